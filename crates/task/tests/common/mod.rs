//! What the task tests share: a small task written to a temporary directory, edited one exact
//! replacement at a time, and loaded.

use ksearch_task::{load_task, Task, TaskError};
use std::path::Path;

/// A task directory: `task.toml` (written at each load) and fixed files beside it.
pub struct Fixture {
    dir: tempfile::TempDir,
    toml: String,
    files: &'static [(&'static str, &'static str)],
}

impl Fixture {
    /// `files`: (path relative to the task directory, contents), e.g. `reference.py`.
    pub fn new(toml: &str, files: &'static [(&'static str, &'static str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        Fixture {
            dir,
            toml: toml.to_string(),
            files,
        }
    }

    /// A new fixture with exactly one occurrence of `from` replaced, so a stale edit fails
    /// loudly; this one stays as it is.
    pub fn replace(&self, from: &str, to: &str) -> Self {
        assert_eq!(self.toml.matches(from).count(), 1, "edit target {from:?}");
        Fixture::new(&self.toml.replacen(from, to, 1), self.files)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn load(&self) -> Result<Task, TaskError> {
        std::fs::write(self.path().join("task.toml"), &self.toml).unwrap();
        load_task(self.path())
    }

    /// The load error, with the temporary directory replaced by `<task>`.
    pub fn error(&self) -> String {
        let err = match self.load() {
            Ok(task) => panic!("expected an error, loaded {}", task.name()),
            Err(e) => e,
        };
        let dir = self.path().canonicalize().unwrap();
        err.to_string().replace(dir.to_str().unwrap(), "<task>")
    }
}
