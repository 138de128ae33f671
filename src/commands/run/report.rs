//! What `multigrain run` reports: the [`Report`] (written with `--json`, and passed from
//! cluster 0 to the process that spawned the job) and its printed form.

use crate::launch::cpus;
use multigrain_apps::{em3d, water};
use multigrain_dsm::{ClusterStats, JobStats};
use multigrain_messaging::net::IniReport;
use multigrain_messaging::net::trace::TraceSummary;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// Where a run ran.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Backend {
    /// The sequential reference, in this process.
    Sequential,
    /// The plain-threads backend: threads of one process, hardware shared memory.
    Threads {
        /// Compute threads.
        threads: usize,
    },
    /// The DSM: one process per cluster.
    Dsm {
        /// The configuration's file (or the embedded default's label).
        config: String,
        /// Compute threads of each cluster.
        threads: Vec<usize>,
        /// Coherence protocol.
        protocol: String,
        /// Home policy.
        home: String,
        /// Substrate policy between clusters.
        substrate: String,
        /// INI threads of each cluster.
        inis: Vec<usize>,
        /// INI scheduling policy.
        policy: String,
    },
}

impl Backend {
    /// One line saying where the run ran.
    pub fn describe(&self) -> String {
        match self {
            Backend::Sequential => "sequential reference (one thread, no DSM)".to_owned(),
            Backend::Threads { threads } => format!(
                "plain threads: {threads} compute thread(s) in one process, hardware shared memory (no DSM)"
            ),
            Backend::Dsm {
                config,
                threads,
                protocol,
                home,
                substrate,
                inis,
                policy,
            } => {
                let shape = if threads.iter().all(|&t| t == threads[0]) {
                    format!("{} cluster(s) × {} thread(s)", threads.len(), threads[0])
                } else {
                    format!("{} clusters with {threads:?} threads", threads.len())
                };
                let inis = if inis.iter().all(|&k| k == inis[0]) {
                    format!("{} INI(s) per cluster", inis[0])
                } else {
                    format!("INIs per cluster {inis:?}")
                };
                format!(
                    "DSM: {shape} ({config}); protocol {protocol}, homes {home}, \
                     {inis} ({policy}), substrate {substrate}"
                )
            }
        }
    }
}

/// One INI's statistics as gathered at cluster 0.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct IniEntry {
    /// Its cluster.
    pub cluster: usize,
    /// Its index in the cluster.
    pub ini: usize,
    /// Fraction of its wall time spent working.
    pub utilization: f64,
    /// Messages it sent.
    pub messages: u64,
    /// The one-line summary of the message layer.
    pub line: String,
    /// Every counter, as the message layer reports it.
    pub report: serde_json::Value,
}

impl IniEntry {
    /// The entry of `r`.
    pub fn of(r: &IniReport) -> IniEntry {
        IniEntry {
            cluster: usize::from(r.site),
            ini: usize::from(r.ini),
            utilization: r.utilization,
            messages: r.messages,
            line: r.line(),
            report: serde_json::to_value(r).unwrap_or(serde_json::Value::Null),
        }
    }
}

/// The result of one conformance check.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CheckResult {
    /// The check (a function of `multigrain_apps::conformance`).
    pub name: String,
    /// Its run time, s.
    pub seconds: f64,
}

/// The outcome of the application.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "app", rename_all = "kebab-case")]
pub enum Outcome {
    /// Water-Nsquared.
    Water {
        /// Parameters.
        params: water::Params,
        /// Energies and phase times.
        result: water::RunResult,
    },
    /// EM3D.
    Em3d {
        /// Parameters.
        params: em3d::Params,
        /// Checksum, graph and phase times.
        result: em3d::RunResult,
    },
    /// The runtime conformance suite.
    Conformance {
        /// Checks passed, in order.
        checks: Vec<CheckResult>,
    },
}

