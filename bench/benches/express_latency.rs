//! One-way Express latency between two threads (ping-pong ÷ 2), beside a bare atomic-flag
//! ping-pong, a two-flag ping-pong (one line per direction), a single-producer
//! single-consumer ring ping-pong (`rtrb`) and a crossbeam-channel bounded ping-pong, all
//! measured in the same run.
//! Each iteration is one round trip; one-way latency is half the reported time.

use criterion::{Criterion, criterion_group, criterion_main};
use multigrain_bench as bench;

fn latency(c: &mut Criterion) {
    let mut g = c.benchmark_group("round_trip");
    g.bench_function("atomic", |b| b.iter_custom(bench::atomic_pingpong));
    g.bench_function("two_flags", |b| b.iter_custom(bench::two_flag_pingpong));
    g.bench_function("spsc_ring", |b| b.iter_custom(bench::spsc_pingpong));
    g.bench_function("express", |b| b.iter_custom(bench::express_pingpong));
    g.bench_function("crossbeam_channel", |b| {
        b.iter_custom(bench::crossbeam_pingpong)
    });
    g.finish();
}

criterion_group!(benches, latency);
criterion_main!(benches);
