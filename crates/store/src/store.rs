//! `RunStore`: one run directory and its database connection.

use rusqlite::{
    params, Connection, OpenFlags, OptionalExtension, Transaction, TransactionBehavior,
};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use crate::clock::{self, now_rfc3339};
use crate::schema::{self, SCHEMA_VERSION};
use crate::sources::{self, SourceId};
use crate::types::*;
use crate::StoreError;

pub const DB_FILE: &str = "ksearch.db";
pub const SOURCES_DIR: &str = "sources";
pub const REPORT_FILE: &str = "report.html";
/// The file whose lock marks the process writing a run ([`RunStore::lock_writer`]).
pub const WRITER_LOCK_FILE: &str = "writer.lock";

/// Held by the one process that writes a run (`ksearch run`, `ksearch resume`): an exclusive
/// advisory lock (flock) on [`WRITER_LOCK_FILE`], which the kernel drops when the holder exits
/// or dies, so a killed run is never left locked. Dropping it unlocks.
#[derive(Debug)]
pub struct RunLock {
    _file: std::fs::File,
}

/// The process holding a run's [`RunLock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Writer {
    /// Its pid, as it wrote it into the lock file (`None` if unreadable).
    pub pid: Option<u32>,
}

/// Long enough for a `show` or `list` to wait out a writer's commit (milliseconds) and for the
/// writer to wait out a reader's checkpoint-blocking snapshot, short enough to report a stuck
/// lock instead of hanging.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// A run directory opened for reading and writing.
///
/// Every method is one SQLite transaction at most, so a caller that sees `Ok` knows the write
/// survives a crash of this process. The connection is `Send` but not `Sync`: the engine keeps
/// one writer (behind a mutex or a channel) as the design prescribes.
#[derive(Debug)]
pub struct RunStore {
    id: String,
    dir: PathBuf,
    config: RunConfig,
    conn: Connection,
}

impl RunStore {
    /// Creates `runs_dir/<new id>/` with an id like `20261130-091500-3f2a` (UTC time, then four
    /// random hex digits), so ids sort by creation time.
    pub fn create(runs_dir: &Path, config: &RunConfig) -> Result<RunStore, StoreError> {
        let now = clock::Utc::now();
        let id = format!("{}-{}", now.id_stamp(), clock::id_suffix());
        Self::create_with_id(runs_dir, &id, config)
    }

