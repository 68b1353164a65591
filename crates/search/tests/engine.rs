//! Cycle-engine behaviour with a scripted proposer and a fake evaluator: stagnation, too-hard,
//! the seed as a result, proposer failures, budgets, and resume after an interrupted run.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde_json::{json, Value};

use ksearch_eval::Interrupt;

use ksearch_search::engine::{
    CandidateEvaluator, Engine, EngineConfig, EngineError, EvalFailure, Evaluation, NoProgress,
    Purpose, RunOutcome,
};
use ksearch_search::evolve::EvolveSettings;
use ksearch_search::proposer::{
    BottleneckReads, CodeRequest, CycleReport, MutationRequest, OutcomeSummary, Proposal, Proposer,
    ProposerError, TaskBrief,
};
use ksearch_search::selection::KSearchPolicy;
use ksearch_search::world_model::{ActionPatch, Edit, NodePatch, NodeState, WorldModel};
use ksearch_store::{CandidateKind, RunStore};

/// Sources look like `score=1.5;tag` (passes with that score) or `fail;tag`. `score=2/1.5~0.3`
/// passes with 2 on its first search evaluation and 1.5 on later ones (re-checks get the last
/// value), with the interval ±0.3 around each.
struct FakeEvaluator {
    calls: AtomicUsize,
    /// Search evaluations so far, per source.
    seen: Mutex<std::collections::HashMap<String, usize>>,
    /// Fail (as an infrastructure error) on this call number, 1-based.
    crash_on: Option<usize>,
    /// Fail every re-check (acceptance) evaluation the same way.
    crash_on_acceptance: bool,
    /// On this call number, request the interrupt and fail as an evaluator whose harness was
    /// killed by it.
    interrupt_on: Option<(usize, Interrupt)>,
    /// How long each evaluation takes.
    delay: std::time::Duration,
    /// How long the first takes instead, when set (a judge's cold start).
    first_delay: Option<std::time::Duration>,
    /// Each evaluation's source and when it ended, in the order they ended.
    ended: Mutex<Vec<(String, std::time::Instant)>>,
    /// When set, one device: an evaluation holds it while it takes its time (a round's
    /// samples queue for it) and reports that time as its result's `wall_seconds`.
    device: Option<Mutex<()>>,
}

impl FakeEvaluator {
    fn new(crash_on: Option<usize>) -> Self {
        Self {
            calls: AtomicUsize::new(0),
            seen: Mutex::new(Default::default()),
            crash_on,
            crash_on_acceptance: false,
            interrupt_on: None,
            delay: std::time::Duration::ZERO,
            first_delay: None,
            ended: Mutex::new(Vec::new()),
            device: None,
        }
    }
}

impl CandidateEvaluator for FakeEvaluator {
    fn evaluate(&self, source: &str, purpose: Purpose) -> Result<Evaluation, EvalFailure> {
        let device = self.device.as_ref().map(|d| d.lock().unwrap());
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let took = self.first_delay.filter(|_| n == 1).unwrap_or(self.delay);
        std::thread::sleep(took);
        if let Some((_, interrupt)) = self.interrupt_on.as_ref().filter(|(k, _)| *k == n) {
            interrupt.request();
            return Err(EvalFailure("interrupted".into()));
        }
        if self.crash_on == Some(n) || (self.crash_on_acceptance && purpose == Purpose::Acceptance)
        {
            return Err(EvalFailure("harness could not start".into()));
        }
        let head = source.split(';').next().unwrap_or("");
        let mut result = match head.strip_prefix("score=") {
            Some(s) => {
                let (values, width) = s.split_once('~').unwrap_or((s, ""));
                let values: Vec<f64> = values.split('/').map(|v| v.parse().unwrap()).collect();
                let k = if purpose == Purpose::Search {
                    let mut seen = self.seen.lock().unwrap();
                    let k = seen.entry(source.to_string()).or_insert(0);
                    *k += 1;
                    *k - 1
                } else {
                    values.len() - 1
                };
                let score = values[k.min(values.len() - 1)];
                let interval = width
                    .parse::<f64>()
                    .ok()
                    .map(|w| json!([score - w, score + w]));
                // `;sol=0.8` anywhere in the source: the speed-of-light share it reaches.
                let sol = source
                    .split(';')
                    .find_map(|p| p.strip_prefix("sol="))
                    .and_then(|v| v.trim().parse::<f64>().ok());
                json!({"status": "passed", "score": score, "score_interval": interval,
                       "purpose": format!("{purpose:?}"), "sol": sol})
            }
            None => json!({"status": "incorrect", "message": "wrong answer"}),
        };
        if device.is_some() {
            result["wall_seconds"] = json!(took.as_secs_f64());
        }
        drop(device);
        self.ended
            .lock()
            .unwrap()
            .push((source.to_string(), std::time::Instant::now()));
        Ok(Evaluation {
            summary: self.summarize(&result),
            result,
        })
    }

    fn summarize(&self, result: &Value) -> OutcomeSummary {
        let passed = result["status"] == "passed";
        OutcomeSummary {
            status: result["status"].as_str().unwrap_or("").to_string(),
            passed,
            score: result["score"].as_f64().filter(|_| passed),
            score_interval: serde_json::from_value(result["score_interval"].clone()).ok(),
            message: result["message"].as_str().unwrap_or("").to_string(),
            speed_of_light: result["sol"].as_f64(),
            ..OutcomeSummary::default()
        }
    }
}

type Script = dyn Fn(&str, u32, u32) -> Result<String, ProposerError> + Send + Sync;

/// Root actions `a` (priority 0.9) and `b` (0.6); code comes from `script(label, round,
/// attempt)`.
struct ScriptedProposer {
    script: Box<Script>,
    refines: Mutex<Vec<String>>,
    /// The bottleneck of each refined cycle's best, as `refine` saw it.
    refined_bottlenecks: Mutex<Vec<Option<String>>>,
    reads: BottleneckReads,
}

impl ScriptedProposer {
    fn new(
        script: impl Fn(&str, u32, u32) -> Result<String, ProposerError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            script: Box::new(script),
            refines: Mutex::new(Vec::new()),
            refined_bottlenecks: Mutex::new(Vec::new()),
            reads: BottleneckReads::EveryAttempt,
        }
    }

    fn reading_bottlenecks(mut self, reads: BottleneckReads) -> Self {
        self.reads = reads;
        self
    }
}

fn action(label: &str, score: f64) -> NodePatch {
    NodePatch {
        label: Some(label.into()),
        action: Some(ActionPatch {
            title: Some(format!("action {label}")),
            score: Some(Some(score)),
            difficulty: Some(2.0),
            ..ActionPatch::default()
        }),
        ..NodePatch::default()
    }
}

impl Proposer for ScriptedProposer {
    fn name(&self) -> &str {
        "scripted"
    }
    fn init_world_model(&self, _task: &TaskBrief) -> Result<WorldModel, ProposerError> {
        let mut wm = WorldModel::new_root("test", vec![]);
        let root = wm.root_id().clone();
        wm.insert_child(&root, &action("a", 0.9), 0).unwrap();
        wm.insert_child(&root, &action("b", 0.6), 0).unwrap();
        Ok(wm)
    }
    fn propose(&self, _: &WorldModel, _: u32, _: &[String]) -> Result<Option<Edit>, ProposerError> {
        Ok(None)
    }
    fn write_code(&self, req: &CodeRequest<'_>) -> Result<Proposal, ProposerError> {
        let label = req.node.label.clone().unwrap_or_else(|| "cont".into());
        let source = (self.script)(&label, req.round, req.attempt)?;
        Ok(Proposal {
            // A round's later samples are sources of their own (none reuses another's result).
            source: match req.sample {
                0 => format!("{source};{label};r{}", req.round),
                k => format!("{source};{label};r{};s{k}", req.round),
            },
            knobs: None,
            note: String::new(),
        })
    }
    fn reads_bottlenecks(&self) -> BottleneckReads {
        self.reads
    }
    fn refine(&self, _: &WorldModel, r: &CycleReport<'_>) -> Result<Option<Edit>, ProposerError> {
        self.refines.lock().unwrap().push(r.node_id.to_string());
        self.refined_bottlenecks
            .lock()
            .unwrap()
            .push(r.best.and_then(|b| b.outcome.bottleneck.clone()));
        Ok(None)
    }
    fn too_hard(&self, _: &WorldModel, _: &CycleReport<'_>) -> Result<Option<Edit>, ProposerError> {
        Ok(None)
    }
}

fn store(dir: &std::path::Path) -> RunStore {
    common::store(dir, "scripted")
}

fn cfg(rounds: u32, cap: u32) -> EngineConfig {
    EngineConfig {
        rounds,
        samples: 1,
        stagnation_window: 3,
        cycle_cap: cap,
        recheck: false,
        ..EngineConfig::default()
    }
}

fn brief() -> TaskBrief {
    TaskBrief {
        language: "c".into(),
        ..TaskBrief::default()
    }
}

/// An engine with the original selection policy and no progress display.
fn new_engine<'a>(
    cfg: EngineConfig,
    store: RunStore,
    proposer: &'a dyn Proposer,
    eval: &'a dyn CandidateEvaluator,
) -> Engine<'a> {
    static POLICY: std::sync::LazyLock<KSearchPolicy> =
        std::sync::LazyLock::new(KSearchPolicy::default);
    Engine::new(cfg, store, proposer, eval, &*POLICY, brief(), &NoProgress)
}

fn final_wm(store: &RunStore) -> WorldModel {
    let state = store.get_state("engine").unwrap().unwrap();
    serde_json::from_value(state["wm"].clone()).unwrap()
}

