//! Action sequences of single machines for the cases the runtime must get right
//! (they double as examples of the calling contract), and a fuzz test: arbitrary
//! event sequences never make a machine panic.

use multigrain_coherence::{
    Action, ClusterId, Config, DiffBytes, Event, FaultToken, FlushPage, IntervalDiff,
    IntervalRecord, LockId, Machine, Message, PageAccess, PageId, PageRange, Protocol,
    ProtocolError, Source, SyncToken, VectorTime,
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
    Event::Message { from: c(from), msg }
}

/// The episode of the barrier arrival among `actions`.
fn arrival_episode(actions: &[Action]) -> u32 {
    actions
        .iter()
        .find_map(|x| match x {
            Action::Send {
                msg: Message::BarrierArrive { episode, .. },
                ..
            } => Some(*episode),
            _ => None,
        })
        .expect("an arrival")
}

fn get(page: u32) -> Message {
    Message::GetPage {
        page: p(page),
        need: VectorTime::new(),
    }
}

/// The `GetPage` sends of `pages` to cluster 1, in order.
fn get_pages_to_c1(pages: &[u32]) -> Vec<Action> {
    pages
        .iter()
        .map(|&n| Action::Send {
            to: c(1),
            msg: get(n),
        })
        .collect()
}

/// The hot path of design.md: remote read fault → GetPage → home replies with the
/// page (Tag-On) → install read-only → wake.
#[test]
fn remote_read_fault_hot_path() {
    let mut cfg = Config::new(Protocol::Hlrc, 2, 4);
    cfg.prefetch = 0; // see the prefetch tests

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
            msg: get(1)
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
    let a = run(&mut home, msg(0, get(1)));
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

fn fault(page: u32, token: u64) -> Event {
    Event::ReadFault {
        page: p(page),
        token: FaultToken(token),
    }
}

fn page_data(page: u32) -> Message {
    Message::PageData {
        page: p(page),
        writable: false,
        zero: false,
    }
}

/// Write-ahead: a write fault that continues the previous one's pages opens the next
/// read-only pages (a copy with its twin, a private home page without), up to
/// `write_ahead`, stopping at a page that is not read-only; the first fault of a sweep
/// opens nothing.
#[test]
fn a_write_fault_that_continues_a_sweep_opens_the_next_pages() {
    let mut cfg = Config::new(Protocol::Hlrc, 2, 8);
    cfg.prefetch = 0;
    cfg.write_ahead = 2;
    let mut me = Machine::new(c(0), cfg).unwrap();
    // Read-only copies of pages 1–6: odd pages homed at cluster 1, even ones here.
    for page in 1..=6 {
        run(&mut me, fault(page, 100 + u64::from(page)));
        if page % 2 == 1 {
            run(&mut me, msg(1, page_data(page)));
        }
        assert_eq!(
            me.access(p(page)),
            Some(PageAccess::ReadOnly),
            "page {page}"
        );
    }
    let write = |page, t| Event::WriteFault {
        page: p(page),
        token: FaultToken(t),
    };
    let opened = |a: &[Action]| -> Vec<u32> {
        a.iter()
            .filter_map(|x| match x {
                Action::Unprotect { page } => Some(page.get()),
                _ => None,
            })
            .collect()
    };
    let twins = |a: &[Action]| -> Vec<u32> {
        a.iter()
            .filter_map(|x| match x {
                Action::MakeTwin { page } => Some(page.get()),
                _ => None,
            })
            .collect()
    };
    let a = run(&mut me, write(1, 1));
    assert_eq!((opened(&a), twins(&a)), (vec![1], vec![1]), "{a:?}");
    // Continues the sweep: pages 3 (a copy: twin) and 4 (private at its home: none).
    let a = run(&mut me, write(2, 2));
    assert_eq!((opened(&a), twins(&a)), (vec![2, 3, 4], vec![3]), "{a:?}");
    assert!(a.iter().any(|x| matches!(x, Action::Wake { .. })), "{a:?}");
    assert_eq!(me.access(p(4)), Some(PageAccess::ReadWrite));
    assert_eq!(me.stats().write_ahead_pages, 2);
    // Page 5 continues again; page 7 is missing here, so only 6 opens.
    let a = run(&mut me, write(5, 3));
    assert_eq!(opened(&a), vec![5, 6], "{a:?}");
    assert_eq!(me.access(p(7)), Some(PageAccess::Invalid));
    assert_eq!(me.stats().write_ahead_pages, 3);
    assert_eq!(me.stats().write_faults, 3);
}

/// Prefetch: a fault on page 1 also requests the next pages homed at the other
/// cluster (3, 5 and 7; the even ones are homed here); a prefetched page is installed
/// without waking anyone, and a fault on a page being prefetched joins its fetch.
#[test]
fn a_fault_prefetches_the_next_pages_homed_elsewhere() {
    let cfg = Config::new(Protocol::Hlrc, 2, 8);
    assert_eq!(cfg.prefetch, 7);
    let mut me = Machine::new(c(0), cfg).unwrap();
    assert_eq!(run(&mut me, fault(1, 1)), get_pages_to_c1(&[1, 3, 5, 7]));
    assert_eq!(me.stats().prefetches, 3);
    assert_eq!(
        run(&mut me, msg(1, page_data(3))),
        vec![Action::Install {
            page: p(3),
            source: Source::Attached,
            writable: false
        }]
    );
    assert_eq!(me.access(p(3)), Some(PageAccess::ReadOnly));
    assert_eq!(run(&mut me, fault(5, 2)), vec![]);
    assert_eq!(
        run(&mut me, msg(1, page_data(5))),
        vec![
            Action::Install {
                page: p(5),
                source: Source::Attached,
                writable: false
            },
            Action::Wake {
                page: p(5),
                tokens: vec![FaultToken(2)]
            }
        ]
    );
    // a fault on the installed page 3 would not fault again; page 7 and the demand
    // page 1 arrive out of order
    run(&mut me, msg(1, page_data(7)));
    assert_eq!(
        run(&mut me, msg(1, page_data(1)))
            .into_iter()
            .filter(|a| matches!(a, Action::Wake { .. }))
            .count(),
        1
    );
    assert_eq!(me.stats().prefetches_installed, 2);
    assert!(me.is_quiescent());
    // a later fault on page 1's neighbours requests nothing more: all are here
    assert_eq!(run(&mut me, fault(0, 3)).len(), 2, "page 0 is homed here");
}

/// Read-ahead stops at the extent the application's data covers (`set_extent`): with
/// the data in pages 0..=4, a fault on page 1 prefetches page 3 only, not 5 and 7.
#[test]
fn read_ahead_stops_at_the_data_extent() {
    let cfg = Config::new(Protocol::Hlrc, 2, 8);
    let mut me = Machine::new(c(0), cfg).unwrap();
    me.set_extent(5);
    assert_eq!(run(&mut me, fault(1, 1)), get_pages_to_c1(&[1, 3]));
    assert_eq!(me.stats().prefetches, 1);
    // No data at all: the demand fetch only.
    let mut none = Machine::new(c(0), Config::new(Protocol::Hlrc, 2, 8)).unwrap();
    none.set_extent(0);
    assert_eq!(run(&mut none, fault(1, 1)).len(), 1);
    // A bound beyond the region is the region's end.
    let mut all = Machine::new(c(0), Config::new(Protocol::Hlrc, 2, 8)).unwrap();
    all.set_extent(1000);
    assert_eq!(run(&mut all, fault(1, 1)).len(), 4);
}

/// A prefetch that a write notice made stale on its way is dropped: the page stays
/// missing and its next fault asks for the versions known now.
#[test]
fn a_stale_prefetch_is_dropped_and_the_page_fetched_again_on_use() {
    let cfg = Config::new(Protocol::Hlrc, 2, 8);
    let mut me = Machine::new(c(0), cfg).unwrap();
    run(&mut me, fault(1, 1));
    // cluster 1 wrote page 3 in its interval 1; the lock's grant says so
    run(&mut me, acquire(1, 9));
    let mut time = VectorTime::new();
    time.set(c(1), 1);
    let notice = Message::LockGrant {
        lock: l(1),
        time: time.clone(),
        records: vec![IntervalRecord {
            owner: c(1),
            index: 1,
            pages: vec![p(3)].into(),
        }],
        diffs: vec![],
        stored: 0,
        tenure: 1,
        contended: false,
    };
    run(&mut me, msg(1, notice));
    assert_eq!(run(&mut me, msg(1, page_data(3))), vec![]);
    assert_eq!(me.access(p(3)), Some(PageAccess::Invalid));
    assert_eq!(me.stats().prefetches_dropped, 1);
    assert_eq!(
        run(&mut me, fault(3, 2)),
        vec![Action::Send {
            to: c(1),
            msg: Message::GetPage {
                page: p(3),
                need: time
            }
        }]
    );
}

/// A read-only copy of page 1 (homed at cluster 1) at cluster 0; cluster 1's barrier
/// flush sends the update of page 1 from its interval 1, then the grant of the lock
/// cluster 0 waits for brings that interval's write notice — with the same diff
/// carried too if `carried`. Returns the machine, the grant's actions, the diff's
/// bytes, the interval's time and its record.
fn grant_after_held_update(
    carried: bool,
) -> (Machine, Vec<Action>, DiffBytes, VectorTime, IntervalRecord) {
    let mut cfg = Config::new(Protocol::Hlrc, 2, 4);
    cfg.prefetch = 0;
    cfg.barrier_manager = c(1);
    let mut me = Machine::new(c(0), cfg).unwrap();
    run(&mut me, fault(1, 1));
    run(&mut me, msg(1, page_data(1)));
    assert_eq!(me.access(p(1)), Some(PageAccess::ReadOnly));
    let data = DiffBytes::new(vec![3, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0]);
    let update = IntervalDiff {
        page: p(1),
        owner: c(1),
        index: 1,
        base: VectorTime::new(),
        data: data.clone(),
    };
    assert_eq!(
        run(
            &mut me,
            msg(
                1,
                Message::Update {
                    diff: update.clone()
                }
            )
        ),
        vec![]
    );
    run(&mut me, acquire(1, 9));
    let mut time = VectorTime::new();
    time.set(c(1), 1);
    let record = IntervalRecord {
        owner: c(1),
        index: 1,
        pages: vec![p(1)].into(),
    };
    let a = run(
        &mut me,
        msg(
            1,
            Message::LockGrant {
                lock: l(1),
                time: time.clone(),
                records: vec![record.clone()],
                diffs: if carried { vec![update] } else { vec![] },
                stored: 0,
                tenure: 1,
                contended: false,
            },
        ),
    );
    (me, a, data, time, record)
}

/// The same diff reaches a copy twice, as a held barrier update and carried with the
/// grant that brings its write notice: it is applied once, and the held update counts
/// as dropped because the copy already had it (`updates_redundant`), not as one that
/// found no copy.
#[test]
fn an_update_that_came_with_the_grant_too_is_counted_as_redundant() {
    let (me, a, data, _, _) = grant_after_held_update(true);
    let applied: Vec<&Action> = a
        .iter()
        .filter(|x| matches!(x, Action::ApplyDiff { .. }))
        .collect();
    assert_eq!(
        applied,
        [&Action::ApplyDiff {
            page: p(1),
            data,
            twin: false
        }],
        "{a:?}"
    );
    assert_eq!(me.access(p(1)), Some(PageAccess::ReadOnly));
    let st = me.stats();
    assert_eq!(
        (st.updates_applied, st.updates_dropped, st.updates_redundant),
        (0, 1, 1)
    );
    assert_eq!(st.invalidations, 0);
}

/// A barrier flush sends the updates of the pages homed at the flushing cluster, then
/// gives back the locks other clusters asked for meanwhile (SPLASH's sums under a lock
/// just before a barrier). A grant that brings the flush's write notice before the
/// departure does — here without the diff, as when the interval wrote more pages than
/// a lock carries — applies the held update: the copy stays valid, nothing is fetched
/// again, and the departure has nothing left to apply.
#[test]
fn a_grant_applies_a_held_barrier_update() {
    // the grant brings the notice only
    let (mut me, a, data, time, record) = grant_after_held_update(false);
    assert!(
        a.contains(&Action::ApplyDiff {
            page: p(1),
            data,
            twin: false
        }),
        "{a:?}"
    );
    assert!(
        !a.iter().any(|x| matches!(x, Action::Invalidate { .. })),
        "{a:?}"
    );
    assert_eq!(me.access(p(1)), Some(PageAccess::ReadOnly));
    let st = me.stats();
    assert_eq!((st.updates_applied, st.updates_at_grant), (1, 1));
    assert_eq!(st.invalidations, 0);
    // the departure brings the same notice: already known, nothing to apply or drop
    run(&mut me, release(1, 10));
    let a = run(
        &mut me,
        Event::Barrier {
            token: SyncToken(11),
        },
    );
    let episode = arrival_episode(&a);
    let a = run(
        &mut me,
        msg(
            1,
            Message::BarrierDepart {
                episode,
                time,
                records: vec![record],
                migrations: vec![],
                updates_due: vec![],
            },
        ),
    );
    assert!(
        !a.iter()
            .any(|x| matches!(x, Action::Invalidate { .. } | Action::ApplyDiff { .. })),
        "{a:?}"
    );
    let st = me.stats();
    assert_eq!((st.updates_applied, st.updates_dropped), (1, 0));
    assert_eq!(me.access(p(1)), Some(PageAccess::ReadOnly));
}

/// A release whose flush wrote more pages than a lock carries diffs
/// (`MAX_CARRIED_DIFFS`) sends the older diffs of the pages homed at the releaser to
/// their copysets as updates, ahead of the grant: the next holder applies all of them
/// and invalidates nothing (Water's positions, written outside any lock and released
/// with a sum's lock).
#[test]
fn a_release_sends_the_diffs_its_lock_cannot_carry_as_updates() {
    let mut cfg = Config::new(Protocol::Hlrc, 2, 64);
    cfg.prefetch = 0;
    let mut home = Machine::new(c(0), cfg.clone()).unwrap();
    let mut other = Machine::new(c(1), cfg).unwrap();
    let n = multigrain_coherence::sync::MAX_CARRIED_DIFFS as u32 + 2;
    // pages 0, 2, 4, … are homed at cluster 0: written there, then fetched by cluster 1
    let pages: Vec<u32> = (0..n).map(|i| 2 * i).collect();
    for (t, &pg) in pages.iter().enumerate() {
        let t = t as u64;
        run(
            &mut home,
            Event::WriteFault {
                page: p(pg),
                token: FaultToken(t),
            },
        );
        run(&mut other, fault(pg, 100 + t));
        run(&mut home, msg(1, get(pg)));
        run(&mut other, msg(0, page_data(pg)));
        assert!(home.has_twin(p(pg)));
    }
    // cluster 0 takes lock 0 (managed there) and keeps it cached; cluster 1 asks for
    // it: the recall flushes every open page
    run(&mut home, acquire(0, 50));
    run(&mut home, release(0, 50));
    let a = run(&mut other, acquire(0, 1));
    let [Action::Send { msg: req, .. }] = a.as_slice() else {
        panic!("{a:?}")
    };
    let a = run(&mut home, msg(1, req.clone()));
    let [Action::Flush { pages: flushed }] = a.as_slice() else {
        panic!("{a:?}")
    };
    assert_eq!(flushed.len(), n as usize);
    let diffs: Vec<DiffBytes> = (0..n)
        .map(|i| DiffBytes::new(vec![0, 0, 1, 0, i as u8 + 1, 0, 0, 0, 0, 0, 0, 0]))
        .collect();
    let a = run(&mut home, Event::Flushed { diffs });
    let updates: Vec<&Message> = a
        .iter()
        .filter_map(|x| match x {
            Action::Send {
                msg: m @ Message::Update { .. },
                ..
            } => Some(m),
            _ => None,
        })
        .collect();
    assert_eq!(updates.len(), 2, "{a:?}");
    let grant = a
        .iter()
        .find_map(|x| match x {
            Action::Send {
                msg: m @ Message::LockGrant { .. },
                ..
            } => Some(m.clone()),
            _ => None,
        })
        .expect("a grant");
    let Message::LockGrant { diffs, .. } = &grant else {
        unreachable!()
    };
    assert_eq!(diffs.len(), n as usize - 2);
    // cluster 1: the updates first (same sender, in order), then the grant
    for u in updates {
        assert_eq!(run(&mut other, msg(0, u.clone())), vec![]);
    }
    let a = run(&mut other, msg(0, grant));
    let applied = a
        .iter()
        .filter(|x| matches!(x, Action::ApplyDiff { .. }))
        .count();
    assert_eq!(applied, n as usize, "{a:?}");
    assert!(
        !a.iter().any(|x| matches!(x, Action::Invalidate { .. })),
        "{a:?}"
    );
    let st = other.stats();
    assert_eq!((st.updates_at_grant, st.invalidations), (2, 0));
    for &pg in &pages {
        assert_eq!(other.access(p(pg)), Some(PageAccess::ReadOnly));
    }
}

/// A barrier arrival waits until the prefetches in flight have landed (no reply may
/// cross a home migration at the departure).
#[test]
fn a_barrier_arrival_waits_for_prefetches_in_flight() {
    let mut cfg = Config::new(Protocol::Hlrc, 2, 8);
    cfg.barrier_manager = c(1);
    let mut me = Machine::new(c(0), cfg).unwrap();
    run(&mut me, fault(1, 1));
    run(&mut me, msg(1, page_data(1)));
    let arrivals = |a: &[Action]| {
        a.iter()
            .filter(|a| {
                matches!(
                    a,
                    Action::Send {
                        msg: Message::BarrierArrive { .. },
                        ..
                    }
                )
            })
            .count()
    };
    let a = run(
        &mut me,
        Event::Barrier {
            token: SyncToken(5),
        },
    );
    assert_eq!(arrivals(&a), 0, "{a:?}");
    assert_eq!(arrivals(&run(&mut me, msg(1, page_data(3)))), 0);
    assert_eq!(arrivals(&run(&mut me, msg(1, page_data(5)))), 0);
    assert_eq!(arrivals(&run(&mut me, msg(1, page_data(7)))), 1);
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
        diffs: vec![],
        stored: 0,
        tenure,
        contended,
    }
}

