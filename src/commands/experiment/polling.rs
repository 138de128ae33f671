//! `multigrain experiment polling`: paper 000 §3.4 and Table 2 — the LogP parameters
//! (L, o_s, o_r, g) and round trip of the shared-memory path and of the network path,
//! each alone and together, under fixed-fraction network polling (every poll, one in 8,
//! one in 32) and under the adaptive policy (`ini.poll_interval_min` …
//! `ini.poll_interval_max`).
//!
//! Like `mva`, the runs are microbenchmarks in this process
//! ([`multigrain_bench::loggp`]): Express messages between two endpoints pinned to
//! different CPUs. The shared-memory path is two endpoints of one site: alone, the site
//! has no network (the paper's single-protocol column); beside the network, the site has
//! INIs over UDP on loopback, so every receive loop also polls the network one time in N
//! (the multi-protocol column), with the network idle or carrying a background stream
//! into the same site (about 10,000 Express messages a second from the other site). The
//! network path is an endpoint of each site through the INIs. The paper's claim to
//! check: adaptive polling keeps the shared-memory round trip within 30 % of its alone
//! value while the network is in use.

use super::plot::{Figure, Kind, Series};
use super::table::{Cell, Column, Fmt, Table};
use super::{CommonArgs, Context, Outcome};
use crate::measure::Summary;
use anyhow::{Context as _, Result};
use multigrain_bench::loggp::{self, LogP, Options};
use multigrain_cluster_config::{EMBEDDED_DEFAULT_TOML, JobConfig};
use multigrain_messaging::net::NetConfig;
use multigrain_messaging::poll::PollBounds;
use serde_json::json;
use std::time::Instant;

/// The paper's bound on the shared-memory round trip beside a busy network under
/// adaptive polling, relative to the round trip alone (paper 000 §4.2: "an increase of
/// roughly 30 % in round trip time").
pub const CLAIM_RTT_RATIO: f64 = 1.3;

/// Flags of `multigrain experiment polling` (see its `--help`).
#[derive(clap::Args, Debug)]
pub struct PollingArgs {
    #[command(flatten)]
    pub(super) common: CommonArgs,
}

/// A network-polling policy of one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Row text.
    pub label: &'static str,
    /// Its bounds.
    pub bounds: PollBounds,
}

/// The fixed fractions of paper 000 §3.4, then the adaptive policy with `adaptive`'s
/// bounds.
pub fn policies(adaptive: PollBounds) -> [Policy; 4] {
    [
        Policy {
            label: "every poll",
            bounds: PollBounds::new(1, 1),
        },
        Policy {
            label: "1 in 8",
            bounds: PollBounds::new(8, 8),
        },
        Policy {
            label: "1 in 32",
            bounds: PollBounds::new(32, 32),
        },
        Policy {
            label: "adaptive",
            bounds: adaptive,
        },
    ]
}

/// What a row measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// Shared memory, no network on the site.
    ShmAlone,
    /// Shared memory on a site with INIs; the network idle.
    ShmNetworkIdle,
    /// Shared memory on a site with INIs; the network carrying a background stream.
    ShmNetworkBusy,
    /// The network path (INIs over UDP on loopback).
    Network,
}

impl Setting {
    fn path(self) -> &'static str {
        match self {
            Setting::Network => "network (INIs, UDP)",
            _ => "shared memory",
        }
    }

    fn condition(self) -> &'static str {
        match self {
            Setting::ShmAlone => "alone (no network)",
            Setting::ShmNetworkIdle => "with the network, idle",
            Setting::ShmNetworkBusy => "with the network in use",
            Setting::Network => "with shared memory (polled first)",
        }
    }
}

/// One row's samples, one per round.
struct Row {
    setting: Setting,
    policy: Option<Policy>,
    samples: Vec<LogP>,
}

/// Runs one measurement.
fn measure(setting: Setting, base: &NetConfig, policy: Option<Policy>, opts: Options) -> LogP {
    let mut cfg = base.clone();
    if let Some(p) = policy {
        cfg.poll = p.bounds;
    }
    match setting {
        Setting::ShmAlone => loggp::shm_alone(opts),
        Setting::ShmNetworkIdle => loggp::shm_beside_network(&cfg, false, opts),
        Setting::ShmNetworkBusy => loggp::shm_beside_network(&cfg, true, opts),
        Setting::Network => loggp::network(&cfg, opts),
    }
}