#[test]
fn a_cycle_that_never_passes_lasts_one_window_and_marks_the_node_too_hard() {
    let tmp = tempfile::tempdir().unwrap();
    let proposer = ScriptedProposer::new(|label, _, _| {
        Ok(if label == "a" {
            "fail".into()
        } else {
            "score=2".into()
        })
    });
    let eval = FakeEvaluator::new(None);
    let engine = new_engine(cfg(4, 0), store(tmp.path()), &proposer, &eval);
    let out = engine.run(Some("score=1;seed")).unwrap();
    let store = engine.into_store();
    let wm = final_wm(&store);
    let a = wm
        .nodes()
        .iter()
        .find(|n| n.label.as_deref() == Some("a"))
        .unwrap();
    assert!(
        matches!(a.state, NodeState::TooHard { .. }),
        "{:?}",
        a.state
    );
    assert_eq!(a.attempts, 3, "window W=3 failed attempts");
    assert_eq!(a.failures, 3);
    // The fourth round went to `b`, which passed.
    let b = wm
        .nodes()
        .iter()
        .find(|n| n.label.as_deref() == Some("b"))
        .unwrap();
    assert_eq!(b.attempts, 1);
    assert_eq!(out.rounds_used, 4);
    assert_eq!(out.best.unwrap().score, 2.0);
    wm.validate().unwrap();
}

#[test]
fn the_seed_counts_as_the_result_when_nothing_beats_it() {
    let tmp = tempfile::tempdir().unwrap();
    let proposer = ScriptedProposer::new(|_, _, _| Ok("score=0.5".into()));
    let eval = FakeEvaluator::new(None);
    let engine = new_engine(cfg(5, 0), store(tmp.path()), &proposer, &eval);
    let out = engine.run(Some("score=3;seed")).unwrap();
    let best = out.best.unwrap();
    assert_eq!(best.score, 3.0);
    assert_eq!(best.round, 0);
    let store = engine.into_store();
    let c = store.candidate(best.candidate_id).unwrap().unwrap();
    assert_eq!(c.kind, CandidateKind::Seed);
}

#[test]
fn improving_attempts_keep_a_cycle_going_until_the_cap_then_refine_runs() {
    let tmp = tempfile::tempdir().unwrap();
    // Every attempt improves on the last: only the cap ends the cycle.
    let proposer =
        ScriptedProposer::new(|_, round, _| Ok(format!("score={}", 1.0 + f64::from(round))));
    let eval = FakeEvaluator::new(None);
    let engine = new_engine(cfg(6, 4), store(tmp.path()), &proposer, &eval);
    engine.run(Some("score=1;seed")).unwrap();
    let store = engine.into_store();
    let wm = final_wm(&store);
    let a = wm
        .nodes()
        .iter()
        .find(|n| n.label.as_deref() == Some("a"))
        .unwrap();
    assert_eq!(a.attempts, 4, "the cap of 4 attempts ended the first cycle");
    let sol = a.solution().expect("a is closed with its best");
    assert_eq!(sol.score, 5.0);
    // The continuation rule gave the solved node an open child.
    assert!(wm
        .children(&a.id)
        .iter()
        .any(|c| c.is_open() && c.is_action()));
    assert_eq!(
        proposer.refines.lock().unwrap().first().map(String::as_str),
        Some(a.id.as_str())
    );
}

#[test]
fn a_proposer_failure_is_a_failed_attempt_not_an_aborted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let proposer = ScriptedProposer::new(|_, round, _| {
        if round == 1 {
            Err(ProposerError::Unusable("no code block in the reply".into()))
        } else {
            Ok("score=2".into())
        }
    });
    let eval = FakeEvaluator::new(None);
    let engine = new_engine(cfg(3, 0), store(tmp.path()), &proposer, &eval);
    let out = engine.run(Some("score=1;seed")).unwrap();
    assert_eq!(out.rounds_used, 3);
    assert_eq!(out.failed, 1);
    assert_eq!(out.best.unwrap().score, 2.0);
}

/// Calls that fail (unreachable, refused) three times in a row stop the run, unfinished and
/// resumable, with the last error; a reply in between, even an unusable one, resets the count.
#[test]
fn failed_proposer_calls_in_a_row_stop_the_run_resumably() {
    let tmp = tempfile::tempdir().unwrap();
    let refused = |_: &str, _: u32, _: u32| -> Result<String, ProposerError> {
        Err(ProposerError::CallFailed(
            "the model call failed: openai: HTTP 401: invalid api key".into(),
        ))
    };
    let proposer = ScriptedProposer::new(refused);
    let eval = FakeEvaluator::new(None);
    let engine = new_engine(cfg(10, 0), store(tmp.path()), &proposer, &eval);
    match engine.run(Some("score=1;seed")) {
        Err(EngineError::ProposerGaveUp { failures, last }) => {
            assert_eq!(failures, 3);
            assert!(last.contains("HTTP 401"), "{last}");
        }
        r => panic!("expected ProposerGaveUp, got {r:?}"),
    }
    let stopped = engine.into_store();
    assert!(!stopped.is_finished().unwrap(), "a resume continues it");
    assert_eq!(events(&stopped, "proposer_gave_up").len(), 1);

    // Two failures, an unusable reply, two more failures: never three in a row.
    let tmp = tempfile::tempdir().unwrap();
    let proposer = ScriptedProposer::new(|_, round, _| match round % 3 {
        0 => Err(ProposerError::Unusable("no code block in the reply".into())),
        _ => Err(ProposerError::CallFailed("connection refused".into())),
    });
    let engine = new_engine(cfg(6, 0), store(tmp.path()), &proposer, &eval);
    let out = engine.run(Some("score=1;seed")).unwrap();
    assert_eq!(out.rounds_used, 6);

    // 0 never stops.
    let tmp = tempfile::tempdir().unwrap();
    let proposer = ScriptedProposer::new(refused);
    let config = EngineConfig {
        max_proposer_failures: 0,
        ..cfg(5, 0)
    };
    let engine = new_engine(config, store(tmp.path()), &proposer, &eval);
    assert_eq!(engine.run(Some("score=1;seed")).unwrap().rounds_used, 5);
}

#[test]
fn a_token_budget_stops_the_run_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let proposer = ScriptedProposer::new(|_, round, _| {
        if round == 2 {
            Err(ProposerError::Budget("max tokens".into()))
        } else {
            Ok("score=2".into())
        }
    });
    let eval = FakeEvaluator::new(None);
    let engine = new_engine(cfg(10, 0), store(tmp.path()), &proposer, &eval);
    let out = engine.run(None).unwrap();
    assert!(
        out.stop_reason.contains("max tokens"),
        "{}",
        out.stop_reason
    );
    assert_eq!(out.rounds_used, 1);
    assert!(engine.into_store().is_finished().unwrap());
}

/// A run of up to 1000 rounds whose scores climb by 0.01 a round, stopped by a wall-time
/// budget of `max_wall` seconds, with a re-check and one confirmation round: its outcome and
/// how long it took.
fn run_on_a_wall_budget(
    eval: &FakeEvaluator,
    max_wall: u64,
    seed: Option<&str>,
) -> (RunOutcome, f64) {
    let tmp = tempfile::tempdir().unwrap();
    let proposer = ScriptedProposer::new(|_, round, _| {
        Ok(format!("score={};r{round}", 1.0 + f64::from(round) / 100.0))
    });
    let config = EngineConfig {
        max_wall_seconds: Some(max_wall),
        recheck: true,
        confirm_rounds: 1,
        ..cfg(1000, 0)
    };
    let engine = new_engine(config, store(tmp.path()), &proposer, eval);
    let t0 = std::time::Instant::now();
    let out = engine.run(seed).unwrap();
    (out, t0.elapsed().as_secs_f64())
}

#[test]
fn the_wall_time_budget_covers_the_finish_too() {
    // Evaluations of 100 ms, a budget of 2 s: rounds stop early enough for the re-check and
    // the confirmation (8 evaluations here) to end within it.
    let eval = FakeEvaluator {
        delay: std::time::Duration::from_millis(100),
        ..FakeEvaluator::new(None)
    };
    let (out, wall) = run_on_a_wall_budget(&eval, 2, None);
    assert!(
        out.stop_reason
            .contains("wall-time budget reached (2 s, of which about"),
        "{}",
        out.stop_reason
    );
    assert!(out.rounds_used >= 5, "{} rounds", out.rounds_used);
    assert!(out.confirmation.is_some());
    // The finish's evaluations all happened, inside the budget (with room for scheduling).
    assert!(wall < 2.4, "the run took {wall:.2} s");
}

#[test]
fn a_slow_first_evaluation_does_not_keep_the_whole_budget_for_the_finish() {
    // The seed's evaluation also starts the judge (imports, input sets, reference outputs):
    // 1.5 s here against 50 ms for the rest. Budgeted at that pace the finish (6 evaluations)
    // would take 9 s of the 4 s and no round would start (on the H200 a default attention run
    // given 540 s stopped after its seed); only the winner's re-check, which draws its input
    // sets anew as the first evaluation did, is budgeted at that pace, the rest at the later
    // evaluations'.
    let eval = FakeEvaluator {
        delay: std::time::Duration::from_millis(50),
        first_delay: Some(std::time::Duration::from_millis(1500)),
        ..FakeEvaluator::new(None)
    };
    let (out, wall) = run_on_a_wall_budget(&eval, 4, Some("score=1;seed"));
    assert!(
        out.rounds_used >= 10,
        "{} rounds: {}",
        out.rounds_used,
        out.stop_reason
    );
    assert!(out.confirmation.is_some());
    assert!(wall < 4.6, "the run took {wall:.2} s");
}

