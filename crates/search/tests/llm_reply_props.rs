//! Property tests of reading LLM replies: replies assembled from fences, JSON fragments, prose
//! and odd characters never panic the readers (`fenced_blocks`, `extract_code`,
//! `extract_json`) or the proposer's steps; an unusable reply is always rejected with a reason;
//! what is extracted is what the reply holds. (`crates/fuzz` fuzzes the same paths with
//! coverage guidance; this runs in every `cargo test`.)

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use serde_json::json;

use ksearch_llm::{ChatProvider, ChatRequest, ChatResponse, LlmError, Usage};
use ksearch_search::proposer::llm::{
    extract_code, extract_json, fenced_blocks, LlmProposer, LlmSettings,
};
use ksearch_search::proposer::prompts::ContextLevel;
use ksearch_search::proposer::{CodeRequest, Proposer, ProposerError, Step, TaskBrief};
use ksearch_search::world_model::{Edit, WorldModel};

/// Pieces replies are made of, the awkward ones included.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[ a-zA-Z0-9.,;:!?()_*/+=-]{0,24}",
        2 => proptest::sample::select(vec![
            "```", "```c", "```C++ {.line}", "```json", "```cuda", "~~~", "~~~~c", "   ```c",
            "```\t", "\n", "\r\n", "{", "}", "\"", "\\", "\\\"", "[", "]", "{\"ops\": [",
            "{\"op\": \"insert\", \"parent_id\": \"root\", \"node\": {\"action\": {\"title\": \"t\"}}}",
            "{\"op\": \"delete\", \"node_id\": \"n1\"}", "\"kernel_summary\": \"k\",",
            "void kern(float* x) { }", "kern", "\u{e9}", "\u{1F680}", "\u{200b}", "\0",
        ]).prop_map(str::to_string),
        1 => any::<String>(),
    ]
}

fn reply() -> impl Strategy<Value = String> {
    proptest::collection::vec(fragment(), 0..24).prop_map(|f| f.concat())
}

fn tags(t: &[&str]) -> Vec<String> {
    t.iter().map(|s| s.to_string()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn reply_readers_never_panic_and_explain_rejections(text in reply()) {
        let blocks = fenced_blocks(&text);
        for t in [&["c", "cpp"][..], &["cuda"], &[]] {
            match extract_code(&text, &tags(t)) {
                Ok(code) => {
                    prop_assert!(!code.trim().is_empty());
                    prop_assert!(code.ends_with('\n'));
                    // The code is the body of one of the reply's blocks.
                    prop_assert!(
                        blocks.iter().any(|b| b.body.trim_end() == code.trim_end()),
                        "{:?} is no block of the reply", code
                    );
                }
                Err(why) => prop_assert!(!why.trim().is_empty()),
            }
        }
        if let Some(v) = extract_json(&text, "ops") {
            prop_assert!(v.is_object() || v.is_array());
            if let Err(errors) = Edit::from_json_value(&v) {
                prop_assert!(errors.iter().all(|e| !e.to_string().trim().is_empty()));
            }
        }
    }

    /// A well-formed code block inside arbitrary prose (without fences) comes back verbatim.
    #[test]
    fn a_tagged_block_in_prose_is_found(
        before in "[ a-zA-Z0-9.,{}\"\n]{0,60}",
        body in "[a-z0-9 ;(){}*=+\n]{0,80}",
        after in "[ a-zA-Z0-9.,{}\"\n]{0,60}",
    ) {
        prop_assume!(!body.trim().is_empty());
        let text = format!("{before}\n```c\nkern {body}\n```\n{after}");
        prop_assert_eq!(
            extract_code(&text, &tags(&["c"])).unwrap(),
            format!("kern {}\n", body.trim_end())
        );
    }

    /// A valid edit inside arbitrary prose is the object `extract_json` prefers.
    #[test]
    fn an_edit_in_prose_is_found(
        before in "[ a-zA-Z0-9.,:\n]{0,60}",
        after in "[ a-zA-Z0-9.,:\n]{0,60}",
        title in "[a-z ]{1,20}",
    ) {
        let edit = json!({"ops": [{"op": "insert", "parent_id": "root",
                                   "node": {"action": {"title": title}}}]});
        let text = format!("{before}{edit}{after}");
        prop_assert_eq!(extract_json(&text, "ops"), Some(edit));
    }
}

/// Answers every call with the reply under test.
struct FixedReply(Mutex<String>);

impl ChatProvider for FixedReply {
    fn name(&self) -> &str {
        "fixed"
    }
    fn model(&self) -> &str {
        "fixed-model"
    }
    fn complete(&self, _: &ChatRequest) -> Result<ChatResponse, LlmError> {
        Ok(ChatResponse {
            text: self.0.lock().unwrap().clone(),
            model: "fixed-model".into(),
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

fn proposer(provider: Arc<FixedReply>) -> LlmProposer {
    let inputs = common::fake_prompt_inputs(ContextLevel::None);
    LlmProposer::new(provider, common::prompt_set(), inputs, LlmSettings::new())
}

fn unusable_with_reason(e: &ProposerError) -> bool {
    matches!(e, ProposerError::Unusable(why) if !why.trim().is_empty())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Every proposer step reads any reply: a first plan is always a valid, workable model
    /// (the reply's or the fallback), edits apply whole or not at all, code names the entry,
    /// and whatever is refused is `Unusable` with a reason.
    #[test]
    fn proposer_steps_take_any_reply(text in reply()) {
        let provider = Arc::new(FixedReply(Mutex::new(text)));
        let p = proposer(provider);
        let brief = TaskBrief { name: "fake".into(), language: "c".into(), ..TaskBrief::default() };
        let wm = match p.init_world_model(&brief) {
            Ok(wm) => wm,
            Err(e) => {
                prop_assert!(unusable_with_reason(&e), "{:?}", e);
                WorldModel::new_root("k", vec![])
            }
        };
        prop_assert!(wm.validate().is_ok());
        prop_assert!(!wm.frontier().is_empty(), "a first plan without an executable action");

        match p.propose(&wm, 1, &[]) {
            Ok(Some(edit)) => {
                let mut copy = wm.clone();
                match copy.apply_edit(&edit, 1) {
                    Ok(_) => prop_assert!(copy.validate().is_ok()),
                    Err(errors) => {
                        prop_assert!(errors.iter().all(|e| !e.to_string().trim().is_empty()));
                        prop_assert_eq!(copy.to_json().unwrap(), wm.to_json().unwrap());
                    }
                }
            }
            Ok(None) => {}
            Err(e) => prop_assert!(unusable_with_reason(&e), "{:?}", e),
        }

        let node = wm.frontier()[0].clone();
        let action = node.action.clone().expect("a frontier node has an action");
        let known = BTreeSet::new();
        let req = CodeRequest {
            step: Step::SpecAction,
            round: 1,
            attempt: 1,
            sample: 0,
            node: &node,
            action: &action,
            base: None,
            last: None,
            cycle_best: None,
            history: &[],
            wm: &wm,
            known_sources: &known,
        };
        match p.write_code(&req) {
            Ok(code) => prop_assert!(code.source.contains("kern")),
            Err(e) => prop_assert!(unusable_with_reason(&e), "{:?}", e),
        }
    }
}
