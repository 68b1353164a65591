//! Knowledge packs (`knowledge/packs/`): the translation layer between what a proposer knows
//! (mostly CUDA) and the target a task is written for.
//!
//! - `targets.toml`: code targets (`cpu`, `cuda`, `metal`, `mlx-metal`, `mlx-cuda`), the backend
//!   each serves, its default hardware profile and the code-format rules a prompt states.
//! - `concepts/*.toml`: concept maps, CUDA construct → target construct, with the CUDA
//!   identifiers that do not exist on the target (lint errors).
//! - `patterns/*.toml`: short verified code patterns per target and task kind.
//! - `assertions/*.toml`: properties a kernel must keep, each checked by extra acceptance
//!   workloads (adversarial inputs the harness runs) or by lint rules.
//! - `lint/*.toml`: the static checks of [`crate::lint`].
//!
//! [`Packs::context`] selects what a prompt receives for one target and task kind.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use ksearch_task::{CustomWorkload, Distribution, ParamValue, ResolvedWorkload, Task};

use crate::error::KnowledgeError;
use crate::files::{header_lines, parse_toml, read_text, read_toml, toml_files};
use crate::hardware::HardwareProfile;
use crate::is_identifier;
use crate::lint::{LintRule, LintTarget, Severity};

/// A code target: the language a candidate is written in and where it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    pub name: String,
    pub title: String,
    /// Task backends this target writes code for (`cpu`, `cuda`, `mlx`).
    #[serde(default)]
    pub backends: Vec<String>,
    /// `macos` or `linux` when the backend means different targets per platform (`mlx`).
    #[serde(default)]
    pub os: Option<String>,
    /// Source language of candidates (`c`, `cuda`, `metal`, `python`).
    pub language: String,
    /// Tags of a fenced code block that hold code for this target, preferred first.
    pub fence_tags: Vec<String>,
    /// Name of the hardware profile used when the device is not known.
    pub hardware: String,
    /// The output rules a code prompt states for this target.
    pub code_format: String,
}

/// What `ksearch knowledge list --json` prints: the targets and the hardware profiles in brief.
#[derive(Debug, Serialize)]
pub struct Listing<'a> {
    pub targets: &'a [Target],
    pub hardware: Vec<HardwareBrief<'a>>,
}

/// A hardware profile's name, title, memory bandwidth and peaks.
#[derive(Debug, Serialize)]
pub struct HardwareBrief<'a> {
    pub name: &'a str,
    pub title: &'a str,
    pub bandwidth_gbs: f64,
    pub peak_tflops: &'a BTreeMap<String, f64>,
}

/// One CUDA construct and its equivalent on the target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Concept {
    pub topic: String,
    pub cuda: String,
    /// What the construct becomes on the target.
    pub target: String,
    #[serde(default)]
    pub note: String,
    /// CUDA identifiers that do not exist on the target; the lint reports them.
    #[serde(default)]
    pub forbid: Vec<String>,
    #[serde(default)]
    pub severity: Severity,
    pub source: String,
    /// Overrides the map's `targets` for this entry.
    #[serde(default)]
    pub targets: Option<Vec<String>>,
}

/// A concept map file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConceptMap {
    pub title: String,
    pub targets: Vec<String>,
    #[serde(default, rename = "concept")]
    pub concepts: Vec<Concept>,
}

impl ConceptMap {
    /// The entries that apply to `target`.
    pub fn for_target<'a>(&'a self, target: &'a str) -> impl Iterator<Item = &'a Concept> + 'a {
        self.concepts.iter().filter(move |c| {
            c.targets
                .as_ref()
                .unwrap_or(&self.targets)
                .iter()
                .any(|t| t == target)
        })
    }
}

/// A short code pattern.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pattern {
    pub id: String,
    pub title: String,
    pub targets: Vec<String>,
    /// Task kinds it applies to; empty means every kind.
    #[serde(default)]
    pub kinds: Vec<String>,
    pub summary: String,
    pub code: String,
    pub source: Vec<String>,
}

/// An adversarial workload that checks an assertion: extra acceptance workload of a task kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssertionWorkload {
    /// The task kind whose axes `params` binds.
    pub kind: String,
    pub name: String,
    pub params: BTreeMap<String, ParamValue>,
    /// Input distributions that replace the task's for this workload.
    #[serde(default)]
    pub dist: BTreeMap<String, Distribution>,
    /// Backends the workload applies to; absent means every backend whose entry point the
    /// parameters can fill.
    #[serde(default)]
    pub backends: Option<Vec<String>>,
}

/// A property a kernel must keep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assertion {
    pub id: String,
    pub title: String,
    /// Task kinds it applies to; empty means every kind.
    #[serde(default)]
    pub kinds: Vec<String>,
    pub property: String,
    pub source: Vec<String>,
    #[serde(default, rename = "workload")]
    pub workloads: Vec<AssertionWorkload>,
    /// Lint rules that check it statically.
    #[serde(default)]
    pub lint: Vec<String>,
}

