//! `TimeAccount` on run stores built here, with time stamps set by hand so that every number
//! can be worked out on paper.

use serde_json::{json, Value};

use ksearch_search::accounting::{
    TimeAccount, TimeKind, WallEnd, BUILD_REQUESTS, BUILD_WAITS, HARNESS_NO_PHASE,
    HARNESS_NO_PHASE_DATA, HARNESS_START_EXIT, OTHER, PROFILER, PROPOSER, YARDSTICK,
};
use ksearch_store::{CandidateKind, Exchange, NewCandidate, RunConfig, RunStore, DB_FILE};

fn new_store(dir: &std::path::Path) -> RunStore {
    RunStore::create_with_id(
        dir,
        "20261201-000000-abcd",
        &RunConfig {
            task: "attention".into(),
            backend: "cpu".into(),
            strategy: "world-model".into(),
            proposer: "offline".into(),
            selection: "calibrated".into(),
            seed: 1,
            secret_seed: 2,
            budgets: Value::Null,
            flags: Value::Null,
            extra: Value::Null,
            created_at: String::new(),
            ksearch_version: String::new(),
        },
    )
    .unwrap()
}

fn candidate(store: &RunStore, code: &str) -> i64 {
    let source_id = store.put_source(code, "c").unwrap();
    store
        .add_candidate(&NewCandidate {
            source_id,
            parent_candidate: None,
            node_id: None,
            round: 0,
            cycle: 0,
            attempt: 0,
            sample: 0,
            kind: CandidateKind::Attempt,
            proposer_note: String::new(),
            knobs: Value::Null,
        })
        .unwrap()
}

/// Rewrites the run's stamps (the store writes "now"; the test needs known instants).
fn set_span(store: &RunStore, started: &str, finished: Option<&str>) {
    let db = rusqlite::Connection::open(store.dir().join(DB_FILE)).unwrap();
    db.execute(
        "UPDATE run SET created_at = ?1, finished_at = ?2",
        rusqlite::params![started, finished],
    )
    .unwrap();
}

