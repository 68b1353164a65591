//! KernelBench problems → ksearch tasks for the cuda backend.
//!
//! A KernelBench problem is a Python module: `class Model(nn.Module)` built from
//! `get_init_inputs()` and called on `get_inputs()`, with the sizes as module constants. Its
//! shapes, dtypes, parameters and outputs are only known by running it, so the import runs
//! [`INTROSPECT_PY`] with an interpreter that has PyTorch (the harness's choice for the cuda
//! backend), then writes a task from what it printed ([`Introspection`]):
//!
//! - **inputs**: `forward`'s tensor arguments (named as `forward` names them), then the model's
//!   parameters and buffers (`conv.weight` → `conv_weight`), in that order; each is drawn by a
//!   generator in `reference.py` that calls `get_inputs()`, or builds the `Model`, under a
//!   seed from the harness, so values follow the problem's own distributions and change per
//!   trial;
//! - **outputs**: `out` (or `out0`, `out1`, … for a tuple);
//! - **reference and baseline**: the `Model` on the GPU with its parameters and buffers loaded
//!   from the inputs, as KernelBench times its PyTorch baseline;
//! - **the kernel**: a CUDA C entry `kernelbench_<problem>` taking device pointers to the inputs
//!   and outputs, then the stream, like the built-in cuda tasks (not a `ModelNew` calling
//!   PyTorch: the harness's provenance checks reject library kernels);
//! - **one workload**, `default`: the problem's fixed sizes (KernelBench has no other), so there
//!   is nothing held out;
//! - **tolerance**: KernelBench's (1e-4 for float32, 1e-2 for float16 and bfloat16) under the
//!   `either` rule, which passes an element within the larger of the two bounds where
//!   `torch.allclose` allows their sum: at most twice as strict.

use crate::flashinfer::{Content, Rendered};
use crate::toml_text::{string, string_list};
use crate::ImportError;
use serde::Deserialize;
use std::fmt::Write as _;
use std::path::Path;

/// Prints, as one JSON object, what a task needs to know of the KernelBench problem whose path
/// is `sys.argv[1]`: `forward`'s arguments, the model's parameters, buffers and outputs (the
/// forward pass runs once, on the GPU when there is one).
pub const INTROSPECT_PY: &str = r#"
import importlib.util, inspect, json, sys
import torch

def describe(t):
    return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}

spec = importlib.util.spec_from_file_location("kernelbench_problem", sys.argv[1])
problem = importlib.util.module_from_spec(spec)
spec.loader.exec_module(problem)
torch.manual_seed(42)
init = list(problem.get_init_inputs())
model = problem.Model(*init)
torch.manual_seed(42)
inputs = list(problem.get_inputs())
names = []
for p in inspect.signature(model.forward).parameters.values():
    if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
        names.append(p.name)
args = []
for i, x in enumerate(inputs):
    name = names[i] if i < len(names) else f"arg{i}"
    if isinstance(x, torch.Tensor):
        args.append({"name": name, **describe(x)})
    else:
        args.append({"name": name, "value": x})
device = "cuda" if torch.cuda.is_available() else "cpu"
with torch.no_grad():
    out = model.to(device)(*[x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs])
outs = list(out) if isinstance(out, (tuple, list)) else [out]
print(json.dumps({
    "inputs": args,
    "parameters": [{"name": n, **describe(p)} for n, p in model.named_parameters()],
    "buffers": [{"name": n, **describe(b)} for n, b in model.named_buffers()],
    "outputs": [describe(o) for o in outs],
}))
"#;

/// A tensor (or, for `forward` arguments, a plain value) as the introspection saw it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Seen {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub shape: Option<Vec<i64>>,
    #[serde(default)]
    pub dtype: Option<String>,
    /// A non-tensor argument's value.
    #[serde(default)]
    pub value: Option<serde_json::Value>,
}

/// What [`INTROSPECT_PY`] prints.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Introspection {
    pub inputs: Vec<Seen>,
    pub parameters: Vec<Seen>,
    pub buffers: Vec<Seen>,
    pub outputs: Vec<Seen>,
}

