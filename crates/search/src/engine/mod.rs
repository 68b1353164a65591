//! The K-Search cycle engine.
//!
//! A run is a sequence of **cycles**. Each cycle picks one open action from the world model's
//! frontier (a [`SelectionPolicy`]), spends **rounds** on it — attempt 1 applies the action to
//! the parent's solution, later attempts debug (nothing passed yet) or improve (something did) —
//! and ends when both stagnation streaks of the original reach the window, or at the per-cycle
//! attempt cap. The cycle's best passing kernel is then attached to the node and the proposer
//! refines the tree; a cycle without a pass marks the node too hard.
//!
//! Crash safety: every candidate is in the run store before it is evaluated, every evaluation
//! is committed as soon as it completes, and the engine's whole state (world model included) is
//! checkpointed in one transaction after each round and each cycle transition. Resuming replays
//! the current round from the store: evaluated samples are reused, unevaluated candidates are
//! evaluated, missing samples are proposed again. No completed evaluation is ever redone.
//!
//! Fixes of the original's plain bugs (always on): an explicit too-hard state; the seed counts
//! as a result; a proposer failure is a failed attempt, not an aborted run; edits are validated
//! atomically and solution ids cannot be overwritten. Behaviour changes that alter results are
//! flags: `cycle_cap` (0 = unlimited, as the original) and the selection policy.

pub mod evaluation;
mod generation;
pub mod ranking;

pub use evaluation::{CandidateEvaluator, EvalFailure, Evaluation, Purpose};
use ranking::Ranked;
pub use ranking::{Confirmation, Confirmed};

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use ksearch_eval::Interrupt;
use ksearch_store::{CandidateKind, CandidateRow, NewCandidate, RunStore, SourceId, StoreError};

use crate::evolve::{EvolveSettings, Population};
use crate::proposer::{
    AttemptView, BottleneckReads, CodeRequest, CycleAttempt, CycleReport, OutcomeSummary, Proposal,
    Proposer, ProposerError, Step, TaskBrief,
};
use crate::selection::SelectionPolicy;
use crate::world_model::{
    Action, ActionPatch, Edit, NodeId, NodePatch, SolutionRef, Trace, WorldModel, WorldModelError,
};

/// How the search is organised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// K-Search: a world model of rated optimisation ideas steers each cycle.
    #[default]
    WorldModel,
    /// Independent candidates from the task's specification alone, the best kept: the
    /// ablation without search (no world model, no earlier attempts in any request).
    BestOfN,
    /// Population-based evolution in the manner of OpenEvolve and ShinkaEvolve: islands of
    /// MAP-Elites grids, each child a diff, rewrite or crossover of a sampled parent
    /// ([`crate::evolve`]).
    Evolve,
}

/// Limits and switches of one run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EngineConfig {
    /// Code-generation rounds (the original's budget B). One round = `samples` candidates.
    pub rounds: u32,
    /// Candidates drawn per attempt, written and evaluated concurrently.
    pub samples: u32,
    /// The original's stagnation window W (both streaks).
    pub stagnation_window: u32,
    /// Attempts per cycle at most; 0 = unlimited, as in the original.
    pub cycle_cap: u32,
    #[serde(default)]
    pub max_wall_seconds: Option<u64>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
    /// Re-check the winner in a fresh process with fresh seeds on every workload (held-out
    /// included) before reporting it.
    pub recheck: bool,
    /// Rounds of the final confirmation (the winner, the runner-ups and the seed evaluated in
    /// turn; engine/ranking.rs); 0 skips it.
    #[serde(default = "default_confirm_rounds")]
    pub confirm_rounds: u32,
    /// Failed proposer calls in a row ([`ProposerError::CallFailed`]: unreachable, refused,
    /// timed out) that stop the run with [`EngineError::ProposerGaveUp`], unfinished and
    /// resumable; 0 never stops. A reply, usable or not, resets the count.
    #[serde(default = "default_max_proposer_failures")]
    pub max_proposer_failures: u32,
    /// How rounds are spent: cycles on the world model's actions, independent samples, or
    /// generations of a population.
    #[serde(default)]
    pub strategy: Strategy,
    /// The population's settings under [`Strategy::Evolve`].
    #[serde(default)]
    pub evolve: EvolveSettings,
    /// The run's seed: the evolve strategy's draws come from it.
    #[serde(default)]
    pub seed: u64,
    /// Stop once the best kernel reaches this fraction of the speed of light on every timed
    /// workload (`OutcomeSummary::speed_of_light`).
    #[serde(default)]
    pub stop_at_sol: Option<f64>,
}

fn default_confirm_rounds() -> u32 {
    DEFAULT_CONFIRM_ROUNDS
}

fn default_max_proposer_failures() -> u32 {
    DEFAULT_MAX_PROPOSER_FAILURES
}

/// Failed proposer calls in a row that stop a run unless configured.
pub const DEFAULT_MAX_PROPOSER_FAILURES: u32 = 3;

/// Rounds of the final confirmation unless configured.
pub const DEFAULT_CONFIRM_ROUNDS: u32 = 2;

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            rounds: 20,
            samples: 1,
            stagnation_window: 5,
            cycle_cap: 6,
            max_wall_seconds: None,
            max_tokens: None,
            max_cost_usd: None,
            recheck: true,
            confirm_rounds: DEFAULT_CONFIRM_ROUNDS,
            max_proposer_failures: DEFAULT_MAX_PROPOSER_FAILURES,
            strategy: Strategy::WorldModel,
            evolve: EvolveSettings::default(),
            seed: 0,
            stop_at_sol: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("world model: {0}")]
    WorldModel(#[from] WorldModelError),
    #[error("proposer: {0}")]
    Proposer(String),
    #[error("evaluator: {0}")]
    Evaluator(String),
    #[error("the run's saved engine state is unreadable: {0}")]
    State(String),
    #[error("the run's settings: {0}")]
    Config(String),
    /// The run ended: by a budget that resuming did not raise (the message says how to), or
    /// for good (no idea left, its speed-of-light goal met).
    #[error("the run is finished ({reason}){hint}")]
    Finished { reason: String, hint: &'static str },
    #[error("the proposer's calls failed {failures} times in a row (the last: {last})")]
    ProposerGaveUp { failures: u32, last: String },
    /// Stopped on request ([`Engine::with_interrupt`]): the evaluation in flight was abandoned
    /// (nothing recorded for it); the run is unfinished and resumable.
    #[error("interrupted")]
    Interrupted,
}

/// What the progress display is told after each round.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Progress {
    pub round: u32,
    pub rounds: u32,
    pub cycle: u32,
    pub node: String,
    pub best_score: Option<f64>,
    pub passed: u32,
    pub failed: u32,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
    pub message: String,
}

impl Progress {
    /// The progress as one line: best score, passed and failed, tokens, cost and what the
    /// cycle is doing (the progress display's message).
    pub fn summary(&self) -> String {
        let best = self
            .best_score
            .map(|s| format!("{s:.2}x"))
            .unwrap_or_else(|| "-".into());
        format!(
            "best {best} | passed {} failed {} | tokens {} | ${:.2} | cycle {} on {}: {}",
            self.passed,
            self.failed,
            self.input_tokens + self.output_tokens,
            self.cost_usd,
            self.cycle,
            self.node,
            self.message
        )
    }
}

pub trait ProgressSink: Sync {
    fn update(&self, p: &Progress);
}

/// A sink that shows nothing (tests, `--quiet`).
pub struct NoProgress;
impl ProgressSink for NoProgress {
    fn update(&self, _: &Progress) {}
}

/// How a run ended.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunOutcome {
    pub stop_reason: String,
    pub rounds_used: u32,
    pub cycles: u32,
    pub passed: u32,
    pub failed: u32,
    pub seed_score: Option<f64>,
    pub best: Option<BestRef>,
    /// The fresh-process, fresh-seed re-check of the winner (all workloads).
    pub recheck: Option<Value>,
    /// The seed kernel re-measured under the same conditions as the winner's re-check, so the
    /// two can be compared directly.
    #[serde(default)]
    pub seed_recheck_score: Option<f64>,
    /// The winner, the runner-ups and the seed re-measured in turn: the run's headline.
    #[serde(default)]
    pub confirmation: Option<Confirmation>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BestRef {
    pub candidate_id: i64,
    /// The score measured during the search (on the shown workloads).
    pub score: f64,
    pub node: Option<String>,
    pub round: u32,
    /// The score of the final re-check (every workload, fresh process and seed): the number to
    /// trust, since the search's maximum over noisy measurements is biased upwards.
    #[serde(default)]
    pub rechecked_score: Option<f64>,
    /// The interval of `score` (pooled over `scores` after a re-measure).
    #[serde(default)]
    pub interval: Option<[f64; 2]>,
    /// Every search-time score of this kernel; `score` is their geometric mean.
    #[serde(default)]
    pub scores: Vec<f64>,
}

