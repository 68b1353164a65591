//! The report of a `ksearch bench`: per workload the median time of each contender, TFLOP/s,
//! the kernel's fraction of the hardware profile's peak and the ratios of the natives' times
//! to the kernel's, as a table ([`render`]) or as JSON with the harness's result
//! ([`report_json`]).

use crate::bench::{BenchResult, BenchWorkload, COMPARATORS};
use crate::report::{Align, Table};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The peak a fraction is taken of: TFLOP/s by dtype, from a hardware profile (the caller
/// looks it up in knowledge/hardware).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Peaks {
    /// The profile's name, when one applies.
    pub profile: Option<String>,
    pub tflops: BTreeMap<String, f64>,
}

impl Peaks {
    fn of(&self, dtype: Option<&str>) -> Option<f64> {
        dtype.and_then(|d| self.tflops.get(d)).copied()
    }
}

/// The numbers of one contender on one workload that the table and the JSON show.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Derived {
    ms: f64,
    tflops: f64,
}

fn derived(w: &BenchWorkload, contender: &str) -> Option<Derived> {
    let m = w.result(contender)?;
    let ns = m.median_ns.filter(|ns| *ns > 0.0)?;
    Some(Derived {
        ms: ns / 1e6,
        tflops: w.flops / ns / 1e3,
    })
}

/// `native / kernel` time: above 1 the kernel is faster.
fn ratio(w: &BenchWorkload, native: &str) -> Option<f64> {
    Some(derived(w, native)?.ms / derived(w, "kernel")?.ms)
}

fn geomean(values: &[f64]) -> Option<f64> {
    let v: Vec<f64> = values
        .iter()
        .copied()
        .filter(|x| x.is_finite() && *x > 0.0)
        .collect();
    (!v.is_empty() && v.len() == values.len())
        .then(|| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
}

fn natives(result: &BenchResult) -> Vec<&str> {
    COMPARATORS
        .iter()
        .copied()
        .filter(|c| result.comparators.get(*c).is_some_and(|i| i.available))
        .collect()
}

fn short_name(native: &str) -> &'static str {
    match native {
        "sdpa" => "SDPA",
        "mlx" => "MLX",
        _ => "?",
    }
}

fn check_text(w: &BenchWorkload, contender: &str) -> String {
    match w.result(contender) {
        None => "-".into(),
        Some(m) => match (&m.error, m.correct) {
            (Some(e), _) => format!("error: {}", e.lines().next().unwrap_or("")),
            (None, Some(true)) => "ok".into(),
            (None, Some(false)) => format!(
                "WRONG (max rel err {})",
                m.max_rel_err
                    .map(|e| format!("{e:.2e}"))
                    .unwrap_or_else(|| "NaN".into())
            ),
            (None, None) => "unchecked".into(),
        },
    }
}

