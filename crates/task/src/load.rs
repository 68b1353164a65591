//! Reads a task directory: parses `task.toml`, checks every name, type, expression and file
//! reference, and resolves every workload, so a task that loads is a task the harness can run.

use crate::error::{SpecError, TaskError};
use crate::expr::{Expr, FUNCTIONS};
use crate::raw::{RawAssume, RawBackend, RawDist, RawTask, RawTolerance};
use crate::source_map::{FieldPath, SourceMap};
use crate::spec::{fill_placeholders, placeholders, *};
use crate::text::{dtype_hint, dtype_list, is_ident, python_defines, ELEM_BYTES};
use crate::workload::{self, dist_problem, dist_suits_dtype, reach_problem, Issue};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Backends the evaluator knows; a typo in `[backends.<name>]` must not load silently.
pub(crate) const KNOWN_BACKENDS: &[&str] = &["cpu", "cuda", "mlx"];

/// A workload resolved for the harness, with the backends it applies to (`None`: all).
#[derive(Debug, Clone)]
pub(crate) struct ResolvedEntry {
    pub workload: ResolvedWorkload,
    pub backends: Option<Vec<String>>,
}

pub(crate) struct Loaded {
    pub dir: PathBuf,
    pub spec: TaskSpec,
    pub resolved: Vec<ResolvedEntry>,
    pub source: String,
    /// The text of the reference module, where custom generators must be defined.
    pub module_source: String,
}

pub(crate) fn load(dir: &Path) -> Result<Loaded, TaskError> {
    let dir = dir.canonicalize().map_err(|source| TaskError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let file = dir.join("task.toml");
    if !file.is_file() {
        return Err(TaskError::NotATaskDir { path: dir });
    }
    let text = std::fs::read_to_string(&file).map_err(|source| TaskError::Io {
        path: file.clone(),
        source,
    })?;
    let ctx = Ctx {
        file,
        map: SourceMap::new(&text),
    };
    let raw: RawTask = toml::from_str(&text).map_err(|e| ctx.toml_error(&e))?;
    let (spec, module_source) = Checker {
        ctx: &ctx,
        dir: &dir,
    }
    .check(raw)?;
    let resolved = resolve_all(&ctx, &spec)?;
    Ok(Loaded {
        dir,
        spec,
        resolved,
        source: text,
        module_source,
    })
}

/// A task file and its source map: turns field paths into errors with lines.
pub(crate) struct Ctx<'a> {
    pub(crate) file: PathBuf,
    pub(crate) map: SourceMap<'a>,
}

impl Ctx<'_> {
    /// The error at `path` (or its nearest existing ancestor) as a `SpecError`.
    pub(crate) fn spec_error(&self, path: &FieldPath, message: impl Into<String>) -> SpecError {
        let offset = self.map.span_of(path).map(|s| s.start);
        self.spec_error_at(path.to_string(), offset, message.into())
    }

    fn spec_error_at(&self, field: String, offset: Option<usize>, message: String) -> SpecError {
        let loc = offset.map(|o| self.map.locate(o));
        SpecError {
            file: self.file.clone(),
            field,
            line: loc.as_ref().map(|l| l.line),
            column: loc.as_ref().map(|l| l.column),
            message,
            snippet: loc.map(|l| l.text),
        }
    }

    fn error_at(&self, field: String, offset: Option<usize>, message: String) -> TaskError {
        TaskError::Invalid(Box::new(self.spec_error_at(field, offset, message)))
    }

    fn err(&self, path: &FieldPath, message: impl Into<String>) -> TaskError {
        TaskError::Invalid(Box::new(self.spec_error(path, message)))
    }

    /// An error inside a string value (an expression): points at `offset` within the string
    /// when the value is a plain one-line string, so the column is exact.
    fn err_in_str(&self, path: &FieldPath, offset: Option<usize>, message: String) -> TaskError {
        let span = self.map.span_of(path);
        let start = match (span, offset) {
            (Some(span), Some(off)) => {
                let raw = &self.map.text()[span.clone()];
                let plain = (raw.starts_with('"') || raw.starts_with('\''))
                    && !raw.contains('\\')
                    && !raw.contains('\n');
                Some(if plain {
                    span.start + 1 + off
                } else {
                    span.start
                })
            }
            (Some(span), None) => Some(span.start),
            (None, _) => None,
        };
        self.error_at(path.to_string(), start, message)
    }

    fn toml_error(&self, e: &toml::de::Error) -> TaskError {
        let offset = e.span().map(|s| s.start);
        let field = offset
            .map(|o| self.map.path_at(o).to_string())
            .unwrap_or_default();
        // toml's messages end with a newline and sometimes carry a second line of detail.
        let message = e.message().trim().replace('\n', "; ");
        self.error_at(field, offset, message)
    }
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphanumeric())
        && chars.all(|c| c == '_' || c == '-' || c == '.' || c.is_ascii_alphanumeric())
}

