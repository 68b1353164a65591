//! Rendered kernels compute the right thing: a sample of each family (the defaults, every
//! single-knob change and a few random settings, covering every knob value) is built like the
//! harness builds candidates and compared with a float64 numpy reference on small odd shapes,
//! through `tests/check_kernels.py`.
//!
//! Needs `KSEARCH_TEST_PYTHON` (a python with numpy; CI sets it) and `cc`; without them the test
//! says that it skipped. `KSEARCH_TEST_ALL_COMBINATIONS=1` checks every valid combination
//! instead of the sample (minutes on two cores).

mod common;

use common::{cc, family, sample, KINDS};
use std::process::Command;

#[test]
fn rendered_kernels_match_the_numpy_reference() {
    let Some(python) = std::env::var_os("KSEARCH_TEST_PYTHON") else {
        eprintln!("SKIPPED rendered_kernels_match_the_numpy_reference: set KSEARCH_TEST_PYTHON to a python with numpy");
        return;
    };
    let Some(cc) = cc() else {
        eprintln!("SKIPPED rendered_kernels_match_the_numpy_reference: no working `cc` on PATH");
        return;
    };
    let all = std::env::var("KSEARCH_TEST_ALL_COMBINATIONS").is_ok_and(|v| v == "1");
    let dir = tempfile::tempdir().unwrap();
    let mut kernels = Vec::new();
    for kind in KINDS {
        let f = family(kind);
        let settings = if all {
            f.enumerate()
        } else {
            sample(&f, 4, 2024)
        };
        for (i, knobs) in settings.iter().enumerate() {
            let path = dir.path().join(format!("{kind}-{i}.c"));
            std::fs::write(&path, f.render(knobs).unwrap()).unwrap();
            kernels.push(serde_json::json!({
                "task": kind,
                "source": path,
                "label": ksearch_knowledge::format_knobs(knobs),
            }));
        }
    }
    let manifest = dir.path().join("manifest.json");
    let count = kernels.len();
    std::fs::write(
        &manifest,
        serde_json::json!({"cc": cc, "jobs": 2, "kernels": kernels}).to_string(),
    )
    .unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/check_kernels.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(&manifest)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let failures: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("\"ok\": false"))
        .collect();
    assert!(
        out.status.success() && failures.is_empty(),
        "{} of {count} kernels failed:\n{}\nstderr:\n{}",
        failures.len(),
        failures.join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(
        summary.contains(&format!("\"checked\": {count}")) && summary.contains("\"failed\": 0"),
        "unexpected summary: {summary}"
    );
    eprintln!("{count} kernels match the float64 reference");
}
