//! Property tests: random sequences of system operations and random (often invalid) edits keep
//! every invariant; rejected edits and failed system ops leave the tree byte-identical; system
//! fields never change through edits; the insert cap and delete rules hold; serde round-trips.

use std::collections::BTreeMap;

use ksearch_search::world_model::{
    ActionPatch, Edit, ImpactPatch, ImpactsPatch, Node, NodeId, NodePatch, NodeState, PatchOp,
    SolutionRef, WorldModel, MAX_NEW_NODES_PER_EDIT,
};
use proptest::prelude::*;
use serde_json::{json, Value};

/// How an op names a node: an existing one (by index), a label of this edit, or nothing real.
#[derive(Clone, Debug)]
enum Target {
    Existing(usize),
    Label(u8),
    Ghost,
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        12 => any::<usize>().prop_map(Target::Existing),
        2 => (0u8..3).prop_map(Target::Label),
        1 => Just(Target::Ghost),
    ]
}

fn resolve(wm: &WorldModel, t: &Target) -> NodeId {
    match t {
        Target::Existing(i) => wm.nodes()[i % wm.nodes().len()].id.clone(),
        Target::Label(k) => NodeId::new(format!("L{k}")),
        Target::Ghost => NodeId::new("ghost"),
    }
}

fn number() -> impl Strategy<Value = f64> {
    prop_oneof![
        30 => -20.0..20.0f64,
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
    ]
}

/// Speedup predictions: mostly valid (> 0), sometimes not.
fn factor() -> impl Strategy<Value = f64> {
    prop_oneof![
        12 => 0.1..5.0f64,
        1 => -2.0..=0.0f64,
        1 => Just(f64::NAN),
    ]
}

fn text() -> impl Strategy<Value = String> {
    "[a-z ]{0,12}"
}

const BAD_KEYS: &[&str] = &[
    "solution_id",
    "state",
    "parent_id",
    "node_id",
    "attempts",
    "colour",
    "solution_ref",
];

fn patch() -> impl Strategy<Value = NodePatch> {
    let action = (
        proptest::option::of(text()),
        proptest::option::of(number()),
        proptest::option::of(proptest::option::of(number())),
        proptest::option::of(proptest::option::of(factor())),
        proptest::option::weighted(0.03, 0usize..BAD_KEYS.len()),
    )
        .prop_map(|(title, difficulty, score, expected, bad)| {
            let mut a = ActionPatch {
                title,
                difficulty,
                score,
                expected_vs_baseline_factor: expected,
                ..ActionPatch::default()
            };
            if let Some(b) = bad {
                a.unknown.insert(BAD_KEYS[b].into(), json!(1));
            }
            a
        });
    (
        proptest::option::weighted(0.3, 0u8..3),
        proptest::option::of(proptest::option::of(text())),
        proptest::option::of(text()),
        proptest::option::of(number()),
        proptest::option::of(number()),
        proptest::option::weighted(0.3, number()),
        proptest::option::weighted(0.7, action),
        proptest::option::weighted(0.05, 0usize..BAD_KEYS.len()),
    )
        .prop_map(
            |(label, decision, notes, rating, confidence, impact, action, bad)| {
                let mut p = NodePatch {
                    label: label.map(|k| format!("L{k}")),
                    decision,
                    notes,
                    overall_rating: rating,
                    confidence,
                    impacts: impact.map(|r| ImpactsPatch {
                        register_pressure: Some(ImpactPatch {
                            rating: Some(r),
                            ..ImpactPatch::default()
                        }),
                        ..ImpactsPatch::default()
                    }),
                    action,
                    ..NodePatch::default()
                };
                if let Some(b) = bad {
                    p.unknown.insert(BAD_KEYS[b].into(), json!("x"));
                }
                p
            },
        )
}

#[derive(Clone, Debug)]
enum RawOp {
    Update(Target, NodePatch),
    Insert(Target, Option<bool>, NodePatch),
    Split(Target, NodePatch, Vec<NodePatch>),
    Delete(Target),
}

fn raw_op() -> impl Strategy<Value = RawOp> {
    prop_oneof![
        3 => (target(), patch()).prop_map(|(t, p)| RawOp::Update(t, p)),
        3 => (target(), proptest::option::weighted(0.2, any::<bool>()), patch())
            .prop_map(|(t, s, p)| RawOp::Insert(t, s, p)),
        2 => (target(), patch(), proptest::collection::vec(patch(), 0..3))
            .prop_map(|(t, p, c)| RawOp::Split(t, p, c)),
        2 => target().prop_map(RawOp::Delete),
    ]
}

