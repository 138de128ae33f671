//! DSM runtime benchmarks (issue 4): fault service and remote read fault beside their
//! baselines measured in the same run (raw UDP round trip, busy-polled and blocking; bare
//! userfaultfd fault), write
//! fault and release cost per page, diff throughput, and the cost of the home's
//! diff-application strategies. The kernels live in `multigrain_dsm::bench`; this file
//! only drives them with criterion and prints per-operation percentiles at the end.

use criterion::Criterion;
use multigrain_bench::network::UdpWait;
use multigrain_cluster_config::Protocol;
use multigrain_dsm::bench::{self, ApplyChoice, BareFault, Pair};
use multigrain_dsm::uffd::Backing;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

static SAMPLES: Mutex<BTreeMap<String, Vec<u64>>> = Mutex::new(BTreeMap::new());

/// Records `samples` under `name` and returns their sum for criterion.
fn record(name: &str, samples: Vec<u64>) -> Duration {
    let total = Duration::from_nanos(samples.iter().sum());
    SAMPLES
        .lock()
        .unwrap()
        .entry(name.to_string())
        .or_default()
        .extend(samples);
    total
}

fn base(slot: usize) -> usize {
    0x4400_0000_0000 + slot * (1 << 36)
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();

    // Baselines.
    for (wait, name) in [
        (UdpWait::BusyPoll, "baseline/udp_round_trip_8B_busy_polled"),
        (UdpWait::Blocking, "baseline/udp_round_trip_8B_blocking"),
    ] {
        c.bench_function(name, |b| {
            b.iter_custom(|n| record(name, bench::udp_round_trips(n as usize, wait)))
        });
    }
    let mut bare = BareFault::new(base(0)).expect("bare region");
    c.bench_function("baseline/bare_uffd_read_fault", |b| {
        b.iter_custom(|n| {
            let s = (0..n).map(|_| bare.fault()).collect();
            record("baseline/bare_uffd_read_fault", s)
        })
    });
    drop(bare);

    for (i, protocol) in [Protocol::Hlrc, Protocol::Sc].into_iter().enumerate() {
        let p = protocol.as_str();
        let mut pair = Pair::new(protocol, base(1 + i)).expect("pair");
        let name = format!("{p}/remote_read_fault");
        c.bench_function(&name, |b| {
            b.iter_custom(|n| {
                record(
                    &name,
                    pair.remote_read_faults(n as usize, Duration::ZERO)
                        .expect("faults"),
                )
            })
        });
        let name = format!("{p}/remote_read_fault_after_2ms_idle");
        c.bench_function(&name, |b| {
            b.iter_custom(|n| {
                let n = (n as usize).min(200);
                record(
                    &name,
                    pair.remote_read_faults(n, Duration::from_millis(2))
                        .expect("faults"),
                )
            })
        });
        let name = format!("{p}/write_fault");
        c.bench_function(&name, |b| {
            b.iter_custom(|n| record(&name, pair.write_faults(n as usize).expect("faults")))
        });
        if protocol == Protocol::Hlrc {
            let name = format!("{p}/release_64_dirty_pages_per_page");
            c.bench_function(&name, |b| {
                b.iter_custom(|n| {
                    let s = (0..n)
                        .map(|_| pair.release_per_page(64).expect("release"))
                        .collect();
                    record(&name, s)
                })
            });
        }
        let stats = pair.finish().expect("finish");
        println!(
            "{p} pair statistics: {}",
            serde_json::to_string(&stats.total).unwrap_or_default()
        );

        // The same remote read fault with the clusters talking through INIs over UDP.
        let mut pair = Pair::over(protocol, base(12 + i), true).expect("pair over INIs");
        let name = format!("{p}/remote_read_fault_via_ini");
        c.bench_function(&name, |b| {
            b.iter_custom(|n| {
                record(
                    &name,
                    pair.remote_read_faults(n as usize, Duration::ZERO)
                        .expect("faults"),
                )
            })
        });
        pair.finish().expect("finish");

        let name = format!("{p}/local_fault_home_page");
        let mut slot = 0;
        let mut pair = Pair::new(protocol, base(4 + i)).expect("pair");
        c.bench_function(&name, |b| {
            b.iter_custom(|n| {
                let mut s = Vec::with_capacity(n as usize);
                while s.len() < n as usize {
                    let got = pair.local_read_faults(n as usize - s.len());
                    if got.is_empty() {
                        slot += 1;
                        let old = std::mem::replace(
                            &mut pair,
                            Pair::new(protocol, base(6 + 2 * i + slot % 2)).expect("pair"),
                        );
                        old.finish().expect("finish");
                    }
                    s.extend(got);
                }
                record(&name, s)
            })
        });
        pair.finish().expect("finish");
    }

    for pct in [1u32, 10, 100] {
        let (twin, cur) = bench::diff_pages(f64::from(pct) / 100.0);
        let name = format!("diff/encode_{pct}pct");
        c.bench_function(&name, |b| {
            b.iter_custom(|n| record(&name, bench::diff_encode(&twin, &cur, n as usize)))
        });
        let name = format!("diff/apply_{pct}pct");
        c.bench_function(&name, |b| {
            b.iter_custom(|n| record(&name, bench::diff_apply(&twin, &cur, n as usize)))
        });
    }

    let choice = ApplyChoice::new(base(10)).expect("apply regions");
    let (twin, cur) = bench::diff_pages(0.10);
    c.bench_function("home_apply/runtime_view_10pct", |b| {
        b.iter_custom(|n| {
            record(
                "home_apply/runtime_view_10pct",
                choice.apply_through_view(&twin, &cur, n as usize),
            )
        })
    });
    c.bench_function("home_apply/anon_copy_zap_reinstall_10pct", |b| {
        b.iter_custom(|n| {
            record(
                "home_apply/anon_copy_zap_reinstall_10pct",
                choice.apply_by_reinstall(&twin, &cur, n as usize),
            )
        })
    });
    // A flush's diff of one page: copied out and diffed, or first checked through the
    // runtime view (the runtime's flush), for an unchanged page and pages with 1 % and
    // all of their words changed.
    for pct in [0u32, 1, 100] {
        for (check, tag) in [
            (false, "copy_then_diff"),
            (true, "check_then_copy_and_diff"),
        ] {
            let name = format!("flush_diff/{tag}_{pct}pct");
            c.bench_function(&name, |b| {
                b.iter_custom(|n| {
                    record(
                        &name,
                        choice.flush_diff(f64::from(pct) / 100.0, check, n as usize),
                    )
                })
            });
        }
    }
    // A flush's diff of one page of which 1, 3 or 32 lines were stored to (one word
    // changed in each): only those lines read and diffed (the runtime's flush of an open
    // page with at most 32 marked lines), or the whole page compared, read and diffed.
    for (lines, tag) in [
        (1u64, "1"),
        (0b1_0000_0000_0101, "3"),
        (0x5555_5555_5555_5555, "32"),
    ] {
        for (by_lines, how) in [(true, "lines_only"), (false, "whole_page")] {
            let name = format!("flush_diff/{how}_{tag}_of_64_lines");
            c.bench_function(&name, |b| {
                b.iter_custom(|n| {
                    record(&name, choice.flush_diff_lines(lines, by_lines, n as usize))
                })
            });
        }
    }
    for (backing, tag) in [
        (Backing::SharedMemory, "shmem"),
        (Backing::Anonymous, "anon"),
    ] {
        let name = format!("page_ops/install_{tag}");
        c.bench_function(&name, |b| {
            b.iter_custom(|n| record(&name, choice.install(backing, n as usize)))
        });
        for run in [1, 64] {
            let name = format!("page_ops/invalidate_{run}_pages_{tag}");
            c.bench_function(&name, |b| {
                b.iter_custom(|n| record(&name, choice.invalidate(backing, run, n as usize)))
            });
        }
    }
    drop(choice);

    c.final_summary();
    print_summary();
}

