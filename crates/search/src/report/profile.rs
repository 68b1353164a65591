//! `ksearch profile`: what bounds a kernel on each workload, from one of its evaluations.
//!
//! An evaluation holds each workload's median time and the machine's measured bandwidth and
//! peak (the harness measures both before timing); the task's roofline model gives each
//! workload's ideal bytes and FLOPs; a cuda build's ptxas report gives the kernel's registers
//! and spills. [`ksearch_eval::bottleneck::diagnose`] turns those (and a profiler's counters,
//! where one ran) into a class and advice.

use std::fmt::Write as _;

use serde::Serialize;

use ksearch_eval::bottleneck::{diagnose, Counters, Diagnosis, Metrics};
use ksearch_eval::EvalResult;
use ksearch_task::Task;

/// One workload's profile.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkloadProfile {
    pub workload: String,
    pub held_out: bool,
    pub metrics: Metrics,
    pub diagnosis: Diagnosis,
}

/// A kernel's profile over the workloads its evaluation timed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Profile {
    pub task: String,
    pub backend: String,
    pub workloads: Vec<WorkloadProfile>,
    /// Workloads the evaluation checked without timing them (held-out and assertion workloads
    /// of a re-check): not profiled.
    pub untimed: Vec<String>,
    /// Workloads timed but not in the task's roofline model: not profiled.
    pub unmodelled: Vec<String>,
    /// What was not available, said once (no profiler on this backend, …).
    pub notes: Vec<String>,
}

/// The workload of `workloads` furthest from its speed of light (the smallest share): where
/// the search's advice, its headroom and the profile of a new best look.
pub fn furthest_from_light<'a>(
    workloads: impl IntoIterator<Item = &'a WorkloadProfile>,
) -> Option<&'a WorkloadProfile> {
    workloads.into_iter().min_by(|a, b| {
        a.diagnosis
            .speed_of_light
            .total_cmp(&b.diagnosis.speed_of_light)
    })
}

/// The profile of `eval`, an evaluation of a kernel for `task` on `backend`.
pub fn profile_evaluation(task: &Task, backend: &str, eval: &EvalResult) -> Profile {
    let env = eval.environment.clone().unwrap_or_default();
    let figure = |key: &str| env.get(key).and_then(|v| v.as_f64()).unwrap_or(0.0);
    let bandwidth = figure("mem_bandwidth_gbs") * 1e9;
    let peak_flops = figure("peak_gflops") * 1e9;
    let model = task.workloads(backend).unwrap_or_default();
    let build = build_counters(eval);
    let profiled = ProfilerSection::of(eval);
    let mut workloads = Vec::new();
    let (mut untimed, mut unmodelled) = (Vec::new(), Vec::new());
    for w in &eval.workloads {
        let Some(time_ns) = w.candidate_median_ns.filter(|t| *t > 0.0) else {
            untimed.push(w.name.clone());
            continue;
        };
        let Some(m) = model.iter().find(|m| m.name == w.name) else {
            unmodelled.push(w.name.clone());
            continue;
        };
        let metrics = Metrics {
            time_ns,
            bytes: m.bytes,
            flops: m.flops,
            bandwidth,
            peak_flops,
            launch_ns: None,
            counters: merged(&build, profiled.counters_of(&w.name)),
        };
        workloads.push(WorkloadProfile {
            workload: w.name.clone(),
            held_out: m.held_out,
            diagnosis: diagnose(&metrics),
            metrics,
        });
    }
    let mut notes = Vec::new();
    if bandwidth <= 0.0 || peak_flops <= 0.0 {
        notes.push(
            "the evaluation has no measured bandwidth or peak: the roofline shares are unknown"
                .into(),
        );
    }
    if let Some(r) = build.registers {
        notes.push(format!(
            "build: {r} registers per thread and {} bytes per thread spilled to local memory, \
             the most of any of its kernel instances (ptxas)",
            build.spill_bytes.unwrap_or(0)
        ));
    }
    notes.extend(profiled.notes());
    Profile {
        task: task.name().to_string(),
        backend: backend.to_string(),
        workloads,
        untimed,
        unmodelled,
        notes,
    }
}

