//! `ksearch show` and `ksearch export`: open a run's store and print or write what
//! `ksearch_search::report` renders of it.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use ksearch_search::report;
use ksearch_store::RunStore;

use crate::exit;

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Run id (or unique prefix) under --runs-dir, or a run directory.
    pub run: String,

    #[arg(long, default_value = "runs", value_name = "DIR")]
    pub runs_dir: PathBuf,

    /// List every candidate, not only the last 15.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Run id (or unique prefix) under --runs-dir, or a run directory.
    pub run: String,

    #[arg(long, default_value = "runs", value_name = "DIR")]
    pub runs_dir: PathBuf,

    /// Directory to write the kernel and its README into; default: `<run dir>/export`.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

pub fn show(args: &ShowArgs) -> Result<u8> {
    let store = RunStore::open_ref(&args.runs_dir, &args.run).context("cannot open the run")?;
    print!("{}", report::render_show(&store, args.all)?);
    Ok(exit::OK)
}

/// Writes the best kernel and its README into `--out` and prints the kernel's path.
pub fn export(args: &ExportArgs) -> Result<u8> {
    let store = RunStore::open_ref(&args.runs_dir, &args.run).context("cannot open the run")?;
    let exported = report::export(&store)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| store.dir().join("export"));
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let kernel = out.join(&exported.file);
    std::fs::write(&kernel, &exported.source)
        .with_context(|| format!("cannot write {}", kernel.display()))?;
    let readme = out.join("README.md");
    std::fs::write(&readme, &exported.readme)
        .with_context(|| format!("cannot write {}", readme.display()))?;
    println!("{}", kernel.display());
    Ok(exit::OK)
}
