//! Snapshots of every rendered prompt for a fixture (the built-in softmax task on the cpu
//! backend, a small world model with a solved node), at each context level, plus the knowledge
//! section of every target. A change to a template or a pack shows up here as a diff.

use std::path::{Path, PathBuf};

use ksearch_knowledge::Packs;
use ksearch_search::proposer::prompts::{
    history_lines, ActionView, AttemptText, ContextLevel, InspirationText, PromptContext,
    PromptInputs, PromptRole, PromptSet,
};
use ksearch_search::proposer::{AttemptView, CycleAttempt, OutcomeSummary};
use ksearch_search::world_model::{ActionPatch, NodeId, NodePatch, SolutionRef, Trace, WorldModel};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn packs() -> Packs {
    Packs::load(&root().join("knowledge")).unwrap_or_else(|e| panic!("{e}"))
}

fn prompts() -> PromptSet {
    PromptSet::load(&root().join("knowledge/prompts")).unwrap_or_else(|e| panic!("{e}"))
}

fn inputs(level: ContextLevel) -> PromptInputs {
    let task = ksearch_task::load_task(&root().join("tasks/softmax")).unwrap();
    PromptInputs::for_task(&task, "cpu", &packs(), None, level).unwrap()
}

fn action(label: &str, title: &str, score: f64) -> NodePatch {
    NodePatch {
        label: Some(label.into()),
        decision: Some(Some("row pass structure".into())),
        choice: Some(Some(label.into())),
        overall_rating: Some(6.0),
        confidence: Some(0.5),
        action: Some(ActionPatch {
            title: Some(title.into()),
            description: Some(format!("{title}, keeping one thread per row.")),
            difficulty: Some(2.0),
            score: Some(Some(score)),
            expected_vs_baseline_factor: Some(Some(1.8)),
            rationale: Some("fewer passes over memory".into()),
            ..ActionPatch::default()
        }),
        ..NodePatch::default()
    }
}

/// Root with the seed solution, two actions, the first solved with one child.
fn world_model() -> (WorldModel, NodeId, NodeId) {
    let mut wm = WorldModel::new_root(
        "Row softmax over f32 rows: three reductions per row, memory bound at these shapes.",
        vec!["Does a one-pass online softmax beat three passes here?".into()],
    );
    let root = wm.root_id().clone();
    wm.attach_solution(
        &root,
        SolutionRef {
            solution_id: "seed0000".into(),
            parent_solution_id: None,
            score: 1.1,
            speedup_vs_baseline: Some(1.1),
            latency_ms: Some(0.9),
            round: 0,
        },
    )
    .unwrap();
    let a = wm
        .insert_child(
            &root,
            &action("online", "Fuse max and sum into one online pass", 0.8),
            1,
        )
        .unwrap();
    let b = wm
        .insert_child(
            &root,
            &action("vector", "Vectorise the exp pass with 8 lanes", 0.6),
            1,
        )
        .unwrap();
    wm.begin_cycle(&a).unwrap();
    wm.record_attempt(&a, false).unwrap();
    wm.record_attempt(&a, true).unwrap();
    wm.attach_solution(
        &a,
        SolutionRef {
            solution_id: "abcd1234".into(),
            parent_solution_id: None,
            score: 1.9,
            speedup_vs_baseline: Some(1.9),
            latency_ms: Some(0.52),
            round: 2,
        },
    )
    .unwrap();
    let c = wm
        .insert_child(
            &a,
            &action("blocked", "Process rows in blocks of 4", 0.7),
            2,
        )
        .unwrap();
    wm.begin_cycle(&c).unwrap();
    wm.record_signals(
        3,
        Some(Trace {
            status: "passed".into(),
            latency_ms: Some(0.52),
            reference_latency_ms: Some(1.69),
            speedup: Some(1.9),
            ..Trace::default()
        }),
    );
    (wm, a, b)
}

const SEED: &str = include_str!("../../../tasks/softmax/seed/naive.c");

