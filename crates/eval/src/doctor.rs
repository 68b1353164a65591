//! `ksearch doctor`: what this machine offers for evaluation, and how to get what is missing.
//!
//! [`Diagnosis::examine`] chooses the harness interpreter (an active one that imports numpy,
//! else the managed environment, set up here; [`crate::harness_env`]), checks what it can on its
//! own (python3 and the venv module when the managed environment needs them, a C compiler), then
//! asks the harness (`probe` op) about everything inside Python and the sandbox. The result is a
//! list of [`Check`]s, shown as a table with install hints or as JSON.

use crate::harness_env::{self, HarnessEnv};
use crate::report::{Align, Table};
use crate::{Evaluator, EvaluatorConfig};
use serde::Serialize;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// One thing doctor looked at: what it found (`detail`) or why it is missing, and how to get it.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    /// Whether the cpu backend (the minimum) needs it.
    pub required: bool,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl Check {
    fn new(name: &str, required: bool, outcome: Result<String, String>, hint: &str) -> Self {
        let ok = outcome.is_ok();
        Check {
            name: name.to_string(),
            ok,
            required,
            detail: outcome.unwrap_or_else(|e| e),
            hint: (!ok && !hint.is_empty()).then(|| hint.to_string()),
        }
    }
}

/// What doctor found: the checks, the interpreter choice (or why there is none) and the
/// harness's probe answer (null when the harness could not be asked).
#[derive(Debug)]
pub struct Diagnosis {
    pub checks: Vec<Check>,
    pub env: Result<HarnessEnv, String>,
    pub probe: Value,
}

impl Diagnosis {
    /// Examines this machine. With `require_sandbox`, a sandbox layer it lacks fails the check
    /// (the `--sandbox require` of an evaluation would refuse to run).
    pub fn examine(require_sandbox: bool) -> Diagnosis {
        let mut checks = Vec::new();
        // Chosen first, since what else is required depends on it: the managed environment needs
        // python3's venv module, an active interpreter does not.
        let env = harness_env::resolve().map_err(|e| e.to_string());
        let source = env.as_ref().ok().map(|e| e.source.clone());
        if let Some(harness_env::Source::Explicit) = source {
            let p = env.as_ref().map(|e| e.python.clone()).unwrap_or_default();
            checks.push(Check::new(
                "python (KSEARCH_PYTHON)",
                true,
                first_line(&p, &["--version"]),
                "KSEARCH_PYTHON must name a working Python 3 interpreter",
            ));
        } else {
            // An interpreter already chosen does not need python3 on PATH; the managed
            // environment (chosen, or failed to be) is built from it.
            let managed = !matches!(source, Some(harness_env::Source::Active));
            let base = harness_env::find_python3().map_err(|e| e.to_string());
            checks.push(Check::new(
                "python3",
                managed,
                base.as_ref().map_err(Clone::clone).and_then(|p| {
                    first_line(p, &["--version"]).map(|v| format!("{v} ({})", p.display()))
                }),
                "install Python 3 (Debian/Ubuntu: `apt install python3`)",
            ));
            if let (Ok(p), true) = (&base, managed) {
                checks.push(Check::new(
                    "python3 venv module",
                    true,
                    first_line(p, &["-c", "import venv, ensurepip; print('available')"]),
                    "install python3-venv (Debian/Ubuntu: `apt install python3-venv`)",
                ));
            }
        }
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        checks.push(Check::new(
            "C compiler",
            true,
            first_line(Path::new(&cc), &["--version"]),
            "install a C compiler (Debian/Ubuntu: `apt install gcc`; macOS: `xcode-select --install`)",
        ));

        checks.push(Check::new(
            "harness environment",
            true,
            env.as_ref()
                .map(|e| format!("{}: {}", e.python.display(), e.reason))
                .map_err(Clone::clone),
            "see the message above; KSEARCH_PYTHON can point at an interpreter that has numpy",
        ));

        let mut probe = Value::Null;
        if let Ok(env) = &env {
            let answer = Evaluator::new(EvaluatorConfig {
                python: Some(env.python.clone()),
                ..EvaluatorConfig::default()
            })
            .and_then(|ev| ev.probe_with_sandbox());
            match answer {
                Ok(v) => {
                    // The harness nests its findings under `probe`; accept a flat answer too.
                    probe = v.get("probe").cloned().unwrap_or(v);
                    checks.push(Check::new("harness", true, Ok(harness_summary(&probe)), ""));
                    checks.extend(probe_checks(&probe));
                    checks.push(Check::new(
                        "sandbox",
                        require_sandbox,
                        sandbox_summary(probe.get("sandbox")),
                        "candidates run with the layers listed; all of them need Linux and root \
                         (docs/security.md)",
                    ));
                }
                Err(e) => checks.push(Check::new(
                    "harness",
                    true,
                    Err(e.to_string()),
                    "the harness sources and interpreter do not work together; run with -v",
                )),
            }
        }
        Diagnosis { checks, env, probe }
    }

