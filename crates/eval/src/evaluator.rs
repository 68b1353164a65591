//! The [`Evaluator`]: turns an [`EvalRequest`] into an [`EvalResult`] by running the harness.

use crate::error::{EvalError, Result};
use crate::harness::{self, Invocation, Outcome};
use crate::interrupt::Interrupt;
use crate::protocol::{
    parse_result_line, EvalResult, Status, Violation, ViolationClass, PROTOCOL_VERSION,
};
use crate::request::{fresh_nonce, EvalRequest};
use crate::yardstick::{RepeatYield, Yardstick};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How the evaluator finds its interpreter and harness, and how it supervises them.
#[derive(Debug, Clone)]
pub struct EvaluatorConfig {
    /// Interpreter to run the harness with; `None`: the one [`crate::harness_env::resolve_for`]
    /// chooses for `backend`.
    pub python: Option<PathBuf>,
    /// The backend the evaluations are for, when known: an active interpreter is chosen only
    /// if it imports that backend's framework. `None`: any backend (numpy alone).
    pub backend: Option<String>,
    /// Directory containing the `ksearch_harness` package; `None`: the shipped harness.
    pub harness_dir: Option<PathBuf>,
    /// Where build directories go; `None`: a temporary directory removed with the evaluator
    /// (or, if its process is killed, by the next evaluator: [`crate::scratch_dir`]).
    pub work_dir: Option<PathBuf>,
    /// Time the harness gets beyond the request's own timeout before its process group is
    /// killed: the harness enforces `timeout_s` itself and should report first.
    pub kill_grace: Duration,
    /// Bytes of harness stdout/stderr kept in a result.
    pub tail_bytes: usize,
    /// Extra `KSEARCH_HARNESS_*` knobs for every harness process.
    pub knobs: Vec<(String, String)>,
    /// Check at start-up that the interpreter can import the harness, so a broken set-up is
    /// one clear error instead of a failure on every candidate.
    pub verify_harness: bool,
    /// How the process that runs candidate code is confined (docs/security.md).
    pub sandbox: SandboxMode,
    /// Stops the harness in flight (its process group killed) when requested; every call
    /// then fails with [`EvalError::Interrupted`].
    pub interrupt: Option<Interrupt>,
    /// Whether `evaluate`, `yardstick` and `profile` go to a persistent judge per device (crate::judge)
    /// instead of a fresh harness process each; default: on unless
    /// `KSEARCH_PERSISTENT_JUDGE=0`.
    pub persistent_judge: bool,
    /// How many persistent judges of one device evaluate side by side ([`crate::judge::lanes`]).
    /// One: a request holds the device from its start to its result, as always. More: their
    /// untimed work overlaps and the harness's device gate (`KSEARCH_HARNESS_DEVICE_GATE`)
    /// gives each one's timed work the device alone. Used on GPU backends with a persistent
    /// judge only; the cpu backend times on the cores a second judge would use.
    pub lanes: usize,
}

/// How strictly the harness confines the process that runs candidate code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SandboxMode {
    /// Every layer this machine allows; each result says which were active.
    #[default]
    BestEffort,
    /// Refuse to evaluate (a set-up error) unless every layer is available.
    Require,
}

impl SandboxMode {
    pub const NAMES: [&'static str; 2] = ["best-effort", "require"];

    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::BestEffort => "best-effort",
            SandboxMode::Require => "require",
        }
    }
}

impl std::str::FromStr for SandboxMode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "best-effort" => Ok(SandboxMode::BestEffort),
            "require" => Ok(SandboxMode::Require),
            other => Err(format!(
                "unknown sandbox mode `{other}` (expected one of: {})",
                SandboxMode::NAMES.join(", ")
            )),
        }
    }
}

