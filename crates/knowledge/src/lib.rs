//! ksearch-knowledge: the data under `knowledge/` and the kernel template families of tasks.
//!
//! - [`Catalog`]: the action catalog (`knowledge/actions/*.toml`), optimisation ideas the offline
//!   proposer turns into world-model nodes, and the hardware profiles
//!   (`knowledge/hardware/*.toml`).
//! - [`TemplateFamily`]: a task's parametric kernel templates (`tasks/<name>/templates/`):
//!   knobs with ordered domains, constraints, minijinja rendering, neighbours and enumeration;
//!   [`render`] serves it to tools outside the binary (`ksearch tasks --render`).
//! - [`Packs`]: the translation layer (`knowledge/packs/`): code targets, CUDA→target concept
//!   maps, code patterns, assertions (with adversarial acceptance workloads) and lint rules;
//!   [`lint`] runs the static checks on candidate code.
//! - [`scaffold`]: the files of a new task (`ksearch new-task`), embedded in the binary.
//!
//! Data only: this crate never talks to an LLM or runs a kernel. `docs/offline-proposer.md`
//! describes the file formats.

mod catalog;
mod error;
mod files;
mod hardware;
pub mod lint;
pub mod packs;
pub mod render;
pub mod scaffold;
pub mod templates;

pub use catalog::{Action, Catalog, Impacts, Origin, TASK_ACTIONS_DIR};
pub use error::{KnowledgeError, TemplateError};
pub use hardware::{DeviceKind, HardwareProfile, Memory, OnChip, Parallelism};
pub use lint::{LintFinding, LintTarget, Severity};
pub use packs::{KnowledgeContext, Packs, Target, TASK_PATTERNS_DIR};
pub use templates::{format_knobs, Knob, KnobValue, Knobs, Rule, TemplateFamily};

/// Is `s` a C/Python identifier (a letter or `_`, then letters, digits and `_`)?
pub(crate) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
