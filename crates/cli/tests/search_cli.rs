//! `ksearch run`, `resume`, `show` and `export` end to end: a real search on the cpu softmax
//! task, a run killed with SIGKILL mid-round and resumed, and a snapshot of `show`.
//!
//! Like `cli.rs`, these need Python 3 with numpy (`KSEARCH_TEST_PYTHON`, or the managed
//! environment created once under `target/`).

mod common;
use common::{configure, ksearch};
use predicates::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use ksearch_search::world_model::{ActionPatch, NodePatch, SolutionRef, WorldModel};
use ksearch_store::{CandidateKind, NewCandidate, RunConfig, RunStore};

fn evaluations(db_dir: &Path) -> BTreeMap<i64, (i64, Value)> {
    let store = RunStore::open(db_dir).unwrap();
    store
        .evaluations()
        .unwrap()
        .into_iter()
        .map(|e| (e.id, (e.candidate_id, e.result)))
        .collect()
}

/// Runs `cmd` (at most 15 minutes), which must succeed, and parses the JSON it prints.
fn succeed_with_json(cmd: &mut assert_cmd::Command) -> Value {
    let out = cmd.timeout(Duration::from_secs(900)).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_run_killed_mid_round_resumes_without_losing_an_evaluation() {
    let runs = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("ksearch"));
    configure(&mut cmd);
    cmd.args([
        "run", "--task", "softmax", "--rounds", "5", "--timing", "quick", "--seed", "5",
    ])
    .arg("--runs-dir")
    .arg(runs.path())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();

    // Wait until the run has completed a few evaluations, then kill it without warning.
    let deadline = Instant::now() + Duration::from_secs(600);
    let run_dir = loop {
        assert!(Instant::now() < deadline, "the run made no progress");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before it was killed"
        );
        let dirs: Vec<PathBuf> = std::fs::read_dir(runs.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.join("ksearch.db").is_file())
            .collect();
        if let Some(dir) = dirs.first() {
            if let Ok(store) = RunStore::open(dir) {
                if store.evaluations().map(|e| e.len()).unwrap_or(0) >= 3 {
                    break dir.clone();
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // SIGKILL: no destructor, no flush, no clean-up in ksearch.
    child.kill().unwrap();
    child.wait().unwrap();
    let before = evaluations(&run_dir);
    assert!(before.len() >= 3);
    assert!(!RunStore::open(&run_dir).unwrap().is_finished().unwrap());

    let outcome = succeed_with_json(ksearch().args(["resume", "--json"]).arg(&run_dir));
    assert_eq!(outcome["outcome"]["rounds_used"], 5, "{outcome}");

    // Every evaluation completed before the kill is still there, unchanged.
    let after = evaluations(&run_dir);
    for (id, row) in &before {
        assert_eq!(
            after.get(id),
            Some(row),
            "evaluation {id} was lost or changed"
        );
    }
    // No search candidate was evaluated twice, and every one was evaluated.
    let store = RunStore::open(&run_dir).unwrap();
    let mut per_candidate: BTreeMap<i64, usize> = BTreeMap::new();
    for (cid, _) in after.values() {
        *per_candidate.entry(*cid).or_default() += 1;
    }
    for c in store.candidates().unwrap() {
        if c.kind != CandidateKind::Recheck {
            assert_eq!(per_candidate.get(&c.id), Some(&1), "candidate {}", c.id);
        }
    }
    // The final tree is valid.
    let state = store.get_state("engine").unwrap().unwrap();
    let wm: WorldModel = serde_json::from_value(state["wm"].clone()).unwrap();
    wm.validate().unwrap();
    assert!(store.check_integrity().unwrap().is_empty());
    assert!(store.is_finished().unwrap());
}

#[test]
fn a_run_its_wall_budget_stopped_continues_under_a_raised_one() {
    let runs = tempfile::tempdir().unwrap();
    // A wall budget of 0 s stops the search before its first round (after the seed).
    let v = succeed_with_json(
        ksearch()
            .args([
                "run",
                "--task",
                "softmax",
                "--rounds",
                "2",
                "--timing",
                "quick",
                "--seed",
                "3",
                "--max-wall-time",
                "0",
                "--no-recheck",
                "--json",
            ])
            .arg("--runs-dir")
            .arg(runs.path()),
    );
    let id = v["run"].as_str().unwrap().to_string();
    assert_eq!(v["outcome"]["rounds_used"], 0, "{v}");
    assert!(v["outcome"]["recheck"].is_null(), "{v}");

    // Resumed as it was, it is finished: the error names the budgets to raise.
    let again = ksearch()
        .args(["resume", &id, "--runs-dir"])
        .arg(runs.path())
        .timeout(Duration::from_secs(900))
        .output()
        .unwrap();
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("--max-wall-time"), "{err}");

    let v = succeed_with_json(
        ksearch()
            .args([
                "resume",
                &id,
                "--max-wall-time",
                "3600",
                "--recheck",
                "--json",
                "--runs-dir",
            ])
            .arg(runs.path()),
    );
    assert_eq!(v["outcome"]["rounds_used"], 2, "{v}");
    assert_eq!(v["outcome"]["recheck"]["status"], "passed", "{v}");
    // The stored summary is the new ending's, not the wall budget's.
    let store = RunStore::open(&runs.path().join(&id)).unwrap();
    let summary = ksearch_search::report::finished(&store).unwrap().unwrap();
    assert_eq!(
        summary.stop_reason, "rounds budget reached (2)",
        "{summary:?}"
    );
}

#[test]
fn run_then_show_and_export_the_best_kernel() {
    let runs = tempfile::tempdir().unwrap();
    let v = succeed_with_json(
        ksearch()
            .args([
                "run", "--task", "softmax", "--rounds", "2", "--timing", "quick", "--json",
            ])
            .arg("--runs-dir")
            .arg(runs.path()),
    );
    let id = v["run"].as_str().unwrap().to_string();
    assert_eq!(v["outcome"]["rounds_used"], 2);
    assert_eq!(v["outcome"]["recheck"]["status"], "passed", "{v}");

    // The run wrote its page; a real browser renders its tree and chart and shows a clicked
    // candidate's source, with nothing on the console.
    let report = PathBuf::from(v["report"].as_str().expect("the run reports its page"));
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains("id=\"tree\"") && html.contains("class=\"best-so-far\""));
    assert!(
        !html.contains("secret_seed"),
        "the page must not carry the secret seed"
    );
    if let Some(seen) = common::browser_check(&report, "report-softmax.png") {
        assert!(seen["tree_nodes"].as_u64().unwrap() > 1, "{seen}");
        assert!(seen["source_chars"].as_u64().unwrap() > 0, "{seen}");
    }
    // The read commands speak JSON too: the run listed with its confirmed best, and shown whole.
    let listed = succeed_with_json(
        ksearch()
            .args(["runs", "--json", "--runs-dir"])
            .arg(runs.path()),
    );
    let row = &listed.as_array().unwrap()[0];
    assert_eq!(row["id"], id.as_str());
    assert_eq!(row["status"], "finished");
    // A winner is set against the seed; a run whose seed stayed its best (two quick rounds
    // on a busy 2-core machine can end so) has nothing to set against it.
    let seed_won = row["best_candidate"] == 1;
    assert!(
        row["confirmed"].as_f64().is_some()
            && (row["versus_seed"].as_f64().is_some() || seed_won && row["versus_seed"].is_null()),
        "{row}"
    );
    let shown = succeed_with_json(
        ksearch()
            .args(["show", &id, "--json", "--runs-dir"])
            .arg(runs.path()),
    );
    assert_eq!(shown["status"], "finished");
    assert!(
        shown["candidates"].as_array().unwrap().len() >= 3,
        "{shown}"
    );
    assert!(shown["world_model"]["nodes"].is_array(), "{shown}");
    assert!(shown["config"].get("secret_seed").is_none(), "{shown}");

    let show = ksearch()
        .args(["show", &id, "--runs-dir"])
        .arg(runs.path())
        .output()
        .unwrap();
    assert!(show.status.success());
    let text = String::from_utf8(show.stdout).unwrap();
    assert!(text.contains("status: finished"), "{text}");
    assert!(text.contains("world model"), "{text}");
    assert!(text.contains("seed"), "{text}");
    // The per-step table starts at the seed, whatever the best kernel's ancestry.
    let path = text
        .split("path to the best")
        .nth(1)
        .expect("show prints the path to the best");
    let first_step = path.lines().nth(2).unwrap_or_default();
    assert!(first_step.contains("the task's seed kernel"), "{text}");

    let export_dir = runs.path().join("exported");
    let exp = ksearch()
        .args(["export", &id, "--runs-dir"])
        .arg(runs.path())
        .arg("--out")
        .arg(&export_dir)
        .output()
        .unwrap();
    assert!(
        exp.status.success(),
        "{}",
        String::from_utf8_lossy(&exp.stderr)
    );
    let kernel = std::fs::read_to_string(export_dir.join("softmax_cpu.c")).unwrap();
    assert!(kernel.contains("softmax_f32"));
    // A FlashInfer-Bench Solution needs a task imported from a definition.
    ksearch()
        .args(["export", &id, "--format", "flashinfer", "--runs-dir"])
        .arg(runs.path())
        .arg("--out")
        .arg(runs.path().join("fib"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "not a task imported from FlashInfer-Bench",
        ));
    let readme = std::fs::read_to_string(export_dir.join("README.md")).unwrap();
    assert!(
        readme.contains("ksearch eval --task softmax --backend cpu --held-out"),
        "{readme}"
    );
    assert!(
        readme.contains("## Steps the search kept") && readme.contains("the task's seed kernel"),
        "{readme}"
    );
    // The exported kernel passes a fresh evaluation on every workload.
    ksearch()
        .args([
            "eval",
            "--task",
            "softmax",
            "--timing",
            "quick",
            "--held-out",
        ])
        .arg(export_dir.join("softmax_cpu.c"))
        .timeout(Duration::from_secs(600))
        .assert()
        .success();
}

/// A fixed run built through the store API, so `show` can be snapshot-tested.
fn fixture_run(dir: &Path) -> PathBuf {
    let store = RunStore::create_with_id(
        dir,
        "20261130-120000-abcd",
        &RunConfig {
            task: "softmax".into(),
            backend: "cpu".into(),
            strategy: "world-model".into(),
            proposer: "offline".into(),
            selection: "calibrated".into(),
            seed: 42,
            secret_seed: 7,
            budgets: json!({"rounds": 2}),
            flags: json!({}),
            extra: json!({}),
            created_at: String::new(),
            ksearch_version: String::new(),
        },
    )
    .unwrap();
    let add = |code: &str, kind, round, node: Option<&str>, note: &str, parent: Option<i64>| {
        let source_id = store.put_source(code, "c").unwrap();
        store
            .add_candidate(&NewCandidate {
                source_id,
                parent_candidate: parent,
                node_id: node.map(str::to_string),
                round,
                cycle: round,
                attempt: 1,
                sample: 0,
                kind,
                proposer_note: note.into(),
                knobs: Value::Null,
            })
            .unwrap()
    };
    // Both timed results were scored against one yardstick; the broken one is an older
    // result without timing fields.
    let yardstick = json!({"version": 1, "workloads": {}, "seconds": 2.0});
    let seed = add(
        "seed",
        CandidateKind::Seed,
        0,
        None,
        "the task's seed kernel",
        None,
    );
    store
        .record_evaluation(
            seed,
            "passed",
            Some(0.5),
            &json!({"status": "passed", "score": 0.5, "workloads": [
                {"name": "r8c64", "held_out": true, "candidate_median_ns": 1.0e3},
                {"name": "r1024c1024", "held_out": false, "candidate_median_ns": 2.0e6,
                 "speedup_vs_baseline": 0.5}],
                "nonce": "n-seed", "wall_seconds": 3.0, "yardstick": yardstick,
                "diagnostics": {"phase_seconds": {"build": 0.5, "timed_calls": 1.0,
                                                  "candidate": 0.5, "settle": 0.25,
                                                  "total": 2.5}}}),
        )
        .unwrap();
    let a = add(
        "fast",
        CandidateKind::Attempt,
        1,
        Some("n1"),
        "apply action: threads=true",
        Some(seed),
    );
    store
        .record_evaluation(
            a,
            "passed",
            Some(2.0),
            &json!({"status": "passed", "score": 2.0, "workloads": [
                {"name": "r1024c1024", "held_out": false, "candidate_median_ns": 0.5e6,
                 "speedup_vs_baseline": 2.0}],
                "nonce": "n-fast", "wall_seconds": 2.5, "yardstick": yardstick,
                "diagnostics": {"phase_seconds": {"build": 0.25, "timed_calls": 0.75,
                                                  "flush": 0.25, "inputs": 0.5,
                                                  "total": 2.0}}}),
        )
        .unwrap();
    let b = add(
        "broken",
        CandidateKind::Attempt,
        2,
        Some("n2"),
        "apply action: lanes=8",
        Some(seed),
    );
    store
        .record_evaluation(b, "incorrect", None, &json!({"status": "incorrect"}))
        .unwrap();

    let mut wm = WorldModel::new_root("row softmax", vec![]);
    let root = wm.root_id().clone();
    let action = |title: &str| NodePatch {
        action: Some(ActionPatch {
            title: Some(title.into()),
            score: Some(Some(0.6)),
            ..ActionPatch::default()
        }),
        ..NodePatch::default()
    };
    let sol = |id: &str, score: f64, round: u32| SolutionRef {
        solution_id: id.into(),
        parent_solution_id: None,
        score,
        speedup_vs_baseline: Some(score),
        latency_ms: None,
        round,
    };
    wm.attach_solution(&root, sol("seed-hash", 0.5, 0)).unwrap();
    let n1 = wm
        .insert_child(&root, &action("Use every core"), 0)
        .unwrap();
    let n2 = wm.insert_child(&root, &action("Vector lanes"), 0).unwrap();
    wm.begin_cycle(&n1).unwrap();
    wm.record_attempt(&n1, true).unwrap();
    wm.attach_solution(&n1, sol("fast-hash", 2.0, 1)).unwrap();
    wm.begin_cycle(&n2).unwrap();
    wm.record_attempt(&n2, false).unwrap();
    wm.mark_too_hard(&n2).unwrap();
    store
        .set_state("engine", &json!({"wm": serde_json::to_value(&wm).unwrap()}))
        .unwrap();
    store
        .mark_finished(&json!({"stop_reason": "rounds budget reached (2)",
                               "rounds_used": 2, "cycles": 2, "passed": 2, "failed": 1,
                               "seed_score": 0.5,
                               "best": {"candidate_id": a, "score": 2.0, "node": "n1", "round": 1},
                               "recheck": {"status": "passed"}}))
        .unwrap();
    // A 30 s run, so that the time block is the same on every machine.
    rusqlite::Connection::open(store.dir().join(ksearch_store::DB_FILE))
        .unwrap()
        .execute(
            "UPDATE run SET created_at = '2026-11-30T12:00:00.000Z',
                            finished_at = '2026-11-30T12:00:30.000Z'",
            [],
        )
        .unwrap();
    store.dir().to_path_buf()
}

#[test]
fn show_prints_status_best_tree_and_candidates() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture_run(tmp.path());
    let out = ksearch().arg("show").arg(&dir).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    insta::assert_snapshot!(text);
}

