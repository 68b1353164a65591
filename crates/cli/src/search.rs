//! `ksearch run` and `ksearch resume`: wiring the task, the proposer, the evaluator and the run
//! store into the cycle engine, with a progress display.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use ksearch_eval::{
    fresh_secret_seed, Evaluator, EvaluatorConfig, Interrupt, SandboxMode, TimingPreset,
};
use ksearch_knowledge::lint::{self as knowledge_lint, LintTarget};
use ksearch_knowledge::Catalog;
use ksearch_knowledge::Packs;
use ksearch_llm::{
    AnthropicConfig, Budget, ChatProvider, Client, ClientConfig, CommandConfig, OpenAiConfig,
    PriceTable, ProviderConfig, Recorder, ReplayConfig, ReplayMode, RetryPolicy,
};
use ksearch_search::engine::evaluation::HarnessEvaluator;
use ksearch_search::engine::{
    Engine, EngineConfig, EngineError, Progress, ProgressSink, RunOutcome,
};
use ksearch_search::proposer::llm::{LlmProposer, LlmSettings};
use ksearch_search::proposer::offline::OfflineProposer;
use ksearch_search::proposer::prompts::{ContextLevel, PromptInputs, PromptSet};
use ksearch_search::proposer::{Proposer, ProposerUsage, TaskBrief};
use ksearch_search::selection::{CalibratedPolicy, KSearchPolicy, SelectionPolicy};
use ksearch_search::settings::{
    ProposerKind, ReplayMatch, RunSettings, SelectionKind, Strategy, RUN_SETTINGS_VERSION,
};
use ksearch_store::{RunConfig, RunStore};
use ksearch_task::Task;
use std::sync::Arc;

use crate::{exit, signals};

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

/// Picks the backend for the task from what this machine can run, as the harness probe reports
/// it (`backends`: cpu always; cuda with PyTorch, nvcc and an NVIDIA GPU; mlx with MLX and a
/// GPU): a GPU backend first, else the CPU.
pub fn default_backend(task: &Task) -> Result<String> {
    let available = probed_backends();
    pick_backend(&task.backend_names(), &available, &["cuda", "mlx", "cpu"])
        .with_context(|| format!("task {} has no backend", task.name()))
}

/// The backends the harness says this machine can run; just `cpu` when the probe fails (the
/// evaluation that follows will say what is wrong with the set-up).
pub fn probed_backends() -> Vec<String> {
    let config = EvaluatorConfig {
        verify_harness: false,
        ..EvaluatorConfig::default()
    };
    let probe = Evaluator::new(config).and_then(|e| e.probe());
    match probe {
        Ok(v) => backends_of_probe(&v),
        Err(e) => {
            tracing::warn!("the harness probe failed, assuming only the cpu backend: {e}");
            vec!["cpu".to_string()]
        }
    }
}

