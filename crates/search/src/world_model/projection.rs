//! Projections of the world model for prompts and for `ksearch show`.
//!
//! All projections are deterministic (fixed field order, ties broken by id) and cycle-safe.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::Serialize;

use super::node::{Node, NodeId, NodeState};
use super::{ComputedSignals, WorldModel};

/// Open questions kept in the compact projection (as in the original).
const COMPACT_QUESTIONS: usize = 6;
/// Siblings of the active leaf kept in the compact projection (as in the original).
const COMPACT_SIBLINGS: usize = 2;
/// Per-string cap inside compact nodes, so one verbose title cannot crowd out the tree.
const COMPACT_TEXT: usize = 160;
/// Notes excerpt in the frontier listing (as in the original).
const LISTING_NOTES: usize = 140;

#[derive(Serialize)]
struct CompactSolution<'a> {
    id: &'a str,
    parent_id: Option<&'a str>,
    round: u32,
    score: f64,
}

#[derive(Serialize)]
struct CompactAction {
    title: String,
    difficulty: u8,
    score: f64,
    expected_vs_baseline_factor: Option<f64>,
}

#[derive(Serialize)]
struct CompactNode<'a> {
    id: &'a str,
    parent: Option<&'a str>,
    state: &'static str,
    decision: Option<String>,
    choice: Option<String>,
    rating: f64,
    confidence: f64,
    attempts: u32,
    failures: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    solution: Option<CompactSolution<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    action: Option<CompactAction>,
}

#[derive(Serialize)]
struct CompactWm<'a> {
    kernel_summary: String,
    open_questions: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    computed_signals: Option<&'a ComputedSignals>,
    root_id: &'a str,
    active_leaf_id: &'a str,
    nodes: Vec<CompactNode<'a>>,
    #[serde(skip_serializing_if = "is_zero")]
    omitted_nodes: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Rounds to 3 decimals: prompts do not need 17 significant digits.
fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Cuts at a char boundary and marks the cut.
fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

fn compact_node(n: &Node) -> CompactNode<'_> {
    CompactNode {
        id: n.id.as_str(),
        parent: n.parent.as_ref().map(NodeId::as_str),
        state: n.state.kind(),
        decision: n.decision.as_deref().map(|s| cut(s, COMPACT_TEXT)),
        choice: n.choice.as_deref().map(|s| cut(s, COMPACT_TEXT)),
        rating: r3(n.overall_rating),
        confidence: r3(n.confidence),
        attempts: n.attempts,
        failures: n.failures,
        solution: n.solution().map(|s| CompactSolution {
            id: &s.solution_id,
            parent_id: s.parent_solution_id.as_deref(),
            round: s.round,
            score: r3(s.score),
        }),
        action: n.action.as_ref().map(|a| CompactAction {
            title: cut(&a.title, COMPACT_TEXT),
            difficulty: a.difficulty,
            score: r3(a.score),
            expected_vs_baseline_factor: a.expected_vs_baseline_factor.map(r3),
        }),
    }
}

