//! Projections: `render_tree`, `compact_json` and `frontier_listing` on a small fixture tree
//! (insta snapshots), and the compact view's size budget.

use ksearch_search::world_model::{Edit, NodeId, PatchOp, SolutionRef, Trace, WorldModel};
use serde_json::{json, Value};

fn id(s: &str) -> NodeId {
    NodeId::new(s)
}

fn solution(sid: &str, score: f64, round: u32) -> SolutionRef {
    SolutionRef {
        solution_id: sid.into(),
        parent_solution_id: None,
        score,
        speedup_vs_baseline: Some(score),
        latency_ms: Some(2.0 / score),
        round,
    }
}

/// root (seed 1.0) ─ n1 tile 64x64 (closed 1.8) ─ n4 unroll (open, active)
///                 │                            ├ n5 double buffer (open)
///                 │                            └ n6 tensor cores (too hard)
///                 ├ n2 vector loads (closed 1.2)
///                 └ n3 prefetch (pruned)
fn fixture() -> WorldModel {
    let mut wm = WorldModel::new_root(
        "Row softmax over f32, memory bound: one read and one write per element.",
        vec![
            "Does the row fit in cache?".into(),
            "Is exp the bottleneck?".into(),
        ],
    );
    wm.attach_solution(&id("root"), solution("seed", 1.0, 0))
        .unwrap();
    let e: Edit = serde_json::from_value(json!({"ops": [
        {"op": "insert", "parent_id": "root", "node": {
            "decision": "tiling", "choice": "64x64", "overall_rating": 7, "confidence": 0.6,
            "notes": "long notes that the compact view drops",
            "action": {"title": "tile 64x64", "difficulty": 2, "score": 0.8,
                       "expected_vs_baseline_factor": 2.0}}},
        {"op": "insert", "parent_id": "root", "node": {
            "decision": "loads", "choice": "float4", "overall_rating": 6,
            "action": {"title": "vector loads", "difficulty": 1, "score": 0.6}}},
        {"op": "insert", "parent_id": "root", "node": {
            "decision": "prefetch", "choice": "software", "overall_rating": 3,
            "action": {"title": "prefetch", "difficulty": 3, "score": 0.2}}}
    ]}))
    .unwrap();
    wm.apply_edit(&e, 1).unwrap();
    wm.begin_cycle(&id("n1")).unwrap();
    wm.record_attempt(&id("n1"), false).unwrap();
    wm.record_attempt(&id("n1"), true).unwrap();
    wm.attach_solution(&id("n1"), solution("s1", 1.8, 2))
        .unwrap();
    wm.attach_solution(&id("n2"), solution("s2", 1.2, 3))
        .unwrap();
    let e: Edit = serde_json::from_value(json!({"ops": [
        {"op": "insert", "parent_id": "n1", "node": {
            "decision": "unroll", "choice": "x4", "overall_rating": 8, "confidence": 0.7,
            "action": {"title": "unroll the inner loop x4", "difficulty": 2, "score": 0.7,
                       "expected_vs_baseline_factor": 2.2}}},
        {"op": "insert", "parent_id": "n1", "node": {
            "decision": "pipelining", "choice": "double buffer", "overall_rating": 6.5,
            "action": {"title": "double buffer", "difficulty": 3, "score": 0.5}}},
        {"op": "insert", "parent_id": "n1", "node": {
            "decision": "math", "choice": "tensor cores", "overall_rating": 9,
            "action": {"title": "tensor cores", "difficulty": 5, "score": 0.9}}},
        {"op": "delete", "node_id": "n3"}
    ]}))
    .unwrap();
    // n3 (prefetch) is deleted; the new nodes are n4, n5, n6.
    wm.apply_edit(&e, 3).unwrap();
    wm.begin_cycle(&id("n6")).unwrap();
    wm.record_attempt(&id("n6"), false).unwrap();
    wm.mark_too_hard(&id("n6")).unwrap();
    wm.begin_cycle(&id("n4")).unwrap();
    wm.record_attempt(&id("n4"), false).unwrap();
    wm.record_signals(
        4,
        Some(Trace {
            status: "incorrect".into(),
            latency_ms: Some(1.5),
            reference_latency_ms: Some(3.0),
            speedup: None,
            ..Trace::default()
        }),
    );
    wm.validate().unwrap();
    wm
}

#[test]
fn render_tree_snapshot() {
    insta::assert_snapshot!(fixture().render_tree());
}

#[test]
fn compact_json_snapshot() {
    let text = fixture().compact_json(50_000);
    let v: Value = serde_json::from_str(&text).unwrap();
    insta::assert_json_snapshot!(v);
}

#[test]
fn frontier_listing_snapshot() {
    insta::assert_snapshot!(fixture().frontier_listing(10));
}

#[test]
fn frontier_listing_respects_max_and_empty_frontier() {
    let wm = fixture();
    assert_eq!(wm.frontier_listing(1).lines().count(), 1);
    let empty = WorldModel::new_root("k", vec![]);
    assert_eq!(empty.frontier_listing(5), "(no executable open actions)\n");
}