fn part(t: &TimeAccount, name: &str) -> Option<f64> {
    t.parts.iter().find(|p| p.name == name).map(|p| p.seconds)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn phases_yardsticks_proposer_and_other_add_up_to_the_wall() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let yard_1 = json!({"version": 1, "workloads": {"w": {"reference": {"median_ns": 5.0}}},
                        "seconds": 3.0});
    // Measured twice (the first attempt drifted): its processes took 4 s in all.
    let yard_2 = json!({"version": 1, "workloads": {"w": {"reference": {"median_ns": 6.0}}},
                        "seconds": 2.0, "spent_seconds": 4.0, "attempts": 2});
    // A: 4.0 s of phases (3.5 s named, 0.5 s unclaimed) in a 5.0 s harness process; a new
    // best, profiled in 2 s; its build request took 0.75 s after a 1.25 s wait for the build
    // written ahead of it.
    let a = json!({"nonce": "a", "status": "passed", "wall_seconds": 5.0,
                   "diagnostics": {"phase_seconds":
                       {"build": 1.0, "timed_calls": 2.0, "settle": 0.5, "total": 4.0}},
                   "yardstick": yard_1,
                   "profile": {"available": true, "workloads": [], "spent_seconds": 2.0},
                   "build_request": {"seconds": 0.75, "waited_seconds": 1.25}});
    // B: scored against the same yardstick, which counts once; unsteady, kept as measured.
    let b = json!({"nonce": "b", "status": "passed", "wall_seconds": 4.0,
                   "diagnostics": {"phase_seconds":
                       {"candidate": 1.5, "flush": 0.5, "inputs": 1.0, "total": 3.0}},
                   "yardstick": yard_1, "unsteady_kept": true});
    // C: a re-measure, recorded only in its event, repeated after an unsteady first try
    // whose harness run took 3 s (2.4 s of phases, 2 s of them named).
    let c = json!({"nonce": "c", "status": "passed", "wall_seconds": 2.0,
                   "diagnostics": {"phase_seconds": {"timed_calls": 1.0, "total": 1.5}},
                   "yardstick": yard_2, "build_request": {"seconds": 0.5, "waited_seconds": 0},
                   "unsteady_first": {"score": 0.5, "wall_seconds": 3.0, "diagnostics":
                       {"phase_seconds": {"timed_calls": 2.0, "total": 2.4}}}});

    let ca = candidate(&store, "a");
    store
        .record_evaluation(ca, "passed", Some(1.0), &a)
        .unwrap();
    let cb = candidate(&store, "b");
    store
        .record_evaluation(cb, "passed", Some(1.0), &b)
        .unwrap();
    // An identical source reusing A's result, and a lint rejection: no harness ran.
    let mut reused = a.clone();
    reused["reused_from_candidate"] = json!(ca);
    let cr = candidate(&store, "a again");
    store
        .record_evaluation(cr, "passed", Some(1.0), &reused)
        .unwrap();
    let cl = candidate(&store, "linted");
    store
        .record_evaluation(
            cl,
            "lint_failed",
            None,
            &json!({"status": "lint_failed", "lint": []}),
        )
        .unwrap();
    store
        .append_event(
            "remeasure",
            &json!({"incumbent": ca, "results": [{"candidate": ca, "result": c}]}),
        )
        .unwrap();
    // B again inside an event (the same harness run, by its nonce), and events without results.
    store
        .append_event(
            "confirmation",
            &json!({"results": [{"round": 0, "candidate": cb, "result": b}]}),
        )
        .unwrap();
    store
        .append_event("cycle_end", &json!({"results": "not a list"}))
        .unwrap();
    store
        .record_exchange(&Exchange {
            role: "propose".into(),
            prompt: "p".into(),
            response: "r".into(),
            model: "m".into(),
            provider: "replay".into(),
            input_tokens: 1,
            output_tokens: 1,
            cost_usd: 0.0,
            latency_ms: 4000,
            error: None,
            cached: false,
        })
        .unwrap();
    store.mark_finished(&json!({})).unwrap();
    set_span(
        &store,
        "2026-12-01T00:00:00.000Z",
        Some("2026-12-01T00:01:00.000Z"),
    );

    let t = TimeAccount::of_run(&store).unwrap();
    assert_eq!(t.wall_seconds, Some(60.0));
    assert_eq!(t.wall_end, WallEnd::Finished);
    let e = &t.evaluations;
    assert_eq!(
        (
            e.stored,
            e.with_phases,
            e.reused,
            e.lint_rejected,
            e.unsteady_repeats,
            e.unsteady_kept,
            e.profiled
        ),
        (2, 4, 1, 1, 1, 1, 1)
    );
    assert_eq!(
        e.in_events.iter().collect::<Vec<_>>(),
        vec![(&"remeasure".to_string(), &1)]
    );
    assert_eq!(e.harness_runs(), 3);
    assert!(close(t.evaluations_per_hour.unwrap(), 180.0));
    assert_eq!(t.yardsticks, 2);

    // Phases: build 1, timed_calls 2 + 1 + 2, settle 0.5, candidate 1.5, flush 0.5, inputs 1.
    // Start/exit: (5 - 4) + (4 - 3) + (2 - 1.5) + (3 - 2.4) = 3.1. No phase: (4 - 3.5) + 0 +
    // (1.5 - 1) + (2.4 - 2) = 1.4. Phases 9.5 + 3.1 + 1.4, yardsticks 3 + 4 = 7 (all of the
    // second's attempts), proposer 4, the profile of A 2 (not device work: it measures
    // nothing the scores use; the copy of A's result reused by another row is not counted
    // again), build requests 0.75 + 0.5 and the wait 1.25: 29.5 s accounted, 30.5 s other.
    let expected = [
        (OTHER, 30.5, TimeKind::Other),
        (YARDSTICK, 7.0, TimeKind::Device),
        ("timed_calls", 5.0, TimeKind::Device),
        (PROPOSER, 4.0, TimeKind::Proposer),
        (HARNESS_START_EXIT, 3.1, TimeKind::Harness),
        (PROFILER, 2.0, TimeKind::Harness),
        ("candidate", 1.5, TimeKind::Device),
        (HARNESS_NO_PHASE, 1.4, TimeKind::Harness),
        (BUILD_REQUESTS, 1.25, TimeKind::Harness),
        (BUILD_WAITS, 1.25, TimeKind::Harness),
        ("build", 1.0, TimeKind::Harness),
        ("inputs", 1.0, TimeKind::Harness),
        ("flush", 0.5, TimeKind::Device),
        ("settle", 0.5, TimeKind::Harness),
    ];
    assert_eq!(t.parts.len(), expected.len(), "{:#?}", t.parts);
    for (p, (name, secs, kind)) in t.parts.iter().zip(expected) {
        assert_eq!((p.name.as_str(), p.kind), (name, kind), "{:#?}", t.parts);
        assert!(close(p.seconds, secs), "{name}: {} != {secs}", p.seconds);
    }
    let sum: f64 = t.parts.iter().map(|p| p.seconds).sum();
    assert!(close(sum, 60.0));
    // Device: timed_calls 5 + candidate 1.5 + flush 0.5 + yardsticks 7 = 14 s of 60.
    assert!(close(t.device_seconds.unwrap(), 14.0));
    assert!(close(t.busy_fraction.unwrap(), 14.0 / 60.0));
    assert_eq!(t.overlap_seconds, 0.0);
    assert!(close(t.share(15.0).unwrap(), 0.25));
    // A typical evaluation, over the stored harness runs A (4 s, device 2 s) and B (3 s,
    // device 1.5 + 0.5 s); not the re-measure C, the reused row or the lint rejection. With
    // two, the median is the upper one.
    let typ = t.typical_evaluation.expect("stored runs with phases");
    assert_eq!(typ.count, 2);
    assert!(close(typ.median_seconds, 4.0));
    assert!(close(typ.median_device_share, 2.0 / 3.0));
}

