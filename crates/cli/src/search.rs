//! `ksearch run` and `ksearch resume`: the options of a run, and wiring the task, the run
//! store and the set-up of `ksearch_search::session` into the engine, with a progress display
//! and the exit status of the outcome.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use ksearch_eval::{fresh_secret_seed, TimingPreset};
use ksearch_search::engine::{EngineError, Progress, ProgressSink};
use ksearch_search::proposer::prompts::ContextLevel;
use ksearch_search::report::render_outcome;
use ksearch_search::session::{self, Seeds, Setup};
use ksearch_search::settings::{
    ProposerKind, ReplayMatch, RunSettings, SelectionKind, Strategy, RUN_SETTINGS_VERSION,
};
use ksearch_store::RunStore;

use crate::{exit, signals};

// `ksearch bench` picks its backend the same way.
pub use ksearch_eval::backends::{pick_backend, probed_backends};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StrategyArg {
    /// K-Search: a world model of rated optimisation ideas steers each cycle.
    WorldModel,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProposerArg {
    /// Built-in, no network: the action catalog and the task's template family.
    Offline,
    /// An OpenAI-compatible chat-completions server (OpenAI, vLLM, Ollama, OpenRouter, …).
    Openai,
    /// The Anthropic Messages API.
    Anthropic,
    /// A program of yours: prompt on stdin, reply on stdout (`--command`).
    Command,
    /// Replies from a recorded transcript (`--transcript`), no network.
    Replay,
}

/// How a replay matches calls to recorded replies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ReplayModeArg {
    /// The next recorded reply of the same role (code, wm-init, …), whatever the prompt:
    /// prompts carry measured times, which differ from run to run.
    #[default]
    Lenient,
    /// Records in file order, each prompt hashing exactly as recorded.
    Strict,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SelectionArg {
    /// Utility with confidence, failures, visits and calibrated predictions (default).
    Calibrated,
    /// The original K-Search order: score, difficulty, rating, id, with its difficulty gate.
    Ksearch,
}

/// The options that define a run. They become the run's [`RunSettings`], which are stored
/// with it so `resume` rebuilds the same search.
#[derive(Clone, Debug, Args)]
pub struct SearchOptions {
    /// Search strategy.
    #[arg(long, value_enum, default_value_t = StrategyArg::WorldModel)]
    pub strategy: StrategyArg,

    /// Who proposes ideas and writes kernels.
    #[arg(long, value_enum, default_value_t = ProposerArg::Offline)]
    pub proposer: ProposerArg,

    /// How the next action is chosen from the world model's frontier.
    #[arg(long, value_enum, default_value_t = SelectionArg::Calibrated)]
    pub selection: SelectionArg,

    /// Code-generation rounds (each evaluates --samples candidates).
    #[arg(long, default_value_t = 20)]
    pub rounds: u32,

    /// Candidates per attempt, written and evaluated concurrently.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub samples: u32,

    /// Rounds without improvement that end a cycle (the original's window W).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub stagnation_window: u32,

    /// Attempts per cycle at most (0: unlimited, as in the original K-Search).
    #[arg(long, default_value_t = 4)]
    pub cycle_cap: u32,

    /// Difficulty cap for `--selection ksearch`.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=5))]
    pub max_difficulty: u8,

    /// Stop after this many seconds of search (checked between rounds).
    #[arg(long, value_name = "SECONDS")]
    pub max_wall_time: Option<u64>,

    /// Stop when the proposer has used this many tokens.
    #[arg(long)]
    pub max_tokens: Option<u64>,

    /// Stop when the proposer has spent this many US dollars.
    #[arg(long, value_name = "USD")]
    pub max_cost: Option<f64>,

    /// Timing effort per candidate: quick, standard or thorough.
    #[arg(long, value_name = "PRESET", default_value = "quick")]
    pub timing: TimingPreset,

    /// Do not re-check the winner in a fresh process on all workloads (held-out included).
    #[arg(long)]
    pub no_recheck: bool,

    /// Rounds of the final confirmation: the winner, two runner-ups and the seed evaluated in
    /// turn, whose numbers are the run's headline (0 skips it).
    #[arg(long, value_name = "N", default_value_t = ksearch_search::engine::DEFAULT_CONFIRM_ROUNDS)]
    pub confirm_rounds: u32,

    /// Failed proposer calls in a row (unreachable, refused, timed out) that stop the run,
    /// unfinished, with exit status 3 (0: never).
    #[arg(long, value_name = "N", default_value_t = ksearch_search::engine::DEFAULT_MAX_PROPOSER_FAILURES, help_heading = "LLM proposers")]
    pub max_proposer_failures: u32,

    /// Model name for LLM proposers (required for openai and anthropic).
    #[arg(long, help_heading = "LLM proposers")]
    pub model: Option<String>,

    /// Base URL of the API (openai: up to `/v1`; anthropic: the host root).
    #[arg(long, value_name = "URL", help_heading = "LLM proposers")]
    pub base_url: Option<String>,

    /// Environment variable holding the API key (default OPENAI_API_KEY / ANTHROPIC_API_KEY;
    /// "" sends none). Keys are only ever read from the environment.
    #[arg(long, value_name = "VAR", help_heading = "LLM proposers")]
    pub api_key_env: Option<String>,

    /// Program and arguments of the command proposer, e.g. "my-agent --print".
    #[arg(long, value_name = "\"PROG ARGS\"", help_heading = "LLM proposers")]
    pub command: Option<String>,

    /// Transcript to replay (`runs/<id>/transcript.jsonl` of an earlier run).
    #[arg(long, value_name = "FILE", help_heading = "LLM proposers")]
    pub transcript: Option<PathBuf>,

    /// How a replay matches calls to recorded replies.
    #[arg(long, value_enum, default_value_t = ReplayModeArg::Lenient, help_heading = "LLM proposers")]
    pub replay_mode: ReplayModeArg,

    /// Seconds each replayed reply waits, as a model endpoint's latency would: how a search
    /// keeps the evaluator busy while its proposer is slow.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0, value_parser = parse_delay, help_heading = "LLM proposers")]
    pub replay_delay: f64,

    /// How much the prompts carry: none (signature only), spec (+ task spec and world model),
    /// full (+ hardware profile, concept maps, patterns, assertions).
    #[arg(long, value_name = "LEVEL", default_value = "full", value_parser = parse_context, help_heading = "LLM proposers")]
    pub context: ContextLevel,

    /// Hardware profile for the prompts (name or alias in knowledge/hardware); default: the
    /// target's.
    #[arg(long, value_name = "NAME", help_heading = "LLM proposers")]
    pub hardware: Option<String>,

    /// Extra price table (TOML, as knowledge/prices.toml); its entries win.
    #[arg(long, value_name = "FILE", help_heading = "LLM proposers")]
    pub price_table: Option<PathBuf>,

    /// Seconds one LLM call may take (each retry gets a fresh limit).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 600.0,
        help_heading = "LLM proposers"
    )]
    pub llm_timeout: f64,

    /// LLM calls in flight at most.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256), help_heading = "LLM proposers")]
    pub llm_concurrency: u32,

    /// Output token limit per LLM call (default: the provider's).
    #[arg(long, value_name = "N", help_heading = "LLM proposers")]
    pub max_output_tokens: Option<u32>,

    /// Sampling temperature of LLM calls (default: the provider's).
    #[arg(long, help_heading = "LLM proposers")]
    pub temperature: Option<f32>,

    /// Do not answer repeated prompts from the response cache.
    #[arg(long, help_heading = "LLM proposers")]
    pub no_llm_cache: bool,

    /// Skip the knowledge packs' static checks before compiling.
    #[arg(long)]
    pub no_lint: bool,
}

