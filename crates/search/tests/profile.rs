//! `report::profile`: a kernel's per-workload profile, read from one of its evaluations.

use ksearch_eval::bottleneck::Bottleneck;
use ksearch_eval::EvalResult;
use ksearch_search::report::profile::{
    profile_evaluation, render_profile, Profile, WorkloadProfile,
};
use serde_json::{json, Value};

/// A passed evaluation of a kernel that timed the first of `task`'s workloads on `backend` at
/// 1 ms, on an H200-like machine, whose build reported `build`.
fn evaluation(task: &ksearch_task::Task, backend: &str, build: Value) -> EvalResult {
    let first = &task.workloads(backend).unwrap()[0];
    serde_json::from_value(json!({
        "nonce": "n",
        "status": "passed",
        "build": build,
        "environment": {"mem_bandwidth_gbs": 4800.0, "peak_gflops": 989000.0},
        "workloads": [{"name": first.name, "correct": true, "candidate_median_ns": 1.0e6}],
    }))
    .unwrap()
}

#[test]
fn a_cuda_builds_registers_and_spills_reach_every_workloads_advice() {
    let task = ksearch_task::resolve("attention").unwrap();
    // Two template instances: the one that spills most sets the figure, not their sum.
    let kernel = |regs: u32, store: u64, load: u64| {
        json!({"mangled": "_Z1k", "registers": regs, "spill_store_bytes": store,
               "spill_load_bytes": load})
    };
    let ptxas = json!({"compiler": "nvcc", "ptxas": {
        "kernels": [kernel(255, 48, 48), kernel(128, 16, 16)],
        "max_registers": 255, "spill_bytes": 128, "gmem_bytes": 0, "warnings": []}});
    let p = profile_evaluation(&task, "cuda", &evaluation(&task, "cuda", ptxas));
    assert_eq!(p.workloads.len(), 1, "{p:?}");
    let w = &p.workloads[0];
    assert_eq!(w.metrics.counters.registers, Some(255));
    assert_eq!(w.metrics.counters.spill_bytes, Some(96));
    let advice = w.diagnosis.advice.join("\n");
    assert!(
        advice.contains("96 bytes per thread spill to local memory at 255 registers"),
        "{advice}"
    );
    let text = render_profile(&p);
    assert!(
        text.contains("build: 255 registers per thread"),
        "the table says what the build used: {text}"
    );

    // No spill: the registers are still reported, and no spill advice is given.
    let clean = json!({"ptxas": {"kernels": [kernel(128, 0, 0)]}});
    let p = profile_evaluation(&task, "cuda", &evaluation(&task, "cuda", clean));
    assert_eq!(p.workloads[0].metrics.counters.registers, Some(128));
    assert!(!p.workloads[0]
        .diagnosis
        .advice
        .iter()
        .any(|a| a.contains("spill")));
}

#[test]
fn a_build_without_a_register_report_gives_no_register_counters() {
    let task = ksearch_task::resolve("softmax").unwrap();
    // A cpu build (gcc) has no ptxas report; a kernel without registers is not believed for
    // its spills either.
    for build in [
        json!({"compiler": "gcc"}),
        json!({"ptxas": {"kernels": [{"spill_store_bytes": 64}]}}),
    ] {
        let p = profile_evaluation(&task, "cpu", &evaluation(&task, "cpu", build));
        let c = &p.workloads[0].metrics.counters;
        assert_eq!((c.registers, c.spill_bytes), (None, None), "{p:?}");
        assert!(!render_profile(&p).contains("registers per thread"));
    }
}

#[test]
fn a_profilers_counters_take_the_builds_place_where_it_has_them() {
    let task = ksearch_task::resolve("attention").unwrap();
    let first = task.workloads("cuda").unwrap()[0].name.clone();
    let build = json!({"ptxas": {"kernels": [{"mangled": "_Z1k", "registers": 255,
                                               "spill_store_bytes": 32, "spill_load_bytes": 32}]}});
    let mut eval = evaluation(&task, "cuda", build);
    eval.extra.insert(
        "profile".into(),
        json!({"profiler": "/usr/local/cuda/bin/ncu", "available": true, "detail": "",
               "workloads": [
                   {"name": first, "seconds": 4.2, "calls": 1, "launches": 2,
                    "counters": {"dram_pct": 41.0, "compute_pct": 30.0, "tensor_pct": 12.5,
                                 "occupancy_pct": 14.6, "occupancy_limiter": "registers",
                                 "registers": 168, "dram_bytes": 1.1e8}},
                   {"name": "elsewhere", "error": "the profiler wrote no counters"}]}),
    );
    let p = profile_evaluation(&task, "cuda", &eval);
    let c = &p.workloads[0].metrics.counters;
    assert_eq!(c.dram_pct, Some(41.0));
    assert_eq!(c.tensor_pct, Some(12.5));
    assert_eq!(c.occupancy_limiter.as_deref(), Some("registers"));
    // The profiler's register count replaces ptxas's; the spill, which it does not report,
    // stays the build's.
    assert_eq!((c.registers, c.spill_bytes), (Some(168), Some(64)));
    let text = render_profile(&p);
    assert!(
        text.contains(&format!("from /usr/local/cuda/bin/ncu on {first}")),
        "{text}"
    );
    assert!(
        text.contains("elsewhere: no counters: the profiler wrote no counters"),
        "{text}"
    );

    // No profiler could run: the counters are the build's, and the note says why.
    let mut eval = evaluation(&task, "cuda", json!({"compiler": "nvcc"}));
    eval.extra.insert(
        "profile".into(),
        json!({"profiler": null, "available": false, "workloads": [],
               "detail": "Nsight Compute (ncu) is not installed"}),
    );
    let p = profile_evaluation(&task, "cuda", &eval);
    assert_eq!(p.workloads[0].metrics.counters.dram_pct, None);
    assert!(
        render_profile(&p).contains("no profiler counters (Nsight Compute (ncu) is not installed)"),
        "{}",
        render_profile(&p)
    );
    // An evaluation without the section: no profiler ran for it.
    let p = profile_evaluation(
        &task,
        "cuda",
        &evaluation(&task, "cuda", json!({"compiler": "nvcc"})),
    );
    assert!(render_profile(&p).contains("no profiler ran for this evaluation"));
}

