//! A request to stop, shared between whoever hears it (the CLI's Ctrl-C handler) and the code
//! that must stop: a harness process being waited for is killed with its process group, and
//! the search stops at its next step, leaving a run that `resume` continues.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A flag set once, from any thread or a signal handler (a store into an atomic), and read
/// by everything that waits.
#[derive(Clone, Debug, Default)]
pub struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// An interrupt sharing `flag` (what a signal handler stores into).
    pub fn from_flag(flag: Arc<AtomicBool>) -> Self {
        Self(flag)
    }
}
