//! `ksearch profile`: what bounds a kernel on each workload (crates/search/src/report/profile.rs
//! reads the evaluation; crates/eval/src/bottleneck.rs interprets it).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use ksearch_eval::{
    fresh_secret_seed, EvalRequest, Evaluator, EvaluatorConfig, TimingPreset, WorkloadSet,
};
use ksearch_search::report::{self, profile};
use ksearch_store::RunStore;

use crate::exit;

#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// A finished run: its best kernel, from the evaluation that speaks for it (the re-check
    /// when the run made one). Id (or unique prefix) under --runs-dir, or a run directory.
    #[arg(long, value_name = "RUN", conflicts_with_all = ["kernel", "task"], required_unless_present = "kernel")]
    run: Option<String>,

    #[arg(long, default_value = "runs", value_name = "DIR")]
    runs_dir: PathBuf,

    /// A kernel file, evaluated now on --task's workloads (held-out included).
    #[arg(long, value_name = "FILE", requires = "task")]
    kernel: Option<PathBuf>,

    /// Built-in task name or task directory (with --kernel).
    #[arg(long, value_name = "NAME|DIR")]
    task: Option<String>,

    /// Backend of the task (with --kernel); default: the best one this machine offers for it.
    #[arg(long)]
    backend: Option<String>,

    /// Timing effort of the evaluation (with --kernel).
    #[arg(long, value_name = "PRESET", default_value = "standard")]
    timing: TimingPreset,

    #[command(flatten)]
    sandbox: crate::sandbox_arg::SandboxArg,

    /// Also run the kernel under the backend's profiler (Nsight Compute on the GPU backends)
    /// once per shown workload and read its counters into the analysis: seconds per workload.
    #[arg(long)]
    counters: bool,

    /// Print the profile as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &ProfileArgs, quiet: bool) -> Result<u8> {
    let evaluator_for = |backend: &str| {
        Evaluator::new(EvaluatorConfig {
            sandbox: args.sandbox.mode,
            backend: Some(backend.to_string()),
            ..EvaluatorConfig::default()
        })
        .context("cannot set up the evaluation environment (try `ksearch doctor`)")
    };
    // The evaluator that evaluated the kernel, kept for its profile (one set-up, not two).
    let (task, backend, kernel, mut eval, evaluator) = match (&args.run, &args.kernel, &args.task) {
        (Some(run), _, _) => {
            let store = RunStore::open_ref(&args.runs_dir, run).context("cannot open the run")?;
            let best = report::best_evaluation(&store).context("no best kernel to profile")?;
            (
                best.kernel.task,
                best.kernel.backend,
                best.kernel.path,
                best.eval,
                None,
            )
        }
        (None, Some(file), Some(task)) => {
            let task = ksearch_task::resolve(task).context("cannot load the task")?;
            let backend = match &args.backend {
                Some(b) => b.clone(),
                None => ksearch_eval::backends::default_backend(&task).with_context(|| {
                    format!("no backend of task {} runs on this machine", task.name())
                })?,
            };
            task.backend(&backend)?;
            if !file.is_file() {
                bail!("kernel file not found: {}", file.display());
            }
            let mut req = EvalRequest::from_task(
                &task,
                &backend,
                file,
                WorkloadSet::Acceptance,
                fresh_secret_seed()?,
                args.timing,
            )?;
            req.timeout = Duration::from_secs(300);
            if !quiet {
                eprintln!(
                    "ksearch: evaluating {} on {}/{}",
                    file.display(),
                    task.name(),
                    backend
                );
            }
            let evaluator = evaluator_for(&backend)?;
            let result = evaluator.evaluate(&req)?;
            if !result.passed() {
                bail!(
                    "the kernel did not pass ({}): {}",
                    result.status,
                    result.message.lines().next().unwrap_or("")
                );
            }
            (task, backend, file.clone(), result, Some(evaluator))
        }
        _ => bail!("give --run RUN, or --kernel FILE with --task TASK"),
    };
    if args.counters {
        let mut req = EvalRequest::from_task(
            &task,
            &backend,
            &kernel,
            WorkloadSet::Search,
            fresh_secret_seed()?,
            args.timing,
        )?;
        let workloads = req.workloads.len();
        req.timeout = Evaluator::profile_timeout(workloads);
        if !quiet {
            eprintln!(
                "ksearch: profiling {} on {workloads} workloads of {}/{backend}",
                kernel.display(),
                task.name()
            );
        }
        let evaluator = match evaluator {
            Some(e) => e,
            None => evaluator_for(&backend)?,
        };
        let profiled = evaluator.profile(&req)?;
        match profiled.extra.get("profile") {
            Some(section) => {
                eval.extra.insert("profile".into(), section.clone());
            }
            None => bail!(
                "the kernel could not be profiled ({}): {}",
                profiled.status,
                profiled.message.lines().next().unwrap_or("")
            ),
        }
    }
    let profile = profile::profile_evaluation(&task, &backend, &eval);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&profile)?);
    } else {
        print!("{}", profile::render_profile(&profile));
    }
    Ok(exit::OK)
}
