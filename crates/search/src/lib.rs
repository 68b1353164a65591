//! ksearch-search: the search side of ksearch.
//!
//! - [`world_model`]: the typed world model (a tree of optimisation decisions), the patch
//!   language a proposer uses to edit it, and the text/JSON projections put into prompts.
//! - [`selection`]: policies that pick the next open action from the world model's frontier.
//!
//! The cycle engine and the proposers live here too (added separately); this crate never knows
//! which backend runs a kernel.

pub mod selection;
pub mod world_model;
