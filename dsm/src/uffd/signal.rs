//! The process-wide `SIGBUS` handler of [`Delivery::Signal`](super::Delivery::Signal).
//!
//! With `UFFD_FEATURE_SIGBUS` the kernel does not queue a fault event; it sends `SIGBUS`
//! (`BUS_ADRERR`, `si_addr` = the exact faulting address) to the thread that faulted. The
//! handler here finds the region holding the address in a fixed table, decodes read/write
//! and missing/write-protect from the x86-64 page-fault error code the kernel saves in
//! the signal frame (`REG_ERR`: bit 0 = protection violation on a present page, bit 1 =
//! write), and calls the region's resolver on the faulting thread. When it returns, the
//! access re-executes.
//!
//! Every other `SIGBUS` — an address outside every region, a non-`BUS_ADRERR` code
//! (hardware memory error, truncated file mapping reported differently), one sent by
//! `kill` — goes to the disposition that was in place before: a previous handler is
//! called; the default action (or an ignored fault) resets `SIGBUS` to `SIG_DFL` and
//! returns so the faulting instruction re-executes and the process dies with the usual
//! `SIGBUS` and core dump (a signal sent by `kill` is re-raised instead).
//!
//! Async-signal safety: the path allocates nothing and takes no lock. The table is an
//! array of atomics; a slot is protected by a user count: the handler increments it
//! *before* loading the region pointer, the owner clears the pointer *before* waiting for
//! the count to reach zero (both sequentially consistent, so one of them sees the other),
//! so the region outlives every handler using it. `errno` is saved and restored.

use super::region::Shared;
use super::resolver::{Access, Fault, FaultContext, FaultKind};
use nix::errno::Errno;
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// How many regions with [`Delivery::Signal`](super::Delivery::Signal) may exist at once.
pub const MAX_SIGNAL_REGIONS: usize = 64;

/// The `SIGBUS` handler could not be installed or used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignalError {
    /// `sigaction(2)` failed.
    #[error("sigaction(SIGBUS) failed: {0}")]
    Sigaction(Errno),
    /// Something replaced the DSM `SIGBUS` handler after it was installed; faults of
    /// signal-delivery regions would no longer be served.
    #[error(
        "the DSM SIGBUS handler has been replaced by another one (another library called \
         sigaction(SIGBUS)); install yours before creating DSM regions, it will be chained"
    )]
    Replaced,
    /// [`MAX_SIGNAL_REGIONS`] regions already use signal delivery.
    #[error("at most {MAX_SIGNAL_REGIONS} regions can use signal delivery at once")]
    TableFull,
    /// The fault's read/write bit is only decoded on x86-64.
    #[error("signal delivery needs the x86-64 page-fault error code; use Delivery::Threads")]
    Unsupported,
}

struct SlotState {
    /// Hint for a quick range check; authoritative is the target's layout.
    start: AtomicUsize,
    end: AtomicUsize,
    target: AtomicPtr<Shared>,
    users: AtomicUsize,
}

static SLOTS: [SlotState; MAX_SIGNAL_REGIONS] = [const {
    SlotState {
        start: AtomicUsize::new(0),
        end: AtomicUsize::new(0),
        target: AtomicPtr::new(ptr::null_mut()),
        users: AtomicUsize::new(0),
    }
}; MAX_SIGNAL_REGIONS];
/// Slots at or above this index have never been used.
static HIGH_WATER: AtomicUsize = AtomicUsize::new(0);
/// Serialises installation, registration and unregistration (never taken by the handler).
static REGISTRY: Mutex<()> = Mutex::new(());
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// The `SIGBUS` disposition found when the handler was installed.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

fn lock_registry() -> std::sync::MutexGuard<'static, ()> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// The current `SIGBUS` disposition.
fn current_action() -> Result<libc::sigaction, SignalError> {
    let mut old = MaybeUninit::<libc::sigaction>::uninit();
    // SAFETY: a null new action makes sigaction(2) only report the current one into
    // `old`, which is writable memory of the right type.
    let r = unsafe { libc::sigaction(libc::SIGBUS, ptr::null(), old.as_mut_ptr()) };
    Errno::result(r).map_err(SignalError::Sigaction)?;
    // SAFETY: sigaction returned 0, so it filled in `old`.
    Ok(unsafe { old.assume_init() })
}

fn handler_address() -> usize {
    on_sigbus as extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) as usize
}

