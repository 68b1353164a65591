//! `ksearch new-task`: a new task directory that works as written, to turn into a real task.
//!
//! The files are embedded in the binary (`crates/knowledge/scaffold/`, through `include_str!`),
//! so an installed `ksearch` without a checkout writes the same ones. `@NAME@`, `@ENTRY@` and
//! `@DIR@` in them are replaced by the task's name, its C entry symbol and the directory as the
//! user gave it. With `templates`, the task also gets a template family for the backend
//! (`templates-<backend>/`) and actions of its own (`knowledge/actions/`), so the offline
//! proposer can search it with no change to ksearch's files.
//!
//! What is written is loaded back before the call returns: the task through `ksearch-task`,
//! the family and the actions as a run would load them. A scaffold that fails that is a bug
//! here, reported as [`ScaffoldError::Check`].

use std::path::{Path, PathBuf};

use crate::catalog::{Catalog, TASK_ACTIONS_DIR};
use crate::templates::{backend_templates_dir, TemplateFamily, FAMILY_FILE};

/// The backends `new-task` writes a seed (and a family) for.
pub const SCAFFOLD_BACKENDS: &[&str] = &["cpu"];

const TASK_TOML: &str = include_str!("../scaffold/task.toml.in");
const REFERENCE: &str = include_str!("../scaffold/reference.py");
const README: &str = include_str!("../scaffold/README.md.in");
const CPU_SEED: &str = include_str!("../scaffold/cpu/naive.c");
const CPU_FAMILY: &str = include_str!("../scaffold/cpu/family.toml");
const CPU_KERNEL: &str = include_str!("../scaffold/cpu/kernel.c.j2");
const CPU_ACTIONS: &str = include_str!("../scaffold/cpu/actions.toml");

/// What to scaffold.
#[derive(Debug, Clone)]
pub struct ScaffoldOptions {
    /// The task's `name` and `kind`.
    pub name: String,
    pub backend: String,
    /// Also write a template family and the task's own actions for the offline proposer.
    pub templates: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ScaffoldError {
    #[error(
        "`{0}` is not a valid task name: use letters, digits, `_`, `-` and `.`, starting with a \
         letter"
    )]
    Name(String),
    #[error(
        "new-task writes a seed for backend {known} only, not `{0}`; add `[backends.{0}]` and \
         its seed by hand (docs/task-format.md, \"[backends.<name>]\")",
        known = SCAFFOLD_BACKENDS.join(", ")
    )]
    Backend(String),
    #[error("{} already exists and is not empty: new-task only writes into a new or empty directory", .0.display())]
    NotEmpty(PathBuf),
    #[error("cannot write {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The written task does not load: a bug in the scaffold, not in the user's input.
    #[error("the task written in {} does not load (a ksearch bug): {message}", dir.display())]
    Check { dir: PathBuf, message: String },
}

/// The C symbol of a task named `name`: `<name>_f32` with every character that is not a letter
/// or digit turned into `_`.
pub fn entry_symbol(name: &str) -> String {
    let base: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("{base}_f32")
}

/// Writes a new task into `dir` (created if needed; it must be empty) and returns the files
/// written, relative to `dir`, in the order written.
pub fn scaffold(dir: &Path, opts: &ScaffoldOptions) -> Result<Vec<PathBuf>, ScaffoldError> {
    let name = opts.name.as_str();
    let name_ok = name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !name_ok {
        return Err(ScaffoldError::Name(name.to_string()));
    }
    if !SCAFFOLD_BACKENDS.contains(&opts.backend.as_str()) {
        return Err(ScaffoldError::Backend(opts.backend.clone()));
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ScaffoldError::Io { path, source }
    };
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir).map_err(io(dir))?;
        if entries.next().is_some() {
            return Err(ScaffoldError::NotEmpty(dir.to_path_buf()));
        }
    }
    let fill = |text: &str| {
        text.replace("@NAME@", name)
            .replace("@ENTRY@", &entry_symbol(name))
            .replace("@DIR@", &dir.display().to_string())
    };
    let mut files: Vec<(PathBuf, String)> = vec![
        ("task.toml".into(), fill(TASK_TOML)),
        ("reference.py".into(), fill(REFERENCE)),
        ("seed/naive.c".into(), fill(CPU_SEED)),
        ("README.md".into(), fill(README)),
    ];
    if opts.templates {
        let family = PathBuf::from(backend_templates_dir(&opts.backend));
        files.push((family.join(FAMILY_FILE), fill(CPU_FAMILY)));
        files.push((family.join("kernel.c.j2"), fill(CPU_KERNEL)));
        files.push((
            Path::new(TASK_ACTIONS_DIR).join(format!("{name}.toml")),
            fill(CPU_ACTIONS),
        ));
    }
    for (rel, text) in &files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, text).map_err(io(&path))?;
    }
    check(dir, opts).map_err(|message| ScaffoldError::Check {
        dir: dir.to_path_buf(),
        message,
    })?;
    Ok(files.into_iter().map(|(rel, _)| rel).collect())
}

/// Loads what [`scaffold`] wrote as a run would: the task, and with templates the family and
/// the actions merged over the built-in catalog, which must fit the family.
fn check(dir: &Path, opts: &ScaffoldOptions) -> Result<(), String> {
    let task = ksearch_task::load_task(dir).map_err(|e| e.to_string())?;
    if !opts.templates {
        return Ok(());
    }
    let family = TemplateFamily::load_for(dir, &opts.backend)
        .map_err(|e| e.to_string())?
        .ok_or("no template family was written")?;
    let catalog = Catalog::for_task(dir).map_err(|e| e.to_string())?;
    if catalog.for_kind_on(task.kind(), &opts.backend).is_empty() {
        return Err("no action applies to the task".into());
    }
    catalog
        .check_task_actions(task.kind(), &opts.backend, &family)
        .map_err(|e| e.to_string())
}
