//! Workload checking and resolution: the one place that turns a workload's parameter values and
//! input distributions into a [`ResolvedWorkload`]. The loader runs it on every `[[workloads]]`
//! entry of `task.toml`; [`crate::Task::resolve_workload`] runs it on workloads given from
//! elsewhere (`ksearch bench` shapes, knowledge-pack assertion workloads). Both get the same
//! checks: every axis bound with a value of its type, a `$dtype` parameter that is a dtype,
//! entry placeholders set, what kernels may assume, input distributions that are valid and suit
//! their input's dtype, every dimension positive, element counts within `i64`, and roofline
//! formulas finite and `>= 0`.

use crate::expr::{Expr, ExprError, Num};
use crate::source_map::FieldPath;
use crate::spec::{
    Axis, AxisType, DType, DTypeSpec, Distribution, ParamValue, Reach, ResolvedTensor,
    ResolvedWorkload, TaskSpec, TensorSpec, WorkloadSpec,
};
use crate::text::{dtype_hint, dtype_list, is_ident, python_defines, ELEM_BYTES};
use std::collections::BTreeMap;

/// A workload given from outside `task.toml` (a `ksearch bench` shape, a knowledge-pack
/// assertion's workload), to be checked and resolved against a task for one backend with
/// [`crate::Task::resolve_workload`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CustomWorkload {
    /// The name the harness reports the workload under.
    pub name: String,
    /// A value for every axis, as in `[[workloads]] params` (str axes with a default may be
    /// left out; they then apply unlisted).
    pub params: BTreeMap<String, ParamValue>,
    /// Checked for correctness only, never timed for a score.
    pub held_out: bool,
    /// Distributions that replace those inputs' own `dist`, by input name.
    pub dist: BTreeMap<String, Distribution>,
}

/// One thing wrong with a workload.
#[derive(Debug)]
pub(crate) struct Issue {
    /// A field of the workload, relative to it (`params.L`, `dist.x`), or, when `in_task`, the
    /// field of `task.toml` (`inputs[0].shape[1]`, `roofline.flops`) that this workload's
    /// values make fail.
    pub field: FieldPath,
    pub in_task: bool,
    /// The byte offset of the problem in the field's expression string, when known.
    pub offset: Option<usize>,
    pub message: String,
}

impl Issue {
    /// An issue at `field` of the workload.
    pub(crate) fn workload(field: FieldPath, message: impl Into<String>) -> Self {
        Issue {
            field,
            in_task: false,
            offset: None,
            message: message.into(),
        }
    }

    fn task(field: FieldPath, offset: Option<usize>, message: impl Into<String>) -> Self {
        Issue {
            field,
            in_task: true,
            offset,
            message: message.into(),
        }
    }
}

fn root() -> FieldPath {
    FieldPath::root()
}

/// The issue of a parameter named `key` when the task has no such axis.
pub(crate) fn unknown_axis(axes: &[Axis], key: &str) -> Option<Issue> {
    if axes.iter().any(|a| a.name == key) {
        return None;
    }
    let known: Vec<&str> = axes.iter().map(|a| a.name.as_str()).collect();
    Some(Issue::workload(
        root().key("params").key(key),
        format!("unknown axis `{key}` (axes: {})", known.join(", ")),
    ))
}

/// The issue of a value of the wrong type (`found`: "a string", "a float", …) for `axis`.
pub(crate) fn wrong_type(axis: &Axis, found: &str) -> Issue {
    let expected = match axis.ty {
        AxisType::Int => "an integer for int",
        AxisType::Str => "a string for str",
    };
    Issue::workload(
        root().key("params").key(&axis.name),
        format!("expected {expected} axis `{}`, found {found}", axis.name),
    )
}

