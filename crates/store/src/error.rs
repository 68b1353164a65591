use std::path::PathBuf;

/// Everything the run store can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("run directory {0} already exists")]
    RunExists(PathBuf),
    #[error("no run found at {0}")]
    RunNotFound(PathBuf),
    #[error("run id {0:?} matches several runs: {1}")]
    AmbiguousRun(String, String),
    #[error("invalid run id {0:?}: expected letters, digits, '-' or '_'")]
    InvalidRunId(String),
    #[error("{path}: database schema version {found} is newer than this ksearch supports ({supported}); upgrade ksearch")]
    SchemaTooNew {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error("{0}: not a ksearch run database (no run row)")]
    NotARun(PathBuf),
    #[error("invalid source id {0:?}: expected 64 lowercase hex digits")]
    InvalidSourceId(String),
    #[error("invalid source extension {0:?}: expected 1-16 ASCII letters or digits")]
    InvalidExtension(String),
    #[error("source {id} is already stored with extension {existing:?}, not {requested:?}")]
    SourceExtConflict {
        id: String,
        existing: String,
        requested: String,
    },
    #[error("source {0} is not in the run store")]
    SourceNotFound(String),
    #[error("source file {path} does not match its hash (found {actual})")]
    SourceCorrupt { path: PathBuf, actual: String },
    #[error("candidate {0} does not exist")]
    CandidateNotFound(i64),
    #[error("evaluation {0} does not exist")]
    EvaluationNotFound(i64),
    #[error("invalid value: {0}")]
    Invalid(String),
    #[error("{} is being written by {} (a `ksearch run` or `ksearch resume`): wait for it to finish, or stop it first", dir.display(), holder.map_or_else(|| "another process".to_string(), |p| format!("process {p}")))]
    RunBusy { dir: PathBuf, holder: Option<u32> },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io {
            path: path.into(),
            source,
        }
    }
}
