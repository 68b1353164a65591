//! The `openai` provider: chat completions on any OpenAI-compatible server
//! (OpenAI, Gemini's compatible endpoint, vLLM, Ollama, OpenRouter, ...).

use std::fmt;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::http::{preflight_verdict, snippet, status_error, HttpTransport, PREFLIGHT_TIMEOUT};
use crate::secret::redact_opt;
use crate::types::estimate_tokens;
use crate::{ChatProvider, ChatRequest, ChatResponse, LlmError, Secret, Usage};

/// Which request field carries the output token limit. OpenAI's reasoning
/// models reject `max_tokens`; some compatible servers only know it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaxTokensField {
    /// `max_completion_tokens` for o1/o3/o4/gpt-5 models, `max_tokens` otherwise.
    #[default]
    Auto,
    MaxTokens,
    MaxCompletionTokens,
}

/// Settings of the `openai` provider.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpenAiConfig {
    pub model: String,
    /// Up to and including the version segment; `/chat/completions` is appended.
    pub base_url: String,
    /// Name of the environment variable holding the key. Unset or empty
    /// means no `Authorization` header (local servers need none).
    pub api_key_env: String,
    /// Whole-call limit: connect, send and read.
    pub timeout_s: f64,
    pub connect_timeout_s: f64,
    pub max_tokens_field: MaxTokensField,
    /// Name used in logs, errors and the cache key.
    pub name: String,
    /// Extra JSON fields merged into every request body (e.g.
    /// `reasoning_effort`); fields the request sets itself take precedence.
    pub extra_body: Map<String, Value>,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        OpenAiConfig {
            model: String::new(),
            base_url: "https://api.openai.com/v1".to_string(),
            api_key_env: "OPENAI_API_KEY".to_string(),
            timeout_s: 600.0,
            connect_timeout_s: 10.0,
            max_tokens_field: MaxTokensField::Auto,
            name: "openai".to_string(),
            extra_body: Map::new(),
        }
    }
}

pub struct OpenAiProvider {
    cfg: OpenAiConfig,
    key: Option<Secret>,
    url: String,
    http: HttpTransport,
}

impl fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("name", &self.cfg.name)
            .field("model", &self.cfg.model)
            .field("url", &self.url)
            .field("key", &self.key)
            .finish()
    }
}

impl OpenAiProvider {
    /// Builds the provider, reading the key from `cfg.api_key_env`.
    pub fn new(cfg: OpenAiConfig) -> Result<Self, LlmError> {
        let key = if cfg.api_key_env.is_empty() {
            None
        } else {
            Secret::from_env(&cfg.api_key_env)
        };
        Self::with_key(cfg, key)
    }

    /// Builds the provider with an explicit key (or none).
    pub fn with_key(cfg: OpenAiConfig, key: Option<Secret>) -> Result<Self, LlmError> {
        if cfg.model.trim().is_empty() {
            return Err(LlmError::Config(format!("{}: model is not set", cfg.name)));
        }
        let base = cfg.base_url.trim().trim_end_matches('/');
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(LlmError::Config(format!(
                "{}: base_url must start with http:// or https://, got {:?}",
                cfg.name, cfg.base_url
            )));
        }
        let url = format!("{base}/chat/completions");
        let http = HttpTransport::new(
            &cfg.name,
            secs(cfg.connect_timeout_s, "connect_timeout_s", &cfg.name)?,
            secs(cfg.timeout_s, "timeout_s", &cfg.name)?,
        );
        Ok(OpenAiProvider {
            cfg,
            key,
            url,
            http,
        })
    }

    /// What to say when the server wants a key and none was sent.
    fn missing_key_hint(&self, status: u16) -> Option<String> {
        match (status, &self.key) {
            (401, None) => Some(format!("no key was sent: is {} set?", self.cfg.api_key_env)),
            _ => None,
        }
    }

    /// The JSON body sent for `req`.
    pub fn request_body(&self, req: &ChatRequest) -> Value {
        let mut messages = Vec::with_capacity(req.messages.len() + 1);
        if let Some(system) = &req.system {
            messages.push(json!({"role": "system", "content": system}));
        }
        for m in &req.messages {
            messages.push(json!({"role": m.role.as_str(), "content": m.content}));
        }
        let mut body = Map::new();
        body.insert("model".into(), json!(self.cfg.model));
        body.insert("messages".into(), Value::Array(messages));
        body.insert("stream".into(), json!(false));
        if let Some(n) = req.max_tokens {
            body.insert(self.max_tokens_key().into(), json!(n));
        }
        if let Some(t) = req.temperature {
            body.insert("temperature".into(), temperature_json(t));
        }
        if let Some(s) = req.seed {
            body.insert("seed".into(), json!(s));
        }
        for (k, v) in &self.cfg.extra_body {
            body.entry(k.clone()).or_insert_with(|| v.clone());
        }
        Value::Object(body)
    }

    fn max_tokens_key(&self) -> &'static str {
        match self.cfg.max_tokens_field {
            MaxTokensField::MaxTokens => "max_tokens",
            MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
            MaxTokensField::Auto => {
                let bare = self
                    .cfg
                    .model
                    .rsplit_once('/')
                    .map_or(self.cfg.model.as_str(), |(_, b)| b);
                if ["o1", "o3", "o4", "gpt-5"]
                    .iter()
                    .any(|p| bare.starts_with(p))
                {
                    "max_completion_tokens"
                } else {
                    "max_tokens"
                }
            }
        }
    }
}

