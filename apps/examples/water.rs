//! Runs Water like SPLASH's `WATER-NSQUARED < deck`, printing SPLASH's output.
//!
//! ```text
//! cargo run --release -p multigrain-apps --example water -- DECK [--velocities FILE] [--threads N]
//! ```
//!
//! Without `--threads` it runs the sequential reference; with it, the parallel program on
//! the plain-threads runtime. `--exact` prints every energy with 17 significant digits
//! instead of SPLASH's layout. Phase times go to stderr.

use std::path::PathBuf;
use std::process::ExitCode;

use multigrain_apps::threads::ThreadsRuntime;
use multigrain_apps::water::{self, VelocitySource};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            let mut source = e.source();
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut deck_path = None;
    let mut velocities = None;
    let mut threads = None;
    let mut exact = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--velocities" => {
                velocities = Some(PathBuf::from(
                    args.next().ok_or("--velocities needs a file")?,
                ))
            }
            "--exact" => exact = true,
            "--threads" => {
                threads = Some(
                    args.next()
                        .ok_or("--threads needs a number")?
                        .parse::<usize>()?,
                )
            }
            _ if deck_path.is_none() => deck_path = Some(PathBuf::from(a)),
            _ => return Err(format!("unexpected argument {a:?}").into()),
        }
    }
    let deck_path =
        deck_path.ok_or("usage: water DECK [--velocities FILE] [--threads N] [--exact]")?;
    let mut deck = water::parse_input_file(&deck_path)?;
    if let Some(v) = velocities {
        deck.params.velocities = VelocitySource::File(v);
    }
    if let Some(t) = threads {
        deck.num_procs = t;
    }
    print!("{}", water::format_banner(&deck)?);
    let result = match threads {
        None => water::run_sequential(&deck.params)?,
        Some(t) => water::run_parallel(&mut ThreadsRuntime::new(t)?, &deck.params)?,
    };
    for e in &result.energies {
        if exact {
            println!(
                "{} {:.16e} {:.16e} {:.16e} {:.16e} {:.16e} {:.16e} {:.16e}",
                e.step,
                e.kinetic,
                e.intra_potential,
                e.inter_potential,
                e.reaction_field,
                e.total,
                e.avg_temperature_k,
                e.virial
            );
        } else {
            print!("{}", water::format_step(e));
        }
    }
    eprintln!("{:?}", result.times);
    Ok(())
}