#[test]
fn an_old_unfinished_store_accounts_what_it_has() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    // Results from before phase times and yardsticks: one bare, one with its wall only, one
    // with a phase map holding junk next to a number, no total and no wall.
    let c1 = candidate(&store, "one");
    store
        .record_evaluation(c1, "passed", Some(1.0), &json!({"status": "passed"}))
        .unwrap();
    let c2 = candidate(&store, "two");
    store
        .record_evaluation(c2, "timeout", None, &json!({"wall_seconds": 7.5}))
        .unwrap();
    let c3 = candidate(&store, "three");
    store
        .record_evaluation(
            c3,
            "passed",
            None,
            &json!({"diagnostics": {"phase_seconds":
                        {"timed_calls": "fast", "build": -1.0, "reference": 0.25}},
                    "yardstick": {"seconds": null}}),
        )
        .unwrap();
    store
        .append_event("cycle_start", &json!({"cycle": 1}))
        .unwrap();
    let last = store.span().unwrap().last_record_at.unwrap();
    let started_ms = ksearch_store::timestamp_millis(&last).unwrap() - 90_000;
    // 90 s before the latest record, as the store would write it.
    let started = {
        let db = rusqlite::Connection::open(store.dir().join(DB_FILE)).unwrap();
        let s: String = db
            .query_row(
                "SELECT strftime('%Y-%m-%dT%H:%M:%fZ', ?1 / 1000.0, 'unixepoch')",
                [started_ms],
                |r| r.get(0),
            )
            .unwrap();
        s
    };
    set_span(&store, &started, None);

    let t = TimeAccount::of_run(&store).unwrap();
    assert_eq!(t.wall_end, WallEnd::LastRecord);
    assert!(close(t.wall_seconds.unwrap(), 90.0), "{t:#?}");
    assert_eq!(t.evaluations.harness_runs(), 3);
    assert_eq!(t.evaluations.with_phases, 1);
    assert!(close(t.evaluations_per_hour.unwrap(), 120.0));
    assert_eq!(t.yardsticks, 0);
    assert!(close(part(&t, HARNESS_NO_PHASE_DATA).unwrap(), 7.5));
    assert!(close(part(&t, "reference").unwrap(), 0.25));
    assert_eq!(part(&t, "timed_calls"), None);
    assert_eq!(part(&t, "build"), None);
    assert_eq!(part(&t, PROPOSER), None);
    assert!(close(part(&t, OTHER).unwrap(), 90.0 - 7.75));
    // One result with phases: the device figure exists, from it alone; so does the typical
    // evaluation, whose total (none recorded) is its named phases'.
    assert!(close(t.device_seconds.unwrap(), 0.25));
    let typ = t.typical_evaluation.expect("one stored run with phases");
    assert_eq!(typ.count, 1);
    assert!(close(typ.median_seconds, 0.25) && close(typ.median_device_share, 1.0));

    // No phase data at all: no device figure, no busy fraction.
    let bare = tempfile::tempdir().unwrap();
    let store = new_store(bare.path());
    let c = candidate(&store, "bare");
    store
        .record_evaluation(c, "passed", Some(1.0), &json!({"status": "passed"}))
        .unwrap();
    let t = TimeAccount::of_run(&store).unwrap();
    assert_eq!((t.device_seconds, t.busy_fraction), (None, None));
    assert_eq!(t.typical_evaluation, None);
    assert_eq!(t.evaluations.harness_runs(), 1);
    assert_eq!(t.parts.len(), 1);
    assert_eq!(t.parts[0].name, OTHER);
}

