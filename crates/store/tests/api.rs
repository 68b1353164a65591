//! Round trips of every RunStore call, on real SQLite databases in temp directories.

use ksearch_store::*;
use serde_json::{json, Value};
use std::path::Path;

fn config() -> RunConfig {
    RunConfig {
        task: "attention".into(),
        backend: "cpu".into(),
        strategy: "world-model".into(),
        proposer: "offline".into(),
        selection: "ucb".into(),
        seed: 7,
        // Above i64::MAX: must survive storage exactly.
        secret_seed: u64::MAX - 3,
        budgets: json!({"evaluations": 40, "usd": 1.5}),
        flags: json!({"fix_stagnation": true}),
        extra: Value::Null,
        created_at: String::new(),
        ksearch_version: String::new(),
    }
}

fn new_store(root: &Path) -> RunStore {
    RunStore::create(&root.join("runs"), &config()).unwrap()
}

fn candidate(store: &RunStore, code: &str, parent: Option<i64>) -> i64 {
    let source_id = store.put_source(code, "c").unwrap();
    store
        .add_candidate(&NewCandidate {
            source_id,
            parent_candidate: parent,
            node_id: Some("n1".into()),
            round: 1,
            cycle: 2,
            attempt: 3,
            sample: 2,
            kind: CandidateKind::Attempt,
            proposer_note: "tile 64".into(),
            knobs: json!({"tile": 64}),
        })
        .unwrap()
}

#[test]
fn create_lays_out_the_run_and_keeps_the_config() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let id = store.id().to_string();
    // 20261130-091500-3f2a
    let parts: Vec<&str> = id.split('-').collect();
    assert_eq!(parts.len(), 3, "{id}");
    assert_eq!(parts[0].len(), 8);
    assert_eq!(parts[1].len(), 6);
    assert_eq!(parts[2].len(), 4);
    assert!(
        parts[..2]
            .iter()
            .all(|p| p.bytes().all(|b| b.is_ascii_digit())),
        "{id}"
    );
    assert!(parts[2].bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    assert_eq!(store.dir(), tmp.path().join("runs").join(&id));
    assert!(store.dir().join(DB_FILE).is_file());
    assert!(store.dir().join(SOURCES_DIR).is_dir());
    assert_eq!(store.report_path(), store.dir().join("report.html"));

    let cfg = store.config().clone();
    assert_eq!(cfg.secret_seed, u64::MAX - 3);
    assert_eq!(cfg.budgets, json!({"evaluations": 40, "usd": 1.5}));
    assert!(
        cfg.created_at.ends_with('Z') && cfg.created_at.len() == 24,
        "{}",
        cfg.created_at
    );
    assert_eq!(cfg.ksearch_version, env!("CARGO_PKG_VERSION"));
    // The date in the id and in created_at agree.
    assert_eq!(&cfg.created_at[..4], &id[..4]);
    drop(store);

    let reopened = RunStore::open(&tmp.path().join("runs").join(&id)).unwrap();
    assert_eq!(reopened.id(), id);
    assert_eq!(reopened.config(), &cfg);
}

#[test]
fn ids_are_unique_and_existing_runs_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let a = RunStore::create(&runs, &config()).unwrap();
    let b = RunStore::create(&runs, &config()).unwrap();
    assert_ne!(a.id(), b.id());

    RunStore::create_with_id(&runs, "fixed-1", &config()).unwrap();
    match RunStore::create_with_id(&runs, "fixed-1", &config()) {
        Err(StoreError::RunExists(p)) => assert_eq!(p, runs.join("fixed-1")),
        other => panic!("expected RunExists, got {other:?}"),
    }
    for bad in ["", "../escape", "a/b", ".hidden", "sp ace"] {
        assert!(
            matches!(
                RunStore::create_with_id(&runs, bad, &config()),
                Err(StoreError::InvalidRunId(_))
            ),
            "{bad:?} accepted"
        );
    }
    assert!(!tmp.path().join("escape").exists());
}

