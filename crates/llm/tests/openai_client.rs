//! The `openai` provider and the `Client` wrapper against a scripted server.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{chat_ok, fast_config, Reply, ScriptedServer};
use ksearch_llm::{
    Budget, ChatProvider, ChatRequest, Client, LlmError, OpenAiConfig, OpenAiProvider, Secret,
};

fn provider(server: &ScriptedServer, timeout_s: f64, key: Option<&str>) -> Arc<dyn ChatProvider> {
    let cfg = OpenAiConfig {
        model: "test-model".into(),
        base_url: server.base_url(),
        timeout_s,
        connect_timeout_s: 2.0,
        ..Default::default()
    };
    Arc::new(OpenAiProvider::with_key(cfg, key.map(Secret::new)).unwrap())
}

#[test]
fn good_reply_sends_the_expected_request() {
    let server = ScriptedServer::start(vec![chat_ok("kernel code", 12, 5)]);
    let p = provider(&server, 5.0, Some("sk-abc"));
    let req = ChatRequest::new("code", "write it")
        .with_system("you write kernels")
        .with_max_tokens(64)
        .with_temperature(0.2)
        .with_seed(42);
    let r = p.complete(&req).unwrap();
    assert_eq!(r.text, "kernel code");
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (12, 5));
    assert!(!r.usage.estimated);
    assert_eq!(r.model, "test-model");

    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(seen[0].header("authorization"), Some("Bearer sk-abc"));
    assert_eq!(seen[0].header("content-type"), Some("application/json"));
    let body = seen[0].json();
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["messages"][0]["role"], "system");
    assert_eq!(body["messages"][1]["content"], "write it");
    assert_eq!(body["max_tokens"], 64);
    assert_eq!(body["temperature"], serde_json::json!(0.2));
    assert_eq!(body["seed"], 42);
    assert_eq!(body["stream"], false);
}

#[test]
fn no_key_means_no_authorization_header() {
    let server = ScriptedServer::start(vec![chat_ok("ok", 1, 1)]);
    provider(&server, 5.0, None)
        .complete(&ChatRequest::new("code", "x"))
        .unwrap();
    assert_eq!(server.seen()[0].header("authorization"), None);
}

