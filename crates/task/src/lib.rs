//! ksearch-task: task specs. Owns the `task.toml` schema (format v1), its validation with
//! file/field/line errors, the shape and formula expression language, and the resolution of
//! workloads to concrete shapes for the harness. It knows nothing of processes, Python
//! execution or the search; `docs/task-format.md` is the user reference.

pub mod check;
mod error;
pub mod expr;
mod load;
mod raw;
mod source_map;
mod spec;

pub use error::{SpecError, TaskError};
pub use expr::{Expr, ExprError, Num};
pub use spec::{
    Assumption, Axis, AxisType, BackendSpec, DType, DTypeSpec, Distribution, ParamValue, Reach,
    ReferenceSpec, ResolvedTensor, ResolvedWorkload, Roofline, TaskSpec, TensorSpec, Tolerance,
    WorkloadSpec, FORMAT_VERSION, NORMAL_REACH_STD,
};

use load::ResolvedEntry;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A loaded, validated task. Every workload has already been resolved once, so the queries
/// below cannot fail on shapes.
#[derive(Debug, Clone)]
pub struct Task {
    dir: PathBuf,
    spec: TaskSpec,
    resolved: Vec<ResolvedEntry>,
    /// The text of `task.toml` as loaded, so later checks can point at lines.
    source: String,
}

/// Loads `dir/task.toml` and checks the whole task (files it names included).
pub fn load_task(dir: &Path) -> Result<Task, TaskError> {
    let loaded = load::load(dir)?;
    Ok(Task {
        dir: loaded.dir,
        spec: loaded.spec,
        resolved: loaded.resolved,
        source: loaded.source,
    })
}

/// A task directory (or its `task.toml`) when `name_or_dir` is one or looks like a path;
/// otherwise the built-in task of that name. A bare name that happens to match an unrelated
/// directory in the working directory still means the built-in.
pub fn resolve(name_or_dir: &str) -> Result<Task, TaskError> {
    let path = Path::new(name_or_dir);
    if path.join("task.toml").is_file() {
        return load_task(path);
    }
    if path.is_file() && path.file_name().is_some_and(|f| f == "task.toml") {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        return load_task(dir);
    }
    let looks_like_path = name_or_dir.contains(std::path::MAIN_SEPARATOR)
        || name_or_dir.contains('/')
        || name_or_dir.starts_with('.')
        || name_or_dir.starts_with('~');
    if looks_like_path {
        if path.is_dir() {
            return Err(TaskError::NotATaskDir {
                path: path.to_path_buf(),
            });
        }
        return Err(TaskError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such task directory"),
        });
    }
    builtin::find(name_or_dir)
}

impl Task {
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The task directory, absolute.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn spec(&self) -> &TaskSpec {
        &self.spec
    }

    /// The text of `task.toml` as it was loaded.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The task kind (e.g. `attention`), which selects actions from the catalog.
    pub fn kind(&self) -> &str {
        &self.spec.kind
    }

    pub fn backend(&self, name: &str) -> Result<&BackendSpec, TaskError> {
        self.spec
            .backends
            .get(name)
            .ok_or_else(|| TaskError::UnknownBackend {
                task: self.spec.name.clone(),
                name: name.to_string(),
                available: self.spec.backends.keys().cloned().collect(),
            })
    }

    /// The reference function `backend` evaluates against: the backend's own `reference`
    /// (e.g. a PyTorch one for cuda) or the task's, in the task's reference module.
    pub fn reference_for(&self, backend: &str) -> Result<ReferenceSpec, TaskError> {
        let spec = self.backend(backend)?;
        Ok(ReferenceSpec {
            module: self.spec.reference.module.clone(),
            function: spec
                .reference
                .clone()
                .unwrap_or_else(|| self.spec.reference.function.clone()),
        })
    }

    pub fn backend_names(&self) -> Vec<&str> {
        self.spec.backends.keys().map(String::as_str).collect()
    }

    /// Every workload that applies to `backend`, held-out ones included, in file order.
    pub fn workloads(&self, backend: &str) -> Result<Vec<ResolvedWorkload>, TaskError> {
        self.backend(backend)?;
        Ok(self
            .resolved
            .iter()
            .filter(|e| {
                e.backends
                    .as_ref()
                    .is_none_or(|list| list.iter().any(|b| b == backend))
            })
            .map(|e| e.workload.clone())
            .collect())
    }

    /// The task's tolerance for `dtype`, or the dtype's default.
    pub fn tolerance(&self, dtype: DType) -> Tolerance {
        self.spec
            .tolerance
            .get(&dtype)
            .copied()
            .unwrap_or_else(|| dtype.default_tolerance())
    }

    /// The effective tolerance of every dtype, as the protocol's `tolerance` object wants it
    /// (the harness also needs the low-precision ones to classify precision cheats).
    pub fn tolerance_table(&self) -> BTreeMap<DType, Tolerance> {
        DType::ALL
            .into_iter()
            .map(|d| (d, self.tolerance(d)))
            .collect()
    }
}

/// The tasks shipped with ksearch.
pub mod builtin {
    use super::{load_task, Task, TaskError};
    use ksearch_assets::{locate, Tree};
    use std::path::PathBuf;

    /// The directory holding the built-in tasks.
    pub fn dir() -> Result<PathBuf, TaskError> {
        Ok(locate(Tree::Tasks)?)
    }

    fn task_dirs() -> Result<Vec<PathBuf>, TaskError> {
        let root = dir()?;
        let entries = std::fs::read_dir(&root).map_err(|source| TaskError::Io {
            path: root.clone(),
            source,
        })?;
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.join("task.toml").is_file())
            .collect();
        dirs.sort();
        Ok(dirs)
    }

    /// Every built-in task, sorted by directory name. A built-in that fails to load is an
    /// error, not a silent omission.
    pub fn list() -> Result<Vec<Task>, TaskError> {
        task_dirs()?.iter().map(|d| load_task(d)).collect()
    }

    /// The built-in task named `name` (its directory name or its `name` field).
    pub fn find(name: &str) -> Result<Task, TaskError> {
        let dirs = task_dirs()?;
        if let Some(d) = dirs
            .iter()
            .find(|d| d.file_name().is_some_and(|f| f == name))
        {
            return load_task(d);
        }
        let mut available = Vec::new();
        for d in &dirs {
            // A broken sibling must not hide the task asked for.
            if let Ok(task) = load_task(d) {
                if task.name() == name {
                    return Ok(task);
                }
                available.push(task.name().to_string());
            } else if let Some(f) = d.file_name() {
                available.push(f.to_string_lossy().into_owned());
            }
        }
        Err(TaskError::UnknownTask {
            name: name.to_string(),
            available,
        })
    }
}
