//! The yardstick: a task's baseline and reference timed once, for many evaluations.
//!
//! Scores divide the baseline's time by the candidate's. [`Evaluator::yardstick`] has the
//! harness time the baseline and the reference of every workload of a request, with many samples
//! (harness/ksearch_harness/yardstick.py); requests that carry the result
//! ([`EvalRequest::yardstick`]) are scored against it instead of re-timing the baseline with a
//! handful of samples each, so candidates of one run, or the files of one `ksearch eval`, share
//! one denominator. Each evaluation still times the reference and reports its `drift`: its
//! reference median over the yardstick's. A drift far from 1 means the machine changed, and the
//! yardstick is measured again ([`Yardstick::drifted`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

use crate::error::{EvalError, Result};
use crate::protocol::{EvalResult, TimingConfig};

/// How the yardstick op times: it stops at whichever comes first of a tight median (±0.5%,
/// after at least 15 samples per contender), `target_seconds` of timed calls per workload, or
/// `max_reps` samples.
pub const YARDSTICK_TIMING: TimingConfig = TimingConfig {
    warmup: 2,
    min_reps: 15,
    max_reps: 400,
    target_seconds: 2.0,
    flush_bytes: 64 << 20,
};

/// Below this relative drift a re-measure is never asked for: the per-evaluation reference
/// median is itself a handful of samples.
pub const MIN_DRIFT_LIMIT: f64 = 0.10;
/// The drift limit in units of the yardstick's own spread between blocks.
pub const DRIFT_SPREADS: f64 = 4.0;

/// One contender's time in the yardstick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub median_ns: f64,
    pub lo_ns: f64,
    pub hi_ns: f64,
    /// Relative half-range of the medians of consecutive blocks of samples.
    #[serde(default)]
    pub spread: f64,
    #[serde(default)]
    pub samples_ns: Vec<f64>,
}

/// The yardstick of one workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadYardstick {
    #[serde(default)]
    pub baseline: Option<Measured>,
    pub reference: Measured,
}

/// What the harness's `yardstick` op reported, kept whole (it travels back to the harness in
/// every request scored against it, and into the run store with every result).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Yardstick {
    pub version: u32,
    pub backend: String,
    /// Whether the task has a baseline (else scores divide the reference's time).
    pub baseline: bool,
    pub workloads: BTreeMap<String, WorkloadYardstick>,
    /// Seconds the op spent timing.
    #[serde(default)]
    pub seconds: f64,
}

impl Yardstick {
    /// Takes the `yardstick` object out of a passed harness result.
    pub fn from_result(result: &EvalResult) -> Result<Self> {
        if !result.passed() {
            return Err(EvalError::Yardstick(format!(
                "{}: {}",
                result.status, result.message
            )));
        }
        let value = result
            .extra
            .get("yardstick")
            .cloned()
            .ok_or_else(|| EvalError::Yardstick("the harness reported no yardstick".into()))?;
        Self::from_value(value)
    }

    pub fn from_value(value: Value) -> Result<Self> {
        serde_json::from_value(value).map_err(|e| EvalError::Yardstick(e.to_string()))
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// What scores divide, for one workload.
    pub fn denominator(&self, workload: &str) -> Option<&Measured> {
        let w = self.workloads.get(workload)?;
        if self.baseline {
            w.baseline.as_ref()
        } else {
            Some(&w.reference)
        }
    }

    /// The largest spread between blocks among the measured times: the machine's drift while
    /// the yardstick was timed.
    pub fn spread(&self) -> f64 {
        self.workloads
            .values()
            .flat_map(|w| w.baseline.iter().chain(std::iter::once(&w.reference)))
            .map(|m| m.spread)
            .fold(0.0, f64::max)
    }

    /// The relative drift beyond which an evaluation's reference says the machine changed.
    pub fn drift_limit(&self) -> f64 {
        MIN_DRIFT_LIMIT.max(DRIFT_SPREADS * self.spread())
    }

    /// Whether `drift` (an evaluation's reference median over the yardstick's) is beyond
    /// [`drift_limit`](Self::drift_limit) either way.
    pub fn drifted(&self, drift: f64) -> bool {
        drift.is_finite() && drift > 0.0 && drift.ln().abs() > (1.0 + self.drift_limit()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn measured(median: f64, spread: f64) -> Value {
        json!({"median_ns": median, "lo_ns": median * 0.99, "hi_ns": median * 1.01,
               "spread": spread, "samples_ns": [median]})
    }

    fn sample() -> Yardstick {
        Yardstick::from_value(json!({
            "version": 1, "backend": "cpu", "baseline": true, "seconds": 1.5,
            "workloads": {
                "a": {"baseline": measured(100.0, 0.01), "reference": measured(300.0, 0.04)},
                "b": {"baseline": measured(50.0, 0.0), "reference": measured(70.0, 0.0)},
            },
        }))
        .unwrap()
    }

    #[test]
    fn denominators_spread_and_drift() {
        let y = sample();
        assert_eq!(y.denominator("a").unwrap().median_ns, 100.0);
        assert!(y.denominator("c").is_none());
        assert!((y.spread() - 0.04).abs() < 1e-12);
        assert!((y.drift_limit() - 0.16).abs() < 1e-12);
        assert!(!y.drifted(1.15) && !y.drifted(1.0 / 1.15));
        assert!(y.drifted(1.2) && y.drifted(1.0 / 1.2));
        assert!(!y.drifted(f64::NAN));
        let mut no_base = y.clone();
        no_base.baseline = false;
        assert_eq!(no_base.denominator("b").unwrap().median_ns, 70.0);
        assert_eq!(Yardstick::from_value(y.to_value()).unwrap(), y);
    }

    #[test]
    fn a_failed_or_empty_result_is_an_error() {
        let mut r = EvalResult::synthesised("n", crate::Status::TaskError, "no baseline");
        let e = Yardstick::from_result(&r).unwrap_err().to_string();
        assert!(e.contains("no baseline"), "{e}");
        r.status = crate::Status::Passed;
        assert!(Yardstick::from_result(&r).is_err());
        r.extra.insert("yardstick".into(), sample().to_value());
        assert_eq!(Yardstick::from_result(&r).unwrap(), sample());
    }
}
