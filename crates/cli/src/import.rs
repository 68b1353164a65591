//! `ksearch import`: other benchmarks' problems as ksearch tasks (ksearch-interop).

use anyhow::Result;
use ksearch_interop::flashinfer::{self, ImportOptions};
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
        /// A CUDA kernel to ship as the task's seed (seed/naive.cu).
        #[arg(long)]
        seed: Option<PathBuf>,
    },
}

pub fn run(args: &ImportArgs) -> Result<u8> {
    let Format::Flashinfer {
        definition,
        out,
        workloads,
        dataset,
        seed,
    } = &args.format;
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
    let imported = flashinfer::import(&def, &opts, out)?;
    let n = imported.task.spec().workloads.len();
    println!(
        "wrote task `{}` to {} ({n} workloads)",
        def.name,
        imported.dir.display()
    );
    for note in &imported.notes {
        println!("  note: {note}");
    }
    Ok(crate::exit::OK)
}
