//! Schema and migrations. `PRAGMA user_version` records how many migrations a database has had;
//! opening a run applies the missing ones, so an old run can be resumed by a newer ksearch.

use rusqlite::Transaction;
use std::path::Path;

use crate::StoreError;

/// Migration `i` (0-based) takes a database from version `i` to `i + 1`. Append only: a shipped
/// migration is never edited, since existing runs have already applied it.
const MIGRATIONS: &[&str] = &[
    // v1
    r#"
CREATE TABLE run (
    id           TEXT PRIMARY KEY,
    created_at   TEXT NOT NULL,
    config_json  TEXT NOT NULL,
    finished_at  TEXT,
    summary_json TEXT
);

CREATE TABLE sources (
    id         TEXT PRIMARY KEY,          -- blake3 hex of the source text
    ext        TEXT NOT NULL,
    bytes      INTEGER NOT NULL,
    created_at TEXT NOT NULL
);

CREATE TABLE candidates (
    id               INTEGER PRIMARY KEY,
    source_id        TEXT NOT NULL REFERENCES sources(id),
    parent_candidate INTEGER REFERENCES candidates(id),
    node_id          TEXT,
    round            INTEGER NOT NULL,
    cycle            INTEGER NOT NULL,
    attempt          INTEGER NOT NULL,
    sample           INTEGER NOT NULL DEFAULT 0,   -- index inside the attempt (--samples K)
    kind             TEXT NOT NULL CHECK (kind IN ('seed', 'attempt', 'recheck')),
    proposer_note    TEXT NOT NULL,
    knobs_json       TEXT NOT NULL,
    created_at       TEXT NOT NULL
);
CREATE INDEX candidates_by_source ON candidates(source_id);
CREATE INDEX candidates_by_parent ON candidates(parent_candidate);
CREATE INDEX candidates_by_node   ON candidates(node_id);

CREATE TABLE evaluations (
    id           INTEGER PRIMARY KEY,
    candidate_id INTEGER NOT NULL REFERENCES candidates(id),
    status       TEXT NOT NULL,
    score        REAL,
    result_json  TEXT NOT NULL,
    created_at   TEXT NOT NULL
);
CREATE INDEX evaluations_by_candidate ON evaluations(candidate_id);
CREATE INDEX evaluations_by_status_score ON evaluations(status, score);

CREATE TABLE world_models (
    round      INTEGER NOT NULL,
    cycle      INTEGER NOT NULL,
    wm_json    TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (round, cycle)
);

-- Prompts and responses repeat (system prompts, cached answers): stored once by blake3.
CREATE TABLE texts (
    hash TEXT PRIMARY KEY,
    body TEXT NOT NULL
);

CREATE TABLE exchanges (
    id            INTEGER PRIMARY KEY,
    role          TEXT NOT NULL,
    prompt_hash   TEXT NOT NULL REFERENCES texts(hash),
    response_hash TEXT NOT NULL REFERENCES texts(hash),
    model         TEXT NOT NULL,
    provider      TEXT NOT NULL,
    input_tokens  INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cost_usd      REAL NOT NULL,
    latency_ms    INTEGER NOT NULL,
    error         TEXT,
    cached        INTEGER NOT NULL,
    created_at    TEXT NOT NULL
);

CREATE TABLE state (
    key        TEXT PRIMARY KEY,
    value_json TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE TABLE events (
    id        INTEGER PRIMARY KEY,
    at        TEXT NOT NULL,
    kind      TEXT NOT NULL,
    data_json TEXT NOT NULL
);
CREATE INDEX events_by_kind ON events(kind);
"#,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

pub(crate) fn user_version(conn: &rusqlite::Connection) -> Result<i64, StoreError> {
    Ok(conn.pragma_query_value(None, "user_version", |r| r.get(0))?)
}

/// Brings the database up to `SCHEMA_VERSION` inside the caller's transaction, so a crash
/// mid-migration leaves the previous version intact.
pub(crate) fn migrate(tx: &Transaction<'_>, path: &Path) -> Result<(), StoreError> {
    let found = user_version(tx)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            path: path.to_path_buf(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(found.max(0) as usize) {
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", i as i64 + 1)?;
    }
    Ok(())
}
