//! End to end: `ksearch run --proposer openai` against a scripted OpenAI-compatible server on
//! loopback, on the cpu softmax task, with malformed, empty, slow, 429 and 500 replies mixed
//! in; then the same run again from its transcript (`--proposer replay`). Also
//! `ksearch knowledge show` for every target and `ksearch knowledge lint`.
//!
//! Evaluations need Python 3 with numpy, as in `cli.rs`: `KSEARCH_TEST_PYTHON` or the managed
//! environment cached under `target/` (`KSEARCH_CACHE_DIR`).

mod common;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use assert_cmd::Command;
use serde_json::{json, Value};

use ksearch_store::{CandidateKind, RunStore};

const KEY_VAR: &str = "KSEARCH_TEST_LLM_KEY";
const KEY: &str = "sk-test-DO-NOT-LEAK-4242";
const PROMPT_TOKENS: u64 = 1000;
const COMPLETION_TOKENS: u64 = 200;
/// $2 / $8 per million input / output tokens (the test price table).
const COST_PER_REPLY: f64 = (PROMPT_TOKENS as f64 * 2.0 + COMPLETION_TOKENS as f64 * 8.0) / 1e6;

fn ksearch() -> Command {
    let mut cmd = common::ksearch();
    cmd.env_remove("OPENAI_API_KEY");
    cmd
}

// ---- kernels the scripted model writes ------------------------------------------------------

const SEED: &str = include_str!("../../../tasks/softmax/seed/naive.c");

fn fenced(code: &str) -> String {
    format!("Here is the kernel.\n\n```c\n{code}```\n")
}

/// The seed with its three passes fused into two and a different comment: correct.
fn kernel_two_pass() -> String {
    "// Two passes per row: max, then exp and sum together; normalise in a third loop.\n\
     #include <math.h>\n#include <stdint.h>\n\n\
     void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {\n\
     \x20   for (int64_t r = 0; r < rows; r++) {\n\
     \x20       const float* xr = x + r * cols;\n\
     \x20       float* yr = y + r * cols;\n\
     \x20       float m = xr[0];\n\
     \x20       for (int64_t c = 1; c < cols; c++) m = xr[c] > m ? xr[c] : m;\n\
     \x20       double sum = 0.0;\n\
     \x20       for (int64_t c = 0; c < cols; c++) { float e = expf(xr[c] - m); yr[c] = e; sum += e; }\n\
     \x20       const float inv = (float)(1.0 / sum);\n\
     \x20       for (int64_t c = 0; c < cols; c++) yr[c] *= inv;\n\
     \x20   }\n}\n"
        .to_string()
}

/// Rows split over OpenMP threads: correct.
fn kernel_omp() -> String {
    SEED.replace(
        "    for (int64_t r = 0; r < rows; r++) {",
        "    #pragma omp parallel for schedule(static)\n    for (int64_t r = 0; r < rows; r++) {",
    )
}

/// A CUDA barrier in C: the lint rejects it before compiling.
fn kernel_cuda_in_c() -> String {
    SEED.replace(
        "        float inv =",
        "        __syncthreads();\n        float inv =",
    )
}

/// Does not compile.
fn kernel_broken() -> String {
    SEED.replace(
        "float inv = (float)(1.0 / sum);",
        "float inv = (float)(1.0 / sum)",
    )
}

// ---- the scripted server --------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Fault {
    /// 429 with `retry-after: 0`.
    RateLimited,
    /// 500.
    ServerError,
    /// 200 whose body is not JSON.
    Malformed,
    /// 200 with an empty message.
    Empty,
    /// A real reply, but only after the client's timeout.
    Slow,
}

#[derive(Clone, Debug)]
enum Step {
    Fault(Fault),
    Text(String),
}

#[derive(Default)]
struct State {
    code: VecDeque<Step>,
    init: VecDeque<Step>,
    propose: VecDeque<Step>,
    /// Real replies the client accepted (not the slow ones it abandoned).
    accepted: usize,
    faults_served: Vec<String>,
    roles: Vec<String>,
    auth: Vec<String>,
    bodies: Vec<String>,
    proposed: usize,
    /// Request lines of GETs (the check before a run), each with the key it carried.
    gets: Vec<(String, Option<String>)>,
}