fn toml_type(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}

/// Does `text` contain `ident` as a whole identifier (not as part of a longer one)?
fn mentions_ident(text: &str, ident: &str) -> bool {
    let is_word = |c: char| c == '_' || c.is_ascii_alphanumeric();
    text.match_indices(ident).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + ident.len()..].chars().next();
        !before.is_some_and(is_word) && !after.is_some_and(is_word)
    })
}

struct Checker<'a, 'c> {
    ctx: &'a Ctx<'c>,
    dir: &'a Path,
}

impl Checker<'_, '_> {
    fn err(&self, path: &FieldPath, message: impl Into<String>) -> TaskError {
        self.ctx.err(path, message)
    }

    /// The validated spec and the text of its reference module.
    fn check(&self, raw: RawTask) -> Result<(TaskSpec, String), TaskError> {
        let root = FieldPath::root();
        let format = raw.format.ok_or_else(|| {
            self.err(
                &root.key("format"),
                "missing `format = 1` (the task format version)",
            )
        })?;
        if format != FORMAT_VERSION {
            return Err(self.err(
                &root.key("format"),
                format!(
                    "unsupported task format {format}; this ksearch reads format {FORMAT_VERSION}"
                ),
            ));
        }
        let name = self.name_field(raw.name, &root.key("name"), "the task's name")?;
        let kind = self.name_field(
            raw.kind,
            &root.key("kind"),
            "the task kind, e.g. \"attention\"",
        )?;

        let axes = self.axes(raw.axes)?;
        let has_dtype_axis = axes
            .iter()
            .any(|a| a.name == "dtype" && a.ty == AxisType::Str);
        let mut taken: BTreeSet<String> = axes.iter().map(|a| a.name.clone()).collect();

        let mut inputs = Vec::new();
        for (i, t) in raw.inputs.into_iter().enumerate() {
            let path = root.key("inputs").index(i);
            let name = self.tensor_name(t.name, &path, &mut taken)?;
            let dtype = self.dtype(t.dtype, &path.key("dtype"), has_dtype_axis)?;
            let shape = self.shape(t.shape, &path.key("shape"), &axes)?;
            let dist = match t.dist {
                None => None,
                Some(v) => Some(self.dist(v, &path.key("dist"), &name)?),
            };
            if let (DTypeSpec::Fixed(d), false) = (dtype, dist_suits_dtype(dtype, dist.as_ref())) {
                return Err(self.err(
                    &path.key("dist"),
                    format!("integer input `{name}` ({d}) needs a `rand_int` or `custom` dist"),
                ));
            }
            let must_reach = match t.must_reach {
                None => None,
                Some(r) => Some(self.reach(r, &path.key("must_reach"))?),
            };
            inputs.push(TensorSpec {
                name,
                dtype,
                shape,
                dist,
                must_reach,
                description: t.description,
            });
        }
        let mut outputs = Vec::new();
        for (i, t) in raw.outputs.into_iter().enumerate() {
            let path = root.key("outputs").index(i);
            let name = self.tensor_name(t.name, &path, &mut taken)?;
            let dtype = self.dtype(t.dtype, &path.key("dtype"), has_dtype_axis)?;
            let shape = self.shape(t.shape, &path.key("shape"), &axes)?;
            outputs.push(TensorSpec {
                name,
                dtype,
                shape,
                dist: None,
                must_reach: None,
                description: t.description,
            });
        }
        if outputs.is_empty() {
            return Err(self.err(
                &root.key("outputs"),
                "no [[outputs]]: a task needs at least one output",
            ));
        }

        let uses_dtype_param = inputs
            .iter()
            .chain(&outputs)
            .any(|t| t.dtype == DTypeSpec::FromParam);
        if let Some(d) = axes
            .iter()
            .find(|a| a.name == "dtype")
            .and_then(|a| a.default.as_ref())
        {
            if uses_dtype_param && DType::parse(d).is_none() {
                return Err(self.err(
                    &root.key("axes").key("dtype").key("default"),
                    format!(
                        "`{d}` is not a dtype{} (expected one of {})",
                        dtype_hint(d),
                        dtype_list()
                    ),
                ));
            }
        }

        let tolerance = self.tolerance(raw.tolerance)?;
        let roofline = self.roofline(raw.roofline, &axes, has_dtype_axis)?;
        let (reference, module_source) = self.reference(raw.reference)?;
        for (i, t) in inputs.iter().enumerate() {
            if let Some(Distribution::Custom { function, .. }) = &t.dist {
                if !python_defines(&module_source, function) {
                    return Err(self.err(
                        &root.key("inputs").index(i).key("dist"),
                        format!(
                            "{} defines no function `{function}` (the custom generator of `{}`)",
                            reference.module, t.name
                        ),
                    ));
                }
            }
        }
        let backends = self.backends(
            raw.backends,
            &axes,
            &inputs,
            &outputs,
            &reference,
            &module_source,
        )?;
        let mut spec = TaskSpec {
            format,
            name,
            kind,
            description: raw.description,
            axes,
            workloads: Vec::new(),
            inputs,
            outputs,
            tolerance,
            roofline,
            reference,
            backends,
        };
        spec.workloads = self.workloads(raw.workloads, &spec, &module_source)?;
        Ok((spec, module_source))
    }