/// The harness's `profile` section of an evaluation (its `profile` op, whose result the search
/// attaches to the evaluations it profiled): per workload the profiler's counters of the
/// kernel's own launches, or why there are none.
#[derive(Debug, Default)]
struct ProfilerSection {
    /// Whether the evaluation carries a profile section at all.
    present: bool,
    profiler: Option<String>,
    /// Why no profiler ran (none installed, the cpu backend, ...).
    unavailable: Option<String>,
    counters: Vec<(String, Counters)>,
    failures: Vec<(String, String)>,
}

impl ProfilerSection {
    fn of(eval: &EvalResult) -> Self {
        let Some(section) = eval.extra.get("profile") else {
            return Self::default();
        };
        let text = |v: &serde_json::Value, key: &str| {
            v.get(key).and_then(|x| x.as_str()).map(str::to_string)
        };
        let mut out = Self {
            present: true,
            profiler: text(section, "profiler"),
            ..Self::default()
        };
        if section.get("available").and_then(|a| a.as_bool()) != Some(true) {
            out.unavailable = Some(text(section, "detail").unwrap_or_default());
        }
        let workloads = section.get("workloads").and_then(|w| w.as_array());
        for w in workloads.map(Vec::as_slice).unwrap_or_default() {
            let Some(name) = text(w, "name") else {
                continue;
            };
            let counters = w
                .get("counters")
                .and_then(|c| serde_json::from_value::<Counters>(c.clone()).ok());
            match (counters, text(w, "error")) {
                (_, Some(error)) => out.failures.push((name, error)),
                (Some(c), None) => out.counters.push((name, c)),
                (None, None) => out
                    .failures
                    .push((name, "the profiler's counters do not read".into())),
            }
        }
        out
    }

    fn counters_of(&self, workload: &str) -> Option<&Counters> {
        self.counters
            .iter()
            .find(|(name, _)| name == workload)
            .map(|(_, c)| c)
    }

    fn notes(&self) -> Vec<String> {
        let plain = "the classes come from the roofline model and the measured times";
        if !self.present {
            return vec![format!("no profiler ran for this evaluation: {plain}")];
        }
        if let Some(why) = &self.unavailable {
            return vec![format!("no profiler counters ({why}): {plain}")];
        }
        let mut notes = Vec::new();
        if !self.counters.is_empty() {
            let names: Vec<&str> = self.counters.iter().map(|(n, _)| n.as_str()).collect();
            notes.push(format!(
                "counters of the kernel's own launches from {} on {}",
                self.profiler.as_deref().unwrap_or("the profiler"),
                names.join(", ")
            ));
        }
        for (name, error) in &self.failures {
            notes.push(format!("{name}: no counters: {error}"));
        }
        notes
    }
}

/// The profiler's counters over the build's: a figure the profiler measured replaces the
/// build's; the build's registers and spills stay where the profiler has none.
fn merged(build: &Counters, profiled: Option<&Counters>) -> Counters {
    let Some(p) = profiled else {
        return build.clone();
    };
    Counters {
        dram_pct: p.dram_pct.or(build.dram_pct),
        compute_pct: p.compute_pct.or(build.compute_pct),
        tensor_pct: p.tensor_pct.or(build.tensor_pct),
        occupancy_pct: p.occupancy_pct.or(build.occupancy_pct),
        occupancy_limiter: p
            .occupancy_limiter
            .clone()
            .or_else(|| build.occupancy_limiter.clone()),
        registers: p.registers.or(build.registers),
        spill_bytes: p.spill_bytes.or(build.spill_bytes),
        stalls: if p.stalls.is_empty() {
            build.stalls.clone()
        } else {
            p.stalls.clone()
        },
        dram_bytes: p.dram_bytes.or(build.dram_bytes),
    }
}

