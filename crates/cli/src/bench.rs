//! `ksearch bench <task>`: a kernel (a run's best, a file, or the task's seed) against the
//! native implementations (PyTorch SDPA, MLX native) on the task's GPU workloads, measured in
//! one harness process in one run; per workload the median time, TFLOP/s, the fraction of the
//! hardware profile's peak and the ratios. The request, the measuring and the report are
//! `ksearch_eval::bench` and `ksearch_eval::bench_report`; the peak is the hardware profile's
//! of ksearch-knowledge. `ksearch bench mamba` is bench_mamba.rs (main.rs hands it over).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use ksearch_eval::backends::bench_backend;
use ksearch_eval::bench::kernel_or_seed;
use ksearch_eval::bench_report::{self, Peaks};
use ksearch_eval::{
    fresh_secret_seed, parse_positive_seconds, BenchRequest, BenchSettings, Evaluator,
    EvaluatorConfig,
};
use ksearch_knowledge::Catalog;
use ksearch_search::report;
use ksearch_store::RunStore;

use crate::exit;

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
    #[arg(long, value_name = "SECONDS", default_value_t = 1200.0, value_parser = parse_positive_seconds)]
    pub timeout: f64,

    /// Print JSON: the derived numbers per workload plus the harness's raw result.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &BenchArgs, quiet: bool) -> Result<u8> {
    let (task, kernel, run_backend) = match &args.run {
        Some(run) => {
            let best = report::best_kernel(
                &RunStore::open_ref(&args.runs_dir, run).context("cannot open the run")?,
            )?;
            (best.task, Some(best.path), Some(best.backend))
        }
        None => {
            let task = ksearch_task::resolve(&args.task).context("cannot load the task")?;
            (task, args.kernel.clone(), None)
        }
    };
    let backend = bench_backend(&task, args.backend.as_deref(), run_backend.as_deref())?;
    let kernel = kernel_or_seed(&task, &backend, kernel.as_deref())?;
    let settings = BenchSettings {
        warmup: args.warmup,
        reps: args.reps,
        compare: args.compare.clone(),
        ..BenchSettings::default()
    };
    let timeout = Duration::from_secs_f64(args.timeout);
    let seed = fresh_secret_seed()?;
    let req = BenchRequest::for_task(
        &task,
        &backend,
        &kernel,
        &args.shapes,
        settings,
        seed,
        timeout,
    )?;
    let evaluator = Evaluator::new(EvaluatorConfig {
        backend: Some(backend.clone()),
        ..EvaluatorConfig::default()
    })
    .context("cannot set up the evaluation environment (try `ksearch doctor`)")?;
    if !quiet {
        let (k, t, n) = (kernel.display(), task.name(), req.eval.workloads.len());
        eprintln!(
            "ksearch: bench {k} on {t}/{backend}: {n} workloads, {} timed calls each",
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
        print!(
            "{}",
            bench_report::render(task.name(), &backend, &label, &result, &peaks)
        );
    }
    let ok = result.passed() && !result.kernel_failed();
    Ok(if ok { exit::OK } else { exit::REJECTED })
}
