//! The recorded-reply corpus (`tests/replies/<role>/*.txt`, expectations in
//! `tests/replies/expect.json`): realistic model replies for every prompt role — prose around
//! code, several code blocks, a reply cut by the token limit, compile errors, refusals, JSON edits
//! with trailing commas, unknown ops, missing fields and refused fields — replayed through the
//! real reply parser (each reply alone, asserting what it becomes) and through the real engine
//! with a fake evaluator (one cycle and its refine step, asserting what the next prompts say).

mod common;
use common::ScriptedLlm;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

use ksearch_knowledge::Packs;
use ksearch_search::engine::{
    CandidateEvaluator, Engine, EngineConfig, EvalFailure, Evaluation, NoProgress, Purpose,
};
use ksearch_search::proposer::llm::{extract_code, LlmProposer, LlmSettings, CODE_ROLE_TAG};
use ksearch_search::proposer::prompts::{ContextLevel, PromptInputs, PromptSet};
use ksearch_search::proposer::{
    AttemptView, CodeRequest, CycleReport, OutcomeSummary, Proposer, ProposerError, Step, TaskBrief,
};
use ksearch_search::selection::{CandidateExplanation, SelectionPolicy};
use ksearch_search::world_model::{ActionPatch, Edit, NodeId, NodePatch, SolutionRef, WorldModel};
use ksearch_store::CandidateKind;

const ROLES: [&str; 5] = ["code", "init", "propose", "refine", "too_hard"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replies")
}

