//! Structural invariants of the world model (`WorldModel::validate`).
//!
//! The original checked none of these (duplicate ids, parent cycles and overwritten solution ids
//! were all possible); here every mutation keeps them and a loaded model is checked once.

use std::collections::{BTreeMap, BTreeSet};

use super::error::InvariantViolation;
use super::node::{Node, NodeId, NodeState};
use super::WorldModel;

impl WorldModel {
    /// Checks every invariant and reports all violations: unique non-empty ids, a single root
    /// without parent (open or closed), every parent exists, no cycles, no live child under a
    /// deleted node, closed nodes keep a non-empty solution id, numbers finite and within their
    /// ranges, and the active leaf exists.
    pub fn validate(&self) -> Result<(), Vec<InvariantViolation>> {
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for n in &self.nodes {
            if n.id.as_str().is_empty() {
                out.push(InvariantViolation::EmptyId);
            }
            if !seen.insert(&n.id) {
                out.push(InvariantViolation::DuplicateId(n.id.clone()));
            }
        }
        let by_id: BTreeMap<&NodeId, &Node> = self.nodes.iter().map(|n| (&n.id, n)).collect();

        match by_id.get(&self.root_id) {
            None => out.push(InvariantViolation::RootMissing(self.root_id.clone())),
            Some(root) => {
                if root.parent.is_some() {
                    out.push(InvariantViolation::RootHasParent(self.root_id.clone()));
                }
                if !matches!(root.state, NodeState::Open | NodeState::Closed { .. }) {
                    out.push(InvariantViolation::RootState(
                        self.root_id.clone(),
                        root.state.kind(),
                    ));
                }
            }
        }

        for n in &self.nodes {
            match &n.parent {
                None if n.id != self.root_id => {
                    out.push(InvariantViolation::ExtraRoot(n.id.clone()));
                }
                None => {}
                Some(p) => match by_id.get(p) {
                    None => out.push(InvariantViolation::MissingParent {
                        node: n.id.clone(),
                        parent: p.clone(),
                    }),
                    Some(parent) if parent.is_pruned() && !n.is_pruned() => {
                        out.push(InvariantViolation::LiveChildOfPruned {
                            node: n.id.clone(),
                            parent: p.clone(),
                        });
                    }
                    Some(_) => {}
                },
            }
            if has_cycle(n, &by_id) {
                out.push(InvariantViolation::Cycle(n.id.clone()));
            }
            if let Some(sol) = n.solution() {
                if sol.solution_id.trim().is_empty() {
                    out.push(InvariantViolation::EmptySolutionId(n.id.clone()));
                }
            }
            check_ranges(n, &mut out);
        }

        if !by_id.contains_key(&self.active_leaf_id) {
            out.push(InvariantViolation::ActiveLeafMissing(
                self.active_leaf_id.clone(),
            ));
        }
        if let Some(t) = &self.computed_signals.trace {
            for (field, v) in [
                ("trace.latency_ms", t.latency_ms),
                ("trace.reference_latency_ms", t.reference_latency_ms),
                ("trace.speedup", t.speedup),
            ] {
                if v.is_some_and(|x| !x.is_finite()) {
                    out.push(InvariantViolation::NonFiniteSignal { field });
                }
            }
        }

        if out.is_empty() {
            Ok(())
        } else {
            Err(out)
        }
    }
}

/// Walks up from `n`; a chain longer than the number of nodes must revisit a node.
fn has_cycle(n: &Node, by_id: &BTreeMap<&NodeId, &Node>) -> bool {
    let mut seen = BTreeSet::new();
    let mut cur = n;
    loop {
        if !seen.insert(&cur.id) {
            return true;
        }
        match cur.parent.as_ref().and_then(|p| by_id.get(p)) {
            Some(next) => cur = next,
            None => return false,
        }
    }
}

fn check_ranges(n: &Node, out: &mut Vec<InvariantViolation>) {
    let mut check = |field: &'static str, value: f64, lo: f64, hi: f64| {
        // NaN fails both comparisons, so the negated form also catches it.
        if !(value >= lo && value <= hi) {
            out.push(InvariantViolation::OutOfRange {
                node: n.id.clone(),
                field,
                value,
            });
        }
    };
    check("overall_rating", n.overall_rating, 0.0, 10.0);
    check("confidence", n.confidence, 0.0, 1.0);
    for (key, impact) in n.impacts.iter() {
        let field = match key {
            "memory_bandwidth" => "impacts.memory_bandwidth.rating",
            "register_pressure" => "impacts.register_pressure.rating",
            _ => "impacts.compute_intensity_and_hw_fit.rating",
        };
        check(field, impact.rating, 0.0, 10.0);
    }
    if let Some(a) = &n.action {
        check("action.difficulty", f64::from(a.difficulty), 1.0, 5.0);
        check("action.score", a.score, 0.0, 1.0);
        if let Some(f) = a.expected_vs_baseline_factor {
            check(
                "action.expected_vs_baseline_factor",
                f,
                f64::MIN_POSITIVE,
                f64::MAX,
            );
        }
    }
    if let Some(b) = n.best_score {
        check("best_score", b, f64::MIN, f64::MAX);
    }
    if let Some(s) = n.solution() {
        check("solution.score", s.score, f64::MIN, f64::MAX);
        for (field, v) in [
            ("solution.speedup_vs_baseline", s.speedup_vs_baseline),
            ("solution.latency_ms", s.latency_ms),
        ] {
            if let Some(v) = v {
                check(field, v, f64::MIN, f64::MAX);
            }
        }
    }
}
