//! The `anthropic` provider against a scripted server.

mod common;

use std::sync::Arc;

use common::{fast_config, message_ok, Reply, ScriptedServer};
use ksearch_llm::{
    AnthropicConfig, AnthropicProvider, ChatProvider, ChatRequest, Client, LlmError, Secret,
};

fn provider(server: &ScriptedServer, key: &str) -> Arc<dyn ChatProvider> {
    let cfg = AnthropicConfig {
        model: "claude-test-1".into(),
        base_url: server.root_url(),
        timeout_s: 5.0,
        ..Default::default()
    };
    Arc::new(AnthropicProvider::with_key(cfg, Secret::new(key)).unwrap())
}

#[test]
fn sends_key_version_and_body_and_reads_usage() {
    let server = ScriptedServer::start(vec![message_ok("hello", 20, 7)]);
    let p = provider(&server, "ak-123");
    let req = ChatRequest::new("code", "hi")
        .with_system("be terse")
        .with_max_tokens(256);
    let r = p.complete(&req).unwrap();
    assert_eq!(r.text, "hello");
    assert_eq!(r.model, "claude-test");
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (20, 7));
    assert_eq!(r.stop_reason.as_deref(), Some("end_turn"));

    let seen = &server.seen()[0];
    assert_eq!(seen.path, "/v1/messages");
    assert_eq!(seen.header("x-api-key"), Some("ak-123"));
    assert_eq!(seen.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(seen.header("authorization"), None);
    let body = seen.json();
    assert_eq!(body["model"], "claude-test-1");
    assert_eq!(body["system"], "be terse");
    assert_eq!(body["max_tokens"], 256);
    assert_eq!(
        body["messages"],
        serde_json::json!([{"role": "user", "content": "hi"}])
    );
}

#[test]
fn overloaded_529_is_retried_and_400_is_not() {
    let server = ScriptedServer::start(vec![
        Reply::new(
            529,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ),
        message_ok("after overload", 1000, 200),
        Reply::new(
            400,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too large"}}"#,
        ),
    ]);
    let client = Client::new(provider(&server, "ak"), fast_config()).unwrap();
    let r = client.complete(&ChatRequest::new("code", "a")).unwrap();
    assert_eq!((r.text.as_str(), r.attempts), ("after overload", 2));
    // claude-test* costs $3 / $15 per million.
    assert!(
        (r.cost_usd - (0.003 + 0.003)).abs() < 1e-12,
        "{}",
        r.cost_usd
    );

    let err = client.complete(&ChatRequest::new("code", "b")).unwrap_err();
    match err {
        LlmError::Http {
            status, message, ..
        } => {
            assert_eq!(status, 400);
            assert_eq!(message, "invalid_request_error: max_tokens: too large");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.request_count(), 3);
}
