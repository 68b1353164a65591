//! `ksearch bench mamba`: mamba-370m end to end — prefill tokens/s at several lengths and
//! decode tokens/s — for ksearch (mlx-lm's model with our selective scan in place of its
//! per-token loop), stock mlx-lm and mambapy, on random weights or a local checkpoint. The
//! measuring is `gpu/mamba/bench.py` (shipped in the binary: ksearch_assets::Tree::MambaBench)
//! run by the harness interpreter chosen for the mlx backend; this module handles the arguments,
//! launches it, and renders its JSON (schema `ksearch-bench-mamba/1`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Deserialize;

use crate::bench::BenchArgs;
use crate::exit;

/// The TASK argument of `ksearch bench` that selects the whole-model Mamba bench.
pub const TASK: &str = "mamba";

const SCHEMA: &str = "ksearch-bench-mamba/1";
/// bench.py's exit status when our logits disagree with stock mlx-lm's.
const CHECK_FAILED: i32 = 3;
/// Where render.py (beside bench.py) finds the tasks tree: it may run from the cache, where
/// the tree is not its grandparent as in a checkout.
const TASKS_DIR_VAR: &str = "KSEARCH_TASKS_DIR";

/// Options of `ksearch bench mamba` (the rest of `ksearch bench`'s: --kernel, --run,
/// --runs-dir, --timeout, --json).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Whole model (TASK = mamba)")]
pub struct MambaArgs {
    /// mamba: a local mamba-*-hf directory (config.json, *.safetensors); default: random
    /// weights with Mamba's initialisation.
    #[arg(long, value_name = "DIR")]
    pub weights: Option<PathBuf>,

    /// mamba: prompt lengths for prefill tokens/s.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "512,1024,2048,4096",
        value_name = "L,.."
    )]
    pub lengths: Vec<u32>,

    /// mamba: tokens decoded (after a warm-up) for decode tokens/s.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub decode_tokens: u32,

    /// mamba: implementations to measure.
    #[arg(long, value_delimiter = ',', default_value = "ksearch,mlx-lm,mambapy",
          value_parser = ["ksearch", "mlx-lm", "mambapy"])]
    pub impls: Vec<String>,

    /// mamba: a named setting of gpu/mamba/variants.toml as our scan (default: the family's
    /// pick; --kernel or --run give a search's kernel instead).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["kernel", "run"])]
    pub variant: Option<String>,

    /// mamba: also time the scan alone, per layer, against its memory floor.
    #[arg(long)]
    pub kernel_only: bool,

    /// mamba: skip a stock mlx-lm length whose estimated time (from the previous length's
    /// rate) exceeds this many seconds; its per-token loop runs ~150 tok/s.
    #[arg(long, default_value_t = 120.0, value_name = "SECONDS")]
    pub stock_budget: f64,

    /// mamba: how the MLX implementations' decode loops wait: pipelined (as mlx_lm.generate,
    /// the next step queued before this token is read) or sync (each step evaluated first).
    #[arg(long, default_value = "pipelined", value_parser = ["pipelined", "sync"])]
    pub decode_loop: String,

    /// mamba: also keep the JSON report at this path (the table still goes to stdout).
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,

    /// mamba: MLX's launch settings for the whole bench, so for every MLX implementation:
    /// `defaults` (MLX's own), or `auto`: gpu/mamba/mlx_env_probe.py first measures MLX's cost
    /// per primitive under each setting (CUDA graphs on or off, nodes per graph), each in a
    /// fresh process, and the bench runs under the cheapest. The report prints the settings.
    #[arg(long, default_value = "defaults", value_parser = ["defaults", "auto"])]
    pub mlx_settings: String,
}

/// What the probe's report says to do to the bench's environment: the variables it varies
/// (`controls`, to clear: its measurements ran without the caller's values of them) and the
/// MLX_* values of its pick (`best` names one of `rows`, each with its `env`). Only MLX_* names
/// with plain values are taken.
struct ProbePick {
    controls: Vec<String>,
    env: Vec<(String, String)>,
}