    fn name_field(
        &self,
        value: Option<String>,
        path: &FieldPath,
        what: &str,
    ) -> Result<String, TaskError> {
        let value = value.ok_or_else(|| self.err(path, format!("missing `{path}` ({what})")))?;
        if !is_name(&value) {
            return Err(self.err(
                path,
                format!("`{value}` is not a valid name (letters, digits, `_`, `-`, `.`)"),
            ));
        }
        Ok(value)
    }

    fn axes(&self, raw: BTreeMap<String, crate::raw::RawAxis>) -> Result<Vec<Axis>, TaskError> {
        let base = FieldPath::root().key("axes");
        let mut axes = Vec::new();
        for (name, a) in raw {
            let path = base.key(&name);
            if !is_ident(&name) {
                return Err(self.err(
                    &path,
                    format!("axis name `{name}` must be an identifier (letters, digits, `_`)"),
                ));
            }
            if name == ELEM_BYTES || FUNCTIONS.iter().any(|(f, _)| *f == name) {
                return Err(self.err(&path, format!("`{name}` is reserved in expressions")));
            }
            let ty = match a.ty.as_deref() {
                None | Some("int") => AxisType::Int,
                Some("str") => AxisType::Str,
                Some(other) => {
                    return Err(self.err(
                        &path.key("type"),
                        format!("unknown axis type `{other}` (expected \"int\" or \"str\")"),
                    ))
                }
            };
            let assume = self.assumption(
                RawAssume {
                    values: a.values,
                    multiple_of: a.multiple_of,
                    min: a.min,
                    max: a.max,
                },
                &path,
                ty,
                &name,
            )?;
            let default = match (a.default, ty) {
                (None, _) => None,
                (Some(toml::Value::String(v)), AxisType::Str) => Some(v),
                (Some(other), AxisType::Str) => {
                    return Err(self.err(
                        &path.key("default"),
                        format!(
                            "expected a string default for str axis `{name}`, found {}",
                            toml_type(&other)
                        ),
                    ))
                }
                (Some(_), AxisType::Int) => {
                    return Err(self.err(
                        &path.key("default"),
                        "only str axes take a `default`; every workload binds its int axes",
                    ))
                }
            };
            axes.push(Axis {
                name,
                ty,
                description: a.description,
                default,
                assume,
            });
        }
        // Keep declaration order: it is how the author lists dimensions.
        axes.sort_by_key(|a| {
            self.ctx
                .map
                .span_of(&base.key(&a.name))
                .map(|s| s.start)
                .unwrap_or(usize::MAX)
        });
        Ok(axes)
    }

    /// An axis's assumption (`values`, `multiple_of`, `min`, `max`) at `path`; only int axes
    /// take one.
    fn assumption(
        &self,
        raw: RawAssume,
        path: &FieldPath,
        ty: AxisType,
        axis: &str,
    ) -> Result<Assumption, TaskError> {
        let a = Assumption {
            values: raw.values,
            multiple_of: raw.multiple_of,
            min: raw.min,
            max: raw.max,
        };
        if a.is_empty() {
            return Ok(a);
        }
        let field = if a.values.is_some() {
            "values"
        } else if a.multiple_of.is_some() {
            "multiple_of"
        } else if a.min.is_some() {
            "min"
        } else {
            "max"
        };
        if ty != AxisType::Int {
            return Err(self.err(
                &path.key(field),
                format!(
                    "`{axis}` is a str axis; only int axes take `values`, `multiple_of`, `min` \
                     and `max`"
                ),
            ));
        }
        if let Some(values) = &a.values {
            if values.is_empty() {
                return Err(self.err(
                    &path.key("values"),
                    "an empty `values` list admits no workload; leave it out to assume nothing",
                ));
            }
            let mut seen = BTreeSet::new();
            if let Some(v) = values.iter().find(|v| !seen.insert(**v)) {
                return Err(self.err(&path.key("values"), format!("{v} is listed twice")));
            }
        }
        if let Some(k) = a.multiple_of {
            if k < 2 {
                return Err(self.err(
                    &path.key("multiple_of"),
                    format!("multiple_of = {k} says nothing; it must be at least 2"),
                ));
            }
        }
        if let (Some(lo), Some(hi)) = (a.min, a.max) {
            if lo > hi {
                return Err(self.err(
                    &path.key("min"),
                    format!("min = {lo} is above max = {hi}: no value is allowed"),
                ));
            }
        }
        if let Some(values) = &a.values {
            let bounds = Assumption {
                values: None,
                ..a.clone()
            };
            if let Some((v, why)) = values
                .iter()
                .find_map(|v| bounds.broken_by(*v).map(|why| (v, why)))
            {
                return Err(self.err(
                    &path.key("values"),
                    format!("{v} is not {why}, which this axis also declares"),
                ));
            }
        }
        Ok(a)
    }