#[test]
fn samples_waiting_for_the_device_do_not_inflate_the_finish_budget() {
    // Four samples a round queue for one device that takes 100 ms per evaluation: a sample
    // waits up to 300 ms before its own 100 ms. Budgeted at the waiting samples' pace, the
    // finish (6 evaluations, about 0.6 s here, one at a time) would keep 1.8 s besides a
    // round of 0.4 s, and a 3 s budget would end after a round or two; at the judge's pace
    // it keeps about 1 s.
    let eval = FakeEvaluator {
        delay: std::time::Duration::from_millis(100),
        device: Some(Mutex::new(())),
        ..FakeEvaluator::new(None)
    };
    let tmp = tempfile::tempdir().unwrap();
    let proposer = ScriptedProposer::new(|label, round, _| {
        Ok(format!(
            "score={};r{round}{label}",
            1.0 + f64::from(round) / 100.0
        ))
    });
    let config = EngineConfig {
        max_wall_seconds: Some(3),
        recheck: true,
        confirm_rounds: 1,
        samples: 4,
        ..cfg(1000, 0)
    };
    let engine = new_engine(config, store(tmp.path()), &proposer, &eval);
    let t0 = std::time::Instant::now();
    let out = engine.run(Some("score=1;seed")).unwrap();
    let wall = t0.elapsed().as_secs_f64();
    assert!(
        out.rounds_used >= 4,
        "{} rounds: {}",
        out.rounds_used,
        out.stop_reason
    );
    assert!(out.confirmation.is_some());
    assert!(wall < 3.4, "the run took {wall:.2} s");
}

#[test]
fn resuming_after_an_interruption_never_redoes_a_completed_evaluation() {
    let tmp = tempfile::tempdir().unwrap();
    let script = |label: &str, round: u32, _: u32| -> Result<String, ProposerError> {
        Ok(if label == "a" && round.is_multiple_of(2) {
            "fail".into()
        } else {
            format!("score={}", 1 + round % 3)
        })
    };
    // First session: the evaluator breaks down on its 5th call (seed + 3 attempts done).
    let proposer = ScriptedProposer::new(script);
    let broken = FakeEvaluator::new(Some(5));
    let engine = new_engine(cfg(8, 0), store(tmp.path()), &proposer, &broken);
    let err = engine.run(Some("score=1;seed")).unwrap_err();
    assert!(matches!(err, EngineError::Evaluator(_)), "{err}");
    let dir = engine.into_store().dir().to_path_buf();
    let evaluated_before = RunStore::open(&dir).unwrap().evaluations().unwrap().len();
    assert_eq!(evaluated_before, 4);

    // Second session on the reopened store.
    let proposer = ScriptedProposer::new(script);
    let eval = FakeEvaluator::new(None);
    let engine = new_engine(cfg(8, 0), RunStore::open(&dir).unwrap(), &proposer, &eval);
    let out = engine.run(Some("score=1;seed")).unwrap();
    assert_eq!(out.rounds_used, 8);
    let store = engine.into_store();
    let evals = store.evaluations().unwrap();
    // One evaluation per candidate, and the second session evaluated only what was missing.
    let cands = store.candidates().unwrap();
    assert_eq!(evals.len(), cands.len());
    assert_eq!(
        eval.calls.load(Ordering::SeqCst) + evaluated_before,
        evals.len() + reused(&evals)
    );
    let mut ids: Vec<i64> = evals.iter().map(|e| e.candidate_id).collect();
    ids.dedup();
    assert_eq!(ids.len(), evals.len(), "no candidate evaluated twice");
    final_wm(&store).validate().unwrap();
}

/// Ctrl-C in the middle of an evaluation: the run stops with `Interrupted` (not an evaluator
/// error), records nothing for the abandoned evaluation, and a resumed session finishes it.
#[test]
fn an_interrupt_stops_the_run_resumably_without_recording_the_abandoned_evaluation() {
    let tmp = tempfile::tempdir().unwrap();
    let script = |_: &str, round: u32, _: u32| -> Result<String, ProposerError> {
        Ok(format!("score={}", 1 + round))
    };
    let interrupt = Interrupt::new();
    let proposer = ScriptedProposer::new(script);
    let mut eval = FakeEvaluator::new(None);
    eval.interrupt_on = Some((3, interrupt.clone()));
    let engine =
        new_engine(cfg(5, 0), store(tmp.path()), &proposer, &eval).with_interrupt(&interrupt);
    let err = engine.run(Some("score=1;seed")).unwrap_err();
    assert!(matches!(err, EngineError::Interrupted), "{err}");
    assert_eq!(
        eval.calls.load(Ordering::SeqCst),
        3,
        "nothing ran after the interrupt"
    );
    let store = engine.into_store();
    assert!(!store.is_finished().unwrap());
    let (evals, cands) = (store.evaluations().unwrap(), store.candidates().unwrap());
    assert_eq!(evals.len(), 2, "the seed and the first attempt");
    assert_eq!(
        cands.len(),
        3,
        "the interrupted attempt is kept, unevaluated"
    );
    let dir = store.dir().to_path_buf();
    drop(store);

    let proposer = ScriptedProposer::new(script);
    let eval = FakeEvaluator::new(None);
    let engine = new_engine(cfg(5, 0), RunStore::open(&dir).unwrap(), &proposer, &eval);
    let out = engine.run(Some("score=1;seed")).unwrap();
    assert_eq!(out.rounds_used, 5);
    let store = engine.into_store();
    let evals = store.evaluations().unwrap();
    assert_eq!(evals.len(), store.candidates().unwrap().len());
    assert!(
        evals.iter().all(|e| e.status == "passed"),
        "no failure was recorded"
    );
}

/// A session killed before its first checkpoint has recorded the seed, evaluated or not; the
/// next session takes it up instead of recording a second seed (found by the CLI's
/// crash-resume test).
#[test]
fn a_seed_recorded_before_a_crash_is_taken_up_not_recorded_again() {
    let script = |_: &str, round: u32, _: u32| Ok(format!("score={}", 1 + round % 3));
    for evaluated in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let proposer = ScriptedProposer::new(script);
        // The evaluator fails on the seed: the session records it and dies before any
        // checkpoint.
        let broken = FakeEvaluator::new(Some(1));
        let engine = new_engine(cfg(4, 0), store(tmp.path()), &proposer, &broken);
        assert!(engine.run(Some("score=1;seed")).is_err());
        let dir = engine.into_store().dir().to_path_buf();
        let store = RunStore::open(&dir).unwrap();
        assert!(store.get_state("engine").unwrap().is_none());
        let seed_id = store.candidates().unwrap()[0].id;
        if evaluated {
            // As if the kill came after the seed's evaluation committed.
            let result = json!({"status": "passed", "score": 1.0});
            store
                .record_evaluation(seed_id, "passed", Some(1.0), &result)
                .unwrap();
        }
        drop(store);

        let proposer = ScriptedProposer::new(script);
        let eval = FakeEvaluator::new(None);
        let engine = new_engine(cfg(4, 0), RunStore::open(&dir).unwrap(), &proposer, &eval);
        let out = engine.run(Some("score=1;seed")).unwrap();
        let store = engine.into_store();
        let seeds: Vec<_> = store
            .candidates()
            .unwrap()
            .into_iter()
            .filter(|c| c.kind == CandidateKind::Seed)
            .collect();
        assert_eq!(seeds.len(), 1, "evaluated before the crash: {evaluated}");
        assert_eq!(seeds[0].id, seed_id);
        let evals = store.evaluations().unwrap();
        assert_eq!(
            evals.iter().filter(|e| e.candidate_id == seed_id).count(),
            1
        );
        assert_eq!(out.seed_score, Some(1.0));
        // The seed is measured once in all: by the second session only if the first did not.
        let attempts = store.candidates().unwrap().len() - 1;
        assert_eq!(
            eval.calls.load(Ordering::SeqCst) + reused(&evals),
            attempts + usize::from(!evaluated)
        );
        final_wm(&store).validate().unwrap();
    }
}

/// A session killed during the final re-checks left a re-check candidate; the next session
/// takes it up instead of recording (and measuring) the same re-check again (found by the
/// CLI's crash-resume test).
#[test]
fn a_recheck_interrupted_by_a_crash_is_taken_up_not_recorded_again() {
    let script = |_: &str, round: u32, _: u32| Ok(format!("score={}", 1 + round % 3));
    let tmp = tempfile::tempdir().unwrap();
    let with_recheck = EngineConfig {
        recheck: true,
        confirm_rounds: 0,
        ..cfg(3, 0)
    };
    let proposer = ScriptedProposer::new(script);
    let broken = FakeEvaluator {
        crash_on_acceptance: true,
        ..FakeEvaluator::new(None)
    };
    let engine = new_engine(with_recheck.clone(), store(tmp.path()), &proposer, &broken);
    assert!(engine.run(Some("score=1;seed")).is_err());
    let dir = engine.into_store().dir().to_path_buf();
    let rechecks = |store: &RunStore| -> Vec<i64> {
        store
            .candidates()
            .unwrap()
            .into_iter()
            .filter(|c| c.kind == CandidateKind::Recheck)
            .map(|c| c.id)
            .collect()
    };
    let interrupted = rechecks(&RunStore::open(&dir).unwrap());
    assert_eq!(interrupted.len(), 1);

    let proposer = ScriptedProposer::new(script);
    let eval = FakeEvaluator::new(None);
    let engine = new_engine(
        with_recheck,
        RunStore::open(&dir).unwrap(),
        &proposer,
        &eval,
    );
    let out = engine.run(Some("score=1;seed")).unwrap();
    assert_eq!(out.recheck.as_ref().unwrap()["status"], "passed");
    let store = engine.into_store();
    let all = rechecks(&store);
    // The winner's re-check (taken up) and the seed's; each evaluated once.
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[0], interrupted[0]);
    let evals = store.evaluations().unwrap();
    for id in &all {
        assert_eq!(evals.iter().filter(|e| e.candidate_id == *id).count(), 1);
    }
    assert_eq!(eval.calls.load(Ordering::SeqCst), 2);
}

