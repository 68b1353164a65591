//! How the engine gets a candidate measured, without knowing the backend.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde_json::Value;

use ksearch_eval::{EvalRequest, EvalResult, Evaluator, TimingPreset, WorkloadSet, Yardstick};
use ksearch_task::Task;

use crate::proposer::OutcomeSummary;

/// What a search evaluation is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// The workloads a proposer may see, with the run's secret seed.
    Search,
    /// Every workload, held-out included, with a fresh seed, in a fresh process: the re-check a
    /// winner must pass before it is reported.
    Acceptance,
}

/// A finished evaluation: the summary the search reasons with, and the full result to store.
#[derive(Clone, Debug)]
pub struct Evaluation {
    pub summary: OutcomeSummary,
    pub result: Value,
}

/// An evaluator failure of ours (cannot start the harness, disk full…), as opposed to a
/// candidate failure, which is an [`Evaluation`] with a failing status.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct EvalFailure(pub String);

pub trait CandidateEvaluator: Sync {
    fn evaluate(&self, source: &str, purpose: Purpose) -> Result<Evaluation, EvalFailure>;

    /// `evaluation` of `source` (a search evaluation) with a profile of the kernel attached
    /// and its summary read again, when it is a passing new best worth profiling here (the
    /// evaluator keeps the best it was offered); `None` when nothing was profiled. The engine
    /// offers each search candidate's first evaluation, or, for a proposer that reads what
    /// bounds a kernel only when its cycle ends, each cycle's best.
    fn profile_new_best(&self, _source: &str, _evaluation: &Evaluation) -> Option<Evaluation> {
        None
    }

    /// Whether `prebuild` can overlap the device's work here (a GPU backend: builds run
    /// outside its timing lock); where it cannot, nothing is worth writing ahead for it.
    fn prebuilds(&self) -> bool {
        false
    }

    /// Compiles `source` ahead of an evaluation that may come (see `prebuilds`); returns
    /// whether it built. It never changes a result: an evaluation of the same source finds
    /// the artefact by content, and one that never comes leaves only a cached build.
    fn prebuild(&self, _source: &str) -> bool {
        false
    }

    /// [`Self::prebuild`] without waiting for it: the build goes on after this returns, and an
    /// evaluation of the same source waits for it rather than compiling again. The engine's
    /// round then ends with its evaluation, not with the slower of the builds it wrote ahead
    /// (one of which never comes). By default it builds before returning.
    fn prebuild_in_background(&self, source: &str) {
        let _ = self.prebuild(source);
    }

    /// Summarises a stored result (used when resuming and when building prompts).
    fn summarize(&self, result: &Value) -> OutcomeSummary;
}

/// The real evaluator: the harness, through `ksearch-eval`.
///
/// It measures the run's yardstick (the baseline and reference times every score divides) on
/// its first evaluation, so a resumed session measures its own, and again whenever an
/// evaluation's drift says the machine changed; that evaluation is then repeated against the
/// new yardstick. Every stored result carries the yardstick it was scored against.
pub struct HarnessEvaluator {
    evaluator: Arc<Evaluator>,
    /// Builds started by `prebuild_in_background` and not yet taken by an evaluation, by
    /// source file, in flight or finished (see [`WrittenAhead`]).
    building: Mutex<WrittenAhead>,
    /// The candidate files (canonical paths) whose build passed in this evaluator, written
    /// ahead or asked for. Evaluating one again asks for no build: the harness finds the
    /// artefact (its build directory is keyed by source) and builds it itself if it is gone.
    built: Mutex<HashSet<PathBuf>>,
    yardstick: std::sync::Mutex<Option<Yardstick>>,
    task: Task,
    backend: String,
    secret_seed: u64,
    /// The seed of every acceptance evaluation this evaluator makes, drawn fresh at the first
    /// (see [`HarnessEvaluator::acceptance_seed`]).
    acceptance_seed: Mutex<Option<u64>>,
    preset: TimingPreset,
    sources_dir: PathBuf,
    extension: String,
    signals: ProfileSignals,
    profiling: Mutex<NewBestProfiling>,
}

/// What the evaluator knows for profiling new bests (see [`HarnessEvaluator::profile_new_best`]).
#[derive(Debug, Default)]
struct NewBestProfiling {
    /// The best search score seen by this evaluator.
    best: Option<f64>,
    /// Why no profile is tried any more: the profiler said it cannot run here.
    unavailable: Option<String>,
}

