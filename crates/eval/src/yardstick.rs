//! The yardstick: a task's baseline and reference timed once, for many evaluations.
//!
//! A score is the candidate's speedup over the task's baseline. [`Evaluator::yardstick`] has the
//! harness time the baseline and the reference of every workload back to back, with many
//! samples (harness/ksearch_harness/yardstick.py). Requests that carry the result
//! ([`EvalRequest::yardstick`]) do not time the baseline: their speedup is the yardstick's
//! baseline/reference ratio times the evaluation's own reference/candidate ratio, both medians of
//! ratios paired within one repetition, so the candidates of one run, or the files of one
//! `ksearch eval`, share one conversion factor measured with care, and a moment of machine load
//! slows both members of a pair alike. Each evaluation reports its `drift`: its reference median
//! over the yardstick's. A drift far from 1 means the machine changed, and the yardstick is
//! measured again ([`Yardstick::drifted`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

use crate::error::{EvalError, Result};
use crate::protocol::{EvalResult, TimingConfig};

/// How the yardstick op times for evaluations timed with `eval`: it stops at whichever comes
/// first of tight medians (±0.5%, after at least 15 samples per contender), twice the
/// evaluations' `target_seconds` of wall time per workload (at least half a second), or 200
/// samples.
pub fn yardstick_timing(eval: &TimingConfig) -> TimingConfig {
    TimingConfig {
        warmup: eval.warmup.max(2),
        min_reps: 15,
        max_reps: 200,
        target_seconds: (2.0 * eval.target_seconds).max(0.5),
        flush_bytes: eval.flush_bytes,
        // The yardstick op has its own rule (±0.5% on every contender's median).
        precision: 0.0,
    }
}

/// Below this relative drift a re-measure is never asked for: the per-evaluation reference
/// median is itself a handful of samples.
pub const MIN_DRIFT_LIMIT: f64 = 0.10;
/// Beyond this one it always is, however noisy the yardstick was.
pub const MAX_DRIFT_LIMIT: f64 = 0.25;
/// The drift limit in units of the reference's spread between the yardstick's blocks.
pub const DRIFT_SPREADS: f64 = 4.0;
/// A yardstick whose baseline/reference ratio drifted more than this between its blocks, by
/// more than noise explains (a permutation p-value below [`DRIFT_P`]), was measured while the
/// machine changed: it is measured again (the tightest of a few attempts is kept).
pub const MAX_RATIO_SPREAD: f64 = 0.05;
/// Below this permutation p-value a spread between blocks is drift rather than noise (with a
/// few samples per block, noise alone spreads block medians by several percent).
pub const DRIFT_P: f64 = 0.05;
/// A passed evaluation whose score interval spans more than this factor is repeated.
pub const UNSTEADY_SPAN: f64 = 2.0;
/// Attempts at a yardstick within [`MAX_RATIO_SPREAD`].
pub const YARDSTICK_ATTEMPTS: usize = 2;
/// Repeats of unsteady evaluations made before [`RepeatYield`] judges whether they pay.
pub const REPEAT_TRIAL: u32 = 3;
/// The share of repeats that must come out steady for repeating to go on after the trial.
pub const REPEAT_MIN_YIELD: f64 = 1.0 / 3.0;

/// Whether repeating unsteady evaluations pays on this machine. A repeat (a new yardstick,
/// then the evaluation again) is worth its time when the unsteadiness passes, as a burst of
/// load does; on a machine whose timings vary this much all the time (a small shared VM with
/// multi-threaded candidates) the repeat comes out as unsteady as the first try and doubles
/// the cost of every such evaluation. After [`REPEAT_TRIAL`] repeats, repeating goes on only
/// while at least [`REPEAT_MIN_YIELD`] of them came out steady; otherwise unsteady results
/// are kept as measured, their wide intervals saying what they are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepeatYield {
    /// Repeats made.
    pub made: u32,
    /// Repeats whose result was steady.
    pub steady: u32,
}

impl RepeatYield {
    /// Whether the next unsteady evaluation should be repeated.
    pub fn worth_repeating(&self) -> bool {
        self.made < REPEAT_TRIAL
            || f64::from(self.steady) >= REPEAT_MIN_YIELD * f64::from(self.made)
    }