fn probe_pick(report: &str) -> Result<ProbePick> {
    let v: serde_json::Value =
        serde_json::from_str(report).context("unreadable report of the MLX settings probe")?;
    let best = v["best"]
        .as_str()
        .context("the MLX settings probe measured no setting")?;
    let row = v["rows"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["label"].as_str() == Some(best)))
        .with_context(|| format!("the probe's pick `{best}` is not among its rows"))?;
    let plain = |t: &str| t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let mut controls = Vec::new();
    for c in v["controls"]
        .as_array()
        .context("the probe's report lists no `controls`")?
    {
        let c = c.as_str().unwrap_or_default();
        if !c.starts_with("MLX_") || !plain(c) {
            bail!("the probe controls an unexpected variable {c:?}");
        }
        controls.push(c.to_string());
    }
    let settings = row["env"]
        .as_object()
        .with_context(|| format!("the probe's pick `{best}` has no `env` object"))?;
    let mut env = Vec::new();
    for (k, val) in settings {
        let val = val
            .as_str()
            .with_context(|| format!("setting {k} is not a string"))?;
        if !k.starts_with("MLX_") || !plain(k) || !plain(val) {
            bail!("the probe named an unexpected setting {k}={val}");
        }
        env.push((k.clone(), val.to_string()));
    }
    Ok(ProbePick { controls, env })
}

/// `ksearch bench mamba ...`; `args` are `ksearch bench`'s with TASK = mamba.
pub fn run(args: &BenchArgs, quiet: bool) -> Result<u8> {
    let m = &args.mamba;
    if !args.shapes.is_empty() || args.backend.is_some() || args.hardware.is_some() {
        bail!("`ksearch bench mamba` takes neither --shapes, --backend nor --hardware (it runs the whole model on MLX)");
    }
    if m.lengths.is_empty() || m.lengths.contains(&0) {
        bail!("--lengths needs positive prompt lengths");
    }
    if m.impls.is_empty() {
        bail!("--impls needs at least one implementation");
    }
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        bail!("--timeout must be a positive number of seconds");
    }
    let kernel = match (&args.kernel, &args.run) {
        (Some(k), _) => {
            if !k.is_file() {
                bail!("kernel file {} does not exist", k.display());
            }
            Some(k.clone())
        }
        (None, Some(run)) => Some(kernel_of_run(&args.runs_dir, run)?),
        (None, None) => None,
    };
    if let Some(w) = &m.weights {
        if !w.join("config.json").is_file() {
            bail!(
                "{} has no config.json (expected a mamba-*-hf checkout)",
                w.display()
            );
        }
    }
    let (script, tasks) = bench_script()?;
    let python = ksearch_eval::harness_env::resolve_for(Some("mlx"))
        .context("cannot set up the Python environment (try `ksearch doctor`)")?
        .python;
    let out = tempfile_path()?;
    let argv = script_args(args, kernel.as_deref(), &out.path);
    if !quiet {
        eprintln!(
            "ksearch: bench mamba ({}) with {}",
            m.impls.join(", "),
            python.display()
        );
    }
    let mut cmd = Command::new(&python);
    cmd.arg(&script).args(&argv).env(TASKS_DIR_VAR, &tasks);
    if m.mlx_settings == "auto" {
        let probe = script.with_file_name("mlx_env_probe.py");
        let report = tempfile_path()?;
        let status = run_with_timeout(
            Command::new(&python)
                .env(TASKS_DIR_VAR, &tasks)
                .arg(&probe)
                .arg("--json")
                .arg(&report.path),
            Duration::from_secs_f64(args.timeout.min(300.0)),
            quiet,
        )?;
        let text = std::fs::read_to_string(&report.path).with_context(|| {
            format!(
                "{} wrote no report ({})",
                probe.display(),
                describe_status(status)
            )
        })?;
        let pick = probe_pick(&text)?;
        for c in &pick.controls {
            cmd.env_remove(c);
        }
        let env = pick.env;
        if !quiet {
            let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            eprintln!(
                "ksearch: MLX settings for the bench: {}",
                if shown.is_empty() {
                    "MLX's defaults".to_string()
                } else {
                    shown.join(" ")
                }
            );
        }
        cmd.envs(env);
    }
    let status = run_with_timeout(&mut cmd, Duration::from_secs_f64(args.timeout), quiet)?;
    let text = std::fs::read_to_string(&out.path).with_context(|| {
        format!(
            "{} wrote no result ({})",
            script.display(),
            describe_status(status)
        )
    })?;
    let report: Report = serde_json::from_str(&text)
        .with_context(|| format!("unreadable result of {}", script.display()))?;
    if report.schema != SCHEMA {
        bail!(
            "{} speaks {:?}, this ksearch reads {SCHEMA:?}",
            script.display(),
            report.schema
        );
    }
    if let Some(path) = &m.save {
        std::fs::write(path, &text)
            .with_context(|| format!("cannot write the report to {}", path.display()))?;
    }
    if args.json {
        let value: serde_json::Value = serde_json::from_str(&text)?;
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{}", render(&report));
    }
    match status {
        Some(0) if report.check.passed => Ok(exit::OK),
        Some(CHECK_FAILED) | Some(0) => Ok(exit::REJECTED),
        other => bail!("{} failed ({})", script.display(), describe_status(other)),
    }
}

