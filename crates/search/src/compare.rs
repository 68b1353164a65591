//! `ksearch compare`: search strategies run on one task with identical budgets, each run stored
//! like any other, and what their runs say side by side.
//!
//! The budget is rounds: every strategy spends the same number of code-generation rounds (of
//! `samples` candidates each); the seed's evaluation, the final confirmation and the re-check
//! do not count. Proposer calls that plan (the world model's propose, refine and too-hard
//! edits) are not rounds either, so with an LLM proposer the world-model strategy makes more
//! calls than best-of-n for the same budget; the runs' token and cost use is in their stores.
//! Runs alternate which strategy goes first from one seed to the next, so a machine that
//! drifts over the campaign does not favour one strategy.
//!
//! What is compared, per run: the best-so-far curve over evaluations (the search's scores,
//! failed candidates holding the curve flat), the evaluations a run needed to reach 90, 95 and
//! 99% of the best any run found, and the run's confirmed result (its winner re-measured in
//! turn with the seed: the speedup over the seed within one confirmation, the figure that
//! compares across runs). The target of the 90/95/99% marks is the best confirmed score over
//! all runs (each run's search best where no confirmation was made): search scores are maxima
//! over noisy measurements and run high, so the marks are reached early rather than late. A
//! confirmation too imprecise to read as one figure (`report::headline::precise`) sets the
//! target only where no run has a precise one.

use std::path::Path;

use ksearch_eval::{Interrupt, SandboxMode};
use ksearch_store::{CandidateKind, RunStore};
use serde::Serialize;

use crate::engine::{NoProgress, RunOutcome};
use crate::session::{self, NewRun, SessionError};
use crate::settings::{ResumeChanges, RunSettings, Strategy};

/// The fractions of the best any run found whose first crossing is reported.
pub const MARKS: [f64; 3] = [0.90, 0.95, 0.99];

/// A comparison to run.
pub struct CompareSpec<'a> {
    pub task: &'a str,
    pub backend: Option<&'a str>,
    pub strategies: &'a [Strategy],
    /// The proposers' seeds: one run per strategy and seed.
    pub seeds: &'a [u64],
    /// Settings of every run but its strategy; `rounds` is the budget.
    pub settings: &'a RunSettings,
    pub runs_dir: &'a Path,
    pub sandbox: SandboxMode,
    /// Run every strategy and seed anew, even where the runs directory has a matching run.
    pub fresh: bool,
}

/// One run of a comparison, as the comparison reads it back from its store.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunRecord {
    pub strategy: Strategy,
    pub seed: u64,
    pub run: String,
    /// The best search score after each evaluated candidate (0 until one passes).
    pub curve: Vec<f64>,
    /// Candidates that did not pass.
    pub failures: u32,
    /// The winner's confirmed score (vs the baseline), else its search score.
    pub best: Option<f64>,
    /// The winner's confirmed speedup over the seed (both re-measured in one confirmation).
    pub best_vs_seed: Option<f64>,
    /// Whether `best` is a confirmation precise enough to read as one figure (its interval
    /// within `report::headline::PRECISE_SPAN`): only such runs set the target.
    pub best_precise: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// Settings that cannot make one of the runs: refused before any run starts.
    #[error(transparent)]
    Evolve(#[from] crate::evolve::EvolveSettingsError),
    #[error("task {task}: {message}")]
    Task { task: String, message: String },
    #[error("strategy {strategy}, seed {seed}: {source}")]
    Session {
        strategy: &'static str,
        seed: u64,
        #[source]
        source: Box<SessionError>,
    },
    #[error("strategy {strategy}, seed {seed} (run {run}): {message}")]
    Run {
        strategy: &'static str,
        seed: u64,
        run: String,
        message: String,
    },
}

