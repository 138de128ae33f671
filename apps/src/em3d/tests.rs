use super::*;
use crate::threads::ThreadsRuntime;

fn small() -> Params {
    Params {
        nodes_per_thread: 300,
        degree: 8,
        percent_remote: 40,
        iterations: 12,
        ..Params::default()
    }
}

fn parallel(rt: &mut ThreadsRuntime, p: &Params, layout: Layout, variant: Variant) -> RunResult {
    let p = Params {
        layout,
        variant,
        ..p.clone()
    };
    run_parallel(rt, &p).unwrap()
}

#[test]
fn parallel_runs_are_bitwise_equal_to_sequential() {
    let p = small();
    for threads in [1, 2, 3, 4, 6] {
        let seq = run_sequential(&p, threads).unwrap();
        assert!(seq.checksum.e_sum().is_finite() && seq.checksum.h_sum().is_finite());
        let mut rt = ThreadsRuntime::new(threads).unwrap();
        for variant in [Variant::Read, Variant::Write] {
            for layout in [Layout::Naive, Layout::Good] {
                let par = parallel(&mut rt, &p, layout, variant);
                assert_eq!(
                    par.checksum, seq.checksum,
                    "{threads} threads {variant:?} {layout:?}"
                );
                assert_eq!(par.partitions, threads);
            }
        }
    }
}

#[test]
fn clustered_layouts_are_bitwise_equal_to_sequential() {
    let p = small();
    for (clusters, per) in [(2, 4), (4, 2), (4, 4)] {
        let seq = run_sequential(&p, clusters * per).unwrap();
        let mut rt = ThreadsRuntime::with_clusters(clusters, per).unwrap();
        for variant in [Variant::Read, Variant::Write] {
            for layout in [Layout::Naive, Layout::Good] {
                let par = parallel(&mut rt, &p, layout, variant);
                assert_eq!(
                    par.checksum, seq.checksum,
                    "{clusters}x{per} {variant:?} {layout:?}"
                );
            }
        }
    }
}

#[test]
fn checksum_depends_on_every_input() {
    let p = small();
    let base = run_sequential(&p, 2).unwrap().checksum;
    let variants = [
        Params {
            seed: p.seed + 1,
            ..p.clone()
        },
        Params {
            percent_remote: 41,
            ..p.clone()
        },
        Params {
            iterations: 11,
            ..p.clone()
        },
        Params {
            degree: 7,
            ..p.clone()
        },
    ];
    for q in variants {
        assert_ne!(run_sequential(&q, 2).unwrap().checksum, base, "{q:?}");
    }
    assert_ne!(run_sequential(&p, 3).unwrap().checksum, base);
    // Zero iterations leave the initial values, which are in [-1, 1).
    let init = run_sequential(
        &Params {
            iterations: 0,
            ..p.clone()
        },
        2,
    )
    .unwrap()
    .checksum;
    assert!(init.e_sum().abs() < 600.0);
}

#[test]
fn default_problem_stays_finite() {
    let r = run_sequential(&Params::default(), 2).unwrap();
    let (e, h) = (r.checksum.e_sum(), r.checksum.h_sum());
    assert!(e.is_finite() && h.is_finite(), "{}", r.checksum);
    assert!(e.abs() < 1e12 && h.abs() < 1e12, "{}", r.checksum);
}

