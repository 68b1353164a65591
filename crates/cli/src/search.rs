//! `ksearch run` and `ksearch resume`: the options of a run (they become its stored
//! `RunSettings`), and wiring `ksearch_search::session` into the engine, with a progress
//! display and the exit status of the outcome. docs/cli.md describes the options.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use ksearch_eval::{interrupt, TimingPreset};
use ksearch_search::compare::{self, CompareSpec};
use ksearch_search::engine::{self, EngineError, Progress, ProgressSink};
use ksearch_search::evolve::Feature;
use ksearch_search::proposer::prompts::ContextLevel;
use ksearch_search::report::render_outcome;
use ksearch_search::session::{self, NewRun, Session};
use ksearch_search::settings::{
    self as s, EvolveSettings, ProposerKind, ReplayMatch, ResumeChanges, RunSettings,
    SelectionKind, Strategy, RUN_SETTINGS_VERSION,
};
use ksearch_store::RunStore;

use crate::{exit, sandbox_arg::SandboxArg};

/// One of a settings choice's `names`, parsed into it (`--help` lists the names).
fn choice<T>(names: &'static [&'static str]) -> impl TypedValueParser<Value = T>
where
    T: FromStr<Err = String> + Clone + Send + Sync + 'static,
{
    PossibleValuesParser::new(names).try_map(|v| v.parse::<T>())
}

/// The options that define a run. They become the run's [`RunSettings`], which are stored
/// with it so `resume` rebuilds the same search.
#[derive(Clone, Debug, Args)]
pub struct SearchOptions {
    /// Search strategy (world-model: K-Search).
    #[arg(long, default_value_t = Strategy::WorldModel, value_parser = choice::<Strategy>(Strategy::NAMES))]
    pub strategy: Strategy,

    /// Who proposes ideas and writes kernels (docs/llm-proposers.md).
    #[arg(long, default_value_t = ProposerKind::Offline, value_parser = choice::<ProposerKind>(ProposerKind::NAMES))]
    pub proposer: ProposerKind,

    /// How the next action is chosen from the world model's frontier.
    #[arg(long, default_value_t = SelectionKind::Calibrated, value_parser = choice::<SelectionKind>(SelectionKind::NAMES))]
    pub selection: SelectionKind,

    /// Code-generation rounds (each evaluates --samples candidates); `compare`'s budget.
    #[arg(long, alias = "budget", default_value_t = 20)]
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

    /// Rounds of the final confirmation (0 skips it).
    #[arg(long, value_name = "N", default_value_t = engine::DEFAULT_CONFIRM_ROUNDS)]
    pub confirm_rounds: u32,

    /// Failed proposer calls in a row that stop the run, resumable, with exit status 3 (0: never).
    #[arg(long, value_name = "N", default_value_t = engine::DEFAULT_MAX_PROPOSER_FAILURES, help_heading = "LLM proposers")]
    pub max_proposer_failures: u32,

    /// Model name for LLM proposers (required for openai and anthropic).
    #[arg(long, help_heading = "LLM proposers")]
    pub model: Option<String>,

    /// Base URL of the API (openai: up to `/v1`; anthropic: the host root).
    #[arg(long, value_name = "URL", help_heading = "LLM proposers")]
    pub base_url: Option<String>,

    /// Environment variable holding the API key ("" sends none); keys are never stored.
    #[arg(long, value_name = "VAR", help_heading = "LLM proposers")]
    pub api_key_env: Option<String>,

    /// Program and arguments of the command proposer, e.g. "my-agent --print".
    #[arg(long, value_name = "\"PROG ARGS\"", help_heading = "LLM proposers")]
    pub command: Option<String>,

    /// Transcript to replay (`runs/<id>/transcript.jsonl` of an earlier run).
    #[arg(long, value_name = "FILE", help_heading = "LLM proposers")]
    pub transcript: Option<PathBuf>,

    /// How a replay matches calls to recorded replies (lenient: by role; strict: by prompt).
    #[arg(long, default_value_t = ReplayMatch::Lenient, value_parser = choice::<ReplayMatch>(ReplayMatch::NAMES), help_heading = "LLM proposers")]
    pub replay_mode: ReplayMatch,

