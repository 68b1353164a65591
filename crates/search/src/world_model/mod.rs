//! The typed world model: a tree of optimisation decisions stored as a flat node list with
//! parent ids, plus the top-level summary, open questions and computed signals.
//!
//! The system owns ids, parent links, states, counters and attached solutions; proposers change
//! only the fields of [`NodePatch`] through [`WorldModel::apply_edit`], which validates a whole
//! [`Edit`] before committing it atomically.

mod error;
mod invariants;
mod lenient;
mod node;
mod patch;
mod projection;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use error::{InvariantViolation, PatchError, WorldModelError};
pub use node::{
    Action, Impact, Impacts, Node, NodeId, NodeState, SolutionRef, DEFAULT_CONFIDENCE,
    DEFAULT_DIFFICULTY, DEFAULT_RATING, ROOT_ID,
};
pub use patch::{
    ActionPatch, ApplyReport, Edit, ImpactPatch, ImpactsPatch, NodePatch, PatchOp,
    MAX_NEW_NODES_PER_EDIT,
};
pub use projection::{cut, OUTLINE_NOTES, OUTLINE_TEXT};

/// The evaluation a round ended with (its best, else its last), for prompts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Trace {
    pub status: String,
    /// Geometric-mean time of the candidate over the workloads.
    pub latency_ms: Option<f64>,
    /// The reference's time on the same workloads (the candidate's time x its speedup over
    /// the reference).
    pub reference_latency_ms: Option<f64>,
    /// The candidate's score: geometric-mean speedup over the baseline.
    pub speedup: Option<f64>,
    /// Its smallest fraction of the speed of light over the workloads (the headroom is the
    /// inverse), and what bounds it there, in words (`ksearch_eval::bottleneck`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speed_of_light: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bottleneck: Option<String>,
}

/// An open question an edit settled, with the answer it gave.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SettledQuestion {
    pub question: String,
    pub answer: String,
    /// The round of the edit that settled it.
    pub round: u32,
}

/// Machine-written signals (never edited by a proposer); the engine records them after every
/// round.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ComputedSignals {
    /// The last round the search completed (0: only the seed was evaluated).
    pub round_index: u32,
    pub trace: Option<Trace>,
}

/// The world model. Construct with [`WorldModel::new_root`] or [`WorldModel::from_json`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorldModel {
    kernel_summary: String,
    #[serde(default)]
    open_questions: Vec<String>,
    /// Questions settled by `close_question` ops, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    settled_questions: Vec<SettledQuestion>,
    root_id: NodeId,
    active_leaf_id: NodeId,
    /// Next value of the `n<seq>` id counter; ids are never reused.
    next_seq: u64,
    #[serde(default)]
    computed_signals: ComputedSignals,
    nodes: Vec<Node>,
}

impl WorldModel {
    /// A world model holding only an open root (id [`ROOT_ID`]), which is also the active leaf.
    pub fn new_root(kernel_summary: impl Into<String>, open_questions: Vec<String>) -> Self {
        let root_id = NodeId::new(ROOT_ID);
        let root = Node {
            decision: None,
            choice: None,
            ..Node::blank(root_id.clone(), None, 0)
        };
        Self {
            kernel_summary: kernel_summary.into(),
            open_questions,
            settled_questions: Vec::new(),
            root_id: root_id.clone(),
            active_leaf_id: root_id,
            next_seq: 1,
            computed_signals: ComputedSignals::default(),
            nodes: vec![root],
        }
    }

    /// Parses a serialised world model and checks its invariants.
    pub fn from_json(text: &str) -> Result<Self, WorldModelError> {
        let wm: Self =
            serde_json::from_str(text).map_err(|e| WorldModelError::Parse(e.to_string()))?;
        wm.validate().map_err(WorldModelError::Invalid)?;
        Ok(wm)
    }

    /// Pretty JSON (2-space indentation, stable field order).
    pub fn to_json(&self) -> Result<String, WorldModelError> {
        serde_json::to_string_pretty(self).map_err(|e| WorldModelError::Serialize(e.to_string()))
    }

    // ---- read access ----

    pub fn kernel_summary(&self) -> &str {
        &self.kernel_summary
    }

    pub fn open_questions(&self) -> &[String] {
        &self.open_questions
    }

    pub fn settled_questions(&self) -> &[SettledQuestion] {
        &self.settled_questions
    }

    pub fn computed_signals(&self) -> &ComputedSignals {
        &self.computed_signals
    }

    pub fn root_id(&self) -> &NodeId {
        &self.root_id
    }

    pub fn active_leaf_id(&self) -> &NodeId {
        &self.active_leaf_id
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, id: &NodeId) -> Option<&Node> {
        self.index_of(id).map(|i| &self.nodes[i])
    }

    pub fn root(&self) -> Option<&Node> {
        self.node(&self.root_id)
    }

