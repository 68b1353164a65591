//! `ksearch import`: other benchmarks' problems as ksearch tasks (ksearch-interop).

use anyhow::Result;
use ksearch_interop::flashinfer;
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
    },
}

pub fn run(args: &ImportArgs) -> Result<u8> {
    let Format::Flashinfer {
        definition,
        out,
        workloads,
    } = &args.format;
    let def = flashinfer::read_definition(definition)?;
    let given = match workloads {
        Some(path) => Some((flashinfer::read_workloads(path, &def.name)?, path)),
        None => None,
    };
    let given = given.as_ref().map(|(w, p)| (w.as_slice(), p.as_path()));
    let imported = flashinfer::import(&def, given, out)?;
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