impl std::fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the harness remembers tasks whose sanity check passed (a `KSEARCH_HARNESS_*` knob).
const SANITY_CACHE: &str = "KSEARCH_HARNESS_SANITY_CACHE";
/// Where the harness keeps what it measured of this machine (bandwidth and peak, for the floors
/// and the fraction of peak), so every evaluation uses the same numbers (machine.py).
const MACHINE_CACHE: &str = "KSEARCH_HARNESS_MACHINE_CACHE";

/// The sanity-cache knob to add: the task sanity check judges the task, not the candidate, and
/// the harness remembers a pass in this directory (harness/ksearch_harness/sanity_cache.py).
/// None when the caller chose already (the variable set in the environment, empty meaning off,
/// or a knob). The path is made absolute: the harness runs in its work directory, where a
/// relative cache directory would be a new, empty one every time.
fn sanity_cache_knob(
    knobs: &[(String, String)],
    in_environment: bool,
    cache_dir: &Path,
) -> Option<(String, String)> {
    cache_knob(
        SANITY_CACHE,
        "task-sanity",
        knobs,
        in_environment,
        cache_dir,
    )
}

/// A `KSEARCH_HARNESS_*` directory knob under ksearch's cache, unless the caller chose one.
fn cache_knob(
    name: &str,
    subdir: &str,
    knobs: &[(String, String)],
    in_environment: bool,
    cache_dir: &Path,
) -> Option<(String, String)> {
    if in_environment || knobs.iter().any(|(k, _)| k == name) {
        return None;
    }
    let dir = std::path::absolute(cache_dir.join(subdir)).ok()?;
    Some((name.into(), dir.to_string_lossy().into_owned()))
}

impl Default for EvaluatorConfig {
    fn default() -> Self {
        EvaluatorConfig {
            python: None,
            backend: None,
            harness_dir: None,
            work_dir: None,
            kill_grace: Duration::from_secs(3),
            tail_bytes: 16 * 1024,
            knobs: Vec::new(),
            verify_harness: true,
            sandbox: SandboxMode::default(),
            interrupt: None,
            persistent_judge: crate::judge::enabled(),
            lanes: 1,
        }
    }
}

/// Runs harness operations. Cheap to share between threads (`&Evaluator` is `Sync`).
#[derive(Debug)]
pub struct Evaluator {
    python: PathBuf,
    harness_dir: PathBuf,
    work_dir: PathBuf,
    config: EvaluatorConfig,
    /// The persistent judges, one per device (dropped before the scratch directory).
    judges: crate::judge::Judges,
    // Held only so the directory lives as long as the evaluator.
    _scratch: Option<tempfile::TempDir>,
    /// Whether repeating unsteady evaluations has paid so far (evaluate_steady).
    repeats: Mutex<RepeatYield>,
}

/// The harness knob naming a device's gate (harness/ksearch_harness/device_gate.py).
const DEVICE_GATE: &str = "KSEARCH_HARNESS_DEVICE_GATE";

/// The ops a persistent judge serves (harness `supervisor.SERVED_OPS`): those that use the
/// device, whose judge gains from keeping its imports, device context and caches.
const SERVED_OPS: [&str; 3] = ["evaluate", "yardstick", "profile"];

/// Timing locks, one per device, shared by every evaluator in the process. Two timed runs on
/// one device compete for its caches, memory bandwidth and clocks, so each would measure the
/// other; builds and everything else may run in parallel.
pub(crate) fn device_lock(key: &str) -> Arc<Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<String, Arc<Mutex<()>>>>> = OnceLock::new();
    let mut map = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    Arc::clone(map.entry(key.to_string()).or_default())
}

