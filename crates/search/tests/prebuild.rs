//! The harness evaluator's prebuild: a GPU candidate compiles ahead of its evaluation (here
//! nvcc, which CI has without a GPU); a cpu candidate does not, since its build would wait
//! for the timing lock anyway.

mod common;

use common::{eval_evaluator, harness_evaluator, harness_evaluator_on, workspace_root as root};
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
    let Some(nvcc) = harness_nvcc() else {
        eprintln!("KSEARCH_TEST_PYTHON unset: the cuda half is left out");
        return;
    };
    assert_eq!(cuda.prebuild(&seed), nvcc, "nvcc found: {nvcc}");
    // Source that does not compile is not reported as built.
    if nvcc {
        assert!(!cuda.prebuild("this is not CUDA"));
    }
}

/// Whether the harness finds nvcc (on PATH, under $CUDA_HOME or in its interpreter's
/// site-packages), asked with the interpreter the evaluator runs; None when
/// `KSEARCH_TEST_PYTHON` is unset (CI sets it and installs nvcc).
fn harness_nvcc() -> Option<bool> {
    let python = std::env::var_os("KSEARCH_TEST_PYTHON")?;
    let found = std::process::Command::new(python)
        .args([
            "-c",
            "from ksearch_harness.adapters.cuda import find_nvcc; print(find_nvcc() or '')",
        ])
        .env("PYTHONPATH", root().join("harness"))
        .output()
        .unwrap();
    Some(!String::from_utf8_lossy(&found.stdout).trim().is_empty())
}

/// Whether cuda candidates build here (`harness_nvcc`); says so on stderr when they do not.
fn builds_here() -> bool {
    let here = harness_nvcc() == Some(true);
    if !here {
        eprintln!("KSEARCH_TEST_PYTHON unset or no nvcc: nothing to build");
    }
    here
}

#[test]
fn a_build_written_ahead_in_the_background_is_finished_before_the_evaluator_goes() {
    if !builds_here() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let seed = std::fs::read_to_string(root().join("tasks/copy/seed/copy.cu")).unwrap();
    // A source no earlier run has built, so the build below is a real compile.
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let source = format!(
        "{seed}\n// background build {nonce} {}\n",
        std::process::id()
    );
    let evaluator = std::sync::Arc::new(eval_evaluator());
    {
        let cuda = harness_evaluator_on(evaluator.clone(), "copy", "cuda", 7, "cu", work.path());
        cuda.prebuild_in_background(&source);
        cuda.prebuild_in_background(&source); // the same source once more: no second build
                                              // Dropped here with the compile in flight: the drop waits for it.
    }
    let task = ksearch_task::load_task(&root().join("tasks/copy")).unwrap();
    let path = work.path().join(format!(
        "{}.cu",
        ksearch_store::SourceId::of(&source).as_str()
    ));
    assert!(path.is_file(), "the source was written for the build");
    let req = ksearch_eval::EvalRequest::from_task(
        &task,
        "cuda",
        &path,
        ksearch_eval::WorkloadSet::Search,
        7,
        ksearch_eval::TimingPreset::Quick,
    )
    .unwrap();
    // The same evaluator (its build directory) builds it again: the artefact is there.
    let again = evaluator.build(&req).unwrap();
    assert_eq!(again.status, ksearch_eval::Status::Passed, "{again:?}");
    let build = again.build.expect("a build report");
    assert_eq!(
        build.extra.get("cached").and_then(|v| v.as_bool()),
        Some(true),
        "the background build finished and left its artefact: {build:?}"
    );
}

#[test]
fn an_evaluation_waits_for_its_own_build_written_ahead_from_a_relative_store() {
    if !builds_here() {
        return;
    }
    // A run store given as a relative path (`--runs-dir runs`, the default) writes its
    // sources under a relative directory; the builds written ahead are keyed by the
    // request's canonical path, which the evaluation must look up.
    let here = std::env::current_dir().unwrap();
    let work = tempfile::tempdir_in(&here).unwrap();
    let relative = work.path().strip_prefix(&here).unwrap().to_path_buf();
    assert!(relative.is_relative());
    let seed = std::fs::read_to_string(root().join("tasks/copy/seed/copy.cu")).unwrap();
    let source = format!("{seed}\n// written ahead {}\n", std::process::id());
    let cuda = harness_evaluator_on(eval_evaluator(), "copy", "cuda", 7, "cu", &relative);
    cuda.prebuild_in_background(&source);
    assert_eq!(cuda.pending_builds().len(), 1);
    // Whatever the evaluation then does on a machine without a GPU, it took that build.
    let _ = cuda.evaluate(&source, ksearch_search::engine::Purpose::Search);
    assert_eq!(
        cuda.pending_builds(),
        Vec::<std::path::PathBuf>::new(),
        "the evaluation waited for the build written ahead of it"
    );
}

