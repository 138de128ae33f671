//! Express throughput with 1, 2, 4 and 8 sending threads into one queue drained by one
//! receiver, beside crossbeam's `ArrayQueue` and a `Mutex<VecDeque>` (both capacity 1024).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use multigrain_bench as bench;

const MESSAGES: u64 = 200_000;

fn throughput(c: &mut Criterion) {
    let mut g = c.benchmark_group("throughput");
    g.throughput(Throughput::Elements(MESSAGES));
    g.sample_size(20);
    for senders in [1usize, 2, 4, 8] {
        let run = |f: fn(usize, u64) -> std::time::Duration| {
            move |iters: u64| (0..iters).map(|_| f(senders, MESSAGES)).sum()
        };
        g.bench_with_input(BenchmarkId::new("express", senders), &senders, |b, _| {
            b.iter_custom(run(bench::express_throughput))
        });
        g.bench_with_input(
            BenchmarkId::new("array_queue", senders),
            &senders,
            |b, _| b.iter_custom(run(bench::array_queue_throughput)),
        );
        g.bench_with_input(
            BenchmarkId::new("mutex_deque", senders),
            &senders,
            |b, _| b.iter_custom(run(bench::mutex_deque_throughput)),
        );
    }
    g.finish();
}

criterion_group!(benches, throughput);
criterion_main!(benches);
