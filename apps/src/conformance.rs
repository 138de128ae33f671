//! Conformance checks for [`Runtime`] backends: the guarantees the apps rely on. Each
//! function runs a small parallel program on the given runtime and panics with a message
//! naming the broken guarantee. The threads backend runs them in its unit tests; the DSM
//! backend should run the same functions.
//!
//! Every check allocates, so run each on a runtime whose allocation sequence is the same in
//! every process (call the checks in the same order everywhere).

use crate::storage::{F64Words, U64Words};
use crate::team::{Runtime, Team};

/// `run` returns this process's threads' values in ascending thread id, and each team
/// reports the runtime's topology.
pub fn results_in_thread_order<R: Runtime>(rt: &mut R) {
    let topo = rt.topology().clone();
    let out = rt
        .run(|team| {
            assert_eq!(
                team.topology(),
                &topo,
                "team and runtime disagree on the topology"
            );
            assert_eq!(team.num_threads(), topo.num_threads());
            team.thread_id()
        })
        .expect("run failed");
    assert!(!out.is_empty(), "run returned no value for this process");
    assert!(
        out.windows(2).all(|w| w[0] < w[1]),
        "values not in ascending thread order: {out:?}"
    );
    assert!(
        out.iter().all(|&t| t < topo.num_threads()),
        "thread id out of range: {out:?}"
    );
}

/// Fresh arrays read as zeros on every thread; lock ids are handed out consecutively.
pub fn fresh_allocations<R: Runtime>(rt: &mut R) {
    let f = rt.alloc_f64s(1000).expect("alloc f64s");
    let u = rt.alloc_u64s(1000).expect("alloc u64s");
    let empty = rt.alloc_f64s(0).expect("alloc of 0 words");
    assert_eq!((f.len(), u.len(), empty.len()), (1000, 1000, 0));
    assert!(empty.is_empty());
    let a = rt.alloc_locks(3).expect("alloc locks");
    let b = rt.alloc_locks(2).expect("alloc locks");
    assert_eq!(b, a + 3, "lock ids are not consecutive");
    let ok = rt
        .run(|_| (0..1000).all(|i| f.get(i).to_bits() == 0 && u.get(i) == 0))
        .expect("run failed");
    assert!(ok.iter().all(|&z| z), "a fresh array is not zeroed");
}

/// Writes before a barrier are visible to every thread after it, round after round.
pub fn barrier_publishes_writes<R: Runtime>(rt: &mut R, rounds: usize) {
    let n = rt.topology().num_threads();
    let a = rt.alloc_f64s(n).expect("alloc f64s");
    let seen = rt
        .run(|team| {
            let me = team.thread_id();
            for r in 0..rounds {
                a.set(me, (r * n + me) as f64);
                team.barrier();
                for t in 0..n {
                    let want = (r * n + t) as f64;
                    let got = a.get(t);
                    assert!(
                        got == want,
                        "round {r}: thread {me} read {got} from thread {t}'s slot after a barrier, expected {want}"
                    );
                }
                team.barrier();
            }
            true
        })
        .expect("run failed");
    assert!(seen.iter().all(|&s| s));
}

/// Read-modify-write sequences under one lock are serialised and published to the next
/// holder.
pub fn locks_serialise_updates<R: Runtime>(rt: &mut R, per_thread: usize) {
    let n = rt.topology().num_threads();
    let lock = rt.alloc_locks(1).expect("alloc locks");
    let count = rt.alloc_u64s(1).expect("alloc u64s");
    let sum = rt.alloc_f64s(1).expect("alloc f64s");
    let totals = rt
        .run(|team| {
            for _ in 0..per_thread {
                let _guard = team.lock(lock);
                count.set(0, count.get(0) + 1);
                sum.set(0, sum.get(0) + 0.5);
            }
            team.barrier();
            (count.get(0), sum.get(0))
        })
        .expect("run failed");
    let want = (n * per_thread) as u64;
    for (c, s) in totals {
        assert_eq!(c, want, "lost updates under a lock");
        assert_eq!(s, want as f64 * 0.5, "lost f64 updates under a lock");
    }
}

/// Runs every check.
pub fn all<R: Runtime>(rt: &mut R) {
    results_in_thread_order(rt);
    fresh_allocations(rt);
    barrier_publishes_writes(rt, 50);
    locks_serialise_updates(rt, 500);
}
