//! The task-format extensions for GPU backends (str-axis defaults, `{axis}` entry placeholders,
//! per-backend references, language and argument rules of cuda and mlx), on the built-in
//! attention task and on small tasks broken one field at a time.

use ksearch_task::{load_task, resolve, DType, ParamValue, TaskError};
use std::collections::BTreeMap;

fn str_param(w: &ksearch_task::ResolvedWorkload, name: &str) -> Option<String> {
    match w.params.get(name) {
        Some(ParamValue::Str(s)) => Some(s.clone()),
        _ => None,
    }
}

fn int_param(w: &ksearch_task::ResolvedWorkload, name: &str) -> i64 {
    match w.params.get(name) {
        Some(ParamValue::Int(i)) => *i,
        other => panic!("{}: {name} = {other:?}", w.name),
    }
}

#[test]
fn attention_declares_cpu_cuda_and_mlx() {
    let task = resolve("attention").unwrap();
    assert_eq!(task.backend_names(), vec!["cpu", "cuda", "mlx"]);

    let cpu = task.backend("cpu").unwrap();
    assert_eq!(cpu.language, "c");
    assert_eq!(cpu.reference, None);
    assert_eq!(task.reference_for("cpu").unwrap().function, "reference");

    let cuda = task.backend("cuda").unwrap();
    assert_eq!(cuda.language, "cuda");
    assert_eq!(cuda.entry, "attention_{dtype}");
    assert_eq!(cuda.entry_placeholders(), vec!["dtype".to_string()]);
    assert_eq!(cuda.baseline.as_deref(), Some("baseline_torch_sdpa"));
    assert_eq!(cuda.baseline_label(), Some("torch_sdpa"));
    let r = task.reference_for("cuda").unwrap();
    assert_eq!(
        (r.module.as_str(), r.function.as_str()),
        ("reference.py", "reference_torch")
    );
    for f in ["reference", "reference_torch", "baseline_torch_sdpa"] {
        assert!(cuda.forbidden.iter().any(|x| x == f), "cuda forbids {f}");
    }
    assert!(cuda.seed.as_ref().unwrap().ends_with("seed/naive.cu"));

    let mlx = task.backend("mlx").unwrap();
    assert_eq!(mlx.language, "python");
    assert_eq!(mlx.entry, "attention");
    assert!(
        !mlx.args.iter().any(|a| a == "out"),
        "mlx returns its output"
    );
    assert_eq!(task.reference_for("mlx").unwrap().function, "reference_mlx");
    assert_eq!(mlx.baseline.as_deref(), Some("baseline_mlx_native"));
    for f in [
        "reference",
        "reference_mlx",
        "baseline_mlx_native",
        "scaled_dot_product_attention",
    ] {
        assert!(mlx.forbidden.iter().any(|x| x == f), "mlx forbids {f}");
    }
    assert!(task.reference_for("tpu").is_err());
}

