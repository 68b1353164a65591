//! Errors of the evaluator itself. A failing *candidate* is never an error here: it is an
//! `Ok(EvalResult)` with a non-passing status.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("python3 not found on PATH: install Python 3 (Debian/Ubuntu: `apt install python3`) or set KSEARCH_PYTHON to an interpreter")]
    PythonNotFound,

    #[error("cannot run `{program}`: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },

    #[error("`{command}` failed: {hint}\n{output}")]
    EnvSetup {
        command: String,
        hint: String,
        output: String,
    },

    #[error("cannot prepare {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("cannot locate the harness sources: {0}")]
    Assets(#[from] ksearch_assets::AssetError),

    #[error("the harness package cannot be imported by {python} from {harness_dir}:\n{output}")]
    HarnessImport {
        python: PathBuf,
        harness_dir: PathBuf,
        output: String,
    },

    #[error("interrupted: the harness was stopped with everything it started")]
    Interrupted,

    #[error("the harness failed before answering `{op}` (exit {exit}):\n{output}")]
    HarnessFailed {
        op: String,
        exit: String,
        output: String,
    },

    #[error("the harness speaks protocol {got}, this ksearch speaks {expected}: the harness sources and the binary do not match")]
    ProtocolMismatch { got: u32, expected: u32 },

    #[error("cannot read the candidate {path}: {source}")]
    Candidate {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("cannot draw random bytes from the OS: {0}")]
    Random(String),

    #[error(transparent)]
    Task(#[from] ksearch_task::TaskError),

    #[error("invalid request: {0}")]
    Request(String),

    /// A `ksearch bench` request that the task or the options rule out (the message says why).
    #[error("{0}")]
    Bench(String),

    #[error("cannot measure the yardstick (the baseline and reference times scores divide): {0}")]
    Yardstick(String),

    #[error("OS call failed while running the harness: {0}")]
    Os(#[from] nix::Error),
}

pub type Result<T, E = EvalError> = std::result::Result<T, E>;
