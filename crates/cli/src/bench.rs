//! `ksearch bench <task>`: a kernel (a run's best, a file, or the task's seed) against the
//! native implementations (PyTorch SDPA, MLX native) on the task's GPU workloads, measured in
//! one harness process in one run; per workload the median time, TFLOP/s, the fraction of the
//! hardware profile's peak and the ratios. The measuring is `ksearch_eval::bench`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};

use ksearch_eval::bench::COMPARATORS;
use ksearch_eval::{
    fresh_secret_seed, is_gpu_backend, BenchRequest, BenchResult, BenchSettings, BenchWorkload,
    EvalRequest, Evaluator, EvaluatorConfig, TimingPreset, WorkloadSet,
};
use ksearch_knowledge::Catalog;
use ksearch_task::{CustomWorkload, ResolvedWorkload, Task};

use crate::exit;
use crate::search::{open_run, pick_backend, probed_backends};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Built-in task name or task directory; `mamba` benches the whole Mamba model instead
    /// (crates/cli/src/bench_mamba.rs).
    #[arg(value_name = "TASK")]
    pub task: String,

    /// Bench the best kernel of this run (id, unique prefix or run directory).
    #[arg(long, value_name = "RUN", conflicts_with = "kernel")]
    pub run: Option<String>,

    /// Where runs are stored.
    #[arg(long, default_value = "runs", value_name = "DIR")]
    pub runs_dir: PathBuf,

    /// Bench this kernel file (default: the task's seed kernel for the backend).
    #[arg(long, value_name = "FILE")]
    pub kernel: Option<PathBuf>,

    /// cuda or mlx; default: the run's backend, else the GPU backend this machine offers.
    #[arg(long)]
    pub backend: Option<String>,

    /// Workloads: names of the task's workloads, or AXIS=VALUE lists such as
    /// `B=1,H=32,L=4096,D=128,causal=1,dtype=f16`; separate several with `;` or repeat the
    /// flag. Default: every workload of the backend, held-out ones included.
    #[arg(long, value_name = "SHAPES")]
    pub shapes: Vec<String>,

    /// Timed calls per contender and workload; the median is reported.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(20..=10_000))]
    pub reps: u32,

    /// Untimed calls before them.
    #[arg(long, default_value_t = 5)]
    pub warmup: u32,

    /// Natives to compare with (those importable on this machine are measured).
    #[arg(long, value_delimiter = ',', default_value = "sdpa,mlx", value_parser = ["sdpa", "mlx"])]
    pub compare: Vec<String>,

    /// Hardware profile for the fraction of peak (name or alias in knowledge/hardware);
    /// default: the profile of the GPU the harness reports.
    #[arg(long, value_name = "NAME")]
    pub hardware: Option<String>,

    /// Seconds the whole bench may take, nvcc included.
    #[arg(long, value_name = "SECONDS", default_value_t = 1200.0)]
    pub timeout: f64,

    /// Print JSON: the derived numbers per workload plus the harness's raw result.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub mamba: crate::bench_mamba::MambaArgs,
}