    /// An input's `must_reach = { low, high }`, or a custom generator's `reach`.
    fn reach(&self, value: toml::Value, path: &FieldPath) -> Result<Reach, TaskError> {
        if !value.is_table() {
            return Err(self.err(
                path,
                format!(
                    "expected a table like {{ low = -100.0, high = 100.0 }}, found {}",
                    toml_type(&value)
                ),
            ));
        }
        let raw = crate::raw::RawReach::deserialize(value)
            .map_err(|e| self.err(path, e.message().trim().to_string()))?;
        let reach = Reach {
            low: raw.low,
            high: raw.high,
        };
        match reach_problem(&reach) {
            Some((field, message)) => Err(self.err(&path.join(&field), message)),
            None => Ok(reach),
        }
    }

    fn tensor_name(
        &self,
        name: Option<String>,
        path: &FieldPath,
        taken: &mut BTreeSet<String>,
    ) -> Result<String, TaskError> {
        let npath = path.key("name");
        let name = name.ok_or_else(|| self.err(&npath, "missing `name`"))?;
        if !is_ident(&name) {
            return Err(self.err(
                &npath,
                format!("`{name}` is not an identifier (letters, digits, `_`)"),
            ));
        }
        if !taken.insert(name.clone()) {
            return Err(self.err(
                &npath,
                format!(
                    "`{name}` is already the name of an axis, input or output; `args` could not \
                     tell them apart"
                ),
            ));
        }
        Ok(name)
    }

    fn dtype(
        &self,
        raw: Option<String>,
        path: &FieldPath,
        has_dtype_axis: bool,
    ) -> Result<DTypeSpec, TaskError> {
        let raw = raw.ok_or_else(|| {
            self.err(
                path,
                format!("missing `dtype` (one of {}, or \"$dtype\")", dtype_list()),
            )
        })?;
        if raw == "$dtype" {
            if !has_dtype_axis {
                return Err(self.err(
                    path,
                    "\"$dtype\" takes the workload's `dtype` parameter, but the task has no str \
                     axis `dtype` (add [axes.dtype] with type = \"str\")",
                ));
            }
            return Ok(DTypeSpec::FromParam);
        }
        DType::parse(&raw).map(DTypeSpec::Fixed).ok_or_else(|| {
            self.err(
                path,
                format!(
                    "unknown dtype `{raw}`{} (expected one of {}, or \"$dtype\")",
                    dtype_hint(&raw),
                    dtype_list()
                ),
            )
        })
    }

    /// Parses `value` (a string expression or a number) and checks its names against `allowed`.
    fn expr(
        &self,
        value: &toml::Value,
        path: &FieldPath,
        axes: &[Axis],
        extra: &[&str],
        what: &str,
    ) -> Result<Expr, TaskError> {
        let expr = match value {
            toml::Value::Integer(i) => Expr::int(*i),
            toml::Value::Float(x) => Expr::parse(&format!("{x:?}"))
                .map_err(|e| self.ctx.err_in_str(path, None, e.message))?,
            toml::Value::String(s) => Expr::parse(s).map_err(|e| {
                self.ctx.err_in_str(
                    path,
                    e.offset,
                    format!("cannot parse {what} `{s}`: {}", e.message),
                )
            })?,
            other => {
                return Err(self.err(
                    path,
                    format!(
                        "expected {what} (a number or an expression string), found {}",
                        toml_type(other)
                    ),
                ))
            }
        };
        for (ident, offset) in expr.identifiers() {
            if extra.contains(&ident) {
                continue;
            }
            match axes.iter().find(|a| a.name == ident) {
                Some(a) if a.ty == AxisType::Int => {}
                Some(_) => {
                    return Err(self.ctx.err_in_str(
                        path,
                        Some(offset),
                        format!(
                            "axis `{ident}` is a str axis; only int axes can appear in {what}s"
                        ),
                    ))
                }
                None => {
                    let mut known: Vec<&str> = axes
                        .iter()
                        .filter(|a| a.ty == AxisType::Int)
                        .map(|a| a.name.as_str())
                        .collect();
                    known.extend_from_slice(extra);
                    let mut hint = String::new();
                    if ident == ELEM_BYTES {
                        hint = " (`elem_bytes` needs a str axis `dtype`)".to_string();
                    }
                    return Err(self.ctx.err_in_str(
                        path,
                        Some(offset),
                        format!(
                            "unknown name `{ident}` in {what} `{}`{hint}; known: {}",
                            expr.source(),
                            if known.is_empty() {
                                "(no int axes)".to_string()
                            } else {
                                known.join(", ")
                            }
                        ),
                    ));
                }
            }
        }
        Ok(expr)
    }

