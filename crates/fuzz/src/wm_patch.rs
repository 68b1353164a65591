//! `wm_patch`: an edit in the patch language (canonical or original dialect) applied to a
//! world model that has every node state, and the same bytes read as a world-model document.
//!
//! Properties: parsing never panics; every parse error and every rejection has a message; a
//! rejected edit leaves the model byte-identical; an accepted one leaves it valid (invariants,
//! serde round trip), and the projections and selection policies work on the result.

use std::sync::OnceLock;

use ksearch_search::selection::{CalibratedPolicy, KSearchPolicy, SelectionPolicy};
use ksearch_search::world_model::{Edit, NodeId, SolutionRef, WorldModel};

use crate::assert_message;

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(wm) = WorldModel::from_json(&text) {
        // `from_json` validates: what it accepts must be usable everywhere.
        exercise(&wm);
        apply(&wm, &text);
    } else if let Err(e) = WorldModel::from_json(&text) {
        assert_message("world model document", &e.to_string());
    }
    apply(fixture(), &text);
}

/// Parses `text` as an edit and applies it to a copy of `wm`.
fn apply(wm: &WorldModel, text: &str) {
    let edit = match Edit::from_json_str(text) {
        Ok(e) => e,
        Err(errors) => {
            assert!(!errors.is_empty(), "an edit rejected without errors");
            for e in &errors {
                assert_message("edit parse", &e.to_string());
            }
            return;
        }
    };
    check_apply(wm, &edit, "apply_edit", true);
}

/// Applies `edit` to a copy of `wm`: accepted, the model stays valid and round-trips (and,
/// with `deep`, serves every reader); rejected, with messages and no change.
pub(crate) fn check_apply(wm: &WorldModel, edit: &Edit, what: &str, deep: bool) {
    let before = wm.to_json().expect("a valid model serialises");
    let mut after = wm.clone();
    match after.apply_edit(edit, 7) {
        Ok(_) => {
            if let Err(v) = after.validate() {
                panic!("{what}: an accepted edit broke the invariants: {v:?}\nedit: {edit:?}");
            }
            let json = after.to_json().expect("a valid model serialises");
            let back = WorldModel::from_json(&json)
                .unwrap_or_else(|e| panic!("{what}: an edited model does not load back: {e}"));
            assert_eq!(
                back.to_json().unwrap(),
                json,
                "{what}: round trip changed the model"
            );
            if deep {
                exercise(&after);
            }
        }
        Err(errors) => {
            assert!(!errors.is_empty(), "{what}: rejected without errors");
            for e in &errors {
                assert_message(what, &e.to_string());
            }
            assert_eq!(
                after.to_json().unwrap(),
                before,
                "{what}: a rejected edit changed the model"
            );
        }
    }
}

/// Everything that reads a model: projections for prompts and `show`, and both selection
/// policies.
fn exercise(wm: &WorldModel) {
    for budget in [0, 200, 6_000] {
        let compact = wm.compact_json(budget);
        serde_json::from_str::<serde_json::Value>(&compact)
            .unwrap_or_else(|e| panic!("compact_json({budget}) is not JSON: {e}"));
    }
    let _ = wm.frontier_listing(10);
    let _ = wm.render_tree();
    let _ = wm.best_closed();
    for n in wm.nodes() {
        let _ = wm.path_to_root(&n.id);
        let _ = wm.subtree_best_score(&n.id);
    }
    let policies: [&dyn SelectionPolicy; 3] = [
        &KSearchPolicy::default(),
        &CalibratedPolicy::default(),
        &CalibratedPolicy::template_backed(),
    ];
    for p in policies {
        let ranked = p.rank(wm);
        if let Some(id) = p.choose(wm) {
            assert!(
                wm.frontier().iter().any(|n| n.id == id),
                "{} chose `{id}`, which is not on the frontier",
                p.name()
            );
        }
        for c in ranked {
            let _ = c.to_string();
        }
    }
}

/// A model with a closed root, closed, open, blocked, too-hard and pruned nodes, so edits meet
/// every state. Ids: n1 (closed), n2 (too hard), n3 (open under n1), n4 (pruned), n5 (open,
/// blocked under n3), n6 (open).
pub fn fixture() -> &'static WorldModel {
    static WM: OnceLock<WorldModel> = OnceLock::new();
    WM.get_or_init(build_fixture)
}

fn build_fixture() -> WorldModel {
    let mut wm = WorldModel::new_root("fixture kernel", vec!["what limits it?".into()]);
    let root = wm.root_id().clone();
    let sol = |id: &str, score: f64, round: u32| SolutionRef {
        solution_id: id.into(),
        parent_solution_id: None,
        score,
        speedup_vs_baseline: Some(score),
        latency_ms: Some(1.0 / score),
        round,
    };
    wm.attach_solution(&root, sol("s0", 1.0, 0)).unwrap();
    let edit = |wm: &mut WorldModel, json: &str, round: u32| {
        let e = Edit::from_json_str(json).unwrap();
        wm.apply_edit(&e, round).unwrap();
    };
    edit(
        &mut wm,
        r#"{"ops": [
          {"op": "insert", "parent_id": "root", "node": {"label": "a", "decision": "tile",
           "choice": "64x64", "overall_rating": 7, "confidence": 0.6,
           "action": {"title": "tile 64x64", "difficulty": 2, "score": 0.8,
                      "expected_vs_baseline_factor": 2.0, "knobs": {"tile": 64}}}},
          {"op": "insert", "parent_id": "root", "node": {"label": "b",
           "action": {"title": "vectorise", "difficulty": 3, "score": 0.5}}},
          {"op": "insert", "parent_id": "a", "node": {"label": "c",
           "action": {"title": "unroll x4", "difficulty": 2, "score": 0.6,
                      "expected_vs_baseline_factor": 2.5}}}
        ]}"#,
        1,
    );
    let n = |s: &str| NodeId::new(s);
    wm.begin_cycle(&n("n1")).unwrap();
    wm.record_attempt(&n("n1"), true).unwrap();
    wm.attach_solution(&n("n1"), sol("s1", 1.8, 2)).unwrap();
    wm.begin_cycle(&n("n2")).unwrap();
    wm.record_attempt(&n("n2"), false).unwrap();
    wm.mark_too_hard(&n("n2")).unwrap();
    edit(
        &mut wm,
        r#"{"ops": [
          {"op": "insert", "parent_id": "root", "node": {"label": "d",
           "action": {"title": "to be deleted", "score": 0.1}}},
          {"op": "insert", "parent_id": "n3", "node": {"label": "e",
           "action": {"title": "after unroll: prefetch", "difficulty": 4, "score": 0.9}}},
          {"op": "insert", "parent_id": "root", "node": {"label": "f",
           "impacts": {"memory_bandwidth": {"rating": 6, "risk": "low", "notes": "streams"}},
           "action": {"title": "fuse passes", "difficulty": 1, "score": 0.7}}}
        ]}"#,
        3,
    );
    edit(
        &mut wm,
        r#"{"ops": [{"op": "delete", "node_id": "n4"}]}"#,
        3,
    );
    wm.set_active_leaf(&n("n3")).unwrap();
    wm.validate().expect("the fixture is valid");
    wm
}