// Test data only; boxing the patches would just add noise.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
enum Step {
    Insert(Target, NodePatch),
    Attach(Target, f64, bool),
    TooHard(Target),
    Attempt(Target, bool),
    Begin(Target),
    SetLeaf(Target),
    Edit(Vec<RawOp>, Option<Target>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (target(), patch()).prop_map(|(t, p)| Step::Insert(t, p)),
        2 => (target(), number(), any::<bool>()).prop_map(|(t, s, e)| Step::Attach(t, s, e)),
        1 => target().prop_map(Step::TooHard),
        1 => (target(), any::<bool>()).prop_map(|(t, p)| Step::Attempt(t, p)),
        1 => target().prop_map(Step::Begin),
        1 => target().prop_map(Step::SetLeaf),
        5 => (
            proptest::collection::vec(raw_op(), 0..5),
            proptest::option::weighted(0.3, target())
        )
            .prop_map(|(ops, leaf)| Step::Edit(ops, leaf)),
    ]
}

fn build_edit(wm: &WorldModel, ops: &[RawOp], leaf: &Option<Target>) -> Edit {
    let ops = ops
        .iter()
        .map(|op| match op {
            RawOp::Update(t, p) => PatchOp::Update {
                node_id: resolve(wm, t),
                set: p.clone(),
            },
            RawOp::Insert(t, s, p) => {
                let parent_id = resolve(wm, t);
                // Some(true): the right solution id (if any); Some(false): a wrong one.
                let parent_solution_id = s.map(|right| {
                    let real = wm
                        .node(&parent_id)
                        .and_then(Node::solution)
                        .map(|s| s.solution_id.clone());
                    match (right, real) {
                        (true, Some(r)) => r,
                        _ => "wrong".into(),
                    }
                });
                PatchOp::Insert {
                    parent_id,
                    parent_solution_id,
                    node: p.clone(),
                }
            }
            RawOp::Split(t, p, c) => PatchOp::Split {
                node_id: resolve(wm, t),
                set: p.clone(),
                children: c.clone(),
            },
            RawOp::Delete(t) => PatchOp::Delete {
                node_id: resolve(wm, t),
            },
        })
        .collect();
    Edit {
        ops,
        active_leaf_id: leaf.as_ref().map(|t| resolve(wm, t)),
    }
}

/// The system-owned part of a node, which edits must never change (deletion aside).
fn system_view(n: &Node) -> (NodeId, Option<NodeId>, u32, u32, u32, u32, u32, Option<f64>) {
    (
        n.id.clone(),
        n.parent.clone(),
        n.attempts,
        n.failures,
        n.cycles,
        n.visits,
        n.created_round,
        n.best_score,
    )
}

fn closed_solutions(wm: &WorldModel) -> BTreeMap<NodeId, SolutionRef> {
    wm.nodes()
        .iter()
        .filter_map(|n| n.solution().map(|s| (n.id.clone(), s.clone())))
        .collect()
}

fn check_round_trip(wm: &WorldModel) -> Result<(), TestCaseError> {
    let text = wm
        .to_json()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let back = WorldModel::from_json(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&back, wm);
    prop_assert_eq!(back.to_json().unwrap(), text);
    Ok(())
}

