//! `multigrain experiment ini-scheduling`: paper 002 Tables 5.3–5.5 and Figures 5-1/5-2
//! — Water on every cluster shape of a fixed thread count × INIs per cluster × policy,
//! with the INIs' message length, message time, queue length and utilization from the
//! traces, and the run time against "No IO node" and "IO delay".

use super::plot::{Figure, Kind, Series};
use super::sweep::{Point, Runs, Sweep};
use super::table::{Cell, Column, Fmt, Table};
use super::{CommonArgs, Context, Link, Outcome, POLICIES, Shape, dsm_point, water_app};
use crate::commands::run::report::Report;
use anyhow::{Result, anyhow};
use multigrain_messaging::net::trace::TraceSummary;
use serde_json::json;

/// Flags of `multigrain experiment ini-scheduling` (see its `--help`).
#[derive(clap::Args, Debug)]
pub struct IniSchedulingArgs {
    #[command(flatten)]
    pub(super) common: CommonArgs,
    #[command(flatten)]
    pub water: super::WaterSize,
    /// Compute threads of every job, split into every shape clusters × threads
    /// [default: 8 on a machine with at least 8 cores, else 4].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=64))]
    pub threads: Option<u64>,
}

/// `f` of a run's trace summary (runs without one give nothing).
pub fn traced(f: fn(&TraceSummary) -> f64) -> impl Fn(&Report) -> Option<f64> {
    move |r| r.trace.as_ref().map(f)
}

/// A run's computation time, s.
pub fn run_s(r: &Report) -> Option<f64> {
    Some(r.run_s)
}

/// Per round, this run's time over the base's.
pub fn slowdown(runs: &Runs, base: &Runs) -> Cell {
    Cell::stat(&runs.paired(base, |a, b| a.run_s / b.run_s))
}