impl BestRef {
    /// A candidate of `round` that passed with `score` (and its interval) in a search
    /// evaluation, on `node`: not re-measured or re-checked yet.
    fn measured(
        candidate_id: i64,
        score: f64,
        node: &NodeId,
        round: u32,
        interval: Option<[f64; 2]>,
    ) -> Self {
        BestRef {
            candidate_id,
            score,
            node: Some(node.to_string()),
            round,
            rechecked_score: None,
            interval,
            scores: vec![score],
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct CycleState {
    node: NodeId,
    index: u32,
    consumed: u32,
    no_improve: u32,
    no_improve_over_base: u32,
    base: Option<i64>,
    best: Option<(i64, f64)>,
    last: Option<i64>,
    /// Every attempt of the cycle in order (cycles checkpointed before this was kept have
    /// none).
    #[serde(default)]
    history: Vec<HistoryEntry>,
}

/// One attempt of a cycle: its candidate, or why the proposer gave none.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct HistoryEntry {
    attempt: u32,
    sample: u32,
    candidate: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Longest proposer error kept in a cycle's history (the end is kept).
const HISTORY_ERROR_CHARS: usize = 400;

/// Everything needed to continue a run; checkpointed as one JSON value.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct EngineState {
    wm: WorldModel,
    rounds_used: u32,
    cycles: u32,
    cycle: Option<CycleState>,
    best: Option<BestRef>,
    seed_candidate: Option<i64>,
    seed_score: Option<f64>,
    passed: u32,
    failed: u32,
    elapsed_ms: u64,
    /// The evolve strategy's population (created at its first round).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    population: Option<Population>,
}

const STATE_KEY: &str = "engine";

/// Where a candidate of a round is recorded.
#[derive(Clone, Copy)]
struct Slot<'n> {
    round: u32,
    cycle: u32,
    attempt: u32,
    sample: u32,
    node: &'n str,
}

/// One candidate of a round after evaluation, in sample order.
struct SampleResult {
    candidate: Option<i64>,
    summary: OutcomeSummary,
}

pub struct Engine<'a> {
    cfg: EngineConfig,
    store: Mutex<RunStore>,
    proposer: &'a dyn Proposer,
    evaluator: &'a dyn CandidateEvaluator,
    policy: &'a (dyn SelectionPolicy + Sync),
    task: TaskBrief,
    progress: &'a dyn ProgressSink,
    started: Instant,
    /// Static checks run on each proposal before it is evaluated; a non-empty list of
    /// messages rejects it as `lint_failed` without a harness run.
    lint: Option<&'a Lint>,
    interrupt: Option<&'a Interrupt>,
    /// Proposer calls that failed in a row (EngineConfig::max_proposer_failures).
    call_failures: std::sync::atomic::AtomicU32,
    /// Wall times of this session's rounds and evaluations: what the wall-time budget keeps
    /// for the next round and the finish ([`Engine::budget_reached`]).
    walls: Mutex<Walls>,
}

/// Seconds each round and each evaluation of this session took.
#[derive(Default)]
struct Walls {
    rounds: Vec<f64>,
    evaluations: Vec<f64>,
}

fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A lint hook: source in, blocking findings out (empty = fine).
pub type Lint = dyn Fn(&str) -> Vec<String> + Sync;

/// Tries of one world-model step (propose, refine, too hard) when the reply cannot be used or
/// the edit is rejected, as in the original.
pub const EDIT_TRIES: usize = 3;

/// Status of a proposal rejected by the lint hook.
pub const LINT_FAILED: &str = "lint_failed";

impl<'a> Engine<'a> {
    pub fn new(
        cfg: EngineConfig,
        store: RunStore,
        proposer: &'a dyn Proposer,
        evaluator: &'a dyn CandidateEvaluator,
        policy: &'a (dyn SelectionPolicy + Sync),
        task: TaskBrief,
        progress: &'a dyn ProgressSink,
    ) -> Self {
        Self {
            cfg,
            store: Mutex::new(store),
            proposer,
            evaluator,
            policy,
            task,
            progress,
            started: Instant::now(),
            lint: None,
            interrupt: None,
            call_failures: std::sync::atomic::AtomicU32::new(0),
            walls: Mutex::new(Walls::default()),
        }
    }

    /// Runs `lint` on every proposal before it is evaluated (see [`Lint`]).
    pub fn with_lint(mut self, lint: &'a Lint) -> Self {
        self.lint = Some(lint);
        self
    }

    /// Stops the run at its next step once `interrupt` is requested (the evaluator, given the
    /// same flag, abandons the evaluation in flight): `run` returns [`EngineError::Interrupted`]
    /// with everything finished so far in the store.
    pub fn with_interrupt(mut self, interrupt: &'a Interrupt) -> Self {
        self.interrupt = Some(interrupt);
        self
    }

    fn interrupted(&self) -> bool {
        self.interrupt.is_some_and(Interrupt::is_requested)
    }

    /// Records a lint rejection as the candidate's evaluation, or returns `None` when the
    /// source passes the hook.
    fn lint_candidate(&self, id: i64, source: &str) -> Result<Option<OutcomeSummary>, EngineError> {
        let Some(lint) = self.lint else {
            return Ok(None);
        };
        let findings = lint(source);
        if findings.is_empty() {
            return Ok(None);
        }
        let result = json!({"status": LINT_FAILED, "lint": findings});
        self.store()
            .record_evaluation(id, LINT_FAILED, None, &result)?;
        Ok(Some(lint_summary(&result)))
    }

    /// The summary of a stored result; lint rejections are not harness results.
    fn summarize_stored(&self, result: &Value) -> OutcomeSummary {
        if result["status"] == LINT_FAILED {
            lint_summary(result)
        } else {
            self.evaluator.summarize(result)
        }
    }

    /// Gives the run store back (for reports after the run).
    pub fn into_store(self) -> RunStore {
        self.store.into_inner().unwrap_or_else(|e| e.into_inner())
    }

    fn store(&self) -> std::sync::MutexGuard<'_, RunStore> {
        // A panic in another sample thread poisons the lock; the store itself is still fine.
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs (or resumes) the search until a budget or the frontier ends it. `seed` is the
    /// task's starting kernel, evaluated once and counted as a result.
    pub fn run(&self, seed: Option<&str>) -> Result<RunOutcome, EngineError> {
        match self.run_to_the_end(seed) {
            // Whatever the interrupt cut short (an evaluation, the confirmation) failed
            // because of it.
            Err(_) if self.interrupted() => Err(EngineError::Interrupted),
            other => other,
        }
    }

    fn run_to_the_end(&self, seed: Option<&str>) -> Result<RunOutcome, EngineError> {
        let mut state = match self.load_state()? {
            Some(s) => s,
            None => self.start(seed)?,
        };
        let stop_reason = loop {
            if self.interrupted() {
                return Err(EngineError::Interrupted);
            }
            if let Some(reason) = self.budget_reached(&state) {
                if state.cycle.is_some() && reason.starts_with("rounds") && !self.sampling() {
                    // The round budget cut a cycle short: close it so its best is attached
                    // (unprofiled: no later round of this session reads what bounds it).
                    self.end_cycle(&mut state, CycleEnd::Last)?;
                    self.checkpoint(&state)?;
                }
                break reason;
            }
            if state.cycle.is_none() && self.sampling() {
                self.begin_sampling(&mut state)?;
                self.checkpoint(&state)?;
                continue;
            }
            if state.cycle.is_none() {
                if !self.begin_cycle(&mut state)? {
                    break "no open action left on the frontier".to_string();
                }
                self.checkpoint(&state)?;
                continue;
            }
            let t0 = Instant::now();
            let round = match self.cfg.strategy {
                Strategy::Evolve => self.run_generation(&mut state),
                Strategy::WorldModel | Strategy::BestOfN => self.run_round(&mut state),
            };
            self.walls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .rounds
                .push(t0.elapsed().as_secs_f64());
            match round {
                Ok(()) => {}
                Err(RoundStop::Budget(reason)) => break reason,
                Err(RoundStop::Error(e)) => return Err(e),
            }
            let cycle_done = !self.sampling()
                && state
                    .cycle
                    .as_ref()
                    .is_some_and(|c| self.cycle_should_end(c));
            if cycle_done {
                // A cycle that ends as a budget runs out is the session's last.
                let end = match self.budget_reached(&state) {
                    Some(_) => CycleEnd::Last,
                    None => CycleEnd::Continuing,
                };
                self.end_cycle(&mut state, end)?;
            }
            self.checkpoint(&state)?;
        };
        self.finish(state, stop_reason)
    }

    fn load_state(&self) -> Result<Option<EngineState>, EngineError> {
        // The store guard is let go before `stored_state` takes it again.
        let finished = {
            let store = self.store();
            if store.is_finished()? {
                Some(store.finish_summary()?.unwrap_or(Value::Null))
            } else {
                None
            }
        };
        if let Some(summary) = finished {
            let reason = summary["stop_reason"]
                .as_str()
                .unwrap_or("finished")
                .to_string();
            // A run that a budget stopped continues once that budget is raised; any other
            // ending (no idea left, the speed-of-light goal met) is final.
            let by_budget = reason.contains("budget reached");
            let state = self.stored_state()?;
            let raised = state
                .as_ref()
                .is_some_and(|st| self.limit_reached(st).is_none());
            if !(by_budget && raised) {
                let hint = if by_budget {
                    "; raise its budget (resume --rounds or --max-wall-time) to continue it"
                } else {
                    ""
                };
                return Err(EngineError::Finished { reason, hint });
            }
            // Running again: `show`, `bench --run` and `export` must not report the old
            // summary's best while (or if this session dies before) the run finishes anew.
            self.store().mark_unfinished()?;
            return Ok(state);
        }
        self.stored_state()
    }

    fn stored_state(&self) -> Result<Option<EngineState>, EngineError> {
        match self.store().get_state(STATE_KEY)? {
            None => Ok(None),
            Some(v) => serde_json::from_value(v)
                .map(Some)
                .map_err(|e| EngineError::State(e.to_string())),
        }
    }

    fn checkpoint(&self, state: &EngineState) -> Result<(), EngineError> {
        let mut state = state.clone();
        state.elapsed_ms = self.elapsed_ms(&state);
        let value = serde_json::to_value(&state).map_err(|e| EngineError::State(e.to_string()))?;
        let store = self.store();
        store.set_state(STATE_KEY, &value)?;
        for x in self.proposer.drain_exchanges() {
            store.record_exchange(&x)?;
        }
        Ok(())
    }

