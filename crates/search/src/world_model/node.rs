//! Node-level types of the world model: ids, states, solutions, impacts and actions.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The id of the root node of every world model built by [`super::WorldModel::new_root`].
pub const ROOT_ID: &str = "root";

/// A node id. System-assigned (`root`, `n1`, `n2`, ...); a proposer never chooses one.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(String);

impl NodeId {
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for NodeId {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl From<String> for NodeId {
    fn from(s: String) -> Self {
        Self(s)
    }
}

/// A measured, passing kernel attached to a node. Written by the system only.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SolutionRef {
    pub solution_id: String,
    /// The solution this one was derived from (the parent node's solution), for lineage.
    pub parent_solution_id: Option<String>,
    /// The evaluator's score (geomean speedup vs the baseline); higher is better.
    pub score: f64,
    pub speedup_vs_baseline: Option<f64>,
    pub latency_ms: Option<f64>,
    pub round: u32,
}

impl SolutionRef {
    /// The measured factor vs the baseline, falling back to the score (which is the same
    /// quantity when a baseline exists).
    pub fn measured_factor(&self) -> f64 {
        self.speedup_vs_baseline.unwrap_or(self.score)
    }
}

/// Explicit node status. The original kept it implicit (solution id set or not) and had no
/// "too hard" state, so a failing node could be chosen forever.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NodeState {
    #[default]
    Open,
    Closed {
        solution: SolutionRef,
    },
    /// Gave up after `cycles` cycles without a passing kernel; never on the frontier again.
    TooHard {
        cycles: u32,
    },
    /// Removed by a `delete` op. Kept in the list so ids are never reused.
    Pruned,
}

impl NodeState {
    pub fn kind(&self) -> &'static str {
        match self {
            NodeState::Open => "open",
            NodeState::Closed { .. } => "closed",
            NodeState::TooHard { .. } => "too_hard",
            NodeState::Pruned => "pruned",
        }
    }

    pub fn solution(&self) -> Option<&SolutionRef> {
        match self {
            NodeState::Closed { solution } => Some(solution),
            _ => None,
        }
    }
}

/// One impact estimate (rating 0..10).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Impact {
    pub rating: f64,
    pub risk: String,
    pub notes: String,
}

/// The three fixed impact dimensions of the original.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Impacts {
    pub memory_bandwidth: Impact,
    pub register_pressure: Impact,
    pub compute_intensity_and_hw_fit: Impact,
}

impl Impacts {
    pub const KEYS: [&'static str; 3] = [
        "memory_bandwidth",
        "register_pressure",
        "compute_intensity_and_hw_fit",
    ];

    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &Impact)> {
        [
            (Self::KEYS[0], &self.memory_bandwidth),
            (Self::KEYS[1], &self.register_pressure),
            (Self::KEYS[2], &self.compute_intensity_and_hw_fit),
        ]
        .into_iter()
    }
}

pub const DEFAULT_DIFFICULTY: u8 = 3;

/// What a node proposes to try. A node is an *action node* only when its title is non-empty.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Action {
    pub title: String,
    pub description: String,
    /// 1 (trivial) ..= 5 (very hard).
    pub difficulty: u8,
    /// Priority 0..1 written by the proposer (the paper's V).
    pub score: f64,
    /// Predicted speedup vs the baseline once this action is done (> 1 is faster).
    pub expected_vs_baseline_factor: Option<f64>,
    pub rationale: String,
    /// Template knobs for the offline proposer; free-form.
    pub knobs: BTreeMap<String, Value>,
}

impl Default for Action {
    fn default() -> Self {
        Self {
            title: String::new(),
            description: String::new(),
            difficulty: DEFAULT_DIFFICULTY,
            score: 0.0,
            expected_vs_baseline_factor: None,
            rationale: String::new(),
            knobs: BTreeMap::new(),
        }
    }
}

pub const DEFAULT_RATING: f64 = 5.0;
pub const DEFAULT_CONFIDENCE: f64 = 0.5;

/// A world-model node. The first group of fields is owned by the system; the second group is
/// what a proposer may change through a [`super::NodePatch`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Node {
    pub id: NodeId,
    pub parent: Option<NodeId>,
    /// The id a proposer suggested when it created the node; informational only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub state: NodeState,
    /// Rounds (generate + evaluate) spent on this node.
    pub attempts: u32,
    /// Attempts that did not pass.
    pub failures: u32,
    /// Cycles in which this node was the chosen action.
    pub cycles: u32,
    /// Cycles spent anywhere in this node's subtree (the UCT visit count).
    pub visits: u32,
    pub created_round: u32,
    pub last_updated_round: u32,
    /// Score of the attached solution, if any.
    pub best_score: Option<f64>,

    pub decision: Option<String>,
    pub choice: Option<String>,
    pub notes: String,
    /// Quality of the partial plan from the root down to here, 0..10.
    pub overall_rating: f64,
    /// How certain the evidence behind the ratings is, 0..1.
    pub confidence: f64,
    pub impacts: Impacts,
    pub action: Option<Action>,
}

impl Default for Node {
    fn default() -> Self {
        Self {
            id: NodeId::default(),
            parent: None,
            label: None,
            state: NodeState::Open,
            attempts: 0,
            failures: 0,
            cycles: 0,
            visits: 0,
            created_round: 0,
            last_updated_round: 0,
            best_score: None,
            decision: None,
            choice: None,
            notes: String::new(),
            overall_rating: DEFAULT_RATING,
            confidence: DEFAULT_CONFIDENCE,
            impacts: Impacts::default(),
            action: None,
        }
    }
}

impl Node {
    pub(crate) fn blank(id: NodeId, parent: Option<NodeId>, round: u32) -> Self {
        Self {
            id,
            parent,
            created_round: round,
            last_updated_round: round,
            ..Self::default()
        }
    }

    /// The node's action, if it has a non-empty title (what makes it selectable).
    /// The node as one line names it: its action's title (else its choice, else its
    /// decision), then the decision and choice it records where they say something else
    /// (`decision → choice`). Each text appears once.
    pub fn display_name(&self) -> String {
        let name = self
            .open_action()
            .map(|a| a.title.as_str())
            .or(self.choice.as_deref())
            .or(self.decision.as_deref());
        let extras: Vec<&str> = [self.decision.as_deref(), self.choice.as_deref()]
            .into_iter()
            .flatten()
            .filter(|x| Some(*x) != name)
            .collect();
        let mut s = name.map(|n| super::cut(n, 80)).unwrap_or_default();
        if !extras.is_empty() {
            if !s.is_empty() {
                s.push(' ');
            }
            s.push_str(&format!("({})", extras.join(" → ")));
        }
        s
    }

    pub fn open_action(&self) -> Option<&Action> {
        self.action.as_ref().filter(|a| !a.title.trim().is_empty())
    }

    pub fn is_action(&self) -> bool {
        self.open_action().is_some()
    }

    pub fn solution(&self) -> Option<&SolutionRef> {
        self.state.solution()
    }

    pub fn is_open(&self) -> bool {
        matches!(self.state, NodeState::Open)
    }

    pub fn is_closed(&self) -> bool {
        matches!(self.state, NodeState::Closed { .. })
    }

    pub fn is_pruned(&self) -> bool {
        matches!(self.state, NodeState::Pruned)
    }
}
