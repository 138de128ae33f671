//! The measurement kernels of `multigrain_dsm::bench` that `multigrain bench dsm` reports
//! do what they say, on tiny counts (no timing is asserted): the lock hand-off passes its
//! lock and the 64 bytes it protects back and forth under both protocols, over shared
//! memory and over INIs, checking every value it reads; the copy and UDP baselines
//! (the page-answered UDP round trip included) return one sample per operation.

use multigrain_bench::network::UdpWait;
use multigrain_cluster_config::Protocol;
use multigrain_dsm::bench::{
    HANDOFF_WORDS, LockHandoff, PageCopy, diff_apply, diff_encode, diff_pages, handoff_words,
    page_copy_warm, udp_page_round_trips, udp_round_trips,
};

/// A region address private to one test of this binary.
fn base(slot: usize) -> usize {
    0x4c00_0000_0000 + slot * (1 << 36)
}

fn hand_off(slot: usize, protocol: Protocol, network: bool) {
    let mut h = LockHandoff::new(protocol, base(slot), network).expect("job");
    for round in 1..=3u64 {
        // Odd counts too: the next call starts with the other cluster's turn; with and
        // without untimed hand-offs first (odd ones too).
        let n = 5 + round as usize;
        let warm = round as usize - 1;
        let t = h.handoffs(warm, n).unwrap_or_else(|e| {
            panic!("{protocol:?} network={network}: {e}");
        });
        assert!(t.as_nanos() > 0);
    }
    assert_eq!(h.updates(), 6 + (1 + 7) + (2 + 8));
    assert!(
        h.lock_acquires() >= h.updates(),
        "one acquire per update at least"
    );
    h.finish().expect("finish");
}

#[test]
fn lock_hand_off_over_shared_memory_hlrc() {
    hand_off(0, Protocol::Hlrc, false);
}

#[test]
fn lock_hand_off_over_shared_memory_sc() {
    hand_off(1, Protocol::Sc, false);
}

#[test]
fn lock_hand_off_over_inis_hlrc() {
    hand_off(2, Protocol::Hlrc, true);
}

#[test]
fn lock_hand_off_over_inis_sc() {
    hand_off(3, Protocol::Sc, true);
}

/// Far more hand-offs than a lock manager keeps carried diffs
/// (`multigrain_coherence::sync::MAX_MANAGER_DIFFS`), with no barrier to drop them:
/// every grant still carries the diff of the 64 bytes, so no copy is invalidated and
/// fetched again. (With the bound dropping the lowest keys first, cluster 0's diffs
/// went first and then on arrival: about a thousand invalidations and fetches here.)
#[test]
fn a_long_hand_off_keeps_carrying_its_diffs() {
    // About one diff per two hand-offs reaches the manager's store here, so the
    // bound is passed after about 8,200 of them.
    let n = 2 * multigrain_coherence::sync::MAX_MANAGER_DIFFS + 2_000;
    let mut h = LockHandoff::new(Protocol::Hlrc, base(4), false).expect("job");
    h.handoffs(0, n).expect("hand-offs");
    let stats = h.finish().expect("finish").total.protocol;
    assert_eq!(stats.invalidations, 0, "{stats:#?}");
    assert!(
        stats.carried_diffs_applied >= n as u64 / 2 - 1,
        "{stats:#?}"
    );
}

/// A barrier arrival carries the interval records its cluster closed since the last
/// barrier, one per hand-off here: past the message layer's bulk limit (1 MiB for this
/// job's 1 MiB region; ≈ 75,000 records of one page) it goes in pieces
/// (`dsm/src/pieces.rs`), and the job goes on: the hand-offs after that barrier still
/// find every update of the other cluster. (Before the pieces the job stopped here:
/// "bulk message of 1400040 bytes exceeds the limit of 1048576 bytes".)
#[test]
fn a_phase_longer_than_one_message_holds_is_sent_in_pieces() {
    long_phase(5, false);
}

/// The same through INIs over UDP, whose bulk limit is the same.
#[test]
fn a_phase_longer_than_one_message_holds_is_sent_in_pieces_through_inis() {
    long_phase(6, true);
}

fn long_phase(slot: usize, net: bool) {
    // Cluster 1 makes every other update, each in an interval of its own: 80,000 records
    // of 14 bytes, 1.12 MB.
    let n = 160_000;
    let mut h = LockHandoff::new(Protocol::Hlrc, base(slot), net).expect("job");
    // `Dsm::run` ends with a barrier, whose arrival goes in pieces; then more hand-offs
    // read what the other cluster wrote before and after it.
    h.handoffs(0, n)
        .expect("hand-offs past one message's records");
    h.handoffs(0, 1_000)
        .expect("hand-offs after the long barrier");
    let stats = h.finish().expect("finish").total;
    assert!(stats.bundle_pieces_sent >= 2, "{stats:#?}");
    assert_eq!(stats.bundle_pieces_sent, stats.bundle_pieces_received);
    assert_eq!(stats.bundles_sent, stats.bundles_received);
}

#[test]
fn hand_off_words_differ_per_update_and_word() {
    assert_eq!(handoff_words(0), [0; HANDOFF_WORDS]);
    let (a, b) = (handoff_words(1), handoff_words(2));
    assert_eq!((a[0], b[0]), (1, 2));
    for k in 1..HANDOFF_WORDS {
        assert_ne!(a[k], b[k], "word {k} must change with the update");
        assert_ne!(a[k], a[k - 1]);
    }
}

#[test]
fn baselines_return_one_sample_per_operation() {
    assert_eq!(udp_round_trips(5, UdpWait::BusyPoll).len(), 5);
    assert_eq!(udp_round_trips(5, UdpWait::Blocking).len(), 5);
    // Each answer is checked to be a whole page (the kernel panics on another size).
    assert_eq!(udp_page_round_trips(5, UdpWait::BusyPoll).len(), 5);
    let mut copy = PageCopy::new();
    for _ in 0..3 {
        assert!(copy.copies(PageCopy::PAGES + 3) > 0.0);
    }
    let (twin, cur) = diff_pages(0.1);
    for samples in [
        page_copy_warm(&cur, 7),
        diff_encode(&twin, &cur, 7),
        diff_apply(&twin, &cur, 7),
    ] {
        assert_eq!(samples.len(), 7);
    }
}