impl SearchOptions {
    /// The run's settings these options ask for.
    pub fn settings(&self) -> RunSettings {
        RunSettings {
            version: RUN_SETTINGS_VERSION,
            strategy: match self.strategy {
                StrategyArg::WorldModel => Strategy::WorldModel,
            },
            proposer: match self.proposer {
                ProposerArg::Offline => ProposerKind::Offline,
                ProposerArg::Openai => ProposerKind::Openai,
                ProposerArg::Anthropic => ProposerKind::Anthropic,
                ProposerArg::Command => ProposerKind::Command,
                ProposerArg::Replay => ProposerKind::Replay,
            },
            selection: match self.selection {
                SelectionArg::Calibrated => SelectionKind::Calibrated,
                SelectionArg::Ksearch => SelectionKind::Ksearch,
            },
            rounds: self.rounds,
            samples: self.samples,
            stagnation_window: self.stagnation_window,
            cycle_cap: self.cycle_cap,
            max_difficulty: self.max_difficulty,
            max_wall_time: self.max_wall_time,
            max_tokens: self.max_tokens,
            max_cost: self.max_cost,
            timing: self.timing,
            no_recheck: self.no_recheck,
            confirm_rounds: self.confirm_rounds,
            max_proposer_failures: self.max_proposer_failures,
            model: self.model.clone(),
            base_url: self.base_url.clone(),
            api_key_env: self.api_key_env.clone(),
            command: self.command.clone(),
            transcript: self.transcript.clone(),
            replay_mode: match self.replay_mode {
                ReplayModeArg::Lenient => ReplayMatch::Lenient,
                ReplayModeArg::Strict => ReplayMatch::Strict,
            },
            replay_delay: self.replay_delay,
            context: self.context,
            hardware: self.hardware.clone(),
            price_table: self.price_table.clone(),
            llm_timeout: self.llm_timeout,
            llm_concurrency: self.llm_concurrency,
            max_output_tokens: self.max_output_tokens,
            temperature: self.temperature,
            no_llm_cache: self.no_llm_cache,
            no_lint: self.no_lint,
        }
    }
}

