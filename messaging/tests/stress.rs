//! Stress: 4 producer threads × 1,000,000 Express messages into one queue, drained by 2
//! consumers. Every message must be received exactly once, and each consumer must see each
//! producer's messages in the order they were sent.

use multigrain_messaging::*;
use std::time::{Duration, Instant};

const PRODUCERS: u64 = 4;
const PER_PRODUCER: u64 = 1_000_000;

#[test]
fn four_producers_two_consumers_exactly_once() {
    let site = Site::new(SiteConfig {
        queues: vec![
            QueueSpec {
                express_capacity: 1024,
                ..QueueSpec::default()
            };
            2
        ],
        ..SiteConfig::default()
    })
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            // Producers receive on queue 1 (unused), send to queue 0.
            let (ep, w) = site.create_endpoint(&[QueueId(1)]).unwrap();
            w.map(
                VirtualName(0),
                Destination {
                    site: SiteId(0),
                    queue: QueueId(0),
                    source: SourceId::new(p as u16).unwrap(),
                },
            )
            .unwrap();
            std::thread::spawn(move || {
                for i in 0..PER_PRODUCER {
                    let msg = Express::new(Handler(1), (p << 32) | i).unwrap();
                    ep.send_express_blocking(
                        VirtualName(0),
                        msg,
                        Some(Duration::from_secs(60)),
                        |m| panic!("unexpected {m:?}"),
                    )
                    .unwrap();
                }
            })
        })
        .collect();
    let consumers: Vec<_> = (0..2)
        .map(|c| {
            let (ep, _w) = site.create_endpoint(&[QueueId(0)]).unwrap();
            std::thread::spawn(move || {
                let mut last = [None::<u64>; PRODUCERS as usize];
                let mut seen = Vec::new();
                loop {
                    match ep.recv_timeout(Duration::from_millis(200)) {
                        Some(Message::Express(m)) => {
                            let (p, i) = (m.payload >> 32, m.payload & 0xffff_ffff);
                            assert_eq!(
                                u64::from(m.source.get()),
                                p,
                                "source id stamped from the table"
                            );
                            if let Some(prev) = last[p as usize] {
                                assert!(
                                    i > prev,
                                    "consumer {c}: producer {p} out of order ({i} after {prev})"
                                );
                            }
                            last[p as usize] = Some(i);
                            seen.push(m.payload);
                        }
                        Some(other) => panic!("unexpected {other:?}"),
                        None if Instant::now() > deadline => {
                            panic!("consumer {c} timed out with {} messages", seen.len())
                        }
                        None => {
                            // Producers finished before DONE was set, so an empty queue
                            // after seeing DONE means every message has been taken.
                            if DONE.load(std::sync::atomic::Ordering::Acquire) {
                                break;
                            }
                        }
                    }
                }
                seen
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    DONE.store(true, std::sync::atomic::Ordering::Release);
    let mut count = vec![0u8; (PRODUCERS * PER_PRODUCER) as usize];
    let mut total = 0;
    for c in consumers {
        for payload in c.join().unwrap() {
            let (p, i) = (payload >> 32, payload & 0xffff_ffff);
            count[(p * PER_PRODUCER + i) as usize] += 1;
            total += 1;
        }
    }
    assert_eq!(total, PRODUCERS * PER_PRODUCER);
    assert!(
        count.iter().all(|&c| c == 1),
        "every message received exactly once"
    );
    let stats = site.stats();
    assert_eq!(stats.sent.express, PRODUCERS * PER_PRODUCER);
    assert_eq!(stats.received.express, PRODUCERS * PER_PRODUCER);
}

#[allow(clippy::disallowed_types)]
static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
