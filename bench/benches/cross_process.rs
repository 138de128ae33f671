//! One-way Express latency between two processes through a shared segment (ping-pong ÷ 2),
//! beside a bare atomic ping-pong in a shared segment between the same two processes and
//! the in-process bare atomic ping-pong, all in the same run. The binary re-executes itself
//! as the peer.

use criterion::Criterion;
use multigrain_bench::{self as bench, cross_process};

fn main() {
    if cross_process::run_peer_if_requested() {
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    let cmd = std::process::Command::new(std::env::current_exe().expect("current exe"));
    let pp = cross_process::PingPong::start(cmd).expect("start peer process");
    let mut g = c.benchmark_group("cross_process_round_trip");
    g.bench_function("atomic_in_process", |b| {
        b.iter_custom(bench::atomic_pingpong)
    });
    g.bench_function("atomic_shm", |b| b.iter_custom(|n| pp.atomic(n)));
    g.bench_function("express_shm", |b| b.iter_custom(|n| pp.express(n)));
    g.finish();
    drop(pp);
    c.final_summary();
}