/// Evaluations copied from an identical earlier source (the compile/eval cache).
fn reused(evals: &[ksearch_store::EvaluationRow]) -> usize {
    evals
        .iter()
        .filter(|e| !e.result["reused_from_candidate"].is_null())
        .count()
}

#[test]
fn a_finished_run_refuses_to_resume_without_more_rounds() {
    let tmp = tempfile::tempdir().unwrap();
    let proposer = ScriptedProposer::new(|_, _, _| Ok("score=2".into()));
    let eval = FakeEvaluator::new(None);
    let engine = new_engine(cfg(2, 0), store(tmp.path()), &proposer, &eval);
    engine.run(None).unwrap();
    let dir = engine.into_store().dir().to_path_buf();
    let engine = new_engine(cfg(2, 0), RunStore::open(&dir).unwrap(), &proposer, &eval);
    assert!(matches!(
        engine.run(None),
        Err(EngineError::Finished { .. })
    ));
    // Continued under more rounds, it is running again: a session that dies before the new
    // ending leaves an unfinished run, not the old summary (whose best `bench --run` and
    // `export` would report).
    let broken = FakeEvaluator::new(Some(1));
    let engine = new_engine(cfg(3, 0), RunStore::open(&dir).unwrap(), &proposer, &broken);
    assert!(matches!(engine.run(None), Err(EngineError::Evaluator(_))));
    let reopened = RunStore::open(&dir).unwrap();
    assert!(!reopened.is_finished().unwrap());
    assert_eq!(reopened.finish_summary().unwrap(), None);
    // More rounds continue it.
    let engine = new_engine(cfg(4, 0), RunStore::open(&dir).unwrap(), &proposer, &eval);
    assert_eq!(engine.run(None).unwrap().rounds_used, 4);
}

#[test]
fn the_winner_and_the_seed_are_re_measured_under_the_same_conditions() {
    let tmp = tempfile::tempdir().unwrap();
    let proposer = ScriptedProposer::new(|_, _, _| Ok("score=4".into()));
    let eval = FakeEvaluator::new(None);
    let config = EngineConfig {
        recheck: true,
        confirm_rounds: 0,
        ..cfg(1, 0)
    };
    let out = new_engine(config, store(tmp.path()), &proposer, &eval)
        .run(Some("score=2;seed"))
        .unwrap();
    let best = out.best.unwrap();
    assert_eq!(best.score, 4.0);
    // Both re-checks ran as acceptance evaluations (the fake reports the purpose).
    assert_eq!(best.rechecked_score, Some(4.0));
    assert_eq!(out.seed_recheck_score, Some(2.0));
    assert_eq!(out.recheck.unwrap()["status"], "passed");
    // Seed, one attempt, the winner's re-check and the seed's.
    assert_eq!(eval.calls.load(Ordering::SeqCst), 4);
}

fn events(store: &RunStore, kind: &str) -> Vec<Value> {
    store
        .events_after(0)
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == kind)
        .map(|e| e.data)
        .collect()
}

/// A higher score inside the incumbent's interval is measured again, incumbent first, and the
/// better pooled score is kept; a higher score beyond the interval replaces it at once.
#[test]
fn a_new_best_within_noise_is_re_measured_against_the_incumbent() {
    let script = |_: &str, round: u32, _: u32| {
        Ok(match round {
            1 => "score=2.0/1.5~0.5;lucky",
            2 => "score=2.1/1.9~0.5;steady",
            _ => "score=0.5;slow",
        }
        .to_string())
    };
    let tmp = tempfile::tempdir().unwrap();
    let proposer = ScriptedProposer::new(script);
    let eval = FakeEvaluator::new(None);
    let engine = new_engine(cfg(3, 0), store(tmp.path()), &proposer, &eval);
    let out = engine.run(Some("score=1~0.1;seed")).unwrap();
    let store = engine.into_store();
    let duels = events(&store, "remeasure");
    // Round 1 beat the seed beyond noise (1.5 > 1.1): no re-measure. Round 2 did not.
    assert_eq!(duels.len(), 1, "{duels:?}");
    assert_eq!(duels[0]["incumbent_scores"], json!([2.0, 1.5]));
    assert_eq!(duels[0]["challenger_scores"], json!([2.1, 1.9]));
    let best = out.best.unwrap();
    assert_eq!(duels[0]["kept"], json!(best.candidate_id));
    assert_eq!(best.scores, vec![2.1, 1.9]);
    assert!((best.score - (2.1f64 * 1.9).sqrt()).abs() < 1e-12);
}

#[test]
fn a_challenger_that_falls_back_on_a_re_measure_loses_the_duel() {
    let script = |_: &str, round: u32, _: u32| {
        Ok(match round {
            1 => "score=2.0~0.5;first",
            _ => "score=2.2/1.0~0.5;fluke",
        }
        .to_string())
    };
    let tmp = tempfile::tempdir().unwrap();
    let proposer = ScriptedProposer::new(script);
    let eval = FakeEvaluator::new(None);
    let engine = new_engine(cfg(2, 0), store(tmp.path()), &proposer, &eval);
    let out = engine.run(Some("score=1~0.1;seed")).unwrap();
    let store = engine.into_store();
    let first = store
        .candidates()
        .unwrap()
        .into_iter()
        .find(|c| c.round == 1)
        .unwrap();
    assert_eq!(out.best.unwrap().candidate_id, first.id);
    assert_eq!(events(&store, "remeasure").len(), 1);
}

