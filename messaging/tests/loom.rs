//! loom model checks of the lock-free ring and the Tag-On buffer pool: every interleaving
//! of the real code (atomics come from the crate's loom shim). Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p multigrain-messaging --test loom --release`.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread::{self, JoinHandle};
use multigrain_messaging::{HeapRing, Pool};

/// Spawns `n` consumers that each try one pop (bounded, so the model stays finite).
fn pop_once_in_threads(ring: &Arc<HeapRing<u64>>, n: usize) -> Vec<JoinHandle<Option<u64>>> {
    (0..n)
        .map(|_| {
            let ring = ring.clone();
            thread::spawn(move || ring.pop())
        })
        .collect()
}

/// What the consumers took plus what they left in the ring, sorted.
fn joined_then_drained(consumers: Vec<JoinHandle<Option<u64>>>, ring: &HeapRing<u64>) -> Vec<u64> {
    let mut got: Vec<u64> = consumers
        .into_iter()
        .filter_map(|c| c.join().unwrap())
        .collect();
    while let Some(v) = ring.pop() {
        got.push(v);
    }
    got.sort_unstable();
    got
}

#[test]
fn two_producers_one_consumer_exactly_once() {
    loom::model(|| {
        let ring = Arc::new(HeapRing::<u64>::new(2));
        let producers: Vec<_> = (0..2u64)
            .map(|p| {
                let ring = ring.clone();
                thread::spawn(move || {
                    while ring.push(p).is_err() {
                        thread::yield_now();
                    }
                })
            })
            .collect();
        let mut got = Vec::new();
        while got.len() < 2 {
            match ring.pop() {
                Some(v) => got.push(v),
                None => thread::yield_now(),
            }
        }
        for p in producers {
            p.join().unwrap();
        }
        got.sort_unstable();
        assert_eq!(got, vec![0, 1]);
        assert_eq!(ring.pop(), None);
    });
}

#[test]
fn one_producer_two_consumers_across_a_wrap() {
    loom::model(|| {
        let ring = Arc::new(HeapRing::<u64>::new(2));
        // Fill and drain once so the next pushes reuse slots (a lap of the stamps).
        ring.push(100).unwrap();
        assert_eq!(ring.pop(), Some(100));
        // Each consumer tries once (bounded, so the model stays finite); whatever they
        // miss is drained afterwards. Nothing may be taken twice or lost.
        let consumers = pop_once_in_threads(&ring, 2);
        ring.push(1).unwrap();
        ring.push(2).unwrap();
        let got = joined_then_drained(consumers, &ring);
        assert_eq!(got, vec![1, 2]);
    });
}

#[test]
fn full_ring_hands_the_value_back_under_concurrency() {
    loom::model(|| {
        let ring = Arc::new(HeapRing::<u64>::new(2));
        ring.push(1).unwrap();
        ring.push(2).unwrap();
        let consumer = {
            let ring = ring.clone();
            thread::spawn(move || ring.pop())
        };
        // Either the consumer freed a slot first (push succeeds) or not (value handed back).
        let pushed = match ring.push(3) {
            Ok(()) => true,
            Err(v) => {
                assert_eq!(v, 3);
                false
            }
        };
        assert_eq!(consumer.join().unwrap(), Some(1));
        let mut rest = Vec::new();
        while let Some(v) = ring.pop() {
            rest.push(v);
        }
        assert_eq!(rest, if pushed { vec![2, 3] } else { vec![2] });
    });
}

/// A producer reuses slot 0 for the next lap while two consumers race for the first lap's
/// values: a consumer must get the value of the position it claimed, never the one written
/// over it, and nothing may be lost or taken twice.
#[test]
fn a_slot_reused_under_a_racing_reader_is_never_misread() {
    loom::model(|| {
        let ring = Arc::new(HeapRing::<u64>::new(2));
        ring.push(1).unwrap();
        ring.push(2).unwrap();
        let consumers = pop_once_in_threads(&ring, 2);
        // Reuses slot 0 (position 2) as soon as a consumer has taken position 0.
        while ring.push(3).is_err() {
            thread::yield_now();
        }
        let got = joined_then_drained(consumers, &ring);
        assert_eq!(got, vec![1, 2, 3], "a value lost, duplicated or misread");
    });
}

#[test]
fn pool_slots_return_exactly_once_after_multicast() {
    loom::model(|| {
        let pool = Pool::new_private(1, 64).unwrap();
        let mut buf = pool.alloc().unwrap();
        buf.fill(b"x");
        let shared = buf.freeze();
        let other = shared.clone();
        let t = thread::spawn(move || {
            assert_eq!(&*other, b"x");
            drop(other);
        });
        // While a reference is alive the single slot cannot be handed out again.
        assert!(pool.alloc().is_err());
        drop(shared);
        t.join().unwrap();
        assert_eq!(pool.free_slots(), 1);
        assert!(pool.alloc().is_ok());
    });
}

#[test]
fn concurrent_allocation_of_the_last_slot() {
    loom::model(|| {
        let pool = Pool::new_private(1, 64).unwrap();
        let p2 = pool.clone();
        let t = thread::spawn(move || p2.alloc().map(drop).is_ok());
        let mine = pool.alloc();
        let mine_ok = mine.is_ok();
        drop(mine);
        let theirs_ok = t.join().unwrap();
        assert!(mine_ok || theirs_ok, "someone gets the slot");
        assert_eq!(pool.free_slots(), 1);
    });
}

#[test]
fn never_used_slots_go_to_one_thread_each() {
    loom::model(|| {
        // Two slots, both never used: racing allocations take them from the fresh
        // cursor and must get one each; a third finds none until one is returned.
        let pool = Pool::new_private(2, 64).unwrap();
        let p2 = pool.clone();
        let t = thread::spawn(move || {
            let mut b = p2.alloc().unwrap();
            b.fill(b"t");
            b.freeze()
        });
        let mut mine = pool.alloc().unwrap();
        mine.fill(b"m");
        let mine = mine.freeze();
        let theirs = t.join().unwrap();
        assert_ne!(
            mine.location(),
            theirs.location(),
            "a slot handed out twice"
        );
        assert_eq!((&*mine, &*theirs), (&b"m"[..], &b"t"[..]));
        assert!(pool.alloc().is_err());
        drop(theirs);
        assert_eq!(pool.used_slots(), 2);
        let again = pool.alloc().unwrap().freeze();
        assert_ne!(
            again.location(),
            mine.location(),
            "the returned slot, not a live one"
        );
    });
}
