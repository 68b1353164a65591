//! Prompt templates (`knowledge/prompts/*.j2`, minijinja) and the typed context they render.
//!
//! One template per role and step: `wm_init`, `propose`, `refine`, `too_hard`,
//! `code_spec_action`, `code_base_action`, `debug`, `improve`, `evolve` (the evolve strategy's
//! children), plus `system.j2` (the system
//! prompt of every call) and `_`-prefixed partials. The [`ContextLevel`] decides how much of
//! the task and the knowledge packs a prompt carries:
//!
//! - `none`: the task's name and entry-point signature only (the naive configuration);
//! - `spec`: + the task specification, the device name and the world model in code prompts
//!   (pure evolution);
//! - `full`: + the knowledge packs: hardware profile, concept maps, patterns and assertions for
//!   the task kind and target (full translation context).
//!
//! World-model prompts always carry the tree itself: an edit cannot name nodes it cannot see.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::{Environment, UndefinedBehavior, Value};
use serde::{Deserialize, Serialize};

use ksearch_knowledge::packs::hardware_lines;
use ksearch_knowledge::{HardwareProfile, KnowledgeContext, Packs, Target};
use ksearch_task::{ParamValue, Task};

use super::{AttemptView, CycleAttempt, OutcomeSummary};
use crate::world_model::{Node, NodeId};

/// How much context the prompts carry (the seeds' three configurations).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContextLevel {
    /// Task signature only: the naive configuration.
    None,
    /// Task spec and world model: pure evolution.
    Spec,
    /// Spec plus the knowledge packs: full translation context.
    #[default]
    Full,
}

impl ContextLevel {
    pub const NAMES: [&'static str; 3] = ["none", "spec", "full"];

    pub fn as_str(self) -> &'static str {
        match self {
            ContextLevel::None => "none",
            ContextLevel::Spec => "spec",
            ContextLevel::Full => "full",
        }
    }

    pub fn has_spec(self) -> bool {
        self != ContextLevel::None
    }

    pub fn has_knowledge(self) -> bool {
        self == ContextLevel::Full
    }
}

impl fmt::Display for ContextLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ContextLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(ContextLevel::None),
            "spec" => Ok(ContextLevel::Spec),
            "full" => Ok(ContextLevel::Full),
            other => Err(format!(
                "unknown context level `{other}` (expected one of: {})",
                Self::NAMES.join(", ")
            )),
        }
    }
}

/// Which prompt; the name is the template's file stem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptRole {
    WmInit,
    Propose,
    Refine,
    TooHard,
    CodeSpecAction,
    CodeBaseAction,
    Debug,
    Improve,
    /// A child of the evolve strategy: a diff, rewrite or crossover of sampled parents.
    Evolve,
}

impl PromptRole {
    pub const ALL: [PromptRole; 9] = [
        PromptRole::WmInit,
        PromptRole::Propose,
        PromptRole::Refine,
        PromptRole::TooHard,
        PromptRole::CodeSpecAction,
        PromptRole::CodeBaseAction,
        PromptRole::Debug,
        PromptRole::Improve,
        PromptRole::Evolve,
    ];

