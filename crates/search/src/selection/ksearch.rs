//! The original K-Search selection rule, reproduced faithfully for comparisons.

use std::cmp::Ordering;

use super::{soft_difficulty_gate, CandidateExplanation, SelectionPolicy};
use crate::world_model::{Action, Node, WorldModel};

/// Best measured vs-baseline factor at or above which the original replaces the cap.
pub const RELAX_IF_BEST_VS_BASE_GE: f64 = 0.5;
/// The cap the original *assigns* once the relaxation fires.
pub const RELAXED_MAX_DIFFICULTY: u8 = 4;

/// The original rule: frontier, soft difficulty gate, then sort by priority score ↓,
/// difficulty ↑, rating ↓, id ↑ (plain string order, so `n10` sorts before `n2`).
///
/// Quirks kept on purpose:
/// - `max_difficulty == 0` means 3;
/// - once any closed node measured a vs-baseline factor ≥ 0.5 the cap is *set* to 4 — an
///   assignment, not a max: a cap of 2 is raised to 4 and a cap of 5 is lowered to 4;
/// - the relaxation looks only at `speedup_vs_baseline`, so it never fires when there is no
///   baseline;
/// - if the gate leaves nothing, every candidate is eligible again, difficulty 5 included.
///
/// Confidence, failures, visits, depth and parent quality are ignored, as in the original.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KSearchPolicy {
    pub max_difficulty: u8,
}

impl Default for KSearchPolicy {
    fn default() -> Self {
        Self { max_difficulty: 4 }
    }
}

impl KSearchPolicy {
    /// The cap actually applied to `wm` (after the 0 → 3 default, the relaxation and the clamp).
    pub fn effective_cap(&self, wm: &WorldModel) -> u8 {
        let mut cap = if self.max_difficulty == 0 {
            3
        } else {
            self.max_difficulty
        };
        let best_vb = wm
            .nodes()
            .iter()
            .filter_map(|n| n.solution())
            .filter_map(|s| s.speedup_vs_baseline)
            .fold(-1.0_f64, f64::max);
        if best_vb >= RELAX_IF_BEST_VS_BASE_GE {
            cap = RELAXED_MAX_DIFFICULTY;
        }
        cap.clamp(1, 5)
    }
}

fn order(a: (&Node, &Action), b: (&Node, &Action)) -> Ordering {
    b.1.score
        .total_cmp(&a.1.score)
        .then_with(|| a.1.difficulty.cmp(&b.1.difficulty))
        .then_with(|| b.0.overall_rating.total_cmp(&a.0.overall_rating))
        .then_with(|| a.0.id.cmp(&b.0.id))
}

impl SelectionPolicy for KSearchPolicy {
    fn name(&self) -> &str {
        "ksearch"
    }

    fn rank(&self, wm: &WorldModel) -> Vec<CandidateExplanation> {
        let cands: Vec<(&Node, &Action)> = wm
            .frontier()
            .into_iter()
            .filter_map(|n| n.open_action().map(|a| (n, a)))
            .collect();
        let cap = self.effective_cap(wm);
        let difficulties: Vec<u8> = cands.iter().map(|(_, a)| a.difficulty).collect();
        let gate = soft_difficulty_gate(&difficulties, cap);
        let mut ranked: Vec<(bool, (&Node, &Action))> = gate.into_iter().zip(cands).collect();
        ranked.sort_by(|(ea, a), (eb, b)| eb.cmp(ea).then_with(|| order(*a, *b)));
        ranked
            .into_iter()
            .map(|(eligible, (n, a))| CandidateExplanation {
                node_id: n.id.clone(),
                eligible,
                utility: None,
                summary: format!(
                    "score {:.2}, difficulty {}{}, rating {:.1}",
                    a.score,
                    a.difficulty,
                    if eligible {
                        String::new()
                    } else {
                        format!(" > cap {cap}")
                    },
                    n.overall_rating
                ),
            })
            .collect()
    }
}
