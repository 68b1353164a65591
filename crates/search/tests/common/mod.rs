//! Fixtures shared by the search crate's integration tests.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use serde_json::json;

use ksearch_search::proposer::prompts::{ContextLevel, PromptInputs, PromptSet, TaskView};
use ksearch_store::{RunConfig, RunStore};

/// A fresh run store for a fake cpu task; `proposer` names who drives the run.
pub fn store(dir: &std::path::Path, proposer: &str) -> RunStore {
    RunStore::create(
        dir,
        &RunConfig {
            task: "fake".into(),
            backend: "cpu".into(),
            strategy: "world-model".into(),
            proposer: proposer.into(),
            selection: "ksearch".into(),
            seed: 7,
            secret_seed: 11,
            budgets: json!({}),
            flags: json!({}),
            extra: json!({}),
            created_at: String::new(),
            ksearch_version: String::new(),
        },
    )
    .unwrap()
}

/// Prompt inputs of the fake cpu task (entry `kern`, ```c replies) at `level`.
pub fn fake_prompt_inputs(level: ContextLevel) -> PromptInputs {
    PromptInputs {
        level,
        task: TaskView {
            name: "fake".into(),
            kind: "softmax".into(),
            backend: "cpu".into(),
            language: "c".into(),
            signature: "void kern(float* x)".into(),
            entry: "kern".into(),
            fence_tag: "c".into(),
            target: "cpu".into(),
            target_title: "CPU kernel in C".into(),
        },
        spec: level.has_spec().then(|| "A fake task.".into()),
        device: None,
        knowledge: None,
        reference: None,
        code_format: "- One ```c block.".into(),
        fence_tags: vec!["c".into()],
    }
}

/// The checkout's prompt templates.
pub fn prompt_set() -> PromptSet {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    PromptSet::load(&root.join("knowledge/prompts")).unwrap()
}
