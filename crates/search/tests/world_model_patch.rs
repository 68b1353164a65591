//! Unit tests of the world model's system operations and of the patch language: every
//! rejection reason, atomicity, clamping, id assignment and the lenient dialect parser.

use ksearch_search::world_model::{
    ActionPatch, Edit, NodeId, NodePatch, NodeState, PatchError, PatchOp, SolutionRef, WorldModel,
    WorldModelError, MAX_NEW_NODES_PER_EDIT,
};
use serde_json::json;

fn id(s: &str) -> NodeId {
    NodeId::new(s)
}

fn action(title: &str, difficulty: f64, score: f64) -> NodePatch {
    NodePatch {
        action: Some(ActionPatch {
            title: Some(title.into()),
            difficulty: Some(difficulty),
            score: Some(Some(score)),
            ..ActionPatch::default()
        }),
        ..NodePatch::default()
    }
}

fn solution(sid: &str, score: f64) -> SolutionRef {
    SolutionRef {
        solution_id: sid.into(),
        parent_solution_id: None,
        score,
        speedup_vs_baseline: Some(score),
        latency_ms: Some(1.0),
        round: 1,
    }
}

/// root (seeded, closed) ─ n1 (closed) ─ n3 (open)
///                       └ n2 (open)
fn fixture() -> WorldModel {
    let mut wm = WorldModel::new_root("summary", vec!["q1".into()]);
    wm.attach_solution(&id("root"), solution("seed", 1.0))
        .unwrap();
    let n1 = wm
        .insert_child(&id("root"), &action("tile", 2.0, 0.8), 1)
        .unwrap();
    let n2 = wm
        .insert_child(&id("root"), &action("vectorize", 3.0, 0.6), 1)
        .unwrap();
    wm.attach_solution(&n1, solution("s1", 1.5)).unwrap();
    let n3 = wm
        .insert_child(&n1, &action("unroll", 2.0, 0.7), 2)
        .unwrap();
    assert_eq!((n1.as_str(), n2.as_str(), n3.as_str()), ("n1", "n2", "n3"));
    wm
}

fn edit(ops: Vec<PatchOp>) -> Edit {
    Edit {
        ops,
        active_leaf_id: None,
    }
}

fn update(node: &str, set: NodePatch) -> PatchOp {
    PatchOp::Update {
        node_id: id(node),
        set,
    }
}

fn insert(parent: &str, node: NodePatch) -> PatchOp {
    PatchOp::Insert {
        parent_id: id(parent),
        parent_solution_id: None,
        node,
    }
}

fn delete(node: &str) -> PatchOp {
    PatchOp::Delete { node_id: id(node) }
}

/// Applies an edit that must be rejected; checks the tree is byte-identical afterwards.
fn rejected(wm: &mut WorldModel, e: &Edit) -> Vec<PatchError> {
    let before = wm.to_json().unwrap();
    let errs = wm.apply_edit(e, 9).expect_err("edit should be rejected");
    assert_eq!(
        wm.to_json().unwrap(),
        before,
        "rejected edit changed the tree"
    );
    errs
}

fn with_unknown(key: &str, value: serde_json::Value) -> NodePatch {
    let mut p = NodePatch::default();
    p.unknown.insert(key.into(), value);
    p
}

// ---------- system operations ----------

#[test]
fn new_root_is_valid_and_active() {
    let wm = WorldModel::new_root("k", vec![]);
    assert!(wm.validate().is_ok());
    assert_eq!(wm.active_leaf_id().as_str(), "root");
    assert!(wm.frontier().is_empty());
    assert!(wm.best_closed().is_none());
}

#[test]
fn attach_fills_lineage_and_closes() {
    let wm = fixture();
    let n1 = wm.node(&id("n1")).unwrap();
    let sol = n1.solution().unwrap();
    assert_eq!(sol.parent_solution_id.as_deref(), Some("seed"));
    assert_eq!(n1.best_score, Some(1.5));
    assert!(wm.node(&id("root")).unwrap().is_closed());
}

#[test]
fn attach_rejects_bad_targets_and_values() {
    let mut wm = fixture();
    assert!(matches!(
        wm.attach_solution(&id("n1"), solution("again", 2.0)),
        Err(WorldModelError::WrongState { .. })
    ));
    assert!(matches!(
        wm.attach_solution(&id("zz"), solution("x", 2.0)),
        Err(WorldModelError::UnknownNode(_))
    ));
    assert!(matches!(
        wm.attach_solution(&id("n2"), solution("  ", 2.0)),
        Err(WorldModelError::InvalidSolution { .. })
    ));
    assert!(matches!(
        wm.attach_solution(&id("n2"), solution("x", f64::NAN)),
        Err(WorldModelError::InvalidSolution { .. })
    ));
    assert!(wm.node(&id("n2")).unwrap().is_open());
}

