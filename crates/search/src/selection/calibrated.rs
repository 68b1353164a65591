//! The default selection policy: a deterministic utility over the frontier that uses what the
//! system measured (failures, visits, solution scores, how good past predictions were) on top
//! of the proposer's numbers. The formula is documented in `docs/world-model.md`.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{soft_difficulty_gate, CandidateExplanation, SelectionPolicy};
use crate::world_model::{Node, NodeId, WorldModel};

/// Per-sample bound on |ln(measured / predicted)|, so one absurd prediction (say 1000×)
/// cannot dominate a subtree's calibration.
const MAX_ABS_LOG_RATIO: f64 = std::f64::consts::LN_10;

/// Weights of the utility terms. All terms are roughly on a 0..1 scale.
#[derive(Clone, Debug, PartialEq)]
pub struct UtilityWeights {
    /// The proposer's priority `action.score`.
    pub priority: f64,
    /// Calibrated predicted gain over the best measured score.
    pub predicted_gain: f64,
    /// Measured quality of the parent relative to the best node.
    pub parent_quality: f64,
    /// Penalty per difficulty step ((d - 1) / 4).
    pub difficulty: f64,
    /// Penalty ln(1 + failures).
    pub failures: f64,
    /// UCB exploration bonus.
    pub exploration: f64,
}

impl Default for UtilityWeights {
    fn default() -> Self {
        Self {
            priority: 1.0,
            predicted_gain: 1.0,
            parent_quality: 0.5,
            difficulty: 0.5,
            failures: 0.5,
            exploration: 0.3,
        }
    }
}

/// Utility-based selection with calibrated predictions (the default policy).
#[derive(Clone, Debug, PartialEq)]
pub struct CalibratedPolicy {
    pub weights: UtilityWeights,
    /// Soft gate as in the original (a true maximum here, no relaxation rule); 5 disables it.
    pub max_difficulty: u8,
    /// Pseudo-observations pulling calibration toward "honest" (global) and subtree ratios
    /// toward the global one; guards against trusting a single sample.
    pub prior_strength: f64,
    /// Off: predictions are taken at face value (for ablations).
    pub use_calibration: bool,
    /// Gate frontier actions that would repeat a closed node's setting (see [`transpositions`]).
    pub skip_transpositions: bool,
}

impl Default for CalibratedPolicy {
    fn default() -> Self {
        Self {
            weights: UtilityWeights::default(),
            max_difficulty: 5,
            prior_strength: 1.0,
            use_calibration: true,
            skip_transpositions: true,
        }
    }
}

impl CalibratedPolicy {
    /// The policy for a proposer whose actions cannot fail to be written: the offline proposer
    /// renders a template family that CI builds in every combination. Difficulty prices the
    /// risk that a writer gets a hard idea wrong; with none, it would only hold back the hard
    /// actions that pay most (wgmma, ping-pong) behind easy tweaks, so it weighs nothing.
    pub fn template_backed() -> Self {
        Self {
            weights: UtilityWeights {
                difficulty: 0.0,
                ..UtilityWeights::default()
            },
            ..Self::default()
        }
    }
}

/// How far measured results fell from predictions: ln(measured / predicted) over closed nodes
/// whose action carried an `expected_vs_baseline_factor`, globally and per closed subtree.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    prior_strength: f64,
    samples: usize,
    global_log: f64,
    /// Closed node → (sum of log ratios, count) over closed samples in its subtree (itself
    /// included).
    subtree: BTreeMap<NodeId, (f64, u32)>,
}

impl Calibration {
    pub fn measure(wm: &WorldModel, prior_strength: f64) -> Self {
        let k = if prior_strength.is_finite() && prior_strength > 0.0 {
            prior_strength
        } else {
            0.0
        };
        let mut sum = 0.0;
        let mut samples = 0usize;
        let mut subtree: BTreeMap<NodeId, (f64, u32)> = BTreeMap::new();
        for n in wm.nodes() {
            let Some(l) = log_ratio(n) else { continue };
            sum += l;
            samples += 1;
            for anc in wm.path_to_root(&n.id).unwrap_or_default() {
                if wm.node(&anc).is_some_and(Node::is_closed) {
                    let e = subtree.entry(anc).or_insert((0.0, 0));
                    e.0 += l;
                    e.1 += 1;
                }
            }
        }
        let denom = samples as f64 + k;
        let global_log = if denom > 0.0 { sum / denom } else { 0.0 };
        Self {
            prior_strength: k,
            samples,
            global_log,
            subtree,
        }
    }

