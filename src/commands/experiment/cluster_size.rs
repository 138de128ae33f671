//! `multigrain experiment cluster-size`: paper 002 §5.5 and Tables 5.8/5.9 (the MGS
//! experiment) with paper 000 Table 4's split of EM3D's communication — at a fixed total
//! of compute threads, from all software DSM (cluster size 1) to all hardware (one
//! cluster): run time, slowdown and DSM statistics of Water and EM3D.

use super::ini_scheduling::{run_s, slowdown};
use super::plot::{Figure, Kind, Series};
use super::sweep::{Point, Runs, Sweep};
use super::table::{Cell, Column, Fmt, Table};
use super::{CommonArgs, Context, Link, Outcome, POLICIES, Shape, dsm_point, water_app};
use crate::commands::run::report::{Outcome as RunOutcome, Report};
use anyhow::{Result, bail};
use multigrain_dsm::ClusterStats;
use serde_json::json;

/// Flags of `multigrain experiment cluster-size` (see its `--help`).
#[derive(clap::Args, Debug)]
pub struct ClusterSizeArgs {
    #[command(flatten)]
    pub(super) common: CommonArgs,
    /// Compute threads of every job, split into every shape clusters × threads
    /// [default: 4 (4×1, 2×2, 1×4)].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(2..=64))]
    pub threads: Option<u64>,
    /// INI scheduling policy of the runs over INIs.
    #[arg(long, default_value = "static", value_parser = POLICIES)]
    pub policy: String,
    #[command(flatten)]
    pub water: super::WaterSize,
    /// EM3D's E nodes (and as many H nodes) per thread [default: 2500; with --quick 500].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub nodes_per_thread: Option<u64>,
    /// EM3D's iterations [default: 100; with --quick 10].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: Option<u64>,
}

/// One application of the table: its name, layout and `multigrain run` arguments.
struct App {
    id: &'static str,
    name: &'static str,
    layout: &'static str,
    args: Vec<String>,
}

/// One row's runs: the shape, how its clusters talk, and the point index.
struct RowKey {
    app: usize,
    shape: Shape,
    link: Link,
    point: usize,
}

/// `f` of the job's DSM totals.
fn total(f: fn(&ClusterStats) -> u64) -> impl Fn(&Report) -> Option<f64> {
    move |r| r.stats.as_ref().map(|s| f(&s.total) as f64)
}

/// EM3D's edges to another thread of the same cluster (local) and to another cluster
/// (remote).
fn edges(r: &Report) -> Option<(u64, u64)> {
    match &r.outcome {
        RunOutcome::Em3d { result, .. } => result.edge_stats.map(|e| {
            (
                e.remote_edges - e.cross_cluster_edges,
                e.cross_cluster_edges,
            )
        }),
        _ => None,
    }
}

/// round(√size): the thesis's INIs per cluster for a cluster of `size` threads.
pub fn sqrt_inis(size: usize) -> usize {
    ((size as f64).sqrt().round() as usize).max(1)
}

