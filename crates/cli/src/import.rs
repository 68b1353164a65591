//! `ksearch import`: other benchmarks' problems as ksearch tasks (ksearch-interop).

use anyhow::{Context, Result};
use ksearch_eval::harness_env;
use ksearch_interop::flashinfer::{self, ImportOptions};
use ksearch_interop::kernelbench;
use std::path::{Path, PathBuf};

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
        /// A CUDA kernel to ship as the task's seed (seed/naive.cu).
        #[arg(long)]
        seed: Option<PathBuf>,
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
    let (definition, out, workloads, dataset, seed) = match &args.format {
        Format::Flashinfer {
            definition,
            out,
            workloads,
            dataset,
            seed,
        } => (definition, out, workloads, dataset, seed),
        Format::Kernelbench { problem, out } => return import_kernelbench(problem, out),
    };
    let def = flashinfer::read_definition(definition)?;
    let given = match workloads {
        Some(path) => Some((flashinfer::read_workloads(path, &def.name)?, path)),
        None => None,
    };
    let dataset = dataset
        .clone()
        .or_else(|| flashinfer::dataset_root(definition));
    let opts = ImportOptions {
        workloads: given.as_ref().map(|(w, p)| (w.as_slice(), p.as_path())),
        dataset: dataset.as_deref(),
        seed: seed.as_deref(),
    };
    report(&flashinfer::import(&def, &opts, out)?)
}

fn import_kernelbench(problem: &Path, out: &Path) -> Result<u8> {
    let python = harness_env::resolve_for(Some("cuda"))
        .context("cannot set up the Python environment (try `ksearch doctor`)")?
        .python;
    let seen = kernelbench::introspect(&python, problem)?;
    report(&kernelbench::import(problem, &seen, out)?)
}

fn report(imported: &flashinfer::Imported) -> Result<u8> {
    let spec = imported.task.spec();
    let n = spec.workloads.len();
    println!(
        "wrote task `{}` to {} ({n} workloads)",
        spec.name,
        imported.dir.display()
    );
    for note in &imported.notes {
        println!("  note: {note}");
    }
    Ok(crate::exit::OK)
}
