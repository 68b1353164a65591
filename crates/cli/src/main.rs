//! ksearch-cli: the `ksearch` binary. Argument parsing and wiring only; the work happens in the
//! library crates (see docs/ARCHITECTURE.md and docs/cli.md).

mod bench;
mod bench_mamba;
mod doctor;
mod eval;
mod exit;
mod import;
mod inspect;
mod knowledge;
mod logging;
mod new_task;
mod profile;
mod sandbox_arg;
mod search;
mod tasks;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Search for fast GPU/CPU kernels; evaluate candidate kernels trustworthily.
#[derive(Debug, Parser)]
#[command(name = "ksearch", version, propagate_version = true)]
struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,

    /// Only errors.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the built-in tasks.
    Tasks(tasks::TasksArgs),
    /// Write a new task directory to start from (task.toml, reference, seed; --templates: a
    /// template family and actions for the offline search).
    NewTask(new_task::NewTaskArgs),
    /// Evaluate candidate kernel files: build, static checks, correctness, timing.
    Eval(eval::EvalArgs),
    /// Check what this machine offers (Python, numpy, compilers, torch, mlx, GPUs).
    Doctor(doctor::DoctorArgs),
    /// Search for a fast kernel: the world-model-guided K-Search loop.
    Run(Box<search::RunArgs>),
    /// Continue a run that was interrupted (or raise a finished run's round budget).
    Resume(search::ResumeArgs),
    /// Print a run: status, best result, the world-model tree, candidates.
    Show(inspect::ShowArgs),
    /// List the runs under --runs-dir: task, status and the confirmed best.
    Runs(inspect::RunsArgs),
    /// Write a run's best kernel and a README of its numbers.
    Export(inspect::ExportArgs),
    /// Write a run as one self-contained HTML page (summary, curves, tree, candidates).
    Report(inspect::ReportArgs),
    /// What bounds a kernel on each workload: memory, compute, latency or launch.
    Profile(profile::ProfileArgs),
    /// Knowledge packs: what prompts receive per target, static checks, targets and devices.
    Knowledge(knowledge::KnowledgeArgs),
    /// Time a GPU kernel against PyTorch SDPA and MLX native on the task's workloads.
    Bench(Box<BenchCommand>),
    /// Run search strategies on one task with equal budgets and compare their runs.
    Compare(Box<search::CompareArgs>),
    /// Turn another benchmark's problem into a ksearch task (FlashInfer-Bench definitions).
    Import(import::ImportArgs),
}

/// `ksearch bench`'s options: those of a task's bench and those of the whole-model Mamba bench
/// (TASK = mamba), which `main` hands over to bench_mamba.rs.
#[derive(Debug, clap::Args)]
struct BenchCommand {
    #[command(flatten)]
    bench: bench::BenchArgs,
    #[command(flatten)]
    mamba: bench_mamba::MambaArgs,
}

fn main() -> ExitCode {
    // Rust ignores SIGPIPE, which turns `ksearch tasks | head` into a panic on the next print.
    // Dying quietly of SIGPIPE, as other command-line tools do, is what users expect.
    // SAFETY: called before any other thread exists; restores the default disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    logging::init(cli.verbose, cli.quiet);
    let result = match cli.command {
        Command::Tasks(args) => tasks::run(&args),
        Command::NewTask(args) => new_task::run(&args, cli.quiet),
        Command::Eval(args) => eval::run(&args, cli.quiet),
        Command::Doctor(args) => doctor::run(&args),
        Command::Run(args) => search::run(&args, cli.quiet),
        Command::Resume(args) => search::resume(&args, cli.quiet),
        Command::Show(args) => inspect::show(&args),
        Command::Runs(args) => inspect::runs(&args),
        Command::Export(args) => inspect::export(&args),
        Command::Report(args) => inspect::report(&args),
        Command::Profile(args) => profile::run(&args, cli.quiet),
        Command::Knowledge(args) => knowledge::run(&args),
        Command::Bench(args) if args.bench.task == bench_mamba::TASK => {
            bench_mamba::run(&args.bench, &args.mamba, cli.quiet)
        }
        Command::Bench(args) => bench::run(&args.bench, cli.quiet),
        Command::Import(args) => import::run(&args),
        Command::Compare(args) => search::compare(&args, cli.quiet),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(exit::SETUP)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