#[test]
fn retries_through_every_transient_failure_then_succeeds() {
    let server = ScriptedServer::start(vec![
        Reply::new(200, "{\"choices\": [ this is not json"),
        Reply::new(
            200,
            r#"{"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":0}}"#,
        ),
        chat_ok("too late", 1, 1).delay(Duration::from_millis(1500)),
        Reply::new(
            429,
            r#"{"error":{"message":"Rate limit reached","type":"requests"}}"#,
        )
        .header("retry-after", "1"),
        Reply::new(
            500,
            r#"{"error":{"message":"internal","type":"server_error"}}"#,
        ),
        chat_ok("finally", 100, 40),
    ]);
    let client = Client::new(provider(&server, 0.3, None), fast_config()).unwrap();
    let start = Instant::now();
    let r = client.complete(&ChatRequest::new("code", "go")).unwrap();
    let elapsed = start.elapsed();
    assert_eq!(r.text, "finally");
    assert_eq!(r.attempts, 6);
    assert_eq!(server.request_count(), 6);
    // The 429 asked for one second; backoff alone is a few milliseconds.
    assert!(
        elapsed >= Duration::from_secs(1),
        "Retry-After ignored: {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(4), "too slow: {elapsed:?}");
    assert!(r.latency_ms >= 1000);
    let t = client.totals();
    assert_eq!((t.calls, t.attempts, t.failed_calls), (1, 6, 0));
    // Only the successful call is charged.
    assert_eq!((t.input_tokens, t.output_tokens), (100, 40));
}

#[test]
fn client_error_fails_at_once_with_the_provider_message() {
    let server = ScriptedServer::start(vec![
        Reply::new(
            401,
            r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#,
        ),
        chat_ok("never reached", 1, 1),
    ]);
    let client = Client::new(provider(&server, 5.0, Some("sk-wrong")), fast_config()).unwrap();
    let err = client
        .complete(&ChatRequest::new("code", "go"))
        .unwrap_err();
    match &err {
        LlmError::Http {
            status, message, ..
        } => {
            assert_eq!(*status, 401);
            assert!(message.contains("Incorrect API key provided"), "{message}");
        }
        other => panic!("expected an HTTP error, got {other:?}"),
    }
    assert!(!err.is_retryable());
    assert_eq!(server.request_count(), 1);
    let t = client.totals();
    assert_eq!((t.calls, t.failed_calls, t.attempts), (0, 1, 1));
}

#[test]
fn gives_up_after_max_attempts_with_the_last_error() {
    let server = ScriptedServer::start(vec![]).with_fallback(Reply::new(
        503,
        r#"{"error":{"message":"overloaded","type":"server_error"}}"#,
    ));
    let mut cfg = fast_config();
    cfg.retry.max_attempts = 3;
    let client = Client::new(provider(&server, 5.0, None), cfg).unwrap();
    let err = client
        .complete(&ChatRequest::new("code", "go"))
        .unwrap_err();
    match &err {
        LlmError::GaveUp { attempts, last } => {
            assert_eq!(*attempts, 3);
            assert!(matches!(**last, LlmError::Http { status: 503, .. }));
        }
        other => panic!("expected GaveUp, got {other:?}"),
    }
    assert_eq!(server.request_count(), 3);
    assert_eq!(client.totals().failed_calls, 1);
}

#[test]
fn retry_after_beyond_the_allowed_wait_ends_the_call() {
    let server = ScriptedServer::start(vec![
        Reply::new(429, r#"{"error":{"message":"slow down"}}"#).header("retry-after", "3600"),
        chat_ok("never reached", 1, 1),
    ]);
    let client = Client::new(provider(&server, 5.0, None), fast_config()).unwrap();
    let start = Instant::now();
    let err = client
        .complete(&ChatRequest::new("code", "go"))
        .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(matches!(err, LlmError::Http { status: 429, .. }), "{err:?}");
    assert_eq!(server.request_count(), 1);
}

#[test]
fn timeout_alone_is_reported_as_timeout() {
    let server = ScriptedServer::start(vec![])
        .with_fallback(chat_ok("late", 1, 1).delay(Duration::from_millis(800)));
    let mut cfg = fast_config();
    cfg.retry.max_attempts = 1;
    let client = Client::new(provider(&server, 0.2, None), cfg).unwrap();
    let start = Instant::now();
    let err = client
        .complete(&ChatRequest::new("code", "go"))
        .unwrap_err();
    assert!(matches!(err, LlmError::Timeout { .. }), "{err:?}");
    assert!(start.elapsed() < Duration::from_millis(700));
}

#[test]
fn connection_refused_is_a_retryable_connection_error() {
    // Bind then drop a listener: nothing listens on that port afterwards.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = OpenAiConfig {
        model: "test-model".into(),
        base_url: format!("http://127.0.0.1:{port}/v1"),
        ..Default::default()
    };
    let p = OpenAiProvider::with_key(cfg, None).unwrap();
    let err = p.complete(&ChatRequest::new("code", "go")).unwrap_err();
    assert!(matches!(err, LlmError::Connection { .. }), "{err:?}");
    assert!(err.is_retryable());
}

#[test]
fn accounting_is_exact_per_call_and_per_role() {
    let server = ScriptedServer::start(vec![
        chat_ok("a", 1000, 500),
        chat_ok("b", 2000, 250),
        chat_ok("c", 10, 0),
    ]);
    let client = Client::new(provider(&server, 5.0, None), fast_config()).unwrap();
    let r1 = client
        .complete(&ChatRequest::new("wm-init", "one"))
        .unwrap();
    let r2 = client.complete(&ChatRequest::new("code", "two")).unwrap();
    let r3 = client.complete(&ChatRequest::new("code", "three")).unwrap();
    // $2 per million input, $8 per million output.
    assert!((r1.cost_usd - 0.006).abs() < 1e-12, "{}", r1.cost_usd);
    assert!((r2.cost_usd - 0.006).abs() < 1e-12, "{}", r2.cost_usd);
    assert!((r3.cost_usd - 0.00002).abs() < 1e-12, "{}", r3.cost_usd);
    let t = client.totals();
    assert_eq!(t.calls, 3);
    assert_eq!(t.input_tokens, 3010);
    assert_eq!(t.output_tokens, 750);
    assert!((t.cost_usd - 0.01202).abs() < 1e-12, "{}", t.cost_usd);
    assert_eq!((t.unpriced_calls, t.estimated_calls), (0, 0));
    let code = &t.by_role["code"];
    assert_eq!(
        (code.calls, code.input_tokens, code.output_tokens),
        (2, 2010, 250)
    );
    assert_eq!(t.by_role["wm-init"].input_tokens, 1000);
}

#[test]
fn unknown_models_are_counted_as_unpriced() {
    let body = r#"{"model":"mystery-1","choices":[{"message":{"content":"hi"}}]}"#;
    let server = ScriptedServer::start(vec![Reply::new(200, body)]);
    let cfg = OpenAiConfig {
        model: "mystery-1".into(),
        base_url: server.base_url(),
        ..Default::default()
    };
    let p: Arc<dyn ChatProvider> = Arc::new(OpenAiProvider::with_key(cfg, None).unwrap());
    let client = Client::new(p, fast_config()).unwrap();
    let r = client
        .complete(&ChatRequest::new("code", "12345678"))
        .unwrap();
    assert_eq!(r.cost_usd, 0.0);
    assert!(r.usage.estimated);
    let t = client.totals();
    assert_eq!((t.unpriced_calls, t.estimated_calls), (1, 1));
    assert_eq!((t.input_tokens, t.output_tokens), (2, 1));
}

#[test]
fn cache_hits_cost_nothing_and_skip_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(vec![
        chat_ok("cached answer", 300, 100),
        chat_ok("other", 1, 1),
    ]);
    let mut cfg = fast_config();
    cfg.cache_dir = Some(dir.path().join("cache"));
    let client = Client::new(provider(&server, 5.0, None), cfg.clone()).unwrap();
    let req = ChatRequest::new("code", "same prompt").with_temperature(0.0);
    let first = client.complete(&req).unwrap();
    assert!(!first.cached);
    // Same content under another role tag is the same request.
    let mut again = req.clone();
    again.role_tag = "refine".into();
    let second = client.complete(&again).unwrap();
    assert!(second.cached);
    assert_eq!(second.text, "cached answer");
    assert_eq!(second.cost_usd, 0.0);
    assert_eq!(second.attempts, 0);
    assert_eq!(second.usage, first.usage);
    assert_eq!(server.request_count(), 1);
    let t = client.totals();
    assert_eq!((t.calls, t.cached_calls), (2, 1));
    assert_eq!((t.input_tokens, t.output_tokens), (300, 100));
    assert!((t.cost_usd - 0.0014).abs() < 1e-12);

    // A new client over the same directory (a re-run) also hits.
    let rerun = Client::new(provider(&server, 5.0, None), cfg).unwrap();
    assert!(rerun.complete(&req).unwrap().cached);
    assert_eq!(rerun.totals().cost_usd, 0.0);
    assert_eq!(server.request_count(), 1);

    // A different prompt misses.
    let other = client
        .complete(&ChatRequest::new("code", "new prompt"))
        .unwrap();
    assert!(!other.cached);
    assert_eq!(server.request_count(), 2);
}

