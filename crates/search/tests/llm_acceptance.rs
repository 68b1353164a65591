//! The knowledge packs' assertions reach the real harness as extra acceptance workloads: a
//! softmax that skips the max subtraction passes every workload a proposer can see, and the
//! re-check of a winner rejects it on the large-logits workload.
//!
//! Needs Python 3 with numpy, like the CLI tests: `KSEARCH_TEST_PYTHON`, else the managed
//! environment cached under `target/` (`KSEARCH_CACHE_DIR`).

use std::path::{Path, PathBuf};

use ksearch_eval::{Evaluator, EvaluatorConfig, TimingPreset};
use ksearch_search::engine::evaluation::HarnessEvaluator;
use ksearch_search::engine::{CandidateEvaluator, Purpose};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Exact as long as exp() stays in range, i.e. for logits below about 88.
const NO_MAX_SUBTRACTION: &str = r#"
#include <math.h>
#include <stdint.h>

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        double sum = 0.0;
        for (int64_t c = 0; c < cols; c++) {
            float e = expf(xr[c]);
            yr[c] = e;
            sum += e;
        }
        float inv = (float)(1.0 / sum);
        for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
    }
}
"#;

#[test]
fn the_large_logits_assertion_rejects_a_softmax_without_max_subtraction() {
    // One test in this binary, so setting the process environment cannot race another test.
    let python = std::env::var_os("KSEARCH_TEST_PYTHON").map(PathBuf::from);
    if python.is_none() && std::env::var_os("KSEARCH_CACHE_DIR").is_none() {
        std::env::set_var(
            "KSEARCH_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("ksearch-cache"),
        );
    }
    std::env::set_var("KSEARCH_ROOT", root());
    let evaluator = Evaluator::new(EvaluatorConfig {
        python,
        ..EvaluatorConfig::default()
    })
    .unwrap_or_else(|e| panic!("no evaluation environment: {e}"));
    let task = ksearch_task::load_task(&root().join("tasks/softmax")).unwrap();
    let work = tempfile::tempdir().unwrap();
    let eval = HarnessEvaluator::new(
        evaluator,
        task,
        "cpu",
        1234,
        TimingPreset::Quick,
        work.path().to_path_buf(),
        "c",
    );

    let search = eval.evaluate(NO_MAX_SUBTRACTION, Purpose::Search).unwrap();
    assert!(search.summary.passed, "{:#}", search.result);
    let names = |r: &serde_json::Value| -> Vec<String> {
        r["workloads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(names(&search.result)
        .iter()
        .all(|n| !n.starts_with("assert-")));

    let acceptance = eval
        .evaluate(NO_MAX_SUBTRACTION, Purpose::Acceptance)
        .unwrap();
    assert!(!acceptance.summary.passed, "{:#}", acceptance.result);
    // Wrong only on workloads a proposer never saw: the harness reports it as such.
    assert!(
        acceptance
            .summary
            .message
            .contains("assert-online-softmax-rescale-large-logits"),
        "{}",
        acceptance.summary.message
    );
    let failed: Vec<String> = acceptance.result["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["correct"] == false)
        .map(|w| w["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        failed
            .iter()
            .any(|n| n == "assert-online-softmax-rescale-large-logits"),
        "{failed:?}\n{:#}",
        acceptance.result
    );
}