/// Everything a run reports (the `--json` file).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// Where it ran.
    pub backend: Backend,
    /// What it computed.
    pub outcome: Outcome,
    /// Run time of the computation, s: Water from the initial state to the last step,
    /// EM3D the initial values and the iterations (not the graph construction), the
    /// conformance checks all together; measured on thread 0.
    pub run_s: f64,
    /// Wall time of the whole command, s, start-up of the cluster processes and the DSM
    /// included.
    pub wall_s: f64,
    /// DSM statistics of every cluster and their sum (DSM runs).
    pub stats: Option<JobStats>,
    /// Every cluster's INIs, up to the end of the computation (DSM runs over UDP).
    pub inis: Vec<IniEntry>,
    /// What the INIs' per-message traces say (runs with `ini.trace_dir`), summarized
    /// by the same code as `multigrain trace summarize` once every cluster has ended.
    /// Read back by `multigrain experiment`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceSummary>,
}

impl Outcome {
    /// Run time of the computation (see [`Report::run_s`]).
    pub fn run_s(&self) -> f64 {
        match self {
            Outcome::Water { result, .. } => {
                let t = &result.times;
                t.init_s + t.initial_forces_s + t.steps_s
            }
            Outcome::Em3d { result, .. } => result.times.init_s + result.times.compute_s,
            Outcome::Conformance { checks } => checks.iter().map(|c| c.seconds).sum(),
        }
    }
}

fn velocities(v: &water::VelocitySource) -> String {
    match v {
        water::VelocitySource::File(p) => format!("velocities from {}", p.display()),
        water::VelocitySource::Seeded(s) => {
            format!("velocities from a seeded generator (seed {s}, as --seed takes it)")
        }
    }
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// The report as printed: the app's own output, the run time, and the DSM statistics.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    match &r.outcome {
        Outcome::Water { params: p, result } => {
            let _ = writeln!(
                s,
                "Water-Nsquared: {} molecules, {} steps, TSTEP {:e} s, NORDER {}, cutoff {} Å, {}",
                p.molecules,
                p.steps,
                p.timestep_s,
                p.order,
                p.cutoff_angstrom,
                velocities(&p.velocities)
            );
            let _ = writeln!(s, "on {}", r.backend.describe());
            let _ = writeln!(
                s,
                "\nenergies every {} step(s), SPLASH's layout: STEP  TEN (kinetic)  POTA (intra)  POTR (inter)  POTRF (reaction field)\n                                           XTT (total)  AVGT (avg. temperature, K)  XVIR (virial); energies in N_atom·kT",
                p.print_every
            );
            for e in &result.energies {
                s.push_str(&water::format_step(e));
            }
            let t = &result.times;
            let _ = writeln!(
                s,
                "\nrun time {:.3} s (initial state {:.3} s, initial forces {:.3} s, {} time steps {:.3} s: predic+intraf {:.3}, interf {:.3}, correc+kineti {:.3}, poteng {:.3})\n  interf on thread 0: pair forces {:.3} s, adding them under the molecule locks {:.3} s, InterfBar and scaling {:.3} s",
                r.run_s,
                t.init_s,
                t.initial_forces_s,
                p.steps,
                t.steps_s,
                t.predic_intraf_s,
                t.interf_s,
                t.correc_kineti_s,
                t.poteng_s,
                t.interf_pairs_s,
                t.interf_locked_s,
                t.interf_barrier_s
            );
        }
        Outcome::Em3d { params: p, result } => {
            let [gx, gy, gz] = result.grid.dims;
            let _ = writeln!(
                s,
                "EM3D: {} partitions on a {gx}×{gy}×{gz} grid, {} E + {} H nodes each, degree {}, {}% remote edges, layout {:?}, variant {:?}, {} iterations, seed {}",
                result.partitions,
                p.nodes_per_thread,
                p.nodes_per_thread,
                p.degree,
                p.percent_remote,
                format!("{:?}", p.layout).to_lowercase(),
                format!("{:?}", p.variant).to_lowercase(),
                p.iterations,
                p.seed
            );
            let _ = writeln!(s, "on {}", r.backend.describe());
            if let Some(e) = &result.edge_stats {
                let _ = writeln!(
                    s,
                    "edges {}: to another thread {} ({:.1}%), to another cluster {} ({:.1}%); ghost slots {} ({} across clusters)",
                    e.edges,
                    e.remote_edges,
                    pct(e.remote_edges, e.edges),
                    e.cross_cluster_edges,
                    pct(e.cross_cluster_edges, e.edges),
                    e.ghost_slots,
                    e.cross_cluster_ghosts
                );
            }
            if let Some(b) = result.cluster_block {
                let _ = writeln!(s, "cluster block {}×{}×{}", b[0], b[1], b[2]);
            }
            let _ = writeln!(s, "\nchecksum: {}", result.checksum);
            let t = &result.times;
            let _ = writeln!(
                s,
                "\nrun time {:.3} s (initial values {:.3} s, {} iterations {:.3} s: E phases {:.3}, H phases {:.3}); graph built in {:.3} s",
                r.run_s, t.init_s, p.iterations, t.compute_s, t.e_phase_s, t.h_phase_s, t.setup_s
            );
        }
        Outcome::Conformance { checks } => {
            let _ = writeln!(s, "runtime conformance suite on {}", r.backend.describe());
            for c in checks {
                let _ = writeln!(s, "  {:<28} ok  {:.3} s", c.name, c.seconds);
            }
            let _ = writeln!(
                s,
                "all {} checks passed; run time {:.3} s",
                checks.len(),
                r.run_s
            );
        }
    }
    let _ = writeln!(s, "wall time {:.3} s (whole command)", r.wall_s);
    match &r.stats {
        Some(stats) => {
            s.push_str(&render_stats(stats, &r.inis));
            if let Backend::Dsm { threads, .. } = &r.backend
                && let Some(note) = crowded_note(threads, stats)
            {
                s.push_str(&note);
            }
        }
        None => {
            let _ = writeln!(s, "\n(no DSM statistics: this run did not use the DSM)");
        }
    }
    if let Some(t) = &r.trace {
        let _ = writeln!(s, "\nINI message traces (paper 002 §4.4.2):");
        s.push_str(&t.render());
    }
    s
}