/// The points of one shape with inter-cluster traffic, by index into the sweep.
struct ShapeRows {
    shape: Shape,
    latency_us: u64,
    no_io: usize,
    io_delay: usize,
    /// (INIs per cluster, policy, point index).
    inis: Vec<(usize, &'static str, usize)>,
}

fn columns() -> Vec<Column> {
    vec![
        Column::new("cluster_size", "clu size", Fmt::Plain),
        Column::new("shape", "shape", Fmt::Plain),
        Column::new("inis", "INIs/clu", Fmt::Plain),
        Column::new("configuration", "configuration", Fmt::Plain),
        Column::new("threads", "threads", Fmt::Plain),
        Column::median("msg_len_bytes", "msg len (B)", Fmt::Num),
        Column::median("msg_time_us", "msg time (µs)", Fmt::Num),
        Column::median("queue_len", "queue len", Fmt::Num),
        Column::median("ini_utilization", "INI util", Fmt::Pct),
        Column::new("run_s", "run time (s)", Fmt::Secs),
        Column::new("slowdown_vs_no_io", "vs No IO node", Fmt::Ratio),
        Column::new("slowdown_vs_io_delay", "vs IO delay", Fmt::Ratio),
        Column::new("note", "note", Fmt::Plain),
    ]
}

/// Runs the experiment.
///
/// # Errors
/// Bad flags, or a calibration run that failed.
pub fn run(ctx: &Context, a: &IniSchedulingArgs) -> Result<Outcome> {
    let (molecules, steps) = a.water.resolve(ctx.quick)?;
    let total = a
        .threads
        .map_or(if ctx.cores >= 8 { 8 } else { 4 }, |t| t as usize);
    let app = water_app(molecules, steps);
    let dsm_shapes: Vec<Shape> = Shape::all(total)
        .into_iter()
        .filter(|s| s.clusters > 1)
        .collect();
    let reference = Shape {
        clusters: 1,
        threads: total,
    };
    let calibration: Vec<Point> = dsm_shapes
        .iter()
        .map(|&s| {
            let mut p = dsm_point(
                &app,
                "water",
                s,
                Link::Inis {
                    inis: 1,
                    policy: "static",
                },
            );
            p.id = format!("calibration-{}", p.id);
            p.label = format!("calibration of IO delay: {}", p.label);
            p
        })
        .collect();
    let per_shape: usize = dsm_shapes
        .iter()
        .map(|s| 2 + s.threads * POLICIES.len())
        .sum();
    let main_count = per_shape + 1;
    let mut sweep = Sweep::new(ctx, (calibration.len() + ctx.repeat * main_count) as u64)?;
    let calibrated = sweep.run(&calibration, 1);
    let mut latency = Vec::new();
    for (p, runs) in calibration.iter().zip(&calibrated) {
        let service = match &runs.rounds[0] {
            Ok(rep) => rep
                .trace
                .as_ref()
                .filter(|t| t.joined > 0)
                .map(|t| t.mean_service_time_us)
                .ok_or_else(|| anyhow!("{}: the run recorded no inter-cluster message", p.label))?,
            Err(e) => return Err(anyhow!("{}: {e}", p.label)),
        };
        latency.push((service.round() as u64).max(1));
    }
    let mut points = Vec::new();
    let mut rows = Vec::new();
    for (&shape, &l) in dsm_shapes.iter().zip(&latency) {
        let mut add = |link: Link| {
            points.push(dsm_point(&app, "water", shape, link));
            points.len() - 1
        };
        let no_io = add(Link::NoIo);
        let io_delay = add(Link::IoDelay { latency_us: l });
        let mut inis = Vec::new();
        for k in 1..=shape.threads {
            for policy in POLICIES {
                inis.push((k, policy, add(Link::Inis { inis: k, policy })));
            }
        }
        rows.push(ShapeRows {
            shape,
            latency_us: l,
            no_io,
            io_delay,
            inis,
        });
    }
    let mut hw = dsm_point(&app, "water", reference, Link::NoIo);
    hw.label = format!("water {}, all hardware", reference.label());
    points.push(hw);
    let runs = sweep.run(&points, ctx.repeat);
    let failed = sweep.finish();

    let title = format!(
        "ini-scheduling: Water {molecules} molecules × {steps} step(s) on {total} compute threads; \
         INIs over UDP, dedicated (paper 002 Tables 5.3/5.4, Figures 5-1/5-2); {} round(s), \
         median (min–max); trace columns: median over the rounds",
        ctx.repeat
    );
    let mut t = Table::new("ini-scheduling", title, columns());
    let mut pivot = Table::new(
        "ini-scheduling-policies",
        "ini-scheduling: run time by policy (paper 002 Table 5.5), s, median (min–max); \
         ratios to static per round",
        vec![
            Column::new("cluster_size", "clu size", Fmt::Plain),
            Column::new("inis", "INIs/clu", Fmt::Plain),
            Column::new("static_s", "static (s)", Fmt::Secs),
            Column::new("round_robin_s", "round-robin (s)", Fmt::Secs),
            Column::new("least_loaded_s", "least-loaded (s)", Fmt::Secs),
            Column::new("round_robin_vs_static", "round-robin / static", Fmt::Ratio),
            Column::new(
                "least_loaded_vs_static",
                "least-loaded / static",
                Fmt::Ratio,
            ),
        ],
    );
    let mut groups = Vec::new();
    let mut series: Vec<Series> = ["IO delay"]
        .into_iter()
        .chain(POLICIES)
        .map(|n| Series {
            kind: Kind::Bar,
            name: n.to_owned(),
            values: Vec::new(),
        })
        .collect();
    for sr in &rows {
        let shape = sr.shape;
        let (no_io, io_delay) = (&runs[sr.no_io], &runs[sr.io_delay]);
        let base_row = |link: Link, r: &Runs| {
            vec![
                Cell::Int(shape.threads as u64),
                Cell::text(shape.label()),
                Cell::Missing,
                Cell::text(link.label()),
                Cell::Int(link.threads(shape) as u64),
                Cell::Missing,
                Cell::Missing,
                Cell::Missing,
                Cell::Missing,
                Cell::stat(&r.values(run_s)),
                slowdown(r, no_io),
                slowdown(r, io_delay),
                ctx.note(link.threads(shape), &[r]),
            ]
        };
        t.push(base_row(Link::NoIo, no_io));
        t.push(base_row(
            Link::IoDelay {
                latency_us: sr.latency_us,
            },
            io_delay,
        ));
        for &(k, policy, i) in &sr.inis {
            let r = &runs[i];
            let link = Link::Inis { inis: k, policy };
            t.push(vec![
                Cell::Int(shape.threads as u64),
                Cell::text(shape.label()),
                Cell::Int(k as u64),
                Cell::text(policy),
                Cell::Int(link.threads(shape) as u64),
                Cell::stat(&r.values(traced(|t| t.mean_message_bytes))),
                Cell::stat(&r.values(traced(|t| t.mean_message_time_us))),
                Cell::stat(&r.values(traced(|t| t.mean_queue_len))),
                Cell::stat(&r.values(traced(|t| t.mean_utilization))),
                Cell::stat(&r.values(run_s)),
                slowdown(r, no_io),
                slowdown(r, io_delay),
                ctx.note(link.threads(shape), &[r]),
            ]);
        }
        for k in 1..=shape.threads {
            let of = |p: &str| {
                let i = sr
                    .inis
                    .iter()
                    .find(|x| x.0 == k && x.1 == p)
                    .map(|x| x.2)
                    .expect("every policy runs");
                &runs[i]
            };
            let (st, rr, ll) = (of("static"), of("round-robin"), of("least-loaded"));
            pivot.push(vec![
                Cell::Int(shape.threads as u64),
                Cell::Int(k as u64),
                Cell::stat(&st.values(run_s)),
                Cell::stat(&rr.values(run_s)),
                Cell::stat(&ll.values(run_s)),
                slowdown(rr, st),
                slowdown(ll, st),
            ]);
            groups.push(format!(
                "{}\n{k} INI{}",
                shape.label(),
                if k == 1 { "" } else { "s" }
            ));
            let stat = |r: &Runs| match slowdown(r, no_io) {
                Cell::Stat(s) => Some(s),
                _ => None,
            };
            series[0].values.push(stat(io_delay));
            for (s, r) in series[1..].iter_mut().zip([st, rr, ll]) {
                s.values.push(stat(r));
            }
        }
    }
    let hw = runs.last().expect("the reference runs");
    t.push(vec![
        Cell::Int(reference.threads as u64),
        Cell::text(reference.label()),
        Cell::Missing,
        Cell::text("all hardware (1 cluster: no inter-cluster traffic)"),
        Cell::Int(reference.total() as u64),
        Cell::Missing,
        Cell::Missing,
        Cell::Missing,
        Cell::Missing,
        Cell::stat(&hw.values(run_s)),
        Cell::Missing,
        Cell::Missing,
        ctx.note(reference.total(), &[hw]),
    ]);
    t.notes.push(ctx.machine_note());
    for (s, l) in dsm_shapes.iter().zip(&latency) {
        t.notes.push(format!(
            "IO delay of {}: L = {l} µs = the INIs' mean message time without the hand-off queue, \
             from a calibration run (1 INI, static, traced)",
            s.label()
        ));
    }
    t.notes.push(
        "msg time: send INI (enqueued → on the wire) + receive INI (last datagram read → \
         delivered); queue len: messages in the INI seen by an arriving one; INI util: \
         share of the INI's span spent processing"
            .to_owned(),
    );
    pivot.notes.push(ctx.machine_note());
    let all_points: Vec<(Point, Runs)> = calibration
        .into_iter()
        .zip(calibrated)
        .chain(points.into_iter().zip(runs))
        .collect();
    Ok(Outcome {
        tables: vec![t, pivot],
        figure: Figure {
            title: format!(
                "Water {molecules}×{steps} on {total} threads: slowdown vs No IO node (paper 002 Fig. 5-1/5-2)"
            ),
            y_label: "run time / No IO node run time (per round)".into(),
            groups,
            series,
        },
        params: json!({
            "app": "water", "molecules": molecules, "steps": steps, "threads": total,
            "io_delay_latency_us": dsm_shapes.iter().zip(&latency)
                .map(|(s, l)| json!({"shape": s.label(), "latency_us": l})).collect::<Vec<_>>(),
        }),
        points: all_points,
        failed,
    })
}
