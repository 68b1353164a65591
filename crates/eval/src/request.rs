//! What to evaluate: [`EvalRequest`] and the knobs that shape it.

use crate::error::{EvalError, Result};
use crate::protocol::{
    BaselineRef, CandidateSection, CorrectnessConfig, EntrySpec, FunctionRef, TaskSection,
    TimingConfig, ToleranceSpec, PROTOCOL_VERSION,
};
use crate::yardstick::Yardstick;
use ksearch_task::{ResolvedWorkload, Task};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

/// Which workloads of a task are evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadSet {
    /// The workloads a search may see: everything but the held-out ones.
    Search,
    /// All workloads, held-out included: used to accept a winner.
    Acceptance,
}

impl WorkloadSet {
    pub fn includes(self, held_out: bool) -> bool {
        match self {
            WorkloadSet::Search => !held_out,
            WorkloadSet::Acceptance => true,
        }
    }
}

/// How hard the harness times: more repetitions give tighter medians and cost more time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimingPreset {
    /// Few repetitions: tests and smoke runs, where only the verdict matters.
    Quick,
    /// The default for searches.
    #[default]
    Standard,
    /// Many repetitions: final measurements of a winner.
    Thorough,
}

impl TimingPreset {
    pub const NAMES: [&'static str; 3] = ["quick", "standard", "thorough"];

    pub fn config(self) -> TimingConfig {
        // 64 MiB exceeds the last-level cache of every machine we target, so one flush
        // between repetitions evicts the previous call's data.
        let flush_bytes = 64 << 20;
        match self {
            TimingPreset::Quick => TimingConfig {
                warmup: 1,
                min_reps: 3,
                max_reps: 10,
                target_seconds: 0.2,
                flush_bytes,
                precision: 0.03,
            },
            // Ten samples give the median a 95% interval from order statistics (five only
            // reach 94% with their full range); the precision rule then ends a steady
            // kernel's timing there instead of at max_reps.
            TimingPreset::Standard => TimingConfig {
                warmup: 2,
                min_reps: 10,
                max_reps: 50,
                target_seconds: 1.0,
                flush_bytes,
                precision: 0.01,
            },
            TimingPreset::Thorough => TimingConfig {
                warmup: 5,
                min_reps: 20,
                max_reps: 500,
                target_seconds: 5.0,
                flush_bytes,
                precision: 0.005,
            },
        }
    }
}

impl FromStr for TimingPreset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "quick" => Ok(TimingPreset::Quick),
            "standard" => Ok(TimingPreset::Standard),
            "thorough" => Ok(TimingPreset::Thorough),
            other => Err(format!(
                "unknown timing preset `{other}` (expected one of: {})",
                TimingPreset::NAMES.join(", ")
            )),
        }
    }
}

/// Default wall-clock limit of one evaluation on the cpu backend, build included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Default limit on a GPU backend. nvcc alone takes 5-60 s per candidate, and the workloads
/// are large: at L = 4096 a naive attention kernel takes ~70 ms a call, inputs of 16 M elements
/// are drawn on the host for every trial and repetition, and correctness runs a float32 device
/// reference.
pub const GPU_DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The backends that run on a GPU.
pub const GPU_BACKENDS: &[&str] = &["cuda", "mlx"];

pub fn is_gpu_backend(backend: &str) -> bool {
    GPU_BACKENDS.contains(&backend)
}

/// A command-line number of seconds that must be positive (`--timeout`).
pub fn parse_positive_seconds(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a positive number of seconds")),
    }
}

/// The default wall-clock limit of one evaluation on `backend`.
pub fn default_timeout(backend: &str) -> Duration {
    if is_gpu_backend(backend) {
        GPU_DEFAULT_TIMEOUT
    } else {
        DEFAULT_TIMEOUT
    }
}

/// The device whose timing lock an evaluation on `backend` takes: `gpu:<id>` on the GPU
/// backends, where `<id>` is the first entry of `CUDA_VISIBLE_DEVICES` (`visible_devices`),
/// the device PyTorch and MLX call 0, or `0` when unset; `None` on the cpu. cuda and mlx
/// evaluations of one GPU share the lock: they would disturb each other's timings as much.
pub fn device_for(backend: &str, visible_devices: Option<&str>) -> Option<String> {
    if !is_gpu_backend(backend) {
        return None;
    }
    let first = visible_devices
        .and_then(|v| v.split(',').map(str::trim).find(|s| !s.is_empty()))
        .unwrap_or("0");
    Some(format!("gpu:{first}"))
}