/// Whether the search sees what bounds each kernel: its bottleneck class, the advice that goes
/// with it and its share of the speed of light, in prompts, the world model's signals, the
/// offline proposer's weights and `--stop-at-sol`. Off only in the ablation that measures what
/// they are worth (`--no-profile-signals`); scores, stores and `ksearch profile` are the same
/// either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProfileSignals {
    #[default]
    On,
    Off,
}

impl HarnessEvaluator {
    /// `sources_dir` receives the candidate files the harness compiles (the run store's
    /// `sources/` works: files there are named by content hash).
    pub fn new(
        evaluator: impl Into<Arc<Evaluator>>,
        task: Task,
        backend: &str,
        secret_seed: u64,
        preset: TimingPreset,
        sources_dir: PathBuf,
        extension: &str,
    ) -> Self {
        Self {
            evaluator: evaluator.into(),
            building: Mutex::new(WrittenAhead::default()),
            built: Mutex::new(HashSet::new()),
            yardstick: std::sync::Mutex::new(None),
            task,
            backend: backend.to_string(),
            secret_seed,
            acceptance_seed: Mutex::new(None),
            preset,
            sources_dir,
            extension: extension.to_string(),
            signals: ProfileSignals::On,
            profiling: Mutex::new(NewBestProfiling::default()),
        }
    }

    /// Summaries with or without what bounds each kernel (see [`ProfileSignals`]).
    pub fn with_profile_signals(mut self, signals: ProfileSignals) -> Self {
        self.signals = signals;
        self
    }

    fn write_source(&self, source: &str) -> Result<PathBuf, EvalFailure> {
        let name = format!(
            "{}.{}",
            ksearch_store::SourceId::of(source).as_str(),
            self.extension
        );
        let path = self.sources_dir.join(name);
        if !path.is_file() {
            std::fs::create_dir_all(&self.sources_dir)
                .map_err(|e| EvalFailure(format!("{}: {e}", self.sources_dir.display())))?;
            let tmp = path.with_extension(format!("{}.tmp{}", self.extension, std::process::id()));
            std::fs::write(&tmp, source)
                .and_then(|_| std::fs::rename(&tmp, &path))
                .map_err(|e| EvalFailure(format!("{}: {e}", path.display())))?;
        }
        Ok(path)
    }
}

impl HarnessEvaluator {
    /// The build request of `source`, written to the sources directory; None where nothing
    /// is built ahead (a cpu backend) or the request cannot be made.
    fn prebuild_request(&self, source: &str) -> Option<EvalRequest> {
        if !self.prebuilds() {
            return None;
        }
        let path = self.write_source(source).ok()?;
        EvalRequest::from_task(
            &self.task,
            &self.backend,
            &path,
            WorkloadSet::Search,
            self.secret_seed,
            self.preset,
        )
        .ok()
    }

    /// Builds started in the background that no evaluation, prebuild or drop has waited for
    /// yet (finished or not), by the canonical path of their source.
    pub fn pending_builds(&self) -> Vec<PathBuf> {
        let building = self.building.lock().unwrap_or_else(|p| p.into_inner());
        building.builds.keys().cloned().collect()
    }

    /// Takes the background build of the source at `path` (a request's canonical candidate
    /// path), waiting for it if it is still running: its result, or None where none was
    /// started, it was taken already, or the harness could not be asked.
    fn take_build_written_ahead(&self, path: &std::path::Path) -> Option<BuiltAhead> {
        let handle = self
            .building
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .builds
            .remove(path);
        handle.and_then(|(_, h)| h.join().ok().flatten())
    }

    /// Whether a build of the candidate file at `path` (canonical) passed in this evaluator.
    fn built_before(&self, path: &std::path::Path) -> bool {
        self.built
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(path)
    }

    /// The result of a build of `source` written ahead (`prebuild_in_background`) that no
    /// evaluation has taken yet, waiting for it if it is still running; None where there is
    /// none. Taken: a second call answers None.
    pub fn build_written_ahead(&self, source: &str) -> Option<EvalResult> {
        let req = self.prebuild_request(source)?;
        self.take_build_written_ahead(&req.candidate.path)
            .map(|b| b.result)
    }
}

/// A build written ahead, finished: its result, when it started and how long it took (what an
/// evaluation that waited for it records, to tell a late start from a slow compiler).
struct BuiltAhead {
    result: EvalResult,
    started: std::time::Instant,
    seconds: f64,
}

