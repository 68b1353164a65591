//! `llm_reply`: the bytes are a chat reply, given to the LLM proposer's steps (first plan,
//! propose, write code, refine) and to the reply readers directly.
//!
//! Properties: no step panics; an unusable reply is `ProposerError::Unusable` with a message;
//! a first plan is always a valid model with an executable action (the parsed one or the
//! fallback); an edit the proposer returns is accepted whole or rejected with messages and no
//! change; code the proposer returns is non-empty and names the entry point.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};

use ksearch_llm::{ChatProvider, ChatRequest, ChatResponse, LlmError, Usage};
use ksearch_search::proposer::llm::{extract_code, extract_json, fenced_blocks};
use ksearch_search::proposer::llm::{LlmProposer, LlmSettings};
use ksearch_search::proposer::prompts::{ContextLevel, PromptInputs, PromptSet, TaskView};
use ksearch_search::proposer::{
    AttemptView, CodeRequest, CycleReport, OutcomeSummary, Proposer, ProposerError, Step, TaskBrief,
};
use ksearch_search::world_model::{Edit, NodeId, WorldModel};

use crate::assert_message;

const ENTRY: &str = "softmax_f32";

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data).into_owned();
    readers(&text);

    let (provider, proposer) = proposer();
    *provider.reply.lock().unwrap_or_else(|e| e.into_inner()) = text;

    let brief = TaskBrief {
        name: "softmax".into(),
        kind: "softmax".into(),
        description: "Row softmax.".into(),
        backend: "cpu".into(),
        signature: format!("void {ENTRY}(const float* x, float* y, int64_t rows, int64_t cols)"),
        language: "c".into(),
    };
    match proposer.init_world_model(&brief) {
        Ok(wm) => {
            if let Err(v) = wm.validate() {
                panic!("the first plan is not a valid model: {v:?}");
            }
            assert!(
                !wm.frontier().is_empty(),
                "the first plan has no executable action"
            );
        }
        Err(e) => check_error("init", &e),
    }

    let wm = crate::wm_patch::fixture();
    check_edit(wm, "propose", proposer.propose(wm, 5, &[]));

    let node = wm.node(&NodeId::new("n3")).expect("fixture node");
    let action = node.action.clone().unwrap_or_default();
    let base = attempt(11, true);
    let last = attempt(12, false);
    let known = BTreeSet::new();
    // The four code steps read replies alike and differ only in their prompts: one per input.
    let steps = [
        Step::SpecAction,
        Step::BaseAction,
        Step::Debug,
        Step::Improve,
    ];
    {
        let step = steps[data.len() % steps.len()];
        let req = CodeRequest {
            step,
            round: 5,
            attempt: 2,
            sample: 0,
            node,
            action: &action,
            base: Some(&base),
            last: Some(&last),
            cycle_best: Some(&base),
            history: &[],
            wm,
            known_sources: &known,
        };
        match proposer.write_code(&req) {
            Ok(p) => {
                assert!(!p.source.trim().is_empty(), "empty code accepted");
                assert!(p.source.contains(ENTRY), "code without the entry accepted");
            }
            Err(e) => check_error("write_code", &e),
        }
    }

    let id = NodeId::new("n3");
    let feedback = vec!["op 0: unknown node `n99`".to_string()];
    let report = CycleReport {
        node_id: &id,
        round: 5,
        attempts: 2,
        base: Some(&base),
        best: Some(&base),
        last: Some(&last),
        history: &[],
        feedback: &feedback,
    };
    // `too_hard` reads its reply as `propose` and `refine` do.
    check_edit(wm, "refine", proposer.refine(wm, &report));
    let _ = proposer.drain_exchanges();
}