struct Server {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    slow: Duration,
}

fn role_of(prompt: &str) -> &'static str {
    let head = prompt.lines().next().unwrap_or("");
    if head.starts_with("# World model: initial") {
        "init"
    } else if head.starts_with("# World model: propose") {
        "propose"
    } else if head.starts_with("# World model: refine") {
        "refine"
    } else if head.starts_with("# World model: an action that did not work") {
        "too_hard"
    } else if head.starts_with("# Write code")
        || head.starts_with("# Debug")
        || head.starts_with("# Improve")
    {
        "code"
    } else {
        "unknown"
    }
}

/// The word after `marker` in `text` (a node id), without trailing punctuation.
fn word_after<'a>(text: &'a str, marker: &str) -> Option<&'a str> {
    let rest = &text[text.find(marker)? + marker.len()..];
    rest.split_whitespace()
        .next()
        .map(|w| w.trim_end_matches(['.', ',', ':', ';']))
}

fn init_reply() -> String {
    let plan = json!({
        "kernel_summary": "Row softmax: three reductions per row, memory bound.",
        "open_questions": ["Is one thread per row enough?", "Does OpenMP pay off at 2 cores?"],
        "ops": [
            {"op": "insert", "parent_id": "root", "node": {
                "label": "fuse", "decision": "pass structure", "choice": "fused exp+sum",
                "overall_rating": 7, "confidence": 0.5,
                "action": {"title": "Fuse the exp and sum passes", "difficulty": 1,
                           "score": 0.9, "expected_vs_baseline_factor": 1.3}}},
            {"op": "insert", "parent_id": "root", "node": {
                "label": "threads", "decision": "parallelism", "choice": "rows over threads",
                "overall_rating": 6, "confidence": 0.4,
                "action": {"title": "Split rows over OpenMP threads", "difficulty": 2,
                           "score": 0.8, "expected_vs_baseline_factor": 1.8}}}
        ]
    });
    format!("Plan below.\n```json\n{plan:#}\n```")
}

fn answer(state: &mut State, role: &str, prompt: &str) -> Step {
    let pop = |q: &mut VecDeque<Step>| q.pop_front();
    match role {
        "init" => pop(&mut state.init).unwrap_or_else(|| Step::Text(init_reply())),
        "code" => pop(&mut state.code).unwrap_or_else(|| Step::Text(fenced(&kernel_two_pass()))),
        "propose" => pop(&mut state.propose).unwrap_or_else(|| {
            state.proposed += 1;
            let n = state.proposed;
            Step::Text(
                json!({"ops": [{"op": "insert", "parent_id": "root", "node": {
                    "label": format!("idea-{n}"),
                    "action": {"title": format!("Unroll the exp loop by {}", 2 * n), "difficulty": 2,
                               "score": 0.7, "expected_vs_baseline_factor": 1.2}}}]})
                .to_string(),
            )
        }),
        "refine" => {
            let node = word_after(prompt, "now attached to node").unwrap_or("root");
            Step::Text(format!(
                "The cycle went well.\n{}",
                json!({"ops": [
                    {"op": "update", "node_id": node, "set": {"notes": "CURRENT: passes. FOLLOW_THROUGH: yes. UPDATE_BELIEF: keep going.", "confidence": 0.7}},
                    {"op": "insert", "parent_id": node, "node": {"label": format!("after-{node}"),
                        "action": {"title": format!("Vectorise the normalise loop after {node}"),
                                   "difficulty": 2, "score": 0.75, "expected_vs_baseline_factor": 1.4}}}
                ]})
            ))
        }
        "too_hard" => {
            let node = word_after(prompt, "closed node").unwrap_or("root");
            Step::Text(
                json!({"ops": [{"op": "update", "node_id": node,
                                "set": {"notes": "failed: see the log", "overall_rating": 2}}]})
                .to_string(),
            )
        }
        _ => Step::Text("I do not know this prompt.".into()),
    }
}

