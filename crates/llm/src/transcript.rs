//! Recorded transcripts: [`Recorder`] writes one JSON line per exchange,
//! [`ReplayProvider`] answers from such a file without any network.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{ChatProvider, ChatRequest, ChatResponse, LlmError, Usage};

/// One exchange in a transcript file (one JSON object per line).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TranscriptRecord {
    /// 0-based position in the file.
    pub seq: u64,
    pub role_tag: String,
    /// [`ChatRequest::hash`] of the request.
    pub request_hash: String,
    pub provider: String,
    pub model: String,
    pub text: String,
    pub usage: Usage,
    pub cost_usd: f64,
    #[serde(default)]
    pub latency_ms: u64,
    #[serde(default)]
    pub cached: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// The request itself, for people reading the file; replay uses only
    /// `request_hash` and `role_tag`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<ChatRequest>,
}

/// Reads every record of a transcript; blank lines are skipped.
pub fn read_transcript(path: &Path) -> Result<Vec<TranscriptRecord>, LlmError> {
    let file = File::open(path)
        .map_err(|e| LlmError::io(format!("opening transcript {}", path.display()), e))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line =
            line.map_err(|e| LlmError::io(format!("reading transcript {}", path.display()), e))?;
        if line.trim().is_empty() {
            continue;
        }
        let rec: TranscriptRecord = serde_json::from_str(&line).map_err(|e| LlmError::Replay {
            message: format!("{}:{}: not a transcript record: {e}", path.display(), i + 1),
        })?;
        out.push(rec);
    }
    Ok(out)
}

/// Wraps a provider and appends every successful exchange to a JSONL file.
///
/// Put it outside a [`crate::Client`] (`Recorder::create(client, ..)`) to
/// record final costs and cache hits, so the file replays a whole run.
pub struct Recorder<P> {
    inner: P,
    path: PathBuf,
    include_requests: bool,
    /// The file and the next sequence number, under one lock so that
    /// concurrent calls write whole lines with distinct numbers.
    out: Mutex<(File, u64)>,
}

impl<P: ChatProvider> Recorder<P> {
    /// Opens (or creates) `path` for appending; numbering continues after
    /// the records already there.
    pub fn create(inner: P, path: impl Into<PathBuf>) -> Result<Self, LlmError> {
        let path = path.into();
        let existing = if path.exists() {
            read_transcript(&path)?.len() as u64
        } else {
            0
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| LlmError::io(format!("creating {}", dir.display()), e))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| LlmError::io(format!("opening transcript {}", path.display()), e))?;
        Ok(Recorder {
            inner,
            path,
            include_requests: true,
            out: Mutex::new((file, existing)),
        })
    }

    /// Leaves the prompts out of the file (hashes and replies only).
    pub fn without_requests(mut self) -> Self {
        self.include_requests = false;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn inner(&self) -> &P {
        &self.inner
    }
}

impl<P: ChatProvider> ChatProvider for Recorder<P> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn model(&self) -> &str {
        self.inner.model()
    }

    fn prices_responses(&self) -> bool {
        self.inner.prices_responses()
    }

    fn complete(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let resp = self.inner.complete(req)?;
        let mut guard = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let (file, seq) = &mut *guard;
        let rec = TranscriptRecord {
            seq: *seq,
            role_tag: req.role_tag.clone(),
            request_hash: req.hash(),
            provider: self.inner.name().to_string(),
            model: resp.model.clone(),
            text: resp.text.clone(),
            usage: resp.usage,
            cost_usd: resp.cost_usd,
            latency_ms: resp.latency_ms,
            cached: resp.cached,
            stop_reason: resp.stop_reason.clone(),
            request: self.include_requests.then(|| req.clone()),
        };
        let mut line = serde_json::to_string(&rec)
            .map_err(|e| LlmError::Config(format!("cannot encode transcript record: {e}")))?;
        line.push('\n');
        file.write_all(line.as_bytes())
            .and_then(|()| file.flush())
            .map_err(|e| LlmError::io(format!("writing transcript {}", self.path.display()), e))?;
        *seq += 1;
        Ok(resp)
    }
}

