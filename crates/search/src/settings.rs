//! What a run was started with: the search's limits and switches and its proposer's
//! configuration. Stored with the run (`RunConfig::flags`) so `resume` rebuilds the same search.
//!
//! This is the run store's format, owned here and versioned, not the command line's: a flag
//! renamed or added in the CLI changes how these settings are filled, never how a stored run
//! reads. Version 0 is what releases before the version field wrote (the CLI's options under the
//! same names); every field a later version adds has a default, so old runs still load.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use ksearch_eval::TimingPreset;

use crate::engine::{EngineConfig, DEFAULT_CONFIRM_ROUNDS, DEFAULT_MAX_PROPOSER_FAILURES};
use crate::proposer::prompts::ContextLevel;

/// The version [`RunSettings`] are written with.
pub const RUN_SETTINGS_VERSION: u32 = 2;

/// How the search is organised (defined with the engine, which acts on it).
pub use crate::engine::Strategy;
pub use crate::evolve::EvolveSettings;

/// Who proposes ideas and writes kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProposerKind {
    /// Built-in, no network: the action catalog and the task's template family.
    #[default]
    Offline,
    /// An OpenAI-compatible chat-completions server.
    Openai,
    /// The Anthropic Messages API.
    Anthropic,
    /// A program of the user's: prompt on stdin, reply on stdout.
    Command,
    /// Replies from a recorded transcript, no network.
    Replay,
}

/// How the next action is chosen from the world model's frontier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SelectionKind {
    /// Utility with confidence, failures, visits and calibrated predictions.
    #[default]
    Calibrated,
    /// The original K-Search order, with its difficulty gate.
    Ksearch,
}

/// How a replay matches calls to recorded replies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplayMatch {
    /// The next recorded reply of the same role, whatever the prompt.
    #[default]
    Lenient,
    /// Records in file order, each prompt hashing exactly as recorded.
    Strict,
}

/// The names of a settings choice, as stored and as the command line spells them: `NAMES`,
/// `as_str`, `Display` and `FromStr` (whose error lists the names).
macro_rules! named_choice {
    ($ty:ident, $what:literal, { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every name, in the order of the variants.
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $ty {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($name => Ok($ty::$variant),)+
                    _ => Err(format!("unknown {} `{s}` (one of: {})", $what, Self::NAMES.join(", "))),
                }
            }
        }
    };
}

named_choice!(Strategy, "strategy", {
    WorldModel => "world-model",
    BestOfN => "best-of-n",
    Evolve => "evolve",
});
named_choice!(ProposerKind, "proposer", {
    Offline => "offline",
    Openai => "openai",
    Anthropic => "anthropic",
    Command => "command",
    Replay => "replay",
});
named_choice!(SelectionKind, "selection", { Calibrated => "calibrated", Ksearch => "ksearch" });
named_choice!(ReplayMatch, "replay mode", { Lenient => "lenient", Strict => "strict" });

/// Seconds one LLM call may take, unless the run says otherwise.
pub const DEFAULT_LLM_TIMEOUT: f64 = 600.0;
/// LLM calls in flight at most, unless the run says otherwise.
pub const DEFAULT_LLM_CONCURRENCY: u32 = 4;

/// `--replay-delay`: seconds from 0 to 3600.
pub fn parse_replay_delay(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds from 0 to 3600")),
    }
}

/// What `ksearch resume` may change of a stored run's settings: a larger round or wall-time
/// budget, and the re-check of the winner turned back on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResumeChanges {
    pub rounds: Option<u32>,
    pub max_wall_time: Option<u64>,
    pub recheck: bool,
}