/// The builds written ahead (`prebuild_in_background`), by source file: each with the order it
/// was started in and its thread, whose answer is the build's result. A finished build is kept
/// for the evaluation of its source, which then asks the harness nothing; of the sources a
/// round writes ahead most never come, so finished builds beyond [`Self::KEPT`] are let go of,
/// the oldest first.
#[derive(Default)]
struct WrittenAhead {
    builds: BTreeMap<PathBuf, (u64, JoinHandle<Option<BuiltAhead>>)>,
    started: u64,
}

impl WrittenAhead {
    /// Room for two rounds' guesses (up to six each) and the next cycle's first attempts.
    const KEPT: usize = 16;

    fn forget_old_finished(&mut self) {
        let mut finished: Vec<(u64, PathBuf)> = self
            .builds
            .iter()
            .filter(|(_, (_, h))| h.is_finished())
            .map(|(p, (order, _))| (*order, p.clone()))
            .collect();
        if finished.len() <= Self::KEPT {
            return;
        }
        finished.sort();
        for (_, p) in &finished[..finished.len() - Self::KEPT] {
            self.builds.remove(p);
        }
    }
}

fn built(evaluator: &Evaluator, req: &EvalRequest) -> Option<BuiltAhead> {
    let started = std::time::Instant::now();
    match evaluator.build(req) {
        Ok(result) => Some(BuiltAhead {
            result,
            started,
            seconds: started.elapsed().as_secs_f64(),
        }),
        Err(e) => {
            tracing::debug!("prebuild of a candidate that may come: {e}");
            None
        }
    }
}

fn passed(r: &EvalResult) -> bool {
    r.status == ksearch_eval::Status::Passed
}

/// A run never ends with a compiler of its own still running: the builds written ahead that
/// no evaluation waited for are waited for here.
impl Drop for HarnessEvaluator {
    fn drop(&mut self) {
        let building = std::mem::take(self.building.get_mut().unwrap_or_else(|p| p.into_inner()));
        for (_, (_, h)) in building.builds {
            let _ = h.join();
        }
    }
}

impl HarnessEvaluator {
    fn has_yardstick(&self) -> bool {
        self.yardstick
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// The run's yardstick, measured now if there is none yet (`req` names the workloads).
    fn current_yardstick(&self, req: &EvalRequest) -> Result<Yardstick, EvalFailure> {
        let mut slot = self.yardstick.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(y) = slot.as_ref() {
            return Ok(y.clone());
        }
        let mut yreq = req.clone();
        yreq.workload_set = WorkloadSet::Search;
        let y = self
            .evaluator
            .yardstick(&yreq)
            .map_err(|e| EvalFailure(e.to_string()))?;
        tracing::info!(
            seconds = y.seconds,
            spread = y.spread(),
            "yardstick measured"
        );
        *slot = Some(y.clone());
        Ok(y)
    }

    /// Evaluates `req` against the run's yardstick (Evaluator::evaluate_steady, which may
    /// measure a new one: it replaces the run's).
    fn evaluate_against_yardstick(
        &self,
        req: &mut EvalRequest,
    ) -> Result<(EvalResult, Option<Yardstick>), EvalFailure> {
        let mut yardstick = self.current_yardstick(req)?;
        let before = yardstick.clone();
        let result = self
            .evaluator
            .evaluate_steady(req, &mut yardstick)
            .map_err(|e| EvalFailure(e.to_string()))?;
        if yardstick != before {
            *self.yardstick.lock().unwrap_or_else(|p| p.into_inner()) = Some(yardstick.clone());
        }
        Ok((result, Some(yardstick)))
    }
}

impl HarnessEvaluator {
    /// Whether this evaluator profiles the new bests of its search (`new_best_profile`): a GPU
    /// run that sees profile signals, until the profiler says it cannot run here.
    fn profiles_new_bests(&self) -> bool {
        ksearch_eval::is_gpu_backend(&self.backend)
            && self.signals == ProfileSignals::On
            && self
                .profiling
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .unavailable
                .is_none()
    }

