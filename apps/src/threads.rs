//! The plain-threads backend of [`Runtime`]: scoped OS threads in one process, shared
//! arrays of relaxed atomics, `std::sync::Mutex` locks and a barrier whose waiters yield,
//! then sleep on a condition variable (as the DSM runtime's cluster-local barrier does).
//!
//! Clusters are only labels here ([`ThreadsRuntime::with_clusters`]): all threads share
//! hardware-coherent memory, but the apps see the same thread → cluster table they would
//! see on the DSM runtime, so EM3D layouts can be exercised and tested.
//!
//! Relaxed atomic loads and stores compile to plain moves; the happens-before edges the
//! programming model promises come from the mutexes and the barrier (its mutex, and its
//! generation counter: the last arrival bumps it with release ordering, every waiter reads
//! it with acquire ordering).

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::storage::{F64Words, U64Words};
use crate::team::{Runtime, RuntimeError, Team, Topology};

/// A shared `f64` array of the threads backend (each word an `AtomicU64` holding the bits).
#[derive(Debug)]
pub struct AtomicF64s {
    words: Box<[AtomicU64]>,
}

impl AtomicF64s {
    /// `len` words, all `0.0`.
    #[must_use]
    pub fn zeroed(len: usize) -> Self {
        Self {
            words: (0..len).map(|_| AtomicU64::new(0.0f64.to_bits())).collect(),
        }
    }
}

impl F64Words for AtomicF64s {
    #[inline]
    fn len(&self) -> usize {
        self.words.len()
    }

    #[inline]
    fn get(&self, i: usize) -> f64 {
        f64::from_bits(self.words[i].load(Ordering::Relaxed))
    }

    #[inline]
    fn set(&self, i: usize, value: f64) {
        self.words[i].store(value.to_bits(), Ordering::Relaxed);
    }

    #[inline]
    fn get_array<const N: usize>(&self, start: usize) -> [f64; N] {
        let block = &self.words[start..start + N];
        let mut out = [0.0; N];
        for (o, w) in out.iter_mut().zip(block) {
            *o = f64::from_bits(w.load(Ordering::Relaxed));
        }
        out
    }
}

/// A shared `u64` array of the threads backend.
#[derive(Debug)]
pub struct AtomicU64s {
    words: Box<[AtomicU64]>,
}