    /// Template stem, e.g. `code_base_action`.
    pub fn template(self) -> &'static str {
        match self {
            PromptRole::WmInit => "wm_init",
            PromptRole::Propose => "propose",
            PromptRole::Refine => "refine",
            PromptRole::TooHard => "too_hard",
            PromptRole::CodeSpecAction => "code_spec_action",
            PromptRole::CodeBaseAction => "code_base_action",
            PromptRole::Debug => "debug",
            PromptRole::Improve => "improve",
            PromptRole::Evolve => "evolve",
        }
    }

    /// Name in the run store's exchanges, e.g. `code-base-action`.
    pub fn tag(self) -> &'static str {
        match self {
            PromptRole::WmInit => "wm-init",
            PromptRole::Propose => "wm-propose",
            PromptRole::Refine => "wm-refine",
            PromptRole::TooHard => "wm-too-hard",
            PromptRole::CodeSpecAction => "code-spec-action",
            PromptRole::CodeBaseAction => "code-base-action",
            PromptRole::Debug => "code-debug",
            PromptRole::Improve => "code-improve",
            PromptRole::Evolve => "code-evolve",
        }
    }

    pub fn writes_code(self) -> bool {
        matches!(
            self,
            PromptRole::CodeSpecAction
                | PromptRole::CodeBaseAction
                | PromptRole::Debug
                | PromptRole::Improve
                | PromptRole::Evolve
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("prompt templates: cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("prompt template {name}: {message}")]
    Template { name: String, message: String },
    #[error("prompt templates in {dir}: missing {name}.j2")]
    Missing { dir: PathBuf, name: String },
    #[error(transparent)]
    Knowledge(#[from] ksearch_knowledge::KnowledgeError),
}

fn template_error(name: &str, e: &minijinja::Error) -> PromptError {
    let mut message = format!("{e:#}");
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        message.push_str(&format!("\ncaused by: {c}"));
        cause = c.source();
    }
    PromptError::Template {
        name: name.to_string(),
        message,
    }
}

/// The system prompt and the user message of one call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RenderedPrompt {
    pub system: String,
    pub user: String,
}

/// The loaded templates.
pub struct PromptSet {
    env: Environment<'static>,
    dir: PathBuf,
}

impl fmt::Debug for PromptSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PromptSet").field("dir", &self.dir).finish()
    }
}

impl PromptSet {
    /// Loads every `*.j2` in `dir`; every role's template and `system.j2` must be there.
    pub fn load(dir: &Path) -> Result<Self, PromptError> {
        let mut env = Environment::new();
        // A misspelt variable must fail the render, not silently drop a prompt section.
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| template_error("syntax", &e))?,
        );
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        let io = |source| PromptError::Io {
            path: dir.to_path_buf(),
            source,
        };
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "j2"))
            .collect();
        entries.sort();
        for path in entries {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let text = std::fs::read_to_string(&path).map_err(|source| PromptError::Io {
                path: path.clone(),
                source,
            })?;
            env.add_template_owned(name.clone(), text)
                .map_err(|e| template_error(&name, &e))?;
        }
        for name in PromptRole::ALL
            .iter()
            .map(|r| r.template())
            .chain(["system", "_knowledge"])
        {
            if env.get_template(&format!("{name}.j2")).is_err() {
                return Err(PromptError::Missing {
                    dir: dir.to_path_buf(),
                    name: name.to_string(),
                });
            }
        }
        Ok(Self {
            env,
            dir: dir.to_path_buf(),
        })
    }

    /// The templates shipped with ksearch (`knowledge/prompts/`).
    pub fn builtin() -> Result<Self, PromptError> {
        let dir = ksearch_assets::locate(ksearch_assets::Tree::Knowledge)
            .map_err(ksearch_knowledge::KnowledgeError::from)?;
        Self::load(&dir.join("prompts"))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn render_one(&self, name: &str, ctx: &Value) -> Result<String, PromptError> {
        let t = self
            .env
            .get_template(name)
            .map_err(|e| template_error(name, &e))?;
        let text = t.render(ctx).map_err(|e| template_error(name, &e))?;
        Ok(tidy(&text))
    }

    /// Renders the system prompt and `role`'s template with `ctx`.
    pub fn render(
        &self,
        role: PromptRole,
        ctx: &PromptContext,
    ) -> Result<RenderedPrompt, PromptError> {
        let mut value = serde_json::to_value(ctx).map_err(|e| PromptError::Template {
            name: role.template().into(),
            message: e.to_string(),
        })?;
        value["role"] = serde_json::Value::String(role.template().to_string());
        let ctx = Value::from(Serde(&value));
        Ok(RenderedPrompt {
            system: self.render_one("system.j2", &ctx)?,
            user: self.render_one(&format!("{}.j2", role.template()), &ctx)?,
        })
    }

    /// The knowledge section exactly as prompts include it (`ksearch knowledge show`).
    pub fn render_knowledge(&self, knowledge: &KnowledgeContext) -> Result<String, PromptError> {
        let ctx = Value::from(Serde(serde_json::json!({ "knowledge": knowledge })));
        self.render_one("_knowledge.j2", &ctx)
    }
}