/// A run of three rounds whose code is `scripts[0]` in round 1, `scripts[1]` in round 2 and
/// `scripts[2]` after, with the re-check and two confirmation rounds. The temporary directory
/// holds the run.
fn confirmed_run(scripts: [&'static str; 3]) -> (tempfile::TempDir, RunOutcome, RunStore) {
    confirmed_run_of(3, move |round| {
        match round {
            1 => scripts[0],
            2 => scripts[1],
            _ => scripts[2],
        }
        .to_string()
    })
}

/// A run of `rounds` rounds whose code in each round is `code(round)`, with the re-check and
/// two confirmation rounds.
fn confirmed_run_of(
    rounds: u32,
    code: impl Fn(u32) -> String + Send + Sync + 'static,
) -> (tempfile::TempDir, RunOutcome, RunStore) {
    let script = move |_: &str, round: u32, _: u32| Ok(code(round));
    let tmp = tempfile::tempdir().unwrap();
    let proposer = ScriptedProposer::new(script);
    let eval = FakeEvaluator::new(None);
    let config = EngineConfig {
        recheck: true,
        confirm_rounds: 2,
        ..cfg(rounds, 0)
    };
    let engine = new_engine(config, store(tmp.path()), &proposer, &eval);
    let out = engine.run(Some("score=1~0.1;seed")).unwrap();
    let store = engine.into_store();
    (tmp, out, store)
}

/// The candidate whose source contains `tag`.
fn candidate_tagged(store: &RunStore, tag: &str) -> i64 {
    store
        .candidates()
        .unwrap()
        .into_iter()
        .find(|k| store.source(&k.source_id).unwrap().contains(tag))
        .unwrap()
        .id
}

/// A runner-up whose confirmation tops the winner's within their intervals does not take over:
/// the highest of overlapping confirmations is the luckiest draw, and the headline would
/// overstate it.
#[test]
fn a_runner_up_confirmed_higher_within_noise_does_not_replace_the_winner() {
    let (_tmp, out, store) = confirmed_run([
        "score=2.4~0.5;steady",
        // Below the winner in the search, a little above it in the confirmation.
        "score=2.0/2.7~0.5;close",
        "score=0.5~0.1;slow",
    ]);
    let c = out.confirmation.clone().unwrap();
    let (steady, close) = (
        candidate_tagged(&store, ";steady"),
        candidate_tagged(&store, ";close"),
    );
    assert_eq!(c.of(close).unwrap().score, Some(2.7));
    assert_eq!(c.of(steady).unwrap().score, Some(2.4));
    assert_eq!(c.winner, steady);
    let best = out.best.unwrap();
    assert_eq!(best.candidate_id, steady);
    assert_eq!(best.score, 2.4);
}

/// The winner, the runner-ups and the seed are evaluated in turn at the end; a runner-up that
/// confirms clearly faster, and passes its re-check, becomes the best, and the confirmation is
/// what the run reports.
#[test]
fn the_confirmation_re_ranks_the_winner_against_the_runner_ups() {
    let (_tmp, out, store) = confirmed_run([
        "score=3/2~0.2;lucky",
        "score=2.5~0.2;solid",
        "score=0.5~0.1;slow",
    ]);
    let c = out.confirmation.clone().unwrap();
    assert_eq!(c.rounds, 2);
    // Winner, seed and one runner-up, each measured twice. `solid`'s interval (2.3–2.7) lies
    // below the lucky winner's (2.8–3.2) but within the margin, so it is confirmed; `slow`'s
    // (0.4–0.6) lies far below and could not overtake.
    assert_eq!(c.contenders.len(), 3);
    assert!(c.contenders.iter().all(|k| k.scores.len() == 2));
    assert_eq!(c.clearly_slower, vec![candidate_tagged(&store, ";slow")]);
    let (lucky, solid) = (
        candidate_tagged(&store, ";lucky"),
        candidate_tagged(&store, ";solid"),
    );
    assert_eq!(c.of(lucky).unwrap().role, "winner");
    assert_eq!(c.of(lucky).unwrap().score, Some(2.0));
    assert_eq!(c.winner, solid);
    let best = out.best.unwrap();
    assert_eq!(best.candidate_id, solid);
    assert_eq!(best.rechecked_score, Some(2.5));
    assert_eq!(c.seed().unwrap().score, Some(1.0));
    assert_eq!(events(&store, "confirmation").len(), 1);
}

/// A kernel whose search interval lies far below the winner's is not confirmed: it could take
/// over only by confirming wholly above the winner. One without an interval, or within the
/// margin, is; the seed always is (the headline's ratio is measured against it).
#[test]
fn runner_ups_far_below_the_winner_are_left_out_of_the_confirmation() {
    let (_tmp, out, store) = confirmed_run([
        "score=2.0~0.1;top",
        "score=1.5~0.1;far",
        "score=1.7;unmeasured",
    ]);
    let c = out.confirmation.clone().unwrap();
    let (top, far, unmeasured) = (
        candidate_tagged(&store, ";top"),
        candidate_tagged(&store, ";far"),
        candidate_tagged(&store, ";unmeasured"),
    );
    let roles: Vec<(i64, &str)> = c
        .contenders
        .iter()
        .map(|k| (k.candidate_id, k.role.as_str()))
        .collect();
    // 1.6 * 1.15 < 1.9: `far` cannot overtake; `unmeasured` has no interval to tell.
    assert!(roles.contains(&(top, "winner")), "{roles:?}");
    assert!(roles.contains(&(unmeasured, "runner-up")), "{roles:?}");
    assert!(roles.iter().any(|(_, r)| *r == "seed"), "{roles:?}");
    assert!(!roles.iter().any(|(id, _)| *id == far), "{roles:?}");
    assert_eq!(c.clearly_slower, vec![far]);
    // Three contenders, two rounds: six evaluations in the event, none of `far`.
    let event = &events(&store, "confirmation")[0];
    let measured: Vec<i64> = event["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["candidate"].as_i64().unwrap())
        .collect();
    assert_eq!(measured.len(), 6);
    assert!(!measured.contains(&far));
    assert_eq!(event["confirmation"]["clearly_slower"], json!([far]));
}

/// Only the two next-best kernels are runner-ups: when both are far below the winner, the
/// confirmation is the winner and the seed, and the kernels further down are not listed.
#[test]
fn the_kernels_left_out_are_at_most_the_two_runner_ups() {
    let (_tmp, out, store) = confirmed_run_of(6, |round| match round {
        1 => "score=3.0~0.1;top".to_string(),
        r => format!("score=1.{r}~0.05;slow{r}"),
    });
    let c = out.confirmation.unwrap();
    let roles: Vec<&str> = c.contenders.iter().map(|k| k.role.as_str()).collect();
    assert_eq!(roles.len(), 2, "{roles:?}");
    assert!(
        roles.contains(&"winner") && roles.contains(&"seed"),
        "{roles:?}"
    );
    // The two highest of the slow ones (rounds 6 and 5), not all five.
    assert_eq!(
        c.clearly_slower,
        vec![
            candidate_tagged(&store, ";slow6"),
            candidate_tagged(&store, ";slow5")
        ]
    );
}

#[test]
fn progress_reads_as_one_line() {
    let p = ksearch_search::engine::Progress {
        round: 3,
        rounds: 20,
        cycle: 2,
        node: "n4".into(),
        best_score: Some(1.234),
        passed: 5,
        failed: 1,
        input_tokens: 900,
        output_tokens: 100,
        cost_usd: 0.5,
        message: "evaluating".into(),
    };
    assert_eq!(
        p.summary(),
        "best 1.23x | passed 5 failed 1 | tokens 1000 | $0.50 | cycle 2 on n4: evaluating"
    );
    let none = ksearch_search::engine::Progress {
        best_score: None,
        ..p
    };
    assert!(none.summary().starts_with("best - | "));
}

/// Records what each request carried and when it came, for the best-of-n tests; each answer
/// takes `delay`, as a model's would.
struct SamplingProposer {
    seen: Mutex<Vec<(u32, String, bool, usize)>>,
    asked: Mutex<Vec<(u32, std::time::Instant)>>,
    calls_to_plan: AtomicUsize,
    delay: std::time::Duration,
}

impl SamplingProposer {
    fn new(delay: std::time::Duration) -> Self {
        Self {
            seen: Mutex::new(Vec::new()),
            asked: Mutex::new(Vec::new()),
            calls_to_plan: AtomicUsize::new(0),
            delay,
        }
    }
}

impl Proposer for SamplingProposer {
    fn name(&self) -> &str {
        "sampling"
    }
    fn init_world_model(&self, t: &TaskBrief) -> Result<WorldModel, ProposerError> {
        ScriptedProposer::new(|_, _, _| Ok(String::new())).init_world_model(t)
    }
    fn propose(&self, _: &WorldModel, _: u32, _: &[String]) -> Result<Option<Edit>, ProposerError> {
        self.calls_to_plan.fetch_add(1, Ordering::SeqCst);
        Ok(None)
    }
    fn write_code(&self, req: &CodeRequest<'_>) -> Result<Proposal, ProposerError> {
        self.asked
            .lock()
            .unwrap()
            .push((req.round, std::time::Instant::now()));
        std::thread::sleep(self.delay);
        self.seen.lock().unwrap().push((
            req.round,
            req.action.title.clone(),
            req.base.is_none() && req.last.is_none() && req.cycle_best.is_none(),
            req.history.len(),
        ));
        // Round 3 is the best sample; round 4 fails.
        let source = match req.round {
            3 => "score=5.0".to_string(),
            4 => "fail".to_string(),
            r => format!("score={}", 1.0 + f64::from(r) / 10.0),
        };
        Ok(Proposal {
            source: format!("{source};r{}", req.round),
            knobs: None,
            note: String::new(),
        })
    }
    fn refine(&self, _: &WorldModel, _: &CycleReport<'_>) -> Result<Option<Edit>, ProposerError> {
        self.calls_to_plan.fetch_add(1, Ordering::SeqCst);
        Ok(None)
    }
    fn too_hard(&self, _: &WorldModel, _: &CycleReport<'_>) -> Result<Option<Edit>, ProposerError> {
        self.calls_to_plan.fetch_add(1, Ordering::SeqCst);
        Ok(None)
    }
}

#[test]
fn best_of_n_spends_every_round_on_an_independent_sample_and_keeps_the_best() {
    let dir = tempfile::tempdir().unwrap();
    let proposer = SamplingProposer::new(std::time::Duration::ZERO);
    let eval = FakeEvaluator::new(None);
    let config = EngineConfig {
        strategy: ksearch_search::settings::Strategy::BestOfN,
        ..cfg(6, 4)
    };
    static POLICY: std::sync::LazyLock<KSearchPolicy> =
        std::sync::LazyLock::new(KSearchPolicy::default);
    let engine = Engine::new(
        config,
        store(dir.path()),
        &proposer,
        &eval,
        &*POLICY,
        brief(),
        &NoProgress,
    );
    let out = engine.run(Some("score=1.0;seed")).unwrap();
    assert_eq!(out.rounds_used, 6);
    assert_eq!(out.best.as_ref().map(|b| b.score), Some(5.0));
    assert_eq!(out.best.as_ref().map(|b| b.round), Some(3));
    assert_eq!(
        (out.passed, out.failed),
        (6, 1),
        "the seed and five samples pass, one fails"
    );
    // Six requests, one per round, each from the specification alone: no base, no earlier
    // attempt, no history; nothing planned or refined. (A round's request may come before the
    // round before it is written: they are asked for side by side.)
    let mut seen = proposer.seen.lock().unwrap().clone();
    seen.sort_by_key(|s| s.0);
    assert_eq!(seen.len(), 6);
    for (i, (round, title, alone, history)) in seen.iter().enumerate() {
        assert_eq!(*round, i as u32 + 1);
        assert_eq!(title, "Write a fast, correct kernel for the task");
        assert!(*alone && *history == 0, "round {round} saw earlier work");
    }
    assert_eq!(proposer.calls_to_plan.load(Ordering::SeqCst), 0);
    // The world model is the root alone: every sample is recorded against it.
    let store = engine.into_store();
    let wm = final_wm(&store);
    let root = wm.node(wm.root_id()).unwrap();
    assert_eq!((root.attempts, root.failures), (6, 1));
}

/// Best-of-n with a proposer that takes time: round r + 1 is asked for while round r is
/// evaluated, so each request after the first comes before the previous round's evaluation
/// ends, and every round evaluates the sample written for it.
#[test]
fn best_of_n_asks_for_the_next_round_while_this_one_is_evaluated() {
    let dir = tempfile::tempdir().unwrap();
    let proposer = SamplingProposer::new(std::time::Duration::from_millis(30));
    let eval = FakeEvaluator {
        delay: std::time::Duration::from_millis(200),
        ..FakeEvaluator::new(None)
    };
    let config = EngineConfig {
        strategy: ksearch_search::settings::Strategy::BestOfN,
        ..cfg(4, 0)
    };
    let engine = new_engine(config, store(dir.path()), &proposer, &eval);
    let out = engine.run(Some("score=1.0;seed")).unwrap();
    assert_eq!(out.rounds_used, 4);
    let asked = proposer.asked.lock().unwrap().clone();
    let mut rounds: Vec<u32> = asked.iter().map(|a| a.0).collect();
    rounds.sort();
    assert_eq!(
        rounds,
        [1, 2, 3, 4],
        "one request per round, none past the budget"
    );
    let ended = eval.ended.lock().unwrap().clone();
    let end_of = |round: u32| {
        ended
            .iter()
            .find(|(src, _)| src.ends_with(&format!(";r{round}")))
            .map(|(_, t)| *t)
            .unwrap_or_else(|| panic!("round {round} was not evaluated: {ended:?}"))
    };
    for &(round, at) in asked.iter().filter(|a| a.0 > 1) {
        assert!(
            at < end_of(round - 1),
            "round {round} was asked for after round {} ended",
            round - 1
        );
    }
    // Each round's candidate is recorded once, for its round, in round order.
    let store = engine.into_store();
    let attempts: Vec<(i64, u32)> = store
        .candidates()
        .unwrap()
        .into_iter()
        .filter(|c| c.kind == CandidateKind::Attempt)
        .map(|c| (c.id, c.round))
        .collect();
    assert_eq!(
        attempts.iter().map(|a| a.1).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    assert!(attempts.windows(2).all(|w| w[0].0 < w[1].0));
}

/// Writes evolve children: a child scores its parent's score + 0.1 (its source names the
/// round and sample), every fourth round's children fail; records what each request carried.
struct EvolvingProposer {
    seen: Mutex<Vec<Value>>,
    calls_to_plan: AtomicUsize,
}

impl EvolvingProposer {
    fn new() -> Self {
        Self {
            seen: Mutex::new(Vec::new()),
            calls_to_plan: AtomicUsize::new(0),
        }
    }
}

impl Proposer for EvolvingProposer {
    fn name(&self) -> &str {
        "evolving"
    }
    fn init_world_model(&self, t: &TaskBrief) -> Result<WorldModel, ProposerError> {
        ScriptedProposer::new(|_, _, _| Ok(String::new())).init_world_model(t)
    }
    fn propose(&self, _: &WorldModel, _: u32, _: &[String]) -> Result<Option<Edit>, ProposerError> {
        self.calls_to_plan.fetch_add(1, Ordering::SeqCst);
        Ok(None)
    }
    fn write_code(&self, _: &CodeRequest<'_>) -> Result<Proposal, ProposerError> {
        Err(ProposerError::Unusable(
            "evolve asks for children, not code".into(),
        ))
    }
    fn mutate(&self, req: &MutationRequest<'_>) -> Result<Proposal, ProposerError> {
        let parent: f64 = req.parent.source.split(';').next().unwrap()["score=".len()..]
            .parse()
            .unwrap();
        // Programs by their tags: candidate ids depend on which sample thread records first.
        let tag = |source: &str| source.trim_end().rsplit(';').next().unwrap().to_string();
        self.seen.lock().unwrap().push(json!({
            "round": req.round, "sample": req.sample, "island": req.island,
            "mutation": req.mutation, "parent": tag(&req.parent.source),
            "parent_passed": req.parent.outcome.passed,
            "mate": req.mate.map(|m| tag(&m.source)),
            "inspirations": req.inspirations.iter().map(|i| tag(&i.view.source)).collect::<Vec<_>>(),
        }));
        let head = if req.round.is_multiple_of(4) {
            "fail".to_string()
        } else {
            format!("score={:.1}", parent + 0.1)
        };
        Ok(Proposal {
            source: format!("{head};r{}s{}", req.round, req.sample),
            knobs: None,
            note: format!("{} of {}", req.mutation.as_str(), req.parent.candidate_id),
        })
    }
    fn refine(&self, _: &WorldModel, _: &CycleReport<'_>) -> Result<Option<Edit>, ProposerError> {
        self.calls_to_plan.fetch_add(1, Ordering::SeqCst);
        Ok(None)
    }
    fn too_hard(&self, _: &WorldModel, _: &CycleReport<'_>) -> Result<Option<Edit>, ProposerError> {
        self.calls_to_plan.fetch_add(1, Ordering::SeqCst);
        Ok(None)
    }
}

fn evolve_cfg() -> EngineConfig {
    EngineConfig {
        strategy: ksearch_search::settings::Strategy::Evolve,
        samples: 2,
        seed: 7,
        evolve: EvolveSettings {
            islands: 2,
            migration_interval: 2,
            crossover_ratio: 0.3,
            ..EvolveSettings::default()
        },
        ..cfg(8, 4)
    }
}

/// What an evolve run did: its outcome, every candidate's source and parent in order, its
/// store and the requests its proposers saw (a crashed first session's too).
struct EvolveRun {
    out: RunOutcome,
    cands: Vec<(String, Option<i64>)>,
    store: RunStore,
    seen: Vec<Value>,
    _dir: tempfile::TempDir,
}

/// An evolve run of [`evolve_cfg`]; with `crash_on`, a first session's evaluator breaks on
/// that call and a second session resumes the run.
fn evolve_run(crash_on: Option<usize>) -> EvolveRun {
    let guard = tempfile::tempdir().unwrap();
    let tmp = guard.path().to_path_buf();
    let mut seen = Vec::new();
    if crash_on.is_some() {
        let proposer = EvolvingProposer::new();
        let broken = FakeEvaluator::new(crash_on);
        let engine = new_evolve_engine(store(&tmp), &proposer, &broken);
        let err = engine.run(Some("score=1.0;seed")).unwrap_err();
        assert!(matches!(err, EngineError::Evaluator(_)), "{err}");
        seen.extend(proposer.seen.lock().unwrap().clone());
    }
    let store = match crash_on {
        Some(_) => {
            let dir = std::fs::read_dir(&tmp)
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path();
            RunStore::open(&dir).unwrap()
        }
        None => store(&tmp),
    };
    let proposer = EvolvingProposer::new();
    let eval = FakeEvaluator::new(None);
    let engine = new_evolve_engine(store, &proposer, &eval);
    let out = engine.run(Some("score=1.0;seed")).unwrap();
    assert_eq!(
        proposer.calls_to_plan.load(Ordering::SeqCst),
        0,
        "nothing planned"
    );
    seen.extend(proposer.seen.lock().unwrap().clone());
    let store = engine.into_store();
    let cands: Vec<(String, Option<i64>)> = store
        .candidates()
        .unwrap()
        .iter()
        .map(|c| (store.source(&c.source_id).unwrap(), c.parent_candidate))
        .collect();
    EvolveRun {
        out,
        cands,
        store,
        seen,
        _dir: guard,
    }
}

fn new_evolve_engine<'a>(
    store: RunStore,
    proposer: &'a EvolvingProposer,
    eval: &'a FakeEvaluator,
) -> Engine<'a> {
    static POLICY: std::sync::LazyLock<KSearchPolicy> =
        std::sync::LazyLock::new(KSearchPolicy::default);
    Engine::new(
        evolve_cfg(),
        store,
        proposer,
        eval,
        &*POLICY,
        brief(),
        &NoProgress,
    )
}

#[test]
fn evolve_writes_children_of_passing_parents_and_islands_take_turns() {
    let EvolveRun {
        out,
        cands,
        store,
        seen,
        _dir,
    } = evolve_run(None);
    assert_eq!(out.rounds_used, 8);
    assert_eq!(seen.len(), 16, "two children a round");
    // Children of rounds 4 and 8 fail; everything else passes.
    assert_eq!((out.passed, out.failed), (13, 4));
    for s in &seen {
        assert_eq!(
            s["island"], s["sample"],
            "two islands, two samples: sample k on island k"
        );
        assert_eq!(s["parent_passed"], true, "{s}");
        assert!(
            !s["inspirations"].as_array().unwrap().contains(&s["parent"]),
            "{s}"
        );
        if s["mutation"] == "crossover" {
            assert!(s["mate"].is_string() && s["mate"] != s["parent"], "{s}");
        }
    }
    assert!(seen.iter().any(|s| s["mutation"] == "crossover"));
    assert!(seen.iter().any(|s| s["mutation"] != "crossover"));
    // Each child is stored with the parent it was written from.
    for s in &seen {
        let tag = format!("r{}s{}", s["round"], s["sample"]);
        let (_, parent) = cands
            .iter()
            .find(|(source, _)| source.trim_end().ends_with(&tag))
            .unwrap();
        let parent = store.candidate(parent.unwrap()).unwrap().unwrap();
        let parent_source = store.source(&parent.source_id).unwrap();
        assert!(
            parent_source
                .trim_end()
                .ends_with(s["parent"].as_str().unwrap()),
            "{tag}: {s}"
        );
    }
    // The best is the highest passing child; children build on children.
    let best = cands
        .iter()
        .filter_map(|(s, _)| s.strip_prefix("score=").and_then(|r| r.split(';').next()))
        .map(|v| v.parse::<f64>().unwrap())
        .fold(0.0, f64::max);
    assert_eq!(out.best.as_ref().map(|b| b.score), Some(best));
    assert!(
        best >= 1.25,
        "a lineage of at least three generations: {best}"
    );
    // A generation event per round, with the islands migrating every two children each.
    let generations = events(&store, "generation");
    assert_eq!(generations.len(), 8);
    let migrated: usize = generations
        .iter()
        .map(|g| g["migrated"].as_array().unwrap().len())
        .sum();
    assert!(migrated > 0, "{generations:?}");
}

#[test]
fn a_resumed_evolve_run_asks_for_the_same_children_as_an_uninterrupted_one() {
    let whole = evolve_run(None);
    // The evaluator breaks on its 8th call: the seed and three rounds of two are done.
    let resumed = evolve_run(Some(8));
    let (whole_cands, whole_seen) = (&whole.cands, &whole.seen);
    let (resumed_cands, resumed_seen, store) = (&resumed.cands, &resumed.seen, &resumed.store);
    // The samples of a round are recorded in the order their threads get there.
    let sources = |c: &[(String, Option<i64>)]| {
        let mut v: Vec<String> = c.iter().map(|(s, _)| s.clone()).collect();
        v.sort_by_key(|s| s.rsplit(';').next().map(str::to_string));
        v
    };
    assert_eq!(sources(resumed_cands), sources(whole_cands));
    assert_eq!(
        resumed.out.best.as_ref().map(|b| b.score),
        whole.out.best.as_ref().map(|b| b.score)
    );
    // Requests asked again after the crash are the ones asked before it.
    let mut asked: Vec<&Value> = resumed_seen.iter().collect();
    asked.sort_by_key(|s| (s["round"].as_u64(), s["sample"].as_u64()));
    asked.dedup();
    let mut whole_asked: Vec<&Value> = whole_seen.iter().collect();
    whole_asked.sort_by_key(|s| (s["round"].as_u64(), s["sample"].as_u64()));
    assert_eq!(asked, whole_asked);
    // Nothing evaluated twice.
    let evals = store.evaluations().unwrap();
    let mut ids: Vec<i64> = evals.iter().map(|e| e.candidate_id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), evals.len());
}