#[test]
fn frontier_needs_root_or_closed_parent_and_excludes_too_hard() {
    let mut wm = fixture();
    // n4 under the open n2 is blocked until n2 closes.
    let n4 = wm
        .insert_child(&id("n2"), &action("blocked", 1.0, 0.9), 3)
        .unwrap();
    let ids = |wm: &WorldModel| -> Vec<String> {
        wm.frontier().iter().map(|n| n.id.to_string()).collect()
    };
    assert_eq!(ids(&wm), ["n2", "n3"]);
    wm.begin_cycle(&id("n2")).unwrap();
    wm.mark_too_hard(&id("n2")).unwrap();
    assert_eq!(ids(&wm), ["n3"]);
    assert_eq!(
        wm.node(&id("n2")).unwrap().state,
        NodeState::TooHard { cycles: 1 }
    );
    assert!(!wm.frontier().iter().any(|n| n.id == n4));
    // A structural (no-title) node is never on the frontier.
    wm.insert_child(&id("root"), &NodePatch::default(), 3)
        .unwrap();
    assert_eq!(ids(&wm), ["n3"]);
}

#[test]
fn mark_too_hard_guards() {
    let mut wm = fixture();
    assert!(matches!(
        wm.mark_too_hard(&id("root")),
        Err(WorldModelError::RootNotAllowed(_))
    ));
    assert!(matches!(
        wm.mark_too_hard(&id("n1")),
        Err(WorldModelError::WrongState { .. })
    ));
}

#[test]
fn counters_and_visits() {
    let mut wm = fixture();
    wm.begin_cycle(&id("n3")).unwrap();
    wm.record_attempt(&id("n3"), false).unwrap();
    wm.record_attempt(&id("n3"), true).unwrap();
    let n3 = wm.node(&id("n3")).unwrap();
    assert_eq!(
        (n3.attempts, n3.failures, n3.cycles, n3.visits),
        (2, 1, 1, 1)
    );
    assert_eq!(wm.node(&id("n1")).unwrap().visits, 1);
    assert_eq!(wm.node(&id("root")).unwrap().visits, 1);
    assert_eq!(wm.node(&id("n2")).unwrap().visits, 0);
    assert_eq!(wm.active_leaf_id().as_str(), "n3");
    assert!(matches!(
        wm.begin_cycle(&id("n1")),
        Err(WorldModelError::WrongState { .. })
    ));
}

#[test]
fn best_closed_ties_go_to_larger_id() {
    let mut wm = fixture();
    wm.attach_solution(&id("n2"), solution("s2", 1.5)).unwrap();
    assert_eq!(wm.best_closed().unwrap().id.as_str(), "n2");
    wm.attach_solution(&id("n3"), solution("s3", 1.4)).unwrap();
    assert_eq!(wm.best_closed().unwrap().id.as_str(), "n2");
    assert_eq!(wm.subtree_best_score(&id("n1")), Some(1.5));
    assert_eq!(wm.subtree_best_score(&id("root")), Some(1.5));
}

#[test]
fn path_to_root_and_validate_survive_a_corrupted_cycle() {
    let mut v: serde_json::Value = serde_json::from_str(&fixture().to_json().unwrap()).unwrap();
    // Make n1 and n3 each other's parent.
    for n in v["nodes"].as_array_mut().unwrap() {
        if n["id"] == "n1" {
            n["parent"] = json!("n3");
        }
    }
    let text = v.to_string();
    let raw: WorldModel = serde_json::from_str(&text).unwrap();
    assert!(matches!(
        raw.path_to_root(&id("n3")),
        Err(WorldModelError::BrokenPath(_))
    ));
    let errs = raw.validate().unwrap_err();
    assert!(errs.iter().any(|e| e.to_string().contains("cycle")));
    // Rendering terminates and lists the unreachable nodes.
    assert!(raw.render_tree().contains("(detached)"));
    assert!(matches!(
        WorldModel::from_json(&text),
        Err(WorldModelError::Invalid(_))
    ));
}

#[test]
fn from_json_rejects_duplicate_ids_and_unknown_parent() {
    let mut v: serde_json::Value = serde_json::from_str(&fixture().to_json().unwrap()).unwrap();
    let nodes = v["nodes"].as_array_mut().unwrap();
    let dup = nodes[1].clone();
    nodes.push(dup);
    nodes[2]["parent"] = json!("ghost");
    let err = WorldModel::from_json(&v.to_string())
        .unwrap_err()
        .to_string();
    assert!(err.contains("duplicate node id `n1`"), "{err}");
    assert!(err.contains("missing parent `ghost`"), "{err}");
}