fn reply(name: &str) -> String {
    std::fs::read_to_string(corpus_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn expectations() -> BTreeMap<String, Value> {
    let text = std::fs::read_to_string(corpus_dir().join("expect.json")).unwrap();
    let v: BTreeMap<String, Value> = serde_json::from_str(&text).unwrap();
    v.into_iter().filter(|(k, _)| !k.starts_with('_')).collect()
}

/// Prompt inputs of the built-in softmax task on the cpu backend, full context.
fn inputs() -> PromptInputs {
    let packs = Packs::load(&root().join("knowledge")).unwrap();
    let task = ksearch_task::load_task(&root().join("tasks/softmax")).unwrap();
    PromptInputs::for_task(&task, "cpu", &packs, None, ContextLevel::Full).unwrap()
}

fn prompts() -> PromptSet {
    PromptSet::load(&root().join("knowledge/prompts")).unwrap()
}

fn brief() -> TaskBrief {
    TaskBrief {
        name: "softmax".into(),
        kind: "softmax".into(),
        description: "Row softmax.".into(),
        backend: "cpu".into(),
        signature: "void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols)".into(),
        language: "c".into(),
    }
}

fn proposer(llm: &Arc<ScriptedLlm>, init_attempts: u32) -> LlmProposer {
    let settings = LlmSettings {
        init_attempts,
        ..LlmSettings::new()
    };
    LlmProposer::new(llm.clone(), prompts(), inputs(), settings)
}

fn node(label: &str, title: &str, score: f64) -> NodePatch {
    NodePatch {
        label: Some(label.into()),
        action: Some(ActionPatch {
            title: Some(title.into()),
            difficulty: Some(2.0),
            score: Some(Some(score)),
            ..ActionPatch::default()
        }),
        ..NodePatch::default()
    }
}

fn solution(id: &str, score: f64) -> SolutionRef {
    SolutionRef {
        solution_id: id.into(),
        parent_solution_id: None,
        score,
        speedup_vs_baseline: Some(score),
        latency_ms: Some(0.5),
        round: 1,
    }
}

/// The tree edit replies are written against: root (seed) ─ n1 online (solved) ─ n3 blocked
/// (open), and n2 threads (open) under the root; two open questions.
fn edit_fixture() -> WorldModel {
    let mut wm = WorldModel::new_root(
        "Row softmax, memory bound.",
        vec!["One pass or three?".into(), "Is exp the bottleneck?".into()],
    );
    let root = wm.root_id().clone();
    wm.attach_solution(&root, solution("seed", 1.1)).unwrap();
    let n1 = wm
        .insert_child(&root, &node("online", "Online max and sum", 0.8), 1)
        .unwrap();
    wm.insert_child(&root, &node("threads", "OpenMP over rows", 0.6), 1)
        .unwrap();
    wm.attach_solution(&n1, solution("s1", 1.5)).unwrap();
    let n3 = wm
        .insert_child(&n1, &node("blocked", "Blocks of 4 rows", 0.5), 2)
        .unwrap();
    assert_eq!(n3.as_str(), "n3");
    wm
}

fn attempt_view(score: f64) -> AttemptView {
    AttemptView {
        candidate_id: 1,
        source: "void softmax_f32(void) {}\n".into(),
        source_id: "s1".into(),
        knobs: None,
        outcome: OutcomeSummary {
            status: "passed".into(),
            passed: true,
            score: Some(score),
            ..OutcomeSummary::default()
        },
    }
}

fn check_unusable(name: &str, want: &Value, e: &ProposerError) {
    let reason = want["reason"].as_str().unwrap();
    match e {
        ProposerError::Unusable(msg) => assert!(msg.contains(reason), "{name}: {msg}"),
        other => panic!("{name}: expected an unusable reply, got {other:?}"),
    }
}

fn check_edit(name: &str, want: &Value, wm: &WorldModel, got: Result<Option<Edit>, ProposerError>) {
    match (want["becomes"].as_str().unwrap(), got) {
        ("no change", Ok(None)) => {}
        ("edit", Ok(Some(edit))) => {
            assert_eq!(
                edit.ops.len() as u64,
                want["ops"].as_u64().unwrap(),
                "{name}"
            );
            let mut draft = wm.clone();
            match (want["rejected"].as_str(), draft.apply_edit(&edit, 3)) {
                (None, Ok(_)) => {}
                (Some(why), Err(errors)) => {
                    let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
                    assert!(text.iter().any(|t| t.contains(why)), "{name}: {text:?}");
                    assert_eq!(&draft, wm, "{name}: a rejected edit changes nothing");
                }
                (want, got) => panic!("{name}: expected rejection {want:?}, got {got:?}"),
            }
        }
        ("unusable", Err(e)) => check_unusable(name, want, &e),
        (becomes, got) => panic!("{name}: expected {becomes}, got {got:?}"),
    }
}

/// Every file of the corpus has an expectation and every expectation a file.
#[test]
fn every_recorded_reply_has_an_expectation() {
    let want = expectations();
    let mut files = Vec::new();
    for role in ROLES {
        for entry in std::fs::read_dir(corpus_dir().join(role)).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            files.push(format!("{role}/{name}"));
        }
    }
    files.sort();
    let named: Vec<String> = want.keys().cloned().collect();
    assert_eq!(files, named);
    for role in ROLES {
        assert!(
            named
                .iter()
                .filter(|n| n.starts_with(&format!("{role}/")))
                .count()
                >= 3,
            "{role}: at least three recorded replies"
        );
    }
}

/// Each reply alone, through the real parser of its role.
#[test]
fn each_recorded_reply_becomes_what_it_should() {
    let wm = edit_fixture();
    let mut too_hard_wm = wm.clone();
    too_hard_wm.mark_too_hard(&NodeId::new("n3")).unwrap();
    let base = attempt_view(1.5);
    let mut checked = 0;
    for (name, want) in expectations() {
        let text = reply(&name);
        let role = name.split('/').next().unwrap();
        let becomes = want["becomes"].as_str().unwrap();
        let tag = match role {
            "code" => CODE_ROLE_TAG,
            "init" => "wm-init",
            "propose" => "wm-propose",
            "refine" => "wm-refine",
            _ => "wm-too-hard",
        };
        let llm = Arc::new(ScriptedLlm::new(vec![(tag, vec![Ok(text.clone())])]));
        let p = proposer(&llm, 1);
        match role {
            "code" => {
                let n3 = wm.node(&NodeId::new("n3")).unwrap().clone();
                let action = n3.action.clone().unwrap();
                let known = Default::default();
                let req = CodeRequest {
                    step: Step::SpecAction,
                    round: 2,
                    attempt: 1,
                    sample: 0,
                    node: &n3,
                    action: &action,
                    base: None,
                    last: None,
                    cycle_best: None,
                    history: &[],
                    wm: &wm,
                    known_sources: &known,
                };
                match (becomes, p.write_code(&req)) {
                    ("code", Ok(proposal)) => {
                        if let Some(note) = want["note"].as_str() {
                            assert_eq!(proposal.note, note, "{name}");
                        }
                        if let Some(part) = want["contains"].as_str() {
                            assert!(
                                proposal.source.contains(part),
                                "{name}: {}",
                                proposal.source
                            );
                        }
                        if let Some(other) = want["same_code_as"].as_str() {
                            let tags = vec!["c".to_string(), "h".to_string()];
                            assert_eq!(
                                proposal.source,
                                extract_code(&reply(other), &tags).unwrap()
                            );
                        }
                        // Prose and other blocks never reach the source.
                        assert!(!proposal.source.contains("Note:"), "{name}");
                        assert!(!proposal.source.contains("```"), "{name}");
                    }
                    ("unusable", Err(e)) => check_unusable(&name, &want, &e),
                    (becomes, got) => panic!("{name}: expected {becomes}, got {got:?}"),
                }
            }
            "init" => {
                let got = p.init_world_model(&brief()).unwrap();
                match becomes {
                    "plan" => {
                        assert_eq!(
                            got.nodes().len() as u64 - 1,
                            want["nodes"].as_u64().unwrap(),
                            "{name}"
                        );
                        assert_eq!(
                            got.frontier().len() as u64,
                            want["actions"].as_u64().unwrap(),
                            "{name}"
                        );
                    }
                    _ => {
                        // One call allowed: the fallback tree says why the plan was not used.
                        let reason = want["reason"].as_str().unwrap();
                        assert!(got.kernel_summary().contains("could not be used"), "{name}");
                        assert!(
                            got.kernel_summary().contains(reason),
                            "{name}: {}",
                            got.kernel_summary()
                        );
                        assert_eq!(got.frontier().len(), 1, "{name}");
                    }
                }
            }
            "propose" => check_edit(&name, &want, &wm, p.propose(&wm, 3, &[])),
            "refine" | "too_hard" => {
                let id = NodeId::new(if role == "refine" { "n1" } else { "n3" });
                let report = CycleReport {
                    node_id: &id,
                    round: 3,
                    attempts: 2,
                    base: None,
                    best: (role == "refine").then_some(&base),
                    last: Some(&base),
                    history: &[],
                    feedback: &[],
                };
                if role == "refine" {
                    check_edit(&name, &want, &wm, p.refine(&wm, &report));
                } else {
                    check_edit(
                        &name,
                        &want,
                        &too_hard_wm,
                        p.too_hard(&too_hard_wm, &report),
                    );
                }
            }
            other => panic!("unknown role directory {other}"),
        }
        // Exactly one call per reply: nothing was asked twice behind the test's back.
        assert_eq!(llm.seen().len(), 1, "{name}");
        checked += 1;
    }
    assert_eq!(checked, expectations().len());
}

/// Answers from the corpus's `eval` expectations: each recorded code reply's source gets the
/// status (and score or compiler message) recorded for it; the seed passes with 1.0.
struct CorpusEvaluator {
    results: BTreeMap<String, Value>,
    calls: AtomicUsize,
}

impl CorpusEvaluator {
    fn new() -> Self {
        let tags = vec!["c".to_string(), "h".to_string()];
        let mut results = BTreeMap::new();
        results.insert(
            "seed".to_string(),
            json!({"status": "passed", "score": 1.0}),
        );
        for (name, want) in expectations() {
            if let (Some(eval), Ok(src)) = (want.get("eval"), extract_code(&reply(&name), &tags)) {
                results.insert(src, eval.clone());
            }
        }
        Self {
            results,
            calls: AtomicUsize::new(0),
        }
    }
}

impl CandidateEvaluator for CorpusEvaluator {
    fn evaluate(&self, source: &str, _purpose: Purpose) -> Result<Evaluation, EvalFailure> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let result = self
            .results
            .get(source.trim_end_matches('\n'))
            .or_else(|| self.results.get(source))
            .cloned()
            .unwrap_or_else(|| json!({"status": "incorrect", "message": "not in the corpus"}));
        Ok(Evaluation {
            summary: self.summarize(&result),
            result,
        })
    }

    fn summarize(&self, result: &Value) -> OutcomeSummary {
        let passed = result["status"] == "passed";
        let score = result["score"].as_f64().filter(|_| passed);
        OutcomeSummary {
            status: result["status"].as_str().unwrap_or("").to_string(),
            passed,
            score,
            latency_ms: score.map(|s| 1.0 / s),
            message: result["message"].as_str().unwrap_or("").to_string(),
            workloads: score
                .map(|s| vec![format!("r512c4096: {:.3} ms, {s:.2}x vs baseline", 1.0 / s)])
                .unwrap_or_default(),
            ..OutcomeSummary::default()
        }
    }
}

