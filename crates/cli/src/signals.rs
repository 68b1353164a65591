//! Ctrl-C (SIGINT) and SIGTERM during `run` and `resume`: the first asks the run to stop (the
//! harness in flight is killed with its process group, the engine stops at its next step and
//! the run stays resumable); a second ends ksearch at once, as the signal would have.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use ksearch_eval::Interrupt;

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
pub fn interrupt_on_signals() -> Interrupt {
    let flag = FLAG.get_or_init(|| Arc::new(AtomicBool::new(false)));
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: installs a handler that does only async-signal-safe work.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
    Interrupt::from_flag(flag.clone())
}