#[test]
fn ids_stay_unique_when_a_loaded_model_already_uses_the_next_id() {
    let mut v: serde_json::Value = serde_json::from_str(&fixture().to_json().unwrap()).unwrap();
    v["next_seq"] = json!(2); // n2 and n3 exist; the counter must skip them
    let mut wm = WorldModel::from_json(&v.to_string()).unwrap();
    let new = wm
        .insert_child(&id("root"), &action("x", 1.0, 0.1), 4)
        .unwrap();
    assert_eq!(new.as_str(), "n4");
    assert!(wm.validate().is_ok());
}

// ---------- successful edits ----------

#[test]
fn update_clamps_like_the_original_normaliser() {
    let mut wm = fixture();
    let set = NodePatch {
        overall_rating: Some(15.0),
        confidence: Some(-0.5),
        action: Some(ActionPatch {
            difficulty: Some(9.7),
            score: Some(Some(2.0)),
            ..ActionPatch::default()
        }),
        ..NodePatch::default()
    };
    wm.apply_edit(&edit(vec![update("n2", set)]), 4).unwrap();
    let n2 = wm.node(&id("n2")).unwrap();
    assert_eq!(n2.overall_rating, 10.0);
    assert_eq!(n2.confidence, 0.0);
    let a = n2.action.as_ref().unwrap();
    assert_eq!((a.difficulty, a.score), (5, 1.0));
    assert_eq!(a.title, "vectorize", "absent fields are unchanged");
    assert_eq!(n2.last_updated_round, 4);

    let low = NodePatch {
        action: Some(ActionPatch {
            difficulty: Some(-3.0),
            score: Some(Some(-1.0)),
            ..ActionPatch::default()
        }),
        ..NodePatch::default()
    };
    wm.apply_edit(&edit(vec![update("n2", low)]), 5).unwrap();
    let a = wm.node(&id("n2")).unwrap().action.clone().unwrap();
    assert_eq!((a.difficulty, a.score), (1, 0.0));
}

#[test]
fn score_defaults_to_rating_over_ten() {
    let mut wm = fixture();
    let node = NodePatch {
        overall_rating: Some(7.0),
        action: Some(ActionPatch {
            title: Some("  fuse  ".into()),
            ..ActionPatch::default()
        }),
        ..NodePatch::default()
    };
    let report = wm.apply_edit(&edit(vec![insert("n1", node)]), 3).unwrap();
    let (new, _) = &report.inserted[0];
    let a = wm.node(new).unwrap().action.clone().unwrap();
    assert_eq!(a.score, 0.7);
    assert_eq!(a.title, "fuse", "titles are trimmed");
    assert_eq!(a.difficulty, 3);

    // An explicit null score recomputes from the (patched) rating.
    let set = NodePatch {
        overall_rating: Some(4.0),
        action: Some(ActionPatch {
            score: Some(None),
            ..ActionPatch::default()
        }),
        ..NodePatch::default()
    };
    wm.apply_edit(&edit(vec![update(new.as_str(), set)]), 4)
        .unwrap();
    assert_eq!(wm.node(new).unwrap().action.as_ref().unwrap().score, 0.4);
}

#[test]
fn new_ids_are_system_assigned_and_labels_resolve_within_the_edit() {
    let mut wm = fixture();
    let mut a = action("a", 2.0, 0.5);
    a.label = Some("n1".into()); // a label that equals an existing id never shadows it
    let mut b = action("b", 2.0, 0.5);
    b.label = Some("mine".into());
    let e = Edit {
        ops: vec![
            insert("n1", a),
            insert("n1", b),
            update(
                "mine",
                NodePatch {
                    notes: Some("edited via label".into()),
                    ..NodePatch::default()
                },
            ),
        ],
        active_leaf_id: Some(id("mine")),
    };
    let report = wm.apply_edit(&e, 5).unwrap();
    let new: Vec<&str> = report.inserted.iter().map(|(i, _)| i.as_str()).collect();
    assert_eq!(new, ["n4", "n5"]);
    assert_eq!(wm.node(&id("n5")).unwrap().notes, "edited via label");
    assert_eq!(wm.node(&id("n5")).unwrap().label.as_deref(), Some("mine"));
    assert_eq!(wm.node(&id("n5")).unwrap().created_round, 5);
    assert_eq!(wm.active_leaf_id().as_str(), "n5");
    assert_eq!(report.updated, [id("n5")]);
    // `n1` still means the existing node.
    assert_eq!(wm.node(&id("n1")).unwrap().notes, "");
}

