//! FlashInfer-Bench definitions imported as ksearch tasks: the shipped example, workloads chosen
//! from the axes, constraints, scalar inputs, and every refusal with its reason.

use ksearch_interop::flashinfer::{self, Definition, ImportOptions};
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

fn given<'a>(workloads: &'a [flashinfer::Workload], source: &'a Path) -> ImportOptions<'a> {
    ImportOptions {
        workloads: Some((workloads, source)),
        ..ImportOptions::default()
    }
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
    let imported = flashinfer::import(&def, &given(&workloads, &jsonl), &dir).unwrap();
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
    let imported =
        flashinfer::import(&rmsnorm(), &ImportOptions::default(), &out.path().join("t")).unwrap();
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
    let imported =
        flashinfer::import(&def, &ImportOptions::default(), &out.path().join("t")).unwrap();
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
    let imported = flashinfer::import(&def, &given(&workloads, source), &dir).unwrap();
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
    let err = flashinfer::import(&def, &given(&w, source), &out.path().join("t"))
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
        let err = flashinfer::import(&def, &given(&w, source), &out.path().join("t"))
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
    let err = flashinfer::import(&rmsnorm(), &ImportOptions::default(), out.path()).unwrap_err();
    assert!(matches!(err, ImportError::OutputExists(_)), "{err}");
    assert_eq!(
        std::fs::read_to_string(out.path().join("keep.txt")).unwrap(),
        "mine"
    );
}