impl Assertion {
    pub fn applies_to(&self, kind: &str) -> bool {
        self.kinds.is_empty() || self.kinds.iter().any(|k| k == kind)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetsFile {
    #[serde(default)]
    target: Vec<Target>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PatternsFile {
    #[serde(default)]
    pattern: Vec<Pattern>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AssertionsFile {
    #[serde(default)]
    assertion: Vec<Assertion>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    #[serde(default)]
    rule: Vec<LintRule>,
}

/// Everything under `knowledge/packs/`, plus the hardware profiles of `knowledge/hardware/`.
#[derive(Debug, Clone)]
pub struct Packs {
    dir: PathBuf,
    targets: Vec<Target>,
    concept_maps: Vec<ConceptMap>,
    patterns: Vec<Pattern>,
    assertions: Vec<Assertion>,
    rules: Vec<LintRule>,
    hardware: Vec<HardwareProfile>,
}

/// What a prompt receives about one target and task kind (the `full` context level).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KnowledgeContext {
    pub target: Target,
    pub kind: String,
    pub hardware: Option<HardwareProfile>,
    /// The hardware profile as lines of text (with derived numbers such as the ridge point).
    pub hardware_lines: Vec<String>,
    pub concepts: Vec<ConceptEntry>,
    pub patterns: Vec<Pattern>,
    pub assertions: Vec<Assertion>,
}

/// A concept with the title of its map.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConceptEntry {
    pub map: String,
    #[serde(flatten)]
    pub concept: Concept,
}

/// Extra acceptance workloads for a task, and why some assertion workloads were left out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AcceptanceWorkloads {
    pub workloads: Vec<ResolvedWorkload>,
    pub skipped: Vec<String>,
}

/// Where a task keeps notes of its own for prompts (code patterns), relative to its directory:
/// merged over the packs by [`Packs::with_task`].
pub const TASK_PATTERNS_DIR: &str = "knowledge/patterns";

/// Prefix of the names of workloads that come from assertions.
pub const ASSERTION_WORKLOAD_PREFIX: &str = "assert-";

impl Packs {
    /// Loads `dir/packs/**` and `dir/hardware/*.toml` (`dir` is a `knowledge/` directory) and
    /// checks every cross-reference: targets name known hardware, concepts and patterns name
    /// known targets, assertions name known lint rules, every fact cites a source.
    pub fn load(dir: &Path) -> Result<Packs, KnowledgeError> {
        let packs_dir = dir.join("packs");
        let hardware = HardwareProfile::load_all(&dir.join("hardware"))?;

        let targets_path = packs_dir.join("targets.toml");
        let targets: Vec<Target> = if targets_path.is_file() {
            read_toml::<TargetsFile>(&targets_path)?.target
        } else {
            Vec::new()
        };
        let mut names = BTreeSet::new();
        for (i, t) in targets.iter().enumerate() {
            let bad = |field: &str, m: String| {
                KnowledgeError::invalid(&targets_path, format!("target[{i}].{field}"), m)
            };
            if !names.insert(t.name.as_str()) {
                return Err(bad("name", format!("{:?} is defined twice", t.name)));
            }
            if HardwareProfile::find(&hardware, &t.hardware).is_none() {
                return Err(bad(
                    "hardware",
                    format!("no hardware profile {:?} in knowledge/hardware", t.hardware),
                ));
            }
            if t.fence_tags.is_empty() {
                return Err(bad("fence_tags", "list at least one tag".into()));
            }
            if let Some(os) = &t.os {
                if os != "macos" && os != "linux" {
                    return Err(bad("os", format!("{os:?} is not `macos` or `linux`")));
                }
            }
        }
        let known_target = |t: &str| names.contains(t);

        let mut concept_maps = Vec::new();
        for path in toml_files(&packs_dir.join("concepts"))? {
            let map: ConceptMap = read_toml(&path)?;
            for t in &map.targets {
                if !known_target(t) {
                    return Err(KnowledgeError::invalid(
                        &path,
                        "targets",
                        format!("unknown target {t:?}"),
                    ));
                }
            }
            for (i, c) in map.concepts.iter().enumerate() {
                let bad = |field: &str, m: String| {
                    KnowledgeError::invalid(&path, format!("concept[{i}].{field}"), m)
                };
                if c.source.trim().is_empty() {
                    return Err(bad("source", "cite a source".into()));
                }
                for t in c.targets.iter().flatten() {
                    if !known_target(t) {
                        return Err(bad("targets", format!("unknown target {t:?}")));
                    }
                }
                if let Some(id) = c.forbid.iter().find(|f| !is_identifier(f)) {
                    return Err(bad("forbid", format!("{id:?} is not an identifier")));
                }
            }
            concept_maps.push(map);
        }

        let mut patterns: Vec<Pattern> = Vec::new();
        for path in toml_files(&packs_dir.join("patterns"))? {
            for (i, p) in read_toml::<PatternsFile>(&path)?
                .pattern
                .into_iter()
                .enumerate()
            {
                let bad = |field: &str, m: String| {
                    KnowledgeError::invalid(&path, format!("pattern[{i}].{field}"), m)
                };
                if patterns.iter().any(|q| q.id == p.id) {
                    return Err(bad("id", format!("{:?} is defined twice", p.id)));
                }
                if let Some(t) = p.targets.iter().find(|t| !known_target(t)) {
                    return Err(bad("targets", format!("unknown target {t:?}")));
                }
                if p.source.iter().all(|s| s.trim().is_empty()) {
                    return Err(bad("source", "cite at least one source".into()));
                }
                patterns.push(p);
            }
        }

        let mut rules: Vec<LintRule> = Vec::new();
        for path in toml_files(&packs_dir.join("lint"))? {
            for (i, r) in read_toml::<RulesFile>(&path)?.rule.into_iter().enumerate() {
                let field = format!("rule[{i}]");
                if rules.iter().any(|q| q.id == r.id) {
                    return Err(KnowledgeError::invalid(
                        &path,
                        format!("{field}.id"),
                        format!("{:?} is defined twice", r.id),
                    ));
                }
                if let Some(t) = r.targets.iter().find(|t| !known_target(t)) {
                    return Err(KnowledgeError::invalid(
                        &path,
                        format!("{field}.targets"),
                        format!("unknown target {t:?}"),
                    ));
                }
                r.validate()
                    .map_err(|(f, m)| KnowledgeError::invalid(&path, format!("{field}.{f}"), m))?;
                rules.push(r);
            }
        }

        let mut assertions: Vec<Assertion> = Vec::new();
        for path in toml_files(&packs_dir.join("assertions"))? {
            for (i, a) in read_toml::<AssertionsFile>(&path)?
                .assertion
                .into_iter()
                .enumerate()
            {
                let bad = |field: &str, m: String| {
                    KnowledgeError::invalid(&path, format!("assertion[{i}].{field}"), m)
                };
                if assertions.iter().any(|q| q.id == a.id) {
                    return Err(bad("id", format!("{:?} is defined twice", a.id)));
                }
                if a.source.iter().all(|s| s.trim().is_empty()) {
                    return Err(bad("source", "cite at least one source".into()));
                }
                if a.workloads.is_empty() && a.lint.is_empty() {
                    return Err(bad(
                        "workload",
                        "an assertion needs a check: workloads the harness runs or lint rules"
                            .into(),
                    ));
                }
                if let Some(l) = a.lint.iter().find(|l| !rules.iter().any(|r| &r.id == *l)) {
                    return Err(bad("lint", format!("unknown lint rule {l:?}")));
                }
                let mut seen = BTreeSet::new();
                for w in &a.workloads {
                    if !seen.insert((w.kind.as_str(), w.name.as_str())) {
                        return Err(bad(
                            "workload",
                            format!("{:?} is defined twice for kind {:?}", w.name, w.kind),
                        ));
                    }
                    if !a.applies_to(&w.kind) {
                        return Err(bad(
                            "workload",
                            format!(
                                "{:?} is for kind {:?}, which `kinds` leaves out",
                                w.name, w.kind
                            ),
                        ));
                    }
                }
                assertions.push(a);
            }
        }

        Ok(Packs {
            dir: dir.to_path_buf(),
            targets,
            concept_maps,
            patterns,
            assertions,
            rules,
            hardware,
        })
    }

