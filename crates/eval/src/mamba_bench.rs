//! `ksearch bench mamba`: mamba-370m end to end — prefill tokens/s at several lengths and
//! decode tokens/s — for ksearch (mlx-lm's model with our selective scan in place of its
//! per-token loop), stock mlx-lm and mambapy, on random weights or a local checkpoint. The
//! measuring is `gpu/mamba/bench.py` (shipped in the binary: ksearch_assets::Tree::MambaBench),
//! run by the interpreter the caller chose; this module checks the options, launches the script
//! (and, for `--mlx-settings auto`, `mlx_env_probe.py` first), reads its JSON report (schema
//! `ksearch-bench-mamba/1`) and renders it.

use crate::report::{Align, Table};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use wait_timeout::ChildExt;

/// The report's schema this ksearch reads.
pub const SCHEMA: &str = "ksearch-bench-mamba/1";
/// bench.py's exit status when our logits disagree with stock mlx-lm's.
const CHECK_FAILED: i32 = 3;
/// The ksearch binary that ksearch_render.py (the bench's client of `ksearch tasks --render`)
/// asks for the selective-scan family's renders: the running one, so the bench measures what
/// this ksearch renders, installed or not.
const BIN_VAR: &str = "KSEARCH_BIN";
/// The longest the MLX settings probe may take, whatever the bench's own timeout.
// Three interleaved rounds of five settings, each a fresh process that starts MLX.
const PROBE_TIMEOUT: Duration = Duration::from_secs(600);

/// What can stop the Mamba bench before it has a report to show.
#[derive(Debug, thiserror::Error)]
pub enum MambaBenchError {
    /// Options that cannot make a bench (the message says which and why).
    #[error("{0}")]
    Options(String),
    #[error("cannot locate the {what}: {source}")]
    Locate {
        what: &'static str,
        source: ksearch_assets::AssetError,
    },
    #[error("{0} is missing")]
    ScriptMissing(PathBuf),
    #[error("cannot find the running ksearch binary (the bench's renderer asks it): {0}")]
    CurrentExe(std::io::Error),
    #[error("cannot prepare the bench's output file: {0}")]
    TempFile(std::io::Error),
    #[error("cannot start the bench's Python: {0}")]
    Spawn(std::io::Error),
    #[error("waiting for the bench's Python failed: {0}")]
    Wait(std::io::Error),
    #[error("the bench ran past --timeout ({0:.0} s) and was stopped")]
    Timeout(f64),
    #[error("{script} wrote no {what} ({status})")]
    NoOutput {
        script: PathBuf,
        what: &'static str,
        status: String,
    },
    #[error("unreadable result of {script}: {source}")]
    Unreadable {
        script: PathBuf,
        source: serde_json::Error,
    },
    #[error("{script} speaks {got:?}, this ksearch reads {SCHEMA:?}")]
    Schema { script: PathBuf, got: String },
    /// The MLX settings probe's report is unusable (the message says why).
    #[error("{0}")]
    Probe(String),
    #[error("{script} failed ({status})")]
    Failed { script: PathBuf, status: String },
}

type Result<T, E = MambaBenchError> = std::result::Result<T, E>;

/// What to measure: the options of `ksearch bench mamba`, passed on to bench.py.
#[derive(Debug, Clone, PartialEq)]
pub struct MambaOptions {
    /// A local mamba-*-hf directory; random weights when absent.
    pub weights: Option<PathBuf>,
    /// Prompt lengths for prefill tokens/s.
    pub lengths: Vec<u32>,
    /// Tokens decoded (after a warm-up) for decode tokens/s.
    pub decode_tokens: u32,
    /// Implementations to measure (`ksearch`, `mlx-lm`, `mambapy`).
    pub impls: Vec<String>,
    /// A named setting of gpu/mamba/variants.toml as our scan.
    pub variant: Option<String>,
    /// A search's kernel as our scan.
    pub kernel: Option<PathBuf>,
    /// Also time the scan alone, per layer.
    pub kernel_only: bool,
    /// Seconds above which a stock mlx-lm length is skipped.
    pub stock_budget: f64,
    /// `pipelined` or `sync`: how the MLX decode loops wait.
    pub decode_loop: String,
}