/// Installs the process-wide `SIGBUS` handler that serves faults of regions created with
/// [`Delivery::Signal`](super::Delivery::Signal); idempotent, and called by
/// [`Region::new`](super::Region::new) when needed.
///
/// The disposition found at installation is kept and receives every `SIGBUS` that is not
/// a fault in such a region (its `sa_mask` and `SA_RESETHAND`/`SA_NODEFER` flags are not
/// re-applied when chaining). Install other `SIGBUS` handlers *before* this one: a
/// handler installed later replaces it, and region creation then fails with
/// [`SignalError::Replaced`]. The handler runs on the faulting thread's own stack (not an
/// alternate signal stack), since resolvers need room for page buffers.
pub fn install_sigbus_handler() -> Result<(), SignalError> {
    if !cfg!(target_arch = "x86_64") {
        return Err(SignalError::Unsupported);
    }
    let _guard = lock_registry();
    if INSTALLED.load(Ordering::Acquire) {
        return if current_action()?.sa_sigaction == handler_address() {
            Ok(())
        } else {
            Err(SignalError::Replaced)
        };
    }
    // Record the previous disposition before ours can run.
    let previous = current_action()?;
    let _ = PREVIOUS.set(previous);
    let action = SigAction::new(
        SigHandler::SigAction(on_sigbus),
        SaFlags::empty(),
        SigSet::empty(),
    );
    // SAFETY: `on_sigbus` is async-signal-safe on its own path (atomics only, no
    // allocation, no lock) and chains every signal it does not own to the previous
    // disposition; resolvers it calls follow the `FaultResolver` contract.
    unsafe { sigaction(Signal::SIGBUS, &action) }.map_err(SignalError::Sigaction)?;
    INSTALLED.store(true, Ordering::Release);
    Ok(())
}

/// Whether the DSM `SIGBUS` handler is installed and still the current one.
pub fn sigbus_handler_installed() -> bool {
    INSTALLED.load(Ordering::Acquire)
        && current_action().is_ok_and(|a| a.sa_sigaction == handler_address())
}

/// A region's entry in the signal table; clearing it on drop waits until no handler uses
/// the region.
pub(crate) struct Slot {
    index: usize,
    // Keeps the target alive for as long as the table can point at it.
    _shared: Arc<Shared>,
}

/// Enters `shared` into the table so its faults reach its resolver.
pub(crate) fn register(shared: &Arc<Shared>) -> Result<Slot, SignalError> {
    let _guard = lock_registry();
    if !INSTALLED.load(Ordering::Acquire) {
        return Err(SignalError::Replaced);
    }
    if current_action()?.sa_sigaction != handler_address() {
        return Err(SignalError::Replaced);
    }
    let index = SLOTS
        .iter()
        .position(|s| {
            s.target.load(Ordering::SeqCst).is_null() && s.users.load(Ordering::SeqCst) == 0
        })
        .ok_or(SignalError::TableFull)?;
    let slot = &SLOTS[index];
    let layout = shared.ops.layout();
    slot.start.store(layout.base(), Ordering::Relaxed);
    slot.end.store(layout.end(), Ordering::Relaxed);
    slot.target
        .store(Arc::as_ptr(shared).cast_mut(), Ordering::SeqCst);
    HIGH_WATER.fetch_max(index + 1, Ordering::SeqCst);
    Ok(Slot {
        index,
        _shared: Arc::clone(shared),
    })
}

impl Drop for Slot {
    fn drop(&mut self) {
        let _guard = lock_registry();
        let slot = &SLOTS[self.index];
        slot.target.store(ptr::null_mut(), Ordering::SeqCst);
        while slot.users.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        slot.start.store(0, Ordering::Relaxed);
        slot.end.store(0, Ordering::Relaxed);
        // `_shared` drops after this: no handler can reach it any more.
    }
}

/// Page-fault error code bits (x86-64 `X86_PF_*`).
const PF_PROT: i64 = 1 << 0;
const PF_WRITE: i64 = 1 << 1;

/// Missing/write-protect and read/write from the saved page-fault error code.
fn classify(error_code: i64) -> (FaultKind, Access) {
    let kind = if error_code & PF_PROT != 0 {
        FaultKind::WriteProtect
    } else {
        FaultKind::Missing
    };
    let access = if error_code & PF_WRITE != 0 {
        Access::Write
    } else {
        Access::Read
    };
    (kind, access)
}

#[cfg(target_arch = "x86_64")]
fn error_code(uctx: *mut c_void) -> Option<i64> {
    // SAFETY: for an SA_SIGINFO handler the third argument points to the ucontext_t the
    // kernel saved on this thread's stack, valid until the handler returns; x86-64 Linux
    // stores the page-fault error code in gregs[REG_ERR] for a fault-generated SIGBUS.
    let err =
        unsafe { (*uctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_ERR as usize] };
    Some(err)
}

