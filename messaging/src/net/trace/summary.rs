//! What the traces say: the quantities of paper 002 Tables 5.3/5.4 (message length,
//! message time in the INI, queue length, INI utilization) and Tables 5.6/5.7
//! (mis-scheduled time rate and count rate), computed per INI, per cluster and for the
//! job.
//!
//! Definitions (paper 002 §5.3–5.4):
//! * **Message time in the INI**: time a message spends in the sending INI (enqueued →
//!   first datagram on the wire) plus in the receiving INI (last datagram read →
//!   delivered to its queue), "cycles spent in both send and receive INI nodes". Per INI,
//!   the part spent in that INI; for the job, the two parts of every message whose
//!   records were found at both ends (send-side part alone for the others, counted apart).
//! * **Queue length**: messages in the INI (queued or being processed, either direction)
//!   that a message finds when it arrives at the INI, itself excluded; the mean over
//!   arrivals (the thesis's "instantaneous queue length in the INI node when the message
//!   arrives", §4.4.2).
//! * **Utilization**: the fraction of the INI's traced span during which it was
//!   processing at least one message (from taking it off the queue, or reading its last
//!   datagram, until it is on the wire, or delivered).
//! * **Mis-scheduled** (Figure 5-3): a message handed to an INI that is already occupied
//!   (another message queued or in processing) while another INI of the same cluster is
//!   idle (nothing queued, nothing in processing) and that then waits in the queue. Its
//!   queue wait is the *wasted* time. Time rate = wasted time / total time the cluster's
//!   INIs were processing messages; count rate = mis-scheduled messages / messages sent.
//!
//! The thesis warns (§5.4) that these rates come from one recorded trace and only
//! indicate balance: any change of one message's latency would change the trace.

use super::file::{ClusterTrace, IniTrace};
use super::record::{Side, TraceRecord};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt::Write as _;

/// One INI's numbers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IniSummary {
    /// Cluster.
    pub cluster: u16,
    /// INI in the cluster.
    pub ini: u16,
    /// Messages it sent (send-side records).
    pub sent: u64,
    /// Messages it delivered (receive-side records).
    pub received: u64,
    /// Records its buffer had no room for.
    pub dropped: u64,
    /// Mean data bytes of the messages it handled.
    pub mean_message_bytes: f64,
    /// Mean time a message spent in this INI, µs.
    pub mean_time_us: f64,
    /// Mean messages in the INI seen by an arriving message.
    pub mean_queue_len: f64,
    /// Fraction of its span spent processing messages, 0..=1.
    pub utilization: f64,
    /// Sent messages that were mis-scheduled here.
    pub misscheduled: u64,
    /// Their queue waits, µs.
    pub wasted_us: f64,
}

/// One cluster's mis-scheduling (paper 002 Tables 5.6/5.7).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterSummary {
    /// Cluster.
    pub cluster: u16,
    /// INIs in the cluster.
    pub inis: usize,
    /// Messages its INIs sent.
    pub sent: u64,
    /// Of those, mis-scheduled.
    pub misscheduled: u64,
    /// Wasted queue time, µs.
    pub wasted_us: f64,
    /// Time its INIs spent processing messages (each INI's busy time, summed), µs.
    pub busy_us: f64,
    /// Wasted / busy.
    pub misscheduled_time_rate: f64,
    /// Mis-scheduled / sent.
    pub misscheduled_count_rate: f64,
}

/// The whole job's numbers, as one row of paper 002 Tables 5.3/5.4 and 5.6/5.7.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceSummary {
    /// Per INI, ordered by cluster and INI.
    pub inis: Vec<IniSummary>,
    /// Per cluster.
    pub clusters: Vec<ClusterSummary>,
    /// Messages sent between clusters (send-side records).
    pub messages: u64,
    /// Of those, found at their receiving INI too.
    pub joined: u64,
    /// Records lost to full buffers, all INIs.
    pub dropped: u64,
    /// Mean data bytes per message.
    pub mean_message_bytes: f64,
    /// Mean message time in the INIs (send part + receive part) over joined messages, µs;
    /// the send part alone when no message could be joined.
    pub mean_message_time_us: f64,
    /// The same without the wait in the sending INI's hand-off queue (taken off the
    /// queue → on the wire, plus last datagram read → delivered), µs: the INIs'
    /// processing time of a message, what an unloaded INI would add (the thesis's "IO
    /// delay"). 0 in summaries written before it existed.
    #[serde(default)]
    pub mean_service_time_us: f64,
    /// Mean queue length seen by arrivals, all INIs.
    pub mean_queue_len: f64,
    /// Mean utilization over the INIs.
    pub mean_utilization: f64,
    /// Wasted / busy over all clusters.
    pub misscheduled_time_rate: f64,
    /// Mis-scheduled / sent over all clusters.
    pub misscheduled_count_rate: f64,
}

/// `num / den`, 0 when `den` is 0.
fn ratio(num: f64, den: f64) -> f64 {
    if den > 0.0 { num / den } else { 0.0 }
}