#[test]
fn safetensors_inputs_are_checked_copied_and_read_back_by_the_generator() {
    let def = definition(SCALED).unwrap();
    let dataset = tempfile::tempdir().unwrap();
    let blob_dir = dataset.path().join("blob/workloads/scale/scaled_rows");
    std::fs::create_dir_all(&blob_dir).unwrap();
    let i32s = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    // bf16 bits of 1.0, -2.5 and 0.15625.
    let bf16: Vec<u8> = [0x3f80u16, 0xc020, 0x3e20]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let mut lines = Vec::new();
    for (i, b) in [2i64, 3].into_iter().enumerate() {
        let file = blob_dir.join(format!("scaled_rows_{i}.safetensors"));
        let indptr: Vec<i32> = (0..=b as i32).map(|k| k * 10 + i as i32).collect();
        ksearch_interop::safetensors::write(
            &file,
            &[
                ("indptr", "I32", vec![b + 1], i32s(&indptr)),
                ("extra", "BF16", vec![3], bf16.clone()),
            ],
        )
        .unwrap();
        lines.push(format!(
            r#"{{"definition": "scaled_rows", "workload": {{"uuid": "u{i}", "axes": {{"batch_size": {b}, "len_indptr": {p}}}, "inputs": {{"indptr": {{"type": "safetensors", "path": "blob/workloads/scale/scaled_rows/scaled_rows_{i}.safetensors", "tensor_key": "indptr"}}, "scale": {{"type": "scalar", "value": 2.0}}}}}}}}"#,
            p = b + 1
        ));
    }
    let source = dataset.path().join("w.jsonl");
    let workloads = flashinfer::parse_workloads(&lines.join("\n"), &source, "scaled_rows").unwrap();
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("t");
    let opts = ImportOptions {
        workloads: Some((&workloads, &source)),
        dataset: Some(dataset.path()),
        with: None,
    };
    let imported = flashinfer::import(&def, &opts, &dir).unwrap();
    assert!(dir.join("blobs/scaled_rows_0.safetensors").is_file());
    assert!(dir.join("blobs/scaled_rows_1.safetensors").is_file());
    assert!(imported
        .notes
        .iter()
        .any(|n| n.contains("2 safetensors file(s) copied")));
    let indptr = imported
        .task
        .spec()
        .inputs
        .iter()
        .find(|t| t.name == "indptr")
        .unwrap()
        .clone();
    assert!(matches!(
        indptr.dist,
        Some(ksearch_task::Distribution::Custom { .. })
    ));

    if let Some(python) = std::env::var_os("KSEARCH_TEST_PYTHON") {
        let script = "import importlib.util, sys\n\
            spec = importlib.util.spec_from_file_location('r', sys.argv[1])\n\
            m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n\
            v = m.make_indptr(None, (4,), {'batch_size': 3, 'len_indptr': 4, 'width': 64})\n\
            print(v.dtype, v.tolist())\n\
            print(m._read_safetensors('blobs/scaled_rows_0.safetensors', 'extra').tolist())";
        let run = std::process::Command::new(python)
            .args(["-c", script])
            .arg(dir.join("reference.py"))
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let stdout = String::from_utf8_lossy(&run.stdout);
        let mut lines = stdout.lines();
        assert_eq!(lines.next(), Some("int32 [1, 11, 21, 31]"));
        assert_eq!(lines.next(), Some("[1.0, -2.5, 0.15625]"));
    }

    // A blob whose shape is not the workload's is refused before anything is written.
    let wrong = lines[0].replace(
        r#""batch_size": 2, "len_indptr": 3"#,
        r#""batch_size": 4, "len_indptr": 5"#,
    );
    let workloads = flashinfer::parse_workloads(&wrong, &source, "scaled_rows").unwrap();
    let opts = ImportOptions {
        workloads: Some((&workloads, &source)),
        dataset: Some(dataset.path()),
        with: None,
    };
    let err = flashinfer::import(&def, &opts, &out.path().join("wrong"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("has shape [3], the workload's is [5]"),
        "{err}"
    );
}

#[test]
fn the_shipped_gqa_paged_decode_example_imports_with_its_blobs_and_seed() {
    let root = examples();
    let def = flashinfer::read_definition(
        &root.join("definitions/gqa_paged/gqa_paged_decode_h32_kv4_d128_ps1.json"),
    )
    .unwrap();
    let jsonl = root.join("workloads/gqa_paged/gqa_paged_decode_h32_kv4_d128_ps1.jsonl");
    let workloads = flashinfer::read_workloads(&jsonl, &def.name).unwrap();
    let with = root.join("ksearch/gqa_paged_decode_h32_kv4_d128_ps1");
    let dataset = flashinfer::dataset_root(
        &root.join("definitions/gqa_paged/gqa_paged_decode_h32_kv4_d128_ps1.json"),
    )
    .unwrap();
    assert_eq!(
        dataset.canonicalize().unwrap(),
        root.canonicalize().unwrap()
    );
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("gqa");
    let opts = ImportOptions {
        workloads: Some((&workloads, &jsonl)),
        dataset: Some(&dataset),
        with: Some(&with),
    };
    let imported = flashinfer::import(&def, &opts, &dir).unwrap();
    let task = &imported.task;
    let cuda = task.backend("cuda").unwrap();
    assert!(cuda.seed.as_ref().unwrap().is_file());
    assert!(std::fs::read_to_string(cuda.seed.as_ref().unwrap())
        .unwrap()
        .contains(&format!("extern \"C\" int {}(", cuda.entry)));
    let resolved = task.workloads("cuda").unwrap();
    assert_eq!(resolved.len(), 5);
    assert_eq!(resolved.iter().filter(|w| w.held_out).count(), 1);
    for w in &resolved {
        let b = int(&w.params["batch_size"]);
        assert_eq!(int(&w.params["len_indptr"]), b + 1);
        assert_eq!(int(&w.params["num_qo_heads"]), 32);
    }
    assert!(imported
        .notes
        .iter()
        .any(|n| n.contains("num_kv_indices == kv_indptr[-1].item()")));

    // The family and actions copied in serve the offline proposer: every setting renders with
    // the task's entry, and every task action applies to the family.
    let family = ksearch_knowledge::TemplateFamily::load_for(&dir, "cuda")
        .unwrap()
        .expect("templates-cuda/ copied in");
    let settings = family.enumerate();
    assert_eq!(settings.len(), 240);
    for knobs in &settings {
        let src = family.render(knobs).unwrap();
        assert!(src.contains(&format!("extern \"C\" int {}(", cuda.entry)));
    }
    let catalog = ksearch_knowledge::Catalog::for_task(&dir).unwrap();
    let kind = &task.spec().kind;
    assert_eq!(
        catalog.for_kind_on(kind, "cuda").len(),
        8,
        "the task's own actions"
    );
    catalog.check_task_actions(kind, "cuda", &family).unwrap();
    assert!(catalog.check_family(kind, "cuda", &family).is_empty());

    // The blobs hold valid page tables: indptr runs from 0 to num_kv_indices, each request
    // has tokens, and every index is a distinct page of the cache (numpy only).
    if let Some(python) = std::env::var_os("KSEARCH_TEST_PYTHON") {
        let params: Vec<String> = resolved
            .iter()
            .map(|w| {
                let p: Vec<String> = w
                    .params
                    .iter()
                    .map(|(k, v)| format!("{k:?}: {v}"))
                    .collect();
                format!("{{{}}}", p.join(", "))
            })
            .collect();
        let script = format!(
            "import importlib.util, sys\n\
             import numpy as np\n\
             spec = importlib.util.spec_from_file_location('r', sys.argv[1])\n\
             m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n\
             for p in [{}]:\n    \
                 ptr = m.make_kv_indptr(None, (p['len_indptr'],), p)\n    \
                 idx = m.make_kv_indices(None, (p['num_kv_indices'],), p)\n    \
                 assert ptr[0] == 0 and ptr[-1] == p['num_kv_indices'], p\n    \
                 assert (np.diff(ptr) > 0).all(), p\n    \
                 assert idx.min() >= 0 and idx.max() < p['num_pages'], p\n    \
                 assert len(np.unique(idx)) == len(idx), p\n    \
                 assert abs(float(m.make_sm_scale(None, (), p)) - 128 ** -0.5) < 1e-7\n\
             print('ok')",
            params.join(", ")
        );
        let run = std::process::Command::new(python)
            .args(["-c", &script])
            .arg(dir.join("reference.py"))
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&run.stdout).trim(), "ok");
    }
}

