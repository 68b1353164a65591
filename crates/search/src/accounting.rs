//! Where a run's time went: wall time, evaluations per hour, time per harness phase and the
//! device's busy fraction, computed after the fact from what the run store holds (`ksearch show`
//! prints it).
//!
//! This lives in the search crate, not in the store, because reading the store's rows takes
//! search concepts the store deliberately does not interpret: which rows are harness runs (a
//! lint rejection or a result reused for an identical source is not), which events carry
//! evaluations of their own (the re-measures and the confirmation), and the harness result's
//! timing fields. The store only supplies the rows and the run's time stamps ([`RunSpan`]).
//!
//! Definitions (docs/cli.md, `show`, repeats them for users):
//!
//! - **wall**: the run row's creation to its finish; for an unfinished run, to its latest
//!   record (candidate, evaluation, exchange or event). A resumed run's wall includes the time
//!   it was stopped: the store records no resume.
//! - **harness runs**: evaluations in the `evaluations` table that ran the harness (not lint
//!   rejections, not reused results), plus the results recorded inside events (`results[].result`
//!   of `remeasure` and `confirmation`), each counted once by its nonce.
//!   **evaluations per hour** = harness runs ÷ wall hours.
//! - **phases**: each result's `diagnostics.phase_seconds` summed over the harness runs (phases
//!   are exclusive: a nested phase's time counts for it alone); **harness, no phase** = the
//!   result's `total` minus its phases; **harness start/exit** = `wall_seconds` (the harness
//!   process as the evaluator timed it) minus `total`; a result with `wall_seconds` but no
//!   phases counts whole as **harness, no phase data**.
//! - **yardstick**: for each distinct yardstick the results were scored against (the same
//!   yardstick is repeated in many results; it is counted once, keyed by its content), the wall
//!   time of all its attempts' processes (`spent_seconds`, discarded attempts included), or
//!   its own timing `seconds` where that was not recorded.
//! - the first try of an evaluation repeated because the machine was changing counts like any
//!   harness run where its result keeps its times (`unsteady_first`).
//! - **profiler**: the wall time of the profiles of new bests (`profile.spent_seconds` of a
//!   stored result, engine::evaluation): Nsight Compute replaying the kernel, counted as
//!   harness time, not device work, since it measures nothing the scores use.
//! - **build requests** and **builds written ahead, waited for**: the `build` request the
//!   search makes before each evaluation (a compile on the cpu, in the timing lock; on a GPU
//!   usually none: the passed build written ahead is taken, `written_ahead`; none for a source
//!   the evaluator built before, `built_before`) and its wait for a
//!   build it started ahead of time that was still running (`build_request` of a result:
//!   `seconds`, `waited_seconds`, engine::evaluation).
//!   Where sample threads overlap, such a wait can overlap another sample's evaluation.
//! - **proposer**: the LLM calls' recorded latencies (absent for the offline proposer, whose
//!   time is in *other*).
//! - **other** = the wall minus all of the above: the search's own work, what older stores did
//!   not record (discarded yardstick attempts, first tries of repeated evaluations), the
//!   offline proposer, waiting.
//! - **typical evaluation**: over the stored harness runs with phases, the median of their
//!   `total` and the median of their device phases' share of it. The first evaluation and the
//!   re-checks pay the run's draws and fresh processes; the median is what a search evaluation
//!   costs in between, and its device share bounds the busy fraction a run could reach if
//!   nothing but such evaluations filled its wall.
//! - **device work** = the phases [`DEVICE_PHASES`] plus the yardsticks: the phases in which
//!   the device (the CPU, for the cpu backend) runs the candidate's, the reference's or the
//!   baseline's work, or work that sets the device up for a timed call. **Device busy
//!   fraction** = device work ÷ wall. A bound from above: a phase counts whole, the round
//!   trips to the candidate's process inside it included, and where evaluations ran side by
//!   side (judges in lanes, `ksearch_eval::judge::lanes`) their phases are summed although
//!   they overlapped (`overlap_seconds` says by how much the parts exceed the wall). Their
//!   waits for each other's timed work are the harness phase `gate`.
//!
//! Old stores without these fields still account: what is missing is left out, and the values
//! that need it are `None`.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;
use serde_json::Value;

