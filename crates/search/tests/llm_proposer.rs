//! The LLM proposer inside the cycle engine, against a scripted in-process chat provider and a
//! fake evaluator: unusable replies become failed attempts whose reason reaches the next
//! prompt, every call is stored as an exchange, usage adds up, a spent budget stops the run
//! cleanly, and the lint hook rejects proposals before evaluation.

mod common;
use common::{Reply, ScriptedLlm};

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

use ksearch_llm::{
    Budget, ChatProvider, ChatRequest, Client, ClientConfig, LlmError, PriceTable, RetryPolicy,
};
use ksearch_search::engine::{
    CandidateEvaluator, Engine, EngineConfig, EvalFailure, Evaluation, NoProgress, Purpose,
};
use ksearch_search::proposer::llm::{LlmProposer, LlmSettings, CODE_ROLE_TAG};
use ksearch_search::proposer::prompts::{ContextLevel, PromptInputs, PromptSet};
use ksearch_search::proposer::{OutcomeSummary, Proposer, TaskBrief};
use ksearch_search::selection::KSearchPolicy;
use ksearch_search::world_model::WorldModel;
use ksearch_store::{CandidateKind, RunStore};

/// Sources look like `score=1.5;...` (passes with that score) or anything else (incorrect).
struct FakeEvaluator {
    calls: AtomicUsize,
}

impl CandidateEvaluator for FakeEvaluator {
    fn evaluate(&self, source: &str, _purpose: Purpose) -> Result<Evaluation, EvalFailure> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let head = source.trim().split(';').next().unwrap_or("");
        let result = match head.strip_prefix("score=") {
            Some(s) => json!({"status": "passed", "score": s.parse::<f64>().unwrap_or(1.0)}),
            None => json!({"status": "incorrect", "message": "wrong answer on r64c1000"}),
        };
        Ok(Evaluation {
            summary: self.summarize(&result),
            result,
        })
    }

    fn summarize(&self, result: &Value) -> OutcomeSummary {
        let passed = result["status"] == "passed";
        OutcomeSummary {
            status: result["status"].as_str().unwrap_or("").to_string(),
            passed,
            score: result["score"].as_f64().filter(|_| passed),
            message: result["message"].as_str().unwrap_or("").to_string(),
            ..OutcomeSummary::default()
        }
    }
}

/// A [`ScriptedLlm`] that falls back on [`default_reply`].
fn scripted(script: Vec<(&str, Vec<Reply>)>) -> ScriptedLlm {
    ScriptedLlm::new(script).with_fallback(default_reply)
}

fn default_reply(role: &str) -> String {
    match role {
        "wm-init" => init_reply(),
        CODE_ROLE_TAG => "```c\nscore=1.1;kern\n```".into(),
        _ => "{\"ops\": []}".into(),
    }
}

fn init_reply() -> String {
    let v = json!({
        "kernel_summary": "fake kernel",
        "open_questions": ["q"],
        "ops": [
            {"op": "insert", "parent_id": "root",
             "node": {"label": "a", "decision": "plan", "choice": "a",
                      "action": {"title": "action a", "difficulty": 2, "score": 0.9}}},
            {"op": "insert", "parent_id": "root",
             "node": {"label": "b", "action": {"title": "action b", "difficulty": 2, "score": 0.6}}},
            {"op": "insert", "parent_id": "a",
             "node": {"label": "a-deeper", "action": {"title": "deeper a", "score": 0.5}}},
            {"op": "insert", "parent_id": "root",
             "node": {"label": "c", "action": {"title": "action c", "difficulty": 3, "score": 0.4}}}
        ]
    });
    format!("Here is my plan.\n```json\n{v:#}\n```\nGood luck.")
}

fn inputs() -> PromptInputs {
    common::fake_prompt_inputs(ContextLevel::Spec)
}

fn prompts() -> PromptSet {
    common::prompt_set()
}

fn store(dir: &Path) -> RunStore {
    common::store(dir, "llm")
}

fn cfg(rounds: u32) -> EngineConfig {
    EngineConfig {
        rounds,
        samples: 1,
        stagnation_window: 2,
        cycle_cap: 3,
        recheck: false,
        ..EngineConfig::default()
    }
}

