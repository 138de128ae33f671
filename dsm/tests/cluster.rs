//! Multi-process tests of the DSM runtime on real userfaultfd: each test starts one
//! process per cluster (this binary re-executed, see `common`), connected through shared
//! memory, for both protocols.
//!
//! * `correctness` on 2 and 4 clusters × 2 threads: a counter incremented 10,000 times
//!   per thread under a distributed lock ends at exactly the total; threads writing
//!   disjoint words of the same pages merge correctly at barriers; producers and
//!   consumers pass items through a buffer guarded by a lock; every write before a
//!   barrier is visible after it.
//! * `lock-holder-dies`, `barrier-dies`, `home-dies` on 3 clusters: a cluster killed
//!   while it holds a lock others wait for, while the others wait at a barrier, or while
//!   the others wait for a page it is the home of, makes every other cluster fail within
//!   `job.peer_timeout_ms` with an error naming it (a thread in a page fault cannot
//!   return an error: its process prints it and exits with `FAULT_EXIT_CODE`).

mod common;

use common::{ChildSpec, Job, Spec};
use multigrain_cluster_config::Protocol;
use multigrain_dsm::{Dsm, DsmError, Worker};
use std::time::{Duration, Instant};

const PER_THREAD: u64 = 10_000;
const PEER_TIMEOUT_MS: u64 = 3_000;
/// Start-up and per-job bound: a hang fails instead of blocking the suite.
const JOB_TIMEOUT: Duration = Duration::from_secs(120);

// ----- children ------------------------------------------------------------------------

