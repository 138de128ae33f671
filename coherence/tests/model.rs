//! Exhaustive model checking (stateright, BFS) of both protocols: a few clusters run
//! small programs; every interleaving of thread steps and message deliveries (the
//! network is unordered) is explored. Each step runs the real machines and executes
//! their actions on simulated page memories (`common`).
//!
//! * hlrc: every read whose last write happens-before it (the program is
//!   data-race-free on that word) returns that write — in particular every read after
//!   an acquire returns the last value released before it; at the end the homes hold
//!   the last writes and every machine is quiescent; no deadlock.
//! * sc: at every state, per page at most one writable copy and then no other valid
//!   copy, and every valid copy equals the latest write (so every read sees the
//!   latest write); same end-state and deadlock checks.
//!
//! `Sometimes` properties show that the interesting states are reachable. The
//! number of distinct states is printed and pinned.

mod common;

use common::{Op, Spec, World};
use multigrain_coherence::{Config, HomePolicy, Protocol};
use stateright::{Checker, Model, Property};

type Cond = fn(&CoherenceModel, &World) -> bool;

struct CoherenceModel {
    spec: Spec,
    sometimes: Vec<(&'static str, Cond)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Step {
    Thread(usize),
    Deliver(usize),
}

impl Model for CoherenceModel {
    type State = World;
    type Action = Step;

    fn init_states(&self) -> Vec<World> {
        vec![World::new(&self.spec)]
    }

    fn actions(&self, s: &World, actions: &mut Vec<Step>) {
        actions.extend(s.runnable(&self.spec).into_iter().map(Step::Thread));
        actions.extend(s.deliverable().into_iter().map(Step::Deliver));
    }