#[test]
fn a_discarded_run_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let kept = RunStore::create(&runs, &config()).unwrap();
    let gone = RunStore::create(&runs, &config()).unwrap();
    gone.put_source("int x;", "c").unwrap();
    let lock = gone.lock_writer().unwrap();
    let (dir, id) = (gone.dir().to_path_buf(), gone.id().to_string());
    gone.discard(Some(lock)).unwrap();
    assert!(!dir.exists());
    let listed: Vec<String> = RunStore::list(&runs)
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(listed, vec![kept.id().to_string()]);
    assert!(RunStore::open_in(&runs, &id).is_err());
}

#[test]
fn open_accepts_dir_db_file_and_id_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    RunStore::create_with_id(&runs, "20260101-000000-aaaa", &config()).unwrap();
    RunStore::create_with_id(&runs, "20260101-000000-aabb", &config()).unwrap();
    RunStore::create_with_id(&runs, "20260202-000000-cccc", &config()).unwrap();

    let by_db = RunStore::open(&runs.join("20260202-000000-cccc").join(DB_FILE)).unwrap();
    assert_eq!(by_db.id(), "20260202-000000-cccc");
    assert_eq!(
        RunStore::open_in(&runs, "20260202").unwrap().id(),
        "20260202-000000-cccc"
    );
    assert_eq!(
        RunStore::open_in(&runs, "20260101-000000-aaaa")
            .unwrap()
            .id(),
        "20260101-000000-aaaa"
    );
    assert!(matches!(
        RunStore::open_in(&runs, "20260101-000000-aa"),
        Err(StoreError::AmbiguousRun(..))
    ));
    assert!(matches!(
        RunStore::open_in(&runs, "2027"),
        Err(StoreError::RunNotFound(_))
    ));
    assert!(matches!(
        RunStore::open(&tmp.path().join("nowhere")),
        Err(StoreError::RunNotFound(_))
    ));
    // A directory path given to open_in is opened as is.
    let dir = runs.join("20260101-000000-aabb");
    assert_eq!(
        RunStore::open_in(&runs, dir.to_str().unwrap())
            .unwrap()
            .id(),
        "20260101-000000-aabb"
    );
    // open_ref: a run directory (wherever it is), else an id prefix under runs_dir.
    assert_eq!(
        RunStore::open_ref(Path::new("elsewhere"), dir.to_str().unwrap())
            .unwrap()
            .id(),
        "20260101-000000-aabb"
    );
    assert_eq!(
        RunStore::open_ref(&runs, "20260202").unwrap().id(),
        "20260202-000000-cccc"
    );
}

#[test]
fn sources_are_content_addressed_and_deduplicated() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let code = "void k(float *x) { x[0] = 1.0f; }\n";
    let a = store.put_source(code, "c").unwrap();
    let b = store.put_source(code, "c").unwrap();
    let c = store.put_source("// other\n", "c").unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a.as_str(), blake3::hash(code.as_bytes()).to_hex().as_str());
    assert_eq!(store.source(&a).unwrap(), code);
    assert_eq!(
        store.source_path(&a).unwrap(),
        store.dir().join(SOURCES_DIR).join(format!("{a}.c"))
    );

    let mut names: Vec<String> = std::fs::read_dir(store.dir().join(SOURCES_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut want = vec![format!("{a}.c"), format!("{c}.c")];
    want.sort();
    assert_eq!(
        names, want,
        "one file per distinct text, no temp files left"
    );

    match store.put_source(code, "cu") {
        Err(StoreError::SourceExtConflict {
            existing,
            requested,
            ..
        }) => {
            assert_eq!((existing.as_str(), requested.as_str()), ("c", "cu"))
        }
        other => panic!("expected SourceExtConflict, got {other:?}"),
    }
    assert!(matches!(
        store.put_source(code, "../c"),
        Err(StoreError::InvalidExtension(_))
    ));
    let unknown = SourceId::of("never stored");
    assert!(matches!(
        store.source(&unknown),
        Err(StoreError::SourceNotFound(_))
    ));
}

#[test]
fn a_tampered_source_is_detected() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let id = store.put_source("int x;", "c").unwrap();
    assert!(store.check_integrity().unwrap().is_empty());
    std::fs::write(store.source_path(&id).unwrap(), "int y;").unwrap();
    assert!(matches!(
        store.source(&id),
        Err(StoreError::SourceCorrupt { .. })
    ));
    let problems = store.check_integrity().unwrap();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains(id.as_str()));
    std::fs::remove_file(store.source_path(&id).unwrap()).unwrap();
    assert!(matches!(store.source(&id), Err(StoreError::Io { .. })));
}