    /// Profiles `result`'s kernel when it is a new best of a GPU run that sees profile
    /// signals, and returns the harness's `profile` section for it (with `spent_seconds`, the
    /// profile's wall time, which `ksearch show` accounts): attached to the result, it makes
    /// the search's summaries classify that workload by the profiler's counters rather than by
    /// its time alone.
    ///
    /// Profiling is slow (a profiler replays each launch once per pass of its metrics), so only
    /// what the search builds on is profiled, a new best, and only on its shown workload
    /// furthest from the speed of light, where the advice matters most. Once the profiler says
    /// it cannot run here (none installed, counters not permitted), no profile is tried again;
    /// a failed profile leaves the result as it was measured, with the failure in its section.
    fn new_best_profile(&self, source: &std::path::Path, result: &EvalResult) -> Option<Value> {
        if !self.profiles_new_bests() {
            // No hardware counters of a cpu kernel (the harness's profile op says so), none
            // asked for, or none to be had here.
            return None;
        }
        let furthest = self
            .profiling
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .workload_to_profile(&self.task, &self.backend, self.signals, result)?;
        let req = EvalRequest::from_task(
            &self.task,
            &self.backend,
            source,
            WorkloadSet::Search,
            self.secret_seed,
            self.preset,
        );
        let mut req = match req {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("no profile of the new best: {e}");
                return None;
            }
        };
        req.workloads.retain(|w| w.name == furthest);
        req.timeout = Evaluator::profile_timeout(req.workloads.len());
        let started = std::time::Instant::now();
        let profiled = self.evaluator.profile(&req);
        let spent = started.elapsed().as_secs_f64();
        // The harness's section says whether a profiler can run here at all; a failure of
        // this profile (the op's or the evaluator's) is this candidate's, and is recorded.
        let (mut section, from_harness) = match profiled {
            Ok(p) => match p.extra.get("profile") {
                Some(section) => (section.clone(), true),
                None => (
                    serde_json::json!({"available": false,
                        "detail": format!("the profile op ended {}: {}", p.status,
                                          p.message.lines().next().unwrap_or(""))}),
                    false,
                ),
            },
            Err(e) => (
                serde_json::json!({"available": false, "detail": e.to_string()}),
                false,
            ),
        };
        section["spent_seconds"] = serde_json::json!(spent);
        let available = section["available"].as_bool() == Some(true);
        tracing::info!(
            workload = furthest.as_str(),
            seconds = spent,
            available,
            "new best profiled"
        );
        if from_harness && !available {
            let why = section["detail"].as_str().unwrap_or("").to_string();
            self.profiling
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .unavailable = Some(why);
        }
        Some(section)
    }
}

impl HarnessEvaluator {
    /// The secret seed of this evaluator's acceptance evaluations (the winner's re-check, the
    /// seed's, a runner-up's): fresh, unlike the search's, so a winner is checked on inputs no
    /// candidate was searched on, and drawn once, so they all see the same input sets. The
    /// judge then draws those sets and computes their reference outputs once, and the seed's
    /// re-check, the baseline of "x faster than the seed", runs on the winner's inputs.
    fn acceptance_seed(&self) -> Result<u64, EvalFailure> {
        let mut seed = self
            .acceptance_seed
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(s) = *seed {
            return Ok(s);
        }
        let fresh = ksearch_eval::fresh_secret_seed().map_err(|e| EvalFailure(e.to_string()))?;
        *seed = Some(fresh);
        Ok(fresh)
    }
}

impl NewBestProfiling {
    /// The shown workload to profile `result` (on `backend`, a GPU's) on, where it is a passing
    /// new best of a run that sees profile signals and a profiler may run here: the one
    /// furthest from its speed of light. A passing score above the best so far becomes the
    /// best, profiled or not.
    fn workload_to_profile(
        &mut self,
        task: &Task,
        backend: &str,
        signals: ProfileSignals,
        result: &EvalResult,
    ) -> Option<String> {
        if signals == ProfileSignals::Off || !result.passed() {
            return None;
        }
        let score = result.score.filter(|s| s.is_finite())?;
        if self.best.is_some_and(|b| score <= b) {
            return None;
        }
        self.best = Some(score);
        if self.unavailable.is_some() {
            return None;
        }
        let profile = crate::report::profile::profile_evaluation(task, backend, result);
        crate::report::profile::furthest_from_light(
            profile.workloads.iter().filter(|w| !w.held_out),
        )
        .map(|w| w.workload.clone())
    }
}

impl CandidateEvaluator for HarnessEvaluator {
    /// A cpu build waits for the timing lock (a compiler shares the cores with the kernel
    /// being timed), so only a GPU backend's build overlaps an evaluation.
    fn prebuilds(&self) -> bool {
        ksearch_eval::is_gpu_backend(&self.backend)
    }