fn brief() -> TaskBrief {
    TaskBrief {
        name: "fake".into(),
        kind: "softmax".into(),
        description: "A fake task.".into(),
        backend: "cpu".into(),
        signature: "void kern(float* x)".into(),
        language: "c".into(),
    }
}

fn code(body: &str) -> Reply {
    Ok(format!("```c\n{body}\n```"))
}

fn user_prompt(req: &ChatRequest) -> &str {
    &req.messages[0].content
}

#[test]
fn unusable_replies_are_failed_attempts_and_every_call_is_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let llm = Arc::new(scripted(vec![
        ("wm-init", vec![Ok("I would start with a plan.".into())]),
        (
            CODE_ROLE_TAG,
            vec![
                Ok("Sure, here is the idea without any code.".into()),
                code("fail;kern"),
                Err(LlmError::Http {
                    provider: "scripted".into(),
                    status: 500,
                    message: "upstream broke".into(),
                    retry_after: None,
                }),
                code("score=1.5;kern"),
                code("score=1.4;kern;other"),
                Ok("```c\nvoid wrong_name(void) {}\n```".into()),
                code("score=2.0;kern"),
            ],
        ),
        (
            "wm-refine",
            vec![Ok(
                "Updating.\n{\"ops\": [{\"op\": \"insert_node\", \"parent_id\": \"n2\", \
                 \"node\": {\"node_id\": \"next\", \"action\": {\"title\": \"follow-up\", \
                 \"difficulty_1_to_5\": 2, \"score_0_to_1\": 0.95}}}]}"
                    .into(),
            )],
        ),
        ("wm-propose", vec![Ok("{not json at all".into())]),
    ]));
    let proposer = LlmProposer::new(llm.clone(), prompts(), inputs(), LlmSettings::new());
    let eval = FakeEvaluator {
        calls: AtomicUsize::new(0),
    };
    let policy = KSearchPolicy::default();
    let engine = Engine::new(
        cfg(8),
        store(tmp.path()),
        &proposer,
        &eval,
        &policy,
        brief(),
        &NoProgress,
    );
    let out = engine.run(Some("score=1;kern")).unwrap();
    let store = engine.into_store();
    assert_eq!(out.rounds_used, 8);

    let seen = llm.seen();
    // The first init reply had no JSON: a second init call carried the reason.
    let inits: Vec<&ChatRequest> = seen.iter().filter(|r| r.role_tag == "wm-init").collect();
    assert_eq!(inits.len(), 2);
    assert!(
        user_prompt(inits[1]).contains("no JSON object"),
        "{}",
        user_prompt(inits[1])
    );
    let state = store.get_state("engine").unwrap().unwrap();
    let wm: WorldModel = serde_json::from_value(state["wm"].clone()).unwrap();
    assert_eq!(wm.kernel_summary(), "fake kernel");
    // Four initial nodes, one of them under another node's label: the cap of 3 per edit does
    // not apply to the first tree.
    let deeper = wm
        .nodes()
        .iter()
        .find(|n| n.label.as_deref() == Some("a-deeper"))
        .unwrap();
    let a = wm
        .nodes()
        .iter()
        .find(|n| n.label.as_deref() == Some("a"))
        .unwrap();
    assert_eq!(deeper.parent.as_ref(), Some(&a.id));
    // The refine reply (original dialect, with prose) inserted a child under the solved node.
    assert!(
        wm.nodes()
            .iter()
            .any(|n| n.label.as_deref() == Some("next")),
        "{}",
        wm.render_tree()
    );

    // Every call is an exchange in the store, failed ones with their error.
    let xs = store.exchanges().unwrap();
    assert_eq!(xs.len(), seen.len());
    let failed: Vec<_> = xs.iter().filter(|x| x.exchange.error.is_some()).collect();
    assert_eq!(failed.len(), 1);
    assert!(failed[0].exchange.error.as_deref().unwrap().contains("500"));
    assert!(xs.iter().all(|x| x.exchange.prompt.contains("## USER")));
    assert!(xs
        .iter()
        .any(|x| x.exchange.role == "code-spec-action" || x.exchange.role == "code-base-action"));
    // Usage: 120 tokens per answered call, nothing for the failed one.
    let answered = (seen.len() - 1) as u64;
    let usage = proposer.usage();
    assert_eq!(usage.calls, answered);
    assert_eq!(usage.input_tokens, 100 * answered);
    assert_eq!(usage.output_tokens, 20 * answered);
    let totals = store.usage_totals().unwrap();
    assert_eq!(totals.input_tokens, usage.input_tokens);
    assert_eq!(totals.output_tokens, usage.output_tokens);

    // The reason a code reply was unusable reaches the next code prompt.
    let codes: Vec<&ChatRequest> = seen
        .iter()
        .filter(|r| r.role_tag == CODE_ROLE_TAG)
        .collect();
    assert!(
        user_prompt(codes[1]).contains("no fenced code block"),
        "{}",
        user_prompt(codes[1])
    );
    assert!(user_prompt(codes[3]).contains("the model call failed"));
    assert!(
        !user_prompt(codes[4]).contains("## Problems with your previous reply"),
        "cleared after a good reply"
    );
    assert!(user_prompt(codes[6]).contains("does not define the entry point `kern`"));
    // The failing kernel ended the first cycle: its log reaches the too-hard prompt.
    let too_hard = seen.iter().find(|r| r.role_tag == "wm-too-hard").unwrap();
    assert!(user_prompt(too_hard).contains("wrong answer on r64c1000"));
    assert!(user_prompt(too_hard).contains("fail;kern"));

    // Unusable replies left no candidate; the others were evaluated in order.
    let sources: Vec<String> = store
        .candidates()
        .unwrap()
        .iter()
        .filter(|c| c.kind == CandidateKind::Attempt)
        .map(|c| store.source(&c.source_id).unwrap())
        .collect();
    assert_eq!(
        sources,
        vec![
            "fail;kern\n",
            "score=1.5;kern\n",
            "score=1.4;kern;other\n",
            "score=2.0;kern\n",
            "score=1.1;kern\n"
        ]
    );
    assert_eq!(
        out.failed, 4,
        "one incorrect kernel and three unusable replies"
    );
    let events = store.events_after(0).unwrap();
    let proposer_errors = events.iter().filter(|e| e.kind == "proposer_error").count();
    assert!(proposer_errors >= 4, "{events:?}");
}

