//! Action sequences of single machines for the cases the runtime must get right
//! (they double as examples of the calling contract), and a fuzz test: arbitrary
//! event sequences never make a machine panic.

use multigrain_coherence::{
    Action, ClusterId, Config, Event, FaultToken, LockId, Machine, Message, PageAccess, PageId,
    PageRange, Protocol, ProtocolError, Source, SyncToken,
};
use proptest::prelude::*;

fn c(n: u16) -> ClusterId {
    ClusterId::new(n).unwrap()
}
fn p(n: u32) -> PageId {
    PageId::new(n).unwrap()
}
fn l(n: u32) -> LockId {
    LockId::new(n).unwrap()
}

fn run(m: &mut Machine, e: Event) -> Vec<Action> {
    let mut out = Vec::new();
    m.handle(e, &mut out).unwrap();
    out
}

fn msg(from: u16, msg: Message) -> Event {
    let attached_len = if msg.attachment().is_some() { 4096 } else { 0 };
    Event::Message {
        from: c(from),
        msg,
        attached_len,
    }
}

/// The hot path of design.md: remote read fault → GetPage → home replies with the
/// page (Tag-On) → install read-only → wake.
#[test]
fn remote_read_fault_hot_path() {
    let cfg = Config::new(Protocol::Hlrc, 2, 4);
    let mut home = Machine::new(c(1), cfg.clone()).unwrap();
    let mut me = Machine::new(c(0), cfg).unwrap();
    // page 1 is homed at cluster 1 (round-robin)
    let a = run(
        &mut me,
        Event::ReadFault {
            page: p(1),
            token: FaultToken(7),
        },
    );
    assert_eq!(
        a,
        vec![Action::Send {
            to: c(1),
            msg: Message::GetPage { page: p(1) }
        }]
    );
    // a second thread faulting meanwhile shares the fetch
    assert_eq!(
        run(
            &mut me,
            Event::ReadFault {
                page: p(1),
                token: FaultToken(8)
            }
        ),
        vec![]
    );
    // the home has never touched the page: it answers "zero page" without data
    let a = run(&mut home, msg(0, Message::GetPage { page: p(1) }));
    assert_eq!(
        a,
        vec![Action::Send {
            to: c(0),
            msg: Message::PageData {
                page: p(1),
                writable: false,
                zero: true
            }
        }]
    );
    assert_eq!(home.copyset(p(1)), vec![c(0), c(1)]);
    let a = run(
        &mut me,
        msg(
            1,
            Message::PageData {
                page: p(1),
                writable: false,
                zero: false,
            },
        ),
    );
    assert_eq!(
        a,
        vec![
            Action::Install {
                page: p(1),
                source: Source::Attached,
                writable: false
            },
            Action::Wake {
                page: p(1),
                tokens: vec![FaultToken(7), FaultToken(8)]
            },
        ]
    );
    assert_eq!(me.access(p(1)), Some(PageAccess::ReadOnly));
    assert_eq!(me.stats().remote_fetches, 1);
    assert_eq!(me.stats().coalesced_faults, 1);
}

