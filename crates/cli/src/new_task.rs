//! `ksearch new-task`: writes a task directory to start from (`ksearch_knowledge::scaffold`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use ksearch_knowledge::scaffold::{scaffold, ScaffoldOptions};

#[derive(Debug, Args)]
pub struct NewTaskArgs {
    /// The task's name (and kind): letters, digits, `_`, `-`, `.`.
    pub name: String,

    /// The task directory to create (new or empty).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,

    /// The backend of the seed kernel.
    #[arg(long, default_value = "cpu")]
    pub backend: String,

    /// Also write a template family and actions of the task's own, for the offline proposer.
    #[arg(long)]
    pub templates: bool,
}

pub fn run(args: &NewTaskArgs, quiet: bool) -> Result<u8> {
    let opts = ScaffoldOptions {
        name: args.name.clone(),
        backend: args.backend.clone(),
        templates: args.templates,
    };
    let files = scaffold(&args.dir, &opts).context("cannot write the new task")?;
    if !quiet {
        for f in &files {
            println!("{}", args.dir.join(f).display());
        }
        eprintln!(
            "ksearch: task {} written; next: {}/README.md and docs/task-format.md",
            args.name,
            args.dir.display()
        );
    }
    Ok(crate::exit::OK)
}