#[test]
fn candidates_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let seed_src = store.put_source("seed", "py").unwrap();
    let seed = store
        .add_candidate(&NewCandidate {
            source_id: seed_src.clone(),
            parent_candidate: None,
            node_id: None,
            round: 0,
            cycle: 0,
            attempt: 0,
            sample: 0,
            kind: CandidateKind::Seed,
            proposer_note: String::new(),
            knobs: Value::Null,
        })
        .unwrap();
    let child = candidate(&store, "child", Some(seed));
    assert!(child > seed);

    let rows = store.candidates().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].id, seed);
    assert_eq!(rows[0].kind, CandidateKind::Seed);
    assert_eq!(rows[0].source_id, seed_src);
    assert_eq!(rows[0].node_id, None);
    let c = &rows[1];
    assert_eq!(
        (
            c.parent_candidate,
            c.node_id.as_deref(),
            c.round,
            c.cycle,
            c.attempt,
            c.sample
        ),
        (Some(seed), Some("n1"), 1, 2, 3, 2)
    );
    assert_eq!(
        (c.kind, c.proposer_note.as_str()),
        (CandidateKind::Attempt, "tile 64")
    );
    assert_eq!(c.knobs, json!({"tile": 64}));
    assert_eq!(store.source(&c.source_id).unwrap(), "child");
    assert_eq!(store.candidate(child).unwrap().as_ref(), Some(c));
    assert_eq!(store.candidate(999).unwrap(), None);

    let bad_parent = NewCandidate {
        parent_candidate: Some(999),
        ..new_candidate(seed_src.clone())
    };
    assert!(matches!(
        store.add_candidate(&bad_parent),
        Err(StoreError::CandidateNotFound(999))
    ));
    let unstored = new_candidate(SourceId::of("not stored"));
    assert!(matches!(
        store.add_candidate(&unstored),
        Err(StoreError::SourceNotFound(_))
    ));
    assert_eq!(store.candidates().unwrap().len(), 2);
}

fn new_candidate(source_id: SourceId) -> NewCandidate {
    NewCandidate {
        source_id,
        parent_candidate: None,
        node_id: None,
        round: 0,
        cycle: 0,
        attempt: 0,
        sample: 0,
        kind: CandidateKind::Recheck,
        proposer_note: String::new(),
        knobs: json!({}),
    }
}

