//! The evaluator against a scripted stand-in for the harness (tests/fixtures/fake_harness):
//! result channel checks, timeouts, process-group kills, environment scrubbing, timing locks.
//! Needs only a Python 3 interpreter (no numpy).

use ksearch_eval::protocol::{
    CandidateSection, CorrectnessConfig, EntrySpec, FunctionRef, TaskSection, ToleranceSpec,
};
use ksearch_eval::{
    EvalError, EvalRequest, Evaluator, EvaluatorConfig, Interrupt, Status, TimingPreset,
    ViolationClass, WorkloadSet,
};
use ksearch_task::{ParamValue, ResolvedWorkload};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("KSEARCH_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    // Resolve shims (pyenv) to the real interpreter: the harness runs with a scrubbed
    // environment in which a shim may not find its configuration.
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("these tests need python3 on PATH");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn fake_harness() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_harness")
}

struct Fixture {
    evaluator: Evaluator,
    dir: tempfile::TempDir,
}

fn fixture(knobs: Vec<(String, String)>) -> Fixture {
    fixture_with(knobs, None)
}

fn fixture_with(knobs: Vec<(String, String)>, interrupt: Option<Interrupt>) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let evaluator = Evaluator::new(EvaluatorConfig {
        python: Some(python()),
        backend: None,
        harness_dir: Some(fake_harness()),
        work_dir: Some(dir.path().join("work")),
        kill_grace: Duration::from_millis(500),
        tail_bytes: 4096,
        knobs,
        verify_harness: true,
        sandbox: Default::default(),
        interrupt,
        // The fake harness answers one request per process (the one-shot mechanics tested
        // here); the persistent judge has tests of its own (persistent_judge.rs).
        persistent_judge: false,
        lanes: 1,
    })
    .unwrap();
    Fixture { evaluator, dir }
}

/// Persistent judges (one request each: the fake harness answers one and exits), `lanes` of
/// them per device.
fn fixture_in_lanes(lanes: usize) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let evaluator = Evaluator::new(EvaluatorConfig {
        python: Some(python()),
        harness_dir: Some(fake_harness()),
        work_dir: Some(dir.path().join("work")),
        kill_grace: Duration::from_millis(500),
        tail_bytes: 4096,
        persistent_judge: true,
        lanes,
        ..EvaluatorConfig::default()
    })
    .unwrap();
    Fixture { evaluator, dir }
}

impl Fixture {
    /// A request whose candidate file tells the fake harness what to do.
    fn request(&self, mode: &str) -> EvalRequest {
        let path = self
            .dir
            .path()
            .join(format!("{}.c", mode.replace(' ', "_")));
        std::fs::write(&path, format!("mode: {mode}\n")).unwrap();
        EvalRequest {
            task: TaskSection {
                name: "toy".into(),
                dir: self.dir.path().to_path_buf(),
                reference: FunctionRef {
                    module: "reference.py".into(),
                    function: "reference".into(),
                },
                baseline: None,
                entry: EntrySpec {
                    symbol: "toy".into(),
                    args: vec!["x".into(), "n".into()],
                },
                forbidden: vec![],
                allowed_kernels: vec![],
            },
            backend: "cpu".into(),
            device: None,
            candidate: CandidateSection {
                path,
                language: "c".into(),
            },
            workload_set: WorkloadSet::Search,
            workloads: vec![ResolvedWorkload {
                name: "w1".into(),
                held_out: false,
                params: [("n".to_string(), ParamValue::Int(4))].into(),
                inputs: vec![],
                outputs: vec![],
                flops: 0.0,
                bytes: 0.0,
            }],
            tolerance: [("f32".to_string(), ToleranceSpec::scaled(1e-5, 1e-6))].into(),
            correctness: CorrectnessConfig { trials: 2 },
            timing: TimingPreset::Quick.config(),
            secret_seed: 4242,
            timeout: Duration::from_secs(30),
            yardstick: None,
            profiles_ahead: false,
        }
    }
}

