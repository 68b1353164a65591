//! The patch language a proposer returns, and its validated, atomic application.
//!
//! Canonical JSON form (tagged by `"op"`):
//! `{"op":"update","node_id":..,"set":{..}}`, `{"op":"insert","parent_id":..,"node":{..}}`,
//! `{"op":"split","node_id":..,"set":{..},"children":[..]}`, `{"op":"delete","node_id":..}`,
//! and two tree-level ops: `{"op":"set_summary","kernel_summary":..}` and
//! `{"op":"close_question","question":<1-based number>,"answer":..}`.
//! `set` / `node` / children accept only the fields of [`NodePatch`]; anything else is kept
//! aside by serde and rejected by [`WorldModel::apply_edit`] with the field's name, so that
//! system-owned fields (solution ids, states, parents, counters) can never be written.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::error::PatchError;
use super::node::{Action, Node, NodeId, NodeState};
use super::{SettledQuestion, WorldModel};

/// New nodes (inserts plus split children) one edit may add, as in the original.
pub const MAX_NEW_NODES_PER_EDIT: usize = 3;

/// Keys that name system-owned data; reported as [`PatchError::SystemField`] rather than as
/// unknown fields, so a proposer learns it may not write them at all.
const SYSTEM_FIELDS: &[&str] = &[
    "id",
    "node_id",
    "parent",
    "parent_id",
    "state",
    "status",
    "solution",
    "solution_ref",
    "solution_id",
    "parent_solution_id",
    "attempts",
    "failures",
    "cycles",
    "visits",
    "created_round",
    "last_updated_round",
    "best_score",
    "subtree_best_score",
    "node_type",
    "children",
];

/// Distinguishes an absent key (`None`) from an explicit `null` (`Some(None)`).
fn double_option<'de, T, D>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    T: Deserialize<'de>,
    D: Deserializer<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Proposer-editable node fields. Absent fields are left unchanged.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodePatch {
    /// Free-form handle; for new nodes, later ops of the same edit may use it as an id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(
        default,
        deserialize_with = "double_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub decision: Option<Option<String>>,
    #[serde(
        default,
        deserialize_with = "double_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub choice: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    /// Clamped to 0..10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overall_rating: Option<f64>,
    /// Clamped to 0..1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impacts: Option<ImpactsPatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<ActionPatch>,
    /// Every other key; non-empty means the op is rejected.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// Shallow merge into the node's action (created with defaults if absent).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ActionPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Truncated to an integer and clamped to 1..=5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub difficulty: Option<f64>,
    /// Clamped to 0..1; `null` (or absent on a new action) means overall_rating / 10.
    #[serde(
        default,
        deserialize_with = "double_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub score: Option<Option<f64>>,
    /// Must be > 0; `null` clears it.
    #[serde(
        default,
        deserialize_with = "double_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub expected_vs_baseline_factor: Option<Option<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rationale: Option<String>,
    /// Replaces the knob map as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub knobs: Option<BTreeMap<String, Value>>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// Per-dimension shallow merge into the three fixed impacts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImpactsPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bandwidth: Option<ImpactPatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub register_pressure: Option<ImpactPatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_intensity_and_hw_fit: Option<ImpactPatch>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImpactPatch {
    /// Clamped to 0..10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rating: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// One edit operation. Node references may name an existing id or the `label` of a node
/// inserted earlier in the same edit (existing ids win).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum PatchOp {
    Update {
        node_id: NodeId,
        set: NodePatch,
    },
    Insert {
        parent_id: NodeId,
        /// Optional consistency check: must equal the parent's solution id when given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_solution_id: Option<String>,
        node: NodePatch,
    },
    /// Patch a node and add children under it (alternative refinements of it).
    Split {
        node_id: NodeId,
        #[serde(default)]
        set: NodePatch,
        #[serde(default)]
        children: Vec<NodePatch>,
    },
    /// Prune an open, childless, non-root node.
    Delete {
        node_id: NodeId,
    },
    /// Replace the tree's `kernel_summary` (non-empty).
    SetSummary {
        kernel_summary: String,
    },
    /// Settle an open question: `question` is its number as prompts list them (1-based, in
    /// the list as it was before the edit); the question leaves `open_questions` and is kept
    /// with its `answer` (non-empty) among the settled ones.
    CloseQuestion {
        question: usize,
        answer: String,
    },
}

