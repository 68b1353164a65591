//! What bounds a kernel on one workload, in words a kernel engineer would use.
//!
//! [`diagnose`] reads what is known of one timed call — its time, the workload's ideal bytes
//! and FLOPs from the task's roofline model, the machine's measured bandwidth and peak, and,
//! where a profiler ran, its counters — and classifies the kernel against the hardware's speed
//! of light: memory-bound, compute-bound, latency-bound (neither roof is near: stalls,
//! occupancy, serial work) or launch-bound (the call costs about what an empty one does). The
//! advice says which numbers led there, so a proposer (or a person) can act on it without
//! reading raw counters.
//!
//! Two questions, two sources: how far the kernel is from its speed of light comes from the
//! model (useful bytes and FLOPs over the time), so the search's headroom and `--stop-at-sol`
//! never credit work the workload does not need; what it is bound by comes from the counters
//! where they exist (what the hardware was busy with), else from the model.
//!
//! This is the one place that interpretation is made; prompts, the
//! world model's signals and `ksearch profile` print its result.

use serde::{Deserialize, Serialize};

/// A fraction of a roof at and above which the kernel is bound by that roof.
pub const BOUND_AT: f64 = 0.6;
/// A call shorter than this many times the platform's empty-call time is launch-bound.
pub const LAUNCH_FACTOR: f64 = 2.0;
/// Achieved occupancy (percent) below which a latency-bound GPU kernel is said to lack warps.
pub const LOW_OCCUPANCY_PCT: f64 = 25.0;

/// Counters of a profiler for the kernel's own launches on the workload (Nsight Compute on
/// NVIDIA; `perf` counters on a CPU). Every field is optional: what the profiler could not
/// read is left out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    /// DRAM throughput, percent of peak.
    pub dram_pct: Option<f64>,
    /// Compute (SM) throughput, percent of peak.
    pub compute_pct: Option<f64>,
    /// Tensor-pipe utilisation, percent.
    pub tensor_pct: Option<f64>,
    /// Achieved occupancy, percent of the maximum warps.
    pub occupancy_pct: Option<f64>,
    /// What limits the theoretical occupancy (`registers`, `shared memory`, `blocks`, …).
    pub occupancy_limiter: Option<String>,
    /// Registers per thread (ptxas).
    pub registers: Option<u32>,
    /// Bytes spilled to local memory per thread (ptxas: stores + loads).
    pub spill_bytes: Option<u64>,
    /// The top stall reasons with their share of stalls, percent, largest first.
    #[serde(default)]
    pub stalls: Vec<(String, f64)>,
    /// Bytes the kernel moved from DRAM, against the workload's ideal bytes.
    pub dram_bytes: Option<f64>,
}

/// Everything known of one kernel on one workload.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// The call's time (the search's median), nanoseconds.
    pub time_ns: f64,
    /// The workload's ideal bytes and FLOPs (the task's roofline model).
    pub bytes: f64,
    pub flops: f64,
    /// The machine's measured memory bandwidth, bytes per second, and peak, FLOP per second.
    pub bandwidth: f64,
    pub peak_flops: f64,
    /// The platform's time for an empty call, when known, nanoseconds.
    pub launch_ns: Option<f64>,
    #[serde(default)]
    pub counters: Counters,
}

/// What bounds the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Bottleneck {
    #[serde(rename = "memory-bound")]
    Memory,
    #[serde(rename = "compute-bound")]
    Compute,
    /// Neither roof is near: the kernel waits (dependencies, too few warps or threads, serial
    /// work, spills).
    #[serde(rename = "latency-bound")]
    Latency,
    /// The call takes about as long as an empty one.
    #[serde(rename = "launch-bound")]
    Launch,
}

impl Bottleneck {
    pub fn as_str(self) -> &'static str {
        match self {
            Bottleneck::Memory => "memory-bound",
            Bottleneck::Compute => "compute-bound",
            Bottleneck::Latency => "latency-bound",
            Bottleneck::Launch => "launch-bound",
        }
    }
}

