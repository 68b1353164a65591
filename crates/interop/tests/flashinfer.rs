//! FlashInfer-Bench definitions imported as ksearch tasks: the shipped example, workloads chosen
//! from the axes, constraints, scalar inputs, and every refusal with its reason.

use ksearch_interop::flashinfer::{self, Definition};
use ksearch_interop::ImportError;
use ksearch_task::ParamValue;
use std::path::{Path, PathBuf};

fn int(v: &ParamValue) -> i64 {
    match v {
        ParamValue::Int(i) => *i,
        ParamValue::Str(s) => panic!("{s} is not an int"),
    }
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/flashinfer-bench")
}

fn rmsnorm() -> Definition {
    flashinfer::read_definition(&examples().join("definitions/rmsnorm/rmsnorm_h4096.json")).unwrap()
}

fn definition(json: &str) -> Result<Definition, ImportError> {
    flashinfer::parse_definition(json, Path::new("def.json"))
}

/// A definition with a var axis fixed by an equality constraint and a scalar input.
const SCALED: &str = r#"{
  "name": "scaled_rows",
  "op_type": "scale",
  "axes": {
    "batch_size": {"type": "var"},
    "len_indptr": {"type": "var"},
    "width": {"type": "const", "value": 64}
  },
  "constraints": ["len_indptr == batch_size + 1", "width % 16 == 0", "some_python_call(width)"],
  "inputs": {
    "x": {"shape": ["batch_size", "width"], "dtype": "float32"},
    "indptr": {"shape": ["len_indptr"], "dtype": "int32"},
    "scale": {"shape": null, "dtype": "float32"}
  },
  "outputs": {"y": {"shape": ["batch_size", "width"], "dtype": "float32"}},
  "reference": "import torch\n\ndef run(x, indptr, scale):\n    return x * scale\n"
}"#;

#[test]
fn the_shipped_rmsnorm_definition_and_its_workloads_import_as_a_loadable_task() {
    let def = rmsnorm();
    let jsonl = examples().join("workloads/rmsnorm/rmsnorm_h4096.jsonl");
    let workloads = flashinfer::read_workloads(&jsonl, &def.name).unwrap();
    assert_eq!(workloads.len(), 8);
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("rmsnorm");
    let imported = flashinfer::import(&def, Some((&workloads, &jsonl)), &dir).unwrap();
    let spec = imported.task.spec();
    assert_eq!(spec.name, "rmsnorm_h4096");
    assert_eq!(spec.kind, "rmsnorm");
    // Every given workload, with the const axis bound; every fourth held out.
    assert_eq!(spec.workloads.len(), 8);
    let held: Vec<i64> = spec
        .workloads
        .iter()
        .filter(|w| w.held_out)
        .map(|w| int(&w.params["batch_size"]))
        .collect();
    assert_eq!(held, [7, 333]);
    assert!(spec
        .workloads
        .iter()
        .all(|w| int(&w.params["hidden_size"]) == 4096));
    let tol = imported.task.tolerance(ksearch_task::DType::BF16);
    assert_eq!(tol.rule, ksearch_task::ToleranceRule::Either);
    assert_eq!((tol.rtol, tol.atol, tol.matched_ratio), (1e-2, 1e-2, 1.0));
    let cuda = &spec.backends["cuda"];
    assert_eq!(cuda.entry, "rmsnorm_h4096");
    assert_eq!(
        cuda.args,
        [
            "hidden_states",
            "weight",
            "output",
            "batch_size",
            "hidden_size"
        ]
    );
    assert!(cuda.signature.contains("const void* hidden_states"));
    assert!(cuda
        .signature
        .ends_with("int64_t hidden_size, void* stream)"));
    let resolved = imported.task.workloads("cuda").unwrap();
    let first = &resolved[0];
    assert_eq!(first.inputs[0].shape, [1, 4096]);
    // The reference module holds `run` verbatim and the functions the backend names.
    let verbatim = std::fs::read_to_string(dir.join("definition_reference.py")).unwrap();
    assert!(verbatim.contains(def.reference.trim_end()));
    let reference = std::fs::read_to_string(dir.join("reference.py")).unwrap();
    for f in [
        "def reference(",
        "def reference_torch(",
        "def baseline_torch(",
    ] {
        assert!(reference.contains(f), "{f} missing");
    }
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(readme.contains("2 of the 8 workloads are held out"));
}

#[test]
fn without_workloads_three_are_chosen_from_the_axes_and_one_is_held_out() {
    let out = tempfile::tempdir().unwrap();
    let imported = flashinfer::import(&rmsnorm(), None, &out.path().join("t")).unwrap();
    let spec = imported.task.spec();
    let sizes: Vec<(i64, bool)> = spec
        .workloads
        .iter()
        .map(|w| (int(&w.params["batch_size"]), w.held_out))
        .collect();
    assert_eq!(sizes, [(1, false), (16, false), (128, false), (7, true)]);
    assert!(imported
        .notes
        .iter()
        .any(|n| n.contains("no workloads given")));
}

