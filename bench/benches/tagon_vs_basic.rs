//! One-way transfer of a 4 KiB page: one Tag-On message (the page copied into a pool buffer
//! once, read in place) beside the same bytes as 16 Basic messages of 256 bytes (copied into
//! and out of a lock-guarded ring), paper 004 §6.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use multigrain_bench as bench;

fn pages(c: &mut Criterion) {
    let mut g = c.benchmark_group("page_4k");
    g.throughput(Throughput::Bytes(4096));
    g.bench_function("tag_on", |b| b.iter_custom(bench::tag_on_stream));
    g.bench_function("basic_x16", |b| b.iter_custom(bench::basic_stream));
    g.finish();
}

criterion_group!(benches, pages);
criterion_main!(benches);