#[test]
fn an_empty_run_and_unreadable_stamps_give_no_rates() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let t = TimeAccount::of_run(&store).unwrap();
    assert_eq!(t.wall_seconds, Some(0.0));
    assert_eq!(t.evaluations.harness_runs(), 0);
    assert_eq!((t.evaluations_per_hour, t.busy_fraction), (None, None));
    assert_eq!(t.share(1.0), None);

    set_span(&store, "yesterday", Some("today"));
    let t = TimeAccount::of_run(&store).unwrap();
    assert_eq!(t.wall_seconds, None);
    assert_eq!(t.evaluations_per_hour, None);
    assert!(t.parts.is_empty());
}

#[test]
fn work_that_overlapped_is_reported_not_hidden() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let c = candidate(&store, "k");
    store
        .record_evaluation(
            c,
            "passed",
            Some(1.0),
            &json!({"wall_seconds": 3.0,
                    "diagnostics": {"phase_seconds": {"timed_calls": 2.0, "total": 3.0}}}),
        )
        .unwrap();
    store.mark_finished(&json!({})).unwrap();
    set_span(
        &store,
        "2026-12-01T00:00:00.000Z",
        Some("2026-12-01T00:00:01.000Z"),
    );
    let t = TimeAccount::of_run(&store).unwrap();
    assert!(close(t.overlap_seconds, 2.0));
    assert_eq!(part(&t, OTHER), Some(0.0));
    assert!(close(t.busy_fraction.unwrap(), 2.0));
}