/// Default number of correctness trials (each with fresh inputs from a derived seed).
pub const DEFAULT_TRIALS: u32 = 3;

/// One candidate to evaluate, with everything the harness needs already resolved: the harness
/// never reads task files itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRequest {
    pub task: TaskSection,
    pub backend: String,
    /// Which device the timing runs on; timed evaluations of one device never overlap.
    /// `None` means the backend has one device (the CPU, or the only GPU).
    pub device: Option<String>,
    pub candidate: CandidateSection,
    pub workload_set: WorkloadSet,
    /// The workloads, resolved, already filtered by `workload_set`; each serialises as a
    /// protocol `workloads` item.
    pub workloads: Vec<ResolvedWorkload>,
    /// Tolerance per dtype name (`"f32"`, …).
    pub tolerance: BTreeMap<String, ToleranceSpec>,
    pub correctness: CorrectnessConfig,
    pub timing: TimingConfig,
    /// Per-run secret from which the harness derives trial seeds.
    pub secret_seed: u64,
    pub timeout: Duration,
    /// The baseline and reference times to score against; `None` times the baseline in the
    /// evaluation itself.
    pub yardstick: Option<Yardstick>,
    /// An evaluation of a run that will ask for profiles of its new bests: a persistent judge
    /// then starts the first profile's profiler once the evaluation is done (harness
    /// profiler.py), so the first profile waits no longer than the later ones.
    #[serde(default)]
    pub profiles_ahead: bool,
}

impl EvalRequest {
    /// A request for `candidate` on `task`'s `backend`, with the default trials and timeout.
    pub fn from_task(
        task: &Task,
        backend: &str,
        candidate: &Path,
        workload_set: WorkloadSet,
        secret_seed: u64,
        preset: TimingPreset,
    ) -> Result<Self> {
        let spec = task.backend(backend)?;
        let path = candidate
            .canonicalize()
            .map_err(|source| EvalError::Candidate {
                path: candidate.to_path_buf(),
                source,
            })?;
        let mut workloads = task.workloads(backend)?;
        workloads.retain(|w| workload_set.includes(w.held_out));
        if workloads.is_empty() {
            return Err(EvalError::Request(format!(
                "task {} has no {} workloads for backend {backend}",
                task.name(),
                match workload_set {
                    WorkloadSet::Search => "non-held-out",
                    WorkloadSet::Acceptance => "",
                }
            )));
        }
        // A backend may have its own reference function (e.g. a torch one for cuda).
        let reference = task.reference_for(backend)?;
        Ok(EvalRequest {
            task: TaskSection {
                name: task.name().to_string(),
                dir: task.dir().to_path_buf(),
                reference: FunctionRef {
                    module: reference.module,
                    function: reference.function,
                },
                baseline: spec.baseline.as_ref().map(|function| BaselineRef {
                    name: spec.baseline_label().unwrap_or(function).to_string(),
                    function: function.clone(),
                }),
                entry: EntrySpec {
                    symbol: spec.entry.clone(),
                    args: spec.args.clone(),
                },
                forbidden: spec.forbidden.clone(),
                allowed_kernels: spec.allowed_kernels.clone(),
            },
            backend: backend.to_string(),
            device: device_for(
                backend,
                std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
            ),
            candidate: CandidateSection {
                path,
                language: spec.language.clone(),
            },
            workload_set,
            workloads,
            tolerance: task
                .tolerance_table()
                .into_iter()
                .map(|(dtype, t)| {
                    (
                        dtype.as_str().to_string(),
                        ToleranceSpec {
                            rtol: t.rtol,
                            atol: t.atol,
                            rule: t.rule,
                            matched_ratio: t.matched_ratio,
                        },
                    )
                })
                .collect(),
            correctness: CorrectnessConfig {
                trials: DEFAULT_TRIALS,
            },
            timing: preset.config(),
            secret_seed,
            timeout: default_timeout(backend),
            yardstick: None,
            profiles_ahead: false,
        })
    }

    /// The key of the per-device timing lock: the device when there is one (so every backend
    /// timing on one GPU queues behind the same lock), else the backend.
    /// Whether candidates run and are timed on the host's CPU cores (the cpu backend), where
    /// any other work of ours, a compiler included, would be timed with them.
    pub fn times_on_host(&self) -> bool {
        self.backend == "cpu"
    }

    pub fn device_key(&self) -> String {
        match &self.device {
            Some(d) => d.clone(),
            None => self.backend.clone(),
        }
    }