/// Runs every strategy once per seed, seeds in order, the order of the strategies rotated by
/// one from each seed to the next; `announce` gets a line as each run starts. Unless
/// `spec.fresh`, a run of the runs directory with the same task, backend, seed and settings is
/// taken up instead of starting another ([`earlier_run`]): a finished one is read back, an
/// unfinished one resumed, so a comparison that was stopped continues where it was, and one
/// with more seeds adds only the new ones.
pub fn run(
    spec: &CompareSpec<'_>,
    interrupt: &Interrupt,
    announce: &dyn Fn(&str),
) -> Result<Vec<RunRecord>, CompareError> {
    if spec.strategies.contains(&Strategy::Evolve) {
        spec.settings.evolve.validate()?;
    }
    // Every run on one backend: the asked one, else the task's default here, decided once so
    // that the runs started and the runs taken up agree.
    let backend = match spec.backend {
        Some(b) => b.to_string(),
        None => {
            let failed = |message: String| CompareError::Task {
                task: spec.task.to_string(),
                message,
            };
            let task = ksearch_task::resolve(spec.task).map_err(|e| failed(e.to_string()))?;
            ksearch_eval::backends::default_backend(&task)
                .ok_or_else(|| failed("no backend of the task runs on this machine".into()))?
        }
    };
    let spec = &CompareSpec {
        backend: Some(&backend),
        ..*spec
    };
    let mut records = Vec::new();
    for (i, &seed) in spec.seeds.iter().enumerate() {
        let n = spec.strategies.len().max(1);
        for k in 0..spec.strategies.len() {
            let strategy = spec.strategies[(i + k) % n];
            let settings = RunSettings {
                strategy,
                ..spec.settings.clone()
            };
            let session_failed = |source: SessionError| CompareError::Session {
                strategy: strategy.as_str(),
                seed,
                source: Box::new(source),
            };
            let earlier = match spec.fresh {
                true => None,
                false => earlier_run(spec, &settings, seed),
            };
            let session = match earlier {
                Some(store) => {
                    let read = crate::report::finished(&store);
                    if let Ok(Some(outcome)) = read {
                        announce(&format!(
                            "ksearch: compare reads back finished run {} ({}, seed {seed})",
                            store.id(),
                            strategy.as_str()
                        ));
                        let r = record(&store, &outcome, strategy, seed).map_err(|e| {
                            CompareError::Run {
                                strategy: strategy.as_str(),
                                seed,
                                run: store.id().to_string(),
                                message: e.to_string(),
                            }
                        })?;
                        records.push(r);
                        continue;
                    }
                    session::resume(
                        store,
                        ResumeChanges::default(),
                        spec.sandbox,
                        interrupt.clone(),
                    )
                    .map_err(session_failed)?
                }
                None => {
                    let new = NewRun {
                        task: spec.task,
                        backend: spec.backend,
                        seed: Some(seed),
                        runs_dir: spec.runs_dir,
                        settings: &settings,
                        sandbox: spec.sandbox,
                    };
                    session::start(new, interrupt.clone()).map_err(session_failed)?
                }
            };
            announce(&session.announce);
            let _writer = session.writer;
            let seed_source = session.seed_source.as_deref();
            let (outcome, store) = session.setup.run(session.store, seed_source, &NoProgress);
            let failed = |message: String| CompareError::Run {
                strategy: strategy.as_str(),
                seed,
                run: store.id().to_string(),
                message,
            };
            let outcome = outcome.map_err(|e| failed(e.to_string()))?;
            records
                .push(record(&store, &outcome, strategy, seed).map_err(|e| failed(e.to_string()))?);
        }
    }
    Ok(records)
}

/// The latest run under the runs directory that a comparison can take up for `settings`
/// (which carry the strategy) and `seed`: the same task as named, the same backend when one is
/// asked for (`run` always asks for one), the same seed and the same stored settings. A run that cannot be read, or is
/// being written by another process, is passed over (a new one is started).
pub fn earlier_run(spec: &CompareSpec<'_>, settings: &RunSettings, seed: u64) -> Option<RunStore> {
    let wanted = settings.to_value();
    let runs = RunStore::list(spec.runs_dir).ok()?;
    runs.into_iter()
        .rev()
        .filter(|r| {
            r.config.as_ref().is_some_and(|c| {
                c.task == spec.task
                    && c.seed == seed
                    && spec.backend.is_none_or(|b| b == c.backend)
                    && RunSettings::from_value(&c.flags).is_ok_and(|s| s.to_value() == wanted)
            })
        })
        .find_map(|r| {
            let store = RunStore::open(&r.dir).ok()?;
            // Another process writes it: not ours to take.
            store.lock_writer().ok().map(drop)?;
            Some(store)
        })
}