/// A note under the statistics when the clusters on one machine ran more compute
/// threads than the CPUs their processes could use (each cluster's `cpus` as the kernel
/// lists them, united over the clusters with the same `machine`; a cluster whose machine
/// is not known counts alone): a waiting thread there shares its CPU with one that
/// computes, and its waits include the time slices of that one (see
/// [`multigrain_dsm::LONG_LOCK_WAIT`]). `threads`: compute threads of each cluster, by
/// cluster id. `None` when nothing was crowded, or when any cluster's CPUs or thread
/// count is not known.
pub fn crowded_note(threads: &[usize], stats: &JobStats) -> Option<String> {
    // Clusters by machine, in cluster order; an unknown machine is a group of its own.
    let mut groups: Vec<(&str, Vec<(usize, &ClusterStats)>)> = Vec::new();
    for (i, c) in stats.clusters.iter().enumerate() {
        let id = c.cluster.unwrap_or(i);
        match groups
            .iter_mut()
            .find(|(m, _)| !m.is_empty() && *m == c.machine)
        {
            Some((_, g)) => g.push((id, c)),
            None => groups.push((&c.machine, vec![(id, c)])),
        }
    }
    // A cluster with more threads than its own CPUs is named alone; a machine's
    // clusters together, where none is crowded alone but they are together (unbound
    // clusters each see every CPU).
    let mut crowded = Vec::new();
    for (_, g) in &groups {
        let mut all = BTreeSet::new();
        let (mut total, mut alone) = (0, Vec::new());
        for &(id, c) in g {
            let (Some(cpus), Some(&t)) = (cpus::parse(&c.cpus), threads.get(id)) else {
                return None;
            };
            if t > cpus.len() {
                alone.push(format!(
                    "c{id} ({t} threads on {})",
                    cpus_phrase(cpus.len())
                ));
            }
            total += t;
            all.extend(cpus);
        }
        if !alone.is_empty() {
            crowded.extend(alone);
        } else if total > all.len() {
            let ids: Vec<String> = g.iter().map(|(id, _)| format!("c{id}")).collect();
            crowded.push(format!(
                "{} ({total} threads on {} of one machine)",
                ids.join(" + "),
                cpus_phrase(all.len())
            ));
        }
    }
    if crowded.is_empty() {
        return None;
    }
    let long = &stats.total.time;
    Some(format!(
        "\nnote: more compute threads than CPUs in {}: a thread waiting for a lock or a page \
         shares its CPU with one that computes and runs again when that one blocks or its \
         time slice ends (milliseconds); {} ms of this run's lock waiting was in {} waits of \
         0.5 ms or more. One compute thread per CPU avoids it: fewer threads per cluster, \
         or the clusters spread over more CPUs or machines.\n",
        crowded.join(", "),
        ms(long.lock_long_wait_ns),
        long.lock_long_waits
    ))
}

