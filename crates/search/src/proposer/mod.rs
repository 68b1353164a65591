//! Proposers: who writes the world model's ideas and the kernels.
//!
//! The cycle engine asks a [`Proposer`] for five things — an initial world model, new actions,
//! code for an attempt, and tree edits after a cycle that passed (refine) or failed (too hard) —
//! and, under the other strategies, for independent samples (best-of-n) and children of a
//! parent (evolve).
//! The [`offline`] proposer answers from the knowledge pack's action catalog and the task's
//! template family; LLM-backed proposers answer from prompts. The engine never knows which.

pub mod diff_edit;
pub mod llm;
pub mod offline;
pub mod prompts;

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::evolve::Mutation;
use crate::world_model::{Action, Edit, Node, NodeId, WorldModel};

/// What the proposer is told about the task (never the held-out workloads).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TaskBrief {
    pub name: String,
    pub kind: String,
    pub description: String,
    pub backend: String,
    /// Entry-point prototype the code must define.
    pub signature: String,
    /// Source language of candidates (file extension), e.g. `c`.
    pub language: String,
}

/// Which prompt of the original loop an attempt corresponds to (§2.4 of the K-Search notes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Attempt 1 without base code: implement the action from the task spec.
    SpecAction,
    /// Attempt 1 on top of the parent's solution.
    BaseAction,
    /// Later attempt while nothing in this cycle has passed yet.
    Debug,
    /// Later attempt once something in this cycle passed: make it faster.
    Improve,
}

/// A measured summary of one evaluated candidate, as proposers see it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OutcomeSummary {
    pub status: String,
    pub passed: bool,
    pub score: Option<f64>,
    /// The score's interval (docs/search.md, "Scores"); `None` for old results.
    #[serde(default)]
    pub score_interval: Option<[f64; 2]>,
    pub latency_ms: Option<f64>,
    pub speedup_vs_reference: Option<f64>,
    /// Why it failed (violation class and message, compiler output tail, …); empty if passed.
    pub message: String,
    /// Per-workload lines, e.g. `b1h4l256d64: 1.23 ms, 4.1x vs numpy`.
    pub workloads: Vec<String>,
    /// What bounds a passing kernel where it is furthest from the speed of light, in words
    /// (`ksearch_eval::bottleneck`); `None` when nothing was timed or for old results.
    #[serde(default)]
    pub bottleneck: Option<String>,
    /// The class of that bottleneck, for proposers that weigh their options by it; `None` as
    /// for `bottleneck`.
    #[serde(default)]
    pub bottleneck_class: Option<ksearch_eval::bottleneck::Bottleneck>,
    /// The smallest fraction of the speed of light over the timed workloads of a passing
    /// kernel (`ksearch_eval::bottleneck`); what `--stop-at-sol` compares.
    #[serde(default)]
    pub speed_of_light: Option<f64>,
}

/// A stored candidate the proposer may build on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AttemptView {
    pub candidate_id: i64,
    pub source: String,
    pub source_id: String,
    /// Template knobs when the candidate came from a template family.
    pub knobs: Option<Value>,
    pub outcome: OutcomeSummary,
}

/// One attempt of the current cycle, as the next prompts list it: what came of it and what
/// the proposer said it tried, so a model that sees a slower or failed attempt does not write
/// it again.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CycleAttempt {
    /// Attempt number inside the cycle (1-based).
    pub attempt: u32,
    /// Sample index inside the attempt (0-based).
    pub sample: u32,
    /// The recorded candidate; `None` when no code came out of the reply.
    pub candidate_id: Option<i64>,
    /// The proposer's one-line note on the candidate (the model's own note line when its reply
    /// had one).
    pub note: String,
    pub outcome: OutcomeSummary,
    /// `(attempt, sample)` of an earlier attempt of this cycle whose source was identical: the
    /// stored result was reused, nothing was measured again.
    pub duplicate_of: Option<(u32, u32)>,
    /// A candidate of an earlier cycle whose identical source's result was reused.
    pub reused_from: Option<i64>,
}

/// Everything a proposer needs to write one candidate.
#[derive(Clone, Debug)]
pub struct CodeRequest<'a> {
    pub step: Step,
    /// Global round number (1-based): one code-generation step of the budget.
    pub round: u32,
    /// Attempt number inside the cycle (1-based).
    pub attempt: u32,
    /// Sample index inside the attempt (0-based) when several are drawn at once.
    pub sample: u32,
    pub node: &'a Node,
    pub action: &'a Action,
    /// The parent's attached solution, when there is one.
    pub base: Option<&'a AttemptView>,
    /// The previous attempt of this cycle (what debug prompts fix).
    pub last: Option<&'a AttemptView>,
    /// The best passing attempt of this cycle (what improve prompts start from).
    pub cycle_best: Option<&'a AttemptView>,
    /// Every attempt of this cycle so far, in order.
    pub history: &'a [CycleAttempt],
    pub wm: &'a WorldModel,
    /// Content hashes of every source already evaluated in this run: proposing one again
    /// only costs a cache hit, but a proposer that can tell should try something new.
    pub known_sources: &'a BTreeSet<String>,
}

/// A program the evolve strategy shows as an example of what worked, and why it was picked.
#[derive(Clone, Debug)]
pub struct Inspiration {
    pub view: AttemptView,
    /// `top` (among the island's best) or `diverse` (another cell of the island's grid).
    pub why: &'static str,
}

