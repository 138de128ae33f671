//! The INI sliding-window core on the deterministic simulated network: exactly-once
//! in-order delivery under loss, duplication, reordering and corruption; fragmentation;
//! sequence wrap-around; dead-peer detection; no head-of-line blocking across
//! connections; reproducibility from the seed.

use multigrain_window::sim::{Sim, SimConfig, SimStats};
use multigrain_window::{
    ConnHandle, ConnStats, EnqueueError, Event, Ini, IniAddr, IniStats, Micros, WindowConfig,
};
use proptest::prelude::*;

/// Deterministic message `i` of stream `stream`: length from `len_of`, bytes from a hash.
fn make_msg(stream: u64, i: u64, len: usize) -> Vec<u8> {
    let mut x = stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Mostly small messages, one in 64 spanning several frames.
fn small_len(stream: u64, i: u64) -> usize {
    let h = (stream ^ i.wrapping_mul(0x2545_F491_4F6C_DD1D)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    if h >> 58 == 0 {
        1 + (h % 5000) as usize
    } else {
        1 + (h % 200) as usize
    }
}

fn lossy(seed: u64) -> SimConfig {
    SimConfig {
        seed,
        latency: Micros(50),
        jitter: Micros(20),
        drop: 0.10,
        duplicate: 0.05,
        corrupt: 0.01,
        reorder: 0.05,
        reorder_delay: Micros(300),
    }
}

fn test_config() -> WindowConfig {
    WindowConfig {
        epoch: 0xC0FFEE,
        mac_key: multigrain_window::wire::MacKey::new([0x33; 32]),
        window: 64,
        send_timeout: Micros(2_000),
        ack_timeout: Micros(200),
        ack_every: 16,
        peer_timeout: Micros::from_millis(1_000),
        send_queue_capacity: 256,
        ..WindowConfig::default()
    }
}

/// One directed message stream: node `from` sends `count` messages to node `to`.
struct Stream {
    from: usize,
    to: usize,
    /// Connection handle at the sender and at the receiver.
    tx: ConnHandle,
    rx: ConnHandle,
    count: u64,
    next_send: u64,
    next_recv: u64,
    held: Option<Vec<u8>>,
    len_of: fn(u64, u64) -> usize,
}

/// Builds a simulation of `sites` sites with `inis` INIs each, every INI connected to
/// every INI of every other site, and one stream of `count` messages per connection and
/// direction.
fn mesh(
    cfg: &WindowConfig,
    net: SimConfig,
    sites: u16,
    inis: u8,
    count: u64,
    len_of: fn(u64, u64) -> usize,
) -> (Sim, Vec<Stream>) {
    let mut sim = Sim::new(net);
    let addrs: Vec<IniAddr> = (0..sites)
        .flat_map(|s| (0..inis).map(move |i| IniAddr::new(s, i)))
        .collect();
    for &a in &addrs {
        let mut ini = Ini::new(a, cfg.clone()).unwrap();
        for &b in &addrs {
            if b.site != a.site {
                ini.add_peer(b).unwrap();
            }
        }
        sim.add_node(ini);
    }
    let mut streams = Vec::new();
    for (from, &a) in addrs.iter().enumerate() {
        for (to, &b) in addrs.iter().enumerate() {
            if a.site != b.site {
                streams.push(Stream {
                    from,
                    to,
                    tx: sim.node(from).conn(b).unwrap(),
                    rx: sim.node(to).conn(a).unwrap(),
                    count,
                    next_send: 0,
                    next_recv: 0,
                    held: None,
                    len_of,
                });
            }
        }
    }
    (sim, streams)
}

/// Runs until every stream is delivered and every INI is idle, checking exactly-once,
/// in-order, byte-exact delivery on the way. Panics on an unresponsive peer.
fn run_streams(sim: &mut Sim, streams: &mut [Stream]) {
    let nodes = streams
        .iter()
        .map(|s| s.from.max(s.to) + 1)
        .max()
        .unwrap_or(0);
    loop {
        for (k, s) in streams.iter_mut().enumerate() {
            while s.next_send < s.count {
                let msg = s.held.take().unwrap_or_else(|| {
                    make_msg(k as u64, s.next_send, (s.len_of)(k as u64, s.next_send))
                });
                match sim.node_mut(s.from).enqueue(s.tx, msg) {
                    Ok(()) => s.next_send += 1,
                    Err(EnqueueError::Full(m)) => {
                        s.held = Some(m);
                        break;
                    }
                    Err(e) => panic!("enqueue failed: {e}"),
                }
            }
        }
        let progressed = sim.step();
        for node in 0..nodes {
            for ev in sim.drain_events(node) {
                match ev {
                    Event::Delivered { conn, msg } => {
                        let (k, s) = streams
                            .iter_mut()
                            .enumerate()
                            .find(|(_, s)| s.to == node && s.rx == conn)
                            .expect("delivery on a connection with no stream");
                        assert!(s.next_recv < s.count, "stream {k}: extra message");
                        let want =
                            make_msg(k as u64, s.next_recv, (s.len_of)(k as u64, s.next_recv));
                        assert!(
                            msg == want,
                            "stream {k}: message {} wrong or out of order (got len {}, want len {})",
                            s.next_recv,
                            msg.len(),
                            want.len()
                        );
                        s.next_recv += 1;
                    }
                    Event::PeerUnresponsive { peer, .. } => {
                        panic!("node {node}: {peer} reported unresponsive at {}", sim.now())
                    }
                }
            }
        }
        let delivered = streams.iter().all(|s| s.next_recv == s.count);
        if delivered && (0..nodes).all(|n| sim.node(n).is_idle()) {
            break;
        }
        assert!(
            progressed,
            "simulation stalled at {} before all messages arrived",
            sim.now()
        );
    }
    // Let late copies land and the last timers expire, so the counts below are final;
    // nothing may be delivered twice on the way.
    while sim.step() {}
    for n in 0..nodes {
        assert_eq!(sim.drain_events(n), vec![], "node {n}: late event");
        assert!(sim.node(n).is_idle());
    }
}

/// The per-connection statistics relations of `ConnStats`' doc, for a finished run.
fn check_stream_stats(sim: &Sim, s: &Stream) -> (ConnStats, ConnStats) {
    let tx = *sim.node(s.from).conn_stats(s.tx);
    let rx = *sim.node(s.to).conn_stats(s.rx);
    let distinct = tx.data_frames_sent - tx.retransmissions;
    assert_eq!(
        rx.frames_accepted, distinct,
        "each sequence number accepted exactly once"
    );
    assert_eq!(
        rx.data_frames_received,
        rx.frames_accepted + rx.duplicates + rx.out_of_window
    );
    assert_eq!(tx.msgs_enqueued, s.count);
    assert_eq!(tx.msgs_sent, s.count);
    assert_eq!(tx.msgs_acked, s.count);
    assert_eq!(rx.msgs_delivered, s.count);
    assert_eq!(tx.bytes_sent, rx.bytes_delivered);
    assert_eq!(rx.reassembly_errors, 0);
    assert!(tx.retransmissions <= tx.send_timeouts + tx.naks_received);
    (tx, rx)
}

/// Datagram-level relations between the network's and the INIs' counts.
fn check_net_stats(sim: &Sim, nodes: usize) -> IniStats {
    let net: SimStats = sim.stats();
    let mut total = IniStats::default();
    for n in 0..nodes {
        let s = sim.node(n).stats();
        total.datagrams_sent += s.datagrams_sent;
        total.datagrams_received += s.datagrams_received;
        total.bad_mac += s.bad_mac;
        total.decode_failures += s.decode_failures;
        total.wrong_epoch += s.wrong_epoch;
        total.connections.accumulate(&s.connections);
    }
    assert_eq!(net.sent, total.datagrams_sent);
    assert_eq!(net.delivered, total.datagrams_received);
    assert_eq!(
        net.delivered,
        net.sent - net.dropped - net.blackholed - net.unroutable + net.duplicated
    );
    // A flipped bit is always caught: by the magic/version check, the epoch check or
    // the MAC.
    assert_eq!(
        net.corrupted,
        total.bad_mac + total.decode_failures + total.wrong_epoch
    );
    let c = &total.connections;
    assert_eq!(
        total.datagrams_received - net.corrupted,
        c.data_frames_received - c.frames_in_batches_received
            + c.batches_received
            + c.acks_received
            + c.naks_received
    );
    assert_eq!(
        total.datagrams_sent,
        c.data_frames_sent - c.frames_in_batches_sent + c.batches_sent + c.acks_sent + c.naks_sent
    );
    assert!(c.frames_in_batches_sent >= 2 * c.batches_sent);
    total
}

#[test]
fn lossy_100k_messages_between_two_inis_arrive_exactly_once_in_order() {
    let cfg = test_config();
    let (mut sim, mut streams) = mesh(&cfg, lossy(1), 2, 1, 100_000, small_len);
    run_streams(&mut sim, &mut streams);
    for s in &streams {
        let (tx, rx) = check_stream_stats(&sim, s);
        assert!(tx.retransmissions > 0 && tx.send_timeouts > 0 && tx.naks_received > 0);
        assert!(rx.duplicates > 0 && rx.naks_sent > 0);
    }
    let total = check_net_stats(&sim, 2);
    let net = sim.stats();
    assert!(net.dropped > 0 && net.duplicated > 0 && net.corrupted > 0 && net.reordered > 0);
    assert!(total.bad_mac > 0);
    // Efficiency guards (a retransmission storm still delivers, so check it here): with
    // 11% of datagrams lost or corrupted and 5% reordered, about a sixth of the frames are
    // resent (run: 17%), and standalone ACKs stay a small fraction of DATA (run: 8%).
    let c = &total.connections;
    assert!(c.retransmissions * 4 < c.frames_accepted, "{c:?}");
    assert!(c.acks_sent * 6 < c.data_frames_sent, "{c:?}");
    // Small messages queued together travel in BATCH datagrams (`coalesce`), through
    // the same losses, duplicates, corruption and reordering.
    assert!(c.batches_sent > 0 && c.batches_received > 0, "{c:?}");
    assert!(c.frames_in_batches_sent > c.data_frames_sent / 4, "{c:?}");
}

#[test]
fn lossy_several_connections_per_ini() {
    // Two sites with three INIs each: every INI has three connections, 18 streams.
    let cfg = WindowConfig {
        window: 16,
        ack_every: 8,
        ..test_config()
    };
    let (mut sim, mut streams) = mesh(&cfg, lossy(2), 2, 3, 2_000, small_len);
    assert_eq!(streams.len(), 18);
    run_streams(&mut sim, &mut streams);
    for s in &streams {
        let (tx, _) = check_stream_stats(&sim, s);
        assert!(tx.retransmissions > 0);
    }
    let total = check_net_stats(&sim, 6);
    assert!(total.connections.duplicates > 0 && total.bad_mac > 0);
    for n in 0..6 {
        assert_eq!(sim.node(n).num_connections(), 3);
    }
}

#[test]
fn messages_of_every_size_class_are_fragmented_and_reassembled() {
    let cfg = test_config();
    let p = cfg.max_payload();
    let sizes = size_table();
    fn size_table() -> [usize; 11] {
        let c = WindowConfig::default();
        let (p, mtu) = (c.max_payload(), c.mtu);
        [
            0,
            1,
            p - 1,
            p,
            p + 1,
            mtu - 1,
            mtu,
            mtu + 1,
            3 * p,
            1 << 20,
            (1 << 20) + 7,
        ]
    }
    fn len_table(_stream: u64, i: u64) -> usize {
        size_table()[i as usize]
    }
    assert_eq!(
        (cfg.mtu, p),
        (
            WindowConfig::default().mtu,
            WindowConfig::default().max_payload()
        )
    );
    let (mut sim, mut streams) = mesh(&cfg, lossy(3), 2, 1, sizes.len() as u64, len_table);
    run_streams(&mut sim, &mut streams);
    let frames: u64 = sizes.iter().map(|&n| n.div_ceil(p).max(1) as u64).sum();
    for s in &streams {
        let (tx, rx) = check_stream_stats(&sim, s);
        assert_eq!(tx.data_frames_sent - tx.retransmissions, frames);
        assert_eq!(rx.bytes_delivered, sizes.iter().sum::<usize>() as u64);
    }
    check_net_stats(&sim, 2);
}

#[test]
fn sequence_numbers_wrap_around() {
    let start = u32::MAX - 300;
    let cfg = WindowConfig {
        initial_seq: start,
        window: 32,
        ..test_config()
    };
    let (mut sim, mut streams) = mesh(&cfg, lossy(4), 2, 1, 3_000, small_len);
    run_streams(&mut sim, &mut streams);
    for s in &streams {
        let (tx, _) = check_stream_stats(&sim, s);
        let used = (tx.data_frames_sent - tx.retransmissions) as u32;
        assert!(used > 301, "the run must cross the wrap");
        let next = sim.node(s.from).next_seq(s.tx);
        assert_eq!(next, start.wrapping_add(used));
        assert!(next < start, "sequence numbers wrapped past 2^32");
        assert_eq!(sim.node(s.to).expected_seq(s.rx), next);
    }
    check_net_stats(&sim, 2);
}

fn dead_peer_sim(cfg: &WindowConfig) -> (Sim, ConnHandle) {
    let mut sim = Sim::new(lossy(5));
    let a = IniAddr::new(0, 0);
    let b = IniAddr::new(1, 0);
    let mut ini_a = Ini::new(a, cfg.clone()).unwrap();
    let conn = ini_a.add_peer(b).unwrap();
    let mut ini_b = Ini::new(b, cfg.clone()).unwrap();
    ini_b.add_peer(a).unwrap();
    sim.add_node(ini_a);
    sim.add_node(ini_b);
    (sim, conn)
}

#[test]
fn dead_peer_is_reported_at_the_peer_timeout() {
    let cfg = test_config();
    let (mut sim, conn) = dead_peer_sim(&cfg);
    // Some traffic first, so the peer is known alive, then it dies.
    for i in 0..50 {
        sim.node_mut(0).enqueue(conn, make_msg(0, i, 100)).unwrap();
    }
    assert!(sim.run_until(|s| s.node(0).is_idle() && s.node(1).is_idle()));
    assert_eq!(sim.drain_events(1).len(), 50);
    sim.set_blackhole(1, true);
    let sent_at = sim.now();
    for i in 0..200 {
        sim.node_mut(0).enqueue(conn, make_msg(1, i, 3000)).unwrap();
    }
    let mut reported = None;
    sim.run_until(|s| {
        if let Some(Event::PeerUnresponsive { conn: c, peer }) = s.node_mut(0).poll_event() {
            assert_eq!((c, peer), (conn, IniAddr::new(1, 0)));
            reported = Some(s.now());
        }
        reported.is_some()
    });
    let at = reported.expect("dead peer never reported");
    assert_eq!(
        at,
        sent_at + cfg.peer_timeout,
        "reported exactly at the peer timeout"
    );
    assert!(sim.node(0).is_unresponsive(conn));
    assert!(sim.node(0).stats().connections.send_timeouts > 0);
    // Nothing is dropped: enqueue hands messages back, and every unacknowledged message
    // comes back in order.
    let back = sim.node_mut(0).enqueue(conn, vec![9; 10]).unwrap_err();
    assert!(matches!(back, EnqueueError::PeerUnresponsive(_)));
    assert_eq!(back.into_inner(), vec![9; 10]);
    let unacked = sim.node_mut(0).take_unacknowledged(conn);
    assert_eq!(unacked.len(), 200);
    for (i, m) in unacked.iter().enumerate() {
        assert!(*m == make_msg(1, i as u64, 3000));
    }
    // Reported once; afterwards the INI goes quiet instead of retransmitting forever.
    let mut steps = 0;
    while sim.step() {
        steps += 1;
        assert!(
            steps < 1_000,
            "an unresponsive connection keeps its timers running"
        );
    }
    assert_eq!(sim.drain_events(0), vec![]);
    assert_eq!(sim.node_mut(0).poll_timeout(), None);
}

/// One frame to a dead peer with `max_retransmits = 3`: when the peer is declared
/// unresponsive, and the sender's counters then.
fn give_up_after_three_retransmits(adaptive_timeout: bool) -> (Option<Micros>, ConnStats) {
    let cfg = WindowConfig {
        max_retransmits: Some(3),
        peer_timeout: Micros::from_millis(60_000),
        adaptive_timeout,
        ..test_config()
    };
    let (mut sim, conn) = dead_peer_sim(&cfg);
    sim.set_blackhole(1, true);
    sim.node_mut(0).enqueue(conn, vec![1; 10]).unwrap();
    let mut at = None;
    sim.run_until(|s| {
        if let Some(Event::PeerUnresponsive { .. }) = s.node_mut(0).poll_event() {
            at = Some(s.now());
        }
        at.is_some()
    });
    (at, *sim.node(0).conn_stats(conn))
}

#[test]
fn dead_peer_is_reported_after_max_retransmits() {
    let (at, s) = give_up_after_three_retransmits(true);
    let st = test_config().send_timeout.0;
    // Sent at 0; each expiry doubles the retransmission timeout (no round trip was
    // measured), so the frame is resent at 1, 3 and 7 SEND timeouts, and the 4th expiry,
    // at 15, gives up (having doubled it a 4th time).
    assert_eq!(at, Some(Micros(15 * st)));
    assert_eq!(
        (
            s.data_frames_sent,
            s.retransmissions,
            s.send_timeouts,
            s.rto_backoffs
        ),
        (4, 3, 4, 4)
    );
}

/// Streams 5,000 messages of 100 bytes from node 0 to node 1 over `net`; returns the
/// simulated time it took and the sender's counters.
fn stream(net: SimConfig, adaptive_timeout: bool) -> (Micros, ConnStats) {
    stream_msgs(net, adaptive_timeout, 5_000, Micros::from_millis(60_000))
}

/// Streams `msgs` messages of 100 bytes from node 0 to node 1 over `net` with the
/// given peer timeout; returns the simulated time it took and the sender's counters.
fn stream_msgs(
    net: SimConfig,
    adaptive_timeout: bool,
    msgs: u64,
    peer_timeout: Micros,
) -> (Micros, ConnStats) {
    let cfg = WindowConfig {
        adaptive_timeout,
        peer_timeout,
        ..test_config()
    };
    let mut sim = Sim::new(net);
    let (a, b) = (IniAddr::new(0, 0), IniAddr::new(1, 0));
    let mut ini_a = Ini::new(a, cfg.clone()).unwrap();
    let conn = ini_a.add_peer(b).unwrap();
    let mut ini_b = Ini::new(b, cfg).unwrap();
    ini_b.add_peer(a).unwrap();
    sim.add_node(ini_a);
    sim.add_node(ini_b);
    let (mut next, mut got) = (0, 0);
    assert!(sim.run_until(|s| {
        while next < msgs && s.node_mut(0).enqueue(conn, make_msg(0, next, 100)).is_ok() {
            next += 1;
        }
        got += s.drain_events(1).len();
        got == msgs as usize && s.node(0).is_idle()
    }));
    (sim.now(), *sim.node(0).conn_stats(conn))
}

/// Random loss (10 % of datagrams) must not make the adaptive timeout back off into
/// long stalls: a frame held back by a lost one is acknowledged late by the cumulative
/// ACK, and sampling its round trip there (rather than at its selective ACK) once made
/// the timeout grow with every hole (the loopback stream of `multigrain-messaging`'s
/// fault test: 3 s → 45 s).
#[test]
fn random_loss_costs_the_adaptive_timeout_little_more_than_the_fixed_one() {
    let (fixed, _) = stream(lossy(21), false);
    let (adaptive, s) = stream(lossy(21), true);
    assert!(s.rto_backoffs > 0 && s.rtt_samples > 0, "{s:?}");
    assert!(
        adaptive.0 <= 2 * fixed.0,
        "adaptive {adaptive} against fixed {fixed}: {s:?}"
    );
}

/// Streams 2,000 messages of 100 bytes from node 0 to node 1 over a lossless network
/// whose round trip (6 ms) is three SEND timeouts, and returns the sender's counters.
fn stream_over_a_slow_link(adaptive_timeout: bool) -> ConnStats {
    let net = SimConfig {
        latency: Micros(3_000),
        ..SimConfig::lossless(8)
    };
    stream_msgs(net, adaptive_timeout, 2_000, Micros::from_millis(10_000)).1
}

/// A round trip longer than the SEND timeout: the fixed timeout resends every frame
/// (the peer holds them all: spurious retransmissions); the adaptive one learns the
/// round trip within the first loss episode (the first window expires, and its
/// retransmissions once more before their ACKs, which Karn's rule cannot time) and
/// resends nothing more.
#[test]
fn an_adaptive_timeout_learns_a_round_trip_longer_than_the_send_timeout() {
    let fixed = stream_over_a_slow_link(false);
    assert!(
        fixed.retransmissions >= 2_000,
        "a fixed 2 ms timeout under a 6 ms round trip resends every frame: {fixed:?}"
    );
    assert_eq!(fixed.rto_backoffs, 0);
    let adaptive = stream_over_a_slow_link(true);
    assert!(
        adaptive.retransmissions <= 2 * u64::from(test_config().window),
        "only the first window is resent: {adaptive:?}"
    );
    assert!(
        adaptive.rto_backoffs >= 1 && adaptive.rtt_samples > 0,
        "{adaptive:?}"
    );
    assert_eq!(adaptive.msgs_acked, 2_000);
}

/// With the thesis' fixed SEND timeout the frame is resent every timeout.
#[test]
fn dead_peer_is_reported_after_max_retransmits_of_a_fixed_timeout() {
    let (at, s) = give_up_after_three_retransmits(false);
    // Sent at 0, retransmitted at 1, 2, 3 SEND timeouts; the 4th expiry gives up.
    assert_eq!(at, Some(Micros(4 * test_config().send_timeout.0)));
    assert_eq!(
        (
            s.data_frames_sent,
            s.retransmissions,
            s.send_timeouts,
            s.rto_backoffs
        ),
        (4, 3, 4, 0)
    );
}

#[test]
fn peer_silent_shorter_than_the_timeout_is_not_reported() {
    let cfg = test_config();
    let (mut sim, conn) = dead_peer_sim(&cfg);
    sim.set_blackhole(1, true);
    for i in 0..100 {
        sim.node_mut(0).enqueue(conn, make_msg(2, i, 500)).unwrap();
    }
    let until = Micros(cfg.peer_timeout.0 * 9 / 10);
    sim.run_until(|s| s.now() >= until);
    sim.set_blackhole(1, false);
    assert!(sim.run_until(|s| s.node(0).is_idle() && s.node(1).is_idle()));
    assert!(!sim.node(0).is_unresponsive(conn));
    let got = sim.drain_events(1);
    assert_eq!(got.len(), 100);
    assert_eq!(sim.drain_events(0), vec![]);
}

#[test]
fn full_window_on_one_connection_does_not_block_another() {
    // Node 0 talks to nodes 1 and 2; node 1 is dead, so its connection's window fills.
    let cfg = WindowConfig {
        window: 8,
        ack_every: 2,
        ..test_config()
    };
    let mut sim = Sim::new(SimConfig::lossless(6));
    let addrs = [IniAddr::new(0, 0), IniAddr::new(1, 0), IniAddr::new(2, 0)];
    for &a in &addrs {
        let mut ini = Ini::new(a, cfg.clone()).unwrap();
        for &b in &addrs {
            if b != a {
                ini.add_peer(b).unwrap();
            }
        }
        sim.add_node(ini);
    }
    let to1 = sim.node(0).conn(addrs[1]).unwrap();
    let to2 = sim.node(0).conn(addrs[2]).unwrap();
    sim.set_blackhole(1, true);
    // The slow connection's messages are enqueued first.
    for i in 0..50 {
        sim.node_mut(0).enqueue(to1, make_msg(1, i, 64)).unwrap();
    }
    for i in 0..50 {
        sim.node_mut(0).enqueue(to2, make_msg(2, i, 64)).unwrap();
    }
    // Before the first SEND timeout to the dead peer, everything for node 2 has arrived.
    let deadline = cfg.send_timeout;
    assert!(sim.run_until(|s| s.node(0).conn_stats(to2).msgs_acked == 50 || s.now() >= deadline));
    assert!(sim.now() < deadline);
    assert_eq!(sim.node(2).stats().connections.msgs_delivered, 50);
    assert_eq!(
        sim.node(0).in_flight(to1),
        8,
        "window to the dead peer is full"
    );
    assert_eq!(sim.node(0).queued(to1), 42);
    assert_eq!(sim.node(0).total_queued(), 42);
    let got: Vec<Vec<u8>> = sim
        .drain_events(2)
        .into_iter()
        .map(|e| match e {
            Event::Delivered { msg, .. } => msg,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(got, (0..50).map(|i| make_msg(2, i, 64)).collect::<Vec<_>>());
}

/// Everything observable about a finished run.
fn fingerprint(seed: u64) -> (Micros, SimStats, Vec<IniStats>) {
    let cfg = test_config();
    let (mut sim, mut streams) = mesh(&cfg, lossy(seed), 2, 2, 500, small_len);
    run_streams(&mut sim, &mut streams);
    let stats = (0..4).map(|n| sim.node(n).stats()).collect();
    (sim.now(), sim.stats(), stats)
}

#[test]
fn same_seed_gives_an_identical_run() {
    let a = fingerprint(77);
    let b = fingerprint(77);
    assert_eq!(a, b);
    let c = fingerprint(78);
    assert_ne!(a, c, "another seed gives another run");
}

#[test]
fn timers_go_quiet_when_traffic_stops() {
    let cfg = test_config();
    let (mut sim, mut streams) = mesh(&cfg, lossy(9), 2, 1, 300, small_len);
    run_streams(&mut sim, &mut streams);
    // With nothing in flight every timer record is cancelled: the simulation drains.
    let mut steps = 0;
    while sim.step() {
        steps += 1;
        assert!(steps < 10_000, "timers keep firing on an idle INI");
    }
    for n in 0..2 {
        assert_eq!(sim.node_mut(n).poll_timeout(), None);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_faults_still_deliver_exactly_once_in_order(
        seed in any::<u64>(),
        drop in 0.0f64..0.3,
        duplicate in 0.0f64..0.2,
        corrupt in 0.0f64..0.05,
        reorder in 0.0f64..0.3,
        window in 1u32..40,
        nak in any::<bool>(),
        initial_seq in any::<u32>(),
    ) {
        let cfg = WindowConfig {
            window,
            ack_every: window.div_ceil(2),
            nak,
            initial_seq,
            peer_timeout: Micros::from_millis(60_000),
            ..test_config()
        };
        let net = SimConfig { drop, duplicate, corrupt, reorder, ..lossy(seed) };
        let (mut sim, mut streams) = mesh(&cfg, net, 2, 1, 150, small_len);
        run_streams(&mut sim, &mut streams);
        for s in &streams {
            check_stream_stats(&sim, s);
        }
        check_net_stats(&sim, 2);
    }
}