fn measured(
    name: &str,
    correct: bool,
    kernel_ns: f64,
    baseline_ns: f64,
) -> ksearch_eval::WorkloadResult {
    ksearch_eval::WorkloadResult {
        name: name.into(),
        correct: Some(correct),
        max_abs_err: Some(if correct { 1e-3 } else { f64::NAN }),
        max_rel_err: Some(if correct { 2e-3 } else { f64::NAN }),
        candidate_median_ns: correct.then_some(kernel_ns),
        baseline_median_ns: Some(baseline_ns),
        ..Default::default()
    }
}

#[test]
fn a_kernel_exports_as_a_solution_with_a_torch_binding_and_a_trace_per_workload() {
    let def = rmsnorm();
    let jsonl = examples().join("workloads/rmsnorm/rmsnorm_h4096.jsonl");
    let workloads = flashinfer::read_workloads(&jsonl, &def.name).unwrap();
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("rms");
    let imported = flashinfer::import(&def, &given(&workloads, &jsonl), &dir).unwrap();
    let names: Vec<String> = imported
        .task
        .spec()
        .workloads
        .iter()
        .map(|w| w.name.clone())
        .collect();
    let mut eval = ksearch_eval::EvalResult::synthesised("n", ksearch_eval::Status::Passed, "");
    let mut env = serde_json::Map::new();
    env.insert("gpu".into(), "NVIDIA H200".into());
    env.insert("torch".into(), "2.11.0+cu130".into());
    eval.environment = Some(env);
    eval.workloads = vec![
        measured(&names[0], true, 10_000.0, 25_000.0),
        measured(&names[1], false, 0.0, 30_000.0),
        ksearch_eval::WorkloadResult {
            held_out: true,
            ..measured(&names[3], true, 1.0, 1.0)
        },
    ];
    let kernel = "extern \"C\" int rmsnorm_h4096(const void* hidden_states, const void* weight, void* output, int64_t batch_size, int64_t hidden_size, void* stream) { return 0; }";
    let provenance = flashinfer::Provenance {
        run_id: "20261202-1",
        timestamp: "2026-12-02T14:00:00Z",
    };
    let exported = flashinfer::export(&dir, kernel, &eval, &provenance).unwrap();
    let solution: serde_json::Value = serde_json::from_str(&exported.solution).unwrap();
    assert_eq!(solution["definition"], "rmsnorm_h4096");
    assert_eq!(solution["name"], "rmsnorm_h4096_ksearch_20261202-1");
    assert_eq!(solution["spec"]["entry_point"], "binding.cpp::run");
    assert_eq!(solution["spec"]["binding"], "torch");
    assert_eq!(solution["spec"]["destination_passing_style"], true);
    assert_eq!(solution["spec"]["target_hardware"][0], "NVIDIA H200");
    assert_eq!(solution["sources"][0]["content"], kernel);
    let binding = solution["sources"][1]["content"].as_str().unwrap();
    assert!(
        binding.contains(
            "void run(torch::Tensor hidden_states, torch::Tensor weight, torch::Tensor output)"
        ),
        "{binding}"
    );
    assert!(binding.contains("const int64_t batch_size = hidden_states.size(0);"));
    assert!(binding.contains("const int64_t hidden_size = hidden_states.size(1);"));
    assert!(binding.contains("rmsnorm_h4096(\n      hidden_states.data_ptr(), weight.data_ptr(), output.data_ptr(), batch_size, hidden_size, at::cuda::getCurrentCUDAStream().stream());"), "{binding}");

    // One trace per shown workload, the workload as the dataset wrote it.
    let lines: Vec<serde_json::Value> = exported
        .traces
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["workload"], workloads[0].json);
    assert_eq!(lines[0]["solution"], solution["name"]);
    let ev = &lines[0]["evaluation"];
    assert_eq!(ev["status"], "PASSED");
    assert_eq!(ev["performance"]["latency_ms"], 0.01);
    assert_eq!(ev["performance"]["speedup_factor"], 2.5);
    assert_eq!(ev["environment"]["libs"]["torch"], "2.11.0+cu130");
    assert_eq!(ev["timestamp"], "2026-12-02T14:00:00Z");
    let failed = &lines[1]["evaluation"];
    assert_eq!(failed["status"], "INCORRECT_NUMERICAL");
    assert_eq!(failed["correctness"]["max_absolute_error"], "NaN");
    assert!(failed.get("performance").is_none());
}

