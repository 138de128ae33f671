//! `multigrain experiment mva`: paper 002 chapter 6 and Figure 6-3 — the contention
//! model's mean INI queue length and cycle time beside the synthetic application's, for
//! N = 1 … `--threads-max` compute threads per INI.
//!
//! The runs, the calibration and the model are `multigrain bench mva`'s
//! ([`crate::commands::bench_mva::run`]); this module lays its report out as an
//! experiment's table and figure. Unlike the other experiments, whose points are
//! `multigrain run` jobs, every run here is the synthetic application in this process
//! (two clusters, one dedicated INI thread each, UDP on loopback: the network the model
//! describes), so the job configuration's `--set` keys have nothing to change.

use super::plot::{Figure, Kind, Series};
use super::table::{Cell, Column, Fmt, Table};
use super::{CommonArgs, Context, Outcome};
use crate::commands::bench_mva::{
    self, DEFAULT_REQUESTS, DEFAULT_THREADS_MAX, Options, Report, WorkloadArgs,
};
use crate::measure::Summary;
use anyhow::{Result, bail};
use serde_json::json;
use std::time::Instant;

/// Largest N of `--quick`.
const QUICK_THREADS_MAX: usize = 3;
/// Timed requests per client of `--quick`.
const QUICK_REQUESTS: u64 = 500;