/// A run's settings (see the module documentation for the format's rules).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSettings {
    /// [`RUN_SETTINGS_VERSION`] when written; 0 for runs stored before it existed.
    #[serde(default)]
    pub version: u32,
    #[serde(default)]
    pub strategy: Strategy,
    pub proposer: ProposerKind,
    pub selection: SelectionKind,
    pub rounds: u32,
    pub samples: u32,
    pub stagnation_window: u32,
    pub cycle_cap: u32,
    pub max_difficulty: u8,
    #[serde(default)]
    pub max_wall_time: Option<u64>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_cost: Option<f64>,
    pub timing: TimingPreset,
    #[serde(default)]
    pub no_recheck: bool,
    #[serde(default = "default_confirm_rounds")]
    pub confirm_rounds: u32,
    #[serde(default = "default_max_proposer_failures")]
    pub max_proposer_failures: u32,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub base_url: Option<String>,
    /// The name of the environment variable holding the key; keys are never stored.
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub transcript: Option<PathBuf>,
    #[serde(default)]
    pub replay_mode: ReplayMatch,
    #[serde(default)]
    pub replay_delay: f64,
    #[serde(default)]
    pub context: ContextLevel,
    #[serde(default)]
    pub hardware: Option<String>,
    #[serde(default)]
    pub price_table: Option<PathBuf>,
    #[serde(default = "default_llm_timeout")]
    pub llm_timeout: f64,
    #[serde(default = "default_llm_concurrency")]
    pub llm_concurrency: u32,
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub no_llm_cache: bool,
    #[serde(default)]
    pub no_lint: bool,
    /// The population's settings under `--strategy evolve`.
    #[serde(default)]
    pub evolve: EvolveSettings,
    /// Stop when the best kernel reaches this fraction of the speed of light everywhere.
    #[serde(default)]
    pub stop_at_sol: Option<f64>,
    /// Leave what bounds each kernel out of the search's decisions (an ablation; see
    /// `engine::evaluation::ProfileSignals`).
    #[serde(default)]
    pub no_profile_signals: bool,
}

fn default_confirm_rounds() -> u32 {
    DEFAULT_CONFIRM_ROUNDS
}

fn default_max_proposer_failures() -> u32 {
    DEFAULT_MAX_PROPOSER_FAILURES
}

fn default_llm_timeout() -> f64 {
    DEFAULT_LLM_TIMEOUT
}

fn default_llm_concurrency() -> u32 {
    DEFAULT_LLM_CONCURRENCY
}

/// Settings that cannot be read: stored by a newer ksearch, or damaged.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("the run's settings are version {found}; this ksearch reads up to {RUN_SETTINGS_VERSION}: use a newer ksearch")]
    TooNew { found: u32 },
    #[error("the run's settings are unreadable: {0}")]
    Unreadable(#[from] serde_json::Error),
}

impl RunSettings {
    /// The settings as stored with a run (`RunConfig::flags`).
    pub fn to_value(&self) -> serde_json::Value {
        let mut stored = self.clone();
        stored.version = RUN_SETTINGS_VERSION;
        // Plain data: serialising it cannot fail.
        serde_json::to_value(stored).unwrap_or(serde_json::Value::Null)
    }

    /// Reads the settings of a stored run, of this version or an earlier one.
    pub fn from_value(stored: &serde_json::Value) -> Result<Self, SettingsError> {
        let settings: RunSettings = serde_json::from_value(stored.clone())?;
        if settings.version > RUN_SETTINGS_VERSION {
            return Err(SettingsError::TooNew {
                found: settings.version,
            });
        }
        Ok(settings)
    }

    /// These settings with a resume's `changes` applied.
    pub fn resumed(mut self, changes: ResumeChanges) -> Self {
        if let Some(r) = changes.rounds {
            self.rounds = r;
        }
        if let Some(w) = changes.max_wall_time {
            self.max_wall_time = Some(w);
        }
        if changes.recheck {
            self.no_recheck = false;
        }
        self
    }

    /// The engine's limits and switches these settings ask for.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            rounds: self.rounds,
            samples: self.samples,
            stagnation_window: self.stagnation_window,
            cycle_cap: self.cycle_cap,
            max_wall_seconds: self.max_wall_time,
            max_tokens: self.max_tokens,
            max_cost_usd: self.max_cost,
            recheck: !self.no_recheck,
            confirm_rounds: self.confirm_rounds,
            max_proposer_failures: self.max_proposer_failures,
            strategy: self.strategy,
            evolve: self.evolve.clone(),
            stop_at_sol: self.stop_at_sol,
            // The session puts the run's seed in.
            seed: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags a run stored by ksearch 0.1.0 carries (crates/cli/tests/fixtures/run-0.1.0).
    const STORED_0_1_0: &str = r#"{"strategy":"world-model","proposer":"offline","selection":"calibrated","rounds":2,"samples":1,"stagnation_window":3,"cycle_cap":4,"max_difficulty":4,"max_wall_time":null,"max_tokens":null,"max_cost":null,"timing":"quick","no_recheck":false,"confirm_rounds":2,"max_proposer_failures":3,"model":null,"base_url":null,"api_key_env":null,"command":null,"transcript":null,"replay_mode":"lenient","replay_delay":0.0,"context":"full","hardware":null,"price_table":null,"llm_timeout":600.0,"llm_concurrency":4,"max_output_tokens":null,"temperature":null,"no_llm_cache":false,"no_lint":false}"#;