#[test]
fn split_patches_the_node_and_adds_children() {
    let mut wm = fixture();
    let e = edit(vec![PatchOp::Split {
        node_id: id("n3"),
        set: NodePatch {
            notes: Some("split into two".into()),
            ..NodePatch::default()
        },
        children: vec![action("unroll x2", 1.0, 0.5), action("unroll x4", 2.0, 0.6)],
    }]);
    let report = wm.apply_edit(&e, 6).unwrap();
    assert_eq!(report.inserted.len(), 2);
    let kids: Vec<&str> = wm
        .children(&id("n3"))
        .iter()
        .map(|n| n.id.as_str())
        .collect();
    assert_eq!(kids, ["n4", "n5"]);
    assert_eq!(wm.node(&id("n3")).unwrap().notes, "split into two");
}

#[test]
fn delete_prunes_and_moves_the_active_leaf_to_the_parent() {
    let mut wm = fixture();
    wm.set_active_leaf(&id("n3")).unwrap();
    let report = wm.apply_edit(&edit(vec![delete("n3")]), 7).unwrap();
    assert_eq!(report.deleted, [id("n3")]);
    assert_eq!(wm.node(&id("n3")).unwrap().state, NodeState::Pruned);
    assert_eq!(wm.active_leaf_id().as_str(), "n1");
    assert!(wm.children(&id("n1")).is_empty());
    // A node whose only children are pruned is childless again.
    let n4 = wm
        .insert_child(&id("n2"), &action("x", 1.0, 0.1), 7)
        .unwrap();
    wm.apply_edit(&edit(vec![delete(n4.as_str()), delete("n2")]), 8)
        .unwrap();
    assert!(wm.node(&id("n2")).unwrap().is_pruned());
}

#[test]
fn impacts_merge_per_dimension_and_knobs_replace() {
    let mut wm = fixture();
    let first = serde_json::from_value::<NodePatch>(json!({
        "impacts": {"memory_bandwidth": {"rating": 8, "risk": "low", "notes": "coalesced"}},
        "action": {"knobs": {"tile": 64, "unroll": 2}}
    }))
    .unwrap();
    wm.apply_edit(&edit(vec![update("n2", first)]), 1).unwrap();
    let second = serde_json::from_value::<NodePatch>(json!({
        "impacts": {"memory_bandwidth": {"rating": 12}},
        "action": {"knobs": {"tile": 128}}
    }))
    .unwrap();
    wm.apply_edit(&edit(vec![update("n2", second)]), 2).unwrap();
    let n2 = wm.node(&id("n2")).unwrap();
    assert_eq!(n2.impacts.memory_bandwidth.rating, 10.0);
    assert_eq!(n2.impacts.memory_bandwidth.risk, "low");
    assert_eq!(n2.impacts.memory_bandwidth.notes, "coalesced");
    let knobs = &n2.action.as_ref().unwrap().knobs;
    assert_eq!(knobs.len(), 1);
    assert_eq!(knobs["tile"], json!(128));
}

#[test]
fn root_decision_cannot_be_set_but_clearing_is_a_no_op() {
    let mut wm = fixture();
    let clear =
        serde_json::from_value::<NodePatch>(json!({"decision": null, "notes": "root notes"}))
            .unwrap();
    wm.apply_edit(&edit(vec![update("root", clear)]), 1)
        .unwrap();
    assert_eq!(wm.root().unwrap().notes, "root notes");
    let set = serde_json::from_value::<NodePatch>(json!({"decision": "d", "choice": "c"})).unwrap();
    let errs = rejected(&mut wm, &edit(vec![update("root", set)]));
    assert_eq!(
        errs,
        [
            PatchError::RootField {
                op: 0,
                field: "set.decision".into()
            },
            PatchError::RootField {
                op: 0,
                field: "set.choice".into()
            }
        ]
    );
}

// ---------- rejections ----------

#[test]
fn system_owned_fields_are_rejected_by_name() {
    let mut wm = fixture();
    for field in [
        "solution_id",
        "solution_ref",
        "state",
        "parent_id",
        "node_id",
        "attempts",
        "failures",
        "visits",
        "best_score",
    ] {
        let e = edit(vec![update("n1", with_unknown(field, json!("hijack")))]);
        let errs = rejected(&mut wm, &e);
        assert_eq!(
            errs,
            [PatchError::SystemField {
                op: 0,
                field: format!("set.{field}")
            }]
        );
        assert!(errs[0].to_string().contains(field));
    }
    assert_eq!(
        wm.node(&id("n1")).unwrap().solution().unwrap().solution_id,
        "s1"
    );
}