#[test]
fn attention_gpu_workloads_resolve_for_cuda_and_mlx() {
    let task = resolve("attention").unwrap();
    let cuda = task.workloads("cuda").unwrap();
    let mlx = task.workloads("mlx").unwrap();
    assert_eq!(cuda, mlx, "both GPU backends run the same workloads");
    let cpu = task.workloads("cpu").unwrap();
    assert!(cpu.iter().all(|w| !cuda.iter().any(|g| g.name == w.name)));

    let spec = task.backend("cuda").unwrap();
    let mut shapes = Vec::new();
    let (mut dtypes, mut causal, mut dims) = (Vec::new(), Vec::new(), Vec::new());
    for w in &cuda {
        let dtype = str_param(w, "dtype").expect("GPU workloads set dtype");
        let d = DType::parse(&dtype).unwrap();
        assert!(matches!(d, DType::F16 | DType::BF16), "{}", w.name);
        for t in w.inputs.iter().chain(&w.outputs) {
            assert_eq!(t.dtype, d, "{}/{}", w.name, t.name);
        }
        let (b, h, l, dd, c) = (
            int_param(w, "B"),
            int_param(w, "H"),
            int_param(w, "L"),
            int_param(w, "D"),
            int_param(w, "causal"),
        );
        assert_eq!(w.inputs[0].shape, vec![b, h, l, dd]);
        // 4·B·H·L²·D, halved when causal; q, k, v and out at 2 bytes an element.
        let full = 4.0 * (b * h * l * l * dd) as f64;
        assert_eq!(
            w.flops,
            if c == 1 { full / 2.0 } else { full },
            "{}",
            w.name
        );
        assert_eq!(w.bytes, (4 * 2 * b * h * l * dd) as f64, "{}", w.name);
        assert_eq!(
            spec.entry_for(&w.params),
            Some(format!("attention_{dtype}"))
        );
        if w.held_out {
            assert_ne!(
                l % 64,
                0,
                "{}: held-out lengths are not multiples of 64",
                w.name
            );
        } else {
            shapes.push((b, h, l, dd));
        }
        dtypes.push(d);
        causal.push(c);
        dims.push(dd);
    }
    for shape in [
        (1, 32, 4096, 128),
        (4, 32, 1024, 128),
        (1, 32, 4096, 64),
        (8, 32, 512, 128),
    ] {
        assert!(shapes.contains(&shape), "missing shown shape {shape:?}");
    }
    assert!(dtypes.contains(&DType::F16) && dtypes.contains(&DType::BF16));
    assert!(causal.contains(&0) && causal.contains(&1));
    assert!(dims.contains(&64) && dims.contains(&128));
    assert!(cuda.iter().filter(|w| w.held_out).count() >= 2);

    // Tolerances of the GPU dtypes as the issue fixes them.
    assert_eq!(task.tolerance(DType::F16).rtol, 2e-3);
    assert_eq!(task.tolerance(DType::F16).atol, 2e-3);
    assert_eq!(task.tolerance(DType::BF16).rtol, 1.6e-2);
    assert_eq!(task.tolerance(DType::BF16).atol, 1.6e-2);
}

#[test]
fn cpu_workloads_take_the_dtype_default_without_listing_it() {
    let task = resolve("attention").unwrap();
    for w in task.workloads("cpu").unwrap() {
        assert!(!w.params.contains_key("dtype"), "{}", w.name);
        assert!(w.inputs.iter().all(|t| t.dtype == DType::F32));
        // elem_bytes = 4 for the default f32: the byte formula of the f32-only task.
        let bhld: i64 = w.inputs[0].shape.iter().product();
        assert_eq!(w.bytes, (16 * bhld) as f64);
    }
    let axis = task.spec().axis("dtype").unwrap();
    assert_eq!(axis.default.as_deref(), Some("f32"));
    let cpu = task.backend("cpu").unwrap();
    assert_eq!(
        cpu.entry_for(&BTreeMap::new()),
        Some("attention_f32".into())
    );
}

#[test]
fn entry_placeholders_fill_from_string_params_only() {
    let task = resolve("attention").unwrap();
    let cuda = task.backend("cuda").unwrap();
    let mut params = BTreeMap::new();
    assert_eq!(cuda.entry_for(&params), None);
    params.insert("dtype".to_string(), ParamValue::Int(3));
    assert_eq!(cuda.entry_for(&params), None);
    params.insert("dtype".to_string(), ParamValue::Str("bf16".into()));
    assert_eq!(cuda.entry_for(&params).as_deref(), Some("attention_bf16"));
}

// -- malformed GPU tasks -----------------------------------------------------------------------

const TASK: &str = r#"format = 1
name = "scale"
kind = "softmax"

[axes.n]
description = "elements"

[axes.dtype]
type = "str"
default = "f32"

[[inputs]]
name = "x"
dtype = "$dtype"
shape = ["n"]

[[outputs]]
name = "y"
dtype = "$dtype"
shape = ["n"]