fn cpus_phrase(n: usize) -> String {
    if n == 1 {
        "1 CPU".to_owned()
    } else {
        format!("{n} CPUs")
    }
}

/// Most clusters shown as columns of the statistics table (beyond that, totals only).
const MAX_COLUMNS: usize = 8;

/// Width of the statistics table's first column (titles), so that every row's label
/// fits and the columns stay aligned.
const LABEL_WIDTH: usize = 40;

/// Locks listed under "locks waited on longest".
const SLOW_LOCKS_SHOWN: usize = 5;

/// Width of a row label (indented by two spaces under its title).
const LABEL_WIDTH_ROW: usize = LABEL_WIDTH - 2;

fn ms(ns: u64) -> u64 {
    ns / 1_000_000
}

/// How [`render_stats`] writes a row: its label, then a value per column from each
/// column's statistics.
type Row<'a> = dyn Fn(&mut String, &str, &dyn Fn(&ClusterStats) -> u64) + 'a;

/// The rows of `dsm.event_profile` (the job's `total` profile, one row per kind it
/// holds): per kind of event, the events handled and their handling time each, whole
/// and in the coherence machine; then the time in actions, by kind.
fn event_profile_rows(
    s: &mut String,
    total: &multigrain_dsm::EventProfile,
    header: &dyn Fn(&mut String, &str),
    row: &Row<'_>,
) {
    let time = |c: &ClusterStats, kind: &str| {
        c.event_profile
            .as_ref()
            .and_then(|p| p.events.get(kind))
            .copied()
            .unwrap_or_default()
    };
    // The cluster's own events first (lower-case names), then the messages received.
    let mut kinds: Vec<&String> = total.events.keys().collect();
    kinds.sort_by_key(|k| (k.starts_with(|c: char| c.is_ascii_uppercase()), *k));
    header(s, "handling by event (dsm.event_profile)");
    for kind in kinds {
        row(s, &format!("{kind}: events"), &|c| time(c, kind).count);
        row(s, "  ns each", &|c| {
            let t = time(c, kind);
            t.ns.checked_div(t.count).unwrap_or(0)
        });
        row(s, "    in the coherence machine", &|c| {
            let t = time(c, kind);
            t.machine_ns.checked_div(t.count).unwrap_or(0)
        });
    }
    header(s, "actions, by kind (µs)");
    for kind in total.actions_ns.keys() {
        row(s, kind, &|c| {
            c.event_profile
                .as_ref()
                .and_then(|p| p.actions_ns.get(kind))
                .map_or(0, |ns| ns / 1_000)
        });
    }
}

