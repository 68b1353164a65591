//! The Python environment the harness runs in, and how ksearch chooses it.
//!
//! In order:
//!
//! 1. `KSEARCH_PYTHON`, used as it is (no probe).
//! 2. An interpreter the user already has, when it has what the harness needs: numpy, and for
//!    a GPU backend that backend's framework (torch for cuda, mlx for mlx). Looked at in this
//!    order: `$VIRTUAL_ENV`'s, `$CONDA_PREFIX`'s, then `python3` on `PATH`. Each is asked with one
//!    short subprocess (a bounded wait: [`PROBE_TIMEOUT`]) and nothing about the answer is kept,
//!    so a package installed or removed since is seen by the next command. A virtual
//!    environment made from a virtual environment would not see the first one's packages, so
//!    using the active interpreter is what keeps a venv's or conda env's torch or MLX.
//!    [`MANAGED_ENV_VAR`] skips this step (CI sets it, to test the environment ksearch builds).
//! 3. ksearch's own virtual environment in the cache directory, created on first use from
//!    `python3` on `PATH` with `--system-site-packages`: machines that have torch or mlx
//!    installed system-wide keep them, and only numpy is installed when the system does not
//!    already provide it.
//!
//! The managed environment's directory name carries a hash of the requirement list and of the
//! interpreter, so a new Python or a new requirement gets a fresh environment instead of a
//! half-matching old one.

use crate::error::{EvalError, Result};
use nix::fcntl::{Flock, FlockArg};
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use wait_timeout::ChildExt;

/// Python packages the harness needs beyond the standard library.
pub const REQUIREMENTS: &[&str] = &["numpy"];

/// Marker written into a finished environment; a directory without it is never trusted.
const READY_MARKER: &str = ".ksearch-ready";

/// Set (to anything but empty or `0`), ksearch uses its managed environment even when an active
/// interpreter has what the harness needs. `KSEARCH_PYTHON` still wins over it.
pub const MANAGED_ENV_VAR: &str = "KSEARCH_MANAGED_ENV";

/// How long one active interpreter may take to answer the probe: importing torch can take
/// seconds on a cold disk; one that takes longer is passed over.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// What the probe imports for the harness on `backend` (`None`: any backend, so only what
/// every backend needs; that is what `ksearch doctor` and the choice of a default backend ask).
pub fn required_modules(backend: Option<&str>) -> Vec<&'static str> {
    let mut modules = REQUIREMENTS.to_vec();
    match backend {
        Some("cuda") => modules.push("torch"),
        Some("mlx") => modules.push("mlx.core"),
        _ => {}
    }
    modules
}

/// Where the harness interpreter comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `KSEARCH_PYTHON`.
    Explicit,
    /// An interpreter the user already has that imports what the harness needs.
    Active,
    /// ksearch's managed virtual environment, in this directory.
    Managed { venv: PathBuf },
}

impl Source {
    pub fn as_str(&self) -> &'static str {
        match self {
            Source::Explicit => "KSEARCH_PYTHON",
            Source::Active => "active",
            Source::Managed { .. } => "managed",
        }
    }
}

/// An interpreter ksearch may use as it is, and where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub python: PathBuf,
    /// `$VIRTUAL_ENV`, `$CONDA_PREFIX` or `python3 on PATH`.
    pub origin: String,
}

/// An active interpreter that was passed over, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub candidate: Candidate,
    pub why: String,
}

/// The interpreter the harness will run under, and why it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HarnessEnv {
    /// The interpreter to run `-m ksearch_harness` with.
    pub python: PathBuf,
    pub source: Source,
    /// Why this interpreter, in one line (for `ksearch doctor` and the log).
    pub reason: String,
    /// The active interpreters looked at before it and passed over.
    pub rejected: Vec<Rejected>,
}

impl HarnessEnv {
    /// The managed virtual environment, when that is the choice.
    pub fn venv(&self) -> Option<&Path> {
        match &self.source {
            Source::Managed { venv } => Some(venv),
            _ => None,
        }
    }
}

