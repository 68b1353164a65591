//! The harness evaluator's prebuild: a GPU candidate compiles ahead of its evaluation (here
//! nvcc, which CI has without a GPU); a cpu candidate does not, since its build would wait
//! for the timing lock anyway.

mod common;

use common::{harness_evaluator, workspace_root as root};
use ksearch_search::engine::CandidateEvaluator;

#[test]
fn a_gpu_candidate_is_built_ahead_and_a_cpu_one_is_not() {
    let work = tempfile::tempdir().unwrap();
    let cpu = harness_evaluator("copy", "cpu", 7, "c", work.path());
    let naive = std::fs::read_to_string(root().join("tasks/copy/seed/naive.c")).unwrap();
    assert!(!cpu.prebuild(&naive));
    let cuda = harness_evaluator("copy", "cuda", 7, "cu", work.path());
    assert!(!cpu.prebuilds() && cuda.prebuilds());
    let seed = std::fs::read_to_string(root().join("tasks/copy/seed/copy.cu")).unwrap();
    // The harness looks for nvcc on PATH, under $CUDA_HOME and in its interpreter's
    // site-packages; ask it, with the interpreter the evaluator runs.
    let Some(python) = std::env::var_os("KSEARCH_TEST_PYTHON") else {
        eprintln!("KSEARCH_TEST_PYTHON unset: the cuda half is left out");
        return;
    };
    let found = std::process::Command::new(python)
        .args([
            "-c",
            "from ksearch_harness.adapters.cuda import find_nvcc; print(find_nvcc() or '')",
        ])
        .env("PYTHONPATH", root().join("harness"))
        .output()
        .unwrap();
    let nvcc = !String::from_utf8_lossy(&found.stdout).trim().is_empty();
    assert_eq!(cuda.prebuild(&seed), nvcc, "nvcc found: {nvcc}");
    // Source that does not compile is not reported as built.
    if nvcc {
        assert!(!cuda.prebuild("this is not CUDA"));
    }
}