impl Evaluator {
    pub fn new(config: EvaluatorConfig) -> Result<Self> {
        let python = match &config.python {
            Some(p) => p.clone(),
            None => crate::harness_env::resolve_for(config.backend.as_deref())?.python,
        };
        let harness_dir = match &config.harness_dir {
            Some(d) => d.clone(),
            None => ksearch_assets::locate(ksearch_assets::Tree::Harness)?,
        };
        let (work_dir, scratch) = match &config.work_dir {
            Some(d) => {
                std::fs::create_dir_all(d).map_err(|source| EvalError::Io {
                    path: d.clone(),
                    source,
                })?;
                (d.clone(), None)
            }
            None => {
                let tmp = crate::scratch_dir::create(&std::env::temp_dir()).map_err(|source| {
                    EvalError::Io {
                        path: std::env::temp_dir(),
                        source,
                    }
                })?;
                (tmp.path().to_path_buf(), Some(tmp))
            }
        };
        let mut config = config;
        if let Some(knob) = sanity_cache_knob(
            &config.knobs,
            std::env::var_os(SANITY_CACHE).is_some(),
            &ksearch_assets::cache_dir(),
        ) {
            config.knobs.push(knob);
        }
        if let Some(knob) = cache_knob(
            MACHINE_CACHE,
            "machine",
            &config.knobs,
            std::env::var_os(MACHINE_CACHE).is_some(),
            &ksearch_assets::cache_dir(),
        ) {
            config.knobs.push(knob);
        }
        let evaluator = Evaluator {
            python,
            harness_dir,
            work_dir,
            config,
            judges: crate::judge::Judges::default(),
            _scratch: scratch,
            repeats: Mutex::new(RepeatYield::default()),
        };
        if evaluator.config.verify_harness {
            evaluator.verify_harness()?;
        }
        Ok(evaluator)
    }

    pub fn python(&self) -> &Path {
        &self.python
    }