/// Collapses runs of blank lines (left by skipped sections) into one, trims line ends.
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank = 0;
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank += 1;
            if blank > 1 {
                continue;
            }
        } else {
            blank = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.trim_start_matches('\n').trim_end().to_string() + "\n"
}

/// The entry points `spec` names for `task`'s workloads on `backend` (held-out ones included:
/// the re-check calls them too), sorted and without repeats; empty unless the entry has
/// `{axis}` placeholders.
fn entry_names(task: &Task, backend: &str, spec: &ksearch_task::BackendSpec) -> Vec<String> {
    if spec.entry_placeholders().is_empty() {
        return Vec::new();
    }
    let names: std::collections::BTreeSet<String> = task
        .workloads(backend)
        .unwrap_or_default()
        .iter()
        .filter_map(|w| spec.entry_for(&w.params))
        .collect();
    names.into_iter().collect()
}

/// What every prompt knows about the task (fixed for a run).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TaskView {
    pub name: String,
    pub kind: String,
    pub backend: String,
    pub language: String,
    pub signature: String,
    /// The symbol the code must define.
    pub entry: String,
    /// Where `entry` is named per workload (`attention_{dtype}`), the names the run's
    /// workloads call, sorted (`attention_bf16`, `attention_f16`): every one must be defined.
    /// Empty for a single entry point.
    pub entries: Vec<String>,
    /// Preferred tag of the code block in replies.
    pub fence_tag: String,
    pub target: String,
    pub target_title: String,
}

/// The per-run part of every prompt: task, spec, device, knowledge, code-format rules.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PromptInputs {
    pub level: ContextLevel,
    pub task: TaskView,
    /// The task specification (levels `spec` and `full`).
    pub spec: Option<String>,
    /// The device's title (levels `spec` and `full`).
    pub device: Option<String>,
    /// Knowledge packs (level `full`).
    pub knowledge: Option<KnowledgeContext>,
    /// The source of the function the harness checks candidates against (level `full`).
    pub reference: Option<String>,
    pub code_format: String,
    /// Fence tags accepted for code replies, preferred first.
    #[serde(skip)]
    pub fence_tags: Vec<String>,
}

impl PromptInputs {
    /// Builds the inputs for `task` on `backend` from the packs. `hardware` names a profile
    /// (by name or alias) that overrides the target's default device.
    pub fn for_task(
        task: &Task,
        backend: &str,
        packs: &Packs,
        hardware: Option<&str>,
        level: ContextLevel,
    ) -> Result<Self, PromptError> {
        let spec = task.backend(backend).map_err(|e| PromptError::Template {
            name: "task".into(),
            message: e.to_string(),
        })?;
        let target = packs
            .target_for_backend(backend)
            .cloned()
            .unwrap_or_else(|| fallback_target(backend, &spec.language));
        let profile: Option<HardwareProfile> = hardware
            .and_then(|h| HardwareProfile::find(packs.hardware(), h))
            .or_else(|| HardwareProfile::find(packs.hardware(), &target.hardware))
            .cloned();
        let knowledge = if level.has_knowledge() && packs.target(&target.name).is_some() {
            Some(packs.context(
                &target.name,
                Some(task.kind()),
                hardware.filter(|h| HardwareProfile::find(packs.hardware(), h).is_some()),
            )?)
        } else {
            None
        };
        Ok(Self {
            level,
            task: TaskView {
                name: task.name().to_string(),
                kind: task.kind().to_string(),
                backend: backend.to_string(),
                language: spec.language.clone(),
                signature: spec.signature.clone(),
                entry: spec.entry.clone(),
                entries: entry_names(task, backend, spec),
                fence_tag: target
                    .fence_tags
                    .first()
                    .cloned()
                    .unwrap_or_else(|| spec.language.clone()),
                target: target.name.clone(),
                target_title: target.title.clone(),
            },
            spec: level.has_spec().then(|| task_spec_text(task, backend)),
            device: if level.has_spec() {
                profile.as_ref().map(|p| p.title.clone())
            } else {
                None
            },
            knowledge,
            reference: if level.has_knowledge() {
                reference_source(task, backend)
            } else {
                None
            },
            code_format: target.code_format.trim().to_string(),
            fence_tags: target.fence_tags.clone(),
        })
    }

