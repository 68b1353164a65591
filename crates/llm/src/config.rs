//! Provider selection from configuration (`kind = "openai" | "anthropic" |
//! "command" | "replay"`), for the CLI and config files.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{
    AnthropicConfig, AnthropicProvider, ChatProvider, CommandConfig, CommandProvider, LlmError,
    OpenAiConfig, OpenAiProvider, ReplayMode, ReplayProvider,
};

/// Settings of the `replay` provider.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayConfig {
    pub transcript: PathBuf,
    pub mode: ReplayMode,
    /// Seconds each reply waits before it is given (0: at once).
    pub delay_s: f64,
}

/// One provider, tagged by `kind`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ProviderConfig {
    Openai(OpenAiConfig),
    Anthropic(AnthropicConfig),
    Command(CommandConfig),
    Replay(ReplayConfig),
}

impl ProviderConfig {
    /// Builds the provider; keys are read from the environment here.
    pub fn build(&self) -> Result<Arc<dyn ChatProvider>, LlmError> {
        Ok(match self {
            ProviderConfig::Openai(c) => Arc::new(OpenAiProvider::new(c.clone())?),
            ProviderConfig::Anthropic(c) => Arc::new(AnthropicProvider::new(c.clone())?),
            ProviderConfig::Command(c) => Arc::new(CommandProvider::new(c.clone())?),
            ProviderConfig::Replay(c) => {
                let delay = std::time::Duration::try_from_secs_f64(c.delay_s).map_err(|_| {
                    LlmError::Config(format!(
                        "replay delay {} s is not a non-negative number of seconds",
                        c.delay_s
                    ))
                })?;
                Arc::new(ReplayProvider::open(&c.transcript, c.mode)?.with_delay(delay))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tagged_provider_tables() {
        let c: ProviderConfig = toml::from_str(
            r#"
            kind = "openai"
            model = "qwen2.5-coder"
            base_url = "http://127.0.0.1:11434/v1"
            api_key_env = ""
            max_tokens_field = "max_tokens"
            extra_body = { reasoning_effort = "low" }
            "#,
        )
        .unwrap();
        match &c {
            ProviderConfig::Openai(o) => {
                assert_eq!(o.model, "qwen2.5-coder");
                assert_eq!(o.timeout_s, 600.0);
                assert_eq!(o.extra_body["reasoning_effort"], "low");
            }
            other => panic!("wrong kind: {other:?}"),
        }
        let p = c.build().unwrap();
        assert_eq!((p.name(), p.model()), ("openai", "qwen2.5-coder"));

        let c: ProviderConfig =
            toml::from_str("kind = \"command\"\nargv = [\"my-agent\", \"--quiet\"]\ntimeout_s = 5")
                .unwrap();
        assert!(matches!(c, ProviderConfig::Command(ref k) if k.argv.len() == 2));

        let c: ProviderConfig =
            toml::from_str("kind = \"replay\"\ntranscript = \"t.jsonl\"\nmode = \"lenient\"")
                .unwrap();
        assert!(matches!(c, ProviderConfig::Replay(ref r) if r.mode == ReplayMode::Lenient));
    }

    #[test]
    fn rejects_unknown_kinds_and_fields() {
        assert!(toml::from_str::<ProviderConfig>("kind = \"gemini\"\nmodel = \"x\"").is_err());
        assert!(toml::from_str::<ProviderConfig>("kind = \"openai\"\nmodle = \"x\"").is_err());
    }

    #[test]
    fn anthropic_without_key_is_a_config_error() {
        let c = ProviderConfig::Anthropic(AnthropicConfig {
            model: "claude-x".into(),
            api_key_env: "KSEARCH_TEST_SURELY_UNSET_VARIABLE".into(),
            ..Default::default()
        });
        let err = c.build().err();
        assert!(
            matches!(err, Some(LlmError::Config(ref m)) if m.contains("KSEARCH_TEST_SURELY_UNSET_VARIABLE"))
        );
    }
}