impl MambaOptions {
    /// Whether these options can make a bench: lengths and implementations given, the kernel
    /// and the weights' config.json present.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(MambaBenchError::Options(m));
        if self.lengths.is_empty() || self.lengths.contains(&0) {
            return bad("--lengths needs positive prompt lengths".into());
        }
        if self.impls.is_empty() {
            return bad("--impls needs at least one implementation".into());
        }
        if let Some(k) = self.kernel.as_ref().filter(|k| !k.is_file()) {
            return bad(format!("kernel file {} does not exist", k.display()));
        }
        if let Some(w) = &self.weights {
            if !w.join("config.json").is_file() {
                return bad(format!(
                    "{} has no config.json (expected a mamba-*-hf checkout)",
                    w.display()
                ));
            }
        }
        Ok(())
    }

    /// bench.py's arguments, writing its report to `out`.
    pub fn script_args(&self, out: &Path) -> Vec<String> {
        let mut argv = vec![
            "--out".to_string(),
            out.display().to_string(),
            "--lengths".into(),
            join(self.lengths.iter().map(u32::to_string)),
            "--decode-tokens".into(),
            self.decode_tokens.to_string(),
            "--impls".into(),
            join(self.impls.iter().cloned()),
            "--stock-budget".into(),
            self.stock_budget.to_string(),
            "--decode-loop".into(),
            self.decode_loop.clone(),
        ];
        if let Some(k) = &self.kernel {
            argv.extend(["--kernel".into(), k.display().to_string()]);
        }
        if let Some(v) = &self.variant {
            argv.extend(["--variant".into(), v.clone()]);
        }
        if let Some(w) = &self.weights {
            argv.extend(["--weights".into(), w.display().to_string()]);
        }
        if self.kernel_only {
            argv.push("--kernel-only".into());
        }
        argv
    }
}

fn join(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(",")
}

/// What the probe's report says to do to the bench's environment: the variables it varies
/// (`controls`, to clear: its measurements ran without the caller's values of them) and the
/// MLX_* values of its pick (`best` names one of `rows`, each with its `env`). Only MLX_* names
/// with plain values are taken.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbePick {
    pub controls: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl ProbePick {
    /// The pick of the probe's JSON report.
    pub fn parse(report: &str) -> Result<ProbePick> {
        let bad = |m: String| MambaBenchError::Probe(m);
        let v: serde_json::Value = serde_json::from_str(report)
            .map_err(|e| bad(format!("unreadable report of the MLX settings probe: {e}")))?;
        let best = v["best"]
            .as_str()
            .ok_or_else(|| bad("the MLX settings probe measured no setting".into()))?;
        let row = v["rows"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["label"].as_str() == Some(best)))
            .ok_or_else(|| bad(format!("the probe's pick `{best}` is not among its rows")))?;
        let plain = |t: &str| t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        let mut controls = Vec::new();
        for c in v["controls"]
            .as_array()
            .ok_or_else(|| bad("the probe's report lists no `controls`".into()))?
        {
            let c = c.as_str().unwrap_or_default();
            if !c.starts_with("MLX_") || !plain(c) {
                return Err(bad(format!(
                    "the probe controls an unexpected variable {c:?}"
                )));
            }
            controls.push(c.to_string());
        }
        let settings = row["env"]
            .as_object()
            .ok_or_else(|| bad(format!("the probe's pick `{best}` has no `env` object")))?;
        let mut env = Vec::new();
        for (k, val) in settings {
            let val = val
                .as_str()
                .ok_or_else(|| bad(format!("setting {k} is not a string")))?;
            if !k.starts_with("MLX_") || !plain(k) || !plain(val) {
                return Err(bad(format!(
                    "the probe named an unexpected setting {k}={val}"
                )));
            }
            env.push((k.clone(), val.to_string()));
        }
        Ok(ProbePick { controls, env })
    }

    /// The pick as the bench announces it: `NAME=VALUE ...`, or "MLX's defaults".
    pub fn describe(&self) -> String {
        if self.env.is_empty() {
            return "MLX's defaults".into();
        }
        let shown: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        shown.join(" ")
    }
}

/// Whether a search's best kernel can be our scan: it must be a selective-scan kernel for mlx
/// (`run` names the run in the message).
pub fn check_run_kernel(run: &str, kind: &str, backend: &str) -> Result<()> {
    if kind != "selective-scan" || backend != "mlx" {
        return Err(MambaBenchError::Options(format!(
            "run {run} searched {kind} on {backend}; `ksearch bench mamba` needs a selective-scan kernel for mlx"
        )));
    }
    Ok(())
}

/// The bench's scripts and the interpreter that runs them.
#[derive(Debug, Clone)]
pub struct MambaBench {
    script: PathBuf,
    ksearch: PathBuf,
    python: PathBuf,
}