pub fn run(args: &BenchArgs, quiet: bool) -> Result<u8> {
    if args.task == crate::bench_mamba::TASK {
        return crate::bench_mamba::run(args, quiet);
    }
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        bail!("--timeout must be a positive number of seconds");
    }
    let (task, kernel, run_backend) = match &args.run {
        Some(run) => {
            let (task, path, backend) = best_of_run(&args.runs_dir, run)?;
            (task, Some(path), Some(backend))
        }
        None => (
            ksearch_task::resolve(&args.task).context("cannot load the task")?,
            args.kernel.clone(),
            None,
        ),
    };
    let backend = match (&args.backend, run_backend) {
        (Some(b), Some(r)) if *b != r => {
            bail!("the run's kernel is for the {r} backend, not {b}")
        }
        (Some(b), _) => b.clone(),
        (None, Some(r)) => r,
        (None, None) => default_gpu_backend(&task)?,
    };
    let kernel =
        match kernel {
            Some(k) => k,
            None => task.backend(&backend)?.seed.clone().with_context(|| {
                format!("task {} has no seed kernel for {backend}", task.name())
            })?,
        };
    let req = build_request(
        &task,
        &backend,
        &kernel,
        &args.shapes,
        BenchSettings {
            warmup: args.warmup,
            reps: args.reps,
            compare: args.compare.clone(),
            ..BenchSettings::default()
        },
        fresh_secret_seed()?,
        Duration::from_secs_f64(args.timeout),
    )?;
    let evaluator = Evaluator::new(EvaluatorConfig {
        backend: Some(backend.clone()),
        ..EvaluatorConfig::default()
    })
    .context("cannot set up the evaluation environment (try `ksearch doctor`)")?;
    if !quiet {
        eprintln!(
            "ksearch: bench {} on {}/{backend}: {} workloads, {} timed calls each",
            kernel.display(),
            task.name(),
            req.eval.workloads.len(),
            args.reps
        );
    }
    let result = evaluator.bench(&req)?;
    let catalog = Catalog::builtin().context("cannot load the knowledge pack")?;
    let peaks = peaks_for(&catalog, args.hardware.as_deref(), result.gpu())?;
    let label = kernel.display().to_string();
    if args.json {
        let doc = report_json(task.name(), &backend, &label, &result, &peaks);
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", render(task.name(), &backend, &label, &result, &peaks));
    }
    let kernel_failed = result.workloads.iter().any(|w| {
        w.result("kernel")
            .is_none_or(|m| m.error.is_some() || m.correct != Some(true))
    });
    Ok(if !result.passed() || kernel_failed {
        exit::REJECTED
    } else {
        exit::OK
    })
}

/// A GPU backend of the task that this machine can run.
fn default_gpu_backend(task: &Task) -> Result<String> {
    let names = task.backend_names();
    if !names.iter().any(|b| is_gpu_backend(b)) {
        bail!(
            "task {} has no GPU backend; `ksearch bench` compares GPU kernels",
            task.name()
        );
    }
    let available = probed_backends();
    pick_backend(&names, &available, &["cuda", "mlx"])
        .context("the task has no GPU backend this machine can run")
}

/// The task, the best kernel's stored source file and the backend of a finished run.
pub(crate) fn best_of_run(runs_dir: &Path, run: &str) -> Result<(Task, PathBuf, String)> {
    let store = open_run(runs_dir, run)?;
    let summary = store
        .finish_summary()?
        .context("the run has not finished; `ksearch resume` it first (or see `ksearch show`)")?;
    let id = summary
        .get("best")
        .filter(|b| !b.is_null())
        .and_then(|b| b["candidate_id"].as_i64())
        .context("the run has no accepted kernel (no candidate passed the final re-check)")?;
    let cand = store
        .candidate(id)?
        .with_context(|| format!("candidate {id} is missing from the store"))?;
    let path = store.source_path(&cand.source_id)?;
    let config = store.config().clone();
    let task_ref = config.extra["task_dir"]
        .as_str()
        .filter(|d| Path::new(d).join("task.toml").is_file())
        .map(str::to_string)
        .unwrap_or_else(|| config.task.clone());
    let task = ksearch_task::resolve(&task_ref).context("cannot load the run's task")?;
    Ok((task, path, config.backend))
}