fn chat_body(text: &str) -> String {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "test-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS,
                  "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS}
    })
    .to_string()
}

impl Server {
    fn start(state: State, slow: Duration) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(state));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        thread::spawn(move || {
            for conn in listener.incoming() {
                if sp.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let st = st.clone();
                thread::spawn(move || serve(conn, st, slow));
            }
        });
        Server {
            addr,
            state,
            stop,
            slow,
        }
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        let _ = self.slow;
    }
}

fn serve(stream: TcpStream, st: Arc<Mutex<State>>, slow: Duration) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end().to_string();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if line.starts_with("GET ") {
            // The model list a compatible server offers; the check before a run reads it.
            let auth = headers
                .iter()
                .find(|(k, _)| k == "authorization")
                .map(|(_, v)| v.clone());
            st.lock()
                .unwrap()
                .gets
                .push((line.trim_end().to_string(), auth));
            let text = r#"{"object": "list", "data": [{"id": "test-model", "object": "model"}]}"#;
            let out = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{text}",
                text.len()
            );
            if writer.write_all(out.as_bytes()).is_err() || writer.flush().is_err() {
                return;
            }
            continue;
        }
        let body = String::from_utf8_lossy(&body).into_owned();
        let request: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let prompt = request["messages"]
            .as_array()
            .and_then(|m| m.iter().find(|x| x["role"] == "user"))
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_string();
        let role = role_of(&prompt);
        let step = {
            let mut s = st.lock().unwrap();
            s.roles.push(role.to_string());
            s.bodies.push(body.clone());
            if let Some((_, v)) = headers.iter().find(|(k, _)| k == "authorization") {
                s.auth.push(v.clone());
            }
            answer(&mut s, role, &prompt)
        };
        let (status, extra, text, delay, accepted) = match step {
            Step::Text(t) => (200, "", chat_body(&t), Duration::ZERO, true),
            Step::Fault(f) => {
                st.lock()
                    .unwrap()
                    .faults_served
                    .push(format!("{role}:{f:?}"));
                // The faulty reply replaced a real one: put it back for the retry.
                let real = {
                    let mut s = st.lock().unwrap();
                    let again = answer(&mut s, role, &prompt);
                    match again {
                        Step::Text(t) => t,
                        Step::Fault(_) => String::new(),
                    }
                };
                {
                    let mut s = st.lock().unwrap();
                    let q = match role {
                        "code" => &mut s.code,
                        "init" => &mut s.init,
                        _ => &mut s.propose,
                    };
                    q.push_front(Step::Text(real.clone()));
                }
                match f {
                    Fault::RateLimited => (
                        429,
                        "retry-after: 0\r\n",
                        r#"{"error": {"message": "slow down", "type": "rate_limit"}}"#.to_string(),
                        Duration::ZERO,
                        false,
                    ),
                    Fault::ServerError => (
                        500,
                        "",
                        r#"{"error": {"message": "internal error"}}"#.into(),
                        Duration::ZERO,
                        false,
                    ),
                    Fault::Malformed => (
                        200,
                        "",
                        "<html>this is not json".into(),
                        Duration::ZERO,
                        false,
                    ),
                    Fault::Empty => (200, "", chat_body(""), Duration::ZERO, false),
                    Fault::Slow => (200, "", chat_body(&real), slow, false),
                }
            }
        };
        thread::sleep(delay);
        if accepted {
            st.lock().unwrap().accepted += 1;
        }
        let out = format!(
            "HTTP/1.1 {status} Scripted\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n{text}",
            text.len()
        );
        if writer.write_all(out.as_bytes()).is_err() || writer.flush().is_err() {
            return;
        }
    }
}