    fn prebuild(&self, source: &str) -> bool {
        let Some(req) = self.prebuild_request(source) else {
            return false;
        };
        let _ = self.take_build_written_ahead(&req.candidate.path);
        built(&self.evaluator, &req).is_some_and(|b| passed(&b.result))
    }

    fn prebuild_in_background(&self, source: &str) {
        let Some(req) = self.prebuild_request(source) else {
            return;
        };
        let mut building = self.building.lock().unwrap_or_else(|p| p.into_inner());
        building.forget_old_finished();
        if building.builds.contains_key(&req.candidate.path) {
            return;
        }
        let evaluator = Arc::clone(&self.evaluator);
        let path = req.candidate.path.clone();
        let spawned = std::thread::Builder::new()
            .name("ksearch-prebuild".into())
            .spawn(move || built(&evaluator, &req));
        match spawned {
            Ok(h) => {
                building.started += 1;
                let order = building.started;
                building.builds.insert(path, (order, h));
            }
            Err(e) => tracing::debug!("no thread for a prebuild: {e}"),
        }
    }

    fn evaluate(&self, source: &str, purpose: Purpose) -> Result<Evaluation, EvalFailure> {
        let path = self.write_source(source)?;
        let (set, seed, preset) = match purpose {
            Purpose::Search => (WorkloadSet::Search, self.secret_seed, self.preset),
            Purpose::Acceptance => (
                WorkloadSet::Acceptance,
                self.acceptance_seed()?,
                TimingPreset::Standard,
            ),
        };
        let mut req = EvalRequest::from_task(&self.task, &self.backend, &path, set, seed, preset)
            .map_err(|e| EvalFailure(e.to_string()))?;
        req.profiles_ahead = purpose == Purpose::Search && self.profiles_new_bests();
        // The run's first evaluation measures its yardstick, which holds the device for many
        // seconds: where builds overlap the device's work, this candidate compiles meanwhile
        // (written ahead now, taken below) instead of before it.
        // Its failure is reported after the build's: a candidate that does not build says so.
        let mut yardstick_failure = None;
        if purpose == Purpose::Search && self.prebuilds() && !self.has_yardstick() {
            self.prebuild_in_background(source);
            yardstick_failure = self.current_yardstick(&req).err();
        }
        // A build of this source written ahead is this build: waited for if still running,
        // and its result taken. Builds are keyed by the request's candidate path (canonical),
        // not by the path written above, which is relative when the run store is.
        let waiting = std::time::Instant::now();
        let ahead = self.take_build_written_ahead(&req.candidate.path);
        let waited = waiting.elapsed().as_secs_f64();
        // When the build written ahead started (seconds before this evaluation asked for it)
        // and how long the compiler took: a wait for it is one or the other.
        let ahead_times = ahead.as_ref().map(|b| {
            serde_json::json!({"started_before_seconds":
                waiting.saturating_duration_since(b.started).as_secs_f64(),
                "build_seconds": b.seconds})
        });
        if purpose == Purpose::Acceptance {
            // The knowledge packs' assertions add adversarial workloads (large logits, ragged
            // tails, extreme decays) that a winner must also pass; they are never searched on.
            match ksearch_knowledge::Packs::builtin() {
                Ok(packs) => {
                    let extra = packs.acceptance_workloads(&self.task, &self.backend);
                    for why in &extra.skipped {
                        tracing::warn!("assertion workload left out: {why}");
                    }
                    req.workloads.extend(extra.workloads);
                }
                Err(e) => tracing::warn!("no assertion workloads (knowledge packs: {e})"),
            }
        }
        // Compile first: on a GPU outside the device's timing lock, so while one sample of a
        // round is timed the others compile; on the cpu inside it, since a compiler would
        // share the cores with the timed kernel (Evaluator::build). The evaluation reuses the
        // artefact (the build directory is keyed by source). A candidate that does not build
        // ends here. A search evaluation whose build written ahead passed takes that build's
        // result as its own: the request was the same (`prebuild_request`), so asking the
        // harness again would only find the artefact. One that failed or was not asked is
        // built again, which also covers a build that lost to a busy machine. A source built
        // before by this evaluator (a re-measure, the confirmation, the re-check) asks for no
        // build at all: the evaluation finds its artefact.
        let building = std::time::Instant::now();
        let written_ahead =
            purpose == Purpose::Search && ahead.as_ref().is_some_and(|b| passed(&b.result));
        let built_before = !written_ahead && self.built_before(&req.candidate.path);
        let built = match ahead {
            Some(b) if written_ahead => Some(b.result),
            _ if built_before => None,
            _ => Some(
                self.evaluator
                    .build(&req)
                    .map_err(|e| EvalFailure(e.to_string()))?,
            ),
        };
        let build_seconds = building.elapsed().as_secs_f64();
        if built.as_ref().is_some_and(passed) {
            self.built
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(req.candidate.path.clone());
        }
        let (result, yardstick) = if let Some(failed) = built.filter(|b| {
            matches!(
                b.status.as_str(),
                "build_error" | "static_check_failed" | "task_error" | "timeout"
            )
        }) {
            (failed, None)
        } else if let Some(failure) = yardstick_failure {
            return Err(failure);
        } else {
            self.evaluate_against_yardstick(&mut req)?
        };
        let mut value = serde_json::to_value(&result).map_err(|e| EvalFailure(e.to_string()))?;
        if let Some(y) = yardstick {
            value["yardstick"] = y.to_value();
        }
        // The search's own compile before the evaluation, which no harness result times
        // (crate::accounting).
        value["build_request"] = serde_json::json!({"seconds": build_seconds,
            "waited_seconds": waited, "written_ahead": written_ahead, "ahead": ahead_times,
            "built_before": built_before});
        Ok(Evaluation {
            summary: summarize_result(&result, &self.task, &self.backend, self.signals),
            result: value,
        })
    }