    /// Seconds each replayed reply waits, as a model endpoint's latency would.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0, value_parser = s::parse_replay_delay, help_heading = "LLM proposers")]
    pub replay_delay: f64,

    /// How much the prompts carry: none, spec or full.
    #[arg(long, value_name = "LEVEL", default_value = "full", value_parser = ContextLevel::from_str, help_heading = "LLM proposers")]
    pub context: ContextLevel,

    /// Hardware profile for the prompts (name or alias); default: the target's.
    #[arg(long, value_name = "NAME", help_heading = "LLM proposers")]
    pub hardware: Option<String>,

    /// Extra price table (TOML, as knowledge/prices.toml); its entries win.
    #[arg(long, value_name = "FILE", help_heading = "LLM proposers")]
    pub price_table: Option<PathBuf>,

    /// Seconds one LLM call may take (each retry gets a fresh limit).
    #[arg(long, value_name = "SECONDS", default_value_t = s::DEFAULT_LLM_TIMEOUT, help_heading = "LLM proposers")]
    pub llm_timeout: f64,

    /// LLM calls in flight at most.
    #[arg(long, value_name = "N", default_value_t = s::DEFAULT_LLM_CONCURRENCY, value_parser = clap::value_parser!(u32).range(1..=256), help_heading = "LLM proposers")]
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

    /// Stop once the best kernel reaches this fraction of the speed of light on every timed
    /// workload (its roofline share: `ksearch profile`).
    #[arg(long, value_name = "FRACTION", value_parser = positive_fraction)]
    pub stop_at_sol: Option<f64>,

    /// Leave what bounds each kernel (its bottleneck class, advice and speed-of-light share)
    /// out of prompts, the world model's signals and the offline proposer's choices: the
    /// ablation of profiler-guided search. Scores are the same.
    #[arg(long, conflicts_with = "stop_at_sol")]
    pub no_profile_signals: bool,

    #[command(flatten)]
    pub evolve: EvolveOptions,
}

/// The population of `--strategy evolve` (docs/search.md, "Strategies").
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Evolve strategy")]
pub struct EvolveOptions {
    /// Islands of the population, migrating along a ring.
    #[arg(long, value_name = "N", default_value_t = EvolveSettings::default().islands, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub islands: u32,

    /// Members per island at most.
    #[arg(long, value_name = "N", default_value_t = EvolveSettings::default().population, value_parser = clap::value_parser!(u32).range(1..))]
    pub population: u32,

    /// Programs in the elite archive.
    #[arg(long, value_name = "N", default_value_t = EvolveSettings::default().archive, value_parser = clap::value_parser!(u32).range(1..))]
    pub archive: u32,

    /// Children an island receives between migrations.
    #[arg(long, value_name = "N", default_value_t = EvolveSettings::default().migration_interval, value_parser = clap::value_parser!(u32).range(1..))]
    pub migration_interval: u32,

    /// Fraction of each island's best copied to its two neighbours at a migration.
    #[arg(long, value_name = "FRACTION", default_value_t = EvolveSettings::default().migration_rate, value_parser = fraction)]
    pub migration_rate: f64,

    /// Share of parents drawn at random from the current island.
    #[arg(long, value_name = "FRACTION", default_value_t = EvolveSettings::default().exploration, value_parser = fraction)]
    pub exploration: f64,

    /// Share of parents drawn from the elite archive (the rest: from any island).
    #[arg(long, value_name = "FRACTION", default_value_t = EvolveSettings::default().exploitation, value_parser = fraction)]
    pub exploitation: f64,

    /// Inspirations from the island's best, and from other cells of its grid.
    #[arg(long, value_name = "TOP,DIVERSE", default_value = "3,2", value_parser = inspirations)]
    pub inspirations: (u32, u32),

    /// Share of children asked for as SEARCH/REPLACE diffs (the rest: full rewrites).
    #[arg(long, value_name = "FRACTION", default_value_t = EvolveSettings::default().diff_ratio, value_parser = fraction)]
    pub diff_ratio: f64,

    /// Share of children written from two parents (0: no crossover).
    #[arg(long, value_name = "FRACTION", default_value_t = EvolveSettings::default().crossover_ratio, value_parser = fraction)]
    pub crossover_ratio: f64,