#[test]
fn a_run_stops_once_its_best_kernel_reaches_the_speed_of_light_goal() {
    let tmp = tempfile::tempdir().unwrap();
    // Each round faster and nearer its roofline: 50%, 70%, then 95% of the speed of light.
    let proposer = ScriptedProposer::new(|_, round, _| {
        let sol = [0.5, 0.7, 0.95, 0.96, 0.97][(round as usize - 1).min(4)];
        Ok(format!(
            "score={};sol={sol};r{round}",
            1.0 + f64::from(round)
        ))
    });
    let eval = FakeEvaluator::new(None);
    let config = EngineConfig {
        stop_at_sol: Some(0.9),
        ..cfg(10, 0)
    };
    let engine = new_engine(config, store(tmp.path()), &proposer, &eval);
    let out = engine.run(Some("score=1;sol=0.1;seed")).unwrap();
    assert_eq!(out.rounds_used, 3, "{}", out.stop_reason);
    assert_eq!(
        out.stop_reason,
        "the best kernel reached 95% of the speed of light on every workload (--stop-at-sol 0.9)"
    );
    // The world model's signals carry the last round's share of the speed of light.
    let store = engine.into_store();
    let trace = final_wm(&store).computed_signals().trace.clone().unwrap();
    assert_eq!(trace.speed_of_light, Some(0.95));
    // Not a budget: raising the rounds does not continue it.
    let dir = store.dir().to_path_buf();
    let proposer = ScriptedProposer::new(|_, _, _| Ok("score=9".into()));
    let engine = new_engine(
        EngineConfig {
            stop_at_sol: Some(0.9),
            ..cfg(20, 0)
        },
        RunStore::open(&dir).unwrap(),
        &proposer,
        &eval,
    );
    let err = engine.run(None).unwrap_err();
    assert!(matches!(err, EngineError::Finished { .. }), "{err}");
    assert!(
        !err.to_string().contains("raise its budget"),
        "a goal met is final, not a budget to raise: {err}"
    );
}

