//! Fault injection: a real `ksearch run` is SIGKILLed at random moments, many times over, and
//! resumed each time until it finishes. After every kill the run store must hold every
//! evaluation committed before it, unchanged (same ids, candidates, statuses, scores, results
//! and sources), with no candidate evaluated twice and no round sample, seed or re-check
//! written twice; at the end the run is finished, every candidate has exactly one evaluation,
//! the world model is valid and `ksearch show` works.
//!
//! The evaluator is `tests/fixtures/fast_harness`, a stand-in for the Python harness that
//! answers in milliseconds (a verdict that depends only on the source), reached through a
//! `KSEARCH_ROOT` whose `harness/` is that stand-in and whose tasks and knowledge are the
//! checkout's. So the whole ksearch process is real — task loading, offline proposer, lint,
//! engine, run store, harness processes — and only the measurements are fake.
//!
//! Also: Ctrl-C in the middle of an evaluation, and a run stored by an earlier release.
//!
//! `KSEARCH_CRASH_KILLS=N` asks for more kills (the default suits CI), `KSEARCH_CRASH_SEED`
//! replays a sequence of kill delays (the seed used is printed).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use ksearch_search::world_model::WorldModel;
use ksearch_store::{CandidateKind, RunStore};

const DEFAULT_KILLS: usize = 24;
const ROUNDS: u32 = 12;

