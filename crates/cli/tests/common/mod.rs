//! What the binary's end-to-end tests share: the checkout and a `ksearch` command set up to
//! read it, with its own cache, and with the interpreter CI names (`KSEARCH_TEST_PYTHON`).

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use assert_cmd::Command;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The environment every test run of the binary gets: this checkout (`KSEARCH_ROOT`, also the
/// working directory), a cache kept in the target directory unless `KSEARCH_CACHE_DIR` names
/// one, no `RUST_LOG`, and `KSEARCH_PYTHON` only when `KSEARCH_TEST_PYTHON` gives it.
pub fn configure(cmd: &mut std::process::Command) {
    let cache = std::env::var_os("KSEARCH_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("ksearch-cache"));
    cmd.env("KSEARCH_CACHE_DIR", cache)
        .env("KSEARCH_ROOT", workspace_root())
        .env_remove("RUST_LOG")
        .current_dir(workspace_root());
    match std::env::var_os("KSEARCH_TEST_PYTHON") {
        Some(p) => cmd.env("KSEARCH_PYTHON", p),
        None => cmd.env_remove("KSEARCH_PYTHON"),
    };
}

/// `ksearch` with [`configure`]'s environment.
pub fn ksearch() -> Command {
    let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("ksearch"));
    configure(&mut cmd);
    Command::from_std(cmd)
}

/// A Python 3 that imports numpy, for tests that need one and cannot build the managed
/// environment in a cache of their own (that may need the network): `KSEARCH_TEST_PYTHON`, else
/// `python3` on PATH by its real path when it imports numpy; `None` (the caller skips, saying
/// so) when neither is there.
pub fn numpy_python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KSEARCH_TEST_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let out = std::process::Command::new("python3")
        .args(["-c", "import numpy, sys; print(sys.executable)"])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !path.is_empty()).then(|| PathBuf::from(path))
}

/// Opens an HTML report in headless Chromium (`browser_check.py`: the tree and the chart
/// render, clicking a candidate shows its source, no console errors) and saves a screenshot as
/// `<target>/tmp/browser/<shot>`; returns what the check saw. `None` (the caller skips, saying
/// so) when Chromium or chromedriver is not installed, unless `KSEARCH_TEST_BROWSER=1` (set by
/// `.ci/run`, which installs them) makes their absence a failure.
pub fn browser_check(report: &Path, shot: &str) -> Option<serde_json::Value> {
    let chromium = std::env::var_os("KSEARCH_TEST_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    let driver = std::env::var_os("KSEARCH_TEST_CHROMEDRIVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromedriver"));
    let required = std::env::var("KSEARCH_TEST_BROWSER").as_deref() == Ok("1");
    if !(chromium.exists() && driver.exists()) {
        assert!(
            !required,
            "KSEARCH_TEST_BROWSER=1 but {} or {} is missing",
            chromium.display(),
            driver.display()
        );
        eprintln!(
            "skipped the browser check: no {} or {}",
            chromium.display(),
            driver.display()
        );
        return None;
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("browser");
    std::fs::create_dir_all(&dir).unwrap();
    let out = std::process::Command::new("python3")
        .arg(workspace_root().join("crates/cli/tests/browser_check.py"))
        .arg("--report")
        .arg(report)
        .arg("--screenshot")
        .arg(dir.join(shot))
        .arg("--chromium")
        .arg(&chromium)
        .arg("--chromedriver")
        .arg(&driver)
        .output()
        .expect("python3 runs browser_check.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "browser check failed ({}): {stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("browser check: {}", stdout.trim());
    Some(serde_json::from_str(stdout.trim()).expect("browser_check prints one JSON line"))
}