    /// Creates `runs_dir/<id>/`; fails with [`StoreError::RunExists`] if it is already there.
    /// `config.created_at` is set to now; an empty `ksearch_version` becomes this crate's version.
    pub fn create_with_id(
        runs_dir: &Path,
        id: &str,
        config: &RunConfig,
    ) -> Result<RunStore, StoreError> {
        check_run_id(id)?;
        std::fs::create_dir_all(runs_dir).map_err(|e| StoreError::io(runs_dir, e))?;
        let dir = runs_dir.join(id);
        // create_dir (not _all) is the atomic "is this id free" test.
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(StoreError::RunExists(dir))
            }
            Err(e) => return Err(StoreError::io(&dir, e)),
        }
        let sources_dir = dir.join(SOURCES_DIR);
        std::fs::create_dir(&sources_dir).map_err(|e| StoreError::io(&sources_dir, e))?;

        let mut config = config.clone();
        config.created_at = now_rfc3339();
        if config.ksearch_version.is_empty() {
            config.ksearch_version = env!("CARGO_PKG_VERSION").to_string();
        }
        let db_path = dir.join(DB_FILE);
        let conn = connect(&db_path, true)?;
        // Schema and run row commit together: a database either is a run or is empty.
        let tx = write_tx(&conn)?;
        schema::migrate(&tx, &db_path)?;
        tx.execute(
            "INSERT INTO run (id, created_at, config_json) VALUES (?1, ?2, ?3)",
            params![id, config.created_at, serde_json::to_string(&config)?],
        )?;
        tx.commit()?;
        Ok(RunStore {
            id: id.to_string(),
            dir,
            config,
            conn,
        })
    }

    /// Deletes a run that never got going (its set-up failed after the directory was made),
    /// so no half-made run is left for `show` to list or `resume` to fail on again. The
    /// connection closes first; `lock` (the caller's writer lock, if taken) is released with
    /// the directory's removal.
    pub fn discard(self, lock: Option<RunLock>) -> Result<(), StoreError> {
        let dir = self.dir.clone();
        drop(self.conn);
        drop(lock);
        std::fs::remove_dir_all(&dir).map_err(|e| StoreError::io(&dir, e))
    }

    /// Takes the run's writer lock, so no second `run` or `resume` writes into it at the same
    /// time; fails at once with [`StoreError::RunBusy`] (naming the holder's pid) if another
    /// process holds it. The lock lasts as long as the returned guard.
    pub fn lock_writer(&self) -> Result<RunLock, StoreError> {
        use std::io::{Seek, Write};
        let path = self.dir.join(WRITER_LOCK_FILE);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| StoreError::io(&path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::RunBusy {
                    dir: self.dir.clone(),
                    holder: read_pid(&mut file),
                })
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(StoreError::io(&path, e)),
        }
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| write!(file, "{}", std::process::id()))
            .and_then(|()| file.flush())
            .map_err(|e| StoreError::io(&path, e))?;
        Ok(RunLock { _file: file })
    }

    /// The process writing this run now, if any. (It peeks with a shared lock for an instant;
    /// a writer starting in that instant is refused as busy.)
    pub fn writer(&self) -> Result<Option<Writer>, StoreError> {
        let path = self.dir.join(WRITER_LOCK_FILE);
        let mut file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io(&path, e)),
        };
        match file.try_lock_shared() {
            Ok(()) => Ok(None),
            Err(std::fs::TryLockError::WouldBlock) => Ok(Some(Writer {
                pid: read_pid(&mut file),
            })),
            Err(std::fs::TryLockError::Error(e)) => Err(StoreError::io(&path, e)),
        }
    }

    /// Opens a run from its directory, its `ksearch.db`, or a bare id under `./runs/`.
    /// Applies pending schema migrations.
    pub fn open(run_dir_or_id: &Path) -> Result<RunStore, StoreError> {
        let p = run_dir_or_id;
        if p.join(DB_FILE).is_file() {
            return Self::open_dir(p);
        }
        if p.file_name().is_some_and(|n| n == DB_FILE) && p.is_file() {
            let parent = p.parent().unwrap_or(Path::new("."));
            return Self::open_dir(parent);
        }
        let mut comps = p.components();
        if let (Some(Component::Normal(_)), None) = (comps.next(), comps.next()) {
            let candidate = Path::new("runs").join(p);
            if candidate.join(DB_FILE).is_file() {
                return Self::open_dir(&candidate);
            }
        }
        Err(StoreError::RunNotFound(p.to_path_buf()))
    }

    /// Opens a run as the commands name it: a run directory (or its `ksearch.db`), else an id
    /// or unique id prefix under `runs_dir` ([`RunStore::open_in`]).
    pub fn open_ref(runs_dir: &Path, run: &str) -> Result<RunStore, StoreError> {
        if Path::new(run).is_dir() {
            Self::open(Path::new(run))
        } else {
            Self::open_in(runs_dir, run)
        }
    }

    /// Opens `runs_dir/<id>`, or the single run whose id starts with `id` (so `show 20261130-09`
    /// works); an existing directory path is opened as is.
    pub fn open_in(runs_dir: &Path, id: &str) -> Result<RunStore, StoreError> {
        let as_path = Path::new(id);
        if as_path.join(DB_FILE).is_file() {
            return Self::open_dir(as_path);
        }
        check_run_id(id)?;
        let exact = runs_dir.join(id);
        if exact.join(DB_FILE).is_file() {
            return Self::open_dir(&exact);
        }
        let matches: Vec<String> = run_dirs(runs_dir)?
            .into_iter()
            .filter(|(name, _)| name.starts_with(id))
            .map(|(name, _)| name)
            .collect();
        match matches.as_slice() {
            [one] => Self::open_dir(&runs_dir.join(one)),
            [] => Err(StoreError::RunNotFound(exact)),
            many => Err(StoreError::AmbiguousRun(id.to_string(), many.join(", "))),
        }
    }

    fn open_dir(dir: &Path) -> Result<RunStore, StoreError> {
        let db_path = dir.join(DB_FILE);
        let conn = connect(&db_path, false)?;
        // Only take the write lock when there is something to migrate, so opening a live run
        // for `show` never waits on the writer.
        if schema::user_version(&conn)? != SCHEMA_VERSION {
            let tx = write_tx(&conn)?;
            schema::migrate(&tx, &db_path)?;
            tx.commit()?;
        }
        let (id, config) = read_run_row(&conn, &db_path)?;
        Ok(RunStore {
            id,
            dir: dir.to_path_buf(),
            config,
            conn,
        })
    }

    /// Every run under `runs_dir`, oldest first. A directory without `ksearch.db` is not a run
    /// (for example one whose creation was interrupted) and is skipped; a database that cannot be
    /// read is listed with `error` set. Databases are opened read-only and never migrated.
    pub fn list(runs_dir: &Path) -> Result<Vec<RunSummary>, StoreError> {
        if !runs_dir.exists() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for (name, dir) in run_dirs(runs_dir)? {
            let summary = match summarize(&dir) {
                Ok(s) => s,
                Err(e) => RunSummary {
                    id: name,
                    dir,
                    config: None,
                    finished: false,
                    candidates: 0,
                    evaluations: 0,
                    best_score: None,
                    error: Some(e.to_string()),
                },
            };
            out.push(summary);
        }
        Ok(out)
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &RunConfig {
        &self.config
    }

    /// Where the report is to be written.
    pub fn report_path(&self) -> PathBuf {
        self.dir.join(REPORT_FILE)
    }

    // ---- sources -------------------------------------------------------------------------

    /// Stores `code` as `sources/<blake3>.<ext>` (once: identical code is deduplicated) and
    /// returns its id. The file is durable before the row naming it commits.
    pub fn put_source(&self, code: &str, ext: &str) -> Result<SourceId, StoreError> {
        sources::check_ext(ext)?;
        let id = SourceId::of(code);
        if let Some(existing) = self.source_ext(&id)? {
            if existing != ext {
                return Err(StoreError::SourceExtConflict {
                    id: id.to_string(),
                    existing,
                    requested: ext.to_string(),
                });
            }
        }
        // Written (or found) before the row: a row never names a missing file.
        sources::write_source(&self.sources_dir(), &id, ext, code)?;
        self.conn
            .prepare_cached(
                "INSERT OR IGNORE INTO sources (id, ext, bytes, created_at) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![id.as_str(), ext, code.len() as i64, now_rfc3339()])?;
        Ok(id)
    }

    /// The text of a stored source, checked against its hash.
    pub fn source(&self, id: &SourceId) -> Result<String, StoreError> {
        let path = self.source_path(id)?;
        sources::read_source(&path, id)
    }

    /// The file holding a stored source (what the evaluator hands to the harness).
    pub fn source_path(&self, id: &SourceId) -> Result<PathBuf, StoreError> {
        let ext = self
            .source_ext(id)?
            .ok_or_else(|| StoreError::SourceNotFound(id.to_string()))?;
        Ok(sources::source_path(&self.sources_dir(), id, &ext))
    }

    fn source_ext(&self, id: &SourceId) -> Result<Option<String>, StoreError> {
        Ok(self
            .conn
            .prepare_cached("SELECT ext FROM sources WHERE id = ?1")?
            .query_row([id.as_str()], |r| r.get(0))
            .optional()?)
    }

    fn sources_dir(&self) -> PathBuf {
        self.dir.join(SOURCES_DIR)
    }

    // ---- candidates and evaluations ------------------------------------------------------

    pub fn add_candidate(&self, c: &NewCandidate) -> Result<i64, StoreError> {
        let knobs = serde_json::to_string(&c.knobs)?;
        let tx = write_tx(&self.conn)?;
        if !exists(
            &tx,
            "SELECT 1 FROM sources WHERE id = ?1",
            c.source_id.as_str(),
        )? {
            return Err(StoreError::SourceNotFound(c.source_id.to_string()));
        }
        if let Some(parent) = c.parent_candidate {
            if !exists(&tx, "SELECT 1 FROM candidates WHERE id = ?1", parent)? {
                return Err(StoreError::CandidateNotFound(parent));
            }
        }
        tx.prepare_cached(
            "INSERT INTO candidates (source_id, parent_candidate, node_id, round, cycle, attempt,
                                     kind, proposer_note, knobs_json, created_at, sample)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        )?
        .execute(params![
            c.source_id.as_str(),
            c.parent_candidate,
            c.node_id,
            c.round,
            c.cycle,
            c.attempt,
            c.kind.as_str(),
            c.proposer_note,
            knobs,
            now_rfc3339(),
            c.sample
        ])?;
        let id = tx.last_insert_rowid();
        tx.commit()?;
        Ok(id)
    }

    pub fn candidate(&self, id: i64) -> Result<Option<CandidateRow>, StoreError> {
        let raw = self
            .conn
            .prepare_cached(&format!("{CANDIDATE_SELECT} WHERE id = ?1"))?
            .query_row([id], RawCandidate::from_row)
            .optional()?;
        raw.map(RawCandidate::into_row).transpose()
    }

    /// All candidates in insertion order.
    pub fn candidates(&self) -> Result<Vec<CandidateRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!("{CANDIDATE_SELECT} ORDER BY id"))?;
        let raws = stmt
            .query_map([], RawCandidate::from_row)?
            .collect::<Result<Vec<_>, _>>()?;
        raws.into_iter().map(RawCandidate::into_row).collect()
    }

    /// Commits the full harness result for a candidate in one transaction. `score` must be
    /// finite when present (SQLite would silently turn NaN into NULL).
    pub fn record_evaluation(
        &self,
        candidate_id: i64,
        status: &str,
        score: Option<f64>,
        result: &Value,
    ) -> Result<i64, StoreError> {
        if status.is_empty() {
            return Err(StoreError::Invalid("evaluation status is empty".into()));
        }
        if let Some(s) = score {
            if !s.is_finite() {
                return Err(StoreError::Invalid(format!(
                    "evaluation score {s} is not finite"
                )));
            }
        }
        let result = serde_json::to_string(result)?;
        let tx = write_tx(&self.conn)?;
        if !exists(&tx, "SELECT 1 FROM candidates WHERE id = ?1", candidate_id)? {
            return Err(StoreError::CandidateNotFound(candidate_id));
        }
        tx.prepare_cached(
            "INSERT INTO evaluations (candidate_id, status, score, result_json, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?
        .execute(params![candidate_id, status, score, result, now_rfc3339()])?;
        let id = tx.last_insert_rowid();
        tx.commit()?;
        Ok(id)
    }

    /// Sets one top-level section of a stored evaluation's result, learnt after it was recorded
    /// (a profile of the kernel taken when its cycle ended), leaving its status, score and
    /// every other section as they are.
    pub fn amend_evaluation(
        &self,
        evaluation_id: i64,
        section: &str,
        value: &Value,
    ) -> Result<(), StoreError> {
        if section.is_empty() {
            return Err(StoreError::Invalid(
                "evaluation section name is empty".into(),
            ));
        }
        let tx = write_tx(&self.conn)?;
        let raw: Option<String> = tx
            .prepare_cached("SELECT result_json FROM evaluations WHERE id = ?1")?
            .query_row([evaluation_id], |r| r.get(0))
            .optional()?;
        let Some(raw) = raw else {
            return Err(StoreError::EvaluationNotFound(evaluation_id));
        };
        let mut result: Value = serde_json::from_str(&raw)?;
        let Some(fields) = result.as_object_mut() else {
            return Err(StoreError::Invalid(format!(
                "evaluation {evaluation_id}'s result is not an object"
            )));
        };
        fields.insert(section.to_string(), value.clone());
        tx.prepare_cached("UPDATE evaluations SET result_json = ?2 WHERE id = ?1")?
            .execute(params![evaluation_id, serde_json::to_string(&result)?])?;
        tx.commit()?;
        Ok(())
    }

    /// The latest evaluation of a candidate (a candidate re-evaluated after a resume has more
    /// than one; the last word counts).
    pub fn evaluation_for(&self, candidate_id: i64) -> Result<Option<EvaluationRow>, StoreError> {
        let raw = self
            .conn
            .prepare_cached(&format!(
                "{EVALUATION_SELECT} WHERE candidate_id = ?1 ORDER BY id DESC LIMIT 1"
            ))?
            .query_row([candidate_id], RawEvaluation::from_row)
            .optional()?;
        raw.map(RawEvaluation::into_row).transpose()
    }

    /// The sources of every candidate that has an evaluation (any kind), without reading the
    /// evaluations themselves.
    pub fn evaluated_source_ids(&self) -> Result<BTreeSet<SourceId>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT DISTINCT c.source_id FROM candidates c
             WHERE EXISTS (SELECT 1 FROM evaluations e WHERE e.candidate_id = c.id)",
        )?;
        let ids = stmt
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        ids.iter().map(|s| SourceId::parse(s)).collect()
    }

    /// The earliest candidate with this source, of any kind but `recheck`, that has an
    /// evaluation, and its latest evaluation: what an identical kernel measured before.
    pub fn first_evaluated_candidate_of(
        &self,
        source_id: &SourceId,
    ) -> Result<Option<(i64, EvaluationRow)>, StoreError> {
        let id: Option<i64> = self
            .conn
            .prepare_cached(
                "SELECT c.id FROM candidates c
                 WHERE c.source_id = ?1 AND c.kind != 'recheck'
                   AND EXISTS (SELECT 1 FROM evaluations e WHERE e.candidate_id = c.id)
                 ORDER BY c.id LIMIT 1",
            )?
            .query_row([source_id.as_str()], |r| r.get(0))
            .optional()?;
        let Some(id) = id else { return Ok(None) };
        Ok(self.evaluation_for(id)?.map(|e| (id, e)))
    }

    /// All evaluations in insertion order.
    pub fn evaluations(&self) -> Result<Vec<EvaluationRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!("{EVALUATION_SELECT} ORDER BY id"))?;
        let raws = stmt
            .query_map([], RawEvaluation::from_row)?
            .collect::<Result<Vec<_>, _>>()?;
        raws.into_iter().map(RawEvaluation::into_row).collect()
    }

    /// The highest-scoring evaluation with status `passed` and its candidate; the earlier one
    /// wins a tie, so the answer is stable as the run goes on.
    pub fn best(&self) -> Result<Option<(CandidateRow, EvaluationRow)>, StoreError> {
        let eval = self
            .conn
            .prepare_cached(&format!(
                "{EVALUATION_SELECT} WHERE status = 'passed' AND score IS NOT NULL
                 ORDER BY score DESC, id ASC LIMIT 1"
            ))?
            .query_row([], RawEvaluation::from_row)
            .optional()?;
        let Some(eval) = eval.map(RawEvaluation::into_row).transpose()? else {
            return Ok(None);
        };
        let cand = self
            .candidate(eval.candidate_id)?
            .ok_or(StoreError::CandidateNotFound(eval.candidate_id))?;
        Ok(Some((cand, eval)))
    }

    // ---- world model ---------------------------------------------------------------------

    /// Stores the world model at the end of a round/cycle; a second snapshot for the same
    /// round and cycle replaces the first (a resumed cycle ends again).
    pub fn snapshot_world_model(
        &self,
        round: u32,
        cycle: u32,
        wm: &Value,
    ) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO world_models (round, cycle, wm_json, created_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (round, cycle) DO UPDATE SET wm_json = excluded.wm_json,
                                                          created_at = excluded.created_at",
            )?
            .execute(params![round, cycle, serde_json::to_string(wm)?, now_rfc3339()])?;
        Ok(())
    }

    /// The snapshot with the highest (round, cycle).
    pub fn latest_world_model(&self) -> Result<Option<(u32, u32, Value)>, StoreError> {
        let row: Option<(u32, u32, String)> = self
            .conn
            .prepare_cached(
                "SELECT round, cycle, wm_json FROM world_models
                 ORDER BY round DESC, cycle DESC LIMIT 1",
            )?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()?;
        row.map(|(r, c, j)| Ok((r, c, serde_json::from_str(&j)?)))
            .transpose()
    }

    pub fn world_model(&self, round: u32, cycle: u32) -> Result<Option<Value>, StoreError> {
        let j: Option<String> = self
            .conn
            .prepare_cached("SELECT wm_json FROM world_models WHERE round = ?1 AND cycle = ?2")?
            .query_row(params![round, cycle], |r| r.get(0))
            .optional()?;
        j.map(|j| Ok(serde_json::from_str(&j)?)).transpose()
    }

    // ---- LLM exchanges -------------------------------------------------------------------

    pub fn record_exchange(&self, x: &Exchange) -> Result<i64, StoreError> {
        if !x.cost_usd.is_finite() || x.cost_usd < 0.0 {
            return Err(StoreError::Invalid(format!(
                "exchange cost {} is not a non-negative number",
                x.cost_usd
            )));
        }
        let prompt_hash = blake3::hash(x.prompt.as_bytes()).to_hex().to_string();
        let response_hash = blake3::hash(x.response.as_bytes()).to_hex().to_string();
        let tx = write_tx(&self.conn)?;
        {
            let mut put =
                tx.prepare_cached("INSERT OR IGNORE INTO texts (hash, body) VALUES (?1, ?2)")?;
            put.execute(params![prompt_hash, x.prompt])?;
            put.execute(params![response_hash, x.response])?;
        }
        tx.prepare_cached(
            "INSERT INTO exchanges (role, prompt_hash, response_hash, model, provider, input_tokens,
                                    output_tokens, cost_usd, latency_ms, error, cached, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        )?
        .execute(params![
            x.role,
            prompt_hash,
            response_hash,
            x.model,
            x.provider,
            to_i64(x.input_tokens, "input_tokens")?,
            to_i64(x.output_tokens, "output_tokens")?,
            x.cost_usd,
            to_i64(x.latency_ms, "latency_ms")?,
            x.error,
            x.cached,
            now_rfc3339()
        ])?;
        let id = tx.last_insert_rowid();
        tx.commit()?;
        Ok(id)
    }

    /// All exchanges in call order, with their prompt and response texts.
    pub fn exchanges(&self) -> Result<Vec<ExchangeRow>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT e.id, e.role, p.body, r.body, e.model, e.provider, e.input_tokens,
                    e.output_tokens, e.cost_usd, e.latency_ms, e.error, e.cached, e.created_at
             FROM exchanges e
             JOIN texts p ON p.hash = e.prompt_hash
             JOIN texts r ON r.hash = e.response_hash
             ORDER BY e.id",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(ExchangeRow {
                id: r.get(0)?,
                exchange: Exchange {
                    role: r.get(1)?,
                    prompt: r.get(2)?,
                    response: r.get(3)?,
                    model: r.get(4)?,
                    provider: r.get(5)?,
                    input_tokens: r.get(6)?,
                    output_tokens: r.get(7)?,
                    cost_usd: r.get(8)?,
                    latency_ms: r.get(9)?,
                    error: r.get(10)?,
                    cached: r.get(11)?,
                },
                created_at: r.get(12)?,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// How many exchanges failed and the last one that did; `None` when none failed.
    pub fn failed_calls(&self) -> Result<Option<FailedCalls>, StoreError> {
        let count: u64 = self.conn.query_row(
            "SELECT COUNT(*) FROM exchanges WHERE error IS NOT NULL",
            [],
            |r| r.get(0),
        )?;
        if count == 0 {
            return Ok(None);
        }
        Ok(Some(self.conn.query_row(
            "SELECT role, error, created_at FROM exchanges WHERE error IS NOT NULL
             ORDER BY id DESC LIMIT 1",
            [],
            |r| {
                Ok(FailedCalls {
                    count,
                    last_role: r.get(0)?,
                    last_error: r.get(1)?,
                    last_at: r.get(2)?,
                })
            },
        )?))
    }

    pub fn usage_totals(&self) -> Result<Usage, StoreError> {
        Ok(self.conn.query_row(
            "SELECT COUNT(*), COALESCE(SUM(cached), 0), COALESCE(SUM(input_tokens), 0),
                    COALESCE(SUM(output_tokens), 0), TOTAL(cost_usd), COALESCE(SUM(latency_ms), 0)
             FROM exchanges",
            [],
            |r| {
                Ok(Usage {
                    calls: r.get(0)?,
                    cached_calls: r.get(1)?,
                    input_tokens: r.get(2)?,
                    output_tokens: r.get(3)?,
                    cost_usd: r.get(4)?,
                    latency_ms: r.get(5)?,
                })
            },
        )?)
    }

    // ---- engine state and events ---------------------------------------------------------

    /// Upserts an engine checkpoint (e.g. the current cycle's streaks) under `key`.
    pub fn set_state(&self, key: &str, value: &Value) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO state (key, value_json, updated_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (key) DO UPDATE SET value_json = excluded.value_json,
                                                 updated_at = excluded.updated_at",
            )?
            .execute(params![key, serde_json::to_string(value)?, now_rfc3339()])?;
        Ok(())
    }

    pub fn get_state(&self, key: &str) -> Result<Option<Value>, StoreError> {
        let j: Option<String> = self
            .conn
            .prepare_cached("SELECT value_json FROM state WHERE key = ?1")?
            .query_row([key], |r| r.get(0))
            .optional()?;
        j.map(|j| Ok(serde_json::from_str(&j)?)).transpose()
    }

    /// Appends a timestamped progress/log event; returns its id (increasing).
    pub fn append_event(&self, kind: &str, data: &Value) -> Result<i64, StoreError> {
        self.conn
            .prepare_cached("INSERT INTO events (at, kind, data_json) VALUES (?1, ?2, ?3)")?
            .execute(params![now_rfc3339(), kind, serde_json::to_string(data)?])?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Events with id greater than `after_id` (0 for all), oldest first: a live `show` polls
    /// with the last id it printed.
    pub fn events_after(&self, after_id: i64) -> Result<Vec<EventRow>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, at, kind, data_json FROM events WHERE id > ?1 ORDER BY id",
        )?;
        let raws = stmt
            .query_map([after_id], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        raws.into_iter()
            .map(|(id, at, kind, j)| {
                Ok(EventRow {
                    id,
                    at,
                    kind,
                    data: serde_json::from_str(&j)?,
                })
            })
            .collect()
    }

    // ---- completion ----------------------------------------------------------------------

    pub fn mark_finished(&self, summary: &Value) -> Result<(), StoreError> {
        self.conn.execute(
            "UPDATE run SET finished_at = ?1, summary_json = ?2",
            params![now_rfc3339(), serde_json::to_string(summary)?],
        )?;
        Ok(())
    }

    /// Takes back `mark_finished`: a finished run that is continued under a raised budget is
    /// running again, and its old summary (best, stop reason) no longer describes it.
    pub fn mark_unfinished(&self) -> Result<(), StoreError> {
        self.conn
            .execute("UPDATE run SET finished_at = NULL, summary_json = NULL", [])?;
        Ok(())
    }

    pub fn is_finished(&self) -> Result<bool, StoreError> {
        Ok(self
            .conn
            .query_row("SELECT finished_at IS NOT NULL FROM run", [], |r| r.get(0))?)
    }

    /// The run's start, finish and latest record (see [`RunSpan`]).
    pub fn span(&self) -> Result<RunSpan, StoreError> {
        // Stamps are fixed-width UTC, so the text maximum is the latest instant.
        Ok(self.conn.query_row(
            "SELECT created_at, finished_at,
                    (SELECT MAX(at) FROM (
                        SELECT MAX(created_at) AS at FROM candidates
                        UNION ALL SELECT MAX(created_at) FROM evaluations
                        UNION ALL SELECT MAX(created_at) FROM exchanges
                        UNION ALL SELECT MAX(at) FROM events))
             FROM run",
            [],
            |r| {
                Ok(RunSpan {
                    started_at: r.get(0)?,
                    finished_at: r.get(1)?,
                    last_record_at: r.get(2)?,
                })
            },
        )?)
    }

    /// The summary given to `mark_finished`, if the run has finished.
    pub fn finish_summary(&self) -> Result<Option<Value>, StoreError> {
        let j: Option<String> = self
            .conn
            .query_row("SELECT summary_json FROM run", [], |r| r.get(0))?;
        j.map(|j| Ok(serde_json::from_str(&j)?)).transpose()
    }

    // ---- verification --------------------------------------------------------------------

    /// Problems found by SQLite's integrity and foreign-key checks, and by re-hashing every
    /// stored source; empty when the run is sound.
    pub fn check_integrity(&self) -> Result<Vec<String>, StoreError> {
        let mut problems = Vec::new();
        let mut stmt = self.conn.prepare("PRAGMA integrity_check")?;
        for line in stmt.query_map([], |r| r.get::<_, String>(0))? {
            let line = line?;
            if line != "ok" {
                problems.push(format!("integrity_check: {line}"));
            }
        }
        let mut stmt = self.conn.prepare("PRAGMA foreign_key_check")?;
        for row in stmt.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, Option<i64>>(1)?))
        })? {
            let (table, rowid) = row?;
            problems.push(format!(
                "foreign_key_check: {table} row {rowid:?} has a dangling reference"
            ));
        }
        let mut stmt = self.conn.prepare("SELECT id FROM sources ORDER BY id")?;
        let ids = stmt
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        for id in ids {
            let checked = SourceId::parse(&id).and_then(|sid| self.source(&sid));
            if let Err(e) = checked {
                problems.push(format!("source {id}: {e}"));
            }
        }
        Ok(problems)
    }
}

