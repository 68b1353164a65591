//! ksearch-interop: problems written for other kernel benchmarks, turned into ksearch tasks.
//!
//! [`flashinfer`] reads FlashInfer-Bench definitions (named axes, typed tensors in calling
//! order, a PyTorch reference `run`) and their workload trace lines, and writes a task
//! directory (`task.toml`, `reference.py`, `README.md`) that `ksearch-task` loads like any
//! other. The written task is loaded before the import reports success, so every error the
//! task loader would raise is raised here, against the generated files.
//!
//! [`kernelbench`] runs a KernelBench problem once (with an interpreter that has PyTorch) to
//! learn its tensors, and writes a task whose reference is the problem's `Model`.
//!
//! This crate knows the foreign formats and the task format; it evaluates nothing (the
//! references of these formats need PyTorch, which the harness calls on a GPU machine).

pub mod flashinfer;
pub mod kernelbench;
pub mod safetensors;
mod toml_text;

use std::path::PathBuf;

/// Why an import failed. Messages name the input file and, where there is one, its line.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid JSON for its format (serde's message has the line and column).
    #[error("{path}:{line}: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
    /// Valid JSON that breaks the format's rules, or uses what ksearch cannot express yet.
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    /// The output directory exists and is not empty: an import never overwrites.
    #[error("{0}: exists and is not empty; choose a new directory")]
    OutputExists(PathBuf),
    /// The written task does not load: a bug of the importer, reported with the loader's words.
    #[error("the imported task in {dir} does not load: {message}")]
    Generated { dir: PathBuf, message: String },
}
