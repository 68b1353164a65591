//! `ksearch runs` and `ksearch show --json`: runs as rows and a run as one JSON document, for
//! scripts and for people who keep many runs.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{json, Value};

use ksearch_store::RunStore;

use super::{finished, world_model, ReportError};
use crate::accounting::TimeAccount;

/// One run of `ksearch runs`.
#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    pub id: String,
    pub dir: PathBuf,
    pub task: Option<String>,
    pub backend: Option<String>,
    pub strategy: Option<String>,
    pub proposer: Option<String>,
    /// `finished`, `running` (a process holds its writer lock), `interrupted` or `unreadable`.
    pub status: String,
    pub stop_reason: Option<String>,
    pub candidates: u64,
    pub evaluations: u64,
    pub best_candidate: Option<i64>,
    /// The winner's score in the final confirmation, and its interval.
    pub confirmed: Option<f64>,
    pub confirmed_interval: Option<[f64; 2]>,
    /// The confirmed winner's time over the seed's, measured there (above one: faster).
    pub versus_seed: Option<f64>,
    /// The score the search ranked the best by (its own measurements).
    pub search_score: Option<f64>,
    pub error: Option<String>,
}

/// Every run under `runs_dir`, oldest first.
pub fn runs(runs_dir: &Path) -> Result<Vec<RunRow>, ReportError> {
    let mut rows = Vec::new();
    for s in RunStore::list(runs_dir)? {
        let mut row = RunRow {
            id: s.id.clone(),
            dir: s.dir.clone(),
            task: s.config.as_ref().map(|c| c.task.clone()),
            backend: s.config.as_ref().map(|c| c.backend.clone()),
            strategy: s.config.as_ref().map(|c| c.strategy.clone()),
            proposer: s.config.as_ref().map(|c| c.proposer.clone()),
            status: if s.error.is_some() {
                "unreadable".into()
            } else if s.finished {
                "finished".into()
            } else {
                "interrupted".into()
            },
            stop_reason: None,
            candidates: s.candidates,
            evaluations: s.evaluations,
            best_candidate: None,
            confirmed: None,
            confirmed_interval: None,
            versus_seed: None,
            search_score: s.best_score,
            error: s.error.clone(),
        };
        if s.error.is_none() {
            if let Err(e) = fill(&mut row, &s.dir) {
                row.status = "unreadable".into();
                row.error = Some(e.to_string());
            }
        }
        rows.push(row);
    }
    Ok(rows)
}

fn fill(row: &mut RunRow, dir: &Path) -> Result<(), ReportError> {
    let store = RunStore::open(dir)?;
    if store.writer()?.is_some() {
        row.status = "running".into();
    }
    let Some(o) = finished(&store)? else {
        return Ok(());
    };
    row.stop_reason = Some(o.stop_reason.clone());
    let Some(best) = &o.best else {
        return Ok(());
    };
    row.best_candidate = Some(best.candidate_id);
    row.search_score = Some(best.score);
    if let Some(c) = &o.confirmation {
        if let Some(w) = c.of(best.candidate_id) {
            row.confirmed = w.score;
            row.confirmed_interval = w.interval;
            row.versus_seed = c
                .seed()
                .filter(|s| s.candidate_id != best.candidate_id)
                .and_then(|s| s.score.filter(|v| *v > 0.0))
                .zip(w.score)
                .map(|(seed, win)| win / seed);
        }
    }
    Ok(())
}

/// The rows as a table.
pub fn render_runs(rows: &[RunRow]) -> String {
    let mut s = String::new();
    if rows.is_empty() {
        s.push_str("no runs\n");
        return s;
    }
    let _ = writeln!(
        s,
        "{:<22} {:<16} {:<7} {:<11} {:<11} {:>5} {:>5}  best (confirmed, vs the seed)",
        "run", "task", "backend", "strategy", "status", "cands", "evals"
    );
    for r in rows {
        let best = match (r.confirmed, r.versus_seed, r.search_score) {
            (Some(c), Some(v), _) => format!(
                "{c:.3}{} · {}",
                r.confirmed_interval
                    .map(|[lo, hi]| format!(" ({lo:.3}–{hi:.3})"))
                    .unwrap_or_default(),
                super::headline::versus_seed(v)
            ),
            (Some(c), None, _) => format!("{c:.3}"),
            (None, _, Some(sc)) => format!("search score {sc:.3} (not confirmed)"),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "{:<22} {:<16} {:<7} {:<11} {:<11} {:>5} {:>5}  {}",
            r.id,
            r.task.as_deref().unwrap_or("?"),
            r.backend.as_deref().unwrap_or("?"),
            r.strategy.as_deref().unwrap_or("?"),
            r.status,
            r.candidates,
            r.evaluations,
            r.error
                .as_deref()
                .map(|e| format!("error: {e}"))
                .unwrap_or(best)
        );
    }
    s
}

/// What `show` prints, as one JSON document: the configuration (the secret seed left out),
/// the status, the finish summary, the time account, the world model and every candidate with
/// its evaluation's status and score.
pub fn show_json(store: &RunStore) -> Result<Value, ReportError> {
    let c = store.config();
    let status = match finished(store)? {
        Some(_) => "finished",
        None if store.writer()?.is_some() => "running",
        None => "interrupted",
    };
    let mut candidates = Vec::new();
    for cand in store.candidates()? {
        let e = store.evaluation_for(cand.id)?;
        candidates.push(json!({
            "id": cand.id, "round": cand.round, "cycle": cand.cycle, "node": cand.node_id,
            "kind": cand.kind.as_str(), "parent": cand.parent_candidate,
            "note": cand.proposer_note, "source": cand.source_id.as_str(),
            "status": e.as_ref().map(|e| e.status.clone()),
            "score": e.as_ref().and_then(|e| e.score),
        }));
    }
    Ok(json!({
        "run": store.id(),
        "dir": store.dir(),
        "config": {"task": c.task, "backend": c.backend, "strategy": c.strategy,
                   "proposer": c.proposer, "selection": c.selection, "seed": c.seed,
                   "budgets": c.budgets, "created_at": c.created_at,
                   "ksearch_version": c.ksearch_version},
        "status": status,
        "outcome": finished(store)?,
        "usage": store.usage_totals()?,
        "time": TimeAccount::of_run(store)?,
        "world_model": world_model(store)?,
        "candidates": candidates,
    }))
}