/// Flags of `multigrain experiment mva` (see its `--help`).
#[derive(clap::Args, Debug)]
pub struct MvaArgs {
    #[command(flatten)]
    pub(super) common: CommonArgs,
    /// Largest number of client threads per INI: rows N = 1 ..= this [default: 8; with
    /// --quick 3].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=256))]
    pub threads_max: Option<u64>,
    /// Timed requests per client thread per run [default: 2000; with --quick 500].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: Option<u64>,
    /// The synthetic application's compute time and INI polling.
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

/// A single number as a cell (non-finite: [`Cell::Missing`]).
fn one(x: f64) -> Cell {
    Cell::stat(&[x])
}

/// `(x − base) / base`.
fn rel(x: f64, base: f64) -> f64 {
    (x - base) / base
}

/// The report as the experiment's table.
fn table(ctx: &Context, r: &Report) -> Table {
    let o = &r.options;
    let mut t = Table::new(
        "mva",
        format!(
            "mva: N client threads in cluster 0 → 1 server thread in cluster 1, one dedicated \
             INI per cluster, UDP on loopback; W = {} µs ({}), {} timed requests per client \
             (paper 002 chapter 6, Figure 6-3); {} run(s) per N, median (min–max)",
            o.work_us,
            match o.work {
                crate::synthetic::Work::Spin => "spin",
                crate::synthetic::Work::Sleep => "sleep",
            },
            o.requests,
            o.samples,
        ),
        vec![
            Column::new("n", "N", Fmt::Plain),
            Column::new("threads", "threads", Fmt::Plain),
            Column::new("q_measured", "Q measured", Fmt::Num),
            Column::new("q_model", "Q eq.6", Fmt::Num),
            Column::new("q_exact", "Q MVA", Fmt::Num),
            Column::new("q_error", "err eq.6", Fmt::SignedPct),
            Column::new("q_exact_error", "err MVA", Fmt::SignedPct),
            Column::new("r_measured", "R measured (µs)", Fmt::Num),
            Column::new("r_model", "R eq.6 (µs)", Fmt::Num),
            Column::new("r_exact", "R MVA (µs)", Fmt::Num),
            Column::new("r_error", "err eq.6", Fmt::SignedPct),
            Column::new("q_within_n", "Q ≤ N", Fmt::Plain),
            Column::new("note", "note", Fmt::Plain),
        ],
    );
    for row in &r.rows {
        let q: Vec<f64> = row.runs.iter().map(|m| m.ini_queue).collect();
        let cycle: Vec<f64> = row.runs.iter().map(|m| m.cycle_us).collect();
        t.push(vec![
            Cell::Int(row.n as u64),
            Cell::Int(row.threads as u64),
            Cell::stat(&q),
            one(row.q_model),
            one(row.q_exact),
            one(row.q_error),
            one(rel(row.q_exact, row.q_measured.median)),
            Cell::stat(&cycle),
            one(row.r_model),
            one(row.r_exact),
            one(row.r_error),
            Cell::text(if row.q_within_n { "yes" } else { "NO" }),
            Cell::text(if row.oversubscribed {
                "oversubscribed"
            } else {
                ""
            }),
        ]);
    }
    t.notes.push(bench_mva::table::inputs_line(r));
    t.notes.push(format!(
        "{} err MVA = (MVA − measured) / measured; threads = N clients + 1 server + 2 INI \
         threads; Q ≤ N: the measured maximum and all three predictions (eq.6, Schweitzer's \
         arrivals, MVA) are at most N (eq. 6.11)",
        bench_mva::table::LEGEND
    ));
    t.notes.push(bench_mva::table::schweitzer_line(r));
    t.notes.push(bench_mva::table::figure_6_3_line(r));
    t.notes.push(ctx.machine_note());
    t
}

/// The figure: Q against N, measured (median, min–max error bars) beside the equations'
/// and the exact MVA's lines.
fn figure(r: &Report) -> Figure {
    let o = &r.options;
    let measured = r
        .rows
        .iter()
        .map(|row| {
            let q: Vec<f64> = row.runs.iter().map(|m| m.ini_queue).collect();
            Some(Summary::of(&q))
        })
        .collect();
    let line = |f: fn(&bench_mva::Row) -> f64| {
        r.rows
            .iter()
            .map(|row| Some(Summary::of(&[f(row)])))
            .collect()
    };
    Figure {
        title: format!(
            "Mean INI queue length Q vs client threads per INI N (paper 002 Figure 6-3; W = {} µs, {} run(s) per N)",
            o.work_us, o.samples
        ),
        y_label: "Q: messages in one INI (time average)".into(),
        groups: r.rows.iter().map(|row| format!("N = {}", row.n)).collect(),
        series: vec![
            Series {
                name: "measured (median, min–max)".into(),
                kind: Kind::Points,
                values: measured,
            },
            Series {
                name: "model, equations 6.1–6.10".into(),
                kind: Kind::Line,
                values: line(|row| row.q_model),
            },
            Series {
                name: "exact MVA".into(),
                kind: Kind::Line,
                values: line(|row| row.q_exact),
            },
        ],
    }
}

/// Runs the experiment.
///
/// # Errors
/// Bad flags (`--set`, which has nothing to change here), or a run that fails.
pub fn run(ctx: &Context, a: &MvaArgs) -> Result<Outcome> {
    if !ctx.sets.is_empty() {
        bail!(
            "experiment mva takes no --set: its runs are the synthetic application in this \
             process (2 clusters, 1 dedicated INI each, UDP on loopback), not `multigrain run` \
             jobs; its knobs are --threads-max, --requests, --work-us, --work and --ini-spin-us"
        );
    }
    let threads_max = a.threads_max.map_or(
        if ctx.quick {
            QUICK_THREADS_MAX
        } else {
            DEFAULT_THREADS_MAX
        },
        |n| n as usize,
    );
    let requests = a.requests.unwrap_or(if ctx.quick {
        QUICK_REQUESTS
    } else {
        DEFAULT_REQUESTS
    });
    let opts = Options::new(threads_max, requests, ctx.repeat, &a.workload);
    let total = (ctx.repeat * threads_max) as u64;
    let progress = crate::progress::bar(total, &format!("experiment {}", ctx.name));
    let lines = crate::progress::shown() == crate::progress::Shown::Lines;
    let started = Instant::now();
    let mut done = 0u64;
    let report = bench_mva::run(&opts, || {
        done += 1;
        progress.inc(1);
        if lines {
            eprintln!(
                "experiment {}: run {done}/{total} (round {}/{}: N = {}) done, {:.1} s",
                ctx.name,
                (done - 1) / threads_max as u64 + 1,
                ctx.repeat,
                (done - 1) % threads_max as u64 + 1,
                started.elapsed().as_secs_f64()
            );
        }
    })?;
    progress.finish_and_clear();
    if !crate::progress::quiet() {
        eprintln!(
            "experiment {}: {total} runs in {:.0} s",
            ctx.name, report.wall_s
        );
    }
    let t = table(ctx, &report);
    let figure = figure(&report);
    Ok(Outcome {
        tables: vec![t],
        figure,
        params: json!({
            "app": "synthetic", "threads_max": threads_max, "requests": requests,
            "options": report.options,
            "calibration": report.calibration,
            "figure_6_3_model": report.figure_6_3_model,
            "wall_s": report.wall_s,
            "rows": report.rows,
        }),
        points: Vec::new(),
        failed: 0,
    })
}