#[test]
fn unknown_fields_are_rejected_at_every_level() {
    let mut wm = fixture();
    let set = serde_json::from_value::<NodePatch>(json!({
        "colour": "red",
        "action": {"title": "t", "speed": 3},
        "impacts": {"latency": {}, "register_pressure": {"rating": 3, "why": "x"}}
    }))
    .unwrap();
    let errs = rejected(&mut wm, &edit(vec![update("n2", set)]));
    let fields: Vec<String> = errs
        .iter()
        .map(|e| match e {
            PatchError::UnknownField { field, .. } => field.clone(),
            other => panic!("unexpected {other}"),
        })
        .collect();
    assert_eq!(
        fields,
        [
            "set.colour",
            "set.impacts.latency",
            "set.impacts.register_pressure.why",
            "set.action.speed"
        ]
    );
}

#[test]
fn unknown_node_is_rejected() {
    let mut wm = fixture();
    let errs = rejected(
        &mut wm,
        &edit(vec![
            update("ghost", NodePatch::default()),
            insert("ghost2", action("a", 1.0, 0.1)),
        ]),
    );
    assert_eq!(
        errs,
        [
            PatchError::UnknownNode {
                op: 0,
                node_id: "ghost".into()
            },
            PatchError::UnknownNode {
                op: 1,
                node_id: "ghost2".into()
            }
        ]
    );
}

#[test]
fn non_finite_and_invalid_numbers_are_rejected() {
    let mut wm = fixture();
    let mut bad = action("a", f64::NAN, 0.5);
    bad.overall_rating = Some(f64::INFINITY);
    if let Some(a) = bad.action.as_mut() {
        a.expected_vs_baseline_factor = Some(Some(-2.0));
    }
    let errs = rejected(&mut wm, &edit(vec![update("n2", bad)]));
    assert_eq!(
        errs,
        [
            PatchError::NotFinite {
                op: 0,
                field: "set.overall_rating".into()
            },
            PatchError::NotFinite {
                op: 0,
                field: "set.action.difficulty".into()
            },
            PatchError::InvalidValue {
                op: 0,
                field: "set.action.expected_vs_baseline_factor".into(),
                reason: "must be > 0 (a speedup factor), got -2".into()
            }
        ]
    );
}

#[test]
fn pruned_nodes_cannot_be_edited_or_expanded() {
    let mut wm = fixture();
    wm.apply_edit(&edit(vec![delete("n2")]), 1).unwrap();
    let errs = rejected(
        &mut wm,
        &edit(vec![
            update("n2", NodePatch::default()),
            insert("n2", action("a", 1.0, 0.1)),
            delete("n2"),
        ]),
    );
    assert_eq!(errs.len(), 3);
    assert!(errs
        .iter()
        .all(|e| matches!(e, PatchError::NodePruned { .. })));
    // Deleting then editing in the same edit is also caught.
    let errs = rejected(
        &mut wm,
        &edit(vec![delete("n3"), update("n3", NodePatch::default())]),
    );
    assert_eq!(
        errs,
        [PatchError::NodePruned {
            op: 1,
            node_id: "n3".into()
        }]
    );
}

#[test]
fn too_hard_nodes_cannot_get_children() {
    let mut wm = fixture();
    wm.mark_too_hard(&id("n2")).unwrap();
    let errs = rejected(&mut wm, &edit(vec![insert("n2", action("a", 1.0, 0.1))]));
    assert!(matches!(
        &errs[..],
        [PatchError::ParentNotExpandable { op: 0, parent, .. }] if parent == "n2"
    ));
    assert!(matches!(
        wm.insert_child(&id("n2"), &action("a", 1.0, 0.1), 1),
        Err(WorldModelError::InvalidFields(_))
    ));
}

#[test]
fn parent_solution_id_must_match() {
    let mut wm = fixture();
    let op = |given: &str| PatchOp::Insert {
        parent_id: id("n1"),
        parent_solution_id: Some(given.into()),
        node: action("a", 1.0, 0.1),
    };
    let errs = rejected(&mut wm, &edit(vec![op("seed")]));
    assert_eq!(
        errs,
        [PatchError::ParentSolutionMismatch {
            op: 0,
            given: "seed".into(),
            expected: "s1".into()
        }]
    );
    wm.apply_edit(&edit(vec![op("s1")]), 1).unwrap();
}

#[test]
fn duplicate_labels_in_one_edit_are_rejected() {
    let mut wm = fixture();
    let mut a = action("a", 1.0, 0.1);
    a.label = Some("x".into());
    let errs = rejected(
        &mut wm,
        &edit(vec![insert("n1", a.clone()), insert("n1", a)]),
    );
    assert_eq!(
        errs,
        [PatchError::DuplicateLabel {
            op: 1,
            label: "x".into()
        }]
    );
}