    fn next_state(&self, s: &World, a: Step) -> Option<World> {
        let mut n = s.clone();
        match a {
            Step::Thread(t) => n.step_thread(&self.spec, t),
            Step::Deliver(i) => n.deliver(&self.spec, i),
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut p = vec![
            Property::always(
                "no protocol error and every race-free read is correct",
                |_, s: &World| s.error.is_none(),
            ),
            Property::always(
                "no deadlock; final memory is the last writes",
                |m: &CoherenceModel, s: &World| {
                    let stuck = s.runnable(&m.spec).is_empty() && s.deliverable().is_empty();
                    !stuck || (s.is_terminal(&m.spec) && s.check_terminal(&m.spec).is_ok())
                },
            ),
        ];
        if self.spec.cfg.protocol == Protocol::Sc {
            p.push(Property::always(
                "sc: single writer, valid copies equal the latest write",
                |m: &CoherenceModel, s: &World| s.check_sc(&m.spec).is_ok(),
            ));
        } else {
            p.push(Property::always(
                "hlrc: no other cluster holds a copy of a private writable home page",
                |m: &CoherenceModel, s: &World| s.check_private_pages(&m.spec).is_ok(),
            ));
        }
        for &(name, cond) in &self.sometimes {
            p.push(Property::sometimes(name, cond));
        }
        p
    }
}

fn check(name: &str, spec: Spec, sometimes: Vec<(&'static str, Cond)>, expected: usize) {
    let start = std::time::Instant::now();
    let model = CoherenceModel { spec, sometimes };
    let checker = model.checker().threads(2).spawn_bfs().join();
    let states = checker.unique_state_count();
    println!("{name}: {states} states explored in {:?}", start.elapsed());
    checker.assert_properties();
    assert!(checker.is_done());
    assert_eq!(states, expected, "{name}: state count changed");
}

fn cfg(protocol: Protocol, clusters: u16, pages: u32) -> Config {
    Config::new(protocol, clusters, pages)
}

const fn r(word: usize) -> Op {
    Op::Read { page: 0, word }
}
const fn w(word: usize, value: u64) -> Op {
    Op::Write {
        page: 0,
        word,
        value,
    }
}
const fn rp(page: u32, word: usize) -> Op {
    Op::Read { page, word }
}
const fn wp(page: u32, word: usize, value: u64) -> Op {
    Op::Write { page, word, value }
}

/// hlrc: write notices travel transitively through two different locks (cluster 1
/// → lock 0 → cluster 0 → lock 1 → cluster 2); the reader caches the pages before
/// its acquire and must invalidate them. Page 0 is homed at cluster 0 (a home that
/// also writes), page 1 at cluster 1.
#[test]
fn hlrc_transitive_locks() {
    let spec = Spec {
        cfg: cfg(Protocol::Hlrc, 3, 2),
        words: 2,
        threads: vec![
            (
                0,
                vec![
                    Op::Acquire(0),
                    Op::Release(0),
                    Op::Acquire(1),
                    wp(0, 1, 5),
                    Op::Release(1),
                ],
            ),
            (
                1,
                vec![Op::Acquire(0), wp(0, 0, 1), wp(1, 1, 7), Op::Release(0)],
            ),
            (
                2,
                vec![
                    rp(1, 0),
                    Op::Acquire(1),
                    rp(0, 0),
                    rp(1, 1),
                    rp(0, 1),
                    Op::Release(1),
                ],
            ),
            (2, vec![rp(0, 1), Op::Acquire(0), rp(0, 0), Op::Release(0)]),
        ],
    };
    check(
        "hlrc_transitive_locks",
        spec,
        vec![(
            "a read after an acquire returns a value released by another cluster",
            |_, s| s.seen.remote_value,
        )],
        EXPECTED_HLRC_TRANSITIVE,
    );
}

/// hlrc: two clusters write disjoint words of one page concurrently (two twins),
/// exchange them through a barrier, then one of them is the page's only writer for a
/// barrier interval and the home migrates to it; afterwards the others fetch from
/// the new home. (Cluster 0's first read races with cluster 2's write: it is not
/// checked, but its fetch overlaps the writers.)
#[test]
fn hlrc_multiple_writers_barrier_migration() {
    let spec = Spec {
        cfg: cfg(Protocol::Hlrc, 3, 1),
        words: 2,
        threads: vec![
            (0, vec![r(1), Op::Barrier, Op::Barrier, r(0), r(1)]),
            (
                1,
                vec![
                    w(0, 1),
                    Op::Barrier,
                    r(1),
                    w(0, 3),
                    Op::Barrier,
                    w(0, 4),
                    Op::Barrier,
                ],
            ),
            (
                2,
                vec![
                    w(1, 2),
                    Op::Barrier,
                    r(0),
                    Op::Barrier,
                    r(0),
                    r(1),
                    Op::Barrier,
                ],
            ),
        ],
    };
    // cluster 0 joins the last barrier too
    let mut spec = spec;
    spec.threads[0].1.push(Op::Barrier);
    check(
        "hlrc_multiple_writers_barrier_migration",
        spec,
        vec![
            ("two clusters hold twins of one page", |_, s| {
                s.seen.concurrent_twins
            }),
            ("a barrier migrates a home", |_, s| s.seen.migration),
            ("a read returns another cluster's write", |_, s| {
                s.seen.remote_value
            }),
        ],
        EXPECTED_HLRC_BARRIER,
    );
}

/// hlrc: two threads share one cluster's copy: concurrent faults coalesce, a dirty
/// page is flushed when an acquire invalidates it, a fetch overtaken by a write
/// notice is repeated, and a write waits for the acknowledgement of the cluster's
/// previous diff of the page before taking a new twin.
#[test]
fn hlrc_threads_in_one_cluster() {
    let spec = Spec {
        cfg: cfg(Protocol::Hlrc, 2, 1),
        words: 3,
        threads: vec![
            (
                0,
                vec![Op::Acquire(0), w(0, 1), Op::Release(0), Op::Barrier],
            ),
            (0, vec![Op::Acquire(0), r(2), Op::Release(0), Op::Barrier]),
            (1, vec![r(1), w(1, 2), r(1), Op::Barrier]),
            (
                1,
                vec![Op::Acquire(0), r(0), w(2, 5), Op::Release(0), Op::Barrier],
            ),
        ],
    };
    check(
        "hlrc_threads_in_one_cluster",
        spec,
        vec![
            ("two faults on one page share a fetch", |_, s| {
                s.seen.coalesced_fault
            }),
            (
                "an acquire flushes a dirty page before invalidating it",
                |_, s| s.seen.diff_at_acquire,
            ),
            ("a fetch overtaken by a write notice is repeated", |_, s| {
                s.seen.stale_refetch
            }),
            (
                "a write waits for the previous diff's acknowledgement",
                |_, s| s.seen.twin_wait,
            ),
            (
                "a read after an acquire returns a value released by another cluster",
                |_, s| s.seen.remote_value,
            ),
        ],
        EXPECTED_HLRC_THREADS,
    );
}

/// hlrc with first-touch homes: clusters race to touch pages first; the directory
/// managers (page mod 3) decide, and requests that reach a new home before its own
/// `HomeIs` are held.
#[test]
fn hlrc_first_touch() {
    let mut c = cfg(Protocol::Hlrc, 3, 2);
    c.home_policy = HomePolicy::FirstTouch;
    let spec = Spec {
        cfg: c,
        words: 2,
        threads: vec![
            (
                0,
                vec![
                    rp(1, 0),
                    Op::Barrier,
                    rp(0, 1),
                    Op::Acquire(0),
                    rp(1, 0),
                    rp(1, 1),
                    Op::Release(0),
                ],
            ),
            (
                1,
                vec![
                    wp(0, 0, 1),
                    Op::Barrier,
                    rp(0, 1),
                    Op::Acquire(0),
                    wp(1, 0, 5),
                    Op::Release(0),
                ],
            ),
            (2, vec![wp(0, 1, 2), wp(1, 1, 3), Op::Barrier, rp(0, 0)]),
        ],
    };
    check(
        "hlrc_first_touch",
        spec,
        vec![("a read returns another cluster's write", |_, s| {
            s.seen.remote_value
        })],
        EXPECTED_HLRC_FIRST_TOUCH,
    );
}

/// hlrc: a lock held across a barrier. Its release after the barrier carries the
/// releaser's garbage-collection time, so the lock manager (cluster 1), which may
/// not have processed the departure yet, does not mistake the discarded records for
/// a gap; the next holder still sees the writes made before the barrier.
#[test]
fn hlrc_lock_held_across_barrier() {
    let spec = Spec {
        cfg: cfg(Protocol::Hlrc, 3, 1),
        words: 2,
        threads: vec![
            (
                0,
                vec![
                    Op::Acquire(1),
                    w(0, 1),
                    Op::Barrier,
                    w(0, 5),
                    Op::Release(1),
                ],
            ),
            (
                1,
                vec![Op::Barrier, Op::Acquire(1), r(0), r(1), Op::Release(1)],
            ),
            (
                2,
                vec![w(1, 2), Op::Barrier, Op::Acquire(1), r(0), Op::Release(1)],
            ),
        ],
    };
    check(
        "hlrc_lock_held_across_barrier",
        spec,
        vec![(
            "a read after an acquire returns a value released by another cluster",
            |_, s| s.seen.remote_value,
        )],
        EXPECTED_HLRC_ACROSS_BARRIER,
    );
}

/// sc: racing writers and readers on two pages (a Dekker pattern plus a third
/// cluster), with the homes taking part.
#[test]
fn sc_racing_readers_and_writers() {
    let spec = Spec {
        cfg: cfg(Protocol::Sc, 3, 2),
        words: 2,
        threads: vec![
            (0, vec![w(0, 1), rp(1, 0), r(1)]),
            (1, vec![w(1, 1), r(0), wp(1, 0, 4)]),
            (2, vec![r(0), w(0, 2), rp(1, 0)]),
            (2, vec![rp(1, 1)]),
        ],
    };
    check(
        "sc_racing_readers_and_writers",
        spec,
        vec![
            ("a writer is recalled by the home", |_, s| s.seen.sc_recall),
            ("readers are invalidated for a writer", |_, s| {
                s.seen.sc_invalidation
            }),
        ],
        EXPECTED_SC_RACING,
    );
}

/// sc: two threads of one cluster fault on the same page, one reading and one
/// writing; a lock orders a second cluster's accesses.
#[test]
fn sc_threads_and_locks() {
    let spec = Spec {
        cfg: cfg(Protocol::Sc, 2, 1),
        words: 2,
        threads: vec![
            (
                0,
                vec![
                    Op::Acquire(0),
                    w(0, 1),
                    Op::Release(0),
                    r(1),
                    Op::Barrier,
                    w(1, 6),
                ],
            ),
            (1, vec![r(0), w(1, 3), Op::Barrier]),
            (
                1,
                vec![Op::Acquire(0), r(0), Op::Release(0), Op::Barrier, r(0)],
            ),
        ],
    };
    check(
        "sc_threads_and_locks",
        spec,
        vec![
            ("two faults on one page share a request", |_, s| {
                s.seen.coalesced_fault
            }),
            ("a writer is recalled by the home", |_, s| s.seen.sc_recall),
        ],
        EXPECTED_SC_THREADS,
    );
}

const EXPECTED_HLRC_TRANSITIVE: usize = 97_062;
const EXPECTED_HLRC_BARRIER: usize = 7_429;
const EXPECTED_HLRC_THREADS: usize = 19_803;
const EXPECTED_HLRC_FIRST_TOUCH: usize = 10_357;
const EXPECTED_HLRC_ACROSS_BARRIER: usize = 541;
const EXPECTED_SC_RACING: usize = 125_660;
const EXPECTED_SC_THREADS: usize = 6_410;