/// A stored evaluation recorded on the H200 by a search that profiled its new bests
/// (`tests/fixtures/profiles`, cut to the fields a profile reads).
fn recorded(name: &str) -> EvalResult {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/profiles")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The profile of `workload` in `p`.
fn workload_named<'a>(p: &'a Profile, workload: &str) -> &'a WorkloadProfile {
    p.workloads
        .iter()
        .find(|w| w.workload == workload)
        .unwrap_or_else(|| panic!("no {workload} in {p:?}"))
}

#[test]
fn recorded_h200_profiles_are_classified_from_their_counters() {
    let task = ksearch_task::resolve("attention").unwrap();
    let without_profile = |mut r: EvalResult| {
        r.extra.remove("profile");
        r
    };

    // The naive seed (255 registers, spilling), profiled on its causal bf16 workload: the SM
    // 23% busy, DRAM idle, warps waiting on memory.
    let seed = recorded("h200-attention-naive-seed.json");
    let p = profile_evaluation(&task, "cuda", &seed);
    let w = workload_named(&p, "b4h32l1024d128-bf16-causal");
    assert_eq!(w.diagnosis.class, Bottleneck::Latency);
    assert_eq!(w.diagnosis.sm_busy, Some(0.2349));
    let advice = w.diagnosis.advice.join("\n");
    for said in [
        "measured, DRAM is busy 0% of the time and the SM 23%",
        "achieved occupancy is 11%, limited by registers",
        "264 bytes per thread spill to local memory at 255 registers per thread",
        "the top stall reason is long scoreboard (78% of stalls)",
    ] {
        assert!(advice.contains(said), "{said:?} not in {advice}");
    }
    // The table lists what the profiler measured, for the one workload it ran on.
    let text = render_profile(&p);
    let measured = text
        .split("measured by the profiler")
        .nth(1)
        .unwrap_or_else(|| panic!("no measured table: {text}"));
    let row = measured
        .lines()
        .find(|l| l.starts_with("b4h32l1024d128-bf16-causal"))
        .unwrap_or_else(|| panic!("no row: {text}"));
    for cell in ["23%", "11% (registers)", "long scoreboard (78%)"] {
        assert!(row.contains(cell), "{cell:?} not in {row:?}");
    }
    assert_eq!(measured.matches("b1h32l4096d128-bf16 ").count(), 0);

    // The wgmma kernel, profiled on the d64 workload: 57% busy, just under the line.
    let best = recorded("h200-attention-wgmma.json");
    let p = profile_evaluation(&task, "cuda", &best);
    let w = workload_named(&p, "b1h32l4096d64-f16-causal");
    assert_eq!(w.diagnosis.class, Bottleneck::Latency);
    assert_eq!(w.metrics.counters.tensor_pct, Some(38.17));
    assert!(w
        .diagnosis
        .advice
        .iter()
        .any(|a| a.contains("the top stall reason is wait (29% of stalls)")));
    // Its bf16 workload is compute-bound by the model alone (62% of the FLOP roof).
    let bf16 = workload_named(&p, "b1h32l4096d128-bf16");
    assert_eq!(bf16.diagnosis.class, Bottleneck::Compute);

    // Counters change what the kernel is said to be bound by, never how far it is from its
    // speed of light: the search's headroom and --stop-at-sol do not move when a profile comes.
    for r in [seed, best] {
        let with = profile_evaluation(&task, "cuda", &r);
        let plain = profile_evaluation(&task, "cuda", &without_profile(r));
        let sol = |p: &Profile| {
            p.workloads
                .iter()
                .map(|w| (w.workload.clone(), w.diagnosis.speed_of_light))
                .collect::<Vec<_>>()
        };
        assert_eq!(sol(&with), sol(&plain));
    }
}