#[test]
fn remote_fraction_follows_percent_remote() {
    let p = Params {
        nodes_per_thread: 1000,
        degree: 20,
        ..Params::default()
    };
    let s = edge_stats(&p, &Topology::uniform(1, 8).unwrap()).unwrap();
    assert_eq!(s.edges, 2 * 8 * 1000 * 20);
    let frac = s.remote_edges as f64 / s.edges as f64;
    assert!((frac - 0.40).abs() < 0.01, "remote fraction {frac}");
    assert_eq!(s.cross_cluster_edges, 0);
    assert_eq!(s.cross_cluster_ghosts, 0);
    assert!(s.ghost_slots > 0 && s.ghost_slots <= s.remote_edges);
    // One partition has no neighbours: every edge is local.
    let one = edge_stats(&p, &Topology::uniform(1, 1).unwrap()).unwrap();
    assert_eq!(one.remote_edges, 0);
    assert_eq!(one.ghost_slots, 0);
    let none = edge_stats(
        &Params {
            percent_remote: 0,
            ..p
        },
        &Topology::uniform(2, 2).unwrap(),
    )
    .unwrap();
    assert_eq!(none.remote_edges, 0);
}

#[test]
fn the_launchers_check_agrees_with_building_the_graph() {
    let p = Params {
        nodes_per_thread: 40,
        degree: 4,
        ..Params::default()
    };
    let uniform = (1..=6).flat_map(|c| (1..=6).map(move |t| Topology::uniform(c, t).unwrap()));
    // Clusters of unequal sizes, which the good layout refuses.
    let uneven =
        [vec![0, 0, 0, 0, 1, 1], vec![0, 1, 1]].map(|of| Topology::from_cluster_of(of).unwrap());
    let mut refused = 0;
    for topo in uniform.chain(uneven) {
        for layout in [Layout::Naive, Layout::Good] {
            let p = Params {
                layout,
                ..p.clone()
            };
            let quick = check(&p, &topo).map_err(|e| e.to_string());
            let built = edge_stats(&p, &topo).map(|_| ()).map_err(|e| e.to_string());
            assert_eq!(quick, built, "{topo:?} {layout:?}");
            refused += usize::from(quick.is_err());
        }
    }
    assert!(refused > 0, "some topology refuses the good layout");
    let huge = Params {
        nodes_per_thread: 1 << 30,
        ..p
    };
    let e = check(&huge, &Topology::uniform(2, 1).unwrap()).unwrap_err();
    assert!(e.to_string().contains("2^31 node limit"), "{e}");
}

#[test]
fn good_layout_crosses_clusters_less() {
    let p = Params {
        nodes_per_thread: 200,
        ..Params::default()
    };
    for (clusters, per) in [(4, 8), (8, 4), (4, 4)] {
        let topo = Topology::uniform(clusters, per).unwrap();
        let naive = edge_stats(&p, &topo).unwrap();
        let good = edge_stats(
            &Params {
                layout: Layout::Good,
                ..p.clone()
            },
            &topo,
        )
        .unwrap();
        // Same graph, different placement.
        assert_eq!(naive.edges, good.edges);
        assert_eq!(naive.remote_edges, good.remote_edges);
        assert_eq!(naive.ghost_slots, good.ghost_slots);
        assert!(
            good.cross_cluster_edges < naive.cross_cluster_edges,
            "{clusters}x{per}: good {good:?} naive {naive:?}"
        );
        assert!(good.cross_cluster_ghosts < naive.cross_cluster_ghosts);
        assert!(naive.cross_cluster_edges <= naive.remote_edges);
    }
}

#[test]
fn parallel_reports_layout_and_stats() {
    let mut rt = ThreadsRuntime::with_clusters(4, 2).unwrap();
    let r = parallel(&mut rt, &small(), Layout::Good, Variant::Write);
    assert_eq!(r.grid.dims, [2, 2, 2]);
    assert_eq!(r.cluster_block, Some([2, 1, 1]));
    assert_eq!(r.layout, Some(Layout::Good));
    assert_eq!(r.variant, Some(Variant::Write));
    let s = r.edge_stats.unwrap();
    assert!(s.cross_cluster_edges > 0 && s.cross_cluster_edges < s.remote_edges);
}

