//! The action catalog (`knowledge/actions/*.toml`): optimisation ideas the offline proposer
//! turns into world-model nodes, each tied to the knob values that implement it.
//!
//! An action applies to task kinds and to backends: the same kind has a C family on `cpu` and
//! a CUDA family on `cuda`, with different knobs, so an action names the backends whose
//! families it was written for (`backends`, `["cpu"]` when left out: the catalog started with
//! the C families only).

use crate::error::KnowledgeError;
use crate::files::{header_lines, parse_toml, read_text, toml_files};
use crate::hardware::HardwareProfile;
use crate::templates::{format_knobs, Knobs, TemplateFamily};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Prior ratings (0..10) on the three axes of a world-model node's `impacts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Impacts {
    pub memory_bandwidth: f64,
    pub register_pressure: f64,
    pub compute_intensity_and_hw_fit: f64,
}

/// One optimisation idea.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    /// Unique across the catalog; `requires` refers to it.
    pub id: String,
    pub title: String,
    pub rationale: String,
    /// Task kinds the action applies to (`softmax`, `attention`, `selective-scan`, …).
    pub kinds: Vec<String>,
    /// Backends whose template families the action's knobs belong to; `["cpu"]` when omitted.
    #[serde(default = "default_backends")]
    pub backends: Vec<String>,
    /// 1 (trivial) ..= 5 (hard).
    pub difficulty: u8,
    pub impacts: Impacts,
    /// Prior guess of the speedup over the kernel the action starts from (> 1 is faster).
    pub expected_factor: f64,
    /// Priors that depend on the kernel the action starts from: the first entry whose knobs
    /// that kernel has replaces `expected_factor` (exp2 pays in tensor-core kernels, not in
    /// scalar ones). See `expected_factor_from`.
    #[serde(default)]
    pub when: Vec<ConditionalPrior>,
    /// The knob values that implement the action in each listed kind's template family.
    #[serde(default)]
    pub knobs: Knobs,
    /// Actions that must be applied first; the action becomes their child in the tree.
    #[serde(default)]
    pub requires: Vec<String>,
}

/// A prior that holds when the starting kernel has every one of `knobs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConditionalPrior {
    pub knobs: Knobs,
    pub expected_factor: f64,
}

fn default_backends() -> Vec<String> {
    vec!["cpu".to_string()]
}

impl Action {
    /// Whether the action applies to `kind` on some backend.
    pub fn applies_to(&self, kind: &str) -> bool {
        self.kinds.iter().any(|k| k == kind)
    }

    /// The prior speedup of applying the action to a kernel with knobs `from`: the first
    /// `when` entry that `from` matches, else `expected_factor`. An empty `from` (a kernel
    /// that is not a template setting, such as a task's seed) matches no entry.
    pub fn expected_factor_from(&self, from: &Knobs) -> f64 {
        self.when
            .iter()
            .find(|w| w.knobs.iter().all(|(k, v)| from.get(k) == Some(v)))
            .map_or(self.expected_factor, |w| w.expected_factor)
    }