// ---- helpers --------------------------------------------------------------------------------

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn assert_no_key(dir: &Path, stdout: &[u8], stderr: &[u8]) {
    for f in files_under(dir) {
        let bytes = std::fs::read(&f).unwrap();
        let hay = String::from_utf8_lossy(&bytes);
        assert!(
            !hay.contains(KEY),
            "the API key leaked into {}",
            f.display()
        );
        assert!(
            !hay.contains("DO-NOT-LEAK"),
            "part of the key leaked into {}",
            f.display()
        );
    }
    for (name, out) in [("stdout", stdout), ("stderr", stderr)] {
        assert!(
            !String::from_utf8_lossy(out).contains(KEY),
            "the API key leaked to {name}"
        );
    }
}

fn attempt_sources(store: &RunStore) -> Vec<String> {
    store
        .candidates()
        .unwrap()
        .iter()
        .filter(|c| c.kind == CandidateKind::Attempt)
        .map(|c| store.source(&c.source_id).unwrap())
        .collect()
}

fn run_json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not the run JSON ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

const SEARCH_ARGS: &[&str] = &[
    "run",
    "--task",
    "softmax",
    "--backend",
    "cpu",
    "--rounds",
    "6",
    "--cycle-cap",
    "2",
    "--stagnation-window",
    "2",
    "--selection",
    "ksearch",
    "--timing",
    "quick",
    "--seed",
    "42",
    // The confirmation re-measures kernels the proposer already wrote (search_cli's tests
    // cover it); here it would only repeat evaluations.
    "--confirm-rounds",
    "0",
    "--no-llm-cache",
    "--json",
];