/// The interpretation of one kernel on one workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Diagnosis {
    pub class: Bottleneck,
    /// Fraction of the speed of light reached: the larger of the memory and compute roofs'
    /// shares. How far the kernel is from the best its workload allows, so it comes from
    /// useful work (the roofline model), never from how busy the hardware was: a kernel that
    /// keeps the SM busy with work the workload does not need is not near its speed of light.
    pub speed_of_light: f64,
    /// Memory roof's share: the workload's ideal bytes at peak bandwidth over the time (the
    /// DRAM counter where the model has no bytes or bandwidth).
    pub memory: f64,
    /// Compute roof's share: the workload's ideal FLOPs at peak over the time (the compute
    /// counter where the model has no FLOPs or peak).
    pub compute: f64,
    /// How busy the profiler found DRAM and the SM (fraction of peak); `None` without counters.
    /// Where known they decide the class: a kernel is bound by what it saturates, whether or
    /// not that work is useful.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dram_busy: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_busy: Option<f64>,
    /// The workload's arithmetic intensity, FLOP per byte, and the machine's ridge point.
    pub intensity: f64,
    pub ridge: f64,
    /// Sentences with the numbers behind the class, most important first.
    pub advice: Vec<String>,
}

impl Diagnosis {
    /// How many times faster the speed of light is (∞ when nothing is known).
    pub fn headroom(&self) -> f64 {
        if self.speed_of_light > 0.0 {
            1.0 / self.speed_of_light
        } else {
            f64::INFINITY
        }
    }
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

/// Classifies `m` (see the module documentation).
pub fn diagnose(m: &Metrics) -> Diagnosis {
    let share = |work: f64, rate: f64| {
        if m.time_ns > 0.0 && rate > 0.0 && work > 0.0 {
            (work / rate * 1e9 / m.time_ns).min(1.0)
        } else {
            0.0
        }
    };
    let c = &m.counters;
    let busy = |pct: Option<f64>| pct.map(|p| (p / 100.0).clamp(0.0, 1.0));
    let (dram_busy, sm_busy) = (busy(c.dram_pct), busy(c.compute_pct));
    // The model says how much of each roof the workload's useful work reaches (the speed of
    // light); the counters, how busy the hardware was (the class). Where the model knows
    // nothing, the counters stand in for it.
    let model = |work: f64, rate: f64| (work > 0.0 && rate > 0.0).then(|| share(work, rate));
    let memory = model(m.bytes, m.bandwidth).or(dram_busy).unwrap_or(0.0);
    let compute = model(m.flops, m.peak_flops).or(sm_busy).unwrap_or(0.0);
    // What each roof's unit was busy with, as the class sees it: the counter, or the useful
    // share where that is higher (a profiler's peaks are the datasheet's, the model's are
    // measured, so useful work can read higher than the counter).
    let busier = |counter: Option<f64>, useful: f64| counter.map_or(useful, |b| b.max(useful));
    let (memory_busy, compute_busy) = (busier(dram_busy, memory), busier(sm_busy, compute));
    let measured = dram_busy.is_some() || sm_busy.is_some();
    let intensity = if m.bytes > 0.0 {
        m.flops / m.bytes
    } else {
        f64::INFINITY
    };
    let ridge = if m.bandwidth > 0.0 {
        m.peak_flops / m.bandwidth
    } else {
        f64::NAN
    };
    let speed_of_light = memory.max(compute);
    let roof = if intensity >= ridge {
        "compute"
    } else {
        "memory"
    };
    let mut advice = Vec::new();

    let launch = m
        .launch_ns
        .filter(|l| *l > 0.0 && m.time_ns < LAUNCH_FACTOR * l);
    let class = if let Some(l) = launch {
        advice.push(format!(
            "a call takes {:.1} µs against {:.1} µs for an empty one: the launch dominates; \
             do more work per call (fuse steps, batch workloads) rather than tune the kernel body",
            m.time_ns / 1e3,
            l / 1e3
        ));
        Bottleneck::Launch
    } else if memory_busy.max(compute_busy) >= BOUND_AT && memory_busy >= compute_busy {
        if measured {
            advice.push(format!(
                "DRAM busy {} of the time while the SM is at {}: memory-bound; the workload's \
                 ideal bytes reach {} of the bandwidth roof, {:.2}x from its speed of light: \
                 move fewer bytes (reuse in registers or shared memory, narrower types, fused \
                 passes)",
                pct(dram_busy.unwrap_or(memory)),
                pct(sm_busy.unwrap_or(compute)),
                pct(memory),
                1.0 / speed_of_light.max(1e-9)
            ));
        } else {
            advice.push(format!(
                "memory traffic at {} of the bandwidth roof while compute is at {}: \
                 memory-bound; the remaining {:.2}x is in moving fewer bytes (reuse in \
                 registers or shared memory, narrower types, fused passes) or in reaching peak \
                 bandwidth (wider, coalesced loads, enough loads in flight)",
                pct(memory),
                pct(compute),
                1.0 / memory.max(1e-9)
            ));
        }
        Bottleneck::Memory
    } else if memory_busy.max(compute_busy) >= BOUND_AT {
        if measured {
            advice.push(format!(
                "SM busy {} of the time while DRAM is at {}: compute-bound; the workload's \
                 FLOPs reach {} of peak, {:.2}x from its speed of light: the instruction mix \
                 (tensor cores or SIMD lanes, FMA, cheaper transcendental functions) and fewer \
                 wasted operations",
                pct(sm_busy.unwrap_or(compute)),
                pct(dram_busy.unwrap_or(memory)),
                pct(compute),
                1.0 / speed_of_light.max(1e-9)
            ));
            if compute < 0.5 * compute_busy {
                advice.push(format!(
                    "most of the SM's work is not the workload's arithmetic ({} busy for {} of \
                     the FLOP roof): index math, type conversions, transcendental functions or \
                     work done twice",
                    pct(compute_busy),
                    pct(compute)
                ));
            }
        } else {
            advice.push(format!(
                "compute at {} of peak while memory traffic is at {}: compute-bound; the \
                 remaining {:.2}x is in the instruction mix (tensor cores or SIMD lanes, FMA, \
                 cheaper transcendental functions) and in fewer wasted operations",
                pct(compute),
                pct(memory),
                1.0 / compute.max(1e-9)
            ));
        }
        if let Some(t) = c.tensor_pct.filter(|t| *t < 50.0) {
            advice.push(format!(
                "the tensor pipe is busy {t:.0}% of the time: move the main products onto it"
            ));
        }
        Bottleneck::Compute
    } else {
        let measured_busy = if measured {
            format!(
                "; measured, DRAM is busy {} of the time and the SM {}",
                pct(dram_busy.unwrap_or(memory)),
                pct(sm_busy.unwrap_or(compute))
            )
        } else {
            String::new()
        };
        advice.push(format!(
            "{} of the speed of light (memory {}, compute {}): neither roof is near, the kernel \
             waits; this workload ({:.2} FLOP/byte against a ridge of {:.1}) would be {roof}-bound \
             at best, {:.1}x from here{measured_busy}",
            pct(speed_of_light),
            pct(memory),
            pct(compute),
            intensity,
            ridge,
            1.0 / speed_of_light.max(1e-9)
        ));
        if let Some(o) = c.occupancy_pct.filter(|o| *o < LOW_OCCUPANCY_PCT) {
            let by = c
                .occupancy_limiter
                .as_deref()
                .map(|l| format!(", limited by {l}"))
                .unwrap_or_default();
            advice.push(format!(
                "achieved occupancy is {o:.0}%{by}: too few warps to hide memory latency; free \
                 the limiting resource or give each thread more independent work"
            ));
        }
        if c.occupancy_pct.is_none() && c.compute_pct.is_none() && c.dram_pct.is_none() {
            advice.push(
                "no profiler counters: check parallelism first (threads or blocks per core or \
                 SM), then loads in flight per thread"
                    .into(),
            );
        }
        Bottleneck::Latency
    };
    if let Some(s) = c.spill_bytes.filter(|s| *s > 0) {
        let regs = c
            .registers
            .map(|r| format!(" at {r} registers per thread"))
            .unwrap_or_default();
        advice.push(format!(
            "{s} bytes per thread spill to local memory{regs}: cut live values (smaller tiles, \
             fewer accumulators) or raise the register budget"
        ));
    }
    if let Some((why, share)) = c.stalls.first() {
        advice.push(format!(
            "the top stall reason is {why} ({share:.0}% of stalls)"
        ));
    }
    if let Some(b) = c.dram_bytes.filter(|b| m.bytes > 0.0 && *b > 1.5 * m.bytes) {
        advice.push(format!(
            "it moves {:.1}x the ideal bytes from DRAM: data is read more than once (tile \
             reuse, cache blocking) or loads are not coalesced",
            b / m.bytes
        ));
    }
    Diagnosis {
        class,
        speed_of_light,
        memory,
        compute,
        dram_busy,
        sm_busy,
        intensity,
        ridge,
        advice,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H200-like device: 4.8 TB/s, 990 TFLOP/s dense f16 (ridge ~206 FLOP/byte).
    fn h200(time_ns: f64, bytes: f64, flops: f64, counters: Counters) -> Metrics {
        Metrics {
            time_ns,
            bytes,
            flops,
            bandwidth: 4.8e12,
            peak_flops: 9.9e14,
            launch_ns: Some(3_000.0),
            counters,
        }
    }

    #[test]
    fn a_copy_at_most_of_the_bandwidth_is_memory_bound() {
        // 1 GiB read and written in 0.5 ms: 4.3 TB/s of 4.8.
        let m = h200(500_000.0, 2.0 * 1.073_741_824e9, 0.0, Counters::default());
        let d = diagnose(&m);
        assert_eq!(d.class, Bottleneck::Memory);
        assert!((d.memory - 0.895).abs() < 0.01, "{d:?}");
        assert!((d.headroom() - 1.117).abs() < 0.01);
        assert!(
            d.advice[0].starts_with("memory traffic at 89% of the bandwidth roof"),
            "{:?}",
            d.advice
        );
    }

    #[test]
    fn attention_on_the_tensor_pipe_is_compute_bound_and_says_when_the_pipe_idles() {
        // Recorded counters of a wgmma attention kernel (B1 H32 L4096 D128): 620 TFLOP/s class.
        let c = Counters {
            dram_pct: Some(12.0),
            compute_pct: Some(71.0),
            tensor_pct: Some(44.0),
            occupancy_pct: Some(12.0),
            registers: Some(168),
            spill_bytes: Some(0),
            stalls: vec![("long scoreboard".into(), 31.0)],
            ..Counters::default()
        };
        let m = h200(880_000.0, 1.34e8, 5.5e11, c);
        let d = diagnose(&m);
        assert_eq!(d.class, Bottleneck::Compute);
        // The SM is 71% busy; the workload's FLOPs reach 5.5e11 / 9.9e14 / 0.88 ms = 63% of
        // peak, which is how far it is from its speed of light.
        assert_eq!(d.sm_busy, Some(0.71));
        assert!((d.compute - 0.6313).abs() < 1e-3, "{d:?}");
        assert_eq!(d.speed_of_light, d.compute);
        assert!(
            d.advice[0].starts_with("SM busy 71% of the time while DRAM is at 12%"),
            "{:?}",
            d.advice
        );
        assert!(
            d.advice
                .iter()
                .any(|a| a.contains("tensor pipe is busy 44%")),
            "{:?}",
            d.advice
        );
        assert!(d
            .advice
            .iter()
            .any(|a| a.contains("long scoreboard (31% of stalls)")));
        assert!(
            !d.advice.iter().any(|a| a.contains("spill")),
            "no spill, no spill advice"
        );
    }

    #[test]
    fn few_warps_far_from_both_roofs_is_latency_bound_and_names_the_limiter() {
        let c = Counters {
            dram_pct: Some(22.0),
            compute_pct: Some(9.0),
            occupancy_pct: Some(14.0),
            occupancy_limiter: Some("registers".into()),
            ..Counters::default()
        };
        let d = diagnose(&h200(120_000.0, 2.0e8, 1.0e9, c));
        assert_eq!(d.class, Bottleneck::Latency);
        // 2e8 ideal bytes in 120 µs at 4.8 TB/s: 35% of the bandwidth roof (some of it from
        // L2: DRAM itself is 22% busy).
        assert!((d.speed_of_light - 2.0e8 / 4.8e12 / 120e-6).abs() < 1e-9);
        assert!(
            d.advice[0].contains(
                "memory-bound at best, 2.9x from here; measured, DRAM is busy 22% of the time \
                 and the SM 9%"
            ),
            "{:?}",
            d.advice
        );
        assert!(d.advice[1].contains("achieved occupancy is 14%, limited by registers"));
    }

    #[test]
    fn spills_and_excess_traffic_are_named_whatever_the_class() {
        let c = Counters {
            dram_pct: Some(81.0),
            compute_pct: Some(20.0),
            registers: Some(255),
            spill_bytes: Some(96),
            dram_bytes: Some(6.0e8),
            ..Counters::default()
        };
        let d = diagnose(&h200(150_000.0, 2.0e8, 1.0e10, c));
        assert_eq!(d.class, Bottleneck::Memory);
        let text = d.advice.join("\n");
        assert!(
            text.contains("96 bytes per thread spill to local memory at 255 registers"),
            "{text}"
        );
        assert!(text.contains("moves 3.0x the ideal bytes"), "{text}");
    }

    #[test]
    fn a_busy_sm_doing_little_of_the_workloads_work_is_compute_bound_far_from_its_speed_of_light() {
        // Recorded on the H200 (ncu 2025.3.1): the Mamba selective scan at D2048 L512, 86.5 µs;
        // the SM 63% busy, DRAM 1.3%, while the task's 8.6 MB and 0.15 GFLOP would take 2.2 µs
        // at the measured 3.84 TB/s.
        let m = Metrics {
            time_ns: 86_512.0,
            bytes: 8_568_832.0,
            flops: 150_994_944.0,
            bandwidth: 3.842_697e12,
            peak_flops: 7.321_331e14,
            launch_ns: None,
            counters: Counters {
                dram_pct: Some(1.25),
                compute_pct: Some(63.39),
                tensor_pct: Some(2.31),
                occupancy_pct: Some(22.92),
                occupancy_limiter: Some("registers".into()),
                ..Counters::default()
            },
        };
        let d = diagnose(&m);
        assert_eq!(d.class, Bottleneck::Compute);
        assert!((d.speed_of_light - 0.0258).abs() < 1e-3, "{d:?}");
        assert!(d.headroom() > 30.0);
        let text = d.advice.join("\n");
        assert!(
            text.contains("most of the SM's work is not the workload's arithmetic (63% busy"),
            "{text}"
        );
        // Without the counters the same time is far from both roofs: latency-bound.
        let plain = diagnose(&Metrics {
            counters: Counters::default(),
            ..m
        });
        assert_eq!(plain.class, Bottleneck::Latency);
        assert_eq!(plain.speed_of_light, d.speed_of_light);
    }

    #[test]
    fn useful_work_near_a_measured_roof_is_bound_by_it_whatever_the_counter_says() {
        // Recorded on the H200: the ping-pong attention kernel at B1 H32 L4096 D128 causal,
        // 286 µs. ncu's SM throughput is 58% of the datasheet peak; the workload's FLOPs reach
        // 66% of the peak the machine measured. The kernel is compute-bound.
        let m = Metrics {
            time_ns: 285_920.0,
            bytes: 134_217_728.0,
            flops: 137_438_953_472.0,
            bandwidth: 3.842_697e12,
            peak_flops: 7.321_331e14,
            launch_ns: None,
            counters: Counters {
                dram_pct: Some(19.72),
                compute_pct: Some(58.26),
                tensor_pct: Some(59.45),
                ..Counters::default()
            },
        };
        let d = diagnose(&m);
        assert_eq!(d.class, Bottleneck::Compute);
        assert!((d.speed_of_light - 0.6566).abs() < 1e-3, "{d:?}");
        assert!(
            d.advice[0].starts_with("SM busy 58% of the time while DRAM is at 20%"),
            "{:?}",
            d.advice
        );
    }

    #[test]
    fn a_call_near_the_empty_call_time_is_launch_bound() {
        let d = diagnose(&h200(4_500.0, 4096.0, 8192.0, Counters::default()));
        assert_eq!(d.class, Bottleneck::Launch);
        assert!(
            d.advice[0].contains("4.5 µs against 3.0 µs for an empty one"),
            "{:?}",
            d.advice
        );
    }

    #[test]
    fn a_cpu_kernel_without_counters_gets_its_roofline_position() {
        // The 2-core CI machine as the harness measured it (18.2 GB/s, 302 GFLOP/s) and softmax
        // r512c4096 (5 FLOP and 8 bytes per element): the naive seed at 4 ms, a search's best
        // at 1.21 ms.
        let n = 512.0 * 4096.0;
        let seed = Metrics {
            time_ns: 4.0e6,
            bytes: 8.0 * n,
            flops: 5.0 * n,
            bandwidth: 18.21e9,
            peak_flops: 302.5e9,
            launch_ns: None,
            counters: Counters::default(),
        };
        let d = diagnose(&seed);
        assert_eq!(d.class, Bottleneck::Latency);
        assert!((d.memory - 8.0 * n / 18.21e9 * 1e9 / 4.0e6).abs() < 1e-9);
        assert!((d.intensity - 0.625).abs() < 1e-12);
        assert!((d.ridge - 16.61).abs() < 0.01);
        assert!(
            d.advice[0].contains("would be memory-bound at best, 4.3x from here"),
            "{:?}",
            d.advice
        );
        assert!(d.advice.iter().any(|a| a.contains("no profiler counters")));
        let best = diagnose(&Metrics {
            time_ns: 1.21e6,
            ..seed
        });
        assert_eq!(best.class, Bottleneck::Memory);
        assert!(
            best.advice[0].starts_with("memory traffic at 76% of the bandwidth roof"),
            "{:?}",
            best.advice
        );
    }

    #[test]
    fn classes_are_written_as_they_are_printed() {
        for c in [
            Bottleneck::Memory,
            Bottleneck::Compute,
            Bottleneck::Latency,
            Bottleneck::Launch,
        ] {
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
        }
    }

    #[test]
    fn nothing_known_is_latency_with_unbounded_headroom() {
        let d = diagnose(&Metrics::default());
        assert_eq!(d.class, Bottleneck::Latency);
        assert_eq!(d.speed_of_light, 0.0);
        assert!(d.headroom().is_infinite());
    }
}