    /// These packs with the patterns of the task in `task_dir` (`task_dir/knowledge/patterns/
    /// *.toml`, the packs' format) merged in: the task's notes on writing its kernel, which
    /// prompts at `--context full` carry. A task pattern whose id a built-in one has replaces it
    /// (the task wins); each is checked as the shipped ones are, and errors name the file and
    /// the line of its `[[pattern]]` table. A task without the directory changes nothing.
    pub fn with_task(mut self, task_dir: &Path) -> Result<Packs, KnowledgeError> {
        let mut seen = BTreeSet::new();
        for path in toml_files(&task_dir.join(TASK_PATTERNS_DIR))? {
            let text = read_text(&path)?;
            let lines = header_lines(&text, "[[pattern]]");
            let file: PatternsFile = parse_toml(&path, &text)?;
            for (i, p) in file.pattern.into_iter().enumerate() {
                let bad = |field: &str, message: String| match lines.get(i) {
                    Some(&line) => KnowledgeError::InvalidAt {
                        path: path.clone(),
                        line,
                        field: format!("pattern[{i}].{field}"),
                        message,
                    },
                    None => {
                        KnowledgeError::invalid(&path, format!("pattern[{i}].{field}"), message)
                    }
                };
                if !seen.insert(p.id.clone()) {
                    return Err(bad(
                        "id",
                        format!("{:?} is defined twice in the task", p.id),
                    ));
                }
                if let Some(t) = p.targets.iter().find(|t| self.target(t).is_none()) {
                    let known: Vec<&str> = self.targets.iter().map(|t| t.name.as_str()).collect();
                    return Err(bad(
                        "targets",
                        format!("unknown target {t:?} (targets: {})", known.join(", ")),
                    ));
                }
                if p.source.iter().all(|s| s.trim().is_empty()) {
                    return Err(bad("source", "cite at least one source".into()));
                }
                match self.patterns.iter().position(|q| q.id == p.id) {
                    Some(j) => self.patterns[j] = p,
                    None => self.patterns.push(p),
                }
            }
        }
        Ok(self)
    }

