//! Unit tests of the site/endpoint layer that need crate internals (raw words injected as
//! stand-ins for corrupted packets). Public-API behaviour is also covered in `tests/`.

use crate::*;
use std::time::{Duration, Instant};

fn site_with(queues: usize, f: impl FnOnce(&mut SiteConfig)) -> Site {
    let mut config = SiteConfig {
        queues: vec![QueueSpec::default(); queues],
        ..SiteConfig::default()
    };
    f(&mut config);
    Site::new(config).unwrap()
}

fn dest(queue: u16, source: u16) -> Destination {
    Destination {
        site: SiteId(0),
        queue: QueueId(queue),
        source: SourceId::new(source).unwrap(),
    }
}

fn express(h: u8, p: u64) -> Express {
    Express::new(Handler(h), p).unwrap()
}

/// An endpoint on queue `own` whose name `n` leads to queue `n` of the same site with source `own`.
fn endpoint(site: &Site, own: u16, names: u16) -> (Endpoint, TableWriter) {
    let (ep, w) = site.create_endpoint(&[QueueId(own)]).unwrap();
    for n in 0..names {
        w.map(VirtualName(n), dest(n, own)).unwrap();
    }
    (ep, w)
}

#[test]
fn express_carries_handler_source_and_payload() {
    let site = site_with(2, |_| {});
    let (a, _wa) = endpoint(&site, 0, 2);
    let (b, _wb) = endpoint(&site, 1, 2);
    a.send_express(VirtualName(1), express(7, word::MAX_PAYLOAD))
        .unwrap();
    let Some(Message::Express(m)) = b.try_recv() else {
        panic!("expected an Express message")
    };
    assert_eq!(
        (m.handler, m.source.get(), m.payload),
        (Handler(7), 0, word::MAX_PAYLOAD)
    );
    // The source id is a name in the receiver's table: reply through it.
    b.reply_express(m.source, express(8, 42)).unwrap();
    let Some(Message::Express(r)) = a.try_recv() else {
        panic!("expected the reply")
    };
    assert_eq!((r.handler, r.source.get(), r.payload), (Handler(8), 1, 42));
    assert!(
        a.try_recv().is_none() && b.try_recv().is_none(),
        "empty answers at once"
    );
}

#[test]
fn unknown_and_unreachable_names_hand_the_message_back() {
    let site = site_with(1, |_| {});
    let (a, w) = endpoint(&site, 0, 1);
    let msg = express(1, 5);
    match a.send_express(VirtualName(9), msg) {
        Err(SendError::UnknownDestination(VirtualName(9), back)) => assert_eq!(back, msg),
        other => panic!("expected UnknownDestination, got {other:?}"),
    }
    let far = Destination {
        site: SiteId(3),
        queue: QueueId(0),
        source: SourceId::default(),
    };
    w.map(VirtualName(2), far).unwrap();
    match a.send_express(VirtualName(2), msg) {
        Err(SendError::Unreachable(d, back)) => assert_eq!((d, back), (far, msg)),
        other => panic!("expected Unreachable, got {other:?}"),
    }
    w.map(VirtualName(3), dest(5, 0)).unwrap();
    assert!(
        matches!(
            a.send_express(VirtualName(3), msg),
            Err(SendError::Unreachable(..))
        ),
        "no queue 5"
    );
    w.unmap(VirtualName(0)).unwrap();
    assert!(matches!(
        a.send_express(VirtualName(0), msg),
        Err(SendError::UnknownDestination(..))
    ));
}