/// Writes `score=N;...` sources from the step alone: an improve step one point above the
/// cycle's best (read from its source), so the next round's candidate is known as soon as this
/// one is written, whichever way its evaluation goes.
struct AheadProposer {
    ahead: bool,
}

impl Proposer for AheadProposer {
    fn name(&self) -> &str {
        "ahead"
    }
    fn init_world_model(&self, t: &TaskBrief) -> Result<WorldModel, ProposerError> {
        ScriptedProposer::new(|_, _, _| Ok(String::new())).init_world_model(t)
    }
    fn propose(&self, _: &WorldModel, _: u32, _: &[String]) -> Result<Option<Edit>, ProposerError> {
        Ok(None)
    }
    fn writes_ahead(&self) -> bool {
        self.ahead
    }
    fn write_code(&self, req: &CodeRequest<'_>) -> Result<Proposal, ProposerError> {
        let best = req.cycle_best.map(|b| {
            let score: f64 = b.source["score=".len()..]
                .split(';')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            (score, b.candidate_id)
        });
        let source = match (req.step, best) {
            (ksearch_search::proposer::Step::Improve, Some((s, _))) => {
                format!("score={};improves;r{}", s + 1.0, req.round)
            }
            (step, _) => format!("score=2;{step:?};r{}", req.round),
        };
        Ok(Proposal {
            source,
            knobs: None,
            note: String::new(),
        })
    }
    fn refine(&self, _: &WorldModel, _: &CycleReport<'_>) -> Result<Option<Edit>, ProposerError> {
        Ok(None)
    }
    fn too_hard(&self, _: &WorldModel, _: &CycleReport<'_>) -> Result<Option<Edit>, ProposerError> {
        Ok(None)
    }
}

/// A FakeEvaluator that logs prebuilds and evaluations in the order they happen (and in
/// `ended`, the log's length as each evaluation ends); it can prebuild when `prebuilds` says so.
struct LoggingEvaluator {
    inner: FakeEvaluator,
    prebuilds: bool,
    log: Mutex<Vec<(bool, String)>>,
    ended: Mutex<Vec<usize>>,
}

impl LoggingEvaluator {
    fn new(inner: FakeEvaluator, prebuilds: bool) -> Self {
        LoggingEvaluator {
            inner,
            prebuilds,
            log: Mutex::new(Vec::new()),
            ended: Mutex::new(Vec::new()),
        }
    }
}

impl CandidateEvaluator for LoggingEvaluator {
    fn evaluate(&self, source: &str, purpose: Purpose) -> Result<Evaluation, EvalFailure> {
        self.log.lock().unwrap().push((false, source.to_string()));
        let out = self.inner.evaluate(source, purpose);
        let at = self.log.lock().unwrap().len();
        self.ended.lock().unwrap().push(at);
        out
    }
    fn prebuilds(&self) -> bool {
        self.prebuilds
    }
    fn prebuild(&self, source: &str) -> bool {
        self.log.lock().unwrap().push((true, source.to_string()));
        true
    }
    fn summarize(&self, result: &Value) -> OutcomeSummary {
        self.inner.summarize(result)
    }
}

#[test]
fn a_proposer_that_writes_ahead_has_the_next_two_rounds_candidates_built_before_they_are_evaluated()
{
    // A proposer that writes ahead, one that does not, and an evaluator that cannot prebuild
    // (a cpu backend's): only the first pair builds ahead.
    for (ahead, prebuilds) in [(true, true), (false, true), (true, false)] {
        let tmp = tempfile::tempdir().unwrap();
        let proposer = AheadProposer { ahead };
        let eval = LoggingEvaluator::new(
            FakeEvaluator {
                delay: std::time::Duration::from_millis(20),
                ..FakeEvaluator::new(None)
            },
            prebuilds,
        );
        let engine = new_engine(cfg(4, 4), store(tmp.path()), &proposer, &eval);
        engine.run(Some("score=1;seed")).unwrap();
        let log = eval.log.into_inner().unwrap();
        let evaluated: Vec<&String> = log.iter().filter(|(b, _)| !b).map(|(_, s)| s).collect();
        // The seed, then one cycle of four attempts that each improve on the last; the first
        // is written ahead while the seed is evaluated, each later one while the one before is.
        assert_eq!(evaluated.len(), 5, "{log:?}");
        for (k, source) in evaluated.iter().enumerate().skip(1) {
            let built_before = log
                .iter()
                .take_while(|(b, s)| *b || s != *source)
                .any(|(b, s)| *b && s == *source);
            assert_eq!(
                built_before,
                ahead && prebuilds,
                "evaluation {k}: {source}; {log:?}"
            );
        }
        // Two rounds ahead: the third and fourth attempts were first guessed when the attempt
        // two before them was written, so their builds began before the attempt just before
        // them was evaluated (a whole evaluation apart; one round ahead, they would race it).
        let at = |source: &str| log.iter().position(|(b, s)| !b && s == source).unwrap();
        for k in 3..evaluated.len() {
            let built = log.iter().position(|(b, s)| *b && s == evaluated[k]);
            assert_eq!(
                built.is_some_and(|i| i < at(evaluated[k - 1])),
                ahead && prebuilds,
                "evaluation {k}: {log:?}"
            );
        }
        // One build during the seed; for each attempt, up to two for the next round and four
        // for the one after, within the cycle (a capped cycle's last attempt has no round to
        // build for): more than one round ahead could start (1 + 2 * 3).
        let last = log.iter().rposition(|(b, _)| !b).unwrap();
        let builds = log[..last].iter().filter(|(b, _)| *b).count();
        if ahead && prebuilds {
            assert!((8..=1 + 6 + 6 + 2).contains(&builds), "{log:?}");
        }
    }
}

/// A [`FakeEvaluator`] that profiles: every passing evaluation above the best it was offered
/// gets a `profile` section naming its score, which its summary reads as the bottleneck.
struct ProfilingEvaluator {
    inner: FakeEvaluator,
    best: Mutex<Option<f64>>,
    /// The sources profiled, in order.
    profiled: Mutex<Vec<String>>,
}

impl CandidateEvaluator for ProfilingEvaluator {
    fn evaluate(&self, source: &str, purpose: Purpose) -> Result<Evaluation, EvalFailure> {
        self.inner.evaluate(source, purpose)
    }

    fn profile_new_best(&self, source: &str, evaluation: &Evaluation) -> Option<Evaluation> {
        let score = evaluation
            .summary
            .score
            .filter(|_| evaluation.summary.passed)?;
        let mut best = self.best.lock().unwrap();
        if best.is_some_and(|b| score <= b) {
            return None;
        }
        *best = Some(score);
        self.profiled.lock().unwrap().push(source.to_string());
        let mut result = evaluation.result.clone();
        result["profile"] = json!({"bound": format!("profiled at {score}")});
        Some(Evaluation {
            summary: self.summarize(&result),
            result,
        })
    }

    fn summarize(&self, result: &Value) -> OutcomeSummary {
        OutcomeSummary {
            bottleneck: result["profile"]["bound"].as_str().map(String::from),
            ..self.inner.summarize(result)
        }
    }
}

/// What a two-cycle run profiled (the scores' sources), what its refines saw as the cycle
/// bests' bottlenecks, and its store.
fn profiled_run(
    reads: BottleneckReads,
    rounds: u32,
    tmp: &std::path::Path,
) -> (Vec<String>, Vec<Option<String>>, RunStore) {
    // Every attempt beats the last; cycles of three attempts.
    let proposer = ScriptedProposer::new(|_, round, _| Ok(format!("score={}", 1 + round)))
        .reading_bottlenecks(reads);
    let eval = ProfilingEvaluator {
        inner: FakeEvaluator::new(None),
        best: Mutex::new(None),
        profiled: Mutex::new(Vec::new()),
    };
    let engine = new_engine(cfg(rounds, 3), store(tmp), &proposer, &eval);
    engine.run(Some("score=1;seed")).unwrap();
    let store = engine.into_store();
    let profiled = eval.profiled.into_inner().unwrap();
    let heads = profiled
        .iter()
        .map(|s| s.split(';').next().unwrap().to_string())
        .collect();
    (
        heads,
        proposer.refined_bottlenecks.into_inner().unwrap(),
        store,
    )
}

