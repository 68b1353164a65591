//! `ksearch tasks`: the built-in tasks.

use crate::exit;
use anyhow::{Context, Result};
use clap::Args;
use ksearch_eval::report::{Align, Table};
use serde::Serialize;

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
}

pub fn run(args: &TasksArgs) -> Result<u8> {
    let tasks = ksearch_task::builtin::list().context("cannot load the built-in tasks")?;
    let rows: Vec<TaskRow> = tasks
        .iter()
        .map(|t| {
            let spec = t.spec();
            TaskRow {
                name: t.name().to_string(),
                kind: t.kind().to_string(),
                dir: t.dir().display().to_string(),
                description: spec.description.trim().to_string(),
                backends: t.backend_names().iter().map(|s| s.to_string()).collect(),
                workloads: spec.workloads.len(),
                held_out: spec.workloads.iter().filter(|w| w.held_out).count(),
            }
        })
        .collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(exit::OK);
    }
    let mut table = Table::new(&[
        ("task", Align::Left),
        ("kind", Align::Left),
        ("backends", Align::Left),
        ("workloads", Align::Right),
        ("description", Align::Left),
    ]);
    for r in &rows {
        let summary = r.description.lines().next().unwrap_or("").to_string();
        table.row(vec![
            r.name.clone(),
            r.kind.clone(),
            r.backends.join(","),
            format!("{} ({} held-out)", r.workloads, r.held_out),
            summary,
        ]);
    }
    print!("{}", table.render());
    Ok(exit::OK)
}
