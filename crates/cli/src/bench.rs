//! `ksearch bench <task>`: a kernel (a run's best, a file, or the task's seed) against the
//! native implementations (PyTorch SDPA, MLX native) on the task's GPU workloads, measured in
//! one harness process in one run; per workload the median time, TFLOP/s, the fraction of the
//! hardware profile's peak and the ratios. The request, the measuring and the report are
//! `ksearch_eval::bench` and `ksearch_eval::bench_report`; the peak is the hardware profile's
//! of ksearch-knowledge. `ksearch bench mamba` is bench_mamba.rs (main.rs hands it over).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use ksearch_eval::bench_report::{self, Peaks};
use ksearch_eval::{
    fresh_secret_seed, is_gpu_backend, BenchRequest, BenchSettings, Evaluator, EvaluatorConfig,
};
use ksearch_knowledge::Catalog;
use ksearch_task::Task;

use crate::exit;
use crate::search::{open_run, pick_backend, probed_backends};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Built-in task name or task directory; `mamba` benches the whole Mamba model instead
    /// (crates/cli/src/bench_mamba.rs).
    #[arg(value_name = "TASK")]
    pub task: String,

    /// Bench the best kernel of this run (id, unique prefix or run directory).
    #[arg(long, value_name = "RUN", conflicts_with = "kernel")]
    pub run: Option<String>,

    /// Where runs are stored.
    #[arg(long, default_value = "runs", value_name = "DIR")]
    pub runs_dir: PathBuf,

    /// Bench this kernel file (default: the task's seed kernel for the backend).
    #[arg(long, value_name = "FILE")]
    pub kernel: Option<PathBuf>,

    /// cuda or mlx; default: the run's backend, else the GPU backend this machine offers.
    #[arg(long)]
    pub backend: Option<String>,

    /// Workloads: names of the task's workloads, or AXIS=VALUE lists such as
    /// `B=1,H=32,L=4096,D=128,causal=1,dtype=f16`; separate several with `;` or repeat the
    /// flag. Default: every workload of the backend, held-out ones included.
    #[arg(long, value_name = "SHAPES")]
    pub shapes: Vec<String>,

    /// Timed calls per contender and workload; the median is reported.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(20..=10_000))]
    pub reps: u32,

    /// Untimed calls before them.
    #[arg(long, default_value_t = 5)]
    pub warmup: u32,

    /// Natives to compare with (those importable on this machine are measured).
    #[arg(long, value_delimiter = ',', default_value = "sdpa,mlx", value_parser = ["sdpa", "mlx"])]
    pub compare: Vec<String>,

    /// Hardware profile for the fraction of peak (name or alias in knowledge/hardware);
    /// default: the profile of the GPU the harness reports.
    #[arg(long, value_name = "NAME")]
    pub hardware: Option<String>,

    /// Seconds the whole bench may take, nvcc included.
    #[arg(long, value_name = "SECONDS", default_value_t = 1200.0)]
    pub timeout: f64,

    /// Print JSON: the derived numbers per workload plus the harness's raw result.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &BenchArgs, quiet: bool) -> Result<u8> {
    let timeout = timeout(args)?;
    let (task, kernel, run_backend) = match &args.run {
        Some(run) => {
            let (task, path, backend) = best_of_run(&args.runs_dir, run)?;
            (task, Some(path), Some(backend))
        }
        None => (
            ksearch_task::resolve(&args.task).context("cannot load the task")?,
            args.kernel.clone(),
            None,
        ),
    };
    let backend = match (&args.backend, run_backend) {
        (Some(b), Some(r)) if *b != r => {
            bail!("the run's kernel is for the {r} backend, not {b}")
        }
        (Some(b), _) => b.clone(),
        (None, Some(r)) => r,
        (None, None) => default_gpu_backend(&task)?,
    };
    let kernel =
        match kernel {
            Some(k) => k,
            None => task.backend(&backend)?.seed.clone().with_context(|| {
                format!("task {} has no seed kernel for {backend}", task.name())
            })?,
        };
    let settings = BenchSettings {
        warmup: args.warmup,
        reps: args.reps,
        compare: args.compare.clone(),
        ..BenchSettings::default()
    };
    let req = BenchRequest::for_task(
        &task,
        &backend,
        &kernel,
        &args.shapes,
        settings,
        fresh_secret_seed()?,
        timeout,
    )?;
    let evaluator = Evaluator::new(EvaluatorConfig {
        backend: Some(backend.clone()),
        ..EvaluatorConfig::default()
    })
    .context("cannot set up the evaluation environment (try `ksearch doctor`)")?;
    if !quiet {
        eprintln!(
            "ksearch: bench {} on {}/{backend}: {} workloads, {} timed calls each",
            kernel.display(),
            task.name(),
            req.eval.workloads.len(),
            args.reps
        );
    }
    let result = evaluator.bench(&req)?;
    let catalog = Catalog::builtin().context("cannot load the knowledge pack")?;
    let peaks = catalog
        .hardware_for(args.hardware.as_deref(), result.gpu())?
        .map(|p| Peaks {
            profile: Some(p.name.clone()),
            tflops: p.peak_tflops.clone(),
        })
        .unwrap_or_default();
    let label = kernel.display().to_string();
    if args.json {
        let doc = bench_report::report_json(task.name(), &backend, &label, &result, &peaks);
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        let text = bench_report::render(task.name(), &backend, &label, &result, &peaks);
        print!("{text}");
    }
    Ok(if !result.passed() || result.kernel_failed() {
        exit::REJECTED
    } else {
        exit::OK
    })
}

/// `--timeout` as a duration; it must be a positive number of seconds.
pub fn timeout(args: &BenchArgs) -> Result<Duration> {
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        bail!("--timeout must be a positive number of seconds");
    }
    Ok(Duration::from_secs_f64(args.timeout))
}

/// A GPU backend of the task that this machine can run.
fn default_gpu_backend(task: &Task) -> Result<String> {
    let names = task.backend_names();
    if !names.iter().any(|b| is_gpu_backend(b)) {
        bail!(
            "task {} has no GPU backend; `ksearch bench` compares GPU kernels",
            task.name()
        );
    }
    let available = probed_backends();
    pick_backend(&names, &available, &["cuda", "mlx"])
        .context("the task has no GPU backend this machine can run")
}

/// The task, the best kernel's stored source file and the backend of a finished run.
pub(crate) fn best_of_run(runs_dir: &Path, run: &str) -> Result<(Task, PathBuf, String)> {
    let store = open_run(runs_dir, run)?;
    let summary = store
        .finish_summary()?
        .context("the run has not finished; `ksearch resume` it first (or see `ksearch show`)")?;
    let id = summary
        .get("best")
        .filter(|b| !b.is_null())
        .and_then(|b| b["candidate_id"].as_i64())
        .context("the run has no accepted kernel (no candidate passed the final re-check)")?;
    let cand = store
        .candidate(id)?
        .with_context(|| format!("candidate {id} is missing from the store"))?;
    let path = store.source_path(&cand.source_id)?;
    let config = store.config().clone();
    let task_ref = config.extra["task_dir"]
        .as_str()
        .filter(|d| Path::new(d).join("task.toml").is_file())
        .map(str::to_string)
        .unwrap_or_else(|| config.task.clone());
    let task = ksearch_task::resolve(&task_ref).context("cannot load the run's task")?;
    Ok((task, path, config.backend))
}