    /// Whether everything the cpu backend needs is there.
    pub fn healthy(&self) -> bool {
        self.checks.iter().all(|c| c.ok || !c.required)
    }

    /// The `--json` document: health, the checks, the interpreter choice and the probe.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "ok": self.healthy(),
            "checks": self.checks,
            "harness_env": self.env.as_ref().ok().map(env_json),
            "probe": self.probe,
        })
    }
    /// The closing line of `ksearch doctor`: whether the cpu backend has what it needs.
    pub fn verdict(&self) -> &'static str {
        if self.healthy() {
            "The cpu backend is ready."
        } else {
            "Something the cpu backend needs is missing (see `how to fix`)."
        }
    }

    /// The checks as a table, then how to fix what is missing.
    pub fn render(&self) -> String {
        render(&self.checks)
    }
}

/// The interpreter choice for `--json`: the interpreter, where it came from (`KSEARCH_PYTHON`,
/// `active` or `managed`), why, and the active interpreters passed over.
fn env_json(env: &HarnessEnv) -> Value {
    let rejected: Vec<Value> = env
        .rejected
        .iter()
        .map(|r| {
            serde_json::json!({
                "python": r.candidate.python,
                "origin": r.candidate.origin,
                "why": r.why,
            })
        })
        .collect();
    serde_json::json!({
        "python": env.python,
        "source": env.source.as_str(),
        "venv": env.venv(),
        "reason": env.reason,
        "rejected": rejected,
    })
}

/// The sandbox probe in one line: the layers active, or what is missing and what got out.
fn sandbox_summary(found: Option<&Value>) -> Result<String, String> {
    let Some(found) = found.filter(|v| v.is_object()) else {
        return Err(match found.and_then(Value::as_str) {
            Some(e) => e.to_string(),
            None => "the harness did not report on the sandbox".into(),
        });
    };
    let layers = found["layers"].as_array().cloned().unwrap_or_default();
    let name = |l: &Value| l["name"].as_str().unwrap_or("?").to_string();
    let active: Vec<String> = layers
        .iter()
        .filter(|l| l["active"] == Value::Bool(true))
        .map(name)
        .collect();
    let inactive: Vec<String> = layers
        .iter()
        .filter(|l| l["active"] != Value::Bool(true))
        .map(name)
        .collect();
    let escapes: Vec<String> = found["escapes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default();
    if inactive.is_empty() && escapes.is_empty() && found["ok"] == Value::Bool(true) {
        return Ok(format!(
            "{} layers active ({}); a confined probe escaped nothing",
            active.len(),
            active.join(", ")
        ));
    }
    let mut why = Vec::new();
    if !inactive.is_empty() {
        why.push(format!("inactive: {}", inactive.join(", ")));
    }
    if !escapes.is_empty() {
        why.push(format!("a confined probe managed: {}", escapes.join(", ")));
    }
    if let Some(e) = found["error"].as_str() {
        why.push(e.to_string());
    }
    Err(why.join("; "))
}

fn render(checks: &[Check]) -> String {
    let mut table = Table::new(&[
        ("check", Align::Left),
        ("status", Align::Left),
        ("detail", Align::Left),
    ]);
    let mut hints = Vec::new();
    for c in checks {
        let status = match (c.ok, c.required) {
            (true, _) => "ok",
            (false, true) => "MISSING",
            (false, false) => "absent",
        };
        let detail = c.detail.lines().next().unwrap_or("").to_string();
        table.row(vec![c.name.clone(), status.into(), detail]);
        if let Some(h) = &c.hint {
            hints.push(format!("  {}: {h}", c.name));
        }
        // A multi-line failure (a Python traceback) is shown in full below the table.
        if !c.ok && c.detail.lines().count() > 1 {
            hints.push(format!("  {} said:\n{}", c.name, indent(&c.detail)));
        }
    }
    let mut out = table.render();
    if !hints.is_empty() {
        out.push_str("\nhow to fix:\n");
        for h in hints {
            out.push_str(&h);
            out.push('\n');
        }
    }
    out
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn harness_summary(probe: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(v) = probe.get("harness_version").and_then(Value::as_str) {
        parts.push(format!("version {v}"));
    }
    if let Some(p) = probe.get("protocol").and_then(Value::as_u64) {
        parts.push(format!("protocol {p}"));
    }
    if let Some(b) = probe.get("backends").and_then(Value::as_array) {
        let names: Vec<&str> = b.iter().filter_map(Value::as_str).collect();
        parts.push(format!("backends: {}", names.join(", ")));
    }
    if parts.is_empty() {
        "answers".into()
    } else {
        parts.join("; ")
    }
}

/// What the probe found, with install hints for what is absent. Only numpy is required: the
/// others enable the GPU backends.
fn probe_checks(probe: &Value) -> Vec<Check> {
    let present = |key: &str| -> Result<String, String> {
        match probe.get(key) {
            Some(Value::String(s)) if s.starts_with("error:") => Err(s.clone()),
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(Value::Array(a)) if !a.is_empty() => Ok(a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string())
                })
                .collect::<Vec<_>>()
                .join("; ")),
            Some(Value::Number(n)) => Ok(n.to_string()),
            Some(Value::Bool(true)) => Ok("yes".into()),
            _ => Err("not found".into()),
        }
    };
    let mut checks = vec![
        Check::new(
            "numpy",
            true,
            present("numpy"),
            "pip install numpy (into the harness environment, or system-wide)",
        ),
        Check::new("cpu", false, present("cpu_model"), ""),
        Check::new("cores", false, present("cores"), ""),
        Check::new(
            "torch",
            false,
            present("torch"),
            "for the cuda backend: pip install torch (a CUDA build matching your driver)",
        ),
        Check::new(
            "mlx",
            false,
            present("mlx"),
            "for the mlx backend: `pip install mlx` (macOS, Apple silicon); on Linux with an \
             NVIDIA GPU `pip install \"mlx[cuda13]\"` (driver >= 580) or `\"mlx[cuda12]\"`",
        ),
        Check::new(
            "nvcc",
            false,
            present("nvcc"),
            "for CUDA kernels: install the CUDA toolkit, or `pip install nvidia-cuda-nvcc \
             nvidia-cuda-runtime nvidia-cuda-cccl` (CUDA 13; the -cu12 packages for CUDA 12) \
             and put the wheel's bin directory on PATH",
        ),
        Check::new(
            "GPUs",
            false,
            present("gpus"),
            "no NVIDIA GPU seen (nvidia-smi); the cpu backend still works",
        ),
    ];
    // Mention anything else the harness reported, so a newer harness needs no CLI change.
    let known = [
        // Checked from Rust already.
        "python",
        "cc",
        "numpy",
        "cpu_model",
        "cores",
        "torch",
        "mlx",
        "nvcc",
        "gpus",
        "harness_version",
        "protocol",
        "backends",
        "nonce",
        "status",
    ];
    if let Some(obj) = probe.as_object() {
        for (k, v) in obj {
            if known.contains(&k.as_str()) || v.is_null() || v.is_object() {
                continue;
            }
            let name = if k == "cxx" {
                "C++ compiler"
            } else {
                k.as_str()
            };
            checks.push(Check::new(name, false, present(k), ""));
        }
    }
    checks
}

