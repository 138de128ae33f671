//! The INI path on loopback, two or more sites in one process: every message kind crosses
//! real UDP sockets through INI threads; order per sending endpoint survives every
//! scheduling policy; with injected drops, duplicates, reordering and corruption every
//! message still arrives exactly once and in order; a peer that stops answering is
//! reported within the peer timeout.

use multigrain_cluster_config::{FaultConfig, IniPolicy, JobConfig};
use multigrain_messaging::net::{self, IniGroup, NetConfig};
use multigrain_messaging::*;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(60);

struct Cluster {
    site: Site,
    inis: IniGroup,
}

/// `n` sites in this process, each with `k` INIs on 127.0.0.1, all reached over UDP.
fn clusters(
    n: usize,
    k: usize,
    policy: IniPolicy,
    faults: FaultConfig,
    tweak: impl Fn(&mut NetConfig),
) -> Vec<Cluster> {
    let mut job = JobConfig::local(n, 1);
    job.ini.per_cluster = k;
    job.ini.policy = policy;
    job.faults = faults;
    job.job.peer_timeout_ms = 2000;
    let mut cfg = NetConfig::from_job(&job);
    tweak(&mut cfg);
    let sites: Vec<Site> = (0..n)
        .map(|s| {
            Site::new(SiteConfig {
                site: SiteId(s as u16),
                queues: vec![QueueSpec::default(); 2],
                pool_slots: 2048,
                ..SiteConfig::default()
            })
            .unwrap()
        })
        .collect();
    let groups = net::connect_loopback(&sites, &cfg, k).unwrap();
    sites
        .into_iter()
        .zip(groups)
        .map(|(site, inis)| Cluster { site, inis })
        .collect()
}

/// An endpoint of `c` receiving on queue `own`; name `s` leads to queue `to_queue` of site `s`.
fn endpoint(c: &Cluster, own: u16, to_queue: u16, sites: usize) -> Endpoint {
    let (ep, w) = c.site.create_endpoint(&[QueueId(own)]).unwrap();
    for s in 0..sites {
        w.map(
            VirtualName(s as u16),
            Destination {
                site: SiteId(s as u16),
                queue: QueueId(to_queue),
                source: SourceId::new(c.site.id().0).unwrap(),
            },
        )
        .unwrap();
    }
    std::mem::forget(w); // the table stays as mapped for the endpoint's life
    ep
}

