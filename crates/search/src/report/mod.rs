//! What a run reports, as text: the outcome `ksearch run` and `resume` print at the end, the
//! run `ksearch show` prints (status, best, time, path to the best, world-model tree,
//! candidates) and the kernel and README `ksearch export` writes. The run's finish summary is
//! read back typed, as the [`RunOutcome`] the engine stored ([`finished`]).
//!
//! - [`headline`]: the words a result is reported in (confirmed, re-measured, cautions).
//! - [`time`]: the `time:` block (where the wall time went).
//! - [`path`]: the steps the search kept on the way to the best kernel.
//! - [`export`]: the exported kernel and its README.
//! - [`html`]: the run as one self-contained HTML file (`ksearch report`).
//! - [`runs`]: the runs of a directory as rows (`ksearch runs`) and a run as JSON (`show --json`).

pub mod export;
pub mod headline;
pub mod html;
pub mod path;
pub mod profile;
pub mod runs;
pub mod time;

use std::fmt::Write as _;

use serde::Deserialize;

use ksearch_store::{CandidateKind, RunStore, StoreError};

use crate::accounting::TimeAccount;
use crate::engine::RunOutcome;
use crate::world_model::WorldModel;

pub use export::{export, Exported};
pub use html::{render_compare, render_html, HtmlReport};
pub use path::render_path;
pub use runs::{render_runs, runs, show_json, RunRow};
pub use time::render_time;