fn process_alive(pid: i32) -> bool {
    // A zombie still answers kill(0); look at its state instead.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn wait_dead(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if !process_alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn a_good_result_is_returned_with_the_wall_time() {
    let f = fixture(vec![]);
    let req = f.request("pass");
    let r = f.evaluator.evaluate(&req).unwrap();
    assert_eq!(r.status, Status::Passed, "{r:?}");
    assert_eq!(r.score, Some(1.5));
    assert_eq!(r.seeds.as_ref().unwrap().secret_seed, Some(4242));
    assert_eq!(r.workloads[0].name, "w1");
    assert!(r.wall_seconds > 0.0 && r.wall_seconds < 30.0);
    // Fields the typed result does not know are kept.
    let echo = &r.extra["echo"];
    assert_eq!(echo["op"], "evaluate");
    assert_eq!(echo["timeout_s"], 30.0);
    // The harness runs inside its build directory, which is keyed by the source.
    assert_eq!(echo["cwd"], echo["build_dir"]);
    assert_eq!(
        Path::new(echo["build_dir"].as_str().unwrap()),
        f.evaluator.build_dir(&req).unwrap()
    );
}

#[test]
fn the_harness_environment_is_scrubbed() {
    let f = fixture(vec![("KSEARCH_HARNESS_MODE".into(), "x".into())]);
    let r = f.evaluator.evaluate(&f.request("pass")).unwrap();
    let env: Vec<String> = serde_json::from_value(r.extra["echo"]["env"].clone()).unwrap();
    let allowed = [
        "PATH",
        "HOME",
        "LANG",
        "TMPDIR",
        "CC",
        "CXX",
        "CUDA_VISIBLE_DEVICES",
        "LD_LIBRARY_PATH",
        "CUDA_HOME",
        "PYTHONPATH",
        "PYTHONUNBUFFERED",
        "KSEARCH_HARNESS_MODE",
        // Set by the interpreter itself at start-up.
        "LC_CTYPE",
    ];
    for key in &env {
        assert!(
            allowed.contains(&key.as_str()) || key.starts_with("KSEARCH_HARNESS_"),
            "{key} leaked into the harness environment"
        );
    }
    assert!(env.contains(&"KSEARCH_HARNESS_MODE".to_string()));
    assert!(env.contains(&"PYTHONPATH".to_string()));
}

#[test]
fn a_hanging_harness_times_out_and_its_whole_group_dies() {
    let f = fixture(vec![]);
    let mut req = f.request("hang");
    req.timeout = Duration::from_secs(1);
    let started = Instant::now();
    let r = f.evaluator.evaluate(&req).unwrap();
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(r.wall_seconds >= 1.5, "killed only after timeout + grace");
    let pid_file = f.evaluator.build_dir(&req).unwrap().join("child.pid");
    let pid: i32 = std::fs::read_to_string(pid_file).unwrap().parse().unwrap();
    assert!(wait_dead(pid), "the grandchild {pid} survived the timeout");
}

/// Ctrl-C during an evaluation: the harness and everything it started die at once, not at the
/// request's timeout, and the evaluation is an error (nothing to record), not a verdict.
#[test]
fn an_interrupt_kills_the_harness_group_in_flight() {
    let interrupt = Interrupt::new();
    let f = fixture_with(vec![], Some(interrupt.clone()));
    let mut req = f.request("hang");
    req.timeout = Duration::from_secs(60);
    let pid_file = f.evaluator.build_dir(&req).unwrap().join("child.pid");
    // Asked once the harness has started its own child, as Ctrl-C would come mid-evaluation.
    let asked = std::sync::Arc::new(std::sync::Mutex::new(None));
    let asker = {
        let (interrupt, pid_file, asked) = (interrupt.clone(), pid_file.clone(), asked.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !pid_file.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            *asked.lock().unwrap() = Some(Instant::now());
            interrupt.request();
        })
    };
    let r = f.evaluator.evaluate(&req);
    let returned = Instant::now();
    asker.join().unwrap();
    assert!(matches!(r, Err(EvalError::Interrupted)), "{r:?}");
    let asked = asked.lock().unwrap().expect("asked");
    assert!(
        returned - asked < Duration::from_secs(3),
        "{:?}",
        returned - asked
    );
    let pid: i32 = std::fs::read_to_string(pid_file).unwrap().parse().unwrap();
    assert!(
        wait_dead(pid),
        "the grandchild {pid} survived the interrupt"
    );
    // Once requested, nothing more starts.
    let again = Instant::now();
    assert!(matches!(
        f.evaluator.evaluate(&f.request("pass")),
        Err(EvalError::Interrupted)
    ));
    assert!(again.elapsed() < Duration::from_secs(1));
}