#[test]
fn evaluations_round_trip_and_best_is_the_top_passed_score() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let c1 = candidate(&store, "one", None);
    let c2 = candidate(&store, "two", Some(c1));
    let c3 = candidate(&store, "three", Some(c1));
    let c4 = candidate(&store, "four", None);
    assert_eq!(store.evaluation_for(c1).unwrap(), None);
    assert_eq!(store.best().unwrap(), None);

    let result = json!({"status": "passed", "score": 1.5, "workloads": [{"name": "w", "candidate_ns": [1, 2, 3]}]});
    let e1 = store
        .record_evaluation(c1, "passed", Some(1.5), &result)
        .unwrap();
    // A failed evaluation with a higher score never wins.
    store
        .record_evaluation(c2, "incorrect", Some(9.0), &json!({}))
        .unwrap();
    store
        .record_evaluation(c3, "passed", Some(2.5), &json!({"n": 3}))
        .unwrap();
    // Same top score later: the earlier one stays best.
    store
        .record_evaluation(c4, "passed", Some(2.5), &json!({"n": 4}))
        .unwrap();

    let got = store.evaluation_for(c1).unwrap().unwrap();
    assert_eq!(
        (got.id, got.candidate_id, got.status.as_str(), got.score),
        (e1, c1, "passed", Some(1.5))
    );
    assert_eq!(got.result, result);

    let (bc, be) = store.best().unwrap().unwrap();
    assert_eq!((bc.id, be.candidate_id, be.score), (c3, c3, Some(2.5)));
    assert_eq!(store.source(&bc.source_id).unwrap(), "three");

    // Re-evaluation (after a resume): the latest one is the candidate's evaluation.
    let e_again = store
        .record_evaluation(c1, "timeout", None, &json!({"message": "slow"}))
        .unwrap();
    let latest = store.evaluation_for(c1).unwrap().unwrap();
    assert_eq!(
        (latest.id, latest.status.as_str(), latest.score),
        (e_again, "timeout", None)
    );
    let all = store.evaluations().unwrap();
    assert_eq!(
        all.iter().map(|e| e.candidate_id).collect::<Vec<_>>(),
        vec![c1, c2, c3, c4, c1]
    );

    assert!(matches!(
        store.record_evaluation(c1, "passed", Some(f64::NAN), &json!({})),
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        store.record_evaluation(c1, "passed", Some(f64::INFINITY), &json!({})),
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        store.record_evaluation(c1, "", None, &json!({})),
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        store.record_evaluation(4242, "passed", Some(1.0), &json!({})),
        Err(StoreError::CandidateNotFound(4242))
    ));
    assert_eq!(store.evaluations().unwrap().len(), 5);
}

#[test]
fn world_model_snapshots() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    assert_eq!(store.latest_world_model().unwrap(), None);
    store
        .snapshot_world_model(0, 5, &json!({"nodes": [1]}))
        .unwrap();
    store
        .snapshot_world_model(1, 0, &json!({"nodes": [1, 2]}))
        .unwrap();
    store
        .snapshot_world_model(0, 9, &json!({"nodes": []}))
        .unwrap();
    assert_eq!(
        store.latest_world_model().unwrap(),
        Some((1, 0, json!({"nodes": [1, 2]})))
    );
    // A cycle that ends again after a resume replaces its snapshot.
    store
        .snapshot_world_model(1, 0, &json!({"nodes": [3]}))
        .unwrap();
    assert_eq!(
        store.latest_world_model().unwrap(),
        Some((1, 0, json!({"nodes": [3]})))
    );
    assert_eq!(
        store.world_model(0, 5).unwrap(),
        Some(json!({"nodes": [1]}))
    );
    assert_eq!(store.world_model(7, 7).unwrap(), None);
}

fn exchange(prompt: &str, cost: f64, cached: bool) -> Exchange {
    Exchange {
        role: "propose".into(),
        prompt: prompt.into(),
        response: format!("answer to {prompt}"),
        model: "m".into(),
        provider: "replay".into(),
        input_tokens: 100,
        output_tokens: 20,
        cost_usd: cost,
        latency_ms: 1234,
        error: None,
        cached,
    }
}

