//! `ksearch tasks`: the built-in tasks; `--check` runs `ksearch_task::check` on them (or on
//! one task) and reports every problem; `--workloads` prints one task's resolved workloads for
//! a backend as JSON, for tools that need them without evaluating task.toml's expressions;
//! `--render` renders a task's template family for tools (ksearch_knowledge::render).

use crate::exit;
use anyhow::{Context, Result};
use clap::Args;
use ksearch_eval::report::{Align, Table};
use ksearch_task::check::check_tasks;
use ksearch_task::TaskSummary;

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("per_backend").args(["workloads", "render"])))]
pub struct TasksArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Check that held-out workloads vary everything the task does not declare (undeclared
    /// shared divisors, single values, missing held-out workloads, inputs that never reach
    /// their `must_reach`). Without NAME|DIR: every built-in task. Exits 1 on any problem.
    #[arg(long, value_name = "NAME|DIR")]
    check: Option<Option<String>>,
    /// Print the workloads of this task (built-in name or task directory) for --backend, held
    /// out ones included, resolved to concrete shapes, as a JSON array of the harness
    /// protocol's `workloads` items.
    #[arg(
        long,
        value_name = "NAME|DIR",
        conflicts_with = "check",
        requires = "backend"
    )]
    workloads: Option<String>,
    /// The backend whose workloads --workloads prints, or whose family --render renders.
    #[arg(long, requires = "per_backend")]
    backend: Option<String>,
    /// Render this task's template family for --backend: the source of the --set setting, or
    /// JSON lines (--list, --batch; docs/cli.md).
    #[arg(long, value_name = "NAME|DIR", conflicts_with_all = ["check", "workloads"], requires = "backend")]
    render: Option<String>,
    /// A knob's value (repeatable); the others take their defaults.
    #[arg(long = "set", value_name = "KNOB=VALUE", requires = "render")]
    set: Vec<String>,
    /// The family's code target (default: its first).
    #[arg(long, requires = "render")]
    target: Option<String>,
    /// Every valid setting, or the named ones of a variants file, with ids and knob summaries.
    #[arg(long, value_name = "FILE.toml", requires = "render", conflicts_with_all = ["set", "batch"])]
    list: Option<Option<std::path::PathBuf>>,
    /// A JSON reply per JSON request line on stdin (settings, sources, the family's knobs).
    #[arg(long, requires = "render", conflicts_with = "set")]
    batch: bool,
}

pub fn run(args: &TasksArgs) -> Result<u8> {
    if let Some(target) = &args.check {
        return check(target.as_deref(), args.json);
    }
    if let (Some(target), Some(backend)) = (&args.workloads, &args.backend) {
        let task = ksearch_task::resolve(target).context("cannot load the task")?;
        let workloads = task.workloads(backend)?;
        println!("{}", serde_json::to_string_pretty(&workloads)?);
        return Ok(exit::OK);
    }
    if let (Some(target), Some(backend)) = (&args.render, &args.backend) {
        use ksearch_knowledge::render::{run_stdio, Job};
        let task = ksearch_task::resolve(target).context("cannot load the task")?;
        let list = args.list.as_ref().map(|file| file.as_deref());
        let job = Job::from_options(list, args.batch, &args.set);
        run_stdio(task.dir(), backend, args.target.as_deref(), job)?;
        return Ok(exit::OK);
    }
    let tasks = ksearch_task::builtin::list().context("cannot load the built-in tasks")?;
    let rows = tasks
        .iter()
        .map(TaskSummary::of)
        .collect::<Result<Vec<_>, _>>()?;
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
        let cells = [&r.name, &r.kind, &r.workloads_per_backend(), r.headline()];
        table.row(cells.iter().map(|c| c.to_string()).collect());
    }
    print!("{}", table.render());
    Ok(exit::OK)
}

/// `ksearch tasks --check [NAME|DIR]` (`ksearch_task::check::check_tasks`).
fn check(target: Option<&str>, json: bool) -> Result<u8> {
    let checked = check_tasks(target).context("cannot load the task")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&checked)?);
    } else {
        for c in &checked {
            if c.ok {
                println!("{}: ok", c.task);
                continue;
            }
            println!("{}: {} problem(s)", c.task, c.problems.len());
            for p in &c.problems {
                println!("{p}");
            }
        }
    }
    Ok(if checked.iter().all(|c| c.ok) {
        exit::OK
    } else {
        exit::REJECTED
    })
}