use ksearch_store::{
    timestamp_millis, EvaluationRow, EventRow, RunSpan, RunStore, StoreError, Usage,
};

use crate::engine::LINT_FAILED;

/// The harness phases (`diagnostics.phase_seconds` keys) in which the device is at work:
///
/// - `timed_calls`: the timed calls of the candidate, the reference and the baseline;
/// - `candidate`: the candidate's correctness calls;
/// - `reference`: the reference computing the expected outputs (and checking them);
/// - `prime`: untimed priming calls before a timed call (GPU backends);
/// - `flush`: the cache flush before every timed call (the device writes a large buffer);
/// - `clock_warmup`: bringing the device clocks up before a timed call;
/// - `calibration`: the round trips to the accused that calibrate the timer.
///
/// The rest is the judge's own work around the device, not work on it: `task`, `build`,
/// `roofline`, `load`, `checks` (comparisons), `upload` (staging inputs and poisoned outputs),
/// `inputs` (drawing inputs on the host), `settle` (watching the accused's threads while the
/// device is deliberately left alone). A phase this list does not name (from a newer harness)
/// counts as harness time, not device time.
pub const DEVICE_PHASES: &[&str] = &[
    "timed_calls",
    "candidate",
    "reference",
    "prime",
    "flush",
    "clock_warmup",
    "calibration",
];

/// Names of the parts that are not harness phases.
pub const YARDSTICK: &str = "yardstick";
pub const HARNESS_START_EXIT: &str = "harness start/exit";
pub const HARNESS_NO_PHASE: &str = "harness, no phase";
pub const HARNESS_NO_PHASE_DATA: &str = "harness, no phase data";
pub const PROPOSER: &str = "proposer (LLM calls)";
pub const PROFILER: &str = "profiler";
/// The harness phase of waits at the device gate (judges in lanes).
pub const GATE: &str = "gate";
pub const BUILD_REQUESTS: &str = "build requests";
pub const BUILD_WAITS: &str = "builds written ahead, waited for";
pub const OTHER: &str = "other";

/// What kind of time a part is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeKind {
    /// Device work (counts for the busy fraction).
    Device,
    /// The harness, outside device work.
    Harness,
    /// LLM calls.
    Proposer,
    /// The wall not accounted for by anything else.
    Other,
}

/// One part of the wall.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimePart {
    pub name: String,
    pub seconds: f64,
    pub kind: TimeKind,
}

/// How the wall's end was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WallEnd {
    /// The run finished.
    Finished,
    /// Not finished: the latest record.
    LastRecord,
}

/// Evaluations by where they were recorded.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EvaluationCounts {
    /// Harness runs in the `evaluations` table.
    pub stored: u64,
    /// Harness runs recorded only inside events, by event kind (`remeasure`, `confirmation`).
    pub in_events: BTreeMap<String, u64>,
    /// Harness runs whose result carries `phase_seconds`.
    pub with_phases: u64,
    /// Stored rows that reuse an earlier result for an identical source (no harness run).
    pub reused: u64,
    /// Stored rows that are lint rejections (no harness run).
    pub lint_rejected: u64,
    /// Harness runs that are the repeat of a first try made while the machine was changing
    /// (`unsteady_first`); the first try's time is counted where the result records it.
    pub unsteady_repeats: u64,
    /// Unsteady results kept as measured because repeats had stopped paying on the machine
    /// (`unsteady_kept`).
    pub unsteady_kept: u64,
    /// Stored results profiled as a new best (`profile.spent_seconds`).
    pub profiled: u64,
    /// Those whose profile took a profiler the judge had started ahead (its first workload's
    /// `started_ahead_seconds`).
    pub profiled_ahead: u64,
    /// Harness runs judged beside other judges of the device (`judge_lanes` above one), the
    /// most lanes any of them had, and how many were timed while the device still ran other
    /// work after the bounded wait for it (`diagnostics.gate.busy_when_timed`).
    pub in_lanes: u64,
    pub lanes: u64,
    pub busy_when_timed: u64,
}