/// How a replay picks the record that answers a call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayMode {
    /// Records are used in file order and each request's hash must equal the
    /// record's: any change in prompts or call order is an error.
    #[default]
    Strict,
    /// The next unused record with the same `role_tag` answers, whatever the
    /// prompt: for replaying a run after prompt edits.
    Lenient,
}

struct ReplayState {
    next: usize,
    by_role: HashMap<String, VecDeque<usize>>,
    used: usize,
}

/// Answers from a transcript. Replies carry the recorded usage and cost, so
/// accounting of a replayed run matches the original.
pub struct ReplayProvider {
    records: Vec<TranscriptRecord>,
    mode: ReplayMode,
    model: String,
    state: Mutex<ReplayState>,
    delay: Duration,
}

impl ReplayProvider {
    pub fn open(path: &Path, mode: ReplayMode) -> Result<Self, LlmError> {
        Ok(Self::from_records(read_transcript(path)?, mode))
    }

    pub fn from_records(records: Vec<TranscriptRecord>, mode: ReplayMode) -> Self {
        let mut by_role: HashMap<String, VecDeque<usize>> = HashMap::new();
        for (i, r) in records.iter().enumerate() {
            by_role.entry(r.role_tag.clone()).or_default().push_back(i);
        }
        let model = records
            .first()
            .map_or_else(|| "replay".to_string(), |r| r.model.clone());
        ReplayProvider {
            records,
            mode,
            model,
            state: Mutex::new(ReplayState {
                next: 0,
                by_role,
                used: 0,
            }),
            delay: Duration::ZERO,
        }
    }

    /// Every reply waits `delay` before it is given, as a model endpoint's latency would
    /// (concurrent calls wait side by side): for measuring how a search uses its evaluator
    /// while the proposer is slow.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Records not yet used.
    pub fn remaining(&self) -> usize {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.records.len() - st.used
    }

    fn answer(&self, rec: &TranscriptRecord) -> ChatResponse {
        ChatResponse {
            text: rec.text.clone(),
            model: rec.model.clone(),
            usage: rec.usage,
            cost_usd: rec.cost_usd,
            latency_ms: self.delay.as_millis() as u64,
            cached: false,
            attempts: 1,
            stop_reason: rec.stop_reason.clone(),
        }
    }
}

impl ChatProvider for ReplayProvider {
    fn name(&self) -> &str {
        "replay"
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn prices_responses(&self) -> bool {
        true
    }

    fn complete(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let idx = self.pick(req)?;
        // Outside the lock: concurrent calls wait together, as they would for an endpoint.
        std::thread::sleep(self.delay);
        Ok(self.answer(&self.records[idx]))
    }
}

impl ReplayProvider {
    /// The index of the record that answers `req`, marked used.
    fn pick(&self, req: &ChatRequest) -> Result<usize, LlmError> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match self.mode {
            ReplayMode::Strict => {
                let idx = st.next;
                let rec = self.records.get(idx).ok_or_else(|| LlmError::Replay {
                    message: format!(
                        "transcript exhausted: call #{idx} (role {:?}) has no record",
                        req.role_tag
                    ),
                })?;
                let hash = req.hash();
                if rec.request_hash != hash || rec.role_tag != req.role_tag {
                    return Err(LlmError::Replay {
                        message: format!(
                            "call #{idx} does not match the transcript: recorded role {:?} hash {}, got role {:?} hash {}",
                            rec.role_tag,
                            short(&rec.request_hash),
                            req.role_tag,
                            short(&hash)
                        ),
                    });
                }
                st.next += 1;
                st.used += 1;
                Ok(idx)
            }
            ReplayMode::Lenient => {
                let idx = st
                    .by_role
                    .get_mut(&req.role_tag)
                    .and_then(VecDeque::pop_front)
                    .ok_or_else(|| LlmError::Replay {
                        message: format!("no record left for role {:?}", req.role_tag),
                    })?;
                st.used += 1;
                Ok(idx)
            }
        }
    }
}

fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}
