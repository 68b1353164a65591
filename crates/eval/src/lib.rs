//! ksearch-eval: evaluates candidate kernels, trustworthily, outside the ksearch process.
//!
//! It owns the Python environment the harness runs in ([`harness_env`]), spawning one harness
//! process per operation in its own process group with a scrubbed environment and a private
//! result channel ([`harness`]), the JSON protocol types ([`protocol`]), the [`Evaluator`] the
//! search calls, and plain-text result tables ([`report`]). It does not know who asks.

pub mod error;
pub mod evaluator;
pub mod harness;
pub mod harness_env;
pub mod protocol;
pub mod report;
pub mod request;

pub use error::EvalError;
pub use evaluator::{Evaluator, EvaluatorConfig};
pub use protocol::{EvalResult, Status, Violation, ViolationClass, WorkloadResult};
pub use request::{
    fresh_secret_seed, EvalRequest, TimingPreset, WorkloadSet, DEFAULT_TIMEOUT, DEFAULT_TRIALS,
};
