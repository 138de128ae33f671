//! `multigrain experiment loggp-sensitivity`: paper 001 §5 (Figures 5–8, Table 5) and
//! §4 (Table 4, Figure 4) — the slowdown of Water and EM3D (read and write variants) as
//! each LogGP parameter (o, g, L, G) grows alone, on two topologies; beside the o sweep,
//! the paper's overhead model r_pred = r_orig + 2·m·Δo; and a communication summary and
//! per-destination balance of every application's unmodified run.
//!
//! Every run goes between clusters through one dedicated INI per cluster over UDP
//! (`ini.substrate = "udp"`), so that every `[emulation]` key applies (g and G stall the
//! sending INI and are refused on shared memory).

use super::ini_scheduling::{run_s, slowdown};
use super::loggp_param::Param;
use super::plot::{Figure, Kind, Series};
use super::sweep::{Point, Runs, Sweep};
use super::table::{Cell, Column, Fmt, Table};
use super::{CommonArgs, Context, Link, Outcome, Shape, water_app};
use crate::commands::run::report::Report;
use anyhow::Result;
use multigrain_dsm::ClusterStats;
use serde_json::json;

/// Flags of `multigrain experiment loggp-sensitivity` (see its `--help`).
#[derive(clap::Args, Debug)]
pub struct LoggpSensitivityArgs {
    #[command(flatten)]
    pub(super) common: CommonArgs,
    /// Water's molecules, a perfect cube [default: 343, the thesis's problem; with --quick 64].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub molecules: Option<u64>,
    /// Water's time steps [default: 3; with --quick 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: Option<u64>,
    /// EM3D's E nodes (and as many H nodes) per thread [default: 2500; with --quick 500].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub nodes_per_thread: Option<u64>,
    /// EM3D's iterations [default: 50; with --quick 5].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: Option<u64>,
}

/// The values each parameter is raised to (the baseline, all zero, is shared).
fn values(p: Param, quick: bool) -> &'static [u64] {
    match (p, quick) {
        (Param::O, false) => &[5, 10, 20],
        (Param::Gap, false) => &[5, 10, 20],
        (Param::L, false) => &[10, 25, 50],
        (Param::PerByte, false) => &[10, 50],
        (Param::O, true) => &[10],
        (Param::Gap, true) => &[10],
        (Param::L, true) => &[25],
        (Param::PerByte, true) => &[50],
    }
}

/// A point's place: (app index, shape, the parameter and its added value or `None` for
/// the all-zero baseline, index into the sweep's points).
type Key = (usize, Shape, Option<(Param, u64)>, usize);

/// One application of the experiment.
struct App {
    id: &'static str,
    name: &'static str,
    args: Vec<String>,
}

/// The `--set` values every point shares: one dedicated INI per cluster over UDP, one
/// message per datagram (paper 001's network carries each message in its own packet,
/// and its *g* and *G* space messages, under which the INIs do not pack them anyway; so
/// the baseline and every point use the same path).
fn link_sets() -> Vec<String> {
    Link::Inis {
        inis: 1,
        policy: "static",
    }
    .sets()
}

/// Messages a cluster handed to its INIs (sent to the other cluster over the network).
fn net(c: &ClusterStats) -> f64 {
    c.layer.substrate_network as f64
}

/// m of paper 001 §5.1 and Table 4: the most network messages one compute thread sent
/// (handed to an INI itself, whoever's request it served), over every compute thread of
/// every cluster. `None` for reports without per-thread counts.
fn max_per_thread(r: &Report) -> Option<f64> {
    let s = r.stats.as_ref()?;
    s.clusters
        .iter()
        .flat_map(|c| c.messages_sent_by_thread.iter())
        .max()
        .map(|&n| n as f64)
}