    /// Feature dimensions of each island's MAP-Elites grid: complexity, diversity, knob:NAME.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "complexity,diversity"
    )]
    pub features: Vec<Feature>,

    /// Bins per feature dimension.
    #[arg(long, value_name = "N", default_value_t = EvolveSettings::default().feature_bins, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub feature_bins: u32,
}

/// A number above 0, at most 1.
fn positive_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number above 0 and at most 1")),
    }
}

/// A number from 0 to 1.
fn fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a number from 0 to 1")),
    }
}

/// `TOP,DIVERSE`: two counts.
fn inspirations(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("`{s}` is not two counts TOP,DIVERSE (e.g. 3,2)");
    let (top, diverse) = s.split_once(',').ok_or_else(bad)?;
    Ok((
        top.trim().parse().map_err(|_| bad())?,
        diverse.trim().parse().map_err(|_| bad())?,
    ))
}

impl EvolveOptions {
    fn settings(&self) -> EvolveSettings {
        EvolveSettings {
            islands: self.islands,
            population: self.population,
            archive: self.archive,
            migration_interval: self.migration_interval,
            migration_rate: self.migration_rate,
            exploration: self.exploration,
            exploitation: self.exploitation,
            top_inspirations: self.inspirations.0,
            diverse_inspirations: self.inspirations.1,
            diff_ratio: self.diff_ratio,
            crossover_ratio: self.crossover_ratio,
            features: self.features.clone(),
            feature_bins: self.feature_bins,
        }
    }
}

impl SearchOptions {
    /// The run's settings these options ask for: every option is the setting of its name (a
    /// setting the list below misses does not compile).
    pub fn settings(&self) -> RunSettings {
        macro_rules! same_names {
            ($o:ident: $($field:ident),* $(,)?) => {
                RunSettings {
                    version: RUN_SETTINGS_VERSION,
                    evolve: $o.evolve.settings(),
                    $($field: $o.$field,)*
                }
            };
        }
        let o = self.clone();
        same_names!(o: strategy, proposer, selection, rounds, samples, stagnation_window,
            cycle_cap, max_difficulty, max_wall_time, max_tokens, max_cost, timing, no_recheck,
            confirm_rounds, max_proposer_failures, model, base_url, api_key_env, command,
            transcript, replay_mode, replay_delay, context, hardware, price_table, llm_timeout,
            llm_concurrency, max_output_tokens, temperature, no_llm_cache, no_lint, stop_at_sol,
            no_profile_signals)
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
    pub sandbox: SandboxArg,

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

    /// Raise the wall-time budget, in seconds of search over every session of the run.
    #[arg(long, value_name = "SECONDS")]
    pub max_wall_time: Option<u64>,

    /// Re-check the winner at the end even if the run was started with --no-recheck.
    #[arg(long)]
    pub recheck: bool,

    #[command(flatten)]
    pub sandbox: SandboxArg,

    #[arg(long)]
    pub json: bool,
}

/// `ksearch compare`: the options of a run, for every run of the comparison.
#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub run: RunArgs,

    /// Strategies to compare, comma-separated (each run's --strategy).
    #[arg(long, value_delimiter = ',', default_value = "world-model,best-of-n", value_parser = choice::<Strategy>(Strategy::NAMES))]
    pub strategies: Vec<Strategy>,

    /// Runs per strategy, with proposer seeds --seed (default 1) onwards.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub seeds: u64,

    /// Start every run anew, even where --runs-dir has a run with the same task, backend,
    /// seed and settings (by default a finished one is read back, an unfinished one resumed).
    #[arg(long)]
    pub fresh: bool,
}