/// Ranks the frontier by visits (fewest first), then priority: counting a cycle's visit changes
/// its ranking, so a `cycle_start` ranking taken after the visit would not start with the node
/// chosen.
struct FewestVisitsFirst;

impl SelectionPolicy for FewestVisitsFirst {
    fn name(&self) -> &str {
        "fewest-visits"
    }

    fn rank(&self, wm: &WorldModel) -> Vec<CandidateExplanation> {
        let mut nodes = wm.frontier();
        nodes.sort_by(|a, b| {
            let p =
                |n: &ksearch_search::world_model::Node| n.action.as_ref().map_or(0.0, |a| a.score);
            a.visits.cmp(&b.visits).then(p(b).total_cmp(&p(a)))
        });
        nodes
            .into_iter()
            .map(|n| CandidateExplanation {
                node_id: n.id.clone(),
                eligible: true,
                utility: None,
                summary: format!("{} visits", n.visits),
            })
            .collect()
    }
}

/// One cycle of five attempts from the corpus (two passes, a compile error, a repeat of the
/// first source, a refusal) and its refine step (a trailing comma, a refused field, then a
/// good edit), through the real engine.
#[test]
fn the_corpus_replayed_through_the_engine() {
    let tmp = tempfile::tempdir().unwrap();
    let codes = [
        "code/prose_around_code.txt",
        "code/several_blocks.txt",
        "code/compile_error.txt",
        "code/duplicate.txt",
        "code/refusal.txt",
    ];
    let refines = [
        "refine/trailing_comma.txt",
        "refine/system_field.txt",
        "refine/good_refine.txt",
    ];
    let llm = Arc::new(ScriptedLlm::new(vec![
        ("wm-init", vec![Ok(reply("init/good_plan.txt"))]),
        (CODE_ROLE_TAG, codes.iter().map(|c| Ok(reply(c))).collect()),
        ("wm-refine", refines.iter().map(|c| Ok(reply(c))).collect()),
    ]));
    let p = proposer(&llm, 3);
    let eval = CorpusEvaluator::new();
    let policy = FewestVisitsFirst;
    let cfg = EngineConfig {
        rounds: 5,
        samples: 1,
        stagnation_window: 5,
        cycle_cap: 5,
        recheck: false,
        confirm_rounds: 0,
        ..EngineConfig::default()
    };
    let engine = Engine::new(
        cfg,
        common::store(tmp.path(), "llm"),
        &p,
        &eval,
        &policy,
        brief(),
        &NoProgress,
    );
    let out = engine.run(Some("seed")).unwrap();
    let store = engine.into_store();
    assert_eq!(out.rounds_used, 5);
    assert_eq!(out.best.as_ref().map(|b| b.score), Some(1.5));

    // The repeated source was not measured again and the refusal left no candidate: the seed
    // and three sources were evaluated.
    assert_eq!(eval.calls.load(Ordering::SeqCst), 4);
    let attempts: Vec<(u32, String)> = store
        .candidates()
        .unwrap()
        .into_iter()
        .filter(|c| c.kind == CandidateKind::Attempt)
        .map(|c| (c.attempt, c.proposer_note))
        .collect();
    assert_eq!(
        attempts,
        [
            (1, "one pass per row with an online max and a rescaled running sum, then one write pass".to_string()),
            (2, "vectorised the write pass with 8-wide AVX2 lanes and a scalar tail".to_string()),
            (3, "float accumulator for the sum to halve the conversion cost".to_string()),
            (4, "back to the online version, it was the fastest".to_string()),
        ]
    );

    // The fifth code prompt (improve) lists every attempt, the repeat named as such.
    let code_prompts = llm.prompts(CODE_ROLE_TAG);
    assert_eq!(code_prompts.len(), 5);
    let fifth = &code_prompts[4];
    for part in [
        "## Attempts of this cycle (in order)",
        "- attempt 1: passed, score 1.500, 0.6667 ms (the cycle's best) — one pass per row",
        "  r512c4096: 0.667 ms, 1.50x vs baseline",
        "- attempt 2: passed, score 1.300, 0.7692 ms — vectorised the write pass",
        "- attempt 3: build_error — float accumulator for the sum",
        "  why: softmax.c:10:9: error: expected ',' or ';' before 'for'",
        "- attempt 4 was identical to attempt 1; it was not re-evaluated.",
    ] {
        assert!(fifth.contains(part), "missing {part:?} in\n{fifth}");
    }
    // An improve prompt after a slower attempt is not the same prompt again.
    assert_ne!(
        code_prompts[2].replace("attempt 3", ""),
        code_prompts[3].replace("attempt 4", "")
    );

    // Refine: asked three times; each retry carries the exact reason.
    let refine_prompts = llm.prompts("wm-refine");
    assert_eq!(refine_prompts.len(), 3);
    let first = &refine_prompts[0];
    assert!(
        first.contains("Signals: round 5; last evaluation proposer_error"),
        "{first}"
    );
    assert!(
        first.contains("- attempt 5: no code came out of the reply"),
        "{first}"
    );
    assert!(
        first.contains("why: code-improve: the reply has no fenced code block"),
        "{first}"
    );
    assert!(
        refine_prompts[1].contains(
            "your previous reply could not be used: wm-refine: JSON block 1 of the reply does not parse: trailing comma at line 4 column 1"
        ),
        "{}",
        refine_prompts[1]
    );
    assert!(
        refine_prompts[2].contains(
            "the edit was rejected: op 0: field `set.solution_id` is owned by the system"
        ),
        "{}",
        refine_prompts[2]
    );

    // The third reply applied: the question is settled, the summary rewritten, the child added.
    let state = store.get_state("engine").unwrap().unwrap();
    let wm: WorldModel = serde_json::from_value(state["wm"].clone()).unwrap();
    assert!(wm
        .kernel_summary()
        .starts_with("Row softmax, memory bound; the online one-pass statistic wins"));
    assert_eq!(wm.settled_questions().len(), 1);
    assert_eq!(wm.open_questions().len(), 2);
    assert!(wm
        .nodes()
        .iter()
        .any(|n| n.label.as_deref() == Some("float-exp")));
    assert_eq!(wm.computed_signals().round_index, 5);

    let events = store.events_after(0).unwrap();
    let kinds: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e.data["step"] == "refine")
        .map(|e| (e.kind.as_str(), e.data["step"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(
        kinds,
        [("proposer_error", "refine"), ("edit_rejected", "refine")]
    );
    // The cycle_start ranking is the one the node was chosen from: its first eligible entry.
    let start = events.iter().find(|e| e.kind == "cycle_start").unwrap();
    let first_eligible = start.data["ranking"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .find(|r| !r.contains("(gated)"))
        .unwrap();
    let chosen = start.data["node"].as_str().unwrap();
    assert_eq!(chosen, "n1");
    assert_eq!(first_eligible, "n1: 0 visits", "{start:?}");
}
