//! The DSM backend in one process: several clusters of one job, each on its own thread
//! with its own region address, connected through shared memory
//! (`multigrain_dsm::local_transports`). Fast checks that the backend passes the
//! conformance suite and that the apps on it agree with their sequential references.
//! (The CLI's end-to-end tests run the same on separate processes over UDP.)
//!
//! A failing check inside a compute thread ends this test binary (the backend's default
//! panic handler, see `dsm_backend`'s module docs) with the check's message on stderr.

use multigrain_apps::dsm_backend::DsmRuntime;
use multigrain_apps::team::{Runtime, Team};
use multigrain_apps::{conformance, em3d, water};
use multigrain_cluster_config::{JobConfig, Protocol};
use multigrain_dsm::{Dsm, DsmOptions, local_transports};

/// A region address private to one test of this binary and one cluster.
fn base(slot: usize, cluster: usize) -> usize {
    0x4c00_0000_0000 + slot * (1 << 36) + cluster * (1 << 32)
}

fn config(clusters: usize, threads: usize, protocol: Protocol) -> JobConfig {
    let mut cfg = JobConfig::local(clusters, threads);
    cfg.dsm.protocol = protocol;
    cfg.dsm.region_size = 64 << 20;
    cfg.job.peer_timeout_ms = 5000;
    cfg
}

/// Joins every cluster of `cfg` and runs `f` on each cluster's runtime, one thread per
/// cluster, then finishes the job; returns the results by cluster.
fn on_each_cluster<R: Send>(
    slot: usize,
    cfg: &JobConfig,
    f: impl Fn(&mut DsmRuntime) -> R + Sync,
) -> Vec<R> {
    on_each_cluster_then(slot, cfg, true, f)
}

/// [`on_each_cluster`], finishing the job only if `finish`.
fn on_each_cluster_then<R: Send>(
    slot: usize,
    cfg: &JobConfig,
    finish: bool,
    f: impl Fn(&mut DsmRuntime) -> R + Sync,
) -> Vec<R> {
    let transports = local_transports(cfg).expect("local transports");
    std::thread::scope(|s| {
        let handles: Vec<_> = transports
            .into_iter()
            .enumerate()
            .map(|(c, t)| {
                let f = &f;
                s.spawn(move || {
                    let opts = DsmOptions {
                        region_base: Some(base(slot, c)),
                        ..DsmOptions::default()
                    };
                    let dsm = Dsm::join_with(t, cfg, opts).expect("join");
                    let mut rt = DsmRuntime::new(dsm).expect("runtime");
                    let r = f(&mut rt);
                    if finish {
                        rt.finish().expect("finish");
                    }
                    r
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn conformance_suite_passes_on_2x2_hlrc() {
    let cfg = config(2, 2, Protocol::Hlrc);
    let topologies = on_each_cluster(0, &cfg, |rt| {
        conformance::all(rt);
        rt.topology().clone()
    });
    assert_eq!(topologies[0].num_threads(), 4);
    assert_eq!(topologies[1].threads_of(1), [2, 3]);
}

#[test]
fn conformance_suite_passes_on_3x1_sc() {
    let cfg = config(3, 1, Protocol::Sc);
    on_each_cluster(1, &cfg, conformance::all);
}

#[test]
fn unequal_clusters_number_threads_cluster_major() {
    let mut cfg = config(2, 1, Protocol::Hlrc);
    cfg.clusters[1].threads = 3;
    let out = on_each_cluster(2, &cfg, |rt| {
        rt.run(|team| {
            (
                team.thread_id(),
                team.topology().cluster_of(team.thread_id()),
            )
        })
        .unwrap()
    });
    assert_eq!(out[0], [(0, 0)]);
    assert_eq!(out[1], [(1, 1), (2, 1), (3, 1)]);
}

#[test]
fn water_on_2x2_agrees_with_the_sequential_reference() {
    let params = water::Params {
        molecules: 64,
        steps: 2,
        ..water::Params::default()
    };
    let seq = water::run_sequential(&params).unwrap();
    let cfg = config(2, 2, Protocol::Hlrc);
    let results = on_each_cluster(3, &cfg, |rt| water::run_parallel(rt, &params).unwrap());
    for r in &results {
        assert_eq!(r.threads, 4);
        assert_eq!(r.energies.len(), seq.energies.len());
        for (p, s) in r.energies.iter().zip(&seq.energies) {
            for (a, b) in [
                (p.kinetic, s.kinetic),
                (p.intra_potential, s.intra_potential),
                (p.inter_potential, s.inter_potential),
                (p.reaction_field, s.reaction_field),
                (p.total, s.total),
                (p.avg_temperature_k, s.avg_temperature_k),
                (p.virial, s.virial),
            ] {
                let rel = ((a - b) / b).abs();
                assert!(rel < 1e-10, "step {}: {a} vs {b} (rel {rel:e})", p.step);
            }
        }
    }
}

#[test]
fn em3d_on_2x2_is_bitwise_equal_to_the_sequential_reference() {
    let cfg = config(2, 2, Protocol::Hlrc);
    for (slot, layout, variant) in [
        (4, em3d::Layout::Naive, em3d::Variant::Read),
        (5, em3d::Layout::Good, em3d::Variant::Write),
    ] {
        let params = em3d::Params {
            nodes_per_thread: 300,
            iterations: 4,
            layout,
            variant,
            ..em3d::Params::default()
        };
        let seq = em3d::run_sequential(&params, 4).unwrap();
        let results = on_each_cluster(slot, &cfg, |rt| em3d::run_parallel(rt, &params).unwrap());
        for r in &results {
            assert_eq!(r.checksum, seq.checksum, "{layout:?}/{variant:?}");
        }
    }
}

#[test]
fn a_panicking_thread_fails_the_job_everywhere_without_hanging() {
    use multigrain_apps::team::RuntimeError;
    // Thread 1 panics (an unallocated lock id is a bug of the program) while thread 0 of
    // the same cluster and the threads of cluster 1 wait at a barrier.
    let cfg = config(2, 2, Protocol::Hlrc);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let errors = on_each_cluster_then(6, &cfg, false, |rt| {
            let lock = rt.alloc_locks(1).unwrap();
            let e = rt
                .run(|team| {
                    if team.thread_id() == 1 {
                        let _g = team.lock(lock + 7);
                    }
                    team.barrier();
                })
                .unwrap_err();
            // The error and its sources.
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                text += &format!(": {s}");
                source = s.source();
            }
            (
                matches!(e, RuntimeError::ThreadPanicked { thread: 1, .. }),
                text,
            )
        });
        let _ = tx.send(errors);
    });
    let errors = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the job did not end within 60 s after a compute thread panicked");
    assert!(
        errors[0].0
            && errors[0].1.contains(
                "compute thread 1 panicked: lock id 7 was never allocated (1 locks exist)"
            ),
        "cluster 0: {:?}",
        errors[0]
    );
    assert!(
        errors[1].1.contains("cluster 0 failed: "),
        "cluster 1: {:?}",
        errors[1]
    );
}