fn passed(id: i64, score: f64) -> AttemptView {
    AttemptView {
        candidate_id: id,
        source: SEED.to_string(),
        source_id: format!("src{id}"),
        knobs: None,
        outcome: OutcomeSummary {
            status: "passed".into(),
            passed: true,
            score: Some(score),
            score_interval: None,
            latency_ms: Some(0.52),
            speedup_vs_reference: Some(3.25),
            message: String::new(),
            workloads: vec![
                "r64c1000: 0.041 ms, 1.71x vs baseline, 12.5% of roofline, latency-bound \
                 (memory 12%, compute 0%)"
                    .into(),
                "r512c4096: 1.210 ms, 2.02x vs baseline, 18.0% of roofline, latency-bound \
                 (memory 18%, compute 1%)"
                    .into(),
            ],
            bottleneck: Some(
                "r64c1000 (latency-bound): 12% of the speed of light (memory 12%, compute 0%): \
                 neither roof is near, the kernel waits; this workload (0.62 FLOP/byte against \
                 a ridge of 16.6) would be memory-bound at best, 8.0x from here"
                    .into(),
            ),
            bottleneck_class: Some(ksearch_eval::bottleneck::Bottleneck::Latency),
            speed_of_light: Some(0.12),
        },
    }
}

fn failed(id: i64) -> AttemptView {
    AttemptView {
        candidate_id: id,
        source: SEED.replace("double sum", "float sum"),
        source_id: format!("src{id}"),
        knobs: None,
        outcome: OutcomeSummary {
            status: "incorrect".into(),
            passed: false,
            score: None,
            score_interval: None,
            latency_ms: None,
            speedup_vs_reference: None,
            message: "workload r512c4096: max relative error 3.1e-4 > rtol 1e-4".into(),
            workloads: vec!["r512c4096 (incorrect)".into()],
            bottleneck: None,
            bottleneck_class: None,
            speed_of_light: None,
        },
    }
}

/// A cycle of four attempts: a pass, a slower pass, a failure, and a repeat of the first.
fn cycle_history() -> Vec<CycleAttempt> {
    let attempt = |n: u32, view: AttemptView, note: &str| CycleAttempt {
        attempt: n,
        sample: 0,
        candidate_id: Some(view.candidate_id),
        note: note.into(),
        outcome: view.outcome,
        duplicate_of: None,
        reused_from: None,
    };
    let mut slower = passed(8, 1.7);
    slower.outcome.latency_ms = Some(0.61);
    vec![
        attempt(1, passed(7, 1.9), "one pass: running max and rescaled sum"),
        attempt(2, slower, "unrolled the exp loop by 4"),
        attempt(3, failed(9), "float accumulator for the sum"),
        CycleAttempt {
            duplicate_of: Some((1, 0)),
            ..attempt(4, passed(7, 1.9), "")
        },
    ]
}

fn context(role: PromptRole, level: ContextLevel) -> PromptContext {
    let (wm, solved, _) = world_model();
    let mut ctx = PromptContext::new(&inputs(level));
    ctx.round = 4;
    ctx.attempt = 2;
    let node = |id: &NodeId| wm.node(id).unwrap();
    let active = wm.active_leaf_id().clone();
    let edit = |ctx: &mut PromptContext, focus: &NodeId| {
        ctx.tree = Some(wm.outline(focus, 40));
    };
    match role {
        PromptRole::WmInit => {
            ctx.attempt = 1;
        }
        PromptRole::Propose => {
            edit(&mut ctx, &active);
            ctx.requirements = vec![
                "Leave at least one executable open action with priority score above 0.5.".into(),
            ];
            ctx.feedback = vec!["the edit was rejected: op 0: unknown node `n9`".into()];
        }
        PromptRole::Refine => {
            edit(&mut ctx, &solved);
            ctx.action = Some(ActionView::of(node(&solved)));
            ctx.best = Some(AttemptText::of(&passed(7, 1.9)));
            ctx.base = Some(AttemptText::of(&passed(1, 1.1)));
            ctx.history = history_lines(&cycle_history());
        }
        PromptRole::TooHard => {
            edit(&mut ctx, &active);
            ctx.action = Some(ActionView::of(node(&active)));
            ctx.current = Some(AttemptText::of(&failed(9)));
        }
        PromptRole::CodeSpecAction => {
            ctx.action = Some(ActionView::of(node(&active)));
            ctx.attempt = 1;
        }
        PromptRole::CodeBaseAction => {
            ctx.action = Some(ActionView::of(node(&active)));
            ctx.base = Some(AttemptText::of(&passed(7, 1.9)));
            ctx.attempt = 1;
            ctx.sample = 1;
        }
        PromptRole::Debug => {
            ctx.action = Some(ActionView::of(node(&active)));
            ctx.base = Some(AttemptText::of(&passed(7, 1.9)));
            ctx.current = Some(AttemptText::of(&failed(9)));
            ctx.feedback =
                vec!["code-debug: the reply has no fenced code block; put the whole file in one ```c block".into()];
        }
        PromptRole::Improve => {
            ctx.action = Some(ActionView::of(node(&active)));
            ctx.best = Some(AttemptText::of(&passed(10, 2.3)));
            ctx.current = Some(AttemptText::of(&failed(11)));
            ctx.history = history_lines(&cycle_history());
        }
        PromptRole::Evolve => {
            ctx.round = 9;
            ctx.island = 1;
            ctx.mutation = Some("diff".into());
            ctx.parent = Some(AttemptText::of(&passed(7, 1.9)));
            ctx.inspirations = vec![
                InspirationText::of(&passed(10, 2.3), "top"),
                InspirationText::of(&passed(4, 1.2), "diverse"),
            ];
            ctx.feedback = vec!["code-evolve: the edit blocks do not apply: block 1: its \
                SEARCH text occurs 2 times (lines 3, 9); include more surrounding lines so it \
                matches once"
                .into()];
        }
    }
    // Evolve children are written without the world model.
    if role.writes_code() && role != PromptRole::Evolve && level.has_spec() {
        ctx.world_model = Some(wm.compact_json(12000));
    }
    ctx
}

