//! SIGINT and SIGTERM to `multigrain launch`: noted by a handler, acted on
//! by the monitor loop.

use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{Context, Result};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

/// The last signal received and not yet taken; 0 when none.
static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn note(signal: libc::c_int) {
    PENDING.store(signal, Ordering::SeqCst);
}

/// Installs the handler for SIGINT and SIGTERM.
pub fn install() -> Result<()> {
    let action = SigAction::new(
        SigHandler::Handler(note),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe; nothing in this process relies on another
        // disposition of SIGINT or SIGTERM. Children get the default
        // disposition back at exec.
        unsafe { sigaction(signal, &action) }
            .with_context(|| format!("cannot install a handler for {signal}"))?;
    }
    Ok(())
}

/// The signal received since the last call, if any.
pub fn take() -> Option<Signal> {
    match PENDING.swap(0, Ordering::SeqCst) {
        0 => None,
        n => Signal::try_from(n).ok(),
    }
}
