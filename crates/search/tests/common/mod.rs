//! Fixtures shared by the search crate's integration tests.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use serde_json::json;

use ksearch_llm::{ChatProvider, ChatRequest, ChatResponse, Usage};

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
            entries: Vec::new(),
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

/// A reply of [`ScriptedLlm`]: text, or the error the call fails with.
pub type Reply = Result<String, ksearch_llm::LlmError>;

/// A chat provider that answers each role tag from its queue of replies, then with
/// `fallback(role)` (`{"ops": []}` unless set), and records every request. Each answer is
/// billed 100 input and 20 output tokens.
pub struct ScriptedLlm {
    queues: Mutex<BTreeMap<String, VecDeque<Reply>>>,
    seen: Mutex<Vec<ChatRequest>>,
    fallback: fn(&str) -> String,
}

impl ScriptedLlm {
    pub fn new(script: Vec<(&str, Vec<Reply>)>) -> Self {
        let mut queues: BTreeMap<String, VecDeque<Reply>> = BTreeMap::new();
        for (role, replies) in script {
            queues.entry(role.to_string()).or_default().extend(replies);
        }
        Self {
            queues: Mutex::new(queues),
            seen: Mutex::new(Vec::new()),
            fallback: |_| "{\"ops\": []}".into(),
        }
    }

    /// The same, answering `fallback(role)` once a role's queue is empty.
    pub fn with_fallback(self, fallback: fn(&str) -> String) -> Self {
        Self { fallback, ..self }
    }

    /// Every request so far, in order.
    pub fn seen(&self) -> Vec<ChatRequest> {
        self.seen.lock().unwrap().clone()
    }

    /// User prompts of the calls with `tag`, in order.
    pub fn prompts(&self, tag: &str) -> Vec<String> {
        self.seen()
            .iter()
            .filter(|r| r.role_tag == tag)
            .map(|r| r.messages[0].content.clone())
            .collect()
    }
}

impl ChatProvider for ScriptedLlm {
    fn name(&self) -> &str {
        "scripted"
    }
    fn model(&self) -> &str {
        "test-model"
    }
    fn complete(&self, req: &ChatRequest) -> Result<ChatResponse, ksearch_llm::LlmError> {
        self.seen.lock().unwrap().push(req.clone());
        let next = self
            .queues
            .lock()
            .unwrap()
            .get_mut(&req.role_tag)
            .and_then(VecDeque::pop_front);
        let text = next.unwrap_or_else(|| Ok((self.fallback)(&req.role_tag)))?;
        Ok(ChatResponse {
            text,
            model: "test-model".into(),
            usage: Usage {
                input_tokens: 100,
                output_tokens: 20,
                estimated: false,
            },
            cost_usd: 0.0,
            latency_ms: 1,
            cached: false,
            attempts: 1,
            stop_reason: Some("stop".into()),
        })
    }
}

/// The checkout's root.
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The real evaluator (the harness) for the built-in task `task` on `backend`, writing its
/// candidate files (extension `ext`) under `work`. The interpreter is `KSEARCH_TEST_PYTHON`,
/// else the managed environment cached under `target/`. It sets the process environment
/// (`KSEARCH_ROOT`, `KSEARCH_CACHE_DIR`): a test binary that calls it runs one test.
pub fn harness_evaluator(
    task: &str,
    backend: &str,
    secret_seed: u64,
    ext: &str,
    work: &std::path::Path,
) -> ksearch_search::engine::evaluation::HarnessEvaluator {
    harness_evaluator_on(eval_evaluator(), task, backend, secret_seed, ext, work)
}

/// The harness's evaluator for tests: `KSEARCH_TEST_PYTHON`'s interpreter, else ksearch's own
/// environment under the target directory.
pub fn eval_evaluator() -> ksearch_eval::Evaluator {
    let python = std::env::var_os("KSEARCH_TEST_PYTHON").map(std::path::PathBuf::from);
    if python.is_none() && std::env::var_os("KSEARCH_CACHE_DIR").is_none() {
        std::env::set_var(
            "KSEARCH_CACHE_DIR",
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ksearch-cache"),
        );
    }
    std::env::set_var("KSEARCH_ROOT", workspace_root());
    ksearch_eval::Evaluator::new(ksearch_eval::EvaluatorConfig {
        python,
        ..ksearch_eval::EvaluatorConfig::default()
    })
    .unwrap_or_else(|e| panic!("no evaluation environment: {e}"))
}

/// [`harness_evaluator`] over an evaluator the test keeps a handle of.
pub fn harness_evaluator_on(
    evaluator: impl Into<std::sync::Arc<ksearch_eval::Evaluator>>,
    task: &str,
    backend: &str,
    secret_seed: u64,
    ext: &str,
    work: &std::path::Path,
) -> ksearch_search::engine::evaluation::HarnessEvaluator {
    let task = ksearch_task::load_task(&workspace_root().join("tasks").join(task)).unwrap();
    ksearch_search::engine::evaluation::HarnessEvaluator::new(
        evaluator,
        task,
        backend,
        secret_seed,
        ksearch_eval::TimingPreset::Quick,
        work.to_path_buf(),
        ext,
    )
}