/// A proposer's edit: ops applied in order, all or nothing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Edit {
    pub ops: Vec<PatchOp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_leaf_id: Option<NodeId>,
}

/// What a committed edit changed.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ApplyReport {
    pub updated: Vec<NodeId>,
    /// New ids with the label the proposer gave them, in creation order.
    pub inserted: Vec<(NodeId, Option<String>)>,
    pub deleted: Vec<NodeId>,
    /// Open questions the edit settled.
    pub closed_questions: usize,
    pub active_leaf_id: NodeId,
}

impl WorldModel {
    /// Validates the whole edit against a copy and commits it only if every op is valid.
    /// On rejection all reasons are returned and `self` is untouched.
    pub fn apply_edit(&mut self, edit: &Edit, round: u32) -> Result<ApplyReport, Vec<PatchError>> {
        let mut draft = self.clone();
        let mut errors = Vec::new();
        let mut report = ApplyReport::default();
        let mut labels: BTreeMap<String, NodeId> = BTreeMap::new();
        let mut new_nodes = 0usize;
        // Questions settled by this edit: (number in the list before the edit, answer).
        let mut closed: Vec<(usize, String)> = Vec::new();

        for (op, item) in edit.ops.iter().enumerate() {
            let before = errors.len();
            match item {
                PatchOp::Update { node_id, set } => {
                    let Some(i) = draft.resolve_live(op, node_id, &labels, &mut errors) else {
                        continue;
                    };
                    let is_root = draft.nodes[i].id == draft.root_id;
                    errors.extend(check_patch(set, op, "set", is_root));
                    if errors.len() == before {
                        apply_patch(&mut draft.nodes[i], set, round);
                        report.updated.push(draft.nodes[i].id.clone());
                    }
                }
                PatchOp::Insert {
                    parent_id,
                    parent_solution_id,
                    node,
                } => {
                    new_nodes += 1;
                    let parent = draft.resolve_live(op, parent_id, &labels, &mut errors);
                    if let Some(p) = parent {
                        let pnode = &draft.nodes[p];
                        if let Some(reason) = not_expandable_reason(pnode) {
                            errors.push(PatchError::ParentNotExpandable {
                                op,
                                parent: pnode.id.to_string(),
                                reason,
                            });
                        }
                        if let Some(given) = parent_solution_id {
                            let expected = pnode.solution().map(|s| s.solution_id.as_str());
                            if expected != Some(given.as_str()) {
                                errors.push(PatchError::ParentSolutionMismatch {
                                    op,
                                    given: given.clone(),
                                    expected: expected.unwrap_or("none").to_owned(),
                                });
                            }
                        }
                    }
                    errors.extend(check_patch(node, op, "node", false));
                    check_label(op, node, &labels, &mut errors);
                    if let (Some(p), true) = (parent, errors.len() == before) {
                        let parent_id = draft.nodes[p].id.clone();
                        draft.push_child(parent_id, node, round, &mut labels, &mut report);
                    }
                }
                PatchOp::Split {
                    node_id,
                    set,
                    children,
                } => {
                    new_nodes += children.len();
                    let Some(i) = draft.resolve_live(op, node_id, &labels, &mut errors) else {
                        continue;
                    };
                    let is_root = draft.nodes[i].id == draft.root_id;
                    errors.extend(check_patch(set, op, "set", is_root));
                    if !children.is_empty() {
                        if let Some(reason) = not_expandable_reason(&draft.nodes[i]) {
                            errors.push(PatchError::ParentNotExpandable {
                                op,
                                parent: draft.nodes[i].id.to_string(),
                                reason,
                            });
                        }
                    }
                    let mut split_labels = labels.clone();
                    for (k, child) in children.iter().enumerate() {
                        errors.extend(check_patch(child, op, &format!("children[{k}]"), false));
                        check_label(op, child, &split_labels, &mut errors);
                        if let Some(l) = &child.label {
                            split_labels.insert(l.clone(), NodeId::default());
                        }
                    }
                    if errors.len() == before {
                        apply_patch(&mut draft.nodes[i], set, round);
                        report.updated.push(draft.nodes[i].id.clone());
                        let parent_id = draft.nodes[i].id.clone();
                        for child in children {
                            draft.push_child(
                                parent_id.clone(),
                                child,
                                round,
                                &mut labels,
                                &mut report,
                            );
                        }
                    }
                }
                PatchOp::Delete { node_id } => {
                    let Some(i) = draft.resolve_live(op, node_id, &labels, &mut errors) else {
                        continue;
                    };
                    let id = draft.nodes[i].id.clone();
                    let reason = if id == draft.root_id {
                        Some("the root cannot be deleted")
                    } else if !draft.nodes[i].is_open() {
                        Some("only open nodes can be deleted")
                    } else if !draft.children(&id).is_empty() {
                        Some("the node has children")
                    } else {
                        None
                    };
                    if let Some(reason) = reason {
                        errors.push(PatchError::NotDeletable {
                            op,
                            node_id: id.to_string(),
                            reason,
                        });
                        continue;
                    }
                    let node = &mut draft.nodes[i];
                    node.state = NodeState::Pruned;
                    node.last_updated_round = round;
                    if draft.active_leaf_id == id {
                        // The active leaf must stay live; fall back to the parent.
                        draft.active_leaf_id =
                            node.parent.clone().unwrap_or_else(|| draft.root_id.clone());
                    }
                    report.deleted.push(id);
                }
                PatchOp::SetSummary { kernel_summary } => {
                    if kernel_summary.trim().is_empty() {
                        errors.push(PatchError::InvalidValue {
                            op,
                            field: "kernel_summary".into(),
                            reason: "must not be empty".into(),
                        });
                    } else {
                        draft.kernel_summary = kernel_summary.trim().to_owned();
                    }
                }
                PatchOp::CloseQuestion { question, answer } => {
                    let open = self.open_questions.len();
                    if *question == 0 || *question > open {
                        errors.push(PatchError::UnknownQuestion {
                            op,
                            question: *question,
                            open,
                        });
                    } else if closed.iter().any(|(q, _)| q == question) {
                        errors.push(PatchError::InvalidValue {
                            op,
                            field: "question".into(),
                            reason: format!("question {question} is closed twice in this edit"),
                        });
                    } else if answer.trim().is_empty() {
                        errors.push(PatchError::InvalidValue {
                            op,
                            field: "answer".into(),
                            reason: "must say what settled the question".into(),
                        });
                    } else {
                        closed.push((*question, answer.trim().to_owned()));
                    }
                }
            }
        }
        // Numbers refer to the list before the edit, so they are removed last, highest first.
        closed.sort_by_key(|c| std::cmp::Reverse(c.0));
        for (q, answer) in closed {
            let question = draft.open_questions.remove(q - 1);
            draft.settled_questions.push(SettledQuestion {
                question,
                answer,
                round,
            });
            report.closed_questions += 1;
        }

        if new_nodes > MAX_NEW_NODES_PER_EDIT {
            errors.push(PatchError::InsertCap {
                requested: new_nodes,
                limit: MAX_NEW_NODES_PER_EDIT,
            });
        }

        if let Some(leaf) = &edit.active_leaf_id {
            match draft.resolve(leaf, &labels) {
                Some(i) if !draft.nodes[i].is_pruned() => {
                    draft.active_leaf_id = draft.nodes[i].id.clone();
                }
                _ => errors.push(PatchError::BadActiveLeaf {
                    node_id: leaf.to_string(),
                }),
            }
        }

        if !errors.is_empty() {
            return Err(errors);
        }
        // Every op was checked above; this guards against a bug in those checks ever
        // committing a broken tree.
        if let Err(violations) = draft.validate() {
            return Err(violations.into_iter().map(PatchError::Invariant).collect());
        }
        report.active_leaf_id = draft.active_leaf_id.clone();
        *self = draft;
        Ok(report)
    }

