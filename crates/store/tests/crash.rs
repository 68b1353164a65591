//! Crash safety: a writer process is SIGKILLed at a random moment, several times over the same
//! run; after each kill the run must reopen with every evaluation the writer reported as
//! committed, pass SQLite's integrity check, and have every referenced source on disk.
//!
//! The writer is this test binary re-invoked with `CHILD_ENV` set (see `child_main`).

use ksearch_store::*;
use serde_json::json;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const CHILD_ENV: &str = "KSEARCH_STORE_CRASH_CHILD_RUN";
const TEST_NAME: &str = "sigkill_loses_no_committed_evaluation";
const KILLS: usize = 4;

#[test]
fn sigkill_loses_no_committed_evaluation() {
    if let Some(run_dir) = std::env::var_os(CHILD_ENV) {
        child_main(Path::new(&run_dir));
    }

    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    eprintln!("crash test rng seed {seed}");
    let mut rng = XorShift(seed | 1);

    let tmp = tempfile::tempdir().unwrap();
    let store = RunStore::create(&tmp.path().join("runs"), &config()).unwrap();
    let run_dir = store.dir().to_path_buf();
    drop(store);

    let mut committed: BTreeSet<(i64, i64, String)> = BTreeSet::new();
    for round in 0..KILLS {
        // Kill after a random number of reported commits plus a random sub-millisecond delay,
        // so the kill lands anywhere in the write cycle (source file, candidate, evaluation,
        // world model, exchange, event), not only right after a commit.
        let after = 1 + rng.below(60) as usize;
        let delay = Duration::from_micros(rng.below(3000));
        let seen = run_child_and_kill(&run_dir, after, delay);
        assert!(
            seen.len() >= after,
            "round {round}: child reported {} commits, wanted {after}",
            seen.len()
        );
        committed.extend(seen);

        let store = RunStore::open(&run_dir).unwrap();
        let problems = store.check_integrity().unwrap();
        assert!(problems.is_empty(), "round {round}: {problems:?}");

        let evals = store.evaluations().unwrap();
        let cands = store.candidates().unwrap();
        for (cid, eid, sid) in &committed {
            let e = evals
                .iter()
                .find(|e| e.id == *eid)
                .unwrap_or_else(|| panic!("round {round}: committed evaluation {eid} is missing"));
            assert_eq!(e.candidate_id, *cid);
            assert_eq!(e.result["candidate"], json!(cid));
            let c = cands.iter().find(|c| c.id == *cid).unwrap();
            assert_eq!(c.source_id.as_str(), sid);
        }
        // No row may name a source that is not on disk with the right content.
        for c in &cands {
            let code = store.source(&c.source_id).unwrap();
            assert!(code.starts_with("// candidate"), "{code:?}");
        }
        for e in &evals {
            assert!(cands.iter().any(|c| c.id == e.candidate_id));
        }
        let conn = rusqlite::Connection::open(run_dir.join(DB_FILE)).unwrap();
        let ok: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(ok, "ok");
    }
    assert!(committed.len() >= KILLS);
}

/// Starts the writer, waits for `after` commit markers, sleeps `delay`, SIGKILLs it, and
/// returns every marker it printed (including those still in the pipe when it died).
fn run_child_and_kill(run_dir: &Path, after: usize, delay: Duration) -> Vec<(i64, i64, String)> {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, run_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    let mut markers = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while markers.len() < after {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => markers.extend(parse_marker(&line)),
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "writer produced only {} commits before dying or timing out",
                    markers.len()
                );
            }
        }
    }
    std::thread::sleep(delay);
    child.kill().unwrap(); // SIGKILL on Unix
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "writer must have been killed, not exited: {status:?}"
    );
    reader.join().unwrap();
    markers.extend(rx.try_iter().filter_map(|l| parse_marker(&l)));
    markers
}

fn parse_marker(line: &str) -> Option<(i64, i64, String)> {
    let rest = line.strip_prefix("committed ")?;
    let mut it = rest.split(' ');
    let cid = it.next()?.parse().ok()?;
    let eid = it.next()?.parse().ok()?;
    let sid = it.next()?.to_string();
    Some((cid, eid, sid))
}

/// The writer: appends work the way the engine does until it is killed. A marker is printed
/// only after `record_evaluation` returned, i.e. after its transaction committed.
fn child_main(run_dir: &Path) -> ! {
    let store = RunStore::open(run_dir).unwrap();
    let start = store.candidates().unwrap().len();
    let parent = store.candidates().unwrap().last().map(|c| c.id);
    for i in start.. {
        // Big enough that a kill can land inside the source write.
        let code = format!(
            "// candidate {i}\n{}",
            "float acc = 0.0f;\n".repeat(200 + i % 50)
        );
        let source_id = store.put_source(&code, "c").unwrap();
        let cid = store
            .add_candidate(&NewCandidate {
                source_id: source_id.clone(),
                parent_candidate: parent,
                node_id: Some(format!("n{}", i % 7)),
                round: (i / 10) as u32,
                cycle: (i % 10) as u32,
                attempt: 0,
                sample: 0,
                kind: CandidateKind::Attempt,
                proposer_note: format!("try {i}"),
                knobs: json!({"i": i}),
            })
            .unwrap();
        let result = json!({"candidate": cid, "status": "passed", "workloads": [{"candidate_ns": vec![i; 50]}]});
        let eid = store
            .record_evaluation(cid, "passed", Some(i as f64), &result)
            .unwrap();
        println!("committed {cid} {eid} {source_id}");
        if i % 3 == 0 {
            store
                .snapshot_world_model((i / 10) as u32, (i % 10) as u32, &json!({"i": i}))
                .unwrap();
            store.set_state("cycle", &json!({"i": i})).unwrap();
        }
        if i % 4 == 0 {
            store
                .record_exchange(&Exchange {
                    role: "propose".into(),
                    prompt: format!("prompt {i}"),
                    response: format!("response {i}"),
                    model: "m".into(),
                    provider: "replay".into(),
                    input_tokens: 10,
                    output_tokens: 5,
                    cost_usd: 0.001,
                    latency_ms: 3,
                    error: None,
                    cached: false,
                })
                .unwrap();
        }
        store
            .append_event("evaluated", &json!({"candidate": cid}))
            .unwrap();
    }
    unreachable!("the writer loops until it is killed")
}

fn config() -> RunConfig {
    RunConfig {
        task: "crash".into(),
        backend: "cpu".into(),
        strategy: "best-of-n".into(),
        proposer: "offline".into(),
        selection: "greedy".into(),
        seed: 1,
        secret_seed: 2,
        budgets: json!({}),
        flags: json!({}),
        extra: json!(null),
        created_at: String::new(),
        ksearch_version: String::new(),
    }
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