    /// Number of (prediction, measurement) pairs seen.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// Global measured/predicted ratio (1 = honest, 0.5 = predictions were 2× optimistic).
    pub fn global_ratio(&self) -> f64 {
        self.global_log.exp()
    }

    /// Ratio for the subtree rooted at closed node `id`, shrunk toward the global ratio.
    pub fn subtree_ratio(&self, id: &NodeId) -> f64 {
        self.subtree_log(id).exp()
    }

    fn subtree_log(&self, id: &NodeId) -> f64 {
        let (s, n) = self.subtree.get(id).copied().unwrap_or((0.0, 0));
        let denom = f64::from(n) + self.prior_strength;
        if n == 0 || denom <= 0.0 {
            self.global_log
        } else {
            (s + self.prior_strength * self.global_log) / denom
        }
    }

    /// Ratio applied to a candidate: that of its nearest closed ancestor, else the global one.
    pub fn ratio_for(&self, wm: &WorldModel, id: &NodeId) -> f64 {
        let path = wm.path_to_root(id).unwrap_or_default();
        path.iter()
            .skip(1)
            .find(|a| wm.node(a).is_some_and(Node::is_closed))
            .map_or(self.global_log, |a| self.subtree_log(a))
            .exp()
    }
}

/// The knob changes of the actions on the way from the root to `id` (its own included), later
/// actions overriding earlier ones; empty when no action on the way names a knob (an LLM
/// proposer's ideas are free text).
fn knob_changes(wm: &WorldModel, id: &NodeId) -> BTreeMap<String, Value> {
    let mut path = wm.path_to_root(id).unwrap_or_default();
    path.reverse();
    let mut knobs = BTreeMap::new();
    for node in path.iter().filter_map(|p| wm.node(p)) {
        if let Some(a) = &node.action {
            knobs.extend(a.knobs.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }
    knobs
}

/// For each of `cands`, a closed node it would repeat: one whose actions, from the root,
/// change the same knobs to the same values as the candidate's path and action do. Such a
/// candidate is the same combination of ideas reached in another order (query blocks then
/// causal skip, or causal skip then query blocks): a cycle spent on it measures a setting the
/// tree has already measured, give or take the tuning steps of the cycles in between.
fn transpositions(wm: &WorldModel, cands: &[&Node]) -> Vec<Option<NodeId>> {
    let closed: Vec<(&NodeId, BTreeMap<String, Value>)> = wm
        .nodes()
        .iter()
        .filter(|n| n.is_closed())
        .map(|n| (&n.id, knob_changes(wm, &n.id)))
        .collect();
    cands
        .iter()
        .map(|c| {
            if c.action.as_ref().is_none_or(|a| a.knobs.is_empty()) {
                return None;
            }
            let mine = knob_changes(wm, &c.id);
            closed
                .iter()
                .find(|(id, knobs)| **id != c.id && *knobs == mine)
                .map(|(id, _)| (*id).clone())
        })
        .collect()
}

fn log_ratio(n: &Node) -> Option<f64> {
    let predicted = n.action.as_ref()?.expected_vs_baseline_factor?;
    let measured = n.solution()?.measured_factor();
    if !(predicted > 0.0 && measured > 0.0 && predicted.is_finite() && measured.is_finite()) {
        return None;
    }
    Some(
        (measured / predicted)
            .ln()
            .clamp(-MAX_ABS_LOG_RATIO, MAX_ABS_LOG_RATIO),
    )
}

impl SelectionPolicy for CalibratedPolicy {
    fn name(&self) -> &str {
        "calibrated"
    }

    fn rank(&self, wm: &WorldModel) -> Vec<CandidateExplanation> {
        let w = &self.weights;
        let calibration = Calibration::measure(wm, self.prior_strength);
        // Score of the best measured kernel; 1.0 (the baseline) before anything passed.
        let reference = wm
            .best_closed()
            .and_then(|b| b.solution())
            .map(|s| s.score)
            .filter(|s| *s > 0.0 && s.is_finite())
            .unwrap_or(1.0);

        let cands: Vec<&Node> = wm
            .frontier()
            .into_iter()
            .filter(|n| n.is_action())
            .collect();
        let difficulties: Vec<u8> = cands
            .iter()
            .filter_map(|n| n.open_action().map(|a| a.difficulty))
            .collect();
        let mut gate = soft_difficulty_gate(&difficulties, self.max_difficulty.clamp(1, 5));
        let repeats = match self.skip_transpositions {
            true => transpositions(wm, &cands),
            false => vec![None; cands.len()],
        };
        // Soft, like the difficulty gate: when every candidate left repeats a closed node, the
        // repeats are allowed rather than ending the search.
        if gate.iter().zip(&repeats).any(|(g, r)| *g && r.is_none()) {
            for (g, r) in gate.iter_mut().zip(&repeats) {
                *g &= r.is_none();
            }
        }

        let mut ranked: Vec<(bool, f64, CandidateExplanation)> = Vec::new();
        for ((n, eligible), repeat) in cands.into_iter().zip(gate).zip(repeats) {
            let Some(a) = n.open_action() else { continue };
            let parent = n.parent.as_ref().and_then(|p| wm.node(p));
            let parent_score = parent
                .and_then(|p| p.solution())
                .map(|s| s.score)
                .unwrap_or(1.0);
            let parent_quality = (parent_score / reference).clamp(0.0, 1.0);

            let ratio = if self.use_calibration {
                calibration.ratio_for(wm, &n.id)
            } else {
                1.0
            };
            let calibrated = a.expected_vs_baseline_factor.map(|f| f * ratio);
            // Confidence shrinks the predicted log-gain toward "no change"; tanh bounds it.
            let gain = calibrated
                .filter(|f| *f > 0.0)
                .map_or(0.0, |f| (n.confidence * (f / reference).ln()).tanh());

            let difficulty_pen = f64::from(a.difficulty.saturating_sub(1)) / 4.0;
            let failure_pen = f64::from(n.failures).ln_1p();
            let parent_visits = parent.map_or(0, |p| p.visits);
            let explore = (f64::from(parent_visits).ln_1p() / (1.0 + f64::from(n.visits))).sqrt();

            let utility =
                w.priority * a.score + w.predicted_gain * gain + w.parent_quality * parent_quality
                    - w.difficulty * difficulty_pen
                    - w.failures * failure_pen
                    + w.exploration * explore;

            let prediction = match (a.expected_vs_baseline_factor, calibrated) {
                (Some(raw), Some(cal)) => {
                    format!("predicted {raw:.2}x -> {cal:.2}x (calibration {ratio:.2})")
                }
                _ => "no prediction".to_owned(),
            };
            let mut summary = format!(
                "priority {:.2}, {prediction}, gain {gain:+.3}, parent quality {parent_quality:.2}, \
                 difficulty {}, failures {}, visits {}/{parent_visits}, explore {explore:+.3}",
                a.score, a.difficulty, n.failures, n.visits
            );
            if let Some(closed) = repeat {
                summary.push_str(&format!(", repeats {closed}'s knob changes"));
            }
            ranked.push((
                eligible,
                utility,
                CandidateExplanation {
                    node_id: n.id.clone(),
                    eligible,
                    utility: Some(utility),
                    summary,
                },
            ));
        }
        ranked.sort_by(|(ea, ua, ca), (eb, ub, cb)| {
            eb.cmp(ea)
                .then_with(|| ub.total_cmp(ua))
                .then_with(|| ca.node_id.cmp(&cb.node_id))
        });
        ranked.into_iter().map(|(_, _, c)| c).collect()
    }
}