/// Runs the experiment.
///
/// # Errors
/// Bad flags.
pub fn run(ctx: &Context, a: &ClusterSizeArgs) -> Result<Outcome> {
    let q = ctx.quick;
    let (molecules, steps) = a.water.resolve(q)?;
    let nodes = a.nodes_per_thread.unwrap_or(if q { 500 } else { 2500 });
    let iterations = a.iterations.unwrap_or(if q { 10 } else { 100 });
    let total_threads = a.threads.map_or(4, |t| t as usize);
    let policy: &'static str = POLICIES
        .into_iter()
        .find(|p| *p == a.policy)
        .unwrap_or("static");
    let shapes = Shape::all(total_threads);
    if shapes.len() < 2 {
        bail!("--threads {total_threads}: needs at least two shapes");
    }
    let em3d = |layout| super::em3d_app(nodes, iterations, Some(layout), "read");
    let apps = [
        App {
            id: "water",
            name: "Water",
            layout: "—",
            args: water_app(molecules, steps),
        },
        App {
            id: "em3d-naive",
            name: "EM3D",
            layout: "naive",
            args: em3d("naive"),
        },
        App {
            id: "em3d-good",
            name: "EM3D",
            layout: "good",
            args: em3d("good"),
        },
    ];
    let mut points: Vec<Point> = Vec::new();
    let mut keys = Vec::new();
    for (ai, app) in apps.iter().enumerate() {
        for &shape in &shapes {
            let mut links = Vec::new();
            if shape.clusters == 1 {
                links.push(Link::NoIo);
            } else {
                links.push(Link::Inis { inis: 1, policy });
                let k = sqrt_inis(shape.threads);
                if k != 1 {
                    links.push(Link::Inis { inis: k, policy });
                }
                links.push(Link::NoIo);
            }
            for link in links {
                let mut p = dsm_point(&app.args, app.id, shape, link);
                if shape.clusters == 1 {
                    p.label = format!("{} {}, all hardware", app.id, shape.label());
                }
                keys.push(RowKey {
                    app: ai,
                    shape,
                    link,
                    point: points.len(),
                });
                points.push(p);
            }
        }
    }
    let mut sweep = Sweep::new(ctx, (ctx.repeat * points.len()) as u64)?;
    let runs = sweep.run(&points, ctx.repeat);
    let failed = sweep.finish();

    let mut t = Table::new(
        "cluster-size",
        format!(
            "cluster-size: {total_threads} compute threads from {} to {} (paper 002 Tables 5.8/5.9, \
             paper 000 Table 4); Water {molecules} × {steps}, EM3D {nodes} nodes/thread × \
             {iterations} iterations (read variant); INIs over UDP, dedicated, {policy}; \
             {} round(s), median (min–max)",
            shapes[0].label(),
            shapes[shapes.len() - 1].label(),
            ctx.repeat
        ),
        vec![
            Column::new("app", "app", Fmt::Plain),
            Column::new("layout", "layout", Fmt::Plain),
            Column::new("cluster_size", "clu size", Fmt::Plain),
            Column::new("shape", "shape", Fmt::Plain),
            Column::new("configuration", "configuration", Fmt::Plain),
            Column::new("inis", "INIs/clu", Fmt::Plain),
            Column::new("threads", "threads", Fmt::Plain),
            Column::new("run_s", "run time (s)", Fmt::Secs),
            Column::new("slowdown_vs_no_io", "vs No IO node", Fmt::Ratio),
            Column::new("slowdown_vs_one_cluster", "vs 1 cluster", Fmt::Ratio),
            Column::median("lock_acquires", "lock acq.", Fmt::Count),
            Column::median("remote_fetches", "remote fetches", Fmt::Count),
            Column::median("diffs_sent", "diffs", Fmt::Count),
            Column::median("dsm_messages", "DSM msgs", Fmt::Count),
            Column::new("edges_local", "edges local", Fmt::Plain),
            Column::new("edges_remote", "edges remote", Fmt::Plain),
            Column::new("note", "note", Fmt::Plain),
        ],
    );
    let find = |ai: usize, shape: Shape, link: Link| -> Option<&Runs> {
        keys.iter()
            .find(|k| k.app == ai && k.shape == shape && k.link == link)
            .map(|k| &runs[k.point])
    };
    let hw_shape = shapes[shapes.len() - 1];
    let mut series: Vec<Series> = apps
        .iter()
        .map(|app| Series {
            kind: Kind::Bar,
            name: if app.layout == "—" {
                app.name.to_owned()
            } else {
                format!("{} {}", app.name, app.layout)
            },
            values: Vec::new(),
        })
        .collect();
    for k in &keys {
        let app = &apps[k.app];
        let r = &runs[k.point];
        let no_io = find(k.app, k.shape, Link::NoIo);
        let hw = find(k.app, hw_shape, Link::NoIo);
        let threads = k.link.threads(k.shape);
        let config = if k.shape.clusters == 1 {
            "all hardware (1 cluster)".to_owned()
        } else {
            match k.link {
                Link::Inis { inis, .. } if inis == sqrt_inis(k.shape.threads) && inis > 1 => {
                    format!("INIs, √{} = {inis} per cluster", k.shape.threads)
                }
                Link::Inis { .. } => "INIs, 1 per cluster".to_owned(),
                _ => k.link.label(),
            }
        };
        let edge = edges_cells(r);
        t.push(vec![
            Cell::text(app.name),
            Cell::text(app.layout),
            Cell::Int(k.shape.threads as u64),
            Cell::text(k.shape.label()),
            Cell::text(config),
            k.link.inis().map_or(Cell::Missing, |n| Cell::Int(n as u64)),
            Cell::Int(threads as u64),
            Cell::stat(&r.values(run_s)),
            match (k.shape.clusters, no_io) {
                (1, _) | (_, None) => Cell::Missing,
                (_, Some(b)) => slowdown(r, b),
            },
            hw.map_or(Cell::Missing, |b| slowdown(r, b)),
            Cell::stat(&r.values(total(|c| c.lock_acquires))),
            Cell::stat(&r.values(total(|c| c.remote_fetches))),
            Cell::stat(&r.values(total(|c| c.diffs_sent))),
            Cell::stat(&r.values(total(|c| c.messages_sent.values().sum()))),
            edge.0,
            edge.1,
            ctx.note(threads, &[r]),
        ]);
        let first_link = k.shape.clusters == 1 || k.link == (Link::Inis { inis: 1, policy });
        if first_link && let Some(b) = hw {
            series[k.app].values.push(match slowdown(r, b) {
                Cell::Stat(s) => Some(s),
                _ => None,
            });
        }
    }
    t.notes.push(ctx.machine_note());
    t.notes.push(
        "vs 1 cluster: run time over the all-hardware run's, per round; DSM msgs: protocol \
         messages between clusters (all kinds); edges local: EM3D edges to another thread of \
         the same cluster (hardware shared memory), remote: to another cluster (through the \
         DSM); lock acq. counts every lock call (also those served inside the cluster)"
            .to_owned(),
    );
    let points: Vec<(Point, Runs)> = points.into_iter().zip(runs).collect();
    Ok(Outcome {
        tables: vec![t],
        figure: Figure {
            title: format!(
                "{total_threads} threads by cluster size: run time / 1-cluster run time (INIs: 1 per cluster, {policy})"
            ),
            y_label: "run time / all-hardware run time (per round)".into(),
            groups: shapes
                .iter()
                .map(|s| format!("{}\ncluster size {}", s.label(), s.threads))
                .collect(),
            series,
        },
        params: json!({
            "threads": total_threads, "policy": policy,
            "water": {"molecules": molecules, "steps": steps},
            "em3d": {"nodes_per_thread": nodes, "iterations": iterations, "variant": "read",
                     "layouts": ["naive", "good"]},
        }),
        points,
        failed,
    })
}

/// EM3D's local and remote edges of a point's first successful run (the graph is the
/// same in every round), or missing cells for Water.
fn edges_cells(r: &Runs) -> (Cell, Cell) {
    match r.rounds.iter().flatten().find_map(edges) {
        Some((local, remote)) => (Cell::Int(local), Cell::Int(remote)),
        None => (Cell::Missing, Cell::Missing),
    }
}
