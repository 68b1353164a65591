//! Requests, responses and the provider trait: text in, text out.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::LlmError;

/// Who speaks a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    pub fn user(content: impl Into<String>) -> Self {
        Message {
            role: Role::User,
            content: content.into(),
        }
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Message {
            role: Role::Assistant,
            content: content.into(),
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Message {
            role: Role::System,
            content: content.into(),
        }
    }
}

/// One chat call. `role_tag` names the purpose of the call ("wm-init",
/// "code", ...) for accounting, logs and lenient replay; it does not change
/// the reply, so it is not part of [`ChatRequest::hash`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    pub messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(default)]
    pub role_tag: String,
}

/// The fields of a request that decide the reply, in a fixed order, so that
/// the hash is stable across versions of the struct above.
#[derive(Serialize)]
struct HashedRequest<'a> {
    system: &'a Option<String>,
    messages: &'a [Message],
    max_tokens: Option<u32>,
    temperature: Option<f32>,
    seed: Option<u64>,
}

impl ChatRequest {
    /// A request with one user message.
    pub fn new(role_tag: impl Into<String>, prompt: impl Into<String>) -> Self {
        ChatRequest {
            messages: vec![Message::user(prompt)],
            role_tag: role_tag.into(),
            ..Default::default()
        }
    }

    pub fn with_system(mut self, system: impl Into<String>) -> Self {
        self.system = Some(system.into());
        self
    }

    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = Some(max_tokens);
        self
    }

    pub fn with_temperature(mut self, temperature: f32) -> Self {
        self.temperature = Some(temperature);
        self
    }

    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Hex BLAKE3 hash of everything that decides the reply (not `role_tag`).
    /// Transcripts store it; strict replay compares it.
    pub fn hash(&self) -> String {
        let view = HashedRequest {
            system: &self.system,
            messages: &self.messages,
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            seed: self.seed,
        };
        // Serializing plain strings, numbers and options cannot fail; the
        // fallback still yields a stable (if coarser) key rather than a panic.
        let json = serde_json::to_vec(&view).unwrap_or_default();
        let mut hasher = blake3::Hasher::new();
        hasher.update(b"ksearch-llm/request/v1\0");
        hasher.update(&json);
        hasher.finalize().to_hex().to_string()
    }

    /// Characters of prompt text (system plus every message).
    pub fn prompt_chars(&self) -> usize {
        self.system.as_deref().map_or(0, |s| s.chars().count())
            + self
                .messages
                .iter()
                .map(|m| m.content.chars().count())
                .sum::<usize>()
    }

    /// A rough input token count, for budget checks before the call and for
    /// servers that do not report usage.
    pub fn estimated_input_tokens(&self) -> u64 {
        estimate_tokens(self.prompt_chars())
    }
}

/// About four characters per token for English and code: crude, but only
/// used when the server does not say, and then marked as an estimate.
pub fn estimate_tokens(chars: usize) -> u64 {
    (chars as u64).div_ceil(4)
}

/// Tokens a call consumed. `estimated` is true when the provider did not
/// report (all of) them and they were derived from character counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub estimated: bool,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

/// A reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    pub text: String,
    /// The model that answered, as the server reports it (else as configured).
    pub model: String,
    pub usage: Usage,
    /// USD charged for this call; 0 for cache hits and unpriced models.
    pub cost_usd: f64,
    /// Wall time of the call; through [`crate::Client`] it includes retries.
    pub latency_ms: u64,
    /// True when the reply came from the response cache.
    pub cached: bool,
    /// Provider calls made (1 without retries, 0 for a cache hit).
    pub attempts: u32,
    /// Why generation stopped ("stop", "length", "end_turn", ...), if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
}

/// Anything that turns a [`ChatRequest`] into a [`ChatResponse`].
///
/// Blocking; implementations must be safe to call from several threads.
pub trait ChatProvider: Send + Sync {
    /// Short provider name ("openai", "anthropic", ...), used in errors, logs
    /// and the cache key.
    fn name(&self) -> &str;
    /// The configured model name.
    fn model(&self) -> &str;
    fn complete(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError>;
    /// True when responses already carry their final `cost_usd` (replays of
    /// priced transcripts, a [`crate::Client`]), so a wrapping client must not
    /// price them again.
    fn prices_responses(&self) -> bool {
        false
    }
    /// A cheap check, before a run spends anything, that calls can succeed at all: the server
    /// answers and accepts the key, or the program exists. Errors are those a call would end
    /// with (connection, timeout, HTTP 401/403, configuration); anything the check cannot
    /// judge (an endpoint the server lacks, a transient server error) passes, and the first
    /// real call decides. The default checks nothing.
    fn preflight(&self) -> Result<(), LlmError> {
        Ok(())
    }
}

impl<T: ChatProvider + ?Sized> ChatProvider for Arc<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn model(&self) -> &str {
        (**self).model()
    }
    fn complete(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        (**self).complete(req)
    }
    fn prices_responses(&self) -> bool {
        (**self).prices_responses()
    }
    fn preflight(&self) -> Result<(), LlmError> {
        (**self).preflight()
    }
}

impl<T: ChatProvider + ?Sized> ChatProvider for Box<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn model(&self) -> &str {
        (**self).model()
    }
    fn complete(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        (**self).complete(req)
    }
    fn prices_responses(&self) -> bool {
        (**self).prices_responses()
    }
    fn preflight(&self) -> Result<(), LlmError> {
        (**self).preflight()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_ignores_role_tag_but_not_content_or_params() {
        let a = ChatRequest::new("code", "write a kernel");
        let mut b = a.clone();
        b.role_tag = "wm-init".into();
        assert_eq!(a.hash(), b.hash());
        assert_ne!(a.hash(), ChatRequest::new("code", "write a kernel!").hash());
        assert_ne!(a.hash(), a.clone().with_temperature(0.5).hash());
        assert_ne!(a.hash(), a.clone().with_seed(1).hash());
        assert_ne!(a.hash(), a.clone().with_system("be brief").hash());
        assert_eq!(a.hash().len(), 64);
    }

    #[test]
    fn token_estimate_rounds_up_on_chars() {
        assert_eq!(estimate_tokens(0), 0);
        assert_eq!(estimate_tokens(1), 1);
        assert_eq!(estimate_tokens(8), 2);
        assert_eq!(estimate_tokens(9), 3);
        // Characters, not bytes: four multi-byte characters are one token.
        let r = ChatRequest::new("t", "ééé").with_system("é");
        assert_eq!(r.prompt_chars(), 4);
        assert_eq!(r.estimated_input_tokens(), 1);
    }
}