#[test]
fn an_equality_constraint_fixes_its_axis_and_scalars_come_from_a_generator() {
    let def = definition(SCALED).unwrap();
    let out = tempfile::tempdir().unwrap();
    let imported = flashinfer::import(&def, None, &out.path().join("t")).unwrap();
    for w in &imported.task.spec().workloads {
        let b = int(&w.params["batch_size"]);
        assert_eq!(int(&w.params["len_indptr"]), b + 1, "{}", w.name);
    }
    assert!(imported
        .notes
        .iter()
        .any(|n| n.contains("not checked") && n.contains("some_python_call(width)")));

    let lines = (0..4)
        .map(|i| {
            format!(
                r#"{{"definition": "scaled_rows", "workload": {{"uuid": "u{i}", "axes": {{"batch_size": {b}, "len_indptr": {p}}}, "inputs": {{"x": {{"type": "random"}}, "indptr": {{"type": "random"}}, "scale": {{"type": "scalar", "value": {s}}}}}}}}}"#,
                b = i + 2,
                p = i + 3,
                s = 0.5 * f64::from(i + 1)
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    let source = Path::new("w.jsonl");
    let workloads = flashinfer::parse_workloads(&lines, source, "scaled_rows").unwrap();
    let dir = out.path().join("given");
    let imported = flashinfer::import(&def, Some((&workloads, source)), &dir).unwrap();
    let scale = imported
        .task
        .spec()
        .inputs
        .iter()
        .find(|t| t.name == "scale")
        .unwrap()
        .clone();
    assert!(scale.shape.is_empty(), "a scalar is a 0-d tensor");
    let reference = std::fs::read_to_string(dir.join("reference.py")).unwrap();
    assert!(reference.contains("def make_scale(rng, shape, params):"));
    assert!(reference.contains("(5, 6, 64,): 2.0,"), "{reference}");

    // The generator gives each workload its value (needs only numpy, not torch).
    if let Some(python) = std::env::var_os("KSEARCH_TEST_PYTHON") {
        let script = "import importlib.util, sys\n\
            spec = importlib.util.spec_from_file_location('r', sys.argv[1])\n\
            m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n\
            v = m.make_scale(None, (), {'batch_size': 3, 'len_indptr': 4, 'width': 64})\n\
            print(v.dtype, float(v))";
        let out = std::process::Command::new(python)
            .args(["-c", script])
            .arg(dir.join("reference.py"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "float32 1.0");
    }
}

#[test]
fn a_workload_that_breaks_a_constraint_is_refused_with_its_uuid() {
    let def = definition(SCALED).unwrap();
    let line = r#"{"definition": "scaled_rows", "workload": {"uuid": "bad-1", "axes": {"batch_size": 4, "len_indptr": 4}, "inputs": {}}}"#;
    let source = Path::new("w.jsonl");
    let w = flashinfer::parse_workloads(line, source, "scaled_rows").unwrap();
    let out = tempfile::tempdir().unwrap();
    let err = flashinfer::import(&def, Some((&w, source)), &out.path().join("t"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bad-1") && err.contains("len_indptr == batch_size + 1"),
        "{err}"
    );
    assert!(
        !out.path().join("t").exists(),
        "nothing is written for a refused import"
    );
}

#[test]
fn refusals_say_what_is_unsupported_or_wrong() {
    let cases = [
        (
            SCALED.replace(
                "\"float32\"},\n    \"indptr\"",
                "\"float8_e4m3fn\"},\n    \"indptr\"",
            ),
            "float8_e4m3fn",
        ),
        (
            SCALED.replace("[\"len_indptr\"]", "[\"nope\"]"),
            "axis `nope`",
        ),
        (SCALED.replace("def run(", "def go("), "def run"),
        (
            SCALED.replace(
                "\"y\": {\"shape\": [\"batch_size\", \"width\"]",
                "\"y\": {\"shape\": null",
            ),
            "scalar outputs",
        ),
        (SCALED.replace("\"x\": {", "\"width\": {"), "distinct names"),
        (
            SCALED.replace("\"name\": \"scaled_rows\",", ""),
            "missing field `name`",
        ),
    ];
    for (json, expect) in cases {
        let err = definition(&json).unwrap_err().to_string();
        assert!(err.contains(expect), "expected `{expect}` in: {err}");
    }
    let def = definition(SCALED).unwrap();
    let source = Path::new("w.jsonl");
    let line = |inputs: &str, axes: &str| {
        format!(
            r#"{{"definition": "scaled_rows", "workload": {{"uuid": "u", "axes": {axes}, "inputs": {inputs}}}}}"#
        )
    };
    let ok_axes = r#"{"batch_size": 2, "len_indptr": 3}"#;
    for (text, expect) in [
        (
            line(
                r#"{"x": {"type": "safetensors", "path": "blob/a.safetensors", "tensor_key": "x"}}"#,
                ok_axes,
            ),
            "safetensors",
        ),
        (
            line("{}", r#"{"batch_size": 2}"#),
            "`len_indptr` has no value",
        ),
        (
            line("{}", r#"{"batch_size": 2, "len_indptr": 3, "width": 32}"#),
            "const axis `width` is 64",
        ),
        (
            line(r#"{"zz": {"type": "random"}}"#, ok_axes),
            "input `zz` is not in the definition",
        ),
    ] {
        let w = flashinfer::parse_workloads(&text, source, "scaled_rows").unwrap();
        let out = tempfile::tempdir().unwrap();
        let err = flashinfer::import(&def, Some((&w, source)), &out.path().join("t"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(expect), "expected `{expect}` in: {err}");
    }
    let err = flashinfer::parse_workloads("{\"definition\": 1}\n", source, "scaled_rows")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("w.jsonl:1:"), "{err}");
    let err = flashinfer::parse_workloads(&line("{}", ok_axes), source, "other")
        .unwrap_err()
        .to_string();
    assert!(err.contains("no workload of definition `other`"), "{err}");
}

#[test]
fn an_import_never_overwrites() {
    let out = tempfile::tempdir().unwrap();
    std::fs::write(out.path().join("keep.txt"), "mine").unwrap();
    let err = flashinfer::import(&rmsnorm(), None, out.path()).unwrap_err();
    assert!(matches!(err, ImportError::OutputExists(_)), "{err}");
    assert_eq!(
        std::fs::read_to_string(out.path().join("keep.txt")).unwrap(),
        "mine"
    );
}