#[test]
fn a_proposer_that_reads_bottlenecks_at_cycle_end_gets_only_cycle_bests_profiled() {
    let tmp = tempfile::tempdir().unwrap();
    let (profiled, refined, store) = profiled_run(BottleneckReads::AtCycleEnd, 7, tmp.path());
    // Not the seed, nor the attempts their own cycle beat: each cycle's best, at its end; the
    // third cycle, cut short by the round budget, unprofiled.
    assert_eq!(profiled, ["score=4", "score=7"]);
    assert_eq!(
        refined,
        [
            Some("profiled at 4".to_string()),
            Some("profiled at 7".to_string()),
            None
        ]
    );
    // The profile is added to the stored evaluation, which stays one evaluation.
    let rows = store.evaluations().unwrap();
    let with_profile: Vec<f64> = rows
        .iter()
        .filter(|e| !e.result["profile"].is_null())
        .filter_map(|e| e.score)
        .collect();
    assert_eq!(with_profile, [4.0, 7.0]);
    let evaluated: std::collections::BTreeSet<i64> = rows.iter().map(|e| e.candidate_id).collect();
    assert_eq!(evaluated.len(), rows.len(), "no evaluation recorded twice");

    // A cycle that the round budget cuts short, or that ends as it runs out, is closed
    // unprofiled: no round reads it.
    for rounds in [5, 6] {
        let tmp = tempfile::tempdir().unwrap();
        let (profiled, refined, _) = profiled_run(BottleneckReads::AtCycleEnd, rounds, tmp.path());
        assert_eq!(profiled, ["score=4"], "{rounds} rounds");
        assert_eq!(refined, [Some("profiled at 4".to_string()), None]);
    }
}

#[test]
fn a_proposer_that_reads_every_attempt_gets_each_new_best_profiled_when_evaluated() {
    let tmp = tempfile::tempdir().unwrap();
    let (profiled, refined, _) = profiled_run(BottleneckReads::EveryAttempt, 7, tmp.path());
    assert_eq!(
        profiled,
        ["score=1", "score=2", "score=3", "score=4", "score=5", "score=6", "score=7", "score=8"]
    );
    assert_eq!(
        refined,
        [
            Some("profiled at 4".to_string()),
            Some("profiled at 7".to_string()),
            Some("profiled at 8".to_string())
        ]
    );
}

/// Writes ahead and reads bottlenecks only at a cycle's end; every refine adds two follow-ups
/// under the refined node (`x<round>` rated above `y<round>`), and each attempt's source names
/// its node, its base and its round, with a score one above the round's (with
/// `flat_after_first`, 0.5 for every attempt after a cycle's first: none improves).
struct FollowUpProposer {
    ahead: bool,
    flat_after_first: bool,
}

impl Proposer for FollowUpProposer {
    fn name(&self) -> &str {
        "follow-ups"
    }
    fn init_world_model(&self, t: &TaskBrief) -> Result<WorldModel, ProposerError> {
        ScriptedProposer::new(|_, _, _| Ok(String::new())).init_world_model(t)
    }
    fn propose(&self, _: &WorldModel, _: u32, _: &[String]) -> Result<Option<Edit>, ProposerError> {
        Ok(None)
    }
    fn writes_ahead(&self) -> bool {
        self.ahead
    }
    fn reads_bottlenecks(&self) -> BottleneckReads {
        BottleneckReads::AtCycleEnd
    }
    fn write_code(&self, req: &CodeRequest<'_>) -> Result<Proposal, ProposerError> {
        let label = req.node.label.clone().unwrap_or_default();
        let base = req.base.map(|b| b.candidate_id).unwrap_or(0);
        let score = match self.flat_after_first && req.attempt > 1 {
            true => 0.5,
            false => f64::from(1 + req.round),
        };
        Ok(Proposal {
            source: format!("score={score};{label};base{base};r{}", req.round),
            knobs: None,
            note: String::new(),
        })
    }
    fn refine(&self, _: &WorldModel, r: &CycleReport<'_>) -> Result<Option<Edit>, ProposerError> {
        let insert = |label: String, score: f64| ksearch_search::world_model::PatchOp::Insert {
            parent_id: r.node_id.clone(),
            parent_solution_id: None,
            node: action(&label, score),
        };
        Ok(Some(Edit {
            ops: vec![
                insert(format!("x{}", r.round), 0.95),
                insert(format!("y{}", r.round), 0.5),
            ],
            active_leaf_id: None,
        }))
    }
    fn too_hard(&self, _: &WorldModel, _: &CycleReport<'_>) -> Result<Option<Edit>, ProposerError> {
        Ok(None)
    }
}

/// A [`LoggingEvaluator`] that also profiles every new best, logging it as `profile:<source>`.
struct ProfilingLogger(LoggingEvaluator, Mutex<f64>);

impl CandidateEvaluator for ProfilingLogger {
    fn evaluate(&self, source: &str, purpose: Purpose) -> Result<Evaluation, EvalFailure> {
        self.0.evaluate(source, purpose)
    }
    fn prebuilds(&self) -> bool {
        self.0.prebuilds()
    }
    fn prebuild(&self, source: &str) -> bool {
        self.0.prebuild(source)
    }
    fn profile_new_best(&self, source: &str, evaluation: &Evaluation) -> Option<Evaluation> {
        let score = evaluation.summary.score?;
        let mut best = self.1.lock().unwrap();
        if score <= *best {
            return None;
        }
        *best = score;
        let log = &self.0.log;
        log.lock()
            .unwrap()
            .push((false, format!("profile:{source}")));
        Some(evaluation.clone())
    }
    fn summarize(&self, result: &Value) -> OutcomeSummary {
        self.0.summarize(result)
    }
}

#[test]
fn a_cycles_first_candidate_is_built_while_the_seed_is_evaluated_or_the_cycle_before_profiled() {
    for ahead in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let proposer = FollowUpProposer {
            ahead,
            flat_after_first: false,
        };
        let eval = ProfilingLogger(
            LoggingEvaluator::new(FakeEvaluator::new(None), true),
            Mutex::new(f64::MIN),
        );
        // Cycles of two attempts: every one improves, so every cycle's best is profiled.
        let engine = new_engine(cfg(6, 2), store(tmp.path()), &proposer, &eval);
        engine.run(Some("score=1;seed")).unwrap();
        let log = eval.0.log.into_inner().unwrap();
        let profiles: Vec<usize> = (0..log.len())
            .filter(|&i| log[i].1.starts_with("profile:"))
            .collect();
        // The first cycle's first candidate was built before the seed was evaluated.
        let seed = log
            .iter()
            .position(|(b, s)| !b && s.contains("seed"))
            .unwrap();
        let (_, first) = log[seed + 1..].iter().find(|(b, _)| !b).unwrap();
        let built_before = log[..seed].iter().any(|(b, s)| *b && s == first);
        assert_eq!(built_before, ahead, "{first}; {log:?}");
        // The ends of cycles 1 and 2, which the run continues after (the third ends it).
        assert_eq!(profiles.len(), 2, "{log:?}");
        for &p in &profiles {
            // The next cycle's first candidate: the first evaluation after the profile, an
            // action on a follow-up the cycle's end added.
            let (_, first) = log[p..]
                .iter()
                .find(|(b, s)| !b && !s.starts_with("profile:"))
                .unwrap();
            assert!(first.contains(";x"), "{first}; {log:?}");
            let built_before = log[..p].iter().any(|(b, s)| *b && s == first);
            assert_eq!(built_before, ahead, "{first}; {log:?}");
        }
    }
}

#[test]
fn a_cycles_first_candidate_compiles_while_the_attempt_that_ends_the_cycle_before_is_evaluated() {
    // Cycles of two attempts whose second never improves: each cycle ends with its first
    // attempt as its best whatever the second scores, so the next cycle's first candidate is
    // known when the second is written, a whole evaluation before the cycle's end.
    let tmp = tempfile::tempdir().unwrap();
    let proposer = FollowUpProposer {
        ahead: true,
        flat_after_first: true,
    };
    let eval = ProfilingLogger(
        LoggingEvaluator::new(
            FakeEvaluator {
                delay: std::time::Duration::from_millis(20),
                ..FakeEvaluator::new(None)
            },
            true,
        ),
        Mutex::new(f64::MIN),
    );
    let engine = new_engine(cfg(6, 2), store(tmp.path()), &proposer, &eval);
    engine.run(Some("score=1;seed")).unwrap();
    let log = eval.0.log.into_inner().unwrap();
    let ended = eval.0.ended.into_inner().unwrap();
    let evaluations: Vec<usize> = (0..log.len())
        .filter(|&i| !log[i].0 && !log[i].1.starts_with("profile:"))
        .collect();
    let end_of = |i: usize| *ended.iter().find(|&&e| e > i).unwrap();
    // The seed, then three cycles of two; cycles 2 and 3 start on a follow-up.
    assert_eq!(evaluations.len(), 7, "{log:?}");
    for cycle in [2, 3] {
        let last_of_before = evaluations[2 * (cycle - 1)];
        let first = &log[evaluations[2 * cycle - 1]].1;
        assert!(first.contains(";x"), "{first}; {log:?}");
        let built = log.iter().position(|(b, s)| *b && s == first);
        assert!(
            built.is_some_and(|i| i < end_of(last_of_before)),
            "cycle {cycle}'s first candidate {first} was not built while {} was evaluated: {log:?}",
            log[last_of_before].1
        );
    }
}
