//! The Python environment the harness runs in.
//!
//! By default ksearch keeps its own virtual environment in the cache directory, created on
//! first use with `--system-site-packages`: machines that have torch or mlx installed
//! system-wide (our GPU box has no network, so nothing could be installed there) keep them,
//! and only numpy is installed when the system does not already provide it.
//!
//! The directory name carries a hash of the requirement list and of the interpreter, so a new
//! Python or a new requirement gets a fresh environment instead of a half-matching old one.
//! `KSEARCH_PYTHON` skips all of this and uses the given interpreter as it is.

use crate::error::{EvalError, Result};
use nix::fcntl::{Flock, FlockArg};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Python packages the harness needs beyond the standard library.
pub const REQUIREMENTS: &[&str] = &["numpy"];

/// Marker written into a finished environment; a directory without it is never trusted.
const READY_MARKER: &str = ".ksearch-ready";

/// The interpreter the harness will run under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HarnessEnv {
    /// The interpreter to run `-m ksearch_harness` with.
    pub python: PathBuf,
    /// The managed virtual environment, or `None` when `KSEARCH_PYTHON` chose the interpreter.
    pub venv: Option<PathBuf>,
}

/// Resolves the harness interpreter: `KSEARCH_PYTHON` if set, otherwise the managed virtual
/// environment under [`ksearch_assets::cache_dir`], created on first use.
pub fn resolve() -> Result<HarnessEnv> {
    if let Some(python) = std::env::var_os("KSEARCH_PYTHON").filter(|p| !p.is_empty()) {
        return Ok(HarnessEnv {
            python: PathBuf::from(python),
            venv: None,
        });
    }
    let base = find_python3()?;
    let python = ensure_venv(&ksearch_assets::cache_dir(), &base)?;
    Ok(HarnessEnv {
        venv: python
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf),
        python,
    })
}

/// `python3` from `PATH`.
pub fn find_python3() -> Result<PathBuf> {
    let path = std::env::var_os("PATH").ok_or(EvalError::PythonNotFound)?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("python3"))
        .find(|candidate| is_executable(candidate))
        .ok_or(EvalError::PythonNotFound)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The directory the managed environment for `base_python` lives in (it may not exist yet).
pub fn venv_dir(cache: &Path, base_python: &Path) -> Result<PathBuf> {
    let identity = interpreter_identity(base_python)?;
    let mut hasher = blake3::Hasher::new();
    for req in REQUIREMENTS {
        hasher.update(req.as_bytes());
        hasher.update(b"\n");
    }
    hasher.update(b"\0");
    hasher.update(identity.as_bytes());
    let hash = hasher.finalize().to_hex();
    Ok(cache.join(format!("harness-venv-{}", &hash[..16])))
}

