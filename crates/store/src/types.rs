//! The typed values that go in and come out of the store.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;

use crate::SourceId;

/// What a run was started with; stored once at creation and returned unchanged on open, so a
/// resumed run uses the same task, seeds and budgets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    pub task: String,
    pub backend: String,
    pub strategy: String,
    pub proposer: String,
    pub selection: String,
    /// Seeds the search's own choices (selection, offline proposer).
    pub seed: u64,
    /// Derives the harness trial seeds; reaches the harness only on stdin.
    pub secret_seed: u64,
    #[serde(default)]
    pub budgets: Value,
    #[serde(default)]
    pub flags: Value,
    /// Anything else the caller wants to keep with the run.
    #[serde(default)]
    pub extra: Value,
    /// Set by [`crate::RunStore::create`] (RFC 3339, UTC).
    #[serde(default)]
    pub created_at: String,
    /// Filled with this crate's version by `create` when left empty.
    #[serde(default)]
    pub ksearch_version: String,
}

/// Why a candidate exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CandidateKind {
    /// A task's seed kernel.
    Seed,
    /// A proposal by the search.
    Attempt,
    /// A winner evaluated again in a fresh process with fresh seeds.
    Recheck,
}

impl CandidateKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CandidateKind::Seed => "seed",
            CandidateKind::Attempt => "attempt",
            CandidateKind::Recheck => "recheck",
        }
    }

    pub fn parse(s: &str) -> Option<CandidateKind> {
        match s {
            "seed" => Some(CandidateKind::Seed),
            "attempt" => Some(CandidateKind::Attempt),
            "recheck" => Some(CandidateKind::Recheck),
            _ => None,
        }
    }
}

/// A candidate to insert; its source must already be stored with `put_source`.
#[derive(Debug, Clone, PartialEq)]
pub struct NewCandidate {
    pub source_id: SourceId,
    pub parent_candidate: Option<i64>,
    pub node_id: Option<String>,
    pub round: u32,
    pub cycle: u32,
    pub attempt: u32,
    /// Index of the candidate among the samples drawn for one attempt.
    pub sample: u32,
    pub kind: CandidateKind,
    pub proposer_note: String,
    pub knobs: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CandidateRow {
    pub id: i64,
    pub source_id: SourceId,
    pub parent_candidate: Option<i64>,
    pub node_id: Option<String>,
    pub round: u32,
    pub cycle: u32,
    pub attempt: u32,
    /// Index of the candidate among the samples drawn for one attempt.
    pub sample: u32,
    pub kind: CandidateKind,
    pub proposer_note: String,
    pub knobs: Value,
    pub created_at: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvaluationRow {
    pub id: i64,
    pub candidate_id: i64,
    pub status: String,
    pub score: Option<f64>,
    /// The harness result JSON, as given.
    pub result: Value,
    pub created_at: String,
}

/// One LLM call, as the proposer made it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    pub role: String,
    pub prompt: String,
    pub response: String,
    pub model: String,
    pub provider: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
    pub latency_ms: u64,
    pub error: Option<String>,
    /// Answered from the response cache, not by the provider.
    pub cached: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExchangeRow {
    pub id: i64,
    #[serde(flatten)]
    pub exchange: Exchange,
    pub created_at: String,
}

/// The proposer calls of a run that ended in an error, and the last of them (what `show`
/// prints when a run stopped because its provider could not be used).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailedCalls {
    pub count: u64,
    pub last_role: String,
    pub last_error: String,
    pub last_at: String,
}

/// Sums over all recorded exchanges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Usage {
    /// Every recorded call, cached ones included.
    pub calls: u64,
    /// Calls answered from the cache (their tokens and cost are whatever was recorded, normally 0).
    pub cached_calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
    /// The recorded latencies summed, cached calls included (milliseconds).
    pub latency_ms: u64,
}

/// When a run started, finished, and last recorded anything: the bounds of its wall time.
/// Stamps are RFC 3339 UTC as the store writes them ([`crate::timestamp_millis`] reads them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunSpan {
    /// The run row's creation (the first start; a resumed run keeps it).
    pub started_at: String,
    /// Set while the run is finished.
    pub finished_at: Option<String>,
    /// The latest stamp of any candidate, evaluation, exchange or event; `None` in an empty run.
    pub last_record_at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventRow {
    pub id: i64,
    pub at: String,
    pub kind: String,
    pub data: Value,
}

/// One line of `ksearch runs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    pub id: String,
    pub dir: PathBuf,
    /// `None` when `error` is set.
    pub config: Option<RunConfig>,
    pub finished: bool,
    pub candidates: u64,
    pub evaluations: u64,
    pub best_score: Option<f64>,
    /// Set when the directory holds a `ksearch.db` that could not be read; the run is still
    /// listed so that it is not silently hidden.
    pub error: Option<String>,
}
