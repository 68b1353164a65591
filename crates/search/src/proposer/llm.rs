//! The LLM-backed proposer: every step of the loop is one chat call with a rendered prompt
//! (see [`super::prompts`]), and the reply is read leniently.
//!
//! - JSON (world-model init and edits) may come fenced or bare, surrounded by prose; the
//!   balanced-brace scan prefers the object that has the key the step needs (`ops`).
//! - Code comes from a fenced block tagged with the target's language, else from the only
//!   fenced block of the reply.
//! - A reply that cannot be used is a [`ProposerError::Unusable`] with the reason; the reason
//!   is also remembered and shown in the next code prompt, so the model learns what was wrong.
//!   A spent budget is [`ProposerError::Budget`], which stops the run cleanly.
//!
//! Every call, failed ones included, becomes a `ksearch_store::Exchange` that
//! [`Proposer::drain_exchanges`] hands to the engine for the run store.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::Value;

use ksearch_llm::{ChatProvider, ChatRequest, Client, LlmError};
use ksearch_store::Exchange;

use super::diff_edit;
use super::prompts::{
    cut_marked, history_lines, ActionView, AttemptText, InspirationText, PromptContext,
    PromptInputs, PromptRole, PromptSet, RenderedPrompt,
};
use super::{
    CodeRequest, CycleReport, Mutation, MutationRequest, Proposal, Proposer, ProposerError,
    ProposerUsage, Step, TaskBrief,
};
use crate::world_model::{ActionPatch, Edit, NodeId, NodePatch, PatchOp, WorldModel};

/// Characters of the compact world model in code prompts.
const WM_CHARS_CODE: usize = 12_000;
/// Node lines of the plan in edit prompts (the prompt states the cap).
pub const TREE_NODES: usize = 40;
/// Nodes the initial world model may have (the per-edit cap does not apply to it).
const MAX_INIT_NODES: usize = 12;
/// Longest note kept from a code reply's `Note:` line.
const NOTE_CHARS: usize = 200;
/// Calls for one diff child: a reply whose edit blocks do not apply is answered once with
/// what failed, so the model can fix them.
const DIFF_TRIES: u64 = 2;
/// Role tag of every code-writing call. One tag for all four code steps keeps a lenient
/// replay in step even when measurements (and so the step sequence) differ between runs.
pub const CODE_ROLE_TAG: &str = "code";

/// Settings of the proposer.
#[derive(Clone, Debug, Default)]
pub struct LlmSettings {
    /// Output token limit per call; `None` leaves it to the provider.
    pub max_output_tokens: Option<u32>,
    pub temperature: Option<f32>,
    /// Sent as the request seed (mixed with round and sample) for providers that honour it.
    pub seed: Option<u64>,
    /// Init calls before falling back to a one-action tree (each retry carries the reason the
    /// previous reply could not be used).
    pub init_attempts: u32,
}

impl LlmSettings {
    pub fn new() -> Self {
        Self {
            init_attempts: 3,
            ..Self::default()
        }
    }
}

pub struct LlmProposer {
    provider: Arc<dyn ChatProvider>,
    client: Option<Arc<Client>>,
    prompts: PromptSet,
    inputs: PromptInputs,
    settings: LlmSettings,
    exchanges: Mutex<Vec<Exchange>>,
    /// Spending of this session (used when no client is attached).
    tally: Mutex<ProposerUsage>,
    /// Spending of earlier sessions of the run (resume).
    prior: ProposerUsage,
    /// Why the last code replies could not be used; shown in the next code prompt.
    pending: Mutex<Vec<String>>,
}

impl LlmProposer {
    /// `provider` answers the calls (normally a [`ksearch_llm::Recorder`] around a [`Client`]);
    /// `inputs` is the per-run part of every prompt.
    pub fn new(
        provider: Arc<dyn ChatProvider>,
        prompts: PromptSet,
        inputs: PromptInputs,
        settings: LlmSettings,
    ) -> Self {
        Self {
            provider,
            client: None,
            prompts,
            inputs,
            settings,
            exchanges: Mutex::new(Vec::new()),
            tally: Mutex::new(ProposerUsage::default()),
            prior: ProposerUsage::default(),
            pending: Mutex::new(Vec::new()),
        }
    }

    /// Takes token and cost totals from `client` (the one inside `provider`).
    pub fn with_client(mut self, client: Arc<Client>) -> Self {
        self.client = Some(client);
        self
    }

    /// Spending of earlier sessions of this run, added to [`Proposer::usage`].
    pub fn with_prior_usage(mut self, prior: ProposerUsage) -> Self {
        self.prior = prior;
        self
    }

    pub fn inputs(&self) -> &PromptInputs {
        &self.inputs
    }