/// Version and real location of an interpreter: two Pythons of the same version but different
/// installations see different system site-packages, so both go into the hash.
fn interpreter_identity(base_python: &Path) -> Result<String> {
    let out = run(
        Command::new(base_python).args([
            "-c",
            "import os, sys; print(sys.version); print(os.path.realpath(sys.executable))",
        ]),
        base_python,
    )?;
    if !out.status.success() {
        return Err(EvalError::EnvSetup {
            command: format!("{} -c 'import sys'", base_python.display()),
            hint: "the interpreter does not start; check your Python 3 installation".into(),
            output: output_text(&out),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Creates (once) the managed environment for `base_python` under `cache` and returns its
/// interpreter. Safe against concurrent first runs: a lock file serialises creators, and the
/// environment is built under a temporary name and renamed into place only when complete, so
/// a crash never leaves a directory that later runs would trust.
pub fn ensure_venv(cache: &Path, base_python: &Path) -> Result<PathBuf> {
    let dir = venv_dir(cache, base_python)?;
    if is_ready(&dir) {
        return Ok(venv_python(&dir));
    }
    std::fs::create_dir_all(cache).map_err(|source| EvalError::Io {
        path: cache.to_path_buf(),
        source,
    })?;
    let lock_path = dir.with_extension("lock");
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|source| EvalError::Io {
            path: lock_path.clone(),
            source,
        })?;
    let _lock =
        Flock::lock(lock_file, FlockArg::LockExclusive).map_err(|(_, errno)| EvalError::Io {
            path: lock_path.clone(),
            source: errno.into(),
        })?;
    // Someone else may have finished while we waited for the lock.
    if is_ready(&dir) {
        return Ok(venv_python(&dir));
    }
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| EvalError::Io { path, source }
    };
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(io_err(&dir))?;
    }
    eprintln!(
        "ksearch: setting up the evaluation environment in {} (first run only)",
        dir.display()
    );
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = cache.join(format!(".{name}.tmp-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
    }
    let built = build_venv(base_python, &tmp);
    if let Err(e) = built {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    std::fs::write(tmp.join(READY_MARKER), REQUIREMENTS.join("\n")).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, &dir).map_err(io_err(&dir))?;
    tracing::info!(venv = %dir.display(), "harness environment ready");
    Ok(venv_python(&dir))
}

fn build_venv(base_python: &Path, tmp: &Path) -> Result<()> {
    let mut venv = Command::new(base_python);
    venv.args(["-m", "venv", "--system-site-packages"]).arg(tmp);
    let out = run(&mut venv, base_python)?;
    if !out.status.success() {
        return Err(EvalError::EnvSetup {
            command: format!("{} -m venv", base_python.display()),
            hint: "install python3-venv (Debian/Ubuntu: `apt install python3-venv`), or set \
                   KSEARCH_PYTHON to an interpreter that has numpy"
                .into(),
            output: output_text(&out),
        });
    }
    let python = venv_python(tmp);
    for req in REQUIREMENTS {
        if imports(&python, req)? {
            continue;
        }
        let mut pip = Command::new(&python);
        pip.args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            req,
        ]);
        let out = run(&mut pip, &python)?;
        if !out.status.success() || !imports(&python, req)? {
            return Err(EvalError::EnvSetup {
                command: format!("pip install {req}"),
                hint: format!(
                    "could not install {req} (no network?): install it for {} system-wide \
                     (Debian/Ubuntu: `apt install python3-{req}`), or set KSEARCH_PYTHON to an \
                     interpreter that has it",
                    base_python.display()
                ),
                output: output_text(&out),
            });
        }
    }
    Ok(())
}

fn imports(python: &Path, module: &str) -> Result<bool> {
    let out = run(
        Command::new(python).args(["-c", &format!("import {module}")]),
        python,
    )?;
    Ok(out.status.success())
}

fn is_ready(dir: &Path) -> bool {
    dir.join(READY_MARKER).is_file() && venv_python(dir).exists()
}

fn venv_python(dir: &Path) -> PathBuf {
    dir.join("bin").join("python")
}

fn run(cmd: &mut Command, program: &Path) -> Result<Output> {
    cmd.output().map_err(|source| EvalError::Spawn {
        program: program.display().to_string(),
        source,
    })
}