/// Network messages sent by the compute threads themselves, averaged over the job's
/// compute threads (`None` for reports without per-thread counts).
fn mean_per_thread(r: &Report, shape: Shape) -> Option<f64> {
    let by_thread = &r.stats.as_ref()?.total.messages_sent_by_thread;
    (!by_thread.is_empty()).then(|| by_thread.iter().sum::<u64>() as f64 / shape.total() as f64)
}

/// The share of the job's network messages that `f` of each cluster sent (the protocol
/// threads, or the threads that are neither compute nor protocol threads).
fn share(r: &Report, f: fn(&ClusterStats) -> u64) -> Option<f64> {
    let total = &r.stats.as_ref()?.total;
    let all = net(total);
    (all > 0.0).then(|| f(total) as f64 / all)
}

/// Barriers the job passed (cluster 0's count: every cluster passes each).
fn barriers(r: &Report) -> Option<f64> {
    let s = r.stats.as_ref()?;
    s.clusters.first().map(|c| c.barriers as f64)
}

/// The DSM messages that are reads — page requests and their replies (`GetPage`,
/// `PageData`, `ScRead`) — over all DSM protocol messages sent.
fn read_share(r: &Report) -> Option<f64> {
    let m = &r.stats.as_ref()?.total.messages_sent;
    let all: u64 = m.values().sum();
    let reads: u64 = ["GetPage", "PageData", "ScRead"]
        .iter()
        .filter_map(|k| m.get(*k))
        .sum();
    (all > 0).then(|| reads as f64 / all as f64)
}