    #[test]
    fn settings_stored_before_the_version_field_still_read() {
        let stored: serde_json::Value = serde_json::from_str(STORED_0_1_0).unwrap();
        let s = RunSettings::from_value(&stored).unwrap();
        assert_eq!(s.version, 0);
        assert_eq!(
            (s.proposer, s.rounds, s.timing),
            (ProposerKind::Offline, 2, TimingPreset::Quick)
        );
        assert_eq!(s.context, ContextLevel::Full);
        // Written back, they carry the version, and read back the same.
        let again = RunSettings::from_value(&s.to_value()).unwrap();
        assert_eq!(again.version, RUN_SETTINGS_VERSION);
        assert_eq!(
            RunSettings {
                version: 0,
                ..again
            },
            s
        );
    }

    #[test]
    fn choices_parse_as_they_are_stored() {
        for name in ProposerKind::NAMES {
            let kind: ProposerKind = name.parse().unwrap();
            assert_eq!(serde_json::to_value(kind).unwrap(), *name);
            assert_eq!(kind.to_string(), *name);
        }
        assert_eq!("ksearch".parse(), Ok(SelectionKind::Ksearch));
        assert_eq!("strict".parse(), Ok(ReplayMatch::Strict));
        assert_eq!("world-model".parse(), Ok(Strategy::WorldModel));
        assert_eq!("best-of-n".parse(), Ok(Strategy::BestOfN));
        assert_eq!(Strategy::BestOfN.as_str(), "best-of-n");
        let err = "gpt".parse::<ProposerKind>().unwrap_err();
        assert_eq!(
            err,
            "unknown proposer `gpt` (one of: offline, openai, anthropic, command, replay)"
        );
    }

    #[test]
    fn replay_delays_are_bounded() {
        assert_eq!(parse_replay_delay("0.5"), Ok(0.5));
        for bad in ["-1", "3601", "NaN", "inf", "x"] {
            assert!(parse_replay_delay(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_resume_only_raises_budgets_and_turns_the_recheck_on() {
        let stored: serde_json::Value = serde_json::from_str(STORED_0_1_0).unwrap();
        let mut s = RunSettings::from_value(&stored).unwrap();
        s.no_recheck = true;
        let same = s.clone().resumed(ResumeChanges::default());
        assert_eq!(same, s);
        let changed = s.clone().resumed(ResumeChanges {
            rounds: Some(9),
            max_wall_time: Some(60),
            recheck: true,
        });
        assert_eq!(
            (changed.rounds, changed.max_wall_time, changed.no_recheck),
            (9, Some(60), false)
        );
    }

    #[test]
    fn settings_of_a_newer_ksearch_are_refused_by_name() {
        let mut stored: serde_json::Value = serde_json::from_str(STORED_0_1_0).unwrap();
        stored["version"] = serde_json::json!(RUN_SETTINGS_VERSION + 1);
        let err = RunSettings::from_value(&stored).unwrap_err();
        assert!(matches!(err, SettingsError::TooNew { .. }), "{err}");
        assert!(err.to_string().contains("newer ksearch"));
    }

    #[test]
    fn the_oldest_runs_without_later_fields_get_their_defaults() {
        let stored = serde_json::json!({"strategy": "world-model", "proposer": "offline",
            "selection": "calibrated", "rounds": 5, "samples": 1, "stagnation_window": 3,
            "cycle_cap": 4, "max_difficulty": 4, "timing": "quick", "no_recheck": false});
        let s = RunSettings::from_value(&stored).unwrap();
        assert_eq!(s.confirm_rounds, DEFAULT_CONFIRM_ROUNDS);
        assert_eq!(s.max_proposer_failures, DEFAULT_MAX_PROPOSER_FAILURES);
        assert_eq!((s.llm_timeout, s.llm_concurrency), (600.0, 4));
        assert_eq!(s.context, ContextLevel::default());
    }
}
