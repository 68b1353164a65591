//! A ksearch kernel of an imported FlashInfer-Bench task as a FlashInfer-Bench Solution, and
//! its evaluation as Trace lines.
//!
//! The Solution holds two sources: `kernel.cu` (the kernel as ksearch evaluated it, whose C
//! entry takes device pointers in the definition's order, then every axis as `int64_t`, then
//! the stream) and `binding.cpp`, a PyTorch extension entry `run` in FlashInfer-Bench's
//! destination-passing style (`binding: "torch"`): it checks the tensors, reads each axis from
//! the first tensor whose shape names it, puts scalar inputs in 0-d device tensors, and calls
//! the kernel on PyTorch's current stream. PyTorch builds the extension for the GPU's own
//! architecture (`sm_90`, not `sm_90a`), so a kernel that needs sm_90a instructions (wgmma,
//! setmaxnreg) needs `TORCH_CUDA_ARCH_LIST=9.0a` there.
//!
//! A Trace line per evaluated workload carries the workload as the dataset gave it (or, for
//! workloads chosen at import, its axes with random inputs), the status, the errors and the
//! median times: the kernel's and the timed baseline's, which for an imported task is the
//! definition's reference.

use super::{read_definition, AxisDef, Definition, TensorDef, DEFINITION_FILE, WORKLOADS_FILE};
use crate::ImportError;
use ksearch_eval::EvalResult;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::Path;

/// What `ksearch export --format flashinfer` writes.
#[derive(Clone, Debug, PartialEq)]
pub struct SolutionExport {
    /// The Solution, pretty-printed as the dataset's `solutions/**/*.json` files are.
    pub solution: String,
    /// One Trace per evaluated shown workload, JSON lines.
    pub traces: String,
    /// The Solution's name.
    pub name: String,
}

/// Facts about the evaluation that the run store has and the result does not.
#[derive(Clone, Debug)]
pub struct Provenance<'a> {
    pub run_id: &'a str,
    /// When the evaluation ran, ISO 8601.
    pub timestamp: &'a str,
}

/// The device an evaluation timed the kernel on, as its environment names it.
fn hardware(eval: &EvalResult) -> String {
    let env = eval.environment.as_ref();
    ["gpu", "cpu_model"]
        .iter()
        .find_map(|k| env.and_then(|e| e.get(*k)).and_then(Value::as_str))
        .unwrap_or("unknown")
        .to_string()
}

/// The Solution and Traces of `source`, the kernel that `eval` evaluated, for the imported
/// task in `task_dir`.
pub fn export(
    task_dir: &Path,
    source: &str,
    eval: &EvalResult,
    provenance: &Provenance<'_>,
) -> Result<SolutionExport, ImportError> {
    let def_path = task_dir.join(DEFINITION_FILE);
    if !def_path.is_file() {
        return Err(ImportError::Invalid {
            path: task_dir.to_path_buf(),
            message: format!(
                "not a task imported from FlashInfer-Bench (no {DEFINITION_FILE}): \
                 `ksearch import flashinfer` writes one"
            ),
        });
    }
    let def = read_definition(&def_path)?;
    let task = ksearch_task::load_task(task_dir).map_err(|e| ImportError::Generated {
        dir: task_dir.to_path_buf(),
        message: e.to_string(),
    })?;
    let entry =
        task.backend("cuda")
            .map(|b| b.entry.clone())
            .map_err(|e| ImportError::Generated {
                dir: task_dir.to_path_buf(),
                message: e.to_string(),
            })?;
    let given: Vec<Value> = match std::fs::read_to_string(task_dir.join(WORKLOADS_FILE)) {
        Ok(text) => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .map(|v| v["workload"].clone())
            .collect(),
        Err(_) => Vec::new(),
    };
    let name = format!("{}_ksearch_{}", def.name, provenance.run_id);
    let hardware = hardware(eval);
    let solution = json!({
        "name": name,
        "definition": def.name,
        "author": "ksearch",
        "description": format!(
            "Found by ksearch run {} (best kernel, re-evaluated on {}); kernel.cu is ksearch's \
             cuda entry, binding.cpp the PyTorch binding FlashInfer-Bench calls.",
            provenance.run_id, hardware
        ),
        "spec": {
            "language": "cuda",
            "target_hardware": [hardware],
            "entry_point": "binding.cpp::run",
            "dependencies": [],
            "destination_passing_style": true,
            "binding": "torch",
        },
        "sources": [
            {"path": "kernel.cu", "content": source},
            {"path": "binding.cpp", "content": binding(&def, &entry)?},
        ],
    });
    let mut traces = String::new();
    for w in eval.workloads.iter().filter(|w| !w.held_out) {
        let workload = match workload_index(&w.name).and_then(|i| given.get(i)) {
            Some(v) => v.clone(),
            None => chosen_workload(&def, &task, &w.name),
        };
        let environment = json!({
            "hardware": hardware,
            "libs": libs(eval),
        });
        let correctness = json!({
            "max_relative_error": w.max_rel_err.unwrap_or(f64::NAN),
            "max_absolute_error": w.max_abs_err.unwrap_or(f64::NAN),
        });
        let reference_ns = w.baseline_median_ns.or(w.reference_median_ns);
        let mut evaluation = json!({
            "environment": environment,
            "timestamp": provenance.timestamp,
            "log": "",
        });
        match (w.correct, w.candidate_median_ns, reference_ns) {
            (Some(true), Some(kernel), Some(reference)) if kernel > 0.0 => {
                evaluation["status"] = json!("PASSED");
                evaluation["correctness"] = correctness;
                evaluation["performance"] = json!({
                    "latency_ms": kernel / 1e6,
                    "reference_latency_ms": reference / 1e6,
                    "speedup_factor": reference / kernel,
                });
            }
            (Some(false), _, _) => {
                evaluation["status"] = json!("INCORRECT_NUMERICAL");
                evaluation["correctness"] = correctness;
            }
            _ => {
                evaluation["status"] = json!("RUNTIME_ERROR");
                evaluation["log"] = json!(format!("ksearch: {} ({})", eval.status, eval.message));
            }
        }
        let line = json!({
            "definition": def.name,
            "workload": workload,
            "solution": name,
            "evaluation": evaluation,
        });
        let _ = writeln!(traces, "{}", nan_as_string(line));
    }
    Ok(SolutionExport {
        solution: serde_json::to_string_pretty(&solution).unwrap_or_default() + "\n",
        traces,
        name,
    })
}