#[test]
fn a_full_queue_hands_the_message_back_and_nothing_is_lost() {
    let site = site_with(1, |c| c.queues[0].express_capacity = 4);
    let (a, _w) = endpoint(&site, 0, 1);
    for i in 0..4 {
        a.send_express(VirtualName(0), express(1, i)).unwrap();
    }
    match a.send_express(VirtualName(0), express(1, 4)) {
        Err(SendError::Full(m)) => assert_eq!(m.payload(), 4),
        other => panic!("expected Full, got {other:?}"),
    }
    let got: Vec<u64> = std::iter::from_fn(|| a.try_recv())
        .map(|m| match m {
            Message::Express(e) => e.payload,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(got, vec![0, 1, 2, 3]);
    assert_eq!(site.stats().full, 1);
}

#[test]
fn several_names_may_map_to_one_queue_with_distinct_sources() {
    let site = site_with(2, |_| {});
    let (a, w) = site.create_endpoint(&[QueueId(0)]).unwrap();
    w.map(VirtualName(10), dest(1, 100)).unwrap();
    w.map(VirtualName(11), dest(1, 101)).unwrap();
    let (b, _) = site.create_endpoint(&[QueueId(1)]).unwrap();
    a.send_express(VirtualName(10), express(1, 0)).unwrap();
    a.send_express(VirtualName(11), express(1, 0)).unwrap();
    let sources: Vec<u16> = std::iter::from_fn(|| b.try_recv())
        .map(|m| m.source().get())
        .collect();
    assert_eq!(sources, vec![100, 101]);
}

#[test]
fn tag_on_delivers_data_and_tag_and_releases_the_slot() {
    let site = site_with(2, |c| c.pool_slots = 4);
    let (a, _wa) = endpoint(&site, 0, 2);
    let (b, _wb) = endpoint(&site, 1, 2);
    let mut buf = a.alloc().unwrap();
    let page: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
    buf.fill(&page);
    buf.set_tag(0x1234);
    a.send_tag_on(VirtualName(1), Handler(3), buf).unwrap();
    assert_eq!(site.pool().free_slots(), 3);
    let Some(Message::TagOn(m)) = b.try_recv() else {
        panic!("expected Tag-On")
    };
    assert_eq!(
        (m.handler, m.source.get(), m.data.tag()),
        (Handler(3), 0, 0x1234)
    );
    assert_eq!(&*m.data, &page[..]);
    drop(m);
    assert_eq!(site.pool().free_slots(), 4, "the guard returned the slot");
}

#[test]
fn multicast_sends_one_buffer_to_many_queues_without_copying() {
    let site = site_with(4, |c| c.pool_slots = 2);
    let (a, _w) = endpoint(&site, 0, 4);
    let mut buf = a.alloc().unwrap();
    buf.fill(b"shared page");
    let frozen = buf.freeze();
    let location = frozen.location();
    for q in 1..4 {
        a.send_tag_on(VirtualName(q), Handler(1), frozen.clone())
            .unwrap();
    }
    drop(frozen);
    assert_eq!(
        site.pool().free_slots(),
        1,
        "one slot for three destinations"
    );
    let mut received = Vec::new();
    for q in 1..4 {
        let (ep, _) = site.create_endpoint(&[QueueId(q)]).unwrap();
        let Some(Message::TagOn(m)) = ep.try_recv() else {
            panic!("queue {q} got nothing")
        };
        assert_eq!(m.data.location(), location, "same slot, no copy");
        assert_eq!(&*m.data, b"shared page");
        received.push(m);
    }
    drop(received);
    assert_eq!(site.pool().free_slots(), 2);
}

#[test]
fn pool_exhaustion_is_an_error_the_caller_sees() {
    let site = site_with(1, |c| c.pool_slots = 2);
    let (a, _w) = endpoint(&site, 0, 1);
    let _x = a.alloc().unwrap();
    let _y = a.alloc().unwrap();
    let err = a.alloc().unwrap_err();
    assert_eq!(err, PoolExhausted { site: 0, slots: 2 });
    assert!(err.to_string().contains("exhausted"));
    assert_eq!(site.stats().pool_exhausted, 1);
}

#[test]
fn a_full_queue_hands_a_tag_on_buffer_back() {
    let site = site_with(1, |c| c.queues[0].express_capacity = 2);
    let (a, _w) = endpoint(&site, 0, 1);
    for _ in 0..2 {
        a.send_tag_on(VirtualName(0), Handler(1), a.alloc().unwrap())
            .unwrap();
    }
    let mut buf = a.alloc().unwrap();
    buf.fill(b"kept");
    match a.send_tag_on(VirtualName(0), Handler(1), buf) {
        Err(SendError::Full(back)) => assert_eq!(&*back, b"kept"),
        other => panic!("expected Full, got {other:?}"),
    }
}

#[test]
fn basic_messages_and_the_length_limit() {
    let site = site_with(2, |_| {});
    let (a, _wa) = endpoint(&site, 0, 2);
    let (b, _wb) = endpoint(&site, 1, 2);
    a.send_basic(VirtualName(1), Handler(4), &[5; BASIC_MAX])
        .unwrap();
    let Some(Message::Basic(m)) = b.try_recv() else {
        panic!("expected Basic")
    };
    assert_eq!((m.handler, m.data()), (Handler(4), &[5u8; BASIC_MAX][..]));
    match a.send_basic(VirtualName(1), Handler(4), &[0; BASIC_MAX + 1]) {
        Err(BasicSendError::TooLong(BasicTooLong(n))) => assert_eq!(n, BASIC_MAX + 1),
        other => panic!("expected TooLong, got {other:?}"),
    }
}

#[test]
fn bulk_messages_up_to_one_mebibyte() {
    // The pool (64 slots, 256 KiB) is far smaller than 1 MiB: the sender waits for the
    // receiver to copy fragments out and free their slots, so memory stays bounded.
    let site = site_with(2, |c| c.pool_slots = 64);
    let (a, _wa) = endpoint(&site, 0, 2);
    let (b, _wb) = endpoint(&site, 1, 2);
    let per = DEFAULT_SLOT_SIZE - bulk::FRAGMENT_HEADER;
    let lens = [0, 1, per - 1, per, per + 1, 1 << 20];
    let payload = |len: usize| -> Vec<u8> { (0..len).map(|i| (i * 7 + len) as u8).collect() };
    let receiver = std::thread::spawn(move || {
        let mut got = Vec::new();
        while got.len() < lens.len() {
            match b.recv_timeout(Duration::from_secs(20)) {
                Some(Message::Bulk(m)) => got.push(m),
                other => panic!("expected a bulk message, got {other:?}"),
            }
        }
        got
    });
    for len in lens {
        a.send_bulk(
            VirtualName(1),
            Handler(9),
            &payload(len),
            Some(Duration::from_secs(20)),
            |_| {},
        )
        .unwrap();
    }
    for (m, len) in receiver.join().unwrap().into_iter().zip(lens) {
        assert_eq!((m.handler, m.data.len()), (Handler(9), len));
        assert!(m.data == payload(len), "bulk of {len} bytes corrupted");
    }
    assert_eq!(site.pool().free_slots(), 64);
    let too_long = vec![0u8; (1 << 20) + 1];
    assert!(matches!(
        a.send_bulk(VirtualName(1), Handler(9), &too_long, None, |_| {}),
        Err(BulkSendError::TooLong { .. })
    ));
}

#[test]
fn one_poll_takes_the_highest_priority_queue_first() {
    let site = site_with(3, |_| {});
    let (tx, _w) = endpoint(&site, 2, 3);
    let (rx, _) = site.create_endpoint(&[QueueId(0), QueueId(1)]).unwrap();
    tx.send_express(VirtualName(1), express(1, 1)).unwrap();
    tx.send_basic(VirtualName(0), Handler(2), b"low").unwrap();
    tx.send_express(VirtualName(0), express(1, 0)).unwrap();
    let order: Vec<String> = std::iter::from_fn(|| rx.try_recv())
        .map(|m| format!("{}:{}", m.kind_name(), m.handler().0))
        .collect();
    assert_eq!(
        order,
        ["express:1", "basic:2", "express:1"],
        "queue 0 (Express, then Basic) before queue 1"
    );
    // A custom order: queue 1 before queue 0.
    tx.send_express(VirtualName(0), express(5, 0)).unwrap();
    tx.send_express(VirtualName(1), express(6, 0)).unwrap();
    let set = rx
        .poll_set(&[
            PollSource::Express(QueueId(1)),
            PollSource::Express(QueueId(0)),
        ])
        .unwrap();
    assert_eq!(rx.one_poll(&set).unwrap().handler(), Handler(6));
    assert_eq!(rx.one_poll(&set).unwrap().handler(), Handler(5));
    assert!(rx.one_poll(&set).is_none());
    assert_eq!(
        rx.poll_set(&[PollSource::Basic(QueueId(2))]).unwrap_err(),
        NotOwnQueue(QueueId(2))
    );
}

#[test]
fn corrupted_words_are_rejected_and_counted_never_a_panic() {
    let site = site_with(1, |c| c.pool_slots = 4);
    let (a, _w) = endpoint(&site, 0, 1);
    let ring = &site.inner().own.express[0];
    let h = Handler(1);
    let s = SourceId::default();
    ring.push(u64::MAX).unwrap(); // reserved kind
    ring.push(Word::buffer(WordKind::TagOn, h, s, 0, 3).0)
        .unwrap(); // slot not in use
    ring.push(Word::buffer(WordKind::TagOn, h, s, 0, 1 << 20).0)
        .unwrap(); // slot out of range
    ring.push(Word::buffer(WordKind::TagOn, h, s, 77, 0).0)
        .unwrap(); // unknown pool
    let mut bad = a.alloc().unwrap();
    bad.fill(&[0xff; 40]); // not a valid fragment header
    let (_, slot) = bad.freeze().into_transfer();
    ring.push(Word::buffer(WordKind::Bulk, h, s, 0, slot).0)
        .unwrap();
    site.inner().own.basic[0].push(h, s, b"x").unwrap();
    site.inner().own.basic[0].corrupt_next_len();
    a.send_express(VirtualName(0), express(2, 9)).unwrap();
    let got: Vec<Message> = std::iter::from_fn(|| a.try_recv()).collect();
    assert_eq!(got.len(), 1, "only the good message is delivered: {got:?}");
    assert_eq!(got[0].handler(), Handler(2));
    let r = site.stats().rejected;
    assert_eq!(
        (
            r.bad_kind,
            r.bad_slot,
            r.unknown_pool,
            r.bad_fragment,
            r.bad_basic
        ),
        (1, 2, 1, 1, 1)
    );
    assert_eq!(
        site.pool().free_slots(),
        4,
        "the malformed fragment's slot was released"
    );
}

#[test]
fn blocking_receive_sleeps_and_wakes() {
    let site = site_with(2, |_| {});
    let (a, _wa) = endpoint(&site, 0, 2);
    let (b, _wb) = endpoint(&site, 1, 2);
    let t0 = Instant::now();
    assert!(b.recv_timeout(Duration::from_millis(30)).is_none());
    assert!(t0.elapsed() >= Duration::from_millis(30));
    let bell = site.inner().own.doorbell(0).unwrap();
    let receiver =
        std::thread::spawn(move || b.recv_timeout(Duration::from_secs(10)).map(|m| m.handler()));
    // Wait until the receiver is asleep on the doorbell, then send.
    let deadline = Instant::now() + Duration::from_secs(10);
    while bell.waiters() == 0 {
        assert!(Instant::now() < deadline, "receiver never went to sleep");
        std::thread::sleep(Duration::from_millis(1));
    }
    a.send_express(VirtualName(1), express(3, 0)).unwrap();
    assert_eq!(receiver.join().unwrap(), Some(Handler(3)));
    assert_eq!(bell.waiters(), 0);
}

/// The calling thread's CPU time.
fn thread_cpu_time() -> Duration {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap();
    Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32)
}

/// A receiver that finds a slot a sender has claimed and not yet written cannot sleep on
/// its doorbell (the sender's wake-up may have come before it registered), but must not
/// keep its CPU either: a real-time protocol thread that only yielded kept a sender
/// preempted on its CPU from writing the slot until the kernel's real-time throttling
/// let it run, ≈ 1 s later (Water on 4×1 over shared memory, fortieth session). It
/// naps instead, and takes the message once it is written.
#[test]
fn a_receiver_waiting_for_an_unwritten_slot_gives_its_cpu_away() {
    let site = site_with(1, |_| {});
    let (a, _w) = endpoint(&site, 0, 1);
    let ring = &site.inner().own.express[0];
    let pos = ring.claim_unwritten();
    let (cpu0, t0) = (thread_cpu_time(), Instant::now());
    assert!(
        a.recv_timeout(Duration::from_millis(50)).is_none(),
        "nothing written yet"
    );
    let (cpu, wall) = (thread_cpu_time() - cpu0, t0.elapsed());
    assert!(wall >= Duration::from_millis(50));
    assert!(
        cpu < wall / 4,
        "the receiver kept its CPU while it waited: {cpu:?} of {wall:?}"
    );
    ring.write_claimed(pos, Word::express(Handler(5), SourceId::default(), 7).0);
    let Some(Message::Express(m)) = a.recv_timeout(Duration::from_secs(10)) else {
        panic!("the written message")
    };
    assert_eq!((m.handler, m.payload), (Handler(5), 7));
}

/// `recv_until_woken` gives up at a doorbell wake-up that finds no message (another
/// endpoint of the queues took it: here a ring with nothing queued), where
/// `recv_timeout` sleeps again until its deadline. A DSM cluster's real-time protocol
/// thread waited in `recv_timeout` while the cluster's compute threads polled and took
/// every message: each one woke it and it preempted a compute thread, for up to its
/// 100 ms timeout (a remote read fault over shared memory took 23–28 µs instead of 7–9
/// in whole runs of faults, forty-first session).
#[test]
fn a_receiver_until_woken_gives_up_at_a_wake_up_that_finds_nothing() {
    let site = site_with(1, |_| {});
    let (mut a, _w) = endpoint(&site, 0, 1);
    a.set_spin(Duration::ZERO);
    let bell = || {
        let inner = site.inner();
        inner
            .own
            .doorbell(inner.own.queue_doorbell[0])
            .expect("queue 0's doorbell")
    };
    // Rings, once the receiver sleeps on the bell, with nothing queued.
    let ring_when_asleep = |after: Duration| {
        let t0 = Instant::now();
        while bell().waiters() == 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the receiver never slept"
            );
            std::thread::yield_now();
        }
        std::thread::sleep(after);
        bell().ring();
    };
    let (done, first_done) = std::sync::mpsc::channel();
    let receiver = std::thread::spawn(move || {
        let t0 = Instant::now();
        let first = (a.recv_until_woken(Duration::from_secs(10)), t0.elapsed());
        done.send(()).unwrap();
        let t0 = Instant::now();
        let second = (a.recv_timeout(Duration::from_millis(300)), t0.elapsed());
        (a, first, second)
    });
    ring_when_asleep(Duration::from_millis(20));
    first_done
        .recv_timeout(Duration::from_secs(10))
        .expect("recv_until_woken slept on after the wake-up");
    ring_when_asleep(Duration::from_millis(20));
    let (a, (m, waited), (m2, waited2)) = receiver.join().unwrap();
    assert!(m.is_none(), "nothing was queued");
    assert!(
        waited < Duration::from_secs(5),
        "recv_until_woken slept on after the wake-up: {waited:?}"
    );
    assert!(m2.is_none());
    assert!(
        waited2 >= Duration::from_millis(300),
        "recv_timeout sleeps on to its deadline: {waited2:?}"
    );
    // A message queued before the wait is taken as by recv_timeout.
    let (b, _wb) = endpoint(&site, 0, 1);
    b.send_express(VirtualName(0), express(3, 9)).unwrap();
    let Some(Message::Express(m)) = a.recv_until_woken(Duration::from_secs(10)) else {
        panic!("the queued message")
    };
    assert_eq!((m.handler, m.payload), (Handler(3), 9));
}

