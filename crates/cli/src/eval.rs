//! `ksearch eval`: evaluate candidate files against a task.

use crate::exit;
use anyhow::{bail, Context, Result};
use clap::Args;
use ksearch_eval::report::{self, render_result, render_summary};
use ksearch_eval::{
    fresh_secret_seed, parse_positive_seconds, EvalError, EvalRequest, EvalResult, Evaluator,
    EvaluatorConfig, TimingPreset, WorkloadSet, Yardstick,
};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Built-in task name or task directory.
    #[arg(long, value_name = "NAME|DIR")]
    task: String,

    /// Backend of the task to evaluate on.
    #[arg(long, default_value = "cpu")]
    backend: String,

    /// Also evaluate the held-out workloads (what accepting a final kernel uses).
    #[arg(long)]
    held_out: bool,

    /// Secret seed from which input seeds derive; default: fresh from the OS for each call.
    #[arg(long, value_name = "N")]
    seed: Option<u64>,

    /// Wall-clock limit per candidate in seconds, build included.
    #[arg(long, value_name = "SECONDS", default_value_t = 120.0, value_parser = parse_positive_seconds)]
    timeout: f64,

    /// Timing effort: quick, standard or thorough.
    #[arg(long, value_name = "PRESET", default_value = "standard")]
    timing: TimingPreset,

    /// Print the full results as JSON (raw samples, seeds, environment) instead of tables.
    #[arg(long, conflicts_with = "json_lines")]
    json: bool,

    /// As --json, but one line per file, each printed as soon as its evaluation ends: a run
    /// that is stopped keeps what it finished.
    #[arg(long)]
    json_lines: bool,

    /// Time the baseline inside each evaluation instead of scoring every file against one
    /// yardstick measured first (docs/search.md, "Scores").
    #[arg(long)]
    no_yardstick: bool,

    #[command(flatten)]
    sandbox: crate::sandbox_arg::SandboxArg,

    /// Candidate source files; each is evaluated on its own, all against one yardstick (a file
    /// may be given more than once: each copy is evaluated again).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
}

pub fn run(args: &EvalArgs, quiet: bool) -> Result<u8> {
    let task = ksearch_task::resolve(&args.task).context("cannot load the task")?;
    task.backend(&args.backend)?;
    for file in &args.files {
        if !file.is_file() {
            bail!("candidate file not found: {}", file.display());
        }
    }
    let evaluator = Evaluator::new(EvaluatorConfig {
        sandbox: args.sandbox.mode,
        backend: Some(args.backend.clone()),
        ..EvaluatorConfig::default()
    })
    .context("cannot set up the evaluation environment (try `ksearch doctor`)")?;
    let seed = args.seed.map_or_else(fresh_secret_seed, Ok)?;
    let set = match args.held_out {
        true => WorkloadSet::Acceptance,
        false => WorkloadSet::Search,
    };

    let request = |file: &Path| {
        let mut req = EvalRequest::from_task(&task, &args.backend, file, set, seed, args.timing)?;
        req.timeout = Duration::from_secs_f64(args.timeout);
        Ok::<_, EvalError>(req)
    };
    let mut yardstick = match args.no_yardstick {
        true => None,
        false => Some(measure_yardstick(
            &evaluator,
            &request(&args.files[0])?,
            quiet,
        )?),
    };
    let mut results: Vec<(String, EvalResult)> = Vec::new();
    let mut json_items = Vec::new();
    let mut setup_failed = false;
    for file in &args.files {
        let label = file.display().to_string();
        let outcome = request(file).and_then(|mut req| {
            if !quiet {
                let n = req.workloads.len();
                let (t, b) = (task.name(), &args.backend);
                eprintln!("ksearch: evaluating {label} on {t}/{b} ({n} workloads)");
            }
            match yardstick.as_mut() {
                Some(y) => evaluator.evaluate_steady(&mut req, y),
                None => evaluator.evaluate(&req),
            }
        });
        let item = match outcome {
            Ok(result) => {
                if !(args.json || args.json_lines) {
                    println!("{}", render_result(&label, &result));
                }
                let item = json!({
                    "file": label, "task": task.name(), "backend": args.backend,
                    "held_out": args.held_out, "result": result, "yardstick": yardstick,
                });
                results.push((label, result));
                item
            }
            Err(e) => {
                setup_failed = true;
                eprintln!("error: {label}: {e}");
                json!({
                    "file": label, "task": task.name(), "backend": args.backend,
                    "error": e.to_string(),
                })
            }
        };
        if args.json_lines {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{}", serde_json::to_string(&item)?)?;
            out.flush()?;
        } else {
            json_items.push(item);
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json_items)?);
    } else if !args.json_lines && args.files.len() > 1 {
        let rows: Vec<(String, &EvalResult)> =
            results.iter().map(|(l, r)| (l.clone(), r)).collect();
        print!("{}", render_summary(&rows));
    }
    Ok(if setup_failed {
        exit::SETUP
    } else if results.iter().all(|(_, r)| r.passed()) {
        exit::OK
    } else {
        exit::REJECTED
    })
}

/// Times the baseline and reference once (`req`: the first file's request), for every file to
/// be scored against.
fn measure_yardstick(evaluator: &Evaluator, req: &EvalRequest, quiet: bool) -> Result<Yardstick> {
    if !quiet {
        eprintln!("{}", report::yardstick_intro(req));
    }
    let y = evaluator
        .yardstick(req)
        .context("cannot time the yardstick (--no-yardstick times the baseline per file)")?;
    if !quiet {
        eprintln!("{}", report::yardstick_measured(&y));
    }
    Ok(y)
}
