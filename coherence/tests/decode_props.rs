//! Property tests of the pure codecs: diffs (round trip, size bound, malformed input)
//! and wire messages (round trip, malformed input).

use multigrain_coherence::diff;
use multigrain_coherence::{
    Body, ClusterId, DiffBytes, IntervalDiff, IntervalRecord, LockId, Message, PAGE_SIZE, PageId,
    VectorTime, WORD_SIZE,
};
use proptest::prelude::*;

/// A twin and a current page differing in a random set of words; `density` is the
/// percentage of changed words.
fn pages(words: usize) -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    (
        proptest::collection::vec(any::<u8>(), words * WORD_SIZE),
        0u32..=100,
        any::<u64>(),
    )
        .prop_map(move |(twin, density, seed)| {
            let mut cur = twin.clone();
            let mut x = seed | 1;
            for i in 0..words {
                // xorshift decides which words change
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if (x % 100) < u64::from(density) {
                    let b = &mut cur[i * WORD_SIZE..(i + 1) * WORD_SIZE];
                    b[(x as usize >> 8) % WORD_SIZE] ^= 1 + (x >> 32) as u8 % 255;
                }
            }
            (twin, cur)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn diff_round_trip_full_pages((twin, cur) in pages(PAGE_SIZE / WORD_SIZE)) {
        let mut out = vec![7u8];
        let n = diff::encode(&twin, &cur, &mut out).unwrap();
        prop_assert_eq!(n + 1, out.len());
        prop_assert!(n <= diff::MAX_ENCODED);
        let mut p = twin.clone();
        diff::apply(&mut p, &out[1..]).unwrap();
        prop_assert_eq!(p, cur);
    }

    #[test]
    fn diff_round_trip_small_pages((twin, cur) in (1usize..20).prop_flat_map(pages)) {
        let d = diff::create(&twin, &cur).unwrap();
        let mut p = twin.clone();
        prop_assert!(d.len() <= twin.len() + 4);
        let s = diff::validate(&d, twin.len()).unwrap();
        let changed = twin.chunks(8).zip(cur.chunks(8)).filter(|(a, b)| a != b).count();
        prop_assert_eq!(s.words, changed);
        diff::apply(&mut p, &d).unwrap();
        prop_assert_eq!(p, cur);
    }

    /// A diff applied to a page holding other writers' words changes only the words
    /// this writer changed (multiple-writer merge at the home).
    #[test]
    fn diff_merges_disjoint_writers((twin, cur) in pages(64), other in any::<u64>()) {
        let d = diff::create(&twin, &cur).unwrap();
        // another writer changed an unchanged word at the home
        let Some(i) = (0..64).find(|&i| twin[i * 8..i * 8 + 8] == cur[i * 8..i * 8 + 8]) else { return Ok(()); };
        let mut home = twin.clone();
        home[i * 8..i * 8 + 8].copy_from_slice(&other.to_le_bytes());
        diff::apply(&mut home, &d).unwrap();
        let mut want = cur.clone();
        want[i * 8..i * 8 + 8].copy_from_slice(&other.to_le_bytes());
        prop_assert_eq!(home, want);
    }

    #[test]
    fn malformed_diffs_never_panic(d in proptest::collection::vec(any::<u8>(), 0..600), words in 0usize..80) {
        let mut page = vec![7u8; words * 8];
        let before = page.clone();
        match diff::apply(&mut page, &d) {
            Ok(s) => prop_assert!(s.words <= words),
            Err(_) => prop_assert_eq!(&page, &before),
        }
        let _ = diff::validate(&d, words * 8 + 3);
    }

    #[test]
    fn malformed_messages_never_panic(opcode in any::<u8>(), payload in any::<u64>(), bulk in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..200))) {
        if let Ok(m) = Message::from_parts(opcode, payload, bulk.as_deref()) {
            // anything accepted re-encodes to the same header
            let p = m.to_parts();
            prop_assert_eq!(p.opcode, opcode);
            prop_assert_eq!(p.payload, payload);
        }
    }

    #[test]
    fn messages_round_trip(m in message()) {
        let p = m.to_parts();
        prop_assert!(p.payload < 1 << 40);
        let bulk = match &p.body { Body::Bulk(b) => Some(b.as_slice()), _ => None };
        prop_assert_eq!(Message::from_parts(p.opcode, p.payload, bulk).unwrap(), m.clone());
        // every prefix of a bulk body is rejected
        if let Some(b) = bulk {
            for cut in 0..b.len() {
                prop_assert!(Message::from_parts(p.opcode, p.payload, Some(&b[..cut])).is_err());
            }
        }
    }
}