    /// The hardware lines of the knowledge section, if any (for tests and `show`).
    pub fn hardware_lines(&self) -> Vec<String> {
        self.knowledge
            .as_ref()
            .and_then(|k| k.hardware.as_ref())
            .map(hardware_lines)
            .unwrap_or_default()
    }
}

/// Longest reference source a prompt carries; beyond it the middle is cut, visibly.
const MAX_REFERENCE_CHARS: usize = 6_000;

/// The reference function `backend` is checked against, as it stands in its module: the `def`
/// line (with its decorators) through the end of its body; `None` when the module cannot be
/// read or does not define it at the top level.
pub fn reference_source(task: &Task, backend: &str) -> Option<String> {
    let spec = task.reference_for(backend).ok()?;
    let text = std::fs::read_to_string(task.dir().join(&spec.module)).ok()?;
    let lines: Vec<&str> = text.lines().collect();
    let def = format!("def {}(", spec.function);
    let start = lines.iter().position(|l| l.starts_with(&def))?;
    let mut first = start;
    while first > 0 && lines[first - 1].starts_with('@') {
        first -= 1;
    }
    // The body ends at the next line that starts at column 0 (a new top-level statement).
    let end = lines[start + 1..]
        .iter()
        .position(|l| !l.trim().is_empty() && !l.starts_with([' ', '\t', ')', ']', '}']))
        .map_or(lines.len(), |i| start + 1 + i);
    let body = lines[first..end].join("\n");
    Some(cut_middle(body.trim_end(), MAX_REFERENCE_CHARS))
}

/// A target for a backend the packs do not know: the language's own fence tag, no rules beyond
/// "one complete file".
fn fallback_target(backend: &str, language: &str) -> Target {
    Target {
        name: backend.to_string(),
        title: format!("{backend} backend"),
        backends: vec![backend.to_string()],
        os: None,
        language: language.to_string(),
        fence_tags: vec![language.to_string()],
        hardware: String::new(),
        code_format: format!(
            "- Reply with exactly one fenced block tagged `{language}` holding the complete source file."
        ),
    }
}