/// Runs [`INTROSPECT_PY`] on `problem` with `python`, which must have PyTorch.
pub fn introspect(python: &Path, problem: &Path) -> Result<Introspection, ImportError> {
    let out = std::process::Command::new(python)
        .arg("-c")
        .arg(INTROSPECT_PY)
        .arg(problem)
        .output()
        .map_err(|source| ImportError::Io {
            path: python.to_path_buf(),
            source,
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(12).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(ImportError::Invalid {
            path: problem.to_path_buf(),
            message: format!(
                "running the problem with {} failed (it needs PyTorch):\n{}",
                python.display(),
                tail.join("\n")
            ),
        });
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or("");
    serde_json::from_str(last).map_err(|e| ImportError::Invalid {
        path: problem.to_path_buf(),
        message: format!("the introspection printed no usable JSON ({e})"),
    })
}

fn dtype(path: &Path, at: &str, name: Option<&str>) -> Result<&'static str, ImportError> {
    Ok(match name {
        Some("float32") => "f32",
        Some("float16") => "f16",
        Some("bfloat16") => "bf16",
        Some("float64") => "f64",
        Some("int32") => "i32",
        Some("int64") => "i64",
        other => {
            return Err(ImportError::Invalid {
                path: path.to_path_buf(),
                message: format!(
                    "{at}: dtype {} is not supported by ksearch tasks",
                    other.unwrap_or("(none)")
                ),
            })
        }
    })
}

/// `name` with every character outside `[A-Za-z0-9_]` replaced by `_`.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// `[A-Za-z0-9_]` only, never starting with a digit.
fn identifier(name: &str) -> String {
    let mut out = sanitize(name);
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, 'k');
    }
    out
}

/// One tensor of the task, and where its values come from.
struct TaskTensor {
    name: String,
    dtype: &'static str,
    shape: Vec<i64>,
    source: Source,
}

enum Source {
    /// `get_inputs()[index]`.
    Forward(usize),
    /// `Model(...).<path>` (a parameter or buffer).
    Model(String),
    Output,
}

/// The task for the problem at `problem` (its text is copied in as `problem.py`).
pub fn render(problem: &Path, seen: &Introspection) -> Result<Rendered, ImportError> {
    let stem = problem
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "problem".into());
    let task_name = format!("kernelbench_{}", sanitize(&stem));
    let mut notes = Vec::new();
    let mut tensors: Vec<TaskTensor> = Vec::new();
    let mut constants = Vec::new();
    let taken = |tensors: &[TaskTensor], n: &str| tensors.iter().any(|t| t.name == n);
    for (i, a) in seen.inputs.iter().enumerate() {
        let Some(shape) = &a.shape else {
            constants.push(format!(
                "{} = {}",
                a.name,
                a.value.clone().unwrap_or_default()
            ));
            continue;
        };
        let name = identifier(&a.name);
        if taken(&tensors, &name) {
            return Err(ImportError::Invalid {
                path: problem.to_path_buf(),
                message: format!("two forward arguments are named `{name}`"),
            });
        }
        tensors.push(TaskTensor {
            dtype: dtype(
                problem,
                &format!("forward argument `{}`", a.name),
                a.dtype.as_deref(),
            )?,
            name,
            shape: shape.clone(),
            source: Source::Forward(i),
        });
    }
    if !constants.is_empty() {
        notes.push(format!(
            "non-tensor forward arguments are fixed at their values and not passed to the kernel: {}",
            constants.join(", ")
        ));
    }
    for p in seen.parameters.iter().chain(&seen.buffers) {
        let mut name = identifier(&p.name);
        if taken(&tensors, &name) {
            name = format!("p_{name}");
        }
        tensors.push(TaskTensor {
            dtype: dtype(
                problem,
                &format!("model tensor `{}`", p.name),
                p.dtype.as_deref(),
            )?,
            name,
            shape: p.shape.clone().unwrap_or_default(),
            source: Source::Model(p.name.clone()),
        });
    }
    let outputs: Vec<TaskTensor> = seen
        .outputs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            Ok(TaskTensor {
                name: if seen.outputs.len() == 1 {
                    "out".into()
                } else {
                    format!("out{i}")
                },
                dtype: dtype(problem, &format!("output {i}"), o.dtype.as_deref())?,
                shape: o.shape.clone().unwrap_or_default(),
                source: Source::Output,
            })
        })
        .collect::<Result<_, ImportError>>()?;
    if outputs.is_empty() {
        return Err(ImportError::Invalid {
            path: problem.to_path_buf(),
            message: "the model returned no tensor".into(),
        });
    }
    if let Some(o) = outputs.iter().find(|o| taken(&tensors, &o.name)) {
        return Err(ImportError::Invalid {
            path: problem.to_path_buf(),
            message: format!("an input is named `{}`, like an output", o.name),
        });
    }
    let source = std::fs::read_to_string(problem).map_err(|source| ImportError::Io {
        path: problem.to_path_buf(),
        source,
    })?;
    if !source.contains("class Model") || !source.contains("def get_inputs") {
        return Err(ImportError::Invalid {
            path: problem.to_path_buf(),
            message: "not a KernelBench problem (no `class Model` or `get_inputs`)".into(),
        });
    }
    notes.push(
        "one workload, the problem's own sizes: nothing is held out (`ksearch tasks --check` says so)"
            .into(),
    );
    let files = vec![
        (
            "task.toml".into(),
            Content::Text(task_toml(&task_name, &stem, &tensors, &outputs)),
        ),
        (
            "reference.py".into(),
            Content::Text(reference_py(&stem, &tensors, &outputs)),
        ),
        ("problem.py".into(), Content::Text(source)),
        (
            "README.md".into(),
            Content::Text(readme(&stem, &task_name, &notes)),
        ),
    ];
    Ok(Rendered { files, notes })
}