impl EvaluationCounts {
    /// Every harness run whose result was recorded.
    pub fn harness_runs(&self) -> u64 {
        self.stored + self.in_events.values().sum::<u64>()
    }
}

/// The builds written ahead that evaluations took (`build_request.ahead`): how long their
/// compiles ran and how long before their evaluation asked for them they started, which tells
/// a wait for one as a late start or a slow compile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AheadBuilds {
    /// Builds written ahead that an evaluation took.
    pub taken: u64,
    /// Of those, the ones an evaluation waited for ([`AHEAD_WAIT_NOTED`] or more).
    pub waited_for: u64,
    pub compile_median_seconds: f64,
    pub compile_max_seconds: f64,
    /// The median of how many seconds before its evaluation asked for it a build started.
    pub head_start_median_seconds: f64,
}

/// A typical stored evaluation (see the module's definitions).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TypicalEvaluation {
    /// Stored harness runs with phase times (what the medians are taken over).
    pub count: u64,
    /// The median of their harness `total` seconds.
    pub median_seconds: f64,
    /// The median of their device phases' share of `total` (a bound from above, as the busy
    /// fraction is).
    pub median_device_share: f64,
}

/// A wait for a build written ahead shorter than this is not counted as one (taking a finished
/// build takes microseconds).
pub const AHEAD_WAIT_NOTED: f64 = 0.05;

/// A run's time, accounted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimeAccount {
    /// Seconds from the run's start to its end; `None` when the stamps cannot be read.
    pub wall_seconds: Option<f64>,
    pub wall_end: WallEnd,
    pub evaluations: EvaluationCounts,
    /// Harness runs ÷ wall hours; `None` without a positive wall.
    pub evaluations_per_hour: Option<f64>,
    /// Distinct yardsticks with a recorded `seconds`.
    pub yardsticks: u64,
    /// Every part with time, largest first; `other` is among them when the wall is known.
    pub parts: Vec<TimePart>,
    /// Device work (the [`DEVICE_PHASES`] and the yardsticks); `None` when no result carries
    /// phase times and no yardstick was recorded (an old store).
    pub device_seconds: Option<f64>,
    /// Device work ÷ wall.
    pub busy_fraction: Option<f64>,
    /// How far the accounted parts exceed the wall (work that overlapped in time); 0 normally.
    pub overlap_seconds: f64,
    /// The builds written ahead that evaluations took; `None` when no result records one.
    pub builds_ahead: Option<AheadBuilds>,
    /// A typical stored evaluation; `None` when no stored result carries phase times.
    pub typical_evaluation: Option<TypicalEvaluation>,
    /// Where the profiled processes' own time went, summed over the profiles of new bests, by
    /// step (`profile.workloads[].target_seconds`: device, load, inputs, calls); the rest of
    /// the profiler's seconds is its start and end and the interpreter's.
    pub profile_steps: BTreeMap<String, f64>,
}

impl TimeAccount {
    /// Accounts the run in `store`.
    pub fn of_run(store: &RunStore) -> Result<TimeAccount, StoreError> {
        Ok(TimeAccount::from_records(
            &store.span()?,
            &store.evaluations()?,
            &store.events_after(0)?,
            &store.usage_totals()?,
        ))
    }