/// Integer tensors filled from a normal or uniform draw would be mostly zeros after the cast;
/// insist on a distribution that means something for integers.
pub(crate) fn dist_suits_dtype(dtype: DTypeSpec, dist: Option<&Distribution>) -> bool {
    match dtype {
        DTypeSpec::Fixed(d) if !d.is_float() => {
            matches!(
                dist,
                Some(Distribution::RandInt { .. } | Distribution::Custom { .. })
            )
        }
        _ => true,
    }
}

/// What is wrong with a distribution's values, if anything: the field (relative to the `dist`
/// table) and the message.
pub(crate) fn dist_problem(d: &Distribution) -> Option<(FieldPath, String)> {
    let whole = |message: String| Some((root(), message));
    match d {
        Distribution::Normal { mean, std } => {
            if !mean.is_finite() || !std.is_finite() || *std <= 0.0 {
                return whole(format!(
                    "normal needs a finite mean and a positive std (got mean {mean}, std {std})"
                ));
            }
        }
        Distribution::Uniform { low, high } => {
            if !low.is_finite() || !high.is_finite() || low >= high {
                return whole(format!(
                    "uniform needs finite low < high (got {low}, {high})"
                ));
            }
        }
        Distribution::RandInt { low, high } => {
            if low >= high {
                return whole(format!(
                    "rand_int draws from [low, high): needs low < high (got {low}, {high})"
                ));
            }
        }
        Distribution::Custom { function, reach } => {
            if !is_ident(function) {
                return whole(format!(
                    "custom function `{function}` is not a Python identifier"
                ));
            }
            if let Some((field, message)) = reach.as_ref().and_then(reach_problem) {
                return Some((root().key("reach").join(&field), message));
            }
        }
    }
    None
}

/// What is wrong with a `must_reach` or `reach` table, if anything: the field (relative to the
/// table) and the message.
pub(crate) fn reach_problem(r: &Reach) -> Option<(FieldPath, String)> {
    if r.low.is_none() && r.high.is_none() {
        return Some((
            root(),
            "needs `low` (values at or below it are drawn), `high` (at or above it), or both"
                .to_string(),
        ));
    }
    for (field, v) in [("low", r.low), ("high", r.high)] {
        if v.is_some_and(|v| !v.is_finite()) {
            return Some((root().key(field), "must be a finite number".to_string()));
        }
    }
    if let (Some(lo), Some(hi)) = (r.low, r.high) {
        if lo >= hi {
            return Some((
                root().key("low"),
                format!("low = {lo} is not below high = {hi}"),
            ));
        }
    }
    None
}