    /// The time a round and the finish are expected to take: one round at the median of this
    /// session's rounds, the winner's re-check at the pace of the session's first evaluation
    /// (both draw every input set and compute every reference output anew), and the finish's
    /// other evaluations ([`Engine::finish_evaluations`]) at the median of the evaluations
    /// after the first. An evaluation counts as the judge's own time (the result's
    /// `wall_seconds`), not the time its sample spent waiting for the device behind the
    /// round's other samples: the finish evaluates one at a time. Zero before anything was
    /// measured.
    fn finish_reserve_ms(&self) -> u64 {
        let walls = self.walls.lock().unwrap_or_else(|e| e.into_inner());
        let warm = median(walls.evaluations.get(1..).unwrap_or_default());
        let finish = match self.finish_evaluations() {
            0 => 0.0,
            n => walls.evaluations.first().copied().unwrap_or(warm) + f64::from(n - 1) * warm,
        };
        let seconds = median(&walls.rounds) + finish;
        (seconds * 1000.0).round() as u64
    }

    /// Evaluations the finish makes at most: the winner's re-check, the confirmation's rounds
    /// (the winner, its runner-ups and the seed in each) and the seed's re-check.
    fn finish_evaluations(&self) -> u32 {
        if !self.cfg.recheck {
            return 0;
        }
        let contenders = 2 + ranking::CONFIRM_RUNNER_UPS as u32;
        2 + self.cfg.confirm_rounds.saturating_mul(contenders)
    }

    /// The evaluator's answer for `source`, its wall time noted for the budget.
    fn evaluate_timed(&self, source: &str, purpose: Purpose) -> Result<Evaluation, EngineError> {
        let t0 = Instant::now();
        let eval = self
            .evaluator
            .evaluate(source, purpose)
            .map_err(|e| EngineError::Evaluator(e.to_string()))?;
        let judged = eval.result["wall_seconds"]
            .as_f64()
            .filter(|s| s.is_finite() && *s > 0.0);
        let mut walls = self.walls.lock().unwrap_or_else(|e| e.into_inner());
        walls
            .evaluations
            .push(judged.unwrap_or_else(|| t0.elapsed().as_secs_f64()));
        Ok(eval)
    }

    fn elapsed_ms(&self, state: &EngineState) -> u64 {
        // `elapsed_ms` in the state is the time of earlier sessions of this run.
        state.elapsed_ms + self.started.elapsed().as_millis() as u64
    }

    /// Seed evaluation, then the initial world model with the seed attached to the root.
    fn start(&self, seed: Option<&str>) -> Result<EngineState, EngineError> {
        let mut seed_candidate = None;
        let mut seed_score = None;
        let mut seed_summary = None;
        // A session killed before its first checkpoint may have recorded (and evaluated) the
        // seed already: take that one up instead of recording a second seed.
        let recorded = self
            .store()
            .candidates()?
            .into_iter()
            .find(|c| c.kind == CandidateKind::Seed);
        let seed = match (recorded, seed) {
            (Some(row), _) => Some((row.id, self.store().source(&row.source_id)?)),
            (None, Some(src)) => {
                let id = self.record_candidate(
                    &Proposal {
                        source: src.to_string(),
                        knobs: None,
                        note: "the task's seed kernel".into(),
                    },
                    None,
                    None,
                    0,
                    0,
                    0,
                    0,
                    CandidateKind::Seed,
                )?;
                Some((id, src.to_string()))
            }
            (None, None) => None,
        };
        if let Some((id, src)) = &seed {
            let id = *id;
            let stored = self.store().evaluation_for(id)?;
            let summary = match stored {
                Some(ev) => self.summarize_stored(&ev.result),
                None => {
                    // The first cycle's first candidate compiles while the seed is evaluated.
                    if self.writes_cycle_starts_ahead() {
                        for source in self.first_cycle_sources_ahead(id) {
                            self.evaluator.prebuild_in_background(&source);
                        }
                    }
                    self.evaluate_candidate(id, src, Purpose::Search)?
                }
            };
            seed_candidate = Some(id);
            if summary.passed {
                seed_score = summary.score;
            }
            seed_summary = Some(summary);
        }
        // Best-of-n and evolve never consult the world model: a bare root records their
        // attempts, and no planning call is made.
        let mut wm = if self.sampling() {
            WorldModel::new_root(self.task.description.clone(), Vec::new())
        } else {
            self.proposer
                .init_world_model(&self.task)
                .map_err(|e| EngineError::Proposer(e.to_string()))?
        };
        wm.record_signals(0, seed_summary.as_ref().map(trace_of));
        let mut best = None;
        if let (Some(id), Some(score), Some(summary)) = (seed_candidate, seed_score, &seed_summary)
        {
            let root = wm.root_id().clone();
            let source_id = self.store().candidate(id)?.map(|c| c.source_id);
            wm.attach_solution(
                &root,
                solution_ref(
                    source_id
                        .map(|s| s.as_str().to_string())
                        .unwrap_or_default(),
                    score,
                    summary.latency_ms,
                    0,
                ),
            )?;
            best = Some(BestRef {
                candidate_id: id,
                score,
                node: Some(root.to_string()),
                round: 0,
                rechecked_score: None,
                interval: summary.score_interval,
                scores: vec![score],
            });
        }
        let state = EngineState {
            wm,
            rounds_used: 0,
            cycles: 0,
            cycle: None,
            best,
            seed_candidate,
            seed_score,
            passed: u32::from(seed_score.is_some()),
            failed: u32::from(seed.is_some() && seed_score.is_none()),
            elapsed_ms: 0,
            population: None,
        };
        self.snapshot(&state)?;
        self.checkpoint(&state)?;
        Ok(state)
    }

    fn snapshot(&self, state: &EngineState) -> Result<(), EngineError> {
        let value =
            serde_json::to_value(&state.wm).map_err(|e| EngineError::State(e.to_string()))?;
        self.store()
            .snapshot_world_model(state.rounds_used, state.cycles, &value)?;
        Ok(())
    }

    /// Why the run stops before its next round: a limit ([`Engine::limit_reached`]) or its
    /// speed-of-light goal met.
    fn budget_reached(&self, state: &EngineState) -> Option<String> {
        self.limit_reached(state)
            .or_else(|| self.goal_reached(state))
    }

    /// The best kernel's speed-of-light share reached `--stop-at-sol` on every workload.
    fn goal_reached(&self, state: &EngineState) -> Option<String> {
        if let (Some(goal), Some(best)) = (self.cfg.stop_at_sol, &state.best) {
            let sol = self
                .attempt_view(best.candidate_id)
                .ok()
                .flatten()
                .and_then(|v| v.outcome.speed_of_light);
            if let Some(sol) = sol.filter(|s| *s >= goal) {
                return Some(format!(
                    "the best kernel reached {:.0}% of the speed of light on every workload \
                     (--stop-at-sol {goal})",
                    sol * 100.0
                ));
            }
        }
        None
    }

    /// A budget is spent: rounds, wall time (with the finish's reserve), tokens or money.
    fn limit_reached(&self, state: &EngineState) -> Option<String> {
        if state.rounds_used >= self.cfg.rounds {
            return Some(format!("rounds budget reached ({})", self.cfg.rounds));
        }
        if let Some(max) = self.cfg.max_wall_seconds {
            // The budget covers the whole run: no round starts unless it and the finish
            // (re-check, confirmation) fit in what is left, at this session's typical times.
            let kept = self.finish_reserve_ms();
            if self.elapsed_ms(state).saturating_add(kept) >= max.saturating_mul(1000) {
                return Some(if kept > 0 {
                    format!(
                        "wall-time budget reached ({max} s, of which about {} s kept for the \
                         next round, the re-check and the confirmation)",
                        kept.div_ceil(1000)
                    )
                } else {
                    format!("wall-time budget reached ({max} s)")
                });
            }
        }
        let usage = self.proposer.usage();
        if let Some(max) = self.cfg.max_tokens {
            if usage.input_tokens + usage.output_tokens >= max {
                return Some(format!("token budget reached ({max})"));
            }
        }
        if let Some(max) = self.cfg.max_cost_usd {
            if usage.cost_usd >= max {
                return Some(format!("cost budget reached (${max:.2})"));
            }
        }
        None
    }

    /// Proposes if the frontier is thin, picks the next action and opens a cycle on it.
    /// Returns false when nothing is left to work on.
    fn begin_cycle(&self, state: &mut EngineState) -> Result<bool, EngineError> {
        let round = state.rounds_used + 1;
        if self.should_propose(&state.wm) {
            self.edit_with_retries("propose", state, round, |wm, feedback| {
                self.proposer.propose(wm, round, feedback)
            })?;
            self.fallback_child(state, round, "continue from the best solution", 0.6)?;
        }
        let Some(node) = self.policy.choose(&state.wm) else {
            return Ok(false);
        };
        // The ranking the policy chose from, taken before the visit below changes the
        // statistics it is computed from.
        let ranking: Vec<String> = self
            .policy
            .rank(&state.wm)
            .iter()
            .take(5)
            .map(|c| c.to_string())
            .collect();
        state.wm.begin_cycle(&node)?;
        let base = self.base_candidate(&state.wm, &node);
        state.cycles += 1;
        self.event(
            "cycle_start",
            json!({"cycle": state.cycles, "node": node.as_str(), "policy": self.policy.name(),
                   "ranking": ranking, "base_candidate": base}),
        )?;
        state.cycle = Some(CycleState {
            node,
            index: state.cycles,
            consumed: 0,
            no_improve: 0,
            no_improve_over_base: 0,
            base,
            best: None,
            last: None,
            history: Vec::new(),
        });
        Ok(true)
    }

    /// Whether rounds are independent samples (`Strategy::BestOfN`) rather than cycles.
    fn independent(&self) -> bool {
        self.cfg.strategy == Strategy::BestOfN
    }