/// The task specification as prompts show it: description, axes, inputs and outputs, the
/// workloads a proposer may see (never the held-out ones), tolerances and the roofline model.
pub fn task_spec_text(task: &Task, backend: &str) -> String {
    let spec = task.spec();
    let mut s = String::new();
    s.push_str(&format!("Task `{}` (kind `{}`)\n", spec.name, spec.kind));
    s.push_str(spec.description.trim());
    s.push_str("\n\nAxes:\n");
    for a in &spec.axes {
        let default = a
            .default
            .as_ref()
            .map(|d| format!(" (default {d})"))
            .unwrap_or_default();
        // What the task lets kernels of this backend assume; anything else is varied by
        // workloads the proposer never sees.
        let assume = spec
            .assumption_text(backend, &a.name)
            .map(|t| format!(" (kernels may assume: {t})"))
            .unwrap_or_default();
        s.push_str(&format!(
            "- {}{default}: {}{assume}\n",
            a.name,
            a.description.trim()
        ));
    }
    let tensor_line = |t: &ksearch_task::TensorSpec| {
        let shape: Vec<&str> = t.shape.iter().map(|e| e.source()).collect();
        let dtype = serde_json::to_value(t.dtype)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let dtype = if dtype == "$dtype" {
            "dtype of the workload".to_string()
        } else {
            dtype
        };
        format!(
            "- {} [{}] {}: {}\n",
            t.name,
            shape.join(", "),
            dtype,
            t.description.trim()
        )
    };
    s.push_str("\nInputs:\n");
    for t in &spec.inputs {
        s.push_str(&tensor_line(t));
    }
    s.push_str("\nOutputs:\n");
    for t in &spec.outputs {
        s.push_str(&tensor_line(t));
    }
    if let Ok(workloads) = task.workloads(backend) {
        s.push_str("\nWorkloads (all must pass; the score is the geometric mean speedup over the baseline):\n");
        for w in workloads.iter().filter(|w| !w.held_out) {
            // In the order the task declares its axes, which is the order people read them.
            let params: Vec<String> = spec
                .axes
                .iter()
                .filter_map(|a| w.params.get(&a.name).map(|v| (&a.name, v)))
                .map(|(k, v)| match v {
                    ParamValue::Int(i) => format!("{k}={i}"),
                    ParamValue::Str(x) => format!("{k}={x}"),
                })
                .collect();
            s.push_str(&format!("- {}: {}\n", w.name, params.join(", ")));
        }
        s.push_str(
            "Other shapes and inputs are checked too before a kernel is accepted: do not specialise on these \
             beyond what the axes say kernels may assume.\n",
        );
    }
    // Only the dtypes this backend's workloads use; the table lists every dtype's default.
    let used: BTreeSet<ksearch_task::DType> = task
        .workloads(backend)
        .unwrap_or_default()
        .iter()
        .flat_map(|w| w.inputs.iter().chain(&w.outputs).map(|t| t.dtype))
        .filter(|d| d.is_float())
        .collect();
    let tol: BTreeMap<String, String> = task
        .tolerance_table()
        .into_iter()
        .filter(|(d, _)| used.contains(d))
        .map(|(d, t)| (d.as_str().to_string(), describe_tolerance(&t)))
        .collect();
    if !tol.is_empty() {
        s.push_str("\nTolerance: ");
        s.push_str(
            &tol.iter()
                .map(|(d, t)| format!("{d}: {t}"))
                .collect::<Vec<_>>()
                .join("; "),
        );
        s.push('\n');
    }
    s.push_str(&format!(
        "Roofline model: {} FLOP and {} bytes per call.\n",
        spec.roofline.flops.source(),
        spec.roofline.bytes.source()
    ));
    s
}

/// An action as code and edit prompts show it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ActionView {
    pub node_id: String,
    pub parent_id: Option<String>,
    pub title: String,
    pub description: String,
    pub difficulty: u8,
    pub score: f64,
    pub expected_vs_baseline_factor: Option<f64>,
    pub rationale: String,
    pub decision: Option<String>,
    pub choice: Option<String>,
}

impl ActionView {
    pub fn of(node: &Node) -> Self {
        let a = node.action.clone().unwrap_or_default();
        Self {
            node_id: node.id.to_string(),
            parent_id: node.parent.as_ref().map(NodeId::to_string),
            title: a.title,
            description: a.description,
            difficulty: a.difficulty,
            score: (a.score * 1000.0).round() / 1000.0,
            expected_vs_baseline_factor: a
                .expected_vs_baseline_factor
                .map(|f| (f * 1000.0).round() / 1000.0),
            rationale: a.rationale,
            decision: node.decision.clone(),
            choice: node.choice.clone(),
        }
    }
}

/// Code plus what was measured about it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AttemptText {
    pub candidate_id: i64,
    pub source: String,
    pub status: String,
    pub passed: bool,
    /// Geometric-mean speedup over the baseline, 3 decimals.
    pub score: Option<String>,
    pub speedup_vs_reference: Option<String>,
    pub latency_ms: Option<String>,
    pub workloads: Vec<String>,
    /// What bounds it where it is furthest from the speed of light (passing kernels).
    pub bottleneck: Option<String>,
    /// Why it failed (end of the compiler output, violation, mismatch); empty if it passed.
    pub log: String,
}

/// Longest source put into a prompt; beyond it the middle is cut.
const MAX_SOURCE_CHARS: usize = 60_000;
/// Longest failure log in a prompt; the end is kept (compilers report the last error last).
const MAX_LOG_CHARS: usize = 4_000;