/// Checks `w` against the task (`spec`'s own `workloads` are not consulted; `module_source` is
/// the text of the reference module, where custom generators must be defined). Everything but
/// what needs the shapes evaluated, which [`resolve`] checks.
pub(crate) fn check(spec: &TaskSpec, module_source: &str, w: &WorkloadSpec) -> Result<(), Issue> {
    let ppath = root().key("params");
    if let Some(issue) = w.params.keys().find_map(|k| unknown_axis(&spec.axes, k)) {
        return Err(issue);
    }
    let uses_dtype_param = spec
        .inputs
        .iter()
        .chain(&spec.outputs)
        .any(|t| t.dtype == DTypeSpec::FromParam);
    for axis in &spec.axes {
        let value = match (w.params.get(&axis.name), &axis.default) {
            (Some(v), _) => v,
            // The default applies, unlisted (see `Axis::default`).
            (None, Some(_)) => continue,
            (None, None) => {
                return Err(Issue::workload(
                    ppath.key(&axis.name),
                    format!("missing a value for axis `{}`", axis.name),
                ))
            }
        };
        match (axis.ty, value) {
            (AxisType::Int, ParamValue::Int(_)) | (AxisType::Str, ParamValue::Str(_)) => {}
            (_, ParamValue::Int(_)) => return Err(wrong_type(axis, "an integer")),
            (_, ParamValue::Str(_)) => return Err(wrong_type(axis, "a string")),
        }
        if let (true, ParamValue::Str(s)) = (axis.name == "dtype" && uses_dtype_param, value) {
            if DType::parse(s).is_none() {
                return Err(Issue::workload(
                    ppath.key(&axis.name),
                    format!(
                        "`{s}` is not a dtype{} (expected one of {})",
                        dtype_hint(s),
                        dtype_list()
                    ),
                ));
            }
        }
    }
    if let Some(list) = &w.backends {
        if list.is_empty() {
            return Err(Issue::workload(
                root().key("backends"),
                "an empty list runs the workload nowhere; leave `backends` out to mean all",
            ));
        }
        for (k, b) in list.iter().enumerate() {
            if !spec.backends.contains_key(b) {
                let known: Vec<&str> = spec.backends.keys().map(String::as_str).collect();
                return Err(Issue::workload(
                    root().key("backends").index(k),
                    format!(
                        "the task declares no backend `{b}` (declared: {})",
                        known.join(", ")
                    ),
                ));
            }
        }
    }
    let applies = |backend: &str| {
        w.backends
            .as_ref()
            .is_none_or(|l| l.iter().any(|b| b == backend))
    };
    // A placeholder in an entry is filled from the params the request carries, which do not
    // include defaults: every workload of such a backend must set the axis.
    for (bname, b) in spec.backends.iter().filter(|(n, _)| applies(n)) {
        if let Some(p) = b
            .entry_placeholders()
            .into_iter()
            .find(|p| !w.params.contains_key(p))
        {
            return Err(Issue::workload(
                ppath.clone(),
                format!(
                    "backend `{bname}` fills `{{{p}}}` in its entry `{}` from each workload's \
                     params; set `{p}` here",
                    b.entry
                ),
            ));
        }
    }
    // Every assumption that applies to this workload holds: a kernel may rely on them.
    for axis in spec.axes.iter().filter(|a| a.ty == AxisType::Int) {
        let Some(ParamValue::Int(v)) = w.params.get(&axis.name) else {
            continue;
        };
        let mut declared = vec![(format!("axes.{}", axis.name), &axis.assume)];
        for (bname, b) in spec.backends.iter().filter(|(n, _)| applies(n)) {
            if let Some(a) = b.assume.get(&axis.name) {
                declared.push((format!("backends.{bname}.assume.{}", axis.name), a));
            }
        }
        for (where_, a) in declared {
            if let Some(why) = a.broken_by(*v) {
                return Err(Issue::workload(
                    ppath.key(&axis.name),
                    format!(
                        "{} = {v} breaks what kernels may assume: `{where_}` says {why} \
                         (limit the workload's `backends`, or change the declaration)",
                        axis.name
                    ),
                ));
            }
        }
    }
    for (input, d) in &w.dist {
        let p = root().key("dist").key(input);
        let Some(t) = spec.inputs.iter().find(|t| &t.name == input) else {
            let known: Vec<&str> = spec.inputs.iter().map(|t| t.name.as_str()).collect();
            return Err(Issue::workload(
                p,
                format!("`{input}` is not an input (inputs: {})", known.join(", ")),
            ));
        };
        if let Some((field, message)) = dist_problem(d) {
            return Err(Issue::workload(p.join(&field), message));
        }
        if let Distribution::Custom { function, .. } = d {
            if !python_defines(module_source, function) {
                return Err(Issue::workload(
                    p,
                    format!(
                        "{} defines no function `{function}` (the custom generator of `{input}` \
                         in this workload)",
                        spec.reference.module
                    ),
                ));
            }
        }
        if let (DTypeSpec::Fixed(dt), false) = (t.dtype, dist_suits_dtype(t.dtype, Some(d))) {
            return Err(Issue::workload(
                p,
                format!("integer input `{input}` ({dt}) needs a `rand_int` or `custom` dist"),
            ));
        }
    }
    Ok(())
}