#[test]
fn a_best_of_n_run_draws_independent_samples_and_resumes_as_one() {
    let runs = tempfile::tempdir().unwrap();
    let v = succeed_with_json(
        ksearch()
            .args([
                "run",
                "--task",
                "softmax",
                "--strategy",
                "best-of-n",
                "--rounds",
                "2",
                "--timing",
                "quick",
                "--no-recheck",
                "--confirm-rounds",
                "0",
                "--seed",
                "3",
                "--json",
            ])
            .arg("--runs-dir")
            .arg(runs.path()),
    );
    assert_eq!(v["outcome"]["rounds_used"], 2);
    let dir = PathBuf::from(v["dir"].as_str().unwrap());
    let store = RunStore::open(&dir).unwrap();
    assert_eq!(store.config().strategy, "best-of-n");
    let notes: Vec<String> = store
        .candidates()
        .unwrap()
        .into_iter()
        .filter(|c| c.kind == CandidateKind::Attempt)
        .map(|c| c.proposer_note)
        .collect();
    assert_eq!(notes.len(), 2);
    assert!(
        notes.iter().all(|n| n.starts_with("independent sample: ")),
        "{notes:?}"
    );
    // The stored settings bring the strategy back: one more round is one more sample.
    let id = v["run"].as_str().unwrap().to_string();
    let again = succeed_with_json(
        ksearch()
            .args(["resume", &id, "--rounds", "3", "--json", "--runs-dir"])
            .arg(runs.path()),
    );
    assert_eq!(again["outcome"]["rounds_used"], 3);
    let store = RunStore::open(&dir).unwrap();
    let attempts = store
        .candidates()
        .unwrap()
        .into_iter()
        .filter(|c| c.kind == CandidateKind::Attempt)
        .collect::<Vec<_>>();
    assert_eq!(attempts.len(), 3);
    assert!(attempts
        .iter()
        .all(|c| c.proposer_note.starts_with("independent sample: ")));
}