    /// Records one repeat and whether it came out steady.
    pub fn record(&mut self, steady: bool) {
        self.made += 1;
        self.steady += u32::from(steady);
    }
}

/// One contender's time in the yardstick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub median_ns: f64,
    pub lo_ns: f64,
    pub hi_ns: f64,
    /// Relative half-range of the medians of consecutive blocks of samples.
    #[serde(default)]
    pub spread: f64,
    /// How often shuffled samples spread their block medians as far (a permutation p-value;
    /// 0 when the harness did not say, which counts as drift).
    #[serde(default)]
    pub spread_p: f64,
    #[serde(default)]
    pub samples_ns: Vec<f64>,
}

/// The median of a paired ratio in the yardstick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ratio {
    pub median: f64,
    pub lo: f64,
    pub hi: f64,
    #[serde(default)]
    pub spread: f64,
    /// As [`Measured::spread_p`].
    #[serde(default)]
    pub spread_p: f64,
    #[serde(default)]
    pub samples: Vec<f64>,
}

/// What an evaluation pairs a candidate's timed calls with (the harness's `yardstick.anchor`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Anchor {
    /// The task's reference; the yardstick's baseline/reference ratio converts the paired
    /// ratio into a score (the cpu backend, and tasks without a baseline).
    #[default]
    Reference,
    /// The baseline itself, paired directly (the GPU backends, for tasks with a baseline).
    Baseline,
}

/// The yardstick of one workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadYardstick {
    #[serde(default)]
    pub baseline: Option<Measured>,
    pub reference: Measured,
    /// The baseline's time over the reference's, paired per repetition (tasks with a
    /// baseline): what converts an evaluation's speedup over the reference into its score.
    #[serde(default)]
    pub baseline_over_reference: Option<Ratio>,
}