/// `w<index>-...`, the names `import` gives workloads read from a trace file.
fn workload_index(name: &str) -> Option<usize> {
    let rest = name.strip_prefix('w')?;
    rest.split('-').next()?.parse().ok()
}

/// A workload chosen at import: its var axes, random tensors and its scalar values as the
/// task has them (none: chosen workloads draw scalars too).
fn chosen_workload(def: &Definition, task: &ksearch_task::Task, name: &str) -> Value {
    let params = task
        .spec()
        .workloads
        .iter()
        .find(|w| w.name == name)
        .map(|w| w.params.clone())
        .unwrap_or_default();
    let axes: serde_json::Map<String, Value> = def
        .axes
        .iter()
        .filter(|(_, a)| matches!(a, AxisDef::Var { .. }))
        .filter_map(|(n, _)| match params.get(n) {
            Some(ksearch_task::ParamValue::Int(v)) => Some((n.clone(), json!(v))),
            _ => None,
        })
        .collect();
    let inputs: serde_json::Map<String, Value> = def
        .inputs
        .iter()
        .map(|t| (t.name.clone(), json!({"type": "random"})))
        .collect();
    json!({"uuid": format!("ksearch-{name}"), "axes": axes, "inputs": inputs})
}

/// The libraries of the evaluation's environment that FlashInfer-Bench records.
fn libs(eval: &EvalResult) -> Value {
    let mut libs = serde_json::Map::new();
    libs.insert("ksearch".into(), json!(env!("CARGO_PKG_VERSION")));
    if let Some(env) = &eval.environment {
        for key in ["torch", "torch_cuda", "compiler", "numpy", "python"] {
            if let Some(v) = env.get(key).and_then(Value::as_str) {
                libs.insert(key.into(), json!(v));
            }
        }
    }
    Value::Object(libs)
}

/// FlashInfer-Bench writes non-finite errors as the strings "NaN" and "Infinity"; serde_json
/// would write `null`.
fn nan_as_string(mut v: Value) -> Value {
    if let Some(c) = v.pointer_mut("/evaluation/correctness") {
        for key in ["max_relative_error", "max_absolute_error"] {
            if let Some(x) = c.get(key).and_then(Value::as_f64).or(Some(f64::NAN)) {
                if !x.is_finite() {
                    c[key] = json!(if x.is_nan() {
                        "NaN"
                    } else if x > 0.0 {
                        "Infinity"
                    } else {
                        "-Infinity"
                    });
                }
            }
        }
    }
    v
}

