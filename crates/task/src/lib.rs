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
pub mod summary;
mod text;
mod workload;

pub use error::{SpecError, TaskError, WorkloadError};
pub use expr::{Expr, ExprError, Num};
pub use spec::{
    placeholder_pieces, Assumption, Axis, AxisType, BackendSpec, DType, DTypeSpec, Distribution,
    ParamValue, Reach, ReferenceSpec, ResolvedTensor, ResolvedWorkload, Roofline, TaskSpec,
    TensorSpec, Tolerance, ToleranceRule, WorkloadSpec, FORMAT_VERSION, NORMAL_REACH_STD,
};
pub use summary::TaskSummary;
pub use workload::CustomWorkload;

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
    /// The text of the reference module, where custom generators must be defined.
    module_source: String,
}

/// Loads `dir/task.toml` and checks the whole task (files it names included).
pub fn load_task(dir: &Path) -> Result<Task, TaskError> {
    let loaded = load::load(dir)?;
    Ok(Task {
        dir: loaded.dir,
        spec: loaded.spec,
        resolved: loaded.resolved,
        source: loaded.source,
        module_source: loaded.module_source,
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

    /// `w`, a workload that is not in `task.toml`, checked and resolved for `backend` exactly
    /// as the task's own workloads are (see `docs/task-format.md`): every axis bound with a
    /// value of its type, the entry's placeholders set, what kernels of `backend` may assume,
    /// valid distributions that suit their inputs' dtypes, positive dimensions, element counts
    /// within `i64`, finite roofline formulas. Str axes with a default that `w` leaves out
    /// apply unlisted, as for the task's own workloads.
    pub fn resolve_workload(
        &self,
        backend: &str,
        w: &CustomWorkload,
    ) -> Result<ResolvedWorkload, TaskError> {
        self.backend(backend)?;
        let spec = WorkloadSpec {
            name: w.name.clone(),
            params: w.params.clone(),
            held_out: w.held_out,
            backends: Some(vec![backend.to_string()]),
            dist: w.dist.clone(),
        };
        let err = |issue: workload::Issue| self.workload_error(&w.name, issue);
        workload::check(&self.spec, &self.module_source, &spec).map_err(err)?;
        workload::resolve(&self.spec, &spec).map_err(err)
    }

    /// Parameter values from `AXIS=VALUE` pairs separated by commas (`B=1, L=4096, dtype=f16`),
    /// each value taken as its axis's type. The pairs need not bind every axis:
    /// [`Task::resolve_workload`] checks that. Errors name the text as the workload.
    pub fn parse_params(&self, text: &str) -> Result<BTreeMap<String, ParamValue>, TaskError> {
        let mut params = BTreeMap::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let field = |key: &str| source_map::FieldPath::root().key("params").key(key);
            let Some((key, value)) = part.split_once('=') else {
                let message = format!("`{part}` is not AXIS=VALUE");
                return Err(self.workload_error(
                    text,
                    workload::Issue::workload(source_map::FieldPath::root(), message),
                ));
            };
            let (key, value) = (key.trim(), value.trim());
            if let Some(issue) = workload::unknown_axis(&self.spec.axes, key) {
                return Err(self.workload_error(text, issue));
            }
            let value = match self.spec.axis(key).map(|a| a.ty) {
                Some(AxisType::Int) => match value.parse() {
                    Ok(v) => ParamValue::Int(v),
                    Err(_) => {
                        let message = format!("{key} = `{value}` is not an integer");
                        let issue = workload::Issue::workload(field(key), message);
                        return Err(self.workload_error(text, issue));
                    }
                },
                _ => ParamValue::Str(value.to_string()),
            };
            if params.insert(key.to_string(), value).is_some() {
                let issue =
                    workload::Issue::workload(field(key), format!("`{key}` is given twice"));
                return Err(self.workload_error(text, issue));
            }
        }
        Ok(params)
    }

    fn workload_error(&self, workload: &str, issue: workload::Issue) -> TaskError {
        TaskError::Workload(Box::new(WorkloadError {
            task: self.spec.name.clone(),
            workload: workload.to_string(),
            field: issue.field.to_string(),
            in_task: issue.in_task,
            message: issue.message,
        }))
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

    /// The built-in task directories (those with a `task.toml`), sorted.
    pub(crate) fn task_dirs() -> Result<Vec<PathBuf>, TaskError> {
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