    /// The protocol request for `op` (`evaluate`, `build` or `yardstick`).
    pub fn to_wire(&self, op: &str, nonce: &str, build_dir: &Path) -> Value {
        let mut wire = json!({
            "protocol": PROTOCOL_VERSION,
            "op": op,
            "nonce": nonce,
            "secret_seed": self.secret_seed,
            "backend": self.backend,
            "task": self.task,
            "candidate": self.candidate,
            "build_dir": build_dir,
            "workloads": self.workloads,
            "tolerance": self.tolerance,
            "correctness": self.correctness,
            "timing": self.timing,
            "timeout_s": self.timeout.as_secs_f64(),
        });
        if let (Some(y), "evaluate") = (&self.yardstick, op) {
            wire["yardstick"] = y.to_value();
        }
        if self.profiles_ahead && op == "evaluate" {
            wire["profiles_ahead"] = json!(true);
        }
        wire
    }
}

/// A fresh secret seed from the OS random source. Kept below 2^53 so that every JSON reader,
/// including ones that parse numbers as doubles, sees the exact value.
pub fn fresh_secret_seed() -> Result<u64> {
    let v = getrandom::u64().map_err(|e| EvalError::Random(e.to_string()))?;
    Ok(v & ((1u64 << 53) - 1))
}

