//! `ksearch knowledge`: what the knowledge packs give a prompt (`show`), the static checks on a
//! kernel file (`lint`), and the targets and devices the packs know (`list`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::json;

use ksearch_knowledge::lint::{lint, Severity};
use ksearch_knowledge::Packs;
use ksearch_search::proposer::prompts::PromptSet;

use crate::exit;

#[derive(Debug, Args)]
pub struct KnowledgeArgs {
    #[command(subcommand)]
    command: KnowledgeCommand,
}

#[derive(Debug, Subcommand)]
enum KnowledgeCommand {
    /// Print what a prompt receives at `--context full`: device, concept map, patterns,
    /// assertions.
    Show(ShowArgs),
    /// Run a target's static checks on kernel files (what a proposal must pass to be compiled).
    Lint(LintArgs),
    /// List the targets and hardware profiles.
    List(ListArgs),
}

#[derive(Debug, Args)]
struct ShowArgs {
    /// Code target (cpu, cuda, metal, mlx-metal, mlx-cuda); default: the --task backend's.
    #[arg(long)]
    target: Option<String>,

    /// Only the patterns and assertions for this task kind (softmax, attention, …).
    #[arg(long)]
    kind: Option<String>,

    /// Take the kind (and, without --target, the target) from a task.
    #[arg(long, value_name = "NAME|DIR")]
    task: Option<String>,

    /// Backend of --task whose target to show (default cpu).
    #[arg(long, default_value = "cpu")]
    backend: String,

    /// Hardware profile instead of the target's default (name or alias).
    #[arg(long, value_name = "NAME")]
    hardware: Option<String>,

    /// Print the selected pack entries as JSON instead of the prompt text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct LintArgs {
    /// Code target whose rules apply.
    #[arg(long)]
    target: String,

    /// Kernel source files.
    #[arg(required = true)]
    files: Vec<PathBuf>,

    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ListArgs {
    #[arg(long)]
    json: bool,
}

pub fn run(args: &KnowledgeArgs) -> Result<u8> {
    let packs = Packs::builtin().context("cannot load the knowledge packs")?;
    match &args.command {
        KnowledgeCommand::Show(a) => show(&packs, a),
        KnowledgeCommand::Lint(a) => lint_files(&packs, a),
        KnowledgeCommand::List(a) => list(&packs, a),
    }
}

fn show(packs: &Packs, a: &ShowArgs) -> Result<u8> {
    let task = a.task.as_deref().map(ksearch_task::resolve).transpose();
    let task = task.context("cannot load the task")?;
    let target = match (&a.target, &task) {
        (Some(t), _) => t.clone(),
        (None, Some(task)) => {
            task.backend(&a.backend)?;
            packs.target_name_for_backend(&a.backend)?
        }
        (None, None) => bail!("give --target NAME (or --task to take it from a task's backend)"),
    };
    let kind = a.kind.as_deref().or(task.as_ref().map(|t| t.kind()));
    let ctx = packs.context(&target, kind, a.hardware.as_deref())?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&ctx)?);
        return Ok(exit::OK);
    }
    let prompts = PromptSet::builtin().context("cannot load the prompt templates")?;
    print!("{}", prompts.render_knowledge(&ctx)?);
    Ok(exit::OK)
}

fn lint_files(packs: &Packs, a: &LintArgs) -> Result<u8> {
    let target = packs.lint_target_named(&a.target)?;
    let mut rejected = false;
    let mut report = Vec::new();
    for f in &a.files {
        let source =
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?;
        let findings = lint(&target, &source);
        rejected |= findings.iter().any(|x| x.severity == Severity::Error);
        if a.json {
            report.push(json!({"file": f, "findings": findings}));
        } else if findings.is_empty() {
            println!("{}: clean", f.display());
        } else {
            for x in &findings {
                println!("{}: {x}", f.display());
            }
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(if rejected { exit::REJECTED } else { exit::OK })
}

fn list(packs: &Packs, a: &ListArgs) -> Result<u8> {
    if a.json {
        println!("{}", serde_json::to_string_pretty(&packs.listing())?);
    } else {
        print!("{}", packs.render_list());
    }
    Ok(exit::OK)
}
