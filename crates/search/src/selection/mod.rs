//! Selection policies: which open action on the world model's frontier to work on next.
//!
//! - [`KSearchPolicy`]: the original K-Search rule, kept exactly (quirks included) for
//!   comparisons.
//! - [`CalibratedPolicy`]: the default; a deterministic utility that also uses confidence,
//!   failures, visits (UCB exploration), parent quality and calibrated predictions.
//!
//! See `docs/world-model.md` for the formulas.

mod calibrated;
mod ksearch;

use std::fmt;

use crate::world_model::{NodeId, WorldModel};

pub use calibrated::{CalibratedPolicy, Calibration, UtilityWeights};
pub use ksearch::{KSearchPolicy, RELAXED_MAX_DIFFICULTY, RELAX_IF_BEST_VS_BASE_GE};

/// One ranked candidate with a short reason, for logs.
#[derive(Clone, Debug, PartialEq)]
pub struct CandidateExplanation {
    pub node_id: NodeId,
    /// False when a gate (e.g. the difficulty cap) excludes it from this choice.
    pub eligible: bool,
    /// The policy's utility, where it computes one.
    pub utility: Option<f64>,
    pub summary: String,
}

impl fmt::Display for CandidateExplanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.node_id)?;
        if let Some(u) = self.utility {
            write!(f, " U={u:.3}")?;
        }
        if !self.eligible {
            f.write_str(" (gated)")?;
        }
        write!(f, ": {}", self.summary)
    }
}

/// Picks the next action node.
pub trait SelectionPolicy {
    fn name(&self) -> &str;

    /// Every frontier candidate, best first; ineligible (gated) candidates come after all
    /// eligible ones.
    fn rank(&self, wm: &WorldModel) -> Vec<CandidateExplanation>;

    /// The first eligible candidate of [`Self::rank`]; `None` when the frontier is empty.
    fn choose(&self, wm: &WorldModel) -> Option<NodeId> {
        self.rank(wm)
            .into_iter()
            .find(|c| c.eligible)
            .map(|c| c.node_id)
    }
}

/// Keeps candidates with difficulty ≤ cap, or all of them when none qualifies (the original's
/// soft gate). Returns, per candidate in input order, whether it passed.
pub(crate) fn soft_difficulty_gate(difficulties: &[u8], cap: u8) -> Vec<bool> {
    let pass: Vec<bool> = difficulties.iter().map(|&d| d <= cap).collect();
    if pass.iter().any(|&p| p) {
        pass
    } else {
        vec![true; difficulties.len()]
    }
}