impl AtomicU64s {
    /// `len` words, all `0`.
    #[must_use]
    pub fn zeroed(len: usize) -> Self {
        Self {
            words: (0..len).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl U64Words for AtomicU64s {
    #[inline]
    fn len(&self) -> usize {
        self.words.len()
    }

    #[inline]
    fn get(&self, i: usize) -> u64 {
        self.words[i].load(Ordering::Relaxed)
    }

    #[inline]
    fn set(&self, i: usize, value: u64) {
        self.words[i].store(value, Ordering::Relaxed);
    }
}

/// Runtime made of plain OS threads in this process.
#[derive(Debug)]
pub struct ThreadsRuntime {
    topology: Topology,
    num_locks: usize,
}

impl ThreadsRuntime {
    /// `num_threads` threads in a single cluster.
    ///
    /// # Errors
    /// [`RuntimeError::BadTopology`] if `num_threads` is zero.
    pub fn new(num_threads: usize) -> Result<Self, RuntimeError> {
        Self::with_clusters(1, num_threads)
    }

    /// `clusters × threads_per_cluster` threads, numbered cluster-major (thread `t` is in
    /// cluster `t / threads_per_cluster`).
    ///
    /// # Errors
    /// [`RuntimeError::BadTopology`] if either count is zero.
    pub fn with_clusters(
        clusters: usize,
        threads_per_cluster: usize,
    ) -> Result<Self, RuntimeError> {
        Ok(Self::with_topology(Topology::uniform(
            clusters,
            threads_per_cluster,
        )?))
    }

    /// Threads grouped as `topology` says.
    #[must_use]
    pub fn with_topology(topology: Topology) -> Self {
        Self {
            topology,
            num_locks: 0,
        }
    }
}

/// Panic payload of a thread released from a barrier or lock because another thread
/// panicked first.
struct Abandoned;

/// Barrier that releases (and fails) every waiter once some thread has panicked.
///
/// A waiter yields its CPU for up to the DSM runtime's default `dsm.wait_spin_us`
/// ([`multigrain_dsm::DsmOptions::DEFAULT_WAIT_SPIN`], 1 ms), watching the generation, before it sleeps on
/// the condition variable — as the DSM runtime's cluster-local barrier does
/// (`dsm/src/runtime/sync.rs`), so `--threads N` and the DSM wait alike — unless the team
/// has more threads than the CPUs this process may use, where it sleeps at once (yielding threads would take the CPUs of the
/// threads still computing). A barrier that always sleeps costs a futex wake-up per
/// waiter per episode (3–18 µs a barrier for two threads on the 2-vCPU development VM,
/// against ≈ 0.5–1.7 µs yielding: EM3D with 16 nodes per thread and 5,000 iterations,
/// forty-eighth session), which made the plain-threads baseline of `bench apps` weaker at
/// barriers than the DSM it is compared with.
struct PoisonBarrier {
    parties: usize,
    /// How long a waiter yields before sleeping (zero: it sleeps at once).
    spin: Duration,
    /// Completed episodes; bumped under `state`'s mutex by the last arrival.
    generation: AtomicU64,
    /// Set under `state`'s mutex by [`PoisonBarrier::poison`].
    poisoned: AtomicBool,
    state: Mutex<BarrierState>,
    wake: Condvar,
}

struct BarrierState {
    arrived: usize,
}

impl PoisonBarrier {
    fn new(parties: usize) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let spin = if parties <= cpus {
            multigrain_dsm::DsmOptions::DEFAULT_WAIT_SPIN
        } else {
            Duration::ZERO
        };
        Self::with_spin(parties, spin)
    }

    fn with_spin(parties: usize, spin: Duration) -> Self {
        Self {
            parties,
            spin,
            generation: AtomicU64::new(0),
            poisoned: AtomicBool::new(false),
            state: Mutex::new(BarrierState { arrived: 0 }),
            wake: Condvar::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, BarrierState> {
        // The state is only mutated in small non-panicking sections; a poisoned mutex
        // still holds consistent data.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn abandon() -> ! {
        resume_unwind(Box::new(Abandoned))
    }

    fn wait(&self) {
        let mut s = self.state();
        if self.poisoned.load(Ordering::Acquire) {
            drop(s);
            Self::abandon();
        }
        let generation = self.generation.load(Ordering::Acquire);
        s.arrived += 1;
        if s.arrived == self.parties {
            s.arrived = 0;
            // Under the mutex: a sleeper checks the generation under it before it waits,
            // so it either sees the new one or is waiting when `notify_all` runs.
            self.generation.fetch_add(1, Ordering::Release);
            drop(s);
            self.wake.notify_all();
            return;
        }
        drop(s);
        let passed = || self.generation.load(Ordering::Acquire) != generation;
        if !self.spin.is_zero() {
            let until = Instant::now() + self.spin;
            loop {
                if passed() {
                    return;
                }
                if self.poisoned.load(Ordering::Acquire) {
                    Self::abandon();
                }
                if Instant::now() >= until {
                    break;
                }
                std::thread::yield_now();
            }
        }
        let mut s = self.state();
        while !passed() && !self.poisoned.load(Ordering::Acquire) {
            s = self
                .wake
                .wait(s)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        drop(s);
        if !passed() {
            Self::abandon();
        }
    }

    fn poison(&self) {
        let s = self.state();
        self.poisoned.store(true, Ordering::Release);
        drop(s);
        self.wake.notify_all();
    }
}

struct Shared {
    topology: Topology,
    barrier: PoisonBarrier,
    locks: Box<[Mutex<()>]>,
}

/// The [`Team`] handle of the threads backend.
pub struct ThreadsTeam {
    id: usize,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ThreadsTeam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadsTeam").field("id", &self.id).finish()
    }
}

impl Team for ThreadsTeam {
    fn thread_id(&self) -> usize {
        self.id
    }

    fn topology(&self) -> &Topology {
        &self.shared.topology
    }

    fn barrier(&self) {
        self.shared.barrier.wait();
    }

    fn lock(&self, id: usize) -> impl Sized + '_ {
        let Some(mutex) = self.shared.locks.get(id) else {
            panic!(
                "lock id {id} was never allocated ({} locks exist)",
                self.shared.locks.len()
            );
        };
        match mutex.lock() {
            Ok(guard) => guard,
            // A previous holder panicked: the job is being abandoned.
            Err(_) => resume_unwind(Box::new(Abandoned)),
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> Option<String> {
    if payload.is::<Abandoned>() {
        None
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        Some((*s).to_owned())
    } else if let Some(s) = payload.downcast_ref::<String>() {
        Some(s.clone())
    } else {
        Some("non-string panic payload".to_owned())
    }
}

impl Runtime for ThreadsRuntime {
    type F64s = AtomicF64s;
    type U64s = AtomicU64s;
    type Team<'t> = ThreadsTeam;

    fn topology(&self) -> &Topology {
        &self.topology
    }

    fn alloc_f64s(&mut self, len: usize) -> Result<AtomicF64s, RuntimeError> {
        Ok(AtomicF64s::zeroed(len))
    }

    fn alloc_u64s(&mut self, len: usize) -> Result<AtomicU64s, RuntimeError> {
        Ok(AtomicU64s::zeroed(len))
    }

    fn alloc_locks(&mut self, count: usize) -> Result<usize, RuntimeError> {
        let first = self.num_locks;
        self.num_locks = first
            .checked_add(count)
            .ok_or_else(|| RuntimeError::Alloc {
                words: count,
                reason: "lock id space exhausted".to_owned(),
            })?;
        Ok(first)
    }

    fn run<T, F>(&mut self, body: F) -> Result<Vec<T>, RuntimeError>
    where
        T: Send,
        F: Fn(&Self::Team<'_>) -> T + Sync,
    {
        run_threads(&self.topology, self.num_locks, body)
    }
}

fn run_threads<T, F>(topology: &Topology, num_locks: usize, body: F) -> Result<Vec<T>, RuntimeError>
where
    T: Send,
    F: Fn(&ThreadsTeam) -> T + Sync,
{
    let n = topology.num_threads();
    let shared = Arc::new(Shared {
        topology: topology.clone(),
        barrier: PoisonBarrier::new(n),
        locks: (0..num_locks).map(|_| Mutex::new(())).collect(),
    });
    let body = &body;
    let mut spawn_error = None;
    let outcomes: Vec<Result<T, Box<dyn Any + Send>>> = std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(n);
        for id in 0..n {
            let mine = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name(format!("compute-{id}"))
                .spawn_scoped(scope, move || {
                    let team = ThreadsTeam { id, shared: mine };
                    let out = catch_unwind(AssertUnwindSafe(|| body(&team)));
                    if out.is_err() {
                        team.shared.barrier.poison();
                    }
                    out
                });
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    // The threads already started would wait for this one forever.
                    shared.barrier.poison();
                    spawn_error = Some(e);
                    break;
                }
            }
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(Err))
            .collect()
    });
    if let Some(e) = spawn_error {
        return Err(RuntimeError::Backend(Box::new(e)));
    }
    let mut results = Vec::with_capacity(n);
    let mut first_abandoned = None;
    for (thread, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Ok(v) => results.push(v),
            Err(payload) => match panic_message(payload.as_ref()) {
                Some(message) => return Err(RuntimeError::ThreadPanicked { thread, message }),
                None => {
                    first_abandoned.get_or_insert(thread);
                }
            },
        }
    }
    if let Some(thread) = first_abandoned {
        return Err(RuntimeError::ThreadPanicked {
            thread,
            message: "abandoned after another thread failed".to_owned(),
        });
    }
    Ok(results)
}

/// A threads runtime whose thread `late` starts its body `delay` after the others: a
/// cluster process that joins late (it built its graph more slowly, it was started
/// later). Tests check that such start-up skew stays out of the apps' timed phases.
#[cfg(test)]
pub(crate) struct LateStart {
    pub(crate) inner: ThreadsRuntime,
    pub(crate) late: usize,
    pub(crate) delay: std::time::Duration,
}

#[cfg(test)]
impl LateStart {
    /// Two threads in one cluster, thread 1 starting `delay` late.
    pub(crate) fn second_of_two(delay: std::time::Duration) -> Self {
        Self {
            inner: ThreadsRuntime::new(2).expect("two threads"),
            late: 1,
            delay,
        }
    }
}

#[cfg(test)]
impl Runtime for LateStart {
    type F64s = AtomicF64s;
    type U64s = AtomicU64s;
    type Team<'t> = ThreadsTeam;

    fn topology(&self) -> &Topology {
        self.inner.topology()
    }

    fn alloc_f64s(&mut self, len: usize) -> Result<AtomicF64s, RuntimeError> {
        self.inner.alloc_f64s(len)
    }

    fn alloc_u64s(&mut self, len: usize) -> Result<AtomicU64s, RuntimeError> {
        self.inner.alloc_u64s(len)
    }

    fn alloc_locks(&mut self, count: usize) -> Result<usize, RuntimeError> {
        self.inner.alloc_locks(count)
    }

    fn run<T, F>(&mut self, body: F) -> Result<Vec<T>, RuntimeError>
    where
        T: Send,
        F: Fn(&Self::Team<'_>) -> T + Sync,
    {
        let (late, delay) = (self.late, self.delay);
        self.inner.run(|team| {
            if team.thread_id() == late {
                std::thread::sleep(delay);
            }
            body(team)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance;

    #[test]
    fn conformance_suite_passes() {
        for (clusters, per) in [(1, 1), (1, 4), (2, 3)] {
            conformance::all(&mut ThreadsRuntime::with_clusters(clusters, per).unwrap());
        }
    }

    #[test]
    fn results_carry_cluster_membership() {
        let mut rt = ThreadsRuntime::with_clusters(2, 3).unwrap();
        let out = rt
            .run(|team| {
                (
                    team.thread_id(),
                    team.topology().cluster_of(team.thread_id()),
                )
            })
            .unwrap();
        assert_eq!(out, [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (5, 1)]);
    }

    /// Runs `f` on its own thread and fails the test if it has not returned within 60 s
    /// (a barrier that loses a wake-up hangs instead of failing).
    fn within_a_minute(what: &str, f: impl FnOnce() + Send + 'static) {
        let (done, finished) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            f();
            let _ = done.send(());
        });
        match finished.recv_timeout(Duration::from_secs(60)) {
            Ok(()) => worker.join().expect("returned"),
            // The worker panicked: its assertion's message is the test's failure.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                if let Err(payload) = worker.join() {
                    resume_unwind(payload);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("{what}: still waiting after 60 s (a barrier hangs)")
            }
        }
    }

    /// Every episode of the barrier, in both of its waiting modes, holds back each thread
    /// until all have arrived and publishes the writes made before it.
    #[test]
    fn barrier_episodes_hold_and_publish_whether_waiters_yield_or_sleep() {
        use std::sync::atomic::AtomicUsize;
        for spin in [Duration::ZERO, Duration::from_secs(10)] {
            within_a_minute(&format!("300 episodes with spin {spin:?}"), move || {
                let parties = 3;
                let barrier = PoisonBarrier::with_spin(parties, spin);
                let count = AtomicUsize::new(0);
                std::thread::scope(|scope| {
                    for t in 0..parties {
                        let (barrier, count) = (&barrier, &count);
                        scope.spawn(move || {
                            let run = catch_unwind(AssertUnwindSafe(|| {
                                for episode in 1..=300 {
                                    if (episode + t) % 7 == 0 {
                                        std::thread::sleep(Duration::from_micros(200));
                                    }
                                    count.fetch_add(1, Ordering::Relaxed);
                                    barrier.wait();
                                    assert_eq!(
                                        count.load(Ordering::Relaxed),
                                        parties * episode,
                                        "thread {t} passed episode {episode} early (spin {spin:?})"
                                    );
                                    barrier.wait();
                                }
                            }));
                            if let Err(payload) = run {
                                // Release the others, as `run_threads` does.
                                barrier.poison();
                                resume_unwind(payload);
                            }
                        });
                    }
                });
            });
        }
    }

    /// A thread waiting at the barrier — yielding or asleep — is released with
    /// `Abandoned` when another thread poisons it, and so is one that arrives later.
    #[test]
    fn poison_releases_waiters_in_either_mode() {
        for spin in [Duration::ZERO, Duration::from_secs(10)] {
            within_a_minute(&format!("poison with spin {spin:?}"), move || {
                let barrier = PoisonBarrier::with_spin(3, spin);
                std::thread::scope(|scope| {
                    let waiter = scope.spawn(|| catch_unwind(AssertUnwindSafe(|| barrier.wait())));
                    std::thread::sleep(Duration::from_millis(50));
                    barrier.poison();
                    let poisoned = Instant::now();
                    let out = waiter.join().expect("the waiter itself does not panic");
                    // Well before the yielding phase (10 s) would end by itself.
                    assert!(
                        poisoned.elapsed() < Duration::from_secs(5),
                        "the waiter (spin {spin:?}) left {:?} after the poison",
                        poisoned.elapsed()
                    );
                    let payload = out.expect_err("a poisoned barrier does not let its waiter pass");
                    assert!(payload.is::<Abandoned>(), "spin {spin:?}");
                });
                let late = catch_unwind(AssertUnwindSafe(|| barrier.wait()));
                assert!(
                    late.expect_err("arrives after the poison")
                        .is::<Abandoned>()
                );
            });
        }
    }

    #[test]
    fn a_panicking_thread_fails_the_run_without_hanging() {
        let mut rt = ThreadsRuntime::new(3).unwrap();
        let err = rt
            .run(|team| {
                if team.thread_id() == 1 {
                    panic!("boom in thread one");
                }
                team.barrier();
                team.barrier();
            })
            .unwrap_err();
        match err {
            RuntimeError::ThreadPanicked { thread, message } => {
                assert_eq!(thread, 1);
                assert!(message.contains("boom"), "{message}");
            }
            other => panic!("unexpected {other}"),
        }
        // The runtime is reusable afterwards.
        assert_eq!(rt.run(|team| team.thread_id()).unwrap(), [0, 1, 2]);
    }

    #[test]
    fn a_panic_while_holding_a_lock_releases_the_waiters() {
        let mut rt = ThreadsRuntime::new(2).unwrap();
        let l = rt.alloc_locks(1).unwrap();
        let err = rt
            .run(|team| {
                if team.thread_id() == 0 {
                    let _g = team.lock(l);
                    panic!("failed under the lock");
                }
                team.barrier();
                let _g = team.lock(l);
            })
            .unwrap_err();
        assert!(err.to_string().contains("failed under the lock"), "{err}");
    }

    #[test]
    fn unallocated_lock_is_reported() {
        let mut rt = ThreadsRuntime::new(1).unwrap();
        let err = rt
            .run(|team| {
                let _g = team.lock(5);
            })
            .unwrap_err();
        assert!(
            err.to_string().contains("lock id 5 was never allocated"),
            "{err}"
        );
    }

    #[test]
    fn zero_threads_is_an_error() {
        assert!(ThreadsRuntime::new(0).is_err());
        assert!(ThreadsRuntime::with_clusters(2, 0).is_err());
    }

    #[test]
    fn block_reads_match_word_reads() {
        let a = AtomicF64s::zeroed(5);
        a.set(2, 1.5);
        a.set(4, -0.0);
        assert_eq!(a.get_array::<3>(2), [1.5, 0.0, -0.0]);
        assert_eq!(a.get_array::<3>(2)[2].to_bits(), (-0.0f64).to_bits());
    }
}