#[test]
fn exchanges_and_usage() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    assert_eq!(store.usage_totals().unwrap(), Usage::default());
    assert_eq!(store.failed_calls().unwrap(), None);
    let x1 = exchange("p1", 0.25, false);
    let mut x2 = exchange("p1", 0.0, true);
    x2.input_tokens = 0;
    x2.output_tokens = 0;
    let mut x3 = exchange("p2", 0.5, false);
    x3.error = Some("HTTP 500".into());
    let ids: Vec<i64> = [&x1, &x2, &x3]
        .iter()
        .map(|x| store.record_exchange(x).unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));

    let rows = store.exchanges().unwrap();
    assert_eq!(
        rows.iter().map(|r| r.exchange.clone()).collect::<Vec<_>>(),
        vec![x1, x2, x3]
    );
    assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), ids);

    let u = store.usage_totals().unwrap();
    assert_eq!(
        (u.calls, u.cached_calls, u.input_tokens, u.output_tokens),
        (3, 1, 200, 40)
    );
    assert_eq!(u.latency_ms, 3 * 1234);
    assert!((u.cost_usd - 0.75).abs() < 1e-12);
    let f = store.failed_calls().unwrap().unwrap();
    assert_eq!((f.count, f.last_error.as_str()), (1, "HTTP 500"));
    let mut x4 = exchange("p3", 0.0, false);
    x4.role = "code".into();
    x4.error = Some("connection refused".into());
    store.record_exchange(&x4).unwrap();
    store.record_exchange(&exchange("p4", 0.0, false)).unwrap();
    let f = store.failed_calls().unwrap().unwrap();
    assert_eq!(
        (f.count, f.last_role.as_str(), f.last_error.as_str()),
        (2, "code", "connection refused")
    );
    assert!(!f.last_at.is_empty());

    assert!(matches!(
        store.record_exchange(&exchange("p", -1.0, false)),
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        store.record_exchange(&exchange("p", f64::NAN, false)),
        Err(StoreError::Invalid(_))
    ));
    let mut huge = exchange("p", 0.0, false);
    huge.input_tokens = u64::MAX;
    assert!(matches!(
        store.record_exchange(&huge),
        Err(StoreError::Invalid(_))
    ));
    assert_eq!(store.usage_totals().unwrap().calls, 5);
}

#[test]
fn repeated_prompts_are_stored_once() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let big = "system prompt ".repeat(10_000);
    for _ in 0..5 {
        store.record_exchange(&exchange(&big, 0.0, false)).unwrap();
    }
    let db = store.dir().join(DB_FILE);
    drop(store);
    let conn = rusqlite::Connection::open(&db).unwrap();
    let texts: i64 = conn
        .query_row("SELECT COUNT(*) FROM texts", [], |r| r.get(0))
        .unwrap();
    assert_eq!(texts, 2, "one prompt and one response text");
}

#[test]
fn state_events_and_finish() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    assert_eq!(store.get_state("cycle").unwrap(), None);
    store.set_state("cycle", &json!({"streak": 1})).unwrap();
    store.set_state("cycle", &json!({"streak": 2})).unwrap();
    store.set_state("other", &json!([1, 2])).unwrap();
    assert_eq!(
        store.get_state("cycle").unwrap(),
        Some(json!({"streak": 2}))
    );

    let e1 = store
        .append_event("round_start", &json!({"round": 1}))
        .unwrap();
    let e2 = store
        .append_event("evaluated", &json!({"candidate": 3}))
        .unwrap();
    let all = store.events_after(0).unwrap();
    assert_eq!(
        all.iter()
            .map(|e| (e.id, e.kind.as_str()))
            .collect::<Vec<_>>(),
        vec![(e1, "round_start"), (e2, "evaluated")]
    );
    assert_eq!(all[1].data, json!({"candidate": 3}));
    assert!(all[0].at <= all[1].at && all[0].at.ends_with('Z'));
    assert_eq!(store.events_after(e1).unwrap().len(), 1);

    assert!(!store.is_finished().unwrap());
    assert_eq!(store.finish_summary().unwrap(), None);
    store.mark_finished(&json!({"best": 2.5})).unwrap();
    assert!(store.is_finished().unwrap());
    let dir = store.dir().to_path_buf();
    drop(store);

    let again = RunStore::open(&dir).unwrap();
    assert!(again.is_finished().unwrap());
    assert_eq!(again.finish_summary().unwrap(), Some(json!({"best": 2.5})));
    assert_eq!(again.get_state("other").unwrap(), Some(json!([1, 2])));
    assert_eq!(again.events_after(0).unwrap().len(), 2);
    // Continued under a raised budget: running again, with no summary until it finishes anew.
    again.mark_unfinished().unwrap();
    assert!(!again.is_finished().unwrap());
    assert_eq!(again.finish_summary().unwrap(), None);
    assert_eq!(again.get_state("other").unwrap(), Some(json!([1, 2])));
}