/// `backends` of a probe answer (nested under `probe`, or flat).
pub fn backends_of_probe(answer: &serde_json::Value) -> Vec<String> {
    let probe = answer.get("probe").unwrap_or(answer);
    let listed: Vec<String> = probe
        .get("backends")
        .and_then(serde_json::Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|b| b.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if listed.is_empty() {
        vec!["cpu".to_string()]
    } else {
        listed
    }
}

/// The first backend of `preference` that the task declares and the machine can run; else the
/// task's first backend in `preference`, else its first backend at all (so the error comes
/// from the evaluation, which names what is missing).
pub fn pick_backend(
    task_backends: &[&str],
    available: &[String],
    preference: &[&str],
) -> Option<String> {
    preference
        .iter()
        .find(|b| task_backends.contains(b) && available.iter().any(|a| a == *b))
        .or_else(|| preference.iter().find(|b| task_backends.contains(b)))
        .or(task_backends.first())
        .map(|b| b.to_string())
}

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
        None => default_backend(&task)?,
    };
    let spec = task.backend(&backend)?;
    let seed_path = spec
        .seed
        .clone()
        .with_context(|| format!("task {} has no seed kernel for {backend}", task.name()))?;
    let seed_source = std::fs::read_to_string(&seed_path)
        .with_context(|| format!("cannot read the seed kernel {}", seed_path.display()))?;
    let seed = match args.seed {
        Some(s) => s,
        None => fresh_secret_seed()?,
    };
    let secret_seed = fresh_secret_seed()?;
    std::fs::create_dir_all(&args.runs_dir)
        .with_context(|| format!("cannot create {}", args.runs_dir.display()))?;
    let config = RunConfig {
        task: args.task.clone(),
        backend: backend.clone(),
        strategy: "world-model".into(),
        proposer: settings.proposer.as_str().into(),
        selection: format!("{:?}", settings.selection).to_lowercase(),
        seed,
        secret_seed,
        budgets: json!({"rounds": settings.rounds, "max_wall_time": settings.max_wall_time,
                        "max_tokens": settings.max_tokens, "max_cost": settings.max_cost}),
        flags: settings.to_value(),
        extra: json!({"task_dir": task.dir(), "seed_kernel": seed_path}),
        created_at: String::new(),
        ksearch_version: env!("CARGO_PKG_VERSION").into(),
    };
    let store = RunStore::create(&args.runs_dir, &config).context("cannot create the run")?;
    // Held until the run ends: no `resume` writes into it meanwhile.
    let writer = store.lock_writer()?;
    let setup = match set_up(
        &store,
        &task,
        &backend,
        &settings,
        args.sandbox.mode,
        seed,
        secret_seed,
        signals::interrupt_on_signals(),
    ) {
        Ok(s) => s,
        Err(e) => {
            // Nothing was evaluated or spent: no half-made run is left for `show` to list as
            // resumable and for `resume` to fail on again.
            let dir = store.dir().to_path_buf();
            if let Err(d) = store.discard(Some(writer)) {
                tracing::warn!("cannot remove the unused run {}: {d}", dir.display());
            }
            return Err(e);
        }
    };
    if !quiet {
        eprintln!(
            "ksearch: run {} — task {}, backend {backend}, {} rounds, proposer {}{}, seed {seed}",
            store.id(),
            task.name(),
            settings.rounds,
            settings.proposer.as_str(),
            settings
                .model
                .as_deref()
                .map(|m| format!(" ({m}, context {})", settings.context))
                .unwrap_or_default()
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
    let task_ref = config.extra["task_dir"]
        .as_str()
        .filter(|d| Path::new(d).join("task.toml").is_file())
        .map(str::to_string)
        .unwrap_or_else(|| config.task.clone());
    let task = ksearch_task::resolve(&task_ref).context("cannot load the run's task")?;
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
    let setup = set_up(
        &store,
        &task,
        &config.backend,
        &search,
        args.sandbox.mode,
        config.seed,
        config.secret_seed,
        signals::interrupt_on_signals(),
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

/// Everything a run needs besides its store, built before the engine starts: a failure here
/// is a set-up error (nothing evaluated, nothing spent), which `run` answers by removing the
/// run it just made.
struct Setup {
    proposer: Box<dyn Proposer>,
    lint_target: Option<LintTarget>,
    policy: Box<dyn SelectionPolicy + Sync>,
    evaluator: HarnessEvaluator,
    cfg: EngineConfig,
    brief: TaskBrief,
    interrupt: Interrupt,
}

#[allow(clippy::too_many_arguments)]
fn set_up(
    store: &RunStore,
    task: &Task,
    backend: &str,
    opts: &RunSettings,
    sandbox: SandboxMode,
    seed: u64,
    secret_seed: u64,
    interrupt: Interrupt,
) -> Result<Setup> {
    let spec = task.backend(backend)?;
    let catalog = Catalog::builtin().context("cannot load the knowledge pack")?;
    let packs = Packs::builtin().context("cannot load the knowledge packs")?;
    let proposer: Box<dyn Proposer> = match opts.proposer {
        ProposerKind::Offline => Box::new(
            OfflineProposer::for_task(
                task.dir(),
                task.kind(),
                backend,
                packs.target_for_backend(backend).map(|t| t.name.as_str()),
                &catalog,
                seed,
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?,
        ),
        _ => Box::new(llm_proposer(store, task, backend, opts, seed, &packs)?),
    };
    let lint_target: Option<LintTarget> = if opts.no_lint {
        None
    } else {
        packs
            .target_for_backend(backend)
            .and_then(|t| packs.lint_target(&t.name))
    };
    let policy: Box<dyn SelectionPolicy + Sync> = match opts.selection {
        SelectionKind::Calibrated if matches!(opts.proposer, ProposerKind::Offline) => {
            Box::new(CalibratedPolicy::template_backed())
        }
        SelectionKind::Calibrated => Box::new(CalibratedPolicy::default()),
        SelectionKind::Ksearch => Box::new(KSearchPolicy {
            max_difficulty: opts.max_difficulty,
        }),
    };
    let evaluator = Evaluator::new(EvaluatorConfig {
        sandbox,
        interrupt: Some(interrupt.clone()),
        backend: Some(backend.to_string()),
        ..EvaluatorConfig::default()
    })
    .context("cannot set up the evaluation environment (try `ksearch doctor`)")?;
    let evaluator = HarnessEvaluator::new(
        evaluator,
        task.clone(),
        backend,
        secret_seed,
        opts.timing,
        store.dir().join("work"),
        &spec.language,
    );
    let cfg = opts.engine_config();
    let brief = TaskBrief {
        name: task.name().to_string(),
        kind: task.kind().to_string(),
        description: task.spec().description.clone(),
        backend: backend.to_string(),
        signature: spec.signature.clone(),
        language: spec.language.clone(),
    };
    Ok(Setup {
        proposer,
        lint_target,
        policy,
        evaluator,
        cfg,
        brief,
        interrupt,
    })
}

fn drive(
    store: RunStore,
    setup: Setup,
    rounds: u32,
    seed_source: Option<&str>,
    quiet: bool,
    json_out: bool,
) -> Result<u8> {
    let Setup {
        proposer,
        lint_target,
        policy,
        evaluator,
        cfg,
        brief,
        interrupt,
    } = setup;
    let lint = move |source: &str| -> Vec<String> {
        lint_target
            .as_ref()
            .map(|t| knowledge_lint::errors(&knowledge_lint::lint(t, source)))
            .unwrap_or_default()
    };
    let progress = ProgressDisplay::new(rounds, quiet);
    let run_id = store.id().to_string();
    let engine = Engine::new(
        cfg,
        store,
        proposer.as_ref(),
        &evaluator,
        policy.as_ref(),
        brief,
        &progress,
    )
    .with_lint(&lint)
    .with_interrupt(&interrupt);
    let outcome = engine.run(seed_source);
    progress.finish();
    let store = engine.into_store();
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

/// Splits `--command` into argv: whitespace separates, single and double quotes group, a
/// backslash escapes the next character (outside single quotes). No shell is involved.
fn split_command(line: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('\''), c) => cur.push(c),
            (_, '\\') => {
                in_word = true;
                match chars.next() {
                    Some(n) => cur.push(n),
                    None => bail!("--command ends with a lone backslash"),
                }
            }
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                in_word = true;
                quote = Some(c);
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if quote.is_some() {
        bail!("--command has an unclosed quote: {line}");
    }
    if in_word {
        out.push(cur);
    }
    if out.is_empty() {
        bail!("--command is empty");
    }
    Ok(out)
}

/// The provider configuration the options describe. Keys are not part of it: providers read
/// them from the environment variable named by `--api-key-env` when they are built.
fn provider_config(opts: &RunSettings) -> Result<ProviderConfig> {
    let model = || {
        opts.model
            .clone()
            .with_context(|| format!("--proposer {} needs --model NAME", opts.proposer.as_str()))
    };
    Ok(match opts.proposer {
        ProposerKind::Offline => bail!("the offline proposer has no provider"),
        ProposerKind::Openai => {
            let mut c = OpenAiConfig {
                model: model()?,
                timeout_s: opts.llm_timeout,
                ..OpenAiConfig::default()
            };
            if let Some(u) = &opts.base_url {
                c.base_url = u.clone();
            }
            if let Some(k) = &opts.api_key_env {
                c.api_key_env = k.clone();
            }
            ProviderConfig::Openai(c)
        }
        ProposerKind::Anthropic => {
            let mut c = AnthropicConfig {
                model: model()?,
                timeout_s: opts.llm_timeout,
                ..AnthropicConfig::default()
            };
            if let Some(u) = &opts.base_url {
                c.base_url = u.clone();
            }
            if let Some(k) = &opts.api_key_env {
                c.api_key_env = k.clone();
            }
            if let Some(n) = opts.max_output_tokens {
                c.default_max_tokens = n;
            }
            ProviderConfig::Anthropic(c)
        }
        ProposerKind::Command => {
            let line = opts
                .command
                .as_deref()
                .context("--proposer command needs --command \"PROG ARGS\"")?;
            let mut c = CommandConfig {
                argv: split_command(line)?,
                timeout_s: opts.llm_timeout,
                ..CommandConfig::default()
            };
            if let Some(m) = &opts.model {
                c.model = m.clone();
            }
            ProviderConfig::Command(c)
        }
        ProposerKind::Replay => ProviderConfig::Replay(ReplayConfig {
            transcript: opts
                .transcript
                .clone()
                .context("--proposer replay needs --transcript FILE")?,
            mode: match opts.replay_mode {
                ReplayMatch::Lenient => ReplayMode::Lenient,
                ReplayMatch::Strict => ReplayMode::Strict,
            },
            delay_s: opts.replay_delay,
        }),
    })
}

/// An LLM proposer for the run in `store`: provider → client (retries, accounting, budget,
/// cache) → recorder (`<run>/transcript.jsonl`). Spending of earlier sessions of the run (a
/// resume) counts against the budgets.
fn llm_proposer(
    store: &RunStore,
    task: &Task,
    backend: &str,
    opts: &RunSettings,
    seed: u64,
    packs: &Packs,
) -> Result<LlmProposer> {
    if !(opts.llm_timeout.is_finite() && opts.llm_timeout > 0.0) {
        bail!("--llm-timeout must be a positive number of seconds");
    }
    let provider = provider_config(opts)?
        .build()
        .context("cannot set up the LLM provider")?;
    let mut prices = PriceTable::builtin();
    if let Some(path) = &opts.price_table {
        prices = prices.with_overrides(
            PriceTable::load(path)
                .with_context(|| format!("cannot read the price table {}", path.display()))?,
        );
    }
    let spent = store
        .usage_totals()
        .context("cannot read the run's LLM usage")?;
    let prior = ProposerUsage {
        calls: spent.calls,
        input_tokens: spent.input_tokens,
        output_tokens: spent.output_tokens,
        cost_usd: spent.cost_usd,
    };
    let replay = opts.proposer == ProposerKind::Replay;
    let client = Arc::new(
        Client::new(
            provider,
            ClientConfig {
                retry: RetryPolicy::default(),
                max_in_flight: opts.llm_concurrency as usize,
                budget: Budget {
                    max_tokens: opts
                        .max_tokens
                        .map(|m| m.saturating_sub(prior.input_tokens + prior.output_tokens)),
                    max_cost_usd: opts.max_cost.map(|c| (c - prior.cost_usd).max(0.0)),
                },
                cache_dir: (!opts.no_llm_cache && !replay)
                    .then(|| ksearch_assets::cache_dir().join("llm")),
                prices,
            },
        )
        .context("cannot set up the LLM client")?,
    );
    // Before anything is evaluated: a server that is down, a refused key or a missing program
    // stops here, in seconds, rather than after the seed's evaluation and three failed calls.
    client
        .preflight()
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| preflight_failure(opts))?;
    let recorder = Recorder::create(client.clone(), store.dir().join("transcript.jsonl"))
        .context("cannot open the run's transcript")?;
    let prompts = PromptSet::builtin().context("cannot load the prompt templates")?;
    let inputs =
        PromptInputs::for_task(task, backend, packs, opts.hardware.as_deref(), opts.context)
            .context("cannot prepare the prompts")?;
    let provider: Arc<dyn ChatProvider> = Arc::new(recorder);
    Ok(LlmProposer::new(
        provider,
        prompts,
        inputs,
        LlmSettings {
            max_output_tokens: opts.max_output_tokens,
            temperature: opts.temperature,
            seed: Some(seed),
            ..LlmSettings::new()
        },
    )
    .with_client(client)
    .with_prior_usage(prior))
}

/// What to check when the provider cannot be used (the error itself follows).
fn preflight_failure(opts: &RunSettings) -> String {
    match opts.proposer {
        ProposerKind::Command => "the --command program cannot be run".into(),
        ProposerKind::Openai | ProposerKind::Anthropic => format!(
            "the {} server cannot be used: check --base-url, that the server is up, and the \
             key in ${}",
            opts.proposer.as_str(),
            opts.api_key_env
                .clone()
                .unwrap_or_else(|| match opts.proposer {
                    ProposerKind::Anthropic => "ANTHROPIC_API_KEY".into(),
                    _ => "OPENAI_API_KEY".into(),
                })
        ),
        ProposerKind::Offline | ProposerKind::Replay => "the proposer cannot be used".into(),
    }
}

fn render_outcome(run_id: &str, o: &RunOutcome) -> String {
    let mut s = format!(
        "\nrun {run_id}: {} rounds in {} cycles, {} passed / {} failed — stopped: {}\n",
        o.rounds_used, o.cycles, o.passed, o.failed, o.stop_reason
    );
    match &o.best {
        Some(best) => {
            s.push_str(&format!(
                "best: candidate {} (round {}, node {})\n",
                best.candidate_id,
                best.round,
                best.node.as_deref().unwrap_or("-"),
            ));
            // The confirmation leads (the winner, runner-ups and seed measured in turn), then
            // the re-check's comparison (fresh process and seed, every workload); the search's
            // own score follows as what it ranked by.
            let summary = serde_json::to_value(o).unwrap_or_default();
            let lines =
                crate::headline::confirmed(&summary)
                    .into_iter()
                    .chain(crate::headline::rechecked(
                        &summary,
                        best.rechecked_score,
                        o.seed_recheck_score,
                    ));
            for line in lines {
                s.push_str(&format!("{line}\n"));
            }
            s.push_str(&format!("search score {:.3}", best.score));
            if let Some(seed) = o.seed_score.filter(|v| *v > 0.0) {
                s.push_str(&format!(
                    " ({} by the search's own measurements, {seed:.3})",
                    crate::headline::versus_seed(best.score / seed)
                ));
            }
            s.push('\n');
        }
        None => s.push_str("no candidate passed the final re-check\n"),
    }
    if let Some(r) = &o.recheck {
        s.push_str(&format!(
            "re-check (fresh process, fresh seed, held-out and assertion workloads): {}\n",
            r["status"].as_str().unwrap_or("?")
        ));
    }
    s.push_str(&format!(
        "see `ksearch show {run_id}`; export the kernel with `ksearch export {run_id}`\n"
    ));
    s
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

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        search: SearchOptions,
    }

    #[test]
    fn the_default_backend_is_the_first_gpu_backend_the_probe_lists() {
        let order = ["cuda", "mlx", "cpu"];
        let avail =
            |names: &[&str]| -> Vec<String> { names.iter().map(|s| s.to_string()).collect() };
        let all = ["cpu", "cuda", "mlx"];
        assert_eq!(
            pick_backend(&all, &avail(&["cpu", "cuda", "mlx"]), &order).unwrap(),
            "cuda"
        );
        assert_eq!(
            pick_backend(&all, &avail(&["cpu", "mlx"]), &order).unwrap(),
            "mlx"
        );
        assert_eq!(pick_backend(&all, &avail(&["cpu"]), &order).unwrap(), "cpu");
        // A cpu-only task stays on cpu on a GPU machine.
        assert_eq!(
            pick_backend(&["cpu"], &avail(&["cpu", "cuda"]), &order).unwrap(),
            "cpu"
        );
        // Nothing runnable: the task's preferred backend, so the evaluation explains what is
        // missing.
        assert_eq!(
            pick_backend(&["mlx", "cuda"], &avail(&["cpu"]), &order).unwrap(),
            "cuda"
        );
        assert_eq!(
            pick_backend(&["tpu"], &avail(&["cpu"]), &order).unwrap(),
            "tpu"
        );
        assert!(pick_backend(&[], &avail(&["cpu"]), &order).is_none());
    }

    #[test]
    fn probe_answers_give_their_backend_list() {
        let nested = json!({"protocol": 1, "probe": {"backends": ["cpu", "cuda"]}});
        assert_eq!(backends_of_probe(&nested), ["cpu", "cuda"]);
        assert_eq!(
            backends_of_probe(&json!({"backends": ["cpu", "mlx"]})),
            ["cpu", "mlx"]
        );
        // An answer without the list (an old harness, an error string) means cpu only.
        assert_eq!(
            backends_of_probe(&json!({"probe": {"backends": "error: x"}})),
            ["cpu"]
        );
        assert_eq!(backends_of_probe(&json!({})), ["cpu"]);
    }

    #[test]
    fn commands_split_like_a_shell_without_one() {
        assert_eq!(
            split_command(r#"my-agent --print  'two words' "a \"q\"" x\ y"#).unwrap(),
            vec!["my-agent", "--print", "two words", "a \"q\"", "x y"]
        );
        assert!(split_command("   ").is_err());
        assert!(split_command("agent 'open").is_err());
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
        match provider_config(&back).unwrap() {
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
