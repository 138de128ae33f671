//! Frames per second through the INI sliding-window core on a loss-free link, to show the
//! protocol core is not the bottleneck of the inter-cluster path (design.md, messaging).
//!
//! * `direct/*`: two INIs wired back to back, no simulator: the cost of the core alone
//!   (encode + MAC + window + timers + decode + reassembly), both ends counted.
//! * `sim/*`: the same through the deterministic simulator (delay queue, virtual clock).
//!
//! Throughput is in DATA frames; delivered message buffers are recycled as new messages,
//! so the allocations left are the receiver's one per delivered message.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use multigrain_window::sim::{Sim, SimConfig};
use multigrain_window::{ConnHandle, EnqueueError, Event, Ini, IniAddr, Micros, WindowConfig};
use std::hint::black_box;
use std::time::Duration;

const A: IniAddr = IniAddr::new(0, 0);
const B: IniAddr = IniAddr::new(1, 0);

fn pair(cfg: &WindowConfig) -> (Ini, ConnHandle, Ini) {
    let mut a = Ini::new(A, cfg.clone()).unwrap();
    let to_b = a.add_peer(B).unwrap();
    let mut b = Ini::new(B, cfg.clone()).unwrap();
    b.add_peer(A).unwrap();
    (a, to_b, b)
}

/// Moves `count` messages of `len` bytes from `a` to `b`, delivering each datagram at
/// once; the clock advances 1 µs per round. Returns the DATA frames sent.
fn direct(cfg: &WindowConfig, count: u64, len: usize) -> u64 {
    let (mut a, to_b, mut b) = pair(cfg);
    let mut buf = vec![0u8; cfg.mtu];
    let mut spare: Vec<Vec<u8>> = Vec::new();
    let (mut sent, mut got, mut now) = (0u64, 0u64, 0u64);
    while got < count {
        while sent < count {
            let msg = spare.pop().unwrap_or_else(|| vec![0x5a; len]);
            match a.enqueue(to_b, msg) {
                Ok(()) => sent += 1,
                Err(EnqueueError::Full(m)) => {
                    spare.push(m);
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        while let Some(t) = a.poll_transmit(Micros(now), &mut buf) {
            let _ = b.handle_datagram(Micros(now), &buf[..t.len]);
        }
        while let Some(t) = b.poll_transmit(Micros(now), &mut buf) {
            let _ = a.handle_datagram(Micros(now), &buf[..t.len]);
        }
        while let Some(e) = b.poll_event() {
            if let Event::Delivered { msg, .. } = e {
                got += 1;
                spare.push(msg);
            }
        }
        now += 1;
        for ini in [&mut a, &mut b] {
            if ini.poll_timeout().is_some_and(|t| t.as_u64() <= now) {
                ini.handle_timeout(Micros(now));
            }
        }
    }
    a.conn_stats(to_b).data_frames_sent
}

/// The same transfer through the simulator on a loss-free link.
fn simulated(cfg: &WindowConfig, count: u64, len: usize) -> u64 {
    let (a, to_b, b) = pair(cfg);
    let mut sim = Sim::new(SimConfig::lossless(1));
    sim.add_node(a);
    sim.add_node(b);
    let mut spare: Vec<Vec<u8>> = Vec::new();
    let (mut sent, mut got) = (0u64, 0u64);
    while got < count {
        while sent < count {
            let msg = spare.pop().unwrap_or_else(|| vec![0x5a; len]);
            match sim.node_mut(0).enqueue(to_b, msg) {
                Ok(()) => sent += 1,
                Err(EnqueueError::Full(m)) => {
                    spare.push(m);
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(sim.step(), "stalled");
        while let Some(e) = sim.node_mut(1).poll_event() {
            if let Event::Delivered { msg, .. } = e {
                got += 1;
                spare.push(msg);
            }
        }
    }
    sim.node(0).conn_stats(to_b).data_frames_sent
}

fn bench(c: &mut Criterion) {
    let cfg = WindowConfig::default();
    let mut g = c.benchmark_group("window");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    // (name, messages, message bytes): 64 B control-sized messages (one frame each), and
    // 4 KiB pages (three frames each at the default 1472-byte MTU).
    for (name, count, len) in [("64B", 50_000u64, 64usize), ("4KiB", 20_000, 4096)] {
        let frames = direct(&cfg, count, len);
        assert_eq!(frames, simulated(&cfg, count, len));
        g.throughput(Throughput::Elements(frames));
        g.bench_function(format!("direct/{name}"), |bch| {
            bch.iter(|| black_box(direct(&cfg, count, len)))
        });
        g.bench_function(format!("sim/{name}"), |bch| {
            bch.iter(|| black_box(simulated(&cfg, count, len)))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