    /// Accounts a run from its rows (what [`TimeAccount::of_run`] reads).
    pub fn from_records(
        span: &RunSpan,
        evaluations: &[EvaluationRow],
        events: &[EventRow],
        usage: &Usage,
    ) -> TimeAccount {
        let (end, wall_end) = match &span.finished_at {
            Some(f) => (Some(f.as_str()), WallEnd::Finished),
            None => (span.last_record_at.as_deref(), WallEnd::LastRecord),
        };
        let wall_seconds = match (timestamp_millis(&span.started_at), end) {
            (Some(start), Some(end)) => {
                timestamp_millis(end).map(|end| (end - start).max(0) as f64 / 1000.0)
            }
            // Nothing recorded yet: no time has been spent on anything.
            (Some(_), None) => Some(0.0),
            (None, _) => None,
        };

        let mut acc = Accumulator::default();
        for e in evaluations {
            if e.status == LINT_FAILED || e.result["status"] == LINT_FAILED {
                acc.counts.lint_rejected += 1;
            } else if !e.result["reused_from_candidate"].is_null() {
                acc.counts.reused += 1;
            } else if acc.add(&e.result) {
                acc.counts.stored += 1;
                acc.add_stored_shape(&e.result);
                if let Some(s) = seconds(&e.result["profile"]["spent_seconds"]) {
                    acc.counts.profiled += 1;
                    if e.result["profile"]["workloads"][0]["started_ahead_seconds"].is_number() {
                        acc.counts.profiled_ahead += 1;
                    }
                    acc.profile_seconds += s;
                    acc.add_profile_steps(&e.result["profile"]);
                }
            }
        }
        for ev in events {
            let Some(results) = ev.data["results"].as_array() else {
                continue;
            };
            for r in results {
                if r["result"].is_object() && acc.add(&r["result"]) {
                    *acc.counts.in_events.entry(ev.kind.clone()).or_default() += 1;
                }
            }
        }

        let mut parts: Vec<TimePart> = acc
            .phases
            .iter()
            .map(|(name, seconds)| TimePart {
                name: name.clone(),
                seconds: *seconds,
                kind: if DEVICE_PHASES.contains(&name.as_str()) {
                    TimeKind::Device
                } else {
                    TimeKind::Harness
                },
            })
            .collect();
        if acc.start_exit > 0.0 {
            parts.push(part(HARNESS_START_EXIT, acc.start_exit, TimeKind::Harness));
        }
        if acc.unclaimed > 0.0 {
            parts.push(part(HARNESS_NO_PHASE, acc.unclaimed, TimeKind::Harness));
        }
        if acc.no_phase_data > 0.0 {
            parts.push(part(
                HARNESS_NO_PHASE_DATA,
                acc.no_phase_data,
                TimeKind::Harness,
            ));
        }
        if acc.yardsticks > 0 {
            parts.push(part(YARDSTICK, acc.yardstick_seconds, TimeKind::Device));
        }
        if acc.counts.profiled > 0 {
            parts.push(part(PROFILER, acc.profile_seconds, TimeKind::Harness));
        }
        parts.push(part(
            BUILD_REQUESTS,
            acc.build_request_seconds,
            TimeKind::Harness,
        ));
        parts.push(part(BUILD_WAITS, acc.build_wait_seconds, TimeKind::Harness));
        if usage.calls > 0 {
            parts.push(part(
                PROPOSER,
                usage.latency_ms as f64 / 1000.0,
                TimeKind::Proposer,
            ));
        }
        let accounted: f64 = parts.iter().map(|p| p.seconds).sum();
        let mut overlap_seconds = 0.0;
        if let Some(wall) = wall_seconds {
            overlap_seconds = (accounted - wall).max(0.0);
            parts.push(part(OTHER, (wall - accounted).max(0.0), TimeKind::Other));
        }
        parts.retain(|p| p.seconds > 0.0 || p.kind == TimeKind::Other);
        parts.sort_by(|a, b| {
            b.seconds
                .total_cmp(&a.seconds)
                .then_with(|| a.name.cmp(&b.name))
        });

        let device_seconds = (acc.counts.with_phases > 0 || acc.yardsticks > 0).then(|| {
            parts
                .iter()
                .filter(|p| p.kind == TimeKind::Device)
                .map(|p| p.seconds)
                .sum::<f64>()
        });
        let positive_wall = wall_seconds.filter(|w| *w > 0.0);
        let builds_ahead = acc.builds_ahead();
        let typical_evaluation = acc.typical_evaluation();
        TimeAccount {
            wall_seconds,
            wall_end,
            evaluations_per_hour: positive_wall
                .map(|w| acc.counts.harness_runs() as f64 / (w / 3600.0)),
            busy_fraction: device_seconds.zip(positive_wall).map(|(d, w)| d / w),
            device_seconds,
            yardsticks: acc.yardsticks,
            evaluations: acc.counts,
            parts,
            overlap_seconds,
            builds_ahead,
            typical_evaluation,
            profile_steps: acc.profile_steps,
        }
    }

