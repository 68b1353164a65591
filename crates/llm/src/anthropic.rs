//! The `anthropic` provider: the Messages API.

use std::fmt;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::http::{
    extract_error_message, preflight_verdict, snippet, status_error, HttpTransport,
    PREFLIGHT_TIMEOUT,
};
use crate::openai::{secs, temperature_json};
use crate::secret::redact_opt;
use crate::types::estimate_tokens;
use crate::{ChatProvider, ChatRequest, ChatResponse, LlmError, Role, Secret, Usage};

/// Settings of the `anthropic` provider.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AnthropicConfig {
    pub model: String,
    /// Host root; `/v1/messages` is appended (or `/messages` if it already
    /// ends in `/v1`).
    pub base_url: String,
    pub api_key_env: String,
    /// Value of the `anthropic-version` header.
    pub version: String,
    /// The API requires an output limit; used when the request has none.
    pub default_max_tokens: u32,
    pub timeout_s: f64,
    pub connect_timeout_s: f64,
    pub name: String,
    /// Extra JSON fields merged into every request body (e.g. `thinking`);
    /// fields the request sets itself take precedence.
    pub extra_body: Map<String, Value>,
}

impl Default for AnthropicConfig {
    fn default() -> Self {
        AnthropicConfig {
            model: String::new(),
            base_url: "https://api.anthropic.com".to_string(),
            api_key_env: "ANTHROPIC_API_KEY".to_string(),
            version: "2023-06-01".to_string(),
            default_max_tokens: 8192,
            timeout_s: 600.0,
            connect_timeout_s: 10.0,
            name: "anthropic".to_string(),
            extra_body: Map::new(),
        }
    }
}

pub struct AnthropicProvider {
    cfg: AnthropicConfig,
    key: Secret,
    url: String,
    http: HttpTransport,
}

impl fmt::Debug for AnthropicProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicProvider")
            .field("name", &self.cfg.name)
            .field("model", &self.cfg.model)
            .field("url", &self.url)
            .field("key", &self.key)
            .finish()
    }
}

impl AnthropicProvider {
    /// Builds the provider, reading the key from `cfg.api_key_env`; the key
    /// is required.
    pub fn new(cfg: AnthropicConfig) -> Result<Self, LlmError> {
        let key = Secret::from_env(&cfg.api_key_env).ok_or_else(|| {
            LlmError::Config(format!(
                "{}: environment variable {} is not set",
                cfg.name, cfg.api_key_env
            ))
        })?;
        Self::with_key(cfg, key)
    }

    pub fn with_key(cfg: AnthropicConfig, key: Secret) -> Result<Self, LlmError> {
        if cfg.model.trim().is_empty() {
            return Err(LlmError::Config(format!("{}: model is not set", cfg.name)));
        }
        if cfg.default_max_tokens == 0 {
            return Err(LlmError::Config(format!(
                "{}: default_max_tokens must be positive",
                cfg.name
            )));
        }
        let base = cfg.base_url.trim().trim_end_matches('/');
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(LlmError::Config(format!(
                "{}: base_url must start with http:// or https://, got {:?}",
                cfg.name, cfg.base_url
            )));
        }
        let url = if base.ends_with("/v1") {
            format!("{base}/messages")
        } else {
            format!("{base}/v1/messages")
        };
        let http = HttpTransport::new(
            &cfg.name,
            secs(cfg.connect_timeout_s, "connect_timeout_s", &cfg.name)?,
            secs(cfg.timeout_s, "timeout_s", &cfg.name)?,
        );
        Ok(AnthropicProvider {
            cfg,
            key,
            url,
            http,
        })
    }

    /// The JSON body sent for `req`. System-role messages are folded into
    /// the top-level `system` field, the only place the API accepts them.
    /// There is no seed parameter in this API, so `seed` is not sent.
    pub fn request_body(&self, req: &ChatRequest) -> Value {
        let mut system: Vec<&str> = req.system.iter().map(String::as_str).collect();
        let mut messages = Vec::with_capacity(req.messages.len());
        for m in &req.messages {
            match m.role {
                Role::System => system.push(&m.content),
                Role::User | Role::Assistant => {
                    messages.push(json!({"role": m.role.as_str(), "content": m.content}))
                }
            }
        }
        let mut body = Map::new();
        body.insert("model".into(), json!(self.cfg.model));
        body.insert(
            "max_tokens".into(),
            json!(req.max_tokens.unwrap_or(self.cfg.default_max_tokens)),
        );
        if !system.is_empty() {
            body.insert("system".into(), json!(system.join("\n\n")));
        }
        body.insert("messages".into(), Value::Array(messages));
        if let Some(t) = req.temperature {
            body.insert("temperature".into(), temperature_json(t));
        }
        for (k, v) in &self.cfg.extra_body {
            body.entry(k.clone()).or_insert_with(|| v.clone());
        }
        Value::Object(body)
    }
}

impl ChatProvider for AnthropicProvider {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    fn model(&self) -> &str {
        &self.cfg.model
    }

    /// GET `<base_url>/v1/models`: reachable, and the key accepted.
    fn preflight(&self) -> Result<(), LlmError> {
        let headers = [
            ("x-api-key", self.key.expose()),
            ("anthropic-version", self.cfg.version.as_str()),
        ];
        let models = format!("{}/models", self.url.trim_end_matches("/messages"));
        let reply = self
            .http
            .get(&models, &headers, Some(&self.key), PREFLIGHT_TIMEOUT)?;
        preflight_verdict(&self.cfg.name, &reply, Some(&self.key), None)
    }