/// Runs the experiment.
///
/// # Errors
/// Bad flags.
pub fn run(ctx: &Context, a: &LoggpSensitivityArgs) -> Result<Outcome> {
    let q = ctx.quick;
    let molecules = a.molecules.unwrap_or(if q { 64 } else { 343 });
    let steps = a.steps.unwrap_or(if q { 1 } else { 3 });
    super::check_water(molecules, steps)?;
    let nodes = a.nodes_per_thread.unwrap_or(if q { 500 } else { 2500 });
    let iterations = a.iterations.unwrap_or(if q { 5 } else { 50 });
    let em3d = |variant| super::em3d_app(nodes, iterations, None, variant);
    let apps = [
        App {
            id: "water",
            name: "Water",
            args: water_app(molecules, steps),
        },
        App {
            id: "em3d-read",
            name: "EM3D(read)",
            args: em3d("read"),
        },
        App {
            id: "em3d-write",
            name: "EM3D(write)",
            args: em3d("write"),
        },
    ];
    let shapes = [
        Shape {
            clusters: 2,
            threads: 1,
        },
        Shape {
            clusters: 2,
            threads: 2,
        },
    ];
    // Points: per app and shape, the baseline (all zero), then each parameter's values.
    let mut points: Vec<Point> = Vec::new();
    let mut keys: Vec<Key> = Vec::new();
    for (ai, app) in apps.iter().enumerate() {
        for &shape in &shapes {
            let mut variants: Vec<Option<(Param, u64)>> = vec![None];
            for p in Param::ALL {
                variants.extend(values(p, q).iter().map(|&v| Some((p, v))));
            }
            for v in variants {
                let (id, label, extra) = match v {
                    None => ("base".to_owned(), "baseline".to_owned(), vec![]),
                    Some((p, x)) => (
                        format!("{}{x}", p.name().to_lowercase()),
                        format!("{} = {x} {}", p.name(), p.unit()),
                        p.sets(x),
                    ),
                };
                keys.push((ai, shape, v, points.len()));
                points.push(Point {
                    id: format!("{}-{}-{id}", app.id, shape.id()),
                    label: format!("{} {}, {label}", app.id, shape.label()),
                    app: app.args.clone(),
                    sets: [shape.sets(), link_sets(), extra].concat(),
                    trace: false,
                });
            }
        }
    }
    let mut sweep = Sweep::new(ctx, (ctx.repeat * points.len()) as u64)?;
    let runs = sweep.run(&points, ctx.repeat);
    let failed = sweep.finish();
    let base_of = |ai: usize, shape: Shape| -> &Runs {
        let k = keys
            .iter()
            .find(|k| k.0 == ai && k.1 == shape && k.2.is_none())
            .expect("every app and shape has a baseline");
        &runs[k.3]
    };

    // Table 1: slowdown per parameter value, with the overhead model beside the o rows.
    let mut t = Table::new(
        "loggp-sensitivity",
        format!(
            "loggp-sensitivity: slowdown as one LogGP parameter grows (paper 001 §5, Figures \
             5–8, Table 5); Water {molecules} × {steps}, EM3D {nodes} nodes/thread × \
             {iterations} iterations; 1 dedicated INI per cluster over UDP; {} round(s), \
             median (min–max)",
            ctx.repeat
        ),
        vec![
            Column::new("app", "app", Fmt::Plain),
            Column::new("shape", "shape", Fmt::Plain),
            Column::new("param", "param", Fmt::Plain),
            Column::new("value", "added", Fmt::Plain),
            Column::new("unit", "unit", Fmt::Plain),
            Column::new("run_s", "run time (s)", Fmt::Secs),
            Column::new("slowdown", "slowdown", Fmt::Ratio),
            Column::median("predicted_s", "o model (s)", Fmt::Secs),
            Column::median("model_error", "model err", Fmt::Pct),
            Column::new("note", "note", Fmt::Plain),
        ],
    );
    for &(ai, shape, v, pi) in &keys {
        let r = &runs[pi];
        let base = base_of(ai, shape);
        let threads = shape.total() + shape.clusters;
        let (param, value, unit) = match v {
            None => ("—".to_owned(), "0".to_owned(), "—".to_owned()),
            Some((p, x)) => (p.name().to_owned(), x.to_string(), p.unit().to_owned()),
        };
        // r_pred = r_orig + 2·m·Δo, per round: m and r_orig from that round's baseline.
        let (pred, err) = match v {
            Some((Param::O, d_us)) => {
                let predict = |b: &Report| {
                    let m = max_per_thread(b).unwrap_or(f64::NAN);
                    b.run_s + 2.0 * m * d_us as f64 * 1e-6
                };
                (
                    Cell::stat(&r.paired(base, |_, b| predict(b))),
                    Cell::stat(&r.paired(base, |run, b| predict(b) / run.run_s - 1.0)),
                )
            }
            _ => (Cell::Missing, Cell::Missing),
        };
        t.push(vec![
            Cell::text(apps[ai].name),
            Cell::text(shape.label()),
            Cell::text(param),
            Cell::text(value),
            Cell::text(unit),
            Cell::stat(&r.values(run_s)),
            slowdown(r, base),
            pred,
            err,
            ctx.note(threads, &[r]),
        ]);
    }
    t.notes.push(ctx.machine_note());
    t.notes.push(
        "slowdown: run time over the same app's and shape's all-zero run, per round; o: \
         emulation.send_overhead_us and recv_overhead_us both set to the value (paper 001's \
         o is paid by sender and receiver); g: gap_us, L: latency_us, G: per_byte_gap_ns; \
         o model: r_pred = r_orig + 2·m·Δo (paper 001 §5.1) with r_orig and m from the \
         same round's all-zero run; model err: r_pred / measured − 1 (negative: the model \
         under-predicts). m: the most network messages (handed to an INI) sent by one \
         compute thread, over every compute thread of both clusters, counted per thread by \
         the runtime (a message counts for the thread that sent it, also when a waiting \
         thread answers another cluster's request); the protocol thread's messages are left \
         out, as paper 001's processors had none (its share: loggp-communication)"
            .to_owned(),
    );

    // Table 2: communication summary (paper 001 Table 4) of the unmodified runs.
    let mut c = Table::new(
        "loggp-communication",
        "loggp-communication: communication of the all-zero runs (paper 001 Table 4), per \
         compute thread",
        vec![
            Column::new("app", "app", Fmt::Plain),
            Column::new("shape", "shape", Fmt::Plain),
            Column::median("run_s", "run time (s)", Fmt::Secs),
            Column::median("msgs_per_thread", "avg msgs/thread", Fmt::Num),
            Column::median("max_msgs_per_thread", "max msgs/thread (m)", Fmt::Num),
            Column::median("msgs_per_thread_ms", "msgs/thread/ms", Fmt::Num),
            Column::median("message_interval_us", "msg interval (µs)", Fmt::Num),
            Column::median("barriers", "barriers", Fmt::Num),
            Column::median("barrier_interval_ms", "barrier interval (ms)", Fmt::Num),
            Column::median("msgs_per_barrier", "msgs/thread/barrier", Fmt::Num),
            Column::median("protocol_share", "% by protocol thr", Fmt::Pct),
            Column::median("other_share", "% by other thr", Fmt::Pct),
            Column::median("read_share", "% reads", Fmt::Pct),
            Column::median("bytes_per_thread", "bytes/thread", Fmt::Count),
            Column::median("dsm_messages", "DSM msgs", Fmt::Count),
        ],
    );
    for (ai, app) in apps.iter().enumerate() {
        for &shape in &shapes {
            let b = base_of(ai, shape);
            let per_ms = |r: &Report| Some(mean_per_thread(r, shape)? / (r.run_s * 1e3));
            c.push(vec![
                Cell::text(app.name),
                Cell::text(shape.label()),
                Cell::stat(&b.values(run_s)),
                Cell::stat(&b.values(|r| mean_per_thread(r, shape))),
                Cell::stat(&b.values(max_per_thread)),
                Cell::stat(&b.values(per_ms)),
                Cell::stat(&b.values(|r| per_ms(r).map(|f| 1e3 / f))),
                Cell::stat(&b.values(barriers)),
                Cell::stat(&b.values(|r| Some(r.run_s * 1e3 / barriers(r)?))),
                Cell::stat(&b.values(|r| Some(mean_per_thread(r, shape)? / barriers(r)?))),
                Cell::stat(&b.values(|r| share(r, |t| t.messages_sent_by_protocol_thread))),
                Cell::stat(&b.values(|r| share(r, |t| t.messages_sent_by_other_threads))),
                Cell::stat(&b.values(read_share)),
                Cell::stat(&b.values(|r| {
                    Some(r.stats.as_ref()?.total.layer.bytes_sent as f64 / shape.total() as f64)
                })),
                Cell::stat(&b.values(|r| {
                    Some(r.stats.as_ref()?.total.messages_sent.values().sum::<u64>() as f64)
                })),
            ]);
        }
    }
    c.notes.push(
        "msgs: message-layer messages handed to an INI (between the two clusters; a bulk \
         message counts once); per thread: sent by the compute thread itself (counted per \
         thread by the runtime), averaged over the job's compute threads (avg) or the most \
         of one (m); % by protocol thr: share of the job's network messages sent by the \
         clusters' protocol threads (not in m or avg); % by other thr: by the thread that \
         joins, runs and finishes the job (start-up, the barrier ending the parallel \
         section, statistics); msg interval: 1 / (msgs/thread/ms); % reads: GetPage, \
         PageData and ScRead among all DSM protocol messages sent; bytes: message-layer \
         payload bytes sent by every substrate (also within a cluster), per compute thread"
            .to_owned(),
    );

    // Table 3: the balance matrix (paper 001 Figure 4) at cluster granularity.
    let mut m = Table::new(
        "loggp-balance",
        "loggp-balance: network messages from cluster (row) to cluster (column) in the \
         all-zero runs (paper 001 Figure 4, per cluster, not per thread)",
        vec![
            Column::new("app", "app", Fmt::Plain),
            Column::new("shape", "shape", Fmt::Plain),
            Column::new("from", "from", Fmt::Plain),
            Column::median("to_0", "to cluster 0", Fmt::Count),
            Column::median("to_1", "to cluster 1", Fmt::Count),
            Column::median("share", "share of job", Fmt::Pct),
        ],
    );
    for (ai, app) in apps.iter().enumerate() {
        for &shape in &shapes {
            let b = base_of(ai, shape);
            for from in 0..shape.clusters {
                let sent = |r: &Report| Some(net(r.stats.as_ref()?.clusters.get(from)?));
                // Two clusters: everything a cluster sends over the network goes to the other.
                let to = |dest: usize| {
                    if dest == from {
                        Cell::stat(&b.values(|_| Some(0.0)))
                    } else {
                        Cell::stat(&b.values(sent))
                    }
                };
                m.push(vec![
                    Cell::text(app.name),
                    Cell::text(shape.label()),
                    Cell::text(format!("cluster {from}")),
                    to(0),
                    to(1),
                    Cell::stat(&b.values(|r| {
                        let all = net(&r.stats.as_ref()?.total);
                        (all > 0.0).then(|| sent(r).unwrap_or(0.0) / all)
                    })),
                ]);
            }
        }
    }
    m.notes.push(
        "per cluster: the runtime counts network messages per sending thread (see \
         loggp-communication) but not per destination; with two clusters every network \
         message of a cluster goes to the other, so this matrix is exact at cluster \
         granularity; paper 001 Figure 4's thread-to-thread matrix is not measured"
            .to_owned(),
    );

    // The figure: slowdown per parameter value, a bar per app and shape.
    let mut groups = Vec::new();
    let mut wanted: Vec<(Param, u64)> = Vec::new();
    for p in Param::ALL {
        for &v in values(p, q) {
            groups.push(format!("{} = {v} {}", p.name(), p.unit()));
            wanted.push((p, v));
        }
    }
    let mut series = Vec::new();
    for &shape in &shapes {
        for (ai, app) in apps.iter().enumerate() {
            let base = base_of(ai, shape);
            let values = wanted
                .iter()
                .map(|&w| {
                    let k = keys
                        .iter()
                        .find(|k| k.0 == ai && k.1 == shape && k.2 == Some(w))?;
                    match slowdown(&runs[k.3], base) {
                        Cell::Stat(s) => Some(s),
                        _ => None,
                    }
                })
                .collect();
            series.push(Series {
                kind: Kind::Bar,
                name: format!("{} {}", app.name, shape.label()),
                values,
            });
        }
    }
    let points: Vec<(Point, Runs)> = points.into_iter().zip(runs).collect();
    Ok(Outcome {
        tables: vec![t, c, m],
        figure: Figure {
            title: "LogGP sensitivity: run time / all-zero run time, one parameter at a time"
                .into(),
            y_label: "slowdown (per round)".into(),
            groups,
            series,
        },
        params: json!({
            "water": {"molecules": molecules, "steps": steps},
            "em3d": {"nodes_per_thread": nodes, "iterations": iterations,
                     "variants": ["read", "write"]},
            "shapes": shapes.iter().map(|s| s.label()).collect::<Vec<_>>(),
            "values": Param::ALL.iter().map(|p| json!({
                "param": p.name(), "unit": p.unit(), "values": values(*p, q)
            })).collect::<Vec<_>>(),
        }),
        points,
        failed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_parameter_sets_its_keys_and_the_job_accepts_them_over_udp() {
        use multigrain_cluster_config::{EMBEDDED_DEFAULT_TOML, JobConfig};
        for p in Param::ALL {
            for &v in values(p, false) {
                let sets: Vec<_> = [link_sets(), p.sets(v)]
                    .concat()
                    .iter()
                    .map(|s| s.parse().unwrap())
                    .collect();
                JobConfig::from_str_with_overrides(EMBEDDED_DEFAULT_TOML, "t", &sets)
                    .unwrap_or_else(|e| panic!("{} = {v}: {e:#}", p.name()));
            }
        }
        assert_eq!(Param::O.sets(5).len(), 2, "o is both o_s and o_r");
    }
}
