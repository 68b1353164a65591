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

/// Keeps the first `max` characters and marks the cut with how much was left out
/// (`… [+N characters]`), so a reader can tell a cut text from a short one.
pub fn cut(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        s.to_owned()
    } else {
        let head: String = s.chars().take(max).collect();
        format!("{}… [+{} characters]", head.trim_end(), n - max)
    }
}

/// Longest text (a title, a choice, a decision) on one line of [`WorldModel::outline`].
pub const OUTLINE_TEXT: usize = 200;
/// Longest notes on a detailed line of [`WorldModel::outline`].
pub const OUTLINE_NOTES: usize = 400;
/// Settled questions [`WorldModel::outline`] lists (the most recent).
const OUTLINE_SETTLED: usize = 5;

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

    /// The plan as edit prompts show it: the summary, the numbered open questions, the last
    /// settled ones, the signals, and every live node (deleted ones left out) on one line,
    /// children indented under their parent, in tree order. Nodes on the path from the root to
    /// `focus` (marked `*`) and executable actions (marked `>`) carry detail: priority,
    /// difficulty, prediction, counters and notes. Texts are cut at [`OUTLINE_TEXT`] and notes
    /// at [`OUTLINE_NOTES`] characters, visibly. Beyond `max_nodes` lines, nodes that are
    /// neither marked nor an ancestor of a marked one are left out, latest in tree order
    /// first, and a closing line says how many.
    pub fn outline(&self, focus: &NodeId, max_nodes: usize) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Summary: {}", self.kernel_summary.trim());
        if self.open_questions.is_empty() {
            out.push_str("Open questions: none.\n");
        } else {
            out.push_str("Open questions (settle one with `close_question` and its number):\n");
            for (i, q) in self.open_questions.iter().enumerate() {
                let _ = writeln!(out, "{}. {}", i + 1, cut(q.trim(), OUTLINE_TEXT));
            }
        }
        let settled = &self.settled_questions;
        for q in &settled[settled.len().saturating_sub(OUTLINE_SETTLED)..] {
            let _ = writeln!(
                out,
                "Settled in round {}: {} -> {}",
                q.round,
                cut(q.question.trim(), OUTLINE_TEXT),
                cut(q.answer.trim(), OUTLINE_TEXT)
            );
        }
        let sig = &self.computed_signals;
        let _ = write!(out, "Signals: round {}", sig.round_index);
        if let Some(t) = &sig.trace {
            let _ = write!(out, "; last evaluation {}", t.status);
            if let Some(s) = t.speedup {
                let _ = write!(out, ", score {s:.3}");
            }
            if let Some(l) = t.latency_ms {
                let _ = write!(out, ", {l:.4} ms");
            }
            if let Some(r) = t.reference_latency_ms {
                let _ = write!(out, " (reference {r:.4} ms)");
            }
        }
        out.push_str(".\n");

        // Tree order (depth first, children in insertion order), live nodes only.
        let mut order: Vec<(usize, &Node)> = Vec::new();
        let mut seen = BTreeSet::new();
        let mut stack: Vec<(usize, &Node)> = self.root().map(|r| (0, r)).into_iter().collect();
        while let Some((depth, n)) = stack.pop() {
            if !seen.insert(&n.id) {
                continue;
            }
            order.push((depth, n));
            for k in self.children(&n.id).into_iter().rev() {
                stack.push((depth + 1, k));
            }
        }
        let path: BTreeSet<NodeId> = self
            .path_to_root(focus)
            .unwrap_or_default()
            .into_iter()
            .collect();
        let frontier: BTreeSet<&NodeId> = self.frontier().into_iter().map(|n| &n.id).collect();
        let marked = |n: &Node| path.contains(&n.id) || frontier.contains(&n.id);
        // Ancestors of marked nodes stay so every shown node hangs under its shown parent.
        let mut keep: BTreeSet<&NodeId> = BTreeSet::new();
        for (_, n) in &order {
            if marked(n) {
                for id in self.path_to_root(&n.id).unwrap_or_default() {
                    if let Some(k) = self.node(&id) {
                        keep.insert(&k.id);
                    }
                }
            }
        }
        let mut shown: BTreeSet<&NodeId> = keep.clone();
        for (_, n) in &order {
            if shown.len() >= max_nodes.max(keep.len()) {
                break;
            }
            shown.insert(&n.id);
        }
        let left_out = order.len() - shown.len();
        let _ = writeln!(
            out,
            "Nodes ({} live; at most {} lines shown; `*` marks the path to {focus}, `>` an \
             action that can be chosen next):",
            order.len(),
            max_nodes.max(keep.len())
        );
        for (depth, n) in order.iter().filter(|(_, n)| shown.contains(&n.id)) {
            let mark = if path.contains(&n.id) {
                '*'
            } else if frontier.contains(&n.id) {
                '>'
            } else {
                ' '
            };
            let _ = write!(
                out,
                "{mark} {}{} [{}",
                "  ".repeat(*depth),
                n.id,
                n.state.kind()
            );
            if let Some(s) = n.solution() {
                let _ = write!(out, " {:.3}", s.score);
            }
            let _ = write!(out, ", rating {:.1}", n.overall_rating);
            if marked(n) {
                let _ = write!(out, ", confidence {:.2}", n.confidence);
                if let Some(a) = n.open_action() {
                    let _ = write!(
                        out,
                        ", priority {:.2}, difficulty {}",
                        a.score, a.difficulty
                    );
                    if let Some(f) = a.expected_vs_baseline_factor {
                        let _ = write!(out, ", predicts {f:.2}x");
                    }
                }
                if n.attempts > 0 {
                    let _ = write!(out, ", {} attempts, {} failed", n.attempts, n.failures);
                }
            }
            out.push(']');
            match (&n.decision, &n.choice) {
                (Some(d), Some(c)) => {
                    let _ = write!(out, " {} -> {}", cut(d, OUTLINE_TEXT), cut(c, OUTLINE_TEXT));
                }
                (Some(x), None) | (None, Some(x)) => {
                    let _ = write!(out, " {}", cut(x, OUTLINE_TEXT));
                }
                (None, None) if n.parent.is_none() => out.push_str(" (root)"),
                (None, None) => {}
            }
            if let Some(a) = n.action.as_ref().filter(|a| !a.title.is_empty()) {
                let _ = write!(out, " | {}", cut(&a.title, OUTLINE_TEXT));
            }
            out.push('\n');
            let notes = n.notes.split_whitespace().collect::<Vec<_>>().join(" ");
            if marked(n) && !notes.is_empty() {
                let _ = writeln!(
                    out,
                    "  {}  notes: {}",
                    "  ".repeat(*depth),
                    cut(&notes, OUTLINE_NOTES)
                );
            }
        }
        if left_out > 0 {
            let _ = writeln!(out, "({left_out} more nodes not shown)");
        }
        out
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
        let name = n.display_name();
        if !name.is_empty() {
            let _ = write!(line, " {name}");
        }
        let state = match &n.state {
            NodeState::Open => "open".to_owned(),
            NodeState::Closed { solution } => {
                let id: String = solution.solution_id.chars().take(12).collect();
                format!("closed: score {:.3}, source {id}", solution.score)
            }
            NodeState::TooHard { cycles } => format!("too hard after {cycles} cycle(s)"),
            NodeState::Pruned => "pruned".to_owned(),
        };
        let _ = write!(line, "  [{state}");
        if let Some(a) = n.open_action() {
            let _ = write!(line, " · d{} p{:.2}", a.difficulty, a.score);
            if let Some(f) = a.expected_vs_baseline_factor {
                let _ = write!(line, " exp {f:.2}x");
            }
        }
        let _ = write!(
            line,
            " · r{:.1} c{:.2} · {} attempt(s), {} failed",
            n.overall_rating, n.confidence, n.attempts, n.failures
        );
        if n.id == self.active_leaf_id {
            line.push_str(" · active");
        }
        line.push(']');
        line
    }
}