#[test]
fn delete_only_open_childless_non_root_nodes() {
    let mut wm = fixture();
    wm.mark_too_hard(&id("n2")).unwrap();
    let errs = rejected(
        &mut wm,
        &edit(vec![delete("root"), delete("n1"), delete("n2")]),
    );
    let reasons: Vec<&str> = errs
        .iter()
        .map(|e| match e {
            PatchError::NotDeletable { reason, .. } => *reason,
            other => panic!("unexpected {other}"),
        })
        .collect();
    assert_eq!(
        reasons,
        [
            "the root cannot be deleted",
            "only open nodes can be deleted",
            "only open nodes can be deleted"
        ]
    );
    // An open node with a live child.
    let n4 = wm
        .insert_child(&id("n3"), &NodePatch::default(), 1)
        .unwrap();
    let errs = rejected(&mut wm, &edit(vec![delete("n3")]));
    assert!(matches!(
        &errs[..],
        [PatchError::NotDeletable {
            reason: "the node has children",
            ..
        }]
    ));
    assert!(wm.node(&n4).unwrap().is_open());
}

#[test]
fn insert_cap_counts_split_children() {
    let mut wm = fixture();
    let four: Vec<PatchOp> = (0..4)
        .map(|_| insert("n1", action("a", 1.0, 0.1)))
        .collect();
    let errs = rejected(&mut wm, &edit(four));
    assert_eq!(
        errs,
        [PatchError::InsertCap {
            requested: 4,
            limit: MAX_NEW_NODES_PER_EDIT
        }]
    );
    let mixed = edit(vec![
        insert("n1", action("a", 1.0, 0.1)),
        insert("n1", action("b", 1.0, 0.1)),
        PatchOp::Split {
            node_id: id("n3"),
            set: NodePatch::default(),
            children: vec![action("c", 1.0, 0.1), action("d", 1.0, 0.1)],
        },
    ]);
    let errs = rejected(&mut wm, &mixed);
    assert!(matches!(
        &errs[..],
        [PatchError::InsertCap { requested: 4, .. }]
    ));
    let three: Vec<PatchOp> = (0..3)
        .map(|_| insert("n1", action("a", 1.0, 0.1)))
        .collect();
    assert_eq!(wm.apply_edit(&edit(three), 1).unwrap().inserted.len(), 3);
}

#[test]
fn bad_active_leaf_is_rejected() {
    let mut wm = fixture();
    wm.apply_edit(&edit(vec![delete("n2")]), 1).unwrap();
    for leaf in ["ghost", "n2"] {
        let e = Edit {
            ops: vec![],
            active_leaf_id: Some(id(leaf)),
        };
        assert_eq!(
            rejected(&mut wm, &e),
            [PatchError::BadActiveLeaf {
                node_id: leaf.into()
            }]
        );
    }
}

#[test]
fn all_reasons_are_reported_and_nothing_is_applied() {
    let mut wm = fixture();
    let e = edit(vec![
        // valid on its own; must not survive the rejection
        update(
            "n2",
            NodePatch {
                notes: Some("changed".into()),
                ..NodePatch::default()
            },
        ),
        update("n1", with_unknown("solution_id", json!("evil"))),
        delete("root"),
        insert("nowhere", NodePatch::default()),
    ]);
    let errs = rejected(&mut wm, &e);
    assert_eq!(errs.len(), 3);
    assert_eq!(wm.node(&id("n2")).unwrap().notes, "");
}

// ---------- parsing ----------

#[test]
fn canonical_json_round_trips() {
    let text = r#"{"ops":[
        {"op":"update","node_id":"n2","set":{"notes":"x","action":{"score":null,"expected_vs_baseline_factor":1.5}}},
        {"op":"insert","parent_id":"n1","parent_solution_id":"s1","node":{"label":"new","decision":"tile","choice":"64","action":{"title":"t","difficulty":2}}},
        {"op":"split","node_id":"n3","children":[{"action":{"title":"c"}}]},
        {"op":"delete","node_id":"n2"}
    ],"active_leaf_id":"n1"}"#;
    let e: Edit = serde_json::from_str(text).unwrap();
    let back: Edit = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
    assert_eq!(e, back);
    // The strict and the lenient parser agree on canonical input.
    assert_eq!(Edit::from_json_str(text).unwrap(), e);
    // Explicit null survives the round trip (it means "reset the score").
    match &e.ops[0] {
        PatchOp::Update { set, .. } => {
            assert_eq!(set.action.as_ref().unwrap().score, Some(None))
        }
        other => panic!("unexpected {other:?}"),
    }
    let mut wm = fixture();
    wm.apply_edit(
        &Edit {
            ops: e.ops[..3].to_vec(),
            ..e.clone()
        },
        3,
    )
    .unwrap();
}