/// `ksearch compare --json` of `task` at CI size: quick timing, no re-check, no confirmation.
fn quick_compare(
    task: &str,
    strategies: &str,
    budget: u32,
    seeds: u32,
    seed: u64,
    runs: &Path,
) -> assert_cmd::Command {
    let mut cmd = ksearch();
    cmd.args(["compare", "--task", task, "--strategies", strategies])
        .args([
            "--budget",
            &budget.to_string(),
            "--seeds",
            &seeds.to_string(),
        ])
        .args([
            "--seed",
            &seed.to_string(),
            "--timing",
            "quick",
            "--no-recheck",
        ])
        .args(["--confirm-rounds", "0", "--json", "--runs-dir"])
        .arg(runs);
    cmd
}

#[test]
fn compare_runs_each_strategy_with_the_same_budget_and_tabulates_them() {
    let runs = tempfile::tempdir().unwrap();
    let compare = || {
        quick_compare(
            "softmax",
            "best-of-n,world-model,evolve",
            1,
            1,
            4,
            runs.path(),
        )
    };
    let v = succeed_with_json(&mut compare());
    let runs_done = v["runs"].as_array().unwrap();
    assert_eq!(runs_done.len(), 3);
    // The strategies' curves on one chart, linking each run's page.
    let page =
        std::fs::read_to_string(v["report"].as_str().expect("compare writes its page")).unwrap();
    assert_eq!(page.matches("class=\"best-so-far\"").count(), 3, "{page}");
    for r in runs_done {
        let id = r["run"].as_str().unwrap();
        assert!(
            page.contains(&format!("href=\"{id}/report.html\"")),
            "{page}"
        );
        assert!(runs.path().join(id).join("report.html").exists());
    }
    let strategies: Vec<&str> = runs_done
        .iter()
        .map(|r| r["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(
        strategies,
        ["best-of-n", "world-model", "evolve"],
        "seed 4 first takes the given order"
    );
    for r in runs_done {
        assert_eq!(r["seed"], 4);
        assert_eq!(
            r["curve"].as_array().unwrap().len(),
            1,
            "one round, one evaluation: {r}"
        );
        let store = RunStore::open(&runs.path().join(r["run"].as_str().unwrap())).unwrap();
        assert_eq!(store.config().strategy, r["strategy"].as_str().unwrap());
        assert_eq!(store.config().seed, 4);
        if r["strategy"] == "evolve" {
            // The child of the seed: a knob move of the offline proposer, linked to its parent,
            // and the round's generation event.
            let seed = store.candidates().unwrap()[0].id;
            let child = store
                .candidates()
                .unwrap()
                .into_iter()
                .find(|c| c.kind == CandidateKind::Attempt)
                .unwrap();
            assert_eq!(child.parent_candidate, Some(seed));
            assert!(
                child.proposer_note.starts_with("diff of candidate")
                    || child.proposer_note.starts_with("full of candidate"),
                "{}",
                child.proposer_note
            );
            let events = store.events_after(0).unwrap();
            assert!(events.iter().any(|e| e.kind == "generation"), "{events:?}");
        }
    }
    let rows = v["strategies"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert!(rows
        .iter()
        .all(|r| r["runs"] == 1 && r["to_mark"].as_array().unwrap().len() == 3));

    // The same comparison again reads the finished runs back: no new run, the same records.
    let dirs = || {
        std::fs::read_dir(runs.path())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().is_dir())
            .count()
    };
    assert_eq!(dirs(), 3);
    let again = succeed_with_json(&mut compare());
    assert_eq!(again["runs"], v["runs"]);
    assert_eq!(dirs(), 3);
    // A run left unfinished (a comparison stopped in it) is resumed and finished, not redone.
    let evolve = runs_done
        .iter()
        .find(|r| r["strategy"] == "evolve")
        .unwrap();
    let dir = runs.path().join(evolve["run"].as_str().unwrap());
    RunStore::open(&dir).unwrap().mark_unfinished().unwrap();
    let out = compare().output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("resuming run {}", evolve["run"].as_str().unwrap())),
        "{said}"
    );
    assert_eq!(said.matches("reads back finished run").count(), 2, "{said}");
    assert!(RunStore::open(&dir).unwrap().is_finished().unwrap());
    assert_eq!(dirs(), 3);
    let resumed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(resumed["runs"], v["runs"]);
    // --fresh starts them all again.
    succeed_with_json(compare().arg("--fresh"));
    assert_eq!(dirs(), 6);
}