fn render(role: PromptRole, level: ContextLevel) -> String {
    let p = prompts().render(role, &context(role, level)).unwrap();
    format!("=== SYSTEM ===\n{}=== USER ===\n{}", p.system, p.user)
}

#[test]
fn every_prompt_at_full_context() {
    for role in PromptRole::ALL {
        insta::assert_snapshot!(
            format!("{}_full", role.template()),
            render(role, ContextLevel::Full)
        );
    }
}

/// The rewrite and crossover forms of the evolve prompt (the diff form is in
/// `every_prompt_at_full_context`): their own headings, the second parent, and the whole-file
/// reply format instead of edit blocks.
#[test]
fn evolve_prompts_of_a_rewrite_and_a_crossover() {
    for mutation in ["full", "crossover"] {
        let mut ctx = context(PromptRole::Evolve, ContextLevel::Full);
        ctx.mutation = Some(mutation.into());
        ctx.feedback.clear();
        if mutation == "crossover" {
            ctx.mate = Some(AttemptText::of(&passed(12, 2.0)));
        }
        let p = prompts().render(PromptRole::Evolve, &ctx).unwrap();
        assert!(!p.user.contains("<<<<<<< SEARCH"), "{mutation}");
        assert!(p.system.contains("write one complete kernel source file"));
        assert_eq!(p.user.contains("## Second parent"), mutation == "crossover");
        let name = if mutation == "full" {
            "rewrite"
        } else {
            mutation
        };
        insta::assert_snapshot!(format!("evolve_{name}_user"), p.user);
    }
    let diff = prompts()
        .render(
            PromptRole::Evolve,
            &context(PromptRole::Evolve, ContextLevel::Full),
        )
        .unwrap();
    assert!(diff.user.contains("<<<<<<< SEARCH"));
    assert!(diff.system.contains("edit one kernel source file"));
}

#[test]
fn code_and_init_prompts_at_lower_context_levels() {
    for level in [ContextLevel::None, ContextLevel::Spec] {
        for role in [
            PromptRole::WmInit,
            PromptRole::CodeSpecAction,
            PromptRole::Debug,
        ] {
            insta::assert_snapshot!(
                format!("{}_{}", role.template(), level),
                render(role, level)
            );
        }
    }
}

#[test]
fn knowledge_section_of_every_target() {
    let packs = packs();
    let set = prompts();
    for t in packs.targets() {
        let kind = match t.name.as_str() {
            "cpu" => "softmax",
            "mlx-cuda" | "mlx-metal" => "selective-scan",
            _ => "attention",
        };
        let ctx = packs.context(&t.name, Some(kind), None).unwrap();
        insta::assert_snapshot!(
            format!("knowledge_{}", t.name),
            set.render_knowledge(&ctx).unwrap()
        );
    }
}