/// One run of bench.py: its report as written (for `--save` and `--json`), as read, and the
/// script's exit status (None when a signal ended it).
#[derive(Debug)]
pub struct MambaRun {
    pub text: String,
    pub report: MambaReport,
    status: Option<i32>,
    script: PathBuf,
}

impl MambaRun {
    /// Ok(true) when the bench ran through and our model reproduced stock mlx-lm's output,
    /// Ok(false) when it did not reproduce it, Err when the script failed otherwise.
    pub fn passed(&self) -> Result<bool> {
        match self.status {
            Some(0) if self.report.check.passed => Ok(true),
            Some(CHECK_FAILED) | Some(0) => Ok(false),
            other => Err(MambaBenchError::Failed {
                script: self.script.clone(),
                status: describe_status(other),
            }),
        }
    }
}

impl MambaBench {
    /// bench.py of the bench's Python (`gpu/mamba` of `KSEARCH_ROOT` or of the checkout ksearch
    /// was built from, else the copy embedded in the binary, extracted into the cache), the
    /// running ksearch, which renders the selective-scan family for it, and `python` to run
    /// them (the harness interpreter for the mlx backend).
    pub fn locate(python: PathBuf) -> Result<MambaBench> {
        use ksearch_assets::{locate, Tree};
        let dir = locate(Tree::MambaBench).map_err(|source| MambaBenchError::Locate {
            what: "Mamba bench's Python",
            source,
        })?;
        let script = dir.join("bench.py");
        if !script.is_file() {
            return Err(MambaBenchError::ScriptMissing(script));
        }
        let ksearch = std::env::current_exe().map_err(MambaBenchError::CurrentExe)?;
        Ok(MambaBench {
            script,
            ksearch,
            python,
        })
    }

    pub fn python(&self) -> &Path {
        &self.python
    }

    /// Runs mlx_env_probe.py, which measures MLX's cost per primitive under each launch setting
    /// in a fresh process, and returns its pick (within `timeout`, at most 600 s).
    pub fn probe_mlx_settings(&self, timeout: Duration, show_output: bool) -> Result<ProbePick> {
        let probe = self.script.with_file_name("mlx_env_probe.py");
        let dir = temp_dir()?;
        let report = dir.path().join("probe.json");
        let status = run_with_timeout(
            Command::new(&self.python)
                .env(BIN_VAR, &self.ksearch)
                .arg(&probe)
                .arg("--json")
                .arg(&report),
            timeout.min(PROBE_TIMEOUT),
            show_output,
        )?;
        let text = std::fs::read_to_string(&report).map_err(|_| MambaBenchError::NoOutput {
            script: probe,
            what: "report",
            status: describe_status(status),
        })?;
        ProbePick::parse(&text)
    }

    /// Runs bench.py with `options` (its stderr shown when `show_output`), under the MLX
    /// settings of `pick` when given, and reads its report. A report with a failed check or a
    /// failing exit status is still returned: see [`MambaRun::passed`].
    pub fn run(
        &self,
        options: &MambaOptions,
        pick: Option<&ProbePick>,
        timeout: Duration,
        show_output: bool,
    ) -> Result<MambaRun> {
        let dir = temp_dir()?;
        let out = dir.path().join("report.json");
        let mut cmd = Command::new(&self.python);
        cmd.arg(&self.script)
            .args(options.script_args(&out))
            .env(BIN_VAR, &self.ksearch);
        if let Some(pick) = pick {
            for c in &pick.controls {
                cmd.env_remove(c);
            }
            cmd.envs(pick.env.iter().map(|(k, v)| (k, v)));
        }
        let status = run_with_timeout(&mut cmd, timeout, show_output)?;
        let script = self.script.clone();
        let text = match std::fs::read_to_string(&out) {
            Ok(text) => text,
            Err(_) => {
                return Err(MambaBenchError::NoOutput {
                    script,
                    what: "result",
                    status: describe_status(status),
                })
            }
        };
        let report: MambaReport =
            serde_json::from_str(&text).map_err(|source| MambaBenchError::Unreadable {
                script: script.clone(),
                source,
            })?;
        if report.schema != SCHEMA {
            return Err(MambaBenchError::Schema {
                script,
                got: report.schema,
            });
        }
        Ok(MambaRun {
            text,
            report,
            status,
            script,
        })
    }
}

/// A private directory for a script's output file, removed when dropped.
fn temp_dir() -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("ksearch-bench-mamba-")
        .tempdir()
        .map_err(MambaBenchError::TempFile)
}

