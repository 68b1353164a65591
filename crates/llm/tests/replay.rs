//! Transcripts: record a run through a real (scripted) provider, replay it.

mod common;

use std::sync::Arc;

use common::{chat_ok, fast_config, ScriptedServer};
use ksearch_llm::{
    read_transcript, ChatProvider, ChatRequest, Client, LlmError, OpenAiConfig, OpenAiProvider,
    Recorder, ReplayMode, ReplayProvider, Usage,
};

fn recorded_run(path: &std::path::Path) -> Vec<ChatRequest> {
    let server = ScriptedServer::start(vec![
        chat_ok("init reply", 100, 10),
        chat_ok("code reply 1", 200, 20),
        chat_ok("code reply 2", 300, 30),
        chat_ok("refine reply", 400, 40),
    ]);
    let cfg = OpenAiConfig {
        model: "test-model".into(),
        base_url: server.base_url(),
        timeout_s: 5.0,
        ..Default::default()
    };
    let p: Arc<dyn ChatProvider> = Arc::new(OpenAiProvider::with_key(cfg, None).unwrap());
    let client = Client::new(p, fast_config()).unwrap();
    let rec = Recorder::create(client, path).unwrap();
    let reqs = vec![
        ChatRequest::new("wm-init", "describe the task").with_seed(1),
        ChatRequest::new("code", "write version 1"),
        ChatRequest::new("code", "write version 2"),
        ChatRequest::new("refine", "update the model"),
    ];
    for r in &reqs {
        rec.complete(r).unwrap();
    }
    reqs
}

#[test]
fn record_then_strict_replay_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run/transcript.jsonl");
    let reqs = recorded_run(&path);

    let records = read_transcript(&path).unwrap();
    assert_eq!(records.len(), 4);
    assert_eq!(
        records.iter().map(|r| r.seq).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    assert_eq!(records[1].role_tag, "code");
    assert_eq!(records[1].request_hash, reqs[1].hash());
    assert_eq!(records[1].text, "code reply 1");
    assert_eq!(records[1].provider, "openai");
    assert_eq!(
        records[1].usage,
        Usage {
            input_tokens: 200,
            output_tokens: 20,
            estimated: false
        }
    );
    // Recorded outside the client: the final, priced cost ($2/$8 per M).
    assert!((records[1].cost_usd - 0.00056).abs() < 1e-12);
    assert_eq!(records[1].request.as_ref(), Some(&reqs[1]));

    // Replayed through a client, accounting equals the original run.
    let replay = Arc::new(ReplayProvider::open(&path, ReplayMode::Strict).unwrap());
    let client = Client::new(replay.clone(), fast_config()).unwrap();
    for (req, rec) in reqs.iter().zip(&records) {
        let r = client.complete(req).unwrap();
        assert_eq!(r.text, rec.text);
        assert_eq!(r.usage, rec.usage);
        assert_eq!(r.model, "test-model");
        assert!((r.cost_usd - rec.cost_usd).abs() < 1e-15);
    }
    let t = client.totals();
    assert_eq!((t.input_tokens, t.output_tokens), (1000, 100));
    assert!((t.cost_usd - (1000.0 * 2.0 + 100.0 * 8.0) / 1e6).abs() < 1e-12);
    assert_eq!(replay.remaining(), 0);
    let err = client.complete(&reqs[0]).unwrap_err();
    assert!(matches!(err, LlmError::Replay { ref message } if message.contains("exhausted")));
}

#[test]
fn strict_replay_rejects_a_changed_prompt_or_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    let reqs = recorded_run(&path);
    let replay = ReplayProvider::open(&path, ReplayMode::Strict).unwrap();
    // Out of order: the second request first.
    let err = replay.complete(&reqs[1]).unwrap_err();
    assert!(
        matches!(err, LlmError::Replay { ref message } if message.contains("call #0")),
        "{err}"
    );
    // A mismatch does not consume the record.
    assert_eq!(replay.complete(&reqs[0]).unwrap().text, "init reply");
    // Same role, edited prompt.
    let edited = ChatRequest::new("code", "write version 1, faster");
    assert!(replay.complete(&edited).is_err());
    // Same prompt, different role tag.
    let mut retagged = reqs[1].clone();
    retagged.role_tag = "refine".into();
    assert!(replay.complete(&retagged).is_err());
    assert_eq!(replay.complete(&reqs[1]).unwrap().text, "code reply 1");
    assert!(replay.complete(&reqs[1]).is_err());
}

#[test]
fn lenient_replay_follows_order_per_role() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    recorded_run(&path);
    let replay = ReplayProvider::open(&path, ReplayMode::Lenient).unwrap();
    // Different prompts, interleaved differently: each role keeps its order.
    let ask = |role: &str| replay.complete(&ChatRequest::new(role, "edited prompt"));
    assert_eq!(ask("code").unwrap().text, "code reply 1");
    assert_eq!(ask("refine").unwrap().text, "refine reply");
    assert_eq!(ask("code").unwrap().text, "code reply 2");
    assert!(matches!(ask("code"), Err(LlmError::Replay { .. })));
    assert!(matches!(ask("unknown-role"), Err(LlmError::Replay { .. })));
    assert_eq!(replay.remaining(), 1);
    assert_eq!(ask("wm-init").unwrap().text, "init reply");
}

#[test]
fn a_delayed_replay_waits_per_reply_and_concurrent_calls_wait_together() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    recorded_run(&path);
    let delay = std::time::Duration::from_millis(300);
    let replay = ReplayProvider::open(&path, ReplayMode::Lenient)
        .unwrap()
        .with_delay(delay);
    let started = std::time::Instant::now();
    let texts: Vec<String> = std::thread::scope(|s| {
        let calls: Vec<_> = (0..2)
            .map(|_| s.spawn(|| replay.complete(&ChatRequest::new("code", "p")).unwrap()))
            .collect();
        calls
            .into_iter()
            .map(|c| {
                let r = c.join().unwrap();
                assert_eq!(r.latency_ms, 300);
                r.text
            })
            .collect()
    });
    let took = started.elapsed();
    assert!(took >= delay, "{took:?}");
    // Side by side, not one after the other.
    assert!(took < 2 * delay, "{took:?}");
    let mut texts = texts;
    texts.sort();
    assert_eq!(texts, ["code reply 1", "code reply 2"]);
}

#[test]
fn recorder_appends_and_continues_numbering() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    recorded_run(&path);
    recorded_run(&path);
    let records = read_transcript(&path).unwrap();
    assert_eq!(records.len(), 8);
    assert_eq!(records[7].seq, 7);
}

#[test]
fn corrupt_transcript_lines_are_reported_with_their_line_number() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    std::fs::write(&path, "\n{\"not\": \"a record\"}\n").unwrap();
    match ReplayProvider::open(&path, ReplayMode::Strict) {
        Err(LlmError::Replay { message }) => assert!(message.contains(":2:"), "{message}"),
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("accepted a corrupt transcript"),
    }
}