#[test]
fn budget_refuses_before_the_call_once_spent() {
    let server = ScriptedServer::start(vec![]).with_fallback(chat_ok("ok", 600, 400));
    let mut cfg = fast_config();
    cfg.budget = Budget {
        max_tokens: Some(1500),
        max_cost_usd: None,
    };
    let client = Client::new(provider(&server, 5.0, None), cfg).unwrap();
    let req = ChatRequest::new("code", "short");
    client.complete(&req.clone().with_seed(1)).unwrap(); // 1000 tokens
                                                         // Passes the pre-check (1000 < 1500) and overshoots: allowed, it is paid.
    client.complete(&req.clone().with_seed(2)).unwrap();
    assert!(client.budget_exhausted());
    let err = client.complete(&req.clone().with_seed(3)).unwrap_err();
    assert!(matches!(err, LlmError::BudgetExhausted { .. }), "{err:?}");
    assert!(!err.is_retryable());
    assert_eq!(server.request_count(), 2);
    let t = client.totals();
    assert_eq!((t.calls, t.budget_refusals, t.failed_calls), (2, 1, 0));
    assert_eq!(t.tokens(), 2000);
}

#[test]
fn cost_budget_counts_the_estimated_prompt() {
    let server = ScriptedServer::start(vec![]).with_fallback(chat_ok("ok", 1000, 500));
    let mut cfg = fast_config();
    // One call costs $0.006; allow a bit less than two.
    cfg.budget = Budget {
        max_tokens: None,
        max_cost_usd: Some(0.011),
    };
    let client = Client::new(provider(&server, 5.0, None), cfg).unwrap();
    client.complete(&ChatRequest::new("code", "a")).unwrap();
    client.complete(&ChatRequest::new("code", "b")).unwrap();
    let err = client.complete(&ChatRequest::new("code", "c")).unwrap_err();
    assert!(
        matches!(err, LlmError::BudgetExhausted { ref reason } if reason.contains("cost")),
        "{err:?}"
    );
    assert_eq!(server.request_count(), 2);

    // A prompt whose own estimated input exceeds what is left is refused
    // before anything is sent: 4M characters ≈ 1M tokens ≈ $2.
    let server2 = ScriptedServer::start(vec![]).with_fallback(chat_ok("ok", 1, 1));
    let mut cfg = fast_config();
    cfg.budget.max_cost_usd = Some(1.0);
    let client = Client::new(provider(&server2, 5.0, None), cfg).unwrap();
    let huge = "x".repeat(4_000_000);
    assert!(matches!(
        client.complete(&ChatRequest::new("code", huge)),
        Err(LlmError::BudgetExhausted { .. })
    ));
    assert_eq!(server2.request_count(), 0);
}

#[test]
fn at_most_k_calls_in_flight() {
    let server = ScriptedServer::start(vec![])
        .with_fallback(chat_ok("ok", 1, 1).delay(Duration::from_millis(100)));
    let mut cfg = fast_config();
    cfg.max_in_flight = 2;
    let client = Arc::new(Client::new(provider(&server, 5.0, None), cfg).unwrap());
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let c = client.clone();
            std::thread::spawn(move || c.complete(&ChatRequest::new("code", format!("prompt {i}"))))
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap();
    }
    assert_eq!(server.request_count(), 8);
    assert_eq!(
        server.peak_in_flight(),
        2,
        "limit 2 must be reached and never exceeded"
    );
    assert_eq!(client.totals().calls, 8);
}
