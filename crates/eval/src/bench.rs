//! `ksearch bench`: one harness process (`python -m ksearch_harness.bench`, outside the
//! protocol ops) times a candidate kernel and the native attention implementations it is
//! compared with (PyTorch SDPA, MLX `mx.fast.scaled_dot_product_attention`) on the same inputs,
//! per workload. A measurement, not a verdict: only static checks and an output check against
//! the task's reference. The process runs like every harness op: own process group, scrubbed
//! environment, request on stdin, result on a private fd, the device's timing lock held.

use crate::error::{EvalError, Result};
use crate::evaluator::Evaluator;
use crate::protocol::PROTOCOL_VERSION;
use crate::request::{fresh_nonce, is_gpu_backend, EvalRequest, TimingPreset, WorkloadSet};
use ksearch_task::{CustomWorkload, ResolvedWorkload, Task};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The harness module `ksearch bench` runs.
pub const BENCH_MODULE: &str = "ksearch_harness.bench";

/// The natives a bench can compare with.
pub const COMPARATORS: [&str; 2] = ["sdpa", "mlx"];

/// How many calls are timed and what is compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchSettings {
    /// Untimed calls before the timed ones, per contender and workload.
    pub warmup: u32,
    /// Timed calls per contender and workload; the median is reported.
    pub reps: u32,
    /// Natives to time beside the kernel (`sdpa`, `mlx`), those that are importable.
    pub compare: Vec<String>,
    /// Bytes the cache flush before each timed call writes at least (the cuda side writes at
    /// least twice the L2).
    pub flush_bytes: u64,
}

impl Default for BenchSettings {
    fn default() -> Self {
        BenchSettings {
            warmup: 5,
            reps: 20,
            compare: COMPARATORS.iter().map(|s| s.to_string()).collect(),
            flush_bytes: 256 << 20,
        }
    }
}

/// What to bench: an evaluation request (task, backend, device, candidate, workloads,
/// tolerance, seed, timeout) and the bench settings.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRequest {
    pub eval: EvalRequest,
    pub settings: BenchSettings,
}

/// The kernel a bench measures: `kernel` when given, else the task's seed kernel for `backend`.
pub fn kernel_or_seed(task: &Task, backend: &str, kernel: Option<&Path>) -> Result<PathBuf> {
    match kernel {
        Some(k) => Ok(k.to_path_buf()),
        None => task.backend(backend)?.seed.clone().ok_or_else(|| {
            EvalError::Bench(format!(
                "task {} has no seed kernel for {backend}",
                task.name()
            ))
        }),
    }
}

impl BenchRequest {
    /// The bench of `kernel` on `shapes` of `task`'s `backend` (every workload of the backend,
    /// held-out ones included, when `shapes` is empty). A shape is a workload's name or an
    /// `AXIS=VALUE,...` list, which the task checks and resolves like its own workloads;
    /// several are separated by `;`.
    pub fn for_task(
        task: &Task,
        backend: &str,
        kernel: &Path,
        shapes: &[String],
        settings: BenchSettings,
        secret_seed: u64,
        timeout: Duration,
    ) -> Result<BenchRequest> {
        let invalid = |m: String| Err(EvalError::Bench(m));
        if !is_gpu_backend(backend) {
            return invalid(format!(
                "`ksearch bench` measures the GPU backends (cuda, mlx), not {backend}"
            ));
        }
        if settings
            .compare
            .iter()
            .any(|c| !COMPARATORS.contains(&c.as_str()))
        {
            return invalid(format!("--compare takes {}", COMPARATORS.join(", ")));
        }
        if !kernel.is_file() {
            return invalid(format!("kernel file not found: {}", kernel.display()));
        }
        let mut eval = EvalRequest::from_task(
            task,
            backend,
            kernel,
            WorkloadSet::Acceptance,
            secret_seed,
            TimingPreset::Standard,
        )?;
        eval.timeout = timeout;
        let specs: Vec<&str> = shapes
            .iter()
            .flat_map(|s| s.split(';'))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if !specs.is_empty() {
            let known = task.workloads(backend)?;
            let mut chosen: Vec<ResolvedWorkload> = Vec::new();
            for spec in specs {
                let w = match known.iter().find(|w| w.name == spec) {
                    Some(w) => w.clone(),
                    None if spec.contains('=') => custom_workload(task, backend, spec)?,
                    None => {
                        let names: Vec<&str> = known.iter().map(|w| w.name.as_str()).collect();
                        return invalid(format!(
                            "`{spec}` is neither a {backend} workload of task {} ({}) nor an \
                             AXIS=VALUE list",
                            task.name(),
                            names.join(", ")
                        ));
                    }
                };
                if chosen.iter().any(|c| c.name == w.name) {
                    return invalid(format!("workload `{}` is listed twice", w.name));
                }
                chosen.push(w);
            }
            eval.workloads = chosen;
        }
        Ok(BenchRequest { eval, settings })
    }

