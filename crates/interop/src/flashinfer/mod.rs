//! FlashInfer-Bench definitions and workload traces → a ksearch task for the cuda backend.
//!
//! A definition names its axes (`const` with a value, or `var`, bound per workload), its inputs
//! and outputs in calling order with shapes over those axes, Python constraints over the axes
//! and a PyTorch reference: a top-level `run(*inputs)` returning the outputs. The written task:
//!
//! - **axes**: every axis becomes an int axis; a const axis declares `values = [v]`, so kernels
//!   may specialise on it, and every workload binds it to `v`;
//! - **tensors**: same names, order and shapes (axis names are valid shape expressions); a
//!   scalar input (`"shape": null`) becomes a 0-d tensor of its dtype, turned back into a Python
//!   number for `run`; `random` inputs are drawn as FlashInfer-Bench draws them (floats from a
//!   standard normal, integers uniform on [-1024, 1024)); scalar values from workloads come
//!   from a generator in `reference.py`;
//! - **reference**: `run` verbatim in `definition_reference.py`, which `reference.py` loads on
//!   first use and calls on the harness's device tensors;
//!   it is also the timed baseline, as FlashInfer-Bench's speedup is against its reference;
//! - **cuda backend**: entry named after the definition, arguments in the definition's order
//!   (inputs, outputs, then every axis as `int64_t`) and the stream last, like the built-in
//!   cuda tasks;
//! - **workloads**: those of the given workload traces, or, without any, three chosen from the
//!   axes (free var axes at 1, 16 and 128, axes fixed by an equality constraint computed from
//!   it) and one held out (7), said in the README. Of four or more given workloads every
//!   fourth is held out (checked for correctness, not timed).
//!
//! Not supported yet, with a clear error: `safetensors` inputs, fp8/fp4/int8/int16/bool
//! tensors and scalar outputs. Constraints that are not comparisons of arithmetic over axes
//! are listed in the README as unchecked.

mod solution;
pub use solution::{export, Provenance, SolutionExport};

use crate::safetensors;
use crate::toml_text::{inline_ints, key, string, string_list};
use crate::ImportError;
use ksearch_task::{Expr, Num};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// An axis of a definition.
#[derive(Clone, Debug, PartialEq)]
pub enum AxisDef {
    /// Fixed by the definition.
    Const { value: i64, description: String },
    /// Bound by each workload.
    Var { description: String },
}

/// An input or output of a definition.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorDef {
    pub name: String,
    /// Axis names, outermost first; `None` is a Python scalar.
    pub shape: Option<Vec<String>>,
    /// FlashInfer-Bench's dtype name (`float32`, `bfloat16`, …).
    pub dtype: String,
    pub description: String,
}

/// A FlashInfer-Bench definition, in the order its file declares axes and tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct Definition {
    pub name: String,
    pub op_type: String,
    pub axes: Vec<(String, AxisDef)>,
    pub inputs: Vec<TensorDef>,
    pub outputs: Vec<TensorDef>,
    pub reference: String,
    pub constraints: Vec<String>,
    pub description: String,
    pub tags: Vec<String>,
    /// The definition file's text, kept in imported tasks as `definition.json`.
    pub json: String,
}

/// How a workload provides one input.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkloadInput {
    Random,
    Scalar(f64),
    Safetensors { path: String, tensor_key: String },
}

/// One workload of a definition: values of its var axes and how each input is provided.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub uuid: String,
    pub axes: BTreeMap<String, i64>,
    pub inputs: BTreeMap<String, WorkloadInput>,
    /// The trace line's `workload` object as read, for the traces of an export.
    pub json: Value,
}

