//! Real-time scheduling of a cluster's DSM protocol thread, batch scheduling of its other
//! threads ([`set_policy`]), and the CPUs a process may run on ([`cpus_in`]).
//!
//! A message that reaches a cluster while all of its threads compute waits for the
//! protocol thread to run. Woken at normal priority, that thread waits for the
//! scheduler to preempt a compute thread, which with more runnable threads than cores
//! can take the rest of a time slice (milliseconds). At real-time priority the wake-up
//! preempts at once, like the interrupt that starts a message handler on a network
//! interface. A real-time protocol thread never busy-waits: it handles what has
//! arrived and sleeps. (The INI threads stay at normal priority: at real-time priority,
//! polling or not, Water and EM3D 2×1 over UDP ran 25–60 % slower, measured
//! 2026-11-25 with alternating binaries.)

use std::io;

use multigrain_cluster_config::ThreadPolicy;

/// Makes the calling thread a real-time thread (`SCHED_FIFO`, priority 1, the lowest
/// real-time priority).
///
/// # Errors
///
/// The OS error: `EPERM` when the process may not (it needs root, `CAP_SYS_NICE`, or
/// an `RLIMIT_RTPRIO` of at least 1).
pub fn make_realtime() -> io::Result<()> {
    set_own(libc::SCHED_FIFO, 1)
}

/// Gives the calling thread `policy` (`dsm.thread_policy`): `SCHED_BATCH` for
/// [`ThreadPolicy::Batch`] — its wake-ups no longer preempt the thread running on its
/// CPU, which keeps its time slice (a waking batch thread runs when that thread blocks or
/// yields, or at the next tick) — or leaves it as it is for [`ThreadPolicy::Normal`].
/// A cluster's compute threads and INI threads take it when they start; the protocol
/// thread, whose wake-ups must preempt ([`make_realtime`]), does not. Any process may
/// make a thread a batch thread; where the call fails the thread keeps its policy (logged
/// at debug level).
pub fn set_policy(policy: ThreadPolicy) {
    if policy != ThreadPolicy::Batch {
        return;
    }
    if let Err(e) = set_own(libc::SCHED_BATCH, 0) {
        tracing::debug!("SCHED_BATCH refused ({e}): the thread keeps its scheduling policy");
    }
}

/// Sets the calling thread's scheduling `policy` and `priority`.
fn set_own(policy: libc::c_int, priority: libc::c_int) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: `pthread_self()` names the calling thread, which is alive for the whole
    // call; `param` is an initialized `sched_param` that outlives the call, and the
    // function only reads it.
    let r = unsafe { libc::pthread_setschedparam(libc::pthread_self(), policy, &param) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r))
    }
}

/// The CPUs of `set`, ascending (e.g. the calling thread's affinity mask, from
/// `nix::sched::sched_getaffinity`).
pub fn cpus_in(set: &nix::sched::CpuSet) -> Vec<usize> {
    (0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's scheduling policy and priority.
    fn own_policy() -> (i32, i32) {
        let (mut policy, mut param) = (0, libc::sched_param { sched_priority: 0 });
        // SAFETY: as in `set_own`; `policy` and `param` are valid out-pointers for the
        // call.
        let r =
            unsafe { libc::pthread_getschedparam(libc::pthread_self(), &mut policy, &mut param) };
        assert_eq!(r, 0);
        (policy, param.sched_priority)
    }

    /// Either the thread becomes real-time, or the refusal is a permission error.
    #[test]
    fn realtime_or_a_permission_error() {
        std::thread::spawn(|| match make_realtime() {
            Ok(()) => assert_eq!(own_policy(), (libc::SCHED_FIFO, 1)),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}"),
        })
        .join()
        .unwrap();
    }

    /// `batch` makes the thread `SCHED_BATCH` (any process may); `normal` leaves it as it
    /// was.
    #[test]
    fn the_batch_policy_is_sched_batch_and_normal_changes_nothing() {
        std::thread::spawn(|| {
            let before = own_policy();
            set_policy(ThreadPolicy::Normal);
            assert_eq!(own_policy(), before);
            set_policy(ThreadPolicy::Batch);
            assert_eq!(own_policy(), (libc::SCHED_BATCH, 0));
        })
        .join()
        .unwrap();
    }

    /// A mask lists its CPUs in ascending order, the highest one the mask holds too.
    #[test]
    fn cpus_in_lists_a_mask_in_order() {
        let mut set = nix::sched::CpuSet::new();
        assert_eq!(cpus_in(&set), Vec::<usize>::new());
        let last = nix::sched::CpuSet::count() - 1;
        for c in [last, 2, 0] {
            set.set(c).unwrap();
        }
        assert_eq!(cpus_in(&set), vec![0, 2, last]);
    }
}