/// What the comparison reads of a finished run.
pub fn record(
    store: &RunStore,
    outcome: &RunOutcome,
    strategy: Strategy,
    seed: u64,
) -> Result<RunRecord, ksearch_store::StoreError> {
    let mut attempts: Vec<_> = store
        .candidates()?
        .into_iter()
        .filter(|c| c.kind == CandidateKind::Attempt)
        .collect();
    attempts.sort_by_key(|c| (c.round, c.sample, c.id));
    let mut curve = Vec::with_capacity(attempts.len());
    let mut failures = 0;
    let mut best = 0.0f64;
    for c in &attempts {
        match store.evaluation_for(c.id)? {
            Some(ev) if ev.status == "passed" => {
                best = best.max(ev.score.unwrap_or(0.0));
            }
            _ => failures += 1,
        }
        curve.push(best);
    }
    let winner = outcome.best.as_ref();
    let confirmed = outcome.confirmation.as_ref().and_then(|c| {
        let w = c.of(winner?.candidate_id)?;
        let seed = c.seed().and_then(|s| s.score).filter(|s| *s > 0.0);
        let precise = w.interval.is_some_and(crate::report::headline::precise);
        Some((w.score?, seed.map(|s| w.score.unwrap_or(0.0) / s), precise))
    });
    Ok(RunRecord {
        strategy,
        seed,
        run: store.id().to_string(),
        curve,
        failures,
        best: confirmed.map(|c| c.0).or(winner.map(|w| w.score)),
        best_vs_seed: confirmed.and_then(|c| c.1),
        best_precise: confirmed.is_some_and(|c| c.2),
    })
}

/// A strategy's results over its runs: medians with their ranges.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StrategyRow {
    pub strategy: Strategy,
    pub runs: usize,
    /// Per mark of [`MARKS`]: the median over runs of the evaluations to reach it (`None`: the
    /// median run never did), and in how many runs it was reached.
    pub to_mark: Vec<(Option<f64>, usize)>,
    pub best: Option<Spread>,
    pub best_vs_seed: Option<Spread>,
    pub failures: Option<Spread>,
}

/// Median, lowest and highest of a set of values.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 {
            v[mid]
        } else {
            (v[mid - 1] + v[mid]) / 2.0
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[v.len() - 1],
        })
    }
}

/// The best any run found: the target of the marks. Runs whose best is a precise
/// confirmation set it; a confirmation whose interval spans more than a factor of
/// `report::headline::PRECISE_SPAN` (a busy machine) is one lucky draw that would put the
/// marks out of every other run's reach, so it counts only where no run has a precise one.
pub fn target(records: &[RunRecord]) -> Option<f64> {
    let best = |precise_only: bool| {
        records
            .iter()
            .filter(|r| r.best_precise || !precise_only)
            .filter_map(|r| r.best)
            .filter(|b| b.is_finite() && *b > 0.0)
            .max_by(f64::total_cmp)
    };
    best(true).or_else(|| best(false))
}

/// The evaluations `curve` needed to reach `level` (1-based), if it did.
pub fn evaluations_to(curve: &[f64], level: f64) -> Option<usize> {
    curve.iter().position(|b| *b >= level).map(|i| i + 1)
}

/// One row per strategy, in the order of `strategies`.
pub fn summarize(records: &[RunRecord], strategies: &[Strategy]) -> Vec<StrategyRow> {
    let target = target(records);
    strategies
        .iter()
        .map(|&strategy| {
            let runs: Vec<&RunRecord> = records.iter().filter(|r| r.strategy == strategy).collect();
            let to_mark = MARKS
                .iter()
                .map(|m| {
                    // A run that never reached the mark counts as needing more than it had, so
                    // the median is unreached when half the runs or more never got there.
                    let mut needed: Vec<f64> = runs
                        .iter()
                        .map(|r| {
                            target
                                .and_then(|t| evaluations_to(&r.curve, m * t))
                                .map_or(f64::INFINITY, |n| n as f64)
                        })
                        .collect();
                    needed.sort_by(f64::total_cmp);
                    let reached = needed.iter().filter(|n| n.is_finite()).count();
                    let median = match needed.len() {
                        0 => None,
                        n if n % 2 == 1 => Some(needed[n / 2]),
                        n => Some((needed[n / 2 - 1] + needed[n / 2]) / 2.0),
                    };
                    (median.filter(|m| m.is_finite()), reached)
                })
                .collect();
            let values = |f: &dyn Fn(&RunRecord) -> Option<f64>| -> Vec<f64> {
                runs.iter().filter_map(|r| f(r)).collect()
            };
            StrategyRow {
                strategy,
                runs: runs.len(),
                to_mark,
                best: Spread::of(&values(&|r| r.best)),
                best_vs_seed: Spread::of(&values(&|r| r.best_vs_seed)),
                failures: Spread::of(&values(&|r| Some(f64::from(r.failures)))),
            }
        })
        .collect()
}

