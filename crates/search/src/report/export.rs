//! `ksearch export`: a finished run's best kernel, named after its task and backend, and a
//! README of its numbers (headline, search score, how to re-evaluate it, the path to it, the
//! re-check's and the search's result tables).

use std::fmt::Write as _;

use serde_json::Value;

use ksearch_eval::report::render_result;
use ksearch_eval::EvalResult;
use ksearch_store::RunStore;

use super::{finished, headline, recheck_of, render_path, ReportError};

/// What `ksearch export` writes: `source` as `file`, and `readme` as `README.md` beside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exported {
    /// `<task>_<backend>.<extension of the stored source>`.
    pub file: String,
    pub source: String,
    pub readme: String,
}

/// The best kernel of the finished run in `store` and its README.
pub fn export(store: &RunStore) -> Result<Exported, ReportError> {
    let summary = finished(store)?.ok_or(ReportError::NotFinished)?;
    let best = summary.best.as_ref().ok_or(ReportError::NoBest)?;
    let id = best.candidate_id;
    let cand = store
        .candidate(id)?
        .ok_or(ReportError::MissingCandidate(id))?;
    let source = store.source(&cand.source_id)?;
    let config = store.config();
    let ext = store
        .source_path(&cand.source_id)?
        .extension()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_else(|| "txt".into());
    let task_name = config
        .task
        .rsplit('/')
        .find(|p| !p.is_empty())
        .unwrap_or("kernel");
    let file = format!("{task_name}_{}.{ext}", config.backend);

    let eval: Option<EvalResult> = store
        .evaluation_for(id)?
        .and_then(|e| serde_json::from_value(e.result).ok());
    let recheck: Option<EvalResult> = recheck_of(&summary)
        .and_then(|r| r.recheck_candidate)
        .and_then(|rid| store.evaluation_for(rid).ok().flatten())
        .and_then(|e| serde_json::from_value(e.result).ok());
    let mut readme = String::new();
    writeln!(readme, "# {file}\n")?;
    writeln!(
        readme,
        "Best kernel of ksearch run `{}` (task `{}`, backend `{}`, proposer `{}`, seed {}).\n",
        store.id(),
        config.task,
        config.backend,
        config.proposer,
        config.seed
    )?;
    for line in headline::lines(&summary) {
        writeln!(readme, "{}.\n", capitalised(&line))?;
    }
    writeln!(
        readme,
        "Search score {:.3} (geometric mean of the speedup over the task's baseline, as the \
         search measured it), found in round {}.",
        best.score, cand.round
    )?;
    if !cand.knobs.is_null() {
        writeln!(readme, "Template knobs: `{}`.", cand.knobs)?;
    }
    writeln!(
        readme,
        "\nRe-evaluate it on every workload, held-out included:\n\n```\nksearch eval --task {} --backend {} --held-out {file}\n```\n",
        config.task, config.backend
    )?;
    writeln!(readme, "## Steps the search kept\n\n```")?;
    readme.push_str(render_path(store, id)?.trim_start());
    writeln!(readme, "```\n")?;
    if let Some(r) = &recheck {
        writeln!(
            readme,
            "## Re-check (fresh process, fresh seed, all workloads)\n\n```"
        )?;
        readme.push_str(&render_result(&file, r));
        writeln!(readme, "```\n")?;
    }
    if let Some(r) = &eval {
        writeln!(readme, "## Measured during the search\n\n```")?;
        readme.push_str(&render_result(&file, r));
        writeln!(readme, "```\n")?;
        if let Some(env) = &r.environment {
            writeln!(readme, "Machine: `{}`", Value::Object(env.clone()))?;
        }
    }
    Ok(Exported {
        file,
        source,
        readme,
    })
}

/// `line` with its first letter upper-case (a headline line as a sentence).
fn capitalised(line: &str) -> String {
    let mut chars = line.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}