/// The tenure and `unused` flag of the `LockRelease` a release sent, when its actions
/// are exactly "release done, then that message" (the release went to the manager).
fn released(a: &[Action]) -> Option<(u32, bool)> {
    match a {
        [
            Action::ReleaseDone { .. },
            Action::Send {
                msg: Message::LockRelease { tenure, unused, .. },
                ..
            },
        ] => Some((*tenure, *unused)),
        _ => None,
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
/// back at its release; a pushed one after its first use (without release batching;
/// see the next test).
#[test]
fn cached_lock_is_reacquired_without_messages_until_recalled() {
    let mut cfg = Config::new(Protocol::Hlrc, 2, 4);
    cfg.release_batch = 1;
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
    assert_eq!(released(&a), Some((3, false)), "{a:?}");
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
    assert_eq!(released(&a).map(|(t, _)| t), Some(5), "{a:?}");
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

/// Release batching: contended and pushed locks released by their last local
/// holder wait, still owned, until `release_batch` of them do; then one flush closes
/// one interval for all and their releases leave together. A local acquire takes a
/// waiting lock back without a message; a recall of any of them, or a local request
/// for a lock another cluster owns, sends the whole batch at once.
/// A runtime may pass a lock that `lock_cacheable` allows among its threads without
/// the machine; the machine says when it wants the lock back (`LockWanted`): a local
/// thread queues behind the holder, or the manager recalls it. A recalled or contended
/// lock is never cacheable.
#[test]
fn a_cacheable_lock_is_wanted_back_by_a_local_waiter_or_a_recall() {
    let mut cfg = Config::new(Protocol::Hlrc, 2, 4);
    cfg.release_batch = 1;
    let mut me = Machine::new(c(0), cfg).unwrap();
    assert!(!me.lock_cacheable(l(1)), "never granted");
    run(&mut me, acquire(1, 1));
    assert!(!me.lock_cacheable(l(1)), "requested, not granted");
    assert_eq!(
        run(&mut me, msg(1, grant(1, 1, false))),
        vec![Action::AcquireDone {
            lock: l(1),
            token: SyncToken(1)
        }]
    );
    assert!(me.lock_cacheable(l(1)), "owned, held, unwanted");
    // Another local thread asks the machine (the runtime's holder has it): it waits,
    // and the runtime hears that the lock is wanted.
    assert_eq!(
        run(&mut me, acquire(1, 2)),
        vec![Action::LockWanted { lock: l(1) }]
    );
    assert!(!me.lock_cacheable(l(1)), "a local thread waits");
    // The holder's release (by the runtime, with a token of its own) passes it on.
    assert_eq!(
        run(&mut me, release(1, 99)),
        vec![
            Action::ReleaseDone {
                lock: l(1),
                token: SyncToken(99)
            },
            Action::AcquireDone {
                lock: l(1),
                token: SyncToken(2)
            },
        ]
    );
    assert!(me.lock_cacheable(l(1)));
    // The manager recalls it while held: wanted again, and no longer cacheable; the
    // release gives it back.
    assert_eq!(
        run(&mut me, msg(1, recall(1, 1))),
        vec![Action::LockWanted { lock: l(1) }]
    );
    assert!(!me.lock_cacheable(l(1)), "recalled");
    let a = run(&mut me, release(1, 2));
    assert!(released(&a).is_some(), "{a:?}");
    assert!(!me.lock_cacheable(l(1)), "given back");
    // A contended grant goes back after its first use: never cacheable.
    run(&mut me, acquire(1, 3));
    assert_eq!(
        run(&mut me, msg(1, grant(1, 2, true))),
        vec![Action::AcquireDone {
            lock: l(1),
            token: SyncToken(3)
        }]
    );
    assert!(!me.lock_cacheable(l(1)), "contended");
}

#[test]
fn eager_releases_leave_in_batches() {
    let mut cfg = Config::new(Protocol::Hlrc, 2, 4);
    cfg.release_batch = 3;
    let mut me = Machine::new(c(0), cfg).unwrap();
    let releases = |a: &[Action]| -> Vec<u32> {
        a.iter()
            .filter_map(|a| match a {
                Action::Send {
                    to,
                    msg: Message::LockRelease { lock, unused, .. },
                } => {
                    assert_eq!(*to, c(1), "locks 1, 3, 5, 7 are managed by cluster 1");
                    assert!(!unused);
                    Some(lock.get())
                }
                _ => None,
            })
            .collect()
    };
    // Locks 1, 3 and 5 (managed by cluster 1) pushed here: each is used once.
    for (i, lock) in [1u32, 3, 5].into_iter().enumerate() {
        assert_eq!(run(&mut me, msg(1, grant(lock, 1, true))), vec![]);
        let t = 10 + i as u64;
        assert_eq!(run(&mut me, acquire(lock, t)).len(), 1);
        let a = run(&mut me, release(lock, t));
        if lock < 5 {
            // released, kept for the batch: no message
            assert_eq!(
                a,
                vec![Action::ReleaseDone {
                    lock: l(lock),
                    token: SyncToken(t)
                }]
            );
            if lock == 3 {
                // lock 1, waiting for the batch, is taken again without a message
                assert_eq!(
                    run(&mut me, acquire(1, 20)),
                    vec![Action::AcquireDone {
                        lock: l(1),
                        token: SyncToken(20)
                    }]
                );
                assert_eq!(run(&mut me, release(1, 20)).len(), 1);
            }
        } else {
            // the third fills the batch: all three leave together
            let mut got = releases(&a);
            got.sort_unstable();
            assert_eq!(got, vec![1, 3, 5], "{a:?}");
        }
    }
    assert_eq!(me.stats().release_batches, 1);
    assert_eq!(me.stats().lock_eager_releases, 4);
    assert_eq!(me.stats().messages_sent, 3);
    // A recall of one waiting lock sends every waiting lock.
    for lock in [1u32, 3] {
        run(&mut me, msg(1, grant(lock, 2, true)));
        run(&mut me, acquire(lock, 30 + u64::from(lock)));
        assert_eq!(
            releases(&run(&mut me, release(lock, 30 + u64::from(lock)))),
            vec![]
        );
    }
    let mut got = releases(&run(&mut me, msg(1, recall(3, 2))));
    got.sort_unstable();
    assert_eq!(got, vec![1, 3]);
    // A local thread that must ask another cluster for a lock sends the batch first.
    run(&mut me, msg(1, grant(5, 2, true)));
    run(&mut me, acquire(5, 40));
    assert_eq!(releases(&run(&mut me, release(5, 40))), vec![]);
    let a = run(&mut me, acquire(7, 41));
    assert_eq!(releases(&a), vec![5], "{a:?}");
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::Send { msg: Message::LockAcquire { lock, .. }, .. } if lock.get() == 7)),
        "{a:?}"
    );
    assert_eq!(me.stats().release_batches, 3);
}

