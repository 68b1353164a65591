//! Bringing your own task (issue 20): `ksearch new-task` writes a task that `eval` accepts and,
//! with `--templates`, that `run` searches offline from the task's own family and actions, with
//! no file of ksearch's changed; a task without a family is refused before a run exists, with a
//! message that says what to add.
//!
//! The search test needs Python 3 with numpy (`KSEARCH_TEST_PYTHON`, else a `python3` that has
//! it); without one it says so and skips.

mod common;

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::Path;

use serde_json::Value;

/// Every file under `dir` (relative path → hash of its contents).
fn snapshot(dir: &Path) -> BTreeMap<String, u64> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, u64>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n == "__pycache__") {
                    continue;
                }
                walk(root, &path, out);
            } else {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                std::fs::read(&path).unwrap().hash(&mut h);
                let rel = path.strip_prefix(root).unwrap().display().to_string();
                out.insert(rel, h.finish());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// `ksearch` run from `cwd` (the checkout's packs through `KSEARCH_ROOT`, as in every test).
fn ksearch_in(cwd: &Path) -> assert_cmd::Command {
    let mut cmd = common::ksearch();
    cmd.current_dir(cwd);
    cmd
}

#[test]
fn a_scaffolded_task_is_evaluated_and_searched_offline_from_its_own_knowledge() {
    let Some(python) = common::numpy_python() else {
        eprintln!("skipping: no Python 3 with numpy (set KSEARCH_TEST_PYTHON)");
        return;
    };
    let root = common::workspace_root();
    let shipped = (
        snapshot(&root.join("knowledge")),
        snapshot(&root.join("tasks")),
    );
    let tmp = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        ksearch_in(tmp.path())
            .env("KSEARCH_PYTHON", &python)
            .args(args)
            .output()
            .unwrap()
    };

    let out = run(&["new-task", "rmsnorm", "--dir", "mytask", "--templates"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task_dir = tmp.path().join("mytask");
    let written = snapshot(&task_dir);
    assert!(
        written.contains_key("templates-cpu/family.toml"),
        "{written:?}"
    );
    assert!(
        written.contains_key("knowledge/actions/rmsnorm.toml"),
        "{written:?}"
    );

    let out = run(&["eval", "--task", "./mytask", "mytask/seed/naive.c"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the seed should pass: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let out = run(&[
        "run",
        "--task",
        "./mytask",
        "--backend",
        "cpu",
        "--rounds",
        "3",
        "--seed",
        "1",
        "--confirm-rounds",
        "0",
        "--runs-dir",
        "runs",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!v["outcome"]["best"].is_null(), "{v}");
    let run_id = v["run"].as_str().unwrap().to_string();

    // The world model was built from the task's own actions, and kernels came from its family.
    let out = run(&["show", "--runs-dir", "runs", &run_id]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("apply local-"), "{shown}");
    assert!(shown.contains("apply action: lanes="), "{shown}");

    // Nothing outside the task directory (and the runs directory) changed; nor did the task.
    assert_eq!(snapshot(&task_dir), written);
    assert_eq!(snapshot(&root.join("knowledge")), shipped.0);
    assert_eq!(snapshot(&root.join("tasks")), shipped.1);
}

#[test]
fn a_task_without_a_family_is_refused_before_a_run_exists() {
    let tmp = tempfile::tempdir().unwrap();
    ksearch_in(tmp.path())
        .args(["new-task", "plain", "--dir", "plain"])
        .assert()
        .success();
    let out = ksearch_in(tmp.path())
        .args([
            "run",
            "--task",
            "./plain",
            "--backend",
            "cpu",
            "--runs-dir",
            "runs",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for needle in [
        "template family",
        "templates-cpu/family.toml",
        "knowledge/actions/",
        "docs/offline-proposer.md#template-families",
        "--proposer openai, anthropic or command",
    ] {
        assert!(stderr.contains(needle), "missing {needle:?} in: {stderr}");
    }
    assert!(
        !tmp.path().join("runs").exists(),
        "a run directory was made"
    );
}

#[test]
fn new_task_refuses_a_directory_in_use_and_a_bad_name() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("taken")).unwrap();
    std::fs::write(tmp.path().join("taken/notes.txt"), "mine").unwrap();
    let out = ksearch_in(tmp.path())
        .args(["new-task", "t", "--dir", "taken"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));
    let out = ksearch_in(tmp.path())
        .args(["new-task", "no/slash", "--dir", "fresh"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(!tmp.path().join("fresh").exists());
}