#[test]
fn bad_parameters_and_layouts_are_errors() {
    for p in [
        Params {
            nodes_per_thread: 0,
            ..small()
        },
        Params {
            degree: 0,
            ..small()
        },
        Params {
            percent_remote: 101,
            ..small()
        },
    ] {
        assert!(matches!(
            run_sequential(&p, 2),
            Err(Em3dError::InvalidParams(_))
        ));
    }
    assert!(run_sequential(&small(), 0).is_err());
    let topo = Topology::from_cluster_of(vec![0, 0, 0, 1]).unwrap();
    let mut rt = ThreadsRuntime::with_topology(topo);
    let e = run_parallel(
        &mut rt,
        &Params {
            layout: Layout::Good,
            ..small()
        },
    )
    .unwrap_err();
    assert!(matches!(e, Em3dError::LayoutUnsupported(_)), "{e}");
}

#[test]
fn checksum_display_names_all_parts() {
    let c = run_sequential(&small(), 1).unwrap().checksum;
    let s = c.to_string();
    assert!(s.contains("E sum") && s.contains("H sum") && s.contains(&format!("{:016x}", c.fnv1a)));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// Any small problem, thread count, variant and layout reproduces the reference bits.
    #[test]
    fn any_small_problem_is_bitwise_reproducible(
        nodes in 1usize..60,
        degree in 1usize..6,
        percent_remote in 0u32..=100,
        iterations in 0usize..6,
        seed in proptest::prelude::any::<u64>(),
        clusters in 1usize..3,
        per in 1usize..4,
        write in proptest::prelude::any::<bool>(),
        good in proptest::prelude::any::<bool>(),
    ) {
        let p = Params {
            nodes_per_thread: nodes,
            degree,
            percent_remote,
            iterations,
            seed,
            layout: if good { Layout::Good } else { Layout::Naive },
            variant: if write { Variant::Write } else { Variant::Read },
        };
        let seq = run_sequential(&p, clusters * per).unwrap();
        let mut rt = ThreadsRuntime::with_clusters(clusters, per).unwrap();
        match run_parallel(&mut rt, &p) {
            Ok(par) => proptest::prop_assert_eq!(par.checksum, seq.checksum),
            // The good layout refuses grids that no cluster-sized block tiles.
            Err(Em3dError::LayoutUnsupported(_)) => proptest::prop_assert!(good),
            Err(e) => return Err(proptest::test_runner::TestCaseError::fail(e.to_string())),
        }
    }
}

#[test]
fn progress_reports_the_phases_and_every_iteration() {
    use crate::progress::testing::Recorder;
    let p = Params {
        iterations: 2,
        ..small()
    };
    let want: Vec<(String, u64)> = vec![
        ("begin graph".into(), 0),
        ("begin initial values".into(), 0),
        ("begin iterations".into(), 2),
        ("advance".into(), 1),
        ("advance".into(), 2),
    ];
    let seq = Recorder::default();
    run_sequential_with(&p, 4, &seq).unwrap();
    assert_eq!(*seq.0.lock().unwrap(), want);
    let par = Recorder::default();
    run_parallel_with(&mut ThreadsRuntime::with_clusters(2, 2).unwrap(), &p, &par).unwrap();
    assert_eq!(*par.0.lock().unwrap(), want);
}

/// A partition whose cluster process starts late (it built its graph more slowly) must
/// not count its start-up in the timed phases: the clock starts at a start barrier.
#[test]
fn a_late_starting_thread_is_not_timed() {
    let delay = std::time::Duration::from_millis(400);
    let mut rt = crate::threads::LateStart::second_of_two(delay);
    let p = small();
    let r = run_parallel(&mut rt, &p).unwrap();
    assert_eq!(r.checksum, run_sequential(&p, 2).unwrap().checksum);
    let timed = r.times.init_s + r.times.compute_s;
    assert!(
        timed < delay.as_secs_f64() / 2.0,
        "thread 0 timed {timed:.3} s (initial values {:.3} s): the other thread's {delay:?} late start was counted",
        r.times.init_s
    );
}