#[test]
fn an_llm_run_survives_a_flaky_server_and_replays_from_its_transcript() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let prices = tmp.path().join("prices.toml");
    std::fs::write(
        &prices,
        "[models]\n\"test-model\" = { input = 2.0, output = 8.0 }\n",
    )
    .unwrap();

    let state = State {
        init: VecDeque::from([Step::Fault(Fault::ServerError)]),
        propose: VecDeque::from([Step::Text(
            "I would add a vectorised variant {but no JSON".into(),
        )]),
        code: VecDeque::from([
            Step::Fault(Fault::RateLimited),
            Step::Text(fenced(&kernel_two_pass())),
            Step::Fault(Fault::ServerError),
            Step::Text("The kernel should fuse the loops; I can write it next time.".into()),
            Step::Fault(Fault::Malformed),
            Step::Text(fenced(&kernel_omp())),
            Step::Fault(Fault::Empty),
            Step::Text(fenced(&kernel_cuda_in_c())),
            Step::Fault(Fault::Slow),
            Step::Text(fenced(SEED)),
            Step::Text(fenced(&kernel_broken())),
        ]),
        ..State::default()
    };
    let server = Server::start(state, Duration::from_secs(5));

    let out = ksearch()
        .args(SEARCH_ARGS)
        .arg("--runs-dir")
        .arg(&runs)
        .args(["--proposer", "openai", "--model", "test-model"])
        .args(["--base-url", &server.base_url()])
        .args(["--api-key-env", KEY_VAR])
        .arg("--price-table")
        .arg(&prices)
        .args(["--llm-timeout", "2", "--llm-concurrency", "2"])
        .env(KEY_VAR, KEY)
        .output()
        .unwrap();
    let report = run_json(&out);
    let outcome = &report["outcome"];
    assert!(
        outcome["stop_reason"]
            .as_str()
            .unwrap()
            .starts_with("rounds budget"),
        "{report:#}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(outcome["rounds_used"], 6);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a candidate passed the re-check: {report:#}"
    );
    assert_eq!(outcome["recheck"]["status"], "passed", "{report:#}");

    let s = server.state.lock().unwrap();
    // Every fault was served and retried through.
    assert_eq!(s.faults_served.len(), 6, "{:?}", s.faults_served);
    assert!(
        s.code.is_empty(),
        "every scripted code reply was used: {:?}",
        s.code
    );
    for role in ["init", "propose", "refine", "code"] {
        assert!(
            s.roles.iter().any(|r| r == role),
            "no {role} call: {:?}",
            s.roles
        );
    }
    assert!(!s.roles.iter().any(|r| r == "unknown"), "{:?}", s.roles);
    // The key went to the server, in the header only.
    assert!(!s.auth.is_empty() && s.auth.iter().all(|a| a == &format!("Bearer {KEY}")));
    assert!(s.bodies.iter().all(|b| !b.contains(KEY)));
    // One check before the run: the model list, with the key.
    assert_eq!(
        s.gets,
        vec![(
            "GET /v1/models HTTP/1.1".to_string(),
            Some(format!("Bearer {KEY}"))
        )]
    );
    // The client's retries are logged, and the log reaches the terminal.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("attempt 1/") && stderr.contains("retrying in"),
        "{stderr}"
    );

    let dir = PathBuf::from(report["dir"].as_str().unwrap());
    let store = RunStore::open(&dir).unwrap();
    // The store holds every exchange the client completed, and the totals are exact.
    let exchanges = store.exchanges().unwrap();
    assert_eq!(exchanges.len(), s.accepted, "{:?}", s.roles);
    assert!(exchanges.iter().all(|x| x.exchange.error.is_none()));
    assert!(exchanges
        .iter()
        .all(|x| x.exchange.model == "test-model" && !x.exchange.cached));
    let totals = store.usage_totals().unwrap();
    let n = s.accepted as u64;
    assert_eq!(totals.input_tokens, n * PROMPT_TOKENS);
    assert_eq!(totals.output_tokens, n * COMPLETION_TOKENS);
    assert!(
        (totals.cost_usd - n as f64 * COST_PER_REPLY).abs() < 1e-9,
        "{} vs {}",
        totals.cost_usd,
        n as f64 * COST_PER_REPLY
    );
    drop(s);

    // What each proposal became: passed, unusable (no candidate), lint_failed, build_error.
    let sources = attempt_sources(&store);
    assert_eq!(sources.len(), 5, "the reply without code left no candidate");
    assert_eq!(sources[0], kernel_two_pass());
    assert_eq!(sources[2], kernel_cuda_in_c());
    let statuses: Vec<String> = store
        .candidates()
        .unwrap()
        .iter()
        .filter(|c| c.kind == CandidateKind::Attempt)
        .map(|c| store.evaluation_for(c.id).unwrap().unwrap().status)
        .collect();
    assert_eq!(
        statuses,
        vec!["passed", "passed", "lint_failed", "passed", "build_error"],
        "{report:#}"
    );
    let events = store.events_after(0).unwrap();
    let errors: Vec<String> = events
        .iter()
        .filter(|e| e.kind == "proposer_error")
        .map(|e| e.data["error"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        errors.iter().any(|e| e.contains("no fenced code block")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("no JSON object")),
        "{errors:?}"
    );
    // The re-check ran the knowledge pack's adversarial workloads too.
    let recheck = store
        .candidates()
        .unwrap()
        .into_iter()
        .find(|c| c.kind == CandidateKind::Recheck)
        .unwrap();
    let result = store.evaluation_for(recheck.id).unwrap().unwrap().result;
    let names: Vec<&str> = result["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["name"].as_str())
        .collect();
    assert!(
        names.contains(&"assert-online-softmax-rescale-large-logits"),
        "{names:?}"
    );
    // The transcript has one record per completed call, and no key anywhere.
    let transcript = dir.join("transcript.jsonl");
    let records = std::fs::read_to_string(&transcript).unwrap();
    assert_eq!(records.lines().count(), exchanges.len());
    assert_no_key(&dir, &out.stdout, &out.stderr);

    // The same run from the transcript: no server, no key, the same proposals in the same
    // order and the same spending.
    drop(server);
    let replay = ksearch()
        .args(SEARCH_ARGS)
        .arg("--runs-dir")
        .arg(&runs)
        .args(["--proposer", "replay", "--transcript"])
        .arg(&transcript)
        // The re-check was covered above; it does not change the proposals.
        .arg("--no-recheck")
        .output()
        .unwrap();
    let replay_report = run_json(&replay);
    assert_eq!(
        replay_report["outcome"]["rounds_used"], 6,
        "{replay_report:#}"
    );
    let replay_dir = PathBuf::from(replay_report["dir"].as_str().unwrap());
    assert_ne!(replay_dir, dir);
    let replayed = RunStore::open(&replay_dir).unwrap();
    assert_eq!(attempt_sources(&replayed), sources);
    let replayed_statuses: Vec<String> = replayed
        .candidates()
        .unwrap()
        .iter()
        .filter(|c| c.kind == CandidateKind::Attempt)
        .map(|c| replayed.evaluation_for(c.id).unwrap().unwrap().status)
        .collect();
    assert_eq!(replayed_statuses, statuses);
    assert_eq!(replay_report["outcome"]["passed"], outcome["passed"]);
    assert_eq!(replay_report["outcome"]["failed"], outcome["failed"]);
    assert_eq!(replay_report["outcome"]["cycles"], outcome["cycles"]);
    let replay_totals = replayed.usage_totals().unwrap();
    assert_eq!(replay_totals.calls, totals.calls);
    assert_eq!(replay_totals.input_tokens, totals.input_tokens);
    assert_eq!(replay_totals.output_tokens, totals.output_tokens);
    assert!((replay_totals.cost_usd - totals.cost_usd).abs() < 1e-9);
    assert_no_key(&replay_dir, &replay.stdout, &replay.stderr);
}

/// `ksearch run` on the softmax task's cpu backend for `rounds` rounds, stored under `runs`.
fn softmax_cpu_run(rounds: &str, runs: &Path) -> Command {
    let mut cmd = ksearch();
    cmd.args([
        "run",
        "--task",
        "softmax",
        "--backend",
        "cpu",
        "--rounds",
        rounds,
    ])
    .arg("--runs-dir")
    .arg(runs);
    cmd
}

/// A proposer whose every call fails (here the `command` proposer's program exits with an
/// error) stops the run after three calls in a row with exit status 3, the cause on screen and
/// the run saved for `resume`, instead of spending every round on failed attempts.
#[test]
fn a_proposer_that_keeps_failing_stops_the_run_with_status_3() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let out = softmax_cpu_run("10", &runs)
        .args(["--timing", "quick", "--no-recheck", "--confirm-rounds", "0"])
        .args(["--proposer", "command", "--command", "false"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("failed 3 times in a row"), "{err}");
    assert!(err.contains("command `false` failed"), "{err}");
    assert!(err.contains("ksearch resume"), "{err}");
    let dirs: Vec<_> = std::fs::read_dir(&runs).unwrap().flatten().collect();
    assert_eq!(dirs.len(), 1);
    let store = RunStore::open(&dirs[0].path()).unwrap();
    assert!(!store.is_finished().unwrap());
    let attempts = store
        .candidates()
        .unwrap()
        .into_iter()
        .filter(|c| c.kind == CandidateKind::Attempt)
        .count();
    assert_eq!(attempts, 0, "no kernel was written");
    // `show` says why.
    let shown = ksearch().arg("show").arg(dirs[0].path()).output().unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("status: interrupted"), "{shown}");
    assert!(
        shown.contains("proposer errors: ") && shown.contains("command `false` failed"),
        "{shown}"
    );
}

