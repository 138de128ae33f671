//! Several clusters of one job in this process (each with its own region address),
//! connected through shared memory: fast checks of the runtime's protocols, its
//! statistics and its error paths. (The multi-process tests are in `cluster.rs`.)

use multigrain_cluster_config::{BarrierUpdates, HomePolicy, JobConfig, Protocol};
use multigrain_dsm::*;

/// A region address private to one test of this binary.
fn base(slot: usize, cluster: usize) -> usize {
    0x4800_0000_0000 + slot * (1 << 36) + cluster * (1 << 32)
}

fn config(clusters: usize, threads: usize, protocol: Protocol) -> JobConfig {
    let mut cfg = JobConfig::local(clusters, threads);
    cfg.dsm.protocol = protocol;
    cfg.dsm.region_size = 64 << 20;
    cfg.job.peer_timeout_ms = 2000;
    cfg
}

/// Joins every cluster of `cfgs` (one configuration per cluster) concurrently.
fn join_all(slot: usize, cfgs: Vec<JobConfig>) -> Vec<Result<Dsm, DsmError>> {
    let transports = local_transports(&cfgs[0]).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = transports
            .into_iter()
            .zip(cfgs)
            .enumerate()
            .map(|(c, (t, cfg))| {
                s.spawn(move || {
                    let opts = DsmOptions {
                        region_base: Some(base(slot, c)),
                        ..DsmOptions::default()
                    };
                    Dsm::join_with(t, &cfg, opts)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn job(slot: usize, cfg: &JobConfig) -> Vec<Dsm> {
    join_all(slot, vec![cfg.clone(); cfg.clusters.len()])
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

/// Runs `f` on every cluster concurrently (one thread per cluster) and collects results.
fn on_each<R: Send>(dsms: Vec<Dsm>, f: impl Fn(Dsm) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = dsms.into_iter().map(|d| s.spawn(|| f(d))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The message kinds with a bulk body (and the runtime's bulk messages).
const BULK_KINDS: [&str; 10] = [
    "GetPage",
    "Diff",
    "Update",
    "LockAcquire",
    "LockGrant",
    "LockRelease",
    "BarrierArrive",
    "BarrierDepart",
    "Stats",
    "Abort",
];

fn counter(slot: usize, protocol: Protocol) {
    let per_thread = 2000u64;
    let cfg = config(2, 2, protocol);
    let results = on_each(job(slot, &cfg), |mut dsm| {
        let c = dsm.alloc::<u64>(1).unwrap();
        dsm.run(|w| {
            for _ in 0..per_thread {
                let _g = w.lock(0).unwrap();
                c.set(0, c.get(0) + 1);
            }
        })
        .unwrap();
        let v = c.get(0);
        (v, dsm.finish().unwrap())
    });
    for (v, stats) in &results {
        assert_eq!(*v, 4 * per_thread);
        // Every cluster gets the same job totals.
        assert_eq!(stats.total, results[0].1.total);
        assert_eq!(stats.clusters.len(), 2);
    }
    let total = &results[0].1.total;
    println!(
        "{protocol:?}: {} Express messages rode in bundles",
        total.express_bundled_sent
    );
    assert_eq!(total.lock_acquires, 4 * per_thread);
    assert!(
        total.lock_local_handoffs > 0,
        "a cluster's threads reuse the cached lock or pass it on"
    );
    assert_eq!(
        total.barriers, 4,
        "the end of run and finish, at both clusters"
    );
    // Every protocol message sent was received.
    for (kind, n) in &total.messages_sent {
        if !["Noop", "Stats", "Abort"].contains(&kind.as_str()) {
            assert_eq!(total.messages_received.get(kind), Some(n), "{kind}");
        }
    }
    // A recall that rode in the bundle of the grant before it (some do here, as many
    // as a few hundred a run, none in some runs) counts as sent of its kind, with no
    // bulk bytes: its part is its payload alone.
    assert!(total.express_bundled_sent <= total.bundled_messages_sent);
    for kind in total.bulk_bytes_sent.keys() {
        assert!(
            BULK_KINDS.contains(&kind.as_str()),
            "bulk bytes counted for {kind}: {:?}",
            total.bulk_bytes_sent
        );
    }
    // Every acquire is served either inside the cluster (by the runtime's lock cache or
    // by the machine) or by the grant answering its request; every grant answers a
    // request or is a push.
    let p = &total.protocol;
    assert_eq!(
        total.lock_acquires,
        p.lock_acquires + total.lock_runtime_acquires
    );
    assert!(total.lock_runtime_acquires <= total.lock_local_handoffs);
    assert_eq!(
        total.lock_acquires - total.lock_local_handoffs,
        p.lock_requests
    );
    assert_eq!(p.lock_grants, p.lock_requests + p.lock_pushes_received);
}

/// A lock held for 50 ms by cluster 0 while cluster 1 asks for it: cluster 1's acquire
/// is among its slow lock waits, with the wait it took, and the job total sums the
/// clusters'.
#[test]
fn a_lock_held_elsewhere_is_reported_among_the_slow_lock_waits() {
    let cfg = config(2, 1, Protocol::Hlrc);
    let results = on_each(job(19, &cfg), |dsm| {
        dsm.run(|w| {
            if w.cluster() == 0 {
                let _g = w.lock(3).unwrap();
                w.barrier().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(50));
            } else {
                w.barrier().unwrap();
                drop(w.lock(3).unwrap());
            }
        })
        .unwrap();
        dsm.finish().unwrap()
    });
    let stats = &results[0];
    let waited = stats.clusters[1].slow_lock_waits[&3];
    assert!(waited.acquires >= 1, "{waited:?}");
    assert!(
        waited.wait_ns >= 30_000_000,
        "cluster 1 waited for the holder's 50 ms: {waited:?}"
    );
    assert!(stats.clusters[1].slow_lock_waits_all.wait_ns >= waited.wait_ns);
    assert_eq!(
        stats.total.slow_lock_waits[&3].wait_ns,
        waited.wait_ns + {
            stats.clusters[0]
                .slow_lock_waits
                .get(&3)
                .map_or(0, |w| w.wait_ns)
        }
    );
}

/// `dsm.wait_spin_us` decides whether a thread waiting at a barrier sleeps: cluster 1's
/// thread waits 50 ms for cluster 0's; with no spin it goes to sleep (the report counts
/// it), with a 1 s spin it polls the whole 50 ms and never sleeps.
#[test]
fn wait_spin_decides_whether_a_waiting_thread_sleeps() {
    let sleeps = |slot: usize, spin_us: u64| {
        let mut cfg = config(2, 1, Protocol::Hlrc);
        cfg.dsm.wait_spin_us = spin_us;
        let results = on_each(job(slot, &cfg), |dsm| {
            dsm.run(|w| {
                if w.cluster() == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                w.barrier().unwrap();
            })
            .unwrap();
            dsm.finish().unwrap()
        });
        let waiting = &results[0].clusters[1];
        assert!(
            waiting.time.barrier_ns >= 30_000_000,
            "cluster 1 waited for cluster 0's 50 ms at the barrier: {:?}",
            waiting.time
        );
        waiting.time.sleeps
    };
    assert!(
        sleeps(41, 0) >= 1,
        "with dsm.wait_spin_us = 0 the waiting thread sleeps"
    );
    assert_eq!(
        sleeps(42, 1_000_000),
        0,
        "with dsm.wait_spin_us = 1 s the waiting thread polls through the 50 ms"
    );
}

/// `DsmOptions::protocol_cpus` binds each cluster's protocol thread to the CPUs given
/// (the report names them), and a CPU the kernel cannot name leaves it on the process's
/// CPUs without failing the job.
#[test]
fn the_protocol_thread_runs_on_the_cpus_it_is_given() {
    // Each cluster's (process CPUs, protocol thread CPUs), as the statistics list them.
    let run = |slot: usize, cpus: Option<Vec<usize>>| {
        let cfg = config(2, 1, Protocol::Hlrc);
        let transports = local_transports(&cfg).unwrap();
        let dsms: Vec<Dsm> = std::thread::scope(|s| {
            let hs: Vec<_> = transports
                .into_iter()
                .enumerate()
                .map(|(c, t)| {
                    let (cfg, cpus) = (&cfg, cpus.clone());
                    s.spawn(move || {
                        let opts = DsmOptions {
                            region_base: Some(base(slot, c)),
                            protocol_cpus: cpus,
                            ..DsmOptions::default()
                        };
                        Dsm::join_with(t, cfg, opts).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let results = on_each(dsms, |mut dsm| {
            let a = dsm.alloc::<u64>(1).unwrap();
            dsm.run(|w| {
                if w.cluster() == 1 {
                    a.set(0, 7);
                }
                w.barrier().unwrap();
                assert_eq!(a.get(0), 7);
            })
            .unwrap();
            dsm.finish().unwrap()
        });
        results[0]
            .clusters
            .iter()
            .map(|c| (c.cpus.clone(), c.protocol_cpus.clone()))
            .collect::<Vec<(String, String)>>()
    };
    let unbound = run(44, None);
    assert_eq!(
        unbound.iter().map(|c| c.1.as_str()).collect::<Vec<_>>(),
        vec!["", ""]
    );
    // The last CPU this process may use: "0-3,8" ends with 8, "0-3" with 3.
    let list = unbound[0].0.clone();
    let last: usize = list.rsplit([',', '-']).next().unwrap().parse().unwrap();
    assert_eq!(
        run(43, Some(vec![last]))
            .into_iter()
            .map(|c| c.1)
            .collect::<Vec<_>>(),
        vec![last.to_string(), last.to_string()],
        "each protocol thread bound to CPU {last}, the last of {list}"
    );
    assert_eq!(
        run(45, Some(vec![1 << 20]))
            .into_iter()
            .map(|c| c.1)
            .collect::<Vec<_>>(),
        vec![String::new(), String::new()],
        "a CPU the kernel cannot name: the thread stays on the process's CPUs"
    );
}

#[test]
fn counter_under_a_lock_hlrc() {
    counter(0, Protocol::Hlrc);
}

#[test]
fn counter_under_a_lock_sc() {
    counter(1, Protocol::Sc);
}

fn visibility(slot: usize, cfg: JobConfig) {
    on_each(job(slot, &cfg), |mut dsm| {
        let words = 3 * 512 + 7;
        let a = dsm.alloc::<u64>(words).unwrap();
        let b = dsm.alloc::<[f32; 4]>(1000).unwrap();
        dsm.run(|w| {
            let (t, n) = (w.thread_id(), w.threads());
            for round in 1..=3u64 {
                for i in (t..words).step_by(n) {
                    a.set(i, round * 1_000_000 + i as u64);
                }
                for i in (t..b.len()).step_by(n) {
                    b.set(i, [round as f32, i as f32, -(i as f32), 0.5]);
                }
                w.barrier().unwrap();
                for i in 0..words {
                    assert_eq!(a.get(i), round * 1_000_000 + i as u64, "word {i}");
                }
                for i in 0..b.len() {
                    assert_eq!(b.get(i), [round as f32, i as f32, -(i as f32), 0.5]);
                }
                w.barrier().unwrap();
            }
        })
        .unwrap();
        dsm.finish().unwrap();
    });
}

#[test]
fn writes_before_a_barrier_are_visible_after_it() {
    visibility(2, config(2, 2, Protocol::Hlrc));
    visibility(3, config(2, 2, Protocol::Sc));
}

/// `dsm.populate = false`: each page is allocated at its first install (`UFFDIO_COPY`),
/// and later installs of the same page map it again from the memfd; the protocols see
/// no difference.
#[test]
fn writes_are_visible_with_pages_allocated_at_first_touch() {
    for (slot, protocol) in [(26, Protocol::Hlrc), (27, Protocol::Sc)] {
        let mut cfg = config(2, 2, protocol);
        cfg.dsm.populate = false;
        visibility(slot, cfg);
    }
}

#[test]
fn first_touch_and_block_homes() {
    for (i, home) in [HomePolicy::FirstTouch, HomePolicy::Block]
        .into_iter()
        .enumerate()
    {
        for (j, protocol) in [Protocol::Hlrc, Protocol::Sc].into_iter().enumerate() {
            let mut cfg = config(3, 1, protocol);
            cfg.dsm.home = home;
            visibility(4 + 2 * i + j, cfg);
        }
    }
}

#[test]
fn every_cluster_times_its_flush_before_a_barrier_arrival() {
    // Each cluster writes one word in each of 64 pages, half of them homed at the other
    // cluster, then both pass a barrier: each flushes before its arrival. The barrier
    // manager (cluster 0) delivers its own arrival without a message, and counts its
    // flush all the same.
    let pages = 64;
    let stats = on_each(job(20, &config(2, 1, Protocol::Hlrc)), |mut dsm| {
        let a = dsm.alloc::<u64>(pages * 512).unwrap();
        let cluster = dsm.cluster();
        dsm.run(|w| {
            for p in 0..pages {
                a.set(p * 512 + w.cluster(), 1);
            }
            w.barrier().unwrap();
        })
        .unwrap();
        let s = dsm.stats();
        dsm.finish().unwrap();
        (cluster, s)
    });
    for (c, s) in &stats {
        // The workers' barrier and the one that ends `run`.
        assert_eq!(s.barriers, 2, "cluster {c}: {s:?}");
        assert_eq!(s.protocol.barrier_arrivals, 2, "cluster {c}: {s:?}");
        assert!(s.protocol.diffs_sent > 0, "cluster {c}: {s:?}");
        let t = &s.time;
        assert!(
            t.barrier_flush_ns > 0 && t.barrier_flush_ns <= t.barrier_global_ns,
            "cluster {c}: flush {} ns of the barrier's {} ns",
            t.barrier_flush_ns,
            t.barrier_global_ns
        );
    }
}

#[test]
fn concurrent_faults_on_one_page_cause_one_fetch() {
    let cfg = config(2, 8, Protocol::Hlrc);
    let stats = on_each(job(8, &cfg), |mut dsm| {
        let a = dsm.alloc::<u64>(4096).unwrap();
        let cluster = dsm.cluster();
        dsm.run(|w| {
            w.barrier().unwrap();
            // All eight threads of cluster 1 read page 2 (homed at cluster 0, not valid at
            // cluster 1) at once.
            if w.cluster() == 1 {
                assert_eq!(a.get(2 * 512 + w.local_id()), 0);
            }
        })
        .unwrap();
        let s = dsm.stats();
        dsm.finish().unwrap();
        (cluster, s)
    });
    let (_, s1) = stats.iter().find(|(c, _)| *c == 1).unwrap();
    // One fetch of page 2, however many of the eight threads faulted on it: those that
    // faulted while it was being fetched joined that fetch (coalesced), those that
    // faulted just after it was installed were answered at once (spurious). (The
    // other fetches are prefetches of the next pages homed at cluster 0.)
    let p = &s1.protocol;
    println!(
        "read faults {}, coalesced {}, spurious {}, fetches {}, prefetches {}",
        s1.read_faults, p.coalesced_faults, p.spurious_faults, p.remote_fetches, p.prefetches
    );
    assert_eq!(p.remote_fetches - p.prefetches, 1, "{s1:?}");
    assert!(s1.read_faults >= 1 && s1.read_faults <= 8, "{s1:?}");
    assert_eq!(
        s1.read_faults,
        1 + p.coalesced_faults + p.spurious_faults,
        "{s1:?}"
    );
}

#[test]
fn a_release_larger_than_the_message_pool_completes() {
    // Each cluster dirties every page of the region (disjoint words): 8192 diffs to the
    // other cluster at one barrier, twice the Tag-On pool.
    let cfg = config(2, 1, Protocol::Hlrc);
    on_each(job(9, &cfg), |mut dsm| {
        let pages = dsm.region_len() / 4096;
        assert!(pages / 2 > transport::POOL_SLOTS);
        let a = dsm.alloc::<u64>(pages * 512).unwrap();
        dsm.run(|w| {
            let c = w.cluster();
            for p in 0..pages {
                a.set(p * 512 + c, (p * 10 + c) as u64);
            }
            w.barrier().unwrap();
            for p in (0..pages).step_by(97) {
                for c in 0..2 {
                    assert_eq!(a.get(p * 512 + c), (p * 10 + c) as u64);
                }
            }
        })
        .unwrap();
        dsm.finish().unwrap();
    });
}

#[test]
fn clusters_with_different_configurations_refuse_to_start() {
    let a = config(2, 1, Protocol::Hlrc);
    let b = config(2, 1, Protocol::Sc);
    for r in join_all(10, vec![a, b]) {
        let e = r.unwrap_err();
        assert!(matches!(e, DsmError::ConfigMismatch { .. }), "{e}");
        assert!(e.to_string().contains("different DSM configuration"), "{e}");
    }
}

#[test]
fn a_panicking_thread_aborts_the_job_everywhere() {
    let cfg = config(2, 2, Protocol::Hlrc);
    let results = on_each(job(11, &cfg), |dsm| {
        let r = dsm.run(|w| {
            if w.thread_id() == 3 {
                panic!("boom in thread 3");
            }
            w.barrier()
        });
        (dsm.cluster(), r)
    });
    for (c, r) in results {
        let e = r.expect_err("the job must fail");
        let text = e.to_string();
        if c == 1 {
            assert!(
                matches!(e, DsmError::ThreadPanicked { thread: 3, .. }),
                "{text}"
            );
        } else {
            assert!(
                matches!(e, DsmError::PeerFailed { cluster: 1, .. }),
                "{text}"
            );
        }
        assert!(
            text.contains("boom in thread 3") || text.contains("thread 3"),
            "{text}"
        );
    }
}

#[test]
fn allocation_is_bounded_and_page_aligned() {
    let cfg = config(1, 1, Protocol::Hlrc);
    let mut dsm = job(12, &cfg).pop().unwrap();
    let a = dsm.alloc::<u64>(3).unwrap();
    let b = dsm.alloc::<[f64; 2]>(1).unwrap();
    assert_eq!(a.addr(), dsm.region_base());
    assert_eq!(b.addr(), dsm.region_base() + 4096);
    assert!(matches!(dsm.alloc::<()>(1), Err(DsmError::Config { .. })));
    let e = dsm.alloc::<[f32; 3]>(1).unwrap_err();
    assert!(e.to_string().contains("multiple of 8 bytes"), "{e}");
    let e = dsm.alloc::<u64>(dsm.region_len()).unwrap_err();
    assert!(matches!(e, DsmError::OutOfSpace { .. }), "{e}");
    assert!(e.to_string().contains("dsm.region_size"), "{e}");
    assert_eq!(dsm.alloc_locks(10).unwrap(), 0);
    assert_eq!(dsm.alloc_locks(1).unwrap(), 10);
    assert!(dsm.lock(1 << 20).is_err());
    // A single cluster works on its own (every page homed here).
    dsm.run(|w| {
        a.set(w.local_id(), 9);
        w.barrier().unwrap();
    })
    .unwrap();
    assert_eq!(a.to_vec(), vec![9, 0, 0]);
    let (base, len) = (dsm.region_base(), dsm.region_len());
    let stats = dsm.finish().unwrap();
    assert_eq!(stats.total.remote_faults, 0);
    // The region stays mapped while arrays refer to it, and is unmapped with the last.
    assert_eq!(a.get(0), 9);
    let again = || {
        uffd::Region::new(
            uffd::RegionConfig::new(base, len),
            std::sync::Arc::new(|_: &uffd::RegionOps, _: uffd::Fault| {}),
        )
    };
    assert!(matches!(
        again(),
        Err(uffd::RegionError::Map(uffd::MapError::AddressTaken { .. }))
    ));
    drop((a, b));
    again().expect("the region is unmapped once the runtime and its arrays are gone");
}

#[test]
fn diffs_to_one_home_travel_in_bundles() {
    // Both clusters write a word of every page: at the barrier each flushes the pages
    // homed at the other in one event, whose Diff messages to that home are bundled.
    let cfg = config(2, 1, Protocol::Hlrc);
    let pages = 64;
    let results = on_each(job(13, &cfg), |mut dsm| {
        let a = dsm.alloc::<u64>(pages * 512).unwrap();
        dsm.run(|w| {
            let c = w.cluster();
            for round in 1..=2 {
                for p in 0..pages {
                    a.set(p * 512 + c, (round * 1000 + p * 10 + c) as u64);
                }
                w.barrier().unwrap();
                for p in 0..pages {
                    for c in 0..2 {
                        assert_eq!(a.get(p * 512 + c), (round * 1000 + p * 10 + c) as u64);
                    }
                }
                w.barrier().unwrap();
            }
        })
        .unwrap();
        dsm.finish().unwrap()
    });
    let total = &results[0].total;
    println!(
        "bundles sent {}, messages in them {} ({} Express), Diff sent {:?}",
        total.bundles_sent,
        total.bundled_messages_sent,
        total.express_bundled_sent,
        total.messages_sent.get("Diff")
    );
    assert!(total.bundles_sent > 0, "{total:?}");
    assert!(total.bundled_messages_sent >= 2 * total.bundles_sent);
    assert_eq!(total.bundles_sent, total.bundles_received);
    assert_eq!(total.bundled_messages_sent, total.bundled_messages_received);
    // Bundles are not a kind of their own: the messages inside are counted.
    assert!(!total.messages_sent.contains_key("Bundle"));
    assert!(!total.messages_received.contains_key("Bundle"));
    for (kind, n) in &total.messages_sent {
        if !["Noop", "Stats", "Abort"].contains(&kind.as_str()) {
            assert_eq!(total.messages_received.get(kind), Some(n), "{kind}");
        }
    }
    // One message-layer bulk message per bundle and per message sent alone; Express
    // messages may ride in the bundle before them.
    assert!(total.express_bundled_sent <= total.bundled_messages_sent);
    let bulk_kinds: u64 = BULK_KINDS
        .iter()
        .filter_map(|k| total.messages_sent.get(*k))
        .sum();
    assert_eq!(
        total.layer.bulk_sent,
        bulk_kinds - (total.bundled_messages_sent - total.express_bundled_sent)
            + total.bundles_sent,
        "{total:?}"
    );
}

/// Producer–consumer across barriers (EM3D's pattern): cluster 0 rewrites 16 pages every
/// phase, cluster 1 reads them after each barrier. With `dsm.barrier_updates` on, the
/// home's diffs reach the reader's copies at the barrier, so after the first phases the
/// reader fetches nothing; off, every phase invalidates the copies and the reader fetches
/// them again. The values are checked either way.
fn producer_consumer(slot: usize, updates: BarrierUpdates) -> ClusterStats {
    let mut cfg = config(2, 1, Protocol::Hlrc);
    cfg.dsm.barrier_updates = updates;
    cfg.dsm.prefetch = 0;
    let pages = 16;
    let phases = 12u64;
    let results = on_each(job(slot, &cfg), |mut dsm| {
        let a = dsm.alloc::<u64>(pages * 512).unwrap();
        dsm.run(|w| {
            for phase in 1..=phases {
                if w.cluster() == 0 {
                    for i in 0..pages * 512 {
                        a.set(i, phase * 100_000 + i as u64);
                    }
                }
                w.barrier().unwrap();
                if w.cluster() == 1 {
                    for i in (0..pages * 512).step_by(61) {
                        assert_eq!(a.get(i), phase * 100_000 + i as u64, "phase {phase}");
                    }
                }
                w.barrier().unwrap();
            }
        })
        .unwrap();
        dsm.finish().unwrap()
    });
    results.into_iter().next().unwrap().total
}

#[test]
fn barrier_updates_replace_refetches() {
    let on = producer_consumer(14, BarrierUpdates::On);
    let off = producer_consumer(15, BarrierUpdates::Off);
    println!(
        "updates on: {} fetches, {} updates applied; off: {} fetches",
        on.remote_fetches, on.protocol.updates_applied, off.remote_fetches
    );
    // Off: the reader fetches its 16 pages in (almost) every one of the 12 phases.
    assert!(off.remote_fetches >= 16 * 10, "{off:?}");
    assert_eq!(off.protocol.updates_sent, 0);
    // On: the first phases fetch (before the home migrates to the writer and the
    // reader holds copies); then the updates keep the copies current.
    assert!(on.protocol.updates_applied >= 16 * 8, "{on:?}");
    assert!(on.remote_fetches <= 16 * 3, "{on:?}");
}

/// A liveness oracle that, once tripped, reports cluster `.1` failed (ends a
/// deadlocked test; a cluster ignores reports of its own failure).
struct Trip(std::sync::Arc<std::sync::atomic::AtomicBool>, usize);

impl Liveness for Trip {
    fn failure(&self) -> Option<(usize, String)> {
        self.0
            .load(std::sync::atomic::Ordering::Acquire)
            .then(|| (self.1, "the test ended the deadlock".to_owned()))
    }
}

/// The progress watchdog's evidence: a cluster whose thread computes is not stalled
/// while the other waits at a barrier; once the computing thread blocks on the lock
/// the waiting one holds (an application deadlock), both clusters report a stall that
/// names what each thread waits for.
#[test]
fn a_deadlock_shows_as_a_stall_naming_every_wait() {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};
    let cfg = config(2, 1, Protocol::Hlrc);
    let trip = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut transports = local_transports(&cfg).unwrap();
    for (c, t) in transports.iter_mut().enumerate() {
        t.liveness = Arc::new(Trip(Arc::clone(&trip), 1 - c));
    }
    let dsms: Vec<Dsm> = std::thread::scope(|s| {
        let hs: Vec<_> = transports
            .into_iter()
            .enumerate()
            .map(|(c, t)| {
                let cfg = &cfg;
                s.spawn(move || {
                    let opts = DsmOptions {
                        region_base: Some(base(16, c)),
                        ..DsmOptions::default()
                    };
                    Dsm::join_with(t, cfg, opts).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let probes: Vec<StallProbe> = dsms.iter().map(Dsm::stall_probe).collect();
    let (go, computing) = std::sync::mpsc::channel::<()>();
    let computing = std::sync::Mutex::new(computing);
    let locked = std::sync::Barrier::new(2);
    let wait_for = |what: &str, f: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    std::thread::scope(|s| {
        let runs: Vec<_> = dsms
            .into_iter()
            .map(|mut dsm| {
                let (computing, locked) = (&computing, &locked);
                s.spawn(move || {
                    let lock = dsm.alloc_locks(1).unwrap();
                    let c = dsm.cluster();
                    let r = dsm.run(|w| {
                        if c == 0 {
                            let _held = w.lock(lock)?;
                            locked.wait();
                            w.barrier()
                        } else {
                            locked.wait();
                            // "Computes" until the test lets it go on.
                            computing.lock().unwrap().recv().unwrap();
                            w.lock(lock).map(drop)
                        }
                    });
                    (
                        c,
                        r.and_then(|v| v.into_iter().collect::<Result<Vec<()>, _>>()),
                    )
                })
            })
            .collect();
        // Cluster 0 waits at the barrier holding the lock; cluster 1 computes.
        wait_for("cluster 0's stall", &|| probes[0].stall().is_some());
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            probes[1].stall(),
            None,
            "a computing cluster is not stalled"
        );
        let s0 = probes[0].stall().expect("still waiting");
        assert!(s0.duration >= Duration::from_millis(50), "{s0:?}");
        assert!(
            s0.waits.iter().any(|w| w.contains("at a barrier")),
            "{s0:?}"
        );
        // Now cluster 1 asks for the lock cluster 0 holds: a deadlock.
        go.send(()).unwrap();
        wait_for("cluster 1's stall", &|| {
            probes[1]
                .stall()
                .is_some_and(|s| s.duration >= Duration::from_millis(50))
        });
        let s1 = probes[1].stall().unwrap();
        assert!(
            s1.waits.iter().any(|w| w.contains("acquiring lock")),
            "{s1:?}"
        );
        assert!(probes[0].stall().is_some(), "cluster 0 still waits");
        trip.store(true, Ordering::Release);
        for h in runs {
            let (c, r) = h.join().unwrap();
            let e = r.expect_err("the tripped job fails");
            assert!(
                e.to_string().contains("ended the deadlock"),
                "cluster {c}: {e}"
            );
        }
    });
}

/// The clusters of `cfg` joined over INI threads on UDP loopback (so that their messages
/// to each other count as network messages); keep the INI groups as long as the runtimes.
fn network_job(
    slot: usize,
    cfg: &JobConfig,
) -> (Vec<Dsm>, Vec<multigrain_messaging::net::IniGroup>) {
    let (transports, inis) = transport::loopback_network_transports(cfg).unwrap();
    let dsms = std::thread::scope(|s| {
        let hs: Vec<_> = transports
            .into_iter()
            .enumerate()
            .map(|(c, t)| {
                s.spawn(move || {
                    let opts = DsmOptions {
                        region_base: Some(base(slot, c)),
                        ..DsmOptions::default()
                    };
                    Dsm::join_with(t, cfg, opts).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (dsms, inis)
}

/// Runs a job of 2 clusters × 3 threads over UDP in which the compute threads for which
/// `talks(cluster, local)` each write 16 pages of their own (homes alternate between the
/// clusters, no prefetch: 8 fetches each) and take a lock managed by the other cluster;
/// returns each cluster's
/// statistics from `finish`, after checking that every network message is counted for
/// exactly one thread.
fn sends_by_thread(slot: usize, talks: fn(usize, usize) -> bool) -> Vec<ClusterStats> {
    let mut cfg = config(2, 3, Protocol::Hlrc);
    cfg.dsm.home = HomePolicy::RoundRobin;
    cfg.dsm.prefetch = 0;
    cfg.ini.substrate = multigrain_cluster_config::Substrate::Udp;
    cfg.ini.inline = false;
    let (dsms, _inis) = network_job(slot, &cfg);
    let jobs = on_each(dsms, |mut dsm| {
        let a = dsm.alloc::<u64>(6 * 16 * 512).unwrap();
        dsm.run(|w| {
            if talks(w.cluster(), w.local_id()) {
                for page in 16 * w.thread_id()..16 * (w.thread_id() + 1) {
                    a.set(page * 512, 1);
                }
                // Lock 1 - c is managed by the other cluster.
                let _g = w.lock(1 - w.cluster() as u32).unwrap();
                a.set(16 * w.thread_id() * 512 + 1, 2);
            }
        })
        .unwrap();
        dsm.finish().unwrap()
    });
    let job = &jobs[0];
    for c in &job.clusters {
        assert_eq!(c.messages_sent_by_thread.len(), 3, "{c:?}");
        let by_threads: u64 = c.messages_sent_by_thread.iter().sum();
        assert_eq!(
            by_threads + c.messages_sent_by_protocol_thread + c.messages_sent_by_other_threads,
            c.layer.substrate_network,
            "every network message is one thread's: {c:?}"
        );
        assert!(c.layer.substrate_network > 0, "{c:?}");
    }
    // The job total lists the job's threads in order.
    let all: Vec<u64> = job
        .clusters
        .iter()
        .flat_map(|c| c.messages_sent_by_thread.iter().copied())
        .collect();
    assert_eq!(job.total.messages_sent_by_thread, all);
    job.clusters.clone()
}

#[test]
fn network_messages_are_counted_for_the_thread_that_sent_them() {
    // Only thread 0 of cluster 0 communicates: every other compute thread sends nothing.
    let c = sends_by_thread(17, |cluster, local| cluster == 0 && local == 0);
    let (c0, c1) = (&c[0], &c[1]);
    // 8 pages homed at cluster 1 fetched, their diffs sent, a lock requested.
    assert!(c0.messages_sent_by_thread[0] >= 8, "{c0:?}");
    assert_eq!(c0.messages_sent_by_thread[1..], [0, 0], "{c0:?}");
    assert_eq!(c1.messages_sent_by_thread, [0, 0, 0], "{c1:?}");
    // Cluster 1 answered them from its protocol thread or from the thread that waits
    // in the barrier ending the parallel section.
    assert!(
        c1.messages_sent_by_protocol_thread + c1.messages_sent_by_other_threads >= 8,
        "{c1:?}"
    );
    // Every thread communicates: each compute thread sent some.
    let c = sends_by_thread(18, |_, _| true);
    for c in &c {
        assert!(
            c.messages_sent_by_thread.iter().all(|&n| n > 0),
            "{:?}",
            c.messages_sent_by_thread
        );
    }
}

/// Software write detection (`WriteMarks`): a flush reads only the pages a store marked,
/// so a store must mark every page it touched. The two clusters take turns under one
/// lock; each turn checks the other cluster's last values and writes new ones: an
/// element of 24 bytes whose last word is the only store to the next page, and a range
/// write whose tail is the only store to the next page. Both pages stay open across the
/// turns (no barrier in between), so a missed mark would leave the next holder the old
/// value.
#[test]
fn stores_across_a_page_boundary_reach_the_next_lock_holder() {
    let turns = 200u64;
    let cfg = config(2, 1, Protocol::Hlrc);
    on_each(job(21, &cfg), |mut dsm| {
        let count = dsm.alloc::<u64>(1).unwrap();
        // Element 170 covers bytes 4080..4104: two words on page 0, one on page 1.
        let straddling = dsm.alloc::<[u64; 3]>(200).unwrap();
        // Words 508..516 cover the last 4 words of page 0 and the first 4 of page 1.
        let range = dsm.alloc::<u64>(1024).unwrap();
        dsm.run(|w| {
            let me = w.cluster() as u64;
            let mut done = 0;
            while done < turns {
                let _g = w.lock(0).unwrap();
                let n = count.get(0);
                if n % 2 != me {
                    drop(_g);
                    std::thread::yield_now();
                    continue;
                }
                if n > 0 {
                    assert_eq!(straddling.get(170), [n, n + 1, n + 2], "turn {n}");
                    let mut got = [0u64; 8];
                    range.read(508, &mut got);
                    assert_eq!(got, std::array::from_fn(|k| n * 100 + k as u64), "turn {n}");
                }
                let m = n + 1;
                straddling.set(170, [m, m + 1, m + 2]);
                range.write(
                    508,
                    &std::array::from_fn::<u64, 8, _>(|k| m * 100 + k as u64),
                );
                count.set(0, m);
                done += 1;
            }
        })
        .unwrap();
        assert_eq!(count.get(0), 2 * turns);
        dsm.finish().unwrap()
    });
}

/// Stores `value` at element `i` of `a` without marking its page written: the state of
/// a [`SharedArray::set`] whose thread has stored and not yet marked (preempted between
/// the two).
fn store_unmarked(a: &SharedArray<u64>, i: usize, value: u64) {
    assert!(i < a.len(), "element {i} of {}", a.len());
    // SAFETY: element `i` lies inside the array, inside the region mapping, which lives
    // as long as the `Dsm` that `a` came from (alive for the whole parallel section that
    // calls this); the address is 8-aligned (the array starts on a page). Region memory
    // is only ever accessed atomically, and a fault in the store is served by the
    // runtime's SIGBUS resolver in this compute thread, after which the store re-executes.
    let word = unsafe { &*((a.addr() + 8 * i) as *const std::sync::atomic::AtomicU64) };
    word.store(value, std::sync::atomic::Ordering::Relaxed);
}

/// A store that has landed but whose write mark has not yet (`SharedArray::set` stores,
/// then marks) must reach the home when the flush after it *closes* the page, since a
/// closed page is never flushed again. Here the stores are never marked, and
/// `idle_flushes = 0` closes every open page at the barrier's flush. Before the fix
/// (thirty-ninth session) such a flush dropped the twin of an unmarked page without
/// comparing it, and the other cluster read the old values (about one Water run in 150
/// on 2×2 ended with wrong energies that way).
#[test]
fn a_store_whose_mark_is_late_reaches_the_home_when_its_page_closes() {
    let pages = 8;
    let mut cfg = config(2, 1, Protocol::Hlrc);
    cfg.dsm.home = HomePolicy::RoundRobin;
    cfg.dsm.idle_flushes = 0;
    on_each(job(22, &cfg), |mut dsm| {
        let a = dsm.alloc::<u64>(pages * 512).unwrap();
        dsm.run(|w| {
            let me = w.cluster();
            for round in 1..=3u64 {
                // Half the pages are homed at the other cluster: their stores reach it
                // only as diffs.
                for page in 0..pages {
                    store_unmarked(&a, page * 512 + me, round * 100 + page as u64);
                }
                w.barrier().unwrap();
                for page in 0..pages {
                    for writer in 0..2 {
                        assert_eq!(
                            a.get(page * 512 + writer),
                            round * 100 + page as u64,
                            "round {round}: cluster {writer}'s store to page {page}, \
                             read by cluster {me}"
                        );
                    }
                }
                w.barrier().unwrap();
            }
        })
        .unwrap();
        dsm.finish().unwrap()
    });
}

/// The calling thread's scheduling policy as `/proc/thread-self/sched` shows it
/// (`SCHED_OTHER` 0, `SCHED_BATCH` 3).
fn own_policy() -> u32 {
    let sched = std::fs::read_to_string("/proc/thread-self/sched").unwrap();
    let line = sched
        .lines()
        .find(|l| l.starts_with("policy"))
        .expect("a policy line");
    line.rsplit(':').next().unwrap().trim().parse().unwrap()
}

/// `dsm.thread_policy`: the compute threads run `SCHED_BATCH` by default, so that their
/// wake-ups do not preempt the thread on their CPU, and keep the normal policy with
/// `normal`.
#[test]
fn compute_threads_take_the_configured_scheduling_policy() {
    use multigrain_cluster_config::ThreadPolicy;
    for (slot, policy, expected) in [(23, ThreadPolicy::Batch, 3), (24, ThreadPolicy::Normal, 0)] {
        let mut cfg = config(2, 2, Protocol::Hlrc);
        cfg.dsm.thread_policy = policy;
        let seen = on_each(job(slot, &cfg), |dsm| {
            let seen = dsm.run(|_| own_policy()).unwrap();
            dsm.finish().unwrap();
            seen
        });
        assert_eq!(
            seen,
            vec![vec![expected; 2]; 2],
            "dsm.thread_policy = {policy}: the policy of each compute thread"
        );
    }
}

/// A page whose mapping the kernel drops behind the runtime's back (reclaim writing a
/// shared-memory page to swap; here `MADV_DONTNEED` on the region, the same zap) faults on
/// its next access although the protocol holds it. On a kernel with minor faults the
/// runtime maps it again with its contents and protection (without it, the access would
/// fault forever); elsewhere the kernel maps it back by itself.
#[test]
fn a_present_page_whose_mapping_the_kernel_dropped_is_mapped_again() {
    let k = uffd::probe(true).unwrap();
    let minor = k.available.contains(uffd::Features::MINOR_SHMEM)
        && k.available.contains(uffd::Features::WP_UNPOPULATED);
    if !minor {
        eprintln!("NOTE: no minor faults on shared memory here: the kernel remaps by itself");
    }
    let cfg = config(1, 1, Protocol::Hlrc);
    let mut dsm = job(25, &cfg).pop().unwrap();
    let written = dsm.alloc::<u64>(512).unwrap();
    let read_only = dsm.alloc::<u64>(512).unwrap();
    let zap = |addr: usize| {
        // SAFETY: `addr` is the first page of an array of the region, mapped while the
        // arrays live; MADV_DONTNEED on this shared mapping only unmaps the page (its
        // contents stay in the region's memfd), as reclaim does.
        let r = unsafe { libc::madvise(addr as *mut libc::c_void, 4096, libc::MADV_DONTNEED) };
        assert_eq!(r, 0, "madvise: {}", std::io::Error::last_os_error());
    };
    // Not a scoped thread: a stuck one must not keep the test from failing.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = dsm.run(|_| {
            written.set(3, 33); // a private home page, writable
            assert_eq!(read_only.get(3), 0); // installed read-only
            zap(written.addr());
            zap(read_only.addr());
            let seen = (written.get(3), read_only.get(3));
            written.set(4, 44); // still writable
            read_only.set(4, 55); // a write-protect fault, as before the zap
            (seen, written.get(4), read_only.get(4))
        });
        let _ = tx.send(r.map(|r| (r, dsm.finish())));
    });
    let (seen, stats) = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("cluster 0 stuck: the zapped pages' faults were not resolved in 30 s")
        .unwrap();
    assert_eq!(seen, vec![((33, 0), 44, 55)]);
    let stats = stats.unwrap();
    assert_eq!(
        stats.total.pages_remapped,
        if minor { 2 } else { 0 },
        "{stats:?}"
    );
    // Both pages were populated at their allocation (`dsm.populate`): their installs
    // mapped memory already in place.
    assert_eq!(stats.total.pages_installed, 2, "{stats:?}");
    assert_eq!(
        stats.total.pages_installed_in_place,
        if minor { 2 } else { 0 },
        "{stats:?}"
    );
}

/// Two clusters pass a lock back and forth far more often than one message's interval
/// records hold (1 MiB for this job's 1 MiB region), with no barrier between: at the
/// closing barrier both send the barrier manager (cluster 0) an arrival in pieces at
/// once, and it puts each sender's back together apart (`dsm/src/pieces.rs`). Cluster
/// 0, which took no part, then reads the count both made.
#[test]
fn two_clusters_send_the_barrier_manager_arrivals_in_pieces_at_once() {
    // Each of clusters 1 and 2 makes every other increment, each in an interval of its
    // own, and its arrival carries its own: 90,000 records of 14 bytes, 1.26 MB.
    let n = 180_000u64;
    let mut cfg = config(3, 1, Protocol::Hlrc);
    cfg.dsm.region_size = 1 << 20;
    let results = on_each(job(40, &cfg), |mut dsm| {
        let count = dsm.alloc::<u64>(1).unwrap();
        dsm.run(|w| {
            let me = w.cluster() as u64;
            if me == 0 {
                return;
            }
            // Cluster 1 makes the odd increments (from an even count), cluster 2 the
            // even ones.
            loop {
                let g = w.lock(0).unwrap();
                let c = count.get(0);
                if c >= n {
                    break;
                }
                if c % 2 == me - 1 {
                    count.set(0, c + 1);
                }
                g.unlock().unwrap();
            }
        })
        .unwrap();
        let seen = count.get(0);
        (seen, dsm.finish().unwrap())
    });
    for (c, (seen, _)) in results.iter().enumerate() {
        assert_eq!(*seen, n, "cluster {c} after the barrier");
    }
    let total = &results[0].1.total;
    let pieces: Vec<u64> = results[0]
        .1
        .clusters
        .iter()
        .map(|s| s.bundle_pieces_sent)
        .collect();
    assert!(
        pieces[1] >= 2 && pieces[2] >= 2,
        "both arrivals in pieces: {pieces:?}"
    );
    assert_eq!(total.bundle_pieces_sent, total.bundle_pieces_received);
}