/// What the choice looks at; [`Lookup::from_env`] reads it from the process environment.
#[derive(Debug, Clone)]
pub struct Lookup {
    /// `KSEARCH_PYTHON`.
    pub explicit: Option<PathBuf>,
    /// [`MANAGED_ENV_VAR`]: skip the active interpreters.
    pub managed_only: bool,
    /// Active interpreters, in order of preference, without duplicates.
    pub active: Vec<Candidate>,
    /// The interpreter the managed environment is made from (`python3` on `PATH`).
    pub base: Option<PathBuf>,
    /// Where the managed environment lives.
    pub cache: PathBuf,
    pub probe_timeout: Duration,
}

impl Lookup {
    /// From this process's environment and [`ksearch_assets::cache_dir`].
    pub fn from_env() -> Lookup {
        Lookup::from_vars(|name| std::env::var_os(name), ksearch_assets::cache_dir())
    }

    /// From the variables `var` gives (`KSEARCH_PYTHON`, [`MANAGED_ENV_VAR`], `VIRTUAL_ENV`,
    /// `CONDA_PREFIX`, `PATH`).
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>, cache: PathBuf) -> Lookup {
        let set = |name: &str| var(name).filter(|v| !v.is_empty());
        let base = set("PATH").and_then(|path| python3_on(&path));
        let mut active: Vec<Candidate> = Vec::new();
        let mut add = |python: Option<PathBuf>, origin: &str| {
            if let Some(python) = python {
                if !active.iter().any(|c| c.python == python) {
                    active.push(Candidate {
                        python,
                        origin: origin.to_string(),
                    });
                }
            }
        };
        add(
            set("VIRTUAL_ENV").and_then(|d| env_python(Path::new(&d))),
            "$VIRTUAL_ENV",
        );
        add(
            set("CONDA_PREFIX").and_then(|d| env_python(Path::new(&d))),
            "$CONDA_PREFIX",
        );
        add(base.clone(), "python3 on PATH");
        Lookup {
            explicit: set("KSEARCH_PYTHON").map(PathBuf::from),
            managed_only: set(MANAGED_ENV_VAR).is_some_and(|v| v != "0"),
            active,
            base,
            cache,
            probe_timeout: PROBE_TIMEOUT,
        }
    }
}

/// The interpreter of a virtual or conda environment: `bin/python3`, else `bin/python` (the
/// name `python3` matches what `PATH` finds once the environment is activated).
fn env_python(prefix: &Path) -> Option<PathBuf> {
    ["python3", "python"]
        .iter()
        .map(|name| prefix.join("bin").join(name))
        .find(|p| is_executable(p))
}

/// Chooses the harness interpreter for any backend (see the module docs).
pub fn resolve() -> Result<HarnessEnv> {
    resolve_for(None)
}

/// Chooses the harness interpreter for `backend` from this process's environment (see the
/// module docs), creating the managed environment when that is the choice, and logs the choice.
pub fn resolve_for(backend: Option<&str>) -> Result<HarnessEnv> {
    let env = choose(&Lookup::from_env(), backend)?;
    tracing::info!(python = %env.python.display(), "harness interpreter: {}", env.reason);
    Ok(env)
}

/// The choice itself, on what `lookup` says.
pub fn choose(lookup: &Lookup, backend: Option<&str>) -> Result<HarnessEnv> {
    if let Some(python) = &lookup.explicit {
        return Ok(HarnessEnv {
            python: python.clone(),
            source: Source::Explicit,
            reason: "KSEARCH_PYTHON names it".into(),
            rejected: Vec::new(),
        });
    }
    let modules = required_modules(backend);
    let mut rejected = Vec::new();
    if !lookup.managed_only {
        for candidate in &lookup.active {
            match probe(&candidate.python, &modules, lookup.probe_timeout) {
                Ok(found) => {
                    return Ok(HarnessEnv {
                        python: candidate.python.clone(),
                        source: Source::Active,
                        reason: format!("{} imports {found}", candidate.origin),
                        rejected,
                    })
                }
                Err(why) => rejected.push(Rejected {
                    candidate: candidate.clone(),
                    why,
                }),
            }
        }
    }
    let reason = if lookup.managed_only {
        format!("managed environment: {MANAGED_ENV_VAR} is set")
    } else if rejected.is_empty() {
        "managed environment: no active interpreter was found".to_string()
    } else {
        let passed: Vec<String> = rejected
            .iter()
            .map(|r| {
                format!(
                    "{} ({}) {}",
                    r.candidate.origin,
                    r.candidate.python.display(),
                    r.why
                )
            })
            .collect();
        format!("managed environment: {}", passed.join("; "))
    };
    let base = lookup.base.as_ref().ok_or(EvalError::PythonNotFound)?;
    let python = ensure_venv(&lookup.cache, base)?;
    let venv = python
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| python.clone());
    Ok(HarnessEnv {
        python,
        source: Source::Managed { venv },
        reason,
        rejected,
    })
}

