//! How many times a waiting thread busy-polls before it polls yielding its CPU.
//!
//! A thread alone on its CPU loses nothing by busy-polling for the reply it waits for
//! (`Tuning::busy_polls`, ≈ 20 µs): most replies over shared memory come within that,
//! and a yield to another runnable thread costs a context switch each way. A thread that
//! shares its CPU with other compute threads — more compute threads than CPUs, as the
//! default job's 2×2 or a 4×1 job on a 2-vCPU machine — takes the busy polls of a wait
//! that outlasts them from a thread that could compute: Water 512 × 50 on 2×2 over UDP
//! has ≈ 15,600 lock waits longer than 20 µs a run (75 µs on average), up to 0.3 of its
//! 1.6 CPU-seconds in busy polls. So each thread's budget adapts as an adaptive mutex's
//! spin does (glibc's `PTHREAD_MUTEX_ADAPTIVE_NP`): it doubles after a wait that the
//! tuning's `busy_polls` would have covered (≈ 20 µs) and halves after a longer one,
//! between [`SpinBudget::MIN`] and `busy_polls`. Alone on its CPU a thread with a
//! small budget loses little: a yield with no other runnable thread returns at once
//! (≈ 0.3 µs), and it polls again.
//!
//! Measured (fortieth session; alternating runs against the build before, median of
//! per-pair ratios (min–max), pairs): Water 512 × 50 on 4×1 over UDP 0.738 (0.62–0.93,
//! 8), on the default 2×2 job 0.940 (0.83–1.04, 10), on 2×1 over UDP 1.012 (0.98–1.09,
//! 8; the build before the per-kind budgets); EM3D on 2×2 1.032 (0.84–1.17, 10), on 2×1 over UDP 0.998 (0.87–1.15, 10). The
//! variants tried on the way — adaptive only where a cluster has more compute threads
//! than CPUs, a wait judged by whether it ended within the polls made (a shrunk budget
//! then never grew back), one budget for every kind of wait, a fixed budget of 30 polls
//! — and their numbers are in `docs/issue-10-log.md`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// What a thread waits for. Page faults and locks keep a [`SpinBudget`] each, since
/// their waits differ — a fault's reply is one round trip (≈ 7 µs over shared memory,
/// 20–40 µs over UDP), a lock's grant waits for its holders elsewhere. Barriers always
/// busy-poll the full `busy_polls`: their departure follows the last arrival by one
/// message, which the polls catch when this cluster arrived last, and adapting them too
/// cost EM3D on 2×2 3.6 % (10 rounds, against 0.3 % with barriers fixed; fortieth
/// session).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitKind {
    /// A page fault served by another cluster.
    Fault = 0,
    /// A lock's acquire or release.
    Lock = 1,
    /// A barrier's departure (no budget: always the full busy polls).
    Barrier = 2,
}

/// The number of [`WaitKind`]s that keep a budget.
pub(crate) const ADAPTIVE_KINDS: usize = 2;

/// One thread's busy-poll budget (written only by the slot's owner; atomic because the
/// slot is shared).
#[derive(Debug)]
pub(crate) struct SpinBudget(AtomicU32);

impl SpinBudget {
    /// The fewest busy polls a wait starts with (≈ 0.3 µs).
    pub(crate) const MIN: u32 = 16;

    /// About how long a busy poll takes when nothing arrives.
    pub(crate) const POLL: Duration = Duration::from_nanos(20);

    /// A budget of `max` polls (a thread starts as if alone on its CPU).
    pub(crate) fn new(max: u32) -> Self {
        SpinBudget(AtomicU32::new(max.max(Self::MIN)))
    }

    /// The busy polls of the next wait.
    #[inline]
    pub(crate) fn polls(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }

    /// Records a wait of `waited`: one that `max` busy polls would have covered (at
    /// [`SpinBudget::POLL`] each) doubles the budget, up to `max`; a longer one halves
    /// it, down to [`SpinBudget::MIN`]. Judged by the wait's length, not by whether it
    /// ended within the polls it made: a budget that has shrunk below the length of the
    /// waits it serves would never see a wait end within it and never grow back (a
    /// thread whose replies come in 7 µs, after a run of long waits).
    #[inline]
    pub(crate) fn record(&self, waited: Duration, max: u32) {
        let b = self.polls();
        let next = if waited <= Self::POLL * max {
            b.saturating_mul(2).min(max.max(Self::MIN))
        } else {
            (b / 2).max(Self::MIN)
        };
        self.0.store(next, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_halves_after_long_waits_and_doubles_after_short_ones() {
        let (short, long) = (Duration::from_micros(7), Duration::from_micros(75));
        let b = SpinBudget::new(1000);
        assert_eq!(b.polls(), 1000, "starts with the tuning's busy polls");
        b.record(long, 1000);
        assert_eq!(b.polls(), 500);
        for _ in 0..20 {
            b.record(long, 1000);
        }
        assert_eq!(b.polls(), SpinBudget::MIN, "never below the floor");
        // A 7 µs wait is longer than 16 polls but within 1000: the budget grows back.
        b.record(short, 1000);
        assert_eq!(b.polls(), 2 * SpinBudget::MIN);
        for _ in 0..20 {
            b.record(short, 1000);
        }
        assert_eq!(b.polls(), 1000, "never above the tuning's busy polls");
        b.record(SpinBudget::POLL * 1000, 1000);
        assert_eq!(
            b.polls(),
            1000,
            "a wait exactly as long as the polls counts as short"
        );
    }

    #[test]
    fn faults_and_locks_index_a_budget_and_barriers_none() {
        // `Slot::busy_budget` indexes an array of ADAPTIVE_KINDS budgets by the kind.
        assert!((WaitKind::Fault as usize) < ADAPTIVE_KINDS);
        assert!((WaitKind::Lock as usize) < ADAPTIVE_KINDS);
        assert_ne!(WaitKind::Fault as usize, WaitKind::Lock as usize);
        assert!((WaitKind::Barrier as usize) >= ADAPTIVE_KINDS);
    }

    #[test]
    fn a_maximum_below_the_floor_is_the_floor() {
        let b = SpinBudget::new(0);
        assert_eq!(b.polls(), SpinBudget::MIN);
        b.record(Duration::ZERO, 0);
        assert_eq!(b.polls(), SpinBudget::MIN);
    }
}