/// How a misbehaving server answers one request: a status and a JSON body (with `retry-after:
/// 0`, so the client's retries do not wait), or nothing at all (the connection stays open).
#[derive(Clone, Copy)]
enum Answer {
    Status(u16, &'static str),
    Hang,
}

/// A server answering GETs (the check before a run) with `get` and POSTs (calls) with `post`.
fn misbehaving_server(get: Answer, post: Answer) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            thread::spawn(move || {
                let Ok(mut writer) = stream.try_clone() else {
                    return;
                };
                let mut reader = BufReader::new(stream);
                let mut request = String::new();
                let mut line = String::new();
                let mut len = 0usize;
                while reader.read_line(&mut line).unwrap_or(0) > 0 && line.trim_end() != "" {
                    if request.is_empty() {
                        request = line.clone();
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    line.clear();
                }
                let mut body = vec![0u8; len];
                let _ = reader.read_exact(&mut body);
                let answer = if request.starts_with("GET ") {
                    get
                } else {
                    post
                };
                match answer {
                    Answer::Hang => thread::sleep(Duration::from_secs(120)),
                    Answer::Status(status, text) => {
                        let _ = write!(
                            writer,
                            "HTTP/1.1 {status} Scripted\r\ncontent-type: application/json\r\nretry-after: 0\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                            text.len()
                        );
                    }
                }
            });
        }
    });
    format!("http://{addr}/v1")
}

