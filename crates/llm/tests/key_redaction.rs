//! API keys must not reach errors, Debug output, logs, transcripts or the
//! cache. Every artefact of a run that saw the key is searched for it.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use common::{chat_ok, fast_config, message_ok, Reply, ScriptedServer};
use ksearch_llm::{
    AnthropicConfig, AnthropicProvider, ChatProvider, ChatRequest, Client, OpenAiConfig,
    OpenAiProvider, Recorder, Secret,
};

const OPENAI_KEY: &str = "sk-test-Zq9XyW7vLEAKCANARY0123456789";
const ANTHROPIC_KEY: &str = "sk-ant-test-KqP4LEAKCANARY9876543210";

/// Collects every log record at every level, ureq's included.
struct CaptureLog(Mutex<Vec<String>>);

impl log::Log for CaptureLog {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        self.0.lock().unwrap().push(format!(
            "{} {}: {}",
            record.level(),
            record.target(),
            record.args()
        ));
    }
    fn flush(&self) {}
}

static LOGS: CaptureLog = CaptureLog(Mutex::new(Vec::new()));

fn files_under(dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push((path.display().to_string(), std::fs::read(&path).unwrap()));
        }
    }
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn keys_never_reach_any_artefact() {
    // Debug level is the most a user turns on; ureq-proto's trace level dumps
    // raw request bytes (see docs/providers.md).
    log::set_logger(&LOGS).unwrap();
    log::set_max_level(log::LevelFilter::Debug);

    let dir = tempfile::tempdir().unwrap();
    let echo = r#"{"error":{"message":"Incorrect API key provided: {{AUTH}}","type":"invalid_request_error"}}"#;
    let server = ScriptedServer::start(vec![
        // Retried (logged with the message), then answered.
        Reply::new(500, echo),
        chat_ok("fine", 10, 10),
        // Not retried: the error goes to the caller.
        Reply::new(401, echo),
        // Malformed body that echoes the key.
        Reply::new(200, "oops {{AUTH}} not json"),
        Reply::new(200, "oops {{AUTH}} not json"),
        Reply::new(200, "oops {{AUTH}} not json"),
        // Anthropic: the key header echoed back in an error.
        Reply::new(
            403,
            r#"{"type":"error","error":{"type":"permission_error","message":"key {{AUTH}} lacks access"}}"#,
        ),
        message_ok("hi", 1, 1),
    ]);

    let mut texts: Vec<(String, String)> = Vec::new();

    let openai_cfg = OpenAiConfig {
        model: "test-model".into(),
        base_url: server.base_url(),
        timeout_s: 5.0,
        ..Default::default()
    };
    let openai = Arc::new(
        OpenAiProvider::with_key(openai_cfg.clone(), Some(Secret::new(OPENAI_KEY))).unwrap(),
    );
    texts.push(("openai provider Debug".into(), format!("{openai:?}")));
    texts.push(("openai config Debug".into(), format!("{openai_cfg:?}")));

    let mut cfg = fast_config();
    cfg.retry.max_attempts = 3;
    cfg.cache_dir = Some(dir.path().join("cache"));
    let client = Client::new(openai.clone() as Arc<dyn ChatProvider>, cfg.clone()).unwrap();
    texts.push(("client Debug".into(), format!("{client:?}")));
    let transcript = dir.path().join("transcript.jsonl");
    let rec = Recorder::create(client, &transcript).unwrap();

    let ok = rec.complete(&ChatRequest::new("code", "first")).unwrap();
    assert_eq!(ok.attempts, 2);
    texts.push(("response Debug".into(), format!("{ok:?}")));
    let e401 = rec
        .complete(&ChatRequest::new("code", "second"))
        .unwrap_err();
    assert!(
        e401.to_string()
            .contains("Incorrect API key provided: Bearer ***"),
        "{e401}"
    );
    let e_malformed = rec
        .complete(&ChatRequest::new("code", "third"))
        .unwrap_err();
    assert!(
        e_malformed.to_string().contains("oops Bearer *** not json"),
        "{e_malformed}"
    );
    for (name, e) in [("401", &e401), ("malformed", &e_malformed)] {
        texts.push((format!("{name} Display"), e.to_string()));
        texts.push((format!("{name} Debug"), format!("{e:?}")));
    }
    // Cache hit path too.
    assert!(
        rec.complete(&ChatRequest::new("code", "first"))
            .unwrap()
            .cached
    );
    texts.push(("totals Debug".into(), format!("{:?}", rec.inner().totals())));

    let anthropic = AnthropicProvider::with_key(
        AnthropicConfig {
            model: "claude-test".into(),
            base_url: server.root_url(),
            timeout_s: 5.0,
            ..Default::default()
        },
        Secret::new(ANTHROPIC_KEY),
    )
    .unwrap();
    texts.push(("anthropic provider Debug".into(), format!("{anthropic:?}")));
    let aclient = Client::new(Arc::new(anthropic), cfg).unwrap();
    let e403 = aclient
        .complete(&ChatRequest::new("code", "a"))
        .unwrap_err();
    assert!(e403.to_string().contains("key *** lacks access"), "{e403}");
    texts.push(("403 Display".into(), e403.to_string()));
    texts.push(("403 Debug".into(), format!("{e403:?}")));
    aclient.complete(&ChatRequest::new("code", "b")).unwrap();

    // The server did receive the keys, so the echoes above were real.
    let seen = server.seen();
    assert_eq!(
        seen[0].header("authorization"),
        Some(&*format!("Bearer {OPENAI_KEY}"))
    );
    assert_eq!(
        seen.last().unwrap().header("x-api-key"),
        Some(ANTHROPIC_KEY)
    );

    let logs = LOGS.0.lock().unwrap().clone();
    assert!(
        logs.iter().any(|l| l.contains("attempt 1/3 failed")),
        "retry warnings were not logged: {logs:?}"
    );
    for (i, line) in logs.iter().enumerate() {
        texts.push((format!("log line {i}"), line.clone()));
    }
    let mut files = Vec::new();
    files_under(dir.path(), &mut files);
    assert!(files.iter().any(|(p, _)| p.ends_with("transcript.jsonl")));
    assert!(files.iter().filter(|(p, _)| p.ends_with(".json")).count() >= 2);

    for key in [OPENAI_KEY, ANTHROPIC_KEY] {
        for (what, text) in &texts {
            assert!(!text.contains(key), "key leaked into {what}: {text}");
        }
        for (path, bytes) in &files {
            assert!(!contains(bytes, key), "key leaked into file {path}");
        }
    }
}