    /// Renders the prompt for `role`; also used by tests and `ksearch knowledge show`.
    pub fn render(
        &self,
        role: PromptRole,
        ctx: &PromptContext,
    ) -> Result<RenderedPrompt, ProposerError> {
        self.prompts
            .render(role, ctx)
            .map_err(|e| ProposerError::Setup(e.to_string()))
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        // Only bookkeeping happens under these locks.
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One chat call; records the exchange whatever happens.
    fn call(
        &self,
        role: PromptRole,
        prompt: &RenderedPrompt,
        seed_salt: u64,
    ) -> Result<String, ProposerError> {
        let tag = if role.writes_code() {
            CODE_ROLE_TAG
        } else {
            role.tag()
        };
        let mut req = ChatRequest::new(tag, prompt.user.clone()).with_system(prompt.system.clone());
        if let Some(n) = self.settings.max_output_tokens {
            req = req.with_max_tokens(n);
        }
        if let Some(t) = self.settings.temperature {
            req = req.with_temperature(t);
        }
        if let Some(s) = self.settings.seed {
            req = req.with_seed(s ^ seed_salt.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
        let started = Instant::now();
        let result = self.provider.complete(&req);
        let prompt_text = format!("## SYSTEM\n{}\n## USER\n{}", prompt.system, prompt.user);
        let mut x = Exchange {
            role: role.tag().to_string(),
            prompt: prompt_text,
            response: String::new(),
            model: self.provider.model().to_string(),
            provider: self.provider.name().to_string(),
            input_tokens: 0,
            output_tokens: 0,
            cost_usd: 0.0,
            latency_ms: started.elapsed().as_millis() as u64,
            error: None,
            cached: false,
        };
        let out = match result {
            Ok(resp) => {
                x.response = resp.text.clone();
                x.model = resp.model.clone();
                x.latency_ms = resp.latency_ms.max(x.latency_ms);
                x.cached = resp.cached;
                // A cache hit spends nothing; its recorded usage belongs to the first call.
                if !resp.cached {
                    x.input_tokens = resp.usage.input_tokens;
                    x.output_tokens = resp.usage.output_tokens;
                    x.cost_usd = resp.cost_usd;
                }
                let mut t = Self::lock(&self.tally);
                t.calls += 1;
                t.input_tokens += x.input_tokens;
                t.output_tokens += x.output_tokens;
                t.cost_usd += x.cost_usd;
                Ok(resp.text)
            }
            Err(e) => {
                x.error = Some(e.to_string());
                Err(match e.last() {
                    LlmError::BudgetExhausted { reason } => ProposerError::Budget(reason.clone()),
                    LlmError::Http { .. }
                    | LlmError::Timeout { .. }
                    | LlmError::Connection { .. }
                    | LlmError::CommandFailed { .. }
                    | LlmError::Replay { .. }
                    | LlmError::Config(_)
                    | LlmError::Io { .. } => {
                        ProposerError::CallFailed(format!("the model call failed: {e}"))
                    }
                    _ => ProposerError::Unusable(format!("the model call failed: {e}")),
                })
            }
        };
        Self::lock(&self.exchanges).push(x);
        out
    }

    /// The context of an edit prompt: the whole plan with detail on the path to `focus`.
    fn edit_context(&self, wm: &WorldModel, focus: &NodeId, round: u32) -> PromptContext {
        let mut ctx = PromptContext::new(&self.inputs);
        ctx.tree = Some(wm.outline(focus, TREE_NODES));
        ctx.round = round;
        ctx
    }

    /// Asks for an edit and parses it; `None` when the reply holds an empty op list.
    fn ask_edit(
        &self,
        role: PromptRole,
        ctx: &PromptContext,
    ) -> Result<Option<Edit>, ProposerError> {
        let prompt = self.render(role, ctx)?;
        let text = self.call(role, &prompt, u64::from(ctx.round))?;
        let value = parse_json_reply(&text, "ops")
            .map_err(|why| ProposerError::Unusable(format!("{}: {why}", role.tag())))?;
        let edit = Edit::from_json_value(&value).map_err(|errors| {
            ProposerError::Unusable(format!(
                "{}: the edit does not parse: {}",
                role.tag(),
                errors
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
        })?;
        Ok((!edit.ops.is_empty()).then_some(edit))
    }

    fn fallback_world_model(&self, task: &TaskBrief, why: &str) -> WorldModel {
        let mut wm = WorldModel::new_root(
            format!(
                "{} (The model's initial plan could not be used: {why})",
                task.description.trim()
            ),
            vec!["What limits a straightforward kernel on this device?".into()],
        );
        let root = wm.root_id().clone();
        let node = NodePatch {
            label: Some("first-kernel".into()),
            decision: Some(Some("first kernel".into())),
            choice: Some(Some("straightforward, correct implementation".into())),
            overall_rating: Some(5.0),
            confidence: Some(0.3),
            action: Some(ActionPatch {
                title: Some("Write a correct, reasonably fast kernel for the task".into()),
                description: Some(
                    "One pass over the data where possible, vectorisable inner loops.".into(),
                ),
                difficulty: Some(2.0),
                score: Some(Some(0.6)),
                ..ActionPatch::default()
            }),
            ..NodePatch::default()
        };
        // A fixed, valid patch on a fresh root cannot be rejected.
        let _ = wm.insert_child(&root, &node, 0);
        wm
    }

    /// Builds the initial world model from an init reply.
    fn world_model_from(&self, value: &Value) -> Result<WorldModel, String> {
        let summary = value
            .get("kernel_summary")
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim()
            .to_string();
        let questions: Vec<String> = value
            .get("open_questions")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|q| q.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let ops = match value.get("ops") {
            Some(ops) => ops.clone(),
            None => return Err("the reply has no `ops` list of initial actions".into()),
        };
        let edit = Edit::from_json_value(&serde_json::json!({ "ops": ops })).map_err(|errs| {
            errs.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        })?;
        let mut wm = WorldModel::new_root(summary, questions);
        let root = wm.root_id().clone();
        // Initial nodes are inserted as system operations: the per-edit cap of 3 is for
        // later edits, a first plan may hold more. Parents are "root" or earlier labels.
        let mut labels: Vec<(String, NodeId)> = Vec::new();
        let mut rest: Vec<PatchOp> = Vec::new();
        let mut errors: Vec<String> = Vec::new();
        let mut inserted = 0usize;
        for (i, op) in edit.ops.into_iter().enumerate() {
            match op {
                PatchOp::Insert {
                    parent_id, node, ..
                } => {
                    if inserted >= MAX_INIT_NODES {
                        errors.push(format!("op {i}: more than {MAX_INIT_NODES} initial nodes"));
                        continue;
                    }
                    let parent = if parent_id == root || parent_id.as_str().is_empty() {
                        Some(root.clone())
                    } else {
                        labels
                            .iter()
                            .find(|(l, _)| l == parent_id.as_str())
                            .map(|(_, id)| id.clone())
                            .or_else(|| wm.node(&parent_id).map(|n| n.id.clone()))
                    };
                    let Some(parent) = parent else {
                        errors.push(format!("op {i}: unknown parent `{parent_id}`"));
                        continue;
                    };
                    match wm.insert_child(&parent, &node, 0) {
                        Ok(id) => {
                            inserted += 1;
                            if let Some(l) = &node.label {
                                labels.push((l.clone(), id));
                            }
                        }
                        Err(e) => errors.push(format!("op {i}: {e}")),
                    }
                }
                other => rest.push(other),
            }
        }
        if !rest.is_empty() {
            // Updates (e.g. notes on the root) go through the validated path.
            if let Err(errs) = wm.apply_edit(
                &Edit {
                    ops: rest,
                    active_leaf_id: None,
                },
                0,
            ) {
                errors.extend(errs.iter().map(|e| e.to_string()));
            }
        }
        if wm.frontier().is_empty() {
            let mut why = "the initial tree has no executable action".to_string();
            if !errors.is_empty() {
                why.push_str(&format!(" ({})", errors.join("; ")));
            }
            return Err(why);
        }
        Ok(wm)
    }

    fn code_role(step: Step) -> PromptRole {
        match step {
            Step::SpecAction => PromptRole::CodeSpecAction,
            Step::BaseAction => PromptRole::CodeBaseAction,
            Step::Debug => PromptRole::Debug,
            Step::Improve => PromptRole::Improve,
        }
    }

    /// A code reply's source, checked: it must name the task's entry point. Accepted, it clears
    /// the reasons remembered for the next prompt; refused, its reason is remembered.
    fn accept(&self, role: PromptRole, source: &str) -> Result<(), ProposerError> {
        let task = &self.inputs.task;
        // Every name the workloads call where the entry is named per workload, else the one.
        let wanted: Vec<&str> = if task.entries.is_empty() {
            vec![task.entry.as_str()]
        } else {
            task.entries.iter().map(String::as_str).collect()
        };
        let missing: Vec<&str> = wanted
            .into_iter()
            .filter(|e| !e.is_empty() && !mentions_identifier(source, e))
            .collect();
        if !missing.is_empty() {
            let names = missing
                .iter()
                .map(|e| format!("`{e}`"))
                .collect::<Vec<_>>()
                .join(", ");
            let what = if missing.len() > 1 {
                "entry points"
            } else {
                "entry point"
            };
            let why = format!(
                "{}: the code does not define the {what} {names} ({})",
                role.tag(),
                task.signature
            );
            self.remember(&why);
            return Err(ProposerError::Unusable(why));
        }
        Self::lock(&self.pending).clear();
        Ok(())
    }

    fn remember(&self, reason: &str) {
        let mut p = Self::lock(&self.pending);
        p.push(reason.to_string());
        // Only the most recent few matter to the next prompt.
        let n = p.len();
        if n > 3 {
            p.drain(..n - 3);
        }
    }
}

impl Proposer for LlmProposer {
    fn name(&self) -> &str {
        "llm"
    }

    fn init_world_model(&self, task: &TaskBrief) -> Result<WorldModel, ProposerError> {
        let mut ctx = PromptContext::new(&self.inputs);
        let mut last_problem = String::new();
        for attempt in 0..self.settings.init_attempts.max(1) {
            ctx.attempt = attempt + 1;
            let prompt = self.render(PromptRole::WmInit, &ctx)?;
            let text = match self.call(PromptRole::WmInit, &prompt, u64::from(attempt)) {
                Ok(t) => t,
                // Without budget there is no point in asking again; the first code call will
                // stop the run cleanly.
                Err(ProposerError::Budget(reason)) => {
                    return Ok(self.fallback_world_model(task, &format!("budget: {reason}")))
                }
                Err(e) => {
                    last_problem = e.to_string();
                    ctx.feedback = vec![last_problem.clone()];
                    continue;
                }
            };
            let parsed = parse_json_reply(&text, "ops").and_then(|v| self.world_model_from(&v));
            match parsed {
                Ok(wm) => return Ok(wm),
                Err(why) => {
                    last_problem = why;
                    ctx.feedback = vec![format!(
                        "your previous reply could not be used: {last_problem}"
                    )];
                }
            }
        }
        Ok(self.fallback_world_model(task, &last_problem))
    }

    fn propose(
        &self,
        wm: &WorldModel,
        round: u32,
        feedback: &[String],
    ) -> Result<Option<Edit>, ProposerError> {
        let mut ctx = self.edit_context(wm, wm.active_leaf_id(), round);
        ctx.requirements.push(
            "Leave at least one executable open action with priority score above 0.5: concrete, \
             one step, no hard-coded shape."
                .into(),
        );
        if let Some(best) = wm.best_closed() {
            let has_child = wm
                .children(&best.id)
                .iter()
                .any(|c| c.is_open() && c.is_action());
            if !has_child {
                ctx.requirements.push(format!(
                    "The best solved node {} (score {:.3}) has no open child: insert at least one \
                     action under it that continues from its kernel.",
                    best.id,
                    best.solution().map(|s| s.score).unwrap_or(0.0)
                ));
            }
        }
        ctx.feedback = feedback.to_vec();
        self.ask_edit(PromptRole::Propose, &ctx)
    }

    fn write_code(&self, req: &CodeRequest<'_>) -> Result<Proposal, ProposerError> {
        let role = Self::code_role(req.step);
        let mut ctx = PromptContext::new(&self.inputs);
        ctx.round = req.round;
        ctx.attempt = req.attempt;
        ctx.sample = req.sample;
        ctx.action = Some(ActionView::of(req.node));
        if self.inputs.level.has_spec() {
            ctx.world_model = Some(req.wm.compact_json(WM_CHARS_CODE));
        }
        ctx.base = req.base.map(AttemptText::of);
        ctx.current = req.last.map(AttemptText::of);
        ctx.best = req.cycle_best.map(AttemptText::of);
        ctx.history = history_lines(req.history);
        // Improve prompts start from the cycle's best; without one (only after a resume with a
        // lost candidate) fall back to the base.
        if role == PromptRole::Improve && ctx.best.is_none() {
            ctx.best = ctx.base.clone();
        }
        if role == PromptRole::CodeBaseAction && ctx.base.is_none() {
            return Err(ProposerError::Unusable(
                "base+action step without a base solution".into(),
            ));
        }
        ctx.feedback = Self::lock(&self.pending).clone();
        let prompt = self.render(role, &ctx)?;
        let salt =
            (u64::from(req.round) << 32) | (u64::from(req.attempt) << 16) | u64::from(req.sample);
        let text = self.call(role, &prompt, salt).inspect_err(|e| {
            if let ProposerError::Unusable(why) | ProposerError::CallFailed(why) = e {
                self.remember(why);
            }
        })?;
        let source = extract_code(&text, &self.inputs.fence_tags).map_err(|why| {
            let why = format!("{}: {why}", role.tag());
            self.remember(&why);
            ProposerError::Unusable(why)
        })?;
        self.accept(role, &source)?;
        // The model's own note on what this version tries, else the step and the action.
        let note = extract_note(&text).unwrap_or_else(|| {
            let title = req.action.title.lines().next().unwrap_or("");
            format!("{}: {}", role.tag(), cut_marked(title, NOTE_CHARS))
        });
        Ok(Proposal {
            source,
            knobs: None,
            note,
        })
    }

    /// An evolve child: the `evolve` prompt with the parent, the mate and the inspirations. A
    /// diff reply's SEARCH/REPLACE blocks are applied to the parent ([`diff_edit`]); blocks
    /// that do not apply are sent back once with the reason. Other replies carry the whole
    /// kernel in a code block, as any code step.
    fn mutate(&self, req: &MutationRequest<'_>) -> Result<Proposal, ProposerError> {
        let role = PromptRole::Evolve;
        let mut ctx = PromptContext::new(&self.inputs);
        ctx.round = req.round;
        ctx.sample = req.sample;
        ctx.island = req.island;
        ctx.mutation = Some(req.mutation.as_str().to_string());
        ctx.parent = Some(AttemptText::of(req.parent));
        ctx.mate = req.mate.map(AttemptText::of);
        ctx.inspirations = req
            .inspirations
            .iter()
            .map(|i| InspirationText::of(&i.view, i.why))
            .collect();
        ctx.feedback = Self::lock(&self.pending).clone();
        let salt = (u64::from(req.round) << 32) | (0xE << 16) | u64::from(req.sample);
        let tries = if req.mutation == Mutation::Diff {
            DIFF_TRIES
        } else {
            1
        };
        let mut written = Err(String::new());
        let mut text = String::new();
        for attempt in 0..tries {
            let prompt = self.render(role, &ctx)?;
            text = self
                .call(role, &prompt, salt ^ (attempt << 24))
                .inspect_err(|e| {
                    if let ProposerError::Unusable(why) | ProposerError::CallFailed(why) = e {
                        self.remember(why);
                    }
                })?;
            written = match req.mutation {
                Mutation::Diff => diff_edit::apply_reply(&req.parent.source, &text)
                    .map(|applied| applied.source)
                    .map_err(|e| format!("{}: the edit blocks do not apply: {e}", role.tag())),
                Mutation::Full | Mutation::Crossover => {
                    extract_code(&text, &self.inputs.fence_tags)
                        .map_err(|why| format!("{}: {why}", role.tag()))
                }
            };
            match &written {
                Ok(_) => break,
                Err(why) => ctx.feedback = vec![why.clone()],
            }
        }
        let source = written.map_err(|why| {
            self.remember(&why);
            ProposerError::Unusable(why)
        })?;
        self.accept(role, &source)?;
        let note = extract_note(&text).unwrap_or_else(|| {
            format!(
                "{}: {} of candidate {}",
                role.tag(),
                req.mutation.as_str(),
                req.parent.candidate_id
            )
        });
        Ok(Proposal {
            source,
            knobs: None,
            note,
        })
    }

    fn refine(
        &self,
        wm: &WorldModel,
        report: &CycleReport<'_>,
    ) -> Result<Option<Edit>, ProposerError> {
        let Some(best) = report.best else {
            return Ok(None);
        };
        let mut ctx = self.edit_context(wm, report.node_id, report.round);
        ctx.action = wm.node(report.node_id).map(ActionView::of);
        ctx.best = Some(AttemptText::of(best));
        ctx.base = report.base.map(AttemptText::of);
        ctx.attempt = report.attempts;
        ctx.history = history_lines(report.history);
        ctx.feedback = report.feedback.to_vec();
        self.ask_edit(PromptRole::Refine, &ctx)
    }

    fn too_hard(
        &self,
        wm: &WorldModel,
        report: &CycleReport<'_>,
    ) -> Result<Option<Edit>, ProposerError> {
        let mut ctx = self.edit_context(wm, report.node_id, report.round);
        ctx.action = wm.node(report.node_id).map(ActionView::of);
        ctx.current = report.last.map(AttemptText::of);
        ctx.attempt = report.attempts;
        ctx.history = history_lines(report.history);
        ctx.feedback = report.feedback.to_vec();
        self.ask_edit(PromptRole::TooHard, &ctx)
    }

    fn usage(&self) -> ProposerUsage {
        let now = match &self.client {
            Some(c) => {
                let t = c.totals();
                ProposerUsage {
                    calls: t.calls,
                    input_tokens: t.input_tokens,
                    output_tokens: t.output_tokens,
                    cost_usd: t.cost_usd,
                }
            }
            None => *Self::lock(&self.tally),
        };
        ProposerUsage {
            calls: now.calls + self.prior.calls,
            input_tokens: now.input_tokens + self.prior.input_tokens,
            output_tokens: now.output_tokens + self.prior.output_tokens,
            cost_usd: now.cost_usd + self.prior.cost_usd,
        }
    }

    fn drain_exchanges(&self) -> Vec<Exchange> {
        std::mem::take(&mut *Self::lock(&self.exchanges))
    }
}

fn excerpt_note(text: &str) -> String {
    let t = text.trim();
    if t.is_empty() {
        return " (the reply is empty)".into();
    }
    let head: String = t.chars().take(160).collect();
    format!(
        " (reply starts: {:?}{})",
        head,
        if t.chars().count() > 160 { "…" } else { "" }
    )
}

/// Whether `source` holds `ident` as a whole identifier. An entry point named per workload
/// (`attention_{dtype}`: the harness resolves each `{placeholder}` from the workload's
/// parameters) is held when some identifier of the source fits it, each placeholder standing
/// for a non-empty run of identifier characters (`attention_f16`).
fn mentions_identifier(source: &str, ident: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    if !ident.contains('{') {
        return source.match_indices(ident).any(|(i, _)| {
            let before = source[..i].chars().next_back();
            let after = source[i + ident.len()..].chars().next();
            !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
        });
    }
    let parts = ksearch_task::placeholder_pieces(ident);
    source
        .split(|c: char| !is_ident(c))
        .any(|token| !token.is_empty() && fits_parts(token, &parts))
}

/// Whether `token` is `parts` joined by non-empty runs (one between each two pieces). Tokens are
/// ASCII identifiers (mentions_identifier splits on everything else). Each inner piece is taken
/// at its earliest place after the run before it, which finds a fit whenever there is one, in
/// time linear in the token per piece: a reply is the LLM's text, and a backtracking match was
/// exponential in the placeholders.
fn fits_parts(token: &str, parts: &[&str]) -> bool {
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return token.is_empty();
    };
    if parts.len() == 1 {
        return token == *first;
    }
    let Some(rest) = token.strip_prefix(first) else {
        return false;
    };
    let Some(end) = rest.strip_suffix(last).map(str::len) else {
        return false;
    };
    if !rest.is_ascii() {
        return false;
    }
    // `pos`: where the run before the next piece starts; it takes at least one character.
    let mut pos = 0;
    for piece in &parts[1..parts.len() - 1] {
        let from = pos + 1;
        if from > end {
            return false;
        }
        match rest[from..end].find(piece) {
            Some(i) => pos = from + i + piece.len(),
            None => return false,
        }
    }
    end > pos
}

/// A fenced code block: its info-string tag (lower-cased, possibly empty) and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub tag: String,
    pub body: String,
}

/// Every fenced block of `text` (``` or ~~~ fences, any indentation of the opening line).
/// An unclosed last fence runs to the end of the text (replies cut by the token limit).
pub fn fenced_blocks(text: &str) -> Vec<Fence> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        let marker = if trimmed.starts_with("```") {
            "```"
        } else if trimmed.starts_with("~~~") {
            "~~~"
        } else {
            continue;
        };
        let info = trimmed[3..].trim_start_matches(['`', '~']).trim();
        let tag = info
            .split(|c: char| c.is_whitespace() || c == '{' || c == ',')
            .next()
            .unwrap_or("")
            .trim_start_matches('.')
            .to_ascii_lowercase();
        let mut body = Vec::new();
        for l in lines.by_ref() {
            if l.trim_start().starts_with(marker)
                && l.trim().trim_start_matches(['`', '~']).is_empty()
            {
                break;
            }
            body.push(l);
        }
        out.push(Fence {
            tag,
            body: body.join("\n"),
        });
    }
    out
}

/// The kernel source in a code reply: the longest block tagged with one of `tags` (the first
/// tag is the target's own), else the only fenced block. Errors say what was wrong.
pub fn extract_code(text: &str, tags: &[String]) -> Result<String, String> {
    if text.trim().is_empty() {
        return Err("the reply is empty".into());
    }
    let blocks = fenced_blocks(text);
    let tagged: Vec<&Fence> = blocks
        .iter()
        .filter(|b| tags.iter().any(|t| t.eq_ignore_ascii_case(&b.tag)))
        .collect();
    let chosen = if let Some(b) = tagged.iter().max_by_key(|b| b.body.len()) {
        Some(*b)
    } else if blocks.len() == 1 {
        blocks.first()
    } else {
        None
    };
    let want = tags.first().map(String::as_str).unwrap_or("code");
    match chosen {
        Some(b) if b.body.trim().is_empty() => Err(format!("the ```{want} block is empty")),
        Some(b) => Ok(format!("{}\n", b.body.trim_end())),
        None if blocks.is_empty() => Err(format!(
            "the reply has no fenced code block; put the whole file in one ```{want} block"
        )),
        None => Err(format!(
            "the reply has {} fenced blocks and none is tagged `{want}`; send exactly one ```{want} block",
            blocks.len()
        )),
    }
}

/// The note line of a code reply (`Note: …`, outside fenced blocks, markdown emphasis or a
/// list marker allowed), cut at [`NOTE_CHARS`] with a marker; `None` without one.
pub fn extract_note(text: &str) -> Option<String> {
    let mut open: Option<&str> = None;
    for line in text.lines() {
        let t = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| t.starts_with(m));
        if let Some(m) = marker {
            match open {
                None => open = Some(m),
                Some(o) if o == m && t.trim_start_matches(['`', '~']).trim().is_empty() => {
                    open = None
                }
                Some(_) => {}
            }
            continue;
        }
        if open.is_some() {
            continue;
        }
        let bare = t.trim_start_matches(['-', '*', '#', '>', ' ', '_']);
        let Some(head) = bare.get(..5) else {
            continue;
        };
        if head.eq_ignore_ascii_case("note:") {
            let note = bare[5..]
                .trim_start_matches(['*', '_'])
                .trim()
                .trim_end_matches(['*', '_'])
                .trim();
            if !note.is_empty() {
                return Some(cut_marked(note, NOTE_CHARS));
            }
        }
    }
    None
}