#[test]
fn strict_serde_rejects_unknown_op_level_keys() {
    let bad = r#"{"ops":[{"op":"insert","parent_id":"n1","node_id":"x","node":{}}]}"#;
    assert!(serde_json::from_str::<Edit>(bad).is_err());
}

#[test]
fn lenient_parser_accepts_the_original_dialect() {
    let reply = json!({
        "active_leaf_id": "n1",
        "ops": [
            {"op": "update_node", "node_id": "n2", "patch": {
                "overall_rating_0_to_10": "8.5",
                "confidence_0_to_1": 0.9,
                "node_type": "decision",
                "last_updated_round": 99,
                "impacts": {"compute_intensity_and_hw_fit": {"rating_0_to_10": 6, "notes": "ok", "hw_notes": "uses MMA"}},
                "action": {"difficulty_1_to_5": "hard", "score_0_to_1": 0.65, "expected_vs_baseline_factor": "n/a"}
            }},
            {"op": "insert_node", "parent_id": "n1", "parent_solution_id": "s1", "node": {
                "node_id": "step2", "parent_id": "n1", "node_type": "decision",
                "solution_ref": {"solution_id": null, "parent_solution_id": "s1"},
                "decision": "loads", "choice": "float4",
                "action": {"title": "vector loads", "difficulty_0_to_3": 1}
            }},
            {"op": "split_node", "node_id": "step2", "parent_patch": {"notes": "two ways"},
             "children": [{"node_id": "a", "action": {"title": "x2", "difficulty_1_to_5": 1}}]},
            {"op": "delete_node", "node_id": "n3"}
        ]
    });
    let e = Edit::from_json_value(&reply).unwrap();
    let mut wm = fixture();
    wm.apply_edit(&e, 4).unwrap();
    let n2 = wm.node(&id("n2")).unwrap();
    assert_eq!((n2.overall_rating, n2.confidence), (8.5, 0.9));
    assert_eq!(n2.last_updated_round, 4, "the LLM cannot set the round");
    assert_eq!(
        n2.impacts.compute_intensity_and_hw_fit.notes,
        "ok (hw: uses MMA)"
    );
    let a2 = n2.action.as_ref().unwrap();
    assert_eq!((a2.difficulty, a2.score), (3, 0.65));
    assert_eq!(a2.expected_vs_baseline_factor, None);
    let n4 = wm.node(&id("n4")).unwrap();
    assert_eq!(n4.label.as_deref(), Some("step2"));
    assert_eq!(n4.parent.as_ref().unwrap().as_str(), "n1");
    assert_eq!(n4.action.as_ref().unwrap().difficulty, 2);
    assert_eq!(n4.notes, "two ways");
    assert_eq!(wm.node(&id("n5")).unwrap().parent, Some(id("n4")));
    assert!(wm.node(&id("n3")).unwrap().is_pruned());
    assert_eq!(wm.active_leaf_id().as_str(), "n1");
}

#[test]
fn lenient_parser_keeps_solution_overwrites_so_they_are_rejected() {
    // The original merged `solution_ref` in update_node: this is the bug being fixed.
    let reply = json!({"ops": [
        {"op": "update_node", "node_id": "n1", "patch": {"solution_ref": {"solution_id": "bogus"}}},
        {"op": "insert_node", "parent_id": "n1", "node": {"solution_ref": {"solution_id": "fake"}}},
        {"op": "insert_node", "parent_id": "n1", "node": {"parent_id": "n2"}}
    ]});
    let e = Edit::from_json_value(&reply).unwrap();
    let mut wm = fixture();
    let errs = rejected(&mut wm, &e);
    assert_eq!(
        errs,
        [
            PatchError::SystemField {
                op: 0,
                field: "set.solution_ref".into()
            },
            PatchError::SystemField {
                op: 1,
                field: "node.solution_ref".into()
            },
            // A parent inside the node that contradicts the op's parent is not silently dropped.
            PatchError::SystemField {
                op: 2,
                field: "node.parent_id".into()
            }
        ]
    );
}

#[test]
fn lenient_parser_reports_each_bad_op() {
    let reply = json!({"ops": [
        {"op": "rename_node", "node_id": "n1"},
        {"op": "update_node"},
        "not an object",
        {"op": "split_node", "node_id": "n1", "children": 3},
        {"op": "update", "node_id": "n1", "set": {"overall_rating": "high"}}
    ]});
    let errs = Edit::from_json_value(&reply).unwrap_err();
    assert_eq!(errs.len(), 5);
    assert_eq!(
        errs[0],
        PatchError::UnknownOp {
            op: 0,
            name: "rename_node".into()
        }
    );
    for (i, e) in errs.iter().enumerate().skip(1) {
        assert!(
            matches!(e, PatchError::Malformed { op: Some(j), .. } if *j == i),
            "{e}"
        );
    }
    assert!(Edit::from_json_value(&json!({"ops": "x"})).is_err());
    assert!(Edit::from_json_value(&json!({"edits": []})).is_err());
    assert!(Edit::from_json_str("not json").is_err());
    // A bare list of ops is accepted.
    let bare = Edit::from_json_value(&json!([{"op": "delete_node", "node_id": 7}])).unwrap();
    assert_eq!(bare.ops, [delete("7")]);
}