    fn profile_new_best(&self, source: &str, evaluation: &Evaluation) -> Option<Evaluation> {
        let mut result = serde_json::from_value::<EvalResult>(evaluation.result.clone()).ok()?;
        let path = match self.write_source(source) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("no profile of the new best: {e}");
                return None;
            }
        };
        let section = self.new_best_profile(&path, &result)?;
        let mut value = evaluation.result.clone();
        value["profile"] = section.clone();
        result.extra.insert("profile".into(), section);
        Some(Evaluation {
            summary: summarize_result(&result, &self.task, &self.backend, self.signals),
            result: value,
        })
    }

    fn summarize(&self, result: &Value) -> OutcomeSummary {
        match serde_json::from_value::<EvalResult>(result.clone()) {
            Ok(r) => summarize_result(&r, &self.task, &self.backend, self.signals),
            Err(e) => OutcomeSummary {
                status: "unreadable".into(),
                message: format!("stored result does not parse: {e}"),
                ..OutcomeSummary::default()
            },
        }
    }
}

/// The search's view of a harness result of a kernel for `task` on `backend`: status,
/// score, per-workload lines with each timed workload's bottleneck class, and what bounds the
/// kernel where it is furthest from the speed of light (crate::report::profile); without the
/// classes, the advice and the speed of light when `signals` is off.
pub fn summarize_result(
    r: &EvalResult,
    task: &ksearch_task::Task,
    backend: &str,
    signals: ProfileSignals,
) -> OutcomeSummary {
    let passed = r.passed();
    let profile = crate::report::profile::profile_evaluation(task, backend, r);
    let diagnosed: &[crate::report::profile::WorkloadProfile] = match signals {
        ProfileSignals::On => profile.workloads.as_slice(),
        ProfileSignals::Off => &[],
    };
    let class_of = |name: &str| {
        diagnosed
            .iter()
            .find(|w| w.workload == name)
            .map(|w| &w.diagnosis)
    };
    let furthest = crate::report::profile::furthest_from_light(diagnosed.iter().filter(|_| passed));
    let bottleneck_class = furthest.map(|w| w.diagnosis.class);
    let bottleneck = furthest.and_then(|w| {
        let first = w.diagnosis.advice.first()?;
        Some(format!(
            "{} ({}): {first}",
            w.workload,
            w.diagnosis.class.as_str()
        ))
    });
    let medians: Vec<f64> = r
        .workloads
        .iter()
        .filter_map(|w| w.candidate_median_ns)
        .filter(|v| *v > 0.0)
        .collect();
    let geomean = |xs: &[f64]| {
        (!xs.is_empty()).then(|| (xs.iter().map(|x| x.ln()).sum::<f64>() / xs.len() as f64).exp())
    };
    let vs_ref: Vec<f64> = r
        .workloads
        .iter()
        .filter_map(|w| w.speedup_vs_reference)
        .filter(|v| *v > 0.0)
        .collect();
    let mut message = String::new();
    if let Some(v) = &r.violation {
        message.push_str(&format!("{}: {}", v.class.as_str(), v.message));
    }
    if !r.message.is_empty() {
        if !message.is_empty() {
            message.push('\n');
        }
        message.push_str(&r.message);
    }
    if !passed {
        if let Some(b) = &r.build {
            if !b.log.is_empty() {
                let tail: String = b
                    .log
                    .chars()
                    .rev()
                    .take(1500)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                message.push_str("\nbuild log:\n");
                message.push_str(&tail);
            }
        }
    }
    let workloads = r
        .workloads
        .iter()
        .map(|w| {
            let mut line = w.name.clone();
            if let Some(ns) = w.candidate_median_ns {
                line.push_str(&format!(": {:.3} ms", ns / 1e6));
            }
            if let Some(s) = w.speedup_vs_baseline {
                line.push_str(&format!(", {s:.2}x vs baseline"));
            }
            if let Some(f) = w.roofline_fraction {
                line.push_str(&format!(", {:.1}% of roofline", 100.0 * f));
            }
            if let Some(d) = class_of(&w.name) {
                line.push_str(&format!(
                    ", {} (memory {:.0}%, compute {:.0}%)",
                    d.class.as_str(),
                    100.0 * d.memory,
                    100.0 * d.compute
                ));
            }
            if w.correct == Some(false) {
                line.push_str(" (incorrect)");
            }
            line
        })
        .collect();
    OutcomeSummary {
        status: r.status.as_str().to_string(),
        passed,
        score: if passed { r.score } else { None },
        score_interval: if passed { r.score_interval } else { None },
        latency_ms: geomean(&medians).map(|ns| ns / 1e6),
        speedup_vs_reference: geomean(&vs_ref),
        message,
        workloads,
        bottleneck,
        bottleneck_class,
        speed_of_light: furthest.map(|w| w.diagnosis.speed_of_light),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ksearch_eval::bottleneck::Bottleneck;

    fn softmax() -> ksearch_task::Task {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tasks/softmax");
        ksearch_task::load_task(&dir).unwrap()
    }

    /// A result on softmax's three search workloads as the harness writes it, on an 18.2 GB/s,
    /// 302 GFLOP/s machine: the first workload at 0.9 of the bandwidth roof (64,000 elements
    /// of 8 bytes in 31.2 µs), the others far from it; a held-out workload checked, not timed.
    fn result(passed: bool) -> EvalResult {
        serde_json::from_value(serde_json::json!({
            "nonce": "n",
            "status": if passed { "passed" } else { "incorrect" },
            "message": "",
            "score": 1.5,
            "environment": {"mem_bandwidth_gbs": 18.21, "peak_gflops": 302.5},
            "workloads": [
                {"name": "r64c1000", "candidate_median_ns": 31_240.0, "speedup_vs_baseline": 3.0},
                {"name": "r512c4096", "candidate_median_ns": 4.0e6, "speedup_vs_baseline": 1.2},
                {"name": "r2048c1024", "candidate_median_ns": 2.0e6, "speedup_vs_baseline": 1.4},
                {"name": "r333c5000"}
            ]
        }))
        .unwrap()
    }

    /// Finished builds nobody took are kept for their evaluation up to `KEPT`, then let go of
    /// oldest first; a build still running is never let go of.
    #[test]
    fn finished_builds_written_ahead_beyond_the_kept_ones_are_let_go_of_oldest_first() {
        let mut ahead = WrittenAhead::default();
        let (hold, release) = std::sync::mpsc::channel::<()>();
        let running = std::thread::spawn(move || {
            let _ = release.recv();
            None
        });
        ahead.started += 1;
        ahead
            .builds
            .insert(PathBuf::from("running"), (ahead.started, running));
        let total = WrittenAhead::KEPT + 3;
        for i in 0..total {
            let h = std::thread::spawn(|| {
                Some(BuiltAhead {
                    result: result(true),
                    started: std::time::Instant::now(),
                    seconds: 0.0,
                })
            });
            while !h.is_finished() {
                std::thread::yield_now();
            }
            ahead.started += 1;
            ahead
                .builds
                .insert(PathBuf::from(format!("b{i:02}")), (ahead.started, h));
        }
        ahead.forget_old_finished();
        let kept: Vec<String> = ahead
            .builds
            .keys()
            .map(|p| p.display().to_string())
            .collect();
        let mut want: Vec<String> = (total - WrittenAhead::KEPT..total)
            .map(|i| format!("b{i:02}"))
            .collect();
        want.push("running".into());
        assert_eq!(kept, want);
        drop(hold);
    }

    #[test]
    fn a_summary_names_each_workloads_bottleneck_and_the_furthest_from_the_speed_of_light() {
        let s = summarize_result(&result(true), &softmax(), "cpu", ProfileSignals::On);
        assert!(
            s.workloads[0].ends_with("memory-bound (memory 90%, compute 3%)"),
            "{:?}",
            s.workloads
        );
        assert!(
            s.workloads[1].contains("latency-bound (memory 23%"),
            "{:?}",
            s.workloads
        );
        assert_eq!(
            s.workloads[3], "r333c5000",
            "an untimed workload has no class"
        );
        let b = s.bottleneck.unwrap();
        assert!(
            b.starts_with("r512c4096 (latency-bound): 23% of the speed of light"),
            "{b}"
        );
        assert_eq!(s.bottleneck_class, Some(Bottleneck::Latency));
        // A failed kernel gets no bottleneck: there is nothing to speed up yet.
        let failed = summarize_result(&result(false), &softmax(), "cpu", ProfileSignals::On);
        assert_eq!((failed.bottleneck, failed.speed_of_light), (None, None));
        assert_eq!(failed.bottleneck_class, None);
        // The slowest share is what --stop-at-sol compares.
        let sol = s.speed_of_light.unwrap();
        assert!(
            (sol - 8.0 * 512.0 * 4096.0 / 18.21e9 * 1e9 / 4.0e6).abs() < 1e-9,
            "{sol}"
        );
    }

    #[test]
    fn only_a_passing_new_best_with_signals_is_profiled_on_its_furthest_workload() {
        // softmax has a cpu model only; the choice does not depend on the backend.
        let task = softmax();
        let mut p = NewBestProfiling::default();
        let on = ProfileSignals::On;
        // The ablation sees no signals; a failing kernel is no best.
        let off = ProfileSignals::Off;
        assert_eq!(
            p.workload_to_profile(&task, "cpu", off, &result(true)),
            None
        );
        assert_eq!(
            p.workload_to_profile(&task, "cpu", on, &result(false)),
            None
        );
        assert_eq!(p.best, None);
        // The first pass is a new best, profiled where it is furthest from the speed of light.
        assert_eq!(
            p.workload_to_profile(&task, "cpu", on, &result(true))
                .as_deref(),
            Some("r512c4096")
        );
        assert_eq!(p.best, Some(1.5));
        // The same score again, or a lower one, is no new best.
        assert_eq!(p.workload_to_profile(&task, "cpu", on, &result(true)), None);
        let mut worse = result(true);
        worse.score = Some(1.2);
        assert_eq!(p.workload_to_profile(&task, "cpu", on, &worse), None);
        let mut better = result(true);
        better.score = Some(1.8);
        assert!(p.workload_to_profile(&task, "cpu", on, &better).is_some());
        // Once the profiler said it cannot run here, new bests are only recorded.
        p.unavailable = Some("Nsight Compute (ncu) is not installed".into());
        better.score = Some(2.0);
        assert_eq!(p.workload_to_profile(&task, "cpu", on, &better), None);
        assert_eq!(p.best, Some(2.0));
    }

    #[test]
    fn without_profile_signals_a_summary_keeps_the_times_and_drops_what_bounds_the_kernel() {
        let on = summarize_result(&result(true), &softmax(), "cpu", ProfileSignals::On);
        let off = summarize_result(&result(true), &softmax(), "cpu", ProfileSignals::Off);
        assert_eq!((off.bottleneck, off.bottleneck_class), (None, None));
        assert_eq!(off.speed_of_light, None);
        assert_eq!((off.score, off.latency_ms), (on.score, on.latency_ms));
        assert_eq!(off.workloads.len(), on.workloads.len());
        for (off, on) in off.workloads.iter().zip(&on.workloads) {
            assert!(
                on.starts_with(off.as_str()),
                "{off:?} is not a prefix of {on:?}"
            );
            assert!(!off.contains("-bound"), "{off:?}");
        }
        assert!(
            off.workloads[0].contains("ms, 3.00x vs baseline"),
            "{:?}",
            off.workloads
        );
    }
}