fn output_text(out: &Output) -> String {
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    crate::harness::tail_of(text.trim(), 4000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in for `python3` written in sh: answers the identity query, creates "venvs"
    /// whose interpreter reports numpy as present or missing, and counts venv creations.
    fn fake_python(dir: &Path, venv_ok: bool, has_numpy: bool, pip_ok: bool) -> PathBuf {
        let log = dir.join("calls.log");
        let venv_python = format!(
            "#!/bin/sh\necho \"$@\" >> {log}\ncase \"$*\" in\n  \"-c import numpy\") {numpy} ;;\n  \"-m pip install\"*) {pip} ;;\nesac\nexit 0\n",
            log = log.display(),
            numpy = if has_numpy {
                "exit 0".to_string()
            } else {
                format!("test -f {}/pip-done; exit $?", dir.display())
            },
            pip = if pip_ok {
                format!("touch {}/pip-done; exit 0", dir.display())
            } else {
                "echo 'ERROR: No matching distribution found for numpy' >&2; exit 1".into()
            },
        );
        std::fs::write(dir.join("venv-python"), venv_python).unwrap();
        let script = format!(
            "#!/bin/sh\necho \"$@\" >> {log}\ncase \"$1 $2\" in\n  \"-c import os, sys\"*) echo '3.11.7 (fake)'; echo /opt/fake/python3 ;;\n  \"-m venv\") {venv} ;;\nesac\n",
            log = log.display(),
            venv = if venv_ok {
                format!(
                    "sleep 0.2; mkdir -p \"$4/bin\" && cp {} \"$4/bin/python\"",
                    dir.join("venv-python").display()
                )
            } else {
                "echo 'The virtual environment was not created successfully because ensurepip is not available.'; exit 1".into()
            },
        );
        let path = dir.join("python3");
        std::fs::write(&path, script).unwrap();
        for p in [&path, &dir.join("venv-python")] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        path
    }

    fn calls(dir: &Path, needle: &str) -> usize {
        std::fs::read_to_string(dir.join("calls.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .count()
    }

    #[test]
    fn concurrent_first_runs_create_one_environment() {
        let bin = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let python = fake_python(bin.path(), true, true, true);
        let results: Vec<PathBuf> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| ensure_venv(cache.path(), &python).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(results.windows(2).all(|w| w[0] == w[1]));
        assert!(results[0].is_file());
        assert_eq!(calls(bin.path(), "-m venv --system-site-packages"), 1);
        assert_eq!(calls(bin.path(), "pip install"), 0, "numpy was importable");
        // Nothing half-built is left behind; only the environment and its lock file.
        let mut names: Vec<String> = std::fs::read_dir(cache.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names[0].starts_with("harness-venv-") && !names[0].ends_with(".lock"));
        assert!(names[1].ends_with(".lock"));
    }

    #[test]
    fn numpy_is_installed_only_when_missing() {
        let bin = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let python = fake_python(bin.path(), true, false, true);
        let venv_python = ensure_venv(cache.path(), &python).unwrap();
        assert_eq!(calls(bin.path(), "-m pip install"), 1);
        // Second use: the ready environment is reused without running anything but the
        // identity query.
        let before = calls(bin.path(), "");
        assert_eq!(ensure_venv(cache.path(), &python).unwrap(), venv_python);
        assert_eq!(calls(bin.path(), "") - before, 1);
    }

    #[test]
    fn missing_venv_module_names_the_package_to_install() {
        let bin = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let python = fake_python(bin.path(), false, true, true);
        let err = ensure_venv(cache.path(), &python).unwrap_err().to_string();
        assert!(err.contains("python3-venv"), "{err}");
        assert!(err.contains("ensurepip is not available"), "{err}");
        let left: Vec<_> = std::fs::read_dir(cache.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| !n.to_string_lossy().ends_with(".lock"))
            .collect();
        assert!(left.is_empty(), "failed build left {left:?}");
    }

    #[test]
    fn failed_numpy_install_says_how_to_fix_it() {
        let bin = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let python = fake_python(bin.path(), true, false, false);
        let err = ensure_venv(cache.path(), &python).unwrap_err().to_string();
        assert!(err.contains("pip install numpy"), "{err}");
        assert!(err.contains("KSEARCH_PYTHON"), "{err}");
        assert!(err.contains("No matching distribution"), "{err}");
    }

    #[test]
    fn the_directory_depends_on_the_interpreter() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let cache = Path::new("/nonexistent-cache");
        let pa = fake_python(a.path(), true, true, true);
        let pb = fake_python(b.path(), true, true, true);
        // Same fake identity: same directory.
        assert_eq!(venv_dir(cache, &pa).unwrap(), venv_dir(cache, &pb).unwrap());
        let script = std::fs::read_to_string(&pb)
            .unwrap()
            .replace("3.11.7 (fake)", "3.12.3 (fake)");
        std::fs::write(&pb, script).unwrap();
        assert_ne!(venv_dir(cache, &pa).unwrap(), venv_dir(cache, &pb).unwrap());
    }
}
