//! A request to stop, shared between whoever hears it (the CLI's Ctrl-C handler) and the code
//! that must stop: a harness process being waited for is killed with its process group, and
//! the search stops at its next step, leaving a run that `resume` continues.
//!
//! [`on_signals`] makes Ctrl-C (SIGINT) and SIGTERM request it (`run` and `resume`): the first
//! asks the run to stop; a second ends the process at once, as the signal would have.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

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

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
static HEARD: AtomicU32 = AtomicU32::new(0);
const NOTICE: &[u8] =
    b"\nksearch: stopping (the evaluation in flight is abandoned; Ctrl-C again quits at once)\n";

extern "C" fn on_signal(signal: libc::c_int) {
    // Only async-signal-safe work: atomics, write(2), signal(2), raise(3).
    if HEARD.fetch_add(1, Ordering::SeqCst) == 0 {
        if let Some(flag) = FLAG.get() {
            flag.store(true, Ordering::SeqCst);
        }
        // SAFETY: writes a static buffer to fd 2.
        unsafe {
            libc::write(2, NOTICE.as_ptr().cast(), NOTICE.len());
        }
    } else {
        // SAFETY: restores the default disposition and re-raises: ksearch dies of the signal
        // (its harness children follow through PR_SET_PDEATHSIG).
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            libc::raise(signal);
        }
    }
}

/// The interrupt that SIGINT and SIGTERM request from now on (one per process).
pub fn on_signals() -> Interrupt {
    let flag = FLAG.get_or_init(|| Arc::new(AtomicBool::new(false)));
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: installs a handler that does only async-signal-safe work.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
    Interrupt::from_flag(flag.clone())
}
