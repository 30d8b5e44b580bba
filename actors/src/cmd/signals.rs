//! SIGINT and SIGTERM counted, not acted on in the handler: the daemon and the sweep look at the
//! count and stop in order. Installed first thing, so a signal that arrives while a command is
//! still starting (loading tasks, recovering a run directory) is not lost.

use std::sync::atomic::{AtomicUsize, Ordering};

/// SIGINTs and SIGTERMs this process received since [`install`].
static SIGNALS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn count_signal(_: libc::c_int) {
    // An atomic add is async-signal-safe; everything else happens where the count is read.
    SIGNALS.fetch_add(1, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM count in [`received`] instead of ending the process.
pub fn install() {
    let handler = count_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only does an atomic add, which is async-signal-safe; signal(2) on
    // Linux (glibc) installs it with BSD semantics (not reset, system calls restarted).
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

/// Signals received so far.
pub fn received() -> usize {
    SIGNALS.load(Ordering::SeqCst)
}