    /// The seconds of the part named `name`; 0 when the run has none.
    pub fn part_seconds(&self, name: &str) -> f64 {
        self.parts
            .iter()
            .find(|p| p.name == name)
            .map_or(0.0, |p| p.seconds)
    }

    /// `seconds` as a fraction of the wall; `None` without a positive wall.
    pub fn share(&self, seconds: f64) -> Option<f64> {
        self.wall_seconds.filter(|w| *w > 0.0).map(|w| seconds / w)
    }
}

#[derive(Default)]
struct Accumulator {
    counts: EvaluationCounts,
    nonces: HashSet<String>,
    phases: BTreeMap<String, f64>,
    start_exit: f64,
    unclaimed: f64,
    no_phase_data: f64,
    yardstick_keys: HashSet<String>,
    yardsticks: u64,
    yardstick_seconds: f64,
    profile_seconds: f64,
    build_request_seconds: f64,
    build_wait_seconds: f64,
    /// Per build written ahead and taken: its compile seconds, its head start, whether waited for.
    ahead: Vec<(f64, f64, bool)>,
    /// Per stored harness run with phases: its `total` seconds and its device phases' seconds.
    stored_shapes: Vec<(f64, f64)>,
    profile_steps: BTreeMap<String, f64>,
}

impl Accumulator {
    /// Adds one harness result; `false` when its nonce was seen already (the same run
    /// recorded twice).
    fn add(&mut self, result: &Value) -> bool {
        if let Some(nonce) = result["nonce"].as_str() {
            if !self.nonces.insert(nonce.to_string()) {
                return false;
            }
        }
        let first = &result["unsteady_first"];
        if !first.is_null() {
            self.counts.unsteady_repeats += 1;
            // Its harness time, where recorded (the first try carries no nonce or yardstick).
            self.add_harness_time(first);
        }
        if result["unsteady_kept"].as_bool() == Some(true) {
            self.counts.unsteady_kept += 1;
        }
        self.add_harness_time(result);
        if let Some(lanes) = result["judge_lanes"].as_u64().filter(|l| *l > 1) {
            self.counts.in_lanes += 1;
            self.counts.lanes = self.counts.lanes.max(lanes);
        }
        if result["diagnostics"]["gate"]["busy_when_timed"].as_bool() == Some(true) {
            self.counts.busy_when_timed += 1;
        }
        let build = &result["build_request"];
        self.build_request_seconds += seconds(&build["seconds"]).unwrap_or(0.0);
        let waited = seconds(&build["waited_seconds"]).unwrap_or(0.0);
        self.build_wait_seconds += waited;
        let ahead = &build["ahead"];
        if let (Some(compile), Some(head_start)) = (
            seconds(&ahead["build_seconds"]),
            seconds(&ahead["started_before_seconds"]),
        ) {
            self.ahead
                .push((compile, head_start, waited >= AHEAD_WAIT_NOTED));
        }
        let yardstick = &result["yardstick"];
        // All attempts' processes where recorded, else the timing of the one kept.
        let spent = seconds(&yardstick["spent_seconds"])
            .filter(|s| *s > 0.0)
            .or_else(|| seconds(&yardstick["seconds"]));
        if let Some(s) = spent {
            if self.yardstick_keys.insert(yardstick.to_string()) {
                self.yardsticks += 1;
                self.yardstick_seconds += s;
            }
        }
        true
    }