#[test]
fn scalars_reach_the_kernel_as_device_values_and_chosen_workloads_get_their_axes() {
    let def = definition(SCALED).unwrap();
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("t");
    let imported = flashinfer::import(&def, &ImportOptions::default(), &dir).unwrap();
    let first = imported.task.spec().workloads[0].name.clone();
    let mut eval = ksearch_eval::EvalResult::synthesised("n", ksearch_eval::Status::Passed, "");
    eval.workloads = vec![measured(&first, true, 1_000.0, 2_000.0)];
    let provenance = flashinfer::Provenance {
        run_id: "r",
        timestamp: "2026-12-02T14:00:00Z",
    };
    let exported = flashinfer::export(&dir, "// kernel", &eval, &provenance).unwrap();
    let solution: serde_json::Value = serde_json::from_str(&exported.solution).unwrap();
    let binding = solution["sources"][1]["content"].as_str().unwrap();
    assert!(
        binding.contains("torch::Tensor indptr, double scale, torch::Tensor y"),
        "{binding}"
    );
    assert!(binding.contains("torch::full({}, scale, x.options().dtype(torch::kFloat32))"));
    assert!(binding.contains("const int64_t len_indptr = indptr.size(0);"));
    assert!(binding.contains("const int64_t width = x.size(1);"));
    let trace: serde_json::Value =
        serde_json::from_str(exported.traces.lines().next().unwrap()).unwrap();
    assert_eq!(trace["workload"]["uuid"], format!("ksearch-{first}"));
    assert_eq!(trace["workload"]["axes"]["len_indptr"], 2);
    assert!(
        trace["workload"]["axes"].get("width").is_none(),
        "const axes are the definition's"
    );
    assert_eq!(trace["evaluation"]["environment"]["hardware"], "unknown");

    // A task that was not imported has nothing to export to.
    let err = flashinfer::export(&examples(), "", &eval, &provenance)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not a task imported from FlashInfer-Bench"),
        "{err}"
    );
}