/// What the build reported of the kernel's resources, the same on every workload (which
/// template instance a workload runs is not known here): on cuda, ptxas's largest register
/// count and largest spill (stores and loads, bytes per thread) over the build's kernel
/// instances (`ptxas.kernels`, which every report of the harness lists); nothing where the
/// build has no such report (cpu, mlx).
fn build_counters(eval: &EvalResult) -> Counters {
    let kernels = eval
        .build
        .as_ref()
        .and_then(|b| b.extra.get("ptxas"))
        .and_then(|p| p.get("kernels"))
        .and_then(|k| k.as_array())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let int = |k: &serde_json::Value, key: &str| k.get(key).and_then(|x| x.as_u64());
    let registers = kernels.iter().filter_map(|k| int(k, "registers")).max();
    let spill = kernels
        .iter()
        .map(|k| int(k, "spill_store_bytes").unwrap_or(0) + int(k, "spill_load_bytes").unwrap_or(0))
        .max();
    Counters {
        registers: registers.and_then(|r| u32::try_from(r).ok()),
        // Spills mean something only beside the registers they came from.
        spill_bytes: registers.and(spill),
        ..Counters::default()
    }
}

/// The profile as a table, one row per workload (and, where a profiler measured any, a table
/// of what it measured), then each workload's advice.
pub fn render_profile(p: &Profile) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "profile: task {}, backend {}", p.task, p.backend);
    let name_of = |w: &WorkloadProfile| {
        if w.held_out {
            format!("{} (held out)", w.workload)
        } else {
            w.workload.clone()
        }
    };
    let width = p
        .workloads
        .iter()
        .map(|w| name_of(w).chars().count())
        .max()
        .unwrap_or(0)
        .max("workload".len());
    let _ = writeln!(
        out,
        "{:<width$} {:>10} {:>9} {:>10} {:>8} {:>8} {:>8}  class",
        "workload", "time", "FLOP/B", "ridge", "memory", "compute", "of SoL"
    );
    for w in &p.workloads {
        let d = &w.diagnosis;
        let _ = writeln!(
            out,
            "{:<width$} {:>10} {:>9.2} {:>10.1} {:>7.0}% {:>7.0}% {:>7.0}%  {}",
            name_of(w),
            ksearch_eval::report::format_ns(w.metrics.time_ns),
            d.intensity,
            d.ridge,
            d.memory * 100.0,
            d.compute * 100.0,
            d.speed_of_light * 100.0,
            d.class.as_str()
        );
    }
    let measured: Vec<&WorkloadProfile> = p
        .workloads
        .iter()
        .filter(|w| w.diagnosis.dram_busy.is_some() || w.diagnosis.sm_busy.is_some())
        .collect();
    if !measured.is_empty() {
        let percent = |x: Option<f64>| match x {
            Some(v) => format!("{v:.0}%"),
            None => "-".into(),
        };
        let _ = writeln!(
            out,
            "\nmeasured by the profiler (percent of peak):\n{:<width$} {:>9} {:>8} {:>8} {:>18}  \
             top stall",
            "workload", "DRAM busy", "SM busy", "tensor", "occupancy"
        );
        for w in measured {
            let (d, c) = (&w.diagnosis, &w.metrics.counters);
            let occupancy = match (c.occupancy_pct, &c.occupancy_limiter) {
                (Some(o), Some(l)) => format!("{o:.0}% ({l})"),
                (o, _) => percent(o),
            };
            let stall = c
                .stalls
                .first()
                .map(|(why, share)| format!("{why} ({share:.0}%)"))
                .unwrap_or_else(|| "-".into());
            let _ = writeln!(
                out,
                "{:<width$} {:>9} {:>8} {:>8} {:>18}  {stall}",
                name_of(w),
                percent(d.dram_busy.map(|x| x * 100.0)),
                percent(d.sm_busy.map(|x| x * 100.0)),
                percent(c.tensor_pct),
                occupancy,
            );
        }
    }
    for w in &p.workloads {
        let _ = writeln!(out, "\n{}:", w.workload);
        for a in &w.diagnosis.advice {
            let _ = writeln!(out, "  - {a}");
        }
    }
    if !p.untimed.is_empty() {
        let _ = writeln!(
            out,
            "\nchecked, not timed: {} workloads ({})",
            p.untimed.len(),
            p.untimed.join(", ")
        );
    }
    if !p.unmodelled.is_empty() {
        let _ = writeln!(
            out,
            "not in the task's roofline model: {}",
            p.unmodelled.join(", ")
        );
    }
    for n in &p.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}