    fn shape(
        &self,
        raw: Option<Vec<toml::Value>>,
        path: &FieldPath,
        axes: &[Axis],
    ) -> Result<Vec<Expr>, TaskError> {
        let raw = raw.ok_or_else(|| {
            self.err(
                path,
                "missing `shape` (a list of integer expressions over axes; [] for a scalar)",
            )
        })?;
        let mut out = Vec::new();
        for (k, v) in raw.iter().enumerate() {
            let p = path.index(k);
            if matches!(v, toml::Value::Float(_)) {
                return Err(self.err(&p, "a shape entry must be an integer, not a float"));
            }
            let e = self.expr(v, &p, axes, &[], "shape expression")?;
            if let toml::Value::Integer(i) = v {
                if *i <= 0 {
                    return Err(self.err(&p, format!("shape entry {i} must be positive")));
                }
            }
            out.push(e);
        }
        Ok(out)
    }

    fn dist(
        &self,
        value: toml::Value,
        path: &FieldPath,
        input: &str,
    ) -> Result<Distribution, TaskError> {
        if !value.is_table() {
            return Err(self.err(
                path,
                format!(
                    "expected a table like {{ kind = \"normal\", mean = 0.0, std = 1.0 }}, found {}",
                    toml_type(&value)
                ),
            ));
        }
        let raw = RawDist::deserialize(value).map_err(|e| {
            self.err(
                path,
                format!(
                    "{} (kinds: normal {{mean, std}}, uniform {{low, high}}, rand_int {{low, high}}, \
                     custom {{function, reach}})",
                    e.message().trim()
                ),
            )
        })?;
        let dist = match raw {
            RawDist::Normal { mean, std } => Distribution::Normal { mean, std },
            RawDist::Uniform { low, high } => Distribution::Uniform { low, high },
            RawDist::RandInt { low, high } => Distribution::RandInt { low, high },
            RawDist::Custom { function, reach } => Distribution::Custom {
                function: function.unwrap_or_else(|| format!("make_{input}")),
                reach: match reach {
                    None => None,
                    Some(r) => Some(self.reach(r, &path.key("reach"))?),
                },
            },
        };
        match dist_problem(&dist) {
            Some((field, message)) => Err(self.err(&path.join(&field), message)),
            None => Ok(dist),
        }
    }

    fn tolerance(
        &self,
        raw: BTreeMap<String, RawTolerance>,
    ) -> Result<BTreeMap<DType, Tolerance>, TaskError> {
        let base = FieldPath::root().key("tolerance");
        let mut out = BTreeMap::new();
        for (key, t) in raw {
            let path = base.key(&key);
            let dtype = DType::parse(&key).ok_or_else(|| {
                self.err(
                    &path,
                    format!(
                        "unknown dtype `{key}`{} (expected one of {})",
                        dtype_hint(&key),
                        dtype_list()
                    ),
                )
            })?;
            let default = dtype.default_tolerance();
            let rule = match t.rule.as_deref() {
                None | Some("scaled") => crate::ToleranceRule::Scaled,
                Some("either") => crate::ToleranceRule::Either,
                Some(other) => {
                    return Err(self.err(
                        &path.key("rule"),
                        format!("unknown rule `{other}` (expected `scaled` or `either`)"),
                    ))
                }
            };
            let matched_ratio = t.matched_ratio.unwrap_or(1.0);
            if !(matched_ratio > 0.0 && matched_ratio <= 1.0) {
                return Err(self.err(
                    &path.key("matched_ratio"),
                    format!("must be in (0, 1], got {matched_ratio}"),
                ));
            }
            let value = Tolerance {
                rtol: t.rtol.unwrap_or(default.rtol),
                atol: t.atol.unwrap_or(default.atol),
                rule,
                matched_ratio,
            };
            for (field, v) in [("rtol", value.rtol), ("atol", value.atol)] {
                if !v.is_finite() || v < 0.0 {
                    return Err(self.err(
                        &path.key(field),
                        format!("must be a finite number >= 0, got {v}"),
                    ));
                }
            }
            out.insert(dtype, value);
        }
        Ok(out)
    }

    fn roofline(
        &self,
        raw: Option<crate::raw::RawRoofline>,
        axes: &[Axis],
        has_dtype_axis: bool,
    ) -> Result<Roofline, TaskError> {
        let path = FieldPath::root().key("roofline");
        let raw = raw.ok_or_else(|| {
            self.err(
                &path,
                "missing [roofline] with `flops` and `bytes` formulas (they set the floor below \
                 which a time is impossible)",
            )
        })?;
        let extra: &[&str] = if has_dtype_axis { &[ELEM_BYTES] } else { &[] };
        let get = |value: Option<toml::Value>, field: &str| {
            let p = path.key(field);
            let v = value.ok_or_else(|| self.err(&p, format!("missing `{field}` formula")))?;
            self.expr(&v, &p, axes, extra, "formula")
        };
        let flops = get(raw.flops, "flops")?;
        let bytes = get(raw.bytes, "bytes")?;
        Ok(Roofline { flops, bytes })
    }