impl WorldModel {
    /// The compact JSON view used in prompts: summary, first open questions, signals, and the
    /// active path plus the two best-rated siblings of the active leaf. Notes, impacts and
    /// long texts are left out. When over `max_chars` (counted in chars), whole nodes are
    /// dropped (siblings first, then ancestors nearest the root, then the root, the active leaf
    /// last), then questions, the summary and signals; the result is always complete JSON
    /// (`{}` at worst), never a cut string.
    pub fn compact_json(&self, max_chars: usize) -> String {
        let mut path: Vec<&Node> = self
            .path_to_root(&self.active_leaf_id)
            .unwrap_or_else(|_| vec![self.active_leaf_id.clone()])
            .iter()
            .filter_map(|id| self.node(id))
            .collect();
        path.reverse(); // root first
        let leaf = path.last().copied();

        let mut siblings: Vec<&Node> = match leaf.and_then(|l| l.parent.as_ref()) {
            Some(parent) => self
                .children(parent)
                .into_iter()
                .filter(|n| Some(n.id.as_str()) != leaf.map(|l| l.id.as_str()))
                .collect(),
            None => Vec::new(),
        };
        siblings.sort_by(|a, b| {
            b.overall_rating
                .total_cmp(&a.overall_rating)
                .then_with(|| a.id.cmp(&b.id))
        });
        siblings.truncate(COMPACT_SIBLINGS);

        // Output order: path (root first) then siblings. Drop order: worst sibling first, then
        // the path from just below the root downwards, then the root, then the leaf.
        let shown: Vec<&Node> = path.iter().chain(siblings.iter()).copied().collect();
        let mut drop_order: Vec<usize> = (path.len()..shown.len()).rev().collect();
        if path.len() > 2 {
            drop_order.extend(1..path.len() - 1);
        }
        if path.len() > 1 {
            drop_order.push(0);
        }
        if !path.is_empty() {
            drop_order.push(path.len() - 1);
        }

        let questions = &self.open_questions[..self.open_questions.len().min(COMPACT_QUESTIONS)];
        let mut doc = CompactWm {
            kernel_summary: self.kernel_summary.clone(),
            open_questions: questions,
            computed_signals: Some(&self.computed_signals),
            root_id: self.root_id.as_str(),
            active_leaf_id: self.active_leaf_id.as_str(),
            nodes: Vec::new(),
            omitted_nodes: 0,
        };
        let render = |doc: &CompactWm| serde_json::to_string(doc).unwrap_or_else(|_| "{}".into());
        let fits = |s: &str| s.chars().count() <= max_chars;

        let mut dropped = BTreeSet::new();
        for step in 0..=drop_order.len() {
            if step > 0 {
                dropped.insert(drop_order[step - 1]);
            }
            doc.nodes = shown
                .iter()
                .enumerate()
                .filter(|(i, _)| !dropped.contains(i))
                .map(|(_, n)| compact_node(n))
                .collect();
            doc.omitted_nodes = dropped.len();
            let text = render(&doc);
            if fits(&text) {
                return text;
            }
        }
        doc.open_questions = &[];
        let text = render(&doc);
        if fits(&text) {
            return text;
        }
        // Shrink the summary to what the remaining budget allows (binary search on length).
        let full = self.kernel_summary.chars().count();
        let (mut lo, mut hi) = (0usize, full);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            doc.kernel_summary = cut(&self.kernel_summary, mid);
            if fits(&render(&doc)) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        doc.kernel_summary = cut(&self.kernel_summary, lo);
        let text = render(&doc);
        if fits(&text) {
            return text;
        }
        doc.kernel_summary = String::new();
        doc.computed_signals = None;
        let text = render(&doc);
        if fits(&text) {
            text
        } else {
            "{}".to_owned()
        }
    }

    /// One line per executable frontier action (at most `max`), shallowest first, then by id:
    /// id, parent and its solution/score, difficulty, priority, prediction, counters, title,
    /// decision -> choice and the start of the notes.
    pub fn frontier_listing(&self, max: usize) -> String {
        let mut items: Vec<(usize, &Node)> = self
            .frontier()
            .into_iter()
            .map(|n| (self.depth(&n.id).unwrap_or(usize::MAX), n))
            .collect();
        items.sort_by(|(da, a), (db, b)| da.cmp(db).then_with(|| a.id.cmp(&b.id)));
        if items.is_empty() {
            return "(no executable open actions)\n".to_owned();
        }
        let mut out = String::new();
        for (_, n) in items.into_iter().take(max) {
            let parent = n.parent.as_ref().and_then(|p| self.node(p));
            let parent_desc = match parent {
                Some(p) => match p.solution() {
                    Some(s) => format!(
                        "parent {} solution {} score {:.3}{}",
                        p.id,
                        s.solution_id,
                        s.score,
                        s.latency_ms
                            .map(|l| format!(" lat {l:.3}ms"))
                            .unwrap_or_default()
                    ),
                    None => format!("parent {} (no solution)", p.id),
                },
                None => "no parent".to_owned(),
            };
            let _ = write!(out, "- {} [{}]", n.id, parent_desc);
            if let Some(a) = n.open_action() {
                let _ = write!(out, " difficulty {} priority {:.2}", a.difficulty, a.score);
                if let Some(f) = a.expected_vs_baseline_factor {
                    let _ = write!(out, " expected {f:.2}x");
                }
                let _ = write!(
                    out,
                    " attempts {} failures {} visits {}: {}",
                    n.attempts,
                    n.failures,
                    n.visits,
                    cut(&a.title, COMPACT_TEXT)
                );
            }
            if n.decision.is_some() || n.choice.is_some() {
                let _ = write!(
                    out,
                    " | {} -> {}",
                    n.decision.as_deref().unwrap_or("?"),
                    n.choice.as_deref().unwrap_or("?")
                );
            }
            let notes = n.notes.split_whitespace().collect::<Vec<_>>().join(" ");
            if !notes.is_empty() {
                let _ = write!(out, " | notes: {}", cut(&notes, LISTING_NOTES));
            }
            out.push('\n');
        }
        out
    }