#[derive(Deserialize)]
struct RawDefinition {
    name: String,
    op_type: String,
    axes: Map<String, Value>,
    inputs: Map<String, Value>,
    outputs: Map<String, Value>,
    reference: String,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    constraints: Vec<String>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum RawAxis {
    Const {
        value: i64,
        #[serde(default)]
        description: Option<String>,
    },
    Var {
        #[serde(default)]
        description: Option<String>,
    },
}

#[derive(Deserialize)]
struct RawTensor {
    shape: Option<Vec<String>>,
    dtype: String,
    #[serde(default)]
    description: Option<String>,
}

#[derive(Deserialize)]
struct RawTraceLine {
    definition: String,
    workload: RawWorkload,
}

#[derive(Deserialize)]
struct RawWorkload {
    uuid: String,
    axes: BTreeMap<String, i64>,
    inputs: BTreeMap<String, RawInput>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum RawInput {
    Random,
    Scalar { value: Value },
    Safetensors { path: String, tensor_key: String },
}

fn read(path: &Path) -> Result<String, ImportError> {
    std::fs::read_to_string(path).map_err(|source| ImportError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn invalid(path: &Path, message: impl Into<String>) -> ImportError {
    ImportError::Invalid {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Reads a definition file (`definitions/**/<name>.json`).
pub fn read_definition(path: &Path) -> Result<Definition, ImportError> {
    parse_definition(&read(path)?, path)
}

/// Parses and checks a definition; `path` is only used in messages.
pub fn parse_definition(text: &str, path: &Path) -> Result<Definition, ImportError> {
    let raw: RawDefinition = serde_json::from_str(text).map_err(|e| ImportError::Parse {
        path: path.to_path_buf(),
        line: e.line(),
        message: e.to_string(),
    })?;
    if raw.name.trim().is_empty() {
        return Err(invalid(path, "`name` is empty"));
    }
    let mut axes = Vec::new();
    for (name, value) in raw.axes {
        check_identifier(path, "axis", &name)?;
        let axis: RawAxis = serde_json::from_value(value)
            .map_err(|e| invalid(path, format!("axes.{name}: {e}")))?;
        axes.push((
            name.clone(),
            match axis {
                RawAxis::Const { value, description } => {
                    if value < 1 {
                        return Err(invalid(
                            path,
                            format!("axes.{name}: a const axis of {value} gives empty tensors"),
                        ));
                    }
                    AxisDef::Const {
                        value,
                        description: description.unwrap_or_default(),
                    }
                }
                RawAxis::Var { description } => AxisDef::Var {
                    description: description.unwrap_or_default(),
                },
            },
        ));
    }
    let tensors = |what: &str, map: Map<String, Value>| -> Result<Vec<TensorDef>, ImportError> {
        let mut out = Vec::new();
        for (name, value) in map {
            check_identifier(path, what, &name)?;
            let t: RawTensor = serde_json::from_value(value)
                .map_err(|e| invalid(path, format!("{what}s.{name}: {e}")))?;
            for axis in t.shape.iter().flatten() {
                if !axes.iter().any(|(a, _)| a == axis) {
                    return Err(invalid(
                        path,
                        format!("{what}s.{name}: shape names axis `{axis}`, which `axes` lacks"),
                    ));
                }
            }
            dtype(path, &format!("{what}s.{name}"), &t.dtype)?;
            out.push(TensorDef {
                name,
                shape: t.shape,
                dtype: t.dtype,
                description: t.description.unwrap_or_default(),
            });
        }
        Ok(out)
    };
    let inputs = tensors("input", raw.inputs)?;
    let outputs = tensors("output", raw.outputs)?;
    if inputs.is_empty() || outputs.is_empty() {
        return Err(invalid(
            path,
            "a definition needs at least one input and one output",
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for name in axes
        .iter()
        .map(|(n, _)| n)
        .chain(inputs.iter().map(|t| &t.name))
        .chain(outputs.iter().map(|t| &t.name))
    {
        if !seen.insert(name.as_str()) {
            return Err(invalid(
                path,
                format!("`{name}` names two of the axes, inputs and outputs; a ksearch task needs distinct names"),
            ));
        }
    }
    if let Some(out) = outputs.iter().find(|t| t.shape.is_none()) {
        return Err(invalid(
            path,
            format!("outputs.{}: scalar outputs are not supported yet", out.name),
        ));
    }
    if !raw
        .reference
        .lines()
        .any(|l| l.starts_with("def run(") || l.starts_with("def run ("))
    {
        return Err(invalid(
            path,
            "`reference` defines no top-level `def run(...)`",
        ));
    }
    Ok(Definition {
        name: raw.name,
        op_type: raw.op_type,
        axes,
        inputs,
        outputs,
        reference: raw.reference,
        constraints: raw.constraints,
        description: raw.description.unwrap_or_default(),
        tags: raw.tags,
        json: text.to_string(),
    })
}

fn check_identifier(path: &Path, what: &str, name: &str) -> Result<(), ImportError> {
    let mut chars = name.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        return Err(invalid(
            path,
            format!("{what} `{name}` is not an identifier"),
        ));
    }
    if ["min", "max", "ceil_div", "elem_bytes"].contains(&name) {
        return Err(invalid(
            path,
            format!("{what} `{name}` is a reserved name in ksearch's shape expressions"),
        ));
    }
    Ok(())
}

/// ksearch's dtype for a FlashInfer-Bench dtype.
fn dtype(path: &Path, at: &str, name: &str) -> Result<&'static str, ImportError> {
    Ok(match name {
        "float32" => "f32",
        "float16" => "f16",
        "bfloat16" => "bf16",
        "int32" => "i32",
        "int64" => "i64",
        "float8_e4m3fn" | "float8_e5m2" | "float4_e2m1" | "int16" | "int8" | "bool" => {
            return Err(invalid(
                path,
                format!("{at}: dtype `{name}` is not supported by ksearch tasks yet"),
            ))
        }
        other => return Err(invalid(path, format!("{at}: unknown dtype `{other}`"))),
    })
}

/// The dataset root of a definition file inside a FlashInfer-Bench dataset: the directory
/// that holds the nearest `definitions/` above it.
pub fn dataset_root(definition: &Path) -> Option<PathBuf> {
    let absolute = std::path::absolute(definition).ok()?;
    absolute
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "definitions"))
        .and_then(Path::parent)
        .map(Path::to_path_buf)
}

/// Reads the workloads of `definition` from a workload trace file (JSON lines); lines of other
/// definitions are skipped, blank lines too.
pub fn read_workloads(path: &Path, definition: &str) -> Result<Vec<Workload>, ImportError> {
    parse_workloads(&read(path)?, path, definition)
}

/// Parses workload trace lines; `path` is only used in messages.
pub fn parse_workloads(
    text: &str,
    path: &Path,
    definition: &str,
) -> Result<Vec<Workload>, ImportError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let parse_error = |e: serde_json::Error| ImportError::Parse {
            path: path.to_path_buf(),
            line: n + 1,
            message: e.to_string(),
        };
        let value: Value = serde_json::from_str(line).map_err(parse_error)?;
        let json = value.get("workload").cloned().unwrap_or(Value::Null);
        let raw: RawTraceLine = serde_json::from_value(value).map_err(parse_error)?;
        if raw.definition != definition {
            continue;
        }
        let at = |m: String| invalid(path, format!("line {}: {m}", n + 1));
        if raw.workload.uuid.is_empty() {
            return Err(at("`workload.uuid` is empty".into()));
        }
        let mut inputs = BTreeMap::new();
        for (name, input) in raw.workload.inputs {
            let input = match input {
                RawInput::Random => WorkloadInput::Random,
                RawInput::Scalar { value } => match value {
                    Value::Number(x) => WorkloadInput::Scalar(x.as_f64().unwrap_or(f64::NAN)),
                    Value::Bool(b) => WorkloadInput::Scalar(f64::from(u8::from(b))),
                    other => return Err(at(format!("inputs.{name}: scalar value {other}"))),
                },
                RawInput::Safetensors { path, tensor_key } => {
                    WorkloadInput::Safetensors { path, tensor_key }
                }
            };
            inputs.insert(name, input);
        }
        out.push(Workload {
            uuid: raw.workload.uuid,
            axes: raw.workload.axes,
            inputs,
            json,
        });
    }
    if out.is_empty() {
        return Err(invalid(
            path,
            format!("no workload of definition `{definition}` in this file"),
        ));
    }
    Ok(out)
}

/// A constraint of the definition, as ksearch can check it.
enum Constraint {
    /// `lhs <op> rhs`, both sides arithmetic over axes.
    Compare {
        text: String,
        lhs: Expr,
        op: &'static str,
        rhs: Expr,
    },
    /// Anything else (Python beyond arithmetic and comparisons): listed as unchecked.
    Unchecked(String),
}

fn parse_constraints(def: &Definition) -> Vec<Constraint> {
    let mut out = Vec::new();
    for c in &def.constraints {
        for part in c.split(" and ") {
            let mut part = part.trim();
            while part.starts_with('(') && part.ends_with(')') {
                part = part[1..part.len() - 1].trim();
            }
            let parsed = ["==", "!=", "<=", ">=", "<", ">"].iter().find_map(|op| {
                let (l, r) = part.split_once(op)?;
                // `<` must not be the first half of `<=` (tried before), nor `=` of `==`.
                if r.starts_with('=') {
                    return None;
                }
                Some(Constraint::Compare {
                    text: part.to_string(),
                    lhs: Expr::parse(l.trim()).ok()?,
                    op,
                    rhs: Expr::parse(r.trim()).ok()?,
                })
            });
            out.push(parsed.unwrap_or_else(|| Constraint::Unchecked(part.to_string())));
        }
    }
    out
}

fn holds(op: &str, l: f64, r: f64) -> bool {
    match op {
        "==" => l == r,
        "!=" => l != r,
        "<=" => l <= r,
        ">=" => l >= r,
        "<" => l < r,
        _ => l > r,
    }
}

/// Checks every comparable constraint against `values`; `Err` names the first that fails.
fn check_constraints(cs: &[Constraint], values: &BTreeMap<String, i64>) -> Result<(), String> {
    let lookup = |n: &str| values.get(n).map(|v| Num::Int(*v));
    for c in cs {
        if let Constraint::Compare { text, lhs, op, rhs } = c {
            let (Ok(l), Ok(r)) = (lhs.eval(&lookup), rhs.eval(&lookup)) else {
                return Err(format!("`{text}` cannot be evaluated"));
            };
            if !holds(op, l.as_f64(), r.as_f64()) {
                return Err(format!("`{text}` does not hold ({l} {op} {r})"));
            }
        }
    }
    Ok(())
}

/// Values for every axis with the free var axes at `free`: const axes at their value, a var
/// axis that an equality constraint (`X == expr`) fixes computed from the others.
fn choose_axes(
    def: &Definition,
    cs: &[Constraint],
    free: i64,
) -> Result<BTreeMap<String, i64>, String> {
    let mut fixed_by: BTreeMap<&str, &Expr> = BTreeMap::new();
    for c in cs {
        if let Constraint::Compare {
            lhs, op: "==", rhs, ..
        } = c
        {
            for (side, other) in [(lhs, rhs), (rhs, lhs)] {
                let name = side.source().trim();
                let is_var = def
                    .axes
                    .iter()
                    .any(|(n, a)| n == name && matches!(a, AxisDef::Var { .. }));
                let self_ref = other.identifiers().iter().any(|(i, _)| *i == name);
                if is_var && !self_ref && !fixed_by.contains_key(name) {
                    fixed_by.insert(
                        def.axes
                            .iter()
                            .find(|(n, _)| n == name)
                            .map(|(n, _)| n.as_str())
                            .unwrap_or(name),
                        other,
                    );
                    break;
                }
            }
        }
    }
    let mut values = BTreeMap::new();
    for (name, axis) in &def.axes {
        match axis {
            AxisDef::Const { value, .. } => {
                values.insert(name.clone(), *value);
            }
            AxisDef::Var { .. } if !fixed_by.contains_key(name.as_str()) => {
                values.insert(name.clone(), free);
            }
            AxisDef::Var { .. } => {}
        }
    }
    // Each pass fixes every axis whose expression is computable; a pass that fixes nothing
    // leaves a cycle.
    while values.len() < def.axes.len() {
        let mut progress = false;
        for (name, expr) in &fixed_by {
            if values.contains_key(*name) {
                continue;
            }
            let lookup = |n: &str| values.get(n).map(|v| Num::Int(*v));
            if let Ok(Num::Int(v)) = expr.eval(&lookup) {
                values.insert(name.to_string(), v);
                progress = true;
            }
        }
        if !progress {
            let open: Vec<&str> = fixed_by
                .keys()
                .filter(|n| !values.contains_key(**n))
                .copied()
                .collect();
            return Err(format!(
                "the constraints leave no integer value for {}",
                open.join(", ")
            ));
        }
    }
    Ok(values)
}

/// What a workload fixes for one input instead of drawing it.
#[derive(Clone, Debug, PartialEq)]
enum Fixed {
    /// A scalar input's value.
    Scalar(f64),
    /// A tensor from a safetensors file, copied into the task (`blobs/...`).
    Blob { file: String, key: String },
}

/// Per input, what each workload fixes, keyed by the workload's axis values in declaration
/// order (the generator in `reference.py` looks them up by its `params`).
type FixedTables = BTreeMap<String, Vec<(Vec<(String, i64)>, Fixed)>>;

/// The definition's own file in an imported task (what `ksearch export --format flashinfer`
/// reads back).
pub const DEFINITION_FILE: &str = "definition.json";
/// The given workload trace lines in an imported task, in the order of the task's workloads
/// (`w<index>-...`).
pub const WORKLOADS_FILE: &str = "workloads.jsonl";

/// What to import besides the definition.
#[derive(Clone, Copy, Debug, Default)]
pub struct ImportOptions<'a> {
    /// Workloads read from a trace file (named in messages); `None` chooses them from the axes.
    pub workloads: Option<(&'a [Workload], &'a Path)>,
    /// The dataset's root, against which `safetensors` paths of workloads resolve.
    pub dataset: Option<&'a Path>,
    /// A directory of the task's own files to copy in: a seed (`seed/naive.cu`, which becomes
    /// the cuda backend's seed), template families (`templates-cuda/`), knowledge
    /// (`knowledge/actions/`, …).
    pub with: Option<&'a Path>,
}

/// The seed an imported task takes from its `with` directory.
pub const SEED_FILE: &str = "seed/naive.cu";

/// One file of an imported task.
#[derive(Clone, Debug)]
pub enum Content {
    Text(String),
    /// A copy of this file (a safetensors blob, the seed).
    Copy(PathBuf),
}

/// One workload of the written task.
struct TaskWorkload {
    name: String,
    params: Vec<(String, i64)>,
    held_out: bool,
    fixed: BTreeMap<String, Fixed>,
}

/// The files of an imported task, relative to its directory, and what the import decided that
/// its user should know.
#[derive(Clone, Debug)]
pub struct Rendered {
    pub files: Vec<(String, Content)>,
    pub notes: Vec<String>,
}

/// The task name and cuda entry for a definition name: runs of characters other than letters,
/// digits and `_` become `_`, and a leading digit gets a `k` in front.
fn identifier(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else if !out.ends_with('_') {
            out.push('_');
        }
    }
    if out.starts_with(|c: char| c.is_ascii_digit()) || out.is_empty() {
        out.insert(0, 'k');
    }
    out
}

/// The task for `def`: from the given workloads, else from workloads chosen from its axes.
pub fn render(def: &Definition, opts: &ImportOptions<'_>) -> Result<Rendered, ImportError> {
    let constraints = parse_constraints(def);
    let mut notes = Vec::new();
    let unchecked: Vec<&str> = constraints
        .iter()
        .filter_map(|c| match c {
            Constraint::Unchecked(t) => Some(t.as_str()),
            Constraint::Compare { .. } => None,
        })
        .collect();
    if !unchecked.is_empty() {
        notes.push(format!(
            "constraints not checked (not arithmetic comparisons over axes): {}",
            unchecked.join("; ")
        ));
    }
    let mut blobs = Blobs::default();
    let workloads = match opts.workloads {
        Some((given, source)) => {
            let count = given.len();
            notes.push(if count >= 4 {
                format!(
                    "{} of the {count} workloads are held out (every fourth): checked for \
                     correctness, not timed",
                    count / 4
                )
            } else {
                format!(
                    "no workload is held out (only {count} given): `ksearch tasks --check` \
                     will say so"
                )
            });
            let dataset = opts.dataset;
            given
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    given_workload(
                        def,
                        &constraints,
                        (i, count),
                        w,
                        source,
                        dataset,
                        &mut blobs,
                    )
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        None => {
            notes.push(
                "no workloads given: chosen from the axes (free var axes at 1, 16 and 128, and 7 \
                 held out); real shapes come from the definition's workload traces (--workloads)"
                    .to_string(),
            );
            chosen_workloads(def, &constraints)?
        }
    };
    let tables = fixed_tables(def, &workloads)?;
    if !blobs.0.is_empty() {
        notes.push(format!(
            "{} safetensors file(s) copied to blobs/; the inputs they hold are the same in \
             every trial",
            blobs.0.len()
        ));
    }

    let extra = match opts.with {
        Some(dir) => files_under(dir)?,
        None => Vec::new(),
    };
    let seed = extra
        .iter()
        .any(|(rel, _)| rel == SEED_FILE)
        .then_some(SEED_FILE);
    let entry = identifier(&def.name);
    let text = |name: &str, text: String| (name.to_string(), Content::Text(text));
    let mut files = vec![
        text(
            "task.toml",
            task_toml(def, &entry, &workloads, &tables, seed)?,
        ),
        text("reference.py", reference_py(def, &tables)),
        text("definition_reference.py", definition_reference_py(def)),
        text("README.md", readme(def, &notes)),
        text(DEFINITION_FILE, def.json.clone()),
    ];
    if let Some((given, _)) = opts.workloads {
        let lines: Vec<String> = given
            .iter()
            .map(|w| serde_json::json!({"definition": def.name, "workload": w.json}).to_string())
            .collect();
        files.push(text(WORKLOADS_FILE, lines.join("\n") + "\n"));
    }
    for (file, source) in blobs.0 {
        files.push((file, Content::Copy(source)));
    }
    for (rel, source) in extra {
        if files.iter().any(|(f, _)| *f == rel) {
            return Err(invalid(
                &source,
                format!("the import writes `{rel}` itself; remove it from the --with directory"),
            ));
        }
        files.push((rel, Content::Copy(source)));
    }
    Ok(Rendered { files, notes })
}

/// The safetensors files the workloads read, as (path in the task, source), each once.
#[derive(Default)]
struct Blobs(Vec<(String, PathBuf)>);

impl Blobs {
    /// The task's path for `source`, added if new (`blobs/<name>`, numbered on a clash).
    fn add(&mut self, source: &Path) -> String {
        if let Some((f, _)) = self.0.iter().find(|(_, p)| p == source) {
            return f.clone();
        }
        let base = source
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "blob.safetensors".into());
        let file = if self.0.iter().any(|(f, _)| f.ends_with(&base)) {
            format!("blobs/{}-{base}", self.0.len())
        } else {
            format!("blobs/{base}")
        };
        self.0.push((file.clone(), source.to_path_buf()));
        file
    }
}

/// Workload `index` of `count` from a trace file (`source` in messages): its axes checked
/// against the definition and its constraints, its scalar values and safetensors inputs
/// (checked, and added to `blobs`) fixed.
fn given_workload(
    def: &Definition,
    constraints: &[Constraint],
    (index, count): (usize, usize),
    w: &Workload,
    source: &Path,
    dataset: Option<&Path>,
    blobs: &mut Blobs,
) -> Result<TaskWorkload, ImportError> {
    let at = |m: String| invalid(source, format!("workload {}: {m}", w.uuid));
    let mut values = BTreeMap::new();
    for (name, axis) in &def.axes {
        let v = match (axis, w.axes.get(name)) {
            (AxisDef::Const { value, .. }, None) => *value,
            (AxisDef::Const { value, .. }, Some(v)) if v == value => *v,
            (AxisDef::Const { value, .. }, Some(v)) => {
                return Err(at(format!("const axis `{name}` is {value}, not {v}")))
            }
            (AxisDef::Var { .. }, Some(v)) if *v >= 1 => *v,
            (AxisDef::Var { .. }, Some(v)) => {
                return Err(at(format!("axis `{name}` = {v} gives empty tensors")))
            }
            (AxisDef::Var { .. }, None) => {
                return Err(at(format!("var axis `{name}` has no value")))
            }
        };
        values.insert(name.clone(), v);
    }
    if let Some(extra) = w.axes.keys().find(|k| !values.contains_key(*k)) {
        return Err(at(format!("axis `{extra}` is not in the definition")));
    }
    check_constraints(constraints, &values).map_err(at)?;
    if let Some(extra) = w
        .inputs
        .keys()
        .find(|k| !def.inputs.iter().any(|t| &&t.name == k))
    {
        return Err(at(format!("input `{extra}` is not in the definition")));
    }
    let mut fixed = BTreeMap::new();
    for t in &def.inputs {
        match w.inputs.get(&t.name) {
            None | Some(WorkloadInput::Random) => {}
            Some(WorkloadInput::Scalar(x)) if t.shape.is_none() => {
                fixed.insert(t.name.clone(), Fixed::Scalar(*x));
            }
            Some(WorkloadInput::Scalar(_)) => {
                return Err(at(format!(
                    "input `{}` is a tensor but the workload gives a scalar",
                    t.name
                )))
            }
            Some(WorkloadInput::Safetensors { path, tensor_key }) => {
                let root = dataset.ok_or_else(|| {
                    at(format!(
                        "input `{}` comes from a safetensors file, whose path is relative to the \
                         dataset's root: name it (--dataset DIR)",
                        t.name
                    ))
                })?;
                let want: Vec<i64> = t.shape.iter().flatten().map(|a| values[a]).collect();
                let file = root.join(path);
                safetensors::check(&file, tensor_key, &t.dtype, &want)
                    .map_err(|m| at(format!("input `{}`: {m}", t.name)))?;
                let key = tensor_key.clone();
                fixed.insert(
                    t.name.clone(),
                    Fixed::Blob {
                        file: blobs.add(&file),
                        key,
                    },
                );
            }
        }
    }
    let short: String = w
        .uuid
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(8)
        .collect();
    Ok(TaskWorkload {
        name: format!("w{index}-{short}"),
        params: ordered(def, &values),
        held_out: count >= 4 && index % 4 == 3,
        fixed,
    })
}

/// The axes' values in the definition's order.
fn ordered(def: &Definition, values: &BTreeMap<String, i64>) -> Vec<(String, i64)> {
    def.axes
        .iter()
        .map(|(n, _)| (n.clone(), values[n]))
        .collect()
}

/// Workloads chosen from the axes: free var axes at 1, 16 and 128 (shown) and 7 (held out),
/// the axes an equality constraint fixes computed from them.
fn chosen_workloads(
    def: &Definition,
    constraints: &[Constraint],
) -> Result<Vec<TaskWorkload>, ImportError> {
    let def_path = PathBuf::from(format!("definition {}", def.name));
    let mut out: Vec<TaskWorkload> = Vec::new();
    for (free, held_out) in [(1, false), (16, false), (128, false), (7, true)] {
        let fail = |m: String| {
            invalid(
                &def_path,
                format!("{m}; pass workloads (--workloads FILE.jsonl)"),
            )
        };
        let values = choose_axes(def, constraints, free).map_err(fail)?;
        check_constraints(constraints, &values)
            .map_err(|m| fail(format!("with every free var axis at {free}, {m}")))?;
        let name: Vec<String> = def
            .axes
            .iter()
            .filter(|(_, a)| matches!(a, AxisDef::Var { .. }))
            .map(|(n, _)| format!("{n}{}", values[n]))
            .collect();
        let name = if name.is_empty() {
            "const".to_string()
        } else {
            name.join("_")
        };
        if !out.iter().any(|w| w.name == name) {
            out.push(TaskWorkload {
                name,
                params: ordered(def, &values),
                held_out,
                fixed: BTreeMap::new(),
            });
        }
    }
    Ok(out)
}

/// Per input that workloads fix, its value in each workload: all workloads fix it or none
/// does (a scalar that none sets is drawn like a random input), and workloads of the same
/// axes agree (the generator looks values up by axes).
fn fixed_tables(def: &Definition, workloads: &[TaskWorkload]) -> Result<FixedTables, ImportError> {
    let def_path = PathBuf::from(format!("definition {}", def.name));
    let mut tables = FixedTables::new();
    for t in &def.inputs {
        let given: Vec<_> = workloads
            .iter()
            .filter_map(|w| w.fixed.get(&t.name).map(|x| (w.params.clone(), x.clone())))
            .collect();
        if given.is_empty() {
            continue;
        }
        if given.len() != workloads.len() {
            return Err(invalid(
                &def_path,
                format!(
                    "input `{}` is fixed by some workloads and drawn in others",
                    t.name
                ),
            ));
        }
        for (i, (p, x)) in given.iter().enumerate() {
            if given[..i].iter().any(|(q, y)| q == p && y != x) {
                return Err(invalid(
                    &def_path,
                    format!(
                        "input `{}` takes two values in workloads of the same axes; the import \
                         needs the axes to tell them apart",
                        t.name
                    ),
                ));
            }
        }
        tables.insert(t.name.clone(), given);
    }
    Ok(tables)
}

/// Every file under `dir`, as (path relative to `dir` with `/` separators, path), sorted.
fn files_under(dir: &Path) -> Result<Vec<(String, PathBuf)>, ImportError> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> Result<(), ImportError> {
        let entries = std::fs::read_dir(dir).map_err(|source| ImportError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out)?;
            } else if let Ok(rel) = path.strip_prefix(root) {
                let rel: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push((rel.join("/"), path.clone()));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort();
    Ok(out)
}

fn task_toml(
    def: &Definition,
    entry: &str,
    workloads: &[TaskWorkload],
    fixed: &FixedTables,
    seed: Option<&str>,
) -> Result<String, ImportError> {
    let path = PathBuf::from(format!("definition {}", def.name));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Imported from the FlashInfer-Bench definition `{}` by `ksearch import flashinfer`.\n\
         # docs/task-format.md describes every field.\nformat = 1\nname = {}\nkind = {}",
        def.name,
        string(&identifier(&def.name)),
        string(&identifier(&def.op_type)),
    );
    let description = if def.description.is_empty() {
        format!(
            "{} ({}), from its FlashInfer-Bench definition.",
            def.name, def.op_type
        )
    } else {
        def.description.clone()
    };
    let _ = writeln!(s, "description = {}", string(&description));
    for (name, axis) in &def.axes {
        let _ = writeln!(s, "\n[axes.{}]", key(name));
        match axis {
            AxisDef::Const { value, description } => {
                let d = if description.is_empty() {
                    String::new()
                } else {
                    format!("{description} ")
                };
                let _ = writeln!(
                    s,
                    "description = {}",
                    string(&format!("{d}(const in the definition)"))
                );
                let _ = writeln!(s, "values = [{value}]");
            }
            AxisDef::Var { description } => {
                let _ = writeln!(s, "description = {}", string(description));
            }
        }
    }
    let tensor =
        |s: &mut String, table: &str, t: &TensorDef, input: bool| -> Result<(), ImportError> {
            let _ = writeln!(s, "\n[[{table}]]\nname = {}", string(&t.name));
            let _ = writeln!(s, "dtype = {}", string(dtype(&path, &t.name, &t.dtype)?));
            let shape = t.shape.clone().unwrap_or_default();
            let _ = writeln!(s, "shape = {}", string_list(&shape));
            if input {
                let integer = matches!(t.dtype.as_str(), "int32" | "int64");
                if fixed.contains_key(&t.name) {
                    let _ = writeln!(s, "dist = {{ kind = \"custom\" }}");
                } else if integer {
                    let _ = writeln!(
                        s,
                        "dist = {{ kind = \"rand_int\", low = -1024, high = 1024 }}"
                    );
                }
            }
            let mut d = t.description.clone();
            if t.shape.is_none() {
                d = format!("{} (a scalar in the definition: a 0-d tensor here)", d)
                    .trim()
                    .to_string();
            }
            let _ = writeln!(s, "description = {}", string(&d));
            Ok(())
        };
    for t in &def.inputs {
        tensor(&mut s, "inputs", t, true)?;
    }
    for t in &def.outputs {
        tensor(&mut s, "outputs", t, false)?;
    }
    for w in workloads {
        let _ = writeln!(
            s,
            "\n[[workloads]]\nname = {}\nparams = {}",
            string(&w.name),
            inline_ints(&w.params)
        );
        if w.held_out {
            let _ = writeln!(s, "held_out = true");
        }
    }
    // FlashInfer-Bench's default tolerance, under its own rule (docs/task-format.md).
    let mut dtypes: Vec<&str> = def
        .outputs
        .iter()
        .filter_map(|t| dtype(&path, &t.name, &t.dtype).ok())
        .collect();
    dtypes.sort_unstable();
    dtypes.dedup();
    for d in dtypes {
        let _ = writeln!(
            s,
            "\n[tolerance.{d}]\nrule = \"either\"\nrtol = 1e-2\natol = 1e-2"
        );
    }
    // The floor must never exceed the truth: outputs are written in full, while inputs (a
    // paged cache, an index set) may be read only in part, and the definition says nothing of
    // the work. The README asks the user to raise it.
    let out_bytes: Vec<String> = def
        .outputs
        .iter()
        .map(|t| {
            let size = dtype(&path, &t.name, &t.dtype)
                .ok()
                .and_then(ksearch_task::DType::parse)
                .map_or(4, ksearch_task::DType::size_bytes);
            std::iter::once(size.to_string())
                .chain(t.shape.iter().flatten().cloned())
                .collect::<Vec<_>>()
                .join(" * ")
        })
        .collect();
    let _ = writeln!(
        s,
        "\n# A floor that cannot exceed the truth: the outputs' bytes, no flops. Raise it to the\n\
         # op's real traffic and work once known.\n[roofline]\nflops = \"0\"\nbytes = {}",
        string(&out_bytes.join(" + "))
    );
    let _ = writeln!(
        s,
        "\n[reference]\nmodule = \"reference.py\"\nfunction = \"reference\""
    );
    let mut args: Vec<&str> = def.inputs.iter().map(|t| t.name.as_str()).collect();
    args.extend(def.outputs.iter().map(|t| t.name.as_str()));
    args.extend(def.axes.iter().map(|(n, _)| n.as_str()));
    let mut params: Vec<String> = def
        .inputs
        .iter()
        .map(|t| format!("const void* {}", t.name))
        .collect();
    params.extend(def.outputs.iter().map(|t| format!("void* {}", t.name)));
    params.extend(def.axes.iter().map(|(n, _)| format!("int64_t {n}")));
    params.push("void* stream".into());
    let signature = format!("extern \"C\" int {entry}({})", params.join(", "));
    let _ = writeln!(
        s,
        "\n[backends.cuda]\nentry = {}\nargs = {}\nsignature = {}\nreference = \"reference_torch\"\nbaseline = \"baseline_torch\"",
        string(entry),
        string_list(&args),
        string(&signature),
    );
    if let Some(seed) = seed {
        let _ = writeln!(s, "seed = {}", string(seed));
    }
    Ok(s)
}