impl AttemptText {
    pub fn of(v: &AttemptView) -> Self {
        let o: &OutcomeSummary = &v.outcome;
        Self {
            candidate_id: v.candidate_id,
            source: cut_middle(v.source.trim_end(), MAX_SOURCE_CHARS),
            status: if o.status.is_empty() {
                "not evaluated".into()
            } else {
                o.status.clone()
            },
            passed: o.passed,
            score: o.score.map(|s| format!("{s:.3}")),
            speedup_vs_reference: o.speedup_vs_reference.map(|s| format!("{s:.3}")),
            latency_ms: o.latency_ms.map(|l| format!("{l:.4}")),
            workloads: o.workloads.clone(),
            bottleneck: o.bottleneck.clone(),
            log: if o.passed {
                String::new()
            } else {
                keep_end(&o.message, MAX_LOG_CHARS)
            },
        }
    }
}

/// Longest source of an inspiration in an evolve prompt (the middle is cut): they are
/// examples, and up to five of them come with the parent.
const MAX_INSPIRATION_CHARS: usize = 8_000;

/// A program an evolve prompt shows for ideas: its measurements and (shortened) code.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct InspirationText {
    pub attempt: AttemptText,
    /// `top` (among the island's best) or `diverse` (another region of the population).
    pub why: String,
}

impl InspirationText {
    pub fn of(v: &AttemptView, why: &str) -> Self {
        let mut attempt = AttemptText::of(v);
        attempt.source = cut_middle(v.source.trim_end(), MAX_INSPIRATION_CHARS);
        Self {
            attempt,
            why: why.to_string(),
        }
    }
}

/// Keeps the first `max` characters and marks the cut with how many were left out.
pub fn cut_marked(s: &str, max: usize) -> String {
    crate::world_model::cut(s, max)
}

/// Longest failure reason on one line of a cycle's attempt list.
const HISTORY_REASON_CHARS: usize = 240;

/// Most attempts a prompt lists of one cycle (a cycle without a cap, `--cycle-cap 0`, can run
/// long): the first, the cycle's best and the latest are kept, one line says how many were
/// left out between them.
pub const HISTORY_MAX: usize = 12;

/// The attempts of a cycle as prompts list them, one entry each (continuation lines indented):
/// status, score and time, the note, then the per-workload times or the failure reason. An
/// attempt that repeated an earlier source is named as that attempt's duplicate. Past
/// [`HISTORY_MAX`] attempts, the first, the best and the latest stay.
pub fn history_lines(history: &[CycleAttempt]) -> Vec<String> {
    let samples = history.iter().any(|h| h.sample > 0);
    let name = |attempt: u32, sample: u32| {
        if samples {
            format!("attempt {attempt}.{}", sample + 1)
        } else {
            format!("attempt {attempt}")
        }
    };
    let best = history
        .iter()
        .filter(|h| h.outcome.passed && h.duplicate_of.is_none())
        .filter_map(|h| h.outcome.score.map(|s| (h.attempt, h.sample, s)))
        .max_by(|a, b| a.2.total_cmp(&b.2))
        .map(|(a, s, _)| (a, s));
    let keep = |i: usize, h: &CycleAttempt| {
        history.len() <= HISTORY_MAX
            || i == 0
            || i + (HISTORY_MAX - 2) >= history.len()
            || best == Some((h.attempt, h.sample))
    };
    let mut lines = Vec::new();
    let mut left_out = 0;
    for (i, h) in history.iter().enumerate() {
        if !keep(i, h) {
            left_out += 1;
            continue;
        }
        if left_out > 0 {
            lines.push(format!("… {left_out} more attempts, left out here"));
            left_out = 0;
        }
        lines.push(history_line(h, &name, best));
    }
    lines
}

