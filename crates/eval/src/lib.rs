//! ksearch-eval: evaluates candidate kernels, trustworthily, outside the ksearch process.
//!
//! It owns the Python environment the harness runs in ([`harness_env`]), spawning one harness
//! process per operation in its own process group with a scrubbed environment and a private
//! result channel ([`harness`]), the JSON protocol types ([`protocol`]), the [`Evaluator`] the
//! search calls, the choice of a default backend from the harness probe ([`backends`]),
//! plain-text result tables ([`report`]), the `ksearch bench` measurement of a kernel against
//! native implementations ([`bench`]) and its report ([`bench_report`]), the whole-model Mamba
//! bench's launcher and report ([`mamba_bench`]) and what `ksearch doctor` checks
//! ([`doctor`]). It does not know who asks.

pub mod backends;
pub mod bench;
pub mod bench_report;
pub mod bottleneck;
pub mod doctor;
pub mod error;
pub mod evaluator;
pub mod harness;
pub mod harness_env;
pub mod interrupt;
pub mod judge;
pub mod mamba_bench;
pub mod protocol;
pub mod report;
pub mod request;
pub mod scratch_dir;
pub mod yardstick;

pub use bench::{BenchRequest, BenchResult, BenchSettings, BenchWorkload, Measurement};
pub use error::EvalError;
pub use evaluator::{Evaluator, EvaluatorConfig, SandboxMode};
pub use interrupt::Interrupt;
pub use protocol::{EvalResult, Status, Violation, ViolationClass, WorkloadResult};
pub use request::{
    default_timeout, device_for, fresh_secret_seed, is_gpu_backend, parse_positive_seconds,
    EvalRequest, TimingPreset, WorkloadSet, DEFAULT_TIMEOUT, DEFAULT_TRIALS, GPU_DEFAULT_TIMEOUT,
};
pub use yardstick::{Anchor, Yardstick};
