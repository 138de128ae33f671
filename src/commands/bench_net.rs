//! `multigrain bench net`: the inter-cluster path on loopback — Express latency through
//! INIs beside a raw UDP ping-pong of the same datagram size, and 4 KiB Tag-On throughput
//! with 1 and 2 INIs per cluster — each measured in the same run (paper 002 §5).

use crate::measure::{Summary, Table, alternate};
use anyhow::{Context, Result};
use multigrain_cluster_config::IniPolicy;
use multigrain_messaging::bench::network::{
    EXPRESS_DATAGRAM, Pair, express_pingpong, tag_on_stream, udp_pingpong,
};

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

/// Runs the benchmark and prints the table (and writes JSON if asked).
pub fn run(opts: Options, json: Option<&std::path::Path>) -> Result<()> {
    anyhow::ensure!(
        opts.samples >= 3,
        "--samples must be at least 3, got {}",
        opts.samples
    );
    let progress = crate::progress::bar(opts.samples as u64 * 4, "bench net");
    let mut t = Table { rows: Vec::new() };
    let rt = opts.round_trips;
    let pair = Pair::new(1, IniPolicy::Static);
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6 / rt as f64 / 2.0;
    let lat = alternate(
        opts.samples,
        &[&|| us(udp_pingpong(rt, EXPRESS_DATAGRAM)), &|| {
            us(express_pingpong(&pair, rt))
        }],
        &progress,
    );
    drop(pair);
    let g = "Inter-cluster one-way latency on loopback (ping-pong ÷ 2, µs)";
    t.push(
        g,
        format!("raw UDP, {EXPRESS_DATAGRAM}-byte datagrams, blocking"),
        "µs",
        lat[0],
    );
    let r = lat[1].ratio_to(&lat[0]);
    t.compare(
        g,
        "Express through INIs",
        "µs",
        lat[1],
        ("raw UDP", &lat[0]),
        Some(("≤ 1.3× raw UDP".into(), r <= 1.3)),
    );
    let g = "4 KiB Tag-On stream between two clusters (MB/s; msgs/s = MB/s × 244)";
    let mut base: Option<Summary> = None;
    for inis in [1usize, 2] {
        let pair = Pair::new(inis, IniPolicy::Static);
        let p = opts.pages;
        let mbs = || p as f64 * 4096.0 / tag_on_stream(&pair, inis, p).as_secs_f64() / 1e6;
        let s = alternate(opts.samples, &[&mbs], &progress)[0];
        let name = format!(
            "{inis} INI{} per cluster, {inis} sender thread{}",
            if inis > 1 { "s" } else { "" },
            if inis > 1 { "s" } else { "" }
        );
        match &base {
            None => {
                t.push(g, name, "MB/s", s);
                base = Some(s);
            }
            Some(b) => t.compare(g, name, "MB/s", s, ("1 INI", b), None),
        }
    }
    progress.finish_and_clear();
    println!(
        "multigrain bench net: {} samples per row, baselines measured in the same run",
        opts.samples
    );
    t.print();
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(&t.rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("\nwrote {}", path.display());
    }
    Ok(())
}