    /// Index of an existing id, else of a node labelled so earlier in this edit.
    fn resolve(&self, id: &NodeId, labels: &BTreeMap<String, NodeId>) -> Option<usize> {
        self.index_of(id)
            .or_else(|| labels.get(id.as_str()).and_then(|real| self.index_of(real)))
    }

    fn resolve_live(
        &self,
        op: usize,
        id: &NodeId,
        labels: &BTreeMap<String, NodeId>,
        errors: &mut Vec<PatchError>,
    ) -> Option<usize> {
        match self.resolve(id, labels) {
            None => {
                errors.push(PatchError::UnknownNode {
                    op,
                    node_id: id.to_string(),
                });
                None
            }
            Some(i) if self.nodes[i].is_pruned() => {
                errors.push(PatchError::NodePruned {
                    op,
                    node_id: id.to_string(),
                });
                None
            }
            Some(i) => Some(i),
        }
    }

    fn push_child(
        &mut self,
        parent: NodeId,
        fields: &NodePatch,
        round: u32,
        labels: &mut BTreeMap<String, NodeId>,
        report: &mut ApplyReport,
    ) {
        let id = self.fresh_id();
        let mut node = Node::blank(id.clone(), Some(parent), round);
        apply_patch(&mut node, fields, round);
        if let Some(l) = &fields.label {
            labels.insert(l.clone(), id.clone());
        }
        report.inserted.push((id, fields.label.clone()));
        self.nodes.push(node);
    }
}