const MODELS: &str = r#"{"object": "list", "data": [{"id": "m", "object": "model"}]}"#;
const BAD_KEY: &str =
    r#"{"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}"#;

/// A provider that cannot be used stops `ksearch run` before the seed is evaluated: status 2
/// within seconds, the cause on screen, and no run left behind.
#[test]
fn an_unusable_provider_fails_the_run_at_once_and_leaves_no_run() {
    let tmp = tempfile::tempdir().unwrap();
    let refusing = misbehaving_server(Answer::Status(401, BAD_KEY), Answer::Status(401, BAD_KEY));
    let silent = misbehaving_server(Answer::Hang, Answer::Hang);
    let cases: Vec<(Vec<&str>, &[&str])> = vec![
        (
            vec![
                "--proposer",
                "openai",
                "--model",
                "m",
                "--base-url",
                "http://127.0.0.1:9/v1",
            ],
            &["connection failed", "--base-url"],
        ),
        (
            vec![
                "--proposer",
                "openai",
                "--model",
                "m",
                "--base-url",
                &refusing,
            ],
            &["HTTP 401", "Incorrect API key", "is OPENAI_API_KEY set?"],
        ),
        (
            vec![
                "--proposer",
                "openai",
                "--model",
                "m",
                "--base-url",
                &silent,
            ],
            &["no reply within 8s", "that the server is up"],
        ),
        (
            vec![
                "--proposer",
                "command",
                "--command",
                "/nonexistent/agent --flag",
            ],
            &["`/nonexistent/agent` is not an executable file"],
        ),
        (
            vec![
                "--proposer",
                "command",
                "--command",
                "no-such-agent-program",
            ],
            &["`no-such-agent-program` is not an executable file on PATH"],
        ),
    ];
    for (i, (args, needles)) in cases.iter().enumerate() {
        let runs = tmp.path().join(format!("runs{i}"));
        let started = Instant::now();
        let out = softmax_cpu_run("3", &runs)
            .args(args)
            .env_remove("OPENAI_API_KEY")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(started.elapsed() < Duration::from_secs(10), "{args:?}");
        for needle in *needles {
            assert!(err.contains(needle), "{args:?}: no {needle:?} in {err}");
        }
        let left: Vec<_> = std::fs::read_dir(&runs)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
}

/// A server that passes the check but fails every call (500s, retried at once as its
/// `retry-after: 0` allows) stops the run after three failed calls in a row: status 3, the
/// server's message on screen, the run kept for `resume`.
#[test]
fn a_server_failing_every_call_stops_the_run_with_status_3() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let failing = misbehaving_server(
        Answer::Status(200, MODELS),
        Answer::Status(500, r#"{"error": {"message": "the model is overloaded"}}"#),
    );
    let out = softmax_cpu_run("10", &runs)
        .args(["--timing", "quick", "--no-recheck", "--confirm-rounds", "0"])
        .args([
            "--proposer",
            "openai",
            "--model",
            "m",
            "--base-url",
            &failing,
        ])
        .args(["--api-key-env", ""])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("failed 3 times in a row"), "{err}");
    assert!(
        err.contains("HTTP 500") && err.contains("the model is overloaded"),
        "{err}"
    );
    assert!(err.contains("ksearch resume"), "{err}");
    assert_eq!(std::fs::read_dir(&runs).unwrap().count(), 1);
}