/// Runs one step and checks every property that must hold after it.
fn run_step(wm: &mut WorldModel, step: &Step, round: u32) -> Result<(), TestCaseError> {
    let before_json = wm.to_json().unwrap();
    let before = wm.clone();
    let solutions_before = closed_solutions(wm);

    let ok = match step {
        Step::Insert(t, p) => wm.insert_child(&resolve(&before, t), p, round).is_ok(),
        Step::Attach(t, score, empty_id) => {
            let sid = if *empty_id {
                String::new()
            } else {
                format!("sol{round}")
            };
            let sol = SolutionRef {
                solution_id: sid,
                parent_solution_id: None,
                score: *score,
                speedup_vs_baseline: Some(*score),
                latency_ms: None,
                round,
            };
            wm.attach_solution(&resolve(&before, t), sol).is_ok()
        }
        Step::TooHard(t) => wm.mark_too_hard(&resolve(&before, t)).is_ok(),
        Step::Attempt(t, passed) => wm.record_attempt(&resolve(&before, t), *passed).is_ok(),
        Step::Begin(t) => wm.begin_cycle(&resolve(&before, t)).is_ok(),
        Step::SetLeaf(t) => wm.set_active_leaf(&resolve(&before, t)).is_ok(),
        Step::Edit(ops, leaf) => {
            let e = build_edit(&before, ops, leaf);
            match wm.apply_edit(&e, round) {
                Ok(report) => {
                    check_committed_edit(&before, wm, &e)?;
                    prop_assert!(report.inserted.len() <= MAX_NEW_NODES_PER_EDIT);
                    true
                }
                Err(errors) => {
                    prop_assert!(!errors.is_empty());
                    for e in &errors {
                        prop_assert!(!e.to_string().trim().is_empty(), "{:?}", e);
                    }
                    false
                }
            }
        }
    };

    if !ok {
        prop_assert_eq!(
            wm.to_json().unwrap(),
            before_json,
            "failed step changed the tree"
        );
    }
    if let Err(v) = wm.validate() {
        return Err(TestCaseError::fail(format!("invariants broken: {v:?}")));
    }
    // Closed nodes keep their solution forever.
    for (id, sol) in &solutions_before {
        prop_assert_eq!(wm.node(id).and_then(Node::solution), Some(sol));
    }
    // Nodes are never removed and ids never change.
    prop_assert!(wm.nodes().len() >= before.nodes().len());
    for (a, b) in before.nodes().iter().zip(wm.nodes()) {
        prop_assert_eq!(&a.id, &b.id);
    }
    Ok(())
}

fn check_committed_edit(
    before: &WorldModel,
    after: &WorldModel,
    e: &Edit,
) -> Result<(), TestCaseError> {
    let added = after.nodes().len() - before.nodes().len();
    prop_assert!(added <= MAX_NEW_NODES_PER_EDIT, "cap exceeded: {}", added);
    for (old, new) in before.nodes().iter().zip(after.nodes()) {
        prop_assert_eq!(system_view(old), system_view(new));
        match (&old.state, &new.state) {
            (a, b) if a == b => {}
            (NodeState::Open, NodeState::Pruned) => {
                // A legal delete target: a named op, not the root, no live children left.
                prop_assert!(old.id != *before.root_id());
                prop_assert!(after.children(&new.id).is_empty());
                let has_delete = e.ops.iter().any(|op| matches!(op, PatchOp::Delete { .. }));
                prop_assert!(has_delete);
            }
            (a, b) => prop_assert!(false, "edit changed state {:?} -> {:?}", a, b),
        }
    }
    for new in &after.nodes()[before.nodes().len()..] {
        prop_assert!(new.is_open() || new.is_pruned());
        prop_assert_eq!((new.attempts, new.failures, new.visits), (0, 0, 0));
        prop_assert!(new.id.as_str().starts_with('n'));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_keep_invariants(steps in proptest::collection::vec(step(), 1..40)) {
        let mut wm = WorldModel::new_root("k", vec!["q".into()]);
        for (round, s) in steps.iter().enumerate() {
            run_step(&mut wm, s, round as u32)?;
        }
        check_round_trip(&wm)?;
    }

    #[test]
    fn edits_round_trip_through_serde(ops in proptest::collection::vec(raw_op(), 0..6)) {
        let wm = WorldModel::new_root("k", vec![]);
        let e = build_edit(&wm, &ops, &None);
        // JSON cannot carry NaN or infinities; those edits are rejected by apply_edit instead.
        prop_assume!(edit_is_finite(&e));
        let text = serde_json::to_string(&e).unwrap();
        let back: Edit = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(&back, &e);
        prop_assert_eq!(serde_json::to_string(&back).unwrap(), text.clone());
        // The lenient parser reads the canonical dialect identically, except that it
        // translates a few original-dialect keys (a suggested `node_id` becomes a label, ...).
        if !edit_has_unknown_keys(&e) {
            prop_assert_eq!(Edit::from_json_str(&text).unwrap(), e);
        }
    }

    /// Arbitrary JSON in the original dialect never panics the parser or breaks the tree.
    #[test]
    fn lenient_json_edits_are_safe(
        ops in proptest::collection::vec(lenient_op(), 0..5),
        seed_steps in proptest::collection::vec(step(), 0..10),
    ) {
        let mut wm = WorldModel::new_root("k", vec![]);
        for (round, s) in seed_steps.iter().enumerate() {
            run_step(&mut wm, s, round as u32)?;
        }
        let before = wm.to_json().unwrap();
        let value = json!({"ops": ops});
        match Edit::from_json_value(&value) {
            Ok(e) => match wm.apply_edit(&e, 99) {
                Ok(_) => prop_assert!(wm.validate().is_ok()),
                Err(errors) => {
                    prop_assert!(!errors.is_empty());
                    prop_assert!(errors.iter().all(|e| !e.to_string().trim().is_empty()));
                    prop_assert_eq!(wm.to_json().unwrap(), before)
                }
            },
            Err(errors) => {
                prop_assert!(!errors.is_empty());
                prop_assert!(errors.iter().all(|e| !e.to_string().trim().is_empty()));
            }
        }
        check_round_trip(&wm)?;
    }
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-50i64..50).prop_map(Value::from),
        (-20.0..20.0f64).prop_map(Value::from),
        "[a-z0-9]{0,4}".prop_map(Value::from),
        Just(json!("root")),
        Just(json!("n1")),
        Just(json!("n2")),
    ]
}