    pub fn harness_dir(&self) -> &Path {
        &self.harness_dir
    }

    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }

    fn verify_harness(&self) -> Result<()> {
        let out = Command::new(&self.python)
            .args(["-c", "import ksearch_harness"])
            .env_clear()
            .envs(harness::child_env(
                &self.harness_dir,
                &self.config.knobs,
                std::env::vars_os(),
            ))
            .current_dir(&self.work_dir)
            .output()
            .map_err(|source| EvalError::Spawn {
                program: self.python.display().to_string(),
                source,
            })?;
        if out.status.success() {
            return Ok(());
        }
        let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
        output.push_str(&String::from_utf8_lossy(&out.stderr));
        Err(EvalError::HarnessImport {
            python: self.python.clone(),
            harness_dir: self.harness_dir.clone(),
            output: harness::tail_of(output.trim(), 4000),
        })
    }

    /// Build directory of a request: keyed by everything that determines the artifact, so
    /// `build` and a later `evaluate` of the same source meet in the same place.
    pub fn build_dir(&self, req: &EvalRequest) -> Result<PathBuf> {
        let source = std::fs::read(&req.candidate.path).map_err(|source| EvalError::Candidate {
            path: req.candidate.path.clone(),
            source,
        })?;
        let mut h = blake3::Hasher::new();
        for part in [
            req.task.name.as_bytes(),
            req.task.dir.as_os_str().as_encoded_bytes(),
            req.backend.as_bytes(),
            req.task.entry.symbol.as_bytes(),
            req.candidate.language.as_bytes(),
        ] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
        h.update(&source);
        let dir = self
            .work_dir
            .join("builds")
            .join(&h.finalize().to_hex()[..20]);
        std::fs::create_dir_all(&dir).map_err(|source| EvalError::Io {
            path: dir.clone(),
            source,
        })?;
        Ok(dir)
    }

    /// Build, static checks, correctness and timing of one candidate. Holds the device's timing
    /// lock for the whole run. `Err` only when ksearch itself fails (the interpreter cannot be
    /// started, the candidate file is unreadable); anything the candidate does is an `Ok` result.
    pub fn evaluate(&self, req: &EvalRequest) -> Result<EvalResult> {
        let lock = device_lock(&req.device_key());
        // In lanes the harness's device gate keeps timed work apart instead.
        let _timing =
            (self.lanes_for(req) == 1).then(|| lock.lock().unwrap_or_else(|p| p.into_inner()));
        self.run_op("evaluate", req)
    }

    /// How many judges serve `req`'s device side by side: the configured lanes on a device
    /// other than the host CPU with a persistent judge, else one.
    fn lanes_for(&self, req: &EvalRequest) -> usize {
        if self.config.persistent_judge && !req.times_on_host() {
            self.config.lanes.max(1)
        } else {
            1
        }
    }

    /// The gate of `key`'s device: a directory of its own in a private scratch directory of
    /// the process (outside the run's work directory, which builds share with the accused), so
    /// that every evaluator of the process keeps its judges' timed work apart on a device. The
    /// scratch directory lives as long as the process; the next evaluator on the machine
    /// removes it once the process is gone ([`crate::scratch_dir`]).
    fn gate_dir(&self, key: &str) -> Result<PathBuf> {
        static GATES: OnceLock<std::result::Result<tempfile::TempDir, String>> = OnceLock::new();
        let root = GATES
            .get_or_init(|| {
                crate::scratch_dir::create(&std::env::temp_dir()).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| EvalError::Io {
                path: std::env::temp_dir(),
                source: std::io::Error::other(e.clone()),
            })?;
        let dir = root
            .path()
            .join(&blake3::hash(key.as_bytes()).to_hex()[..16]);
        std::fs::create_dir_all(&dir).map_err(|source| EvalError::Io {
            path: dir.clone(),
            source,
        })?;
        Ok(dir)
    }

    /// Times the baseline and reference of `req`'s workloads for scores to build on (the
    /// `yardstick` op; `req`'s candidate is not used). A yardstick whose baseline/reference
    /// ratio drifted between its blocks ([`Yardstick::ratio_drifted`]) is measured again, up
    /// to [`YARDSTICK_ATTEMPTS`](crate::yardstick::YARDSTICK_ATTEMPTS) times, and the tightest
    /// is kept. Holds the device's timing lock.
    pub fn yardstick(&self, req: &EvalRequest) -> Result<Yardstick> {
        use crate::yardstick::{yardstick_timing, YARDSTICK_ATTEMPTS};
        let mut req = req.clone();
        req.timing = yardstick_timing(&req.timing);
        req.yardstick = None;
        // The candidate's time limit is not the yardstick's.
        req.timeout = req
            .timeout
            .max(crate::request::default_timeout(&req.backend));
        let lock = device_lock(&req.device_key());
        let _timing = lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut best: Option<Yardstick> = None;
        let mut spent = 0.0;
        let mut attempts = 0;
        for attempt in 0..YARDSTICK_ATTEMPTS {
            let result = self.run_op("yardstick", &req)?;
            spent += result.wall_seconds;
            attempts += 1;
            let y = Yardstick::from_result(&result)?;
            let spread = y.ratio_spread();
            let drifted = y.ratio_drifted();
            if best.as_ref().is_none_or(|b| spread < b.ratio_spread()) {
                best = Some(y);
            }
            if !drifted {
                break;
            }
            tracing::warn!(
                attempt,
                spread,
                "the yardstick drifted between its blocks: again"
            );
        }
        let mut best = best.ok_or_else(|| EvalError::Yardstick("no attempt was made".into()))?;
        best.spent_seconds = spent;
        best.attempts = attempts;
        Ok(best)
    }

    /// Evaluates `req` against `yardstick`. A result measured while the machine was changing
    /// ([`Yardstick::unsteady`]) has the yardstick measured again and the evaluation repeated
    /// once against it; the repeat's result is returned (with `unsteady_first`: the first
    /// result's score, interval, drift, wall and phase seconds) and `yardstick` is the new one.
    /// Once repeats stop paying on this machine ([`RepeatYield`]), an unsteady result is
    /// returned as measured, marked `unsteady_kept`.
    pub fn evaluate_steady(
        &self,
        req: &mut EvalRequest,
        yardstick: &mut Yardstick,
    ) -> Result<EvalResult> {
        req.yardstick = Some(yardstick.clone());
        let mut first = self.evaluate(req)?;
        if !yardstick.unsteady(&first) {
            return Ok(first);
        }
        let record = *self.repeats.lock().unwrap_or_else(|p| p.into_inner());
        if !record.worth_repeating() {
            tracing::info!(
                drift = first.drift,
                interval = ?first.score_interval,
                repeats = record.made,
                steady = record.steady,
                "unsteady, kept as measured: repeats have come out as unsteady on this machine"
            );
            first
                .extra
                .insert("unsteady_kept".into(), Value::Bool(true));
            return Ok(first);
        }
        tracing::warn!(
            drift = first.drift,
            interval = ?first.score_interval,
            "measured while the machine was changing: the yardstick again, then the evaluation"
        );
        *yardstick = self.yardstick(req)?;
        req.yardstick = Some(yardstick.clone());
        let mut again = self.evaluate(req)?;
        {
            let mut record = self.repeats.lock().unwrap_or_else(|p| p.into_inner());
            record.record(!yardstick.unsteady(&again));
            if !record.worth_repeating() {
                tracing::warn!(
                    repeats = record.made,
                    steady = record.steady,
                    "repeated evaluations came out as unsteady as their first tries: \
                     unsteady results are kept as measured from now on"
                );
            }
        }
        // The first try's time stays on record (`ksearch show` accounts for it).
        let phases = first
            .extra
            .get("diagnostics")
            .and_then(|d| d.get("phase_seconds"))
            .cloned();
        again.extra.insert(
            "unsteady_first".into(),
            json!({"score": first.score, "score_interval": first.score_interval,
                   "drift": first.drift, "wall_seconds": first.wall_seconds,
                   "diagnostics": {"phase_seconds": phases}}),
        );
        Ok(again)
    }

    /// The time limit of a `profile` of `workloads` workloads: a profiler replays each launch
    /// once per pass of its metrics.
    pub fn profile_timeout(workloads: usize) -> Duration {
        const SECONDS_PER_WORKLOAD: u64 = 120;
        let n = u64::try_from(workloads.max(1)).unwrap_or(u64::MAX);
        Duration::from_secs(SECONDS_PER_WORKLOAD.saturating_mul(n))
    }

    /// Hardware counters of the candidate's kernels on each of `req`'s shown workloads (the
    /// `profile` op: the candidate run under Nsight Compute in the accused's sandbox; the
    /// result's `profile` section, harness/README.md). Advice for the search, not a score.
    /// Holds the device's timing lock: a profiler replays each launch many times.
    pub fn profile(&self, req: &EvalRequest) -> Result<EvalResult> {
        let lock = device_lock(&req.device_key());
        let _timing = lock.lock().unwrap_or_else(|p| p.into_inner());
        self.run_op("profile", req)
    }

    /// Compile only (pre-compilation while another candidate is timed). On a device other
    /// than the host CPU it runs concurrently with anything; for the cpu backend, whose
    /// kernels are timed on the cores a compiler would use, it waits for the timing lock.
    pub fn build(&self, req: &EvalRequest) -> Result<EvalResult> {
        let lock = req.times_on_host().then(|| device_lock(&req.device_key()));
        let _timing = lock
            .as_ref()
            .map(|l| l.lock().unwrap_or_else(|p| p.into_inner()));
        self.run_op("build", req)
    }

    fn run_op(&self, op: &str, req: &EvalRequest) -> Result<EvalResult> {
        if !req.candidate.path.is_absolute() {
            return Err(EvalError::Request(format!(
                "candidate path must be absolute: {}",
                req.candidate.path.display()
            )));
        }
        let build_dir = self.build_dir(req)?;
        let nonce = fresh_nonce()?;
        let mut wire = req.to_wire(op, &nonce, &build_dir);
        wire["sandbox"] = json!(self.config.sandbox.as_str());
        let request = serde_json::to_vec(&wire)
            .map_err(|e| EvalError::Request(format!("cannot encode the request: {e}")))?;
        let span = tracing::info_span!("harness", op, candidate = %req.candidate.path.display());
        let _enter = span.enter();
        // Judges side by side on the device (one: as ever), for the ops a judge serves.
        let served = self.config.persistent_judge && SERVED_OPS.contains(&op);
        let lanes = if served { self.lanes_for(req) } else { 1 };
        let outcome = if served {
            let timeout = req.timeout + self.config.kill_grace;
            let mut knobs = std::borrow::Cow::Borrowed(&self.config.knobs);
            if lanes > 1 {
                let gate = self.gate_dir(&req.device_key())?;
                knobs
                    .to_mut()
                    .push((DEVICE_GATE.into(), gate.to_string_lossy().into_owned()));
            }
            let inv = Invocation {
                python: &self.python,
                harness_dir: &self.harness_dir,
                module: harness::HARNESS_MODULE,
                op,
                request: &request,
                cwd: &self.work_dir,
                timeout,
                knobs: &knobs,
                tail_bytes: self.config.tail_bytes,
                interrupt: self.config.interrupt.as_ref(),
            };
            self.judges.serve(&req.device_key(), &inv, timeout, lanes)?
        } else {
            self.run_module(
                harness::HARNESS_MODULE,
                op,
                &request,
                &build_dir,
                req.timeout,
            )?
        };
        let mut result = interpret(outcome, &nonce, req.timeout)?;
        if lanes > 1 {
            // How many judges shared the device with this one (its `diagnostics.gate` says
            // what it waited for them).
            result.extra.insert("judge_lanes".into(), json!(lanes));
        }
        tracing::info!(status = %result.status, wall_s = result.wall_seconds, "harness done");
        Ok(result)
    }

    /// Runs `python -m <module> <op>` on `request` in `cwd`, killed `timeout` plus the grace
    /// period after it started.
    pub(crate) fn run_module(
        &self,
        module: &str,
        op: &str,
        request: &[u8],
        cwd: &Path,
        timeout: Duration,
    ) -> Result<Outcome> {
        harness::run(&Invocation {
            python: &self.python,
            harness_dir: &self.harness_dir,
            module,
            op,
            request,
            cwd,
            timeout: timeout + self.config.kill_grace,
            knobs: &self.config.knobs,
            tail_bytes: self.config.tail_bytes,
            interrupt: self.config.interrupt.as_ref(),
        })
    }

    /// Runs the harness `probe` op: what the machine offers (interpreter, numpy, torch, mlx,
    /// compilers, CPU, GPUs). The answer is returned as the harness wrote it.
    pub fn probe(&self) -> Result<Value> {
        self.probe_op(false)
    }

    /// [`probe`](Self::probe), and a confined process that tries every sandbox escape: which
    /// layers are active here and whether anything got out (`sandbox` in the answer).
    pub fn probe_with_sandbox(&self) -> Result<Value> {
        self.probe_op(true)
    }

    fn probe_op(&self, sandbox: bool) -> Result<Value> {
        let nonce = fresh_nonce()?;
        let request = serde_json::to_vec(&json!({
            "protocol": PROTOCOL_VERSION, "op": "probe", "nonce": nonce,
            "sandbox_probe": sandbox,
        }))
        .map_err(|e| EvalError::Request(e.to_string()))?;
        let outcome = harness::run(&Invocation {
            python: &self.python,
            harness_dir: &self.harness_dir,
            module: harness::HARNESS_MODULE,
            op: "probe",
            request: &request,
            cwd: &self.work_dir,
            timeout: Duration::from_secs(120),
            knobs: &self.config.knobs,
            tail_bytes: self.config.tail_bytes,
            interrupt: self.config.interrupt.as_ref(),
        })?;
        let failed = |why: &str| EvalError::HarnessFailed {
            op: "probe".into(),
            exit: outcome.exit_description(),
            output: format!("{why}\n{}", outcome.output_tail),
        };
        if outcome.timed_out {
            return Err(failed("no answer within 120 s"));
        }
        let text = String::from_utf8_lossy(&outcome.result);
        let line = text.trim();
        let value: Value = serde_json::from_str(line)
            .or_else(|e| match crate::protocol::replace_non_finite(line) {
                Some(fixed) => serde_json::from_str(&fixed),
                None => Err(e),
            })
            .map_err(|e| failed(&format!("the answer is not JSON ({e})")))?;
        if value.get("nonce").and_then(Value::as_str) != Some(nonce.as_str()) {
            return Err(failed("the answer does not carry the request nonce"));
        }
        Ok(value)
    }
}

