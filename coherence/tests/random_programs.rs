//! Random data-race-free programs on several clusters, run on the coherence machines
//! over an unordered in-memory network with random delivery order (only the messages
//! one `Machine::handle` call sends to one cluster stay in order), executing every
//! action on simulated page memories. Checks: every race-free read returns the last
//! write that happens-before it, no other cluster holds a copy of a private writable
//! home page, no deadlock, and the final memory equals a sequential run's.

mod common;

use common::{Op, Spec, World};
use multigrain_coherence::{Config, HomePolicy, Protocol};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Clone, Copy, Debug)]
enum Class {
    Lock(u32),
    Thread(usize),
    ReadOnly,
}

/// The largest job a program may have.
#[derive(Clone, Copy, Debug)]
struct Shape {
    clusters: u16,
    threads_per_cluster: usize,
    locks: u32,
    phases: usize,
    /// Operations per thread and phase: up to one less than this.
    ops: usize,
}

/// Small jobs: dense sharing, short programs.
const NARROW: Shape = Shape {
    clusters: 4,
    threads_per_cluster: 3,
    locks: 2,
    phases: 4,
    ops: 8,
};

/// Wider jobs: more clusters, threads and locks, so that one event sends several
/// grants (pushes) to one cluster (Water on 8 × 2 clusters found a bug there that
/// the narrow shape never produced in 300,000 programs).
const WIDE: Shape = Shape {
    clusters: 8,
    threads_per_cluster: 4,
    locks: 6,
    phases: 6,
    ops: 8,
};

/// Long jobs: many locks and long lock sweeps between barriers, as in Water.
const LONG: Shape = Shape {
    clusters: 8,
    threads_per_cluster: 2,
    locks: 24,
    phases: 3,
    ops: 40,
};

/// Builds a data-race-free program: phases separated by barriers; in each phase every
/// word is protected by a lock (only `Add` inside that lock's sections), owned by one
/// thread (plain reads and writes), or read-only.
fn program(rng: &mut StdRng, protocol: Protocol, policy: HomePolicy, shape: Shape) -> Spec {
    let clusters = rng.random_range(2..=shape.clusters);
    let per_cluster: Vec<usize> = (0..clusters)
        .map(|_| rng.random_range(1..=shape.threads_per_cluster))
        .collect();
    let pages = rng.random_range(1..=3u32);
    let words = [2, 4, 4, 512][rng.random_range(0..4)];
    let locks = rng.random_range(1..=shape.locks);
    let phases = rng.random_range(1..=shape.phases);
    let mut cfg = Config::new(protocol, clusters, pages);
    cfg.home_policy = policy;
    cfg.migrate_single_writer = rng.random_bool(0.7);
    cfg.barrier_manager = common::cluster(rng.random_range(0..clusters));
    let owners: Vec<u16> = per_cluster
        .iter()
        .enumerate()
        .flat_map(|(c, &n)| std::iter::repeat_n(c as u16, n))
        .collect();
    let nt = owners.len();
    let mut progs: Vec<Vec<Op>> = vec![Vec::new(); nt];
    let mut counter = 0u64;
    // Only a few distinct words per page are used, to keep sharing dense.
    let used_words: Vec<usize> = (0..4.min(words)).map(|i| i * (words / 4).max(1)).collect();
    for _ in 0..phases {
        let mut class = Vec::new();
        for p in 0..pages {
            for &w in &used_words {
                let c = match rng.random_range(0..3) {
                    0 => Class::Lock(rng.random_range(0..locks)),
                    1 => Class::Thread(rng.random_range(0..nt)),
                    _ => Class::ReadOnly,
                };
                class.push((p, w, c));
            }
        }
        for (t, prog) in progs.iter_mut().enumerate() {
            for _ in 0..rng.random_range(0..shape.ops) {
                match rng.random_range(0..4) {
                    0 => {
                        let l = rng.random_range(0..locks);
                        let mine: Vec<_> = class
                            .iter()
                            .filter(|x| matches!(x.2, Class::Lock(k) if k == l))
                            .collect();
                        prog.push(Op::Acquire(l));
                        for _ in 0..rng.random_range(1..=2) {
                            if let Some(&&(page, word, _)) =
                                mine.get(rng.random_range(0..mine.len().max(1)))
                            {
                                if rng.random_bool(0.7) {
                                    prog.push(Op::Add {
                                        page,
                                        word,
                                        delta: rng.random_range(1..100),
                                    });
                                } else {
                                    prog.push(Op::Read { page, word });
                                }
                            }
                        }
                        prog.push(Op::Release(l));
                    }
                    1 | 2 => {
                        let mine: Vec<_> = class
                            .iter()
                            .filter(|x| matches!(x.2, Class::Thread(k) if k == t))
                            .collect();
                        if let Some(&&(page, word, _)) =
                            mine.get(rng.random_range(0..mine.len().max(1)))
                        {
                            if rng.random_bool(0.6) {
                                counter += 1;
                                prog.push(Op::Write {
                                    page,
                                    word,
                                    value: ((t as u64 + 1) << 32) | counter,
                                });
                            } else {
                                prog.push(Op::Read { page, word });
                            }
                        }
                    }
                    _ => {
                        let ro: Vec<_> = class
                            .iter()
                            .filter(|x| matches!(x.2, Class::ReadOnly))
                            .collect();
                        if let Some(&&(page, word, _)) =
                            ro.get(rng.random_range(0..ro.len().max(1)))
                        {
                            prog.push(Op::Read { page, word });
                        }
                    }
                }
            }
            prog.push(Op::Barrier);
        }
    }
    // Drawn last, so that the programs of earlier seeds are unchanged.
    cfg.prefetch = [0, 1, 7][rng.random_range(0..3)];
    // Drawn after it for the same reason.
    cfg.release_batch = [1, 2, 3, 16][rng.random_range(0..4)];
    // And this after both: open pages closed at every flush, after one or two unchanged
    // flushes, or the default's eight.
    cfg.idle_flushes = [0, 1, 2, 8][rng.random_range(0..4)];
    // And last: flushes ahead of a lock's grant in three programs of four.
    cfg.flush_ahead = rng.random_range(0..4) != 0;
    Spec {
        cfg,
        words,
        threads: owners.into_iter().zip(progs).collect(),
    }
}