/// Two senders send bursts of 1–4 messages to one receiver that sleeps on its doorbell
/// whenever its queue is empty (no spinning), and each waits for the receiver's answer
/// to its burst: a wake-up lost by the armed-doorbell protocol (only the first ring after
/// a receiver armed it makes the `FUTEX_WAKE`) would leave the receiver asleep with a
/// message queued and both senders waiting, and the receive would time out.
#[test]
fn bursts_from_two_senders_always_wake_the_sleeping_receiver() {
    const ROUNDS: u64 = 1500;
    let site = site_with(3, |_| {});
    let (mut rx, _w) = endpoint(&site, 0, 3);
    rx.set_spin(Duration::ZERO);
    let senders: Vec<_> = (1..3u16)
        .map(|me| {
            let (mut tx, w) = endpoint(&site, me, 3);
            tx.set_spin(Duration::ZERO);
            std::thread::spawn(move || {
                let _w = w;
                for round in 0..ROUNDS {
                    let burst = 1 + round % 4;
                    for i in (0..burst).rev() {
                        tx.send_express(VirtualName(0), express(1, i)).unwrap();
                    }
                    let answer = tx.recv_timeout(Duration::from_secs(10));
                    assert!(answer.is_some(), "sender {me}: no answer to round {round}");
                }
            })
        })
        .collect();
    let mut done = 0;
    while done < 2 * ROUNDS {
        let m = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the receiver slept through a message (lost wake-up)");
        if matches!(&m, Message::Express(e) if e.payload == 0) {
            let to = VirtualName(m.source().get());
            rx.send_express(to, express(2, 0)).unwrap();
            done += 1;
        }
    }
    for s in senders {
        s.join().unwrap();
    }
}