fn one(page: u32) -> PageRange {
    PageRange {
        start: p(page),
        count: 1,
    }
}

fn flush(page: u32, keep_open: bool) -> Action {
    Action::Flush {
        pages: vec![FlushPage {
            page: p(page),
            keep_open,
        }],
    }
}

/// Write fault → twin; a release that hands a lock to another cluster flushes the
/// open page (diffed, twin refreshed, kept writable) and the lock leaves at once with
/// the diff, without waiting for the home; a page unchanged at one flush is
/// write-protected and closed at the next; a write fault never waits for the home.
#[test]
fn release_flushes_open_pages_and_does_not_wait_for_the_home() {
    let mut cfg = Config::new(Protocol::Hlrc, 2, 4);
    cfg.prefetch = 0; // see the prefetch tests
    // Closed after two unchanged flushes (the default waits for more; the count is
    // the configuration's, so the walk below is the same for any value).
    cfg.idle_flushes = 2;

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
    let write = |t| Event::WriteFault {
        page: p(1),
        token: FaultToken(t),
    };
    let twin_and_wake = |t| {
        vec![
            Action::MakeTwin { page: p(1) },
            Action::Unprotect { page: p(1) },
            Action::Wake {
                page: p(1),
                tokens: vec![FaultToken(t)],
            },
        ]
    };
    assert_eq!(run(&mut me, write(1)), twin_and_wake(1));
    assert!(me.has_twin(p(1)));
    // lock 0 is managed by cluster 0 itself: granted at once
    assert_eq!(
        run(&mut me, acquire(0, 1)),
        vec![Action::AcquireDone {
            lock: l(0),
            token: SyncToken(1)
        }]
    );
    // cluster 1 asks for it: the manager (this cluster) recalls it from its holder,
    // and tells the runtime that the lock is wanted (it may be passing it among its
    // threads without the machine)
    assert_eq!(
        run(&mut me, request_from(1, 0)),
        vec![Action::LockWanted { lock: l(0) }]
    );
    assert_eq!(me.stats().lock_recalls, 1);
    // the release flushes the open page, keeping it open; the thread goes on
    assert_eq!(
        run(&mut me, release(0, 1)),
        vec![
            Action::ReleaseDone {
                lock: l(0),
                token: SyncToken(1)
            },
            flush(1, true),
        ]
    );
    assert!(me.is_flushing());
    // another event before the flush's result is a contract violation
    let mut out = Vec::new();
    assert_eq!(
        me.clone().handle(acquire(3, 9), &mut out),
        Err(ProtocolError::FlushPending)
    );
    let bytes = DiffBytes::new(vec![0u8, 0, 1, 0, 7, 0, 0, 0, 0, 0, 0, 0]);
    let d = IntervalDiff {
        page: p(1),
        owner: c(0),
        index: 1,
        base: VectorTime::new(),
        data: bytes.clone(),
    };
    let a = run(
        &mut me,
        Event::Flushed {
            diffs: vec![bytes.clone()],
        },
    );
    // the diff goes to the home, and the lock to cluster 1 at once, carrying the
    // interval's write notice and its diff
    assert_eq!(
        a,
        vec![
            Action::Send {
                to: c(1),
                msg: Message::Diff { diff: d.clone() }
            },
            Action::Send {
                to: c(1),
                msg: Message::LockGrant {
                    lock: l(0),
                    time: VectorTime::from_entries(vec![1]),
                    records: vec![IntervalRecord {
                        owner: c(0),
                        index: 1,
                        pages: vec![p(1)].into()
                    }],
                    diffs: vec![d],
                    stored: 0,
                    tenure: 2,
                    contended: true
                }
            },
        ]
    );
    assert_eq!(me.access(p(1)), Some(PageAccess::ReadWrite));
    assert_eq!(me.versions(p(1)).unwrap().entries(), &[1]);
    // the next flush finds the page unchanged: kept open, idle
    run(&mut me, acquire(2, 2));
    run(&mut me, request_from(1, 2));
    assert_eq!(run(&mut me, release(2, 2))[1], flush(1, true));
    let a = run(
        &mut me,
        Event::Flushed {
            diffs: vec![DiffBytes::default()],
        },
    );
    assert!(
        matches!(a.as_slice(), [Action::Send { msg: Message::LockGrant { lock, .. }, .. }] if *lock == l(2)),
        "{a:?}"
    );
    // unchanged again: still open (idle at two flushes in a row)
    run(&mut me, acquire(6, 5));
    run(&mut me, request_from(1, 6));
    assert_eq!(run(&mut me, release(6, 5))[1], flush(1, true));
    run(
        &mut me,
        Event::Flushed {
            diffs: vec![DiffBytes::default()],
        },
    );
    // then it is write-protected and closed at the following flush
    run(&mut me, acquire(4, 3));
    run(&mut me, request_from(1, 4));
    assert_eq!(
        run(&mut me, release(4, 3))[1..],
        [Action::WriteProtect { pages: one(1) }, flush(1, false)]
    );
    run(
        &mut me,
        Event::Flushed {
            diffs: vec![DiffBytes::default()],
        },
    );
    assert_eq!(me.access(p(1)), Some(PageAccess::ReadOnly));
    assert!(!me.has_twin(p(1)));
    // a write takes a new twin at once, whether or not the home has the first diff
    assert_eq!(run(&mut me, write(3)), twin_and_wake(3));
    assert!(me.is_quiescent());
}