/// `0.2f32` widened to f64 is 0.20000000298023224; going through the
/// shortest decimal form sends the 0.2 the user wrote.
pub(crate) fn temperature_json(t: f32) -> Value {
    let v: f64 = t.to_string().parse().unwrap_or(f64::from(t));
    json!(v)
}

pub(crate) fn secs(v: f64, what: &str, provider: &str) -> Result<Duration, LlmError> {
    if v.is_finite() && v > 0.0 && v < 1e9 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(LlmError::Config(format!(
            "{provider}: {what} must be a positive number of seconds, got {v}"
        )))
    }
}

impl ChatProvider for OpenAiProvider {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    fn model(&self) -> &str {
        &self.cfg.model
    }

    /// GET `<base_url>/models`: reachable, and the key (if any) accepted.
    fn preflight(&self) -> Result<(), LlmError> {
        let auth = self.key.as_ref().map(|k| format!("Bearer {}", k.expose()));
        let mut headers = Vec::new();
        if let Some(a) = &auth {
            headers.push(("authorization", a.as_str()));
        }
        let models = format!("{}/models", self.url.trim_end_matches("/chat/completions"));
        let reply = self
            .http
            .get(&models, &headers, self.key.as_ref(), PREFLIGHT_TIMEOUT)?;
        preflight_verdict(
            &self.cfg.name,
            &reply,
            self.key.as_ref(),
            self.missing_key_hint(reply.status).as_deref(),
        )
    }

    fn complete(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let start = Instant::now();
        let auth = self.key.as_ref().map(|k| format!("Bearer {}", k.expose()));
        let mut headers = Vec::new();
        if let Some(a) = &auth {
            headers.push(("authorization", a.as_str()));
        }
        let reply = self.http.post_json(
            &self.url,
            &headers,
            &self.request_body(req),
            self.key.as_ref(),
        )?;
        if !(200..300).contains(&reply.status) {
            return Err(status_error(
                &self.cfg.name,
                &reply,
                self.key.as_ref(),
                self.missing_key_hint(reply.status).as_deref(),
            ));
        }
        let mut resp = parse_chat_completion(
            &self.cfg.name,
            &self.cfg.model,
            req,
            &reply.body,
            self.key.as_ref(),
        )?;
        resp.latency_ms = start.elapsed().as_millis() as u64;
        Ok(resp)
    }
}

