//! Setting up a run (`ksearch run` and `ksearch resume`): the run's configuration, its seed
//! kernel, and everything the engine needs besides the store, built from the run's
//! [`RunSettings`] — the proposer (offline, or an LLM provider behind a client and a
//! transcript recorder), the lint target, the selection policy, the evaluator, the engine's
//! limits and the task brief.
//!
//! A failure here is a set-up error: nothing has been evaluated or spent, so `ksearch run`
//! removes the run it just made. Errors are [`SessionError`]s whose messages name the option or
//! file to fix.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;

use ksearch_eval::{
    fresh_secret_seed, EvalError, Evaluator, EvaluatorConfig, Interrupt, SandboxMode,
};
use ksearch_knowledge::lint::{self as knowledge_lint, LintTarget};
use ksearch_knowledge::{Catalog, KnowledgeError, Packs};
use ksearch_llm::{
    AnthropicConfig, Budget, ChatProvider, Client, ClientConfig, CommandConfig, LlmError,
    OpenAiConfig, PriceTable, ProviderConfig, Recorder, ReplayConfig, ReplayMode, RetryPolicy,
};
use ksearch_store::{RunConfig, RunLock, RunStore, StoreError};
use ksearch_task::{Task, TaskError};

use crate::engine::evaluation::{HarnessEvaluator, ProfileSignals};
use crate::engine::{Engine, EngineConfig, EngineError, ProgressSink, RunOutcome};
use crate::evolve::EvolveSettingsError;
use crate::proposer::llm::{LlmProposer, LlmSettings};
use crate::proposer::offline::OfflineProposer;
use crate::proposer::prompts::{PromptError, PromptInputs, PromptSet};
use crate::proposer::{Proposer, ProposerError, ProposerUsage, TaskBrief};
use crate::selection::{CalibratedPolicy, KSearchPolicy, SelectionPolicy};
use crate::settings::{
    ProposerKind, ReplayMatch, ResumeChanges, RunSettings, SelectionKind, SettingsError, Strategy,
};