#[test]
fn context_levels_change_what_the_prompt_carries() {
    let none = render(PromptRole::CodeSpecAction, ContextLevel::None);
    let spec = render(PromptRole::CodeSpecAction, ContextLevel::Spec);
    let full = render(PromptRole::CodeSpecAction, ContextLevel::Full);
    let sig = "void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols)";
    for p in [&none, &spec, &full] {
        assert!(p.contains(sig), "every level names the signature");
        assert!(p.contains("Fuse max and sum") || p.contains("Process rows in blocks"));
    }
    // none: no description, no workloads, no world model, no device, no knowledge.
    assert!(!none.contains("Row-wise softmax"));
    assert!(!none.contains("r512c4096"));
    assert!(!none.contains("kernel_summary"));
    assert!(!none.contains("Generic x86-64"));
    // spec: the task spec (visible workloads only), the world model and the device name.
    assert!(spec.contains("Row-wise softmax"));
    assert!(spec.contains("r512c4096"));
    assert!(
        !spec.contains("r333c5000"),
        "held-out workloads never reach a prompt"
    );
    assert!(spec.contains("kernel_summary"));
    assert!(spec.contains("Generic x86-64"));
    assert!(!spec.contains("## Knowledge for"));
    // full: + hardware numbers, patterns and assertions.
    assert!(full.contains("## Knowledge for"));
    assert!(full.contains("20 GB/s memory bandwidth"));
    assert!(full.contains("One-pass (online) softmax statistics"));
    assert!(full.contains("rescales its running sum"));
    assert!(!full.contains("r333c5000"));
}

#[test]
fn a_broken_template_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(root().join("knowledge/prompts")).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.path().join("debug.j2"), "{{ no_such_variable }}\n").unwrap();
    let set = PromptSet::load(dir.path()).unwrap();
    let err = set
        .render(
            PromptRole::Debug,
            &context(PromptRole::Debug, ContextLevel::Full),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("debug.j2"), "{err}");
    std::fs::remove_file(dir.path().join("improve.j2")).unwrap();
    let err = PromptSet::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("improve.j2"), "{err}");
}

/// Every role's rendered size (system + user, in characters) for the softmax and attention
/// tasks at full context, printed for the record (`--nocapture`) and held under a budget so a
/// template change that bloats a prompt fails here.
#[test]
fn prompt_sizes_stay_within_budget() {
    let attention = ksearch_task::load_task(&root().join("tasks/attention")).unwrap();
    let attention =
        PromptInputs::for_task(&attention, "cpu", &packs(), None, ContextLevel::Full).unwrap();
    for (task, inputs) in [
        ("softmax", inputs(ContextLevel::Full)),
        ("attention", attention),
    ] {
        for role in PromptRole::ALL {
            let mut ctx = context(role, ContextLevel::Full);
            ctx.inputs = inputs.clone();
            let p = prompts().render(role, &ctx).unwrap();
            let n = p.system.chars().count() + p.user.chars().count();
            println!("prompt size {task} {}: {n}", role.template());
            assert!(n < 24_000, "{task} {}: {n} characters", role.template());
        }
    }
}

/// An entry point named per workload (the attention task's `attention_{dtype}` on cuda): the
/// code prompts list every name the run's workloads call, so a reply defines all of them.
#[test]
fn a_per_workload_entry_is_spelled_out_for_each_name_the_workloads_call() {
    let attention = ksearch_task::load_task(&root().join("tasks/attention")).unwrap();
    let code_prompt = |backend: &str| {
        let inputs =
            PromptInputs::for_task(&attention, backend, &packs(), None, ContextLevel::Spec)
                .unwrap();
        let mut ctx = context(PromptRole::CodeSpecAction, ContextLevel::Spec);
        ctx.inputs = inputs.clone();
        let user = prompts()
            .render(PromptRole::CodeSpecAction, &ctx)
            .unwrap()
            .user;
        (inputs, user)
    };
    let (cuda, user) = code_prompt("cuda");
    assert_eq!(cuda.task.entry, "attention_{dtype}");
    assert_eq!(cuda.task.entries, ["attention_bf16", "attention_f16"]);
    assert!(
        user.contains("define all of `attention_bf16`, `attention_f16`"),
        "{user}"
    );
    // A single entry point gets no such line.
    let (cpu, user) = code_prompt("cpu");
    assert!(cpu.task.entries.is_empty());
    assert!(!user.contains("define all of"), "{user}");
}
