//! Running an experiment's points: each point is one `multigrain run` command line, run
//! in a child process ([`crate::commands::child_run`]); round *r* runs every point once,
//! so a change of the machine's speed between rounds touches every point alike.

use super::Context;
use crate::commands::child_run::run_report;
use crate::commands::run::report::Report;
use crate::commands::run::spawn::ScratchDir;
use anyhow::{Context as _, Result};
use indicatif::{ProgressBar, ProgressStyle};
use multigrain_cluster_config::Override;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// One configuration of a sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Unique within the experiment; names its scratch directory (letters, digits, `-`).
    pub id: String,
    /// What the progress line shows, e.g. `2×2, 2 INIs, static`.
    pub label: String,
    /// The application and its flags, e.g. `["water", "--molecules", "343"]`.
    pub app: Vec<String>,
    /// `KEY=VALUE` configuration values, applied after the user's `--set` values.
    pub sets: Vec<String>,
    /// Record INI traces (`ini.trace_dir` in the run's scratch directory).
    pub trace: bool,
}

/// A point's runs, one per round.
#[derive(Clone, Debug)]
pub struct Runs {
    /// Per round, the run's report or why it has none.
    pub rounds: Vec<Result<Report, String>>,
}

impl Runs {
    /// `f` of every successful run, in round order.
    pub fn values(&self, f: impl Fn(&Report) -> Option<f64>) -> Vec<f64> {
        self.rounds.iter().flatten().filter_map(f).collect()
    }

    /// Per round, `f` of this run against `base`'s run of the same round (rounds where
    /// both succeeded), e.g. a slowdown.
    pub fn paired(&self, base: &Runs, f: impl Fn(&Report, &Report) -> f64) -> Vec<f64> {
        self.rounds
            .iter()
            .zip(&base.rounds)
            .filter_map(|(a, b)| match (a, b) {
                (Ok(a), Ok(b)) => Some(f(a, b)),
                _ => None,
            })
            .collect()
    }

    /// Why runs failed, `round N: reason` each.
    pub fn failures(&self) -> Vec<String> {
        self.rounds
            .iter()
            .enumerate()
            .filter_map(|(r, x)| x.as_ref().err().map(|e| format!("round {}: {e}", r + 1)))
            .collect()
    }
}

/// Runs points and shows progress: an overall bar with ETA and the current point (on
/// a terminal), else one line per run on stderr.
pub struct Sweep {
    exe: PathBuf,
    scratch: ScratchDir,
    timeout: Duration,
    user_sets: Vec<String>,
    bar: Option<ProgressBar>,
    /// Without a bar: a line per run (stderr not a terminal), or nothing but failures
    /// (`-q`).
    lines: bool,
    name: &'static str,
    total: u64,
    done: u64,
    failed: usize,
    started: Instant,
}

impl Sweep {
    /// A sweep of `total` runs in all (every call to [`Sweep::run`] together).
    ///
    /// # Errors
    /// The executable cannot be found or the scratch directory cannot be made.
    pub fn new(ctx: &Context, total: u64) -> Result<Sweep> {
        let shown = crate::progress::shown();
        let bar = (shown == crate::progress::Shown::Bars).then(|| {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{elapsed_precise}] {bar:30} {pos}/{len} ETA {eta} {wide_msg}",
                )
                .expect("valid template"),
            );
            bar.set_prefix(format!("experiment {}", ctx.name));
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Ok(Sweep {
            exe: std::env::current_exe().context("locating the multigrain binary to run")?,
            scratch: ScratchDir::new()?,
            timeout: ctx.timeout,
            user_sets: ctx.sets.iter().map(Override::assignment).collect(),
            bar,
            lines: shown == crate::progress::Shown::Lines,
            name: ctx.name,
            total,
            done: 0,
            failed: 0,
            started: Instant::now(),
        })
    }

    /// Runs every point `rounds` times, interleaved: round 1 runs each point once, then
    /// round 2, …. Returns the runs in `points` order.
    pub fn run(&mut self, points: &[Point], rounds: usize) -> Vec<Runs> {
        let mut out: Vec<Runs> = points
            .iter()
            .map(|_| Runs {
                rounds: Vec::with_capacity(rounds),
            })
            .collect();
        for round in 0..rounds {
            for (p, runs) in points.iter().zip(out.iter_mut()) {
                runs.rounds.push(self.run_one(p, round, rounds));
            }
        }
        out
    }

    fn run_one(&mut self, p: &Point, round: usize, rounds: usize) -> Result<Report, String> {
        self.done += 1;
        let what = format!("round {}/{rounds}: {}", round + 1, p.label);
        if let Some(bar) = &self.bar {
            bar.set_message(what.clone());
        } else if self.lines {
            eprint!(
                "experiment {}: run {}/{} ({what}) … ",
                self.name, self.done, self.total
            );
        }
        let dir = self.scratch.path().join(format!("{}-r{}", p.id, round + 1));
        let t = Instant::now();
        let r = self.run_in(&dir, p);
        let _ = std::fs::remove_dir_all(&dir);
        if r.is_err() {
            self.failed += 1;
        }
        match (&self.bar, &r) {
            (Some(bar), Err(e)) => bar.println(format!("FAILED: {what}: {e}")),
            (Some(_), Ok(_)) => {}
            (None, Ok(rep)) if self.lines => eprintln!(
                "run_s {:.3} s ({:.1} s with start-up)",
                rep.run_s,
                t.elapsed().as_secs_f64()
            ),
            (None, Ok(_)) => {}
            (None, Err(e)) if self.lines => eprintln!("FAILED: {e}"),
            // `-q`: the error only, with what failed.
            (None, Err(e)) => eprintln!(
                "experiment {}: run {}/{} ({what}) FAILED: {e}",
                self.name, self.done, self.total
            ),
        }
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
        r
    }

    fn run_in(&self, dir: &std::path::Path, p: &Point) -> Result<Report, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let mut args = p.app.clone();
        let mut sets: Vec<String> = self.user_sets.iter().chain(&p.sets).cloned().collect();
        if p.trace {
            sets.push(format!("ini.trace_dir={}", dir.join("traces").display()));
        }
        for s in sets {
            args.push("--set".into());
            args.push(s);
        }
        run_report(&self.exe, dir, &args, self.timeout)
    }

    /// Clears the bar and prints how many runs took how long (and how many failed).
    pub fn finish(self) -> usize {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if self.bar.is_none() && !self.lines && self.failed == 0 {
            // `-q`, nothing failed: nothing to say.
            return 0;
        }
        eprintln!(
            "experiment {}: {} runs in {:.0} s{}",
            self.name,
            self.done,
            self.started.elapsed().as_secs_f64(),
            if self.failed > 0 {
                format!(", {} FAILED", self.failed)
            } else {
                String::new()
            }
        );
        self.failed
    }
}