/// The reply readers on their own, with the tag sets of every backend.
fn readers(text: &str) {
    let _ = fenced_blocks(text);
    for tags in [
        &["c", "cpp", "c++"][..],
        &["cuda", "cu"],
        &["python", "py"],
        &[],
    ] {
        let tags: Vec<String> = tags.iter().map(|t| t.to_string()).collect();
        match extract_code(text, &tags) {
            Ok(code) => assert!(!code.trim().is_empty(), "extract_code returned nothing"),
            Err(why) => assert_message("extract_code", &why),
        }
    }
    if let Some(v) = extract_json(text, "ops") {
        assert!(
            v.is_object() || v.is_array(),
            "extract_json returned a scalar"
        );
        if let Err(errors) = Edit::from_json_value(&v) {
            assert!(!errors.is_empty(), "an edit rejected without errors");
            for e in &errors {
                assert_message("Edit::from_json_value", &e.to_string());
            }
        }
    }
}

fn check_error(step: &str, e: &ProposerError) {
    assert!(
        matches!(e, ProposerError::Unusable(_)),
        "{step}: a reply must be usable or Unusable, got {e:?}"
    );
    assert_message(step, &e.to_string());
}

/// What the engine does with a returned edit: apply it whole or not at all.
fn check_edit(wm: &WorldModel, step: &str, got: Result<Option<Edit>, ProposerError>) {
    let edit = match got {
        Ok(Some(edit)) => edit,
        Ok(None) => return,
        Err(e) => return check_error(step, &e),
    };
    crate::wm_patch::check_apply(wm, &edit, step, false);
}

fn attempt(id: i64, passed: bool) -> AttemptView {
    AttemptView {
        candidate_id: id,
        source: format!("void {ENTRY}(const float* x, float* y, long r, long c) {{ }}\n"),
        source_id: format!("src{id}"),
        knobs: None,
        outcome: OutcomeSummary {
            status: if passed { "passed" } else { "incorrect" }.into(),
            passed,
            score: passed.then_some(1.5),
            score_interval: passed.then_some([1.4, 1.6]),
            latency_ms: Some(0.5),
            speedup_vs_reference: Some(3.0),
            message: if passed { "" } else { "wrong answer on w0" }.into(),
            workloads: vec!["w0: 0.50 ms".into()],
            bottleneck: None,
            bottleneck_class: None,
            speed_of_light: None,
        },
    }
}

/// Answers every call with the current input.
struct FixedReply {
    reply: Mutex<String>,
}

impl ChatProvider for FixedReply {
    fn name(&self) -> &str {
        "fuzz"
    }
    fn model(&self) -> &str {
        "fuzz-model"
    }
    fn complete(&self, _req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        Ok(ChatResponse {
            text: self.reply.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            model: "fuzz-model".into(),
            usage: Usage {
                input_tokens: 1,
                output_tokens: 1,
                estimated: false,
            },
            cost_usd: 0.0,
            latency_ms: 0,
            cached: false,
            attempts: 1,
            stop_reason: None,
        })
    }
}

/// One proposer per process: loading the prompt templates costs more than a whole input.
fn proposer() -> (&'static FixedReply, &'static LlmProposer) {
    static P: OnceLock<(Arc<FixedReply>, LlmProposer)> = OnceLock::new();
    let (provider, proposer) = P.get_or_init(|| {
        let provider = Arc::new(FixedReply {
            reply: Mutex::new(String::new()),
        });
        let knowledge =
            ksearch_assets::locate(ksearch_assets::Tree::Knowledge).expect("the knowledge tree");
        let prompts = PromptSet::load(&knowledge.join("prompts")).expect("the prompt templates");
        let inputs = PromptInputs {
            level: ContextLevel::Spec,
            task: TaskView {
                name: "softmax".into(),
                kind: "softmax".into(),
                backend: "cpu".into(),
                language: "c".into(),
                signature: format!("void {ENTRY}(const float* x, float* y)"),
                entry: ENTRY.into(),
                entries: Vec::new(),
                fence_tag: "c".into(),
                target: "cpu".into(),
                target_title: "CPU kernel in C".into(),
            },
            spec: Some("Row softmax.".into()),
            device: None,
            knowledge: None,
            reference: None,
            code_format: "- One ```c block.".into(),
            fence_tags: vec!["c".into(), "cpp".into()],
        };
        let proposer = LlmProposer::new(provider.clone(), prompts, inputs, LlmSettings::new());
        (provider, proposer)
    });
    (provider, proposer)
}
