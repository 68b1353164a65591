//! `Evaluator::bench` against the real harness (`ksearch_harness.bench`) on a machine without a
//! GPU: the request reaches the module, the answer comes back on the private channel with the
//! nonce, and what is missing (MLX, a compilable kernel) is the result's status, not an error.
//! With a harness that has no bench module, the missing answer is an error. The measuring
//! itself is covered by harness/tests/test_bench.py (numpy stand-ins) and on the device by
//! gpu/attention/device_check.sh.

mod common;
use common::{python, root};
use ksearch_eval::{
    BenchRequest, BenchSettings, EvalError, EvalRequest, Evaluator, EvaluatorConfig, TimingPreset,
    WorkloadSet,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn request(backend: &str, kernel: &Path) -> BenchRequest {
    let task = ksearch_task::load_task(&root().join("tasks/attention")).unwrap();
    let mut eval = EvalRequest::from_task(
        &task,
        backend,
        kernel,
        WorkloadSet::Acceptance,
        3,
        TimingPreset::Quick,
    )
    .unwrap();
    eval.timeout = Duration::from_secs(300);
    BenchRequest {
        eval,
        settings: BenchSettings::default(),
    }
}

fn evaluator(python: PathBuf, harness: PathBuf, work: &Path) -> Evaluator {
    Evaluator::new(EvaluatorConfig {
        python: Some(python),
        harness_dir: Some(harness),
        work_dir: Some(work.to_path_buf()),
        verify_harness: false,
        ..EvaluatorConfig::default()
    })
    .unwrap()
}

fn has_module(python: &Path, module: &str) -> bool {
    std::process::Command::new(python)
        .args(["-c", &format!("import {module}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn the_bench_module_answers_with_the_nonce_and_a_status() {
    let Some(py) = python() else { return };
    let work = tempfile::tempdir().unwrap();
    let ev = evaluator(py.clone(), root().join("harness"), work.path());

    if !has_module(&py, "mlx.core") {
        let seed = root().join("tasks/attention/seed/naive_mlx.py");
        let r = ev.bench(&request("mlx", &seed)).unwrap();
        assert_eq!(r.status, "task_error", "{r:?}");
        assert!(r.message.contains("mlx"), "{}", r.message);
        // The module passed the static checks and compiled before MLX was needed.
        assert!(r.build.is_some());
        assert!(r.workloads.is_empty());
    }

    // A kernel that cannot build: a build error (nvcc's, or that there is no nvcc).
    let bad = work.path().join("bad.cu");
    std::fs::write(&bad, "extern \"C\" int attention_f16( {\n").unwrap();
    let r = ev.bench(&request("cuda", &bad)).unwrap();
    assert_eq!(r.status, "build_error", "{r:?}");
    assert!(!r.passed());
    assert!(r.nonce.as_deref().is_some_and(|n| n.len() == 32));

    // Static checks still apply: a kernel calling into PyTorch's SDPA is refused.
    let cheat = work.path().join("cheat.py");
    std::fs::write(
        &cheat,
        "import mlx.core as mx\n\ndef attention(*, q, k, v, B, H, L, D, causal):\n    \
         return mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0)\n",
    )
    .unwrap();
    let r = ev.bench(&request("mlx", &cheat)).unwrap();
    assert_eq!(r.status, "static_check_failed", "{r:?}");
}

#[test]
fn no_answer_is_an_error_with_the_output() {
    let Some(py) = python() else { return };
    let work = tempfile::tempdir().unwrap();
    // The scripted stand-in harness of the other tests has no bench module.
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_harness");
    let ev = evaluator(py, fake, work.path());
    let seed = root().join("tasks/attention/seed/naive_mlx.py");
    match ev.bench(&request("mlx", &seed)) {
        Err(EvalError::HarnessFailed { op, output, .. }) => {
            assert_eq!(op, "bench");
            assert!(output.contains("without a result"), "{output}");
            assert!(output.contains("ksearch_harness.bench"), "{output}");
        }
        other => panic!("expected HarnessFailed, got {other:?}"),
    }
}