/// The JSON object of a world-model reply: the first object with key `key` that
/// [`extract_json`] finds. Otherwise the reason, as exactly as it can be told: serde_json's own
/// message (with line and column) for the first ```json block, or else the reply's outermost
/// `{…}` span, that does not parse (a trailing comma, a missing quote, a cut reply); an object
/// without `key`; no JSON at all.
pub fn parse_json_reply(text: &str, key: &str) -> Result<Value, String> {
    let found = extract_json(text, key);
    if let Some(v) = found.as_ref().filter(|v| v.get(key).is_some()) {
        return Ok(v.clone());
    }
    let fenced: Vec<Fence> = fenced_blocks(text)
        .into_iter()
        .filter(|b| matches!(b.tag.as_str(), "" | "json" | "jsonc") && b.body.contains('{'))
        .collect();
    let candidates: Vec<(String, &str)> = if fenced.is_empty() {
        match (text.find('{'), text.rfind('}')) {
            (Some(a), Some(b)) if a < b => vec![(
                "the reply's JSON (from its first `{` to its last `}`)".to_string(),
                &text[a..=b],
            )],
            _ => Vec::new(),
        }
    } else {
        fenced
            .iter()
            .enumerate()
            .map(|(i, b)| {
                (
                    format!("JSON block {} of the reply", i + 1),
                    b.body.as_str(),
                )
            })
            .collect()
    };
    for (what, body) in &candidates {
        if let Err(e) = serde_json::from_str::<Value>(body.trim()) {
            return Err(format!(
                "{what} does not parse: {e} (line and column count from the start of that JSON); send one valid JSON object"
            ));
        }
    }
    match found {
        Some(Value::Object(_)) => Err(format!(
            "the reply's JSON object has no `{key}` list; send {{\"{key}\": [...]}}"
        )),
        _ => Err(format!(
            "the reply holds no JSON object{}",
            excerpt_note(text)
        )),
    }
}