/// First line of `program args…` output, or why it could not be run.
fn first_line(program: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    let text = if out.stdout.is_empty() {
        String::from_utf8_lossy(&out.stderr).into_owned()
    } else {
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            program.display(),
            text.lines().last().unwrap_or("").trim()
        ));
    }
    Ok(text.lines().next().unwrap_or("").trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn missing_optional_tools_get_hints_but_do_not_fail() {
        let probe = json!({
            "harness_version": "0.1", "protocol": 1, "python": "3.11.7",
            "numpy": "2.4.0", "cxx": "g++ 12", "python_abi": "cp311", "torch": null, "mlx": null, "cc": "gcc 12", "nvcc": null,
            "cpu_model": "Xeon", "cores": 2, "gpus": [], "backends": ["cpu"],
        });
        let checks = probe_checks(&probe);
        let get = |n: &str| checks.iter().find(|c| c.name == n).unwrap();
        assert!(get("numpy").ok);
        assert!(!get("nvcc").ok && !get("nvcc").required);
        assert!(get("nvcc")
            .hint
            .as_ref()
            .unwrap()
            .contains("nvidia-cuda-nvcc"));
        assert!(get("mlx")
            .hint
            .as_ref()
            .unwrap()
            .contains("pip install mlx"));
        assert!(!get("GPUs").ok);
        // Keys without a dedicated check are shown too.
        assert!(get("C++ compiler").ok && get("python_abi").ok);
        assert_eq!(
            harness_summary(&probe),
            "version 0.1; protocol 1; backends: cpu"
        );
        let text = render(&checks);
        assert!(text.contains("how to fix:"));
        assert!(text.contains("absent"));
        assert!(!text.contains("MISSING"));
    }

    #[test]
    fn missing_numpy_is_required() {
        let probe = json!({"numpy": null});
        let checks = probe_checks(&probe);
        let numpy = checks.iter().find(|c| c.name == "numpy").unwrap();
        assert!(!numpy.ok && numpy.required);
        assert!(render(&checks).contains("MISSING"));
    }
}