fn parse_context(s: &str) -> Result<ContextLevel, String> {
    s.parse()
}

fn parse_delay(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds from 0 to 3600")),
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Built-in task name or task directory.
    #[arg(long, value_name = "NAME|DIR")]
    pub task: String,

    /// Backend; default: the best one this machine offers for the task.
    #[arg(long)]
    pub backend: Option<String>,

    /// Seed of the proposer's random choices; default: fresh (recorded in the run).
    #[arg(long)]
    pub seed: Option<u64>,

    /// Where runs are stored.
    #[arg(long, default_value = "runs", value_name = "DIR")]
    pub runs_dir: PathBuf,

    #[command(flatten)]
    pub search: SearchOptions,

    #[command(flatten)]
    pub sandbox: crate::sandbox_arg::SandboxArg,

    /// Print the outcome as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// Run id (or unique prefix) under --runs-dir, or a run directory.
    pub run: String,

    #[arg(long, default_value = "runs", value_name = "DIR")]
    pub runs_dir: PathBuf,

    /// Raise the round budget (to continue a finished run).
    #[arg(long)]
    pub rounds: Option<u32>,

    /// Raise the wall-time budget, in seconds of search over every session of the run (to
    /// continue a run its --max-wall-time stopped).
    #[arg(long, value_name = "SECONDS")]
    pub max_wall_time: Option<u64>,

    /// Re-check the winner at the end even if the run was started with --no-recheck.
    #[arg(long)]
    pub recheck: bool,

    #[command(flatten)]
    pub sandbox: crate::sandbox_arg::SandboxArg,

    #[arg(long)]
    pub json: bool,
}

/// Opens a run by id (or unique prefix) under `runs_dir`, or by its directory.
pub fn open_run(runs_dir: &Path, run: &str) -> Result<RunStore> {
    let as_path = Path::new(run);
    let store = if as_path.is_dir() {
        RunStore::open(as_path)
    } else {
        RunStore::open_in(runs_dir, run)
    };
    store.with_context(|| format!("cannot open run `{run}` (looked in {})", runs_dir.display()))
}

