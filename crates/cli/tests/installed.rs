//! The binary as a user installs it: copied alone into an empty directory, run from another one,
//! with no `KSEARCH_ROOT`, the fallback to the checkout it was built from switched off
//! (`KSEARCH_NO_SOURCE_CHECKOUT`) and a fresh cache. Everything it needs must come out of the
//! binary: the built-in tasks, the knowledge packs, the harness and the Mamba bench's Python.
//!
//! Evaluations need Python 3 with numpy: `KSEARCH_TEST_PYTHON` (passed as `KSEARCH_PYTHON`), else
//! a `python3` on PATH that has it, which ksearch then finds itself; without either the test
//! says so and skips.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

struct Installed {
    _bin_dir: tempfile::TempDir,
    binary: PathBuf,
    cwd: tempfile::TempDir,
    cache: tempfile::TempDir,
}

impl Installed {
    fn new() -> Installed {
        let bin_dir = tempfile::tempdir().unwrap();
        let binary = bin_dir.path().join("ksearch");
        std::fs::copy(env!("CARGO_BIN_EXE_ksearch"), &binary).unwrap();
        Installed {
            _bin_dir: bin_dir,
            binary,
            cwd: tempfile::tempdir().unwrap(),
            cache: tempfile::tempdir().unwrap(),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.args(args)
            .current_dir(self.cwd.path())
            .env_remove("KSEARCH_ROOT")
            .env_remove("RUST_LOG")
            .env("KSEARCH_NO_SOURCE_CHECKOUT", "1")
            .env("KSEARCH_CACHE_DIR", self.cache.path());
        match std::env::var_os("KSEARCH_TEST_PYTHON") {
            Some(p) => cmd.env("KSEARCH_PYTHON", p),
            None => cmd.env_remove("KSEARCH_PYTHON"),
        };
        cmd
    }

    /// Runs `args`, at most `limit` (then the test fails).
    fn output(&self, args: &[&str], limit: Duration) -> Output {
        let mut child = self
            .command(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + limit;
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("`ksearch {}` took more than {limit:?}", args.join(" "));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        child.wait_with_output().unwrap()
    }

    /// The extracted asset trees in the cache whose names start with `prefix`.
    fn extracted(&self, prefix: &str) -> Vec<PathBuf> {
        let dir = self.cache.path().join("assets");
        std::fs::read_dir(&dir)
            .map(|entries| {
                entries
                    .map(|e| e.unwrap().path())
                    .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn an_installed_binary_needs_no_checkout() {
    if common::numpy_python().is_none() {
        eprintln!(
            "skipped: no Python with numpy (set KSEARCH_TEST_PYTHON, or put one on PATH as python3)"
        );
        return;
    }
    let ks = Installed::new();
    let checkout = common::workspace_root().canonicalize().unwrap();

    // The built-in tasks, from the embedded copy.
    let out = ks.output(&["tasks", "--json"], Duration::from_secs(60));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let tasks: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = tasks.iter().filter_map(|t| t["name"].as_str()).collect();
    for task in ["attention", "copy", "selective-scan", "softmax"] {
        assert!(names.contains(&task), "{task} missing from {names:?}");
    }
    assert_eq!(ks.extracted("tasks-").len(), 1);

    // A small search on the cpu: the seed is evaluated, then the wall budget of 0 s stops it.
    let runs = ks.cwd.path().join("runs");
    let out = ks.output(
        &[
            "run",
            "--task",
            "softmax",
            "--backend",
            "cpu",
            "--rounds",
            "1",
            "--timing",
            "quick",
            "--seed",
            "3",
            "--max-wall-time",
            "0",
            "--no-recheck",
            "--json",
            "--runs-dir",
            runs.to_str().unwrap(),
        ],
        Duration::from_secs(900),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(run["run"].is_string(), "{run}");
    assert_eq!(run["outcome"]["rounds_used"], 0, "{run}");
    assert_eq!(run["outcome"]["passed"], 1, "{run}");
    assert!(
        run["outcome"]["best"]["score"]
            .as_f64()
            .is_some_and(|s| s > 0.0),
        "{run}"
    );
    assert_eq!(ks.extracted("harness-").len(), 1);
    assert_eq!(ks.extracted("knowledge-").len(), 1);

    // The Mamba bench starts from its embedded Python; on a machine without MLX it stops at
    // the import of MLX in bench.py, which ran from the cache.
    let out = ks.output(
        &[
            "bench",
            "mamba",
            "--lengths",
            "16",
            "--decode-tokens",
            "1",
            "--impls",
            "ksearch",
            "--timeout",
            "300",
        ],
        Duration::from_secs(600),
    );
    let stderr = text(&out.stderr);
    let bench = ks.extracted("mamba-bench-");
    assert_eq!(bench.len(), 1, "{stderr}");
    assert!(!stderr.contains("needs a ksearch checkout"), "{stderr}");
    for tree in ["gpu", "tasks"] {
        let in_checkout = checkout.join(tree);
        assert!(!stderr.contains(in_checkout.to_str().unwrap()), "{stderr}");
    }
    // What mamba_model.render_module does once MLX is there: the extracted client asks the
    // installed binary (KSEARCH_BIN, as `bench mamba` sets it to itself) for the default variant
    // of the mlx family, which it renders from its embedded tasks.
    let python = common::numpy_python().unwrap();
    let script = "import sys; sys.path.insert(0, sys.argv[1]); \
                  from ksearch_render import Family; \
                  f = Family('selective-scan', 'mlx'); \
                  print(f.render(f.variants(sys.argv[1] + '/variants.toml')['chunked_fused']))";
    let render = Command::new(&python)
        .current_dir(ks.cwd.path())
        .env("KSEARCH_BIN", &ks.binary)
        .env("KSEARCH_NO_SOURCE_CHECKOUT", "1")
        .env("KSEARCH_CACHE_DIR", ks.cache.path())
        .env_remove("KSEARCH_ROOT")
        .args(["-c", script])
        .arg(&bench[0])
        .output()
        .unwrap();
    assert!(render.status.success(), "{}", text(&render.stderr));
    let module = text(&render.stdout);
    assert!(module.contains("def selective_scan("), "{module}");
    assert!(module.contains("algo=\"chunked\""), "{module}");
    assert_eq!(
        ks.extracted("tasks-").len(),
        1,
        "the tasks come from the binary"
    );
    if !out.status.success() {
        let script = bench[0].join("bench.py");
        assert!(
            stderr.contains(&format!("File \"{}\"", script.display())),
            "the failure is not in the extracted bench.py: {stderr}"
        );
        // The Python exception that ended it (`ModuleNotFoundError: No module named 'mlx'`, or
        // MLX finding no device) names MLX.
        let exception = stderr
            .lines()
            .rev()
            .find(|l| {
                l.split(':')
                    .next()
                    .is_some_and(|w| w.ends_with("Error") && w != "Error" && !w.contains(' '))
            })
            .unwrap_or_default();
        assert!(
            exception.contains("mlx"),
            "the failure is not about MLX: {stderr}"
        );
    }
}

#[test]
fn an_installed_binary_scaffolds_and_imports_tasks() {
    let ks = Installed::new();
    let out = ks.output(
        &["new-task", "rowscale", "--dir", "rowscale", "--templates"],
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let task = ks.cwd.path().join("rowscale");
    for file in [
        "task.toml",
        "reference.py",
        "seed/naive.c",
        "templates-cpu/family.toml",
    ] {
        assert!(task.join(file).is_file(), "{file} missing");
    }
    let out = ks.output(&["tasks", "--check", "./rowscale"], Duration::from_secs(60));
    assert!(out.status.success(), "{}", text(&out.stderr));

    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/flashinfer-bench");
    let definition = examples.join("definitions/rmsnorm/rmsnorm_h4096.json");
    let out = ks.output(
        &[
            "import",
            "flashinfer",
            definition.to_str().unwrap(),
            "--out",
            "rms",
        ],
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("wrote task `rmsnorm_h4096`"));
    assert!(ks.cwd.path().join("rms/task.toml").is_file());
}
