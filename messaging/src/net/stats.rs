//! Per-INI statistics (paper 002 §4.4.2, Tables 5.3 and 5.4).

use super::faults::InjectedFaults;
use crate::window::IniStats;
use serde::Serialize;

/// What one INI did, as printed with `--stats` and written with `--stats-json`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct IniReport {
    /// Site (cluster) of the INI.
    pub site: u16,
    /// INI index in its cluster.
    pub ini: u8,
    /// Messages this INI took from its hand-off queue and sent.
    pub messages: u64,
    /// Their bytes (frame data, excluding headers).
    pub bytes: u64,
    /// Mean message length, bytes.
    pub mean_message_bytes: f64,
    /// Mean time a message waited in this INI's hand-off queue before the INI framed it
    /// into the sliding window, µs (only the queue: the thesis's message time through the
    /// INI, to the wire and from arrival to delivery, comes from the per-message trace,
    /// `ini.trace_dir`).
    pub mean_time_in_ini_us: f64,
    /// Mean length of the hand-off queue as seen by arriving messages.
    pub mean_queue_len_at_arrival: f64,
    /// Fraction of wall time spent in passes of this INI that did work (not polling idle
    /// or sleeping), whichever thread ran them: the INI thread, or a compute thread in
    /// the inline variant (`ini.inline`). The trace's utilization counts only the time
    /// messages were in service.
    pub utilization: f64,
    /// Messages put in this INI's queue while another INI of the cluster had an empty
    /// queue (mis-scheduled, paper 002 §5.3).
    pub misscheduled: u64,
    /// Their total time waiting in this INI, µs.
    pub misscheduled_time_us: f64,
    /// Times a sending thread woke this INI's sleeping thread to take a message it had
    /// queued (an eventfd write). With inline INIs (`ini.inline`) the sender runs the
    /// INI's pass itself and wakes the thread only when that pass could not take the
    /// message (another thread ran one, or the pass's budget was spent).
    pub sender_wakeups: u64,
    /// Messages this INI received and delivered to local queues.
    pub delivered: u64,
    /// Messages that passed the window's checks (address, epoch, MAC) but whose frame
    /// did not decode, or outgoing messages whose buffer could not be read (counted,
    /// dropped).
    pub rejected_frames: u64,
    /// Faults injected by the `[faults]` shim.
    pub injected: InjectedFaults,
    /// The sliding window's counters: retransmissions, NAKs, duplicates, and the datagrams
    /// rejected for a bad MAC, another run's epoch, an unregistered source address or a
    /// malformed header…
    pub window: IniStats,
    /// UDP segmentation and receive offload (`ini.offload`).
    pub offload: OffloadStats,
    /// Wall time the INI ran, µs.
    pub elapsed_us: f64,
    /// The cluster's liveness thread ([`crate::liveness`]): its probes, answers and the
    /// probes it refused (bad MAC, another run's epoch, unregistered source, malformed
    /// or stale). Reported with INI 0 of each cluster; `None` on the other INIs.
    pub liveness: Option<crate::liveness::LivenessStats>,
}

/// What one INI's segmentation and receive offload did (`ini.offload`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OffloadStats {
    /// Segmented sends (GSO): one `sendmsg` each for two or more datagrams to one peer.
    pub sends: u64,
    /// Datagrams those sends carried (the rest left one `sendto` each).
    pub sent_datagrams: u64,
    /// Socket reads that returned two or more datagrams the kernel coalesced (GRO).
    pub reads: u64,
    /// Datagrams those reads returned.
    pub read_datagrams: u64,
}

impl IniReport {
    /// A one-line summary (for `--stats` tables). `datagrams` counts the datagrams sent
    /// (ACKs included; fewer than `msgs` when messages share one, `ini.coalesce`). The
    /// last four columns are the
    /// rejected datagrams by reason: `mac` failed authentication (corrupted or forged), `epoch` another
    /// run's epoch (replays), `src` from an address that is not a registered peer INI's,
    /// `bad` malformed (plus frames that passed the window but did not decode). On the
    /// INI that carries the liveness counters, the same four reasons follow for the
    /// liveness probes (`probes rejected: mac … bad` where `bad` also counts stale
    /// answers), with the answers received. Where segmentation offload batched sends or
    /// reads, `offload` gives their counts and the datagrams they carried.
    pub fn line(&self) -> String {
        let c = &self.window.connections;
        let w = &self.window;
        let probes = self.liveness.map_or_else(String::new, |l| {
            format!(
                "  liveness answers {:>6}  probes rejected: mac {:>5}  epoch {:>5}  src {:>5}  bad {:>5}",
                l.answers, l.rejected_mac, l.rejected_epoch, l.rejected_source, l.rejected_bad
            )
        });
        let o = &self.offload;
        let offload = if o.sends + o.reads == 0 {
            String::new()
        } else {
            format!(
                "  offload: {} sends of {} datagrams, {} reads of {}",
                o.sends, o.sent_datagrams, o.reads, o.read_datagrams
            )
        };
        format!(
            "c{}/ini{}  msgs {:>9}  datagrams {:>9}  bytes {:>12}  mean len {:>7.1}  hand-off wait {:>6.1} µs  queue {:>6.2}  util {:>5.1}%  missched {:>7}  retx {:>6}  NAK {:>5}/{:<5}  dup {:>5}  rejected: mac {:>5}  epoch {:>5}  src {:>5}  bad {:>5}",
            self.site,
            self.ini,
            self.messages,
            w.datagrams_sent,
            self.bytes,
            self.mean_message_bytes,
            self.mean_time_in_ini_us,
            self.mean_queue_len_at_arrival,
            self.utilization * 100.0,
            self.misscheduled,
            c.retransmissions,
            c.naks_sent,
            c.naks_received,
            c.duplicates,
            w.bad_mac,
            w.wrong_epoch,
            w.unknown_source,
            w.decode_failures + w.misdirected + w.unknown_peer + self.rejected_frames,
        ) + &probes
            + &offload
    }
}