/// Turns what the child left behind into a result; see docs/ARCHITECTURE.md for why a missing
/// or forged result is an integrity violation rather than an error.
pub(crate) fn interpret(outcome: Outcome, nonce: &str, timeout: Duration) -> Result<EvalResult> {
    let wall = outcome.wall.as_secs_f64();
    let mut result = if outcome.timed_out {
        EvalResult::synthesised(
            nonce,
            Status::Timeout,
            format!(
                "no result within {} s; the harness and everything it started were killed",
                timeout.as_secs_f64()
            ),
        )
    } else {
        let text = String::from_utf8_lossy(&outcome.result);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        match lines.as_slice() {
            [] => match outcome.signal() {
                // A crash in native candidate code takes the interpreter with it.
                Some(_) => EvalResult::synthesised(
                    nonce,
                    Status::RuntimeError,
                    format!(
                        "the harness died ({}) before reporting a result",
                        outcome.exit_description()
                    ),
                ),
                None => channel_violation(
                    nonce,
                    format!(
                        "the harness exited ({}) without writing a result",
                        outcome.exit_description()
                    ),
                ),
            },
            [line] => match parse_result_line(line) {
                Ok(r) if r.nonce != nonce => channel_violation(
                    nonce,
                    "the result does not carry this request's nonce".into(),
                ),
                Ok(r) if r.protocol != PROTOCOL_VERSION => {
                    return Err(EvalError::ProtocolMismatch {
                        got: r.protocol,
                        expected: PROTOCOL_VERSION,
                    })
                }
                Ok(r) => r,
                Err(e) => channel_violation(
                    nonce,
                    format!("the result channel carried something that is not a result: {e}"),
                ),
            },
            more => channel_violation(
                nonce,
                format!(
                    "the result channel carried {} lines instead of one",
                    more.len()
                ),
            ),
        }
    };
    result.wall_seconds = wall;
    result.harness_output = outcome.output_tail;
    Ok(result)
}

fn channel_violation(nonce: &str, message: String) -> EvalResult {
    let mut r = EvalResult::synthesised(nonce, Status::IntegrityViolation, message.clone());
    r.violation = Some(Violation {
        class: ViolationClass::ResultChannel,
        message,
        extra: Default::default(),
    });
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sanity_cache_knob_defers_to_the_caller_and_is_absolute() {
        let rel = Path::new("relative/cache");
        let (k, v) = sanity_cache_knob(&[], false, rel).expect("added when nobody chose");
        assert_eq!(k, SANITY_CACHE);
        let v = PathBuf::from(v);
        assert!(
            v.is_absolute() && v.ends_with("relative/cache/task-sanity"),
            "{v:?}"
        );
        // Set in the environment (an empty value turns it off): left alone.
        assert!(sanity_cache_knob(&[], true, rel).is_none());
        let given = vec![(SANITY_CACHE.to_string(), "/x".to_string())];
        assert!(sanity_cache_knob(&given, false, rel).is_none());
        // Other knobs do not count as a choice.
        let other = vec![("KSEARCH_HARNESS_THREADS".to_string(), "1".to_string())];
        assert!(sanity_cache_knob(&other, false, rel).is_some());
    }
}