/// Why a run cannot be reported.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the run's finish summary is unreadable")]
    Summary(#[source] serde_json::Error),
    #[error("the stored world model is unreadable")]
    WorldModel(#[source] serde_json::Error),
    #[error("the run has not finished; `ksearch resume` it first (or see `ksearch show`)")]
    NotFinished,
    #[error("the run has no accepted kernel (no candidate passed the final re-check)")]
    NoBest,
    #[error("candidate {0} is missing from the store")]
    MissingCandidate(i64),
    #[error("cannot load the run's task")]
    Task(#[source] ksearch_task::TaskError),
    #[error("the stored evaluation of the best kernel is unreadable")]
    Evaluation(#[source] serde_json::Error),
    #[error("cannot read the best kernel's source {path}")]
    Source {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Format(#[from] std::fmt::Error),
}

/// The outcome of a finished run, as the engine stored it when the run finished; `None` while
/// the run has not finished. The store keeps the summary as plain JSON (it does not know the
/// search's types); this is where it is read back as a [`RunOutcome`].
pub fn finished(store: &RunStore) -> Result<Option<RunOutcome>, ReportError> {
    store
        .finish_summary()?
        .map(|v| serde_json::from_value(v).map_err(ReportError::Summary))
        .transpose()
}

/// The best kernel of a finished run: the run's task (loaded again), the kernel's stored
/// source file and the backend it is for (what `ksearch bench --run` measures).
pub struct BestKernel {
    pub task: ksearch_task::Task,
    pub path: std::path::PathBuf,
    pub backend: String,
}

/// The best kernel of the finished run in `store`.
pub fn best_kernel(store: &RunStore) -> Result<BestKernel, ReportError> {
    let outcome = finished(store)?.ok_or(ReportError::NotFinished)?;
    let id = outcome
        .best
        .as_ref()
        .ok_or(ReportError::NoBest)?
        .candidate_id;
    let cand = store
        .candidate(id)?
        .ok_or(ReportError::MissingCandidate(id))?;
    let config = store.config();
    let task = ksearch_task::resolve(&crate::session::task_ref_of_run(config))
        .map_err(ReportError::Task)?;
    Ok(BestKernel {
        task,
        path: store.source_path(&cand.source_id)?,
        backend: config.backend.clone(),
    })
}

/// The best kernel of a finished run with the evaluation that speaks for it: the winner's
/// re-check (a fresh process and seed, every workload) when the run made one, else the
/// evaluation the search ranked it by.
pub struct BestEvaluation {
    pub kernel: BestKernel,
    pub source: String,
    pub eval: ksearch_eval::EvalResult,
    /// When that evaluation was stored.
    pub evaluated_at: String,
}

/// See [`BestEvaluation`].
pub fn best_evaluation(store: &RunStore) -> Result<BestEvaluation, ReportError> {
    let kernel = best_kernel(store)?;
    let outcome = finished(store)?.ok_or(ReportError::NotFinished)?;
    let best = outcome
        .best
        .as_ref()
        .ok_or(ReportError::NoBest)?
        .candidate_id;
    let recheck = recheck_of(&outcome).and_then(|r| r.recheck_candidate);
    let row = match recheck
        .map(|id| store.evaluation_for(id))
        .transpose()?
        .flatten()
    {
        Some(row) => row,
        None => store
            .evaluation_for(best)?
            .ok_or(ReportError::MissingCandidate(best))?,
    };
    let eval = serde_json::from_value(row.result).map_err(ReportError::Evaluation)?;
    let source = std::fs::read_to_string(&kernel.path).map_err(|source| ReportError::Source {
        path: kernel.path.clone(),
        source,
    })?;
    Ok(BestEvaluation {
        kernel,
        source,
        eval,
        evaluated_at: row.created_at,
    })
}

/// The parts of [`RunOutcome::recheck`] that reports use: how the winner's re-check ended and
/// the candidate its re-check result is stored under.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Recheck {
    pub status: Option<String>,
    pub recheck_candidate: Option<i64>,
}

/// The winner's re-check, if the run made one (a re-check of another shape reads as one with
/// an unknown status).
pub fn recheck_of(outcome: &RunOutcome) -> Option<Recheck> {
    let r = outcome.recheck.as_ref().filter(|r| !r.is_null())?;
    Some(serde_json::from_value(r.clone()).unwrap_or_default())
}

/// What `ksearch run` and `resume` print when the run ends.
pub fn render_outcome(run_id: &str, o: &RunOutcome) -> String {
    let mut s = format!(
        "\nrun {run_id}: {} rounds in {} cycles, {} passed / {} failed — stopped: {}\n",
        o.rounds_used, o.cycles, o.passed, o.failed, o.stop_reason
    );
    match &o.best {
        Some(best) => {
            s.push_str(&format!(
                "best: candidate {} (round {}, node {})\n",
                best.candidate_id,
                best.round,
                best.node.as_deref().unwrap_or("-"),
            ));
            // The confirmation leads (the winner, runner-ups and seed measured in turn), then
            // the re-check's comparison (fresh process and seed, every workload); the search's
            // own score follows as what it ranked by.
            for line in headline::lines(o) {
                s.push_str(&format!("{line}\n"));
            }
            s.push_str(&format!("search score {:.3}", best.score));
            if let Some(seed) = o.seed_score.filter(|v| *v > 0.0) {
                s.push_str(&format!(
                    " ({} by the search's own measurements, {seed:.3})",
                    headline::versus_seed(best.score / seed)
                ));
            }
            s.push('\n');
        }
        None => s.push_str("no candidate passed the final re-check\n"),
    }
    if let Some(r) = recheck_of(o) {
        s.push_str(&format!(
            "re-check (fresh process, fresh seed, held-out and assertion workloads): {}\n",
            r.status.as_deref().unwrap_or("?")
        ));
    }
    s.push_str(&format!(
        "see `ksearch show {run_id}`; export the kernel with `ksearch export {run_id}`\n"
    ));
    s
}

/// The run's world model: the engine's live checkpoint, else the latest snapshot.
pub(crate) fn world_model(store: &RunStore) -> Result<Option<WorldModel>, ReportError> {
    let value = match store.get_state("engine")? {
        Some(state) => Some(state["wm"].clone()),
        None => store.latest_world_model()?.map(|(_, _, v)| v),
    };
    value
        .map(|v| serde_json::from_value(v).map_err(ReportError::WorldModel))
        .transpose()
}

/// The status and score of a candidate's evaluation, if it has one.
fn score_of(store: &RunStore, candidate: i64) -> Result<Option<(String, Option<f64>)>, StoreError> {
    Ok(store
        .evaluation_for(candidate)?
        .map(|e| (e.status, e.score)))
}

/// A run in one line of counts: candidates, evaluations (passed, rejected), proposer calls,
/// tokens and cost (`show` and the HTML report's summary).
pub(crate) fn counts_line(
    candidates: &[ksearch_store::CandidateRow],
    evaluations: &[ksearch_store::EvaluationRow],
    usage: &ksearch_store::Usage,
) -> String {
    let passed = evaluations.iter().filter(|e| e.status == "passed").count();
    format!(
        "candidates {} · evaluations {} ({} passed, {} rejected) · proposer calls {} · tokens {} · ${:.2}",
        candidates.len(),
        evaluations.len(),
        passed,
        evaluations.len() - passed,
        usage.calls,
        usage.input_tokens + usage.output_tokens,
        usage.cost_usd
    )
}

/// What `ksearch show` prints: the run's configuration and status, its best kernel with the
/// headline lines, the time block, the path to the best, the world-model tree and the latest
/// candidates (`all`: every candidate).
pub fn render_show(store: &RunStore, all: bool) -> Result<String, ReportError> {
    let c = store.config();
    let mut s = String::new();
    writeln!(
        s,
        "run {}  task {}  backend {}  strategy {}  proposer {}  selection {}  seed {}",
        store.id(),
        c.task,
        c.backend,
        c.strategy,
        c.proposer,
        c.selection,
        c.seed
    )?;
    let summary = finished(store)?;
    match &summary {
        Some(sum) => writeln!(s, "status: finished — {}", sum.stop_reason)?,
        None => match store.writer()? {
            Some(w) => writeln!(
                s,
                "status: running{}",
                w.pid.map(|p| format!(" (process {p})")).unwrap_or_default()
            )?,
            None => writeln!(
                s,
                "status: interrupted (`ksearch resume {}` continues it)",
                store.id()
            )?,
        },
    }
    let candidates = store.candidates()?;
    let evaluations = store.evaluations()?;
    let usage = store.usage_totals()?;
    writeln!(s, "{}", counts_line(&candidates, &evaluations, &usage))?;
    if let Some(f) = store.failed_calls()? {
        writeln!(
            s,
            "proposer errors: {} of {} calls; the last ({}, {}): {}",
            f.count, usage.calls, f.last_role, f.last_at, f.last_error
        )?;
    }
    let seed_score = candidates
        .iter()
        .find(|c| c.kind == CandidateKind::Seed)
        .and_then(|c| score_of(store, c.id).ok().flatten())
        .and_then(|(_, sc)| sc);
    if let Some((sum, best)) = summary
        .as_ref()
        .and_then(|sum| Some((sum, sum.best.as_ref()?)))
    {
        writeln!(
            s,
            "best: candidate {} (round {}, node {})",
            best.candidate_id,
            best.round,
            best.node.as_deref().unwrap_or("-"),
        )?;
        for line in headline::lines(sum) {
            writeln!(s, "{line}")?;
        }
        write!(s, "search score {:.3}", best.score)?;
        if let Some(seed) = seed_score.filter(|v| *v > 0.0) {
            write!(
                s,
                " ({} by the search's own measurements)",
                headline::versus_seed(best.score / seed)
            )?;
        }
        writeln!(s)?;
        if let Some(r) = recheck_of(sum) {
            writeln!(
                s,
                "re-check on all workloads (fresh process and seed): {}",
                r.status.as_deref().unwrap_or("?")
            )?;
        }
    }

    s.push_str(&render_time(&TimeAccount::of_run(store)?));

    if let Some(best) = summary
        .as_ref()
        .and_then(|sum| Some(sum.best.as_ref()?.candidate_id))
    {
        s.push_str(&render_path(store, best)?);
    }

    if let Some(wm) = world_model(store)? {
        writeln!(s, "\nworld model (* = on the path to the best solution):")?;
        s.push_str(&wm.render_tree());
    }

    writeln!(s, "\ncandidates:")?;
    writeln!(
        s,
        "{:>5} {:>5} {:>5} {:>6} {:<8} {:<22} {:>8}  note",
        "id", "round", "cycle", "node", "kind", "status", "score"
    )?;
    let shown = if all || candidates.len() <= 15 {
        &candidates[..]
    } else {
        writeln!(
            s,
            "  … {} earlier (--all lists them)",
            candidates.len() - 15
        )?;
        &candidates[candidates.len() - 15..]
    };
    for cand in shown {
        let (status, score) = score_of(store, cand.id)?.unwrap_or(("(not evaluated)".into(), None));
        writeln!(
            s,
            "{:>5} {:>5} {:>5} {:>6} {:<8} {:<22} {:>8}  {}",
            cand.id,
            cand.round,
            cand.cycle,
            cand.node_id.as_deref().unwrap_or("-"),
            cand.kind.as_str(),
            status,
            score
                .map(|v| format!("{v:.3}"))
                .unwrap_or_else(|| "-".into()),
            cand.proposer_note.chars().take(70).collect::<String>()
        )?;
    }
    Ok(s)
}