#[test]
fn an_unusable_first_plan_falls_back_to_one_action() {
    let llm = Arc::new(scripted(vec![(
        "wm-init",
        vec![
            Ok("".into()),
            Ok("{\"kernel_summary\": \"x\", \"ops\": []}".into()),
            Ok(
                "```json\n{\"ops\": [\n  {\"op\": \"delete\", \"node_id\": \"n1\"},\n]}\n```"
                    .into(),
            ),
        ],
    )]));
    let proposer = LlmProposer::new(llm.clone(), prompts(), inputs(), LlmSettings::new());
    let wm = proposer.init_world_model(&brief()).unwrap();
    // Each retry carried the exact reason the previous reply could not be used.
    let inits = llm.seen();
    assert_eq!(inits.len(), 3);
    assert!(user_prompt(&inits[1]).contains("the reply is empty"));
    assert!(user_prompt(&inits[2]).contains("no executable action"));
    assert_eq!(wm.frontier().len(), 1);
    assert!(
        wm.kernel_summary().contains("could not be used"),
        "{}",
        wm.kernel_summary()
    );
    assert!(
        wm.kernel_summary()
            .contains("trailing comma at line 3 column 1"),
        "{}",
        wm.kernel_summary()
    );
    let xs = proposer.drain_exchanges();
    assert_eq!(xs.len(), 3);
    assert!(proposer.drain_exchanges().is_empty(), "drained once");
}

#[test]
fn a_spent_budget_stops_the_run_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let llm: Arc<dyn ChatProvider> = Arc::new(scripted(vec![]));
    let client = Arc::new(
        Client::new(
            llm,
            ClientConfig {
                retry: RetryPolicy {
                    max_attempts: 1,
                    ..RetryPolicy::default()
                },
                max_in_flight: 1,
                budget: Budget {
                    max_tokens: Some(1500),
                    max_cost_usd: None,
                },
                cache_dir: None,
                prices: PriceTable::builtin(),
            },
        )
        .unwrap(),
    );
    let proposer = LlmProposer::new(client.clone(), prompts(), inputs(), LlmSettings::new())
        .with_client(client.clone());
    let eval = FakeEvaluator {
        calls: AtomicUsize::new(0),
    };
    let policy = KSearchPolicy::default();
    let engine = Engine::new(
        cfg(50),
        store(tmp.path()),
        &proposer,
        &eval,
        &policy,
        brief(),
        &NoProgress,
    );
    let out = engine.run(Some("score=1;kern")).unwrap();
    assert!(out.stop_reason.contains("budget"), "{}", out.stop_reason);
    assert!(out.rounds_used < 50);
    let store = engine.into_store();
    // The refused call is stored too, and spending never passed the limit by more than one
    // call's worth.
    let xs = store.exchanges().unwrap();
    assert!(xs.iter().any(|x| x
        .exchange
        .error
        .as_deref()
        .is_some_and(|e| e.contains("budget"))));
    let usage = proposer.usage();
    assert_eq!(
        usage.input_tokens + usage.output_tokens,
        client.totals().tokens()
    );
    assert!(client.totals().tokens() <= 1500 + 120);
}

