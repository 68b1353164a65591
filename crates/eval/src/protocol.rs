//! Serde types of harness protocol v1 (docs/ARCHITECTURE.md): the request sections and the
//! result. Every result struct keeps the fields it does not know in `extra`, so a newer harness
//! never loses information on its way to the run store.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;
use std::path::PathBuf;

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// Extra fields a harness reported that this crate has no typed field for.
pub type Extra = Map<String, Value>;

/// Outcome of one evaluation, as reported by the harness (or synthesised by ksearch for a
/// timeout or a broken result channel).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Passed,
    BuildError,
    StaticCheckFailed,
    Incorrect,
    IntegrityViolation,
    RuntimeError,
    Timeout,
    TaskError,
    /// A status this version of ksearch does not know; kept verbatim.
    #[serde(untagged)]
    Other(String),
}

impl Status {
    pub fn as_str(&self) -> &str {
        match self {
            Status::Passed => "passed",
            Status::BuildError => "build_error",
            Status::StaticCheckFailed => "static_check_failed",
            Status::Incorrect => "incorrect",
            Status::IntegrityViolation => "integrity_violation",
            Status::RuntimeError => "runtime_error",
            Status::Timeout => "timeout",
            Status::TaskError => "task_error",
            Status::Other(s) => s,
        }
    }