pub fn run(args: &RunArgs, quiet: bool) -> Result<u8> {
    let settings = args.search.settings();
    let task = ksearch_task::resolve(&args.task).context("cannot load the task")?;
    let backend = match &args.backend {
        Some(b) => b.clone(),
        None => ksearch_eval::backends::default_backend(&task)
            .with_context(|| format!("task {} has no backend", task.name()))?,
    };
    let (seed_path, seed_source) = session::seed_kernel(&task, &backend)?;
    // Before the run exists: a task the proposer cannot search leaves no run behind.
    session::check_task(&task, &backend, &settings)?;
    let seeds = Seeds {
        seed: match args.seed {
            Some(s) => s,
            None => fresh_secret_seed()?,
        },
        secret_seed: fresh_secret_seed()?,
    };
    std::fs::create_dir_all(&args.runs_dir)
        .with_context(|| format!("cannot create {}", args.runs_dir.display()))?;
    let config = session::run_config(&args.task, &task, &backend, &settings, seeds, &seed_path);
    let store = RunStore::create(&args.runs_dir, &config).context("cannot create the run")?;
    // Held until the run ends: no `resume` writes into it meanwhile.
    let writer = store.lock_writer()?;
    let interrupt = signals::interrupt_on_signals();
    let sandbox = args.sandbox.mode;
    let setup = match session::set_up(
        &store, &task, &backend, &settings, sandbox, seeds, interrupt,
    ) {
        Ok(s) => s,
        Err(e) => {
            // Nothing was evaluated or spent: no half-made run is left for `show` to list as
            // resumable and for `resume` to fail on again.
            let dir = store.dir().to_path_buf();
            if let Err(d) = store.discard(Some(writer)) {
                tracing::warn!("cannot remove the unused run {}: {d}", dir.display());
            }
            return Err(e.into());
        }
    };
    if !quiet {
        eprintln!(
            "ksearch: run {} — task {}, backend {backend}, {} rounds, proposer {}{}, seed {}",
            store.id(),
            task.name(),
            settings.rounds,
            settings.proposer.as_str(),
            settings
                .model
                .as_deref()
                .map(|m| format!(" ({m}, context {})", settings.context))
                .unwrap_or_default(),
            seeds.seed
        );
    }
    let outcome = drive(
        store,
        setup,
        settings.rounds,
        Some(&seed_source),
        quiet,
        args.json,
    );
    drop(writer);
    outcome
}

pub fn resume(args: &ResumeArgs, quiet: bool) -> Result<u8> {
    let store = open_run(&args.runs_dir, &args.run)?;
    // Held until the resumed run ends: a second `run` or `resume` of it is refused at once.
    let _writer = store.lock_writer()?;
    let config = store.config().clone();
    let mut search = RunSettings::from_value(&config.flags)?;
    if let Some(r) = args.rounds {
        search.rounds = r;
    }
    if let Some(w) = args.max_wall_time {
        search.max_wall_time = Some(w);
    }
    if args.recheck {
        search.no_recheck = false;
    }
    let task = ksearch_task::resolve(&session::task_ref_of_run(&config))
        .context("cannot load the run's task")?;
    let seed_source = task
        .backend(&config.backend)?
        .seed
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok());
    if !quiet {
        eprintln!(
            "ksearch: resuming run {} ({} rounds{})",
            store.id(),
            search.rounds,
            search
                .max_wall_time
                .map(|w| format!(", {w} s of search"))
                .unwrap_or_default()
        );
    }
    let seeds = Seeds {
        seed: config.seed,
        secret_seed: config.secret_seed,
    };
    let interrupt = signals::interrupt_on_signals();
    let setup = session::set_up(
        &store,
        &task,
        &config.backend,
        &search,
        args.sandbox.mode,
        seeds,
        interrupt,
    )?;
    drive(
        store,
        setup,
        search.rounds,
        seed_source.as_deref(),
        quiet,
        args.json,
    )
}

