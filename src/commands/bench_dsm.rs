//! `multigrain bench dsm`: the DSM runtime's fault path beside its baselines measured in the
//! same run — a raw UDP round trip and a bare userfaultfd fault — plus write-fault and
//! release cost per page and diff throughput (issue 4's benchmarks; kernels in
//! `multigrain_dsm::bench`).

use crate::measure::{Summary, Table};
use anyhow::{Context, Result};
use multigrain_cluster_config::Protocol;
use multigrain_dsm::bench::{self as kernels, BareFault, Pair};
use std::time::Duration;

/// How much work each row does.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Operations timed per row.
    pub ops: usize,
}

fn us(samples: &[u64]) -> Summary {
    let v: Vec<f64> = samples.iter().map(|&ns| ns as f64 / 1e3).collect();
    Summary::of(&v)
}

/// Virtual addresses for the benchmark regions, away from the job default.
fn base(slot: usize) -> usize {
    0x4800_0000_0000 + slot * (1 << 36)
}

/// Runs the benchmark and prints the table (and writes JSON if asked).
pub fn run(opts: Options, json: Option<&std::path::Path>) -> Result<()> {
    anyhow::ensure!(
        opts.ops >= 10,
        "--ops must be at least 10, got {}",
        opts.ops
    );
    let n = opts.ops;
    let progress = crate::progress::bar(2 + 2 * 5 + 6, "bench dsm");
    let mut t = Table::default();
    let udp = us(&kernels::udp_round_trips(n));
    progress.inc(1);
    let mut bare = BareFault::new(base(0)).context("mapping the bare-fault region")?;
    let bare_fault = us(&(0..n).map(|_| bare.fault()).collect::<Vec<_>>());
    drop(bare);
    progress.inc(1);
    let sum = Summary {
        median: udp.median + bare_fault.median,
        p25: udp.p25 + bare_fault.p25,
        p75: udp.p75 + bare_fault.p75,
        min: udp.min + bare_fault.min,
        max: udp.max + bare_fault.max,
        samples: n,
    };
    let g = "Baselines (µs per operation)";
    t.push(g, "UDP round trip, 8 B, blocking sockets", "µs", udp);
    t.push(g, "bare userfaultfd read fault", "µs", bare_fault);
    t.push(g, "UDP round trip + bare fault (sum)", "µs", sum);
    for (i, protocol) in [Protocol::Hlrc, Protocol::Sc].into_iter().enumerate() {
        let p = protocol.as_str();
        let g: &'static str = if i == 0 {
            "hlrc (µs per operation; ratio against UDP round trip + bare fault)"
        } else {
            "sc (µs per operation; ratio against UDP round trip + bare fault)"
        };
        let mut pair = Pair::new(protocol, base(1 + 2 * i))
            .with_context(|| format!("{p}: two clusters over shared memory"))?;
        let local = us(&pair.local_read_faults(n));
        progress.inc(1);
        let remote = us(&pair.remote_read_faults(n, Duration::ZERO)?);
        progress.inc(1);
        let write = us(&pair.write_faults(n)?);
        progress.inc(1);
        let release: Vec<u64> = (0..10)
            .map(|_| pair.release_per_page(64))
            .collect::<Result<_, _>>()?;
        let release = us(&release);
        progress.inc(1);
        pair.finish()?;
        let mut net = Pair::over(protocol, base(2 + 2 * i), true)
            .with_context(|| format!("{p}: two clusters over INIs"))?;
        let remote_net = us(&net.remote_read_faults(n, Duration::ZERO)?);
        net.finish()?;
        progress.inc(1);
        t.compare(
            g,
            "local fault (page homed here)",
            "µs",
            local,
            ("UDP + fault", &sum),
            None,
        );
        let target = |s: &Summary| {
            Some((
                "≤ 1.5× UDP + fault".to_owned(),
                s.median <= 1.5 * sum.median,
            ))
        };
        t.compare(
            g,
            "remote read fault, shared memory",
            "µs",
            remote,
            ("UDP + fault", &sum),
            target(&remote),
        );
        t.compare(
            g,
            "remote read fault, INIs over UDP",
            "µs",
            remote_net,
            ("UDP + fault", &sum),
            target(&remote_net),
        );
        t.compare(
            g,
            if i == 0 {
                "write fault (twin + unprotect)"
            } else {
                "write fault (ownership)"
            },
            "µs",
            write,
            ("UDP + fault", &sum),
            None,
        );
        t.push(g, "release, per page of 64 dirty", "µs", release);
    }
    let g = "Diffs of a 4 KiB page (µs per page)";
    for pct in [1u32, 10, 100] {
        let (twin, cur) = kernels::diff_pages(f64::from(pct) / 100.0);
        t.push(
            g,
            format!("encode, {pct}% of words changed"),
            "µs",
            us(&kernels::diff_encode(&twin, &cur, n.max(1000))),
        );
        t.push(
            g,
            format!("apply, {pct}% of words changed"),
            "µs",
            us(&kernels::diff_apply(&twin, &cur, n.max(1000))),
        );
        progress.inc(2);
    }
    progress.finish_and_clear();
    println!(
        "multigrain bench dsm: {n} operations per row; two clusters in this process (block homes); baselines from the same run"
    );
    t.print();
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(&t.rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("\nwrote {}", path.display());
    }
    Ok(())
}