    /// The JSON request the bench module reads: an `evaluate` request with `op = "bench"`, the
    /// flush size in `timing` and the settings in `bench`.
    pub fn to_wire(&self, nonce: &str, build_dir: &Path) -> Value {
        let mut wire = self.eval.to_wire("bench", nonce, build_dir);
        wire["timing"] = json!({ "flush_bytes": self.settings.flush_bytes });
        wire["bench"] = json!({
            "warmup": self.settings.warmup,
            "reps": self.settings.reps,
            "compare": self.settings.compare,
        });
        wire
    }
}

/// A workload from `AXIS=VALUE,...`, checked and resolved by the task like its own workloads.
fn custom_workload(task: &Task, backend: &str, spec: &str) -> Result<ResolvedWorkload> {
    let custom = CustomWorkload {
        name: spec.replace(' ', ""),
        params: task.parse_params(spec)?,
        held_out: false,
        dist: BTreeMap::new(),
    };
    Ok(task.resolve_workload(backend, &custom)?)
}

/// Whether a native was importable, and how it was timed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparator {
    pub available: bool,
    #[serde(default)]
    pub label: String,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub timing: Option<String>,
    /// Why it is not available.
    #[serde(default)]
    pub reason: Option<String>,
}

/// One contender on one workload.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Measurement {
    #[serde(default)]
    pub samples_ns: Vec<f64>,
    #[serde(default)]
    pub median_ns: Option<f64>,
    #[serde(default)]
    pub p10_ns: Option<f64>,
    #[serde(default)]
    pub p90_ns: Option<f64>,
    /// The output matched the task's reference within the tolerance (for the kernel: on the
    /// first call and on the last timed call).
    #[serde(default)]
    pub correct: Option<bool>,
    #[serde(default)]
    pub max_abs_err: Option<f64>,
    #[serde(default)]
    pub max_rel_err: Option<f64>,
    /// Why there is no measurement (a CUDA error, a native that cannot run this workload).
    #[serde(default)]
    pub error: Option<String>,
}

/// One workload: its parameters and each contender's measurement (`kernel`, `sdpa`, `mlx`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchWorkload {
    pub name: String,
    #[serde(default)]
    pub held_out: bool,
    #[serde(default)]
    pub params: Map<String, Value>,
    /// FLOPs of one call (the task's roofline formula: 4·B·H·L²·D, halved when causal).
    pub flops: f64,
    #[serde(default)]
    pub bytes: f64,
    #[serde(default)]
    pub results: BTreeMap<String, Measurement>,
}

impl BenchWorkload {
    pub fn result(&self, contender: &str) -> Option<&Measurement> {
        self.results.get(contender)
    }

    /// A string parameter (`dtype`) or the text of a numeric one.
    pub fn param(&self, name: &str) -> Option<String> {
        self.params.get(name).map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }
}

/// The bench module's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    pub protocol: u32,
    #[serde(default)]
    pub nonce: Option<String>,
    /// `passed` when the kernel was built and every workload measured (a workload's contender
    /// may still carry an error); otherwise why nothing was measured (`build_error`, ...).
    pub status: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub backend: String,
    #[serde(default)]
    pub build: Option<Value>,
    #[serde(default)]
    pub environment: Map<String, Value>,
    #[serde(default)]
    pub comparators: BTreeMap<String, Comparator>,
    #[serde(default)]
    pub settings: Value,
    #[serde(default)]
    pub workloads: Vec<BenchWorkload>,
    #[serde(default)]
    pub log_tail: String,
}

impl BenchResult {
    pub fn passed(&self) -> bool {
        self.status == "passed"
    }

    /// Whether the kernel failed anywhere: an error, a wrong output or no measurement on some
    /// workload (a native's failure does not count).
    pub fn kernel_failed(&self) -> bool {
        self.workloads.iter().any(|w| {
            w.result("kernel")
                .is_none_or(|m| m.error.is_some() || m.correct != Some(true))
        })
    }

