//! The evaluator's scratch directory, where build directories go when the caller names none.
//!
//! It is a temporary directory named after the process that made it
//! (`ksearch-eval-<pid>-<random>`), removed when the evaluator is dropped. A process that is
//! killed (SIGKILL, a crash, a test that kills runs on purpose) cannot remove its own, so each
//! new scratch directory is made after removing those of processes that no longer exist: a
//! killed run leaves its builds behind only until the next evaluator starts on the machine.
//! The harness's judges keep their own scratch the same way (`harness/ksearch_harness/scratch.py`);
//! both assume the temporary directory is not shared with ksearch processes in another pid
//! namespace, whose live processes would look gone from here.

use std::ffi::OsStr;
use std::io;
use std::path::Path;

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

/// What every scratch directory's name starts with, before its owner's process id.
pub const PREFIX: &str = "ksearch-eval-";

/// A new scratch directory in `parent` (removed when dropped), after [`sweep`]ing `parent`.
pub fn create(parent: &Path) -> io::Result<tempfile::TempDir> {
    let removed = sweep(parent);
    if removed > 0 {
        tracing::debug!(
            "removed {removed} scratch director(ies) of ksearch processes that are gone"
        );
    }
    tempfile::Builder::new()
        .prefix(&format!("{PREFIX}{}-", std::process::id()))
        .tempdir_in(parent)
}

/// Removes the scratch directories in `parent` whose owning process no longer exists;
/// returns how many. A directory of a live process, of another user (whose process ksearch
/// may not signal) or without an owner in its name is left alone.
pub fn sweep(parent: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| owner(&e.file_name()).is_some_and(|pid| !alive(pid)))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| std::fs::remove_dir_all(e.path()).is_ok())
        .count()
}

/// The process id in a scratch directory's name (`ksearch-eval-<pid>-<random>`).
fn owner(name: &OsStr) -> Option<i32> {
    let (pid, _) = name.to_str()?.strip_prefix(PREFIX)?.split_once('-')?;
    pid.parse().ok().filter(|&p: &i32| p > 0)
}

/// Whether a process with this id exists (signal 0 checks without sending anything).
fn alive(pid: i32) -> bool {
    !matches!(kill(Pid::from_raw(pid), None), Err(Errno::ESRCH))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id of a process that has exited and been reaped.
    fn gone_pid() -> i32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        pid
    }

    #[test]
    fn the_scratch_of_a_process_that_is_gone_is_removed_and_a_live_ones_is_kept() {
        let parent = tempfile::tempdir().unwrap();
        let dead = parent.path().join(format!("{PREFIX}{}-abc123", gone_pid()));
        std::fs::create_dir_all(dead.join("builds/x")).unwrap();
        std::fs::write(dead.join("builds/x/kernel.so"), b"left by a killed run").unwrap();
        let live = parent
            .path()
            .join(format!("{PREFIX}{}-def456", std::process::id()));
        std::fs::create_dir(&live).unwrap();
        // Not scratch directories: another name, a name without an owner, a file.
        let other = parent.path().join("ksearch-eval-XyZ123");
        std::fs::create_dir(&other).unwrap();
        let unrelated = parent.path().join("some-build");
        std::fs::create_dir(&unrelated).unwrap();
        let file = parent.path().join(format!("{PREFIX}{}-file", gone_pid()));
        std::fs::write(&file, b"").unwrap();

        let made = create(parent.path()).unwrap();

        assert!(!dead.exists(), "a gone process's scratch stays");
        for kept in [&live, &other, &unrelated, &file, &made.path().to_path_buf()] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
        let name = made.path().file_name().unwrap().to_owned();
        assert_eq!(owner(&name), Some(std::process::id() as i32));
        // Another sweep finds nothing more to remove.
        assert_eq!(sweep(parent.path()), 0);
    }

    #[test]
    fn owners_are_read_from_names_of_the_scratch_form_only() {
        assert_eq!(owner(OsStr::new("ksearch-eval-42-a1b2c3")), Some(42));
        for name in [
            "ksearch-eval-a1b2c3",
            "ksearch-eval--a1b2",
            "ksearch-eval-0-a1b2",
            "ksearch-eval-x42-a1",
            "ksearch-judge-42-a1",
        ] {
            assert_eq!(owner(OsStr::new(name)), None, "{name}");
        }
    }
}
