//! Test helpers: a scripted HTTP/1.1 server on 127.0.0.1 and small builders.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use ksearch_llm::{Budget, ClientConfig, PriceTable, RetryPolicy};

/// One scripted answer. `{{AUTH}}` in the body is replaced by the request's
/// credentials header (`authorization` or `x-api-key`), to imitate servers
/// that echo the key they rejected.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub delay: Duration,
}

impl Reply {
    pub fn new(status: u16, body: impl Into<String>) -> Self {
        Reply {
            status,
            headers: Vec::new(),
            body: body.into(),
            delay: Duration::ZERO,
        }
    }
    pub fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.to_string(), v.to_string()));
        self
    }
    pub fn delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
}

/// A chat-completions success with exact usage.
pub fn chat_ok(text: &str, prompt_tokens: u64, completion_tokens: u64) -> Reply {
    let body = serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "test-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens}
    });
    Reply::new(200, body.to_string())
}

/// An Anthropic Messages success with exact usage.
pub fn message_ok(text: &str, input_tokens: u64, output_tokens: u64) -> Reply {
    let body = serde_json::json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}
    });
    Reply::new(200, body.to_string())
}

#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Lower-cased names.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).expect("request body is JSON")
    }
}

struct State {
    script: Mutex<VecDeque<Reply>>,
    fallback: Mutex<Option<Reply>>,
    seen: Mutex<Vec<Seen>>,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
}

/// Answers requests with the scripted replies in order (then the fallback,
/// or a 599 "script exhausted"). Counts requests in flight: from the moment
/// a request is fully read until its reply starts being written.
pub struct ScriptedServer {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Arc<AtomicBool>,
}

impl ScriptedServer {
    pub fn start(script: Vec<Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            script: Mutex::new(script.into()),
            fallback: Mutex::new(None),
            seen: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        thread::spawn(move || {
            for conn in listener.incoming() {
                if sp.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let st = st.clone();
                thread::spawn(move || serve_connection(conn, st));
            }
        });
        ScriptedServer { addr, state, stop }
    }

    /// Every request past the script gets this reply.
    pub fn with_fallback(self, reply: Reply) -> Self {
        *self.state.fallback.lock().unwrap() = Some(reply);
        self
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn root_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    pub fn request_count(&self) -> usize {
        self.state.seen.lock().unwrap().len()
    }

    pub fn peak_in_flight(&self) -> usize {
        self.state.peak.load(Ordering::SeqCst)
    }

    pub fn script_left(&self) -> usize {
        self.state.script.lock().unwrap().len()
    }
}

impl Drop for ScriptedServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn serve_connection(stream: TcpStream, st: Arc<State>) {
    // Idle keep-alive connections must not pin a thread forever.
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        match reader.read_line(&mut request_line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut parts = request_line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let len = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let auth = headers
            .iter()
            .find(|(k, _)| k == "authorization" || k == "x-api-key")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        st.seen.lock().unwrap().push(Seen {
            method,
            path,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        });
        let now = st.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        st.peak.fetch_max(now, Ordering::SeqCst);
        let reply = st.script.lock().unwrap().pop_front();
        let reply = reply
            .or_else(|| st.fallback.lock().unwrap().clone())
            .unwrap_or_else(|| Reply::new(599, "script exhausted"));
        thread::sleep(reply.delay);
        st.in_flight.fetch_sub(1, Ordering::SeqCst);
        let body = reply.body.replace("{{AUTH}}", &auth);
        let mut out = format!(
            "HTTP/1.1 {} Scripted\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
            reply.status,
            body.len()
        );
        for (k, v) in &reply.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        out.push_str(&body);
        if writer.write_all(out.as_bytes()).is_err() || writer.flush().is_err() {
            return;
        }
    }
}

/// Prices used by the tests: $2 / $8 per million input / output tokens.
pub fn test_prices() -> PriceTable {
    PriceTable::from_toml_str(
        r#"
        [models]
        "test-model" = { input = 2.0, output = 8.0 }
        "claude-test*" = { input = 3.0, output = 15.0 }
        "#,
        "tests",
    )
    .unwrap()
}

/// Fast retries so that tests do not sleep on backoff.
pub fn fast_config() -> ClientConfig {
    ClientConfig {
        retry: RetryPolicy {
            max_attempts: 6,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
            max_retry_after: Duration::from_secs(5),
        },
        max_in_flight: 4,
        budget: Budget::default(),
        cache_dir: None,
        prices: test_prices(),
    }
}