    /// The GPU the harness measured on (`NVIDIA H200`), as it reports it.
    pub fn gpu(&self) -> Option<&str> {
        self.environment.get("gpu").and_then(Value::as_str)
    }

    /// Parses the result line.
    pub fn parse(line: &str) -> std::result::Result<BenchResult, serde_json::Error> {
        match serde_json::from_str(line) {
            Ok(r) => Ok(r),
            Err(first) => match crate::protocol::replace_non_finite(line) {
                Some(fixed) => serde_json::from_str(&fixed),
                None => Err(first),
            },
        }
    }
}

impl Evaluator {
    /// Runs the bench module on `req`, holding the device's timing lock. `Err` when no result
    /// came back (the harness could not start, died, or ran out of time); anything about the
    /// kernel is in the result.
    pub fn bench(&self, req: &BenchRequest) -> Result<BenchResult> {
        if !req.eval.candidate.path.is_absolute() {
            return Err(EvalError::Request(format!(
                "candidate path must be absolute: {}",
                req.eval.candidate.path.display()
            )));
        }
        let build_dir = self.build_dir(&req.eval)?;
        let nonce = fresh_nonce()?;
        let wire = req.to_wire(&nonce, &build_dir);
        let request = serde_json::to_vec(&wire)
            .map_err(|e| EvalError::Request(format!("cannot encode the request: {e}")))?;
        let lock = crate::evaluator::device_lock(&req.eval.device_key());
        let _timing = lock.lock().unwrap_or_else(|p| p.into_inner());
        let outcome = self.run_module(
            BENCH_MODULE,
            "bench",
            &request,
            &build_dir,
            req.eval.timeout,
        )?;
        let failed = |why: String| EvalError::HarnessFailed {
            op: "bench".into(),
            exit: outcome.exit_description(),
            output: format!("{why}\n{}", outcome.output_tail),
        };
        if outcome.timed_out {
            return Err(failed(format!(
                "no result within {} s; the harness and everything it started were killed \
                 (raise --timeout)",
                req.eval.timeout.as_secs_f64()
            )));
        }
        let text = String::from_utf8_lossy(&outcome.result);
        let line = text.trim();
        if line.is_empty() {
            return Err(failed(
                "the bench process ended without a result (a crash in the kernel takes the \
                 process with it; see the output above)"
                    .into(),
            ));
        }
        let result = BenchResult::parse(line)
            .map_err(|e| failed(format!("the result is not a bench result: {e}")))?;
        if result.protocol != PROTOCOL_VERSION {
            return Err(EvalError::ProtocolMismatch {
                got: result.protocol,
                expected: PROTOCOL_VERSION,
            });
        }
        // A result for another request would be someone else's numbers.
        if result.nonce.as_deref() != Some(nonce.as_str()) {
            return Err(failed(
                "the result does not carry this request's nonce".into(),
            ));
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attention() -> Task {
        ksearch_task::load_task(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tasks/attention"),
        )
        .unwrap()
    }

    fn seed(task: &Task, backend: &str) -> PathBuf {
        task.backend(backend).unwrap().seed.clone().unwrap()
    }

    fn request(backend: &str, shapes: &[&str]) -> Result<BenchRequest> {
        let task = attention();
        let shapes: Vec<String> = shapes.iter().map(|s| s.to_string()).collect();
        let kernel = seed(&task, if backend == "cpu" { "cuda" } else { backend });
        BenchRequest::for_task(
            &task,
            backend,
            &kernel,
            &shapes,
            BenchSettings::default(),
            7,
            Duration::from_secs(900),
        )
    }

    #[test]
    fn the_request_carries_every_gpu_workload_and_the_settings() {
        let req = request("cuda", &[]).unwrap();
        let task = attention();
        assert_eq!(
            req.eval.workloads.len(),
            task.workloads("cuda").unwrap().len()
        );
        assert!(req.eval.workloads.iter().any(|w| w.held_out));
        assert_eq!(req.eval.timeout, Duration::from_secs(900));
        assert_eq!(
            req.eval.device.as_deref().map(|d| d.starts_with("gpu:")),
            Some(true)
        );
        let wire = req.to_wire("n1", Path::new("/tmp/b"));
        assert_eq!(wire["op"], "bench");
        assert_eq!(wire["nonce"], "n1");
        assert_eq!(wire["backend"], "cuda");
        assert_eq!(wire["task"]["entry"]["symbol"], "attention_{dtype}");
        assert_eq!(wire["candidate"]["language"], "cuda");
        assert_eq!(wire["bench"]["reps"], 20);
        assert_eq!(wire["bench"]["warmup"], 5);
        assert_eq!(wire["bench"]["compare"], json!(["sdpa", "mlx"]));
        assert_eq!(wire["timing"]["flush_bytes"], 256u64 << 20);
        assert_eq!(wire["timeout_s"], 900.0);
        assert_eq!(wire["tolerance"]["bf16"]["rtol"], 1.6e-2);
        let mlx = request("mlx", &[]).unwrap();
        assert_eq!(
            mlx.to_wire("n", Path::new("/b"))["task"]["entry"]["symbol"],
            "attention"
        );
    }

    #[test]
    fn shapes_select_workloads_or_make_new_ones() {
        let req = request("cuda", &["b1h32l4096d128-bf16; b3h4l100d64-f16"]).unwrap();
        let names: Vec<&str> = req.eval.workloads.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["b1h32l4096d128-bf16", "b3h4l100d64-f16"]);

        let req = request("cuda", &["B=2, H=4, L=100, D=64, causal=1, dtype=bf16"]).unwrap();
        // As the harness receives it.
        let w = &serde_json::to_value(&req.eval.workloads[0]).unwrap();
        assert_eq!(w["name"], "B=2,H=4,L=100,D=64,causal=1,dtype=bf16");
        assert_eq!(
            w["params"],
            json!({"B": 2, "D": 64, "H": 4, "L": 100, "causal": 1, "dtype": "bf16"})
        );
        assert_eq!(w["inputs"][0]["shape"], json!([2, 4, 100, 64]));
        assert_eq!(w["inputs"][0]["dtype"], "bf16");
        assert_eq!(w["inputs"][0]["dist"]["kind"], "normal");
        assert_eq!(w["outputs"][0]["dtype"], "bf16");
        assert_eq!(w["flops"], 4.0 * 2.0 * 4.0 * 100.0 * 100.0 * 64.0 / 2.0);
        assert_eq!(w["bytes"], 4.0 * 2.0 * 2.0 * 4.0 * 100.0 * 64.0);
        // The same numbers as the task's own resolution of that shape.
        let task = attention();
        let own = task
            .workloads("cuda")
            .unwrap()
            .into_iter()
            .find(|w| w.name == "b3h4l100d64-f16")
            .unwrap();
        let req = request("cuda", &["B=3,H=4,L=100,D=64,causal=0,dtype=f16"]).unwrap();
        let made = req.eval.workloads[0].clone();
        assert_eq!(
            (
                made.inputs,
                made.outputs,
                made.flops,
                made.bytes,
                made.params
            ),
            (own.inputs, own.outputs, own.flops, own.bytes, own.params)
        );
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let err =
            |backend: &str, shapes: &[&str]| request(backend, shapes).unwrap_err().to_string();
        assert!(err("cpu", &[]).contains("GPU backends"));
        assert!(err("cuda", &["b9h9"]).contains("neither"));
        assert!(err("cuda", &["B=1,H=1,L=8,D=64,causal=0"]).contains("`dtype`"));
        assert!(err("cuda", &["B=1,H=1,L=8,causal=0,dtype=f16"]).contains("axis `D`"));
        assert!(
            err("cuda", &["B=1,H=1,L=8,D=64,causal=0,dtype=f16,X=2"]).contains("unknown axis `X`")
        );
        assert!(err("cuda", &["B=x,H=1,L=8,D=64,causal=0,dtype=f16"]).contains("not an integer"));
        assert!(err("cuda", &["B=0,H=1,L=8,D=64,causal=0,dtype=f16"])
            .contains("`B` = 0; a dimension must be positive"));
        // The task's checks apply to a shape as to the task's own workloads: what the cuda
        // kernels may assume, and an integer draw for integer inputs.
        assert!(err("cuda", &["B=1,H=1,L=8,D=96,causal=0,dtype=f16"])
            .contains("D = 96 breaks what kernels may assume"));
        assert!(err("cuda", &["B=1,H=1,L=8,D=64,causal=0,dtype=i32"])
            .contains("integer input `q` (i32) needs a `rand_int` or `custom` dist"));
        assert!(err("cuda", &["b3h4l100d64-f16", "b3h4l100d64-f16"]).contains("twice"));
        let task = attention();
        let e = BenchRequest::for_task(
            &task,
            "cuda",
            Path::new("/no/such.cu"),
            &[],
            BenchSettings::default(),
            1,
            Duration::from_secs(1),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("/no/such.cu"), "{e}");
    }
}