/// The comparison as a table.
pub fn render(rows: &[StrategyRow], records: &[RunRecord]) -> String {
    let spread = |s: &Option<Spread>, digits: usize| match s {
        Some(s) => format!(
            "{:.digits$} ({:.digits$}–{:.digits$})",
            s.median, s.min, s.max
        ),
        None => "-".into(),
    };
    let mut out = String::new();
    let target = target(records);
    out.push_str(&format!(
        "best any run found: {} (the target of the marks)\n",
        target.map_or("-".into(), |t| format!("{t:.3}x the baseline"))
    ));
    out.push_str(&format!(
        "{:<12} {:>4}  {:>9} {:>9} {:>9}  {:<24} {:<24} {}\n",
        "strategy",
        "runs",
        "to 90%",
        "to 95%",
        "to 99%",
        "best (x baseline)",
        "best (x seed)",
        "failed"
    ));
    for r in rows {
        let marks: Vec<String> = r
            .to_mark
            .iter()
            .map(|(m, reached)| match m {
                Some(m) => format!("{m:.0} [{reached}/{}]", r.runs),
                None => format!("- [{reached}/{}]", r.runs),
            })
            .collect();
        out.push_str(&format!(
            "{:<12} {:>4}  {:>9} {:>9} {:>9}  {:<24} {:<24} {}\n",
            r.strategy.as_str(),
            r.runs,
            marks[0],
            marks[1],
            marks[2],
            spread(&r.best, 3),
            spread(&r.best_vs_seed, 2),
            spread(&r.failures, 0),
        ));
    }
    out.push_str(
        "to X%: median evaluations to reach X% of the best any run found [runs that did]; \
         best: median (range) over seeds of the confirmed winner\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(strategy: Strategy, curve: &[f64], best: f64) -> RunRecord {
        RunRecord {
            strategy,
            seed: 1,
            run: "r".into(),
            curve: curve.to_vec(),
            failures: curve.windows(2).filter(|w| w[0] == w[1]).count() as u32,
            best: Some(best),
            best_vs_seed: Some(best / 0.5),
            best_precise: true,
        }
    }

    #[test]
    fn an_imprecise_confirmation_sets_the_target_only_where_no_run_has_a_precise_one() {
        let wm = Strategy::WorldModel;
        let lucky = RunRecord {
            best_precise: false,
            ..rec(Strategy::Evolve, &[1.0, 3.0], 3.0)
        };
        let records = [rec(wm, &[1.0, 2.0], 2.0), lucky.clone()];
        assert_eq!(target(&records), Some(2.0));
        assert_eq!(target(&[lucky]), Some(3.0));
    }

    #[test]
    fn marks_count_evaluations_to_a_fraction_of_the_best_any_run_found() {
        let wm = Strategy::WorldModel;
        let bon = Strategy::BestOfN;
        let records = [
            rec(wm, &[1.0, 1.9, 2.0, 2.0], 2.0),
            rec(wm, &[1.0, 1.0, 1.8, 1.98], 1.98),
            rec(bon, &[0.5, 1.2, 1.2, 1.85], 1.85),
            rec(bon, &[0.7, 0.7, 0.7, 1.1], 1.1),
        ];
        assert_eq!(target(&records), Some(2.0));
        assert_eq!(evaluations_to(&records[0].curve, 1.8), Some(2));
        assert_eq!(evaluations_to(&records[3].curve, 1.8), None);
        let rows = summarize(&records, &[wm, bon]);
        // World model: 90% (1.8) after 2 and 3 evaluations: median 2.5; 99% (1.98) after 3
        // and 4.
        assert_eq!(rows[0].to_mark[0], (Some(2.5), 2));
        assert_eq!(rows[0].to_mark[2], (Some(3.5), 2));
        // Best-of-n: one run reaches 90% at 4, the other never: the median is unreached.
        assert_eq!(rows[1].to_mark[0], (None, 1));
        assert_eq!(rows[1].best.unwrap().median, 1.475);
        let text = render(&rows, &records);
        assert!(
            text.contains("best any run found: 2.000x the baseline"),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("world-model") && l.contains("[2/2]")),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("best-of-n") && l.contains("- [1/2]")),
            "{text}"
        );
    }

    #[test]
    fn spreads_are_medians_with_ranges() {
        let s = Spread::of(&[3.0, 1.0, 2.0, f64::NAN]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Spread::of(&[1.0, 4.0]).unwrap().median, 2.5);
        assert!(Spread::of(&[]).is_none());
    }
}