    /// Non-pruned children, in insertion order.
    pub fn children(&self, id: &NodeId) -> Vec<&Node> {
        self.nodes
            .iter()
            .filter(|n| n.parent.as_ref() == Some(id) && !n.is_pruned())
            .collect()
    }

    /// Ids from `id` up to the root, `id` first. Fails (instead of looping) on a cycle or a
    /// missing link, which can only happen in a model that fails [`Self::validate`].
    pub fn path_to_root(&self, id: &NodeId) -> Result<Vec<NodeId>, WorldModelError> {
        let mut path = Vec::new();
        let mut seen = BTreeSet::new();
        let mut cur = self
            .node(id)
            .ok_or_else(|| WorldModelError::UnknownNode(id.clone()))?;
        loop {
            if !seen.insert(&cur.id) {
                return Err(WorldModelError::BrokenPath(id.clone()));
            }
            path.push(cur.id.clone());
            match &cur.parent {
                None => return Ok(path),
                Some(p) => {
                    cur = self
                        .node(p)
                        .ok_or_else(|| WorldModelError::BrokenPath(id.clone()))?;
                }
            }
        }
    }

    /// Depth below the root (root = 0); `None` if the chain is broken.
    pub fn depth(&self, id: &NodeId) -> Option<usize> {
        self.path_to_root(id).ok().map(|p| p.len() - 1)
    }

    /// Executable open actions: open nodes with a non-empty action title whose parent is the root
    /// or a closed node. Too-hard and pruned nodes are never on the frontier. Insertion order.
    pub fn frontier(&self) -> Vec<&Node> {
        let by_id = self.id_map();
        self.nodes
            .iter()
            .filter(|n| n.is_open() && n.is_action())
            .filter(|n| match &n.parent {
                None => false,
                Some(p) if *p == self.root_id => true,
                Some(p) => by_id.get(p).is_some_and(|&i| self.nodes[i].is_closed()),
            })
            .collect()
    }

    /// The closed node with the highest solution score; ties go to the lexicographically larger
    /// id (as in the original).
    pub fn best_closed(&self) -> Option<&Node> {
        self.nodes
            .iter()
            .filter_map(|n| n.solution().map(|s| (n, s.score)))
            .max_by(|(a, sa), (b, sb)| sa.total_cmp(sb).then_with(|| a.id.cmp(&b.id)))
            .map(|(n, _)| n)
    }

    /// The best solution score anywhere in the subtree of `id` (derived, not stored).
    pub fn subtree_best_score(&self, id: &NodeId) -> Option<f64> {
        self.nodes
            .iter()
            .filter_map(|n| n.solution().map(|s| (n, s.score)))
            .filter(|(n, _)| {
                self.path_to_root(&n.id)
                    .map(|p| p.contains(id))
                    .unwrap_or(false)
            })
            .map(|(_, s)| s)
            .max_by(f64::total_cmp)
    }

    // ---- system operations ----

    pub fn set_kernel_summary(&mut self, summary: impl Into<String>) {
        self.kernel_summary = summary.into();
    }

    pub fn set_open_questions(&mut self, questions: Vec<String>) {
        self.open_questions = questions;
    }

    /// Records the round counter and the last evaluation. Non-finite numbers are dropped so
    /// the model always serialises losslessly.
    pub fn record_signals(&mut self, round_index: u32, trace: Option<Trace>) {
        let finite = |x: Option<f64>| x.filter(|v| v.is_finite());
        self.computed_signals = ComputedSignals {
            round_index,
            trace: trace.map(|t| Trace {
                status: t.status,
                latency_ms: finite(t.latency_ms),
                reference_latency_ms: finite(t.reference_latency_ms),
                speedup: finite(t.speedup),
                speed_of_light: finite(t.speed_of_light),
                bottleneck: t.bottleneck,
            }),
        };
    }

    pub fn set_active_leaf(&mut self, id: &NodeId) -> Result<(), WorldModelError> {
        let node = self.live_node(id)?;
        self.active_leaf_id = node.id.clone();
        Ok(())
    }

    /// Inserts a child for the system (deterministic fallback children, offline proposer).
    /// Not subject to the per-edit insert cap. Returns the new id.
    pub fn insert_child(
        &mut self,
        parent: &NodeId,
        fields: &NodePatch,
        round: u32,
    ) -> Result<NodeId, WorldModelError> {
        let parent_node = self
            .node(parent)
            .ok_or_else(|| WorldModelError::UnknownNode(parent.clone()))?;
        if let Some(reason) = patch::not_expandable_reason(parent_node) {
            return Err(WorldModelError::InvalidFields(vec![
                PatchError::ParentNotExpandable {
                    op: 0,
                    parent: parent.to_string(),
                    reason,
                },
            ]));
        }
        let errors = patch::check_patch(fields, 0, "node", false);
        if !errors.is_empty() {
            return Err(WorldModelError::InvalidFields(errors));
        }
        let id = self.fresh_id();
        let mut node = Node::blank(id.clone(), Some(parent.clone()), round);
        patch::apply_patch(&mut node, fields, round);
        self.nodes.push(node);
        Ok(id)
    }