    /// Whether the action applies to `kind` on `backend`.
    pub fn applies_to_backend(&self, kind: &str, backend: &str) -> bool {
        self.applies_to(kind) && self.backends.iter().any(|b| b == backend)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawActionsFile {
    #[serde(default)]
    action: Vec<Action>,
}

/// Where a task keeps actions of its own, relative to the task directory (beside its template
/// families): merged over the built-in catalog by [`Catalog::with_task`].
pub const TASK_ACTIONS_DIR: &str = "knowledge/actions";

/// Where an action was declared: its file, the line of its `[[action]]` header (when it can be
/// found in the text) and whether the file belongs to a task rather than the built-in pack.
#[derive(Debug, Clone, PartialEq)]
pub struct Origin {
    pub path: PathBuf,
    pub line: Option<usize>,
    pub task_local: bool,
}

impl Origin {
    fn invalid(&self, field: String, message: impl Into<String>) -> KnowledgeError {
        match self.line {
            Some(line) => KnowledgeError::InvalidAt {
                path: self.path.clone(),
                line,
                field,
                message: message.into(),
            },
            None => KnowledgeError::invalid(&self.path, field, message),
        }
    }
}

/// A knowledge pack: actions and hardware profiles loaded from one directory, plus the actions
/// of a task when [`Catalog::with_task`] merged them in.
#[derive(Debug, Clone)]
pub struct Catalog {
    dir: PathBuf,
    actions: Vec<Action>,
    /// Parallel to `actions`.
    origin: Vec<Origin>,
    hardware: Vec<HardwareProfile>,
}

impl Catalog {
    /// Loads `dir/actions/*.toml` and `dir/hardware/*.toml` (files in name order; an absent
    /// section is empty). Every file is checked: ids unique, `requires` known and acyclic,
    /// ratings in range.
    pub fn load(dir: &Path) -> Result<Catalog, KnowledgeError> {
        let (actions, origin): (Vec<Action>, Vec<Origin>) =
            read_actions(&dir.join("actions"), false)?
                .into_iter()
                .unzip();
        check_links(&actions, &origin)?;
        let hardware = HardwareProfile::load_all(&dir.join("hardware"))?;
        Ok(Catalog {
            dir: dir.to_path_buf(),
            actions,
            origin,
            hardware,
        })
    }

    /// This catalog with the actions of the task in `task_dir` (`task_dir/knowledge/actions/
    /// *.toml`, same format) merged in: a task action whose id a built-in action has replaces
    /// it (the task wins), the others are added. The task's files are checked as the pack's
    /// are, and `requires` may name actions of either. A task without the directory changes
    /// nothing.
    pub fn with_task(mut self, task_dir: &Path) -> Result<Catalog, KnowledgeError> {
        let local = read_actions(&task_dir.join(TASK_ACTIONS_DIR), true)?;
        for (action, origin) in local {
            match self.actions.iter().position(|a| a.id == action.id) {
                Some(i) => {
                    self.actions[i] = action;
                    self.origin[i] = origin;
                }
                None => {
                    self.actions.push(action);
                    self.origin.push(origin);
                }
            }
        }
        check_links(&self.actions, &self.origin)?;
        Ok(self)
    }

    /// The built-in pack with the actions of the task in `task_dir` merged in
    /// ([`Catalog::with_task`]): what a run of that task proposes from.
    pub fn for_task(task_dir: &Path) -> Result<Catalog, KnowledgeError> {
        Catalog::builtin()?.with_task(task_dir)
    }

    /// Where action `id` was declared.
    pub fn origin(&self, id: &str) -> Option<&Origin> {
        let i = self.actions.iter().position(|a| a.id == id)?;
        self.origin.get(i)
    }

    /// Like [`Catalog::check_family`], for the task's own actions only, as a load error that
    /// names the action's file and line: a task action whose knobs its family lacks is a
    /// mistake in the task, found before a run starts rather than when the action is tried.
    pub fn check_task_actions(
        &self,
        kind: &str,
        backend: &str,
        family: &TemplateFamily,
    ) -> Result<(), KnowledgeError> {
        for (a, origin) in self.actions.iter().zip(&self.origin) {
            if !origin.task_local || !a.applies_to_backend(kind, backend) {
                continue;
            }
            let problems = self.check_actions(std::iter::once(a), family);
            if let Some(p) = problems.into_iter().next() {
                return Err(origin.invalid(
                    format!("action {:?}.knobs", a.id),
                    format!("{p} (family in {})", family.dir().display()),
                ));
            }
        }
        Ok(())
    }

    /// The pack shipped with ksearch (see `ksearch_assets::locate`).
    pub fn builtin() -> Result<Catalog, KnowledgeError> {
        let dir = ksearch_assets::locate(ksearch_assets::Tree::Knowledge)?;
        Catalog::load(&dir)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// All actions, in file-name then declaration order.
    pub fn actions(&self) -> &[Action] {
        &self.actions
    }

    pub fn action(&self, id: &str) -> Option<&Action> {
        self.actions.iter().find(|a| a.id == id)
    }

    /// The actions that apply to `kind` on any backend, in catalog order.
    pub fn for_kind(&self, kind: &str) -> Vec<&Action> {
        self.actions.iter().filter(|a| a.applies_to(kind)).collect()
    }

    /// The actions that apply to `kind` on `backend`, in catalog order: what the offline
    /// proposer of a run on that backend works with.
    pub fn for_kind_on(&self, kind: &str, backend: &str) -> Vec<&Action> {
        self.actions
            .iter()
            .filter(|a| a.applies_to_backend(kind, backend))
            .collect()
    }

    /// Every (kind, backend) pair some action applies to.
    pub fn kind_backends(&self) -> BTreeSet<(&str, &str)> {
        self.actions
            .iter()
            .flat_map(|a| {
                a.kinds
                    .iter()
                    .flat_map(|k| a.backends.iter().map(move |b| (k.as_str(), b.as_str())))
            })
            .collect()
    }

    /// Every kind some action applies to.
    pub fn kinds(&self) -> BTreeSet<&str> {
        self.actions
            .iter()
            .flat_map(|a| a.kinds.iter().map(String::as_str))
            .collect()
    }

    /// The actions of `kind` that list `id` in `requires`.
    pub fn dependents(&self, kind: &str, id: &str) -> Vec<&Action> {
        self.for_kind(kind)
            .into_iter()
            .filter(|a| a.requires.iter().any(|r| r == id))
            .collect()
    }

    /// The knobs an action sets once its requirements are in place: the union over the chain
    /// of `requires` (ancestors first, so the action's own values win).
    pub fn cumulative_knobs(&self, id: &str) -> Knobs {
        let mut knobs = Knobs::new();
        let mut seen = BTreeSet::new();
        self.collect_knobs(id, &mut knobs, &mut seen);
        knobs
    }

    fn collect_knobs(&self, id: &str, knobs: &mut Knobs, seen: &mut BTreeSet<String>) {
        if !seen.insert(id.to_string()) {
            return;
        }
        if let Some(a) = self.action(id) {
            for r in &a.requires {
                self.collect_knobs(r, knobs, seen);
            }
            knobs.extend(a.knobs.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }

    /// Checks that every action of `kind` on `backend` names knobs and values that `family`
    /// has and that the action (with its requirements) can be applied to the defaults. Returns
    /// one line per problem.
    pub fn check_family(&self, kind: &str, backend: &str, family: &TemplateFamily) -> Vec<String> {
        self.check_actions(self.for_kind_on(kind, backend), family)
    }

    fn check_actions<'a>(
        &self,
        actions: impl IntoIterator<Item = &'a Action>,
        family: &TemplateFamily,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        for a in actions {
            let conditions = a.when.iter().map(|w| (&w.knobs, "a `when` condition"));
            for (set, what) in std::iter::once((&a.knobs, "its knobs")).chain(conditions) {
                for (name, value) in set {
                    match family.knob(name) {
                        None => problems.push(format!(
                            "action {:?}, {what}: family {:?} has no knob `{name}`",
                            a.id,
                            family.name()
                        )),
                        Some(k) if k.position(value).is_none() => problems.push(format!(
                            "action {:?}, {what}: {name} = {value} is outside the domain of \
                             family {:?}",
                            a.id,
                            family.name()
                        )),
                        Some(_) => {}
                    }
                }
            }
            let knobs = self.cumulative_knobs(&a.id);
            if let Err(e) = family.apply(&family.default_knobs(), &knobs) {
                problems.push(format!(
                    "action {:?}: {} cannot be applied: {e}",
                    a.id,
                    format_knobs(&knobs)
                ));
            }
        }
        problems
    }

    /// All hardware profiles, sorted by file name.
    pub fn hardware(&self) -> &[HardwareProfile] {
        &self.hardware
    }

    /// A hardware profile by name or alias (case-insensitive).
    pub fn hardware_profile(&self, name: &str) -> Option<&HardwareProfile> {
        HardwareProfile::find(&self.hardware, name)
    }

    /// The profile a measurement's numbers are compared with: the one named by `wanted` (an
    /// error when there is none), else the one of the device the measurement `reported`, if
    /// any. `ksearch bench` takes its fraction of peak from it.
    pub fn hardware_for(
        &self,
        wanted: Option<&str>,
        reported: Option<&str>,
    ) -> Result<Option<&HardwareProfile>, KnowledgeError> {
        match (wanted, reported) {
            (Some(name), _) => self
                .hardware_profile(name)
                .map(Some)
                .ok_or_else(|| KnowledgeError::UnknownHardware(name.to_string())),
            (None, Some(device)) => Ok(self.hardware_profile(device)),
            (None, None) => Ok(None),
        }
    }
}

fn validate_action(origin: &Origin, i: usize, a: &Action) -> Result<(), KnowledgeError> {
    let field = |f: &str| format!("action[{i}] ({}).{f}", a.id);
    let err = |f: &str, m: String| Err(origin.invalid(field(f), m));
    let id_ok = !a.id.is_empty()
        && a.id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !id_ok {
        return err(
            "id",
            "must be non-empty lowercase letters, digits, `-` or `_`".into(),
        );
    }
    if a.title.trim().is_empty() {
        return err("title", "must not be empty".into());
    }
    if a.rationale.trim().is_empty() {
        return err("rationale", "must not be empty".into());
    }
    if a.kinds.is_empty() {
        return err("kinds", "must list at least one task kind".into());
    }
    if a.backends.is_empty() {
        return err(
            "backends",
            "must list at least one backend (leave it out for cpu)".into(),
        );
    }
    if !(1..=5).contains(&a.difficulty) {
        return err("difficulty", format!("{} is outside 1..=5", a.difficulty));
    }
    let ratings = [
        ("impacts.memory_bandwidth", a.impacts.memory_bandwidth),
        ("impacts.register_pressure", a.impacts.register_pressure),
        (
            "impacts.compute_intensity_and_hw_fit",
            a.impacts.compute_intensity_and_hw_fit,
        ),
    ];
    for (f, r) in ratings {
        if !(0.0..=10.0).contains(&r) {
            return err(f, format!("{r} is outside 0..=10"));
        }
    }
    if !(a.expected_factor.is_finite() && a.expected_factor > 0.0) {
        return err("expected_factor", "must be a positive number".into());
    }
    for (i, w) in a.when.iter().enumerate() {
        if w.knobs.is_empty() {
            return err(
                &format!("when[{i}].knobs"),
                "must name at least one knob (the unconditional prior is expected_factor)".into(),
            );
        }
        if !(w.expected_factor.is_finite() && w.expected_factor > 0.0) {
            return err(
                &format!("when[{i}].expected_factor"),
                "must be a positive number".into(),
            );
        }
    }
    if a.requires.iter().any(|r| r == &a.id) {
        return err("requires", "an action cannot require itself".into());
    }
    Ok(())
}

/// The id (and file) of an action on a `requires` cycle, if there is one.
fn find_cycle<'a>(actions: &'a [Action], origin: &'a [Origin]) -> Option<(&'a str, &'a Origin)> {
    // 0 = unvisited, 1 = on the current path, 2 = done.
    fn visit(i: usize, actions: &[Action], state: &mut [u8]) -> bool {
        match state[i] {
            1 => return true,
            2 => return false,
            _ => {}
        }
        state[i] = 1;
        for r in &actions[i].requires {
            if let Some(j) = actions.iter().position(|a| &a.id == r) {
                if visit(j, actions, state) {
                    return true;
                }
            }
        }
        state[i] = 2;
        false
    }
    let mut state = vec![0u8; actions.len()];
    (0..actions.len())
        .find(|&i| visit(i, actions, &mut state))
        .map(|i| (actions[i].id.as_str(), &origin[i]))
}

/// The actions of `dir/*.toml` (files in name order), each checked on its own and with its
/// origin; ids must be unique among them.
fn read_actions(dir: &Path, task_local: bool) -> Result<Vec<(Action, Origin)>, KnowledgeError> {
    let mut out: Vec<(Action, Origin)> = Vec::new();
    for path in toml_files(dir)? {
        let text = read_text(&path)?;
        let raw: RawActionsFile = parse_toml(&path, &text)?;
        let lines = header_lines(&text, "[[action]]");
        for (i, action) in raw.action.into_iter().enumerate() {
            let origin = Origin {
                path: path.clone(),
                line: lines.get(i).copied(),
                task_local,
            };
            validate_action(&origin, i, &action)?;
            if let Some((_, first)) = out.iter().find(|(a, _)| a.id == action.id) {
                return Err(origin.invalid(
                    format!("action[{i}].id"),
                    format!(
                        "{:?} is already defined in {}",
                        action.id,
                        first.path.display()
                    ),
                ));
            }
            out.push((action, origin));
        }
    }
    Ok(out)
}

/// Checks every `requires` (a known action that applies to all of the dependent's kinds and
/// backends) and that the requirements form no cycle.
fn check_links(actions: &[Action], origin: &[Origin]) -> Result<(), KnowledgeError> {
    for (a, origin) in actions.iter().zip(origin) {
        for r in &a.requires {
            let field = format!("action {:?}.requires", a.id);
            let Some(req) = actions.iter().find(|b| &b.id == r) else {
                return Err(origin.invalid(field, format!("unknown action {r:?}")));
            };
            if let Some(kind) = a.kinds.iter().find(|k| !req.applies_to(k)) {
                return Err(origin.invalid(
                    field,
                    format!("{r:?} does not apply to kind {kind:?}, so it cannot come first there"),
                ));
            }
            if let Some(b) = a.backends.iter().find(|b| !req.backends.contains(b)) {
                return Err(origin.invalid(
                    field,
                    format!("{r:?} does not apply to backend {b:?}, so it cannot come first there"),
                ));
            }
        }
    }
    if let Some((id, origin)) = find_cycle(actions, origin) {
        return Err(origin.invalid(
            format!("action {id:?}.requires"),
            "the requirements form a cycle",
        ));
    }
    Ok(())
}
