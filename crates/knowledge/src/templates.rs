//! Parametric kernel template families (`tasks/<name>/templates/`, and per backend
//! `tasks/<name>/templates-<backend>/`).
//!
//! A family is a `family.toml` that declares knobs (each with an ordered domain and a default)
//! and constraints between them, plus minijinja templates rendered with one value per knob.
//! The offline proposer walks this space: `default_knobs` is a plain kernel, `neighbours`
//! moves one knob one step, `apply` jumps to the values an action names.
//!
//! A task can ship one family per backend (C for `cpu`, CUDA C++ for `cuda`, a Python module
//! for `mlx`); [`TemplateFamily::load_for`] picks the backend's. A family may borrow templates
//! from a sibling directory (`include_dirs`), so two backends can share one device-code
//! template, and may render for several code targets (`targets`, e.g. `mlx-cuda` and
//! `mlx-metal`): templates and constraints see the chosen one as `target`.

use crate::error::{KnowledgeError, TemplateError};
use crate::files::{read_text, read_toml};
use crate::is_identifier;
use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Expression, UndefinedBehavior, Value};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The file inside `templates/` that declares a family.
pub const FAMILY_FILE: &str = "family.toml";

/// The directory of a task's backend-independent family (the cpu backend's, by history).
pub const TEMPLATES_DIR: &str = "templates";

/// The directory of a task's family for `backend`: `templates-<backend>`.
pub fn backend_templates_dir(backend: &str) -> String {
    format!("{TEMPLATES_DIR}-{backend}")
}

/// Families larger than this are refused: `enumerate` walks the space (pruned where a rule
/// breaks, but a loose family walks most of it), and the search is meant to explore it, not
/// sample a sliver of it.
pub const MAX_SPACE: u64 = 250_000;

/// Names a template may not use for a knob: they are given to templates by the renderer, or
/// are words of the expression language.
const RESERVED: &[&str] = &[
    "knobs",
    "knob_summary",
    "family",
    "target",
    "true",
    "false",
    "none",
    "True",
    "False",
    "None",
    "and",
    "or",
    "not",
    "in",
    "is",
    "if",
    "else",
    "loop",
];

/// One knob value. Domains are homogeneous: all booleans, all integers or all strings.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum KnobValue {
    Bool(bool),
    Int(i64),
    Str(String),
}

impl KnobValue {
    fn type_name(&self) -> &'static str {
        match self {
            KnobValue::Bool(_) => "bool",
            KnobValue::Int(_) => "integer",
            KnobValue::Str(_) => "string",
        }
    }

    fn to_value(&self) -> Value {
        match self {
            KnobValue::Bool(b) => Value::from(*b),
            KnobValue::Int(i) => Value::from(*i),
            KnobValue::Str(s) => Value::from(s.as_str()),
        }
    }
}

impl fmt::Display for KnobValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KnobValue::Bool(b) => write!(f, "{b}"),
            KnobValue::Int(i) => write!(f, "{i}"),
            KnobValue::Str(s) => write!(f, "{s:?}"),
        }
    }
}

impl From<bool> for KnobValue {
    fn from(v: bool) -> Self {
        KnobValue::Bool(v)
    }
}

impl From<i64> for KnobValue {
    fn from(v: i64) -> Self {
        KnobValue::Int(v)
    }
}

impl From<&str> for KnobValue {
    fn from(v: &str) -> Self {
        KnobValue::Str(v.to_string())
    }
}

impl From<String> for KnobValue {
    fn from(v: String) -> Self {
        KnobValue::Str(v)
    }
}

/// A knob setting: knob name to value. Sorted, so equal settings serialise identically.
pub type Knobs = BTreeMap<String, KnobValue>;