/// The home's own writes need no twin while no other cluster has fetched the page
/// (it stays writable, untracked). The first fetch sends a copy that becomes the
/// twin; the home's later writes are then diffed at its flushes, and the lock carries
/// the diff to the next holder, which applies it to its copy instead of dropping it.
#[test]
fn home_writes_travel_as_diffs_once_shared() {
    let mut cfg = Config::new(Protocol::Hlrc, 2, 4);
    cfg.prefetch = 0; // see the prefetch tests

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
    // a release does not touch the private page
    run(&mut home, acquire(0, 1));
    assert_eq!(
        run(&mut home, release(0, 1)),
        vec![Action::ReleaseDone {
            lock: l(0),
            token: SyncToken(1)
        }]
    );
    assert!(!home.has_twin(p(0)));
    // cluster 1 fetches the page: the copy sent becomes the home's twin
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
    assert_eq!(
        run(&mut home, msg(1, get.clone())),
        vec![Action::ShareHomePage {
            to: c(1),
            page: p(0)
        }]
    );
    assert_eq!(home.stats().home_pages_shared, 1);
    assert_eq!(home.copyset(p(0)), vec![c(0), c(1)]);
    assert!(home.has_twin(p(0)));
    run(
        &mut other,
        msg(
            0,
            Message::PageData {
                page: p(0),
                writable: false,
                zero: false,
            },
        ),
    );
    // cluster 1 asks for lock 0 (managed by cluster 0, where it is cached): the
    // recall gives it back, flushing the home's open page
    let a = run(&mut other, acquire(0, 4));
    let [Action::Send { to, msg: req }] = a.as_slice() else {
        panic!("{a:?}")
    };
    assert_eq!(*to, c(0));
    assert_eq!(run(&mut home, msg(1, req.clone())), vec![flush(0, true)]);
    let bytes = DiffBytes::new(vec![1u8, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0]);
    let a = run(
        &mut home,
        Event::Flushed {
            diffs: vec![bytes.clone()],
        },
    );
    // no diff message to itself; the grant carries the notice and the diff
    let [Action::Send { msg: grant, .. }] = a.as_slice() else {
        panic!("{a:?}")
    };
    let Message::LockGrant { records, diffs, .. } = grant else {
        panic!("{grant:?}")
    };
    assert_eq!(records.len(), 1);
    assert_eq!(&records[0].pages[..], &[p(0)]);
    assert_eq!(diffs.len(), 1);
    // cluster 1 applies the diff to its copy, which stays valid
    let a = run(&mut other, msg(0, grant.clone()));
    assert_eq!(
        a,
        vec![
            Action::ApplyDiff {
                page: p(0),
                data: bytes,
                twin: false
            },
            Action::AcquireDone {
                lock: l(0),
                token: SyncToken(4)
            },
        ]
    );
    assert_eq!(other.access(p(0)), Some(PageAccess::ReadOnly));
    assert_eq!(other.stats().carried_diffs_applied, 1);
    assert_eq!(other.stats().invalidations, 0);
}