#[cfg(not(target_arch = "x86_64"))]
fn error_code(_uctx: *mut c_void) -> Option<i64> {
    None
}

/// Serves the fault at `addr` if a registered region holds it.
fn dispatch(addr: usize, uctx: *mut c_void) -> bool {
    let high = HIGH_WATER.load(Ordering::Acquire).min(MAX_SIGNAL_REGIONS);
    for slot in &SLOTS[..high] {
        if addr < slot.start.load(Ordering::Relaxed) || addr >= slot.end.load(Ordering::Relaxed) {
            continue;
        }
        slot.users.fetch_add(1, Ordering::SeqCst);
        let target = slot.target.load(Ordering::SeqCst);
        let served = if target.is_null() {
            false
        } else {
            // SAFETY: a non-null target loaded after incrementing `users` stays alive
            // until `users` drops back: `Slot::drop` clears the pointer and then waits
            // for `users == 0` before releasing its `Arc<Shared>` (SeqCst on both sides).
            let shared = unsafe { &*target };
            match (shared.ops.page_of(addr), error_code(uctx)) {
                (Some(page), Some(err)) => {
                    let (kind, access) = classify(err);
                    let fault = Fault {
                        page,
                        addr,
                        kind,
                        access,
                        context: FaultContext::FaultingThread,
                    };
                    shared.resolver.resolve(&shared.ops, fault);
                    true
                }
                _ => false,
            }
        };
        slot.users.fetch_sub(1, Ordering::Release);
        if served {
            return true;
        }
    }
    false
}

extern "C" fn on_sigbus(signo: c_int, info: *mut libc::siginfo_t, uctx: *mut c_void) {
    let saved_errno = Errno::last_raw();
    // SAFETY: the kernel passes an SA_SIGINFO handler a valid siginfo_t that lives until
    // the handler returns.
    let info_ref = unsafe { &*info };
    let code = info_ref.si_code;
    let served = code == libc::BUS_ADRERR && {
        // SAFETY: a kernel-generated SIGBUS (si_code > 0) carries the sigfault member of
        // the union, whose first field is the faulting address.
        let addr = unsafe { info_ref.si_addr() } as usize;
        dispatch(addr, uctx)
    };
    if !served {
        chain(signo, info, uctx, code);
    }
    Errno::set_raw(saved_errno);
}

/// Hands a signal that is not ours to the disposition found at installation.
fn chain(signo: c_int, info: *mut libc::siginfo_t, uctx: *mut c_void, code: c_int) {
    let sent_by_process = code <= 0; // SI_USER, SI_TKILL, SI_QUEUE, ...
    let previous = PREVIOUS.get();
    let handler = previous.map_or(libc::SIG_DFL, |p| p.sa_sigaction);
    match handler {
        libc::SIG_IGN if sent_by_process => {}
        libc::SIG_DFL | libc::SIG_IGN => {
            // A fault cannot be ignored (the kernel forces the default action when it is
            // blocked or ignored); do the same.
            let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
            // SAFETY: installing SIG_DFL runs no code; sigaction is async-signal-safe.
            let _ = unsafe { sigaction(Signal::SIGBUS, &default) };
            if sent_by_process {
                // Pending until this handler returns, then the default action applies.
                let _ = nix::sys::signal::raise(Signal::SIGBUS);
            }
            // A fault: returning re-executes the access, which now gets the default
            // action (terminate with a core dump).
        }
        f if previous.is_some_and(|p| p.sa_flags & libc::SA_SIGINFO != 0) => {
            // SAFETY: with SA_SIGINFO the recorded handler address is a
            // `void (*)(int, siginfo_t *, void *)` installed by whoever called sigaction.
            let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                unsafe { std::mem::transmute::<usize, _>(f) };
            f(signo, info, uctx);
        }
        f => {
            // SAFETY: without SA_SIGINFO the recorded handler address is a
            // `void (*)(int)` installed by whoever called sigaction.
            let f: extern "C" fn(c_int) = unsafe { std::mem::transmute::<usize, _>(f) };
            f(signo);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_decodes_x86_error_codes() {
        // User-mode read of a not-present page: U=4.
        assert_eq!(classify(4), (FaultKind::Missing, Access::Read));
        // User-mode write of a not-present page: U|W.
        assert_eq!(classify(6), (FaultKind::Missing, Access::Write));
        // User-mode write of a present, write-protected page: U|W|P.
        assert_eq!(classify(7), (FaultKind::WriteProtect, Access::Write));
    }
}
