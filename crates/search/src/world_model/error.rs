//! Typed errors of the world model: system operations, patch rejections, invariant violations.

use std::fmt;

use super::node::NodeId;

/// An error from a system operation on the world model.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum WorldModelError {
    #[error("unknown node `{0}`")]
    UnknownNode(NodeId),
    #[error("node `{node}` is {state}, but this operation needs it {needed}")]
    WrongState {
        node: NodeId,
        state: &'static str,
        needed: &'static str,
    },
    #[error("the root node cannot be {0}")]
    RootNotAllowed(&'static str),
    #[error("invalid solution for node `{node}`: {reason}")]
    InvalidSolution { node: NodeId, reason: String },
    #[error("invalid node fields: {}", Joined(.0))]
    InvalidFields(Vec<PatchError>),
    #[error("the parent chain of `{0}` is broken (a cycle or a missing parent)")]
    BrokenPath(NodeId),
    #[error("cannot parse world model JSON: {0}")]
    Parse(String),
    #[error("cannot serialise world model: {0}")]
    Serialize(String),
    #[error("world model violates its invariants: {}", Joined(.0))]
    Invalid(Vec<InvariantViolation>),
}

/// Why an edit (or one of its ops) was rejected. `op` is the op's index in the edit.
/// The messages are meant to be shown to the proposer so it can fix its edit.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PatchError {
    #[error("op {op}: unknown node `{node_id}`")]
    UnknownNode { op: usize, node_id: String },
    #[error("op {op}: field `{field}` is owned by the system and cannot be set by an edit")]
    SystemField { op: usize, field: String },
    #[error("op {op}: unknown field `{field}`")]
    UnknownField { op: usize, field: String },
    #[error("op {op}: field `{field}` cannot be set on the root")]
    RootField { op: usize, field: String },
    #[error("op {op}: field `{field}` must be a finite number")]
    NotFinite { op: usize, field: String },
    #[error("op {op}: field `{field}`: {reason}")]
    InvalidValue {
        op: usize,
        field: String,
        reason: String,
    },
    #[error("op {op}: node `{node_id}` was deleted and cannot be edited")]
    NodePruned { op: usize, node_id: String },
    #[error("op {op}: cannot add children under `{parent}` ({reason})")]
    ParentNotExpandable {
        op: usize,
        parent: String,
        reason: &'static str,
    },
    #[error(
        "op {op}: parent_solution_id `{given}` does not match the parent's solution ({expected})"
    )]
    ParentSolutionMismatch {
        op: usize,
        given: String,
        expected: String,
    },
    #[error("op {op}: label `{label}` is used by two new nodes in the same edit")]
    DuplicateLabel { op: usize, label: String },
    #[error("op {op}: cannot delete `{node_id}`: {reason}")]
    NotDeletable {
        op: usize,
        node_id: String,
        reason: &'static str,
    },
    #[error(
        "op {op}: there is no open question {question} (open questions are numbered 1 to {open})"
    )]
    UnknownQuestion {
        op: usize,
        question: usize,
        open: usize,
    },
    #[error("the edit adds {requested} new nodes; at most {limit} are allowed per edit")]
    InsertCap { requested: usize, limit: usize },
    #[error("active_leaf_id: unknown or deleted node `{node_id}`")]
    BadActiveLeaf { node_id: String },
    #[error("op {op}: unknown op kind `{name}` (the ops are update, insert, split, delete, set_summary, close_question)")]
    UnknownOp { op: usize, name: String },
    #[error("{}malformed: {reason}", .op.map(|i| format!("op {i}: ")).unwrap_or_default())]
    Malformed { op: Option<usize>, reason: String },
    #[error("the edit would break an invariant: {0}")]
    Invariant(InvariantViolation),
}

/// A broken structural invariant, reported by [`super::WorldModel::validate`].
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InvariantViolation {
    #[error("a node has an empty id")]
    EmptyId,
    #[error("duplicate node id `{0}`")]
    DuplicateId(NodeId),
    #[error("root `{0}` is missing")]
    RootMissing(NodeId),
    #[error("root `{0}` has a parent")]
    RootHasParent(NodeId),
    #[error("root `{0}` is {1}; it must be open or closed")]
    RootState(NodeId, &'static str),
    #[error("node `{0}` has no parent but is not the root")]
    ExtraRoot(NodeId),
    #[error("node `{node}` points to missing parent `{parent}`")]
    MissingParent { node: NodeId, parent: NodeId },
    #[error("the ancestry of node `{0}` contains a cycle")]
    Cycle(NodeId),
    #[error("node `{node}` is live but its parent `{parent}` was deleted")]
    LiveChildOfPruned { node: NodeId, parent: NodeId },
    #[error("closed node `{0}` has an empty solution id")]
    EmptySolutionId(NodeId),
    #[error("node `{node}`: `{field}` = {value} is outside its range")]
    OutOfRange {
        node: NodeId,
        field: &'static str,
        value: f64,
    },
    #[error("`{field}` is not a finite number")]
    NonFiniteSignal { field: &'static str },
    #[error("active leaf `{0}` does not exist")]
    ActiveLeafMissing(NodeId),
}

/// Displays a list of errors separated by "; ".
pub(crate) struct Joined<'a, T>(pub &'a [T]);

impl<T: fmt::Display> fmt::Display for Joined<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}