// ---- helpers ---------------------------------------------------------------------------------

fn connect(path: &Path, create: bool) -> Result<Connection, StoreError> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // WAL: readers (`show`) never block the writer, and a commit is a single append to the log.
    // synchronous=NORMAL: a commit returns once the log is written to the OS, without fsync.
    // That survives any death of this process, kill -9 included, because the kernel already
    // holds the bytes; only an OS crash or power loss can drop the last few commits, and even
    // then the database stays consistent. FULL would add an fsync per commit for that case
    // alone, and the events/exchanges written between evaluations make commits frequent.
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Invalid(format!(
            "{}: could not enable WAL mode (got {mode}); is the run on a network file system?",
            path.display()
        )));
    }
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    Ok(conn)
}

/// BEGIN IMMEDIATE takes the write lock up front, so a read-then-write transaction cannot fail
/// half-way with SQLITE_BUSY when another connection writes; `busy_timeout` covers the wait.
fn write_tx(conn: &Connection) -> Result<Transaction<'_>, StoreError> {
    Ok(Transaction::new_unchecked(
        conn,
        TransactionBehavior::Immediate,
    )?)
}

fn exists(tx: &Transaction<'_>, sql: &str, key: impl rusqlite::ToSql) -> Result<bool, StoreError> {
    Ok(tx
        .prepare_cached(sql)?
        .query_row([key], |_| Ok(()))
        .optional()?
        .is_some())
}

