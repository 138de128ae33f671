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

fn acquire(lock: u32, token: u64) -> Event {
    Event::Acquire {
        lock: l(lock),
        token: SyncToken(token),
    }
}

fn release(lock: u32, token: u64) -> Event {
    Event::Release {
        lock: l(lock),
        token: SyncToken(token),
    }
}

fn request_from(from: u16, lock: u32) -> Event {
    msg(
        from,
        Message::LockAcquire {
            lock: l(lock),
            time: multigrain_coherence::VectorTime::new(),
            seen: 0,
        },
    )
}

fn grant(lock: u32, tenure: u32, contended: bool) -> Message {
    Message::LockGrant {
        lock: l(lock),
        time: multigrain_coherence::VectorTime::new(),
        records: vec![],
        tenure,
        contended,
    }
}

fn recall(lock: u32, tenure: u32) -> Message {
    Message::LockRecall {
        lock: l(lock),
        tenure,
    }
}

/// Lock caching: a lock granted to a cluster stays there; its threads acquire and
/// release it without messages until the manager recalls it. A contended lock goes
/// back at its release; a pushed one after its first use.
#[test]
fn cached_lock_is_reacquired_without_messages_until_recalled() {
    let cfg = Config::new(Protocol::Hlrc, 2, 4);
    let mut me = Machine::new(c(0), cfg).unwrap();
    // lock 1 is managed by cluster 1: the first acquire asks for it
    assert_eq!(
        run(&mut me, acquire(1, 1)),
        vec![Action::Send {
            to: c(1),
            msg: Message::LockAcquire {
                lock: l(1),
                time: multigrain_coherence::VectorTime::new(),
                seen: 0,
            }
        }]
    );
    // a second thread waits behind the request without a message of its own
    assert_eq!(run(&mut me, acquire(1, 2)), vec![]);
    assert_eq!(
        run(&mut me, msg(1, grant(1, 1, false))),
        vec![Action::AcquireDone {
            lock: l(1),
            token: SyncToken(1)
        }]
    );
    // the holder passes it on to the local waiter, then the lock stays cached
    assert_eq!(
        run(&mut me, release(1, 1)),
        vec![
            Action::ReleaseDone {
                lock: l(1),
                token: SyncToken(1)
            },
            Action::AcquireDone {
                lock: l(1),
                token: SyncToken(2)
            },
        ]
    );
    assert_eq!(
        run(&mut me, release(1, 2)),
        vec![Action::ReleaseDone {
            lock: l(1),
            token: SyncToken(2)
        }]
    );
    for t in 3..6 {
        assert_eq!(
            run(&mut me, acquire(1, t)),
            vec![Action::AcquireDone {
                lock: l(1),
                token: SyncToken(t)
            }]
        );
        assert_eq!(
            run(&mut me, release(1, t)),
            vec![Action::ReleaseDone {
                lock: l(1),
                token: SyncToken(t)
            }]
        );
    }
    assert_eq!(me.stats().lock_acquires, 5);
    assert_eq!(me.stats().lock_requests, 1);
    assert_eq!(me.stats().lock_local_acquires, 4);
    assert_eq!(me.stats().messages_sent, 1);
    // the manager recalls tenure 1: given back at once (nothing dirty to wait for)
    let a = run(&mut me, msg(1, recall(1, 1)));
    assert!(
        matches!(a.as_slice(), [Action::Send { to, msg: Message::LockRelease { lock, tenure: 1, .. } }] if *to == c(1) && *lock == l(1)),
        "{a:?}"
    );
    assert!(me.is_quiescent());
    // a second recall of that tenure is stale: ignored
    assert_eq!(run(&mut me, msg(1, recall(1, 1))), vec![]);
    // a contended lock is given back at its release without a recall (eager); the
    // request says which tenure this cluster saw last
    let a = run(&mut me, acquire(1, 7));
    assert!(
        matches!(
            a.as_slice(),
            [Action::Send {
                msg: Message::LockAcquire { seen: 1, .. },
                ..
            }]
        ),
        "{a:?}"
    );
    assert_eq!(run(&mut me, msg(1, grant(1, 3, true))).len(), 1);
    let a = run(&mut me, release(1, 7));
    assert!(
        matches!(
            a.as_slice(),
            [
                Action::Send {
                    msg: Message::LockRelease {
                        tenure: 3,
                        unused: false,
                        ..
                    },
                    ..
                },
                Action::ReleaseDone { .. }
            ]
        ),
        "{a:?}"
    );
    assert_eq!(me.stats().lock_eager_releases, 1);
    // a push (a grant without a request) waits for the next local acquire, which takes
    // it without a message; its release sends it back
    assert_eq!(run(&mut me, msg(1, grant(1, 5, true))), vec![]);
    assert_eq!(me.stats().lock_pushes_received, 1);
    assert_eq!(
        run(&mut me, acquire(1, 8)),
        vec![Action::AcquireDone {
            lock: l(1),
            token: SyncToken(8)
        }]
    );
    let a = run(&mut me, release(1, 8));
    assert!(
        matches!(
            a.as_slice(),
            [
                Action::Send {
                    msg: Message::LockRelease { tenure: 5, .. },
                    ..
                },
                Action::ReleaseDone { .. }
            ]
        ),
        "{a:?}"
    );
    // a stale recall of that tenure is ignored
    assert_eq!(run(&mut me, msg(1, recall(1, 5))), vec![]);
    // a recall that overtakes its (pushed) grant applies when the grant arrives: the
    // unused lock goes straight back
    assert_eq!(run(&mut me, msg(1, recall(1, 9))), vec![]);
    let a = run(&mut me, msg(1, grant(1, 9, true)));
    assert!(
        matches!(
            a.as_slice(),
            [Action::Send {
                msg: Message::LockRelease { tenure: 9, .. },
                ..
            }]
        ),
        "{a:?}"
    );
    assert!(me.is_quiescent());
}

