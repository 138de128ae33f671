//! Waiting: a thread waits for its completion while it serves the protocol queue
//! (see the parent module), synchronization events, the lock cache's fast path, and
//! the protocol thread's loop.

use super::*;
use crate::runtime::spin::WaitKind;

/// Messages a waiting thread handles before its wait is shown to the progress watchdog
/// even if it has not left its busy polls (see [`Core::wait`]).
const WATCH_AFTER_MESSAGES: u32 = 64;

/// What one busy poll that reads the INIs' sockets is charged against a wait's budget of
/// busy polls ([`crate::runtime::spin`], which counts polls of shared memory, ≈ 20 ns
/// each). On a cluster with INIs every poll of a wait reads the network as well as
/// its queues — instead of one in 8 to 32 (paper 000 §3.4's interval, which left a reply
/// that had arrived ≈ 1 µs unread: a probe build stamping each step of a remote fault
/// through INIs read the page's arrival to its read 1.2–2.0 µs, 0.7–0.8 µs polling at
/// every poll) — and such a poll took ≈ 0.45 µs (a `recvmsg`; a `recvfrom` of ≈ 0.3 µs
/// since the sixty-fourth session), so it counts as 8: the
/// busy phase before a waiting thread yields lasts about as long as before. Measured
/// (fifty-seventh session, Zen 3 VM, alternating runs against polling every poll in
/// fault waits only, median of per-pair ratios, pairs): Water 512 × 50 over UDP on 4×1
/// 0.976 (6), 2×2 0.965 (6), 2×1 0.918 (6); EM3D over UDP on 2×1 1.025 (8), 4×1 1.015
/// (6); `bench dsm`'s rows through INIs, two alternating runs: the remote read fault
/// 1.71 / 1.69 → 1.60 / 1.63 × its floor, the lock hand-off 2.19 / 2.12 → 2.11 / 2.07 ×
/// its floor. Every wait polling the network at every poll but charged 1 a poll spun
/// ten times longer before yielding and cost Water 1.40 × the time on 4×1 udp and 1.075 ×
/// on 2×2 udp, where compute threads share CPUs. A cluster without INIs polls as before.
const NETWORK_POLL_WEIGHT: u32 = 8;

/// A yield that returns within this long found no other thread wanting the CPU (≈ 0.3 µs
/// here; one that ran another thread returns after that thread's turn, tens of µs or
/// more). See [`Core::wait`]: a thread alone on its CPU busy-polls again after serving a
/// message.
const ALONE_YIELD: Duration = Duration::from_micros(2);