fn check_label(
    op: usize,
    fields: &NodePatch,
    labels: &BTreeMap<String, NodeId>,
    errors: &mut Vec<PatchError>,
) {
    if let Some(l) = &fields.label {
        if labels.contains_key(l) {
            errors.push(PatchError::DuplicateLabel {
                op,
                label: l.clone(),
            });
        }
    }
}

/// Why children may not be added under `node`, if they may not.
pub(crate) fn not_expandable_reason(node: &Node) -> Option<&'static str> {
    match node.state {
        NodeState::Pruned => Some("it was deleted"),
        NodeState::TooHard { .. } => Some(
            "it is marked too hard, so its children could never become executable; \
             insert alternatives under its parent instead",
        ),
        NodeState::Open | NodeState::Closed { .. } => None,
    }
}

fn unknown_keys(
    op: usize,
    path: &str,
    unknown: &BTreeMap<String, Value>,
    errors: &mut Vec<PatchError>,
) {
    for key in unknown.keys() {
        let field = format!("{path}.{key}");
        errors.push(if SYSTEM_FIELDS.contains(&key.as_str()) {
            PatchError::SystemField { op, field }
        } else {
            PatchError::UnknownField { op, field }
        });
    }
}

fn finite(op: usize, field: String, v: Option<f64>, errors: &mut Vec<PatchError>) {
    if v.is_some_and(|x| !x.is_finite()) {
        errors.push(PatchError::NotFinite { op, field });
    }
}