const LENIENT_KEYS: &[&str] = &[
    "node_id",
    "parent_id",
    "patch",
    "set",
    "node",
    "parent_patch",
    "children",
    "overall_rating_0_to_10",
    "confidence_0_to_1",
    "action",
    "impacts",
    "difficulty_1_to_5",
    "difficulty_0_to_3",
    "score_0_to_1",
    "title",
    "solution_ref",
    "solution_id",
    "decision",
    "notes",
    "memory_bandwidth",
    "rating_0_to_10",
    "hw_notes",
    "expected_vs_baseline_factor",
];

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            proptest::collection::btree_map(proptest::sample::select(LENIENT_KEYS), inner, 0..4)
                .prop_map(|m| {
                    Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
                }),
        ]
    })
}

fn lenient_op() -> impl Strategy<Value = Value> {
    (
        proptest::sample::select(
            &[
                "update_node",
                "insert_node",
                "split_node",
                "delete_node",
                "update",
                "insert",
                "split",
                "delete",
                "bogus",
            ][..],
        ),
        json_value(),
    )
        .prop_map(|(op, body)| {
            let mut obj = match body {
                Value::Object(m) => m,
                other => {
                    let mut m = serde_json::Map::new();
                    m.insert("node_id".into(), other);
                    m
                }
            };
            obj.insert("op".into(), Value::from(op));
            Value::Object(obj)
        })
}

fn patch_is_finite(p: &NodePatch) -> bool {
    let mut nums: Vec<f64> = Vec::new();
    nums.extend(p.overall_rating);
    nums.extend(p.confidence);
    if let Some(i) = &p.impacts {
        for one in [
            &i.memory_bandwidth,
            &i.register_pressure,
            &i.compute_intensity_and_hw_fit,
        ]
        .into_iter()
        .flatten()
        {
            nums.extend(one.rating);
        }
    }
    if let Some(a) = &p.action {
        nums.extend(a.difficulty);
        nums.extend(a.score.flatten());
        nums.extend(a.expected_vs_baseline_factor.flatten());
    }
    nums.iter().all(|x| x.is_finite())
}

fn edit_is_finite(e: &Edit) -> bool {
    e.ops.iter().all(|op| match op {
        PatchOp::Update { set, .. } => patch_is_finite(set),
        PatchOp::Insert { node, .. } => patch_is_finite(node),
        PatchOp::Split { set, children, .. } => {
            patch_is_finite(set) && children.iter().all(patch_is_finite)
        }
        PatchOp::Delete { .. } | PatchOp::SetSummary { .. } | PatchOp::CloseQuestion { .. } => true,
    })
}

fn patch_has_unknown_keys(p: &NodePatch) -> bool {
    !p.unknown.is_empty() || p.action.as_ref().is_some_and(|a| !a.unknown.is_empty())
}