impl Core {
    /// Waits until wait `seq` of `slot` completes, handling every message that arrives
    /// meanwhile (see the module documentation); `kind` names what it waits for, whose
    /// busy-poll budget it uses and adapts (see `runtime::spin`).
    pub(crate) fn wait(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        slot: u32,
        seq: u32,
        kind: WaitKind,
        context: &dyn Fn() -> String,
    ) -> Result<(), DsmError> {
        let s = self.slots.get(slot);
        if s.is_done(seq) {
            return Ok(());
        }
        // The progress watchdog hears of the wait once it outlasts the busy polls (or
        // a long run of messages handled meanwhile): a stall is seconds, and most
        // waits end within microseconds, without the context string and the
        // watchdog's mutex.
        let mut watched = None;
        let mut handled = 0u32;
        let _counted = Counted::enter(&self.waiting);
        let start = FastInstant::now();
        let spin_until = start + self.tuning.spin;
        let mut next_check = start + self.tuning.liveness_period;
        // The thread learns how long its waits last (see `spin`).
        let budget = s.busy_budget(kind);
        let full = budget.map_or(self.tuning.busy_polls, |b| b.polls());
        let mut busy = full;
        let mut alone = false;
        let network = ep.polls_network();
        // What each busy poll takes from the budget.
        let weight = if network { NETWORK_POLL_WEIGHT } else { 1 };
        let ended = || {
            if let Some(b) = budget {
                b.record(start.elapsed(), self.tuning.busy_polls);
            }
        };
        loop {
            if s.is_done(seq) {
                ended();
                return Ok(());
            }
            self.note_poll();
            if network {
                ep.poll_network_next();
            }
            if let Some(m) = ep.try_recv() {
                self.dispatch(ops, ep, m)?;
                // Requests come in streams (a sweep of faults, a lock's queue): a thread
                // that found itself alone on its CPU at its last yield busy-polls again
                // after serving one, instead of putting a yield's system call before the
                // next. Where clusters share a CPU its yields run other threads, are
                // slow, and it yields on: busy polls re-armed after every message
                // regardless cost Water 512 × 50 on 4×1 3-8 %. Measured (forty-third
                // session, alternating builds): `bench dsm`'s remote read fault over
                // shared memory with the home polling 6.36-6.53 → 6.06-6.28 µs (6 pairs,
                // the row alone); applications within their spread (Water 4×1 udp 0.984,
                // 4×1 shm 1.010 and 0.996, 2×2 udp 0.986; EM3D 2×1 shm 0.995; 10-16
                // pairs each).
                if alone {
                    busy = full;
                }
                handled += 1;
                if handled == WATCH_AFTER_MESSAGES && watched.is_none() {
                    watched = Some(self.waits.enter(context()));
                }
                continue;
            }
            if busy > 0 {
                // The reply to a request usually comes within microseconds: poll
                // without giving the CPU away first (a yield to another runnable thread
                // costs a context switch each way).
                busy = busy.saturating_sub(weight);
                std::hint::spin_loop();
                continue;
            }
            if watched.is_none() {
                watched = Some(self.waits.enter(context()));
            }
            if self.is_failed() {
                return Err(self.failure_error(Some(context())));
            }
            let now = FastInstant::now();
            // More waiting threads than CPUs (hundreds of compute threads per core):
            // yielding ones would keep every core busy and starve the threads that
            // produce what they wait for, so they sleep at once.
            let crowded = self.waiting.load(Ordering::Relaxed) > self.cpus;
            if now < spin_until && !crowded {
                // Then yield rather than burn the core: with more runnable threads than
                // cores (compute threads of several clusters on one machine) the thread
                // that will produce our message may be waiting for this very core.
                // The poll after a yield also polls the network (INIs): its system call
                // is small beside the yield's, and a request from another machine is
                // then seen within one yield instead of 8 to 32 of them.
                ep.poll_network_next();
                std::thread::yield_now();
                alone = now.elapsed() < ALONE_YIELD;
                continue;
            }
            if now >= next_check {
                self.check_liveness(ops, ep, context)?;
                next_check = now + self.tuning.liveness_period;
            }
            let slept = FastInstant::now();
            // At most one thread per CPU sleeps on the doorbell, serving the protocol
            // queue when it rings; the others park until their own completion. Every
            // message rings the doorbell, which wakes all its sleepers: with 256
            // sleepers per cluster each message cost 256 wake-ups and the cores did
            // little else (Water 8 × 1 on 2 × 256 threads took minutes).
            if self.doorbell_sleepers.fetch_add(1, Ordering::SeqCst) >= self.cpus {
                self.doorbell_sleepers.fetch_sub(1, Ordering::SeqCst);
                if s.prepare_park(seq) {
                    ended();
                    return Ok(());
                }
                std::thread::park_timeout(self.tuning.liveness_period.max(self.tuning.slice));
                s.awake();
                bump(&self.counters.sleeps, 1);
                bump(&self.counters.sleep_ns, slept.elapsed().as_nanos() as u64);
                continue;
            }
            if s.prepare_sleep(seq) {
                self.doorbell_sleepers.fetch_sub(1, Ordering::SeqCst);
                ended();
                return Ok(());
            }
            let m = ep.recv_timeout(self.tuning.slice);
            self.doorbell_sleepers.fetch_sub(1, Ordering::SeqCst);
            s.awake();
            bump(&self.counters.sleeps, 1);
            bump(&self.counters.sleep_ns, slept.elapsed().as_nanos() as u64);
            if let Some(m) = m {
                self.dispatch(ops, ep, m)?;
            }
        }
    }

    /// Passes a synchronization event (built from its token) to the machine and waits
    /// for its completion.
    ///
    /// An acquire or release first serves what has arrived (see `serve_arrived`); a
    /// barrier arrival does not: it is flushed and sent first, and what arrived is
    /// served while the thread waits for the departure. The last cluster to arrive is
    /// the barrier's critical path, and what waits for it then is mostly the updates the
    /// other clusters sent as they arrived (EM3D: ≈ 40 pages of 4 KiB each way a
    /// phase), which it now applies while the barrier manager applies its own — in
    /// parallel instead of before its flush. Measured on EM3D (2×1 over shared memory,
    /// 20,000 nodes per thread, 100 iterations, 8 alternating runs; issue-10 log,
    /// thirty-seventh session): from the last cluster's entry into a barrier to each
    /// cluster's exit, median a phase, 0.26 and 0.29 ms → 0.22 and 0.24 ms; the run
    /// 0.96–0.97 × (16 alternating pairs). The same order for acquires and releases was
    /// slower on Water (a request or release that leaves before a recall already
    /// received is handled moves the lock a message later).
    pub(crate) fn sync(
        self: &Arc<Self>,
        ops: &RegionOps,
        event: impl FnOnce(SyncToken) -> Event,
        context: &dyn Fn() -> String,
    ) -> Result<(), DsmError> {
        if self.is_failed() {
            return Err(self.failure_error(Some(context())));
        }
        self.with_thread(|slot, ep| {
            let s = self.slots.get(slot);
            let seq = s.next_seq();
            let event = event(SyncToken(token(slot, seq)));
            let kind = if matches!(event, Event::Barrier { .. }) {
                WaitKind::Barrier
            } else {
                self.serve_arrived(ops, ep)?;
                WaitKind::Lock
            };
            self.handle(ops, ep, event, None)?;
            self.wait(ops, ep, slot, seq, kind, context)
        })
    }