#[test]
fn compare_over_two_seeds_on_the_attention_task_takes_medians_over_the_seeds() {
    // The CI-sized form of a comparison on the other CPU task: two seeds, a small budget.
    let runs = tempfile::tempdir().unwrap();
    // Two strategies (the softmax comparison above covers the third): four runs.
    let mut cmd = quick_compare("attention", "world-model,evolve", 2, 2, 7, runs.path());
    let v = succeed_with_json(cmd.args(["--backend", "cpu"]));
    let runs_done = v["runs"].as_array().unwrap();
    assert_eq!(runs_done.len(), 4, "two strategies, two seeds: {v}");
    let mut seeds: Vec<u64> = runs_done
        .iter()
        .map(|r| r["seed"].as_u64().unwrap())
        .collect();
    seeds.sort_unstable();
    seeds.dedup();
    assert_eq!(seeds.len(), 2, "{seeds:?}");
    for r in runs_done {
        // The budget counts evaluations of the search: two rounds of one sample each.
        assert_eq!(r["curve"].as_array().unwrap().len(), 2, "{r}");
        let store = RunStore::open(&runs.path().join(r["run"].as_str().unwrap())).unwrap();
        assert_eq!(store.config().task, "attention");
        assert_eq!(store.config().strategy, r["strategy"].as_str().unwrap());
    }
    let rows = v["strategies"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        assert_eq!(row["runs"], 2, "{row}");
        assert_eq!(row["to_mark"].as_array().unwrap().len(), 3, "{row}");
    }
}

