//! `TaskError`: every way loading or querying a task can fail. Spec errors name the file, the
//! field path (`workloads[2].params.L`) and, when the TOML source is known, the line.

use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The task files are malformed or inconsistent.
    #[error("{0}")]
    Invalid(Box<SpecError>),

    #[error("no task named `{name}`; built-in tasks: {}", list(.available))]
    UnknownTask {
        name: String,
        available: Vec<String>,
    },

    #[error("task `{task}` has no `{name}` backend; it has: {}", list(.available))]
    UnknownBackend {
        task: String,
        name: String,
        available: Vec<String>,
    },

    /// A workload given from outside `task.toml` (a `ksearch bench` shape, a knowledge-pack
    /// assertion's workload) does not fit the task.
    #[error("{0}")]
    Workload(Box<WorkloadError>),

    #[error("{}: not a task directory (no task.toml)", path.display())]
    NotATaskDir { path: PathBuf },

    #[error(transparent)]
    Assets(#[from] ksearch_assets::AssetError),
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "(none)".to_string()
    } else {
        items.join(", ")
    }
}

/// Why a workload given from outside `task.toml` does not fit the task. Displays as
/// `task softmax, workload `w`: params.cols: missing a value for axis `cols``.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadError {
    pub task: String,
    pub workload: String,
    /// Dotted path of the offending field: of the workload (`params.L`, `dist.x`), or of
    /// `task.toml` when `in_task` (`inputs[0].shape[1]`: an expression the workload's values
    /// make fail); empty for the workload as a whole.
    pub field: String,
    pub in_task: bool,
    pub message: String,
}

impl std::fmt::Display for WorkloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "task {}, workload `{}`: ", self.task, self.workload)?;
        match (self.in_task, self.field.is_empty()) {
            (true, _) => write!(f, "task.toml {}: ", self.field)?,
            (false, false) => write!(f, "{}: ", self.field)?,
            (false, true) => {}
        }
        f.write_str(&self.message)
    }
}

/// Where a task file is wrong and why. Displays as `file:line:column: field: message`,
/// followed by the source line with a caret when the line is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    pub file: PathBuf,
    /// Dotted path of the offending field (`workloads[2].params.L`); empty for the document
    /// as a whole.
    pub field: String,
    /// 1-based.
    pub line: Option<usize>,
    /// 1-based, in characters.
    pub column: Option<usize>,
    pub message: String,
    /// The source line, for display.
    pub snippet: Option<String>,
}

impl std::fmt::Display for SpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&render(self))
    }
}

fn render(e: &SpecError) -> String {
    let (file, field, line, column, message, snippet) = (
        &e.file, &e.field, &e.line, &e.column, &e.message, &e.snippet,
    );
    let mut out = file.display().to_string();
    if let Some(line) = line {
        let _ = write!(out, ":{line}");
        if let Some(column) = column {
            let _ = write!(out, ":{column}");
        }
    }
    out.push_str(": ");
    if !field.is_empty() {
        let _ = write!(out, "{field}: ");
    }
    out.push_str(message);
    if let (Some(line), Some(text)) = (line, snippet) {
        let gutter = line.to_string();
        let _ = write!(out, "\n {gutter} | {text}");
        if let Some(column) = column {
            let pad = " ".repeat(gutter.len() + column.saturating_sub(1));
            let _ = write!(out, "\n {pad}   ^");
        }
    }
    out
}