/// One attempt of [`history_lines`].
fn history_line(
    h: &CycleAttempt,
    name: &dyn Fn(u32, u32) -> String,
    best: Option<(u32, u32)>,
) -> String {
    let o = &h.outcome;
    let me = name(h.attempt, h.sample);
    if let Some((a, s)) = h.duplicate_of {
        return format!(
            "{me} was identical to {}; it was not re-evaluated.",
            name(a, s)
        );
    }
    let mut line = me;
    if h.candidate_id.is_none() {
        line.push_str(": no code came out of the reply");
    } else {
        line.push_str(&format!(
            ": {}",
            if o.status.is_empty() {
                "not evaluated"
            } else {
                &o.status
            }
        ));
    }
    if let Some(sc) = o.score.filter(|_| o.passed) {
        line.push_str(&format!(", score {sc:.3}"));
    }
    if let Some(l) = o.latency_ms.filter(|_| o.passed) {
        line.push_str(&format!(", {l:.4} ms"));
    }
    if best == Some((h.attempt, h.sample)) {
        line.push_str(" (the cycle's best)");
    }
    let note = h.note.trim();
    if !note.is_empty() {
        line.push_str(&format!(" — {note}"));
    }
    if let Some(c) = h.reused_from {
        line.push_str(&format!(
            "\n  identical to candidate {c} of an earlier cycle: its result was reused, not measured again"
        ));
    }
    if o.passed {
        if !o.workloads.is_empty() {
            line.push_str(&format!("\n  {}", o.workloads.join("; ")));
        }
    } else {
        let reason = o
            .message
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("(no reason recorded)");
        line.push_str(&format!(
            "\n  why: {}",
            cut_marked(reason, HISTORY_REASON_CHARS)
        ));
    }
    line
}

pub(crate) fn cut_middle(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    let head: String = s.chars().take(max / 2).collect();
    let tail: String = s.chars().skip(n - max / 2).collect();
    format!(
        "{head}\n… [{} characters left out] …\n{tail}",
        n - 2 * (max / 2)
    )
}

pub fn keep_end(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    let tail: String = s.chars().skip(n - max).collect();
    format!("… {tail}")
}

/// Everything one template may use. Fields a role does not need stay empty.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PromptContext {
    #[serde(flatten)]
    pub inputs: PromptInputs,
    /// Compact JSON of the world model (edit prompts always; code prompts from level `spec`).
    pub world_model: Option<String>,
    /// The whole plan, one line per node (edit prompts; [`WorldModel::outline`]).
    pub tree: Option<String>,
    /// Every attempt of the current cycle, one entry each ([`history_lines`]).
    pub history: Vec<String>,
    pub action: Option<ActionView>,
    /// The parent's solution (code prompts), or the cycle's base (refine).
    pub base: Option<AttemptText>,
    /// The attempt being debugged, or the last attempt of a cycle.
    pub current: Option<AttemptText>,
    /// The best passing attempt of the cycle.
    pub best: Option<AttemptText>,
    /// Why earlier replies or edits were rejected.
    pub feedback: Vec<String>,
    /// Extra demands of this call (propose's continuation rule, …).
    pub requirements: Vec<String>,
    pub round: u32,
    pub attempt: u32,
    /// Sample index when several candidates are drawn for one attempt.
    pub sample: u32,
    /// Evolve prompts: `diff`, `full` or `crossover`.
    pub mutation: Option<String>,
    /// Evolve prompts: the island the child is for.
    pub island: u32,
    /// Evolve prompts: the kernel the child is written from.
    pub parent: Option<AttemptText>,
    /// Evolve prompts: the second parent of a crossover.
    pub mate: Option<AttemptText>,
    /// Evolve prompts: other programs of the population, for ideas.
    pub inspirations: Vec<InspirationText>,
}

impl PromptContext {
    pub fn new(inputs: &PromptInputs) -> Self {
        Self {
            inputs: inputs.clone(),
            ..Self::default()
        }
    }
}

