//! `ksearch bench`: one harness process (`python -m ksearch_harness.bench`, outside the
//! protocol ops) times a candidate kernel and the native attention implementations it is
//! compared with (PyTorch SDPA, MLX `mx.fast.scaled_dot_product_attention`) on the same inputs,
//! per workload. A measurement, not a verdict: only static checks and an output check against
//! the task's reference. The process runs like every harness op: own process group, scrubbed
//! environment, request on stdin, result on a private fd, the device's timing lock held.

use crate::error::{EvalError, Result};
use crate::evaluator::Evaluator;
use crate::protocol::PROTOCOL_VERSION;
use crate::request::{fresh_nonce, EvalRequest};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

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

impl BenchRequest {
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