/// The bench request: the candidate on `shapes` (all of the backend's workloads when empty).
pub fn build_request(
    task: &Task,
    backend: &str,
    kernel: &Path,
    shapes: &[String],
    settings: BenchSettings,
    secret_seed: u64,
    timeout: Duration,
) -> Result<BenchRequest> {
    if !is_gpu_backend(backend) {
        bail!("`ksearch bench` measures the GPU backends (cuda, mlx), not {backend}");
    }
    if settings
        .compare
        .iter()
        .any(|c| !COMPARATORS.contains(&c.as_str()))
    {
        bail!("--compare takes {}", COMPARATORS.join(", "));
    }
    if !kernel.is_file() {
        bail!("kernel file not found: {}", kernel.display());
    }
    let mut eval = EvalRequest::from_task(
        task,
        backend,
        kernel,
        WorkloadSet::Acceptance,
        secret_seed,
        TimingPreset::Standard,
    )?;
    eval.timeout = timeout;
    let specs: Vec<&str> = shapes
        .iter()
        .flat_map(|s| s.split(';'))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if !specs.is_empty() {
        let known = task.workloads(backend)?;
        let mut chosen = Vec::new();
        for spec in specs {
            let w = match known.iter().find(|w| w.name == spec) {
                Some(w) => w.clone(),
                None if spec.contains('=') => custom_workload(task, backend, spec)?,
                None => bail!(
                    "`{spec}` is neither a {backend} workload of task {} ({}) nor an \
                     AXIS=VALUE list",
                    task.name(),
                    known
                        .iter()
                        .map(|w| w.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            if chosen.iter().any(|c: &ResolvedWorkload| c.name == w.name) {
                bail!("workload `{}` is listed twice", w.name);
            }
            chosen.push(w);
        }
        eval.workloads = chosen
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()?;
    }
    Ok(BenchRequest { eval, settings })
}

/// A workload from `AXIS=VALUE,...`, checked and resolved by the task like its own workloads.
fn custom_workload(task: &Task, backend: &str, spec: &str) -> Result<ResolvedWorkload> {
    let custom = CustomWorkload {
        name: spec.replace(' ', ""),
        params: task.parse_params(spec)?,
        held_out: false,
        dist: BTreeMap::new(),
    };
    Ok(task.resolve_workload(backend, &custom)?)
}

/// The peak a fraction is taken of: TFLOP/s by dtype, from a hardware profile.
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

fn peaks_for(catalog: &Catalog, wanted: Option<&str>, gpu: Option<&str>) -> Result<Peaks> {
    let profile = match (wanted, gpu) {
        (Some(name), _) => Some(
            catalog
                .hardware_profile(name)
                .with_context(|| format!("no hardware profile `{name}` in knowledge/hardware"))?,
        ),
        (None, Some(gpu)) => catalog.hardware_profile(gpu),
        (None, None) => None,
    };
    Ok(profile
        .map(|p| Peaks {
            profile: Some(p.name.clone()),
            tflops: p.peak_tflops.clone(),
        })
        .unwrap_or_default())
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
    s.push_str(&table(&rows));
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

/// Left-aligned first column, right-aligned numbers, columns two spaces apart.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|x| x.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut s = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c > 0 {
                line.push_str("  ");
            }
            let pad = widths[c] - cell.chars().count();
            // The first column and the last (check) read left to right; numbers line up right.
            if c == 0 || c + 1 == cols {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            }
        }
        s.push_str(line.trim_end());
        s.push('\n');
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

    fn attention() -> Task {
        ksearch_task::load_task(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tasks/attention"),
        )
        .unwrap()
    }

    fn seed(task: &Task, backend: &str) -> PathBuf {
        task.backend(backend).unwrap().seed.clone().unwrap()
    }

    fn request(backend: &str, shapes: &[&str]) -> Result<BenchRequest> {
        let task = attention();
        let shapes: Vec<String> = shapes.iter().map(|s| s.to_string()).collect();
        let kernel = seed(&task, if backend == "cpu" { "cuda" } else { backend });
        build_request(
            &task,
            backend,
            &kernel,
            &shapes,
            BenchSettings::default(),
            7,
            Duration::from_secs(900),
        )
    }

    #[test]
    fn the_request_carries_every_gpu_workload_and_the_settings() {
        let req = request("cuda", &[]).unwrap();
        let task = attention();
        assert_eq!(
            req.eval.workloads.len(),
            task.workloads("cuda").unwrap().len()
        );
        assert!(req.eval.workloads.iter().any(|w| w["held_out"] == true));
        assert_eq!(req.eval.timeout, Duration::from_secs(900));
        assert_eq!(
            req.eval.device.as_deref().map(|d| d.starts_with("gpu:")),
            Some(true)
        );
        let wire = req.to_wire("n1", Path::new("/tmp/b"));
        assert_eq!(wire["op"], "bench");
        assert_eq!(wire["nonce"], "n1");
        assert_eq!(wire["backend"], "cuda");
        assert_eq!(wire["task"]["entry"]["symbol"], "attention_{dtype}");
        assert_eq!(wire["candidate"]["language"], "cuda");
        assert_eq!(wire["bench"]["reps"], 20);
        assert_eq!(wire["bench"]["warmup"], 5);
        assert_eq!(wire["bench"]["compare"], json!(["sdpa", "mlx"]));
        assert_eq!(wire["timing"]["flush_bytes"], 256u64 << 20);
        assert_eq!(wire["timeout_s"], 900.0);
        assert_eq!(wire["tolerance"]["bf16"]["rtol"], 1.6e-2);
        let mlx = request("mlx", &[]).unwrap();
        assert_eq!(
            mlx.to_wire("n", Path::new("/b"))["task"]["entry"]["symbol"],
            "attention"
        );
    }

    #[test]
    fn shapes_select_workloads_or_make_new_ones() {
        let req = request("cuda", &["b1h32l4096d128-bf16; b3h4l100d64-f16"]).unwrap();
        let names: Vec<&str> = req
            .eval
            .workloads
            .iter()
            .map(|w| w["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["b1h32l4096d128-bf16", "b3h4l100d64-f16"]);

        let req = request("cuda", &["B=2, H=4, L=100, D=64, causal=1, dtype=bf16"]).unwrap();
        let w = &req.eval.workloads[0];
        assert_eq!(w["name"], "B=2,H=4,L=100,D=64,causal=1,dtype=bf16");
        assert_eq!(
            w["params"],
            json!({"B": 2, "D": 64, "H": 4, "L": 100, "causal": 1, "dtype": "bf16"})
        );
        assert_eq!(w["inputs"][0]["shape"], json!([2, 4, 100, 64]));
        assert_eq!(w["inputs"][0]["dtype"], "bf16");
        assert_eq!(w["inputs"][0]["dist"]["kind"], "normal");
        assert_eq!(w["outputs"][0]["dtype"], "bf16");
        assert_eq!(w["flops"], 4.0 * 2.0 * 4.0 * 100.0 * 100.0 * 64.0 / 2.0);
        assert_eq!(w["bytes"], 4.0 * 2.0 * 2.0 * 4.0 * 100.0 * 64.0);
        // The same numbers as the task's own resolution of that shape.
        let task = attention();
        let own = task
            .workloads("cuda")
            .unwrap()
            .into_iter()
            .find(|w| w.name == "b3h4l100d64-f16")
            .unwrap();
        let req = request("cuda", &["B=3,H=4,L=100,D=64,causal=0,dtype=f16"]).unwrap();
        let made: ResolvedWorkload = serde_json::from_value(req.eval.workloads[0].clone()).unwrap();
        assert_eq!(
            (
                made.inputs,
                made.outputs,
                made.flops,
                made.bytes,
                made.params
            ),
            (own.inputs, own.outputs, own.flops, own.bytes, own.params)
        );
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let err =
            |backend: &str, shapes: &[&str]| request(backend, shapes).unwrap_err().to_string();
        assert!(err("cpu", &[]).contains("GPU backends"));
        assert!(err("cuda", &["b9h9"]).contains("neither"));
        assert!(err("cuda", &["B=1,H=1,L=8,D=64,causal=0"]).contains("`dtype`"));
        assert!(err("cuda", &["B=1,H=1,L=8,causal=0,dtype=f16"]).contains("axis `D`"));
        assert!(
            err("cuda", &["B=1,H=1,L=8,D=64,causal=0,dtype=f16,X=2"]).contains("unknown axis `X`")
        );
        assert!(err("cuda", &["B=x,H=1,L=8,D=64,causal=0,dtype=f16"]).contains("not an integer"));
        assert!(err("cuda", &["B=0,H=1,L=8,D=64,causal=0,dtype=f16"])
            .contains("`B` = 0; a dimension must be positive"));
        // The task's checks apply to a shape as to the task's own workloads: what the cuda
        // kernels may assume, and an integer draw for integer inputs.
        assert!(err("cuda", &["B=1,H=1,L=8,D=96,causal=0,dtype=f16"])
            .contains("D = 96 breaks what kernels may assume"));
        assert!(err("cuda", &["B=1,H=1,L=8,D=64,causal=0,dtype=i32"])
            .contains("integer input `q` (i32) needs a `rand_int` or `custom` dist"));
        assert!(err("cuda", &["b3h4l100d64-f16", "b3h4l100d64-f16"]).contains("twice"));
        let task = attention();
        let e = build_request(
            &task,
            "cuda",
            Path::new("/no/such.cu"),
            &[],
            BenchSettings::default(),
            1,
            Duration::from_secs(1),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("/no/such.cu"), "{e}");
    }

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