#[test]
fn builds_written_ahead_and_the_profiled_processes_steps_are_read_back() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    // Three builds written ahead, taken: compiles of 4, 6 and 9 s started 5, 2 and 3 s before
    // their evaluations asked; two of them waited for (1 s and 0.5 s), one only for the
    // microseconds of taking it. One evaluation built nothing ahead.
    let builds = [(4.0, 5.0, 0.00001), (6.0, 2.0, 1.0), (9.0, 3.0, 0.5)];
    for (i, (compile, head_start, waited)) in builds.iter().enumerate() {
        let mut r = json!({"nonce": format!("b{i}"), "status": "passed", "wall_seconds": 1.0,
                           "build_request": {"seconds": 0.0, "waited_seconds": waited,
                               "written_ahead": true,
                               "ahead": {"build_seconds": compile,
                                         "started_before_seconds": head_start}}});
        if i == 0 {
            // A new best, profiled on two workloads.
            r["profile"] = json!({"available": true, "spent_seconds": 9.0, "workloads": [
                {"name": "w1", "target_seconds": {"device": 2.0, "load": 0.25, "calls": 1.0}},
                {"name": "w2", "target_seconds": {"device": 1.5, "inputs": 0.5}}]});
        }
        if i == 1 {
            // Another, by a profiler the judge started ahead: device and wait were before.
            r["profile"] = json!({"available": true, "spent_seconds": 2.0, "workloads": [
                {"name": "w1", "started_ahead_seconds": 30.0,
                 "target_seconds": {"load": 0.5, "calls": 1.0}}]});
        }
        let c = candidate(&store, &format!("k{i}"));
        store.record_evaluation(c, "passed", Some(1.0), &r).unwrap();
    }
    let c = candidate(&store, "built here");
    store
        .record_evaluation(
            c,
            "passed",
            Some(1.0),
            &json!({"nonce": "h", "status": "passed", "wall_seconds": 1.0,
                    "build_request": {"seconds": 3.0, "waited_seconds": 0.0,
                                      "written_ahead": false}}),
        )
        .unwrap();
    let t = TimeAccount::of_run(&store).unwrap();
    let b = t.builds_ahead.expect("builds written ahead");
    assert_eq!((b.taken, b.waited_for), (3, 2));
    assert!(close(b.compile_median_seconds, 6.0) && close(b.compile_max_seconds, 9.0));
    assert!(close(b.head_start_median_seconds, 3.0));
    assert_eq!(
        (t.evaluations.profiled, t.evaluations.profiled_ahead),
        (2, 1)
    );
    let steps: Vec<(String, f64)> = t.profile_steps.into_iter().collect();
    assert_eq!(
        steps,
        vec![
            ("calls".to_string(), 2.0),
            ("device".to_string(), 3.5),
            ("inputs".to_string(), 0.5),
            ("load".to_string(), 0.75)
        ]
    );
    // A store without either records neither.
    let tmp = tempfile::tempdir().unwrap();
    let bare = TimeAccount::of_run(&new_store(tmp.path())).unwrap();
    assert!(bare.builds_ahead.is_none() && bare.profile_steps.is_empty());
}

#[test]
fn evaluations_judged_in_lanes_are_counted_with_their_gate_waits() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let results = [
        json!({"wall_seconds": 2.0, "judge_lanes": 2,
               "diagnostics": {"phase_seconds": {"candidate": 0.5, "gate": 0.4, "total": 1.8},
                               "gate": {"waited_s": 0.4, "waits": 1, "busy_probes": 0,
                                        "busy_wait_s": 0.0, "busy_when_timed": false}}}),
        json!({"wall_seconds": 2.0, "judge_lanes": 2,
               "diagnostics": {"phase_seconds": {"candidate": 0.5, "gate": 0.2, "total": 1.8},
                               "gate": {"waited_s": 0.2, "waits": 1, "busy_probes": 400,
                                        "busy_wait_s": 2.0, "busy_when_timed": true}}}),
        // One judge for the device: no lanes, no gate.
        json!({"wall_seconds": 2.0,
               "diagnostics": {"phase_seconds": {"candidate": 0.5, "total": 1.8},
                               "gate": null}}),
    ];
    for (i, r) in results.iter().enumerate() {
        let c = candidate(&store, &format!("k{i}"));
        store.record_evaluation(c, "passed", Some(1.0), r).unwrap();
    }
    store.mark_finished(&json!({})).unwrap();
    set_span(
        &store,
        "2026-12-01T00:00:00.000Z",
        Some("2026-12-01T00:00:10.000Z"),
    );
    let t = TimeAccount::of_run(&store).unwrap();
    assert_eq!(
        (
            t.evaluations.in_lanes,
            t.evaluations.lanes,
            t.evaluations.busy_when_timed
        ),
        (2, 2, 1)
    );
    // The waits are a harness phase of their own, not device work.
    assert!(close(part(&t, "gate").unwrap(), 0.6));
    assert!(close(t.device_seconds.unwrap(), 1.5));
}