/// How many of one INI's messages are inside it at a time: `[start, end)` per record.
struct Occupancy {
    starts: Vec<u64>,
    ends: Vec<u64>,
}

impl Occupancy {
    fn of(records: &[TraceRecord]) -> Occupancy {
        let mut starts: Vec<u64> = records.iter().map(TraceRecord::start_ns).collect();
        let mut ends: Vec<u64> = records.iter().map(TraceRecord::end_ns).collect();
        starts.sort_unstable();
        ends.sort_unstable();
        Occupancy { starts, ends }
    }

    /// Messages with `start <= t < end`.
    fn at(&self, t: u64) -> usize {
        let started = self.starts.partition_point(|&s| s <= t);
        let ended = self.ends.partition_point(|&e| e <= t);
        started.saturating_sub(ended)
    }
}

/// Total length of the union of the INI's processing intervals, ns.
fn busy_ns(records: &[TraceRecord]) -> u64 {
    let mut iv: Vec<(u64, u64)> = records
        .iter()
        .map(|r| (r.service_start_ns(), r.end_ns()))
        .filter(|(s, e)| e > s)
        .collect();
    iv.sort_unstable();
    let mut total = 0;
    let mut cur: Option<(u64, u64)> = None;
    for (s, e) in iv {
        cur = match cur {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some((cs, ce)) = cur {
        total += ce - cs;
    }
    total
}

/// Messages in the INI that `r` finds on arrival, itself excluded.
fn found_on_arrival(occ: &Occupancy, r: &TraceRecord) -> usize {
    let own = usize::from(r.end_ns() > r.start_ns());
    occ.at(r.start_ns()).saturating_sub(own)
}

/// Summarizes the traces of any number of clusters of one job (each cluster at most once).
pub fn summarize(traces: &[ClusterTrace]) -> TraceSummary {
    let mut inis = Vec::new();
    let mut clusters = Vec::new();
    for ct in traces {
        let occ: Vec<Occupancy> = ct.inis.iter().map(|i| Occupancy::of(&i.records)).collect();
        let mut cluster = ClusterSummary {
            cluster: ct.cluster,
            inis: ct.inis.len(),
            sent: 0,
            misscheduled: 0,
            wasted_us: 0.0,
            busy_us: 0.0,
            misscheduled_time_rate: 0.0,
            misscheduled_count_rate: 0.0,
        };
        for (i, it) in ct.inis.iter().enumerate() {
            let s = ini_summary(ct, i, it, &occ);
            cluster.sent += s.sent;
            cluster.misscheduled += s.misscheduled;
            cluster.wasted_us += s.wasted_us;
            cluster.busy_us += busy_ns(&it.records) as f64 / 1e3;
            inis.push(s);
        }
        cluster.misscheduled_time_rate = ratio(cluster.wasted_us, cluster.busy_us);
        cluster.misscheduled_count_rate = ratio(cluster.misscheduled as f64, cluster.sent as f64);
        clusters.push(cluster);
    }
    job_summary(traces, inis, clusters)
}

fn ini_summary(ct: &ClusterTrace, i: usize, it: &IniTrace, occ: &[Occupancy]) -> IniSummary {
    let n = it.records.len() as f64;
    let mut bytes = 0.0;
    let mut time_ns = 0.0;
    let mut found = 0.0;
    let (mut sent, mut received, mut misscheduled, mut wasted_ns) = (0, 0, 0, 0u64);
    for r in &it.records {
        bytes += f64::from(r.bytes);
        time_ns += r.end_ns().saturating_sub(r.start_ns()) as f64;
        let ahead = found_on_arrival(&occ[i], r);
        found += ahead as f64;
        match r.side {
            Side::Receive => received += 1,
            Side::Send => {
                sent += 1;
                let t = r.enqueued_ns();
                let wait = r.dequeued_ns().saturating_sub(t);
                let idle_elsewhere = ct.inis.iter().enumerate().any(|(j, other)| {
                    j != i && other.span.0 <= t && t <= other.span.1 && occ[j].at(t) == 0
                });
                if ahead > 0 && wait > 0 && idle_elsewhere {
                    misscheduled += 1;
                    wasted_ns += wait;
                }
            }
        }
    }
    let span = it.span.1.saturating_sub(it.span.0) as f64;
    IniSummary {
        cluster: ct.cluster,
        ini: i as u16,
        sent,
        received,
        dropped: it.dropped,
        mean_message_bytes: ratio(bytes, n),
        mean_time_us: ratio(time_ns, n) / 1e3,
        mean_queue_len: ratio(found, n),
        utilization: ratio(busy_ns(&it.records) as f64, span).min(1.0),
        misscheduled,
        wasted_us: wasted_ns as f64 / 1e3,
    }
}

fn job_summary(
    traces: &[ClusterTrace],
    inis: Vec<IniSummary>,
    clusters: Vec<ClusterSummary>,
) -> TraceSummary {
    // One message at both ends: (origin cluster, destination cluster, lane, seq).
    let mut receive_part: HashMap<(u16, u16, u16, u32), u64> = HashMap::new();
    let all = || traces.iter().flat_map(|c| &c.inis).flat_map(|i| &i.records);
    for r in all().filter(|r| r.side == Side::Receive) {
        receive_part.insert(
            (r.peer_cluster, r.cluster, r.lane, r.seq),
            r.delivered_ns().saturating_sub(r.arrived_ns()),
        );
    }
    let (mut messages, mut joined, mut bytes) = (0u64, 0u64, 0.0);
    let (mut joined_ns, mut send_only_ns) = (0.0, 0.0);
    let (mut joined_service_ns, mut send_only_service_ns) = (0.0, 0.0);
    for r in all().filter(|r| r.side == Side::Send) {
        messages += 1;
        bytes += f64::from(r.bytes);
        let send_part = r.wired_ns().saturating_sub(r.enqueued_ns()) as f64;
        let send_service = r.wired_ns().saturating_sub(r.dequeued_ns()) as f64;
        send_only_ns += send_part;
        send_only_service_ns += send_service;
        if let Some(&recv) = receive_part.get(&(r.cluster, r.peer_cluster, r.lane, r.seq)) {
            joined += 1;
            joined_ns += send_part + recv as f64;
            joined_service_ns += send_service + recv as f64;
        }
    }
    let arrivals: u64 = inis.iter().map(|s| s.sent + s.received).sum();
    let found: f64 = inis
        .iter()
        .map(|s| s.mean_queue_len * (s.sent + s.received) as f64)
        .sum();
    let wasted: f64 = clusters.iter().map(|c| c.wasted_us).sum();
    let busy: f64 = clusters.iter().map(|c| c.busy_us).sum();
    let missched: u64 = clusters.iter().map(|c| c.misscheduled).sum();
    TraceSummary {
        messages,
        joined,
        dropped: inis.iter().map(|s| s.dropped).sum(),
        mean_message_bytes: ratio(bytes, messages as f64),
        mean_message_time_us: if joined > 0 {
            joined_ns / joined as f64 / 1e3
        } else {
            ratio(send_only_ns, messages as f64) / 1e3
        },
        mean_service_time_us: if joined > 0 {
            joined_service_ns / joined as f64 / 1e3
        } else {
            ratio(send_only_service_ns, messages as f64) / 1e3
        },
        mean_queue_len: ratio(found, arrivals as f64),
        mean_utilization: ratio(inis.iter().map(|s| s.utilization).sum(), inis.len() as f64),
        misscheduled_time_rate: ratio(wasted, busy),
        misscheduled_count_rate: ratio(missched as f64, messages as f64),
        inis,
        clusters,
    }
}

impl TraceSummary {
    /// The summary as text: a job line, a table per INI (paper 002 Tables 5.3/5.4
    /// columns) and one per cluster (Tables 5.6/5.7 columns).
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{} messages ({} found at both ends, {} records dropped): mean length {:.0} B, \
             time in the INIs {:.1} µs ({:.1} µs without the queue), queue length {:.3}, \
             INI utilization {:.3}, mis-scheduled time rate {:.1} %, count rate {:.1} %",
            self.messages,
            self.joined,
            self.dropped,
            self.mean_message_bytes,
            self.mean_message_time_us,
            self.mean_service_time_us,
            self.mean_queue_len,
            self.mean_utilization,
            self.misscheduled_time_rate * 100.0,
            self.misscheduled_count_rate * 100.0,
        );
        let _ = writeln!(
            s,
            "\n{:>7} {:>4} {:>9} {:>9} {:>9} {:>11} {:>9} {:>7} {:>11} {:>10}",
            "cluster",
            "INI",
            "sent",
            "received",
            "len (B)",
            "time (µs)",
            "queue",
            "util",
            "missched",
            "wasted µs"
        );
        for i in &self.inis {
            let _ = writeln!(
                s,
                "{:>7} {:>4} {:>9} {:>9} {:>9.0} {:>11.1} {:>9.3} {:>7.3} {:>11} {:>10.0}",
                i.cluster,
                i.ini,
                i.sent,
                i.received,
                i.mean_message_bytes,
                i.mean_time_us,
                i.mean_queue_len,
                i.utilization,
                i.misscheduled,
                i.wasted_us,
            );
        }
        let _ = writeln!(
            s,
            "\n{:>7} {:>4} {:>9} {:>11} {:>22} {:>23}",
            "cluster", "INIs", "sent", "missched", "mis-sched. time rate", "mis-sched. count rate"
        );
        for c in &self.clusters {
            let _ = writeln!(
                s,
                "{:>7} {:>4} {:>9} {:>11} {:>21.1}% {:>22.1}%",
                c.cluster,
                c.inis,
                c.sent,
                c.misscheduled,
                c.misscheduled_time_rate * 100.0,
                c.misscheduled_count_rate * 100.0,
            );
        }
        s
    }
}