    /// Whether the world model is left alone: best-of-n and evolve spend every round in one
    /// open-ended "cycle" on the root.
    fn sampling(&self) -> bool {
        self.cfg.strategy != Strategy::WorldModel
    }

    /// Best-of-n and evolve: one open-ended "cycle" on the root that every round samples into;
    /// nothing is proposed, refined or chosen from the world model.
    fn begin_sampling(&self, state: &mut EngineState) -> Result<(), EngineError> {
        let root = state.wm.root_id().clone();
        state.cycles += 1;
        self.event(
            "cycle_start",
            json!({"cycle": state.cycles, "node": root.as_str(),
                   "policy": self.cfg.strategy.as_str()}),
        )?;
        state.cycle = Some(CycleState {
            node: root,
            index: state.cycles,
            consumed: 0,
            no_improve: 0,
            no_improve_over_base: 0,
            base: None,
            best: None,
            last: None,
            history: Vec::new(),
        });
        Ok(())
    }

    /// The original skips proposing while ≥ 3 actions are executable and the best solved node
    /// already has an open child.
    fn should_propose(&self, wm: &WorldModel) -> bool {
        let executable = wm.frontier().len();
        let best_has_child = wm.best_closed().is_none_or(|b| {
            wm.children(&b.id)
                .iter()
                .any(|c| c.is_open() && c.is_action())
        });
        !(executable >= 3 && best_has_child)
    }

    /// Deterministic continuation child under the best solved node when it has none (the
    /// original's fallback; score and difficulty as there).
    fn fallback_child(
        &self,
        state: &mut EngineState,
        round: u32,
        title: &str,
        score: f64,
    ) -> Result<(), EngineError> {
        let Some(best) = state.wm.best_closed().map(|b| b.id.clone()) else {
            return Ok(());
        };
        self.ensure_continuation(state, &best, round, title, score)
    }

    fn ensure_continuation(
        &self,
        state: &mut EngineState,
        node: &NodeId,
        round: u32,
        title: &str,
        score: f64,
    ) -> Result<(), EngineError> {
        let has_child = state
            .wm
            .children(node)
            .iter()
            .any(|c| c.is_open() && c.open_action().is_some_and(|a| a.difficulty < 5));
        if has_child {
            return Ok(());
        }
        let parent = state.wm.node(node).cloned();
        let factor = parent
            .as_ref()
            .and_then(|p| p.solution().map(|s| s.measured_factor()));
        let patch = NodePatch {
            label: Some(format!("continue-{}", node.as_str())),
            decision: Some(Some("continue".into())),
            choice: Some(Some(title.into())),
            overall_rating: parent.as_ref().map(|p| p.overall_rating),
            confidence: parent.as_ref().map(|p| p.confidence.max(0.2)),
            action: Some(ActionPatch {
                title: Some(title.into()),
                description: Some(
                    "Tune the parent's kernel: target its largest remaining bottleneck.".into(),
                ),
                difficulty: Some(2.0),
                score: Some(Some(score)),
                expected_vs_baseline_factor: Some(factor.map(|f| f * 1.1)),
                ..ActionPatch::default()
            }),
            ..NodePatch::default()
        };
        state.wm.insert_child(node, &patch, round)?;
        Ok(())
    }

    /// Counts a code request's outcome towards [`EngineConfig::max_proposer_failures`]: a
    /// failed call adds one, any reply resets the count; reaching the limit stops the run
    /// before this sample is recorded, so a resume asks again.
    fn count_call_failure<T>(&self, written: &Result<T, ProposerError>) -> Result<(), RoundStop> {
        use std::sync::atomic::Ordering;
        let why = match written {
            Err(ProposerError::CallFailed(why)) => why,
            Ok(_) | Err(ProposerError::Unusable(_)) => {
                self.call_failures.store(0, Ordering::SeqCst);
                return Ok(());
            }
            Err(ProposerError::Budget(_) | ProposerError::Setup(_)) => return Ok(()),
        };
        let failures = self.call_failures.fetch_add(1, Ordering::SeqCst) + 1;
        let limit = self.cfg.max_proposer_failures;
        if limit > 0 && failures >= limit {
            self.event(
                "proposer_gave_up",
                json!({"failures": failures, "error": why}),
            )?;
            return Err(RoundStop::Error(EngineError::ProposerGaveUp {
                failures,
                last: why.clone(),
            }));
        }
        Ok(())
    }

    fn cycle_should_end(&self, c: &CycleState) -> bool {
        let w = self.cfg.stagnation_window.max(1);
        c.no_improve >= w
            || c.no_improve_over_base >= w
            || (self.cfg.cycle_cap > 0 && c.consumed >= self.cfg.cycle_cap)
    }

    fn run_round(&self, state: &mut EngineState) -> Result<(), RoundStop> {
        let round = state.rounds_used + 1;
        let cycle = state
            .cycle
            .clone()
            .ok_or_else(|| RoundStop::Error(EngineError::State("round outside a cycle".into())))?;
        let attempt = cycle.consumed + 1;
        let node = state.wm.node(&cycle.node).cloned().ok_or_else(|| {
            RoundStop::Error(WorldModelError::UnknownNode(cycle.node.clone()).into())
        })?;
        let independent = self.independent();
        let action = if independent {
            independent_sample()
        } else {
            node.action.clone().unwrap_or_default()
        };
        // An independent sample sees the specification only: no base, no earlier attempt.
        let view = |id: Option<i64>| -> Result<Option<AttemptView>, EngineError> {
            id.filter(|_| !independent)
                .map(|i| self.attempt_view(i))
                .transpose()
                .map(Option::flatten)
        };
        let base = view(cycle.base)?;
        let last = view(cycle.last)?;
        let cycle_best = view(cycle.best.map(|b| b.0))?;
        let history = match independent {
            true => Vec::new(),
            false => self.cycle_history(&cycle)?,
        };
        let step = if independent {
            Step::SpecAction
        } else if attempt == 1 {
            if base.is_some() {
                Step::BaseAction
            } else {
                Step::SpecAction
            }
        } else if cycle.best.is_none() {
            Step::Debug
        } else {
            Step::Improve
        };
        let known = self.known_sources()?;
        // Samples already recorded for this round (a resumed run).
        let existing: Vec<CandidateRow> = self
            .store()
            .candidates()?
            .into_iter()
            .filter(|c| c.kind == CandidateKind::Attempt && c.round == round)
            .collect();

        let req = CodeRequest {
            step,
            round,
            attempt,
            sample: 0,
            node: &node,
            action: &action,
            base: base.as_ref(),
            last: last.as_ref(),
            cycle_best: cycle_best.as_ref(),
            history: &history,
            wm: &state.wm,
            known_sources: &known,
        };
        // With one sample per round, the next round's candidate cannot be written before this
        // one's score is in; a proposer that writes ahead for free lets the candidates that
        // round could bring (this one improving the cycle's best, or not) compile meanwhile,
        // in threads the round waits for (docs/search.md, "What overlaps, and what waits").
        let ahead = !independent
            && self.cfg.samples <= 1
            && self.proposer.writes_ahead()
            && self.evaluator.prebuilds();
        // Best-of-n's next round asks for what this one asked (the specification alone), so a
        // proposer whose calls take time (an LLM) is asked for it while this round is
        // evaluated (docs/search.md, "What overlaps, and what waits").
        let next_round = independent && !self.proposer.writes_ahead() && round < self.cfg.rounds;
        // The next cycle's likely first attempts are written when this round's candidate is,
        // where the cycle ends unless it improves (`Self::cycle_end_unless_improved`): a
        // round's evaluation earlier than its end would write them.
        let ends_ahead = ahead && self.profiles_at_cycle_end();
        let frozen: &EngineState = state;
        let (outcomes, written_ahead) = std::thread::scope(|builds| {
            let write_ahead = |written: &Proposal, id: i64| {
                if ahead {
                    for source in self.sources_ahead(&req, written, id) {
                        builds.spawn(move || self.evaluator.prebuild_in_background(&source));
                    }
                }
                if let Some((after, (best, score))) = ends_ahead
                    .then(|| self.cycle_end_unless_improved(frozen, &cycle, id))
                    .flatten()
                {
                    builds.spawn(move || {
                        for source in
                            self.next_cycle_sources_ahead(frozen, &after, best, score, round)
                        {
                            self.evaluator.prebuild_in_background(&source);
                        }
                    });
                }
            };
            let next = next_round.then(|| builds.spawn(|| self.write_next_round(&req)));
            let outcomes = self.each_sample(|sample| {
                let req = CodeRequest {
                    sample,
                    ..req.clone()
                };
                let existing = existing.iter().find(|c| c.sample == sample).cloned();
                self.run_sample(&req, existing, &cycle, independent, &write_ahead)
            });
            let written = next.and_then(|h| h.join().ok()).unwrap_or_default();
            (outcomes, written)
        });
        let outcomes = outcomes?;
        // Recorded after this round's own candidates, so candidate ids follow the rounds; the
        // next round finds them as a resumed round finds its recorded samples.
        for (sample, proposal) in written_ahead {
            self.record_candidate(
                &proposal,
                None,
                Some(cycle.node.as_str()),
                round + 1,
                cycle.index,
                attempt + 1,
                sample,
                CandidateKind::Attempt,
            )
            .map_err(RoundStop::Error)?;
        }

        // Process in sample order so the decisions do not depend on which thread finished first.
        let c = state.cycle.as_mut().expect("checked above");
        let mut improved = false;
        let mut round_best: Option<(i64, f64)> = None;
        let mut last_id = None;
        for (sample, o) in (0u32..).zip(&outcomes) {
            c.history.push(HistoryEntry {
                attempt,
                sample,
                candidate: o.candidate,
                error: o.candidate.is_none().then(|| {
                    crate::proposer::prompts::keep_end(&o.summary.message, HISTORY_ERROR_CHARS)
                }),
            });
            state
                .wm
                .record_attempt(&c.node, o.summary.passed)
                .map_err(EngineError::from)?;
            if o.summary.passed {
                state.passed += 1;
            } else {
                state.failed += 1;
            }
            if let Some(id) = o.candidate {
                last_id = Some(id);
            }
            let (Some(id), Some(score), true) = (o.candidate, o.summary.score, o.summary.passed)
            else {
                continue;
            };
            if round_best.is_none_or(|(_, s)| score > s) {
                round_best = Some((id, score));
            }
            let challenger = BestRef::measured(id, score, &c.node, round, o.summary.score_interval);
            state.best = self.offer_best(state.best.take(), challenger)?;
            if c.best.is_none_or(|(_, s)| score > s) {
                c.best = Some((id, score));
                improved = true;
            }
        }
        count_streaks(c, improved, &state.wm);
        // A round whose samples all failed before producing code keeps the previous attempt as
        // the one the next debug step sees.
        c.last = round_best.map(|(id, _)| id).or(last_id).or(c.last);
        c.consumed += 1;
        state.rounds_used = round;
        self.round_signals(state, round, &outcomes);
        Ok(())
    }

