//! The seed of the FlashInfer-Bench GQA decode example (examples/flashinfer-bench), imported
//! as a task, and a sample of its template family that takes every knob value build for sm_90a
//! through the harness's `build` op, as a run builds every candidate. Needs `KSEARCH_TEST_CUDA_BUILD=1` and nvcc 13 where the cuda adapter finds it
//! (CI installs it from pip into the harness environment); skipped otherwise.

use ksearch_eval::{EvalRequest, Evaluator, EvaluatorConfig, Status, TimingPreset, WorkloadSet};
use ksearch_interop::flashinfer::{self, ImportOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn cuda_seed_of_the_imported_gqa_decode_example_builds_for_sm90a() {
    if std::env::var_os("KSEARCH_TEST_CUDA_BUILD").is_none() {
        eprintln!("skipped: set KSEARCH_TEST_CUDA_BUILD=1 to build CUDA sources");
        return;
    }
    let python = std::env::var_os("KSEARCH_TEST_PYTHON")
        .map(PathBuf::from)
        .expect(
            "KSEARCH_TEST_CUDA_BUILD is set: KSEARCH_TEST_PYTHON must name the harness's Python",
        );
    let examples = root().join("examples/flashinfer-bench");
    let name = "gqa_paged_decode_h32_kv4_d128_ps1";
    let def =
        flashinfer::read_definition(&examples.join(format!("definitions/gqa_paged/{name}.json")))
            .unwrap();
    let jsonl = examples.join(format!("workloads/gqa_paged/{name}.jsonl"));
    let workloads = flashinfer::read_workloads(&jsonl, name).unwrap();
    let with = examples.join(format!("ksearch/{name}"));
    let work = tempfile::tempdir().unwrap();
    let opts = ImportOptions {
        workloads: Some((&workloads, &jsonl)),
        dataset: Some(&examples),
        with: Some(&with),
    };
    let imported = flashinfer::import(&def, &opts, &work.path().join("task")).unwrap();
    let task_seed = imported.task.backend("cuda").unwrap().seed.clone().unwrap();
    let ev = Evaluator::new(EvaluatorConfig {
        python: Some(python),
        harness_dir: Some(root().join("harness")),
        work_dir: Some(work.path().join("work")),
        // CI has no GPU: build for the H200, as the device will.
        knobs: vec![("KSEARCH_HARNESS_CUDA_ARCH".into(), "sm_90a".into())],
        ..EvaluatorConfig::default()
    })
    .unwrap();
    let mut req = EvalRequest::from_task(
        &imported.task,
        "cuda",
        &task_seed,
        WorkloadSet::Search,
        1,
        TimingPreset::Quick,
    )
    .unwrap();
    req.timeout = Duration::from_secs(600);
    let kernels = |req: &EvalRequest| -> Vec<serde_json::Value> {
        let result = ev.build(req).unwrap();
        let log = result
            .build
            .as_ref()
            .map(|b| b.log.clone())
            .unwrap_or_default();
        assert_eq!(result.status, Status::Passed, "{}\n{log}", result.message);
        let build = result.build.as_ref().unwrap();
        assert_eq!(build.extra["arch"], "sm_90a");
        build.extra["ptxas"]["kernels"].as_array().unwrap().clone()
    };
    let seed_kernels = kernels(&req);
    assert_eq!(seed_kernels.len(), 1);
    assert_eq!(seed_kernels[0]["spill_store_bytes"].as_u64(), Some(0));

    // Every knob value at least once: split 1 has one kernel, split > 1 adds the merge.
    let family = ksearch_knowledge::TemplateFamily::load_for(&imported.dir, "cuda")
        .unwrap()
        .unwrap();
    let sample = [
        "",
        "heads=group warps=8 split=16 unroll=4 exp2=true",
        "heads=group warps=2 split=2 unroll=2",
        "warps=4 split=4 exp2=true",
        "warps=8 split=8 unroll=4",
    ];
    for (i, setting) in sample.iter().enumerate() {
        let mut knobs = family.default_knobs();
        for kv in setting.split_whitespace() {
            let (k, v) = family.parse_setting(kv).unwrap();
            knobs.insert(k, v);
        }
        let knobs = family.validate(&knobs).unwrap();
        let path = work.path().join(format!("variant{i}.cu"));
        std::fs::write(&path, family.render(&knobs).unwrap()).unwrap();
        req.candidate.path = path;
        let built = kernels(&req);
        let split = setting.contains("split=");
        assert_eq!(
            built.len(),
            if split { 2 } else { 1 },
            "`{setting}`: {built:?}"
        );
        assert!(built
            .iter()
            .all(|k| k["registers"].as_u64().is_some_and(|r| r > 0)));
    }
}