/// Write fault → twin; a release of a recalled lock write-protects first, then
/// diffs; the thread goes on at once, but the lock leaves (the release reaches the
/// manager) only after the home's acknowledgement, and releases leave in order.
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
    assert_eq!(
        run(&mut me, acquire(0, 1)),
        vec![Action::AcquireDone {
            lock: l(0),
            token: SyncToken(1)
        }]
    );
    // cluster 1 asks for it: the manager (this cluster) recalls it from its holder
    assert_eq!(run(&mut me, request_from(1, 0)), vec![]);
    assert_eq!(me.stats().lock_recalls, 1);
    assert_eq!(
        run(&mut me, release(0, 1)),
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
            // the thread goes on; the lock leaves once the diff is acknowledged
            Action::ReleaseDone {
                lock: l(0),
                token: SyncToken(1)
            },
        ]
    );
    // a second recalled release (another thread, lock 2) with nothing dirty must
    // still wait for the first before its lock leaves
    run(&mut me, acquire(2, 2));
    run(&mut me, request_from(1, 2));
    assert_eq!(
        run(&mut me, release(2, 2)),
        vec![Action::ReleaseDone {
            lock: l(2),
            token: SyncToken(2)
        }]
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
        a[..3],
        [
            Action::MakeTwin { page: p(1) },
            Action::Unprotect { page: p(1) },
            Action::Wake {
                page: p(1),
                tokens: vec![FaultToken(3)]
            },
        ]
    );
    // then the manager hands both locks to cluster 1, in order, with the write notice
    // of p(1), and says they are contended (cluster 0 held them)
    let grants: Vec<_> = a[3..]
        .iter()
        .map(|x| match x {
            Action::Send {
                to,
                msg:
                    Message::LockGrant {
                        lock,
                        records,
                        contended,
                        ..
                    },
            } if *to == c(1) => (lock.get(), records.len(), *contended),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(grants, vec![(0, 1, true), (2, 1, true)]);
    assert!(me.is_quiescent());
    assert_eq!(me.vector_time().entries(), &[1]);
}

/// The home's own writes need no twin and no diff. While no other cluster has
/// fetched the page they need no write notice either (the page stays writable); once
/// another cluster holds a copy, they produce write notices.
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
    // a release does not protect the private page
    run(&mut home, acquire(0, 1));
    assert_eq!(
        run(&mut home, release(0, 1)),
        vec![Action::ReleaseDone {
            lock: l(0),
            token: SyncToken(1)
        }]
    );
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
    let one = PageRange {
        start: p(0),
        count: 1,
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
        },]
    );
    assert_eq!(home.stats().home_pages_shared, 1);
    assert_eq!(home.copyset(p(0)), vec![c(0), c(1)]);
    run(&mut other, msg(0, data));
    // the home keeps writing (the page is still writable) under its cached lock
    run(&mut home, acquire(0, 2));
    run(&mut home, release(0, 2));
    // cluster 1 acquires lock 0 from its manager (cluster 0), which recalls it from
    // itself: the interval closes, protecting the page and recording the notice that
    // covers the home's writes after the copy
    let a = run(&mut other, acquire(0, 4));
    let [Action::Send { to, msg: req }] = a.as_slice() else {
        panic!("{a:?}")
    };
    assert_eq!(*to, c(0));
    let a = run(&mut home, msg(1, req.clone()));
    let [
        Action::WriteProtect { pages },
        Action::Send { msg: grant, .. },
    ] = a.as_slice()
    else {
        panic!("{a:?}")
    };
    assert_eq!(*pages, one);
    let Message::LockGrant { records, .. } = grant else {
        panic!("{grant:?}")
    };
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].pages, vec![p(0)]);
    // from now on the home's writes fault and are tracked
    assert_eq!(
        run(&mut home, write(3)),
        vec![Action::Unprotect { page: p(0) }, wake(3)]
    );
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
        (lock.clone(), time.clone(), 0u32..3)
            .prop_map(|(lock, time, seen)| { Message::LockAcquire { lock, time, seen } }),
        (lock.clone(), 0u32..3).prop_map(|(lock, tenure)| Message::LockRecall { lock, tenure }),
        (
            lock.clone(),
            time.clone(),
            proptest::collection::vec(rec.clone(), 0..2)
        )
            .prop_map(|(lock, time, records)| Message::LockGrant {
                lock,
                time,
                records,
                tenure: 1,
                contended: false
            }),
        (
            lock.clone(),
            time.clone(),
            proptest::collection::vec(rec.clone(), 0..2)
        )
            .prop_map(|(lock, time, records)| Message::LockRelease {
                lock,
                tenure: 1,
                unused: false,
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