fn edit_has_unknown_keys(e: &Edit) -> bool {
    e.ops.iter().any(|op| match op {
        PatchOp::Update { set, .. } => patch_has_unknown_keys(set),
        PatchOp::Insert { node, .. } => patch_has_unknown_keys(node),
        PatchOp::Split { set, children, .. } => {
            patch_has_unknown_keys(set) || children.iter().any(patch_has_unknown_keys)
        }
        PatchOp::Delete { .. } | PatchOp::SetSummary { .. } | PatchOp::CloseQuestion { .. } => {
            false
        }
    })
}

/// JSON-ish text built from the patch language's own tokens.
fn edit_text() -> impl Strategy<Value = String> {
    const TOKENS: &[&str] = &[
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "\"ops\"",
        "\"op\"",
        "\"update\"",
        "\"insert\"",
        "\"split\"",
        "\"delete\"",
        "\"update_node\"",
        "\"insert_node\"",
        "\"node_id\"",
        "\"parent_id\"",
        "\"set\"",
        "\"node\"",
        "\"patch\"",
        "\"children\"",
        "\"action\"",
        "\"title\"",
        "\"score\"",
        "\"difficulty\"",
        "\"difficulty_0_to_3\"",
        "\"label\"",
        "\"impacts\"",
        "\"memory_bandwidth\"",
        "\"rating_0_to_10\"",
        "\"hw_notes\"",
        "\"active_leaf_id\"",
        "\"solution_id\"",
        "\"root\"",
        "\"n1\"",
        "\"n2\"",
        "\"n3\"",
        "\"x\"",
        "null",
        "true",
        "0",
        "-1",
        "2.5",
        "1e308",
        "\"3\"",
        "\"\"",
    ];
    proptest::collection::vec(proptest::sample::select(TOKENS), 0..40).prop_map(|t| t.concat())
}

/// A model with closed, too-hard, pruned and open nodes (the edit targets of the tests).
fn seeded_model(steps: &[Step]) -> Result<WorldModel, TestCaseError> {
    let mut wm = WorldModel::new_root("k", vec![]);
    for (round, s) in steps.iter().enumerate() {
        run_step(&mut wm, s, round as u32)?;
    }
    Ok(wm)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Arbitrary edit text (mostly malformed) never panics the parser; every rejection,
    /// parse or apply, has a message; what applies keeps the invariants.
    #[test]
    fn arbitrary_edit_text_is_parsed_or_rejected_with_reasons(
        text in edit_text(),
        steps in proptest::collection::vec(step(), 0..8),
    ) {
        let mut wm = seeded_model(&steps)?;
        let before = wm.to_json().unwrap();
        match Edit::from_json_str(&text) {
            Err(errors) => {
                prop_assert!(!errors.is_empty());
                prop_assert!(errors.iter().all(|e| !e.to_string().trim().is_empty()));
            }
            Ok(e) => match wm.apply_edit(&e, 5) {
                Ok(_) => prop_assert!(wm.validate().is_ok()),
                Err(errors) => {
                    prop_assert!(errors.iter().all(|e| !e.to_string().trim().is_empty()));
                    prop_assert_eq!(wm.to_json().unwrap(), before);
                }
            },
        }
    }

    /// A world-model document with one value replaced anywhere loads only if it is valid,
    /// and a loaded one serves the prompt projections and `show`'s tree.
    #[test]
    fn mutated_world_model_documents_load_only_when_valid(
        steps in proptest::collection::vec(step(), 0..12),
        pick in any::<usize>(),
        replacement in json_leaf(),
    ) {
        let wm = seeded_model(&steps)?;
        let mut doc: Value = serde_json::from_str(&wm.to_json().unwrap()).unwrap();
        let mut leaves = Vec::new();
        collect_pointers(&doc, String::new(), &mut leaves);
        let at = &leaves[pick % leaves.len()];
        *doc.pointer_mut(at).unwrap() = replacement;
        match WorldModel::from_json(&doc.to_string()) {
            Ok(loaded) => {
                prop_assert!(loaded.validate().is_ok());
                let compact = loaded.compact_json(300);
                prop_assert!(serde_json::from_str::<Value>(&compact).is_ok(), "{}", compact);
                let _ = loaded.frontier_listing(10);
                let _ = loaded.render_tree();
            }
            Err(e) => prop_assert!(!e.to_string().trim().is_empty()),
        }
    }
}

/// JSON pointers of every value in `v`.
fn collect_pointers(v: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let key = k.replace('~', "~0").replace('/', "~1");
                collect_pointers(x, format!("{at}/{key}"), out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                collect_pointers(x, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}
