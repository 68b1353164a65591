//! End-to-end tests of the `ksearch` binary against the real harness and built-in tasks.
//!
//! Evaluations need Python 3 with numpy: `KSEARCH_TEST_PYTHON` names one (CI sets it), else
//! the binary creates its managed environment once in a cache under `target/` shared by all
//! tests (`KSEARCH_CACHE_DIR` overrides the location).

mod common;
use common::{ksearch, workspace_root};
use predicates::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The machine, as the tests that run evaluations share it: those take it `shared`; a test
/// whose claim is about timing noise takes it `alone`, since other tests' evaluations on the
/// same cores (two on CI) would add noise between its evaluations that no single evaluation's
/// interval can know of. Under `cargo test` the tests of this file are threads of one process
/// and this lock orders them; nextest runs each in a process of its own and gives the timing
/// test the machine through `.config/nextest.toml` instead.
static MACHINE: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(|e| e.into_inner())
}

fn alone() -> RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(|e| e.into_inner())
}

fn candidate(dir: &Path, name: &str, source: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, source).unwrap();
    path
}

const SOFTMAX_SEED: &str = "tasks/softmax/seed/naive.c";

#[test]
fn help_lists_every_command_and_each_has_its_own() {
    ksearch()
        .arg("--help")
        .assert()
        .success()
        .stdout(predicate::str::contains("tasks"))
        .stdout(predicate::str::contains("eval"))
        .stdout(predicate::str::contains("doctor"));
    for (cmd, flag) in [
        ("tasks", "--json"),
        ("eval", "--held-out"),
        ("doctor", "--python-path"),
    ] {
        ksearch()
            .args([cmd, "--help"])
            .assert()
            .success()
            .stdout(predicate::str::contains(flag));
    }
}

/// While one process writes a run, a `resume` of it is refused at once with the holder's pid,
/// and `show` says the run is running; once the holder is gone, it says interrupted.
#[test]
fn a_run_being_written_refuses_a_second_writer_and_shows_as_running() {
    let _machine = shared();
    let tmp = tempfile::tempdir().unwrap();
    let config = ksearch_store::RunConfig {
        task: "softmax".into(),
        backend: "cpu".into(),
        strategy: "world-model".into(),
        proposer: "offline".into(),
        selection: "calibrated".into(),
        seed: 1,
        secret_seed: 2,
        budgets: serde_json::json!({}),
        flags: serde_json::json!({}),
        extra: serde_json::Value::Null,
        created_at: String::new(),
        ksearch_version: String::new(),
    };
    let store = ksearch_store::RunStore::create(&tmp.path().join("runs"), &config).unwrap();
    let dir = store.dir().to_path_buf();
    let lock = store.lock_writer().unwrap();
    let me = std::process::id().to_string();
    ksearch()
        .arg("resume")
        .arg(&dir)
        .assert()
        .failure()
        .stderr(predicate::str::contains(format!("process {me}")));
    ksearch()
        .arg("show")
        .arg(&dir)
        .assert()
        .success()
        .stdout(predicate::str::contains(format!(
            "status: running (process {me})"
        )));
    drop(lock);
    ksearch()
        .arg("show")
        .arg(&dir)
        .assert()
        .success()
        .stdout(predicate::str::contains("status: interrupted"));
}

#[test]
fn tasks_lists_the_builtin_tasks() {
    ksearch()
        .arg("tasks")
        .assert()
        .success()
        .stdout(predicate::str::contains("attention"))
        .stdout(predicate::str::contains("softmax"))
        .stdout(predicate::str::contains("held-out"));
    let out = ksearch().args(["tasks", "--json"]).output().unwrap();
    assert!(out.status.success());
    let tasks: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let attention = tasks.iter().find(|t| t["name"] == "attention").unwrap();
    assert!(attention["held_out"].as_u64().unwrap() > 0);
    assert!(attention["workloads"].as_u64().unwrap() > attention["held_out"].as_u64().unwrap());
    assert!(attention["backends"]
        .as_array()
        .unwrap()
        .contains(&Value::from("cpu")));
    let cpu = &attention["per_backend"]["cpu"];
    assert!(cpu["held_out"].as_u64().unwrap() > 0);
    assert!(cpu["workloads"].as_u64().unwrap() <= attention["workloads"].as_u64().unwrap());
}