    /// What the next prompts show as the search's signals (this round's best evaluation, else
    /// its last one), and the round's progress line.
    fn round_signals(&self, state: &mut EngineState, round: u32, outcomes: &[SampleResult]) {
        // What the next prompts show as the search's signals: this round and its best
        // evaluation (else its last one).
        let traced = outcomes
            .iter()
            .filter(|o| o.summary.passed)
            .max_by(|a, b| {
                a.summary
                    .score
                    .unwrap_or(0.0)
                    .total_cmp(&b.summary.score.unwrap_or(0.0))
            })
            .or(outcomes.last());
        state
            .wm
            .record_signals(round, traced.map(|o| trace_of(&o.summary)));

        let usage = self.proposer.usage();
        let message = outcomes
            .iter()
            .map(|o| {
                if o.summary.passed {
                    format!("{:.3}", o.summary.score.unwrap_or(0.0))
                } else {
                    o.summary.status.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        self.progress.update(&Progress {
            round,
            rounds: self.cfg.rounds,
            cycle: state.cycle.as_ref().map_or(0, |c| c.index),
            node: state
                .cycle
                .as_ref()
                .map(|c| c.node.to_string())
                .unwrap_or_default(),
            best_score: state.best.as_ref().map(|b| b.score),
            passed: state.passed,
            failed: state.failed,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cost_usd: usage.cost_usd,
            message,
        });
    }

    /// The run's best after `challenger` passed: it replaces a lower incumbent outright when
    /// clearly faster, after a duel (both measured again) when its score is inside the
    /// incumbent's noise.
    fn offer_best(
        &self,
        incumbent: Option<BestRef>,
        challenger: BestRef,
    ) -> Result<Option<BestRef>, EngineError> {
        Ok(Some(match incumbent {
            None => challenger,
            Some(b) if challenger.score > b.score => {
                if ranking::clearly_better((challenger.score, challenger.interval), &b) {
                    challenger
                } else {
                    self.duel(&b, challenger)?
                }
            }
            Some(b) => b,
        }))
    }

    /// `run(sample)` for each of the round's samples, each in a thread of its own, the results
    /// in sample order; the first that stops the round stops it.
    fn each_sample(
        &self,
        run: impl Fn(u32) -> Result<SampleResult, RoundStop> + Sync,
    ) -> Result<Vec<SampleResult>, RoundStop> {
        let run = &run;
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.cfg.samples.max(1))
                .map(|sample| s.spawn(move || run(sample)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(RoundStop::Error(EngineError::Evaluator(
                            "a sample thread panicked".into(),
                        )))
                    })
                })
                .collect()
        })
    }

    /// Best-of-n: the next round's samples, asked for while `req`'s round is evaluated (each
    /// in a thread of its own, as a round's samples are) and compiled as they come on a GPU
    /// backend. Samples that round already has (a resumed run) are not asked for again; a
    /// call that fails is left to that round, which asks again and records the failure.
    fn write_next_round(&self, req: &CodeRequest<'_>) -> Vec<(u32, Proposal)> {
        let round = req.round + 1;
        let recorded: Vec<u32> = match self.store().candidates() {
            Ok(all) => all
                .into_iter()
                .filter(|c| c.kind == CandidateKind::Attempt && c.round == round)
                .map(|c| c.sample)
                .collect(),
            Err(e) => {
                tracing::warn!("round {round} is not written ahead: {e}");
                return Vec::new();
            }
        };
        std::thread::scope(|s| {
            let calls: Vec<_> = (0..self.cfg.samples.max(1))
                .filter(|sample| !recorded.contains(sample))
                .map(|sample| {
                    s.spawn(move || {
                        let next = CodeRequest {
                            round,
                            attempt: req.attempt + 1,
                            sample,
                            ..req.clone()
                        };
                        match self.proposer.sample(&next) {
                            Ok(p) => {
                                if self.evaluator.prebuilds() {
                                    self.evaluator.prebuild_in_background(&p.source);
                                }
                                Some((sample, p))
                            }
                            Err(e) => {
                                tracing::debug!(
                                    "round {round}, sample {sample} not written ahead: {e}"
                                );
                                None
                            }
                        }
                    })
                })
                .collect();
            calls
                .into_iter()
                .filter_map(|h| h.join().ok().flatten())
                .collect()
        })
    }

    /// The sources the next rounds of this cycle would write after `req`'s candidate
    /// (`written`, recorded as `id`): for each of the next [`ROUNDS_WRITTEN_AHEAD`] rounds,
    /// what it writes if the candidate before it became the cycle's best, and if it did not.
    /// A compile takes longer than an evaluation, so a build started one round ahead was
    /// still compiling when its round asked for it. Nothing beyond the cycle's end (its cap);
    /// sources already known are left out. Nearest rounds first.
    fn sources_ahead(&self, req: &CodeRequest<'_>, written: &Proposal, id: i64) -> Vec<String> {
        let mut known = req.known_sources.clone();
        known.insert(SourceId::of(&written.source).as_str().to_string());
        let mut levels: Vec<Vec<String>> = vec![Vec::new(); ROUNDS_WRITTEN_AHEAD];
        self.guess_ahead(req, written, Some(id), &mut known, &mut levels, 0);
        levels.into_iter().flatten().collect()
    }

    /// One level of [`Self::sources_ahead`]: the two sources the round after `req`'s writes,
    /// then (below `ROUNDS_WRITTEN_AHEAD`) the rounds after each of them.
    fn guess_ahead(
        &self,
        req: &CodeRequest<'_>,
        written: &Proposal,
        id: Option<i64>,
        known: &mut BTreeSet<String>,
        levels: &mut [Vec<String>],
        depth: usize,
    ) {
        if depth >= levels.len() || (self.cfg.cycle_cap > 0 && req.attempt >= self.cfg.cycle_cap) {
            return;
        }
        let sid = SourceId::of(&written.source).as_str().to_string();
        let this = AttemptView {
            candidate_id: id.unwrap_or(-1),
            source: written.source.clone(),
            source_id: sid,
            knobs: written.knobs.clone(),
            outcome: OutcomeSummary::default(),
        };
        let seen = known.clone();
        let next = CodeRequest {
            round: req.round + 1,
            attempt: req.attempt + 1,
            last: Some(&this),
            known_sources: &seen,
            ..req.clone()
        };
        let improved = CodeRequest {
            step: Step::Improve,
            cycle_best: Some(&this),
            ..next.clone()
        };
        let not_improved = CodeRequest {
            step: match req.cycle_best {
                Some(_) => Step::Improve,
                None => Step::Debug,
            },
            ..next.clone()
        };
        for hypothesis in [improved, not_improved] {
            let Ok(p) = self.proposer.write_code(&hypothesis) else {
                continue;
            };
            let new = SourceId::of(&p.source).as_str().to_string();
            if p.source == written.source || !known.insert(new) {
                continue;
            }
            levels[depth].push(p.source.clone());
            self.guess_ahead(&hypothesis, &p, None, known, levels, depth + 1);
        }
    }

    /// The cycle `c` as it ends if its attempt recorded as `id` does not improve on its best,
    /// with that best (the candidate and its score); `None` where the cycle would go on
    /// without improving, or has no best to profile at its end. Most cycles end that way (an
    /// attempt that improves at its cap is the exception), so the next cycle's first attempts
    /// guessed from it compile while this attempt is evaluated; where the attempt does
    /// improve, the cycle's end guesses again from the new best (`Self::end_cycle`).
    fn cycle_end_unless_improved(
        &self,
        state: &EngineState,
        c: &CycleState,
        id: i64,
    ) -> Option<(CycleState, (i64, f64))> {
        let best = c.best?;
        let mut after = c.clone();
        count_streaks(&mut after, false, &state.wm);
        after.last = Some(id);
        after.consumed += 1;
        self.cycle_should_end(&after).then_some((after, best))
    }

    /// Writes (unless the store already has it), records and evaluates one sample;
    /// `write_ahead` sees a newly written candidate before it is evaluated.
    fn run_sample(
        &self,
        req: &CodeRequest<'_>,
        existing: Option<CandidateRow>,
        cycle: &CycleState,
        independent: bool,
        write_ahead: &(dyn Fn(&Proposal, i64) + Sync),
    ) -> Result<SampleResult, RoundStop> {
        let at = Slot {
            round: req.round,
            cycle: cycle.index,
            attempt: req.attempt,
            sample: req.sample,
            node: cycle.node.as_str(),
        };
        self.produce(at, existing, write_ahead, || {
            let written = match independent {
                true => self.proposer.sample(req),
                false => self.proposer.write_code(req),
            };
            // What the proposal was written from: the base of an action, the attempt a debug
            // step fixes, the cycle's best an improve step refines. `ksearch show` follows
            // these links for the path to the best.
            let parent = match req.step {
                Step::SpecAction => None,
                Step::BaseAction => req.base,
                Step::Debug => req.last,
                Step::Improve => req.cycle_best,
            }
            .map(|v| v.candidate_id)
            .filter(|id| *id > 0);
            (written, parent)
        })
    }

    /// One candidate at `at`: the stored one of a resumed round (its evaluation reused when it
    /// has one), else what `write` proposes (with the candidate it was written from), recorded
    /// before it is linted and evaluated (`on_written` sees it then). A proposer failure is a
    /// failed attempt with its reason, not a crash; a spent budget stops the round.
    fn produce(
        &self,
        at: Slot<'_>,
        existing: Option<CandidateRow>,
        on_written: &(dyn Fn(&Proposal, i64) + Sync),
        write: impl FnOnce() -> (Result<Proposal, ProposerError>, Option<i64>),
    ) -> Result<SampleResult, RoundStop> {
        let (id, source) = match existing {
            Some(row) => {
                if let Some(ev) = self
                    .store()
                    .evaluation_for(row.id)
                    .map_err(EngineError::from)?
                {
                    return Ok(SampleResult {
                        candidate: Some(row.id),
                        summary: self.summarize_stored(&ev.result),
                    });
                }
                let src = self
                    .store()
                    .source(&row.source_id)
                    .map_err(EngineError::from)?;
                (row.id, src)
            }
            None => {
                let (written, parent) = write();
                self.count_call_failure(&written)?;
                let proposal = match written {
                    Ok(p) => p,
                    Err(ProposerError::Budget(reason)) => return Err(RoundStop::Budget(reason)),
                    Err(e) => {
                        self.event(
                            "proposer_error",
                            json!({"round": at.round, "sample": at.sample, "error": e.to_string()}),
                        )?;
                        return Ok(SampleResult {
                            candidate: None,
                            summary: OutcomeSummary {
                                status: "proposer_error".into(),
                                message: e.to_string(),
                                ..OutcomeSummary::default()
                            },
                        });
                    }
                };
                let id = self.record_candidate(
                    &proposal,
                    parent,
                    Some(at.node),
                    at.round,
                    at.cycle,
                    at.attempt,
                    at.sample,
                    CandidateKind::Attempt,
                )?;
                on_written(&proposal, id);
                (id, proposal.source)
            }
        };
        if let Some(summary) = self.lint_candidate(id, &source)? {
            return Ok(SampleResult {
                candidate: Some(id),
                summary,
            });
        }
        let summary = self.evaluate_candidate(id, &source, Purpose::Search)?;
        Ok(SampleResult {
            candidate: Some(id),
            summary,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn record_candidate(
        &self,
        p: &Proposal,
        parent_candidate: Option<i64>,
        node: Option<&str>,
        round: u32,
        cycle: u32,
        attempt: u32,
        sample: u32,
        kind: CandidateKind,
    ) -> Result<i64, EngineError> {
        let store = self.store();
        let source_id = store.put_source(&p.source, &self.task.language)?;
        Ok(store.add_candidate(&NewCandidate {
            source_id,
            parent_candidate,
            node_id: node.map(str::to_string),
            round,
            cycle,
            attempt,
            sample,
            kind,
            proposer_note: p.note.clone(),
            knobs: p.knobs.clone().unwrap_or(Value::Null),
        })?)
    }

    /// Evaluates a recorded candidate and commits the result at once. A source evaluated
    /// before in this run (same content hash, same purpose) reuses that result.
    fn evaluate_candidate(
        &self,
        id: i64,
        source: &str,
        purpose: Purpose,
    ) -> Result<OutcomeSummary, EngineError> {
        if purpose == Purpose::Search {
            if let Some(prev) = self.previous_evaluation(source)? {
                let mut result = prev.clone();
                result["reused_from_candidate"] = prev["__candidate"].clone();
                let summary = self.summarize_stored(&result);
                self.store()
                    .record_evaluation(id, &summary.status, summary.score, &result)?;
                return Ok(summary);
            }
        }
        let mut eval = self.evaluate_timed(source, purpose)?;
        if purpose == Purpose::Search && !self.profiles_at_cycle_end() {
            if let Some(profiled) = self.evaluator.profile_new_best(source, &eval) {
                eval = profiled;
            }
        }
        self.store().record_evaluation(
            id,
            &eval.summary.status,
            eval.summary.score,
            &eval.result,
        )?;
        Ok(eval.summary)
    }

    /// Whether new bests are profiled when their cycle ends rather than when evaluated: for a
    /// proposer that reads bottlenecks only then, a new best that a later attempt of the same
    /// cycle beats would be profiled for nothing. Best-of-n and evolve have no cycle ends to
    /// wait for.
    fn profiles_at_cycle_end(&self) -> bool {
        !self.sampling() && self.proposer.reads_bottlenecks() == BottleneckReads::AtCycleEnd
    }

    /// The cycle's best kernel (candidate `id`) profiled where it is the run's new best (see
    /// [`Self::profiles_at_cycle_end`]), the profile added to its stored evaluation, so the
    /// views read after this one see what bounds it.
    fn profile_cycle_best(&self, id: i64) -> Result<(), EngineError> {
        let (source, row) = {
            let store = self.store();
            let Some(c) = store.candidate(id)? else {
                return Ok(());
            };
            let Some(row) = store.evaluation_for(id)? else {
                return Ok(());
            };
            (store.source(&c.source_id)?, row)
        };
        let stored = Evaluation {
            summary: self.summarize_stored(&row.result),
            result: row.result,
        };
        if let Some(profiled) = self.evaluator.profile_new_best(&source, &stored) {
            self.store()
                .amend_evaluation(row.id, "profile", &profiled.result["profile"])?;
        }
        Ok(())
    }

    fn previous_evaluation(&self, source: &str) -> Result<Option<Value>, EngineError> {
        let sid = SourceId::of(source);
        Ok(self
            .store()
            .first_evaluated_candidate_of(&sid)?
            .map(|(id, ev)| {
                let mut v = ev.result;
                v["__candidate"] = json!(id);
                v
            }))
    }

    fn known_sources(&self) -> Result<BTreeSet<String>, EngineError> {
        Ok(self
            .store()
            .evaluated_source_ids()?
            .into_iter()
            .map(|id| id.as_str().to_string())
            .collect())
    }

    fn attempt_view(&self, id: i64) -> Result<Option<AttemptView>, EngineError> {
        let store = self.store();
        let Some(c) = store.candidate(id)? else {
            return Ok(None);
        };
        let source = store.source(&c.source_id)?;
        let outcome = store
            .evaluation_for(id)?
            .map(|e| self.summarize_stored(&e.result))
            .unwrap_or_default();
        Ok(Some(AttemptView {
            candidate_id: id,
            source,
            source_id: c.source_id.as_str().to_string(),
            knobs: (!c.knobs.is_null()).then_some(c.knobs),
            outcome,
        }))
    }

    /// The cycle's attempts as prompts list them: each with its outcome and note, an attempt
    /// whose source repeats an earlier one of the cycle named as its duplicate.
    fn cycle_history(&self, c: &CycleState) -> Result<Vec<CycleAttempt>, EngineError> {
        let mut out: Vec<CycleAttempt> = Vec::new();
        let mut sources: Vec<(String, (u32, u32))> = Vec::new();
        for h in &c.history {
            let mut a = CycleAttempt {
                attempt: h.attempt,
                sample: h.sample,
                candidate_id: h.candidate,
                ..CycleAttempt::default()
            };
            match h.candidate {
                None => {
                    a.outcome = OutcomeSummary {
                        status: "proposer_error".into(),
                        message: h.error.clone().unwrap_or_default(),
                        ..OutcomeSummary::default()
                    };
                }
                Some(id) => {
                    let (row, result) = {
                        let store = self.store();
                        (
                            store.candidate(id)?,
                            store.evaluation_for(id)?.map(|e| e.result),
                        )
                    };
                    if let Some(row) = &row {
                        a.note = row.proposer_note.clone();
                        let sid = row.source_id.as_str().to_string();
                        a.duplicate_of = sources.iter().find(|(s, _)| *s == sid).map(|(_, at)| *at);
                        if a.duplicate_of.is_none() {
                            sources.push((sid, (h.attempt, h.sample)));
                        }
                    }
                    if let Some(result) = &result {
                        a.outcome = self.summarize_stored(result);
                        if a.duplicate_of.is_none() {
                            a.reused_from = result["reused_from_candidate"].as_i64();
                        }
                    }
                }
            }
            out.push(a);
        }
        Ok(out)
    }

    /// The candidate a cycle on `node` starts from: the one whose source is the solution
    /// attached to the node's parent (the best of them where several share it).
    fn base_candidate(&self, wm: &WorldModel, node: &NodeId) -> Option<i64> {
        let parent = wm.node(node)?.parent.as_ref()?;
        let solution = wm.node(parent)?.solution()?;
        self.candidate_for_source(&solution.solution_id)
            .ok()
            .flatten()
    }

    fn candidate_for_source(&self, source_id: &str) -> Result<Option<i64>, EngineError> {
        let store = self.store();
        let mut best: Option<(i64, f64)> = None;
        for c in store.candidates()? {
            if c.source_id.as_str() != source_id {
                continue;
            }
            let score = store
                .evaluation_for(c.id)?
                .and_then(|e| e.score)
                .unwrap_or(f64::MIN);
            if best.is_none_or(|(_, s)| score > s) {
                best = Some((c.id, score));
            }
        }
        Ok(best.map(|b| b.0))
    }

    /// Whether a cycle's likely first candidates are written ahead, while the seed is evaluated
    /// or the cycle before ends ([`Self::first_cycle_sources_ahead`],
    /// [`Self::next_cycle_sources_ahead`]): a proposer whose code is free to write, a backend
    /// whose builds overlap the device's work, cycles on the world model, one sample a round.
    fn writes_cycle_starts_ahead(&self) -> bool {
        !self.sampling()
            && self.cfg.samples <= 1
            && self.proposer.writes_ahead()
            && self.evaluator.prebuilds()
    }

    /// The first candidates of the cycles that may follow the one ending (`c`, whose best is
    /// candidate `best_id`), written before its best is profiled: the world model refined as
    /// the cycle's end will refine it, but without the profile (which only re-weighs the
    /// follow-ups), then the first attempt on each new follow-up and on the policy's
    /// [`NEXT_CYCLE_RANKED_AHEAD`] best-ranked actions. Nothing here touches the run's state
    /// or store; where any step fails, fewer (or no) sources come back.
    fn next_cycle_sources_ahead(
        &self,
        state: &EngineState,
        c: &CycleState,
        best_id: i64,
        score: f64,
        round: u32,
    ) -> Vec<String> {
        let view = |id: Option<i64>| id.and_then(|i| self.attempt_view(i).ok().flatten());
        let Some(best) = view(Some(best_id)) else {
            return Vec::new();
        };
        let (base, last) = (view(c.base), view(c.last));
        let mut wm = state.wm.clone();
        let solution = solution_ref(
            best.source_id.clone(),
            score,
            best.outcome.latency_ms,
            round,
        );
        if wm.attach_solution(&c.node, solution).is_err() {
            return Vec::new();
        }
        let Ok(history) = self.cycle_history(c) else {
            return Vec::new();
        };
        let report = CycleReport {
            node_id: &c.node,
            round,
            attempts: c.consumed,
            base: base.as_ref(),
            best: Some(&best),
            last: last.as_ref(),
            history: &history,
            feedback: &[],
        };
        let nodes: Vec<NodeId> = match self.proposer.refine(&wm, &report) {
            Ok(Some(edit)) => wm
                .apply_edit(&edit, round)
                .map(|applied| applied.inserted.into_iter().map(|(id, _)| id).collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        self.first_attempts_ahead(&wm, nodes, round + 1)
    }

    /// The first cycle's likely first candidates, written before the seed (candidate `seed`)
    /// is evaluated: the initial tree with the seed attached to its root as if it passed
    /// (its score is not known yet; the ranking compares the root's children, each relative to
    /// it) and new actions proposed where the first cycle would propose them.
    fn first_cycle_sources_ahead(&self, seed: i64) -> Vec<String> {
        let Ok(mut wm) = self.proposer.init_world_model(&self.task) else {
            return Vec::new();
        };
        let Some(view) = self.attempt_view(seed).ok().flatten() else {
            return Vec::new();
        };
        let root = wm.root_id().clone();
        let solution = solution_ref(view.source_id, 1.0, None, 0);
        if wm.attach_solution(&root, solution).is_err() {
            return Vec::new();
        }
        if self.should_propose(&wm) {
            if let Ok(Some(edit)) = self.proposer.propose(&wm, 1, &[]) {
                let _ = wm.apply_edit(&edit, 1);
            }
        }
        self.first_attempts_ahead(&wm, Vec::new(), 1)
    }

    /// The sources of a cycle's first attempt (round `round`) on each of `nodes` and on the
    /// policy's [`NEXT_CYCLE_RANKED_AHEAD`] best-ranked actions of `wm` (a copy of the tree
    /// as the next cycle is expected to find it), leaving out sources already evaluated.
    fn first_attempts_ahead(
        &self,
        wm: &WorldModel,
        mut nodes: Vec<NodeId>,
        round: u32,
    ) -> Vec<String> {
        for ranked in self
            .policy
            .rank(wm)
            .into_iter()
            .filter(|r| r.eligible)
            .take(NEXT_CYCLE_RANKED_AHEAD)
        {
            if !nodes.contains(&ranked.node_id) {
                nodes.push(ranked.node_id);
            }
        }
        let Ok(known) = self.known_sources() else {
            return Vec::new();
        };
        let mut out: Vec<String> = Vec::new();
        for id in nodes {
            let Some(node) = wm.node(&id).filter(|n| n.is_open()) else {
                continue;
            };
            let action = node.action.clone().unwrap_or_default();
            let base = self
                .base_candidate(wm, &id)
                .and_then(|i| self.attempt_view(i).ok().flatten());
            let req = CodeRequest {
                step: if base.is_some() {
                    Step::BaseAction
                } else {
                    Step::SpecAction
                },
                round,
                attempt: 1,
                sample: 0,
                node,
                action: &action,
                base: base.as_ref(),
                last: None,
                cycle_best: None,
                history: &[],
                wm,
                known_sources: &known,
            };
            if let Ok(p) = self.proposer.write_code(&req) {
                let id = SourceId::of(&p.source).as_str().to_string();
                if !known.contains(&id) && !out.contains(&p.source) {
                    out.push(p.source);
                }
            }
        }
        out
    }

    fn end_cycle(&self, state: &mut EngineState, end: CycleEnd) -> Result<(), EngineError> {
        let Some(c) = state.cycle.take() else {
            return Ok(());
        };
        let round = state.rounds_used;
        if let Some((best_id, score)) = c
            .best
            .filter(|_| end == CycleEnd::Continuing && self.profiles_at_cycle_end())
        {
            // The next cycle's first candidate is written after the profile below (refine
            // reads it), and its build would then keep the device waiting: what it most
            // likely is compiles while the profile runs.
            if self.writes_cycle_starts_ahead() {
                for source in self.next_cycle_sources_ahead(state, &c, best_id, score, round) {
                    self.evaluator.prebuild_in_background(&source);
                }
            }
            self.profile_cycle_best(best_id)?;
        }
        let base = c.base.map(|i| self.attempt_view(i)).transpose()?.flatten();
        let last = c.last.map(|i| self.attempt_view(i)).transpose()?.flatten();
        if let Some((best_id, score)) = c.best {
            let best = self.attempt_view(best_id)?;
            let latency = best.as_ref().and_then(|b| b.outcome.latency_ms);
            let source_id = best
                .as_ref()
                .map(|b| b.source_id.clone())
                .unwrap_or_default();
            state
                .wm
                .attach_solution(&c.node, solution_ref(source_id, score, latency, round))?;
            let history = self.cycle_history(&c)?;
            self.edit_with_retries("refine", state, round, |wm, feedback| {
                let report = CycleReport {
                    node_id: &c.node,
                    round,
                    attempts: c.consumed,
                    base: base.as_ref(),
                    best: best.as_ref(),
                    last: last.as_ref(),
                    history: &history,
                    feedback,
                };
                self.proposer.refine(wm, &report)
            })?;
            // The continuation rule: a solved node always offers a next step.
            self.ensure_continuation(state, &c.node, round, "next-step refinement", 0.35)?;
            self.event(
                "cycle_end",
                json!({"cycle": c.index, "node": c.node.as_str(), "result": "solved",
                       "score": score, "candidate": best_id, "attempts": c.consumed}),
            )?;
        } else {
            state.wm.mark_too_hard(&c.node)?;
            let history = self.cycle_history(&c)?;
            self.edit_with_retries("too_hard", state, round, |wm, feedback| {
                let report = CycleReport {
                    node_id: &c.node,
                    round,
                    attempts: c.consumed,
                    base: base.as_ref(),
                    best: None,
                    last: last.as_ref(),
                    history: &history,
                    feedback,
                };
                self.proposer.too_hard(wm, &report)
            })?;
            self.event(
                "cycle_end",
                json!({"cycle": c.index, "node": c.node.as_str(), "result": "too_hard",
                       "attempts": c.consumed}),
            )?;
        }
        self.snapshot(state)?;
        Ok(())
    }

    fn event(&self, kind: &str, data: Value) -> Result<(), EngineError> {
        tracing::debug!(kind, %data, "engine event");
        self.store().append_event(kind, &data)?;
        Ok(())
    }

    /// Asks the proposer for an edit (`ask` gets the tree and the reasons earlier tries were
    /// refused) and applies it, up to [`EDIT_TRIES`] times: a reply that cannot be used (no
    /// JSON, JSON that does not parse, an edit with unknown ops or missing fields) and an edit
    /// that the world model rejects are both asked for again with the exact reason. A spent
    /// budget, an empty edit and a failed call end the step; the tree is then left as it is.
    fn edit_with_retries(
        &self,
        step: &str,
        state: &mut EngineState,
        round: u32,
        mut ask: impl FnMut(&WorldModel, &[String]) -> Result<Option<Edit>, ProposerError>,
    ) -> Result<(), EngineError> {
        let mut feedback: Vec<String> = Vec::new();
        for _ in 0..EDIT_TRIES {
            match ask(&state.wm, &feedback) {
                Ok(None) | Err(ProposerError::Budget(_)) => break,
                Ok(Some(edit)) => match state.wm.apply_edit(&edit, round) {
                    Ok(_) => break,
                    Err(errors) => {
                        let errors: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
                        self.event("edit_rejected", json!({"step": step, "errors": errors}))?;
                        feedback = errors
                            .iter()
                            .map(|e| format!("the edit was rejected: {e}"))
                            .collect();
                    }
                },
                Err(ProposerError::Unusable(why)) => {
                    self.event("proposer_error", json!({"step": step, "error": why}))?;
                    feedback = vec![format!("your previous reply could not be used: {why}")];
                }
                Err(e) => {
                    self.event(
                        "proposer_error",
                        json!({"step": step, "error": e.to_string()}),
                    )?;
                    break;
                }
            }
        }
        Ok(())
    }

    /// Re-checks the winner (falling back to the next best if it fails) and marks the run
    /// finished.
    fn finish(&self, state: EngineState, stop_reason: String) -> Result<RunOutcome, EngineError> {
        self.checkpoint(&state)?;
        let mut best = state.best.clone();
        let mut recheck = None;
        let mut confirm_pool: Vec<Ranked> = Vec::new();
        if self.cfg.recheck {
            let mut ranked: Vec<Ranked> = Vec::new();
            {
                let store = self.store();
                for e in store.evaluations()? {
                    if e.status == "passed" {
                        if let (Some(s), Some(c)) = (e.score, store.candidate(e.candidate_id)?) {
                            if c.kind != CandidateKind::Recheck {
                                ranked.push(Ranked {
                                    candidate_id: c.id,
                                    score: s,
                                    interval: self.summarize_stored(&e.result).score_interval,
                                });
                            }
                        }
                    }
                }
            }
            ranked.sort_by(|a, b| {
                b.score
                    .total_cmp(&a.score)
                    .then(a.candidate_id.cmp(&b.candidate_id))
            });
            // The search's best (a re-measure may have preferred it over a higher single
            // score) is re-checked first; the others follow by score.
            if let Some(b) = &state.best {
                if let Some(pos) = ranked.iter().position(|r| r.candidate_id == b.candidate_id) {
                    let first = ranked.remove(pos);
                    ranked.insert(
                        0,
                        Ranked {
                            score: b.score,
                            ..first
                        },
                    );
                }
            }
            confirm_pool = ranked.clone();
            let mut seen = BTreeSet::new();
            for Ranked {
                candidate_id: id,
                score,
                ..
            } in ranked.into_iter().take(8)
            {
                let Some(view) = self.attempt_view(id)? else {
                    continue;
                };
                if !seen.insert(view.source_id.clone()) {
                    continue;
                }
                let (rid, summary) = self.recheck_view(
                    &view,
                    view.knobs.clone(),
                    format!("re-check of candidate {id}"),
                    &state,
                )?;
                let passed = summary.passed;
                recheck = Some(json!({"candidate": id, "recheck_candidate": rid,
                                      "status": summary.status, "score": summary.score,
                                      "message": summary.message}));
                let row = self.store().candidate(id)?;
                if passed {
                    let prior = state.best.as_ref().filter(|b| b.candidate_id == id);
                    best = Some(BestRef {
                        candidate_id: id,
                        score,
                        node: row.as_ref().and_then(|r| r.node_id.clone()),
                        round: row.map(|r| r.round).unwrap_or(0),
                        rechecked_score: summary.score,
                        interval: prior.and_then(|b| b.interval),
                        scores: prior
                            .map(|b| b.scores.clone())
                            .unwrap_or_else(|| vec![score]),
                    });
                    break;
                }
                self.event(
                    "recheck_failed",
                    json!({"candidate": id, "status": summary.status,
                                                   "message": summary.message}),
                )?;
                best = None;
            }
        }
        let mut confirmation = None;
        if let (true, Some(b)) = (self.cfg.recheck, best.clone()) {
            let others: Vec<Ranked> = confirm_pool
                .iter()
                .copied()
                .filter(|r| r.candidate_id != b.candidate_id)
                .collect();
            confirmation =
                self.confirm(&b, &others, state.seed_candidate, self.cfg.confirm_rounds)?;
            if let Some(c) = confirmation.as_mut() {
                if c.winner != b.candidate_id {
                    // A runner-up confirmed faster: it must pass the re-check too.
                    best = self.accept_confirmed(c, &b, &state)?;
                }
            }
        }
        let mut seed_recheck_score = None;
        if let (true, Some(b), Some(seed)) = (self.cfg.recheck, &best, state.seed_candidate) {
            seed_recheck_score = if b.candidate_id == seed {
                b.rechecked_score
            } else {
                self.recheck_seed(seed, &state)?
            };
        }
        let outcome = RunOutcome {
            seed_recheck_score,
            stop_reason,
            rounds_used: state.rounds_used,
            cycles: state.cycles,
            passed: state.passed,
            failed: state.failed,
            seed_score: state.seed_score,
            best,
            recheck,
            confirmation,
        };
        let summary =
            serde_json::to_value(&outcome).map_err(|e| EngineError::State(e.to_string()))?;
        self.store().mark_finished(&summary)?;
        Ok(outcome)
    }
}

/// What a passing kernel (source `solution_id`, its score and latency) attaches to the node
/// it solved in `round`; the score is also its speedup over the baseline.
fn solution_ref(
    solution_id: String,
    score: f64,
    latency_ms: Option<f64>,
    round: u32,
) -> SolutionRef {
    SolutionRef {
        solution_id,
        parent_solution_id: None,
        score,
        speedup_vs_baseline: Some(score),
        latency_ms,
        round,
    }
}

/// How many rounds of a cycle the candidates that may come are written ahead for
/// ([`Engine::sources_ahead`]): two, since a compile took longer than one evaluation (on the
/// H100, nvcc 4 to 6 s against evaluations of about 3 s; docs/results/evaluation-speed).
const ROUNDS_WRITTEN_AHEAD: usize = 2;

/// How many of the policy's best-ranked actions a cycle's first attempts are written ahead on
/// (`first_attempts_ahead`), besides the follow-ups a cycle's end adds: the guess is made
/// without what the real choice reads (the seed's score, the cycle best's profile), so the
/// first few, not only the first.
const NEXT_CYCLE_RANKED_AHEAD: usize = 2;

/// Whether the search goes on after a cycle ends, or a budget of the session ended with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CycleEnd {
    Continuing,
    Last,
}

/// The world model's trace of one evaluation.
fn trace_of(o: &OutcomeSummary) -> Trace {
    Trace {
        status: o.status.clone(),
        latency_ms: o.latency_ms,
        reference_latency_ms: o.latency_ms.zip(o.speedup_vs_reference).map(|(l, s)| l * s),
        speedup: o.score,
        speed_of_light: o.speed_of_light,
        bottleneck: o.bottleneck.clone(),
    }
}

/// What the proposer is told about a lint rejection.
fn lint_summary(result: &Value) -> OutcomeSummary {
    let findings: Vec<String> = result["lint"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    OutcomeSummary {
        status: LINT_FAILED.into(),
        message: format!(
            "rejected by static checks before compiling:\n{}",
            findings
                .iter()
                .map(|f| format!("- {f}"))
                .collect::<Vec<_>>()
                .join("\n")
        ),
        ..OutcomeSummary::default()
    }
}

impl Engine<'_> {
    /// Re-measures the seed exactly as the winner was re-checked.
    fn recheck_seed(&self, seed: i64, state: &EngineState) -> Result<Option<f64>, EngineError> {
        let Some(view) = self.attempt_view(seed)? else {
            return Ok(None);
        };
        let note = format!("re-check of the seed (candidate {seed}) for comparison");
        let (_, summary) = self.recheck_view(&view, None, note, state)?;
        Ok(summary.score.filter(|_| summary.passed))
    }

    /// Records `view`'s source again as a `recheck` candidate and evaluates it for acceptance
    /// (a fresh process and seed, every workload); returns the new candidate and its outcome.
    fn recheck_view(
        &self,
        view: &AttemptView,
        knobs: Option<Value>,
        note: String,
        state: &EngineState,
    ) -> Result<(i64, OutcomeSummary), EngineError> {
        let parent = Some(view.candidate_id).filter(|id| *id > 0);
        // A session killed during the re-checks left this one in the store (with or without
        // its result): take it up rather than record and measure it again.
        let earlier = self.store().candidates()?.into_iter().find(|c| {
            c.kind == CandidateKind::Recheck
                && c.parent_candidate == parent
                && c.round == state.rounds_used
                && c.source_id.as_str() == view.source_id
        });
        let rid = match earlier {
            Some(c) => c.id,
            None => self.record_candidate(
                &Proposal {
                    source: view.source.clone(),
                    knobs,
                    note,
                },
                parent,
                None,
                state.rounds_used,
                state.cycles,
                0,
                0,
                CandidateKind::Recheck,
            )?,
        };
        let stored = self.store().evaluation_for(rid)?;
        let summary = match stored {
            Some(ev) => self.summarize_stored(&ev.result),
            None => self.evaluate_candidate(rid, &view.source, Purpose::Acceptance)?,
        };
        Ok((rid, summary))
    }
}

/// The action of every best-of-n request: the task, from its specification alone.
fn independent_sample() -> Action {
    Action {
        title: "Write a fast, correct kernel for the task".into(),
        description: "An independent sample: write the fastest correct kernel you can from the \
                      task's specification alone."
            .into(),
        ..Action::default()
    }
}

/// The original's two streaks (§2.5), counted per round: rounds without improving on the
/// cycle's best, and rounds whose best is no better than the base's.
fn count_streaks(c: &mut CycleState, improved: bool, wm: &WorldModel) {
    if improved {
        c.no_improve = 0;
    } else {
        c.no_improve += 1;
    }
    if let (Some((_, best)), Some(base)) = (c.best, cycle_base_score(c, wm)) {
        if base > 0.0 {
            c.no_improve_over_base = if best > base {
                0
            } else {
                c.no_improve_over_base + 1
            };
        }
    }
}

fn cycle_base_score(c: &CycleState, wm: &WorldModel) -> Option<f64> {
    let parent = wm.node(&c.node)?.parent.clone()?;
    wm.node(&parent)?.solution().map(|s| s.score)
}

enum RoundStop {
    Budget(String),
    Error(EngineError),
}

impl From<EngineError> for RoundStop {
    fn from(e: EngineError) -> Self {
        RoundStop::Error(e)
    }
}

impl From<StoreError> for RoundStop {
    fn from(e: StoreError) -> Self {
        RoundStop::Error(e.into())
    }
}