/// Runs the child (stderr shown when `show_output`) and kills it after `timeout`; its exit
/// code, or None when it died of a signal.
fn run_with_timeout(
    cmd: &mut Command,
    timeout: Duration,
    show_output: bool,
) -> Result<Option<i32>> {
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    if !show_output {
        cmd.stderr(Stdio::null());
    }
    let mut child = cmd.spawn().map_err(MambaBenchError::Spawn)?;
    match child.wait_timeout(timeout).map_err(MambaBenchError::Wait)? {
        Some(status) => Ok(status.code()),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            Err(MambaBenchError::Timeout(timeout.as_secs_f64()))
        }
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

/// bench.py's report, as far as [`render`] shows it.
#[derive(Debug, Deserialize)]
pub struct MambaReport {
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
    tok_s: BTreeMap<String, f64>,
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
    picks: BTreeMap<String, String>,
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
    prefill_tok_s: BTreeMap<String, f64>,
    #[serde(default)]
    decode_tok_s: Option<f64>,
    #[serde(default)]
    skipped: BTreeMap<String, String>,
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

/// The report as text: the model, the check against stock mlx-lm, the scan used, versions and
/// MLX settings, then (when the check passed) tokens/s per implementation and length, the
/// speed-ups of ksearch, the targets, the scan alone and footnotes.
pub fn render(r: &MambaReport) -> String {
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
    let align = |c: usize, _| if c == 0 { Align::Left } else { Align::Right };
    s.push('\n');
    s.push_str(&Table::from_rows(&table, align).render());

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

    fn fixture() -> MambaReport {
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
        let pick = ProbePick::parse(&report(
            r#""graph-5""#,
            r#"{"MLX_MAX_OPS_PER_BUFFER": "5"}"#,
        ));
        let pick = pick.unwrap();
        assert_eq!(
            pick.env,
            vec![("MLX_MAX_OPS_PER_BUFFER".to_string(), "5".to_string())]
        );
        assert_eq!(pick.controls.len(), 2);
        assert_eq!(pick.describe(), "MLX_MAX_OPS_PER_BUFFER=5");
        let defaults = ProbePick::parse(&report(r#""defaults""#, "{}")).unwrap();
        assert!(defaults.env.is_empty());
        assert_eq!(defaults.describe(), "MLX's defaults");
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
            assert!(ProbePick::parse(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_a_selective_scan_kernel_for_mlx_is_benched() {
        assert!(check_run_kernel("r1", "selective-scan", "mlx").is_ok());
        let err = check_run_kernel("r1", "attention", "cuda").unwrap_err();
        assert_eq!(
            err.to_string(),
            "run r1 searched attention on cuda; `ksearch bench mamba` needs a selective-scan kernel for mlx"
        );
        assert!(check_run_kernel("r1", "selective-scan", "cuda").is_err());
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
        let mut options = MambaOptions {
            weights: None,
            lengths: vec![512, 4096],
            decode_tokens: 32,
            impls: vec!["ksearch".into(), "mlx-lm".into()],
            variant: Some("s3_items".into()),
            kernel: None,
            kernel_only: true,
            stock_budget: 15.0,
            decode_loop: "sync".into(),
        };
        let argv = options.script_args(Path::new("/tmp/o.json"));
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
        options.kernel = Some("k.py".into());
        let with_kernel = options.script_args(Path::new("o"));
        assert!(with_kernel.windows(2).any(|w| w == ["--kernel", "k.py"]));
    }

    #[test]
    fn options_that_cannot_make_a_bench_say_why() {
        let options = MambaOptions {
            weights: None,
            lengths: vec![512],
            decode_tokens: 1,
            impls: vec!["ksearch".into()],
            variant: None,
            kernel: None,
            kernel_only: false,
            stock_budget: 1.0,
            decode_loop: "sync".into(),
        };
        assert!(options.check().is_ok());
        let err = |o: MambaOptions| o.check().unwrap_err().to_string();
        let lengths = MambaOptions {
            lengths: vec![0],
            ..options.clone()
        };
        assert_eq!(err(lengths), "--lengths needs positive prompt lengths");
        let impls = MambaOptions {
            impls: vec![],
            ..options.clone()
        };
        assert!(err(impls).contains("--impls"));
        let kernel = MambaOptions {
            kernel: Some("/no/such.py".into()),
            ..options.clone()
        };
        assert!(err(kernel).contains("/no/such.py"));
        let weights = MambaOptions {
            weights: Some("/no/such".into()),
            ..options
        };
        assert!(err(weights).contains("no config.json"));
    }

    #[test]
    fn the_fixture_is_the_current_schema() {
        assert_eq!(fixture().schema, SCHEMA);
    }
}