fn print_summary() {
    let samples = SAMPLES.lock().unwrap();
    let s = |k: &str| bench::summarize(samples.get(k).map_or(&[][..], |v| &v[..]));
    println!();
    println!("per-operation latency (µs), every timed operation of the run:");
    println!(
        "{:<44} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "benchmark", "n", "p10", "median", "p90", "p99", "mean"
    );
    for (name, v) in samples.iter() {
        let m = bench::summarize(v);
        println!(
            "{:<44} {:>8} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            name, m.n, m.p10, m.median, m.p90, m.p99, m.mean
        );
    }
    let (udp, bare) = (
        s("baseline/udp_round_trip_8B_busy_polled"),
        s("baseline/bare_uffd_read_fault"),
    );
    let base = udp.median + bare.median;
    let fast = udp.p10 + bare.p10;
    for p in ["hlrc", "sc"] {
        for via in ["", "_via_ini"] {
            let r = s(&format!("{p}/remote_read_fault{via}"));
            println!(
                "{p}: remote read fault{} median {:.2} µs = {:.2} × (busy-polled UDP round trip + bare fault, medians \
                 = {base:.2} µs); p10 {:.2} µs = {:.2} × (the same, p10 = {fast:.2} µs); target ≤ 1.5",
                if via.is_empty() {
                    " (shared memory)"
                } else {
                    " (INIs over UDP)"
                },
                r.median,
                r.median / base,
                r.p10,
                r.p10 / fast
            );
        }
    }
    for pct in [1, 10, 100] {
        let e = s(&format!("diff/encode_{pct}pct")).median;
        let a = s(&format!("diff/apply_{pct}pct")).median;
        println!(
            "diff {pct:>3}% of words: encode {:.2} GB/s, apply {:.2} GB/s (4 KiB page per {e:.3} / {a:.3} µs)",
            4096.0 / (e * 1000.0),
            4096.0 / (a * 1000.0)
        );
    }
}