/// The best kernel of a finished selective-scan run on the mlx backend.
fn kernel_of_run(runs_dir: &Path, run: &str) -> Result<PathBuf> {
    let (task, path, backend) = crate::bench::best_of_run(runs_dir, run)?;
    if task.kind() != "selective-scan" || backend != "mlx" {
        bail!(
            "run {run} searched {} on {backend}; `ksearch bench mamba` needs a selective-scan kernel for mlx",
            task.kind()
        );
    }
    Ok(path)
}

/// bench.py of the bench's Python (`gpu/mamba` of `KSEARCH_ROOT` or of the checkout ksearch was
/// built from, else the copy embedded in the binary, extracted into the cache), and the tasks
/// tree its renderer reads the selective-scan templates from.
fn bench_script() -> Result<(PathBuf, PathBuf)> {
    use ksearch_assets::{locate, Tree};
    let dir = locate(Tree::MambaBench).context("cannot locate the Mamba bench's Python")?;
    let tasks = locate(Tree::Tasks).context("cannot locate the built-in tasks")?;
    let script = dir.join("bench.py");
    if !script.is_file() {
        bail!("{} is missing", script.display());
    }
    Ok((script, tasks))
}

fn script_args(args: &BenchArgs, kernel: Option<&Path>, out: &Path) -> Vec<String> {
    let m = &args.mamba;
    let join = |v: Vec<String>| v.join(",");
    let mut argv = vec![
        "--out".to_string(),
        out.display().to_string(),
        "--lengths".into(),
        join(m.lengths.iter().map(u32::to_string).collect()),
        "--decode-tokens".into(),
        m.decode_tokens.to_string(),
        "--impls".into(),
        join(m.impls.clone()),
        "--stock-budget".into(),
        m.stock_budget.to_string(),
        "--decode-loop".into(),
        m.decode_loop.clone(),
    ];
    if let Some(k) = kernel {
        argv.extend(["--kernel".into(), k.display().to_string()]);
    }
    if let Some(v) = &m.variant {
        argv.extend(["--variant".into(), v.clone()]);
    }
    if let Some(w) = &m.weights {
        argv.extend(["--weights".into(), w.display().to_string()]);
    }
    if m.kernel_only {
        argv.push("--kernel-only".into());
    }
    argv
}

/// A file path that is removed when dropped.
struct TempPath {
    path: PathBuf,
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn tempfile_path() -> Result<TempPath> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let path = std::env::temp_dir().join(format!(
        "ksearch-bench-mamba-{}-{nanos}.json",
        std::process::id()
    ));
    Ok(TempPath { path })
}