    fn reference(
        &self,
        raw: Option<crate::raw::RawReference>,
    ) -> Result<(ReferenceSpec, String), TaskError> {
        let path = FieldPath::root().key("reference");
        let (module, function) = match raw {
            Some(r) => (r.module, r.function),
            None => (None, None),
        };
        let module = module.unwrap_or_else(|| "reference.py".to_string());
        let function = function.unwrap_or_else(|| "reference".to_string());
        let relative = Path::new(&module);
        if relative.is_absolute()
            || relative
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(self.err(
                &path.key("module"),
                format!("`{module}` must be a path inside the task directory"),
            ));
        }
        let file = self.dir.join(relative);
        let source = std::fs::read_to_string(&file).map_err(|e| {
            self.err(
                &path.key("module"),
                format!("cannot read the reference module {}: {e}", file.display()),
            )
        })?;
        if !is_ident(&function) {
            return Err(self.err(
                &path.key("function"),
                format!("`{function}` is not a Python identifier"),
            ));
        }
        if !python_defines(&source, &function) {
            return Err(self.err(
                &path.key("function"),
                format!("{module} defines no top-level function `{function}`"),
            ));
        }
        Ok((ReferenceSpec { module, function }, source))
    }

    fn backends(
        &self,
        raw: BTreeMap<String, RawBackend>,
        axes: &[Axis],
        inputs: &[TensorSpec],
        outputs: &[TensorSpec],
        reference: &ReferenceSpec,
        module_source: &str,
    ) -> Result<BTreeMap<String, BackendSpec>, TaskError> {
        let base = FieldPath::root().key("backends");
        if raw.is_empty() {
            return Err(self.err(
                &base,
                "no [backends.<name>] table: a task needs at least one backend (e.g. [backends.cpu])",
            ));
        }
        let mut out = BTreeMap::new();
        for (name, b) in raw {
            let path = base.key(&name);
            if !KNOWN_BACKENDS.contains(&name.as_str()) {
                return Err(self.err(
                    &path,
                    format!(
                        "unknown backend `{name}` (known: {})",
                        KNOWN_BACKENDS.join(", ")
                    ),
                ));
            }
            let entry = b.entry.ok_or_else(|| {
                self.err(
                    &path.key("entry"),
                    "missing `entry` (the kernel's symbol name)",
                )
            })?;
            // `{axis}` placeholders name str axes; filled with any value the entry must be an
            // identifier.
            for p in placeholders(&entry) {
                if !axes.iter().any(|a| a.name == p && a.ty == AxisType::Str) {
                    return Err(self.err(
                        &path.key("entry"),
                        format!(
                            "`{{{p}}}` in `{entry}` names no str axis; placeholders are filled \
                             from a workload's str params (e.g. `{{dtype}}`)"
                        ),
                    ));
                }
            }
            let probe = fill_placeholders(&entry, |_| Some("x".to_string()));
            if !probe.as_deref().is_some_and(is_ident) {
                return Err(self.err(
                    &path.key("entry"),
                    format!("`{entry}` is not a C identifier"),
                ));
            }
            let args = b.args.ok_or_else(|| {
                self.err(
                    &path.key("args"),
                    "missing `args` (input, output and axis names in call order)",
                )
            })?;
            let mut seen = BTreeSet::new();
            for (i, arg) in args.iter().enumerate() {
                let p = path.key("args").index(i);
                let is_tensor = inputs.iter().chain(outputs).any(|t| &t.name == arg);
                match axes.iter().find(|a| &a.name == arg) {
                    Some(a) if a.ty == AxisType::Str => {
                        return Err(self.err(
                            &p,
                            format!(
                                "`{arg}` is a str axis; only int axes can be passed to a kernel"
                            ),
                        ))
                    }
                    Some(_) => {}
                    None if is_tensor => {}
                    None => {
                        let mut known: Vec<&str> = inputs
                            .iter()
                            .chain(outputs)
                            .map(|t| t.name.as_str())
                            .collect();
                        known.extend(
                            axes.iter()
                                .filter(|a| a.ty == AxisType::Int)
                                .map(|a| a.name.as_str()),
                        );
                        return Err(self.err(
                            &p,
                            format!(
                                "`{arg}` names no input, output or int axis (known: {})",
                                known.join(", ")
                            ),
                        ));
                    }
                }
                if !seen.insert(arg.as_str()) {
                    return Err(self.err(&p, format!("`{arg}` is passed twice")));
                }
            }
            // mlx entries return their outputs instead of writing into them.
            let returns_outputs = name == "mlx";
            for t in inputs.iter().chain(outputs) {
                let is_output = outputs.iter().any(|o| o.name == t.name);
                if returns_outputs && is_output {
                    if seen.contains(t.name.as_str()) {
                        return Err(self.err(
                            &path.key("args"),
                            format!(
                                "the mlx entry returns its outputs; `{}` cannot be an argument",
                                t.name
                            ),
                        ));
                    }
                } else if !seen.contains(t.name.as_str()) {
                    let what = if returns_outputs {
                        "every input"
                    } else {
                        "every input and output"
                    };
                    return Err(self.err(
                        &path.key("args"),
                        format!("`args` must pass {what}; `{}` is missing", t.name),
                    ));
                }
            }
            let signature = b.signature.ok_or_else(|| {
                self.err(
                    &path.key("signature"),
                    "missing `signature` (the prototype shown to proposers)",
                )
            })?;
            if !mentions_ident(&signature, &entry) {
                return Err(self.err(
                    &path.key("signature"),
                    format!("the signature does not mention the entry `{entry}`"),
                ));
            }
            let language = match (b.language, name.as_str()) {
                (Some(l), _) => l,
                (None, "cpu") => "c".to_string(),
                (None, "cuda") => "cuda".to_string(),
                (None, "mlx") => "python".to_string(),
                (None, _) => return Err(self.err(&path.key("language"), "missing `language`")),
            };
            let language_ok = match name.as_str() {
                "cpu" => matches!(language.as_str(), "c" | "c++"),
                "cuda" => language == "cuda",
                "mlx" => language == "python",
                _ => true,
            };
            if !language_ok {
                let expected = match name.as_str() {
                    "cpu" => "compiles \"c\" or \"c++\"",
                    "cuda" => "compiles \"cuda\"",
                    _ => "runs \"python\" modules",
                };
                return Err(self.err(
                    &path.key("language"),
                    format!("the {name} backend {expected}, not `{language}`"),
                ));
            }
            let seed = match b.seed {
                None => None,
                Some(s) => {
                    let file = self.dir.join(&s);
                    if !file.is_file() {
                        return Err(self.err(
                            &path.key("seed"),
                            format!(
                                "seed kernel `{s}` not found (looked for {})",
                                file.display()
                            ),
                        ));
                    }
                    Some(file)
                }
            };
            for (field, f) in [("reference", &b.reference), ("baseline", &b.baseline)] {
                let Some(f) = f else { continue };
                if !is_ident(f) {
                    return Err(self.err(
                        &path.key(field),
                        format!("`{f}` is not a Python identifier"),
                    ));
                }
                if !python_defines(module_source, f) {
                    return Err(self.err(
                        &path.key(field),
                        format!("{} defines no top-level function `{f}`", reference.module),
                    ));
                }
            }
            let mut forbidden: Vec<String> = Vec::new();
            for (i, f) in b.forbidden.iter().enumerate() {
                if f.trim().is_empty() || f.chars().any(char::is_whitespace) {
                    return Err(self.err(
                        &path.key("forbidden").index(i),
                        format!("`{f}` is not an identifier"),
                    ));
                }
            }
            // The reference and baseline are always off limits: calling them is the cheapest
            // way to pass every check.
            for f in b
                .forbidden
                .iter()
                .chain(std::iter::once(&reference.function))
                .chain(b.reference.iter())
                .chain(b.baseline.iter())
            {
                if !forbidden.contains(f) {
                    forbidden.push(f.clone());
                }
            }
            for (i, k) in b.allowed_kernels.iter().enumerate() {
                if k.trim().is_empty() {
                    return Err(self.err(
                        &path.key("allowed_kernels").index(i),
                        "an empty pattern would allow every kernel",
                    ));
                }
            }
            let mut assume = BTreeMap::new();
            for (axis, raw) in b.assume {
                let p = path.key("assume").key(&axis);
                let Some(a) = axes.iter().find(|a| a.name == axis) else {
                    let known: Vec<&str> = axes
                        .iter()
                        .filter(|a| a.ty == AxisType::Int)
                        .map(|a| a.name.as_str())
                        .collect();
                    return Err(self.err(
                        &p,
                        format!("`{axis}` is not an axis (int axes: {})", known.join(", ")),
                    ));
                };
                let a = self.assumption(raw, &p, a.ty, &axis)?;
                if a.is_empty() {
                    return Err(self.err(
                        &p,
                        "an empty assumption; give `values`, `multiple_of`, `min` or `max`",
                    ));
                }
                assume.insert(axis, a);
            }
            out.insert(
                name,
                BackendSpec {
                    entry,
                    args,
                    signature,
                    language,
                    seed,
                    reference: b.reference,
                    baseline: b.baseline,
                    forbidden,
                    allowed_kernels: b.allowed_kernels,
                    assume,
                },
            );
        }
        Ok(out)
    }

    /// The `[[workloads]]`, each checked against `spec` (whose own `workloads` are not yet
    /// filled) by [`workload::check`]; then every backend needs a workload, and one that is not
    /// held out.
    fn workloads(
        &self,
        raw: Vec<crate::raw::RawWorkload>,
        spec: &TaskSpec,
        module_source: &str,
    ) -> Result<Vec<WorkloadSpec>, TaskError> {
        let base = FieldPath::root().key("workloads");
        if raw.is_empty() {
            return Err(self.err(
                &base,
                "no [[workloads]]: a task needs at least one workload",
            ));
        }
        let mut names = BTreeSet::new();
        let mut out = Vec::new();
        for (i, w) in raw.into_iter().enumerate() {
            let path = base.index(i);
            let name = w
                .name
                .ok_or_else(|| self.err(&path.key("name"), "missing `name`"))?;
            if !is_name(&name) {
                return Err(self.err(
                    &path.key("name"),
                    format!("`{name}` is not a valid name (letters, digits, `_`, `-`, `.`)"),
                ));
            }
            if !names.insert(name.clone()) {
                return Err(self.err(
                    &path.key("name"),
                    format!("duplicate workload name `{name}`"),
                ));
            }
            // TOML values that are neither integers nor strings fit no axis type.
            let mut params = BTreeMap::new();
            for (key, value) in w.params {
                let value = match value {
                    toml::Value::Integer(v) => ParamValue::Int(v),
                    toml::Value::String(v) => ParamValue::Str(v),
                    other => match spec.axis(&key) {
                        Some(axis) => {
                            let issue = workload::wrong_type(axis, toml_type(&other));
                            return Err(self.workload_err(&path, issue));
                        }
                        // Not an axis: `workload::check` reports the name, whatever its value.
                        None => ParamValue::Str(String::new()),
                    },
                };
                params.insert(key, value);
            }
            let mut dist = BTreeMap::new();
            for (input, value) in w.dist {
                let d = self.dist(value, &path.key("dist").key(&input), &input)?;
                dist.insert(input, d);
            }
            let w = WorkloadSpec {
                name,
                params,
                held_out: w.held_out,
                backends: w.backends,
                dist,
            };
            workload::check(spec, module_source, &w).map_err(|e| self.workload_err(&path, e))?;
            out.push(w);
        }
        for backend in spec.backends.keys() {
            let applies =
                |w: &&WorkloadSpec| w.backends.as_ref().is_none_or(|b| b.contains(backend));
            let total = out.iter().filter(applies).count();
            if total == 0 {
                return Err(self.err(&base, format!("no workload applies to backend `{backend}`")));
            }
            if out.iter().filter(applies).all(|w| w.held_out) {
                return Err(self.err(
                    &base,
                    format!(
                        "every workload of backend `{backend}` is held out; proposers need at least \
                         one workload they can see"
                    ),
                ));
            }
        }
        Ok(out)
    }

    /// An issue of the workload at `path` (`workloads[i]`) as an error at its line.
    fn workload_err(&self, path: &FieldPath, issue: Issue) -> TaskError {
        workload_error(self.ctx, path, issue, None)
    }
}