/// The DSM statistics table: job totals and, for up to [`MAX_COLUMNS`] clusters, one
/// column per cluster; the locks waited on longest; messages and bulk bytes by kind; the
/// message layer; the INIs.
pub fn render_stats(stats: &JobStats, inis: &[IniEntry]) -> String {
    let mut s = String::new();
    let cols: &[ClusterStats] = if stats.clusters.len() <= MAX_COLUMNS {
        &stats.clusters
    } else {
        &[]
    };
    let header = |s: &mut String, title: &str| {
        let _ = write!(s, "\n{title:<LABEL_WIDTH$}{:>12}", "total");
        for (i, c) in cols.iter().enumerate() {
            let _ = write!(s, "{:>12}", format!("c{}", c.cluster.unwrap_or(i)));
        }
        s.push('\n');
    };
    let row = |s: &mut String, name: &str, f: &dyn Fn(&ClusterStats) -> u64| {
        let _ = write!(s, "  {name:<LABEL_WIDTH_ROW$}{:>12}", f(&stats.total));
        for c in cols {
            let _ = write!(s, "{:>12}", f(c));
        }
        s.push('\n');
    };
    header(&mut s, "DSM statistics");
    // A row of CPU lists, one a cluster (none for the total), where any cluster has one.
    let cpu_row = |s: &mut String, name: &str, f: &dyn Fn(&ClusterStats) -> &str| {
        if cols.iter().all(|c| f(c).is_empty()) {
            return;
        }
        let _ = write!(s, "  {name:<LABEL_WIDTH_ROW$}{:>12}", "");
        for c in cols {
            let _ = write!(s, "{:>12}", f(c));
        }
        s.push('\n');
    };
    // Each cluster's CPU mask (its share where launch.cpu_bind split the host) and,
    // placed apart, its protocol thread's (the other clusters' shares).
    cpu_row(&mut s, "CPUs (launch.cpu_bind)", &|c| &c.cpus);
    cpu_row(&mut s, "  its protocol thread", &|c| &c.protocol_cpus);
    row(&mut s, "read faults", &|c| c.read_faults);
    row(&mut s, "write faults", &|c| c.write_faults);
    row(&mut s, "faults waiting on a cluster", &|c| c.remote_faults);
    row(&mut s, "time in faults (ms)", &|c| ms(c.fault_ns));
    row(&mut s, "remote fetches (pages)", &|c| c.remote_fetches);
    row(&mut s, "  prefetched (dsm.prefetch)", &|c| {
        c.protocol.prefetches
    });
    row(&mut s, "  prefetches a fault waited for", &|c| {
        c.protocol.prefetch_hits
    });
    row(&mut s, "pages installed", &|c| c.pages_installed);
    row(&mut s, "  mapped in place (minor faults)", &|c| {
        c.pages_installed_in_place
    });
    row(&mut s, "twins", &|c| c.twins);
    row(&mut s, "  opened ahead (dsm.write_ahead)", &|c| {
        c.protocol.write_ahead_pages
    });
    row(&mut s, "open pages flushed", &|c| {
        c.protocol.pages_kept_open + c.protocol.pages_closed
    });
    row(&mut s, "  not read: no store since the last flush", &|c| {
        c.flush_pages_unmarked
    });
    row(&mut s, "  read in part: only the lines stored to", &|c| {
        c.flush_pages_by_lines
    });
    row(&mut s, "home writes to private pages", &|c| {
        c.protocol.private_home_writes
    });
    row(&mut s, "diffs sent", &|c| c.diffs_sent);
    row(&mut s, "diff bytes sent", &|c| c.diff_bytes_sent);
    row(&mut s, "diffs applied (as home)", &|c| c.diffs_applied);
    row(&mut s, "invalidations", &|c| c.invalidations);
    row(&mut s, "updates sent to copies", &|c| {
        c.protocol.updates_sent
    });
    row(&mut s, "  applied instead of invalidating", &|c| {
        c.protocol.updates_applied
    });
    row(&mut s, "    with a lock grant", &|c| {
        c.protocol.updates_at_grant
    });
    row(&mut s, "    on arrival, waiting at the barrier", &|c| {
        c.protocol.updates_early
    });
    row(&mut s, "  dropped", &|c| c.protocol.updates_dropped);
    row(&mut s, "    already applied with a lock", &|c| {
        c.protocol.updates_redundant
    });
    row(&mut s, "  departures that waited for them", &|c| {
        c.protocol.departures_held_for_updates
    });
    row(&mut s, "lock acquires", &|c| c.lock_acquires);
    row(&mut s, "  served inside the cluster", &|c| {
        c.lock_local_handoffs
    });
    row(&mut s, "    cached, without the protocol", &|c| {
        c.lock_runtime_acquires
    });
    row(&mut s, "  pushed here before asked", &|c| {
        c.protocol.lock_pushes_received
    });
    row(&mut s, "    given back for missing records", &|c| {
        c.protocol.lock_pushes_refused
    });
    row(&mut s, "  kept for the visit's next use", &|c| {
        c.protocol.lock_visit_keeps
    });
    row(&mut s, "  asked for: flushed while waiting", &|c| {
        c.protocol.flushes_ahead
    });
    row(&mut s, "lock recalls sent (as manager)", &|c| {
        c.protocol.lock_recalls
    });
    row(&mut s, "  ahead of a sweep's requests", &|c| {
        c.protocol.lock_sweep_recalls
    });
    row(&mut s, "    of locks pushed to their holder", &|c| {
        c.protocol.lock_sweep_pushed_recalls
    });
    row(&mut s, "lock wait (ms, all threads)", &|c| {
        ms(c.lock_wait_ns)
    });
    row(&mut s, "interval records received", &|c| {
        c.protocol.records_received
    });
    row(&mut s, "  already held (sent again)", &|c| {
        c.protocol.records_known
    });
    row(&mut s, "barriers", &|c| c.barriers);
    row(&mut s, "barrier wait (ms, all threads)", &|c| {
        ms(c.barrier_wait_ns)
    });
    header(&mut s, "where the time went (ms, all threads)");
    row(&mut s, "lock acquire", &|c| ms(c.time.lock_acquire_ns));
    row(&mut s, "  in waits of 0.5 ms or more", &|c| {
        ms(c.time.lock_long_wait_ns)
    });
    row(&mut s, "    waits", &|c| c.time.lock_long_waits);
    row(&mut s, "lock release (flush, send)", &|c| {
        ms(c.time.lock_release_ns)
    });
    row(&mut s, "page faults", &|c| ms(c.time.fault_ns));
    row(&mut s, "  waiting for another cluster", &|c| {
        ms(c.time.remote_fault_ns)
    });
    row(&mut s, "barriers", &|c| ms(c.time.barrier_ns));
    row(&mut s, "  global part (one thread)", &|c| {
        ms(c.time.barrier_global_ns)
    });
    row(&mut s, "    flush before the arrival", &|c| {
        ms(c.time.barrier_flush_ns)
    });
    row(&mut s, "handling messages (any thread)", &|c| {
        ms(c.time.dispatch_ns)
    });
    row(&mut s, "  messages handled", &|c| c.time.dispatched);
    row(&mut s, "asleep while waiting", &|c| ms(c.time.sleep_ns));
    row(&mut s, "real-time protocol thread", &|c| {
        c.realtime_protocol_threads
    });
    row(&mut s, "  times", &|c| c.time.sleeps);
    if let Some(total) = &stats.total.event_profile {
        event_profile_rows(&mut s, total, &header, &row);
    }
    // The job's longest lock waits; each cluster reports its own longest
    // (`SLOW_LOCKS_KEPT`), so a cluster's 0 may be a lock outside its own list.
    let mut slow: Vec<(u32, u64)> = stats
        .total
        .slow_lock_waits
        .iter()
        .map(|(&lock, w)| (lock, w.wait_ns))
        .collect();
    slow.sort_by_key(|&(lock, ns)| (std::cmp::Reverse(ns), lock));
    if !slow.is_empty() {
        header(
            &mut s,
            &format!(
                "locks waited on longest (over {} µs)",
                multigrain_dsm::SLOW_LOCK_WAIT.as_micros()
            ),
        );
        row(&mut s, "all locks: wait (µs)", &|c| {
            c.slow_lock_waits_all.wait_ns / 1_000
        });
        row(&mut s, "  acquires", &|c| c.slow_lock_waits_all.acquires);
        for &(lock, _) in slow.iter().take(SLOW_LOCKS_SHOWN) {
            let waits = |c: &ClusterStats| c.slow_lock_waits.get(&lock).copied();
            row(&mut s, &format!("lock {lock}: wait (µs)"), &|c| {
                waits(c).map_or(0, |w| w.wait_ns / 1_000)
            });
            row(&mut s, "  acquires", &|c| {
                waits(c).map_or(0, |w| w.acquires)
            });
        }
    }
    header(&mut s, "messages sent, by kind");
    for kind in stats.total.messages_sent.keys() {
        row(&mut s, kind, &|c| {
            c.messages_sent.get(kind).copied().unwrap_or(0)
        });
    }
    // Bulk messages only: an Express message is one word, a Tag-On message a word and
    // its page.
    header(&mut s, "bulk message bytes sent, by kind");
    for kind in stats.total.bulk_bytes_sent.keys() {
        row(&mut s, kind, &|c| {
            c.bulk_bytes_sent.get(kind).copied().unwrap_or(0)
        });
    }
    header(&mut s, "message layer");
    row(&mut s, "Express sent", &|c| c.layer.express_sent);
    row(&mut s, "Tag-On sent", &|c| c.layer.tag_on_sent);
    row(&mut s, "bulk sent", &|c| c.layer.bulk_sent);
    row(&mut s, "bundles sent", &|c| c.bundles_sent);
    row(&mut s, "messages in bundles", &|c| c.bundled_messages_sent);
    row(&mut s, "  Express ones, after bulk ones", &|c| {
        c.express_bundled_sent
    });
    if stats.total.bundle_pieces_sent > 0 {
        // Bundles longer than one bulk message (interval records of long phases).
        row(&mut s, "pieces of long bundles sent", &|c| {
            c.bundle_pieces_sent
        });
    }
    row(&mut s, "payload bytes sent", &|c| c.layer.bytes_sent);
    row(&mut s, "sends to a full queue", &|c| c.layer.queue_full);
    row(&mut s, "empty buffer pool", &|c| c.layer.pool_exhausted);
    row(&mut s, "buffer pool slots used", &|c| {
        c.layer.pool_used_slots
    });
    if !inis.is_empty() {
        row(&mut s, "receive polls reading the network", &|c| {
            c.layer.network_polls
        });
    }
    if inis.is_empty() {
        let _ = writeln!(
            s,
            "\nINIs: none (no cluster reached another over UDP in this job)"
        );
    } else {
        let _ = writeln!(s, "\nINIs (up to the end of the computation)");
        for i in inis {
            let _ = writeln!(s, "  {}", i.line);
        }
        let util: Vec<String> = inis
            .iter()
            .map(|i| format!("c{}/ini{} {:.1}%", i.cluster, i.ini, 100.0 * i.utilization))
            .collect();
        let _ = writeln!(s, "INI utilization: {}", util.join(", "));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(id: usize, machine: &str, cpus: &str) -> ClusterStats {
        let mut c = ClusterStats {
            cluster: Some(id),
            machine: machine.into(),
            cpus: cpus.into(),
            ..Default::default()
        };
        c.time.lock_long_waits = 3;
        c.time.lock_long_wait_ns = 2_000_000;
        c
    }

    #[test]
    fn the_crowded_note_names_the_clusters_with_more_threads_than_cpus() {
        // Bound, each to its own CPUs: cluster 0 crowded, cluster 1 not.
        let stats = JobStats::from_clusters(vec![cluster(0, "m", "0"), cluster(1, "m", "1-2")]);
        let note = crowded_note(&[2, 2], &stats).expect("cluster 0 is crowded");
        assert!(note.contains("in c0 (2 threads on 1 CPU)"), "{note}");
        assert!(!note.contains("c1"), "{note}");
        assert!(
            note.contains("4 ms of this run's lock waiting was in 6 waits"),
            "{note}"
        );
        assert_eq!(crowded_note(&[1, 2], &stats), None);
        // Crowded alone on a machine with CPUs to spare.
        let note = crowded_note(&[2, 1], &stats).expect("cluster 0 is crowded");
        assert!(note.contains("in c0 (2 threads on 1 CPU):"), "{note}");
        // Unbound on one machine: each sees both CPUs, together they crowd them.
        let shared = JobStats::from_clusters(vec![cluster(0, "m", "0-1"), cluster(1, "m", "0-1")]);
        let note = crowded_note(&[2, 2], &shared).expect("the machine is crowded");
        assert!(
            note.contains("c0 + c1 (4 threads on 2 CPUs of one machine)"),
            "{note}"
        );
        assert_eq!(crowded_note(&[1, 1], &shared), None);
        // The same lists on two machines, or machines not known: not crowded.
        let apart = JobStats::from_clusters(vec![cluster(0, "m", "0-1"), cluster(1, "n", "0-1")]);
        assert_eq!(crowded_note(&[2, 2], &apart), None);
        let unknown = JobStats::from_clusters(vec![cluster(0, "", "0-1"), cluster(1, "", "0-1")]);
        assert_eq!(crowded_note(&[2, 2], &unknown), None);
        // CPUs not known: no note.
        let no_cpus = JobStats::from_clusters(vec![cluster(0, "m", ""), cluster(1, "m", "")]);
        assert_eq!(crowded_note(&[4, 4], &no_cpus), None);
    }
}