/// A fetch that needs a diff the home has not received yet waits for it; a diff
/// whose base names a diff the home lacks waits too, and both complete when the
/// missing diff arrives (in any order).
#[test]
fn home_waits_for_the_versions_a_fetch_needs() {
    let cfg = Config::new(Protocol::Hlrc, 3, 3);
    let mut home = Machine::new(c(0), cfg).unwrap();
    // clusters 1 and 2 fetch page 0 (untouched: zero pages)
    for r in [1, 2] {
        run(&mut home, msg(r, get(0)));
    }
    let diff = |owner: u16, index: u32, base: Vec<u32>, word: u8| IntervalDiff {
        page: p(0),
        owner: c(owner),
        index,
        base: VectorTime::from_entries(base),
        data: DiffBytes::new(vec![word, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0]),
    };
    // cluster 2 wrote after applying cluster 1's interval 1: its diff must wait
    let d2 = diff(2, 1, vec![0, 1], 1);
    assert_eq!(
        run(&mut home, msg(2, Message::Diff { diff: d2.clone() })),
        vec![]
    );
    assert_eq!(home.stats().diffs_buffered, 1);
    // a fetch by cluster 1 that must see cluster 2's interval waits as well
    let need = Message::GetPage {
        page: p(0),
        need: VectorTime::from_entries(vec![0, 1, 1]),
    };
    assert_eq!(run(&mut home, msg(1, need)), vec![]);
    assert_eq!(home.stats().fetches_deferred, 1);
    // cluster 1's diff arrives: both diffs apply in order, then the fetch is served
    let d1 = diff(1, 1, vec![], 0);
    let a = run(&mut home, msg(1, Message::Diff { diff: d1.clone() }));
    assert_eq!(
        a,
        vec![
            Action::Install {
                page: p(0),
                source: Source::Zero,
                writable: false
            },
            Action::ApplyDiff {
                page: p(0),
                data: d1.data.clone(),
                twin: false
            },
            Action::ApplyDiff {
                page: p(0),
                data: d2.data.clone(),
                twin: false
            },
            Action::Send {
                to: c(1),
                msg: Message::PageData {
                    page: p(0),
                    writable: false,
                    zero: false
                }
            },
        ]
    );
    assert!(home.is_quiescent());
    assert_eq!(home.versions(p(0)).unwrap().entries(), &[0, 1, 1]);
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
    assert_eq!(
        m.handle(msg(1, get(1)), &mut out),
        Err(ProtocolError::NotHome {
            page: p(1),
            from: c(1)
        })
    );
    assert_eq!(
        m.handle(msg(0, get(0)), &mut out),
        Err(ProtocolError::NoSuchCluster(c(0)))
    );
    assert_eq!(
        m.handle(Event::Flushed { diffs: vec![] }, &mut out),
        Err(ProtocolError::UnexpectedFlush)
    );
    // a diff that claims another writer
    let forged = IntervalDiff {
        page: p(0),
        owner: c(2),
        index: 1,
        base: VectorTime::new(),
        data: DiffBytes::default(),
    };
    assert!(matches!(
        m.handle(msg(1, Message::Diff { diff: forged }), &mut out),
        Err(ProtocolError::Unexpected { .. })
    ));
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
                pages: pages.into(),
            },
        );
    let diff = (
        page.clone(),
        from.clone(),
        1u32..3,
        time.clone(),
        proptest::collection::vec(any::<u8>(), 0..24),
    )
        .prop_map(|(page, owner, index, base, data)| IntervalDiff {
            page,
            owner,
            index,
            base,
            data: DiffBytes::new(data),
        });
    let message = prop_oneof![
        (page.clone(), time.clone()).prop_map(|(page, need)| Message::GetPage { page, need }),
        page.clone().prop_map(|page| Message::HomeQuery { page }),
        (page.clone(), from.clone()).prop_map(|(page, home)| Message::HomeIs { page, home }),
        (page.clone(), any::<bool>(), any::<bool>()).prop_map(|(page, writable, zero)| {
            Message::PageData {
                page,
                writable,
                zero,
            }
        }),
        diff.clone().prop_map(|diff| Message::Diff { diff }),
        diff.clone().prop_map(|diff| Message::Update { diff }),
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
            proptest::collection::vec(rec.clone(), 0..2),
            proptest::collection::vec(diff.clone(), 0..2)
        )
            .prop_map(|(lock, time, records, diffs)| Message::LockGrant {
                lock,
                time,
                records,
                diffs,
                stored: 1,
                tenure: 1,
                contended: false
            }),
        (
            lock.clone(),
            time.clone(),
            proptest::collection::vec(rec.clone(), 0..2),
            proptest::collection::vec(diff, 0..2)
        )
            .prop_map(|(lock, time, records, diffs)| Message::LockRelease {
                lock,
                tenure: 1,
                unused: false,
                gc: time.clone(),
                time,
                records,
                diffs,
                homed: 0,
                stored: 1
            }),
        (
            0u32..2,
            time.clone(),
            proptest::collection::vec(rec.clone(), 0..2),
            proptest::collection::vec(page.clone(), 0..2),
            proptest::collection::btree_map(from.clone(), 0u64..3, 0..2)
        )
            .prop_map(|(episode, time, records, migratable, counts)| {
                Message::BarrierArrive {
                    episode,
                    time,
                    records,
                    migratable,
                    updates_sent: counts.into_iter().collect(),
                }
            }),
        (
            0u32..2,
            time,
            proptest::collection::vec(rec, 0..2),
            proptest::collection::vec((page.clone(), from.clone()), 0..2),
            proptest::collection::btree_map(from.clone(), 0u64..3, 0..2)
        )
            .prop_map(|(episode, time, records, migrations, counts)| {
                Message::BarrierDepart {
                    episode,
                    time,
                    records,
                    migrations,
                    updates_due: counts.into_iter().collect(),
                }
            }),
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
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..16), 0..3).prop_map(
            |d| Event::Flushed {
                diffs: d.into_iter().map(DiffBytes::new).collect()
            }
        ),
        (from, message).prop_map(|(from, msg)| Event::Message { from, msg }),
    ]
}