    fn add_profile_steps(&mut self, profile: &Value) {
        for w in profile["workloads"].as_array().into_iter().flatten() {
            for (step, v) in w["target_seconds"].as_object().into_iter().flatten() {
                if let Some(s) = seconds(v) {
                    *self.profile_steps.entry(step.clone()).or_default() += s;
                }
            }
        }
    }

    /// The total and device seconds of a stored result's phases (not of the first try of an
    /// unsteady repeat, which `add` counts in the wall's parts only).
    fn add_stored_shape(&mut self, result: &Value) {
        let Some(phases) = result["diagnostics"]["phase_seconds"].as_object() else {
            return;
        };
        let sums = PhaseSums::of(phases);
        if sums.total > 0.0 {
            self.stored_shapes
                .push((sums.total, sums.device.min(sums.total)));
        }
    }

    fn typical_evaluation(&self) -> Option<TypicalEvaluation> {
        if self.stored_shapes.is_empty() {
            return None;
        }
        Some(TypicalEvaluation {
            count: self.stored_shapes.len() as u64,
            median_seconds: median(self.stored_shapes.iter().map(|s| s.0).collect()),
            median_device_share: median(self.stored_shapes.iter().map(|s| s.1 / s.0).collect()),
        })
    }

    fn builds_ahead(&self) -> Option<AheadBuilds> {
        if self.ahead.is_empty() {
            return None;
        }
        let compiles: Vec<f64> = self.ahead.iter().map(|a| a.0).collect();
        Some(AheadBuilds {
            taken: self.ahead.len() as u64,
            waited_for: self.ahead.iter().filter(|a| a.2).count() as u64,
            compile_max_seconds: compiles.iter().copied().fold(0.0, f64::max),
            compile_median_seconds: median(compiles),
            head_start_median_seconds: median(self.ahead.iter().map(|a| a.1).collect()),
        })
    }

    /// The phases and start/exit time of one harness run.
    fn add_harness_time(&mut self, result: &Value) {
        let wall = seconds(&result["wall_seconds"]);
        match result["diagnostics"]["phase_seconds"].as_object() {
            Some(phases) => {
                self.counts.with_phases += 1;
                for (name, v) in phases {
                    if let Some(s) = seconds(v).filter(|_| name != "total") {
                        *self.phases.entry(name.clone()).or_default() += s;
                    }
                }
                let sums = PhaseSums::of(phases);
                self.unclaimed += (sums.total - sums.named).max(0.0);
                if let Some(w) = wall {
                    self.start_exit += (w - sums.total).max(0.0);
                }
            }
            None => {
                if let Some(w) = wall {
                    self.no_phase_data += w;
                }
            }
        }
    }
}

/// One result's `phase_seconds` summed.
struct PhaseSums {
    /// The named phases (every entry but `total`).
    named: f64,
    /// The recorded `total`, or the named phases' sum where none is recorded.
    total: f64,
    /// The [`DEVICE_PHASES`].
    device: f64,
}

impl PhaseSums {
    fn of(phases: &serde_json::Map<String, Value>) -> PhaseSums {
        let (mut named, mut device) = (0.0, 0.0);
        for (name, v) in phases {
            let Some(s) = seconds(v).filter(|_| name != "total") else {
                continue;
            };
            named += s;
            if DEVICE_PHASES.contains(&name.as_str()) {
                device += s;
            }
        }
        let total = phases.get("total").and_then(seconds).unwrap_or(named);
        PhaseSums {
            named,
            total,
            device,
        }
    }
}

/// The middle value (the upper of the two middle ones for an even count); `v` is not empty.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn part(name: &str, seconds: f64, kind: TimeKind) -> TimePart {
    TimePart {
        name: name.to_string(),
        seconds,
        kind,
    }
}

/// A finite, non-negative number of seconds.
fn seconds(v: &Value) -> Option<f64> {
    v.as_f64().filter(|s| s.is_finite() && *s >= 0.0)
}