[[workloads]]
name = "cpu-small"
params = { n = 64 }
backends = ["cpu"]

[[workloads]]
name = "gpu-f16"
params = { n = 1024, dtype = "f16" }
backends = ["cuda", "mlx"]

[[workloads]]
name = "gpu-bf16"
params = { n = 1000, dtype = "bf16" }
held_out = true
backends = ["cuda", "mlx"]

[roofline]
flops = "n"
bytes = "2 * elem_bytes * n"

[backends.cpu]
entry = "scale_f32"
args = ["x", "y", "n"]
signature = "void scale_f32(const float* x, float* y, int64_t n)"
seed = "seed.c"

[backends.cuda]
entry = "scale_{dtype}"
args = ["x", "y", "n"]
signature = 'extern "C" int scale_{dtype}(const void* x, void* y, int64_t n, void* stream)'
seed = "seed.cu"
reference = "reference_torch"

[backends.mlx]
entry = "scale"
args = ["x", "n"]
signature = "def scale(*, x, n)"
seed = "seed.py"
reference = "reference_mlx"
"#;

const REFERENCE: &str = "def reference(inputs, params):\n    pass\n\ndef reference_torch(inputs, params):\n    pass\n\ndef reference_mlx(inputs, params):\n    pass\n";

struct Fixture {
    dir: tempfile::TempDir,
    toml: String,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("reference.py"), REFERENCE).unwrap();
        for f in ["seed.c", "seed.cu", "seed.py"] {
            std::fs::write(dir.path().join(f), "\n").unwrap();
        }
        Fixture {
            dir,
            toml: TASK.to_string(),
        }
    }

    fn replace(mut self, from: &str, to: &str) -> Self {
        assert_eq!(self.toml.matches(from).count(), 1, "edit target {from:?}");
        self.toml = self.toml.replacen(from, to, 1);
        self
    }

    fn load(&self) -> Result<ksearch_task::Task, TaskError> {
        std::fs::write(self.dir.path().join("task.toml"), &self.toml).unwrap();
        load_task(self.dir.path())
    }

    /// The error, which must name `field`.
    fn error(&self, field: &str) -> String {
        match self.load() {
            Ok(t) => panic!("expected an error, loaded {}", t.name()),
            Err(TaskError::Invalid(e)) => {
                assert_eq!(e.field, field, "{e}");
                e.to_string()
            }
            Err(e) => panic!("expected a spec error, got {e}"),
        }
    }
}

#[test]
fn the_gpu_fixture_loads() {
    let task = Fixture::new().load().unwrap();
    let cuda = task.workloads("cuda").unwrap();
    assert_eq!(cuda.len(), 2);
    assert_eq!(cuda[0].inputs[0].dtype, DType::F16);
    assert_eq!(cuda[0].bytes, 2.0 * 2.0 * 1024.0);
    assert_eq!(cuda[1].inputs[0].dtype, DType::BF16);
    let cpu = task.workloads("cpu").unwrap();
    assert_eq!(cpu[0].inputs[0].dtype, DType::F32);
    assert_eq!(cpu[0].bytes, 2.0 * 4.0 * 64.0);
    // Languages default per backend.
    assert_eq!(task.backend("cuda").unwrap().language, "cuda");
    assert_eq!(task.backend("mlx").unwrap().language, "python");
    // The backend reference is forbidden to candidates like the task's.
    let f = &task.backend("cuda").unwrap().forbidden;
    assert!(f.contains(&"reference".to_string()) && f.contains(&"reference_torch".to_string()));
}

#[test]
fn placeholder_must_name_a_str_axis() {
    let e = Fixture::new()
        .replace("entry = \"scale_{dtype}\"", "entry = \"scale_{kind}\"")
        .error("backends.cuda.entry");
    assert!(
        e.contains("`{kind}`") && e.contains("names no str axis"),
        "{e}"
    );
    let e = Fixture::new()
        .replace("entry = \"scale_{dtype}\"", "entry = \"scale_{n}\"")
        .error("backends.cuda.entry");
    assert!(e.contains("names no str axis"), "{e}");
}