#[test]
fn set_summary_replaces_the_summary_and_refuses_an_empty_one() {
    let mut wm = fixture();
    let e = Edit::from_json_str(
        r#"{"ops": [{"op": "set_summary", "kernel_summary": "  memory bound; one pass wins  "}]}"#,
    )
    .unwrap();
    wm.apply_edit(&e, 3).unwrap();
    assert_eq!(wm.kernel_summary(), "memory bound; one pass wins");
    let e =
        Edit::from_json_str(r#"{"ops": [{"op": "set_summary", "kernel_summary": " "}]}"#).unwrap();
    let errs = wm.apply_edit(&e, 4).unwrap_err();
    assert!(errs[0].to_string().contains("kernel_summary"), "{errs:?}");
    assert_eq!(wm.kernel_summary(), "memory bound; one pass wins");
    // A missing field is a parse error naming it.
    let errs = Edit::from_json_str(r#"{"ops": [{"op": "set_summary"}]}"#).unwrap_err();
    assert!(
        errs[0]
            .to_string()
            .contains("missing field `kernel_summary`"),
        "{errs:?}"
    );
}

#[test]
fn close_question_settles_questions_by_their_number_before_the_edit() {
    let mut wm = WorldModel::new_root("s", vec!["q1".into(), "q2".into(), "q3".into()]);
    // Numbers refer to the list as shown, whatever order the ops come in.
    let e = Edit::from_json_str(
        r#"{"ops": [{"op": "close_question", "question": 3, "answer": "yes"},
                    {"op": "close_question", "question": 1, "answer": "no, 2x slower"}]}"#,
    )
    .unwrap();
    let report = wm.apply_edit(&e, 5).unwrap();
    assert_eq!(report.closed_questions, 2);
    assert_eq!(wm.open_questions(), ["q2".to_string()]);
    let settled: Vec<(&str, &str, u32)> = wm
        .settled_questions()
        .iter()
        .map(|q| (q.question.as_str(), q.answer.as_str(), q.round))
        .collect();
    assert_eq!(settled, [("q3", "yes", 5), ("q1", "no, 2x slower", 5)]);
    // The settled questions survive a round trip through JSON.
    let back = WorldModel::from_json(&wm.to_json().unwrap()).unwrap();
    assert_eq!(back.settled_questions(), wm.settled_questions());
}

#[test]
fn close_question_rejects_unknown_numbers_repeats_and_empty_answers_atomically() {
    let mut wm = WorldModel::new_root("s", vec!["q1".into(), "q2".into()]);
    let before = wm.clone();
    for (ops, want) in [
        (
            r#"[{"op": "close_question", "question": 3, "answer": "a"}]"#,
            "no open question 3 (open questions are numbered 1 to 2)",
        ),
        (
            r#"[{"op": "close_question", "question": 0, "answer": "a"}]"#,
            "no open question 0",
        ),
        (
            r#"[{"op": "close_question", "question": 1, "answer": "a"}, {"op": "close_question", "question": 1, "answer": "b"}]"#,
            "closed twice",
        ),
        (
            r#"[{"op": "close_question", "question": 2, "answer": "  "}]"#,
            "`answer`",
        ),
    ] {
        let e = Edit::from_json_str(&format!(r#"{{"ops": {ops}}}"#)).unwrap();
        let errs = wm.apply_edit(&e, 1).unwrap_err();
        let text = errs
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; ");
        assert!(text.contains(want), "{ops}: {text}");
        assert_eq!(wm, before, "a rejected edit changes nothing");
    }
    let errs = Edit::from_json_str(
        r#"{"ops": [{"op": "close_question", "question": "first", "answer": "a"}]}"#,
    )
    .unwrap_err();
    assert!(errs[0].to_string().contains("op 0"), "{errs:?}");
}

#[test]
fn an_unknown_op_names_the_ops_there_are() {
    let errs = Edit::from_json_str(r#"{"ops": [{"op": "rename", "node_id": "n1"}]}"#).unwrap_err();
    let text = errs[0].to_string();
    assert!(text.contains("unknown op kind `rename`"), "{text}");
    assert!(text.contains("set_summary, close_question"), "{text}");
}