/// Evaluates `w`'s shapes and roofline formulas (after [`check`]): every dimension positive,
/// every element count within `i64`, every input's distribution suited to its resolved dtype
/// (a `$dtype` input is only known here), both formulas finite and `>= 0`.
pub(crate) fn resolve(spec: &TaskSpec, w: &WorkloadSpec) -> Result<ResolvedWorkload, Issue> {
    let param_dtype = match w.params.get("dtype") {
        Some(ParamValue::Str(s)) => DType::parse(s),
        Some(ParamValue::Int(_)) => None,
        None => spec
            .axis("dtype")
            .and_then(|a| a.default.as_deref())
            .and_then(DType::parse),
    };
    let lookup = |name: &str| -> Option<Num> {
        if name == ELEM_BYTES {
            return param_dtype.map(|d| Num::Int(d.size_bytes() as i64));
        }
        match w.params.get(name) {
            Some(ParamValue::Int(i)) => Some(Num::Int(*i)),
            _ => None,
        }
    };
    let expr_err = |path: &FieldPath, e: ExprError| Issue::task(path.clone(), e.offset, e.message);

    let resolve_tensors = |list: &[TensorSpec],
                           section: &str|
     -> Result<Vec<ResolvedTensor>, Issue> {
        let mut out = Vec::new();
        for (j, t) in list.iter().enumerate() {
            let path = root().key(section).index(j);
            let dtype = match t.dtype {
                DTypeSpec::Fixed(d) => d,
                DTypeSpec::FromParam => param_dtype.ok_or_else(|| {
                    Issue::workload(
                        root().key("params").key("dtype"),
                        format!(
                            "`{}` has dtype \"$dtype\" but the workload's dtype is not a dtype name",
                            t.name
                        ),
                    )
                })?,
            };
            let mut shape = Vec::new();
            let mut numel: i64 = 1;
            for (k, e) in t.shape.iter().enumerate() {
                let p = path.key("shape").index(k);
                let n = e.eval_int(&lookup).map_err(|err| expr_err(&p, err))?;
                if n <= 0 {
                    return Err(Issue::task(
                        p,
                        None,
                        format!("`{}` = {n}; a dimension must be positive", e.source()),
                    ));
                }
                numel = numel.checked_mul(n).ok_or_else(|| {
                    Issue::task(
                        path.key("shape"),
                        None,
                        format!("the element count of `{}` overflows", t.name),
                    )
                })?;
                shape.push(n);
            }
            // A workload's own distribution for the input replaces the input's.
            let own = w.dist.get(&t.name);
            let given = own.or(t.dist.as_ref());
            if section == "inputs" && !dist_suits_dtype(DTypeSpec::Fixed(dtype), given) {
                let message = format!(
                    "integer input `{}` ({dtype}) needs a `rand_int` or `custom` dist",
                    t.name
                );
                return Err(match own {
                    Some(_) => Issue::workload(root().key("dist").key(&t.name), message),
                    None => Issue::task(path.key("dist"), None, message),
                });
            }
            let dist = (section == "inputs").then(|| given.cloned().unwrap_or_default());
            out.push(ResolvedTensor {
                name: t.name.clone(),
                dtype,
                shape,
                dist,
            });
        }
        Ok(out)
    };
    let inputs = resolve_tensors(&spec.inputs, "inputs")?;
    let outputs = resolve_tensors(&spec.outputs, "outputs")?;

    let formula = |e: &Expr, field: &str| -> Result<f64, Issue> {
        let p = root().key("roofline").key(field);
        let v = e.eval(&lookup).map_err(|err| expr_err(&p, err))?.as_f64();
        if !v.is_finite() || v < 0.0 {
            return Err(Issue::task(
                p,
                None,
                format!("`{}` = {v}; it must be a finite number >= 0", e.source()),
            ));
        }
        Ok(v)
    };
    let flops = formula(&spec.roofline.flops, "flops")?;
    let bytes = formula(&spec.roofline.bytes, "bytes")?;

    Ok(ResolvedWorkload {
        name: w.name.clone(),
        held_out: w.held_out,
        params: w.params.clone(),
        inputs,
        outputs,
        flops,
        bytes,
    })
}