/// `name=value name=value …`, the compact label used in logs and prompts.
pub fn format_knobs(knobs: &Knobs) -> String {
    knobs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A knob: an ordered domain (neighbours are adjacent entries) and a default.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Knob {
    name: String,
    description: String,
    values: Vec<KnobValue>,
    default: KnobValue,
}

impl Knob {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    /// The domain in order; a boolean knob is `[false, true]`.
    pub fn values(&self) -> &[KnobValue] {
        &self.values
    }

    pub fn default_value(&self) -> &KnobValue {
        &self.default
    }

    pub fn is_bool(&self) -> bool {
        matches!(self.values.first(), Some(KnobValue::Bool(_)))
    }

    /// The position of `value` in the domain, if it is in it.
    pub fn position(&self, value: &KnobValue) -> Option<usize> {
        self.values.iter().position(|v| v == value)
    }

    fn domain_text(&self) -> String {
        self.values
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A rule every knob setting must satisfy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Rule {
    /// A minijinja expression over the knob names that must be true.
    Expr { expr: String, message: String },
    /// A combination that must not occur: a setting matching every entry is rejected.
    Forbid { knobs: Knobs, message: String },
}

impl Rule {
    pub fn message(&self) -> &str {
        match self {
            Rule::Expr { message, .. } | Rule::Forbid { message, .. } => message,
        }
    }

    fn describe(&self) -> String {
        match self {
            Rule::Expr { expr, .. } => expr.clone(),
            Rule::Forbid { knobs, .. } => format!("forbidden combination {}", format_knobs(knobs)),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFamilyFile {
    family: RawHeader,
    #[serde(default)]
    knob: Vec<RawKnob>,
    #[serde(default)]
    constraint: Vec<RawConstraint>,
    #[serde(default)]
    forbid: Vec<RawForbid>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeader {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default = "default_entry")]
    entry: String,
    /// Sibling directories (relative to this one, inside the task) whose templates this family
    /// may include, registered under their path relative to that directory.
    #[serde(default)]
    include_dirs: Vec<String>,
    /// Code targets (knowledge-pack target names) the family renders for; the first is the
    /// default. Templates and constraints see the chosen one as `target`.
    #[serde(default)]
    targets: Vec<String>,
    /// Backends the family serves; empty: any backend without a family of its own.
    #[serde(default)]
    backends: Vec<String>,
}

fn default_entry() -> String {
    "kernel.c.j2".to_string()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKnob {
    name: String,
    #[serde(default)]
    description: String,
    values: Option<Vec<KnobValue>>,
    #[serde(rename = "type")]
    kind: Option<String>,
    default: KnobValue,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConstraint {
    expr: String,
    #[serde(default)]
    message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawForbid {
    knobs: Knobs,
    #[serde(default)]
    message: String,
}

/// A loaded template family. Loading validates everything that does not depend on a knob
/// setting, and renders the defaults once, so a family that loads renders its defaults.
pub struct TemplateFamily {
    name: String,
    description: String,
    dir: PathBuf,
    entry: String,
    knobs: Vec<Knob>,
    rules: Vec<Rule>,
    targets: Vec<String>,
    /// Index into `targets` of the target renders are for (0 when there are none).
    target: usize,
    backends: Vec<String>,
    env: Environment<'static>,
    /// Every valid setting for the chosen target, enumerated on first use: the offline
    /// proposer repairs and samples settings every round, and the rules (which may read the
    /// target) do not change once the family is loaded.
    valid: OnceLock<Vec<Knobs>>,
}

impl fmt::Debug for TemplateFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TemplateFamily")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .field("entry", &self.entry)
            .field("knobs", &self.knobs)
            .field("rules", &self.rules)
            .field("targets", &self.targets)
            .field("target", &self.target())
            .field("backends", &self.backends)
            .finish()
    }
}

impl TemplateFamily {
    /// Loads `task_dir/templates/family.toml` and the templates beside it. `Ok(None)` when the
    /// task has no `templates/` directory.
    pub fn load(task_dir: &Path) -> Result<Option<TemplateFamily>, KnowledgeError> {
        Self::load_dir(&task_dir.join(TEMPLATES_DIR))
    }

    /// The family that writes kernels for `backend`: `task_dir/templates-<backend>/` when the
    /// task has one, else `task_dir/templates/` unless that family lists other `backends`.
    /// `Ok(None)` when neither applies.
    pub fn load_for(
        task_dir: &Path,
        backend: &str,
    ) -> Result<Option<TemplateFamily>, KnowledgeError> {
        let own = task_dir.join(backend_templates_dir(backend));
        if own.is_dir() {
            let family = Self::load_dir(&own)?;
            if let Some(f) = &family {
                if !f.serves(backend) {
                    return Err(KnowledgeError::invalid(
                        own.join(FAMILY_FILE),
                        "family.backends",
                        format!("the family in {} does not list `{backend}`", own.display()),
                    ));
                }
            }
            return Ok(family);
        }
        match Self::load(task_dir)? {
            Some(f) if f.serves(backend) => Ok(Some(f)),
            _ => Ok(None),
        }
    }

    /// Loads the family declared by `dir/family.toml`. `Ok(None)` when `dir` does not exist.
    pub fn load_dir(dir: &Path) -> Result<Option<TemplateFamily>, KnowledgeError> {
        if !dir.is_dir() {
            return Ok(None);
        }
        let path = dir.join(FAMILY_FILE);
        if !path.is_file() {
            return Err(KnowledgeError::invalid(
                dir,
                FAMILY_FILE,
                "a templates directory needs a family.toml that declares its knobs",
            ));
        }
        let raw: RawFamilyFile = read_toml(&path)?;
        Self::from_raw(raw, dir.to_path_buf(), &path).map(Some)
    }

    /// Whether this family writes kernels for `backend` (a family that lists no backends
    /// serves any).
    pub fn serves(&self, backend: &str) -> bool {
        self.backends.is_empty() || self.backends.iter().any(|b| b == backend)
    }

    fn from_raw(raw: RawFamilyFile, dir: PathBuf, path: &Path) -> Result<Self, KnowledgeError> {
        let invalid =
            |field: String, message: String| KnowledgeError::invalid(path, field, message);
        if raw.family.name.trim().is_empty() {
            return Err(invalid("family.name".into(), "must not be empty".into()));
        }
        if raw.knob.is_empty() {
            return Err(invalid(
                "knob".into(),
                "a family needs at least one knob".into(),
            ));
        }

        let mut knobs: Vec<Knob> = Vec::new();
        for (i, k) in raw.knob.into_iter().enumerate() {
            let field = |f: &str| format!("knob[{i}] ({}).{f}", k.name);
            if !is_identifier(&k.name) {
                return Err(invalid(
                    field("name"),
                    "must be an identifier ([A-Za-z_][A-Za-z0-9_]*) so templates can use it".into(),
                ));
            }
            if RESERVED.contains(&k.name.as_str()) {
                return Err(invalid(field("name"), "is a reserved name".into()));
            }
            if knobs.iter().any(|o| o.name == k.name) {
                return Err(invalid(field("name"), "is declared twice".into()));
            }
            let values = match (k.values, k.kind.as_deref()) {
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        field("type"),
                        "give either `values` or `type = \"bool\"`, not both".into(),
                    ))
                }
                (None, Some("bool")) => vec![KnobValue::Bool(false), KnobValue::Bool(true)],
                (None, Some(other)) => {
                    return Err(invalid(
                        field("type"),
                        format!(
                        "unknown type {other:?}; the only type is \"bool\" (else list `values`)"
                    ),
                    ))
                }
                (None, None) => {
                    return Err(invalid(
                        field("values"),
                        "missing: list the domain or write `type = \"bool\"`".into(),
                    ))
                }
                (Some(values), None) => values,
            };
            if values.is_empty() {
                return Err(invalid(field("values"), "must not be empty".into()));
            }
            let ty = values[0].type_name();
            if let Some(v) = values.iter().find(|v| v.type_name() != ty) {
                return Err(invalid(
                    field("values"),
                    format!(
                        "mixes types: {v} is a {} but the first value is a {ty}",
                        v.type_name()
                    ),
                ));
            }
            for (j, v) in values.iter().enumerate() {
                if values[..j].contains(v) {
                    return Err(invalid(field("values"), format!("{v} appears twice")));
                }
            }
            let knob = Knob {
                name: k.name.clone(),
                description: k.description,
                values,
                default: k.default,
            };
            if knob.position(&knob.default).is_none() {
                return Err(invalid(
                    field("default"),
                    format!(
                        "{} is not in the domain [{}]",
                        knob.default,
                        knob.domain_text()
                    ),
                ));
            }
            knobs.push(knob);
        }

        let space = knobs
            .iter()
            .try_fold(1u64, |acc, k| acc.checked_mul(k.values.len() as u64))
            .unwrap_or(u64::MAX);
        if space > MAX_SPACE {
            return Err(invalid(
                "knob".into(),
                format!("the knob space has {space} combinations; at most {MAX_SPACE} are allowed"),
            ));
        }

        for (i, t) in raw.family.targets.iter().enumerate() {
            if t.trim().is_empty() || raw.family.targets[..i].contains(t) {
                return Err(invalid(
                    format!("family.targets[{i}]"),
                    format!("{t:?} is empty or listed twice"),
                ));
            }
        }

        let env = environment().map_err(|e| KnowledgeError::Template {
            path: path.to_path_buf(),
            source: Box::new(e),
        })?;
        let mut family = TemplateFamily {
            name: raw.family.name,
            description: raw.family.description,
            dir,
            entry: raw.family.entry,
            knobs,
            rules: Vec::new(),
            targets: raw.family.targets,
            target: 0,
            backends: raw.family.backends,
            env,
            valid: OnceLock::new(),
        };

        for (i, c) in raw.constraint.into_iter().enumerate() {
            let field = format!("constraint[{i}].expr");
            let expr = family
                .env
                .compile_expression_owned(c.expr.clone())
                .map_err(|e| invalid(field.clone(), format!("does not parse: {e}")))?;
            let mut unknown: Vec<String> = expr
                .undeclared_variables(false)
                .into_iter()
                .filter(|v| family.knob(v).is_none())
                .filter(|v| v != "target" || family.targets.is_empty())
                .collect();
            unknown.sort();
            if !unknown.is_empty() {
                return Err(invalid(
                    field,
                    format!("names unknown knobs: {}", unknown.join(", ")),
                ));
            }
            let message = if c.message.is_empty() {
                format!("constraint `{}` is violated", c.expr)
            } else {
                c.message
            };
            drop(expr);
            family.rules.push(Rule::Expr {
                expr: c.expr,
                message,
            });
        }
        for (i, f) in raw.forbid.into_iter().enumerate() {
            if f.knobs.is_empty() {
                return Err(invalid(
                    format!("forbid[{i}].knobs"),
                    "must not be empty".into(),
                ));
            }
            if let Err(e) = family.check_domain(&f.knobs) {
                return Err(invalid(format!("forbid[{i}].knobs"), e.to_string()));
            }
            let message = if f.message.is_empty() {
                format!("the combination {} is forbidden", format_knobs(&f.knobs))
            } else {
                f.message
            };
            family.rules.push(Rule::Forbid {
                knobs: f.knobs,
                message,
            });
        }

        family.add_templates(path, &raw.family.include_dirs)?;

        // The defaults are the search's starting point under every target.
        let defaults = family.default_knobs();
        for t in 0..family.targets.len().max(1) {
            family.target = t;
            let under = family
                .target()
                .map(|t| format!(" (target {t})"))
                .unwrap_or_default();
            {
                let checker = family
                    .checker()
                    .map_err(|e| invalid("constraint".into(), e))?;
                if let Err(e) = checker.check(&family, &defaults) {
                    return Err(invalid(
                        "knob.default".into(),
                        format!("the defaults break a rule{under}: {e}"),
                    ));
                }
            }
            if let Err(e) = family.render(&defaults) {
                return Err(invalid(
                    family.entry.clone(),
                    format!("the defaults do not render{under}: {e}"),
                ));
            }
        }
        family.target = 0;
        Ok(family)
    }

    /// Every `*.j2` file in the templates directory (and its subdirectories) is registered under
    /// its relative path, so the entry template can include or import the others; so is every
    /// `*.j2` file of the `include_dirs`, which must lie inside the task directory.
    fn add_templates(
        &mut self,
        path: &Path,
        include_dirs: &[String],
    ) -> Result<(), KnowledgeError> {
        let mut files = Vec::new();
        collect_templates(&self.dir, &self.dir, &mut files)?;
        for (i, rel) in include_dirs.iter().enumerate() {
            let field = format!("family.include_dirs[{i}]");
            let dir = self
                .included_dir(rel)
                .map_err(|m| KnowledgeError::invalid(path, &field, m))?;
            let mut more = Vec::new();
            collect_templates(&dir, &dir, &mut more)?;
            for (name, file) in more {
                if files.iter().any(|(n, _)| *n == name) {
                    return Err(KnowledgeError::invalid(
                        path,
                        &field,
                        format!(
                            "template {name:?} of {} clashes with one already registered",
                            dir.display()
                        ),
                    ));
                }
                files.push((name, file));
            }
        }
        files.sort();
        if !files.iter().any(|(name, _)| *name == self.entry) {
            return Err(KnowledgeError::invalid(
                path,
                "family.entry",
                format!(
                    "template {:?} not found in {}",
                    self.entry,
                    self.dir.display()
                ),
            ));
        }
        for (name, file) in files {
            let text = read_text(&file)?;
            self.env
                .add_template_owned(name, text)
                .map_err(|e| KnowledgeError::Template {
                    path: file.clone(),
                    source: Box::new(e),
                })?;
        }
        Ok(())
    }

    /// `rel` resolved against the family directory; it must be a directory inside the task
    /// (the family directory's parent), so a family cannot read templates from anywhere.
    fn included_dir(&self, rel: &str) -> Result<PathBuf, String> {
        let rel_path = Path::new(rel);
        if rel.is_empty() || rel_path.is_absolute() {
            return Err(format!("{rel:?} must be a relative path"));
        }
        let dir = self.dir.join(rel_path);
        let task = self.dir.parent().and_then(|p| p.canonicalize().ok());
        let (Some(task), Ok(canonical)) = (task, dir.canonicalize()) else {
            return Err(format!("{} is not a directory", dir.display()));
        };
        if !canonical.is_dir() {
            return Err(format!("{} is not a directory", dir.display()));
        }
        if !canonical.starts_with(&task) || canonical == task {
            return Err(format!(
                "{rel:?} leaves the task directory {}",
                task.display()
            ));
        }
        Ok(canonical)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    /// The `templates/` directory the family was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The template that `render` renders, relative to `dir()`.
    pub fn entry(&self) -> &str {
        &self.entry
    }

    pub fn knobs(&self) -> &[Knob] {
        &self.knobs
    }

    /// The code targets the family renders for (empty: one, unnamed).
    pub fn targets(&self) -> &[String] {
        &self.targets
    }

    /// The target renders are for: the first of `targets` unless [`Self::with_target`] chose
    /// another; `None` when the family declares no targets.
    pub fn target(&self) -> Option<&str> {
        self.targets.get(self.target).map(String::as_str)
    }

    /// The same family rendering for `target`. Constraints may depend on the target, so the
    /// valid settings (and the neighbours) can differ from the default target's.
    pub fn with_target(mut self, target: &str) -> Result<Self, TemplateError> {
        match self.targets.iter().position(|t| t == target) {
            Some(i) => {
                self.target = i;
                self.valid = OnceLock::new();
                Ok(self)
            }
            None => Err(TemplateError::UnknownTarget {
                family: self.name.clone(),
                target: target.to_string(),
                known: if self.targets.is_empty() {
                    "none declared".to_string()
                } else {
                    self.targets.join(", ")
                },
            }),
        }
    }

    /// The backends the family declares it serves (empty: any).
    pub fn backends(&self) -> &[String] {
        &self.backends
    }

    pub fn knob(&self, name: &str) -> Option<&Knob> {
        self.knobs.iter().find(|k| k.name == name)
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Every knob at its default: the simple kernel a search starts from.
    pub fn default_knobs(&self) -> Knobs {
        self.knobs
            .iter()
            .map(|k| (k.name.clone(), k.default.clone()))
            .collect()
    }

    /// `knobs` with every knob it leaves out at its default (no check of names or domains).
    pub fn with_defaults(&self, knobs: &Knobs) -> Knobs {
        let mut full = self.default_knobs();
        full.extend(knobs.iter().map(|(k, v)| (k.clone(), v.clone())));
        full
    }

    /// The number of combinations before constraints.
    pub fn space_size(&self) -> u64 {
        self.knobs.iter().map(|k| k.values.len() as u64).product()
    }

    /// Checks names and domains only (a partial setting is fine).
    fn check_domain(&self, knobs: &Knobs) -> Result<(), TemplateError> {
        for (name, value) in knobs {
            let Some(knob) = self.knob(name) else {
                return Err(TemplateError::UnknownKnob {
                    family: self.name.clone(),
                    knob: name.clone(),
                    known: self
                        .knobs
                        .iter()
                        .map(|k| k.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            };
            if knob.position(value).is_none() {
                return Err(TemplateError::OutOfDomain {
                    family: self.name.clone(),
                    knob: name.clone(),
                    value: value.to_string(),
                    domain: knob.domain_text(),
                });
            }
        }
        Ok(())
    }

    /// Fills knobs missing from `knobs` with their defaults and checks names, domains and
    /// rules. The result is a complete, valid setting.
    pub fn validate(&self, knobs: &Knobs) -> Result<Knobs, TemplateError> {
        self.check_domain(knobs)?;
        let full = self.with_defaults(knobs);
        let checker = self
            .checker()
            .map_err(|message| TemplateError::Constraint {
                family: self.name.clone(),
                message,
                rule: "constraint".into(),
                knobs: format_knobs(&full),
            })?;
        checker.check(self, &full)?;
        Ok(full)
    }

    /// Whether `knobs` is a complete setting that `render` accepts as it is.
    pub fn is_valid(&self, knobs: &Knobs) -> bool {
        knobs.len() == self.knobs.len() && self.validate(knobs).is_ok()
    }

    /// Renders the entry template. Missing knobs take their defaults; unknown knobs, values
    /// outside a domain and broken rules are errors.
    pub fn render(&self, knobs: &Knobs) -> Result<String, TemplateError> {
        self.render_template(&self.entry, knobs)
    }

    /// Renders `name`, any template of the family (its path relative to the family directory
    /// or to an included one), with the same checks and context as [`Self::render`]. Tools use
    /// it for pieces of a candidate, e.g. the device code that MLX takes as a kernel's header.
    pub fn render_template(&self, name: &str, knobs: &Knobs) -> Result<String, TemplateError> {
        let full = self.validate(knobs)?;
        let template = self
            .env
            .get_template(name)
            .map_err(|e| self.render_error(name, e))?;
        template
            .render(self.context(&full))
            .map_err(|e| self.render_error(name, e))
    }

    fn render_error(&self, template: &str, e: minijinja::Error) -> TemplateError {
        TemplateError::Render {
            family: self.name.clone(),
            file: self.dir.join(template).display().to_string(),
            source: Box::new(e),
        }
    }

    /// Reads `KNOB=VALUE` as written on a command line: the value is taken as the knob's type
    /// (`true`/`false` for a boolean knob, a number for an integer one), so `--set block_n=64`
    /// means the integer. A value that is not of the knob's type is kept as text and fails the
    /// domain check with the knob's domain in the message.
    pub fn parse_setting(&self, text: &str) -> Result<(String, KnobValue), TemplateError> {
        let Some((name, raw)) = text.split_once('=') else {
            return Err(TemplateError::Setting {
                family: self.name.clone(),
                text: text.to_string(),
            });
        };
        let (name, raw) = (name.trim(), raw.trim());
        let value = match self.knob(name).and_then(|k| k.values.first()) {
            Some(KnobValue::Bool(_)) if raw == "true" || raw == "false" => {
                KnobValue::Bool(raw == "true")
            }
            Some(KnobValue::Int(_)) => raw
                .parse()
                .map_or_else(|_| KnobValue::from(raw), KnobValue::Int),
            _ => KnobValue::from(raw),
        };
        self.check_domain(&Knobs::from([(name.to_string(), value.clone())]))?;
        Ok((name.to_string(), value))
    }

    fn context(&self, knobs: &Knobs) -> Value {
        let mut ctx: BTreeMap<Value, Value> = knobs
            .iter()
            .map(|(k, v)| (Value::from(k.as_str()), v.to_value()))
            .collect();
        let listing: BTreeMap<Value, Value> = ctx.clone();
        ctx.insert(Value::from("knobs"), Value::from(listing));
        ctx.insert(Value::from("family"), Value::from(self.name.as_str()));
        ctx.insert(
            Value::from("knob_summary"),
            Value::from(format_knobs(knobs)),
        );
        if let Some(t) = self.target() {
            ctx.insert(Value::from("target"), Value::from(t));
        }
        Value::from(ctx)
    }

    /// Settings that differ from `knobs` in exactly one knob, moved one step along its domain
    /// (the previous and the next value), and that satisfy every rule. Missing knobs are read
    /// as defaults; a setting with unknown knobs or out-of-domain values has no neighbours.
    pub fn neighbours(&self, knobs: &Knobs) -> Vec<Knobs> {
        if self.check_domain(knobs).is_err() {
            return Vec::new();
        }
        let Ok(checker) = self.checker() else {
            return Vec::new();
        };
        let base = self.with_defaults(knobs);
        let mut out = Vec::new();
        for knob in &self.knobs {
            let Some(i) = knob.position(&base[&knob.name]) else {
                continue;
            };
            let steps = [
                i.checked_sub(1),
                Some(i + 1).filter(|&j| j < knob.values.len()),
            ];
            for j in steps.into_iter().flatten() {
                let mut next = base.clone();
                next.insert(knob.name.clone(), knob.values[j].clone());
                if checker.check(self, &next).is_ok() {
                    out.push(next);
                }
            }
        }
        out
    }

    /// Every valid combination, in odometer order over the declared domains (the last knob
    /// varies fastest).
    pub fn enumerate(&self) -> Vec<Knobs> {
        self.settings().to_vec()
    }

    /// As [`TemplateFamily::enumerate`], borrowed from the family's cache.
    pub fn settings(&self) -> &[Knobs] {
        self.valid.get_or_init(|| self.enumerate_fresh())
    }

    /// The valid settings, depth first over the knobs in declaration order (so in odometer
    /// order), each rule checked as soon as every knob it names is set: a prefix that breaks
    /// a rule is not extended. Walking the whole product instead cost a second per process for
    /// the attention cuda family (184 320 combinations, 1 536 valid).
    fn enumerate_fresh(&self) -> Vec<Knobs> {
        let Ok(checker) = self.checker() else {
            return Vec::new();
        };
        if self.knobs.is_empty() {
            let none = Knobs::new();
            return match checker.check(self, &none) {
                Ok(()) => vec![none],
                Err(_) => Vec::new(),
            };
        }
        // due[d]: the rules whose knobs are all set once knob d is.
        let mut due = vec![Vec::new(); self.knobs.len()];
        for (i, rule) in self.rules.iter().enumerate() {
            due[checker.last_knob(self, i, rule)].push(i);
        }
        let mut out = Vec::new();
        self.extend_valid(&checker, &due, &mut Knobs::new(), &mut out);
        out
    }

    /// Every valid completion of `prefix` (the knobs before `prefix.len()` set) into `out`.
    fn extend_valid(
        &self,
        checker: &Checker<'_>,
        due: &[Vec<usize>],
        prefix: &mut Knobs,
        out: &mut Vec<Knobs>,
    ) {
        let depth = prefix.len();
        let knob = &self.knobs[depth];
        for v in &knob.values {
            prefix.insert(knob.name.clone(), v.clone());
            if checker.holds(self, prefix, &due[depth]) {
                if depth + 1 == self.knobs.len() {
                    out.push(prefix.clone());
                } else {
                    self.extend_valid(checker, due, prefix, out);
                }
            }
        }
        prefix.remove(&knob.name);
    }

    /// `base` with `changes` applied. When the result breaks a rule, the other knobs are
    /// repaired: among valid settings that keep `changes`, the one that differs from the naive
    /// merge in the fewest knobs (then the fewest domain steps, then enumeration order).
    pub fn apply(&self, base: &Knobs, changes: &Knobs) -> Result<Knobs, TemplateError> {
        self.check_domain(base)?;
        self.check_domain(changes)?;
        let mut merged = self.with_defaults(base);
        merged.extend(changes.iter().map(|(k, v)| (k.clone(), v.clone())));
        if self.validate(&merged).is_ok() {
            return Ok(merged);
        }
        let distance = |candidate: &Knobs| -> (usize, usize) {
            let mut differing = 0;
            let mut steps = 0;
            for knob in &self.knobs {
                let (a, b) = (&merged[&knob.name], &candidate[&knob.name]);
                if a != b {
                    differing += 1;
                    let (i, j) = (knob.position(a), knob.position(b));
                    if let (Some(i), Some(j)) = (i, j) {
                        steps += i.abs_diff(j);
                    }
                }
            }
            (differing, steps)
        };
        self.settings()
            .iter()
            .filter(|c| changes.iter().all(|(k, v)| c.get(k) == Some(v)))
            .min_by_key(|c| distance(c))
            .cloned()
            .ok_or_else(|| TemplateError::Unsatisfiable {
                family: self.name.clone(),
                fixed: format_knobs(changes),
            })
    }

    fn checker(&self) -> Result<Checker<'_>, String> {
        let mut exprs = Vec::new();
        for rule in &self.rules {
            if let Rule::Expr { expr, .. } = rule {
                let compiled = self
                    .env
                    .compile_expression_owned(expr.clone())
                    .map_err(|e| format!("constraint `{expr}` does not parse: {e}"))?;
                exprs.push(Some(compiled));
            } else {
                exprs.push(None);
            }
        }
        Ok(Checker { exprs })
    }
}

/// The family's rules with their expressions compiled once, for loops over many settings.
struct Checker<'env> {
    exprs: Vec<Option<Expression<'env, 'static>>>,
}

impl Checker<'_> {
    /// The position of the last knob rule `i` reads: an expression's names (knobs, or the
    /// constant `target`, as loading checked), a forbidden combination's knobs; 0 for a rule
    /// that reads none.
    fn last_knob(&self, family: &TemplateFamily, i: usize, rule: &Rule) -> usize {
        let names: Vec<String> = match (rule, &self.exprs[i]) {
            (Rule::Expr { .. }, Some(expr)) => {
                expr.undeclared_variables(false).into_iter().collect()
            }
            (Rule::Forbid { knobs, .. }, _) => knobs.keys().cloned().collect(),
            (Rule::Expr { .. }, None) => Vec::new(),
        };
        names
            .iter()
            .filter_map(|n| family.knobs.iter().position(|k| &k.name == n))
            .max()
            .unwrap_or(0)
    }

    /// Whether `knobs` keeps the rules numbered in `which` (every knob they read is set).
    fn holds(&self, family: &TemplateFamily, knobs: &Knobs, which: &[usize]) -> bool {
        if which.is_empty() {
            return true;
        }
        let ctx = family.context(knobs);
        which
            .iter()
            .all(|&i| matches!(self.broken(family, i, &ctx, knobs), Ok(false)))
    }

    /// Whether rule `i` is broken in `ctx` (the context of `knobs`); an error when its
    /// expression cannot be evaluated.
    fn broken(
        &self,
        family: &TemplateFamily,
        i: usize,
        ctx: &Value,
        knobs: &Knobs,
    ) -> Result<bool, TemplateError> {
        let rule = &family.rules[i];
        Ok(match (rule, &self.exprs[i]) {
            (Rule::Expr { .. }, Some(expr)) => match expr.eval(ctx.clone()) {
                Ok(v) => !v.is_true(),
                Err(e) => {
                    return Err(TemplateError::Constraint {
                        family: family.name.clone(),
                        message: format!("the rule cannot be evaluated: {e}"),
                        rule: rule.describe(),
                        knobs: format_knobs(knobs),
                    })
                }
            },
            (
                Rule::Forbid {
                    knobs: forbidden, ..
                },
                _,
            ) => forbidden.iter().all(|(k, v)| knobs.get(k) == Some(v)),
            (Rule::Expr { .. }, None) => false,
        })
    }

    fn check(&self, family: &TemplateFamily, knobs: &Knobs) -> Result<(), TemplateError> {
        let ctx = family.context(knobs);
        for (i, rule) in family.rules.iter().enumerate() {
            if self.broken(family, i, &ctx, knobs)? {
                return Err(TemplateError::Constraint {
                    family: family.name.clone(),
                    message: rule.message().to_string(),
                    rule: rule.describe(),
                    knobs: format_knobs(knobs),
                });
            }
        }
        Ok(())
    }
}

fn environment() -> Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    // A typo in a template or a constraint must fail loudly, not render an empty string.
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_syntax(
        SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(true)
            .build()?,
    );
    Ok(env)
}

fn collect_templates(
    root: &Path,
    dir: &Path,
    out: &mut Vec<(String, PathBuf)>,
) -> Result<(), KnowledgeError> {
    let io = |source| KnowledgeError::Io {
        path: dir.to_path_buf(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.is_dir() {
            collect_templates(root, &path, out)?;
        } else if path.extension().is_some_and(|e| e == "j2") {
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.push((rel, path));
        }
    }
    Ok(())
}
