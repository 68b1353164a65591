//! ksearch-search: the search side of ksearch.
//!
//! - [`world_model`]: the typed world model (a tree of optimisation decisions), the patch
//!   language a proposer uses to edit it, and the text/JSON projections put into prompts.
//! - [`selection`]: policies that pick the next open action from the world model's frontier.
//! - [`engine`]: the K-Search cycle engine (rounds, cycles, stagnation, budgets, resume).
//! - [`evolve`]: the evolve strategy's program database (islands, MAP-Elites grids, elite
//!   archive, migration, parent and inspiration sampling).
//! - [`proposer`]: the `Proposer` interface, the offline proposer (action catalog + template
//!   families) and the LLM proposer (prompt templates over `ksearch-llm` providers).
//! - [`accounting`]: where a finished or running search's time went (wall, evaluations per hour,
//!   time per harness phase, the device's busy fraction), read back from its run store.
//! - [`session`]: setting up a run from its settings (proposer, provider check, lint target,
//!   selection policy, evaluator, engine limits) and running the engine over its store.
//! - [`report`]: a run as text: the outcome printed at its end, `ksearch show`, and the kernel
//!   and README of `ksearch export`; the finish summary read back as a typed [`engine::RunOutcome`].
//!
//! This crate never knows which backend runs a kernel: evaluation goes through
//! [`engine::CandidateEvaluator`].

pub mod accounting;
pub mod compare;
pub mod engine;
pub mod evolve;
pub mod proposer;
pub mod report;
pub mod selection;
pub mod session;
pub mod settings;
pub mod world_model;
