//! `ksearch tasks`: the built-in tasks; `--check` runs `ksearch_task::check` on them (or on
//! one task) and reports every problem; `--workloads` prints one task's resolved workloads for
//! a backend as JSON, for tools that need them without evaluating task.toml's expressions;
//! `--render` renders a task's template family for tools (ksearch_knowledge::render).

use crate::exit;
use anyhow::{Context, Result};
use clap::Args;
use ksearch_eval::report::{Align, Table};
use serde::Serialize;
use std::collections::BTreeMap;

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

#[derive(Debug, Serialize)]
struct CheckedTask {
    task: String,
    dir: String,
    ok: bool,
    problems: Vec<Problem>,
}

#[derive(Debug, Serialize)]
struct Problem {
    file: String,
    line: Option<usize>,
    field: String,
    message: String,
}

/// `ksearch tasks --check [NAME|DIR]`. A task that does not load is a failed check (its load
/// error is the problem); a name that matches nothing is a usage error.
fn check(target: Option<&str>, json: bool) -> Result<u8> {
    let tasks = match target {
        Some(t) => match ksearch_task::resolve(t) {
            Ok(task) => vec![(t.to_string(), Ok(task))],
            Err(ksearch_task::TaskError::Invalid(e)) => vec![(t.to_string(), Err(*e))],
            Err(e) => return Err(e).context(format!("cannot load task `{t}`")),
        },
        None => {
            let dir = ksearch_task::builtin::dir().context("cannot find the built-in tasks")?;
            let mut dirs: Vec<_> = std::fs::read_dir(&dir)
                .with_context(|| format!("cannot read {}", dir.display()))?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.join("task.toml").is_file())
                .collect();
            dirs.sort();
            let mut out = Vec::new();
            for d in dirs {
                let label = d
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default();
                match ksearch_task::load_task(&d) {
                    Ok(task) => out.push((label, Ok(task))),
                    Err(ksearch_task::TaskError::Invalid(e)) => out.push((label, Err(*e))),
                    Err(e) => return Err(e).context(format!("cannot load {}", d.display())),
                }
            }
            out
        }
    };
    let mut report = Vec::new();
    for (label, loaded) in tasks {
        let (name, dir, problems) = match loaded {
            Ok(task) => (
                task.name().to_string(),
                task.dir().display().to_string(),
                ksearch_task::check::check(&task),
            ),
            Err(e) => (label, String::new(), vec![e]),
        };
        report.push((name, dir, problems));
    }
    let failed = report.iter().any(|(_, _, p)| !p.is_empty());
    if json {
        let items: Vec<CheckedTask> = report
            .into_iter()
            .map(|(task, dir, problems)| CheckedTask {
                task,
                dir,
                ok: problems.is_empty(),
                problems: problems
                    .into_iter()
                    .map(|e| Problem {
                        file: e.file.display().to_string(),
                        line: e.line,
                        field: e.field,
                        message: e.message,
                    })
                    .collect(),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&items)?);
    } else {
        for (name, _, problems) in &report {
            if problems.is_empty() {
                println!("{name}: ok");
                continue;
            }
            println!("{name}: {} problem(s)", problems.len());
            for p in problems {
                println!("{p}");
            }
        }
    }
    Ok(if failed { exit::REJECTED } else { exit::OK })
}
