//! The two futex operations the doorbells need. Shared (not `FUTEX_PRIVATE_FLAG`) so that
//! a doorbell in a shared-memory segment wakes a receiver in another process.

use crate::sync::AtomicU32;
use std::time::Duration;

/// Blocks while `*word == expected`, at most `timeout` (forever if `None`). Returns on a
/// wake-up, a value change, a signal or the timeout; callers re-check their condition.
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live, 4-byte aligned atomic for the duration of the call (it is
    // borrowed); FUTEX_WAIT only reads it. `ts_ptr` is null or points to `ts`, alive here.
    // Errors (EAGAIN: value changed, EINTR, ETIMEDOUT) all mean "re-check", so the return
    // value is deliberately ignored.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            ts_ptr,
            0usize,
            0u32,
        );
    }
}

/// Wakes every thread blocked in [`wait`] on `word`, in any process that maps it.
pub(crate) fn wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a live aligned atomic; FUTEX_WAKE does not access user memory
    // beyond hashing the address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        );
    }
}