#[test]
fn the_span_runs_from_creation_to_the_finish_or_the_latest_record() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let span = store.span().unwrap();
    assert_eq!(span.started_at, store.config().created_at);
    assert_eq!((span.finished_at, span.last_record_at), (None, None));
    let started = timestamp_millis(&span.started_at).unwrap();

    let id = candidate(&store, "a", None);
    let after_candidate = store.span().unwrap().last_record_at.unwrap();
    store
        .record_evaluation(id, "passed", Some(1.0), &json!({}))
        .unwrap();
    store.append_event("cycle_end", &json!({})).unwrap();
    let last_event = store.events_after(0).unwrap()[0].at.clone();
    let span = store.span().unwrap();
    assert_eq!(span.last_record_at.as_deref(), Some(last_event.as_str()));
    assert!(after_candidate <= last_event);
    assert!(timestamp_millis(&last_event).unwrap() >= started);

    store.mark_finished(&json!({})).unwrap();
    let finished = store.span().unwrap().finished_at.unwrap();
    assert!(timestamp_millis(&finished).unwrap() >= timestamp_millis(&last_event).unwrap());
}

#[test]
fn everything_survives_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let c = candidate(&store, "kernel", None);
    store
        .record_evaluation(c, "passed", Some(3.0), &json!({"score": 3.0}))
        .unwrap();
    store.snapshot_world_model(2, 1, &json!({"v": 1})).unwrap();
    store.record_exchange(&exchange("p", 0.1, false)).unwrap();
    let before = (
        store.candidates().unwrap(),
        store.evaluations().unwrap(),
        store.exchanges().unwrap(),
    );
    let dir = store.dir().to_path_buf();
    drop(store);
    let store = RunStore::open(&dir).unwrap();
    let after = (
        store.candidates().unwrap(),
        store.evaluations().unwrap(),
        store.exchanges().unwrap(),
    );
    assert_eq!(before, after);
    assert_eq!(
        store.latest_world_model().unwrap(),
        Some((2, 1, json!({"v": 1})))
    );
    assert!(store.check_integrity().unwrap().is_empty());
}

#[test]
fn a_second_connection_reads_a_live_run() {
    let tmp = tempfile::tempdir().unwrap();
    let writer = new_store(tmp.path());
    let reader = RunStore::open(writer.dir()).unwrap();
    let c = candidate(&writer, "live", None);
    writer
        .record_evaluation(c, "passed", Some(1.0), &json!({}))
        .unwrap();
    assert_eq!(reader.candidates().unwrap().len(), 1);
    assert_eq!(reader.best().unwrap().unwrap().0.id, c);
    // list() opens read-only while the writer is live.
    let listed = RunStore::list(&tmp.path().join("runs")).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (
            listed[0].candidates,
            listed[0].evaluations,
            listed[0].best_score
        ),
        (1, 1, Some(1.0))
    );
    // ...and the reader's presence does not stop the writer.
    writer
        .record_evaluation(c, "passed", Some(2.0), &json!({}))
        .unwrap();
    assert_eq!(reader.evaluations().unwrap().len(), 2);
}