/// A strict replay whose transcript does not match the run's calls fails each call with the
/// mismatch named, and stops the run like any provider that keeps failing (status 3); a
/// transcript that is not there is a set-up error (status 2, no run left).
#[test]
fn a_strict_replay_that_does_not_match_stops_the_run_with_status_3() {
    let tmp = tempfile::tempdir().unwrap();
    let transcript = tmp.path().join("other-run.jsonl");
    let record = |seq: u64| {
        json!({"seq": seq, "role_tag": "wm-init", "request_hash": format!("{seq:064x}"),
               "provider": "openai", "model": "m", "text": "{}",
               "usage": {"input_tokens": 1, "output_tokens": 1}, "cost_usd": 0.0})
        .to_string()
    };
    std::fs::write(
        &transcript,
        (0..8).map(record).collect::<Vec<_>>().join("\n") + "\n",
    )
    .unwrap();
    let runs = tmp.path().join("runs");
    let out = softmax_cpu_run("10", &runs)
        .args(["--timing", "quick", "--no-recheck", "--confirm-rounds", "0"])
        .args([
            "--proposer",
            "replay",
            "--replay-mode",
            "strict",
            "--transcript",
        ])
        .arg(&transcript)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("does not match the transcript"), "{err}");
    assert_eq!(std::fs::read_dir(&runs).unwrap().count(), 1);

    let missing = tmp.path().join("runs-missing");
    let out = softmax_cpu_run("10", &missing)
        .args(["--proposer", "replay", "--transcript"])
        .arg(tmp.path().join("no-such.jsonl"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no-such.jsonl"), "{err}");
    assert_eq!(std::fs::read_dir(&missing).map_or(0, |d| d.count()), 0);
}

#[test]
fn llm_options_are_checked_before_a_run_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    for (args, needle) in [
        (vec!["--proposer", "openai"], "needs --model"),
        (vec!["--proposer", "replay"], "needs --transcript"),
        (vec!["--proposer", "command"], "needs --command"),
        (
            vec!["--proposer", "openai", "--model", "m", "--context", "most"],
            "none, spec, full",
        ),
    ] {
        let out = softmax_cpu_run("1", &runs).args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        // A run whose set-up failed is not left behind as resumable.
        let left = std::fs::read_dir(&runs).map_or(0, |d| d.count());
        assert_eq!(left, 0, "{args:?}");
    }
}

#[test]
fn knowledge_show_prints_the_prompt_section_of_every_target() {
    for (target, needle) in [
        ("cpu", "Generic x86-64 CPU"),
        ("cuda", "NVIDIA H100"),
        ("metal", "threadgroup_barrier(mem_flags::mem_threadgroup)"),
        ("mlx-metal", "grid counts threads"),
        ("mlx-cuda", "grid counts threads"),
    ] {
        let out = ksearch()
            .args(["knowledge", "show", "--target", target])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{target}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("## Knowledge for"), "{target}: {text}");
        assert!(text.contains(needle), "{target}: {text}");
    }
    // From a task: its kind selects the patterns and assertions.
    let out = ksearch()
        .args([
            "knowledge",
            "show",
            "--task",
            "selective-scan",
            "--target",
            "metal",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "selective-scan");
    assert!(v["patterns"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["id"] == "scan-combine-in-order"));
    let out = ksearch()
        .args(["knowledge", "show", "--target", "tpu"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("mlx-cuda"));
}

#[test]
fn knowledge_lint_flags_cuda_in_c() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.c");
    std::fs::write(&bad, kernel_cuda_in_c()).unwrap();
    let good = tmp.path().join("good.c");
    std::fs::write(&good, SEED).unwrap();
    let out = ksearch()
        .args(["knowledge", "lint", "--target", "cpu"])
        .arg(&good)
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("good.c: clean"), "{text}");
    assert!(text.contains("error [gpu-identifiers-in-c]"), "{text}");
    assert!(text.contains("__syncthreads"), "{text}");
}