/// Runs the threads one after another, phase by phase, on a plain memory.
fn sequential(spec: &Spec) -> Vec<Vec<u64>> {
    let mut mem = vec![vec![0u64; spec.words]; spec.cfg.pages as usize];
    let mut pcs = vec![0usize; spec.threads.len()];
    loop {
        let mut progressed = false;
        for (t, (_, prog)) in spec.threads.iter().enumerate() {
            while pcs[t] < prog.len() {
                let op = prog[pcs[t]];
                pcs[t] += 1;
                match op {
                    Op::Write { page, word, value } => mem[page as usize][word] = value,
                    Op::Add { page, word, delta } => {
                        let w = &mut mem[page as usize][word];
                        *w = w.wrapping_add(delta);
                    }
                    Op::Barrier => {
                        progressed = true;
                        break;
                    }
                    Op::Read { .. } | Op::Acquire(_) | Op::Release(_) => {}
                }
            }
        }
        if !progressed {
            return mem;
        }
    }
}

fn run(protocol: Protocol, policy: HomePolicy, seed: u64) -> Result<(), TestCaseError> {
    run_shape(protocol, policy, seed, NARROW)
}

fn run_shape(
    protocol: Protocol,
    policy: HomePolicy,
    seed: u64,
    shape: Shape,
) -> Result<(), TestCaseError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let spec = program(&mut rng, protocol, policy, shape);
    let mut order = StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
    let w = World::run(&spec, |n| order.random_range(0..n))
        .map_err(|e| TestCaseError::fail(format!("{e}\nspec: {spec:?}")))?;
    prop_assert_eq!(w.final_memory(&spec), sequential(&spec), "spec: {:?}", spec);
    // Every program ends with a barrier, after which no write notice is needed any
    // more: the barrier garbage collection leaves no records behind.
    for k in &w.clusters {
        prop_assert_eq!(k.machine.stored_records(), 0);
    }
    Ok(())
}