fn to_i64(v: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Invalid(format!("{what} {v} is too large")))
}

/// Run ids become directory names: keep them to one plain path component.
fn check_run_id(id: &str) -> Result<(), StoreError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidRunId(id.to_string()))
    }
}

/// Subdirectories of `runs_dir` that hold a database, sorted by name (= creation time).
fn run_dirs(runs_dir: &Path) -> Result<Vec<(String, PathBuf)>, StoreError> {
    let entries = std::fs::read_dir(runs_dir).map_err(|e| StoreError::io(runs_dir, e))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| StoreError::io(runs_dir, e))?;
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if path.join(DB_FILE).is_file() {
            out.push((name, path));
        }
    }
    out.sort();
    Ok(out)
}

fn read_run_row(conn: &Connection, db_path: &Path) -> Result<(String, RunConfig), StoreError> {
    let row: Option<(String, String)> = conn
        .query_row("SELECT id, config_json FROM run", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?;
    let (id, config_json) = row.ok_or_else(|| StoreError::NotARun(db_path.to_path_buf()))?;
    Ok((id, serde_json::from_str(&config_json)?))
}

/// Reads a run without writing to it: `list` must not migrate or lock other runs.
fn summarize(dir: &Path) -> Result<RunSummary, StoreError> {
    let db_path = dir.join(DB_FILE);
    let conn = Connection::open_with_flags(
        &db_path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let version = schema::user_version(&conn)?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            path: db_path,
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    let (id, config) = read_run_row(&conn, &db_path)?;
    let (finished, candidates, evaluations, best_score) = conn.query_row(
        "SELECT (SELECT finished_at IS NOT NULL FROM run),
                (SELECT COUNT(*) FROM candidates),
                (SELECT COUNT(*) FROM evaluations),
                (SELECT MAX(score) FROM evaluations WHERE status = 'passed')",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )?;
    Ok(RunSummary {
        id,
        dir: dir.to_path_buf(),
        config: Some(config),
        finished,
        candidates,
        evaluations,
        best_score,
        error: None,
    })
}

const CANDIDATE_SELECT: &str = "SELECT id, source_id, parent_candidate, node_id, round, cycle, \
     attempt, kind, proposer_note, knobs_json, created_at, sample FROM candidates";

/// Columns as stored; typed conversion happens outside rusqlite's row callback so that a bad
/// value is reported as a store error, not a generic conversion failure.
struct RawCandidate {
    id: i64,
    source_id: String,
    parent_candidate: Option<i64>,
    node_id: Option<String>,
    round: u32,
    cycle: u32,
    attempt: u32,
    kind: String,
    proposer_note: String,
    knobs_json: String,
    created_at: String,
    sample: u32,
}

impl RawCandidate {
    fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(RawCandidate {
            id: r.get(0)?,
            source_id: r.get(1)?,
            parent_candidate: r.get(2)?,
            node_id: r.get(3)?,
            round: r.get(4)?,
            cycle: r.get(5)?,
            attempt: r.get(6)?,
            kind: r.get(7)?,
            proposer_note: r.get(8)?,
            knobs_json: r.get(9)?,
            created_at: r.get(10)?,
            sample: r.get(11)?,
        })
    }

    fn into_row(self) -> Result<CandidateRow, StoreError> {
        Ok(CandidateRow {
            id: self.id,
            source_id: SourceId::parse(&self.source_id)?,
            parent_candidate: self.parent_candidate,
            node_id: self.node_id,
            round: self.round,
            cycle: self.cycle,
            attempt: self.attempt,
            sample: self.sample,
            kind: CandidateKind::parse(&self.kind)
                .ok_or_else(|| StoreError::Invalid(format!("candidate kind {:?}", self.kind)))?,
            proposer_note: self.proposer_note,
            knobs: serde_json::from_str(&self.knobs_json)?,
            created_at: self.created_at,
        })
    }
}

const EVALUATION_SELECT: &str =
    "SELECT id, candidate_id, status, score, result_json, created_at FROM evaluations";

struct RawEvaluation {
    id: i64,
    candidate_id: i64,
    status: String,
    score: Option<f64>,
    result_json: String,
    created_at: String,
}

impl RawEvaluation {
    fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(RawEvaluation {
            id: r.get(0)?,
            candidate_id: r.get(1)?,
            status: r.get(2)?,
            score: r.get(3)?,
            result_json: r.get(4)?,
            created_at: r.get(5)?,
        })
    }

    fn into_row(self) -> Result<EvaluationRow, StoreError> {
        Ok(EvaluationRow {
            id: self.id,
            candidate_id: self.candidate_id,
            status: self.status,
            score: self.score,
            result: serde_json::from_str(&self.result_json)?,
            created_at: self.created_at,
        })
    }
}

/// The pid a writer recorded in its lock file, if readable.
fn read_pid(file: &mut std::fs::File) -> Option<u32> {
    use std::io::{Read, Seek};
    let mut text = String::new();
    file.rewind().ok()?;
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}