/// Runs the engine with a progress display and maps how it ended to the exit status: an
/// interruption or a proposer that gave up leaves a resumable run (and says so).
fn drive(
    store: RunStore,
    setup: Setup,
    rounds: u32,
    seed_source: Option<&str>,
    quiet: bool,
    json_out: bool,
) -> Result<u8> {
    let progress = ProgressDisplay::new(rounds, quiet);
    let run_id = store.id().to_string();
    let (outcome, store) = setup.run(store, seed_source, &progress);
    progress.finish();
    let outcome = match outcome {
        Ok(o) => o,
        Err(EngineError::Interrupted) => {
            eprintln!("interrupted: the run is saved; continue it with `ksearch resume {run_id}`");
            return Ok(exit::INTERRUPTED);
        }
        Err(e @ EngineError::ProposerGaveUp { .. }) => {
            eprintln!(
                "error: {e}\nthe run is saved: fix the cause, then continue it with \
                 `ksearch resume {run_id}`"
            );
            return Ok(exit::GAVE_UP);
        }
        Err(e) => {
            bail!("{e}\nthe run is saved: continue it with `ksearch resume {run_id}`")
        }
    };
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"run": run_id, "dir": store.dir(), "outcome": outcome})
            )?
        );
    } else {
        print!("{}", render_outcome(&run_id, &outcome));
    }
    Ok(if outcome.best.is_some() {
        exit::OK
    } else {
        exit::REJECTED
    })
}

/// A progress bar on a terminal; one line per round otherwise (logs, CI).
struct ProgressDisplay {
    bar: Option<ProgressBar>,
    lines: bool,
}

impl ProgressDisplay {
    fn new(rounds: u32, quiet: bool) -> Self {
        if quiet {
            return Self {
                bar: None,
                lines: false,
            };
        }
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(u64::from(rounds));
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} round {pos}/{len} [{bar:24}] {elapsed_precise} {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
            Self {
                bar: Some(bar),
                lines: false,
            }
        } else {
            Self {
                bar: None,
                lines: true,
            }
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

impl ProgressSink for ProgressDisplay {
    fn update(&self, p: &Progress) {
        let best = p
            .best_score
            .map(|s| format!("{s:.2}x"))
            .unwrap_or_else(|| "-".into());
        let msg = format!(
            "best {best} | passed {} failed {} | tokens {} | ${:.2} | cycle {} on {}: {}",
            p.passed,
            p.failed,
            p.input_tokens + p.output_tokens,
            p.cost_usd,
            p.cycle,
            p.node,
            p.message
        );
        if let Some(b) = &self.bar {
            b.set_position(u64::from(p.round));
            b.set_message(msg);
        } else if self.lines {
            eprintln!("round {}/{}: {msg}", p.round, p.rounds);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use ksearch_llm::ProviderConfig;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        search: SearchOptions,
    }

    #[test]
    fn llm_options_round_trip_through_the_run_config_without_the_key() {
        let cli = Cli::parse_from([
            "x",
            "--proposer",
            "openai",
            "--model",
            "m",
            "--base-url",
            "http://h/v1",
            "--api-key-env",
            "MY_KEY",
            "--context",
            "spec",
            "--llm-timeout",
            "5",
        ]);
        let stored = cli.search.settings().to_value();
        assert_eq!(stored["api_key_env"], "MY_KEY");
        assert_eq!(stored["context"], "spec");
        let back = RunSettings::from_value(&stored).unwrap();
        match session::provider_config(&back).unwrap() {
            ProviderConfig::Openai(c) => {
                assert_eq!(
                    (c.model.as_str(), c.base_url.as_str()),
                    ("m", "http://h/v1")
                );
                assert_eq!(c.api_key_env, "MY_KEY");
                assert_eq!(c.timeout_s, 5.0);
            }
            other => panic!("{other:?}"),
        }
    }
}