#[test]
fn the_lint_hook_rejects_before_evaluation_and_tells_the_next_prompt() {
    let tmp = tempfile::tempdir().unwrap();
    let llm = Arc::new(scripted(vec![(
        CODE_ROLE_TAG,
        vec![
            code("score=3;kern(); __syncthreads();"),
            code("score=1.5;kern"),
        ],
    )]));
    let proposer = LlmProposer::new(llm.clone(), prompts(), inputs(), LlmSettings::new());
    let eval = FakeEvaluator {
        calls: AtomicUsize::new(0),
    };
    let policy = KSearchPolicy::default();
    let lint = |src: &str| -> Vec<String> {
        if src.contains("__syncthreads") {
            vec!["error [gpu-identifiers-in-c] line 1: `__syncthreads` is GPU code".into()]
        } else {
            Vec::new()
        }
    };
    let engine = Engine::new(
        cfg(2),
        store(tmp.path()),
        &proposer,
        &eval,
        &policy,
        brief(),
        &NoProgress,
    )
    .with_lint(&lint);
    engine.run(Some("score=1;kern")).unwrap();
    let store = engine.into_store();
    // Seed and the second proposal were evaluated; the linted one was not.
    assert_eq!(eval.calls.load(Ordering::SeqCst), 2);
    let attempts: Vec<_> = store
        .candidates()
        .unwrap()
        .into_iter()
        .filter(|c| c.kind == CandidateKind::Attempt)
        .collect();
    let ev = store.evaluation_for(attempts[0].id).unwrap().unwrap();
    assert_eq!(ev.status, "lint_failed");
    assert_eq!(
        ev.result["lint"][0],
        "error [gpu-identifiers-in-c] line 1: `__syncthreads` is GPU code"
    );
    let codes: Vec<ChatRequest> = llm
        .seen()
        .into_iter()
        .filter(|r| r.role_tag == CODE_ROLE_TAG)
        .collect();
    let second = user_prompt(&codes[1]);
    assert!(second.contains("Status: lint_failed"), "{second}");
    assert!(
        second.contains("rejected by static checks before compiling"),
        "{second}"
    );
    assert!(second.contains("`__syncthreads` is GPU code"), "{second}");
}

/// Edit blocks for an evolve diff: `search` replaced by `replace`, after a note line.
fn blocks(search: &str, replace: &str) -> Reply {
    Ok(format!(
        "Note: {search} to {replace}\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"
    ))
}

