//! `ksearch tasks --check`, and what the built-in held-out workloads now catch: a softmax
//! kernel without the max subtraction passes every shown workload and is rejected on the
//! held-out ones (the evaluation needs Python with numpy, as in cli.rs).

mod common;
use common::{ksearch, workspace_root};
use predicates::prelude::*;
use serde_json::Value;

#[test]
fn every_builtin_task_passes_the_check() {
    ksearch()
        .args(["tasks", "--check"])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("attention: ok"))
        .stdout(predicate::str::contains("selective-scan: ok"))
        .stdout(predicate::str::contains("softmax: ok"));
    ksearch()
        .args(["tasks", "--check", "softmax"])
        .assert()
        .code(0)
        .stdout("softmax: ok\n");
}

/// The softmax task with its held-out workloads of odd column counts and large logits
/// removed, as it was before: every cols a multiple of 8, logits at std 4.
fn old_softmax(dir: &std::path::Path) {
    let src = workspace_root().join("tasks/softmax");
    std::fs::copy(src.join("reference.py"), dir.join("reference.py")).unwrap();
    std::fs::create_dir(dir.join("seed")).unwrap();
    std::fs::copy(src.join("seed/naive.c"), dir.join("seed/naive.c")).unwrap();
    let toml = std::fs::read_to_string(src.join("task.toml")).unwrap();
    let cut = toml
        .find("# Sizes that share no divisor")
        .expect("the held-out block of tasks/softmax/task.toml");
    let end = toml.find("# Every output carries").unwrap();
    std::fs::write(
        dir.join("task.toml"),
        format!("{}{}", &toml[..cut], &toml[end..]),
    )
    .unwrap();
}

#[test]
fn a_task_with_an_undeclared_divisor_and_unreached_inputs_fails_the_check() {
    let dir = tempfile::tempdir().unwrap();
    old_softmax(dir.path());
    let out = ksearch()
        .args(["tasks", "--check"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.starts_with("softmax: 3 problem(s)\n"), "{stdout}");
    // The problem points at the axis's line.
    let toml = std::fs::read_to_string(dir.path().join("task.toml")).unwrap();
    let line = toml.lines().position(|l| l == "[axes.cols]").unwrap() + 1;
    assert!(
        stdout.contains(&format!(
            "task.toml:{line}:7: axes.cols: backend `cpu`: every value of `cols` (1000, 1024, \
             4096, 5000, 65536) is a multiple of 8, which the task does not declare"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "inputs[0].must_reach.low: backend `cpu`: no workload draws `x` at or below -100"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("inputs[0].must_reach.high"), "{stdout}");

    // Declaring the divisor settles the first problem; the inputs still fall short.
    std::fs::write(
        dir.path().join("task.toml"),
        toml.replacen("[axes.cols]\n", "[axes.cols]\nmultiple_of = 8\n", 1),
    )
    .unwrap();
    let out = ksearch()
        .args(["tasks", "--json", "--check"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report.len(), 1);
    assert_eq!(report[0]["ok"], false);
    let fields: Vec<&str> = report[0]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        ["inputs[0].must_reach.low", "inputs[0].must_reach.high"]
    );
}

#[test]
fn a_task_that_does_not_load_fails_the_check_and_an_unknown_name_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    old_softmax(dir.path());
    let toml = std::fs::read_to_string(dir.path().join("task.toml")).unwrap();
    std::fs::write(
        dir.path().join("task.toml"),
        toml.replacen("[axes.cols]\n", "[axes.cols]\nmultiple_of = 3\n", 1),
    )
    .unwrap();
    ksearch()
        .args(["tasks", "--check"])
        .arg(dir.path())
        .assert()
        .code(1)
        .stdout(predicate::str::contains(
            "workloads[0].params.cols: cols = 1000 breaks what kernels may assume: `axes.cols` \
             says a multiple of 3",
        ));
    ksearch()
        .args(["tasks", "--check", "no-such-task"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no task named `no-such-task`"));
}

/// exp(x) / sum exp(x): right while exp stays finite and normal in float32, as it does for
/// the shown workloads' std-4 logits.
const SOFTMAX_WITHOUT_MAX: &str = r#"#include <math.h>
#include <stdint.h>

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        double sum = 0.0;
        for (int64_t c = 0; c < cols; c++) {
            yr[c] = expf(xr[c]);
            sum += yr[c];
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
    }
}
"#;

#[test]
fn a_softmax_without_the_max_subtraction_is_rejected_on_held_out_workloads() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = dir.path().join("no_max.c");
    std::fs::write(&kernel, SOFTMAX_WITHOUT_MAX).unwrap();
    let out = ksearch()
        .args([
            "eval",
            "--task",
            "softmax",
            "--timing",
            "quick",
            "--held-out",
            "--json",
        ])
        .arg(&kernel)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let items: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let result = &items[0]["result"];
    assert_eq!(result["status"], "integrity_violation", "{result:#}");
    assert_eq!(
        result["violation"]["class"], "shape_specialisation",
        "{result:#}"
    );
    let workloads = result["workloads"].as_array().unwrap();
    let correct = |name: &str| {
        workloads
            .iter()
            .find(|w| w["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {result:#}"))["correct"]
            .clone()
    };
    // Every shown workload passes: only the held-out inputs show the missing subtraction.
    for w in workloads.iter().filter(|w| w["held_out"] == false) {
        assert_eq!(w["correct"], true, "{w:#}");
    }
    for name in ["r7c4099-hot", "r5c1031-cold", "r97c257-rows"] {
        assert_eq!(correct(name), false, "{name}");
    }
    assert_eq!(correct("r333c5000"), true);
}

/// `ksearch tasks --workloads`: the task's own resolution, as the harness receives it.
#[test]
fn workloads_print_as_resolved_for_the_harness() {
    let out = ksearch()
        .args([
            "tasks",
            "--workloads",
            "selective-scan",
            "--backend",
            "cuda",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let printed: Vec<ksearch_task::ResolvedWorkload> = serde_json::from_slice(&out.stdout).unwrap();
    let task = ksearch_task::load_task(&workspace_root().join("tasks/selective-scan")).unwrap();
    assert_eq!(printed, task.workloads("cuda").unwrap());
    assert!(printed.iter().any(|w| w.held_out));
    ksearch()
        .args(["tasks", "--workloads", "softmax", "--backend", "tpu"])
        .assert()
        .code(predicate::ne(0))
        .stderr(predicate::str::contains("no `tpu` backend"));
    ksearch()
        .args(["tasks", "--workloads", "softmax"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--backend"));
}