/// Programs per protocol: `MULTIGRAIN_RANDOM_PROGRAMS`, default 3000.
fn cases() -> u32 {
    std::env::var("MULTIGRAIN_RANDOM_PROGRAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}

fn policy() -> impl Strategy<Value = HomePolicy> {
    prop_oneof![
        Just(HomePolicy::RoundRobin),
        Just(HomePolicy::Block),
        Just(HomePolicy::FirstTouch)
    ]
}

proptest! {
    // 3000 programs per protocol; `MULTIGRAIN_RANDOM_PROGRAMS=100000` for a long run.
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn hlrc_random_drf_programs_match_sequential_run(policy in policy(), seed in any::<u64>()) {
        run(Protocol::Hlrc, policy, seed)?;
    }

    #[test]
    fn sc_random_drf_programs_match_sequential_run(policy in policy(), seed in any::<u64>()) {
        run(Protocol::Sc, policy, seed)?;
    }

    #[test]
    fn hlrc_wide_random_drf_programs_match_sequential_run(
        policy in policy(),
        seed in any::<u64>(),
    ) {
        run_shape(Protocol::Hlrc, policy, seed, WIDE)?;
    }

    #[test]
    fn hlrc_long_random_drf_programs_match_sequential_run(
        policy in policy(),
        seed in any::<u64>(),
    ) {
        run_shape(Protocol::Hlrc, policy, seed, LONG)?;
    }

    #[test]
    fn sc_wide_random_drf_programs_match_sequential_run(
        policy in policy(),
        seed in any::<u64>(),
    ) {
        run_shape(Protocol::Sc, policy, seed, WIDE)?;
    }
}

/// A manager sends two pushes to one cluster in one event, and the cluster waits at a
/// barrier the manager has passed: it keeps each push's records out of its log until
/// a local thread takes that lock. The second push must carry the records the first
/// one carried (the per-event skipping of records sent once, calling contract point 5,
/// counts no push), or taking the second lock first leaves a gap in the log (found by
/// the wide test above; Water on 8 × 2 clusters failed the same way). Since a manager
/// leaves out of a push what its earlier pushes to that cluster carried, the second
/// push here answers the cluster's request with such a gap: the cluster refuses it
/// (gives it back unused and asks again) instead of failing.
#[test]
fn a_push_does_not_count_as_delivering_its_records() {
    run_shape(
        Protocol::Hlrc,
        HomePolicy::RoundRobin,
        3_171_369_772_707_991_106,
        WIDE,
    )
    .expect("run");
}

/// A cached lock given back while its cluster waits at a barrier closes an interval
/// after the cluster's arrival: garbage collection at the departure must stop at the
/// departure's time, or a later grant misses that record (found by the test above).
#[test]
fn lock_given_back_during_a_barrier_keeps_its_interval() {
    run(
        Protocol::Hlrc,
        HomePolicy::FirstTouch,
        9_712_696_874_338_674_255,
    )
    .expect("run");
}

/// The generator does produce the situations the protocols must handle.
#[test]
fn random_programs_exercise_the_protocol() {
    let mut seen = common::Seen::default();
    let mut reads = 0;
    for seed in 0..300u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let spec = program(&mut rng, Protocol::Hlrc, HomePolicy::RoundRobin, NARROW);
        let mut order = StdRng::seed_from_u64(seed);
        let w = World::run(&spec, |n| order.random_range(0..n)).expect("run");
        reads += w.checked_reads;
        let s = w.seen;
        seen.remote_value |= s.remote_value;
        seen.concurrent_twins |= s.concurrent_twins;
        seen.carried_diff |= s.carried_diff;
        seen.diff_buffered |= s.diff_buffered;
        seen.fetch_deferred |= s.fetch_deferred;
        seen.acquire_held |= s.acquire_held;
        seen.kept_open |= s.kept_open;
        seen.migration |= s.migration;
        seen.diff_at_acquire |= s.diff_at_acquire;
        seen.coalesced_fault |= s.coalesced_fault;
        seen.private_home_write |= s.private_home_write;
        seen.home_page_shared |= s.home_page_shared;
        seen.local_lock_acquire |= s.local_lock_acquire;
        seen.lock_recall |= s.lock_recall;
        seen.runtime_lock_acquire |= s.runtime_lock_acquire;
        seen.runtime_lock_release |= s.runtime_lock_release;
        seen.lock_push |= s.lock_push;
        seen.lock_visit_keep |= s.lock_visit_keep;
        seen.sweep_recall |= s.sweep_recall;
        seen.sweep_pushed |= s.sweep_pushed;
        seen.flush_ahead |= s.flush_ahead;
        seen.stale_lock_request |= s.stale_lock_request;
        seen.push_refused |= s.push_refused;
        seen.update_early |= s.update_early;
        seen.prefetch_installed |= s.prefetch_installed;
        seen.prefetch_dropped |= s.prefetch_dropped;
        seen.prefetch_hit |= s.prefetch_hit;
        seen.arrival_held |= s.arrival_held;
        seen.update_at_grant |= s.update_at_grant;
        seen.update_applied |= s.update_applied;
    }
    // A lock pushed back to its releaser needs a turn seen twice in a row: the long
    // shape's lock sweeps make them.
    for seed in 0..100u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let spec = program(&mut rng, Protocol::Hlrc, HomePolicy::RoundRobin, LONG);
        let mut order = StdRng::seed_from_u64(seed);
        let w = World::run(&spec, |n| order.random_range(0..n)).expect("run");
        seen.lock_push_back |= w.seen.lock_push_back;
        seen.lock_visit_keep |= w.seen.lock_visit_keep;
        seen.update_at_grant |= w.seen.update_at_grant;
        seen.sweep_recall |= w.seen.sweep_recall;
        seen.sweep_pushed |= w.seen.sweep_pushed;
        seen.push_refused |= w.seen.push_refused;
    }
    // A push refused at its first use for a gap in its records is rarer since clusters
    // keep a lock for their visit's next use: first-touch homes in the long shape
    // make one (seeds 46 and 239 below 300 with open pages closed after two unchanged
    // flushes; seed 1127 since `idle_flushes` is drawn as well).
    // A sweep over locks pushed to a quiet cluster (two neighbouring locks pushed there,
    // 16 used releases by others since its own last) comes from the long programs
    // here (seed 998). Both with flushes ahead of grants off (`Config::flush_ahead`):
    // with them on, none of the first 6,000 long programs of either home policy sweeps
    // over pushed locks (the clusters' requests interleave differently; the draw in
    // `program` runs three programs of four with them on).
    for seed in 0..2000u64 {
        if seen.push_refused && seen.sweep_pushed {
            break;
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let mut spec = program(&mut rng, Protocol::Hlrc, HomePolicy::FirstTouch, LONG);
        spec.cfg.flush_ahead = false;
        let mut order = StdRng::seed_from_u64(seed);
        let w = World::run(&spec, |n| order.random_range(0..n)).expect("run");
        seen.push_refused |= w.seen.push_refused;
        seen.sweep_pushed |= w.seen.sweep_pushed;
    }
    eprintln!("checked reads: {reads}, seen: {seen:?}");
    assert!(reads > 1000, "only {reads} race-free reads checked");
    assert!(
        seen.remote_value
            && seen.concurrent_twins
            && seen.carried_diff
            && seen.diff_buffered
            && seen.fetch_deferred
            && seen.acquire_held
            && seen.kept_open
            && seen.migration
            && seen.coalesced_fault
            && seen.private_home_write
            && seen.home_page_shared
            && seen.local_lock_acquire
            && seen.prefetch_installed
            && seen.prefetch_hit
            && seen.arrival_held
            && seen.lock_recall
            && seen.runtime_lock_acquire
            && seen.runtime_lock_release
            && seen.lock_push
            && seen.lock_push_back
            && seen.lock_visit_keep
            && seen.sweep_recall
            && seen.sweep_pushed
            && seen.flush_ahead
            && seen.stale_lock_request
            && seen.push_refused
            && seen.update_early
            && seen.update_applied
            && seen.update_at_grant,
        "{seen:?}"
    );
}

/// Two grants at a page's home carry the same write notice while the diff is still
/// on its way: the first acquire waits for the diff, and the second must wait too
/// although the record is no longer new (found by the test above).
#[test]
fn a_notice_seen_before_the_home_has_its_diff_holds_every_acquire() {
    run(
        Protocol::Hlrc,
        HomePolicy::RoundRobin,
        15_587_403_163_368_846_434,
    )
    .expect("run");
}
/// A push from a manager that has passed a barrier the receiver still waits at: its
/// notices cannot take effect on arrival (the receiver lacks the departure's records),
/// so they wait for the first local use (found by the test above).
#[test]
fn a_push_from_beyond_a_barrier_waits_for_its_first_use() {
    run(
        Protocol::Hlrc,
        HomePolicy::RoundRobin,
        15_587_403_163_367_074_352,
    )
    .expect("run");
}
/// A page's home sees a write notice with one grant while the diff is on its way;
/// a later acquire of another lock whose time covers that notice brings no record of
/// it (the cluster's time already does) and must still wait for the diff (found by
/// the test above).
#[test]
fn a_notice_taken_earlier_still_holds_a_later_acquire_at_the_home() {
    run(Protocol::Hlrc, HomePolicy::Block, 5_541_284_111_945_988_202).expect("run");
}