#[test]
fn evolve_settings_that_cannot_make_a_population_are_refused_before_a_run_exists() {
    let runs = tempfile::tempdir().unwrap();
    let out = ksearch()
        .args([
            "run",
            "--task",
            "softmax",
            "--strategy",
            "evolve",
            "--exploration",
            "0.6",
            "--exploitation",
            "0.6",
        ])
        .arg("--runs-dir")
        .arg(runs.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("exploration (0.6) and exploitation (0.6) add up to more than 1"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(runs.path()).unwrap().count(),
        0,
        "no run left behind"
    );
    // A comparison with evolve among its strategies refuses them before its first run.
    let out = ksearch()
        .args([
            "compare",
            "--task",
            "softmax",
            "--strategies",
            "world-model,evolve",
            "--exploration",
            "0.6",
            "--exploitation",
            "0.6",
        ])
        .arg("--runs-dir")
        .arg(runs.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("add up to more than 1"));
    assert_eq!(
        std::fs::read_dir(runs.path()).unwrap().count(),
        0,
        "no run started"
    );
    // Values the parser can refuse are refused as usage errors.
    for bad in [
        ["--features", "size"],
        ["--diff-ratio", "1.5"],
        ["--inspirations", "3"],
    ] {
        let out = ksearch()
            .args(["run", "--task", "softmax", "--strategy", "evolve"])
            .args(bad)
            .arg("--runs-dir")
            .arg(runs.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(bad[0]), "{bad:?}: {err}");
    }
}

/// A store of `n` candidates in a world model of `n / 10` actions: sources of ~60 lines
/// that differ from their parents in a line, evaluations with per-workload times and a log,
/// a failure in every seventh.
fn synthetic_run(dir: &Path, n: usize) -> PathBuf {
    let store = RunStore::create_with_id(
        dir,
        "20261202-120000-big0",
        &RunConfig {
            task: "softmax".into(),
            backend: "cpu".into(),
            strategy: "world-model".into(),
            proposer: "offline".into(),
            selection: "calibrated".into(),
            seed: 1,
            secret_seed: 2,
            budgets: json!({"rounds": n}),
            flags: json!({}),
            extra: json!({}),
            created_at: String::new(),
            ksearch_version: String::new(),
        },
    )
    .unwrap();
    let mut wm = WorldModel::new_root("row softmax", vec![]);
    let root = wm.root_id().clone();
    let mut nodes = vec![root.clone()];
    for k in 0..n / 10 {
        let parent = nodes[k / 3].clone();
        let patch = NodePatch {
            action: Some(ActionPatch {
                title: Some(format!("idea {k}: tile by {}", 8 << (k % 4))),
                score: Some(Some(0.5)),
                ..ActionPatch::default()
            }),
            ..NodePatch::default()
        };
        nodes.push(wm.insert_child(&parent, &patch, 0).unwrap());
    }
    let body: String = (0..60)
        .map(|l| format!("  acc{l} = fmaf(x[i + {l}], w[{l}], acc{l});\n"))
        .collect();
    let mut prev: Option<i64> = None;
    for i in 0..n {
        let code =
            format!("// candidate {i}\nvoid softmax_f32(void) {{\n{body}  unroll = {i};\n}}\n");
        let source_id = store.put_source(&code, "c").unwrap();
        let id = store
            .add_candidate(&NewCandidate {
                source_id,
                parent_candidate: prev,
                node_id: Some(nodes[i % nodes.len()].as_str().to_string()),
                round: i as u32,
                cycle: (i / 5) as u32,
                attempt: 1,
                sample: 0,
                kind: if i == 0 {
                    CandidateKind::Seed
                } else {
                    CandidateKind::Attempt
                },
                proposer_note: format!("apply action: unroll={i}"),
                knobs: Value::Null,
            })
            .unwrap();
        let score = 0.5 + (i as f64).sqrt() / 10.0;
        let (status, score) = if i % 7 == 3 {
            ("incorrect", None)
        } else {
            ("passed", Some(score))
        };
        store
            .record_evaluation(
                id,
                status,
                score,
                &json!({"status": status, "score": score,
                        "message": if score.is_none() { "wrong outputs on r64c1000" } else { "" },
                        "log_tail": "harness: built in 0.4 s\n".repeat(40),
                        "workloads": [
                            {"name": "r64c1000", "held_out": false, "candidate_median_ns": 2.0e5},
                            {"name": "r2048c1024", "held_out": false, "candidate_median_ns": 8.0e6}]}),
            )
            .unwrap();
        prev = Some(id);
    }
    store
        .set_state("engine", &json!({"wm": serde_json::to_value(&wm).unwrap()}))
        .unwrap();
    store.dir().to_path_buf()
}

#[test]
fn a_report_of_2000_candidates_is_small_and_opens_in_the_browser_within_2_s() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = synthetic_run(tmp.path(), 2000);
    let page = dir.join("report.html");
    let out = ksearch().arg("report").arg(&dir).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(said.contains("2000 candidates, 2000 evaluations"), "{said}");
    let bytes = std::fs::metadata(&page).unwrap().len();
    eprintln!("report of 2000 candidates: {bytes} bytes");
    assert!(bytes < 8 << 20, "{bytes} bytes");
    if let Some(seen) = common::browser_check(&page, "report-2000.png") {
        assert_eq!(seen["rows"], 2000, "{seen}");
        let open = seen["open_seconds"].as_f64().unwrap();
        assert!(open < 2.0, "the page took {open} s to open");
    }
}