/// Why a run could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Task(#[from] TaskError),
    #[error("task {task} has no seed kernel for {backend}")]
    NoSeed { task: String, backend: String },
    #[error("cannot read the seed kernel {}", path.display())]
    SeedUnreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The built-in action catalog or the task's own actions could not be loaded.
    #[error("cannot load the action catalog")]
    Catalog(#[source] KnowledgeError),
    #[error("cannot load the knowledge packs")]
    Packs(#[source] KnowledgeError),
    /// The offline proposer's own message, which says what is missing.
    #[error("{0}")]
    Offline(ProposerError),
    #[error("cannot set up the evaluation environment (try `ksearch doctor`)")]
    Evaluator(#[source] EvalError),
    #[error("--llm-timeout must be a positive number of seconds")]
    LlmTimeout,
    #[error(transparent)]
    Evolve(#[from] EvolveSettingsError),
    #[error("the offline proposer has no provider")]
    NoProvider,
    #[error("--proposer {proposer} needs {needs}")]
    MissingOption {
        proposer: &'static str,
        needs: &'static str,
    },
    #[error(transparent)]
    Command(#[from] CommandLineError),
    #[error("cannot set up the LLM provider")]
    Provider(#[source] LlmError),
    #[error("cannot read the price table {}", path.display())]
    PriceTable {
        path: PathBuf,
        #[source]
        source: LlmError,
    },
    #[error("cannot read the run's LLM usage")]
    Usage(#[source] StoreError),
    #[error("cannot set up the LLM client")]
    Client(#[source] LlmError),
    /// The provider check failed: `what` says what to check, `cause` is the provider's error.
    #[error("{what}")]
    Preflight {
        what: String,
        #[source]
        cause: Cause,
    },
    #[error("cannot open the run's transcript")]
    Transcript(#[source] LlmError),
    #[error("cannot load the prompt templates")]
    Prompts(#[source] PromptError),
    #[error("cannot load the task")]
    LoadTask(#[source] TaskError),
    #[error("cannot load the run's task")]
    RunTask(#[source] TaskError),
    #[error("task {0} has no backend")]
    NoBackend(String),
    #[error(transparent)]
    Seed(EvalError),
    #[error("cannot create {}", path.display())]
    RunsDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create the run")]
    Create(#[source] StoreError),
    #[error(transparent)]
    Store(StoreError),
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error("cannot prepare the prompts")]
    PromptInputs(#[source] PromptError),
}

/// An error kept as its message alone: the provider's message already says what went wrong,
/// and its causes would repeat it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Cause(String);

/// Why `--command` cannot be split into a program and its arguments.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommandLineError {
    #[error("--command ends with a lone backslash")]
    LoneBackslash,
    #[error("--command has an unclosed quote: {0}")]
    UnclosedQuote(String),
    #[error("--command is empty")]
    Empty,
}

/// The seed kernel of the task's `backend`: its path and its source.
pub fn seed_kernel(task: &Task, backend: &str) -> Result<(PathBuf, String), SessionError> {
    let path = task
        .backend(backend)?
        .seed
        .clone()
        .ok_or_else(|| SessionError::NoSeed {
            task: task.name().to_string(),
            backend: backend.to_string(),
        })?;
    let source = std::fs::read_to_string(&path).map_err(|source| SessionError::SeedUnreadable {
        path: path.clone(),
        source,
    })?;
    Ok((path, source))
}

/// The stored configuration of a new run of `task` (as the user named it: `task_ref`) on
/// `backend`; `seed_kernel` is recorded so `show` and `resume` know where the run started.
pub fn run_config(
    task_ref: &str,
    task: &Task,
    backend: &str,
    settings: &RunSettings,
    seeds: Seeds,
    seed_kernel: &Path,
) -> RunConfig {
    RunConfig {
        task: task_ref.to_string(),
        backend: backend.to_string(),
        strategy: settings.strategy.as_str().into(),
        proposer: settings.proposer.as_str().into(),
        selection: format!("{:?}", settings.selection).to_lowercase(),
        seed: seeds.seed,
        secret_seed: seeds.secret_seed,
        budgets: json!({"rounds": settings.rounds, "max_wall_time": settings.max_wall_time,
                        "max_tokens": settings.max_tokens, "max_cost": settings.max_cost}),
        flags: settings.to_value(),
        extra: json!({"task_dir": task.dir(), "seed_kernel": seed_kernel}),
        created_at: String::new(),
        ksearch_version: env!("CARGO_PKG_VERSION").into(),
    }
}

/// How to load a stored run's task again: its recorded directory while that still holds a
/// `task.toml`, else the name it was started with.
pub fn task_ref_of_run(config: &RunConfig) -> String {
    config.extra["task_dir"]
        .as_str()
        .filter(|d| Path::new(d).join("task.toml").is_file())
        .map(str::to_string)
        .unwrap_or_else(|| config.task.clone())
}

/// Checks, before a run is created, what the run's proposer needs from the task: the task's
/// own patterns load (`knowledge/patterns/`, for prompts); for the offline proposer, a template family for `backend` (the task's) and catalog actions for its
/// kind (the built-in pack's and the task's own, `knowledge/actions/`). A task that cannot be
/// searched this way is a set-up error whose message says what to add, and no run directory
/// is made for it.
pub fn check_task(task: &Task, backend: &str, opts: &RunSettings) -> Result<(), SessionError> {
    if opts.strategy == Strategy::Evolve {
        opts.evolve.validate()?;
    }
    task.backend(backend)?;
    let packs = task_packs(task)?;
    if opts.proposer == ProposerKind::Offline {
        offline_proposer(task, backend, &packs, 0)?;
    }
    Ok(())
}

/// The built-in knowledge packs with the task's own patterns (`knowledge/patterns/`).
fn task_packs(task: &Task) -> Result<Packs, SessionError> {
    Packs::builtin()
        .and_then(|p| p.with_task(task.dir()))
        .map_err(SessionError::Packs)
}

/// The offline proposer for `task` on `backend`: the task's template family and the actions of
/// the built-in catalog merged with the task's own.
fn offline_proposer(
    task: &Task,
    backend: &str,
    packs: &Packs,
    seed: u64,
) -> Result<OfflineProposer, SessionError> {
    let catalog = Catalog::for_task(task.dir()).map_err(SessionError::Catalog)?;
    OfflineProposer::for_task(
        task.dir(),
        task.kind(),
        backend,
        packs.target_for_backend(backend).map(|t| t.name.as_str()),
        &catalog,
        seed,
    )
    .map_err(SessionError::Offline)
}

/// Everything a run needs besides its store, built before the engine starts.
pub struct Setup {
    proposer: Box<dyn Proposer>,
    lint_target: Option<LintTarget>,
    policy: Box<dyn SelectionPolicy + Sync>,
    evaluator: HarnessEvaluator,
    cfg: EngineConfig,
    brief: TaskBrief,
    interrupt: Interrupt,
}

/// The seeds of a run: the proposer's random choices (`seed`) and the harness's secret seed.
#[derive(Clone, Copy, Debug)]
pub struct Seeds {
    pub seed: u64,
    pub secret_seed: u64,
}

/// Builds the run's [`Setup`] from its settings. An LLM proposer's provider is checked here
/// (a server that is down stops the run before anything is evaluated).
pub fn set_up(
    store: &RunStore,
    task: &Task,
    backend: &str,
    opts: &RunSettings,
    sandbox: SandboxMode,
    seeds: Seeds,
    interrupt: Interrupt,
) -> Result<Setup, SessionError> {
    let spec = task.backend(backend)?;
    let packs = task_packs(task)?;
    let proposer: Box<dyn Proposer> = match opts.proposer {
        ProposerKind::Offline => Box::new(offline_proposer(task, backend, &packs, seeds.seed)?),
        _ => Box::new(llm_proposer(
            store, task, backend, opts, seeds.seed, &packs,
        )?),
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
        // A round's samples side by side on a GPU, where KSEARCH_JUDGE_LANES asks for it.
        lanes: ksearch_eval::judge::lanes(opts.samples),
        ..EvaluatorConfig::default()
    })
    .map_err(SessionError::Evaluator)?;
    let evaluator = HarnessEvaluator::new(
        evaluator,
        task.clone(),
        backend,
        seeds.secret_seed,
        opts.timing,
        store.dir().join("work"),
        &spec.language,
    )
    .with_profile_signals(match opts.no_profile_signals {
        true => ProfileSignals::Off,
        false => ProfileSignals::On,
    });
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
        cfg: EngineConfig {
            seed: seeds.seed,
            ..opts.engine_config()
        },
        brief,
        interrupt,
    })
}

impl Setup {
    /// Runs the engine over `store` to the end (or to an interruption or error), reporting to
    /// `progress`; gives the store back either way so the caller can name the saved run.
    pub fn run(
        self,
        store: RunStore,
        seed_source: Option<&str>,
        progress: &dyn ProgressSink,
    ) -> (Result<RunOutcome, EngineError>, RunStore) {
        let lint_target = self.lint_target;
        let lint = move |source: &str| -> Vec<String> {
            lint_target
                .as_ref()
                .map(|t| knowledge_lint::errors(&knowledge_lint::lint(t, source)))
                .unwrap_or_default()
        };
        let engine = Engine::new(
            self.cfg,
            store,
            self.proposer.as_ref(),
            &self.evaluator,
            self.policy.as_ref(),
            self.brief,
            progress,
        )
        .with_lint(&lint)
        .with_interrupt(&self.interrupt);
        let outcome = engine.run(seed_source);
        (outcome, engine.into_store())
    }
}

/// A new run as `ksearch run` asks for it: the task as the user named it, the backend (default:
/// the best one this machine offers for the task) and the proposer's seed (default: fresh).
pub struct NewRun<'a> {
    pub task: &'a str,
    pub backend: Option<&'a str>,
    pub seed: Option<u64>,
    pub runs_dir: &'a Path,
    pub settings: &'a RunSettings,
    pub sandbox: SandboxMode,
}

/// A run ready to go: its store, the lock that keeps other writers out until it is dropped,
/// its set-up, the rounds it runs to and its seed kernel's source.
pub struct Session {
    pub store: RunStore,
    pub writer: RunLock,
    pub setup: Setup,
    pub rounds: u32,
    pub seed_source: Option<String>,
    /// The line announcing the run (what `ksearch run` and `resume` print first).
    pub announce: String,
}

/// Creates a new run under `new.runs_dir` and sets it up. When the set-up fails, nothing was
/// evaluated or spent and the run is removed again, so no half-made run is left for `show` to
/// list as resumable and for `resume` to fail on.
pub fn start(new: NewRun<'_>, interrupt: Interrupt) -> Result<Session, SessionError> {
    let settings = new.settings;
    let task = ksearch_task::resolve(new.task).map_err(SessionError::LoadTask)?;
    let backend = match new.backend {
        Some(b) => b.to_string(),
        None => ksearch_eval::backends::default_backend(&task)
            .ok_or_else(|| SessionError::NoBackend(task.name().to_string()))?,
    };
    let (seed_path, seed_source) = seed_kernel(&task, &backend)?;
    // Before the run exists: a task the proposer cannot search leaves no run behind.
    check_task(&task, &backend, settings)?;
    let seeds = Seeds {
        seed: match new.seed {
            Some(s) => s,
            None => fresh_secret_seed().map_err(SessionError::Seed)?,
        },
        secret_seed: fresh_secret_seed().map_err(SessionError::Seed)?,
    };
    std::fs::create_dir_all(new.runs_dir).map_err(|source| SessionError::RunsDir {
        path: new.runs_dir.to_path_buf(),
        source,
    })?;
    let config = run_config(new.task, &task, &backend, settings, seeds, &seed_path);
    let store = RunStore::create(new.runs_dir, &config).map_err(SessionError::Create)?;
    let writer = store.lock_writer().map_err(SessionError::Store)?;
    let setup = match set_up(
        &store,
        &task,
        &backend,
        settings,
        new.sandbox,
        seeds,
        interrupt,
    ) {
        Ok(s) => s,
        Err(e) => {
            let dir = store.dir().to_path_buf();
            if let Err(d) = store.discard(Some(writer)) {
                tracing::warn!("cannot remove the unused run {}: {d}", dir.display());
            }
            return Err(e);
        }
    };
    let model = settings
        .model
        .as_deref()
        .map(|m| format!(" ({m}, context {})", settings.context))
        .unwrap_or_default();
    let announce = format!(
        "ksearch: run {} — task {}, backend {backend}, {} rounds, proposer {}{model}, seed {}",
        store.id(),
        task.name(),
        settings.rounds,
        settings.proposer,
        seeds.seed
    );
    Ok(Session {
        store,
        writer,
        setup,
        rounds: settings.rounds,
        seed_source: Some(seed_source),
        announce,
    })
}

/// Sets up a stored run again to continue it (`ksearch resume`), with its settings and
/// seeds as stored and `changes` applied. A second writer of the run is refused at once.
pub fn resume(
    store: RunStore,
    changes: ResumeChanges,
    sandbox: SandboxMode,
    interrupt: Interrupt,
) -> Result<Session, SessionError> {
    let writer = store.lock_writer().map_err(SessionError::Store)?;
    let config = store.config().clone();
    let settings = RunSettings::from_value(&config.flags)?.resumed(changes);
    let task = ksearch_task::resolve(&task_ref_of_run(&config)).map_err(SessionError::RunTask)?;
    let seed_source = task
        .backend(&config.backend)?
        .seed
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok());
    let seeds = Seeds {
        seed: config.seed,
        secret_seed: config.secret_seed,
    };
    let setup = set_up(
        &store,
        &task,
        &config.backend,
        &settings,
        sandbox,
        seeds,
        interrupt,
    )?;
    let wall = settings
        .max_wall_time
        .map(|w| format!(", {w} s of search"))
        .unwrap_or_default();
    let announce = format!(
        "ksearch: resuming run {} ({} rounds{wall})",
        store.id(),
        settings.rounds
    );
    Ok(Session {
        store,
        writer,
        setup,
        rounds: settings.rounds,
        seed_source,
        announce,
    })
}

/// Splits `--command` into argv: whitespace separates, single and double quotes group, a
/// backslash escapes the next character (outside single quotes). No shell is involved.
pub fn split_command(line: &str) -> Result<Vec<String>, CommandLineError> {
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
                    None => return Err(CommandLineError::LoneBackslash),
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
        return Err(CommandLineError::UnclosedQuote(line.to_string()));
    }
    if in_word {
        out.push(cur);
    }
    if out.is_empty() {
        return Err(CommandLineError::Empty);
    }
    Ok(out)
}

/// The provider configuration the settings describe. Keys are not part of it: providers read
/// them from the environment variable named by `--api-key-env` when they are built.
pub fn provider_config(opts: &RunSettings) -> Result<ProviderConfig, SessionError> {
    let needs = |needs| SessionError::MissingOption {
        proposer: opts.proposer.as_str(),
        needs,
    };
    let model = || opts.model.clone().ok_or_else(|| needs("--model NAME"));
    // `--base-url` and `--api-key-env` replace the provider's defaults where given.
    let endpoint = |base_url: &mut String, api_key_env: &mut String| {
        if let Some(u) = &opts.base_url {
            base_url.clone_from(u);
        }
        if let Some(k) = &opts.api_key_env {
            api_key_env.clone_from(k);
        }
    };
    Ok(match opts.proposer {
        ProposerKind::Offline => return Err(SessionError::NoProvider),
        ProposerKind::Openai => {
            let mut c = OpenAiConfig {
                model: model()?,
                timeout_s: opts.llm_timeout,
                ..OpenAiConfig::default()
            };
            endpoint(&mut c.base_url, &mut c.api_key_env);
            ProviderConfig::Openai(c)
        }
        ProposerKind::Anthropic => {
            let mut c = AnthropicConfig {
                model: model()?,
                timeout_s: opts.llm_timeout,
                ..AnthropicConfig::default()
            };
            endpoint(&mut c.base_url, &mut c.api_key_env);
            if let Some(n) = opts.max_output_tokens {
                c.default_max_tokens = n;
            }
            ProviderConfig::Anthropic(c)
        }
        ProposerKind::Command => {
            let line = opts
                .command
                .as_deref()
                .ok_or_else(|| needs("--command \"PROG ARGS\""))?;
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
                .ok_or_else(|| needs("--transcript FILE"))?,
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
) -> Result<LlmProposer, SessionError> {
    if !(opts.llm_timeout.is_finite() && opts.llm_timeout > 0.0) {
        return Err(SessionError::LlmTimeout);
    }
    let provider_cfg = provider_config(opts)?;
    let provider = provider_cfg.build().map_err(SessionError::Provider)?;
    let mut prices = PriceTable::builtin();
    if let Some(path) = &opts.price_table {
        prices = prices.with_overrides(PriceTable::load(path).map_err(|source| {
            SessionError::PriceTable {
                path: path.clone(),
                source,
            }
        })?);
    }
    let spent = store.usage_totals().map_err(SessionError::Usage)?;
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
        .map_err(SessionError::Client)?,
    );
    // Before anything is evaluated: a server that is down, a refused key or a missing program
    // stops here, in seconds, rather than after the seed's evaluation and three failed calls.
    client.preflight().map_err(|e| SessionError::Preflight {
        what: preflight_failure(&provider_cfg),
        cause: Cause(e.to_string()),
    })?;
    let recorder = Recorder::create(client.clone(), store.dir().join("transcript.jsonl"))
        .map_err(SessionError::Transcript)?;
    let prompts = PromptSet::builtin().map_err(SessionError::Prompts)?;
    let inputs =
        PromptInputs::for_task(task, backend, packs, opts.hardware.as_deref(), opts.context)
            .map_err(SessionError::PromptInputs)?;
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

/// What to check when the provider cannot be used (the error itself follows): the key named
/// is the variable the provider read.
fn preflight_failure(cfg: &ProviderConfig) -> String {
    let server = |name: &str, key_env: &str| {
        format!(
            "the {name} server cannot be used: check --base-url, that the server is up, and the \
             key in ${key_env}"
        )
    };
    match cfg {
        ProviderConfig::Command(_) => "the --command program cannot be run".into(),
        ProviderConfig::Openai(c) => server("openai", &c.api_key_env),
        ProviderConfig::Anthropic(c) => server("anthropic", &c.api_key_env),
        ProviderConfig::Replay(_) => "the proposer cannot be used".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_split_like_a_shell_without_one() {
        assert_eq!(
            split_command(r#"my-agent --print  'two words' "a \"q\"" x\ y"#).unwrap(),
            vec!["my-agent", "--print", "two words", "a \"q\"", "x y"]
        );
        assert_eq!(split_command("   "), Err(CommandLineError::Empty));
        assert!(matches!(
            split_command("agent 'open"),
            Err(CommandLineError::UnclosedQuote(_))
        ));
        assert_eq!(split_command("a\\"), Err(CommandLineError::LoneBackslash));
    }
}
