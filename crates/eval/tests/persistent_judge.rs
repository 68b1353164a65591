//! The persistent judge with the real harness: evaluations of one evaluator share one judge
//! process until it times out, dies or is interrupted; each candidate still gets its own
//! accused process.

mod common;

use ksearch_eval::{
    EvalError, EvalRequest, EvalResult, Evaluator, EvaluatorConfig, Interrupt, TimingPreset,
    WorkloadSet,
};
use std::path::PathBuf;
use std::time::Duration;

struct Setup {
    evaluator: Evaluator,
    seed: PathBuf,
    task: ksearch_task::Task,
    _dir: tempfile::TempDir,
}

fn setup(interrupt: Option<Interrupt>) -> Option<Setup> {
    let python = common::python()?;
    let dir = tempfile::tempdir().unwrap();
    let evaluator = Evaluator::new(EvaluatorConfig {
        python: Some(python),
        harness_dir: Some(common::root().join("harness")),
        work_dir: Some(dir.path().join("work")),
        interrupt,
        persistent_judge: true,
        ..EvaluatorConfig::default()
    })
    .unwrap();
    let task = ksearch_task::load_task(&common::root().join("tasks/softmax")).unwrap();
    Some(Setup {
        evaluator,
        seed: common::root().join("tasks/softmax/seed/naive.c"),
        task,
        _dir: dir,
    })
}

impl Setup {
    fn request(&self) -> EvalRequest {
        EvalRequest::from_task(
            &self.task,
            "cpu",
            &self.seed,
            WorkloadSet::Search,
            7,
            TimingPreset::Quick,
        )
        .unwrap()
    }
}

/// (pid, requests served) of the judge that produced `r`.
fn judge(r: &EvalResult) -> (i64, i64) {
    let j = &r.environment.as_ref().expect("an environment")["judge"];
    (j["pid"].as_i64().unwrap(), j["served"].as_i64().unwrap())
}

fn alive(pid: i64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

#[test]
fn evaluations_share_one_judge_until_one_times_out() {
    let Some(s) = setup(None) else { return };
    let first = s.evaluator.evaluate(&s.request()).unwrap();
    assert!(first.passed(), "{}", first.message);
    let second = s.evaluator.evaluate(&s.request()).unwrap();
    assert!(second.passed(), "{}", second.message);
    let (pid, served) = judge(&first);
    assert_eq!(served, 1);
    assert_eq!(judge(&second), (pid, 2));
    assert!(alive(pid));
    // A request that outlives its limit: the harness kills the worker and says so; the judge
    // process goes on, with a fresh worker for the next request.
    let mut late = s.request();
    late.timeout = Duration::from_millis(50);
    let timed_out = s.evaluator.evaluate(&late).unwrap();
    assert_eq!(
        timed_out.status.as_str(),
        "timeout",
        "{}",
        timed_out.message
    );
    let third = s.evaluator.evaluate(&s.request()).unwrap();
    assert!(third.passed(), "{}", third.message);
    assert_eq!(judge(&third).1, 1);
    // The evaluator's end ends its judge.
    drop(s);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while alive(pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(pid), "the judge outlived its evaluator");
}

#[test]
fn an_interrupt_kills_the_judge_and_the_next_evaluation_starts_another() {
    let interrupt = Interrupt::new();
    let Some(s) = setup(Some(interrupt.clone())) else {
        return;
    };
    let first = s.evaluator.evaluate(&s.request()).unwrap();
    assert!(first.passed(), "{}", first.message);
    let (pid, _) = judge(&first);
    let stopper = {
        let interrupt = interrupt.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            interrupt.request();
        })
    };
    let stopped = s.evaluator.evaluate(&s.request());
    stopper.join().unwrap();
    assert!(
        matches!(stopped, Err(EvalError::Interrupted)),
        "{stopped:?}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while alive(pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(pid), "the interrupted judge is still running");
}
