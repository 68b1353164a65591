//! `ksearch tasks`: the built-in tasks.

use crate::exit;
use anyhow::{Context, Result};
use clap::Args;
use ksearch_eval::report::{Align, Table};
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Args)]
pub struct TasksArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct TaskRow {
    name: String,
    kind: String,
    dir: String,
    description: String,
    backends: Vec<String>,
    workloads: usize,
    held_out: usize,
    /// Workloads can be limited to some backends, so each backend has its own counts.
    per_backend: BTreeMap<String, Counts>,
}

#[derive(Debug, Serialize)]
struct Counts {
    workloads: usize,
    held_out: usize,
}

pub fn run(args: &TasksArgs) -> Result<u8> {
    let tasks = ksearch_task::builtin::list().context("cannot load the built-in tasks")?;
    let mut rows = Vec::new();
    for t in &tasks {
        let spec = t.spec();
        let mut per_backend = BTreeMap::new();
        for b in t.backend_names() {
            let workloads = t.workloads(b)?;
            per_backend.insert(
                b.to_string(),
                Counts {
                    workloads: workloads.len(),
                    held_out: workloads.iter().filter(|w| w.held_out).count(),
                },
            );
        }
        rows.push(TaskRow {
            name: t.name().to_string(),
            kind: t.kind().to_string(),
            dir: t.dir().display().to_string(),
            description: spec.description.trim().to_string(),
            backends: t.backend_names().iter().map(|s| s.to_string()).collect(),
            workloads: spec.workloads.len(),
            held_out: spec.workloads.iter().filter(|w| w.held_out).count(),
            per_backend,
        });
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(exit::OK);
    }
    let mut table = Table::new(&[
        ("task", Align::Left),
        ("kind", Align::Left),
        ("workloads per backend (held-out)", Align::Left),
        ("description", Align::Left),
    ]);
    for r in &rows {
        let summary = r.description.lines().next().unwrap_or("").to_string();
        table.row(vec![
            r.name.clone(),
            r.kind.clone(),
            r.per_backend
                .iter()
                .map(|(b, c)| format!("{b} {} ({})", c.workloads, c.held_out))
                .collect::<Vec<_>>()
                .join(", "),
            summary,
        ]);
    }
    print!("{}", table.render());
    Ok(exit::OK)
}
