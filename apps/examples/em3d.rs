//! Runs EM3D sequentially and on the plain-threads runtime and prints checksums, edge
//! statistics and times.
//!
//! ```text
//! cargo run --release -p multigrain-apps --example em3d -- \
//!     [--clusters C] [--threads-per-cluster T] [--layout naive|good] [--variant read|write] \
//!     [--nodes N] [--degree D] [--remote PCT] [--iterations I] [--seed S]
//! ```

use std::process::ExitCode;

use multigrain_apps::em3d::{self, Layout, Params, Variant};
use multigrain_apps::threads::ThreadsRuntime;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut p = Params::default();
    let (mut clusters, mut per) = (1usize, 2usize);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--clusters" => clusters = value()?.parse()?,
            "--threads-per-cluster" => per = value()?.parse()?,
            "--layout" => {
                p.layout = match value()?.as_str() {
                    "naive" => Layout::Naive,
                    "good" => Layout::Good,
                    other => return Err(format!("unknown layout {other:?}").into()),
                }
            }
            "--variant" => {
                p.variant = match value()?.as_str() {
                    "read" => Variant::Read,
                    "write" => Variant::Write,
                    other => return Err(format!("unknown variant {other:?}").into()),
                }
            }
            "--nodes" => p.nodes_per_thread = value()?.parse()?,
            "--degree" => p.degree = value()?.parse()?,
            "--remote" => p.percent_remote = value()?.parse()?,
            "--iterations" => p.iterations = value()?.parse()?,
            "--seed" => p.seed = value()?.parse()?,
            other => return Err(format!("unknown flag {other:?}").into()),
        }
    }
    let seq = em3d::run_sequential(&p, clusters * per)?;
    println!(
        "sequential: {}  ({:.3} s)",
        seq.checksum, seq.times.compute_s
    );
    let mut rt = ThreadsRuntime::with_clusters(clusters, per)?;
    let par = em3d::run_parallel(&mut rt, &p)?;
    println!(
        "parallel {clusters}x{per} {:?}/{:?}: {}  ({:.3} s)",
        p.layout, p.variant, par.checksum, par.times.compute_s
    );
    println!(
        "grid {:?}, cluster block {:?}",
        par.grid.dims, par.cluster_block
    );
    println!("{:?}", par.edge_stats);
    println!("bitwise equal: {}", par.checksum == seq.checksum);
    Ok(())
}