#[test]
fn evolve_diffs_apply_to_the_parent_and_blocks_that_do_not_apply_are_sent_back() {
    let tmp = tempfile::tempdir().unwrap();
    let llm = Arc::new(scripted(vec![(
        CODE_ROLE_TAG,
        vec![
            // Round 1: a block that matches nothing, then (told why) one that does.
            blocks("score=9;kern", "score=3;kern"),
            blocks("score=1;kern", "score=1.5;kern"),
            // Round 2: two replies that do not apply: a failed attempt with the reason.
            Ok("I would rather not use blocks.".into()),
            blocks("no such line", "x"),
            // Round 3: the reason of round 2 is in the prompt; a good edit on the last line.
            blocks("// end", "// end of kernel"),
        ],
    )]));
    let proposer = LlmProposer::new(llm.clone(), prompts(), inputs(), LlmSettings::new());
    let eval = FakeEvaluator {
        calls: AtomicUsize::new(0),
    };
    let policy = KSearchPolicy::default();
    let config = EngineConfig {
        strategy: ksearch_search::settings::Strategy::Evolve,
        seed: 3,
        evolve: ksearch_search::evolve::EvolveSettings {
            islands: 1,
            diff_ratio: 1.0,
            ..Default::default()
        },
        ..cfg(3)
    };
    let engine = Engine::new(
        config,
        store(tmp.path()),
        &proposer,
        &eval,
        &policy,
        brief(),
        &NoProgress,
    );
    let out = engine.run(Some("score=1;kern\nbody();\n// end\n")).unwrap();
    let store = engine.into_store();
    assert_eq!((out.rounds_used, out.passed, out.failed), (3, 3, 1));

    let prompts = llm.prompts(CODE_ROLE_TAG);
    assert_eq!(prompts.len(), 5, "round 1 and round 2 were asked twice");
    assert!(prompts[0].contains("# Evolve: improve a kernel with targeted edits"));
    assert!(prompts[0].contains("## Parent kernel"));
    let told = &prompts[1];
    assert!(
        told.contains("the edit blocks do not apply")
            && told.contains("block 1: its SEARCH text is not in the kernel"),
        "{told}"
    );
    assert!(
        prompts[3].contains("the reply has no SEARCH/REPLACE block"),
        "{}",
        prompts[3]
    );
    // Round 2's failure reaches round 3's prompt, with the island's other program for ideas.
    assert!(prompts[4].contains("## Problems with your previous reply"));
    assert!(prompts[4].contains("## Other kernels of the population, for ideas"));
    // Each child is its parent with the blocks applied.
    let children: Vec<(String, String)> = store
        .candidates()
        .unwrap()
        .iter()
        .filter(|c| c.kind == CandidateKind::Attempt)
        .map(|c| {
            let parent = store
                .candidate(c.parent_candidate.unwrap())
                .unwrap()
                .unwrap();
            (
                store.source(&parent.source_id).unwrap(),
                store.source(&c.source_id).unwrap(),
            )
        })
        .collect();
    assert_eq!(children.len(), 2);
    assert_eq!(
        children[0],
        (
            "score=1;kern\nbody();\n// end\n".to_string(),
            "score=1.5;kern\nbody();\n// end\n".to_string()
        )
    );
    assert_eq!(
        children[1].1,
        children[1].0.replace("// end", "// end of kernel")
    );
    assert_eq!(out.best.map(|b| b.score), Some(1.5));
    let xs = store.exchanges().unwrap();
    assert!(xs.iter().any(|x| x.exchange.role == "code-evolve"));
    // Nothing was planned: evolve leaves the world model alone.
    assert!(llm
        .seen()
        .iter()
        .all(|r| r.role_tag == CODE_ROLE_TAG || r.role_tag == "wm-init"));
}

#[test]
fn a_reply_must_define_every_entry_point_the_workloads_call() {
    let tmp = tempfile::tempdir().unwrap();
    let llm = Arc::new(scripted(vec![(
        CODE_ROLE_TAG,
        vec![
            code("score=3;kern_f16"),
            code("score=1.5;kern_f16;kern_bf16"),
        ],
    )]));
    let mut per_dtype = inputs();
    per_dtype.task.entry = "kern_{dtype}".into();
    per_dtype.task.entries = vec!["kern_bf16".into(), "kern_f16".into()];
    let proposer = LlmProposer::new(llm.clone(), prompts(), per_dtype, LlmSettings::new());
    let eval = FakeEvaluator {
        calls: AtomicUsize::new(0),
    };
    let policy = KSearchPolicy::default();
    let engine = Engine::new(
        cfg(2),
        store(tmp.path()),
        &proposer,
        &eval,
        &policy,
        brief(),
        &NoProgress,
    );
    engine.run(Some("score=1;kern_f16;kern_bf16")).unwrap();
    // Round 1's reply, missing `kern_bf16`, was refused before evaluation (a failed attempt);
    // round 2's, told why, was evaluated.
    assert_eq!(eval.calls.load(Ordering::SeqCst), 2);
    let codes: Vec<ChatRequest> = llm
        .seen()
        .into_iter()
        .filter(|r| r.role_tag == CODE_ROLE_TAG)
        .collect();
    let second = user_prompt(&codes[1]);
    assert!(
        second.contains("does not define the entry point `kern_bf16`"),
        "{second}"
    );
    assert!(
        second.contains("define all of `kern_bf16`, `kern_f16`"),
        "{second}"
    );
}
