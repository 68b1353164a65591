//! Fuzz targets of ksearch: the inputs that come from outside — task files, world-model patches
//! and LLM replies — fed to the code that reads them.
//!
//! Each target takes raw bytes and **panics only on a bug**: a panic inside ksearch, a rejection
//! without a message, a task error that names neither field nor line, or an accepted edit that
//! leaves the world model violating its invariants. The same functions serve the libFuzzer
//! binary (`fuzz.sh`, coverage-guided, on stable Rust) and the corpus replay that CI runs
//! (`tests/corpus.rs`); `corpus/<target>/` holds the seeds and every minimised crash.

pub mod llm_reply;
pub mod task_toml;
pub mod wm_patch;

use std::path::{Path, PathBuf};

/// A fuzz target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// `task.toml` text, loaded as a task directory (with the built-in tasks' other files).
    TaskToml,
    /// An edit in the patch language (either dialect) applied to a fixed world model, or a
    /// world-model document.
    WmPatch,
    /// A chat reply, read by every step of the LLM proposer.
    LlmReply,
}

impl Target {
    pub const ALL: [Target; 3] = [Target::TaskToml, Target::WmPatch, Target::LlmReply];

    pub fn name(self) -> &'static str {
        match self {
            Target::TaskToml => "task_toml",
            Target::WmPatch => "wm_patch",
            Target::LlmReply => "llm_reply",
        }
    }

    pub fn from_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Runs the target on one input; panics on a bug.
    pub fn run(self, data: &[u8]) {
        match self {
            Target::TaskToml => task_toml::run(data),
            Target::WmPatch => wm_patch::run(data),
            Target::LlmReply => llm_reply::run(data),
        }
    }

    /// The target's corpus in this checkout.
    pub fn corpus_dir(self) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(self.name())
    }
}

/// Every file of `dir`, sorted (a missing directory is empty).
pub fn corpus_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Asserts that a rejection explains itself.
pub(crate) fn assert_message(what: &str, message: &str) {
    assert!(
        !message.trim().is_empty(),
        "{what}: a rejection without a message"
    );
}
