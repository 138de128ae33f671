//! `multigrain bench messaging`: the message layer measured beside its baselines, in one
//! run, with medians and spread (paper 004 §6; the targets of the message-layer issue).

use crate::measure::{Kernel, Table, Target, interleave, ns_per, write_json};
use anyhow::{Context, Result};
use multigrain_bench as bench;
use std::time::Duration;

/// How much work each sample does.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Samples per quantity (each a separate run; baseline and subject alternate).
    pub samples: usize,
    /// Round trips per latency sample.
    pub round_trips: u64,
    /// Messages per throughput sample.
    pub messages: u64,
    /// 4 KiB pages per Tag-On/Basic sample.
    pub pages: u64,
    /// Also measure between two processes.
    pub cross_process: bool,
}

/// Runs the benchmark and prints the table (and writes JSON if asked).
pub fn run(opts: Options, json: Option<&std::path::Path>) -> Result<()> {
    anyhow::ensure!(
        opts.samples >= 3,
        "--samples must be at least 3 (median and quartiles), got {}",
        opts.samples
    );
    let steps = opts.samples as u64 * (5 + 4 * 3 + 2 + if opts.cross_process { 3 } else { 0 });
    let progress = crate::progress::bar(steps, "bench messaging");
    let mut t = Table { rows: Vec::new() };
    let s = opts.samples;

    let rt = opts.round_trips;
    let one_way = |f: fn(u64) -> Duration| move || Ok(ns_per(f(rt), rt) / 2.0);
    let lat = interleave(
        s,
        &mut [
            &mut one_way(bench::atomic_pingpong),
            &mut one_way(bench::express_pingpong),
            &mut one_way(bench::crossbeam_pingpong),
            &mut one_way(bench::two_flag_pingpong),
            &mut one_way(bench::spsc_pingpong),
        ],
        &progress,
    )?;
    let g = "Express one-way latency, thread → thread (ping-pong ÷ 2)";
    t.push(g, "bare atomic ping-pong", "ns", &lat[0]);
    t.compare(
        g,
        "two flags, one line per direction",
        "ns",
        &lat[3],
        ("atomic", &lat[0]),
        None,
    );
    t.compare(
        g,
        "Express",
        "ns",
        &lat[1],
        ("atomic", &lat[0]),
        Some(Target::at_most(2.0, "≤ 2.0× atomic")),
    );
    t.compare(
        g,
        "SPSC ring (rtrb), one per direction",
        "ns",
        &lat[4],
        ("atomic", &lat[0]),
        None,
    );
    t.compare(
        g,
        "Express, against the SPSC ring",
        "ns",
        &lat[1],
        ("SPSC ring", &lat[4]),
        None,
    );
    t.compare(
        g,
        "crossbeam-channel bounded",
        "ns",
        &lat[2],
        ("Express", &lat[1]),
        Some(Target::at_least(1.0, "Express faster (≥ 1×)")),
    );

    let m = opts.messages;
    for senders in [1usize, 2, 4, 8] {
        let mps = |f: fn(usize, u64) -> Duration| {
            move || Ok(m as f64 / f(senders, m).as_secs_f64() / 1e6)
        };
        let thr = interleave(
            s,
            &mut [
                &mut mps(bench::array_queue_throughput),
                &mut mps(bench::express_throughput),
                &mut mps(bench::mutex_deque_throughput),
            ],
            &progress,
        )?;
        let g = "Throughput into one queue, one receiver (million messages/s)";
        let name = |what: &str| {
            format!(
                "{what}, {senders} sender{}",
                if senders > 1 { "s" } else { "" }
            )
        };
        t.push(g, name("ArrayQueue"), "M/s", &thr[0]);
        t.compare(
            g,
            name("Express"),
            "M/s",
            &thr[1],
            ("ArrayQueue", &thr[0]),
            Some(Target::at_least(0.9, "≥ 0.9× ArrayQueue")),
        );
        t.compare(
            g,
            name("Mutex<VecDeque>"),
            "M/s",
            &thr[2],
            ("ArrayQueue", &thr[0]),
            None,
        );
    }

    let p = opts.pages;
    let per_page = |f: fn(u64) -> Duration| move || Ok(ns_per(f(p), p));
    let pages = interleave(
        s,
        &mut [
            &mut per_page(bench::basic_stream),
            &mut per_page(bench::tag_on_stream),
        ],
        &progress,
    )?;
    let g = "4 KiB page one way, thread → thread (ns per page)";
    t.push(g, "Basic ×16 (256 B each, copied)", "ns", &pages[0]);
    t.compare(
        g,
        "Tag-On (one pool buffer)",
        "ns",
        &pages[1],
        ("Basic", &pages[0]),
        Some(Target::at_most(1.0, "faster than Basic (≤ 1×)")),
    );

    if opts.cross_process {
        let exe = std::env::current_exe()
            .context("locating the multigrain binary to start the peer process")?;
        let pp = bench::cross_process::PingPong::start(std::process::Command::new(exe))
            .map_err(anyhow::Error::msg)?;
        let mut in_proc = || Ok(ns_per(bench::atomic_pingpong(rt), rt) / 2.0);
        let mut shm_atomic = || Ok(ns_per(pp.atomic(rt), rt) / 2.0);
        let mut shm_express = || Ok(ns_per(pp.express(rt), rt) / 2.0);
        let kernels: &mut [Kernel<'_>] = &mut [&mut in_proc, &mut shm_atomic, &mut shm_express];
        let x = interleave(s, kernels, &progress)?;
        let g = "Express one-way latency, process → process (shared segment)";
        t.push(g, "bare atomic ping-pong, threads", "ns", &x[0]);
        t.compare(
            g,
            "bare atomic ping-pong, processes",
            "ns",
            &x[1],
            ("atomic threads", &x[0]),
            None,
        );
        t.compare(
            g,
            "Express, processes",
            "ns",
            &x[2],
            ("atomic threads", &x[0]),
            Some(Target::at_most(2.5, "≤ 2.5× atomic")),
        );
    }
    progress.finish_and_clear();
    println!(
        "multigrain bench messaging: {s} samples per row; each row's samples alternate with its baseline's, round by round; ratio = median of the per-pair ratios (sample i / baseline sample i), with their p25–p75"
    );
    t.print();
    if let Some(path) = json {
        write_json(path, &t.rows)?;
        println!("\nwrote {}", path.display());
    }
    Ok(())
}