/// Reads a chat-completions body leniently: content as a string or as an
/// array of parts, usage optional (estimated when missing), unknown fields
/// and `reasoning_content` ignored.
pub(crate) fn parse_chat_completion(
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
    let choices = v.get("choices").and_then(Value::as_array);
    if choices.is_none() {
        if let Some(err) = v.get("error") {
            // OpenRouter and some proxies report upstream failures with a 200
            // status and an error object; its numeric code says what kind.
            let code = err.get("code").and_then(Value::as_u64);
            let message = crate::http::extract_error_message(&v).unwrap_or_default();
            return Err(LlmError::Api {
                provider: provider.to_string(),
                message: redact_opt(secret, &snippet(&message, 1000)),
                retryable: code.is_none_or(|c| crate::error::is_retryable_status(c as u16)),
            });
        }
    }
    let choice = match choices.and_then(|c| c.first()) {
        Some(c) => c,
        None => {
            return Err(LlmError::EmptyReply {
                provider: provider.to_string(),
                detail: "no choices in the reply".to_string(),
            })
        }
    };
    let message = choice.get("message");
    let content = message.and_then(|m| m.get("content"));
    let text = match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                Value::Object(o) => {
                    let kind = o.get("type").and_then(Value::as_str).unwrap_or("text");
                    if kind == "text" || kind == "output_text" {
                        o.get("text").and_then(Value::as_str)
                    } else {
                        None
                    }
                }
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    };
    if text.trim().is_empty() {
        if let Some(refusal) = message
            .and_then(|m| m.get("refusal"))
            .and_then(Value::as_str)
        {
            return Err(LlmError::Refused {
                provider: provider.to_string(),
                message: redact_opt(secret, &snippet(refusal, 500)),
            });
        }
        let finish = choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .unwrap_or("none");
        return Err(LlmError::EmptyReply {
            provider: provider.to_string(),
            detail: format!("no text content (finish_reason: {finish})"),
        });
    }
    let usage_obj = v.get("usage");
    let reported = |names: &[&str]| {
        names
            .iter()
            .find_map(|n| usage_obj.and_then(|u| u.get(*n)).and_then(Value::as_u64))
    };
    let input = reported(&["prompt_tokens", "input_tokens"]);
    let output = reported(&["completion_tokens", "output_tokens"]);
    let usage = Usage {
        input_tokens: input.unwrap_or_else(|| req.estimated_input_tokens()),
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
        stop_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<ChatResponse, LlmError> {
        parse_chat_completion(
            "openai",
            "cfg-model",
            &ChatRequest::new("t", "12345678"),
            body,
            None,
        )
    }

    #[test]
    fn parses_string_content_and_usage() {
        let r = parse(
            r#"{"model":"gpt-x-2025","choices":[{"index":0,"message":{"role":"assistant","content":"hi","reasoning_content":"thinking..."},"finish_reason":"stop"}],
               "usage":{"prompt_tokens":11,"completion_tokens":3,"total_tokens":14},"system_fingerprint":"fp"}"#,
        )
        .unwrap();
        assert_eq!(r.text, "hi");
        assert_eq!(r.model, "gpt-x-2025");
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 11,
                output_tokens: 3,
                estimated: false
            }
        );
        assert_eq!(r.stop_reason.as_deref(), Some("stop"));
    }

    #[test]
    fn parses_content_parts_and_estimates_missing_usage() {
        let r = parse(
            r#"{"choices":[{"message":{"content":[{"type":"text","text":"ab"},{"type":"image_url"},{"type":"text","text":"cdefg"}]},"finish_reason":""}],
               "usage":{"prompt_tokens":5}}"#,
        )
        .unwrap();
        assert_eq!(r.text, "abcdefg");
        assert_eq!(r.model, "cfg-model");
        // Input reported, output estimated from 7 characters.
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 5,
                output_tokens: 2,
                estimated: true
            }
        );
        assert_eq!(r.stop_reason, None);
        let r = parse(r#"{"choices":[{"message":{"content":"xyz"}}]}"#).unwrap();
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 2,
                output_tokens: 1,
                estimated: true
            }
        );
    }

    #[test]
    fn classifies_bad_replies() {
        assert!(matches!(
            parse("{not json"),
            Err(LlmError::Malformed { .. })
        ));
        assert!(matches!(parse("[1]"), Err(LlmError::Malformed { .. })));
        assert!(matches!(
            parse(r#"{"choices":[]}"#),
            Err(LlmError::EmptyReply { .. })
        ));
        assert!(matches!(
            parse(r#"{"choices":[{"message":{"content":null},"finish_reason":"length"}]}"#),
            Err(LlmError::EmptyReply { .. })
        ));
        let e =
            parse(r#"{"choices":[{"message":{"content":null,"refusal":"I can't"}}]}"#).unwrap_err();
        assert!(matches!(e, LlmError::Refused { .. }) && !e.is_retryable());
        let e = parse(r#"{"error":{"message":"upstream down","code":502}}"#).unwrap_err();
        assert!(matches!(e, LlmError::Api { .. }) && e.is_retryable());
        let e = parse(r#"{"error":{"message":"bad model","code":400}}"#).unwrap_err();
        assert!(!e.is_retryable());
    }

    #[test]
    fn request_body_shape() {
        let mut cfg = OpenAiConfig {
            model: "o3-mini".into(),
            ..Default::default()
        };
        cfg.extra_body
            .insert("reasoning_effort".into(), json!("high"));
        cfg.extra_body.insert("temperature".into(), json!(1.0));
        let p = OpenAiProvider::with_key(cfg, None).unwrap();
        let req = ChatRequest::new("code", "go")
            .with_system("sys")
            .with_max_tokens(100)
            .with_temperature(0.2)
            .with_seed(7);
        let b = p.request_body(&req);
        assert_eq!(b["model"], "o3-mini");
        assert_eq!(b["messages"][0], json!({"role":"system","content":"sys"}));
        assert_eq!(b["messages"][1], json!({"role":"user","content":"go"}));
        assert_eq!(b["max_completion_tokens"], 100);
        assert!(b.get("max_tokens").is_none());
        assert_eq!(b["temperature"], json!(0.2));
        assert_eq!(b["seed"], 7);
        assert_eq!(b["reasoning_effort"], "high");

        let p = OpenAiProvider::with_key(
            OpenAiConfig {
                model: "llama3".into(),
                ..Default::default()
            },
            None,
        )
        .unwrap();
        let b = p.request_body(&ChatRequest::new("c", "x").with_max_tokens(5));
        assert_eq!(b["max_tokens"], 5);
        assert!(b.get("temperature").is_none() && b.get("seed").is_none());
    }

    #[test]
    fn rejects_bad_config() {
        let no_model = OpenAiConfig::default();
        assert!(matches!(
            OpenAiProvider::with_key(no_model, None),
            Err(LlmError::Config(_))
        ));
        let bad_url = OpenAiConfig {
            model: "m".into(),
            base_url: "localhost:8000".into(),
            ..Default::default()
        };
        assert!(OpenAiProvider::with_key(bad_url, None).is_err());
        let bad_timeout = OpenAiConfig {
            model: "m".into(),
            timeout_s: 0.0,
            ..Default::default()
        };
        assert!(OpenAiProvider::with_key(bad_timeout, None).is_err());
    }
}
