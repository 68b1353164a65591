//! The knowledge packs' assertions reach the real harness as extra acceptance workloads: a
//! softmax that skips the max subtraction passes every workload a proposer can see, and the
//! re-check of a winner rejects it on the large-logits workload. An evaluator's acceptance
//! evaluations share one fresh seed, so the next one finds its input sets drawn.
//!
//! Needs Python 3 with numpy, like the CLI tests: `KSEARCH_TEST_PYTHON`, else the managed
//! environment cached under `target/` (`KSEARCH_CACHE_DIR`).

mod common;

use ksearch_search::engine::{CandidateEvaluator, Purpose};

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
    let work = tempfile::tempdir().unwrap();
    let eval = common::harness_evaluator("softmax", "cpu", 1234, "c", work.path());

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

    // The seed's re-check after the winner's: the same fresh seed (not the search's), so the
    // same input sets, which the judge kept from the first.
    let seed = std::fs::read_to_string(common::workspace_root().join("tasks/softmax/seed/naive.c"))
        .unwrap();
    let again = eval.evaluate(&seed, Purpose::Acceptance).unwrap();
    assert!(again.summary.passed, "{:#}", again.result);
    let secret = |r: &serde_json::Value| r["seeds"]["secret_seed"].as_u64().unwrap();
    assert_eq!(secret(&again.result), secret(&acceptance.result));
    assert_ne!(secret(&again.result), 1234);
    let hits = |r: &serde_json::Value| r["diagnostics"]["draw_cache"]["hits"].as_u64();
    if again.result["environment"]["judge"]["persistent"] == true {
        assert!(
            hits(&again.result) > hits(&acceptance.result),
            "{:#}",
            again.result
        );
    }
}