    /// Takes `lock` for the calling thread from the runtime's lock cache, if it is
    /// there idle (see [`LockCache`]); `false`: ask the machine ([`Core::sync`]).
    ///
    /// First serves what has arrived on the protocol queue, as [`Core::sync`] does: a
    /// thread that keeps taking a cached lock (a holder waiting for its turn, say) must
    /// see the other cluster's recall of it, or the lock stays here until the protocol
    /// thread gets a CPU (measured with `bench dsm`'s hand-off, 2 vCPUs: 3.3 acquires
    /// per hand-off over shared memory and 12 over UDP without this, 1.4 and 2.6 before
    /// the cache).
    ///
    /// # Errors
    /// As [`Core::dispatch`] (a message that cannot be handled).
    #[inline]
    pub(crate) fn try_cached_acquire(
        self: &Arc<Self>,
        ops: &RegionOps,
        lock: u32,
    ) -> Result<bool, DsmError> {
        if self.is_failed() {
            return Ok(false);
        }
        self.with_thread(|slot, ep| {
            self.serve_arrived(ops, ep)?;
            if !self.lock_cache.try_acquire(lock) {
                return Ok(false);
            }
            self.slots.get(slot).note_runtime_acquire();
            Ok(true)
        })
    }

    /// Handles what has arrived on the protocol queue, before an acquire or release: a
    /// thread that keeps taking a lock cached in its cluster never waits, so it must
    /// notice a recall of that lock itself (with every thread busy, the protocol thread
    /// may not run for a while).
    ///
    /// # Errors
    /// As [`Core::dispatch`].
    fn serve_arrived(&self, ops: &RegionOps, ep: &Endpoint) -> Result<(), DsmError> {
        self.note_poll();
        while let Some(m) = ep.try_recv() {
            self.dispatch(ops, ep, m)?;
        }
        Ok(())
    }

    /// Notes that a thread of this cluster is polling the protocol queue from inside
    /// the runtime (see [`Core::serve`]).
    #[inline]
    pub(crate) fn note_poll(&self) {
        // Read-mostly: the line is written only after the protocol thread cleared it.
        if !self.polled.load(Ordering::Relaxed) {
            self.polled.store(true, Ordering::Relaxed);
        }
    }

    /// Serves the protocol queue until `stop` is set (the protocol thread's loop).
    ///
    /// The cluster's own threads poll the queue whenever they are in the runtime
    /// (every lock operation, fault and barrier, and all the time while they wait), so
    /// while one of them polled during its last nap of [`Tuning::handover`] the
    /// protocol thread only naps again (not registered on the queue's doorbell: senders
    /// pay no wake-up, and it takes no CPU from them). Once the cluster's threads have
    /// been away for a whole nap — they compute, or sleep — it serves: it handles what
    /// is queued, polls (yielding) for `spin` after the last message it handled, then
    /// sleeps in the message layer's blocking receive, woken by the next message. A
    /// wake-up whose message a polling thread took ends that receive
    /// ([`Endpoint::recv_until_woken`]), and the loop looks at `polled` again: a receive
    /// that slept on was woken by every message of a run of remote faults whose threads
    /// polled for their replies, preempting them (`bench dsm`, remote read fault over
    /// shared memory with the home polling: 23–28 µs instead of 7–9 µs in whole rounds;
    /// applications within their spread). (Measured on Water 512 × 50, 2×1
    /// over shared memory: a protocol thread spinning after every message, as before,
    /// took a quarter of each core; one always asleep on the doorbell made every
    /// message a futex wake-up; see `docs/measurements.md`, *Applications*.)
    ///
    /// `thread_index` is the protocol thread's index for the `static` INI policy.
    pub(crate) fn serve(&self, ops: &RegionOps, spin: Duration, thread_index: usize) {
        let ep = self.new_endpoint(Duration::ZERO);
        ep.set_thread_index(thread_index);
        crate::runtime::slots::set_protocol_thread();
        let mut reported = false;
        let mut last = FastInstant::now();
        let mut handle = |m, last: &mut FastInstant| {
            *last = FastInstant::now();
            if let Err(e) = self.dispatch(ops, &ep, m)
                && !reported
            {
                reported = true;
                self.fail_with(&ep, &e);
                tracing::error!("cluster {}: protocol thread: {e}", self.me);
            }
        };
        while !self.stop.load(Ordering::Acquire) {
            if let Some(m) = ep.try_recv() {
                handle(m, &mut last);
                continue;
            }
            if self.polled.swap(false, Ordering::Relaxed) {
                std::thread::sleep(self.tuning.handover);
                continue;
            }
            if last.elapsed() < spin {
                std::thread::yield_now();
                continue;
            }
            if let Some(m) = ep.recv_until_woken(Duration::from_millis(100)) {
                handle(m, &mut last);
            }
        }
    }
}

/// Counts a thread in a counter for as long as the guard lives.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn enter(counter: &'a AtomicUsize) -> Counted<'a> {
        counter.fetch_add(1, Ordering::Relaxed);
        Counted(counter)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
