//! `task_toml`: the bytes are written as `task.toml` into a directory that holds every other
//! file of the built-in tasks (their reference modules concatenated, so each reference and
//! baseline function exists), and loaded as a task.
//!
//! Properties: loading never panics; every error has a message, and a spec error names the
//! file and the field or the line; a task that loads answers every query (workloads, references,
//! tolerances, its evaluation requests) without panicking.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ksearch_eval::{EvalRequest, TimingPreset, WorkloadSet};
use ksearch_task::{load_task, DType, TaskError};

use crate::assert_message;

pub fn run(data: &[u8]) {
    let dir = fixture_dir();
    // One fixed file: inputs are loaded one at a time.
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    std::fs::write(dir.join("task.toml"), data).expect("write task.toml");
    match load_task(dir) {
        Ok(task) => {
            let seed = dir.join("seed/naive.c");
            for backend in task.backend_names() {
                let spec = task.backend(backend).expect("a listed backend exists");
                let _ = spec.baseline_label();
                let _ = spec.entry_placeholders();
                let _ = task.reference_for(backend).expect("a listed backend");
                let workloads = task.workloads(backend).expect("a listed backend");
                for w in &workloads {
                    assert!(
                        spec.entry_for(&w.params).is_some(),
                        "a loaded task's entry `{}` cannot be filled for workload `{}`",
                        spec.entry,
                        w.name
                    );
                }
                for set in [WorkloadSet::Search, WorkloadSet::Acceptance] {
                    match EvalRequest::from_task(&task, backend, &seed, set, 7, TimingPreset::Quick)
                    {
                        Ok(req) => {
                            let _ = req.to_wire("evaluate", "nonce", dir);
                        }
                        Err(e) => assert_message("EvalRequest::from_task", &e.to_string()),
                    }
                }
            }
            let _ = task.tolerance_table();
            for d in DType::ALL {
                let _ = task.tolerance(d);
            }
        }
        Err(e) => check_error(&e, dir),
    }
}

fn check_error(e: &TaskError, dir: &Path) {
    let shown = e.to_string();
    assert_message("load_task", &shown);
    if let TaskError::Invalid(spec) = e {
        assert_message("load_task (spec error)", &spec.message);
        assert!(
            spec.file.starts_with(dir) || spec.file.starts_with(canonical(dir)),
            "the error names a file outside the task: {shown}"
        );
        // The one error the TOML parser cannot place is its nesting limit (thousands of
        // nested tables or dotted keys); it names the file only.
        assert!(
            !spec.field.is_empty() || spec.line.is_some() || spec.message == "recursion limit",
            "the error names neither a field nor a line: {shown}"
        );
    }
}

fn canonical(dir: &Path) -> PathBuf {
    dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf())
}

/// The task directory the inputs are loaded from, made once per process.
pub fn fixture_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        // Every input is written to disk: a memory file system keeps that cheap.
        let shm = Path::new("/dev/shm");
        let parent = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        // A static is never dropped, so the directory outlives the process: it carries the
        // process id, and those of processes that are gone are removed here.
        remove_stale(&parent);
        let tmp = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-", std::process::id()))
            .tempdir_in(&parent)
            .expect("temporary directory");
        let tasks = ksearch_task::builtin::dir().expect("the built-in tasks");
        let mut reference = String::new();
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&tasks)
            .expect("read the tasks directory")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.join("task.toml").is_file())
            .collect();
        dirs.sort();
        for d in &dirs {
            copy_tree(d, tmp.path());
            if let Ok(text) = std::fs::read_to_string(d.join("reference.py")) {
                reference.push_str(&text);
                reference.push('\n');
            }
        }
        std::fs::write(tmp.path().join("reference.py"), reference).expect("write reference.py");
        tmp
    })
    .path()
}

const PREFIX: &str = "ksearch-fuzz-task-";

/// Removes the fixture directories of processes that no longer run (Linux: `/proc/<pid>`).
fn remove_stale(parent: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from)
        .expect("read a task directory")
        .flatten()
    {
        let path = entry.path();
        let target = to.join(entry.file_name());
        if path.is_dir() {
            std::fs::create_dir_all(&target).expect("create a directory");
            copy_tree(&path, &target);
        } else if !target.exists() {
            std::fs::copy(&path, &target).expect("copy a task file");
        }
    }
}