#[test]
fn one_writer_at_a_time_and_the_lock_goes_with_its_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let other = RunStore::open(store.dir()).unwrap();
    assert_eq!(other.writer().unwrap(), None, "never locked");
    let lock = store.lock_writer().unwrap();
    // A second writer (another `resume`) is refused at once and told who holds the run.
    let me = std::process::id();
    match other.lock_writer() {
        Err(StoreError::RunBusy { holder, .. }) => assert_eq!(holder, Some(me)),
        r => panic!("expected RunBusy, got {r:?}"),
    }
    let msg = other.lock_writer().unwrap_err().to_string();
    assert!(msg.contains(&format!("process {me}")), "{msg}");
    assert_eq!(other.writer().unwrap(), Some(Writer { pid: Some(me) }));
    // Peeking does not take the lock away from its holder.
    assert!(other.lock_writer().is_err());
    drop(lock);
    assert_eq!(other.writer().unwrap(), None);
    let _again = other.lock_writer().unwrap();
    assert!(store.lock_writer().is_err());
}

#[test]
fn list_summarises_runs_and_flags_broken_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    assert!(RunStore::list(&runs).unwrap().is_empty());

    let b = RunStore::create_with_id(&runs, "20260102-000000-bbbb", &config()).unwrap();
    let c = candidate(&b, "k", None);
    b.record_evaluation(c, "passed", Some(4.0), &json!({}))
        .unwrap();
    b.record_evaluation(c, "incorrect", Some(8.0), &json!({}))
        .unwrap();
    b.mark_finished(&json!({})).unwrap();
    drop(b);
    let a = RunStore::create_with_id(&runs, "20260101-000000-aaaa", &config()).unwrap();
    drop(a);
    std::fs::create_dir_all(runs.join("not-a-run")).unwrap();
    std::fs::create_dir_all(runs.join("20260103-000000-dead")).unwrap();
    std::fs::write(
        runs.join("20260103-000000-dead").join(DB_FILE),
        b"garbage, not sqlite",
    )
    .unwrap();

    let listed = RunStore::list(&runs).unwrap();
    let ids: Vec<&str> = listed.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "20260101-000000-aaaa",
            "20260102-000000-bbbb",
            "20260103-000000-dead"
        ]
    );
    let (a, b, dead) = (&listed[0], &listed[1], &listed[2]);
    assert_eq!(
        (a.finished, a.candidates, a.best_score, a.error.is_none()),
        (false, 0, None, true)
    );
    assert_eq!(
        (b.finished, b.candidates, b.evaluations, b.best_score),
        (true, 1, 2, Some(4.0))
    );
    assert_eq!(b.config.as_ref().unwrap().task, "attention");
    assert!(dead.error.is_some() && dead.config.is_none());
}

#[test]
fn a_newer_schema_is_refused_and_an_empty_database_is_not_a_run() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let dir = store.dir().to_path_buf();
    drop(store);
    {
        let conn = rusqlite::Connection::open(dir.join(DB_FILE)).unwrap();
        let v: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
    }
    assert!(
        matches!(RunStore::open(&dir), Err(StoreError::SchemaTooNew { found, .. }) if found == SCHEMA_VERSION + 1)
    );
    let listed = RunStore::list(&tmp.path().join("runs")).unwrap();
    assert!(
        listed[0].error.as_deref().unwrap_or("").contains("newer"),
        "{listed:?}"
    );

    // A database that migrations ran on but that has no run row is not a run.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    rusqlite::Connection::open(empty.join(DB_FILE)).unwrap();
    assert!(matches!(
        RunStore::open(&empty),
        Err(StoreError::NotARun(_))
    ));
}

#[test]
fn pragmas_are_set() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let conn = rusqlite::Connection::open(store.dir().join(DB_FILE)).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal", "WAL is persistent in the file");
    // Foreign keys are per connection: one that turns them off can insert a dangling reference,
    // and check_integrity reports it.
    conn.pragma_update(None, "foreign_keys", false).unwrap();
    conn.execute(
        "INSERT INTO candidates (source_id, round, cycle, attempt, kind, proposer_note, knobs_json, created_at)
         VALUES ('ab', 0, 0, 0, 'seed', '', 'null', '')",
        [],
    )
    .unwrap();
    let problems = store.check_integrity().unwrap();
    assert!(
        problems.iter().any(|p| p.contains("foreign_key_check")),
        "{problems:?}"
    );
}