/// A Python float literal that reads back as `x`.
fn py_float(x: f64) -> String {
    if x.is_nan() {
        "float('nan')".into()
    } else if x.is_infinite() {
        if x > 0.0 {
            "float('inf')".into()
        } else {
            "float('-inf')".into()
        }
    } else {
        format!("{x:?}")
    }
}

fn reference_py(def: &Definition, fixed: &FixedTables) -> String {
    let names = |ts: &[TensorDef]| -> String {
        let q: Vec<String> = ts.iter().map(|t| format!("{:?}", t.name)).collect();
        format!("[{}]", q.join(", "))
    };
    let scalar_names: Vec<String> = def
        .inputs
        .iter()
        .filter(|t| t.shape.is_none())
        .map(|t| format!("{:?}", t.name))
        .collect();
    let mut s = format!(
        r#""""The reference of the FlashInfer-Bench definition `{name}`, imported by `ksearch import
flashinfer`.

The definition's reference is `run` in definition_reference.py, verbatim; it is loaded on first
use, so that this module imports without PyTorch. `reference_torch` calls it on the harness's
device tensors (PyTorch on the GPU) and is also the timed baseline: FlashInfer-Bench measures a
solution's speedup against its reference. Scalar inputs arrive as 0-d arrays and are passed to
`run` as Python numbers.
"""

import importlib.util
import json
from pathlib import Path

import numpy as np

INPUTS = {inputs}
OUTPUTS = {outputs}
SCALAR_INPUTS = {{{scalars}}}


_RUN = []


def _run():
    if not _RUN:
        path = Path(__file__).with_name("definition_reference.py")
        spec = importlib.util.spec_from_file_location("definition_reference", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _RUN.append(module.run)
    return _RUN[0]


def _call_run(inputs, params):
    from ksearch_harness.adapters import device

    tensors = device.torch_inputs(inputs, params)
    args = [tensors[n].item() if n in SCALAR_INPUTS else tensors[n] for n in INPUTS]
    result = _run()(*args)
    results = result if isinstance(result, (tuple, list)) else (result,)
    if len(results) != len(OUTPUTS):
        raise ValueError(f"run returned {{len(results)}} outputs, the definition has {{len(OUTPUTS)}}")
    return {{n: device.host(r) for n, r in zip(OUTPUTS, results)}}


def reference(inputs, params):
    """Ground truth: the definition's `run` (needs PyTorch and a CUDA device)."""
    return _call_run(inputs, params)


def reference_torch(inputs, params):
    """The cuda backend's reference: the definition's `run` on the GPU."""
    return _call_run(inputs, params)


def baseline_torch(inputs, params):
    """The timed baseline: the definition's `run`, as FlashInfer-Bench times it."""
    return _call_run(inputs, params)
"#,
        name = def.name,
        inputs = names(&def.inputs),
        outputs = names(&def.outputs),
        scalars = scalar_names.join(", "),
    );
    if fixed
        .values()
        .flatten()
        .any(|(_, f)| matches!(f, Fixed::Blob { .. }))
    {
        s.push_str(SAFETENSORS_PY);
    }
    let axes: Vec<String> = def
        .axes
        .iter()
        .map(|(n, _)| format!("params[{n:?}]"))
        .collect();
    for (input, table) in fixed {
        let t = def.inputs.iter().find(|t| &t.name == input);
        let np_dtype = match t.map(|t| t.dtype.as_str()) {
            Some("int32") => "np.int32",
            Some("int64") => "np.int64",
            Some("float16") => "np.float16",
            _ => "np.float32",
        };
        let rows: Vec<String> = table
            .iter()
            .map(|(params, x)| {
                let key: Vec<String> = params.iter().map(|(_, v)| v.to_string()).collect();
                let value = match x {
                    Fixed::Scalar(x) => py_float(*x),
                    Fixed::Blob { file, key } => format!("({file:?}, {key:?})"),
                };
                format!("    ({},): {value},", key.join(", "))
            })
            .collect();
        let (what, value) = match table.first().map(|(_, f)| f) {
            Some(Fixed::Blob { .. }) => (
                "tensor, read from the safetensors file the workload names",
                format!("_read_safetensors(*_{input}_VALUES[key])"),
            ),
            _ => ("scalar", format!("_{input}_VALUES[key]")),
        };
        let _ = write!(
            s,
            "\n\n# `{input}` per workload, keyed by the workload's axes in declaration order.\n\
             _{input}_VALUES = {{\n{}\n}}\n\n\n\
             def make_{input}(rng, shape, params):\n    \
             \"\"\"The workload's `{input}` ({what}).\"\"\"\n    \
             key = ({},)\n    \
             return np.asarray({value}, dtype={np_dtype}).reshape(shape)\n",
            rows.join("\n"),
            axes.join(", "),
        );
    }
    s
}

/// A reader of one tensor of a safetensors file (an 8-byte little-endian header length, a
/// JSON header naming each tensor's dtype, shape and byte range, then the data), with numpy
/// only; bf16 is widened to float32, as the harness stores it.
const SAFETENSORS_PY: &str = r#"

_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4"}


def _read_safetensors(file, key):
    """Tensor `key` of the safetensors file `file` (relative to this task)."""
    with open(Path(__file__).parent / file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(size))[key]
        start, end = meta["data_offsets"]
        f.seek(8 + size + start)
        raw = f.read(end - start)
    if meta["dtype"] == "BF16":
        values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        values = np.frombuffer(raw, dtype=_SAFETENSORS_DTYPES[meta["dtype"]])
    return values.reshape(meta["shape"])
"#;

/// The definition's reference source, verbatim, with a header comment.
fn definition_reference_py(def: &Definition) -> String {
    format!(
        "# The reference of the FlashInfer-Bench definition `{}`, verbatim (reference.py calls\n\
         # its `run`).\n{}\n",
        def.name,
        def.reference.trim_end()
    )
}

fn readme(def: &Definition, notes: &[String]) -> String {
    let mut s = format!(
        "# {name}\n\nImported from the FlashInfer-Bench definition `{name}` (op_type `{op}`) by \
         `ksearch import flashinfer`.\n\n",
        name = def.name,
        op = def.op_type
    );
    if !def.description.is_empty() {
        let _ = writeln!(s, "{}\n", def.description);
    }
    s.push_str(
        "The reference is the definition's PyTorch `run`: evaluating and searching this task \
         needs PyTorch and a CUDA GPU (`ksearch eval --task DIR --backend cuda`). The kernel's \
         entry point and arguments are in `task.toml` (`[backends.cuda]`). A seed kernel \
         (`seed/naive.cu`) gives the search a place to start, and a template family \
         (`templates-cuda/`) with actions (`knowledge/actions/`) lets the offline proposer \
         search it (docs/offline-proposer.md); `ksearch import flashinfer --with DIR` copies \
         them in.\n\n\
         The roofline floor in `task.toml` counts only the outputs' bytes (the definition \
         gives neither traffic nor work); raise it to the op's real traffic and flops.\n\n\
         Tolerances are FlashInfer-Bench's defaults (rtol = atol = 1e-2) under its rule \
         (`rule = \"either\"`: an element fails only when both its absolute and relative \
         errors exceed them; docs/task-format.md).\n",
    );
    if !notes.is_empty() {
        s.push_str("\nWhat the import decided:\n\n");
        for n in notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    if !def.tags.is_empty() {
        let _ = writeln!(s, "\nTags: {}", def.tags.join(", "));
    }
    s
}

/// What [`import`] wrote.
#[derive(Debug)]
pub struct Imported {
    pub dir: PathBuf,
    pub task: ksearch_task::Task,
    pub notes: Vec<String>,
}

impl Imported {
    /// What the import commands print: the task, where, how many workloads, and the notes.
    pub fn summary(&self) -> String {
        let spec = self.task.spec();
        let mut s = format!(
            "wrote task `{}` to {} ({} workloads)\n",
            spec.name,
            self.dir.display(),
            spec.workloads.len()
        );
        for note in &self.notes {
            s.push_str(&format!("  note: {note}\n"));
        }
        s
    }
}

/// Writes the task for `def` into `out` (which must not exist or be empty) and loads it. A
/// task that does not load is left in `out` for inspection and reported.
pub fn import(
    def: &Definition,
    opts: &ImportOptions<'_>,
    out: &Path,
) -> Result<Imported, ImportError> {
    write_task(render(def, opts)?, out)
}

/// Reads the definition (and the workload trace file, when given) and imports them into
/// `out`: `dataset` defaults to the directory above the definition's `definitions/`.
pub fn import_files(
    definition: &Path,
    workloads: Option<&Path>,
    dataset: Option<&Path>,
    with: Option<&Path>,
    out: &Path,
) -> Result<Imported, ImportError> {
    let def = read_definition(definition)?;
    let given = workloads
        .map(|path| read_workloads(path, &def.name).map(|w| (w, path)))
        .transpose()?;
    let dataset = dataset
        .map(Path::to_path_buf)
        .or_else(|| dataset_root(definition));
    let opts = ImportOptions {
        workloads: given.as_ref().map(|(w, p)| (w.as_slice(), *p)),
        dataset: dataset.as_deref(),
        with,
    };
    import(&def, &opts, out)
}

/// Writes rendered task files into `out` (which must not exist or be empty) and loads the
/// task. A task that does not load is left in `out` for inspection and reported.
pub(crate) fn write_task(rendered: Rendered, out: &Path) -> Result<Imported, ImportError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ImportError::Io { path, source }
    };
    if out.exists() {
        let empty = std::fs::read_dir(out).map_err(io(out))?.next().is_none();
        if !empty {
            return Err(ImportError::OutputExists(out.to_path_buf()));
        }
    }
    for (name, content) in &rendered.files {
        let path = out.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        match content {
            Content::Text(text) => std::fs::write(&path, text).map_err(io(&path))?,
            Content::Copy(source) => {
                std::fs::copy(source, &path).map_err(io(source))?;
            }
        }
    }
    let task = ksearch_task::load_task(out).map_err(|e| ImportError::Generated {
        dir: out.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(Imported {
        dir: out.to_path_buf(),
        task,
        notes: rendered.notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_made_from_any_name() {
        assert_eq!(
            identifier("gqa_paged_decode_h32_kv4_d128_ps1"),
            "gqa_paged_decode_h32_kv4_d128_ps1"
        );
        assert_eq!(identifier("rms-norm.v2"), "rms_norm_v2");
        assert_eq!(identifier("2d-conv"), "k2d_conv");
    }

    #[test]
    fn python_floats_read_back() {
        assert_eq!(py_float(0.08838834764831845), "0.08838834764831845");
        assert_eq!(py_float(1.0), "1.0");
        assert_eq!(py_float(f64::INFINITY), "float('inf')");
    }
}