/// A fresh request nonce (128 random bits, hex).
pub fn fresh_nonce() -> Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| EvalError::Random(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_grow_monotonically_and_parse() {
        let [q, s, t] = TimingPreset::NAMES.map(|n| n.parse::<TimingPreset>().unwrap().config());
        assert!(q.max_reps < s.max_reps && s.max_reps < t.max_reps);
        assert!(q.target_seconds < s.target_seconds && s.target_seconds < t.target_seconds);
        assert!(q.precision > s.precision && s.precision > t.precision && t.precision > 0.0);
        assert!("fast"
            .parse::<TimingPreset>()
            .unwrap_err()
            .contains("quick"));
    }

    #[test]
    fn seeds_and_nonces_are_fresh_and_json_safe() {
        let a = fresh_secret_seed().unwrap();
        let b = fresh_secret_seed().unwrap();
        assert_ne!(a, b);
        assert!(a < (1 << 53) && b < (1 << 53));
        let n = fresh_nonce().unwrap();
        assert_eq!(n.len(), 32);
        assert!(n.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(n, fresh_nonce().unwrap());
    }

    fn attention() -> Task {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tasks/attention");
        ksearch_task::load_task(&dir).unwrap()
    }

    #[test]
    fn request_from_a_task_matches_the_protocol() {
        let task = attention();
        let seed = task.backend("cpu").unwrap().seed.clone().unwrap();
        let all = task.workloads("cpu").unwrap();
        let held_out = all.iter().filter(|w| w.held_out).count();
        assert!(held_out > 0, "the attention task has held-out workloads");

        let req = EvalRequest::from_task(
            &task,
            "cpu",
            &seed,
            WorkloadSet::Search,
            7,
            TimingPreset::Quick,
        )
        .unwrap();
        assert_eq!(req.workloads.len(), all.len() - held_out);
        assert!(req.workloads.iter().all(|w| !w.held_out));
        let wire = req.to_wire("evaluate", "n0", Path::new("/tmp/b"));
        assert_eq!(wire["protocol"], 1);
        assert_eq!(wire["op"], "evaluate");
        assert_eq!(wire["nonce"], "n0");
        assert_eq!(wire["secret_seed"], 7);
        assert_eq!(wire["task"]["entry"]["symbol"], "attention_f32");
        assert_eq!(wire["task"]["baseline"]["function"], "baseline_numpy");
        assert_eq!(wire["task"]["baseline"]["name"], "numpy");
        assert_eq!(wire["task"]["reference"]["module"], "reference.py");
        assert_eq!(wire["candidate"]["language"], "c");
        assert!(Path::new(wire["candidate"]["path"].as_str().unwrap()).is_absolute());
        assert_eq!(wire["tolerance"]["f32"]["rtol"], 2e-5);
        assert_eq!(wire["workloads"][0]["inputs"][0]["dtype"], "f32");
        assert!(wire["workloads"][0]["flops"].as_f64().unwrap() > 0.0);
        assert_eq!(
            wire["timing"]["max_reps"],
            TimingPreset::Quick.config().max_reps
        );
        // Said only where profiles will follow, and only to an evaluation.
        assert!(wire.get("profiles_ahead").is_none());
        let mut profiled = req.clone();
        profiled.profiles_ahead = true;
        let wire = profiled.to_wire("evaluate", "n1", Path::new("/tmp/b"));
        assert_eq!(wire["profiles_ahead"], true);
        assert!(profiled
            .to_wire("build", "n2", Path::new("/tmp/b"))
            .get("profiles_ahead")
            .is_none());

        let acceptance = EvalRequest::from_task(
            &task,
            "cpu",
            &seed,
            WorkloadSet::Acceptance,
            7,
            TimingPreset::Quick,
        )
        .unwrap();
        assert_eq!(acceptance.workloads.len(), all.len());
    }

    #[test]
    fn unknown_backend_and_missing_candidate_are_errors() {
        let task = attention();
        let seed = task.backend("cpu").unwrap().seed.clone().unwrap();
        let err = EvalRequest::from_task(
            &task,
            "tpu",
            &seed,
            WorkloadSet::Search,
            1,
            TimingPreset::Quick,
        )
        .unwrap_err();
        assert!(err.to_string().contains("tpu"), "{err}");
        let err = EvalRequest::from_task(
            &task,
            "cpu",
            Path::new("/no/such/kernel.c"),
            WorkloadSet::Search,
            1,
            TimingPreset::Quick,
        )
        .unwrap_err();
        assert!(err.to_string().contains("/no/such/kernel.c"), "{err}");
    }

    #[test]
    fn gpu_requests_get_a_longer_timeout_and_a_per_gpu_device() {
        let task = attention();
        let seed = task.backend("cuda").unwrap().seed.clone().unwrap();
        let req = EvalRequest::from_task(
            &task,
            "cuda",
            &seed,
            WorkloadSet::Search,
            1,
            TimingPreset::Quick,
        )
        .unwrap();
        assert_eq!(req.timeout, GPU_DEFAULT_TIMEOUT);
        assert!(req.timeout > DEFAULT_TIMEOUT);
        assert!(req.device.as_deref().unwrap().starts_with("gpu:"));
        assert_eq!(req.device_key(), req.device.clone().unwrap());
        assert_eq!(
            serde_json::to_value(&req.workloads[0]).unwrap()["params"]["dtype"],
            "f16"
        );
        assert_eq!(
            req.to_wire("build", "n", Path::new("/b"))["timeout_s"],
            600.0
        );

        let cpu_seed = task.backend("cpu").unwrap().seed.clone().unwrap();
        let cpu = EvalRequest::from_task(
            &task,
            "cpu",
            &cpu_seed,
            WorkloadSet::Search,
            1,
            TimingPreset::Quick,
        )
        .unwrap();
        assert_eq!(cpu.timeout, DEFAULT_TIMEOUT);
        assert_eq!(cpu.device, None);
        assert_eq!(cpu.device_key(), "cpu");
    }

    #[test]
    fn a_tasks_allowed_library_kernels_travel_with_its_request() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tasks/copy");
        let task = ksearch_task::load_task(&root).unwrap();
        let wire = |backend: &str| {
            let seed = task.backend(backend).unwrap().seed.clone().unwrap();
            EvalRequest::from_task(
                &task,
                backend,
                &seed,
                WorkloadSet::Search,
                1,
                TimingPreset::Quick,
            )
            .unwrap()
            .to_wire("evaluate", "n", Path::new("/b"))
        };
        assert_eq!(
            wire("mlx")["task"]["allowed_kernels"],
            serde_json::json!(["mlx::core::cu::copy_v<"])
        );
        // None given: none sent (the harness's own defaults apply).
        assert!(wire("cuda")["task"].get("allowed_kernels").is_none());
    }

    #[test]
    fn the_gpu_is_the_first_visible_device() {
        assert_eq!(device_for("cpu", Some("3")), None);
        assert_eq!(device_for("cuda", None).unwrap(), "gpu:0");
        assert_eq!(device_for("cuda", Some("2,3")).unwrap(), "gpu:2");
        assert_eq!(device_for("mlx", Some(" 1 ")).unwrap(), "gpu:1");
        assert_eq!(device_for("cuda", Some("")).unwrap(), "gpu:0");
        assert_eq!(
            device_for("cuda", Some("GPU-8f3a,GPU-11")).unwrap(),
            "gpu:GPU-8f3a"
        );
        // Both GPU backends share one lock per GPU.
        assert_eq!(device_for("cuda", Some("1")), device_for("mlx", Some("1")));
        assert_eq!(default_timeout("mlx"), GPU_DEFAULT_TIMEOUT);
        assert_eq!(default_timeout("cpu"), DEFAULT_TIMEOUT);
    }

    #[test]
    fn search_set_excludes_held_out() {
        assert!(WorkloadSet::Search.includes(false));
        assert!(!WorkloadSet::Search.includes(true));
        assert!(WorkloadSet::Acceptance.includes(true));
    }
}