#[test]
fn processes_left_behind_by_a_finished_harness_are_killed() {
    let f = fixture(vec![]);
    let req = f.request("leave_child");
    let r = f.evaluator.evaluate(&req).unwrap();
    assert_eq!(r.status, Status::Passed);
    let pid_file = f.evaluator.build_dir(&req).unwrap().join("child.pid");
    let pid: i32 = std::fs::read_to_string(pid_file).unwrap().parse().unwrap();
    assert!(wait_dead(pid), "the leftover {pid} is still running");
}

#[test]
fn result_channel_problems_are_integrity_violations() {
    let f = fixture(vec![]);
    for mode in ["wrong_nonce", "garbage", "two_lines", "silent_exit"] {
        let r = f.evaluator.evaluate(&f.request(mode)).unwrap();
        assert_eq!(r.status, Status::IntegrityViolation, "{mode}: {r:?}");
        let v = r.violation.as_ref().unwrap();
        assert_eq!(v.class, ViolationClass::ResultChannel, "{mode}");
        assert!(!v.message.is_empty());
    }
}

#[test]
fn a_crash_is_a_runtime_error() {
    let f = fixture(vec![]);
    let r = f.evaluator.evaluate(&f.request("segfault")).unwrap();
    assert_eq!(r.status, Status::RuntimeError, "{r:?}");
    assert!(r.message.contains("SIGSEGV"), "{}", r.message);
}

#[test]
fn a_protocol_mismatch_is_our_error() {
    let f = fixture(vec![]);
    let err = f
        .evaluator
        .evaluate(&f.request("old_protocol"))
        .unwrap_err();
    assert!(err.to_string().contains("protocol 0"), "{err}");
}

#[test]
fn nan_in_a_result_is_read_as_missing() {
    let f = fixture(vec![]);
    let r = f.evaluator.evaluate(&f.request("nan")).unwrap();
    assert_eq!(r.status, Status::Incorrect);
    assert_eq!(r.score, None);
}

#[test]
fn output_is_kept_as_a_bounded_tail() {
    let f = fixture(vec![]);
    let r = f.evaluator.evaluate(&f.request("chatty")).unwrap();
    assert_eq!(r.status, Status::Passed);
    assert!(
        r.harness_output.len() < 4096 + 100,
        "{}",
        r.harness_output.len()
    );
    assert!(r.harness_output.ends_with("LAST LINE\n"));
    assert!(r.harness_output.contains("earlier bytes dropped"));
}

/// When an evaluation of `req` and a second op, started `delay_ms` later on another thread,
/// ran (the fake harness's clock, seconds): `(evaluation, second)`, after checking that the
/// second was `op`.
fn evaluation_and(
    f: &Fixture,
    req: &EvalRequest,
    delay_ms: u64,
    op: &str,
    second: impl FnOnce(&Evaluator, &EvalRequest) -> ksearch_eval::EvalResult + Send,
) -> ((f64, f64), (f64, f64)) {
    let interval = |r: &ksearch_eval::EvalResult| {
        let e = &r.extra["echo"];
        (
            e["started"].as_f64().unwrap(),
            e["finished"].as_f64().unwrap(),
        )
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| f.evaluator.evaluate(req).unwrap());
        let b = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(delay_ms));
            second(&f.evaluator, req)
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(b.extra["echo"]["op"], op);
    (interval(&a), interval(&b))
}

fn on_gpu(mut req: EvalRequest, device: &str) -> EvalRequest {
    req.backend = "cuda".into();
    req.device = Some(device.into());
    req
}

#[test]
fn timed_evaluations_never_overlap_and_builds_overlap_them_only_off_the_cpu() {
    let f = fixture(vec![]);
    let req = f.request("sleep 0.8");
    let (a, b) = evaluation_and(&f, &req, 0, "evaluate", |e, r| e.evaluate(r).unwrap());
    assert!(
        a.1 <= b.0 || b.1 <= a.0,
        "timed runs overlapped: {a:?} {b:?}"
    );

    // On a GPU, compiling while another candidate is timed costs the timing nothing.
    let req = on_gpu(f.request("sleep 2"), "cuda:test-overlap");
    let (a, b) = evaluation_and(&f, &req, 300, "build", |e, r| e.build(r).unwrap());
    assert!(
        a.0 < b.1 && b.0 < a.1,
        "a gpu build waited for a timed run: {a:?} {b:?}"
    );

    // On the cpu a compiler would share the cores with the timed kernel: builds wait.
    let req = f.request("sleep 0.8");
    let (a, b) = evaluation_and(&f, &req, 200, "build", |e, r| e.build(r).unwrap());
    assert!(
        a.1 <= b.0 || b.1 <= a.0,
        "a cpu build ran during a timed run: {a:?} {b:?}"
    );
}