/// Records are checked on receipt: a forged record of the receiver's own that it
/// never made, or one naming a page outside the region, is an error (found by the
/// fuzz test below: the forged record went into the receiver's log and a later
/// barrier arrival indexed the page table with its page).
#[test]
fn forged_records_are_errors() {
    let cfg = Config::new(Protocol::Hlrc, 2, 3);
    let forged = |owner: u16, index: u32, page: u32| Message::LockGrant {
        lock: l(1),
        time: VectorTime::new(),
        records: vec![IntervalRecord {
            owner: c(owner),
            index,
            pages: vec![PageId::new(page).unwrap()].into(),
        }],
        diffs: vec![],
        stored: 0,
        tenure: 1,
        contended: false,
    };
    for (msg, want) in [
        (
            forged(0, 1, 0),
            "a record of this cluster that it never made",
        ),
        (forged(1, 1, 3), "no such page"),
    ] {
        let mut me = Machine::new(c(0), cfg.clone()).unwrap();
        run(&mut me, acquire(1, 1));
        let mut out = Vec::new();
        let e = me.handle(self::msg(1, msg), &mut out).unwrap_err();
        assert!(
            e.to_string().contains(want) || format!("{e:?}").contains("NoSuchPage"),
            "{e}"
        );
    }
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

/// A departure that comes before an update another cluster had sent here when it
/// arrived (the departure, from the manager, overtook it) waits for the update, and a
/// second departure meanwhile is a protocol error. Cluster 1 of three, manager 0.
#[test]
fn a_departure_waits_for_the_updates_it_overtook() {
    let depart = |episode| Message::BarrierDepart {
        episode,
        time: VectorTime::new(),
        records: vec![],
        migrations: vec![],
        updates_due: vec![(c(2), 1)],
    };
    let token = SyncToken(5);
    let mut me = Machine::new(c(1), Config::new(Protocol::Hlrc, 3, 4)).unwrap();
    let episode = arrival_episode(&run(&mut me, Event::Barrier { token }));
    let a = run(&mut me, msg(0, depart(episode)));
    assert!(
        !a.iter().any(|x| matches!(x, Action::BarrierDone { .. })),
        "{a:?}"
    );
    assert_eq!(me.stats().departures_held_for_updates, 1);
    // a second departure while the first waits
    let mut twice = me.clone();
    let mut out = Vec::new();
    assert!(matches!(
        twice.handle(msg(0, depart(episode)), &mut out),
        Err(ProtocolError::Unexpected { .. })
    ));
    // cluster 2's update (of a page not homed there: counted, then dropped) completes it
    let update = IntervalDiff {
        page: p(0),
        owner: c(2),
        index: 1,
        base: VectorTime::new(),
        data: DiffBytes::new(vec![]),
    };
    let a = run(&mut me, msg(2, Message::Update { diff: update }));
    assert!(a.contains(&Action::BarrierDone { token }), "{a:?}");
}

/// A pushed lock whose records leave a gap in this cluster's log (the push that
/// carried the missing record was given back, or has not arrived) waits for its first
/// local use; if the gap is still open then, the cluster gives it back unused and asks
/// for the lock instead, and the grant that answers carries the missing record.
#[test]
fn a_push_that_leaves_a_gap_is_refused_at_its_first_use() {
    let mut cfg = Config::new(Protocol::Hlrc, 2, 4);
    cfg.release_batch = 16;
    let mut me = Machine::new(c(0), cfg).unwrap();
    let time = multigrain_coherence::VectorTime::from_entries(vec![0, 1]);
    let push = |tenure| Message::LockGrant {
        lock: l(1),
        time: time.clone(),
        records: vec![],
        diffs: vec![],
        stored: 0,
        tenure,
        contended: true,
    };
    // the push names cluster 1's interval 1, whose record this cluster lacks: held
    assert_eq!(run(&mut me, msg(1, push(1))), vec![]);
    let a = run(&mut me, acquire(1, 1));
    assert!(
        matches!(
            a.as_slice(),
            [
                Action::Send {
                    msg: Message::LockRelease {
                        tenure: 1,
                        unused: true,
                        ..
                    },
                    ..
                },
                Action::Send {
                    msg: Message::LockAcquire { seen: 1, .. },
                    ..
                },
            ]
        ),
        "{a:?}"
    );
    assert_eq!(me.stats().lock_pushes_refused, 1);
    // the grant to the request carries the record: the acquire completes
    let record = multigrain_coherence::IntervalRecord {
        owner: c(1),
        index: 1,
        pages: std::sync::Arc::from(Vec::new()),
    };
    let grant = Message::LockGrant {
        lock: l(1),
        time,
        records: vec![record],
        diffs: vec![],
        stored: 0,
        tenure: 3,
        contended: true,
    };
    assert_eq!(
        run(&mut me, msg(1, grant)),
        vec![Action::AcquireDone {
            lock: l(1),
            token: SyncToken(1)
        }]
    );
}

/// Visits (see `crate::sync`): a lock pushed back to the cluster that released it (the
/// tenure right after its own) continues the cluster's visit. At its next visit the
/// cluster keeps the lock at a release until its threads took it as often as in the
/// last visit, or until the manager recalls it.
#[test]
fn a_lock_stays_for_as_many_uses_as_its_last_visit_had() {
    let mut cfg = Config::new(Protocol::Hlrc, 2, 4);
    cfg.release_batch = 2;
    let mut me = Machine::new(c(0), cfg).unwrap();
    let released_locks = |a: &[Action]| -> Vec<u32> {
        let mut got: Vec<u32> = a
            .iter()
            .filter_map(|a| match a {
                Action::Send {
                    msg: Message::LockRelease { lock, .. },
                    ..
                } => Some(lock.get()),
                _ => None,
            })
            .collect();
        got.sort_unstable();
        got
    };
    // One use of lock `lock` pushed here with `tenure` (both locks are managed by
    // cluster 1); returns the release's actions.
    let mut token = 0;
    let mut use_pushed = |me: &mut Machine, lock: u32, tenure: u32| {
        token += 1;
        assert_eq!(run(me, msg(1, grant(lock, tenure, true))), vec![]);
        assert_eq!(run(me, acquire(lock, token)).len(), 1);
        run(me, release(lock, token))
    };
    // First visit of lock 1: tenures 1 and 2 (pushed back), one use each; lock 3 fills
    // each release batch of two.
    assert_eq!(released_locks(&use_pushed(&mut me, 1, 1)), vec![]);
    assert_eq!(released_locks(&use_pushed(&mut me, 3, 1)), vec![1, 3]);
    assert_eq!(released_locks(&use_pushed(&mut me, 1, 2)), vec![]);
    assert_eq!(released_locks(&use_pushed(&mut me, 3, 2)), vec![1, 3]);
    assert_eq!(me.stats().lock_visit_keeps, 0);
    // Tenure 3 went to cluster 1. The next visit (tenure 4) keeps lock 1 after its
    // first use: no batch, no message, and it stays through lock 3's batch.
    let a = use_pushed(&mut me, 1, 4);
    assert!(
        matches!(a.as_slice(), [Action::ReleaseDone { .. }]),
        "{a:?}"
    );
    assert_eq!(me.stats().lock_visit_keeps, 1);
    assert_eq!(released_locks(&use_pushed(&mut me, 3, 3)), vec![]);
    // The second use is taken without a message; its release joins the batch.
    assert_eq!(
        run(&mut me, acquire(1, 100)),
        vec![Action::AcquireDone {
            lock: l(1),
            token: SyncToken(100)
        }]
    );
    assert_eq!(released_locks(&run(&mut me, release(1, 100))), vec![1, 3]);
    // A kept lock goes at once when the manager recalls it.
    let a = use_pushed(&mut me, 1, 6);
    assert!(
        matches!(a.as_slice(), [Action::ReleaseDone { .. }]),
        "{a:?}"
    );
    assert_eq!(released_locks(&run(&mut me, msg(1, recall(1, 6)))), vec![1]);
    assert_eq!(me.stats().lock_visit_keeps, 2);
}

/// Page 0, homed at cluster 0, written there and then fetched by cluster 1: the
/// home's copy is open, tracked with a twin, and cluster 1 is in its copyset.
fn home_page_shared(cfg: &Config) -> (Machine, Machine) {
    let mut home = Machine::new(c(0), cfg.clone()).unwrap();
    let mut other = Machine::new(c(1), cfg.clone()).unwrap();
    run(
        &mut home,
        Event::WriteFault {
            page: p(0),
            token: FaultToken(1),
        },
    );
    let a = run(&mut other, fault(0, 2));
    let [Action::Send { msg: get, .. }] = a.as_slice() else {
        panic!("{a:?}")
    };
    run(&mut home, msg(1, get.clone()));
    run(&mut other, msg(0, page_data(0)));
    assert!(home.has_twin(p(0)));
    (home, other)
}

/// A thread that asks another cluster for a lock closes the interval while the
/// request is on its way (`Config::flush_ahead`): the open page is flushed, its diff
/// goes to the copy as an update (no lock carries it), and the critical section's
/// release has nothing of it left to diff. The update is applied when the write
/// notice reaches the copy with a grant, instead of invalidating it.
#[test]
fn a_thread_waiting_for_a_lock_flushes_ahead() {
    let mut cfg = Config::new(Protocol::Hlrc, 2, 4);
    cfg.prefetch = 0; // see the prefetch tests

    // without flush_ahead the acquire only asks (the comparison)
    let mut off = cfg.clone();
    off.flush_ahead = false;
    let (mut plain, _) = home_page_shared(&off);
    let a = run(&mut plain, acquire(1, 3));
    assert!(
        matches!(
            a.as_slice(),
            [Action::Send {
                msg: Message::LockAcquire { .. },
                ..
            }]
        ),
        "{a:?}"
    );

    let (mut home, mut other) = home_page_shared(&cfg);
    // lock 1 is managed by cluster 1: the request leaves first, then the flush
    let a = run(&mut home, acquire(1, 3));
    let [
        Action::Send {
            to,
            msg: req @ Message::LockAcquire { .. },
        },
        Action::Flush { pages },
    ] = a.as_slice()
    else {
        panic!("{a:?}")
    };
    assert_eq!(*to, c(1));
    assert_eq!(
        pages,
        &[FlushPage {
            page: p(0),
            keep_open: true
        }]
    );
    let bytes = DiffBytes::new(vec![1u8, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0]);
    let a = run(
        &mut home,
        Event::Flushed {
            diffs: vec![bytes.clone()],
        },
    );
    // the diff goes to the copy as an update; no lock leaves
    let [
        Action::Send {
            to,
            msg: update @ Message::Update { diff },
        },
    ] = a.as_slice()
    else {
        panic!("{a:?}")
    };
    assert_eq!((*to, diff.page, &diff.data), (c(1), p(0), &bytes));
    let st = home.stats();
    assert_eq!((st.flushes_ahead, st.intervals), (1, 1));
    assert_eq!(home.versions(p(0)).unwrap().entries(), &[1]);

    // cluster 1 holds the update (its notice has not come) and grants the lock
    assert_eq!(run(&mut other, msg(0, update.clone())), vec![]);
    let a = run(&mut other, msg(0, req.clone()));
    let [Action::Send { msg: grant, .. }] = a.as_slice() else {
        panic!("{a:?}")
    };
    assert_eq!(
        run(&mut home, msg(1, grant.clone())),
        vec![Action::AcquireDone {
            lock: l(1),
            token: SyncToken(3)
        }]
    );
    // the critical section writes nothing, and the lock (uncontended) stays cached
    run(&mut home, release(1, 3));
    assert!(!home.is_flushing());
    // a thread of cluster 1 asks for it: the manager recalls it from cluster 0, whose
    // give-back closes no new interval and carries the earlier one's notice
    let a = run(&mut other, acquire(1, 4));
    let [Action::Send { msg: recall, .. }] = a.as_slice() else {
        panic!("{a:?}")
    };
    let mut a = run(&mut home, msg(1, recall.clone()));
    if home.is_flushing() {
        a = run(
            &mut home,
            Event::Flushed {
                diffs: vec![DiffBytes::default()],
            },
        );
    }
    assert_eq!(home.stats().intervals, 1);
    let [Action::Send { msg: back, .. }] = a.as_slice() else {
        panic!("{a:?}")
    };
    // the notice applies the held update instead of invalidating the copy
    let a = run(&mut other, msg(0, back.clone()));
    assert!(
        a.contains(&Action::ApplyDiff {
            page: p(0),
            data: bytes,
            twin: false
        }),
        "{a:?}"
    );
    assert!(
        !a.iter().any(|x| matches!(x, Action::Invalidate { .. })),
        "{a:?}"
    );
    assert!(a.contains(&Action::AcquireDone {
        lock: l(1),
        token: SyncToken(4)
    }));
    assert_eq!(other.access(p(0)), Some(PageAccess::ReadOnly));
}
