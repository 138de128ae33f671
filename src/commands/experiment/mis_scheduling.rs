//! `multigrain experiment mis-scheduling`: paper 002 Tables 5.6–5.7 — how often, and
//! for how much queue time, a message waits in one INI while another INI of its cluster
//! is idle, per policy and INI count, from the traces.

use super::ini_scheduling::{run_s, traced};
use super::plot::{Figure, Kind, Series};
use super::sweep::{Point, Runs, Sweep};
use super::table::{Cell, Column, Fmt, Table};
use super::{CommonArgs, Context, Link, Outcome, POLICIES, Shape, dsm_point, water_app};
use anyhow::{Result, bail};
use serde_json::json;

/// Flags of `multigrain experiment mis-scheduling` (see its `--help`).
#[derive(clap::Args, Debug)]
pub struct MisSchedulingArgs {
    #[command(flatten)]
    pub(super) common: CommonArgs,
    #[command(flatten)]
    pub water: super::WaterSize,
    /// Compute threads of every job; the shapes are those with at least 2 clusters of
    /// at least 2 threads [default: 8 (4×2, 2×4), with --quick 4 (2×2)].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(4..=64))]
    pub threads: Option<u64>,
}

/// Runs the experiment.
///
/// # Errors
/// Bad flags (no shape with several clusters of several threads).
pub fn run(ctx: &Context, a: &MisSchedulingArgs) -> Result<Outcome> {
    let (molecules, steps) = a.water.resolve(ctx.quick)?;
    let total = a
        .threads
        .map_or(if ctx.quick { 4 } else { 8 }, |t| t as usize);
    let shapes: Vec<Shape> = Shape::all(total)
        .into_iter()
        .filter(|s| s.clusters > 1 && s.threads > 1)
        .collect();
    if shapes.is_empty() {
        bail!("--threads {total}: no shape of several clusters with several threads each");
    }
    let app = water_app(molecules, steps);
    // (shape, INIs, policy) per point.
    let mut keys = Vec::new();
    let mut points: Vec<Point> = Vec::new();
    for &shape in &shapes {
        for k in 2..=shape.threads {
            for policy in POLICIES {
                keys.push((shape, k, policy));
                points.push(dsm_point(
                    &app,
                    "water",
                    shape,
                    Link::Inis { inis: k, policy },
                ));
            }
        }
    }
    let mut sweep = Sweep::new(ctx, (ctx.repeat * points.len()) as u64)?;
    let runs = sweep.run(&points, ctx.repeat);
    let failed = sweep.finish();

    let mut t = Table::new(
        "mis-scheduling",
        format!(
            "mis-scheduling: Water {molecules} molecules × {steps} step(s) on {total} compute threads, \
             INIs over UDP, dedicated (paper 002 Tables 5.6/5.7); {} round(s), median (min–max)",
            ctx.repeat
        ),
        vec![
            Column::new("cluster_size", "clu size", Fmt::Plain),
            Column::new("shape", "shape", Fmt::Plain),
            Column::new("inis", "INIs/clu", Fmt::Plain),
            Column::new("policy", "policy", Fmt::Plain),
            Column::new("threads", "threads", Fmt::Plain),
            Column::new("messages", "messages", Fmt::Count),
            Column::new("misscheduled_time_rate", "mis-sched. time rate", Fmt::Pct),
            Column::new("misscheduled_count_rate", "mis-sched. count rate", Fmt::Pct),
            Column::median("queue_len", "queue len", Fmt::Num),
            Column::new("run_s", "run time (s)", Fmt::Secs),
            Column::new("note", "note", Fmt::Plain),
        ],
    );
    let mut groups = Vec::new();
    let mut series: Vec<Series> = POLICIES
        .iter()
        .map(|p| Series {
            kind: Kind::Bar,
            name: format!("{p}: count rate"),
            values: Vec::new(),
        })
        .collect();
    for ((shape, k, policy), r) in keys.iter().zip(&runs) {
        let link = Link::Inis { inis: *k, policy };
        t.push(vec![
            Cell::Int(shape.threads as u64),
            Cell::text(shape.label()),
            Cell::Int(*k as u64),
            Cell::text(*policy),
            Cell::Int(link.threads(*shape) as u64),
            Cell::stat(&r.values(traced(|t| t.messages as f64))),
            Cell::stat(&r.values(traced(|t| t.misscheduled_time_rate))),
            Cell::stat(&r.values(traced(|t| t.misscheduled_count_rate))),
            Cell::stat(&r.values(traced(|t| t.mean_queue_len))),
            Cell::stat(&r.values(run_s)),
            ctx.note(link.threads(*shape), &[r]),
        ]);
        let group = format!("{}\n{k} INIs", shape.label());
        if groups.last() != Some(&group) {
            groups.push(group);
        }
        let i = POLICIES.iter().position(|p| p == policy).unwrap_or(0);
        series[i].values.push(
            match Cell::stat(&r.values(traced(|t| t.misscheduled_count_rate))) {
                Cell::Stat(s) => Some(s),
                _ => None,
            },
        );
    }
    t.notes.push(ctx.machine_note());
    t.notes.push(
        "mis-scheduled: a message handed to an occupied INI while another INI of its cluster \
         was idle, and that then waited; time rate = its queue waits / the time the cluster's \
         INIs were busy (can exceed 100 % when queues wait longer than INIs work, e.g. on an \
         oversubscribed machine); count rate = mis-scheduled / messages sent"
            .to_owned(),
    );
    let points: Vec<(Point, Runs)> = points.into_iter().zip(runs).collect();
    Ok(Outcome {
        tables: vec![t],
        figure: Figure {
            title: format!(
                "Water {molecules}×{steps} on {total} threads: mis-scheduled count rate (paper 002 Tables 5.6/5.7)"
            ),
            y_label: "mis-scheduled messages / messages sent".into(),
            groups,
            series,
        },
        params: json!({
            "app": "water", "molecules": molecules, "steps": steps, "threads": total,
            "shapes": shapes.iter().map(|s| s.label()).collect::<Vec<_>>(),
        }),
        points,
        failed,
    })
}