fn recv(ep: &Endpoint, what: &str) -> Message {
    ep.recv_timeout(TIMEOUT)
        .unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

#[test]
fn every_message_kind_crosses_the_network() {
    let cs = clusters(2, 1, IniPolicy::Static, FaultConfig::default(), |_| {});
    let a = endpoint(&cs[0], 0, 1, 2);
    let b = endpoint(&cs[1], 1, 0, 2);
    assert_eq!(cs[0].site.substrate(SiteId(1)), Some(Substrate::Network));
    assert!(a.reaches_over_network(VirtualName(1)), "the other site");
    assert!(!a.reaches_over_network(VirtualName(0)), "its own site");
    assert!(!a.reaches_over_network(VirtualName(7)), "an unmapped name");
    a.send_express(VirtualName(1), Express::new(Handler(3), 77).unwrap())
        .unwrap();
    let mut buf = a.alloc().unwrap();
    let page: Vec<u8> = (0..4096).map(|i| (i * 13) as u8).collect();
    buf.fill(&page);
    buf.set_tag(0xabc);
    a.send_tag_on(VirtualName(1), Handler(4), buf).unwrap();
    a.send_basic(VirtualName(1), Handler(5), b"basic over udp")
        .unwrap();
    let Message::Express(e) = recv(&b, "Express") else {
        panic!("not Express")
    };
    assert_eq!((e.handler, e.source.get(), e.payload), (Handler(3), 0, 77));
    let Message::TagOn(t) = recv(&b, "Tag-On") else {
        panic!("not Tag-On")
    };
    assert_eq!(
        (t.handler, t.data.tag(), *t.data == page[..]),
        (Handler(4), 0xabc, true)
    );
    assert_eq!(
        t.data.location().0,
        1,
        "the data now lives in the receiving site's pool"
    );
    drop(t);
    let Message::Basic(m) = recv(&b, "Basic") else {
        panic!("not Basic")
    };
    assert_eq!((m.handler, m.data()), (Handler(5), &b"basic over udp"[..]));
    // Sent only now: Basic messages have a ring of their own, which OnePoll reads after
    // the Express ring (where bulk fragments land), so a bulk message that had arrived
    // whole before this receive would come first (a loaded CI machine did that).
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    a.send_bulk(VirtualName(1), Handler(6), &big, Some(TIMEOUT), |_| {})
        .unwrap();
    let Message::Bulk(m) = recv(&b, "bulk") else {
        panic!("not bulk")
    };
    assert!(m.data == big);
    // The reply travels back through the source id.
    b.reply_express(e.source, Express::new(Handler(7), 1).unwrap())
        .unwrap();
    assert_eq!(recv(&a, "reply").handler(), Handler(7));
    let stats = cs[0].site.stats();
    assert_eq!(
        stats.substrate.network,
        4 + 49,
        "four messages, the bulk one in 49 fragments"
    );
    assert_eq!(
        cs[0].site.pool().free_slots(),
        2048,
        "the INI released every sent buffer"
    );
    drain_all(&cs, Duration::from_secs(10));
    for c in cs {
        let reports = c.inis.shutdown(Duration::from_secs(10)).unwrap();
        assert!(reports[0].messages > 0 && reports[0].window.bad_mac == 0);
    }
}

#[test]
fn an_inline_sender_does_not_wake_the_sleeping_ini_thread() {
    // Inline INIs (the default): the sending thread runs the INI's pass itself, so the
    // INI thread, asleep between messages, is not woken for each one (it was, with an
    // eventfd write per message, before the pass ran).
    let cs = clusters(2, 1, IniPolicy::Static, FaultConfig::default(), |c| {
        assert!(c.inline, "the default");
    });
    let a = endpoint(&cs[0], 0, 1, 2);
    let b = endpoint(&cs[1], 1, 0, 2);
    const N: u64 = 50;
    for i in 0..N {
        // Long enough for the INI thread to handle the last ACK and fall asleep.
        std::thread::sleep(Duration::from_millis(3));
        a.send_express(VirtualName(1), Express::new(Handler(3), i).unwrap())
            .unwrap();
        let Message::Express(e) = recv(&b, "Express") else {
            panic!("not Express")
        };
        assert_eq!(e.payload, i, "in order");
    }
    drop((a, b));
    drain_all(&cs, Duration::from_secs(10));
    let reports: Vec<_> = cs
        .into_iter()
        .map(|c| c.inis.shutdown(Duration::from_secs(10)).unwrap())
        .collect();
    let sender = &reports[0][0];
    assert!(sender.messages >= N, "{} messages", sender.messages);
    assert_eq!(
        sender.sender_wakeups, 0,
        "the sending thread's own passes took every message"
    );
}

/// Waits until every cluster's INIs have had everything acknowledged, while all of them
/// still run, as `Job::finish` does before its drained barrier. Shutting clusters down one
/// by one without this can strand the last frame of a later cluster: its ACK, sent by an
/// earlier cluster that then stopped, may have been lost, and nobody is left to ACK the
/// retransmission.
fn drain_all(cs: &[Cluster], timeout: Duration) {
    for (i, c) in cs.iter().enumerate() {
        c.inis
            .drain(timeout)
            .unwrap_or_else(|e| panic!("cluster {i}: {e}"));
    }
}

/// `senders` endpoints per site send `per` Express messages to every other site's queue 0;
/// every message must arrive exactly once and in order per (sender, destination).
fn all_to_all(cs: &[Cluster], senders: usize, per: u64) {
    let n = cs.len();
    std::thread::scope(|scope| {
        for (s, c) in cs.iter().enumerate() {
            for t in 0..senders {
                let ep = endpoint(c, 1, 0, n);
                ep.set_thread_index(t);
                scope.spawn(move || {
                    for i in 0..per {
                        for d in (0..n).filter(|&d| d != s) {
                            let payload = ((t as u64) << 32) | i;
                            ep.send_express_blocking(
                                VirtualName(d as u16),
                                Express::new(Handler(s as u8), payload).unwrap(),
                                Some(TIMEOUT),
                                |_| {},
                            )
                            .unwrap();
                        }
                    }
                });
            }
            let rx = endpoint(c, 0, 0, n);
            scope.spawn(move || {
                let expected = (n as u64 - 1) * senders as u64 * per;
                let mut next = vec![vec![0u64; senders]; n];
                let deadline = Instant::now() + TIMEOUT;
                let mut got = 0;
                while got < expected {
                    assert!(
                        Instant::now() < deadline,
                        "site {s} received {got} of {expected}"
                    );
                    let Some(Message::Express(m)) = rx.recv_timeout(Duration::from_millis(100))
                    else {
                        continue;
                    };
                    let (from, t, i) = (
                        usize::from(m.handler.0),
                        (m.payload >> 32) as usize,
                        m.payload & 0xffff_ffff,
                    );
                    assert_eq!(
                        i, next[from][t],
                        "site {s}: message from site {from} sender {t} out of order or duplicated"
                    );
                    next[from][t] += 1;
                    got += 1;
                }
            });
        }
    });
}

#[test]
fn order_per_sender_survives_every_policy_with_two_inis() {
    for policy in [
        IniPolicy::Static,
        IniPolicy::RoundRobin,
        IniPolicy::LeastLoaded,
    ] {
        let cs = clusters(3, 2, policy, FaultConfig::default(), |_| {});
        all_to_all(&cs, 2, 5_000);
        drain_all(&cs, Duration::from_secs(10));
        for c in cs {
            let r = c.inis.shutdown(Duration::from_secs(10)).unwrap();
            if policy == IniPolicy::Static {
                // Two senders, two INIs: each thread has its own INI.
                assert!(r.iter().all(|x| x.messages > 0), "{policy}: {r:?}");
            }
        }
    }
}

#[test]
fn injected_faults_lose_nothing() {
    let faults = FaultConfig {
        drop: 0.10,
        duplicate: 0.05,
        reorder: 0.05,
        corrupt: 0.01,
        seed: 42,
    };
    let cs = clusters(2, 1, IniPolicy::Static, faults, |c| {
        c.window.peer_timeout = multigrain_messaging::window::Micros::from_millis(20_000)
    });
    all_to_all(&cs, 1, 100_000);
    drain_all(&cs, Duration::from_secs(20));
    let mut retx = 0;
    let mut rejected = 0;
    let mut injected = 0;
    let mut datagrams = 0;
    for c in cs {
        for r in c.inis.shutdown(Duration::from_secs(20)).unwrap() {
            datagrams += r.window.datagrams_sent;
            retx += r.window.connections.retransmissions;
            rejected += r.window.bad_mac
                + r.window.wrong_epoch
                + r.window.decode_failures
                + r.window.connections.duplicates;
            injected += r.injected.dropped + r.injected.corrupted + r.injected.duplicated;
        }
    }
    // About 16 % of the datagrams meet a drop, a duplicate or a corruption (fewer
    // datagrams than messages: small ones share a datagram, `ini.coalesce`).
    assert!(
        injected > 5_000 && injected * 10 > datagrams,
        "faults were injected: {injected} in {datagrams} datagrams"
    );
    assert!(
        retx > 0 && rejected > 0,
        "retransmissions {retx}, rejected datagrams {rejected}"
    );
}

/// A datagram the fault shim holds back for reordering goes to the peer it was written
/// for, even when a datagram for another peer releases it: with three sites each INI
/// has two peers, and none of them ever hears a datagram meant for the other.
#[test]
fn reordered_datagrams_reach_their_own_peer() {
    let faults = FaultConfig {
        reorder: 0.2,
        seed: 5,
        ..FaultConfig::default()
    };
    let cs = clusters(3, 1, IniPolicy::Static, faults, |_| {});
    all_to_all(&cs, 1, 5_000);
    drain_all(&cs, Duration::from_secs(20));
    let (mut reordered, mut strays) = (0, 0);
    for c in cs {
        for r in c.inis.shutdown(Duration::from_secs(20)).unwrap() {
            reordered += r.injected.reordered;
            strays += r.window.misdirected + r.window.unknown_source + r.window.unknown_peer;
        }
    }
    assert!(reordered > 100, "datagrams were reordered: {reordered}");
    assert_eq!(
        strays, 0,
        "datagrams heard by a peer they were not written for"
    );
}

#[test]
fn a_silent_peer_is_reported_within_the_timeout() {
    let mut cs = clusters(2, 1, IniPolicy::Static, FaultConfig::default(), |c| {
        c.window.peer_timeout = multigrain_messaging::window::Micros::from_millis(500)
    });
    let a = endpoint(&cs[0], 0, 0, 2);
    let dead = cs.pop().unwrap();
    drop(dead); // its INIs stop: nothing will acknowledge
    let t0 = Instant::now();
    a.send_express(VirtualName(1), Express::new(Handler(1), 1).unwrap())
        .unwrap();
    while cs[0].inis.failure().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "silent peer not reported"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let (site, reason) = cs[0].inis.failure().unwrap();
    assert_eq!(site, SiteId(1));
    assert!(reason.contains("cluster 1"), "{reason}");
    assert!(
        t0.elapsed() >= Duration::from_millis(500),
        "not before the timeout"
    );
    // Later sends to the dead site come back to the sender as errors.
    assert!(matches!(
        a.send_express(VirtualName(1), Express::new(Handler(1), 2).unwrap()),
        Err(SendError::Unreachable(..))
    ));
}

#[test]
fn emulated_latency_delays_each_way() {
    let cs = clusters(2, 1, IniPolicy::Static, FaultConfig::default(), |c| {
        c.emulation.latency_us = 2000.0
    });
    let a = endpoint(&cs[0], 0, 0, 2);
    let b = endpoint(&cs[1], 0, 0, 2);
    let t0 = Instant::now();
    a.send_express(VirtualName(1), Express::new(Handler(1), 0).unwrap())
        .unwrap();
    let m = recv(&b, "ping");
    b.reply_express(m.source(), Express::new(Handler(1), 0).unwrap())
        .unwrap();
    recv(&a, "pong");
    assert!(
        t0.elapsed() >= Duration::from_millis(4),
        "L = 2 ms each way, round trip {:?}",
        t0.elapsed()
    );
}

/// A peer whose INIs are bound to every address (cluster 0 of a launcher-placed job) is
/// reached at one of its addresses but answers from whichever the kernel picks: here
/// site 1 is bound to 0.0.0.0 and known to site 0 as 127.0.0.2, and its datagrams come
/// from 127.0.0.1. Heard only at exactly its registered address, it is dropped as an
/// unknown source; listed in `any_ip_peers`, it is heard on its port — its send port
/// with connected sending sockets (`ini.connected_sends`), else its receive port.
#[test]
fn peers_bound_to_every_address_are_heard_on_their_port() {
    for (relaxed, connected) in [(false, true), (true, true), (false, false), (true, false)] {
        let mut job = JobConfig::local(2, 1);
        job.job.peer_timeout_ms = 20_000;
        let mut cfg = NetConfig::from_job(&job);
        cfg.window.epoch = 0x1234;
        cfg.window.mac_key = multigrain_messaging::window::wire::MacKey::new([9; 32]);
        let sites: Vec<Site> = (0..2)
            .map(|s| {
                Site::new(SiteConfig {
                    site: SiteId(s),
                    queues: vec![QueueSpec::default(); 2],
                    pool_slots: 64,
                    ..SiteConfig::default()
                })
                .unwrap()
            })
            .collect();
        let b0 = net::BoundInis::bind(SiteId(0), "127.0.0.1", 0, 1, connected).unwrap();
        let b1 = net::BoundInis::bind(SiteId(1), "0.0.0.0", 0, 1, connected).unwrap();
        let e0 = b0.endpoints()[0];
        let mut e1 = b1.endpoints()[0];
        assert_eq!(e1.sends_from.is_some(), connected);
        let to_127_0_0_2 = |a: &mut std::net::SocketAddr| {
            assert!(a.ip().is_unspecified());
            a.set_ip(std::net::Ipv4Addr::new(127, 0, 0, 2).into());
        };
        to_127_0_0_2(&mut e1.addr);
        e1.sends_from.as_mut().map(to_127_0_0_2);
        let mut cfg0 = cfg.clone();
        if relaxed {
            cfg0.any_ip_peers = std::iter::once(e1.addr).chain(e1.sends_from).collect();
        }
        let g0 = b0.start(&sites[0], &cfg0, &[None, Some(vec![e1])]).unwrap();
        let g1 = b1.start(&sites[1], &cfg, &[Some(vec![e0]), None]).unwrap();
        let cs = [
            Cluster {
                site: sites[0].clone(),
                inis: g0,
            },
            Cluster {
                site: sites[1].clone(),
                inis: g1,
            },
        ];
        let p0 = endpoint(&cs[0], 0, 1, 2);
        let p1 = endpoint(&cs[1], 1, 0, 2);
        p0.send_express(VirtualName(1), Express::new(Handler(1), 5).unwrap())
            .unwrap();
        assert!(matches!(recv(&p1, "0 → 1"), Message::Express(_)));
        p1.send_express(VirtualName(0), Express::new(Handler(1), 6).unwrap())
            .unwrap();
        let back = p0.recv_timeout(Duration::from_millis(if relaxed { 20_000 } else { 500 }));
        let unknown = cs[0].inis.reports()[0].window.unknown_source;
        if relaxed {
            assert!(matches!(back, Some(Message::Express(_))), "1 → 0 heard");
            assert_eq!(unknown, 0);
        } else {
            assert!(back.is_none(), "1 → 0 must not be heard from 127.0.0.1");
            assert!(unknown > 0, "dropped as unknown source");
        }
    }
}

/// Sends 20 bulk messages of 40 fragments from site 0 to site 1 of `cs` over their INIs,
/// checks that each arrives intact, and returns every INI's report (site 0's first).
fn bulk_stream(cs: Vec<Cluster>) -> Vec<net::IniReport> {
    let a = endpoint(&cs[0], 0, 1, 2);
    let b = endpoint(&cs[1], 1, 0, 2);
    let big: Vec<u8> = (0..40 * 4080u32).map(|i| (i % 253) as u8).collect();
    for _ in 0..20 {
        a.send_bulk(VirtualName(1), Handler(6), &big, Some(TIMEOUT), |_| {})
            .unwrap();
        let Message::Bulk(m) = recv(&b, "bulk") else {
            panic!("not bulk")
        };
        assert!(m.data == big);
    }
    drop((a, b));
    cs.into_iter()
        .flat_map(|c| c.inis.shutdown(Duration::from_secs(20)).unwrap())
        .collect()
}

/// [`bulk_stream`] with a 8972-byte MTU; site 0's (DATA frames sent, BATCH datagrams
/// sent, datagrams sent).
fn bulk_stream_counts(coalesce: bool) -> (u64, u64, u64) {
    let r = bulk_stream(clusters(
        2,
        1,
        IniPolicy::Static,
        FaultConfig::default(),
        |c| {
            c.window.mtu = 8972;
            c.window.coalesce = coalesce;
        },
    ));
    let c = &r[0].window.connections;
    (
        c.data_frames_sent,
        c.batches_sent,
        r[0].window.datagrams_sent,
    )
}

#[test]
fn bulk_fragments_share_datagrams_when_they_fit() {
    // Two 4 KiB fragments fit one 8972-byte datagram; a bulk message's fragments reach
    // the INI together (`RemoteRoute::submit`'s `more`), so the pass that sends them
    // packs them into BATCH datagrams (`ini.coalesce`).
    let (frames, batches, datagrams) = bulk_stream_counts(true);
    assert!(frames >= 800, "{frames} frames");
    assert!(batches > 0, "no BATCH among {datagrams} datagrams");
    // About two frames per datagram (runs here: 400–416 datagrams for 800 frames).
    assert!(
        datagrams * 4 <= frames * 3,
        "{datagrams} datagrams for {frames} frames"
    );
    // Off: one frame per datagram (ACKs add some).
    let (frames, batches, datagrams) = bulk_stream_counts(false);
    assert_eq!(batches, 0);
    assert!(
        datagrams >= frames,
        "{datagrams} datagrams for {frames} frames"
    );
}

/// [`bulk_stream`] at the default 1,472-byte MTU (three datagrams per 4 KiB fragment)
/// with `ini.offload` as given: the two INIs' reports, sender first.
fn offload_stream(offload: bool) -> Vec<net::IniReport> {
    bulk_stream(clusters(
        2,
        1,
        IniPolicy::Static,
        FaultConfig::default(),
        |c| {
            c.window.mtu = 1472;
            c.offload = offload;
        },
    ))
}

#[test]
fn segmentation_offload_sends_and_reads_runs_of_datagrams() {
    // The fragments of a bulk message reach the INI together; the window releases up
    // to a window's worth of their datagrams at once, which leave in segmented sends
    // and arrive in coalesced reads (Linux GSO and GRO on loopback).
    let r = offload_stream(true);
    let (tx, rx) = (&r[0], &r[1]);
    assert!(
        tx.offload.sends > 0 && tx.offload.sent_datagrams >= 2 * tx.offload.sends,
        "sender: {:?}",
        tx.offload
    );
    // Most of the stream's data datagrams left in batches (runs here: 800–804 sends
    // carried 2,336–2,347 of 2,400–2,411: a 4 KiB fragment's three datagrams, the last
    // one shorter, which ends its batch).
    assert!(
        tx.offload.sent_datagrams * 2 >= tx.window.connections.data_frames_sent,
        "{} of {} data frames in segmented sends",
        tx.offload.sent_datagrams,
        tx.window.connections.data_frames_sent
    );
    assert!(
        rx.offload.reads > 0 && rx.offload.read_datagrams >= 2 * rx.offload.reads,
        "receiver: {:?}",
        rx.offload
    );
    assert!(tx.line().contains("offload:"), "{}", tx.line());
    // Off: one system call per datagram, nothing counted.
    let r = offload_stream(false);
    for ini in &r {
        assert_eq!(ini.offload, net::OffloadStats::default());
        assert!(!ini.line().contains("offload:"));
    }
}

#[test]
fn a_spinning_receiver_reads_the_network_at_every_pass() {
    // Receive polls read the sockets once in 2^30 here (paper 000 §3.4's interval at
    // its bound; minutes of polls), except in a blocking receive's spin.
    let every = 1 << 30;
    let cs = clusters(2, 1, IniPolicy::Static, FaultConfig::default(), |c| {
        c.poll = poll::PollBounds::new(every, every)
    });
    let mut b = endpoint(&cs[1], 1, 0, 2);
    let polls = || cs[1].site.stats().network_polls;
    // The first receive poll reads the network, the next 2^30 - 1 do not.
    assert!(b.try_recv().is_none());
    assert_eq!(polls(), 1);
    for _ in 0..10_000 {
        assert!(b.try_recv().is_none());
    }
    assert_eq!(polls(), 1, "try_recv keeps the interval");
    // Spinning with nothing to receive: a socket read at every pass.
    b.set_spin(Duration::from_millis(20));
    assert!(b.recv_timeout(Duration::from_millis(20)).is_none());
    let spun = polls() - 1;
    assert!(
        spun >= 64,
        "a receiver spinning 20 ms read the network {spun} times"
    );
    // Without a spin it sleeps after one round of polls, which keep the interval.
    b.set_spin(Duration::ZERO);
    let before = polls();
    assert!(b.recv_timeout(Duration::from_millis(5)).is_none());
    assert!(
        polls() - before <= 1,
        "a receive without a spin read the network {} times",
        polls() - before
    );
    // And a datagram that arrives while it spins is received.
    let a = endpoint(&cs[0], 0, 1, 2);
    b.set_spin(TIMEOUT);
    a.send_express(VirtualName(1), Express::new(Handler(3), 5).unwrap())
        .unwrap();
    let got = b.recv_timeout(TIMEOUT);
    assert!(
        matches!(got, Some(Message::Express(e)) if e.payload == 5),
        "{got:?}"
    );
    drain_all(&cs, Duration::from_secs(10));
    for c in cs {
        c.inis.shutdown(Duration::from_secs(10)).unwrap();
    }
}