fn stat(rows: &[LogP], f: fn(&LogP) -> f64) -> Cell {
    Cell::stat(&rows.iter().map(f).collect::<Vec<_>>())
}

/// Per round: this row's round trip over the same round's shared-memory-alone one.
fn rtt_ratios(row: &Row, alone: &Row) -> Vec<f64> {
    row.samples
        .iter()
        .zip(&alone.samples)
        .map(|(x, a)| x.rtt_us / a.rtt_us)
        .collect()
}

fn table(ctx: &Context, rows: &[Row], opts: Options, adaptive: PollBounds) -> Table {
    let mut t = Table::new(
        "polling",
        format!(
            "polling: LogP parameters (µs) of Express messages by path and network-polling \
             policy (paper 000 Table 2); adaptive = 1 in {}–{} (ini.poll_interval_min/max); \
             {} round(s), median (min–max)",
            adaptive.min, adaptive.max, ctx.repeat
        ),
        vec![
            Column::new("path", "path", Fmt::Plain),
            Column::new("condition", "condition", Fmt::Plain),
            Column::new("policy", "network polled", Fmt::Plain),
            Column::new("rtt_us", "RTT", Fmt::Num),
            Column::new("o_s_us", "o_s", Fmt::Num),
            Column::new("o_r_us", "o_r", Fmt::Num),
            Column::new("g_us", "g", Fmt::Num),
            Column::new("l_us", "L", Fmt::Num),
            Column::new("rtt_vs_alone", "RTT / shm alone", Fmt::Ratio),
        ],
    );
    let alone = rows
        .iter()
        .find(|r| r.setting == Setting::ShmAlone)
        .expect("the shared-memory-alone row is always measured");
    for r in rows {
        let ratio = if r.setting == Setting::Network {
            Cell::Missing
        } else {
            Cell::stat(&rtt_ratios(r, alone))
        };
        t.push(vec![
            Cell::text(r.setting.path()),
            Cell::text(r.setting.condition()),
            Cell::text(r.policy.map_or("—", |p| p.label)),
            stat(&r.samples, |l| l.rtt_us),
            stat(&r.samples, |l| l.o_s_us),
            stat(&r.samples, |l| l.o_r_us),
            stat(&r.samples, |l| l.g_us),
            stat(&r.samples, |l| l.l_us),
            ratio,
        ]);
    }
    let busy_adaptive = rows.iter().find(|r| {
        r.setting == Setting::ShmNetworkBusy && r.policy.is_some_and(|p| p.label == "adaptive")
    });
    if let Some(b) = busy_adaptive {
        let s = Summary::of(&rtt_ratios(b, alone));
        t.notes.push(format!(
            "paper 000's claim: adaptive polling keeps the shared-memory round trip within \
             30 % of its alone value while the network is in use — here {:.2}× (per-round \
             ratios {:.2}–{:.2}): {}",
            s.median,
            s.min,
            s.max,
            if s.median <= CLAIM_RTT_RATIO {
                "holds"
            } else {
                "does NOT hold"
            }
        ));
    }
    t.notes.push(format!(
        "RTT: Express ping-pong ({} round trips); o_s: sender's time per send in bursts of {} \
         sends {} µs apart ({} bursts); o_r: receiver's time per receive of a burst already queued ({} µs after \
         it was sent); g: receiver's time per message of a {}-message stream; L = RTT/2 − o_s \
         − o_r (negative: the overheads overlap). Ends pinned to different CPUs. \"in use\": \
         the other site streams Express into a third queue of the measured site, one per \
         ~{} µs",
        opts.round_trips,
        loggp::BURST,
        loggp::SEND_SPACING.as_micros(),
        opts.bursts,
        loggp::SETTLE.as_micros(),
        opts.stream,
        loggp::BACKGROUND_PERIOD.as_micros()
    ));
    t.notes.push(ctx.machine_note());
    t
}

