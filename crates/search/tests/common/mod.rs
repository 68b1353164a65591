//! Fixtures shared by the search crate's integration tests.

use serde_json::json;

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