/// Write fault → twin → release write-protects first, then diffs; the release
/// completes only after the home's acknowledgement; releases complete in order.
#[test]
fn release_protects_then_diffs_and_waits_for_acks() {
    let cfg = Config::new(Protocol::Hlrc, 2, 4);
    let mut me = Machine::new(c(0), cfg).unwrap();
    run(
        &mut me,
        Event::ReadFault {
            page: p(1),
            token: FaultToken(1),
        },
    );
    run(
        &mut me,
        msg(
            1,
            Message::PageData {
                page: p(1),
                writable: false,
                zero: true,
            },
        ),
    );
    let a = run(
        &mut me,
        Event::WriteFault {
            page: p(1),
            token: FaultToken(1),
        },
    );
    assert_eq!(
        a,
        vec![
            Action::MakeTwin { page: p(1) },
            Action::Unprotect { page: p(1) },
            Action::Wake {
                page: p(1),
                tokens: vec![FaultToken(1)]
            },
        ]
    );
    // lock 0 is managed by cluster 0 itself: granted at once
    let a = run(
        &mut me,
        Event::Acquire {
            lock: l(0),
            token: SyncToken(1),
        },
    );
    assert_eq!(
        a,
        vec![Action::AcquireDone {
            lock: l(0),
            token: SyncToken(1)
        }]
    );
    let a = run(
        &mut me,
        Event::Release {
            lock: l(0),
            token: SyncToken(1),
        },
    );
    assert_eq!(
        a,
        vec![
            Action::WriteProtect {
                pages: PageRange {
                    start: p(1),
                    count: 1
                }
            },
            Action::SendDiff {
                to: c(1),
                page: p(1),
                tag: 0
            },
        ]
    );
    // a second release (another thread, lock 2) with nothing dirty must still wait
    run(
        &mut me,
        Event::Acquire {
            lock: l(2),
            token: SyncToken(2),
        },
    );
    assert_eq!(
        run(
            &mut me,
            Event::Release {
                lock: l(2),
                token: SyncToken(2)
            }
        ),
        vec![]
    );
    // the write fault of a third thread waits for the diff's acknowledgement
    assert_eq!(
        run(
            &mut me,
            Event::WriteFault {
                page: p(1),
                token: FaultToken(3)
            }
        ),
        vec![]
    );
    let a = run(&mut me, msg(1, Message::DiffAck { page: p(1), tag: 0 }));
    assert_eq!(
        a,
        vec![
            Action::MakeTwin { page: p(1) },
            Action::Unprotect { page: p(1) },
            Action::Wake {
                page: p(1),
                tokens: vec![FaultToken(3)]
            },
            Action::ReleaseDone {
                lock: l(0),
                token: SyncToken(1)
            },
            Action::ReleaseDone {
                lock: l(2),
                token: SyncToken(2)
            },
        ]
    );
    assert!(me.is_quiescent());
    assert_eq!(me.vector_time().entries(), &[1]);
}

/// The home's own writes need no twin and no diff. While no other cluster has
/// fetched the page they need no write notice either (the page stays writable across
/// releases); once another cluster holds a copy, they produce write notices.
/// Source: HLRC (OSDI 1996 §2) home writes; private pages as in ArgoDSM (HPDC 2015).
#[test]
fn home_writes_produce_write_notices_once_shared() {
    let cfg = Config::new(Protocol::Hlrc, 2, 4);
    let mut home = Machine::new(c(0), cfg.clone()).unwrap();
    let mut other = Machine::new(c(1), cfg).unwrap();
    let write = |t| Event::WriteFault {
        page: p(0),
        token: FaultToken(t),
    };
    let wake = |t| Action::Wake {
        page: p(0),
        tokens: vec![FaultToken(t)],
    };
    let acquire = |t| Event::Acquire {
        lock: l(0),
        token: SyncToken(t),
    };
    let release = |t| Event::Release {
        lock: l(0),
        token: SyncToken(t),
    };
    let done = |t| Action::ReleaseDone {
        lock: l(0),
        token: SyncToken(t),
    };
    let one = PageRange {
        start: p(0),
        count: 1,
    };
    assert_eq!(
        run(&mut home, write(1)),
        vec![
            Action::Install {
                page: p(0),
                source: Source::Zero,
                writable: true
            },
            wake(1),
        ]
    );
    assert_eq!(home.stats().private_home_writes, 1);
    // a release neither protects the private page nor records a notice for it
    run(&mut home, acquire(1));
    assert_eq!(run(&mut home, release(1)), vec![done(1)]);
    assert_eq!(home.access(p(0)), Some(PageAccess::ReadWrite));
    // cluster 1 fetches the page: it joins the home's write set as it is copied
    let a = run(
        &mut other,
        Event::ReadFault {
            page: p(0),
            token: FaultToken(2),
        },
    );
    let [Action::Send { msg: get, .. }] = a.as_slice() else {
        panic!("{a:?}")
    };
    let data = Message::PageData {
        page: p(0),
        writable: false,
        zero: false,
    };
    assert_eq!(
        run(&mut home, msg(1, get.clone())),
        vec![Action::Send {
            to: c(1),
            msg: data.clone()
        }]
    );
    assert_eq!(home.stats().home_pages_shared, 1);
    assert_eq!(home.copyset(p(0)), vec![c(0), c(1)]);
    run(&mut other, msg(0, data));
    // the home's next release protects the page and records the notice covering its
    // writes after the copy
    run(&mut home, acquire(2));
    assert_eq!(
        run(&mut home, release(2)),
        vec![Action::WriteProtect { pages: one }, done(2)]
    );
    // from now on the home's writes fault and are tracked
    assert_eq!(
        run(&mut home, write(3)),
        vec![Action::Unprotect { page: p(0) }, wake(3)]
    );
    // cluster 1 acquires lock 0 from its manager (cluster 0): the grant carries the
    // notice, and cluster 1 invalidates its copy
    let a = run(&mut other, acquire(4));
    let [Action::Send { to, msg: req }] = a.as_slice() else {
        panic!("{a:?}")
    };
    assert_eq!(*to, c(0));
    let a = run(&mut home, msg(1, req.clone()));
    let [Action::Send { msg: grant, .. }] = a.as_slice() else {
        panic!("{a:?}")
    };
    let Message::LockGrant { records, .. } = grant else {
        panic!("{grant:?}")
    };
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].pages, vec![p(0)]);
    let a = run(&mut other, msg(0, grant.clone()));
    assert_eq!(
        a,
        vec![
            Action::Invalidate { pages: one },
            Action::AcquireDone {
                lock: l(0),
                token: SyncToken(4)
            },
        ]
    );
}