fn figure(rows: &[Row], policies: &[Policy]) -> Figure {
    let alone = rows
        .iter()
        .find(|r| r.setting == Setting::ShmAlone)
        .expect("the shared-memory-alone row is always measured");
    let series = |setting: Setting, name: &str| Series {
        name: name.to_owned(),
        kind: Kind::Bar,
        values: policies
            .iter()
            .map(|p| {
                rows.iter()
                    .find(|r| r.setting == setting && r.policy == Some(*p))
                    .map(|r| Summary::of(&rtt_ratios(r, alone)))
            })
            .collect(),
    };
    let claim = Series {
        name: format!("paper 000's bound ({CLAIM_RTT_RATIO}×)"),
        kind: Kind::Line,
        values: vec![Some(Summary::of(&[CLAIM_RTT_RATIO])); policies.len()],
    };
    Figure {
        title: "Shared-memory round trip beside the network, relative to alone, by network polling (paper 000 §3.4)".into(),
        y_label: "RTT / RTT alone".into(),
        groups: policies.iter().map(|p| p.label.to_owned()).collect(),
        series: vec![
            series(Setting::ShmNetworkIdle, "network idle"),
            series(Setting::ShmNetworkBusy, "network in use"),
            claim,
        ],
    }
}

/// Runs the experiment.
///
/// # Errors
/// A `--set` that makes no valid job.
pub fn run(ctx: &Context, _a: &PollingArgs) -> Result<Outcome> {
    let job = JobConfig::from_str_with_overrides(
        EMBEDDED_DEFAULT_TOML,
        "embedded default job",
        &ctx.sets,
    )
    .context("--set")?;
    let base = NetConfig::from_job(&job);
    let adaptive = base.poll;
    let opts = if ctx.quick {
        Options::QUICK
    } else {
        Options::FULL
    };
    let policies = policies(adaptive);
    let mut plan: Vec<(Setting, Option<Policy>)> = vec![(Setting::ShmAlone, None)];
    for setting in [
        Setting::ShmNetworkIdle,
        Setting::ShmNetworkBusy,
        Setting::Network,
    ] {
        plan.extend(policies.iter().map(|p| (setting, Some(*p))));
    }
    let mut rows: Vec<Row> = plan
        .iter()
        .map(|&(setting, policy)| Row {
            setting,
            policy,
            samples: Vec::new(),
        })
        .collect();
    let total = (ctx.repeat * plan.len()) as u64;
    let progress = crate::progress::bar(total, &format!("experiment {}", ctx.name));
    let lines = crate::progress::shown() == crate::progress::Shown::Lines;
    let started = Instant::now();
    for round in 0..ctx.repeat {
        for (i, row) in rows.iter_mut().enumerate() {
            row.samples
                .push(measure(row.setting, &base, row.policy, opts));
            progress.inc(1);
            if lines {
                eprintln!(
                    "experiment {}: round {}/{}, {} of {} ({} {}) done, {:.1} s",
                    ctx.name,
                    round + 1,
                    ctx.repeat,
                    i + 1,
                    plan.len(),
                    row.setting.condition(),
                    row.policy.map_or("", |p| p.label),
                    started.elapsed().as_secs_f64()
                );
            }
        }
    }
    progress.finish_and_clear();
    let t = table(ctx, &rows, opts, adaptive);
    let figure = figure(&rows, &policies);
    let measured: Vec<_> = rows
        .iter()
        .map(|r| {
            json!({
                "path": r.setting.path(), "condition": r.setting.condition(),
                "policy": r.policy.map(|p| json!({
                    "label": p.label, "poll_interval_min": p.bounds.min,
                    "poll_interval_max": p.bounds.max,
                })),
                "samples": r.samples,
            })
        })
        .collect();
    Ok(Outcome {
        tables: vec![t],
        figure,
        params: json!({
            "round_trips": opts.round_trips, "bursts": opts.bursts, "burst": loggp::BURST,
            "stream": opts.stream, "settle_us": loggp::SETTLE.as_micros() as u64,
            "background_period_us": loggp::BACKGROUND_PERIOD.as_micros() as u64,
            "adaptive": { "poll_interval_min": adaptive.min, "poll_interval_max": adaptive.max },
            "claim_rtt_ratio": CLAIM_RTT_RATIO,
            "wall_s": started.elapsed().as_secs_f64(),
            "rows": measured,
        }),
        points: Vec::new(),
        failed: 0,
    })
}