/// An issue of the workload at `path` as an error at its line: a field of the workload under
/// `path`, a field of the task as it is. `context` (which workload) prefixes the message.
fn workload_error(
    ctx: &Ctx<'_>,
    path: &FieldPath,
    issue: Issue,
    context: Option<&str>,
) -> TaskError {
    let field = if issue.in_task {
        issue.field
    } else {
        path.join(&issue.field)
    };
    let message = match context {
        Some(c) => format!("{c}: {}", issue.message),
        None => issue.message,
    };
    ctx.err_in_str(&field, issue.offset, message)
}

fn resolve_all(ctx: &Ctx<'_>, spec: &TaskSpec) -> Result<Vec<ResolvedEntry>, TaskError> {
    let base = FieldPath::root().key("workloads");
    spec.workloads
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let context = format!("in workload `{}` (workloads[{i}])", w.name);
            let workload = workload::resolve(spec, w)
                .map_err(|e| workload_error(ctx, &base.index(i), e, Some(&context)))?;
            Ok(ResolvedEntry {
                workload,
                backends: w.backends.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_whole_identifiers_only() {
        let sig = "void softmax_f32(const float* x)";
        assert!(mentions_ident(sig, "softmax_f32"));
        assert!(!mentions_ident(sig, "softmax"));
        assert!(!mentions_ident(sig, "f32"));
        assert!(mentions_ident(sig, "x"));
    }

    #[test]
    fn names_and_identifiers() {
        assert!(is_ident("B") && is_ident("_x1") && is_ident("delta_bias"));
        assert!(!is_ident("1x") && !is_ident("a-b") && !is_ident(""));
        assert!(is_name("b1h4l256d64") && is_name("selective-scan") && is_name("v1.2"));
        assert!(!is_name("-x") && !is_name("a b") && !is_name(""));
    }
}