/// sc: a write fault at a reader makes the home invalidate the other readers and
/// grant an upgrade without data.
#[test]
fn sc_upgrade_invalidates_other_readers() {
    let cfg = Config::new(Protocol::Sc, 3, 1);
    let mut home = Machine::new(c(0), cfg.clone()).unwrap();
    for r in [1, 2] {
        let a = run(&mut home, msg(r, Message::ScRead { page: p(0) }));
        assert_eq!(
            a,
            vec![Action::Send {
                to: c(r),
                msg: Message::PageData {
                    page: p(0),
                    writable: false,
                    zero: true
                }
            }]
        );
    }
    let a = run(&mut home, msg(1, Message::ScWrite { page: p(0) }));
    assert_eq!(
        a,
        vec![Action::Send {
            to: c(2),
            msg: Message::ScInvalidate { page: p(0) }
        }]
    );
    // a read by the home itself queues behind the transaction
    assert_eq!(
        run(
            &mut home,
            Event::ReadFault {
                page: p(0),
                token: FaultToken(9)
            }
        ),
        vec![]
    );
    let a = run(&mut home, msg(2, Message::ScInvAck { page: p(0) }));
    assert_eq!(
        a,
        vec![
            Action::Send {
                to: c(1),
                msg: Message::ScUpgrade { page: p(0) }
            },
            Action::Send {
                to: c(1),
                msg: Message::ScRecall {
                    page: p(0),
                    invalidate: false
                }
            },
        ]
    );
    assert_eq!(home.remote_owner(p(0)), Some(c(1)));
    let a = run(&mut home, msg(1, Message::ScWriteBack { page: p(0) }));
    assert_eq!(
        a,
        vec![
            Action::Install {
                page: p(0),
                source: Source::Attached,
                writable: false
            },
            Action::Wake {
                page: p(0),
                tokens: vec![FaultToken(9)]
            },
        ]
    );
    assert_eq!(home.copyset(p(0)), vec![c(1)]);
}

/// Contract violations and impossible messages are errors, not panics.
#[test]
fn protocol_errors() {
    let cfg = Config::new(Protocol::Hlrc, 2, 4);
    let mut m = Machine::new(c(0), cfg).unwrap();
    let mut out = Vec::new();
    assert_eq!(
        m.handle(
            Event::Release {
                lock: l(0),
                token: SyncToken(0)
            },
            &mut out
        ),
        Err(ProtocolError::NotHeld(l(0)))
    );
    assert_eq!(
        m.handle(
            Event::ReadFault {
                page: p(4),
                token: FaultToken(0)
            },
            &mut out
        ),
        Err(ProtocolError::NoSuchPage(p(4)))
    );
    assert!(matches!(
        m.handle(msg(1, Message::DiffAck { page: p(1), tag: 0 }), &mut out),
        Err(ProtocolError::Unexpected { .. })
    ));
    assert_eq!(
        m.handle(msg(1, Message::GetPage { page: p(1) }), &mut out),
        Err(ProtocolError::NotHome {
            page: p(1),
            from: c(1)
        })
    );
    assert_eq!(
        m.handle(msg(0, Message::GetPage { page: p(0) }), &mut out),
        Err(ProtocolError::NoSuchCluster(c(0)))
    );
}