    fn complete(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let start = Instant::now();
        let headers = [
            ("x-api-key", self.key.expose()),
            ("anthropic-version", self.cfg.version.as_str()),
        ];
        let reply = self.http.post_json(
            &self.url,
            &headers,
            &self.request_body(req),
            Some(&self.key),
        )?;
        if !(200..300).contains(&reply.status) {
            return Err(status_error(&self.cfg.name, &reply, Some(&self.key), None));
        }
        let mut resp = parse_message(
            &self.cfg.name,
            &self.cfg.model,
            req,
            &reply.body,
            Some(&self.key),
        )?;
        resp.latency_ms = start.elapsed().as_millis() as u64;
        Ok(resp)
    }
}

/// Reads a Messages API reply: text blocks are concatenated, thinking and
/// tool blocks ignored. Prompt-cache reads and writes count as input tokens.
pub(crate) fn parse_message(
    provider: &str,
    configured_model: &str,
    req: &ChatRequest,
    body: &str,
    secret: Option<&Secret>,
) -> Result<ChatResponse, LlmError> {
    let malformed = |message: String| LlmError::Malformed {
        provider: provider.to_string(),
        message: redact_opt(secret, &message),
    };
    let v: Value = serde_json::from_str(body)
        .map_err(|e| malformed(format!("{e}; body starts {:?}", snippet(body, 200))))?;
    if !v.is_object() {
        return Err(malformed(format!(
            "expected a JSON object, got {:?}",
            snippet(body, 200)
        )));
    }
    if v.get("type").and_then(Value::as_str) == Some("error") {
        let message = extract_error_message(&v).unwrap_or_default();
        return Err(LlmError::Api {
            provider: provider.to_string(),
            message: redact_opt(secret, &snippet(&message, 1000)),
            retryable: true,
        });
    }
    let blocks = v
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("no `content` array".to_string()))?;
    let text: String = blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect();
    let stop_reason = v
        .get("stop_reason")
        .and_then(Value::as_str)
        .map(str::to_string);
    if text.trim().is_empty() {
        if stop_reason.as_deref() == Some("refusal") {
            return Err(LlmError::Refused {
                provider: provider.to_string(),
                message: "stop_reason: refusal".to_string(),
            });
        }
        return Err(LlmError::EmptyReply {
            provider: provider.to_string(),
            detail: format!(
                "no text blocks (stop_reason: {})",
                stop_reason.as_deref().unwrap_or("none")
            ),
        });
    }
    let u = v.get("usage");
    let field = |n: &str| u.and_then(|u| u.get(n)).and_then(Value::as_u64);
    let input = field("input_tokens");
    let output = field("output_tokens");
    let usage = Usage {
        input_tokens: input.unwrap_or_else(|| req.estimated_input_tokens())
            + field("cache_creation_input_tokens").unwrap_or(0)
            + field("cache_read_input_tokens").unwrap_or(0),
        output_tokens: output.unwrap_or_else(|| estimate_tokens(text.chars().count())),
        estimated: input.is_none() || output.is_none(),
    };
    let model = v
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .unwrap_or(configured_model)
        .to_string();
    Ok(ChatResponse {
        text,
        model,
        usage,
        cost_usd: 0.0,
        latency_ms: 0,
        cached: false,
        attempts: 1,
        stop_reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;

    fn parse(body: &str) -> Result<ChatResponse, LlmError> {
        parse_message(
            "anthropic",
            "cfg",
            &ChatRequest::new("t", "abcd"),
            body,
            None,
        )
    }

    #[test]
    fn parses_text_blocks_and_usage() {
        let r = parse(
            r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-x",
                "content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"Hel"},{"type":"text","text":"lo"}],
                "stop_reason":"end_turn","usage":{"input_tokens":10,"output_tokens":4,"cache_read_input_tokens":5,"cache_creation_input_tokens":1}}"#,
        )
        .unwrap();
        assert_eq!(r.text, "Hello");
        assert_eq!(r.model, "claude-x");
        assert_eq!(r.stop_reason.as_deref(), Some("end_turn"));
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 16,
                output_tokens: 4,
                estimated: false
            }
        );
    }

    #[test]
    fn classifies_bad_replies() {
        assert!(matches!(parse("<html>"), Err(LlmError::Malformed { .. })));
        assert!(matches!(
            parse(r#"{"type":"message"}"#),
            Err(LlmError::Malformed { .. })
        ));
        assert!(matches!(
            parse(r#"{"content":[],"stop_reason":"max_tokens"}"#),
            Err(LlmError::EmptyReply { .. })
        ));
        assert!(matches!(
            parse(r#"{"content":[],"stop_reason":"refusal"}"#),
            Err(LlmError::Refused { .. })
        ));
        let e =
            parse(r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#)
                .unwrap_err();
        assert!(e.is_retryable());
        assert!(e.to_string().contains("overloaded_error: Overloaded"));
    }

    #[test]
    fn request_body_folds_system_messages_and_defaults_max_tokens() {
        let p = AnthropicProvider::with_key(
            AnthropicConfig {
                model: "claude-x".into(),
                base_url: "http://127.0.0.1:9/v1/".into(),
                ..Default::default()
            },
            Secret::new("k"),
        )
        .unwrap();
        assert_eq!(p.url, "http://127.0.0.1:9/v1/messages");
        let mut req = ChatRequest::new("code", "go")
            .with_system("first")
            .with_temperature(0.7)
            .with_seed(3);
        req.messages.insert(0, Message::system("second"));
        let b = p.request_body(&req);
        assert_eq!(b["system"], "first\n\nsecond");
        assert_eq!(b["messages"], json!([{"role":"user","content":"go"}]));
        assert_eq!(b["max_tokens"], 8192);
        assert_eq!(b["temperature"], json!(0.7));
        assert!(b.get("seed").is_none());
    }
}