#[test]
fn a_run_killed_at_random_moments_resumes_with_every_evaluation_intact() {
    let kills_wanted: usize = std::env::var("KSEARCH_CRASH_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_KILLS);
    let seed = std::env::var("KSEARCH_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("crash-resume: seed {seed} (KSEARCH_CRASH_SEED={seed} replays the kill delays)");
    let mut rng = XorShift(seed | 1);

    let tmp = tempfile::tempdir().unwrap();
    let root = fast_root(tmp.path());
    let env = Env {
        root,
        cache: tmp.path().join("cache"),
    };
    let runs = tmp.path().join("runs");

    let started = Instant::now();
    let mut kills = 0usize;
    let mut sessions = 0usize;
    // Sessions that committed at least one evaluation before they ended.
    let mut progressed = 0usize;
    let mut rounds = ROUNDS;
    let mut seen = Snapshot::default();
    let mut run_dir: Option<PathBuf> = None;
    while kills < kills_wanted {
        // Most kills land inside a session; a few late ones let sessions finish, which then
        // continue under a raised round budget.
        let delay = Duration::from_millis(rng.below(1500));
        let mut cmd = env.session(run_dir.as_deref(), rounds, &runs);
        sessions += 1;
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (killed, out) = kill_after(child, delay);
        if killed {
            kills += 1;
        } else {
            assert!(
                out.status.success(),
                "session {sessions} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if run_dir.is_none() {
            run_dir = find_run(&runs);
            if run_dir.is_none() {
                // Killed before the run existed: start again in a clean directory.
                let _ = std::fs::remove_dir_all(&runs);
                continue;
            }
        }
        let dir = run_dir.as_ref().unwrap();
        let now = Snapshot::take(dir);
        now.check_consistent(&format!("after session {sessions} (killed: {killed})"));
        seen.check_kept_by(&now, sessions);
        if now.evaluations.len() > seen.evaluations.len() {
            progressed += 1;
        }
        seen = now;
        if RunStore::open(dir).unwrap().is_finished().unwrap() {
            // It finished (a kill can land after that, too): raise the budget so the next
            // session has work to be killed in.
            rounds += 6;
        }
    }

    // The last session runs to the end (a `run` still, if every kill came before the run
    // existed) under the same budget, so that it takes up what the last kill interrupted,
    // the final re-checks included. (Under a raised budget the search would go on, and a
    // re-check interrupted before would be left without a result: a later finish re-checks
    // the winner of then.)
    let out = env
        .session(run_dir.as_deref(), rounds, &runs)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the final session failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outcome["outcome"]["rounds_used"], rounds, "{outcome}");
    let dir = PathBuf::from(outcome["dir"].as_str().unwrap());
    let last = Snapshot::take(&dir);
    last.check_consistent("at the end");
    seen.check_kept_by(&last, sessions + 1);

    let store = RunStore::open(&dir).unwrap();
    assert!(store.is_finished().unwrap());
    // Every candidate, re-checks included, was evaluated exactly once, whatever the kills
    // interrupted.
    for c in store.candidates().unwrap() {
        let n = last.evaluations.values().filter(|e| e.0 == c.id).count();
        assert_eq!(
            n, 1,
            "candidate {} ({:?}) has {n} evaluations",
            c.id, c.kind
        );
    }
    let state = store.get_state("engine").unwrap().unwrap();
    let wm: WorldModel = serde_json::from_value(state["wm"].clone()).unwrap();
    wm.validate().unwrap();
    let show = env.ksearch().arg("show").arg(&dir).output().unwrap();
    assert!(
        show.status.success(),
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
    assert!(String::from_utf8_lossy(&show.stdout).contains("status: finished"));
    eprintln!(
        "crash-resume: {kills} kills over {sessions} sessions ({progressed} committed \
         evaluations), {} evaluations, {} candidates, {:.1} s",
        last.evaluations.len(),
        last.candidates.len(),
        started.elapsed().as_secs_f64()
    );
}

/// An evaluation row: candidate, status, score, result.
type EvaluationRow = (i64, String, Option<f64>, Value);
/// A candidate row: source id, kind, round, sample, node, parent candidate.
type CandidateRow = (String, CandidateKind, u32, u32, Option<String>, Option<i64>);

/// What a run's store holds, keyed by row id.
#[derive(Default)]
struct Snapshot {
    evaluations: BTreeMap<i64, EvaluationRow>,
    candidates: BTreeMap<i64, CandidateRow>,
}

impl Snapshot {
    fn take(dir: &Path) -> Snapshot {
        let store = RunStore::open(dir).unwrap();
        let problems = store.check_integrity().unwrap();
        assert!(problems.is_empty(), "integrity: {problems:?}");
        Snapshot {
            evaluations: store
                .evaluations()
                .unwrap()
                .into_iter()
                .map(|e| (e.id, (e.candidate_id, e.status, e.score, e.result)))
                .collect(),
            candidates: store
                .candidates()
                .unwrap()
                .into_iter()
                .map(|c| {
                    let row = (
                        c.source_id.as_str().to_string(),
                        c.kind,
                        c.round,
                        c.sample,
                        c.node_id,
                        c.parent_candidate,
                    );
                    (c.id, row)
                })
                .collect(),
        }
    }

    /// Nothing evaluated twice; no sample, seed or re-check written twice.
    fn check_consistent(&self, when: &str) {
        let mut per_candidate: BTreeMap<i64, usize> = BTreeMap::new();
        for (cid, ..) in self.evaluations.values() {
            assert!(
                self.candidates.contains_key(cid),
                "{when}: evaluation of unknown candidate {cid}"
            );
            *per_candidate.entry(*cid).or_default() += 1;
        }
        for (cid, n) in &per_candidate {
            assert!(*n <= 1, "{when}: candidate {cid} was evaluated {n} times");
        }
        let mut slots: BTreeMap<(u32, u32), i64> = BTreeMap::new();
        let mut rechecks: BTreeMap<(Option<i64>, u32), i64> = BTreeMap::new();
        let mut seeds = 0;
        for (id, (_, kind, round, sample, _, parent)) in &self.candidates {
            match kind {
                CandidateKind::Seed => seeds += 1,
                CandidateKind::Attempt => {
                    if let Some(other) = slots.insert((*round, *sample), *id) {
                        panic!(
                            "{when}: round {round} sample {sample} was written twice \
                             (candidates {other} and {id})"
                        );
                    }
                }
                CandidateKind::Recheck => {
                    if let Some(other) = rechecks.insert((*parent, *round), *id) {
                        panic!(
                            "{when}: candidate {parent:?} was re-checked twice at round {round} \
                             (candidates {other} and {id})"
                        );
                    }
                }
            }
        }
        assert!(seeds <= 1, "{when}: the seed was recorded {seeds} times");
    }

    /// Every row of `self` is in `later`, unchanged.
    fn check_kept_by(&self, later: &Snapshot, session: usize) {
        for (id, row) in &self.evaluations {
            assert_eq!(
                later.evaluations.get(id),
                Some(row),
                "session {session}: evaluation {id} was lost or changed"
            );
        }
        for (id, row) in &self.candidates {
            assert_eq!(
                later.candidates.get(id),
                Some(row),
                "session {session}: candidate {id} was lost or changed"
            );
        }
    }
}

struct Env {
    root: PathBuf,
    cache: PathBuf,
}

impl Env {
    /// The next session: `run` until the run exists, then `resume` (with the round budget).
    fn session(&self, run_dir: Option<&Path>, rounds: u32, runs: &Path) -> Command {
        let mut cmd = self.ksearch();
        match run_dir {
            None => cmd
                .args([
                    "run",
                    "--task",
                    "softmax",
                    "--backend",
                    "cpu",
                    "--seed",
                    "5",
                ])
                .args(["--samples", "2", "--timing", "quick", "--runs-dir"])
                .arg(runs),
            Some(dir) => cmd.arg("resume").arg(dir),
        };
        cmd.arg("--rounds").arg(rounds.to_string());
        cmd
    }

    fn ksearch(&self) -> Command {
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("ksearch"));
        common::configure(&mut cmd);
        cmd.env("KSEARCH_ROOT", &self.root)
            .env("KSEARCH_CACHE_DIR", &self.cache)
            .env("KSEARCH_PYTHON", python());
        cmd
    }
}

/// Ctrl-C during an evaluation: ksearch kills the harness and what it started, says how to
/// resume and exits with 130 within seconds; `show` calls the run interrupted, and `resume`
/// finishes it.
#[test]
fn ctrl_c_abandons_the_evaluation_in_flight_and_leaves_a_resumable_run() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env {
        root: fast_root(tmp.path()),
        cache: tmp.path().join("cache"),
    };
    let runs = tmp.path().join("runs");
    let pids = tmp.path().join("hanging.pids");
    let child = env
        .session(None, 4, &runs)
        .env("KSEARCH_HARNESS_FAST_HANG_PIDS", &pids)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&pids).is_ok_and(|s| s.ends_with('\n')) {
        assert!(Instant::now() < deadline, "no evaluation started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let interrupted = Instant::now();
    // SAFETY: signals a child this test spawned and has not reaped.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(interrupted.elapsed() < Duration::from_secs(10), "{err}");
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted: the run is saved"), "{err}");
    assert!(err.contains("ksearch resume "), "{err}");
    for pid in std::fs::read_to_string(&pids).unwrap().split_whitespace() {
        let pid: i32 = pid.parse().unwrap();
        let gone = (0..250).any(|_| {
            // A zombie counts as gone: only its parent's reaping is left.
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let dead = state.is_empty()
                || state
                    .rsplit(") ")
                    .next()
                    .is_some_and(|r| r.starts_with('Z'));
            if !dead {
                std::thread::sleep(Duration::from_millis(20));
            }
            dead
        });
        assert!(
            gone,
            "process {pid} of the interrupted evaluation is still running"
        );
    }

    let dir = find_run(&runs).expect("the run is kept");
    let store = RunStore::open(&dir).unwrap();
    assert!(!store.is_finished().unwrap());
    drop(store);
    let shown = env.ksearch().arg("show").arg(&dir).output().unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("status: interrupted"), "{shown}");
    let out = env.session(Some(&dir), 4, &runs).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(RunStore::open(&dir).unwrap().is_finished().unwrap());
}

/// A run stored by ksearch 0.1.0 (tests/fixtures/run-0.1.0: its database as SQL, its sources;
/// a finished two-round offline run of the cpu softmax) loads, shows and resumes with this
/// build: the stored settings are the store's own format, whatever the flags are called now.
#[test]
fn a_run_stored_by_release_0_1_0_loads_shows_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env {
        root: fast_root(tmp.path()),
        cache: tmp.path().join("cache"),
    };
    let fixture = common::workspace_root().join("crates/cli/tests/fixtures/run-0.1.0");
    let id = std::fs::read_to_string(fixture.join("RUN_ID")).unwrap();
    let dir = tmp.path().join("runs").join(id.trim());
    std::fs::create_dir_all(dir.join("sources")).unwrap();
    for f in std::fs::read_dir(fixture.join("sources"))
        .unwrap()
        .flatten()
    {
        std::fs::copy(f.path(), dir.join("sources").join(f.file_name())).unwrap();
    }
    let sql = std::fs::read_to_string(fixture.join("ksearch.sql")).unwrap();
    rusqlite::Connection::open(dir.join("ksearch.db"))
        .unwrap()
        .execute_batch(&sql)
        .unwrap();
    let before = RunStore::open(&dir).unwrap().evaluations().unwrap().len();

    let shown = env.ksearch().arg("show").arg(&dir).output().unwrap();
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    assert!(
        text.contains("status: finished") && text.contains("best: candidate"),
        "{text}"
    );

    let out = env
        .ksearch()
        .args(["resume", "--rounds", "3", "--json"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outcome["outcome"]["rounds_used"], 3, "{outcome}");
    let store = RunStore::open(&dir).unwrap();
    assert!(store.is_finished().unwrap());
    assert!(store.evaluations().unwrap().len() > before);
    assert_eq!(store.check_integrity().unwrap(), Vec::<String>::new());
}

/// The interpreter for the stand-in harness (it needs nothing beyond the standard library):
/// CI's, else the one `python3` runs, by its real path (a version manager's `python3` shim
/// can cost more start-up time than the stand-in's whole evaluation).
fn python() -> std::ffi::OsString {
    if let Some(p) = std::env::var_os("KSEARCH_TEST_PYTHON") {
        return p;
    }
    static RESOLVED: std::sync::OnceLock<std::ffi::OsString> = std::sync::OnceLock::new();
    RESOLVED
        .get_or_init(|| {
            Command::new("python3")
                .args(["-c", "import sys; print(sys.executable)"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "python3".into())
                .into()
        })
        .clone()
}

/// A `KSEARCH_ROOT` with the checkout's tasks and knowledge and the fast harness.
fn fast_root(tmp: &Path) -> PathBuf {
    let ws = common::workspace_root().canonicalize().unwrap();
    let root = tmp.join("root");
    std::fs::create_dir_all(&root).unwrap();
    for tree in ["tasks", "knowledge"] {
        std::os::unix::fs::symlink(ws.join(tree), root.join(tree)).unwrap();
    }
    std::os::unix::fs::symlink(
        ws.join("crates/cli/tests/fixtures/fast_harness"),
        root.join("harness"),
    )
    .unwrap();
    root
}

/// SIGKILLs `child` after `delay` unless it exits first; returns whether it was killed.
fn kill_after(mut child: Child, delay: Duration) -> (bool, std::process::Output) {
    let deadline = Instant::now() + delay;
    let mut killed = false;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() >= deadline {
            // SIGKILL: no destructor, no flush, no clean-up in ksearch.
            child.kill().unwrap();
            killed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    (killed, child.wait_with_output().unwrap())
}

/// The run directory under `runs` whose store opens (a kill during creation can leave a
/// directory without a run in it).
fn find_run(runs: &Path) -> Option<PathBuf> {
    let dirs = std::fs::read_dir(runs).ok()?;
    dirs.filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| RunStore::open(p).is_ok())
}

struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