    /// A human-readable tree (for `ksearch show`): one line per node with its state, score,
    /// attempts/failures; nodes on the path to the best solution are marked `*`. Nodes not
    /// reachable from the root (only in an invalid model) are listed at the end.
    pub fn render_tree(&self) -> String {
        let mut children: BTreeMap<&NodeId, Vec<&Node>> = BTreeMap::new();
        for n in &self.nodes {
            if let Some(p) = &n.parent {
                children.entry(p).or_default().push(n);
            }
        }
        let best_path: BTreeSet<NodeId> = self
            .best_closed()
            .and_then(|b| self.path_to_root(&b.id).ok())
            .unwrap_or_default()
            .into_iter()
            .collect();

        let mut out = String::new();
        let mut seen = BTreeSet::new();
        if let Some(root) = self.root() {
            self.render_node(root, "", "", &children, &best_path, &mut seen, &mut out);
        }
        let detached: Vec<&Node> = self
            .nodes
            .iter()
            .filter(|n| !seen.contains(&n.id))
            .collect();
        if !detached.is_empty() {
            out.push_str("(detached)\n");
            for n in detached {
                let _ = writeln!(out, "  {}", self.node_line(n, &best_path));
            }
        }
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn render_node<'a>(
        &'a self,
        n: &'a Node,
        lead: &str,
        child_lead: &str,
        children: &BTreeMap<&NodeId, Vec<&'a Node>>,
        best_path: &BTreeSet<NodeId>,
        seen: &mut BTreeSet<&'a NodeId>,
        out: &mut String,
    ) {
        if !seen.insert(&n.id) {
            return;
        }
        let _ = writeln!(out, "{lead}{}", self.node_line(n, best_path));
        let kids = children.get(&n.id).map(Vec::as_slice).unwrap_or(&[]);
        for (i, k) in kids.iter().enumerate() {
            let last = i + 1 == kids.len();
            let (branch, cont) = if last {
                ("└── ", "    ")
            } else {
                ("├── ", "│   ")
            };
            self.render_node(
                k,
                &format!("{child_lead}{branch}"),
                &format!("{child_lead}{cont}"),
                children,
                best_path,
                seen,
                out,
            );
        }
    }

    fn node_line(&self, n: &Node, best_path: &BTreeSet<NodeId>) -> String {
        let mut line = String::new();
        if best_path.contains(&n.id) {
            line.push_str("* ");
        }
        line.push_str(n.id.as_str());
        if let (Some(d), Some(c)) = (&n.decision, &n.choice) {
            let _ = write!(line, " {d} -> {c}");
        } else if let Some(d) = n.decision.as_ref().or(n.choice.as_ref()) {
            let _ = write!(line, " {d}");
        }
        if let Some(a) = n.open_action() {
            let _ = write!(line, " \"{}\"", cut(&a.title, 80));
        }
        let state = match &n.state {
            NodeState::Open => "open".to_owned(),
            NodeState::Closed { solution } => {
                format!(
                    "closed {} score {:.3}",
                    solution.solution_id, solution.score
                )
            }
            NodeState::TooHard { cycles } => format!("too hard after {cycles} cycle(s)"),
            NodeState::Pruned => "pruned".to_owned(),
        };
        let _ = write!(line, " [{state}");
        if let Some(a) = n.open_action() {
            let _ = write!(line, " d{} p{:.2}", a.difficulty, a.score);
            if let Some(f) = a.expected_vs_baseline_factor {
                let _ = write!(line, " exp {f:.2}x");
            }
        }
        let _ = write!(
            line,
            " r{:.1} c{:.2} a{}/f{}",
            n.overall_rating, n.confidence, n.attempts, n.failures
        );
        if n.id == self.active_leaf_id {
            line.push_str(" active");
        }
        line.push(']');
        line
    }
}