/// The C++ type of a scalar input in the binding's signature, and its torch dtype.
fn scalar_types(t: &TensorDef) -> (&'static str, &'static str) {
    match t.dtype.as_str() {
        "int32" => ("int64_t", "torch::kInt32"),
        "int64" => ("int64_t", "torch::kInt64"),
        "float16" => ("double", "torch::kHalf"),
        "bfloat16" => ("double", "torch::kBFloat16"),
        _ => ("double", "torch::kFloat32"),
    }
}

/// `binding.cpp`: FlashInfer-Bench's `run(inputs..., outputs...)` over ksearch's C entry.
fn binding(def: &Definition, entry: &str) -> Result<String, ImportError> {
    let tensors: Vec<&TensorDef> = def.inputs.iter().chain(&def.outputs).collect();
    let first_tensor = tensors
        .iter()
        .find(|t| t.shape.is_some())
        .map(|t| t.name.clone())
        .unwrap_or_default();
    let mut params = Vec::new();
    let mut prologue = String::new();
    let mut ptrs = Vec::new();
    for t in &tensors {
        if t.shape.is_some() {
            params.push(format!("torch::Tensor {}", t.name));
            let _ = writeln!(
                prologue,
                "  TORCH_CHECK({n}.is_cuda() && {n}.is_contiguous(), \"{n} must be a contiguous CUDA tensor\");",
                n = t.name
            );
            ptrs.push(format!("{}.data_ptr()", t.name));
        } else {
            let (cty, dtype) = scalar_types(t);
            params.push(format!("{cty} {}", t.name));
            let _ = writeln!(
                prologue,
                "  const torch::Tensor {n}_on_device = torch::full({{}}, {n}, {first}.options().dtype({dtype}));",
                n = t.name,
                first = first_tensor
            );
            ptrs.push(format!("{}_on_device.data_ptr()", t.name));
        }
    }
    let mut axes = String::new();
    let mut axis_args = Vec::new();
    for (name, axis) in &def.axes {
        let source = tensors.iter().find_map(|t| {
            let dim = t.shape.as_ref()?.iter().position(|a| a == name)?;
            Some(format!("{}.size({dim})", t.name))
        });
        let value = match (source, axis) {
            (Some(s), _) => s,
            (None, AxisDef::Const { value, .. }) => value.to_string(),
            (None, AxisDef::Var { .. }) => {
                return Err(ImportError::Invalid {
                    path: DEFINITION_FILE.into(),
                    message: format!(
                        "axis `{name}` is in no tensor's shape: the binding cannot read it"
                    ),
                })
            }
        };
        let _ = writeln!(axes, "  const int64_t {name} = {value};");
        axis_args.push(name.clone());
    }
    let mut c_params: Vec<String> = def
        .inputs
        .iter()
        .map(|_| "const void*".to_string())
        .collect();
    c_params.extend(def.outputs.iter().map(|_| "void*".to_string()));
    c_params.extend(def.axes.iter().map(|_| "int64_t".to_string()));
    c_params.push("void*".into());
    let mut call: Vec<String> = ptrs;
    call.extend(axis_args);
    call.push("at::cuda::getCurrentCUDAStream().stream()".into());
    Ok(format!(
        "// FlashInfer-Bench's entry point for the ksearch kernel in kernel.cu (binding \"torch\",\n\
         // destination-passing style): the definition's inputs, then its outputs; each axis read\n\
         // from the first tensor whose shape names it; scalars put in 0-d device tensors; the\n\
         // kernel runs on PyTorch's current stream. Written by `ksearch export --format flashinfer`.\n\
         #include <ATen/cuda/CUDAContext.h>\n\
         #include <torch/extension.h>\n\n\
         extern \"C\" int {entry}({c_params});\n\n\
         void run({params}) {{\n{prologue}{axes}  const int err = {entry}(\n      {call});\n  \
         TORCH_CHECK(err == 0, \"{entry} failed: \", cudaGetErrorString(static_cast<cudaError_t>(err)));\n}}\n\n\
         PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ m.def(\"run\", &run); }}\n",
        c_params = c_params.join(", "),
        params = params.join(", "),
        call = call.join(", "),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imported_workload_names_give_back_their_line() {
        assert_eq!(workload_index("w0-00005eed"), Some(0));
        assert_eq!(workload_index("w12-abc"), Some(12));
        assert_eq!(workload_index("batch_size16"), None);
    }
}