/// The JSON object in a reply: fenced `json` blocks first, then the whole text, then every
/// balanced `{…}` span (strings and escapes respected). Among the objects that parse, the
/// first one with key `prefer` wins, else the first one.
pub fn extract_json(text: &str, prefer: &str) -> Option<Value> {
    let mut found: Vec<Value> = Vec::new();
    let consider = |s: &str, found: &mut Vec<Value>| {
        if let Ok(v) = serde_json::from_str::<Value>(s.trim()) {
            if v.is_object() || v.is_array() {
                found.push(v);
            }
        }
    };
    for b in fenced_blocks(text) {
        if b.tag.is_empty() || b.tag == "json" || b.tag == "jsonc" {
            consider(&b.body, &mut found);
        }
    }
    consider(text, &mut found);
    for (start, end) in balanced_spans(text.as_bytes()) {
        consider(&text[start..=end], &mut found);
    }
    let preferred = found
        .iter()
        .position(|v| v.get(prefer).is_some())
        .or_else(|| found.iter().position(Value::is_object));
    preferred.map(|i| found.swap_remove(i))
}

/// Every `{` of `bytes` with the `}` that closes it, in order: what a scan from that `{`, as
/// if the text began there, finds when it skips braces inside JSON strings. A `{` never closed
/// is left out.
///
/// Linear time: one scan settles every `{` it meets outside a string (a scan from there would
/// see the same bytes in the same state), so only a `{` inside some scan's string starts a scan
/// of its own. (Scanning from each `{` separately took quadratic time: minutes for a reply
/// holding tens of thousands of unclosed braces, such as long code cut by the token limit.)
fn balanced_spans(bytes: &[u8]) -> Vec<(usize, usize)> {
    const UNKNOWN: usize = usize::MAX;
    const UNCLOSED: usize = usize::MAX - 1;
    let mut end = vec![UNKNOWN; bytes.len()];
    let mut open: Vec<usize> = Vec::new();
    for start in 0..bytes.len() {
        if bytes[start] != b'{' || end[start] != UNKNOWN {
            continue;
        }
        open.clear();
        let mut in_str = false;
        let mut escaped = false;
        for (i, &b) in bytes.iter().enumerate().skip(start) {
            if in_str {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    in_str = false;
                }
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'{' => open.push(i),
                b'}' => {
                    if let Some(o) = open.pop() {
                        end[o] = i;
                    }
                    if open.is_empty() {
                        break;
                    }
                }
                _ => {}
            }
        }
        for &o in &open {
            end[o] = UNCLOSED;
        }
    }
    (0..bytes.len())
        .filter(|&i| bytes[i] == b'{' && end[i] < UNCLOSED)
        .map(|i| (i, end[i]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(t: &[&str]) -> Vec<String> {
        t.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn code_comes_from_the_tagged_block() {
        let reply = "Here is a sketch:\n```text\nnot code\n```\nand the kernel:\n```c\nint f(void) { return 1; }\n```\n";
        assert_eq!(
            extract_code(reply, &tags(&["c"])).unwrap(),
            "int f(void) { return 1; }\n"
        );
        // The only block counts even without a tag; an unclosed fence runs to the end.
        assert_eq!(extract_code("```\nx\n```", &tags(&["c"])).unwrap(), "x\n");
        assert_eq!(
            extract_code("intro\n```C\ny\n", &tags(&["c"])).unwrap(),
            "y\n"
        );
        // The longest of several tagged blocks (a snippet, then the file).
        let two = "```c\nsnippet\n```\n```c\nthe whole file\n```";
        assert_eq!(
            extract_code(two, &tags(&["c"])).unwrap(),
            "the whole file\n"
        );
        let e = extract_code("no code at all", &tags(&["c"])).unwrap_err();
        assert!(e.contains("no fenced code block"), "{e}");
        let e = extract_code("```py\na\n```\n```js\nb\n```", &tags(&["c"])).unwrap_err();
        assert!(e.contains("none is tagged `c`"), "{e}");
        assert!(extract_code("  \n", &tags(&["c"]))
            .unwrap_err()
            .contains("empty"));
        assert!(extract_code("```c\n\n```", &tags(&["c"]))
            .unwrap_err()
            .contains("empty"));
    }

    #[test]
    fn json_is_found_fenced_bare_or_in_prose() {
        let v = extract_json("```json\n{\"ops\": []}\n```", "ops").unwrap();
        assert_eq!(v["ops"], serde_json::json!([]));
        let v = extract_json("{\"ops\": [1]}", "ops").unwrap();
        assert_eq!(v["ops"][0], 1);
        // Prose around it, braces inside strings, and an inner object without `ops` first.
        let text = "Plan: {\"note\": \"a } b\"} then the edit {\"ops\": [{\"op\": \"delete\", \"node_id\": \"n1\"}], \"x\": \"{\"} done";
        let v = extract_json(text, "ops").unwrap();
        assert_eq!(v["ops"][0]["node_id"], "n1");
        // A trailing comma in the outer object: its inner objects parse, the edit does not.
        let broken = "{\"ops\": [{\"op\": \"delete\", \"node_id\": \"n1\"},]}";
        let v = extract_json(broken, "ops").unwrap();
        assert!(v.get("ops").is_none());
        assert!(extract_json("no json here", "ops").is_none());
        assert!(extract_json("", "ops").is_none());
    }

    #[test]
    fn json_replies_that_do_not_parse_get_serde_json_s_message_with_its_position() {
        // A trailing comma in a fenced block: the inner op parses, but the edit does not, and
        // the reason is serde_json's own, with line and column.
        let reply =
            "Here:\n```json\n{\"ops\": [\n  {\"op\": \"delete\", \"node_id\": \"n1\"},\n]}\n```";
        let e = parse_json_reply(reply, "ops").unwrap_err();
        assert!(
            e.contains(
                "JSON block 1 of the reply does not parse: trailing comma at line 3 column 1"
            ),
            "{e}"
        );
        // Bare JSON cut short by the token limit.
        let e = parse_json_reply("Plan: {\"ops\": [{\"op\": \"update\"}", "ops").unwrap_err();
        assert!(
            e.contains("does not parse") || e.contains("no `ops` list"),
            "{e}"
        );
        let e = parse_json_reply("{\"kernel_summary\": \"x\", \"ops\": [1,]}", "ops").unwrap_err();
        assert!(e.contains("the reply's JSON (from its first `{` to its last `}`) does not parse: trailing comma at line 1 column"), "{e}");
        // Valid JSON without the key, and no JSON at all.
        let e = parse_json_reply("{\"edits\": []}", "ops").unwrap_err();
        assert!(e.contains("has no `ops` list"), "{e}");
        let e = parse_json_reply("I cannot help with that.", "ops").unwrap_err();
        assert!(
            e.contains("holds no JSON object") && e.contains("I cannot help"),
            "{e}"
        );
        // A good reply among broken blocks still wins.
        let ok = "```json\n{\"ops\": [],}\n```\nfixed:\n```json\n{\"ops\": []}\n```";
        assert_eq!(
            parse_json_reply(ok, "ops").unwrap()["ops"],
            serde_json::json!([])
        );
    }

    #[test]
    fn the_note_line_comes_from_outside_code_blocks() {
        let reply = "Note: fused the max and sum passes\n```c\n// Note: not this one\nvoid kern(void) {}\n```";
        assert_eq!(extract_note(reply).unwrap(), "fused the max and sum passes");
        assert_eq!(
            extract_note("**Note:** unrolled by 4**\n```c\nx\n```").unwrap(),
            "unrolled by 4"
        );
        assert_eq!(extract_note("```c\nNote: inside\n```\n"), None);
        assert_eq!(extract_note("Here is the kernel.\n```c\nx\n```"), None);
        assert_eq!(extract_note("Note:   \n"), None);
        let long = format!("Note: {}", "y".repeat(300));
        assert!(extract_note(&long)
            .unwrap()
            .ends_with("… [+100 characters]"));
        // Multi-byte text before the colon position cannot split a character.
        assert_eq!(extract_note("Ünïcödé line\nnote: ok"), Some("ok".into()));
    }

    /// The per-`{` scan `balanced_spans` replaced, as the reference it must agree with.
    fn balanced_end_reference(bytes: &[u8], start: usize) -> Option<usize> {
        let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
        for (i, &b) in bytes.iter().enumerate().skip(start) {
            if in_str {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    in_str = false;
                }
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(i);
                    }
                }
                _ => {}
            }
        }
        None
    }

    #[test]
    fn balanced_spans_agree_with_a_scan_from_each_brace() {
        let alphabet = b"{}{}\"\\a ";
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let len = (next() % 40) as usize;
            let text: Vec<u8> = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            let want: Vec<(usize, usize)> = (0..text.len())
                .filter(|&i| text[i] == b'{')
                .filter_map(|i| balanced_end_reference(&text, i).map(|e| (i, e)))
                .collect();
            assert_eq!(
                balanced_spans(&text),
                want,
                "{:?}",
                String::from_utf8_lossy(&text)
            );
        }
    }

    #[test]
    fn many_unclosed_braces_take_linear_time() {
        // Long code cut by the token limit: the per-brace scan took minutes on this.
        let reply = format!(
            "```c\nvoid f() {{\n{}",
            "if (x) { y(\"}\"); }\nwhile (1) {\n".repeat(20_000)
        );
        let started = std::time::Instant::now();
        assert!(extract_json(&reply, "ops").is_none());
        let flat = "{".repeat(200_000);
        assert!(extract_json(&flat, "ops").is_none());
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn identifiers_are_matched_whole() {
        assert!(mentions_identifier("void softmax_f32(int)", "softmax_f32"));
        assert!(!mentions_identifier(
            "void softmax_f32x(int)",
            "softmax_f32"
        ));
        assert!(!mentions_identifier(
            "void my_softmax_f32(int)",
            "softmax_f32"
        ));
    }

    #[test]
    fn an_entry_named_per_workload_is_matched_by_any_resolution() {
        let src = "extern \"C\" int attention_f16(const void* q);\nint attention_bf16(int);";
        assert!(mentions_identifier(src, "attention_{dtype}"));
        assert!(mentions_identifier(
            "int scan_f32_d16(int)",
            "scan_{dtype}_d{d}"
        ));
        // The placeholder stands for something: the bare prefix is not the entry point.
        assert!(!mentions_identifier(
            "int attention_(int)",
            "attention_{dtype}"
        ));
        assert!(!mentions_identifier(
            "int my_attention_f16(int)",
            "attention_{dtype}"
        ));
        assert!(!mentions_identifier(
            "int softmax_f16(int)",
            "attention_{dtype}"
        ));
        assert!(!mentions_identifier(
            "int scan_f32_x16(int)",
            "scan_{dtype}_d{d}"
        ));
        // Adjacent placeholders take a character each; the suffix cannot overlap the prefix.
        assert!(mentions_identifier("int kab(int)", "k{a}{b}"));
        assert!(!mentions_identifier("int ka(int)", "k{a}{b}"));
        assert!(!mentions_identifier("int ab(int)", "ab{x}b"));
        assert!(mentions_identifier("int abxb(int)", "ab{x}b"));
        // Pieces found late in the token: the first place a piece occurs may be the wrong one.
        assert!(mentions_identifier("int a_x_b_y_b_c(int)", "a_{p}_b_{q}_c"));
    }

    #[test]
    fn a_long_identifier_in_a_reply_is_matched_in_linear_time() {
        // The reply is the LLM's: a token of many near-misses must not take long to refuse.
        let token = format!("int {}(int)", "a_".repeat(2000));
        let started = std::time::Instant::now();
        assert!(!mentions_identifier(&token, "a_{p}_{q}_{r}_{s}_b"));
        assert!(started.elapsed() < std::time::Duration::from_millis(200));
    }
}