#[test]
fn compact_json_drops_nodes_not_text_and_keeps_the_leaf_last() {
    let wm = fixture();
    let full = wm.compact_json(usize::MAX);
    let full_len = full.chars().count();
    let mut last_nodes: Vec<String> = Vec::new();
    let mut saw_leaf_only = false;
    for budget in (0..=full_len).rev().step_by(7) {
        let text = wm.compact_json(budget);
        // Always complete JSON, always within budget (or the minimal "{}").
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(
            text.chars().count() <= budget || text == "{}",
            "{budget}: {text}"
        );
        let nodes: Vec<String> = v["nodes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|n| n["id"].as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        // Nodes disappear one way only: a smaller budget never brings one back.
        assert!(nodes
            .iter()
            .all(|n| last_nodes.is_empty() || last_nodes.contains(n)));
        if nodes == ["n4"] {
            saw_leaf_only = true;
        }
        if !nodes.is_empty() {
            let omitted = v["omitted_nodes"].as_u64().unwrap_or(0) as usize;
            assert_eq!(nodes.len() + omitted, 5, "path of 3 + 2 siblings");
        }
        last_nodes = nodes;
    }
    assert!(saw_leaf_only, "the active leaf is the last node kept");
    // Too-hard siblings are still siblings; pruned ones are not.
    let v: Value = serde_json::from_str(&full).unwrap();
    let ids: Vec<&str> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["root", "n1", "n4", "n6", "n5"]);
    assert!(!full.contains("long notes"));
}

#[test]
fn compact_json_shrinks_the_summary_only_after_all_nodes_are_gone() {
    let mut wm = fixture();
    wm.set_kernel_summary("x".repeat(5_000));
    let text = wm.compact_json(1_000);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(text.chars().count() <= 1_000);
    assert!(v.get("nodes").unwrap().as_array().unwrap().is_empty());
    let summary = v["kernel_summary"].as_str().unwrap();
    assert!(
        summary.contains("… [+") && summary.ends_with(" characters]") && summary.len() > 500,
        "{summary}"
    );
    assert_eq!(wm.compact_json(1), "{}");
}

#[test]
fn compact_json_is_deterministic_and_ignores_unrelated_edits() {
    let mut wm = fixture();
    let before = wm.compact_json(2_600);
    assert_eq!(before, wm.compact_json(2_600));
    // Notes are not part of the compact view.
    let e = Edit {
        ops: vec![PatchOp::Update {
            node_id: id("n2"),
            set: serde_json::from_value(json!({"notes": "more notes"})).unwrap(),
        }],
        active_leaf_id: None,
    };
    wm.apply_edit(&e, 5).unwrap();
    assert_eq!(before, wm.compact_json(2_600));
}

#[test]
fn outline_snapshot() {
    let mut wm = fixture();
    wm.record_signals(
        4,
        Some(Trace {
            status: "passed".into(),
            latency_ms: Some(1.1),
            reference_latency_ms: Some(3.3),
            speedup: Some(1.8),
            ..Trace::default()
        }),
    );
    insta::assert_snapshot!(wm.outline(&id("n4"), 40));
}

#[test]
fn outline_lists_every_live_node_with_detail_only_where_marked() {
    let wm = fixture();
    let text = wm.outline(&id("n4"), 40);
    // Every live node has a line; the pruned one has none.
    for n in ["root", "n1", "n2", "n4", "n5", "n6"] {
        assert!(
            text.lines().any(|l| l
                .trim_start_matches(['*', '>', ' '])
                .starts_with(&format!("{n} ["))),
            "{n}: {text}"
        );
    }
    assert!(!text.contains("n3 ["), "{text}");
    let line = |n: &str| {
        text.lines()
            .find(|l| {
                l.trim_start_matches(['*', '>', ' '])
                    .starts_with(&format!("{n} ["))
            })
            .unwrap()
            .to_string()
    };
    // The path to the focus and the frontier carry detail, the others do not.
    assert!(
        line("n4").starts_with('*') && line("n4").contains("priority"),
        "{text}"
    );
    assert!(
        line("n5").starts_with('>') && line("n5").contains("priority"),
        "{text}"
    );
    assert!(!line("n2").contains("confidence"), "{text}");
    assert!(
        text.contains("notes: long notes"),
        "notes of the path are shown: {text}"
    );
    assert!(!text.contains("more nodes not shown"));
}

#[test]
fn outline_cuts_long_texts_visibly_and_caps_the_node_count() {
    let mut wm = fixture();
    let long = "c".repeat(300);
    let e: Edit = serde_json::from_value(json!({"ops": [
        {"op": "update", "node_id": "n2", "set": {"choice": long}}
    ]}))
    .unwrap();
    wm.apply_edit(&e, 5).unwrap();
    let text = wm.outline(&id("n4"), 40);
    assert!(
        text.contains(&format!("{}… [+100 characters]", "c".repeat(200))),
        "{text}"
    );
    // Over the cap, unmarked nodes go first and the cut is counted; marked nodes and their
    // ancestors stay.
    let text = wm.outline(&id("n4"), 2);
    assert!(text.contains("(2 more nodes not shown)"), "{text}");
    assert!(!text.contains("n2 [") && !text.contains("n6 ["), "{text}");
    for n in ["root [", "n1 [", "n4 [", "n5 ["] {
        assert!(text.contains(n), "{n}: {text}");
    }
}