pub fn compare(args: &CompareArgs, quiet: bool) -> Result<u8> {
    let first = args.run.seed.unwrap_or(1);
    let seeds: Vec<u64> = (first..first.saturating_add(args.seeds)).collect();
    let spec = CompareSpec {
        task: &args.run.task,
        backend: args.run.backend.as_deref(),
        strategies: &args.strategies,
        seeds: &seeds,
        settings: &args.run.search.settings(),
        runs_dir: &args.run.runs_dir,
        sandbox: args.run.sandbox.mode,
        fresh: args.fresh,
    };
    let say = |line: &str| {
        if !quiet {
            eprintln!("{line}");
        }
    };
    let records = compare::run(&spec, &interrupt::on_signals(), &say)?;
    let rows = compare::summarize(&records, &args.strategies);
    // Each run's page, and the strategies' curves on one chart beside them, linking them.
    for r in &records {
        let written = RunStore::open_ref(&args.run.runs_dir, &r.run)
            .map_err(anyhow::Error::from)
            .and_then(|store| crate::inspect::write_report(&store, &store.report_path()));
        if let Err(e) = written {
            eprintln!("warning: no report page for run {}: {e:#}", r.run);
        }
    }
    let page = args.run.runs_dir.join("compare.html");
    let wrote = std::fs::write(
        &page,
        ksearch_search::report::render_compare(&args.run.task, &rows, &records),
    );
    if let Err(e) = &wrote {
        eprintln!("warning: cannot write {}: {e}", page.display());
    }
    if args.run.json {
        let doc = json!({"runs": records, "strategies": rows,
                         "report": wrote.is_ok().then_some(&page)});
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", compare::render(&rows, &records));
        if wrote.is_ok() {
            println!("report: {}", page.display());
        }
    }
    Ok(exit::OK)
}

pub fn run(args: &RunArgs, quiet: bool) -> Result<u8> {
    let settings = args.search.settings();
    let new = NewRun {
        task: &args.task,
        backend: args.backend.as_deref(),
        seed: args.seed,
        runs_dir: &args.runs_dir,
        settings: &settings,
        sandbox: args.sandbox.mode,
    };
    let session = session::start(new, interrupt::on_signals())?;
    drive(session, quiet, args.json)
}

pub fn resume(args: &ResumeArgs, quiet: bool) -> Result<u8> {
    let store = RunStore::open_ref(&args.runs_dir, &args.run).context("cannot open the run")?;
    let changes = ResumeChanges {
        rounds: args.rounds,
        max_wall_time: args.max_wall_time,
        recheck: args.recheck,
    };
    let interrupt = interrupt::on_signals();
    let session = session::resume(store, changes, args.sandbox.mode, interrupt)?;
    drive(session, quiet, args.json)
}

/// Runs the engine with a progress display and maps how it ended to the exit status: an
/// interruption or a proposer that gave up leaves a resumable run (and says so). The run's
/// writer lock is held until it ends.
fn drive(session: Session, quiet: bool, json_out: bool) -> Result<u8> {
    if !quiet {
        eprintln!("{}", session.announce);
    }
    let progress = ProgressDisplay::new(session.rounds, quiet);
    let run_id = session.store.id().to_string();
    let _writer = session.writer;
    let seed = session.seed_source.as_deref();
    let (outcome, store) = session.setup.run(session.store, seed, &progress);
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
    // The run's page (`ksearch report`); a run whose page cannot be written is still a run.
    let report = store.report_path();
    let wrote = match crate::inspect::write_report(&store, &report) {
        Ok(line) => Some(line),
        Err(e) => {
            eprintln!("warning: no report page: {e:#}");
            None
        }
    };
    if json_out {
        let doc = json!({"run": run_id, "dir": store.dir(), "outcome": outcome,
                         "report": wrote.as_ref().map(|_| &report)});
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", render_outcome(&run_id, &outcome));
        if wrote.is_some() {
            println!("report: {}", report.display());
        }
    }
    let found = outcome.best.is_some();
    Ok(if found { exit::OK } else { exit::REJECTED })
}

/// A progress bar on a terminal; one line per round otherwise (logs, CI).
struct ProgressDisplay {
    bar: Option<ProgressBar>,
    lines: bool,
}

impl ProgressDisplay {
    fn new(rounds: u32, quiet: bool) -> Self {
        let terminal = !quiet && std::io::stderr().is_terminal();
        let bar = terminal.then(|| {
            let style = ProgressStyle::with_template(
                "{spinner} round {pos}/{len} [{bar:24}] {elapsed_precise} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            let bar = ProgressBar::new(u64::from(rounds));
            bar.set_style(style.progress_chars("=> "));
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        let lines = !quiet && !terminal;
        Self { bar, lines }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

impl ProgressSink for ProgressDisplay {
    fn update(&self, p: &Progress) {
        let msg = p.summary();
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
