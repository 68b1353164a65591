//! `ksearch import`: other benchmarks' problems as ksearch tasks (ksearch-interop).

use anyhow::{Context, Result};
use ksearch_eval::harness_env;
use ksearch_interop::flashinfer;
use ksearch_interop::kernelbench;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    #[command(subcommand)]
    format: Format,
}

#[derive(Debug, clap::Subcommand)]
enum Format {
    /// A FlashInfer-Bench definition (JSON) → a task for the cuda backend.
    Flashinfer {
        /// The definition file.
        definition: PathBuf,
        /// The task directory to write (must not exist, or be empty).
        #[arg(long)]
        out: PathBuf,
        /// Workload trace lines (JSONL); without it, workloads are chosen from the axes.
        #[arg(long)]
        workloads: Option<PathBuf>,
        /// The dataset's root, for workloads' safetensors paths [default: the directory above
        /// the definition's `definitions/`].
        #[arg(long)]
        dataset: Option<PathBuf>,
        /// The task's own files to copy in: seed/naive.cu (the seed), templates-cuda/,
        /// knowledge/actions/.
        #[arg(long, value_name = "DIR")]
        with: Option<PathBuf>,
    },
    /// A KernelBench problem (Python) → a task for the cuda backend (runs it once with PyTorch).
    Kernelbench {
        /// The problem file (`Model`, `get_inputs`, `get_init_inputs`).
        problem: PathBuf,
        /// The task directory to write (must not exist, or be empty).
        #[arg(long)]
        out: PathBuf,
    },
}

pub fn run(args: &ImportArgs) -> Result<u8> {
    let imported = match &args.format {
        Format::Flashinfer {
            definition,
            out,
            workloads,
            dataset,
            with,
        } => flashinfer::import_files(
            definition,
            workloads.as_deref(),
            dataset.as_deref(),
            with.as_deref(),
            out,
        )?,
        Format::Kernelbench { problem, out } => {
            let python = harness_env::resolve_for(Some("cuda"))
                .context("cannot set up the Python environment (try `ksearch doctor`)")?
                .python;
            kernelbench::import(problem, &kernelbench::introspect(&python, problem)?, out)?
        }
    };
    print!("{}", imported.summary());
    Ok(crate::exit::OK)
}
