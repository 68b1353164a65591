//! ksearch-store: the run store.
//!
//! A search run lives in `runs/<id>/`: `ksearch.db` (SQLite in WAL mode) holds the run config,
//! candidates, evaluations, world-model snapshots, LLM exchanges, engine checkpoints and events;
//! `sources/<blake3>.<ext>` holds candidate sources, content-addressed; `report.html` comes later.
//! The crate owns persistence and resume queries only, never search policy: values it does not
//! interpret (evaluation results, knobs, world models) are stored as JSON.
//!
//! Durability: every write is one SQLite transaction, and a source file is renamed into place
//! (and synced) before any row that references it commits, so a `kill -9` at any moment leaves a
//! consistent store in which everything the engine saw committed is present.
//! `docs/run-store.md` describes the layout and the choices.

mod clock;
mod error;
mod schema;
mod sources;
mod store;
mod types;

pub use clock::timestamp_millis;
pub use error::StoreError;
pub use schema::SCHEMA_VERSION;
pub use sources::SourceId;
pub use store::{RunLock, RunStore, Writer, DB_FILE, REPORT_FILE, SOURCES_DIR, WRITER_LOCK_FILE};
pub use types::{
    CandidateKind, CandidateRow, EvaluationRow, EventRow, Exchange, ExchangeRow, FailedCalls,
    NewCandidate, RunConfig, RunSpan, RunSummary, Usage,
};