/// Two evaluations of `req` started together on two threads: each one's interval (the fake
/// harness's clock) and whether its harness was given a device gate.
fn two_evaluations(f: &Fixture, req: &EvalRequest) -> [((f64, f64), bool); 2] {
    let run = || {
        let r = f.evaluator.evaluate(req).unwrap();
        assert!(r.passed(), "{} / {}", r.message, r.harness_output);
        let e = &r.extra["echo"];
        let gated = e["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v == "KSEARCH_HARNESS_DEVICE_GATE");
        // The result says how many judges shared the device, where more than one did.
        assert_eq!(r.extra.get("judge_lanes").is_some(), gated);
        (
            (
                e["started"].as_f64().unwrap(),
                e["finished"].as_f64().unwrap(),
            ),
            gated,
        )
    };
    std::thread::scope(|s| {
        let a = s.spawn(run);
        let b = s.spawn(run);
        [a.join().unwrap(), b.join().unwrap()]
    })
}

#[test]
fn in_lanes_gpu_evaluations_run_side_by_side_behind_a_gate_and_cpu_ones_one_at_a_time() {
    let f = fixture_in_lanes(2);
    let [(a, gated_a), (b, gated_b)] =
        two_evaluations(&f, &on_gpu(f.request("sleep 0.8"), "cuda:test-lanes"));
    assert!(
        a.0 < b.1 && b.0 < a.1,
        "evaluations in two lanes waited for each other: {a:?} {b:?}"
    );
    assert!(gated_a && gated_b, "a judge in lanes has no device gate");

    // The cpu backend times on the cores a second judge would use: one at a time, no gate.
    let [(a, gated_a), (b, gated_b)] = two_evaluations(&f, &f.request("sleep 0.5"));
    assert!(
        a.1 <= b.0 || b.1 <= a.0,
        "cpu evaluations overlapped: {a:?} {b:?}"
    );
    assert!(!gated_a && !gated_b);

    // One lane: one at a time, as always.
    let f = fixture_in_lanes(1);
    let [(a, gated_a), (b, gated_b)] =
        two_evaluations(&f, &on_gpu(f.request("sleep 0.5"), "cuda:test-one-lane"));
    assert!(
        a.1 <= b.0 || b.1 <= a.0,
        "evaluations in one lane overlapped: {a:?} {b:?}"
    );
    assert!(!gated_a && !gated_b);
}

#[test]
fn a_profile_waits_for_the_timed_run_on_its_device() {
    let f = fixture(vec![]);
    let req = on_gpu(f.request("sleep 0.8"), "cuda:test-profile");
    let (a, b) = evaluation_and(&f, &req, 200, "profile", |e, r| e.profile(r).unwrap());
    assert!(
        a.1 <= b.0 || b.1 <= a.0,
        "a profile replayed kernels during a timed run: {a:?} {b:?}"
    );
}

#[test]
fn probe_returns_the_harness_answer() {
    let f = fixture(vec![]);
    let p = f.evaluator.probe().unwrap();
    assert_eq!(p["compilers"]["cc"], "fake");
    assert!(p["python"].as_str().unwrap().starts_with('3'));
}

#[test]
fn a_missing_harness_is_reported_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let err = Evaluator::new(EvaluatorConfig {
        python: Some(python()),
        harness_dir: Some(dir.path().to_path_buf()),
        work_dir: Some(dir.path().join("work")),
        ..EvaluatorConfig::default()
    })
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("cannot be imported"), "{text}");
    assert!(text.contains("No module named 'ksearch_harness'"), "{text}");
}

#[test]
fn an_unreadable_candidate_is_our_error_not_a_result() {
    let f = fixture(vec![]);
    let mut req = f.request("pass");
    req.candidate.path = f.dir.path().join("missing.c");
    let err = f.evaluator.evaluate(&req).unwrap_err();
    assert!(err.to_string().contains("missing.c"), "{err}");
}