/// Runs the child (stderr shown unless quiet) and kills it after `timeout`; its exit code, or
/// None when it died of a signal.
fn run_with_timeout(cmd: &mut Command, timeout: Duration, quiet: bool) -> Result<Option<i32>> {
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    if quiet {
        cmd.stderr(Stdio::null());
    }
    let mut child = cmd.spawn().context("cannot start the bench's Python")?;
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status.code());
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the bench ran past --timeout ({:.0} s) and was stopped",
                timeout.as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn describe_status(status: Option<i32>) -> String {
    match status {
        Some(c) => format!("exit status {c}"),
        None => "killed by a signal".to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// The report (the fields this module renders; bench.py writes more).

#[derive(Debug, Deserialize)]
struct Report {
    schema: String,
    model: Model,
    kernel: KernelInfo,
    lengths: Vec<u32>,
    decode_tokens: u32,
    check: Check,
    #[serde(default)]
    rows: Vec<Row>,
    #[serde(default)]
    targets: Option<Targets>,
    #[serde(default)]
    kernel_only: Option<Vec<KernelOnly>>,
    #[serde(default)]
    bandwidth_gbs: Option<f64>,
    #[serde(default)]
    mlx_launch_overhead: Option<LaunchOverhead>,
    #[serde(default)]
    versions: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct Model {
    name: String,
    d_model: u64,
    n_layer: u64,
    vocab: u64,
    d_inner: u64,
    d_state: u64,
    dtype: String,
    weights: String,
}

#[derive(Debug, Deserialize)]
struct KernelInfo {
    source: String,
    #[serde(default)]
    knobs: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    channel_last: Option<bool>,
    #[serde(default)]
    compiled: Option<bool>,
    #[serde(default)]
    compile_error: Option<String>,
    /// `--variant auto`: the setting timed fastest per scan length.
    #[serde(default)]
    tuning: Option<Tuning>,
    /// How a single token goes through a block (bench.py --model-kernels).
    #[serde(default)]
    decode_path: Option<String>,
    /// Paths of `--model-kernels auto` that failed here, before the one used.
    #[serde(default)]
    fallbacks: Vec<Fallback>,
    /// `--model-kernels auto`: decode tok/s of every path that passed, and the one used.
    #[serde(default)]
    decode_tuning: Option<DecodeTuning>,
}

#[derive(Debug, Deserialize)]
struct DecodeTuning {
    tok_s: std::collections::BTreeMap<String, f64>,
    pick: String,
}

#[derive(Debug, Deserialize)]
struct Fallback {
    mode: String,
    problem: String,
}

/// MLX's cost per primitive when the work is negligible (what bounds decode).
#[derive(Debug, Deserialize)]
struct LaunchOverhead {
    compiled_us_per_op: f64,
    eager_us_per_op: f64,
}

#[derive(Debug, Deserialize)]
struct Tuning {
    picks: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct Check {
    passed: bool,
    positions: u64,
    max_rel_diff: f64,
    #[serde(default)]
    max_state_rel_diff: Option<f64>,
    tolerance: f64,
    #[serde(default)]
    state_tolerance: Option<f64>,
    argmax_agreement: f64,
}

#[derive(Debug, Deserialize)]
struct Row {
    #[serde(rename = "impl")]
    name: String,
    #[serde(default)]
    prefill_tok_s: std::collections::BTreeMap<String, f64>,
    #[serde(default)]
    decode_tok_s: Option<f64>,
    #[serde(default)]
    skipped: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    notes: Vec<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Targets {
    prefill_512: f64,
    prefill_4096: f64,
    decode: f64,
}

#[derive(Debug, Deserialize)]
struct KernelOnly {
    #[serde(rename = "L")]
    l: u32,
    us_per_layer: f64,
    floor_us: f64,
    fraction_of_floor: f64,
    #[serde(default)]
    share_of_ksearch_prefill: Option<f64>,
}

/// Thousands separators, no decimals from 100 up; two significant decimals below.
fn rate(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    if v < 100.0 {
        return format!("{v:.1}");
    }
    let digits = format!("{:.0}", v);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn render(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let m = &r.model;
    let _ = writeln!(
        s,
        "{}: {} layers, d_model {}, d_inner {}, d_state {}, vocab {}; weights: {}; {}",
        m.name, m.n_layer, m.d_model, m.d_inner, m.d_state, m.vocab, m.weights, m.dtype
    );
    let c = &r.check;
    let _ = writeln!(
        s,
        "check against stock mlx-lm ({} positions): logits max rel diff {:.1e} (tolerance {:.0e}){}; argmax agreement {:.1}%: {}",
        c.positions,
        c.max_rel_diff,
        c.tolerance,
        match (c.max_state_rel_diff, c.state_tolerance) {
            (Some(v), Some(t)) => format!(", states {v:.1e} ({t:.0e})"),
            (Some(v), None) => format!(", states {v:.1e}"),
            _ => String::new(),
        },
        100.0 * c.argmax_agreement,
        if c.passed { "passed" } else { "FAILED" }
    );
    let k = &r.kernel;
    let mut scan = format!("scan: {}", k.source);
    if let Some(knobs) = &k.knobs {
        let list: Vec<String> = knobs
            .iter()
            .map(|(n, v)| format!("{n}={}", v.to_string().trim_matches('"')))
            .collect();
        let _ = write!(scan, " ({})", list.join(" "));
    }
    if let Some(cl) = k.channel_last {
        scan.push_str(if cl {
            ", channel-last"
        } else {
            ", [batch, dim, L] via transposes"
        });
    }
    match (k.compiled, &k.compile_error) {
        (_, Some(e)) => {
            let _ = write!(scan, ", uncompiled ({e})");
        }
        (Some(true), None) => scan.push_str(", mx.compile"),
        (Some(false), None) => scan.push_str(", uncompiled"),
        (None, None) => {}
    }
    if let Some(t) = &k.tuning {
        let mut picks: Vec<(u64, &String)> = t
            .picks
            .iter()
            .filter_map(|(l, v)| l.parse().ok().map(|l| (l, v)))
            .collect();
        picks.sort();
        let list: Vec<String> = picks.iter().map(|(l, v)| format!("L={l} {v}")).collect();
        let _ = write!(scan, "; tuned here: {}", list.join(", "));
    }
    if let Some(path) = &k.decode_path {
        let _ = write!(scan, "; decode: {path}");
    }
    let _ = writeln!(s, "{scan}");
    for f in &k.fallbacks {
        let problem: String = f.problem.chars().take(160).collect();
        let _ = writeln!(s, "  not used: model kernels `{}` ({problem})", f.mode);
    }
    if let Some(t) = &k.decode_tuning {
        let list: Vec<String> = t.tok_s.iter().map(|(m, v)| format!("{m} {v:.0}")).collect();
        let _ = writeln!(
            s,
            "  decode paths timed here (tok/s): {}; using {}",
            list.join(", "),
            t.pick
        );
    }
    let versions: Vec<String> = ["mlx", "mlx_lm", "mambapy", "torch", "gpu"]
        .iter()
        .filter_map(|key| {
            r.versions
                .get(*key)
                .and_then(|v| v.as_str())
                .map(|v| format!("{key} {v}"))
        })
        .collect();
    if !versions.is_empty() {
        let _ = writeln!(s, "{}", versions.join(", "));
    }
    // MLX's launch settings move every MLX row, so they are printed with the versions.
    if let Some(env) = r.versions.get("mlx_env").and_then(|v| v.as_object()) {
        if !env.is_empty() {
            let list: Vec<String> = env
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("?")))
                .collect();
            let _ = writeln!(s, "MLX settings: {}", list.join(" "));
        }
    }
    if !c.passed {
        let _ = writeln!(
            s,
            "\nnot reported: our model does not reproduce stock mlx-lm's output on the same weights"
        );
        return s;
    }

    // The table: rows = implementations, columns = prefill at each L, then decode.
    let mut header = vec!["tokens/s".to_string()];
    header.extend(r.lengths.iter().enumerate().map(|(i, l)| {
        if i == 0 {
            format!("prefill L={l}")
        } else {
            format!("L={l}")
        }
    }));
    header.push(format!("decode ({})", r.decode_tokens));
    let mut table = vec![header];
    let mut footnotes = Vec::new();
    for row in &r.rows {
        let mut line = vec![row.name.clone()];
        for l in &r.lengths {
            let key = l.to_string();
            line.push(match (row.prefill_tok_s.get(&key), row.skipped.get(&key)) {
                (Some(v), _) => rate(*v),
                (None, Some(why)) => {
                    footnotes.push(format!("{} L={l}: skipped, {why}", row.name));
                    "skipped".into()
                }
                (None, None) => "-".into(),
            });
        }
        line.push(row.decode_tok_s.map(rate).unwrap_or_else(|| "-".into()));
        if let Some(e) = &row.error {
            footnotes.push(format!("{}: {e}", row.name));
        }
        for n in &row.notes {
            footnotes.push(format!("{}: {n}", row.name));
        }
        table.push(line);
    }
    let widths: Vec<usize> = (0..table[0].len())
        .map(|col| table.iter().map(|r| r[col].len()).max().unwrap_or(0))
        .collect();
    s.push('\n');
    for line in &table {
        let cells: Vec<String> = line
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                if i == 0 {
                    format!("{cell:<w$}", w = widths[i])
                } else {
                    format!("{cell:>w$}", w = widths[i])
                }
            })
            .collect();
        let _ = writeln!(s, "{}", cells.join("  ").trim_end());
    }

    // Speed-ups of ksearch over the others, where both were measured.
    let ours = r.rows.iter().find(|row| row.name == "ksearch");
    if let Some(ours) = ours {
        for other in r.rows.iter().filter(|row| row.name != "ksearch") {
            let mut parts = Vec::new();
            for l in &r.lengths {
                let key = l.to_string();
                if let (Some(a), Some(b)) =
                    (ours.prefill_tok_s.get(&key), other.prefill_tok_s.get(&key))
                {
                    parts.push(format!("L={l} {:.1}x", a / b));
                }
            }
            if let (Some(a), Some(b)) = (ours.decode_tok_s, other.decode_tok_s) {
                parts.push(format!("decode {:.1}x", a / b));
            }
            if !parts.is_empty() {
                let _ = writeln!(s, "ksearch / {}: {}", other.name, parts.join(", "));
            }
        }
    }
    if let (Some(t), Some(ours)) = (&r.targets, ours) {
        let verdict = |got: Option<f64>, want: f64| match got {
            Some(v) if v >= want => "met",
            Some(_) => "not met",
            None => "not measured",
        };
        let _ = writeln!(
            s,
            "targets: prefill >= {} tok/s at L=512 ({}), >= {} at L=4096 ({}); decode >= {} ({})",
            rate(t.prefill_512),
            verdict(ours.prefill_tok_s.get("512").copied(), t.prefill_512),
            rate(t.prefill_4096),
            verdict(ours.prefill_tok_s.get("4096").copied(), t.prefill_4096),
            rate(t.decode),
            verdict(ours.decode_tok_s, t.decode)
        );
    }
    if let Some(rows) = &r.kernel_only {
        let bw = r
            .bandwidth_gbs
            .map(|b| format!(" at {b:.0} GB/s"))
            .unwrap_or_default();
        let _ = writeln!(s, "\nscan alone, per layer (memory floor{bw}):");
        for k in rows {
            let share = k
                .share_of_ksearch_prefill
                .map(|v| format!("; all layers: {:.0}% of ksearch's prefill", 100.0 * v))
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "  L={:<5} {:>9.1} us  floor {:>7.1} us  {:>5.1}% of the floor{share}",
                k.l,
                k.us_per_layer,
                k.floor_us,
                100.0 * k.fraction_of_floor
            );
        }
    }
    if let Some(o) = &r.mlx_launch_overhead {
        let _ = writeln!(
            s,
            "MLX cost per primitive with negligible work: {:.1} us compiled, {:.1} us eager",
            o.compiled_us_per_op, o.eager_us_per_op
        );
    }
    if !footnotes.is_empty() {
        s.push('\n');
        for f in footnotes {
            let _ = writeln!(s, "{f}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = include_str!("../../../gpu/mamba/tests/fixtures/bench_mamba.json");

    fn fixture() -> Report {
        serde_json::from_str(FIXTURE).expect("the fixture parses")
    }

    #[test]
    fn the_table_from_a_fixture() {
        insta::assert_snapshot!(render(&fixture()), @r#"
        mamba-370m: 48 layers, d_model 1024, d_inner 2048, d_state 16, vocab 50280; weights: random (seed 0); float16
        check against stock mlx-lm (72 positions): logits max rel diff 6.1e-3 (tolerance 2e-2), states 1.3e-2 (5e-2); argmax agreement 98.6%: passed
        scan: family, channel-last, mx.compile; tuned here: L=512 tiled_c16_t256, L=2048 tiled_c16_t256; decode: conv and step kernels
          not used: model kernels `fused` (RuntimeError: made up for the renderer test)
          decode paths timed here (tok/s): conv 412, layer 299; using conv
        mlx 0.32.4, mlx_lm 0.32.2, mambapy 1.2.0, torch 2.11.0, gpu fixture GPU (numbers made up for the renderer test)
        MLX settings: MLX_USE_CUDA_GRAPHS=0

        tokens/s  prefill L=512  L=1024   L=2048   L=4096  decode (64)
        ksearch          61,234  98,765  120,001  131,073          412
        mlx-lm              151     149      147  skipped         91.3
        mambapy           1,102   2,204    3,990    6,021         40.4
        ksearch / mlx-lm: L=512 405.0x, L=1024 663.3x, L=2048 816.3x, decode 4.5x
        ksearch / mambapy: L=512 55.6x, L=1024 44.8x, L=2048 30.1x, L=4096 21.8x, decode 10.2x
        targets: prefill >= 50,000 tok/s at L=512 (met), >= 100,000 at L=4096 (met); decode >= 300 (met)

        scan alone, per layer (memory floor at 4301 GB/s):
          L=512        21.5 us  floor     2.0 us    9.1% of the floor; all layers: 12% of ksearch's prefill
          L=4096      101.7 us  floor    15.7 us   15.4% of the floor; all layers: 16% of ksearch's prefill
        MLX cost per primitive with negligible work: 6.5 us compiled, 11.2 us eager

        ksearch: one mx.compile'd forward; prompt in pieces of 2048
        mlx-lm L=4096: skipped, estimated 28 s > budget 20 s
        mlx-lm: one run per length (its per-token loop); prompt in pieces of 2048
        mambapy: torch 2.11.0 on cuda, f16 autocast
        "#);
    }

    #[test]
    fn a_failed_check_reports_no_numbers() {
        let mut r = fixture();
        r.check.passed = false;
        r.check.max_rel_diff = 0.31;
        let text = render(&r);
        assert!(text.contains("FAILED"), "{text}");
        assert!(text.contains("not reported"), "{text}");
        assert!(!text.contains("tokens/s"), "{text}");
    }

    #[test]
    fn the_probe_pick_becomes_mlx_variables_and_nothing_else() {
        let report = |best: &str, env: &str| {
            format!(
                r#"{{"best": {best}, "controls": ["MLX_MAX_OPS_PER_BUFFER", "MLX_USE_CUDA_GRAPHS"],
                   "rows": [{{"label": "defaults", "env": {{}}}},
                   {{"label": "graph-5", "env": {env}}}]}}"#
            )
        };
        let pick = probe_pick(&report(
            r#""graph-5""#,
            r#"{"MLX_MAX_OPS_PER_BUFFER": "5"}"#,
        ));
        let pick = pick.unwrap();
        assert_eq!(
            pick.env,
            vec![("MLX_MAX_OPS_PER_BUFFER".to_string(), "5".to_string())]
        );
        assert_eq!(pick.controls.len(), 2);
        let defaults = probe_pick(&report(r#""defaults""#, "{}")).unwrap();
        assert!(defaults.env.is_empty());
        for bad in [
            report("null", "{}"),
            report(r#""graph-9""#, "{}"),
            report(r#""graph-5""#, r#"{"LD_PRELOAD": "x.so"}"#),
            report(r#""graph-5""#, r#"{"MLX_X": "1; rm -rf /"}"#),
            report(r#""graph-5""#, "null"),
            report(r#""graph-5""#, "{}").replace("MLX_USE_CUDA_GRAPHS", "LD_PRELOAD"),
            report(r#""graph-5""#, "{}").replace(r#""controls""#, r#""other""#),
            "not json".to_string(),
        ] {
            assert!(probe_pick(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rates_are_grouped_and_small_ones_keep_a_decimal() {
        assert_eq!(rate(147.04), "147");
        assert_eq!(rate(1_234_567.4), "1,234,567");
        assert_eq!(rate(91.26), "91.3");
        assert_eq!(rate(f64::NAN), "-");
    }

    #[test]
    fn script_arguments_follow_the_options() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let cli = Cli::parse_from([
            "ksearch",
            "mamba",
            "--lengths",
            "512,4096",
            "--impls",
            "ksearch,mlx-lm",
            "--variant",
            "s3_items",
            "--kernel-only",
            "--decode-tokens",
            "32",
            "--stock-budget",
            "15",
            "--decode-loop",
            "sync",
        ]);
        let argv = script_args(&cli.bench, None, Path::new("/tmp/o.json"));
        assert_eq!(
            argv,
            [
                "--out",
                "/tmp/o.json",
                "--lengths",
                "512,4096",
                "--decode-tokens",
                "32",
                "--impls",
                "ksearch,mlx-lm",
                "--stock-budget",
                "15",
                "--decode-loop",
                "sync",
                "--variant",
                "s3_items",
                "--kernel-only"
            ]
        );
        let with_kernel = script_args(&cli.bench, Some(Path::new("k.py")), Path::new("o"));
        assert!(with_kernel.windows(2).any(|w| w == ["--kernel", "k.py"]));
        // --variant names a family setting; it cannot be combined with a kernel.
        assert!(
            Cli::try_parse_from(["ksearch", "mamba", "--variant", "x", "--kernel", "k.py"])
                .is_err()
        );
        assert!(Cli::try_parse_from(["ksearch", "mamba", "--impls", "torch"]).is_err());
        assert!(Cli::try_parse_from(["ksearch", "mamba", "--decode-loop", "async"]).is_err());
    }

    #[test]
    fn the_fixture_is_the_current_schema() {
        assert_eq!(fixture().schema, SCHEMA);
    }
}