/// `ksearch profile` of the softmax seed, evaluated with quick timing, as JSON.
const PROFILE_SOFTMAX_SEED: [&str; 8] = [
    "profile",
    "--kernel",
    "tasks/softmax/seed/naive.c",
    "--task",
    "softmax",
    "--timing",
    "quick",
    "--json",
];

#[test]
fn profile_classifies_each_timed_workload_of_a_kernel_against_the_roofline() {
    let out = ksearch().args(PROFILE_SOFTMAX_SEED).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    let timed = p["workloads"].as_array().unwrap();
    assert_eq!(timed.len(), 3, "the three search workloads are timed: {p}");
    for w in timed {
        let d = &w["diagnosis"];
        // Softmax moves 8 bytes and does 5 FLOP per element: below any CPU's ridge.
        assert!(
            (d["intensity"].as_f64().unwrap() - 0.625).abs() < 1e-9,
            "{w}"
        );
        assert!(d["ridge"].as_f64().unwrap() > 0.625, "{w}");
        assert!(["memory-bound", "latency-bound", "launch-bound"]
            .contains(&d["class"].as_str().unwrap()));
        let sol = d["speed_of_light"].as_f64().unwrap();
        assert!(sol > 0.0 && sol <= 1.0, "{w}");
        assert!(!d["advice"].as_array().unwrap().is_empty());
    }
    // Held-out workloads are checked, not timed, and said so.
    assert!(!p["untimed"].as_array().unwrap().is_empty(), "{p}");
    // Without a kernel or a run there is nothing to profile: a usage error.
    let none = ksearch().arg("profile").output().unwrap();
    assert_eq!(none.status.code(), Some(2));
}

