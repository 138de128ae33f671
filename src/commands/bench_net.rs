//! `multigrain bench net`: the inter-cluster path on loopback — Express latency through
//! INIs beside raw UDP ping-pongs (busy-polled: the baseline the INIs are held to; with
//! blocking sockets: the weak baseline), and 4 KiB Tag-On throughput with 1 and 2 INIs
//! per cluster — each sampled in alternation with its baseline in the same run (paper
//! 002 §5).

use crate::measure::{Table, Target, interleave, write_json};
use anyhow::Result;
use multigrain_bench::network::{
    EXPRESS_DATAGRAM, Pair, UdpWait, express_pingpong, tag_on_stream, udp_pingpong,
};
use multigrain_cluster_config::IniPolicy;

/// How much work each sample does.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Samples per row.
    pub samples: usize,
    /// Round trips per latency sample.
    pub round_trips: u64,
    /// 4 KiB pages per throughput sample.
    pub pages: u64,
}

/// Size of the small raw-UDP datagrams (the payload of `bench dsm`'s UDP baseline).
const SMALL_DATAGRAM: usize = 8;

/// Runs the benchmark and prints the table (and writes JSON if asked).
pub fn run(opts: Options, json: Option<&std::path::Path>) -> Result<()> {
    anyhow::ensure!(
        opts.samples >= 3,
        "--samples must be at least 3, got {}",
        opts.samples
    );
    anyhow::ensure!(
        opts.round_trips >= 1,
        "--round-trips must be at least 1, got 0"
    );
    anyhow::ensure!(
        opts.pages >= 2,
        "--pages must be at least 2 (one per sender with 2 INIs), got {}",
        opts.pages
    );
    let progress = crate::progress::bar(opts.samples as u64 * 6, "bench net");
    let mut t = Table::default();
    let rt = opts.round_trips;
    let pair = Pair::new(1, IniPolicy::Static);
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6 / rt as f64 / 2.0;
    let udp = |size: usize, wait: UdpWait| move || Ok(us(udp_pingpong(rt, size, wait)));
    let lat = interleave(
        opts.samples,
        &mut [
            &mut udp(EXPRESS_DATAGRAM, UdpWait::BusyPoll),
            &mut || Ok(us(express_pingpong(&pair, rt))),
            &mut udp(EXPRESS_DATAGRAM, UdpWait::Blocking),
            &mut udp(SMALL_DATAGRAM, UdpWait::BusyPoll),
        ],
        &progress,
    )?;
    drop(pair);
    let g = "Inter-cluster one-way latency on loopback (ping-pong ÷ 2, µs; ends pinned to different CPUs)";
    let busy = format!("raw UDP, {EXPRESS_DATAGRAM}-byte datagrams, busy-polled");
    t.push(g, &busy, "µs", &lat[0]);
    t.push(
        g,
        format!("raw UDP, {SMALL_DATAGRAM}-byte datagrams, busy-polled"),
        "µs",
        &lat[3],
    );
    t.push(
        g,
        format!("raw UDP, {EXPRESS_DATAGRAM}-byte datagrams, blocking (weak baseline)"),
        "µs",
        &lat[2],
    );
    t.compare(
        g,
        "Express through INIs",
        "µs",
        &lat[1],
        ("busy UDP", &lat[0]),
        Some(Target::at_most(1.5, "≤ 1.5× busy-polled UDP")),
    );
    t.compare(
        g,
        "Express through INIs, against the weak baseline",
        "µs",
        &lat[1],
        ("blocking UDP", &lat[2]),
        None,
    );

    let g = "4 KiB Tag-On stream between two clusters (MB/s; msgs/s = MB/s × 244)";
    let (one, two) = (
        Pair::new(1, IniPolicy::Static),
        Pair::new(2, IniPolicy::Static),
    );
    let p = opts.pages;
    let mbs = |pair: &Pair, inis: usize| {
        p as f64 * 4096.0 / tag_on_stream(pair, inis, p).as_secs_f64() / 1e6
    };
    let thr = interleave(
        opts.samples,
        &mut [&mut || Ok(mbs(&one, 1)), &mut || Ok(mbs(&two, 2))],
        &progress,
    )?;
    drop((one, two));
    t.push(g, "1 INI per cluster, 1 sender thread", "MB/s", &thr[0]);
    t.compare(
        g,
        "2 INIs per cluster, 2 sender threads",
        "MB/s",
        &thr[1],
        ("1 INI", &thr[0]),
        None,
    );
    progress.finish_and_clear();
    println!(
        "multigrain bench net: {} samples per row; each row's samples alternate with its baseline's, round by round; ratio = median of the per-pair ratios (sample i / baseline sample i), with their p25–p75",
        opts.samples
    );
    t.print();
    if let Some(path) = json {
        write_json(path, &t.rows)?;
        println!("\nwrote {}", path.display());
    }
    Ok(())
}
