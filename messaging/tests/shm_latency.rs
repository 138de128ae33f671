//! Emulated latency *L* on shared-memory links (paper 001 §3.2; `SiteConfig::shm_latency`,
//! the job's `emulation.latency_us`): a message from another site over shared memory is
//! delivered no earlier than *L* after it was sent, each message independently of the
//! others, while messages within the site pass at once.

use multigrain_messaging::*;
use std::time::{Duration, Instant};

const L: Duration = Duration::from_millis(150);
const TIMEOUT: Duration = Duration::from_secs(10);

fn site(id: u16, latency: Duration) -> Site {
    Site::new(SiteConfig {
        site: SiteId(id),
        shared: true,
        pool_slots: 64,
        shm_latency: latency,
        ..SiteConfig::default()
    })
    .unwrap()
}

/// Queue 0 of `site`; the receiver sees the sender as its name `source`.
fn to(site: u16, source: u16) -> Destination {
    Destination {
        site: SiteId(site),
        queue: QueueId(0),
        source: SourceId::new(source).unwrap(),
    }
}

#[test]
fn shm_messages_wait_l_and_local_ones_do_not() {
    let (a, b) = (site(0, Duration::ZERO), site(1, L));
    a.attach_peer(SiteId(1), b.segment_name().unwrap()).unwrap();
    b.attach_peer(SiteId(0), a.segment_name().unwrap()).unwrap();
    let (ea, wa) = a.create_endpoint(&[QueueId(0)]).unwrap();
    let (eb, wb) = b.create_endpoint(&[QueueId(0)]).unwrap();
    // a's messages carry source 0, which at b is the name leading back to a; b's own
    // messages to itself carry source 1, b's name for itself.
    wa.map(VirtualName(0), to(1, 0)).unwrap();
    wb.map(VirtualName(0), to(0, 0)).unwrap();
    wb.map(VirtualName(1), to(1, 1)).unwrap();

    let sent = Instant::now();
    ea.send_express(VirtualName(0), Express::new(Handler(1), 7).unwrap())
        .unwrap();
    let mut buf = ea.alloc().unwrap();
    buf.fill(&[0xab; 4096]);
    ea.send_tag_on(VirtualName(0), Handler(2), buf).unwrap();
    // Held: the first polls see nothing from a.
    assert!(eb.try_recv().is_none(), "delivered before L had passed");
    // A message within b passes at once, while a's are held.
    eb.send_express(VirtualName(1), Express::new(Handler(3), 9).unwrap())
        .unwrap();
    match eb.try_recv() {
        Some(Message::Express(m)) => assert_eq!((m.handler, m.payload), (Handler(3), 9)),
        other => panic!("the local message should pass at once, got {other:?}"),
    }
    let first = eb.recv_timeout(TIMEOUT).expect("a's Express after L");
    let at = sent.elapsed();
    match first {
        Message::Express(m) => assert_eq!(m.payload, 7),
        other => panic!("expected a's Express first, got {other:?}"),
    }
    assert!(at >= L, "delivered {at:?} after sending, L is {L:?}");
    // The Tag-On was held alongside, not behind it: it is due at about the same time.
    match eb.recv_timeout(TIMEOUT).expect("a's Tag-On") {
        Message::TagOn(t) => assert!(t.data.iter().all(|&x| x == 0xab), "page intact"),
        other => panic!("expected a's Tag-On, got {other:?}"),
    }
    assert!(
        sent.elapsed() < at + L,
        "the second message waited behind the first ({:?})",
        sent.elapsed()
    );
}

/// A message one endpoint took off a shared queue and holds is delivered by another
/// endpoint polling that queue (the first may block elsewhere meanwhile, e.g. in a
/// barrier among its cluster's threads: Water on 2×2 with `emulation.latency_us` hung
/// when each endpoint kept its own held messages).
#[test]
fn a_held_message_reaches_any_endpoint_on_its_queue() {
    let (a, b) = (site(0, Duration::ZERO), site(1, L));
    a.attach_peer(SiteId(1), b.segment_name().unwrap()).unwrap();
    b.attach_peer(SiteId(0), a.segment_name().unwrap()).unwrap();
    let (ea, wa) = a.create_endpoint(&[QueueId(0)]).unwrap();
    let (first, wb) = b.create_endpoint(&[QueueId(0)]).unwrap();
    let (second, _) = b.create_endpoint(&[QueueId(0)]).unwrap();
    wa.map(VirtualName(0), to(1, 0)).unwrap();
    wb.map(VirtualName(0), to(0, 0)).unwrap();
    let sent = Instant::now();
    ea.send_express(VirtualName(0), Express::new(Handler(1), 42).unwrap())
        .unwrap();
    // `first` takes it off the queue and holds it; then only `second` polls.
    assert!(first.try_recv().is_none(), "delivered before L had passed");
    match second.recv_timeout(TIMEOUT) {
        Some(Message::Express(m)) => assert_eq!(m.payload, 42),
        other => panic!("the held message never reached the other endpoint: {other:?}"),
    }
    assert!(sent.elapsed() >= L, "delivered before L");
}