/// A stand-in for Nsight Compute: it starts its target as ncu does (after its options: up to
/// `--log-file PATH`, then any `--option value` pairs) and writes a page recorded on the H200
/// where ncu writes its counters.
const NCU_STAND_IN: &str = r#"#!/bin/sh
log=""
while [ $# -gt 0 ]; do
    case "$1" in
        --log-file) log="$2"; shift 2; break ;;
        *) shift ;;
    esac
done
while [ $# -gt 1 ] && [ "${1#--}" != "$1" ]; do shift 2; done
"$@"
rc=$?
cp "$(dirname "$0")/page.csv" "$log"
exit $rc
"#;

#[test]
fn profile_with_counters_reads_the_profilers_page_into_each_workloads_analysis() {
    use std::os::unix::fs::PermissionsExt;
    // The sandbox's uid runs the stand-in and reads its page: a directory open to it, which
    // needs no revealed path (a machine without mount namespaces cannot reveal one).
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().to_path_buf();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::copy(
        root.join("harness/tests/fixtures/nsight/h200-torch-randn-and-matmul-raw.csv"),
        bin.join("page.csv"),
    )
    .unwrap();
    let ncu = bin.join("ncu");
    std::fs::write(&ncu, NCU_STAND_IN).unwrap();
    for (path, mode) in [(&bin, 0o755), (&ncu, 0o755), (&bin.join("page.csv"), 0o644)] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let counters = || {
        let mut cmd = ksearch();
        cmd.args(PROFILE_SOFTMAX_SEED).arg("--counters");
        cmd
    };
    let p = succeed_with_json(counters().env("KSEARCH_HARNESS_NCU", &ncu));
    let timed = p["workloads"].as_array().unwrap();
    assert_eq!(timed.len(), 3, "{p}");
    for w in timed {
        let c = &w["metrics"]["counters"];
        // The page's two matmul launches and its fill, weighted by their times.
        let dram = c["dram_pct"].as_f64().unwrap();
        assert!(dram > 0.0 && dram < 100.0, "{w}");
        assert_eq!(
            c["registers"], 168,
            "the page's largest register count: {w}"
        );
    }
    let notes = p["notes"].to_string();
    assert!(
        notes.contains(&format!("from {} on", ncu.display())),
        "{notes}"
    );

    // Without a profiler the profile still comes, from the times, and says why.
    let p = succeed_with_json(counters().env("KSEARCH_HARNESS_NCU", dir.path().join("none")));
    assert_eq!(
        p["workloads"][0]["metrics"]["counters"]["dram_pct"],
        Value::Null
    );
    assert!(
        p["notes"].to_string().contains("is not an executable file"),
        "{p}"
    );
}