fn event(clusters: u16, pages: u32) -> impl Strategy<Value = Event> {
    let page = (0..pages + 1).prop_map(|n| PageId::new(n).unwrap());
    let from = (0..clusters).prop_map(|n| ClusterId::new(n).unwrap());
    let lock = (0u32..3).prop_map(|n| LockId::new(n).unwrap());
    let time = proptest::collection::vec(0u32..3, 0..3)
        .prop_map(multigrain_coherence::VectorTime::from_entries);
    let rec = (
        from.clone(),
        1u32..3,
        proptest::collection::vec(page.clone(), 0..2),
    )
        .prop_map(
            |(owner, index, pages)| multigrain_coherence::IntervalRecord {
                owner,
                index,
                pages,
            },
        );
    let message = prop_oneof![
        page.clone().prop_map(|page| Message::GetPage { page }),
        page.clone().prop_map(|page| Message::HomeQuery { page }),
        (page.clone(), from.clone()).prop_map(|(page, home)| Message::HomeIs { page, home }),
        (page.clone(), any::<bool>(), any::<bool>()).prop_map(|(page, writable, zero)| {
            Message::PageData {
                page,
                writable,
                zero,
            }
        }),
        (page.clone(), 0u16..3).prop_map(|(page, tag)| Message::Diff { page, tag }),
        (page.clone(), 0u16..3).prop_map(|(page, tag)| Message::DiffAck { page, tag }),
        page.clone().prop_map(|page| Message::ScRead { page }),
        page.clone().prop_map(|page| Message::ScWrite { page }),
        page.clone().prop_map(|page| Message::ScUpgrade { page }),
        page.clone().prop_map(|page| Message::ScInvalidate { page }),
        page.clone().prop_map(|page| Message::ScInvAck { page }),
        (page.clone(), any::<bool>())
            .prop_map(|(page, invalidate)| Message::ScRecall { page, invalidate }),
        page.clone().prop_map(|page| Message::ScWriteBack { page }),
        (lock.clone(), time.clone()).prop_map(|(lock, time)| Message::LockAcquire { lock, time }),
        (
            lock.clone(),
            time.clone(),
            proptest::collection::vec(rec.clone(), 0..2)
        )
            .prop_map(|(lock, time, records)| Message::LockGrant {
                lock,
                time,
                records
            }),
        (
            lock.clone(),
            time.clone(),
            proptest::collection::vec(rec.clone(), 0..2)
        )
            .prop_map(|(lock, time, records)| Message::LockRelease {
                lock,
                gc: time.clone(),
                time,
                records
            }),
        (
            0u32..2,
            time.clone(),
            proptest::collection::vec(rec, 0..2),
            proptest::collection::vec(page.clone(), 0..2)
        )
            .prop_map(
                |(episode, time, records, migratable)| Message::BarrierArrive {
                    episode,
                    time,
                    records,
                    migratable
                }
            ),
        (
            0u32..2,
            time,
            proptest::collection::vec(page.clone(), 0..2),
            proptest::collection::vec((page.clone(), from.clone()), 0..2)
        )
            .prop_map(
                |(episode, time, notices, migrations)| Message::BarrierDepart {
                    episode,
                    time,
                    notices,
                    migrations
                }
            ),
    ];
    prop_oneof![
        (page.clone(), 0u64..3).prop_map(|(page, t)| Event::ReadFault {
            page,
            token: FaultToken(t)
        }),
        (page, 0u64..3).prop_map(|(page, t)| Event::WriteFault {
            page,
            token: FaultToken(t)
        }),
        (lock.clone(), 0u64..3).prop_map(|(lock, t)| Event::Acquire {
            lock,
            token: SyncToken(t)
        }),
        (lock, 0u64..3).prop_map(|(lock, t)| Event::Release {
            lock,
            token: SyncToken(t)
        }),
        (0u64..3).prop_map(|t| Event::Barrier {
            token: SyncToken(t)
        }),
        (from, message, 0usize..5000).prop_map(|(from, msg, attached_len)| Event::Message {
            from,
            msg,
            attached_len
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Arbitrary (mostly nonsensical) event sequences: the machine answers with
    /// actions or an error, never a panic; after an error a fresh machine is used.
    #[test]
    fn arbitrary_events_never_panic(
        sc in any::<bool>(),
        first_touch in any::<bool>(),
        events in proptest::collection::vec(event(3, 3), 1..40),
    ) {
        let mut cfg = Config::new(if sc { Protocol::Sc } else { Protocol::Hlrc }, 3, 3);
        if first_touch {
            cfg.home_policy = multigrain_coherence::HomePolicy::FirstTouch;
        }
        let mut m = Machine::new(c(1), cfg.clone()).unwrap();
        let mut out = Vec::new();
        for e in events {
            if m.handle(e, &mut out).is_err() {
                m = Machine::new(c(1), cfg.clone()).unwrap();
            }
            out.clear();
        }
    }
}