    /// The packs shipped with ksearch (see `ksearch_assets::locate`).
    pub fn builtin() -> Result<Packs, KnowledgeError> {
        let dir = ksearch_assets::locate(ksearch_assets::Tree::Knowledge)?;
        Packs::load(&dir)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    pub fn target(&self, name: &str) -> Option<&Target> {
        self.targets.iter().find(|t| t.name == name)
    }

    pub fn concept_maps(&self) -> &[ConceptMap] {
        &self.concept_maps
    }

    pub fn patterns(&self) -> &[Pattern] {
        &self.patterns
    }

    pub fn assertions(&self) -> &[Assertion] {
        &self.assertions
    }

    pub fn rules(&self) -> &[LintRule] {
        &self.rules
    }

    pub fn hardware(&self) -> &[HardwareProfile] {
        &self.hardware
    }

    /// The target that writes code for a task backend on the platform this binary runs on
    /// (`mlx` means `mlx-metal` on macOS and `mlx-cuda` elsewhere).
    pub fn target_for_backend(&self, backend: &str) -> Option<&Target> {
        let os = if cfg!(target_os = "macos") {
            "macos"
        } else {
            "linux"
        };
        let all: Vec<&Target> = self
            .targets
            .iter()
            .filter(|t| t.backends.iter().any(|b| b == backend))
            .collect();
        all.iter()
            .find(|t| t.os.as_deref() == Some(os))
            .or_else(|| all.iter().find(|t| t.os.is_none()))
            .or_else(|| all.first())
            .copied()
    }

    /// Concepts of every map that apply to `target`, in file order.
    pub fn concepts_for(&self, target: &str) -> Vec<ConceptEntry> {
        self.concept_maps
            .iter()
            .flat_map(|m| {
                m.for_target(target).map(|c| ConceptEntry {
                    map: m.title.clone(),
                    concept: c.clone(),
                })
            })
            .collect()
    }

    /// Patterns for `target` that apply to task kind `kind` (`None`: every kind).
    pub fn patterns_for(&self, target: &str, kind: Option<&str>) -> Vec<&Pattern> {
        self.patterns
            .iter()
            .filter(|p| p.targets.iter().any(|t| t == target))
            .filter(|p| match kind {
                None => true,
                Some(k) => p.kinds.is_empty() || p.kinds.iter().any(|x| x == k),
            })
            .collect()
    }

    /// Assertions that apply to task kind `kind` (`None`: all) and, when checked only by lint
    /// rules, have a rule for `target`.
    pub fn assertions_for(&self, target: &str, kind: Option<&str>) -> Vec<&Assertion> {
        self.assertions
            .iter()
            .filter(|a| kind.is_none_or(|k| a.applies_to(k)))
            .filter(|a| {
                let runnable = kind.is_none_or(|k| a.workloads.iter().any(|w| w.kind == k));
                let linted = a.lint.iter().any(|l| {
                    self.rules
                        .iter()
                        .any(|r| &r.id == l && r.targets.iter().any(|t| t == target))
                });
                runnable || linted
            })
            .collect()
    }

    /// Everything a `full`-context prompt receives for `target` and task kind `kind`.
    /// `hardware` overrides the target's default profile (by name or alias).
    pub fn context(
        &self,
        target: &str,
        kind: Option<&str>,
        hardware: Option<&str>,
    ) -> Result<KnowledgeContext, KnowledgeError> {
        let t = self.target(target).ok_or_else(|| {
            KnowledgeError::invalid(
                self.dir.join("packs/targets.toml"),
                "target",
                format!(
                    "no target {target:?} (targets: {})",
                    self.targets
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })?;
        let hw_name = hardware.unwrap_or(&t.hardware);
        let hw = HardwareProfile::find(&self.hardware, hw_name).cloned();
        if hw.is_none() && hardware.is_some() {
            return Err(KnowledgeError::invalid(
                self.dir.join("hardware"),
                "name",
                format!(
                    "no hardware profile {hw_name:?} (profiles: {})",
                    self.hardware
                        .iter()
                        .map(|p| p.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        Ok(KnowledgeContext {
            target: t.clone(),
            kind: kind.unwrap_or("").to_string(),
            hardware_lines: hw.as_ref().map(hardware_lines).unwrap_or_default(),
            hardware: hw,
            concepts: self.concepts_for(target),
            patterns: self
                .patterns_for(target, kind)
                .into_iter()
                .cloned()
                .collect(),
            assertions: self
                .assertions_for(target, kind)
                .into_iter()
                .cloned()
                .collect(),
        })
    }

    /// The name of the target that writes code for `backend` ([`Packs::target_for_backend`]).
    pub fn target_name_for_backend(&self, backend: &str) -> Result<String, KnowledgeError> {
        self.target_for_backend(backend)
            .map(|t| t.name.clone())
            .ok_or_else(|| KnowledgeError::NoTargetForBackend(backend.to_string()))
    }

    /// [`Packs::lint_target`] of a target the user named: an unknown name is an error that
    /// lists the targets.
    pub fn lint_target_named(&self, target: &str) -> Result<LintTarget, KnowledgeError> {
        self.lint_target(target)
            .ok_or_else(|| KnowledgeError::UnknownTarget {
                name: target.to_string(),
                known: self
                    .targets
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// The targets and hardware profiles, as `ksearch knowledge list` prints them.
    pub fn render_list(&self) -> String {
        let mut out = String::from("targets:\n");
        for t in &self.targets {
            let backends = match t.backends.is_empty() {
                true => "-".to_string(),
                false => t.backends.join(", "),
            };
            out.push_str(&format!(
                "  {:<10} {} (backends: {backends}; default device {})\n",
                t.name, t.title, t.hardware
            ));
        }
        out.push_str("hardware profiles:\n");
        for h in &self.hardware {
            let f32_peak = h.peak_tflops.get("f32").map(|v| v.to_string());
            out.push_str(&format!(
                "  {:<16} {} — {} GB/s, f32 {} TFLOP/s\n",
                h.name,
                h.title,
                h.memory.bandwidth_gbs,
                f32_peak.as_deref().unwrap_or("-")
            ));
        }
        out
    }

    /// The targets and, in brief, the hardware profiles (`ksearch knowledge list --json`).
    pub fn listing(&self) -> Listing<'_> {
        Listing {
            targets: &self.targets,
            hardware: self
                .hardware
                .iter()
                .map(|h| HardwareBrief {
                    name: &h.name,
                    title: &h.title,
                    bandwidth_gbs: h.memory.bandwidth_gbs,
                    peak_tflops: &h.peak_tflops,
                })
                .collect(),
        }
    }

    /// The lint rules of `target`, with the forbidden identifiers of its concept maps resolved.
    pub fn lint_target(&self, target: &str) -> Option<LintTarget> {
        let t = self.target(target)?;
        let concepts = self.concepts_for(target);
        let rules = self
            .rules
            .iter()
            .filter(|r| r.targets.iter().any(|x| x == target))
            .cloned()
            .collect();
        let forbids = concepts.iter().flat_map(|c| {
            c.concept
                .forbid
                .iter()
                .map(|ident| (ident.clone(), c.concept.target.clone(), c.concept.severity))
        });
        Some(LintTarget::new(&t.name, &t.language, rules, forbids))
    }

    /// The assertion workloads for `task`'s kind on `backend`, checked and resolved by
    /// [`Task::resolve_workload`], with every check of the task's own workloads. They are held
    /// out (acceptance only). A workload that does not fit this task is skipped with the
    /// reason.
    pub fn acceptance_workloads(&self, task: &Task, backend: &str) -> AcceptanceWorkloads {
        let mut out = AcceptanceWorkloads::default();
        for a in &self.assertions {
            for w in a.workloads.iter().filter(|w| w.kind == task.kind()) {
                if w.backends
                    .as_ref()
                    .is_some_and(|b| !b.iter().any(|x| x == backend))
                {
                    continue;
                }
                let custom = CustomWorkload {
                    name: format!("{ASSERTION_WORKLOAD_PREFIX}{}-{}", a.id, w.name),
                    params: w.params.clone(),
                    held_out: true,
                    dist: w.dist.clone(),
                };
                match task.resolve_workload(backend, &custom) {
                    Ok(r) => out.workloads.push(r),
                    Err(why) => out
                        .skipped
                        .push(format!("assertion {} workload {}: {why}", a.id, w.name)),
                }
            }
        }
        out
    }
}

/// The hardware profile as prompt lines, with the derived ridge points.
pub fn hardware_lines(p: &HardwareProfile) -> Vec<String> {
    let mut out = vec![format!(
        "{} ({}): {} GB/s memory bandwidth{}",
        p.title,
        match p.kind {
            crate::hardware::DeviceKind::Cpu => "cpu",
            crate::hardware::DeviceKind::Gpu => "gpu",
        },
        trim_num(p.memory.bandwidth_gbs),
        p.memory
            .capacity_gib
            .map(|c| format!(", {} GiB", trim_num(c)))
            .unwrap_or_default()
    )];
    let peaks: Vec<String> = p
        .peak_tflops
        .iter()
        .map(|(d, v)| format!("{d} {}", trim_num(*v)))
        .collect();
    out.push(format!("peak TFLOP/s (dense): {}", peaks.join(", ")));
    if let Some(ridge) = p.ridge_point("f32") {
        out.push(format!(
            "f32 ridge point: {:.1} FLOP/byte (below it a kernel is memory bound)",
            ridge
        ));
    }
    let par = &p.parallelism;
    let mut units = format!(
        "{} compute units, SIMD/warp width {}",
        par.compute_units, par.simd_width
    );
    if let Some(t) = par.max_threads_per_block {
        units.push_str(&format!(", at most {t} threads per block/threadgroup"));
    }
    out.push(units);
    let oc = &p.on_chip;
    let mut chip = Vec::new();
    if let Some(v) = oc.shared_memory_per_block_kib {
        chip.push(format!(
            "{} KB shared/threadgroup memory per block",
            trim_num(v)
        ));
    }
    if let Some(v) = oc.registers_per_unit {
        chip.push(format!("{v} 32-bit registers per SM"));
    }
    if let Some(v) = oc.max_registers_per_thread {
        chip.push(format!("at most {v} registers per thread"));
    }
    if let Some(v) = oc.vector_registers {
        chip.push(format!("{v} vector registers"));
    }
    if let Some(v) = oc.l1_kib {
        chip.push(format!("L1 {} KB", trim_num(v)));
    }
    if let Some(v) = oc.l2_kib {
        chip.push(format!("L2 {} KB", trim_num(v)));
    }
    if let Some(v) = oc.llc_mib {
        chip.push(format!("last-level cache {} MB", trim_num(v)));
    }
    if !chip.is_empty() {
        out.push(format!("on chip: {}", chip.join(", ")));
    }
    if !p.notes.trim().is_empty() {
        out.push(p.notes.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    out
}

fn trim_num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lint::{lint, Severity};
    use ksearch_task::DType;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    fn builtin() -> Packs {
        Packs::load(&root().join("knowledge")).unwrap_or_else(|e| panic!("{e}"))
    }

    fn task(name: &str) -> Task {
        ksearch_task::load_task(&root().join("tasks").join(name)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A task directory whose `knowledge/patterns/notes.toml` holds `text`.
    fn task_with_patterns(text: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let patterns = dir.path().join(TASK_PATTERNS_DIR);
        std::fs::create_dir_all(&patterns).unwrap();
        std::fs::write(patterns.join("notes.toml"), text).unwrap();
        dir
    }

    fn pattern(id: &str, targets: &str, kinds: &str) -> String {
        format!(
            "\n[[pattern]]\nid = \"{id}\"\ntitle = \"t\"\ntargets = [{targets}]\n\
             kinds = [{kinds}]\nsummary = \"s\"\ncode = \"c\"\nsource = [\"mine\"]\n"
        )
    }

    #[test]
    fn task_patterns_reach_the_prompt_context_and_win_on_a_shared_id() {
        let shipped = builtin();
        let id = shipped.patterns()[0].id.clone();
        let text = format!(
            "{}{}",
            pattern("my-note", "\"cpu\"", "\"mine\""),
            pattern(&id, "\"cpu\"", "")
        );
        let task = task_with_patterns(&text);
        let p = builtin().with_task(task.path()).unwrap();
        assert_eq!(p.patterns().len(), shipped.patterns().len() + 1);
        let ids: Vec<&str> = p
            .patterns_for("cpu", Some("mine"))
            .iter()
            .map(|q| q.id.as_str())
            .collect();
        assert!(ids.contains(&"my-note"), "{ids:?}");
        let replaced = p.patterns().iter().find(|q| q.id == id).unwrap();
        assert_eq!(replaced.source, ["mine"]);
        // No directory: nothing changes.
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            builtin().with_task(empty.path()).unwrap().patterns(),
            shipped.patterns()
        );
    }

    #[test]
    fn task_pattern_errors_name_the_file_and_the_line() {
        let text = format!(
            "# notes\n{}{}",
            pattern("a", "\"cpu\"", ""),
            pattern("b", "\"tpu\"", "")
        );
        let task = task_with_patterns(&text);
        let e = builtin().with_task(task.path()).unwrap_err().to_string();
        assert!(
            e.contains("notes.toml:12:") && e.contains("unknown target \"tpu\""),
            "{e}"
        );
    }

    #[test]
    fn targets_named_by_the_user_and_the_list() {
        let p = builtin();
        assert_eq!(p.target_name_for_backend("cpu").unwrap(), "cpu");
        let err = p.target_name_for_backend("tpu").unwrap_err();
        assert_eq!(
            err.to_string(),
            "no knowledge-pack target serves backend tpu"
        );
        assert!(p.lint_target_named("cuda").is_ok());
        let err = p.lint_target_named("fortran").unwrap_err().to_string();
        assert!(
            err.starts_with("no target `fortran` (targets: cpu, "),
            "{err}"
        );
        let text = p.render_list();
        assert!(text.starts_with("targets:\n  cpu "), "{text}");
        assert!(text.contains("\nhardware profiles:\n  "), "{text}");
        let h200 = text
            .lines()
            .find(|l| l.trim_start().starts_with("h200 "))
            .unwrap();
        assert!(
            h200.contains(" GB/s, f32 ") && h200.ends_with(" TFLOP/s"),
            "{h200}"
        );
        let listing = p.listing();
        assert_eq!(listing.targets.len(), p.targets().len());
        assert_eq!(listing.hardware.len(), p.hardware().len());
    }

    #[test]
    fn builtin_packs_load_and_name_every_required_device() {
        let p = builtin();
        for hw in [
            "h100", "h200", "b200", "a100", "rtx-4090", "m1-max", "m2-ultra", "m3-max", "m4-max",
        ] {
            let profile = HardwareProfile::find(p.hardware(), hw)
                .unwrap_or_else(|| panic!("no hardware profile {hw}"));
            assert!(profile.memory.bandwidth_gbs > 0.0);
            assert!(profile.peak_flops("f32").is_some(), "{hw}: no f32 peak");
            assert!(profile.parallelism.simd_width == 32, "{hw}");
            assert!(
                profile.on_chip.shared_memory_per_block_kib.is_some(),
                "{hw}"
            );
        }
        for t in ["cpu", "cuda", "metal", "mlx-metal", "mlx-cuda"] {
            assert!(p.target(t).is_some(), "no target {t}");
        }
        // Both MLX custom-kernel flavours and raw Metal have a concept map.
        for t in ["metal", "mlx-metal", "mlx-cuda"] {
            assert!(p.concepts_for(t).len() >= 5, "{t}: too few concepts");
        }
        // Every assertion is checked somehow.
        assert!(p
            .assertions()
            .iter()
            .all(|a| !a.workloads.is_empty() || !a.lint.is_empty()));
        assert_eq!(Packs::builtin().unwrap().targets(), p.targets());
    }

    #[test]
    fn metal_context_carries_the_translation_facts() {
        let ctx = builtin().context("metal", Some("softmax"), None).unwrap();
        assert_eq!(
            ctx.hardware.as_ref().map(|h| h.name.as_str()),
            Some("m1-max")
        );
        let shared = ctx
            .concepts
            .iter()
            .find(|c| c.concept.cuda.contains("__shared__"))
            .expect("a __shared__ concept");
        assert!(shared.concept.target.contains("threadgroup"));
        assert!(shared.concept.target.contains("32 KB"));
        let barrier = ctx
            .concepts
            .iter()
            .find(|c| c.concept.forbid.iter().any(|f| f == "__syncthreads"))
            .unwrap();
        assert!(barrier
            .concept
            .target
            .contains("threadgroup_barrier(mem_flags::mem_threadgroup)"));
        let ids: Vec<&str> = ctx.patterns.iter().map(|p| p.id.as_str()).collect();
        assert!(
            ids.contains(&"simd-row-reduce-8x8") && ids.contains(&"exp2-trick"),
            "{ids:?}"
        );
        let assertions: Vec<&str> = ctx.assertions.iter().map(|a| a.id.as_str()).collect();
        assert!(
            assertions.contains(&"online-softmax-rescale"),
            "{assertions:?}"
        );
        assert!(
            assertions.contains(&"threadgroup-memory-limit"),
            "{assertions:?}"
        );
        // A CUDA-only lint assertion has no rule for raw Metal beyond the shared ones.
        assert!(!assertions.contains(&"scan-combine-order"));
        assert!(ctx.hardware_lines.iter().any(|l| l.contains("400 GB/s")));
        assert!(ctx.hardware_lines.iter().any(|l| l.contains("ridge point")));

        let mlx = builtin()
            .context("mlx-cuda", Some("selective-scan"), None)
            .unwrap();
        assert!(mlx
            .concepts
            .iter()
            .any(|c| c.concept.topic == "grid counts threads"));
        assert!(mlx.patterns.iter().any(|p| p.id == "scan-combine-in-order"));
        assert!(!mlx.patterns.iter().any(|p| p.id == "simd-row-reduce-8x8"));
        assert!(mlx.assertions.iter().any(|a| a.id == "scan-combine-order"));
        assert!(mlx.assertions.iter().any(|a| a.id == "mlx-grid-guard"));

        let cpu = builtin().context("cpu", Some("softmax"), None).unwrap();
        assert!(cpu.concepts.is_empty());
        assert!(cpu.patterns.iter().any(|p| p.id == "online-softmax"));
        assert!(builtin().context("tpu", None, None).is_err());
        assert!(builtin()
            .context("metal", None, Some("no-such-gpu"))
            .is_err());
        let h200 = builtin()
            .context("metal", None, Some("NVIDIA H200"))
            .unwrap();
        assert_eq!(h200.hardware.unwrap().name, "h200");
    }

    #[test]
    fn backends_map_to_targets() {
        let p = builtin();
        assert_eq!(p.target_for_backend("cpu").unwrap().name, "cpu");
        assert_eq!(p.target_for_backend("cuda").unwrap().name, "cuda");
        let mlx = p.target_for_backend("mlx").unwrap().name.clone();
        let expected = if cfg!(target_os = "macos") {
            "mlx-metal"
        } else {
            "mlx-cuda"
        };
        assert_eq!(mlx, expected);
        assert!(p.target_for_backend("tpu").is_none());
    }

    #[test]
    fn assertion_workloads_resolve_against_each_task() {
        let p = builtin();
        let softmax = p.acceptance_workloads(&task("softmax"), "cpu");
        assert!(softmax.skipped.is_empty(), "{:?}", softmax.skipped);
        let names: Vec<&str> = softmax.workloads.iter().map(|w| w.name.as_str()).collect();
        assert!(
            names.contains(&"assert-online-softmax-rescale-large-logits"),
            "{names:?}"
        );
        assert!(
            names.contains(&"assert-ragged-tails-prime-tail"),
            "{names:?}"
        );
        let big = softmax
            .workloads
            .iter()
            .find(|w| w.name.ends_with("large-logits"))
            .unwrap();
        assert!(big.held_out);
        assert_eq!(big.inputs[0].shape, vec![7, 3001]);
        assert_eq!(
            big.inputs[0].dist,
            Some(Distribution::Normal {
                mean: 0.0,
                std: 30.0
            })
        );
        assert_eq!(big.outputs[0].shape, vec![7, 3001]);
        assert_eq!(big.flops, 5.0 * 7.0 * 3001.0);
        assert_eq!(big.bytes, 8.0 * 7.0 * 3001.0);
        // The serialised form is what the harness protocol expects of a workload.
        let v = serde_json::to_value(big).unwrap();
        assert_eq!(v["params"]["cols"], 3001);
        assert_eq!(v["inputs"][0]["dist"]["kind"], "normal");

        let scan = p.acceptance_workloads(&task("selective-scan"), "cpu");
        assert!(scan.skipped.is_empty(), "{:?}", scan.skipped);
        let near_one = scan
            .workloads
            .iter()
            .find(|w| w.name == "assert-scan-combine-order-decay-near-one-long")
            .unwrap();
        let delta = near_one.inputs.iter().find(|t| t.name == "delta").unwrap();
        assert_eq!(
            delta.dist,
            Some(Distribution::Normal {
                mean: -9.0,
                std: 0.5
            })
        );
        assert_eq!(delta.shape, vec![1, 8, 4096]);
        // Inputs without an override keep the task's generator.
        let a = near_one.inputs.iter().find(|t| t.name == "A").unwrap();
        assert!(matches!(a.dist, Some(Distribution::Custom { .. })));

        let attention = p.acceptance_workloads(&task("attention"), "cpu");
        assert!(attention.skipped.is_empty(), "{:?}", attention.skipped);
        assert!(!attention.workloads.is_empty());
        // The defaulted dtype axis resolves to f32 on the cpu; GPU backends get f16 ones.
        assert!(attention
            .workloads
            .iter()
            .all(|w| w.inputs[0].dtype == DType::F32));
        let gpu = p.acceptance_workloads(&task("attention"), "cuda");
        assert!(gpu.skipped.is_empty(), "{:?}", gpu.skipped);
        assert!(!gpu.workloads.is_empty());
        assert!(gpu
            .workloads
            .iter()
            .all(|w| w.inputs[0].dtype == DType::F16));
        // No two workloads of a task share a name with each other or with the task's own.
        for t in ["softmax", "attention", "selective-scan"] {
            let task = task(t);
            let mut all: Vec<String> = task
                .workloads("cpu")
                .unwrap()
                .into_iter()
                .map(|w| w.name)
                .collect();
            all.extend(
                p.acceptance_workloads(&task, "cpu")
                    .workloads
                    .into_iter()
                    .map(|w| w.name),
            );
            let n = all.len();
            all.sort();
            all.dedup();
            assert_eq!(all.len(), n, "{t}");
        }
    }

    fn pack_with(files: &[(&str, &str)]) -> Result<Packs, KnowledgeError> {
        let dir = tempfile::tempdir().unwrap();
        let k = dir.path();
        std::fs::create_dir_all(k.join("hardware")).unwrap();
        std::fs::copy(
            root().join("knowledge/hardware/m1-max.toml"),
            k.join("hardware/m1-max.toml"),
        )
        .unwrap();
        std::fs::create_dir_all(k.join("packs")).unwrap();
        std::fs::write(
            k.join("packs/targets.toml"),
            "[[target]]\nname = \"metal\"\ntitle = \"t\"\nlanguage = \"metal\"\n\
             fence_tags = [\"metal\"]\nhardware = \"m1-max\"\ncode_format = \"x\"\n",
        )
        .unwrap();
        for (path, text) in files {
            let p = k.join("packs").join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let r = Packs::load(k);
        drop(dir);
        r
    }

    #[test]
    fn bad_pack_files_are_rejected_with_file_and_field() {
        assert!(pack_with(&[]).is_ok());
        let err = pack_with(&[("concepts/x.toml", "title = \"x\"\ntargets = [\"vulkan\"]\n")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("x.toml") && err.contains("vulkan"), "{err}");
        let err = pack_with(&[(
            "concepts/x.toml",
            "title = \"x\"\ntargets = [\"metal\"]\n[[concept]]\ntopic = \"t\"\ncuda = \"c\"\ntarget = \"m\"\nsource = \"\"\n",
        )])
        .unwrap_err()
        .to_string();
        assert!(err.contains("concept[0].source"), "{err}");
        let err = pack_with(&[(
            "assertions/a.toml",
            "[[assertion]]\nid = \"a\"\ntitle = \"t\"\nproperty = \"p\"\nsource = [\"s\"]\n",
        )])
        .unwrap_err()
        .to_string();
        assert!(err.contains("needs a check"), "{err}");
        let err = pack_with(&[(
            "assertions/a.toml",
            "[[assertion]]\nid = \"a\"\ntitle = \"t\"\nproperty = \"p\"\nsource = [\"s\"]\nlint = [\"nope\"]\n",
        )])
        .unwrap_err()
        .to_string();
        assert!(err.contains("unknown lint rule"), "{err}");
        let err = pack_with(&[(
            "lint/r.toml",
            "[[rule]]\nid = \"r\"\nkind = \"static_memory_limit\"\ntargets = [\"metal\"]\nmessage = \"m\"\nsource = \"s\"\n",
        )])
        .unwrap_err()
        .to_string();
        assert!(err.contains("rule[0].qualifier"), "{err}");
        let err = pack_with(&[(
            "patterns/p.toml",
            "[[pattern]]\nid = \"p\"\ntitle = \"t\"\ntargets = [\"metal\"]\nsummary = \"s\"\ncode = \"c\"\nsource = [\"s\"]\ntypo = 1\n",
        )])
        .unwrap_err()
        .to_string();
        assert!(err.contains("typo"), "{err}");
    }

    #[test]
    fn workloads_that_do_not_fit_the_task_are_skipped_with_a_reason() {
        let p = pack_with(&[
            (
                "lint/r.toml",
                "[[rule]]\nid = \"r\"\nkind = \"concept_forbids\"\ntargets = [\"metal\"]\nmessage = \"m\"\nsource = \"s\"\n",
            ),
            (
                "assertions/a.toml",
                "[[assertion]]\nid = \"a\"\ntitle = \"t\"\nproperty = \"p\"\nsource = [\"s\"]\n\
                 [[assertion.workload]]\nkind = \"softmax\"\nname = \"w\"\nparams = { rows = 2 }\n\
                 [[assertion.workload]]\nkind = \"softmax\"\nname = \"v\"\nparams = { rows = 2, cols = 3 }\n\
                 dist = { nope = { kind = \"normal\", mean = 0.0, std = 1.0 } }\n\
                 [[assertion.workload]]\nkind = \"softmax\"\nname = \"u\"\nparams = { rows = 2, cols = 3 }\n\
                 dist = { x = { kind = \"normal\", mean = 0.0, std = 0.0 } }\n",
            ),
        ])
        .unwrap();
        let out = p.acceptance_workloads(&task("softmax"), "cpu");
        assert!(out.workloads.is_empty());
        assert_eq!(out.skipped.len(), 3);
        assert!(out.skipped[0].contains("`cols`"), "{:?}", out.skipped);
        assert!(out.skipped[1].contains("`nope`"), "{:?}", out.skipped);
        // The task's checks of distributions apply (a normal draw needs a positive std).
        assert!(
            out.skipped[2].contains("dist.x: normal needs a finite mean and a positive std"),
            "{:?}",
            out.skipped
        );
    }

    /// Checks that only task.toml's own workloads had before `Task::resolve_workload` apply to
    /// assertion workloads too: an integer input needs an integer distribution, and a workload
    /// of a backend keeps what its kernels may assume.
    #[test]
    fn assertion_workloads_get_the_task_checks() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        std::fs::write(
            t.join("task.toml"),
            "format = 1\nname = \"gather\"\nkind = \"gather\"\n\
             [axes.n]\nmultiple_of = 4\n[axes.dtype]\ntype = \"str\"\ndefault = \"f32\"\n\
             [[inputs]]\nname = \"x\"\ndtype = \"$dtype\"\nshape = [\"n\"]\n\
             [[outputs]]\nname = \"y\"\ndtype = \"f32\"\nshape = [\"n\"]\n\
             [[workloads]]\nname = \"w\"\nparams = { n = 8 }\n\
             [roofline]\nflops = \"0\"\nbytes = \"8 * n\"\n\
             [backends.cpu]\nentry = \"g\"\nargs = [\"x\", \"y\", \"n\"]\n\
             signature = \"void g(const void* x, float* y, int64_t n)\"\n",
        )
        .unwrap();
        std::fs::write(
            t.join("reference.py"),
            "def reference(inputs, params):\n    pass\n",
        )
        .unwrap();
        let gather = ksearch_task::load_task(t).unwrap_or_else(|e| panic!("{e}"));
        let p = pack_with(&[(
            "assertions/a.toml",
            "[[assertion]]\nid = \"a\"\ntitle = \"t\"\nproperty = \"p\"\nsource = [\"s\"]\n\
             [[assertion.workload]]\nkind = \"gather\"\nname = \"ints\"\nparams = { n = 8, dtype = \"i32\" }\n\
             [[assertion.workload]]\nkind = \"gather\"\nname = \"odd\"\nparams = { n = 7 }\n\
             [[assertion.workload]]\nkind = \"gather\"\nname = \"fine\"\nparams = { n = 12, dtype = \"i32\" }\n\
             dist = { x = { kind = \"rand_int\", low = 0, high = 3 } }\n",
        )])
        .unwrap();
        let out = p.acceptance_workloads(&gather, "cpu");
        assert_eq!(out.skipped.len(), 2, "{:?}", out.skipped);
        assert!(
            out.skipped[0].contains("integer input `x` (i32) needs a `rand_int` or `custom` dist"),
            "{:?}",
            out.skipped
        );
        assert!(
            out.skipped[1].contains("n = 7 breaks what kernels may assume"),
            "{:?}",
            out.skipped
        );
        let names: Vec<&str> = out.workloads.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["assert-a-fine"]);
        assert_eq!(out.workloads[0].inputs[0].dtype, DType::I32);
    }

    #[test]
    fn lint_rejects_cuda_in_metal_with_the_replacement() {
        let p = builtin();
        let metal = p.lint_target("metal").unwrap();
        let src = "#include <metal_stdlib>\nusing namespace metal;\n\
                   // __syncthreads() is CUDA; this comment must not count\n\
                   [[kernel]] void k(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {\n\
                       threadgroup float t[32];\n    t[i % 32] = y[i];\n    __syncthreads();\n    y[i] = t[0];\n}\n";
        let findings = lint(&metal, src);
        let errors: Vec<_> = findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
            .collect();
        assert_eq!(errors.len(), 1, "{findings:?}");
        assert_eq!(errors[0].line, Some(7));
        assert!(
            errors[0].message.contains("threadgroup_barrier"),
            "{}",
            errors[0]
        );
        assert!(lint(
            &metal,
            &src.replace(
                "__syncthreads();",
                "threadgroup_barrier(mem_flags::mem_threadgroup);"
            )
        )
        .iter()
        .all(|f| f.severity != Severity::Error));
    }

    #[test]
    fn lint_counts_threadgroup_memory_against_the_32kb_limit() {
        let metal = builtin().lint_target("metal").unwrap();
        let over = "#define BM 64\nconstexpr int BK = 128;\n[[kernel]] void k(uint i [[thread_position_in_grid]]) {\n\
                    threadgroup float a[BM][BK + 1];\n  threadgroup half b[BM * BK];\n  threadgroup float s;\n}\n";
        let f = lint(&metal, over);
        let err = f
            .iter()
            .find(|f| f.rule == "threadgroup-memory-limit" && f.severity == Severity::Error)
            .unwrap_or_else(|| panic!("{f:?}"));
        // 64*129*4 + 64*128*2 + 4 bytes.
        assert!(
            err.message
                .contains(&(64 * 129 * 4 + 64 * 128 * 2 + 4).to_string()),
            "{err}"
        );
        assert!(err.message.contains("`a`"), "{err}");
        let fits = over.replace("BK = 128", "BK = 16");
        assert!(lint(&metal, &fits)
            .iter()
            .all(|f| f.rule != "threadgroup-memory-limit"));
        // A buffer bound at launch is not static memory; an unknown size is a warning only.
        let param = "[[kernel]] void k(threadgroup float* buf [[threadgroup(0)]], uint i [[thread_position_in_grid]]) {\n\
                     threadgroup float c[TILE];\n}\n";
        let f = lint(&metal, param);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].severity, Severity::Warning);
        assert!(f[0].message.contains("`c`"));
    }

    #[test]
    fn lint_wants_a_bounds_check_in_mlx_cuda_kernels() {
        let mlx = builtin().lint_target("mlx-cuda").unwrap();
        let unguarded = "import mlx.core as mx\n\nSRC = \"\"\"\n    uint i = blockIdx.x * blockDim.x + threadIdx.x;\n    out[i] = inp[i] * 2.0f;\n\"\"\"\n\
                         k = mx.fast.cuda_kernel(name=\"k\", input_names=[\"inp\"], output_names=[\"out\"], source=SRC)\n";
        let f = lint(&mlx, unguarded);
        let e = f
            .iter()
            .find(|f| f.rule == "mlx-cuda-index-guard")
            .unwrap_or_else(|| panic!("{f:?}"));
        assert_eq!(e.severity, Severity::Error);
        assert_eq!(e.line, Some(4));
        let guarded = unguarded.replace("    out[i]", "    if (i >= inp_size) return;\n    out[i]");
        assert!(
            lint(&mlx, &guarded).is_empty(),
            "{:?}",
            lint(&mlx, &guarded)
        );
        let strided = unguarded.replace(
            "    out[i] = inp[i] * 2.0f;",
            "    for (uint j = i; j < n; j += gridDim.x * blockDim.x) out[j] = inp[j];",
        );
        assert!(lint(&mlx, &strided).is_empty());
        // Metal identifiers inside a CUDA kernel body are errors too.
        let metal_in_cuda = guarded.replace("out[i] = inp[i]", "out[i] = simd_sum(inp[i])");
        assert!(lint(&mlx, &metal_in_cuda)
            .iter()
            .any(|f| f.message.contains("simd_sum")));
    }

    #[test]
    fn the_seed_kernels_lint_clean_and_gpu_code_in_c_does_not() {
        let cpu = builtin().lint_target("cpu").unwrap();
        for t in ["softmax", "attention", "selective-scan"] {
            let task = task(t);
            let seed = task.backend("cpu").unwrap().seed.clone().unwrap();
            let src = std::fs::read_to_string(seed).unwrap();
            assert!(lint(&cpu, &src).is_empty(), "{t}: {:?}", lint(&cpu, &src));
        }
        let f = lint(&cpu, "void f(float* x) {\n  __syncthreads();\n}\n");
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].severity, Severity::Error);
        assert!(
            f[0].to_string()
                .starts_with("error [gpu-identifiers-in-c] line 2:"),
            "{}",
            f[0]
        );
    }
}