#[test]
fn an_evaluation_amended_with_a_section_keeps_everything_else() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let c1 = candidate(&store, "one", None);
    let result = json!({"status": "passed", "score": 1.5, "workloads": [{"name": "w"}]});
    let e1 = store
        .record_evaluation(c1, "passed", Some(1.5), &result)
        .unwrap();
    let profile = json!({"available": true, "spent_seconds": 4.2});
    store.amend_evaluation(e1, "profile", &profile).unwrap();

    let got = store.evaluation_for(c1).unwrap().unwrap();
    assert_eq!(
        (got.id, got.status.as_str(), got.score),
        (e1, "passed", Some(1.5))
    );
    let mut expected = result.clone();
    expected["profile"] = profile;
    assert_eq!(got.result, expected);
    // Still one evaluation: an amendment is not a measurement.
    assert_eq!(store.evaluations().unwrap().len(), 1);

    // A second amendment of the same section replaces it.
    store.amend_evaluation(e1, "profile", &json!(null)).unwrap();
    assert_eq!(
        store.evaluation_for(c1).unwrap().unwrap().result["profile"],
        json!(null)
    );

    assert!(matches!(
        store.amend_evaluation(e1 + 7, "profile", &json!({})),
        Err(StoreError::EvaluationNotFound(id)) if id == e1 + 7
    ));
    let c2 = candidate(&store, "two", None);
    let e2 = store
        .record_evaluation(c2, "passed", Some(1.0), &json!([1, 2]))
        .unwrap();
    assert!(matches!(
        store.amend_evaluation(e2, "profile", &json!({})),
        Err(StoreError::Invalid(_))
    ));
}

#[test]
fn evaluated_sources_and_the_first_evaluation_of_a_source() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let a = store.put_source("kernel a", "c").unwrap();
    let b = store.put_source("kernel b", "c").unwrap();
    let c = store.put_source("kernel c", "c").unwrap();
    let add = |source: &SourceId, kind| {
        store
            .add_candidate(&NewCandidate {
                kind,
                ..new_candidate(source.clone())
            })
            .unwrap()
    };
    // a: a recheck (evaluated), then an attempt never evaluated, then two evaluated attempts.
    let a_recheck = add(&a, CandidateKind::Recheck);
    let _a_unevaluated = add(&a, CandidateKind::Attempt);
    let a_first = add(&a, CandidateKind::Attempt);
    let a_second = add(&a, CandidateKind::Attempt);
    // b: only a recheck; c: never evaluated.
    let b_recheck = add(&b, CandidateKind::Recheck);
    add(&c, CandidateKind::Seed);
    store
        .record_evaluation(a_recheck, "passed", Some(9.0), &json!({"r": 0}))
        .unwrap();
    store
        .record_evaluation(a_first, "failed", None, &json!({"r": 1}))
        .unwrap();
    store
        .record_evaluation(a_first, "passed", Some(2.0), &json!({"r": 2}))
        .unwrap();
    store
        .record_evaluation(a_second, "passed", Some(3.0), &json!({"r": 3}))
        .unwrap();
    store
        .record_evaluation(b_recheck, "passed", Some(1.0), &json!({"r": 4}))
        .unwrap();

    let evaluated = store.evaluated_source_ids().unwrap();
    assert_eq!(evaluated, [a.clone(), b.clone()].into_iter().collect());
    // The earliest evaluated non-recheck candidate, with its latest evaluation.
    let (id, eval) = store.first_evaluated_candidate_of(&a).unwrap().unwrap();
    assert_eq!((id, eval.result), (a_first, json!({"r": 2})));
    assert_eq!(store.first_evaluated_candidate_of(&b).unwrap(), None);
    assert_eq!(store.first_evaluated_candidate_of(&c).unwrap(), None);
}