fn page() -> impl Strategy<Value = PageId> {
    (0u32..(1 << 24)).prop_map(|n| PageId::new(n).unwrap())
}
fn cluster() -> impl Strategy<Value = ClusterId> {
    (0u16..1024).prop_map(|n| ClusterId::new(n).unwrap())
}
fn time() -> impl Strategy<Value = VectorTime> {
    proptest::collection::vec(any::<u32>(), 0..6).prop_map(VectorTime::from_entries)
}
fn records() -> impl Strategy<Value = Vec<IntervalRecord>> {
    proptest::collection::vec(
        (cluster(), 1u32.., proptest::collection::vec(page(), 0..4)).prop_map(
            |(owner, index, pages)| IntervalRecord {
                owner,
                index,
                pages: pages.into(),
            },
        ),
        0..4,
    )
}

fn diffs() -> impl Strategy<Value = Vec<IntervalDiff>> {
    proptest::collection::vec(
        (
            page(),
            cluster(),
            1u32..,
            time(),
            proptest::collection::vec(any::<u8>(), 0..40),
        )
            .prop_map(|(page, owner, index, base, data)| IntervalDiff {
                page,
                owner,
                index,
                base,
                data: DiffBytes::new(data),
            }),
        0..3,
    )
}

fn message() -> impl Strategy<Value = Message> {
    let lock = (0u32..(1 << 20)).prop_map(|n| LockId::new(n).unwrap());
    let tenure = || 0u32..multigrain_coherence::sync::TENURE_MODULUS;
    prop_oneof![
        (page(), time()).prop_map(|(page, need)| Message::GetPage { page, need }),
        (page(), cluster()).prop_map(|(page, home)| Message::HomeIs { page, home }),
        (page(), any::<bool>(), any::<bool>()).prop_map(|(page, writable, zero)| {
            Message::PageData {
                page,
                writable,
                zero,
            }
        }),
        diffs().prop_filter_map("one diff", |d| d
            .into_iter()
            .next()
            .map(|diff| Message::Diff { diff })),
        diffs().prop_filter_map("one diff", |d| d
            .into_iter()
            .next()
            .map(|diff| Message::Update { diff })),
        (page(), any::<bool>())
            .prop_map(|(page, invalidate)| Message::ScRecall { page, invalidate }),
        (lock.clone(), time(), tenure()).prop_map(|(lock, time, seen)| Message::LockAcquire {
            lock,
            time,
            seen
        }),
        (
            lock.clone(),
            time(),
            records(),
            diffs(),
            any::<u32>(),
            tenure(),
            any::<bool>()
        )
            .prop_map(|(lock, time, records, diffs, stored, tenure, contended)| {
                Message::LockGrant {
                    lock,
                    time,
                    records,
                    diffs,
                    stored,
                    tenure,
                    contended,
                }
            }),
        (lock.clone(), tenure()).prop_map(|(lock, tenure)| Message::LockRecall { lock, tenure }),
        (
            lock,
            tenure(),
            time(),
            time(),
            records(),
            diffs(),
            (any::<u32>(), any::<u32>()),
            any::<bool>()
        )
            .prop_map(
                |(lock, tenure, time, gc, records, diffs, (homed, stored), unused)| {
                    Message::LockRelease {
                        lock,
                        tenure,
                        unused,
                        time,
                        gc,
                        records,
                        diffs,
                        homed,
                        stored,
                    }
                }
            ),
        (
            any::<u32>(),
            time(),
            records(),
            proptest::collection::vec(page(), 0..4),
            proptest::collection::btree_map(cluster(), any::<u64>(), 0..3)
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
            any::<u32>(),
            time(),
            records(),
            proptest::collection::vec((page(), cluster()), 0..3),
            proptest::collection::btree_map(cluster(), any::<u64>(), 0..3)
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
    ]
}