    pub fn is_passed(&self) -> bool {
        *self == Status::Passed
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Cheat classes (docs/ARCHITECTURE.md, "Cheat classes").
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationClass {
    OutputNotWritten,
    InputMutated,
    StaleOutput,
    DeferredWork,
    PhaseDependent,
    Precision,
    ShapeSpecialisation,
    ReferenceCall,
    ForbiddenCall,
    TimerTampering,
    Nondeterministic,
    ImpossibleTime,
    ResultChannel,
    LazyOutput,
    LingeringWork,
    ForbiddenKernel,
    /// A class this version of ksearch does not know; kept verbatim.
    #[serde(untagged)]
    Other(String),
}

impl ViolationClass {
    pub fn as_str(&self) -> &str {
        match self {
            ViolationClass::OutputNotWritten => "output_not_written",
            ViolationClass::InputMutated => "input_mutated",
            ViolationClass::StaleOutput => "stale_output",
            ViolationClass::DeferredWork => "deferred_work",
            ViolationClass::PhaseDependent => "phase_dependent",
            ViolationClass::Precision => "precision",
            ViolationClass::ShapeSpecialisation => "shape_specialisation",
            ViolationClass::ReferenceCall => "reference_call",
            ViolationClass::ForbiddenCall => "forbidden_call",
            ViolationClass::TimerTampering => "timer_tampering",
            ViolationClass::Nondeterministic => "nondeterministic",
            ViolationClass::ImpossibleTime => "impossible_time",
            ViolationClass::ResultChannel => "result_channel",
            ViolationClass::LazyOutput => "lazy_output",
            ViolationClass::LingeringWork => "lingering_work",
            ViolationClass::ForbiddenKernel => "forbidden_kernel",
            ViolationClass::Other(s) => s,
        }
    }
}

impl fmt::Display for ViolationClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Violation {
    pub class: ViolationClass,
    #[serde(default)]
    pub message: String,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BuildInfo {
    #[serde(default)]
    pub compiler: Option<String>,
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default)]
    pub seconds: Option<f64>,
    #[serde(default)]
    pub log: String,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Seeds {
    #[serde(default)]
    pub secret_seed: Option<u64>,
    #[serde(default)]
    pub trial_seeds: Vec<u64>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// Per-workload measurements. Everything but the name is optional: a workload that failed
/// correctness has no timings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkloadResult {
    pub name: String,
    #[serde(default)]
    pub held_out: bool,
    #[serde(default)]
    pub correct: Option<bool>,
    #[serde(default)]
    pub max_abs_err: Option<f64>,
    #[serde(default)]
    pub max_rel_err: Option<f64>,
    #[serde(default)]
    pub candidate_ns: Vec<f64>,
    #[serde(default)]
    pub reference_ns: Vec<f64>,
    #[serde(default)]
    pub baseline_ns: Vec<f64>,
    #[serde(default)]
    pub candidate_median_ns: Option<f64>,
    #[serde(default)]
    pub candidate_p10_ns: Option<f64>,
    #[serde(default)]
    pub candidate_p90_ns: Option<f64>,
    #[serde(default)]
    pub reference_median_ns: Option<f64>,
    #[serde(default)]
    pub baseline_median_ns: Option<f64>,
    #[serde(default)]
    pub speedup_vs_reference: Option<f64>,
    #[serde(default)]
    pub speedup_vs_baseline: Option<f64>,
    #[serde(default)]
    pub floor_ns: Option<f64>,
    #[serde(default)]
    pub roofline_fraction: Option<f64>,
    /// Interval of the speedup the score uses (vs the baseline, or the reference).
    #[serde(default)]
    pub speedup_interval: Option<[f64; 2]>,
    /// This evaluation's reference median over the yardstick's (with a yardstick only).
    #[serde(default)]
    pub drift: Option<f64>,
    /// How far the paired ratio's median moved between consecutive thirds of the evaluation
    /// (relative half-range), and how often shuffled ratios moved as far (a permutation
    /// p-value: small means load came and went, large means noise).
    #[serde(default)]
    pub ratio_spread: Option<f64>,
    #[serde(default)]
    pub ratio_spread_p: Option<f64>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// The result of one harness operation (`evaluate` or `build`).
///
/// `wall_seconds` and `harness_output` are filled in by ksearch, not by the harness: the wall
/// time is measured around the child process, and `harness_output` is the bounded tail of what
/// the process printed before the harness redirected its own output (interpreter start-up
/// errors land there).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalResult {
    #[serde(default)]
    pub protocol: u32,
    pub nonce: String,
    pub status: Status,
    #[serde(default)]
    pub violation: Option<Violation>,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub build: Option<BuildInfo>,
    #[serde(default)]
    pub environment: Option<Map<String, Value>>,
    #[serde(default)]
    pub seeds: Option<Seeds>,
    #[serde(default)]
    pub workloads: Vec<WorkloadResult>,
    #[serde(default)]
    pub score: Option<f64>,
    /// The score's interval: geometric means of the workloads' bounds (docs/search.md).
    #[serde(default)]
    pub score_interval: Option<[f64; 2]>,
    /// Geometric mean of the workloads' drift (with a yardstick only).
    #[serde(default)]
    pub drift: Option<f64>,
    #[serde(default)]
    pub log_tail: String,
    #[serde(default)]
    pub wall_seconds: f64,
    #[serde(default)]
    pub harness_output: String,
    #[serde(flatten)]
    pub extra: Extra,
}

impl EvalResult {
    /// A result ksearch writes itself (the harness could not report one).
    pub fn synthesised(nonce: &str, status: Status, message: impl Into<String>) -> Self {
        EvalResult {
            protocol: PROTOCOL_VERSION,
            nonce: nonce.to_string(),
            status,
            violation: None,
            message: message.into(),
            build: None,
            environment: None,
            seeds: None,
            workloads: Vec::new(),
            score: None,
            score_interval: None,
            drift: None,
            log_tail: String::new(),
            wall_seconds: 0.0,
            harness_output: String::new(),
            extra: Extra::new(),
        }
    }

    /// The confinement of the process that ran the candidate, as the harness reported it:
    /// (layer, active). Empty when the result has none (a synthesised result, an old harness).
    pub fn sandbox_layers(&self) -> Vec<(String, bool)> {
        self.extra
            .get("sandbox")
            .and_then(Value::as_array)
            .map(|layers| {
                layers
                    .iter()
                    .filter_map(|l| {
                        let name = l.get("name")?.as_str()?.to_string();
                        Some((name, l.get("active").and_then(Value::as_bool) == Some(true)))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn passed(&self) -> bool {
        self.status.is_passed()
    }
}

/// `task` section of a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskSection {
    pub name: String,
    pub dir: PathBuf,
    pub reference: FunctionRef,
    pub baseline: Option<BaselineRef>,
    pub entry: EntrySpec,
    #[serde(default)]
    pub forbidden: Vec<String>,
    /// Library kernels a GPU candidate may run besides its own (the harness's kernel audit).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_kernels: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionRef {
    pub module: String,
    pub function: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineRef {
    pub name: String,
    pub function: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntrySpec {
    pub symbol: String,
    pub args: Vec<String>,
}

/// `candidate` section of a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateSection {
    pub path: PathBuf,
    pub language: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ToleranceSpec {
    pub rtol: f64,
    pub atol: f64,
    /// `"scaled"` (the default, left out of the request) or `"either"`.
    #[serde(default, skip_serializing_if = "is_scaled")]
    pub rule: ksearch_task::ToleranceRule,
    /// The fraction of an output's elements that must be close; 1 is left out.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub matched_ratio: f64,
}

fn is_scaled(rule: &ksearch_task::ToleranceRule) -> bool {
    *rule == ksearch_task::ToleranceRule::Scaled
}

fn one() -> f64 {
    1.0
}

fn is_one(x: &f64) -> bool {
    *x == 1.0
}

impl ToleranceSpec {
    /// The default rule with every element required to pass.
    pub fn scaled(rtol: f64, atol: f64) -> ToleranceSpec {
        ToleranceSpec {
            rtol,
            atol,
            rule: ksearch_task::ToleranceRule::Scaled,
            matched_ratio: 1.0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CorrectnessConfig {
    pub trials: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimingConfig {
    pub warmup: u32,
    pub min_reps: u32,
    pub max_reps: u32,
    pub target_seconds: f64,
    pub flush_bytes: u64,
    /// A workload's timing stops after `min_reps` once half the width of the interval of the
    /// candidate's paired ratio (to the reference, or to the baseline timed beside it) is at
    /// most this fraction of its median; 0 turns the rule off (configs stored before it).
    #[serde(default)]
    pub precision: f64,
}

/// Parses a result line. Python's `json` module writes `NaN` and `Infinity` unless told not to,
/// and an incorrect kernel easily produces a NaN error; such a result is honest, so those
/// tokens are read as `null` instead of failing the whole result.
pub fn parse_result_line(line: &str) -> Result<EvalResult, serde_json::Error> {
    match serde_json::from_str(line) {
        Ok(r) => Ok(r),
        Err(first) => match replace_non_finite(line) {
            Some(fixed) => serde_json::from_str(&fixed),
            None => Err(first),
        },
    }
}

/// Rewrites the bare tokens `NaN`, `Infinity` and `-Infinity` outside strings to `null`;
/// `None` when there was nothing to rewrite.
pub(crate) fn replace_non_finite(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut changed = false;
    let mut in_string = false;
    let mut escaped = false;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        if c == '"' {
            in_string = true;
            out.push(c);
            rest = &rest[1..];
            continue;
        }
        let token = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|t| rest.starts_with(t));
        if let Some(t) = token {
            out.push_str("null");
            rest = &rest[t.len()..];
            changed = true;
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_and_statuses_survive_a_round_trip() {
        let line = r#"{"protocol":1,"nonce":"ab","status":"quantum_error","violation":{"class":"new_cheat","message":"m","where":"line 3"},"workloads":[{"name":"w","held_out":true,"gpu_clock_mhz":1980}],"device_uuid":"GPU-1"}"#;
        let r = parse_result_line(line).unwrap();
        assert_eq!(r.status, Status::Other("quantum_error".into()));
        let v = r.violation.as_ref().unwrap();
        assert_eq!(v.class, ViolationClass::Other("new_cheat".into()));
        assert_eq!(v.extra["where"], "line 3");
        assert_eq!(r.workloads[0].extra["gpu_clock_mhz"], 1980);
        assert_eq!(r.extra["device_uuid"], "GPU-1");
        let back: Value = serde_json::to_value(&r).unwrap();
        assert_eq!(back["status"], "quantum_error");
        assert_eq!(back["device_uuid"], "GPU-1");
        assert_eq!(back["violation"]["class"], "new_cheat");
        assert_eq!(back["workloads"][0]["gpu_clock_mhz"], 1980);
    }

    #[test]
    fn known_classes_use_protocol_spelling() {
        let v: Violation =
            serde_json::from_str(r#"{"class":"shape_specialisation","message":"x"}"#).unwrap();
        assert_eq!(v.class, ViolationClass::ShapeSpecialisation);
        assert_eq!(v.class.as_str(), "shape_specialisation");
        assert_eq!(
            serde_json::to_string(&Status::StaticCheckFailed).unwrap(),
            "\"static_check_failed\""
        );
    }

    #[test]
    fn non_finite_numbers_become_null_but_strings_are_untouched() {
        let line = r#"{"nonce":"NaN","status":"incorrect","message":"got NaN, \"Infinity\"","workloads":[{"name":"w","max_abs_err":NaN,"max_rel_err":-Infinity,"floor_ns":Infinity}]}"#;
        assert!(serde_json::from_str::<EvalResult>(line).is_err());
        let r = parse_result_line(line).unwrap();
        assert_eq!(r.nonce, "NaN");
        assert_eq!(r.message, "got NaN, \"Infinity\"");
        assert_eq!(r.workloads[0].max_abs_err, None);
        assert_eq!(r.workloads[0].max_rel_err, None);
        assert_eq!(r.workloads[0].floor_ns, None);
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse_result_line("not json").is_err());
        assert!(
            parse_result_line(r#"{"status":"passed"}"#).is_err(),
            "nonce is required"
        );
    }
}