/// Everything that can be wrong with a patch, independently of the node it targets (apart
/// from whether that node is the root).
pub(crate) fn check_patch(p: &NodePatch, op: usize, path: &str, is_root: bool) -> Vec<PatchError> {
    let mut errors = Vec::new();
    unknown_keys(op, path, &p.unknown, &mut errors);
    if is_root {
        // The root is a dummy decision point; clearing (null) is a harmless no-op.
        for (name, v) in [("decision", &p.decision), ("choice", &p.choice)] {
            if matches!(v, Some(Some(_))) {
                errors.push(PatchError::RootField {
                    op,
                    field: format!("{path}.{name}"),
                });
            }
        }
    }
    finite(
        op,
        format!("{path}.overall_rating"),
        p.overall_rating,
        &mut errors,
    );
    finite(op, format!("{path}.confidence"), p.confidence, &mut errors);
    if let Some(ip) = &p.impacts {
        unknown_keys(op, &format!("{path}.impacts"), &ip.unknown, &mut errors);
        for (key, one) in [
            ("memory_bandwidth", &ip.memory_bandwidth),
            ("register_pressure", &ip.register_pressure),
            (
                "compute_intensity_and_hw_fit",
                &ip.compute_intensity_and_hw_fit,
            ),
        ] {
            if let Some(one) = one {
                let sub = format!("{path}.impacts.{key}");
                unknown_keys(op, &sub, &one.unknown, &mut errors);
                finite(op, format!("{sub}.rating"), one.rating, &mut errors);
            }
        }
    }
    if let Some(a) = &p.action {
        let sub = format!("{path}.action");
        unknown_keys(op, &sub, &a.unknown, &mut errors);
        finite(op, format!("{sub}.difficulty"), a.difficulty, &mut errors);
        finite(op, format!("{sub}.score"), a.score.flatten(), &mut errors);
        if let Some(Some(f)) = a.expected_vs_baseline_factor {
            if !f.is_finite() {
                errors.push(PatchError::NotFinite {
                    op,
                    field: format!("{sub}.expected_vs_baseline_factor"),
                });
            } else if f <= 0.0 {
                errors.push(PatchError::InvalidValue {
                    op,
                    field: format!("{sub}.expected_vs_baseline_factor"),
                    reason: format!("must be > 0 (a speedup factor), got {f}"),
                });
            }
        }
    }
    errors
}

/// Truncates toward zero and clamps, like the original normaliser's int() + clamp.
fn clamp_difficulty(x: f64) -> u8 {
    x.trunc().clamp(1.0, 5.0) as u8
}

/// Applies a patch already accepted by [`check_patch`], clamping values into range.
pub(crate) fn apply_patch(node: &mut Node, p: &NodePatch, round: u32) {
    if let Some(l) = &p.label {
        node.label = Some(l.clone());
    }
    if let Some(d) = &p.decision {
        node.decision = d.clone();
    }
    if let Some(c) = &p.choice {
        node.choice = c.clone();
    }
    if let Some(n) = &p.notes {
        node.notes = n.clone();
    }
    if let Some(r) = p.overall_rating {
        node.overall_rating = r.clamp(0.0, 10.0);
    }
    if let Some(c) = p.confidence {
        node.confidence = c.clamp(0.0, 1.0);
    }
    if let Some(ip) = &p.impacts {
        for (target, one) in [
            (&mut node.impacts.memory_bandwidth, &ip.memory_bandwidth),
            (&mut node.impacts.register_pressure, &ip.register_pressure),
            (
                &mut node.impacts.compute_intensity_and_hw_fit,
                &ip.compute_intensity_and_hw_fit,
            ),
        ] {
            if let Some(one) = one {
                if let Some(r) = one.rating {
                    target.rating = r.clamp(0.0, 10.0);
                }
                if let Some(r) = &one.risk {
                    target.risk = r.clone();
                }
                if let Some(n) = &one.notes {
                    target.notes = n.clone();
                }
            }
        }
    }
    if let Some(ap) = &p.action {
        // Rating is applied first so a defaulted score sees the patched rating.
        let default_score = (node.overall_rating / 10.0).clamp(0.0, 1.0);
        let is_new = node.action.is_none();
        let action = node.action.get_or_insert_with(Action::default);
        if let Some(t) = &ap.title {
            action.title = t.trim().to_owned();
        }
        if let Some(d) = &ap.description {
            action.description = d.clone();
        }
        if let Some(d) = ap.difficulty {
            action.difficulty = clamp_difficulty(d);
        }
        match ap.score {
            Some(Some(s)) => action.score = s.clamp(0.0, 1.0),
            Some(None) => action.score = default_score,
            None if is_new => action.score = default_score,
            None => {}
        }
        if let Some(f) = ap.expected_vs_baseline_factor {
            action.expected_vs_baseline_factor = f;
        }
        if let Some(r) = &ap.rationale {
            action.rationale = r.clone();
        }
        if let Some(k) = &ap.knobs {
            action.knobs = k.clone();
        }
    }
    node.last_updated_round = round;
}