#[test]
fn blocking_sends_between_two_full_queues_do_not_deadlock() {
    let site = site_with(2, |c| {
        for q in &mut c.queues {
            q.express_capacity = 2;
        }
    });
    let (a, _wa) = endpoint(&site, 0, 2);
    let (b, _wb) = endpoint(&site, 1, 2);
    const N: u64 = 10_000;
    let run = |ep: Endpoint, to: u16| {
        std::thread::spawn(move || {
            let mut got = Vec::new();
            for i in 0..N {
                ep.send_express_blocking(
                    VirtualName(to),
                    express(1, i),
                    Some(Duration::from_secs(20)),
                    |m| got.push(m),
                )
                .unwrap();
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while (got.len() as u64) < N {
                assert!(
                    Instant::now() < deadline,
                    "stuck with {} of {N} received",
                    got.len()
                );
                if let Some(m) = ep.recv_timeout(Duration::from_millis(10)) {
                    got.push(m);
                }
            }
            got.iter()
                .map(|m| {
                    if let Message::Express(e) = m {
                        e.payload
                    } else {
                        u64::MAX
                    }
                })
                .collect::<Vec<_>>()
        })
    };
    let ta = run(a, 1);
    let tb = run(b, 0);
    let expected: Vec<u64> = (0..N).collect();
    assert_eq!(ta.join().unwrap(), expected);
    assert_eq!(tb.join().unwrap(), expected);
}

#[test]
fn active_message_dispatch_and_the_reply_rules() {
    let site = site_with(2, |_| {});
    let (client, _wc) = endpoint(&site, 0, 2);
    let (server, _ws) = endpoint(&site, 1, 2);
    #[derive(Default)]
    struct State {
        second_reply: Option<String>,
        reply_from_reply: Option<String>,
        errors: Vec<String>,
        results: Vec<u64>,
    }
    let mut d = Dispatcher::<State>::new(|s, u| {
        s.errors
            .push(format!("{}: {}", u.message.handler(), u.reason))
    });
    d.register(Handler(1), HandlerKind::Request, |ctx, s, m| {
        let Message::Express(e) = m else { return };
        ctx.reply_express(Handler(2), e.payload * 2).unwrap();
        s.second_reply = ctx
            .reply_express(Handler(2), 0)
            .err()
            .map(|e| e.to_string());
    })
    .unwrap();
    d.register(Handler(2), HandlerKind::Reply, |ctx, s, m| {
        if let Message::Express(e) = m {
            s.results.push(e.payload);
        }
        s.reply_from_reply = ctx
            .reply_express(Handler(2), 0)
            .err()
            .map(|e| e.to_string());
    })
    .unwrap();
    assert!(
        d.register(Handler(0), HandlerKind::Request, |_, _, _| {})
            .is_err(),
        "index 0 is the error handler"
    );
    assert!(
        d.register(Handler(1), HandlerKind::Request, |_, _, _| {})
            .is_err(),
        "taken"
    );
    let mut state = State::default();
    client.send_express(VirtualName(1), express(1, 21)).unwrap();
    client
        .send_express(VirtualName(1), express(200, 0))
        .unwrap();
    assert!(d.poll(&server, &mut state));
    assert!(d.poll(&server, &mut state));
    assert!(!d.poll(&server, &mut state));
    assert!(d.poll(&client, &mut state));
    assert_eq!(state.results, vec![42]);
    assert_eq!(
        state.second_reply.as_deref(),
        Some("a request handler may reply at most once")
    );
    assert_eq!(
        state.reply_from_reply.as_deref(),
        Some("a reply handler may not reply")
    );
    assert_eq!(
        state.errors,
        vec!["handler 200: no handler is registered at index 200".to_string()]
    );
    assert!(
        client.try_recv().is_none(),
        "the refused replies were not sent"
    );
}

#[test]
fn statistics_count_by_kind_and_substrate() {
    let site = site_with(2, |_| {});
    let (a, _wa) = endpoint(&site, 0, 2);
    let (b, _wb) = endpoint(&site, 1, 2);
    a.send_express(VirtualName(1), express(1, 0)).unwrap();
    a.send_basic(VirtualName(1), Handler(1), b"abc").unwrap();
    a.send_tag_on(VirtualName(1), Handler(1), a.alloc().unwrap())
        .unwrap();
    while b.try_recv().is_some() {}
    let s = site.stats();
    assert_eq!((s.sent.express, s.sent.basic, s.sent.tag_on), (1, 1, 1));
    assert_eq!(
        (s.received.express, s.received.basic, s.received.tag_on),
        (1, 1, 1)
    );
    assert_eq!(s.substrate.local, 3);
    assert_eq!(s.rejected.total(), 0);
}
