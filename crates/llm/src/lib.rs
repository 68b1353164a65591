//! ksearch-llm: chat providers behind one blocking trait, text in and text out.
//!
//! Owns the `openai` (any OpenAI-compatible server), `anthropic`, `command`
//! (the user's own program) and `replay` providers, transcript recording, and
//! the [`Client`] wrapper that adds retries with backoff, an in-flight limit,
//! token and money accounting from a price table, a budget and a response
//! cache. It knows nothing about world models, prompts or kernels.
//! Provider options are documented in `docs/providers.md`.

mod anthropic;
mod cache;
mod client;
mod command;
mod config;
mod error;
mod http;
mod openai;
mod prices;
mod secret;
mod semaphore;
mod transcript;
mod types;

pub use anthropic::{AnthropicConfig, AnthropicProvider};
pub use cache::{CacheEntry, ResponseCache};
pub use client::{Budget, Client, ClientConfig, RetryPolicy, RoleTotals, Totals};
pub use command::{CommandConfig, CommandInput, CommandProvider};
pub use config::{ProviderConfig, ReplayConfig};
pub use error::{is_retryable_status, LlmError};
pub use openai::{MaxTokensField, OpenAiConfig, OpenAiProvider};
pub use prices::{Price, PriceTable};
pub use secret::Secret;
pub use transcript::{read_transcript, Recorder, ReplayMode, ReplayProvider, TranscriptRecord};
pub use types::{estimate_tokens, ChatProvider, ChatRequest, ChatResponse, Message, Role, Usage};