/// What the harness's `yardstick` op reported, kept whole (it travels back to the harness in
/// every request scored against it, and into the run store with every result).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Yardstick {
    pub version: u32,
    pub backend: String,
    /// Whether the task has a baseline (else scores divide the reference's time).
    pub baseline: bool,
    /// What evaluations pair candidates with (absent from yardsticks of older harnesses,
    /// which paired with the reference).
    #[serde(default)]
    pub anchor: Anchor,
    pub workloads: BTreeMap<String, WorkloadYardstick>,
    /// Seconds the op spent timing.
    #[serde(default)]
    pub seconds: f64,
    /// Wall seconds of every attempt's harness process, this one's and any discarded for
    /// drifting ([`Evaluator::yardstick`](crate::Evaluator::yardstick)); 0 when not recorded.
    #[serde(default)]
    pub spent_seconds: f64,
    /// Attempts made for this yardstick (0 when not recorded).
    #[serde(default)]
    pub attempts: u32,
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

    /// (spread, spread_p) per workload of what scores rest on: the baseline/reference ratio
    /// where evaluations pair with the reference (it converts every score), the baseline's
    /// own times where they pair with the baseline (it is what every evaluation's drift is
    /// measured against).
    fn score_basis(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        self.workloads
            .values()
            .filter_map(move |w| match self.anchor {
                Anchor::Reference => w
                    .baseline_over_reference
                    .as_ref()
                    .map(|r| (r.spread, r.spread_p)),
                Anchor::Baseline => w.baseline.as_ref().map(|b| (b.spread, b.spread_p)),
            })
    }

    /// The largest spread between blocks of what scores rest on ([`Self::score_basis`]): how
    /// much it moved while it was measured.
    pub fn ratio_spread(&self) -> f64 {
        self.score_basis().map(|(s, _)| s).fold(0.0, f64::max)
    }

    /// Whether what scores rest on drifted for some workload while it was measured: its
    /// blocks spread beyond [`MAX_RATIO_SPREAD`] by more than noise explains.
    pub fn ratio_drifted(&self) -> bool {
        self.score_basis()
            .any(|(spread, p)| spread > MAX_RATIO_SPREAD && p < DRIFT_P)
    }

    /// The largest spread between blocks of the anchor's times (the reference's, or the
    /// baseline's where evaluations pair with it).
    pub fn spread(&self) -> f64 {
        self.workloads
            .values()
            .map(|w| match (self.anchor, &w.baseline) {
                (Anchor::Baseline, Some(b)) => b.spread,
                _ => w.reference.spread,
            })
            .fold(0.0, f64::max)
    }

    /// The relative drift beyond which an evaluation's reference says the machine changed.
    pub fn drift_limit(&self) -> f64 {
        (DRIFT_SPREADS * self.spread()).clamp(MIN_DRIFT_LIMIT, MAX_DRIFT_LIMIT)
    }

    /// Whether `result` was measured while the machine was changing: its drift is beyond
    /// [`drift_limit`](Self::drift_limit), or its score's interval spans more than a factor
    /// of [`UNSTEADY_SPAN`] and some workload's paired ratio moved between the evaluation's
    /// thirds beyond noise (load that came and went). An interval that is wide from noise
    /// alone is not repeated: a repeat would be as wide. A result timed while another
    /// process's work still ran on the device (judges in lanes: the harness's bounded wait for
    /// an idle device gave up, `diagnostics.gate.busy_when_timed`) is unsteady too.
    pub fn unsteady(&self, result: &EvalResult) -> bool {
        let shared = result
            .extra
            .get("diagnostics")
            .and_then(|d| d.get("gate"))
            .and_then(|g| g.get("busy_when_timed"))
            .and_then(Value::as_bool)
            == Some(true);
        let drifted = shared || result.drift.is_some_and(|d| self.drifted(d));
        let wide = match (result.score, result.score_interval) {
            (Some(_), Some([lo, hi])) => lo <= 0.0 || hi / lo > UNSTEADY_SPAN,
            _ => false,
        };
        // A harness that did not report the p-value: the width counts as load.
        let moved = result
            .workloads
            .iter()
            .any(|w| w.ratio_spread_p.is_none_or(|p| p < DRIFT_P));
        result.passed() && (drifted || (wide && moved))
    }

    /// Whether `drift` (an evaluation's anchor median over the yardstick's) is beyond
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

    fn ratio(median: f64, spread: f64) -> Value {
        json!({"median": median, "lo": median * 0.99, "hi": median * 1.01, "spread": spread,
               "spread_p": 0.5})
    }

    fn sample() -> Yardstick {
        Yardstick::from_value(json!({
            "version": 1, "backend": "cpu", "baseline": true, "seconds": 1.5,
            "workloads": {
                "a": {"baseline": measured(100.0, 0.01), "reference": measured(300.0, 0.04),
                      "baseline_over_reference": ratio(0.33, 0.02)},
                "b": {"baseline": measured(50.0, 0.0), "reference": measured(70.0, 0.0),
                      "baseline_over_reference": ratio(0.7, 0.01)},
            },
        }))
        .unwrap()
    }

    #[test]
    fn spreads_and_drift() {
        let y = sample();
        assert!((y.spread() - 0.04).abs() < 1e-12);
        assert!((y.ratio_spread() - 0.02).abs() < 1e-12);
        assert!((y.drift_limit() - 0.16).abs() < 1e-12);
        assert!(!y.drifted(1.15) && !y.drifted(1.0 / 1.15));
        assert!(y.drifted(1.2) && y.drifted(1.0 / 1.2));
        assert!(!y.drifted(f64::NAN));
        // However noisy the reference was, a 30% drift asks for a re-measure.
        let mut noisy = y.clone();
        noisy.workloads.get_mut("a").unwrap().reference.spread = 0.5;
        assert!((noisy.drift_limit() - MAX_DRIFT_LIMIT).abs() < 1e-12);
        assert!(noisy.drifted(1.3));
        assert_eq!(Yardstick::from_value(y.to_value()).unwrap(), y);
    }

    #[test]
    fn a_baseline_anchor_rests_on_the_baselines_own_times() {
        let mut v = sample().to_value();
        v["anchor"] = json!("baseline");
        let mut y = Yardstick::from_value(v).unwrap();
        assert_eq!(y.anchor, Anchor::Baseline);
        // The baseline's spreads (0.01, 0.0), not the reference's or the ratio's.
        assert!((y.spread() - 0.01).abs() < 1e-12);
        assert!((y.ratio_spread() - 0.01).abs() < 1e-12);
        assert!((y.drift_limit() - MIN_DRIFT_LIMIT).abs() < 1e-12);
        // A drifting ratio does not matter to scores paired with the baseline ...
        let w = y.workloads.get_mut("a").unwrap();
        let r = w.baseline_over_reference.as_mut().unwrap();
        r.spread = 0.3;
        r.spread_p = 0.0;
        assert!(!y.ratio_drifted());
        // ... a drifting baseline does.
        let b = y.workloads.get_mut("a").unwrap().baseline.as_mut().unwrap();
        b.spread = 0.3;
        b.spread_p = 0.0;
        assert!(y.ratio_drifted());
        // Older yardsticks, without the field, paired with the reference.
        let mut old = sample().to_value();
        old.as_object_mut().unwrap().remove("anchor");
        assert_eq!(
            Yardstick::from_value(old).unwrap().anchor,
            Anchor::Reference
        );
    }

    #[test]
    fn only_a_spread_beyond_noise_is_drift() {
        let mut y = sample();
        assert!(!y.ratio_drifted());
        let r = y
            .workloads
            .get_mut("a")
            .unwrap()
            .baseline_over_reference
            .as_mut()
            .unwrap();
        // Wide, but shuffled samples spread as far half the time: noise.
        r.spread = 0.12;
        assert!(!y.clone().ratio_drifted());
        // Wide and beyond what shuffles show: drift.
        y.workloads
            .get_mut("a")
            .unwrap()
            .baseline_over_reference
            .as_mut()
            .unwrap()
            .spread_p = 0.01;
        assert!(y.ratio_drifted());
        // A harness that did not report the p-value: a wide spread counts as drift.
        let mut old = y.to_value();
        old["workloads"]["a"]["baseline_over_reference"]
            .as_object_mut()
            .unwrap()
            .remove("spread_p");
        assert!(Yardstick::from_value(old).unwrap().ratio_drifted());
    }

    #[test]
    fn unsteady_means_drift_or_load_that_came_and_went() {
        let y = sample();
        let mut r = EvalResult::synthesised("n", crate::Status::Passed, "");
        r.score = Some(1.0);
        r.score_interval = Some([0.8, 1.25]);
        r.drift = Some(1.02);
        r.workloads = vec![crate::WorkloadResult {
            name: "a".into(),
            ratio_spread: Some(0.3),
            ratio_spread_p: Some(0.4),
            ..Default::default()
        }];
        assert!(!y.unsteady(&r));
        // The reference ran 30% slower than in the yardstick: the machine changed.
        r.drift = Some(1.3);
        assert!(y.unsteady(&r));
        r.drift = Some(1.02);
        // Wider than 2x from noise alone: a repeat would be as wide.
        r.score_interval = Some([0.5, 1.6]);
        assert!(!y.unsteady(&r));
        // Wide, and the paired ratio moved between thirds beyond noise: repeated.
        r.workloads[0].ratio_spread_p = Some(0.01);
        assert!(y.unsteady(&r));
        // An older harness without the p-value: the width alone decides.
        r.workloads[0].ratio_spread_p = None;
        assert!(y.unsteady(&r));
        // Timed while another process's kernels still ran on the device (lanes).
        r.workloads[0].ratio_spread_p = Some(0.4);
        r.score_interval = Some([0.8, 1.25]);
        assert!(!y.unsteady(&r));
        r.extra.insert(
            "diagnostics".into(),
            json!({"gate": {"busy_when_timed": true}}),
        );
        assert!(y.unsteady(&r));
        // A failed evaluation is never repeated.
        r.status = crate::Status::Incorrect;
        assert!(!y.unsteady(&r));
    }

    #[test]
    fn repeating_stops_once_repeats_come_out_as_unsteady_as_first_tries() {
        let mut y = RepeatYield::default();
        // The trial: repeats are made whatever they yield.
        for _ in 0..REPEAT_TRIAL {
            assert!(y.worth_repeating());
            y.record(false);
        }
        assert!(!y.worth_repeating(), "{y:?}");
        // One repeat in three that came out steady keeps repeating worth it.
        let mut y = RepeatYield::default();
        y.record(false);
        y.record(true);
        y.record(false);
        assert!(y.worth_repeating());
        y.record(false);
        assert!(!y.worth_repeating(), "1 of 4 is below a third: {y:?}");
        y.record(true);
        assert!(y.worth_repeating(), "2 of 5: {y:?}");
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