/// Runs `body` on every compute thread; the first thread error (which says what the
/// thread was doing) becomes the result, before the error of the section's end.
fn run(
    dsm: &Dsm,
    body: impl Fn(&Worker<'_>) -> Result<(), DsmError> + Sync,
) -> Result<(), DsmError> {
    let first = std::sync::Mutex::new(None);
    let r = dsm.run(|w| {
        if let Err(e) = body(w) {
            first.lock().unwrap().get_or_insert(e);
        }
    });
    match first.into_inner().unwrap() {
        Some(e) => Err(e),
        None => r.map(drop),
    }
}

fn timed(name: &str, f: impl FnOnce() -> Result<(), DsmError>) -> Result<(), DsmError> {
    let t = Instant::now();
    f()?;
    println!("RESULT {name} ok {} ms", t.elapsed().as_millis());
    Ok(())
}

fn check(ok: bool, what: impl FnOnce() -> String) {
    if !ok {
        println!("MISMATCH {}", what());
        std::process::exit(1);
    }
}

fn correctness(spec: &ChildSpec, mut dsm: Dsm) -> Result<(), DsmError> {
    let n = dsm.total_threads();
    let clusters = dsm.clusters();
    let counter = dsm.alloc::<u64>(1)?;
    let shared = dsm.alloc::<u64>(4 * 512)?;
    const CAP: usize = 8;
    const ITEMS: u64 = 100;
    let ctl = dsm.alloc::<u64>(3)?; // head, tail, consumed
    let items = dsm.alloc::<[u64; 16]>(CAP)?;
    let tally = dsm.alloc::<u64>(2 * n)?;
    let blocks = dsm.alloc::<u64>(n * 1024)?;

    timed("counter", || {
        run(&dsm, |w| {
            for _ in 0..PER_THREAD {
                let _g = w.lock(0)?;
                counter.set(0, counter.get(0) + 1);
            }
            Ok(())
        })?;
        let v = counter.get(0);
        check(v == n as u64 * PER_THREAD, || {
            format!("counter {v}, expected {}", n as u64 * PER_THREAD)
        });
        Ok(())
    })?;

    timed("multiple-writers", || {
        run(&dsm, |w| {
            let (t, len) = (w.thread_id(), shared.len());
            for round in 1..=3u64 {
                for i in (t..len).step_by(n) {
                    shared.set(i, (round << 32) | i as u64);
                }
                w.barrier()?;
                for i in 0..len {
                    let v = shared.get(i);
                    check(v == (round << 32) | i as u64, || {
                        format!("thread {t} round {round}: word {i} = {v:#x}")
                    });
                }
                w.barrier()?;
            }
            Ok(())
        })
    })?;

    timed("producer-consumer", || {
        run(&dsm, |w| {
            let t = w.thread_id();
            let total = clusters as u64 * ITEMS;
            let (mut count, mut sum) = (0u64, 0u64);
            if w.local_id() == 0 {
                // Producer.
                for k in 0..ITEMS {
                    loop {
                        let g = w.lock(1)?;
                        let (head, tail) = (ctl.get(0), ctl.get(1));
                        if tail - head < CAP as u64 {
                            let v = ((w.cluster() as u64) << 32) | k;
                            let mut item = [0u64; 16];
                            for (j, x) in item.iter_mut().enumerate() {
                                *x = v + j as u64;
                            }
                            items.set(tail as usize % CAP, item);
                            ctl.set(1, tail + 1);
                            break;
                        }
                        drop(g);
                        std::thread::yield_now();
                    }
                }
            }
            if w.local_id() != 0 || w.cluster_threads() == 1 {
                // Consumer.
                loop {
                    let g = w.lock(1)?;
                    let (head, tail, consumed) = (ctl.get(0), ctl.get(1), ctl.get(2));
                    if consumed == total {
                        break;
                    }
                    if head < tail {
                        let item = items.get(head as usize % CAP);
                        for (j, &x) in item.iter().enumerate() {
                            check(x == item[0] + j as u64, || {
                                format!(
                                    "thread {t}: item {head} word {j} = {x:#x}, word 0 = {:#x}",
                                    item[0]
                                )
                            });
                        }
                        ctl.set(0, head + 1);
                        ctl.set(2, consumed + 1);
                        count += 1;
                        sum = sum.wrapping_add(item[0]);
                    }
                    drop(g);
                    if head == tail {
                        std::thread::yield_now();
                    }
                }
            }
            tally.set(2 * t, count);
            tally.set(2 * t + 1, sum);
            Ok(())
        })?;
        let v = tally.to_vec();
        let count: u64 = v.iter().step_by(2).sum();
        let sum = v
            .iter()
            .skip(1)
            .step_by(2)
            .fold(0u64, |a, &b| a.wrapping_add(b));
        let expected = (0..clusters as u64)
            .flat_map(|c| (0..ITEMS).map(move |k| (c << 32) | k))
            .fold(0u64, |a, b| a.wrapping_add(b));
        check(count == clusters as u64 * ITEMS && sum == expected, || {
            format!(
                "consumed {count} items with sum {sum:#x}, expected {} with {expected:#x}",
                clusters as u64 * ITEMS
            )
        });
        Ok(())
    })?;

    timed("barrier-visibility", || {
        run(&dsm, |w| {
            let t = w.thread_id();
            let value = |round: u64, owner: usize, i: usize| {
                round * 1_000_000_000 + owner as u64 * 100_000 + i as u64
            };
            for round in 1..=3u64 {
                for i in 0..1024 {
                    blocks.set(t * 1024 + i, value(round, t, i));
                }
                w.barrier()?;
                for owner in 0..n {
                    for i in 0..1024 {
                        let v = blocks.get(owner * 1024 + i);
                        check(v == value(round, owner, i), || {
                            format!("thread {t} round {round}: thread {owner}'s word {i} = {v}")
                        });
                    }
                }
                w.barrier()?;
            }
            Ok(())
        })
    })?;

    let stats = dsm.finish()?;
    let _ = spec;
    println!(
        "STATS remote_faults={} lock_acquires={} local_handoffs={} diffs={} invalidations={} messages={}",
        stats.total.remote_faults,
        stats.total.lock_acquires,
        stats.total.lock_local_handoffs,
        stats.total.diffs_sent,
        stats.total.invalidations,
        stats.total.messages_sent.values().sum::<u64>()
    );
    Ok(())
}

fn lock_holder_dies(spec: &ChildSpec, dsm: Dsm) -> Result<(), DsmError> {
    let victim = 1;
    run(&dsm, |w| {
        if w.cluster() == victim {
            let _g = w.lock(5)?;
            w.barrier()?;
            println!("HOLDING");
            std::thread::sleep(Duration::from_secs(60));
        } else {
            w.barrier()?;
            println!("WAITING");
            let _g = w.lock(5)?;
            println!("UNEXPECTED lock acquired");
        }
        Ok(())
    })?;
    let _ = spec;
    Ok(())
}

fn barrier_dies(spec: &ChildSpec, dsm: Dsm) -> Result<(), DsmError> {
    let victim = 2;
    run(&dsm, |w| {
        if w.cluster() == victim {
            println!("SKIPPING");
            std::thread::sleep(Duration::from_secs(60));
        } else {
            println!("WAITING");
            w.barrier()?;
            println!("UNEXPECTED barrier passed");
        }
        Ok(())
    })?;
    let _ = spec;
    Ok(())
}

fn home_dies(spec: &ChildSpec, mut dsm: Dsm) -> Result<(), DsmError> {
    let victim = 1;
    // Round-robin homes over 3 clusters: page 1 lives at cluster 1.
    let a = dsm.alloc::<u64>(3 * 512)?;
    run(&dsm, |w| {
        w.barrier()?;
        if w.cluster() == victim {
            println!("IDLE");
            std::thread::sleep(Duration::from_secs(60));
        } else {
            println!("WAITING");
            // The parent kills the home meanwhile; the read then waits for a page that
            // will never come.
            std::thread::sleep(Duration::from_millis(500));
            let v = a.get(512);
            println!("UNEXPECTED page read: {v}");
        }
        Ok(())
    })?;
    let _ = spec;
    Ok(())
}

fn child() {
    // Leave when the parent is gone (no orphans if the test process is killed).
    let parent = std::os::unix::process::parent_id();
    std::thread::spawn(move || {
        loop {
            if std::os::unix::process::parent_id() != parent {
                std::process::exit(2);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let (spec, transport) = common::child_setup();
    let result = Dsm::join(transport, &spec.cfg).and_then(|dsm| match spec.scenario.as_str() {
        "correctness" => correctness(&spec, dsm),
        "lock-holder-dies" => lock_holder_dies(&spec, dsm),
        "barrier-dies" => barrier_dies(&spec, dsm),
        "home-dies" => home_dies(&spec, dsm),
        other => panic!("unknown scenario {other}"),
    });
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            println!("FAILED {e}");
            std::process::exit(3);
        }
    }
}

// ----- parent --------------------------------------------------------------------------

fn correctness_test(protocol: Protocol, clusters: usize) {
    let name = format!("correctness_{}_{clusters}x2", protocol.as_str());
    let spec = Spec {
        scenario: "correctness".into(),
        clusters,
        threads: 2,
        protocol,
        peer_timeout_ms: PEER_TIMEOUT_MS,
    };
    let mut job = Job::start(&name, &spec, JOB_TIMEOUT);
    job.wait_all(JOB_TIMEOUT);
    for (c, cl) in job.clusters.iter().enumerate() {
        let status = cl.exit.expect("exited").1;
        assert!(
            status.success(),
            "{name}: cluster {c} failed ({status}); {}",
            job.report()
        );
        for s in [
            "counter",
            "multiple-writers",
            "producer-consumer",
            "barrier-visibility",
        ] {
            assert!(
                cl.output
                    .iter()
                    .any(|l| l.starts_with(&format!("RESULT {s} ok"))),
                "{name}: cluster {c} did not pass {s}; {}",
                job.report()
            );
        }
    }
    let lines: Vec<&String> = job.clusters[0]
        .output
        .iter()
        .filter(|l| l.starts_with("RESULT") || l.starts_with("STATS"))
        .collect();
    println!("  {name} (cluster 0): {lines:?}");
}

/// Kills `victim` once it printed `victim_line` and the others printed `WAITING`; the
/// others must fail naming it within the peer timeout (after `grace`, a delay the
/// scenario builds in before the survivors start waiting).
fn failure_test(
    protocol: Protocol,
    scenario: &str,
    victim: usize,
    victim_line: &str,
    grace: Duration,
) {
    let name = format!("{scenario}_{}", protocol.as_str());
    let spec = Spec {
        scenario: scenario.into(),
        clusters: 3,
        threads: 1,
        protocol,
        peer_timeout_ms: PEER_TIMEOUT_MS,
    };
    let mut job = Job::start(&name, &spec, JOB_TIMEOUT);
    job.expect_line(victim, victim_line, JOB_TIMEOUT);
    for c in (0..3).filter(|&c| c != victim) {
        job.expect_line(c, "WAITING", JOB_TIMEOUT);
    }
    // Let the survivors block in their waits.
    std::thread::sleep(Duration::from_millis(300));
    let killed = job.kill(victim);
    job.wait_all(Duration::from_millis(PEER_TIMEOUT_MS) + Duration::from_secs(10));
    for c in (0..3).filter(|&c| c != victim) {
        let (at, status) = job.clusters[c].exit.expect("exited");
        let took = at.saturating_duration_since(killed);
        assert!(
            matches!(
                status.code(),
                Some(3) | Some(multigrain_dsm::FAULT_EXIT_CODE)
            ),
            "{name}: cluster {c} should fail with an error, got {status}; {}",
            job.report()
        );
        let named = format!("cluster {victim} failed");
        assert!(
            job.clusters[c].output.iter().any(|l| l.contains(&named)),
            "{name}: cluster {c}'s error does not name cluster {victim}; {}",
            job.report()
        );
        assert!(
            took <= grace + Duration::from_millis(PEER_TIMEOUT_MS),
            "{name}: cluster {c} took {took:?} to fail (peer timeout {PEER_TIMEOUT_MS} ms); {}",
            job.report()
        );
        let line = job.clusters[c]
            .output
            .iter()
            .find(|l| l.contains(&named))
            .cloned();
        println!(
            "  {name}: cluster {c} failed {took:?} after the kill: {}",
            line.unwrap_or_default()
        );
    }
}

fn main() {
    if std::env::var_os(common::ROLE).is_some() {
        return child();
    }
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let mut tests: Vec<(String, Box<dyn Fn()>)> = Vec::new();
    for protocol in [Protocol::Hlrc, Protocol::Sc] {
        for clusters in [2, 4] {
            tests.push((
                format!("correctness_{}_{clusters}x2", protocol.as_str()),
                Box::new(move || correctness_test(protocol, clusters)),
            ));
        }
        tests.push((
            format!("lock_holder_dies_{}", protocol.as_str()),
            Box::new(move || {
                failure_test(protocol, "lock-holder-dies", 1, "HOLDING", Duration::ZERO)
            }),
        ));
        tests.push((
            format!("barrier_dies_{}", protocol.as_str()),
            Box::new(move || failure_test(protocol, "barrier-dies", 2, "SKIPPING", Duration::ZERO)),
        ));
        tests.push((
            format!("home_dies_{}", protocol.as_str()),
            Box::new(move || {
                failure_test(protocol, "home-dies", 1, "IDLE", Duration::from_millis(500))
            }),
        ));
    }
    let mut failed = 0;
    let mut ran = 0;
    for (name, test) in &tests {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        ran += 1;
        let t0 = Instant::now();
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(test)).is_ok();
        println!(
            "test {name} ... {} ({:.2?})",
            if ok { "ok" } else { "FAILED" },
            t0.elapsed()
        );
        failed += usize::from(!ok);
    }
    println!("{ran} multi-process tests, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}