/// Asks `python` to import `modules` (stopping at the first that fails) in one subprocess,
/// bounded by `timeout`. `Ok`: what it imported, with versions (`numpy 2.1.0, torch 2.5.1`);
/// `Err`: why it will not do, in words.
fn probe(python: &Path, modules: &[&str], timeout: Duration) -> Result<String, String> {
    // Imports may print; only the answer goes to the real stdout. Python older than 3.10 (which
    // the harness needs) must still get as far as saying so.
    const SCRIPT: &str = r#"
import importlib, json, sys
out, sys.stdout = sys.stdout, sys.stderr
found = {"python": sys.version.split()[0], "modules": [], "error": None}
if sys.version_info < (3, 10):
    found["error"] = "is Python %s; the harness needs 3.10 or newer" % found["python"]
else:
    for name in sys.argv[1:]:
        try:
            module = importlib.import_module(name)
        except BaseException as e:
            found["error"] = "cannot import %s (%s: %s)" % (name, type(e).__name__, e)
            break
        found["modules"].append([name, str(getattr(module, "__version__", "") or "")])
out.write(json.dumps(found) + "\n")
"#;
    let mut cmd = Command::new(python);
    cmd.arg("-c")
        .arg(SCRIPT)
        .args(modules)
        .env_clear()
        .envs(crate::harness::probe_env(std::env::vars_os()))
        // Away from the caller's directory, whose files would shadow modules on `sys.path`.
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot be started ({e})"))?;
    // Read on a thread, so output larger than a pipe's buffer cannot stall the wait; the thread
    // is not waited for past the probe, since a process the interpreter started could hold the
    // pipe open.
    let mut stdout = child.stdout.take();
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(out) = stdout.as_mut() {
            let _ = out.read_to_string(&mut text);
        }
        let _ = send.send(text);
    });
    let status = match child.wait_timeout(timeout) {
        Ok(Some(status)) => status,
        Ok(None) | Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("did not answer within {} s", timeout.as_secs_f64()));
        }
    };
    let text = receive
        .recv_timeout(Duration::from_secs(1))
        .unwrap_or_default();
    let answer: Option<serde_json::Value> = text
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok());
    let Some(answer) = answer else {
        return Err(format!("gave no answer ({status})"));
    };
    if let Some(e) = answer["error"].as_str() {
        return Err(e.to_string());
    }
    let found: Vec<String> = answer["modules"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| {
                    let name = m[0].as_str().unwrap_or("?");
                    match m[1].as_str() {
                        Some(v) if !v.is_empty() => format!("{name} {v}"),
                        _ => name.to_string(),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    if found.len() != modules.len() {
        return Err("gave an incomplete answer".into());
    }
    Ok(found.join(", "))
}

/// `python3` from `PATH`.
pub fn find_python3() -> Result<PathBuf> {
    let path = std::env::var_os("PATH").ok_or(EvalError::PythonNotFound)?;
    python3_on(&path).ok_or(EvalError::PythonNotFound)
}

/// The first executable `python3` in the directories of `path` (a `PATH` value).
fn python3_on(path: &std::ffi::OsStr) -> Option<PathBuf> {
    std::env::split_paths(path)
        .map(|dir| dir.join("python3"))
        .find(|candidate| is_executable(candidate))
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

    /// A stand-in for an interpreter the user has, written in sh: it answers the probe as if
    /// `have` (module names) were installed, after `delay` seconds, and logs each call.
    fn fake_active(dir: &Path, name: &str, have: &[&str], delay: f64) -> PathBuf {
        let bin = dir.join(name).join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let path = bin.join("python3");
        let script = format!(
            r#"#!/bin/sh
echo probe >> {log}
sleep {delay}
shift 2
found=""
for m in "$@"; do
  case " {have} " in
    *" $m "*) found="$found${{found:+,}}[\"$m\", \"1.$#\"]" ;;
    *) printf '{{"python": "3.12.1", "modules": [], "error": "cannot import %s (ModuleNotFoundError: No module named %s)"}}\n' "$m" "$m"; exit 0 ;;
  esac
done
printf '{{"python": "3.12.1", "modules": [%s], "error": null}}\n' "$found"
"#,
            log = dir.join(format!("{name}.log")).display(),
            have = have.join(" "),
        );
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn probes(dir: &Path, name: &str) -> usize {
        calls_in(&dir.join(format!("{name}.log")))
    }

    fn calls_in(log: &Path) -> usize {
        std::fs::read_to_string(log)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    fn lookup(active: &[(&Path, &str)], base: Option<PathBuf>, cache: &Path) -> Lookup {
        Lookup {
            explicit: None,
            managed_only: false,
            active: active
                .iter()
                .map(|(p, o)| Candidate {
                    python: p.to_path_buf(),
                    origin: o.to_string(),
                })
                .collect(),
            base,
            cache: cache.to_path_buf(),
            probe_timeout: Duration::from_secs(20),
        }
    }

    fn cache_is_empty(cache: &Path) -> bool {
        std::fs::read_dir(cache).unwrap().next().is_none()
    }

    #[test]
    fn an_active_interpreter_with_the_backends_framework_comes_before_the_managed_one() {
        let dir = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let venv = fake_active(dir.path(), "venv", &["numpy", "torch"], 0.0);
        let system = fake_active(dir.path(), "system", &["numpy"], 0.0);
        let l = lookup(
            &[(&venv, "$VIRTUAL_ENV"), (&system, "python3 on PATH")],
            None,
            cache.path(),
        );
        let env = choose(&l, Some("cuda")).unwrap();
        assert_eq!(env.python, venv);
        assert_eq!(env.source, Source::Active);
        assert_eq!(env.reason, "$VIRTUAL_ENV imports numpy 1.2, torch 1.2");
        assert!(env.rejected.is_empty());
        assert_eq!(
            probes(dir.path(), "system"),
            0,
            "the first that fits is taken"
        );
        assert!(cache_is_empty(cache.path()), "no environment was built");
    }

    #[test]
    fn an_interpreter_without_the_framework_is_passed_over_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let conda = fake_active(dir.path(), "conda", &["numpy"], 0.0);
        let system = fake_active(dir.path(), "system", &["numpy", "mlx.core"], 0.0);
        let l = lookup(
            &[(&conda, "$CONDA_PREFIX"), (&system, "python3 on PATH")],
            None,
            cache.path(),
        );
        let env = choose(&l, Some("mlx")).unwrap();
        assert_eq!(env.python, system);
        assert_eq!(env.rejected.len(), 1);
        assert_eq!(env.rejected[0].candidate.python, conda);
        assert!(
            env.rejected[0].why.contains("cannot import mlx.core"),
            "{:?}",
            env.rejected
        );
        // The cpu backend needs numpy alone: the first interpreter does.
        assert_eq!(choose(&l, Some("cpu")).unwrap().python, conda);
        assert_eq!(choose(&l, None).unwrap().python, conda);
    }

    #[test]
    fn without_a_fitting_interpreter_the_managed_environment_is_built_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let system = fake_active(dir.path(), "system", &["numpy"], 0.0);
        let base = fake_python(bin.path(), true, true, true);
        let l = lookup(&[(&system, "python3 on PATH")], Some(base), cache.path());
        let env = choose(&l, Some("cuda")).unwrap();
        let Source::Managed { venv } = &env.source else {
            panic!("{env:?}")
        };
        assert!(venv.starts_with(cache.path()), "{venv:?}");
        assert_eq!(env.python, venv.join("bin").join("python"));
        assert!(env
            .reason
            .starts_with("managed environment: python3 on PATH ("));
        assert!(env.reason.contains("cannot import torch"), "{}", env.reason);
        assert_eq!(calls(bin.path(), "-m venv --system-site-packages"), 1);
    }

    #[test]
    fn the_managed_switch_and_ksearch_python_skip_the_active_interpreters() {
        let dir = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let system = fake_active(dir.path(), "system", &["numpy", "torch"], 0.0);
        let base = fake_python(bin.path(), true, true, true);
        let mut l = lookup(&[(&system, "python3 on PATH")], Some(base), cache.path());
        l.managed_only = true;
        let env = choose(&l, None).unwrap();
        assert!(env.venv().is_some(), "{env:?}");
        assert_eq!(
            env.reason,
            "managed environment: KSEARCH_MANAGED_ENV is set"
        );
        l.explicit = Some(PathBuf::from("/opt/mine/python"));
        let env = choose(&l, Some("cuda")).unwrap();
        assert_eq!(env.python, Path::new("/opt/mine/python"));
        assert_eq!(env.source, Source::Explicit);
        assert_eq!(probes(dir.path(), "system"), 0);
    }

    #[test]
    fn an_interpreter_that_hangs_is_passed_over_after_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let slow = fake_active(dir.path(), "slow", &["numpy"], 30.0);
        let quick = fake_active(dir.path(), "quick", &["numpy"], 0.0);
        let mut l = lookup(
            &[(&slow, "$VIRTUAL_ENV"), (&quick, "python3 on PATH")],
            None,
            cache.path(),
        );
        l.probe_timeout = Duration::from_millis(300);
        let started = std::time::Instant::now();
        let env = choose(&l, None).unwrap();
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(env.python, quick);
        assert!(
            env.rejected[0].why.contains("did not answer within 0.3 s"),
            "{:?}",
            env.rejected
        );
    }

    #[test]
    fn the_lookup_reads_the_activated_environments_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let venv = fake_active(dir.path(), "venv", &[], 0.0);
        let conda = fake_active(dir.path(), "conda", &[], 0.0);
        let prefix = |p: &Path| p.parent().unwrap().parent().unwrap().as_os_str().to_owned();
        let path =
            std::env::join_paths([venv.parent().unwrap(), Path::new("/nonexistent")]).unwrap();
        let vars = |managed: &'static str| {
            let (venv, conda, path) = (prefix(&venv), prefix(&conda), path.clone());
            move |name: &str| match name {
                "VIRTUAL_ENV" => Some(venv.clone()),
                "CONDA_PREFIX" => Some(conda.clone()),
                "PATH" => Some(path.clone()),
                "KSEARCH_MANAGED_ENV" => Some(managed.into()),
                _ => None,
            }
        };
        let l = Lookup::from_vars(vars("0"), PathBuf::from("/cache"));
        let found: Vec<(PathBuf, String)> = l
            .active
            .iter()
            .map(|c| (c.python.clone(), c.origin.clone()))
            .collect();
        // The activated venv's python3 is also the first on PATH: looked at once.
        assert_eq!(
            found,
            [
                (venv.clone(), "$VIRTUAL_ENV".to_string()),
                (conda.clone(), "$CONDA_PREFIX".to_string())
            ]
        );
        assert_eq!(l.base, Some(venv.clone()));
        assert!(!l.managed_only && l.explicit.is_none());
        assert!(Lookup::from_vars(vars("1"), PathBuf::from("/cache")).managed_only);
    }

    /// The probe script itself, with a real interpreter: what it imports and what it cannot.
    #[test]
    fn a_real_interpreter_answers_the_probe() {
        let Ok(python) = find_python3() else {
            eprintln!("skipped: no python3 on PATH");
            return;
        };
        let t = Duration::from_secs(30);
        let found = probe(&python, &["json"], t).unwrap();
        assert!(found.starts_with("json "), "{found}");
        let why = probe(&python, &["json", "ksearch_no_such_module"], t).unwrap_err();
        assert!(
            why.contains("cannot import ksearch_no_such_module (ModuleNotFoundError"),
            "{why}"
        );
    }
}
