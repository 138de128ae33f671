//! The inter-cluster path on loopback: one-way Express latency between two clusters
//! through INIs (ping-pong ÷ 2) beside a raw UDP ping-pong of the same datagram size,
//! busy-polled (the baseline the INIs are held to) and with blocking sockets (the weak
//! baseline), in the same run; and 4 KiB Tag-On throughput with 1 and 2 INIs per
//! cluster (bytes/s; messages/s = bytes/s ÷ 4096).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use multigrain_bench::network::{
    EXPRESS_DATAGRAM, Pair, UdpWait, express_pingpong, tag_on_stream, udp_pingpong,
};
use multigrain_cluster_config::IniPolicy;

fn latency(c: &mut Criterion) {
    let pair = Pair::new(1, IniPolicy::Static);
    let mut g = c.benchmark_group("inter_cluster_round_trip");
    g.bench_function("raw_udp_busy_polled", |b| {
        b.iter_custom(|n| udp_pingpong(n, EXPRESS_DATAGRAM, UdpWait::BusyPoll))
    });
    g.bench_function("raw_udp_blocking", |b| {
        b.iter_custom(|n| udp_pingpong(n, EXPRESS_DATAGRAM, UdpWait::Blocking))
    });
    g.bench_function("express_via_ini", |b| {
        b.iter_custom(|n| express_pingpong(&pair, n))
    });
    g.finish();
}

fn throughput(c: &mut Criterion) {
    let mut g = c.benchmark_group("tag_on_4k_stream");
    g.throughput(Throughput::Bytes(4096));
    g.sample_size(20);
    for inis in [1usize, 2] {
        let pair = Pair::new(inis, IniPolicy::Static);
        g.bench_function(format!("{inis}_ini"), |b| {
            b.iter_custom(|n| tag_on_stream(&pair, inis, n.max(inis as u64)))
        });
    }
    g.finish();
}

criterion_group!(benches, latency, throughput);
criterion_main!(benches);