#[test]
fn placeholder_entry_must_be_an_identifier_once_filled() {
    let e = Fixture::new()
        .replace("entry = \"scale_{dtype}\"", "entry = \"scale-{dtype}\"")
        .error("backends.cuda.entry");
    assert!(e.contains("not a C identifier"), "{e}");
    let e = Fixture::new()
        .replace("entry = \"scale_{dtype}\"", "entry = \"scale_{dtype\"")
        .error("backends.cuda.entry");
    assert!(e.contains("not a C identifier"), "{e}");
}

#[test]
fn workloads_of_a_placeholder_backend_must_set_the_axis() {
    let e = Fixture::new()
        .replace("{ n = 1024, dtype = \"f16\" }", "{ n = 1024 }")
        .error("workloads[1].params");
    assert!(e.contains("`{dtype}`") && e.contains("set `dtype`"), "{e}");
}

#[test]
fn only_str_axes_take_defaults_and_dtype_defaults_are_dtypes() {
    let e = Fixture::new()
        .replace(
            "description = \"elements\"",
            "description = \"elements\"\ndefault = 8",
        )
        .error("axes.n.default");
    assert!(e.contains("only str axes"), "{e}");
    let e = Fixture::new()
        .replace("default = \"f32\"", "default = 4")
        .error("axes.dtype.default");
    assert!(e.contains("expected a string default"), "{e}");
    let e = Fixture::new()
        .replace("default = \"f32\"", "default = \"float\"")
        .error("axes.dtype.default");
    assert!(e.contains("not a dtype") && e.contains("f32"), "{e}");
    // Without a default, a workload that leaves the axis out is an error as before.
    let e = Fixture::new()
        .replace("default = \"f32\"\n", "")
        .error("workloads[0].params.dtype");
    assert!(e.contains("missing a value for axis `dtype`"), "{e}");
}

#[test]
fn mlx_entries_return_their_outputs() {
    let e = Fixture::new()
        .replace("args = [\"x\", \"n\"]", "args = [\"x\", \"y\", \"n\"]")
        .error("backends.mlx.args");
    assert!(e.contains("returns its outputs"), "{e}");
    let e = Fixture::new()
        .replace("args = [\"x\", \"n\"]", "args = [\"n\"]")
        .error("backends.mlx.args");
    assert!(e.contains("every input;") && e.contains("`x`"), "{e}");
    // cuda still passes outputs as pointers.
    let e = Fixture::new()
        .replace(
            "args = [\"x\", \"y\", \"n\"]\nsignature = 'extern",
            "args = [\"x\", \"n\"]\nsignature = 'extern",
        )
        .error("backends.cuda.args");
    assert!(e.contains("every input and output"), "{e}");
}

#[test]
fn backend_languages_are_checked() {
    let e = Fixture::new()
        .replace(
            "seed = \"seed.cu\"",
            "seed = \"seed.cu\"\nlanguage = \"c++\"",
        )
        .error("backends.cuda.language");
    assert!(e.contains("compiles \"cuda\""), "{e}");
    let e = Fixture::new()
        .replace(
            "seed = \"seed.py\"",
            "seed = \"seed.py\"\nlanguage = \"cuda\"",
        )
        .error("backends.mlx.language");
    assert!(e.contains("runs \"python\" modules"), "{e}");
}

#[test]
fn backend_reference_must_exist() {
    let e = Fixture::new()
        .replace(
            "reference = \"reference_torch\"",
            "reference = \"reference_cuda\"",
        )
        .error("backends.cuda.reference");
    assert!(
        e.contains("defines no top-level function `reference_cuda`"),
        "{e}"
    );
    let e = Fixture::new()
        .replace("reference = \"reference_mlx\"", "reference = \"ref mlx\"")
        .error("backends.mlx.reference");
    assert!(e.contains("not a Python identifier"), "{e}");
}