/// The human-readable report.
pub fn render(
    task: &str,
    backend: &str,
    kernel: &str,
    result: &BenchResult,
    peaks: &Peaks,
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "ksearch bench: task {task}, backend {backend}, kernel {kernel}"
    );
    let gpu = result.gpu().unwrap_or("unknown GPU");
    let _ = match &peaks.profile {
        Some(p) => writeln!(
            s,
            "GPU: {gpu} (profile {p}: peak {})",
            peaks
                .tflops
                .iter()
                .filter(|(d, _)| ["f16", "bf16", "f32"].contains(&d.as_str()))
                .map(|(d, t)| format!("{d} {t} TFLOP/s"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => writeln!(s, "GPU: {gpu} (no hardware profile: no fraction of peak)"),
    };
    if !result.passed() {
        let _ = writeln!(
            s,
            "\nnothing measured: {}: {}",
            result.status, result.message
        );
        if let Some(log) = result
            .build
            .as_ref()
            .and_then(|b| b.get("log"))
            .and_then(Value::as_str)
            .filter(|l| !l.is_empty())
        {
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let _ = writeln!(s, "build log (end):");
            for line in tail.into_iter().rev() {
                let _ = writeln!(s, "  {line}");
            }
        }
        return s;
    }
    let settings = &result.settings;
    // Harnesses since 2026-12-01 take the contenders in turns and say so.
    let order = match settings.get("order").and_then(Value::as_str) {
        Some("interleaved") => ", contenders in turns (one call of each per round)",
        _ => "",
    };
    let _ = writeln!(
        s,
        "timing: median of {} calls after {} warm-up, per contender and workload, one \
         process{order}",
        settings["reps"], settings["warmup"]
    );
    let _ = writeln!(
        s,
        "  kernel: {}",
        settings["kernel_timing"].as_str().unwrap_or("-")
    );
    for name in COMPARATORS {
        if let Some(c) = result.comparators.get(name) {
            let _ = if c.available {
                writeln!(
                    s,
                    "  {} {}: {}",
                    c.label,
                    c.version.as_deref().unwrap_or(""),
                    c.timing.as_deref().unwrap_or("-")
                )
            } else {
                writeln!(
                    s,
                    "  {}: not measured ({})",
                    c.label,
                    c.reason.as_deref().unwrap_or("unavailable")
                )
            };
        }
    }
    let natives = natives(result);
    let mut header = vec![
        "workload".to_string(),
        "dtype".into(),
        "causal".into(),
        "kernel ms".into(),
        "TFLOP/s".into(),
        "% peak".into(),
    ];
    for n in &natives {
        header.push(format!("{} ms", short_name(n)));
        header.push(format!("vs {}", short_name(n)));
    }
    header.push("check".into());
    let mut rows = vec![header];
    let mut ratios: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut wrong_natives = Vec::new();
    for w in &result.workloads {
        let dtype = w.param("dtype");
        let k = derived(w, "kernel");
        let mut row = vec![
            if w.held_out {
                format!("{} (held out)", w.name)
            } else {
                w.name.clone()
            },
            dtype.clone().unwrap_or_else(|| "-".into()),
            w.param("causal").unwrap_or_else(|| "-".into()),
            k.map(|d| format!("{:.3}", d.ms))
                .unwrap_or_else(|| "-".into()),
            k.map(|d| format!("{:.0}", d.tflops))
                .unwrap_or_else(|| "-".into()),
            match (k, peaks.of(dtype.as_deref())) {
                (Some(d), Some(p)) if p > 0.0 => format!("{:.1}", 100.0 * d.tflops / p),
                _ => "-".into(),
            },
        ];
        for n in &natives {
            let d = derived(w, n);
            let wrong = w.result(n).is_some_and(|m| m.correct == Some(false));
            if wrong {
                wrong_natives.push(format!("{} on {}", short_name(n), w.name));
            }
            row.push(
                d.map(|d| format!("{:.3}{}", d.ms, if wrong { "!" } else { "" }))
                    .unwrap_or_else(|| "-".into()),
            );
            let r = ratio(w, n);
            if let Some(r) = r {
                ratios.entry(n).or_default().push(r);
            }
            row.push(r.map(|r| format!("{r:.2}")).unwrap_or_else(|| "-".into()));
        }
        row.push(check_text(w, "kernel"));
        rows.push(row);
    }
    if natives
        .iter()
        .any(|n| ratios.get(n).is_some_and(|r| !r.is_empty()))
    {
        let mut row = vec!["geomean".to_string()];
        row.extend(std::iter::repeat_n(String::new(), 5));
        for n in &natives {
            row.push(String::new());
            let g = ratios.get(n).and_then(|r| geomean(r));
            row.push(g.map(|g| format!("{g:.2}")).unwrap_or_else(|| "-".into()));
        }
        row.push(String::new());
        rows.push(row);
    }
    s.push('\n');
    // The first column and the last (check) read left to right; numbers line up right.
    let align = |c: usize, cols: usize| {
        if c == 0 || c + 1 == cols {
            Align::Left
        } else {
            Align::Right
        }
    };
    s.push_str(&Table::from_rows(&rows, align).render());
    let _ = writeln!(
        s,
        "\nvs X = X's median / the kernel's median (above 1: the kernel is faster). TFLOP/s \
         count the task's FLOPs (attention: 4·B·H·L²·D, halved when causal)."
    );
    if !wrong_natives.is_empty() {
        let _ = writeln!(
            s,
            "! the native's output did not match the reference: {}",
            wrong_natives.join(", ")
        );
    }
    s
}

/// `--json`: the derived numbers per workload, and the harness's result as it came.
pub fn report_json(
    task: &str,
    backend: &str,
    kernel: &str,
    result: &BenchResult,
    peaks: &Peaks,
) -> Value {
    let workloads: Vec<Value> = result
        .workloads
        .iter()
        .map(|w| {
            let dtype = w.param("dtype");
            let mut contenders = serde_json::Map::new();
            for (name, m) in &w.results {
                let d = derived(w, name);
                let mut entry = json!({
                    "median_ms": d.map(|d| d.ms),
                    "tflops": d.map(|d| d.tflops),
                    "correct": m.correct,
                    "max_rel_err": m.max_rel_err,
                    "error": m.error,
                });
                if name == "kernel" {
                    entry["peak_fraction"] = json!(d
                        .zip(peaks.of(dtype.as_deref()))
                        .filter(|(_, p)| *p > 0.0)
                        .map(|(d, p)| d.tflops / p));
                } else {
                    entry["ratio"] = json!(ratio(w, name));
                }
                contenders.insert(name.clone(), entry);
            }
            json!({
                "name": w.name, "held_out": w.held_out, "params": w.params, "flops": w.flops,
                "contenders": contenders,
            })
        })
        .collect();
    json!({
        "task": task,
        "backend": backend,
        "kernel": kernel,
        "status": result.status,
        "message": result.message,
        "gpu": result.gpu(),
        "hardware_profile": peaks.profile,
        "peak_tflops": peaks.tflops,
        "workloads": workloads,
        "result": result,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bench result as the harness writes it: H200 numbers of docs/gpu-attention.md for the
    /// kernel, SDPA and MLX; one held-out workload; one kernel error; one wrong native output.
    const FIXTURE: &str = r#"{
      "protocol": 1, "op": "bench", "nonce": "abc", "status": "passed", "violation": null,
      "message": "", "backend": "cuda",
      "build": {"compiler": "nvcc release 13.0", "command": [], "seconds": 4.1, "log": ""},
      "environment": {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130"},
      "comparators": {
        "sdpa": {"available": true, "label": "PyTorch SDPA", "version": "2.11.0+cu130",
                 "timing": "CUDA events on the current stream, L2 flush before each call"},
        "mlx": {"available": true, "label": "MLX native (mx.fast.scaled_dot_product_attention)",
                "version": "0.32.4", "timing": "wall clock around the call, mx.eval and mx.synchronize, MLX flush before each call"}
      },
      "settings": {"warmup": 5, "reps": 20, "compare": ["sdpa", "mlx"],
                   "kernel_timing": "CUDA events on the harness stream, L2 flush before each call"},
      "workloads": [
        {"name": "b1h32l4096d128-f16-causal", "held_out": false,
         "params": {"B": 1, "H": 32, "L": 4096, "D": 128, "causal": 1, "dtype": "f16"},
         "flops": 137438953472.0, "bytes": 134217728.0,
         "results": {
           "kernel": {"samples_ns": [368000, 369000], "median_ns": 368000.0, "p10_ns": 367000.0, "p90_ns": 371000.0, "correct": true, "max_abs_err": 0.0004, "max_rel_err": 0.0011},
           "sdpa": {"samples_ns": [294000], "median_ns": 294000.0, "correct": true, "max_rel_err": 0.0008},
           "mlx": {"samples_ns": [475000], "median_ns": 475000.0, "correct": true, "max_rel_err": 0.0009}}},
        {"name": "b1h32l4096d128-bf16", "held_out": false,
         "params": {"B": 1, "H": 32, "L": 4096, "D": 128, "causal": 0, "dtype": "bf16"},
         "flops": 274877906944.0, "bytes": 134217728.0,
         "results": {
           "kernel": {"samples_ns": [692000], "median_ns": 692000.0, "correct": true, "max_rel_err": 0.006},
           "sdpa": {"samples_ns": [440000], "median_ns": 440000.0, "correct": true, "max_rel_err": 0.005},
           "mlx": {"samples_ns": [680000], "median_ns": 680000.0, "correct": false, "max_rel_err": 0.2}}},
        {"name": "b1h8l777d64-bf16", "held_out": true,
         "params": {"B": 1, "H": 8, "L": 777, "D": 64, "causal": 0, "dtype": "bf16"},
         "flops": 1236603904.0, "bytes": 3182592.0,
         "results": {
           "kernel": {"error": "CUDA error in a timed call: an illegal memory access was encountered", "status": "runtime_error"},
           "sdpa": {"samples_ns": [44000], "median_ns": 44000.0, "correct": true, "max_rel_err": 0.004},
           "mlx": {"samples_ns": [142000], "median_ns": 142000.0, "correct": true, "max_rel_err": 0.004}}}
      ],
      "log_tail": ""
    }"#;

    fn h200() -> Peaks {
        Peaks {
            profile: Some("h200".into()),
            tflops: BTreeMap::from([
                ("bf16".to_string(), 989.4),
                ("f16".to_string(), 989.4),
                ("f32".to_string(), 67.0),
            ]),
        }
    }

    #[test]
    fn the_table_from_a_fixture() {
        let result = BenchResult::parse(FIXTURE).unwrap();
        let text = render("attention", "cuda", "best.cu", &result, &h200());
        insta::assert_snapshot!(text);
    }

    #[test]
    fn an_interleaved_bench_says_so_in_its_timing_line() {
        let mut result = BenchResult::parse(FIXTURE).unwrap();
        let line = |r: &BenchResult| {
            render("attention", "cuda", "best.cu", r, &h200())
                .lines()
                .find(|l| l.starts_with("timing:"))
                .unwrap()
                .to_string()
        };
        assert!(!line(&result).contains("in turns"), "{}", line(&result));
        result.settings["order"] = json!("interleaved");
        assert!(
            line(&result)
                .ends_with("one process, contenders in turns (one call of each per round)"),
            "{}",
            line(&result)
        );
    }

    #[test]
    fn numbers_are_derived_from_the_medians() {
        let result = BenchResult::parse(FIXTURE).unwrap();
        let w = &result.workloads[0];
        let d = derived(w, "kernel").unwrap();
        assert!((d.ms - 0.368).abs() < 1e-12);
        // 4·1·32·4096²·128 / 2 FLOPs in 0.368 ms.
        assert!((d.tflops - 137438953472.0 / 0.368e-3 / 1e12).abs() < 1e-9);
        assert!((ratio(w, "sdpa").unwrap() - 294.0 / 368.0).abs() < 1e-12);
        assert!((ratio(w, "mlx").unwrap() - 475.0 / 368.0).abs() < 1e-12);
        assert!(ratio(&result.workloads[2], "sdpa").is_none());
        let doc = report_json("attention", "cuda", "best.cu", &result, &h200());
        let k = &doc["workloads"][0]["contenders"]["kernel"];
        assert!((k["peak_fraction"].as_f64().unwrap() - d.tflops / 989.4).abs() < 1e-12);
        assert!(doc["workloads"][2]["contenders"]["kernel"]["error"]
            .as_str()
            .unwrap()
            .contains("illegal"));
        assert_eq!(doc["hardware_profile"], "h200");
        assert_eq!(doc["result"]["nonce"], "abc");
        assert_eq!(geomean(&[2.0, 8.0]), Some(4.0));
        assert_eq!(geomean(&[2.0, f64::NAN]), None);
    }

    #[test]
    fn a_failed_bench_and_missing_natives_are_shown_as_such() {
        let mut result = BenchResult::parse(FIXTURE).unwrap();
        result.comparators.get_mut("mlx").unwrap().available = false;
        result.comparators.get_mut("mlx").unwrap().reason =
            Some("ModuleNotFoundError: No module named 'mlx'".into());
        let text = render("attention", "cuda", "k.cu", &result, &Peaks::default());
        assert!(text.contains("not measured (ModuleNotFoundError"), "{text}");
        assert!(
            !text.contains("MLX ms") && text.contains("SDPA ms"),
            "{text}"
        );
        assert!(text.contains("no hardware profile"), "{text}");

        let failed = BenchResult::parse(
            r#"{"protocol": 1, "nonce": "n", "status": "build_error", "message": "nvcc failed",
                "build": {"log": "kernel.cu(3): error: identifier \"x\" is undefined"}}"#,
        )
        .unwrap();
        let text = render("attention", "cuda", "k.cu", &failed, &h200());
        insta::assert_snapshot!(text);
    }
}