fn task_toml(task: &str, stem: &str, inputs: &[TaskTensor], outputs: &[TaskTensor]) -> String {
    let mut s = format!(
        "# Imported from the KernelBench problem `{stem}` by `ksearch import kernelbench`.\n\
         # docs/task-format.md describes every field.\nformat = 1\nname = {}\nkind = {}\n\
         description = {}\n",
        string(task),
        string(task),
        string(&format!(
            "KernelBench problem {stem}: the forward pass of problem.py's Model, whose parameters \
             and buffers are inputs too. problem.py is the specification."
        )),
    );
    let shape = |t: &TaskTensor| {
        format!(
            "[{}]",
            t.shape
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    for t in inputs {
        let what = match &t.source {
            Source::Forward(i) => format!("forward argument {i} (get_inputs()[{i}])"),
            Source::Model(p) => format!("the model's `{p}`"),
            Source::Output => String::new(),
        };
        let _ = writeln!(
            s,
            "\n[[inputs]]\nname = {}\ndtype = {}\nshape = {}\ndist = {{ kind = \"custom\" }}\ndescription = {}",
            string(&t.name),
            string(t.dtype),
            shape(t),
            string(&what)
        );
    }
    for t in outputs {
        let _ = writeln!(
            s,
            "\n[[outputs]]\nname = {}\ndtype = {}\nshape = {}",
            string(&t.name),
            string(t.dtype),
            shape(t)
        );
    }
    let _ = writeln!(s, "\n[[workloads]]\nname = \"default\"\nparams = {{}}");
    let mut dtypes: Vec<&str> = outputs.iter().map(|t| t.dtype).collect();
    dtypes.sort_unstable();
    dtypes.dedup();
    for d in dtypes {
        let tol = if d == "f16" || d == "bf16" {
            "1e-2"
        } else {
            "1e-4"
        };
        let _ = writeln!(
            s,
            "\n[tolerance.{d}]\nrule = \"either\"\nrtol = {tol}\natol = {tol}"
        );
    }
    let bytes: i64 = outputs
        .iter()
        .map(|t| {
            let size = ksearch_task::DType::parse(t.dtype).map_or(4, |d| d.size_bytes() as i64);
            size * t.shape.iter().product::<i64>()
        })
        .sum();
    let _ = writeln!(
        s,
        "\n# A floor that cannot exceed the truth: the outputs' bytes, no flops. Raise it to the\n\
         # problem's real traffic and work once known.\n[roofline]\nflops = \"0\"\nbytes = \"{bytes}\"\n\n\
         [reference]\nmodule = \"reference.py\"\nfunction = \"reference\""
    );
    let mut args: Vec<&str> = inputs.iter().map(|t| t.name.as_str()).collect();
    args.extend(outputs.iter().map(|t| t.name.as_str()));
    let mut params: Vec<String> = inputs
        .iter()
        .map(|t| format!("const void* {}", t.name))
        .collect();
    params.extend(outputs.iter().map(|t| format!("void* {}", t.name)));
    params.push("void* stream".into());
    let _ = writeln!(
        s,
        "\n[backends.cuda]\nentry = {}\nargs = {}\nsignature = {}\nreference = \"reference_torch\"\nbaseline = \"baseline_torch\"",
        string(task),
        string_list(&args),
        string(&format!("extern \"C\" int {task}({})", params.join(", "))),
    );
    s
}

fn reference_py(stem: &str, inputs: &[TaskTensor], outputs: &[TaskTensor]) -> String {
    let forward: Vec<String> = inputs
        .iter()
        .filter(|t| matches!(t.source, Source::Forward(_)))
        .map(|t| format!("{:?}", t.name))
        .collect();
    let model: Vec<String> = inputs
        .iter()
        .filter_map(|t| match &t.source {
            Source::Model(p) => Some(format!("({:?}, {p:?})", t.name)),
            _ => None,
        })
        .collect();
    let outs: Vec<String> = outputs.iter().map(|t| format!("{:?}", t.name)).collect();
    let mut s = format!(
        r#""""Reference of the KernelBench problem `{stem}`, imported by `ksearch import kernelbench`.

problem.py is the problem, verbatim. The reference (and the timed baseline, as KernelBench times
PyTorch) is its Model on the GPU, with its parameters and buffers loaded from the task's inputs;
every input is drawn by calling the problem's own get_inputs() or building its Model under a
seed from the harness. PyTorch is imported on first use.
"""

import importlib.util
from pathlib import Path

import numpy as np

FORWARD = [{forward}]
# (input name, the model's parameter or buffer)
MODEL_TENSORS = [{model}]
OUTPUTS = [{outs}]
_CACHE = {{}}


def _problem():
    if "problem" not in _CACHE:
        path = Path(__file__).with_name("problem.py")
        spec = importlib.util.spec_from_file_location("kernelbench_problem", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _CACHE["problem"] = module
    return _CACHE["problem"]


def _host(t):
    import torch

    t = t.detach().to("cpu")
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy()


def _seed(rng):
    return int(rng.integers(0, 2**31 - 1))


def _forward_input(rng, index):
    import torch

    torch.manual_seed(_seed(rng))
    return _host(_problem().get_inputs()[index])


def _model_tensor(rng, path):
    import torch

    torch.manual_seed(_seed(rng))
    problem = _problem()
    model = problem.Model(*problem.get_init_inputs())
    tensors = dict(model.named_parameters())
    tensors.update(dict(model.named_buffers()))
    return _host(tensors[path])


def _model(device):
    if "model" not in _CACHE:
        problem = _problem()
        _CACHE["model"] = problem.Model(*problem.get_init_inputs()).to(device)
    return _CACHE["model"]


def _call(inputs, params):
    import torch
    from ksearch_harness.adapters import device

    t = device.torch_inputs(inputs, params)
    first = t[FORWARD[0]] if FORWARD else t[MODEL_TENSORS[0][0]]
    model = _model(first.device)
    with torch.no_grad():
        own = dict(model.named_parameters())
        own.update(dict(model.named_buffers()))
        for name, path in MODEL_TENSORS:
            own[path].copy_(t[name])
        result = model(*[t[n] for n in FORWARD])
    results = result if isinstance(result, (tuple, list)) else (result,)
    return {{n: device.host(r) for n, r in zip(OUTPUTS, results)}}


def reference(inputs, params):
    """Ground truth: the problem's Model (needs PyTorch and a CUDA device)."""
    return _call(inputs, params)


def reference_torch(inputs, params):
    """The cuda backend's reference: the problem's Model on the GPU."""
    return _call(inputs, params)


def baseline_torch(inputs, params):
    """The timed baseline: the problem's Model in PyTorch, as KernelBench times it."""
    return _call(inputs, params)
"#,
        forward = forward.join(", "),
        model = model.join(", "),
        outs = outs.join(", "),
    );
    for t in inputs {
        let body = match &t.source {
            Source::Forward(i) => format!("_forward_input(rng, {i})"),
            Source::Model(p) => format!("_model_tensor(rng, {p:?})"),
            Source::Output => continue,
        };
        let _ = write!(
            s,
            "\n\ndef make_{}(rng, shape, params):\n    return {body}\n",
            t.name
        );
    }
    s
}

fn readme(stem: &str, task: &str, notes: &[String]) -> String {
    let mut s = format!(
        "# {task}\n\nImported from the KernelBench problem `{stem}` (problem.py, verbatim) by \
         `ksearch import kernelbench`. The kernel is a CUDA C entry `{task}` taking the inputs \
         (forward's tensors, then the model's parameters and buffers) and the outputs as device \
         pointers, then the stream (`task.toml`, `[backends.cuda]`); the reference and the \
         timed baseline are the problem's Model in PyTorch on the GPU. Evaluating needs \
         PyTorch and a CUDA GPU.\n\nWhat the import decided:\n\n"
    );
    for n in notes {
        let _ = writeln!(s, "- {n}");
    }
    s
}

/// Writes the task for `problem` into `out` (which must not exist or be empty) from what
/// [`introspect`] saw, and loads it.
pub fn import(
    problem: &Path,
    seen: &Introspection,
    out: &Path,
) -> Result<crate::flashinfer::Imported, ImportError> {
    let rendered = render(problem, seen)?;
    crate::flashinfer::write_task(rendered, out)
}