/// Everything a proposer needs to write one child of the evolve strategy.
#[derive(Clone, Debug)]
pub struct MutationRequest<'a> {
    /// Global round number (1-based).
    pub round: u32,
    /// Sample index inside the round (0-based).
    pub sample: u32,
    /// The island the child is for.
    pub island: u32,
    pub mutation: Mutation,
    pub parent: &'a AttemptView,
    /// The second parent of a crossover.
    pub mate: Option<&'a AttemptView>,
    pub inspirations: &'a [Inspiration],
    /// Content hashes of every source already evaluated in this run.
    pub known_sources: &'a BTreeSet<String>,
}

/// One candidate written by a proposer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    pub source: String,
    pub knobs: Option<Value>,
    /// One line on what this candidate tries.
    pub note: String,
}

/// The evidence a refine or too-hard edit is based on.
#[derive(Clone, Debug)]
pub struct CycleReport<'a> {
    pub node_id: &'a NodeId,
    pub round: u32,
    pub attempts: u32,
    pub base: Option<&'a AttemptView>,
    /// The cycle's best passing attempt (refine) or `None` (too hard).
    pub best: Option<&'a AttemptView>,
    /// The last attempt, for too-hard edits.
    pub last: Option<&'a AttemptView>,
    /// Every attempt of the cycle, in order.
    pub history: &'a [CycleAttempt],
    /// Rejection messages of an earlier edit in this step, when the engine asks again.
    pub feedback: &'a [String],
}

#[derive(Debug, thiserror::Error)]
pub enum ProposerError {
    /// A token or money budget is spent: the engine stops the run cleanly.
    #[error("budget exhausted: {0}")]
    Budget(String),
    /// The reply could not be used (unparseable reply, no code block, a refusal, …). The
    /// engine counts it as a failed attempt and goes on.
    #[error("{0}")]
    Unusable(String),
    /// The call itself failed after the client's retries: the service could not be reached,
    /// refused the request (authentication, a bad model name) or timed out, or the command
    /// proposer's program failed. A failed attempt too, but the engine stops the run after
    /// `max_proposer_failures` of them in a row, since retrying will not fix those causes.
    #[error("{0}")]
    CallFailed(String),
    /// The proposer cannot work at all for this task (e.g. no template family offline).
    #[error("{0}")]
    Setup(String),
}

/// Token and money use of a proposer so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProposerUsage {
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
}

/// When a proposer reads what bounds a kernel ([`Proposer::reads_bottlenecks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BottleneckReads {
    /// Each attempt's outcome, as the next attempt is written.
    EveryAttempt,
    /// The cycle's best only, in `refine`.
    AtCycleEnd,
}

/// Writes world-model ideas and kernels. Implementations are shared across the sample threads
/// of one attempt, so they take `&self` and must be `Sync`.
pub trait Proposer: Send + Sync {
    fn name(&self) -> &str;

    /// The initial world model (the root is open; the engine attaches the seed to it).
    fn init_world_model(&self, task: &TaskBrief) -> Result<WorldModel, ProposerError>;

    /// New or re-rated actions at the start of a cycle; `None` means no change.
    fn propose(
        &self,
        wm: &WorldModel,
        round: u32,
        feedback: &[String],
    ) -> Result<Option<Edit>, ProposerError>;

    fn write_code(&self, req: &CodeRequest<'_>) -> Result<Proposal, ProposerError>;

    /// Whether `write_code` is free, quick and a function of its request (no model call, no
    /// budget), so the engine may ask it for a round that has not come yet and compile the
    /// answer while the current candidate is timed (the offline proposer).
    fn writes_ahead(&self) -> bool {
        false
    }

    /// When this proposer reads what bounds a kernel (an outcome's `bottleneck` and its class):
    /// after every attempt (a model shown each attempt's outcome) or only in `refine`, once a
    /// cycle ends (the offline proposer). The engine profiles new bests when they are read.
    fn reads_bottlenecks(&self) -> BottleneckReads {
        BottleneckReads::EveryAttempt
    }

    /// One independent candidate for the best-of-n strategy: `req` is a spec-action request on
    /// the root with no base, history or earlier attempt. A writer of code answers it as any
    /// request; the offline proposer draws a setting of its family at random instead.
    fn sample(&self, req: &CodeRequest<'_>) -> Result<Proposal, ProposerError> {
        self.write_code(req)
    }

    /// One child for the evolve strategy: `req.parent` changed as `req.mutation` says (a
    /// diff, a rewrite, or a crossover with `req.mate`), with the inspirations as examples.
    fn mutate(&self, req: &MutationRequest<'_>) -> Result<Proposal, ProposerError> {
        let _ = req;
        Err(ProposerError::Setup(format!(
            "the {} proposer cannot write children for the evolve strategy",
            self.name()
        )))
    }

    /// After a cycle that attached a solution to `report.node_id`.
    fn refine(
        &self,
        wm: &WorldModel,
        report: &CycleReport<'_>,
    ) -> Result<Option<Edit>, ProposerError>;

    /// After a cycle without any passing attempt.
    fn too_hard(
        &self,
        wm: &WorldModel,
        report: &CycleReport<'_>,
    ) -> Result<Option<Edit>, ProposerError>;

    fn usage(&self) -> ProposerUsage {
        ProposerUsage::default()
    }

    /// Exchanges (prompt, reply, tokens, cost) since the last call, for the run store.
    fn drain_exchanges(&self) -> Vec<ksearch_store::Exchange> {
        Vec::new()
    }
}