/// A build written ahead that passed is there for its search evaluation to take, once: the
/// evaluation then asks the harness for no second build (crate::engine::evaluation).
#[test]
fn a_passed_build_written_ahead_is_taken_once() {
    if !builds_here() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let seed = std::fs::read_to_string(root().join("tasks/copy/seed/copy.cu")).unwrap();
    let source = format!("{seed}\n// taken once {}\n", std::process::id());
    let cuda = harness_evaluator_on(eval_evaluator(), "copy", "cuda", 7, "cu", work.path());
    assert!(
        cuda.build_written_ahead(&source).is_none(),
        "nothing written ahead yet"
    );
    cuda.prebuild_in_background(&source);
    let taken = cuda
        .build_written_ahead(&source)
        .expect("the build written ahead, waited for");
    assert_eq!(taken.status, ksearch_eval::Status::Passed, "{taken:?}");
    assert!(cuda.pending_builds().is_empty());
    assert!(cuda.build_written_ahead(&source).is_none(), "taken already");
    // Source that does not compile is written ahead too, and taken with its failure.
    cuda.prebuild_in_background("this is not CUDA");
    let failed = cuda
        .build_written_ahead("this is not CUDA")
        .expect("its result");
    assert_ne!(failed.status, ksearch_eval::Status::Passed);
}

/// A GPU run's first search evaluation measures the yardstick while its candidate compiles
/// (crate::engine::evaluation). On a machine with nvcc and no GPU the yardstick cannot be
/// measured: a candidate that builds gets the yardstick's failure, with its build taken (none
/// left running), and one that does not build still reports its build failure.
#[test]
fn the_first_evaluation_compiles_beside_the_yardstick_and_a_failed_build_says_so() {
    if !builds_here() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let seed = std::fs::read_to_string(root().join("tasks/copy/seed/copy.cu")).unwrap();
    let source = format!("{seed}\n// first evaluation {}\n", std::process::id());
    let search = ksearch_search::engine::Purpose::Search;
    let cuda = harness_evaluator_on(eval_evaluator(), "copy", "cuda", 7, "cu", work.path());
    if cuda.evaluate(&source, search).is_ok() {
        eprintln!("a GPU is here: the yardstick was measured");
        return;
    }
    assert!(cuda.pending_builds().is_empty(), "the build was taken");
    let broken = harness_evaluator_on(eval_evaluator(), "copy", "cuda", 7, "cu", work.path());
    let failed = broken
        .evaluate("this is not CUDA", search)
        .expect("a build failure is a result, not the yardstick's error");
    assert_eq!(failed.summary.status, "build_error", "{:?}", failed.summary);
    assert!(broken.pending_builds().is_empty());
}

/// An evaluation that takes a build written ahead records, in its `build_request`, how long
/// before it asked the build started and how long the compiler took (here a source that
/// fails to compile, whose result a machine without a GPU still gets).
#[test]
fn an_evaluation_records_when_its_build_written_ahead_started_and_what_it_took() {
    if !builds_here() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let source = format!("this is not CUDA {}", std::process::id());
    let cuda = harness_evaluator_on(eval_evaluator(), "copy", "cuda", 7, "cu", work.path());
    cuda.prebuild_in_background(&source);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let failed = cuda
        .evaluate(&source, ksearch_search::engine::Purpose::Search)
        .expect("a build failure is a result");
    assert_eq!(failed.summary.status, "build_error");
    let request = &failed.result["build_request"];
    assert_eq!(request["written_ahead"], false, "{request}");
    let ahead = &request["ahead"];
    let started = ahead["started_before_seconds"]
        .as_f64()
        .expect("when it started");
    let took = ahead["build_seconds"].as_f64().expect("what it took");
    assert!(started >= 0.3 && took > 0.0, "{ahead}");
}

/// A source this evaluator built before (the winner's re-check, the confirmation and the
/// re-measures evaluate sources the search built) asks for no second build: the evaluation
/// finds the artefact. A source it never built still gets its build request.
#[test]
fn a_source_built_before_asks_for_no_build_again() {
    if std::env::var_os("KSEARCH_TEST_PYTHON").is_none() {
        eprintln!("KSEARCH_TEST_PYTHON unset: no harness to evaluate with");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let cpu = harness_evaluator("copy", "cpu", 7, "c", work.path());
    let naive = std::fs::read_to_string(root().join("tasks/copy/seed/naive.c")).unwrap();
    let source = format!("{naive}\n// built before {}\n", std::process::id());
    let search = cpu
        .evaluate(&source, ksearch_search::engine::Purpose::Search)
        .expect("an evaluation");
    assert_eq!(
        search.summary.status, "passed",
        "{}",
        search.summary.message
    );
    assert_eq!(search.result["build_request"]["built_before"], false);
    let again = cpu
        .evaluate(&source, ksearch_search::engine::Purpose::Acceptance)
        .expect("an evaluation");
    assert_eq!(again.summary.status, "passed", "{}", again.summary.message);
    let request = &again.result["build_request"];
    assert_eq!(request["built_before"], true, "{request}");
    assert!(request["seconds"].as_f64().unwrap() < 0.01, "{request}");
    // Another evaluator has built nothing.
    let fresh = harness_evaluator("copy", "cpu", 7, "c", work.path());
    let first = fresh
        .evaluate(&source, ksearch_search::engine::Purpose::Acceptance)
        .expect("an evaluation");
    assert_eq!(first.result["build_request"]["built_before"], false);
}