#[test]
fn a_closed_stdout_is_not_a_panic() {
    let bin = assert_cmd::cargo::cargo_bin("ksearch");
    let mut child = std::process::Command::new(bin)
        .args(["tasks", "--json"])
        .env("KSEARCH_ROOT", workspace_root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end before the output is written, as `| head -0` would.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn unknown_task_names_the_available_ones() {
    ksearch()
        .args(["eval", "--task", "atention", SOFTMAX_SEED])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no task named `atention`"))
        .stderr(predicate::str::contains("attention"));
}

#[test]
fn unknown_backend_and_missing_file_are_usage_errors() {
    ksearch()
        .args([
            "eval",
            "--task",
            "softmax",
            "--backend",
            "tpu",
            SOFTMAX_SEED,
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("tpu"))
        .stderr(predicate::str::contains("cpu"));
    ksearch()
        .args(["eval", "--task", "softmax", "no/such/kernel.c"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no/such/kernel.c"));
    ksearch()
        .args(["eval", "--task", "softmax", "--timeout", "-1", SOFTMAX_SEED])
        .assert()
        .code(2);
}

#[test]
fn the_seed_kernel_passes_held_out_workloads_included() {
    let _machine = shared();
    let task_dir = workspace_root().join("tasks/softmax");
    let task = ksearch_task::resolve(&task_dir.to_string_lossy()).unwrap();
    let held_out: Vec<String> = task
        .workloads("cpu")
        .unwrap()
        .into_iter()
        .filter(|w| w.held_out)
        .map(|w| w.name)
        .collect();
    assert!(!held_out.is_empty());
    let out = ksearch()
        .args([
            "eval",
            "--task",
            "softmax",
            "--timing",
            "quick",
            "--held-out",
            SOFTMAX_SEED,
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains(": passed"), "{stdout}");
    for name in &held_out {
        let row = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("no row for held-out workload {name}:\n{stdout}"));
        assert!(row.contains("held-out"), "{row}");
    }
}

/// A softmax candidate that does not compile.
const BROKEN_SOFTMAX: &str = "#include <stdint.h>\nvoid softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {\n    this is not C;\n}\n";

#[test]
fn a_failing_candidate_does_not_stop_the_others_and_json_has_everything() {
    let _machine = shared();
    let dir = tempfile::tempdir().unwrap();
    let broken = candidate(dir.path(), "broken.c", BROKEN_SOFTMAX);
    let out = ksearch()
        .args([
            "eval", "--task", "softmax", "--timing", "quick", "--seed", "1234", "--json",
        ])
        .arg(&broken)
        .arg(SOFTMAX_SEED)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let items: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(items.len(), 2);
    let broken = &items[0]["result"];
    assert_eq!(broken["status"], "build_error", "{broken:#}");
    assert!(broken["build"]["log"].as_str().unwrap().contains("error"));
    let seed = &items[1]["result"];
    assert_eq!(seed["status"], "passed", "{seed:#}");
    assert_eq!(seed["seeds"]["secret_seed"], 1234);
    let workloads = seed["workloads"].as_array().unwrap();
    assert!(!workloads.is_empty());
    assert!(workloads.iter().all(|w| w["held_out"] == false));
    assert!(!workloads[0]["candidate_ns"].as_array().unwrap().is_empty());
    assert!(seed["wall_seconds"].as_f64().unwrap() > 0.0);
}

/// `--json-lines` prints each file's result as soon as its evaluation ends: the first line is
/// there while the second file is still being evaluated, and a stopped eval keeps it.
#[test]
fn json_lines_keep_what_a_stopped_eval_finished() {
    let _machine = shared();
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let broken = candidate(dir.path(), "broken.c", BROKEN_SOFTMAX);
    let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("ksearch"));
    common::configure(&mut cmd);
    let mut child = cmd
        .args([
            "eval",
            "--task",
            "softmax",
            "--timing",
            "quick",
            "--json-lines",
        ])
        .arg(&broken)
        .args([SOFTMAX_SEED; 3])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    // Stopped with three evaluations to go: the finished one is already out.
    let still_running = child.try_wait().unwrap().is_none();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(still_running);
    assert_eq!(first["result"]["status"], "build_error", "{first:#}");
    assert!(first["file"].as_str().unwrap().ends_with("broken.c"));
}

/// One kernel evaluated five times in one `ksearch eval`: all five are scored against the same
/// yardstick, every interval holds its own score, and every two intervals overlap: they are
/// intervals of one quantity. (Asking each score to lie inside each of the other four
/// intervals made twenty checks of a score against a 95% interval measured apart from it, a
/// test bound to fail now and then on an honest machine; two honest intervals of the same
/// quantity miss each other far less often, and intervals too narrow for the noise still do.)
#[test]
fn five_evaluations_of_one_kernel_agree_within_their_intervals() {
    let _machine = alone();
    let out = ksearch()
        .args(["eval", "--task", "softmax", "--timing", "quick", "--json"])
        .args([SOFTMAX_SEED; 5])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let items: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(items.len(), 5);
    let mut scored = Vec::new();
    for item in &items {
        // One yardstick for all, unless an evaluation made while the machine was changing had
        // it measured again (and was repeated).
        assert!(item["yardstick"]["workloads"].is_object(), "{item:#}");
        // What its measurement cost, discarded attempts included, is on record.
        let y = &item["yardstick"];
        let attempts = y["attempts"].as_u64().unwrap();
        assert!((1..=2).contains(&attempts), "{y:#}");
        assert!(y["spent_seconds"].as_f64().unwrap() > y["seconds"].as_f64().unwrap());
        let r = &item["result"];
        let score = r["score"].as_f64().unwrap();
        let lo = r["score_interval"][0].as_f64().unwrap();
        let hi = r["score_interval"][1].as_f64().unwrap();
        assert!(lo <= score && score <= hi, "{r:#}");
        assert!(r["drift"].as_f64().unwrap() > 0.0);
        scored.push((score, lo, hi));
    }
    for (i, (_, lo_i, hi_i)) in scored.iter().enumerate() {
        for (j, (_, lo_j, hi_j)) in scored.iter().enumerate() {
            assert!(
                lo_i <= hi_j && lo_j <= hi_i,
                "intervals {i} ({lo_i}..{hi_i}) and {j} ({lo_j}..{hi_j}) do not overlap: \
                 {scored:?}"
            );
        }
    }
}

#[test]
fn a_candidate_that_does_not_compile_is_rejected() {
    let _machine = shared();
    let dir = tempfile::tempdir().unwrap();
    let broken = candidate(
        dir.path(),
        "broken.c",
        "void softmax_f32(const float* x, float* y, long rows, long cols) { return 1 +; }\n",
    );
    ksearch()
        .args(["eval", "--task", "softmax"])
        .arg(&broken)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("build_error"));
}

#[test]
fn an_endless_candidate_times_out() {
    let _machine = shared();
    let dir = tempfile::tempdir().unwrap();
    let spin = candidate(
        dir.path(),
        "spin.c",
        "#include <stdint.h>\nvoid softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {\n    volatile int forever = 1;\n    while (forever) {}\n}\n",
    );
    let started = std::time::Instant::now();
    ksearch()
        .args(["eval", "--task", "softmax", "--timeout", "5"])
        .arg(&spin)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("timeout"));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn doctor_reports_the_cpu_backend_ready() {
    let out = ksearch().args(["doctor", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], true);
    let checks = report["checks"].as_array().unwrap();
    let numpy = checks.iter().find(|c| c["name"] == "numpy").unwrap();
    assert_eq!(numpy["ok"], true);
    let path = ksearch()
        .args(["doctor", "--python-path"])
        .output()
        .unwrap();
    assert!(path.status.success());
    let python = String::from_utf8(path.stdout).unwrap();
    assert!(Path::new(python.trim()).exists(), "{python}");
}

/// Without `KSEARCH_PYTHON`, doctor takes an activated environment's interpreter when it
/// imports numpy, says which it passed over and why, and builds no environment of its own. The
/// "environments" are wrappers around a numpy-capable Python: `$VIRTUAL_ENV`'s runs it with
/// `-S` (no site-packages, so no numpy), `$CONDA_PREFIX`'s as it is.
#[test]
fn doctor_chooses_an_active_interpreter_that_has_numpy() {
    let Some(python) = common::numpy_python() else {
        eprintln!("skipped: no Python with numpy (set KSEARCH_TEST_PYTHON)");
        return;
    };
    let envs = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let wrapper = |name: &str, flags: &str| -> PathBuf {
        let bin = envs.path().join(name).join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let path = bin.join("python3");
        let script = format!("#!/bin/sh\nexec '{}' {flags} \"$@\"\n", python.display());
        std::fs::write(&path, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    };
    let bare = wrapper("venv", "-S");
    let conda = wrapper("conda", "");
    let doctor = |args: &[&str]| {
        ksearch()
            .args(args)
            .env_remove("KSEARCH_PYTHON")
            .env_remove("KSEARCH_MANAGED_ENV")
            .env("VIRTUAL_ENV", envs.path().join("venv"))
            .env("CONDA_PREFIX", envs.path().join("conda"))
            .env("KSEARCH_CACHE_DIR", cache.path())
            .output()
            .unwrap()
    };
    let out = doctor(&["doctor", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let env = &report["harness_env"];
    assert_eq!(env["source"], "active", "{env}");
    assert_eq!(env["python"], conda.to_str().unwrap(), "{env}");
    assert!(env["reason"]
        .as_str()
        .unwrap()
        .starts_with("$CONDA_PREFIX imports numpy "));
    assert_eq!(
        env["rejected"][0]["python"],
        bare.to_str().unwrap(),
        "{env}"
    );
    assert!(env["rejected"][0]["why"]
        .as_str()
        .unwrap()
        .contains("cannot import numpy"));
    assert_eq!(report["ok"], true, "{report}");
    // No managed environment was built.
    let built: Vec<String> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("harness-venv"))
        .collect();
    assert!(built.is_empty(), "{built:?}");
    let out = doctor(&["doctor", "--python-path"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        conda.to_str().unwrap()
    );
}

/// A SIGKILLed ksearch takes its harness with it (PR_SET_PDEATHSIG): nothing goes on building or
/// timing beside the next session. The harness here is the eval tests' stand-in, which reports
/// its pid and then waits for ever.
#[cfg(target_os = "linux")]
#[test]
fn a_killed_ksearch_leaves_no_harness_running() {
    let _machine = shared();
    let root = workspace_root();
    let tmp = tempfile::tempdir().unwrap();
    let fake_root = tmp.path().join("root");
    std::fs::create_dir(&fake_root).unwrap();
    for tree in ["tasks", "knowledge"] {
        std::os::unix::fs::symlink(root.join(tree), fake_root.join(tree)).unwrap();
    }
    std::os::unix::fs::symlink(
        root.join("crates/eval/tests/fixtures/fake_harness"),
        fake_root.join("harness"),
    )
    .unwrap();
    let pid_file = tmp.path().join("harness.pid");
    let cand = candidate(tmp.path(), "hang.c", "mode: hang_self\n");
    let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("ksearch"));
    common::configure(&mut cmd);
    let python = std::env::var_os("KSEARCH_TEST_PYTHON").unwrap_or_else(|| "python3".into());
    let mut child = cmd
        .env("KSEARCH_ROOT", &fake_root)
        .env("KSEARCH_PYTHON", python)
        .env("KSEARCH_HARNESS_FAKE_PID_FILE", &pid_file)
        .args(["eval", "--task", "softmax", "--timeout", "300"])
        .arg(&cand)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let pid = loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file) {
            if let Ok(pid) = text.trim().parse::<i32>() {
                break pid;
            }
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the harness never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let gone = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.split(") ")
                    .nth(1)
                    .is_some_and(|rest| rest.starts_with('Z'))
            })
            .unwrap_or(true)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !gone(pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        gone(pid),
        "the harness {pid} outlived the ksearch that started it"
    );
}

#[test]
fn import_flashinfer_writes_a_task_that_loads_and_never_overwrites() {
    let root = workspace_root();
    let def = root.join("examples/flashinfer-bench/definitions/rmsnorm/rmsnorm_h4096.json");
    let jsonl = root.join("examples/flashinfer-bench/workloads/rmsnorm/rmsnorm_h4096.jsonl");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("rms");
    ksearch()
        .args(["import", "flashinfer"])
        .arg(&def)
        .arg("--out")
        .arg(&out)
        .arg("--workloads")
        .arg(&jsonl)
        .assert()
        .success()
        .stdout(predicate::str::contains("wrote task `rmsnorm_h4096`"))
        .stdout(predicate::str::contains("(8 workloads)"));
    ksearch()
        .args(["tasks", "--check"])
        .arg(&out)
        .assert()
        .success();
    ksearch()
        .args(["import", "flashinfer"])
        .arg(&def)
        .arg("--out")
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("exists and is not empty"));
}