/// A dtype's tolerance as proposers read it: what an element may be off by, and how many
/// elements must pass.
fn describe_tolerance(t: &ksearch_task::Tolerance) -> String {
    let rule = match t.rule {
        ksearch_task::ToleranceRule::Scaled => {
            format!("rtol {:e}, atol {:e} x max|reference|", t.rtol, t.atol)
        }
        ksearch_task::ToleranceRule::Either => format!(
            "an element fails only if its absolute error exceeds {:e} and its relative error exceeds {:e}",
            t.atol, t.rtol
        ),
    };
    if t.matched_ratio < 1.0 {
        format!(
            "{rule}; at least {}% of elements must pass",
            t.matched_ratio * 100.0
        )
    } else {
        rule
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_cycle_lists_its_first_best_and_latest_attempts() {
        let attempt = |n: u32, score: f64| CycleAttempt {
            attempt: n,
            sample: 0,
            candidate_id: Some(i64::from(n)),
            note: format!("try {n}"),
            outcome: OutcomeSummary {
                status: "passed".into(),
                passed: true,
                score: Some(score),
                ..OutcomeSummary::default()
            },
            duplicate_of: None,
            reused_from: None,
        };
        let short: Vec<CycleAttempt> = (1..=HISTORY_MAX as u32).map(|n| attempt(n, 1.0)).collect();
        assert_eq!(
            history_lines(&short).len(),
            HISTORY_MAX,
            "a short cycle is listed whole"
        );
        // 30 attempts, the best the fifth: the first, the fifth and the last ten stay.
        let long: Vec<CycleAttempt> = (1..=30)
            .map(|n| attempt(n, if n == 5 { 9.0 } else { 1.0 }))
            .collect();
        let lines = history_lines(&long);
        let listed: Vec<&str> = lines
            .iter()
            .map(|l| l.split(':').next().unwrap_or(""))
            .collect();
        let mut want = vec![
            "attempt 1".to_string(),
            "… 3 more attempts, left out here".into(),
            "attempt 5".into(),
            "… 15 more attempts, left out here".into(),
        ];
        want.extend((21..=30).map(|n| format!("attempt {n}")));
        assert_eq!(listed, want);
        assert!(lines[2].contains("(the cycle's best)"));
    }

    #[test]
    fn tolerances_read_as_their_rule_says() {
        let scaled = ksearch_task::Tolerance::scaled(2e-5, 1e-5);
        assert_eq!(
            describe_tolerance(&scaled),
            "rtol 2e-5, atol 1e-5 x max|reference|"
        );
        let either = ksearch_task::Tolerance {
            rule: ksearch_task::ToleranceRule::Either,
            matched_ratio: 0.95,
            ..ksearch_task::Tolerance::scaled(1e-2, 1e-2)
        };
        let text = describe_tolerance(&either);
        assert!(text.starts_with("an element fails only if its absolute error exceeds 1e-2"));
        assert!(
            text.ends_with("at least 95% of elements must pass"),
            "{text}"
        );
    }

    #[test]
    fn the_spec_says_what_kernels_of_the_backend_may_assume() {
        let task = ksearch_task::resolve("attention").unwrap();
        let cuda = task_spec_text(&task, "cuda");
        assert!(
            cuda.contains("- D: head dimension (kernels may assume: one of 64, 128)\n"),
            "{cuda}"
        );
        let cpu = task_spec_text(&task, "cpu");
        assert!(cpu.contains("- D: head dimension\n"), "{cpu}");
        // Held-out workloads stay out of the prompt.
        assert!(
            !cuda.contains("hot") && !cpu.contains("b2h3l131d13"),
            "{cpu}"
        );
    }

    #[test]
    fn context_levels_parse_and_print() {
        for name in ContextLevel::NAMES {
            let level: ContextLevel = name.parse().unwrap();
            assert_eq!(level.to_string(), name);
            assert_eq!(
                serde_json::to_value(level).unwrap(),
                serde_json::Value::String(name.into())
            );
        }
        assert!("most"
            .parse::<ContextLevel>()
            .unwrap_err()
            .contains("none, spec, full"));
        assert!(!ContextLevel::None.has_spec());
        assert!(ContextLevel::Spec.has_spec() && !ContextLevel::Spec.has_knowledge());
        assert!(ContextLevel::Full.has_knowledge());
    }

    #[test]
    fn long_texts_are_cut_visibly() {
        let s = "a".repeat(50) + &"b".repeat(50);
        let c = cut_middle(&s, 20);
        assert!(
            c.starts_with("aaaaaaaaaa\n") && c.ends_with("\nbbbbbbbbbb"),
            "{c}"
        );
        assert!(c.contains("80 characters left out"));
        assert_eq!(cut_middle("short", 20), "short");
        assert_eq!(keep_end("0123456789", 4), "… 6789");
    }

    #[test]
    fn tidy_collapses_blank_runs() {
        assert_eq!(tidy("\n\na  \n\n\n\nb\n\n"), "a\n\nb\n");
    }
}