    /// Attaches a passing solution: `Open` → `Closed`. The root may carry the seed solution.
    /// A missing `parent_solution_id` is filled from the parent's solution (lineage).
    pub fn attach_solution(
        &mut self,
        id: &NodeId,
        mut solution: SolutionRef,
    ) -> Result<(), WorldModelError> {
        let i = self
            .index_of(id)
            .ok_or_else(|| WorldModelError::UnknownNode(id.clone()))?;
        let node = &self.nodes[i];
        if !node.is_open() {
            return Err(WorldModelError::WrongState {
                node: id.clone(),
                state: node.state.kind(),
                needed: "open",
            });
        }
        let bad = |reason: &str| WorldModelError::InvalidSolution {
            node: id.clone(),
            reason: reason.to_owned(),
        };
        if solution.solution_id.trim().is_empty() {
            return Err(bad("empty solution id"));
        }
        if !solution.score.is_finite() {
            return Err(bad("score is not finite"));
        }
        if [solution.speedup_vs_baseline, solution.latency_ms]
            .iter()
            .flatten()
            .any(|v| !v.is_finite())
        {
            return Err(bad("speedup or latency is not finite"));
        }
        if solution.parent_solution_id.is_none() {
            solution.parent_solution_id = node
                .parent
                .as_ref()
                .and_then(|p| self.node(p))
                .and_then(|p| p.solution())
                .map(|s| s.solution_id.clone());
        }
        let node = &mut self.nodes[i];
        node.best_score = Some(solution.score);
        node.last_updated_round = solution.round;
        node.state = NodeState::Closed { solution };
        Ok(())
    }

    /// Starts a cycle on an open node: counts the cycle on the node, a visit on every node of
    /// its path (UCT statistics), and makes it the active leaf.
    pub fn begin_cycle(&mut self, id: &NodeId) -> Result<(), WorldModelError> {
        let node = self.live_node(id)?;
        if !node.is_open() {
            return Err(WorldModelError::WrongState {
                node: id.clone(),
                state: node.state.kind(),
                needed: "open",
            });
        }
        let path = self.path_to_root(id)?;
        for p in &path {
            if let Some(i) = self.index_of(p) {
                self.nodes[i].visits = self.nodes[i].visits.saturating_add(1);
            }
        }
        if let Some(i) = self.index_of(id) {
            self.nodes[i].cycles = self.nodes[i].cycles.saturating_add(1);
        }
        self.active_leaf_id = id.clone();
        Ok(())
    }

    /// Gives up on an open node after a cycle without a pass: it leaves the frontier for good.
    pub fn mark_too_hard(&mut self, id: &NodeId) -> Result<(), WorldModelError> {
        if *id == self.root_id {
            return Err(WorldModelError::RootNotAllowed("marked too hard"));
        }
        let i = self
            .index_of(id)
            .ok_or_else(|| WorldModelError::UnknownNode(id.clone()))?;
        let node = &mut self.nodes[i];
        if !node.is_open() {
            return Err(WorldModelError::WrongState {
                node: id.clone(),
                state: node.state.kind(),
                needed: "open",
            });
        }
        node.state = NodeState::TooHard {
            cycles: node.cycles,
        };
        Ok(())
    }

    /// Counts one evaluated attempt on a node.
    pub fn record_attempt(&mut self, id: &NodeId, passed: bool) -> Result<(), WorldModelError> {
        self.live_node(id)?;
        if let Some(i) = self.index_of(id) {
            let node = &mut self.nodes[i];
            node.attempts = node.attempts.saturating_add(1);
            if !passed {
                node.failures = node.failures.saturating_add(1);
            }
        }
        Ok(())
    }

    // ---- internals ----

    fn live_node(&self, id: &NodeId) -> Result<&Node, WorldModelError> {
        let node = self
            .node(id)
            .ok_or_else(|| WorldModelError::UnknownNode(id.clone()))?;
        if node.is_pruned() {
            return Err(WorldModelError::WrongState {
                node: id.clone(),
                state: "pruned",
                needed: "not pruned",
            });
        }
        Ok(node)
    }

    /// Last node with this id (the original's lookup rule; ids are unique in a valid model).
    fn index_of(&self, id: &NodeId) -> Option<usize> {
        self.nodes.iter().rposition(|n| n.id == *id)
    }

    fn id_map(&self) -> BTreeMap<&NodeId, usize> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (&n.id, i))
            .collect()
    }

    fn fresh_id(&mut self) -> NodeId {
        // Wrapping (not saturating) guarantees termination: among len+1 consecutive counter
        // values at least one id is free, even for a hand-edited counter near u64::MAX.
        loop {
            let id = NodeId::new(format!("n{}", self.next_seq));
            self.next_seq = self.next_seq.wrapping_add(1);
            if self.index_of(&id).is_none() {
                return id;
            }
        }
    }
}
