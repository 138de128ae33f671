//! Protocol rules of the INI core, one at a time, by feeding hand-made datagrams to one
//! [`Ini`] and decoding what it sends (thesis §3.1, §3.2.1, §3.2.2).

use multigrain_window::wire::{self, ConnId, FrameKind, Header};
use multigrain_window::{
    AddPeerError, ConnHandle, EnqueueError, Event, Ini, IniAddr, Micros, Rejected, WindowConfig,
};
use proptest::prelude::*;

const A: IniAddr = IniAddr::new(0, 0);
const B: IniAddr = IniAddr::new(1, 0);
const C: IniAddr = IniAddr::new(2, 0);
const EPOCH: u64 = 42;
const KEY: [u8; 32] = [0x5a; 32];

fn config() -> WindowConfig {
    WindowConfig {
        epoch: EPOCH,
        mac_key: wire::MacKey::new(KEY),
        window: 8,
        send_timeout: Micros(1_000),
        ack_timeout: Micros(100),
        ack_every: 8,
        peer_timeout: Micros(50_000),
        // These tests follow single frames through the thesis protocol; batching has
        // tests of its own (`coalesce_*`).
        coalesce: false,
        ..WindowConfig::default()
    }
}

/// INI `A` with one connection, to `B`.
fn ini_a(cfg: WindowConfig) -> (Ini, ConnHandle) {
    let mut ini = Ini::new(A, cfg).unwrap();
    let conn = ini.add_peer(B).unwrap();
    (ini, conn)
}

/// A datagram from `B` to `A`.
fn from_b(kind: FrameKind, seq: u32, ack: u32, frag: (u16, u16), payload: &[u8]) -> Vec<u8> {
    let h = Header {
        kind,
        epoch: EPOCH,
        conn: ConnId { src: B, dst: A },
        seq,
        ack,
        frag_index: frag.0,
        frag_count: frag.1,
    };
    let mut buf = vec![0; wire::OVERHEAD + payload.len()];
    let key = wire::DatagramKey::new(&wire::MacKey::new(KEY), EPOCH);
    wire::encode(&h, payload, &key, &mut buf).unwrap();
    buf
}

fn data(seq: u32, ack: u32, payload: &[u8]) -> Vec<u8> {
    from_b(FrameKind::Data, seq, ack, (0, 1), payload)
}

/// The next datagram `ini` sends, decoded: (header, payload).
fn next(ini: &mut Ini, now: u64) -> Option<(Header, Vec<u8>)> {
    let mut buf = vec![0; ini.config().mtu];
    let t = ini.poll_transmit(Micros(now), &mut buf)?;
    let key = wire::DatagramKey::new(&wire::MacKey::new(KEY), EPOCH);
    let mut scratch = Vec::new();
    let f = wire::decode(&buf[..t.len], &key, EPOCH, &mut scratch)
        .expect("the INI sends valid datagrams");
    assert_eq!(f.header.conn.src, ini.local());
    assert_eq!(f.header.conn.dst, t.peer);
    // What the emulated gap keys on (paper 001 §3.2): DATA frames, not ACKs or NAKs.
    assert_eq!(
        t.data,
        matches!(f.header.kind, FrameKind::Data | FrameKind::Batch),
        "{:?}",
        f.header.kind
    );
    Some((f.header, f.payload.to_vec()))
}

fn delivered(ini: &mut Ini) -> Vec<Vec<u8>> {
    std::iter::from_fn(|| ini.poll_event())
        .map(|e| match e {
            Event::Delivered { msg, .. } => msg,
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

#[test]
fn delayed_ack_fires_after_the_ack_timeout_without_reverse_traffic() {
    let (mut a, _) = ini_a(config());
    assert_eq!(a.poll_timeout(), None);
    a.handle_datagram(Micros(1_000), &data(0, 0, b"hi"))
        .unwrap();
    assert_eq!(delivered(&mut a), vec![b"hi".to_vec()]);
    assert!(next(&mut a, 1_000).is_none(), "the ACK is delayed");
    assert_eq!(a.poll_timeout(), Some(Micros(1_100)));
    a.handle_timeout(Micros(1_099));
    assert!(next(&mut a, 1_099).is_none());
    a.handle_timeout(Micros(1_100));
    let (h, payload) = next(&mut a, 1_100).unwrap();
    assert_eq!((h.kind, h.ack, payload.len()), (FrameKind::Ack, 1, 0));
    assert!(next(&mut a, 1_100).is_none());
    assert_eq!(a.poll_timeout(), None);
    assert!(a.is_idle());
}

#[test]
fn ack_rides_on_reverse_data() {
    let (mut a, conn) = ini_a(config());
    a.handle_datagram(Micros(0), &data(0, 0, b"x")).unwrap();
    a.enqueue(conn, b"reply".to_vec()).unwrap();
    let (h, payload) = next(&mut a, 10).unwrap();
    assert_eq!((h.kind, h.seq, h.ack), (FrameKind::Data, 0, 1));
    assert_eq!(payload, b"reply");
    assert!(next(&mut a, 10).is_none(), "no standalone ACK is owed");
    // The only timer left is the SEND timer of the reply.
    assert_eq!(a.poll_timeout(), Some(Micros(1_010)));
    assert_eq!(a.conn_stats(conn).acks_sent, 0);
}

#[test]
fn ack_every_frames_is_sent_at_once() {
    let (mut a, _) = ini_a(WindowConfig {
        ack_every: 3,
        ..config()
    });
    for seq in 0..3 {
        a.handle_datagram(Micros(5), &data(seq, 0, b"m")).unwrap();
    }
    let (h, _) = next(&mut a, 5).unwrap();
    assert_eq!((h.kind, h.ack), (FrameKind::Ack, 3));
}

#[test]
fn gap_is_naked_once_and_selectively_acked_then_delivered_in_order() {
    let (mut a, conn) = ini_a(config());
    a.handle_datagram(Micros(0), &data(0, 0, b"m0")).unwrap();
    a.handle_datagram(Micros(1), &data(2, 0, b"m2")).unwrap();
    a.handle_datagram(Micros(2), &data(3, 0, b"m3")).unwrap();
    a.handle_datagram(Micros(3), &data(5, 0, b"m5")).unwrap();
    assert_eq!(delivered(&mut a), vec![b"m0".to_vec()]);
    // One NAK per missing frame (1 and 4), in order, each carrying the cumulative ACK.
    let (h, _) = next(&mut a, 3).unwrap();
    assert_eq!((h.kind, h.seq, h.ack), (FrameKind::Nak, 1, 1));
    let (h, _) = next(&mut a, 3).unwrap();
    assert_eq!((h.kind, h.seq, h.ack), (FrameKind::Nak, 4, 1));
    assert!(next(&mut a, 3).is_none());
    // The ACK timer sends a selective ACK: frames 2, 3 and 5 are held (bits for 2..=5).
    a.handle_timeout(Micros(100));
    let (h, bitmap) = next(&mut a, 100).unwrap();
    assert_eq!((h.kind, h.ack), (FrameKind::Ack, 1));
    assert_eq!(bitmap, vec![0b1011]);
    // The missing frames arrive: everything is delivered, in order, once.
    a.handle_datagram(Micros(200), &data(1, 0, b"m1")).unwrap();
    assert_eq!(
        delivered(&mut a),
        vec![b"m1".to_vec(), b"m2".to_vec(), b"m3".to_vec()]
    );
    a.handle_datagram(Micros(201), &data(4, 0, b"m4")).unwrap();
    assert_eq!(delivered(&mut a), vec![b"m4".to_vec(), b"m5".to_vec()]);
    assert_eq!(a.expected_seq(conn), 6);
    let s = a.conn_stats(conn);
    assert_eq!(
        (s.naks_sent, s.frames_accepted, s.msgs_delivered),
        (2, 6, 6)
    );
}

#[test]
fn fragments_arriving_out_of_order_are_reassembled() {
    let (mut a, _) = ini_a(config());
    let frag = |seq: u32, i: u16, bytes: &[u8]| from_b(FrameKind::Data, seq, 0, (i, 3), bytes);
    a.handle_datagram(Micros(0), &frag(2, 2, b"ghi")).unwrap();
    a.handle_datagram(Micros(0), &frag(0, 0, b"abc")).unwrap();
    assert!(delivered(&mut a).is_empty());
    a.handle_datagram(Micros(0), &frag(1, 1, b"def")).unwrap();
    assert_eq!(delivered(&mut a), vec![b"abcdefghi".to_vec()]);
}

#[test]
fn inconsistent_fragments_are_discarded_and_counted() {
    let (mut a, conn) = ini_a(config());
    // Fragment 0 of 3, then a frame claiming to be fragment 2: the message is dropped.
    a.handle_datagram(Micros(0), &from_b(FrameKind::Data, 0, 0, (0, 3), b"a"))
        .unwrap();
    a.handle_datagram(Micros(0), &from_b(FrameKind::Data, 1, 0, (2, 3), b"c"))
        .unwrap();
    // A fresh single-fragment message after it is delivered normally.
    a.handle_datagram(Micros(0), &data(2, 0, b"ok")).unwrap();
    assert_eq!(delivered(&mut a), vec![b"ok".to_vec()]);
    assert_eq!(a.conn_stats(conn).reassembly_errors, 2);
}

#[test]
fn send_timeout_retransmits_the_same_frame() {
    let (mut a, conn) = ini_a(config());
    a.enqueue(conn, b"payload".to_vec()).unwrap();
    let (first, p1) = next(&mut a, 500).unwrap();
    assert_eq!(a.poll_timeout(), Some(Micros(1_500)));
    a.handle_timeout(Micros(1_499));
    assert!(next(&mut a, 1_499).is_none());
    a.handle_timeout(Micros(1_500));
    let (again, p2) = next(&mut a, 1_500).unwrap();
    assert_eq!((again.seq, p2), (first.seq, p1));
    assert_eq!(a.poll_timeout(), Some(Micros(2_500)));
    let s = a.conn_stats(conn);
    assert_eq!(
        (s.data_frames_sent, s.retransmissions, s.send_timeouts),
        (2, 1, 1)
    );
    // The ACK stops it.
    a.handle_datagram(Micros(1_600), &from_b(FrameKind::Ack, 0, 1, (0, 0), &[]))
        .unwrap();
    assert_eq!(a.in_flight(conn), 0);
    assert_eq!(a.poll_timeout(), None);
    assert_eq!(a.conn_stats(conn).msgs_acked, 1);
}

#[test]
fn nak_retransmits_the_named_frame_at_once() {
    let (mut a, conn) = ini_a(config());
    for m in [b"m0", b"m1", b"m2"] {
        a.enqueue(conn, m.to_vec()).unwrap();
    }
    for seq in 0..3 {
        assert_eq!(next(&mut a, 0).unwrap().0.seq, seq);
    }
    // NAK of frame 1, acknowledging frame 0.
    a.handle_datagram(Micros(10), &from_b(FrameKind::Nak, 1, 1, (0, 0), &[]))
        .unwrap();
    let (h, payload) = next(&mut a, 10).unwrap();
    assert_eq!(
        (h.kind, h.seq, payload),
        (FrameKind::Data, 1, b"m1".to_vec())
    );
    assert!(next(&mut a, 10).is_none());
    assert_eq!(a.in_flight(conn), 2);
    // A NAK for an acknowledged frame is ignored.
    a.handle_datagram(Micros(11), &from_b(FrameKind::Nak, 0, 1, (0, 0), &[]))
        .unwrap();
    assert!(next(&mut a, 11).is_none());
    let s = a.conn_stats(conn);
    assert_eq!((s.naks_received, s.retransmissions), (2, 1));
}

#[test]
fn selectively_acked_frames_are_not_resent_on_timeout() {
    let (mut a, conn) = ini_a(config());
    for i in 0..4u8 {
        a.enqueue(conn, vec![i]).unwrap();
    }
    while next(&mut a, 0).is_some() {}
    // Receiver holds 2 and 3 (bits 1 and 2 after ACK 0), misses 0 and 1.
    a.handle_datagram(Micros(5), &from_b(FrameKind::Ack, 0, 0, (0, 0), &[0b110]))
        .unwrap();
    a.handle_timeout(Micros(1_000));
    let mut resent = Vec::new();
    while let Some((h, _)) = next(&mut a, 1_000) {
        resent.push(h.seq);
    }
    assert_eq!(resent, vec![0, 1]);
}

#[test]
fn duplicates_and_out_of_window_frames_are_rejected_and_counted() {
    let (mut a, conn) = ini_a(config());
    a.handle_datagram(Micros(0), &data(0, 0, b"m0")).unwrap();
    assert_eq!(
        a.handle_datagram(Micros(1), &data(0, 0, b"m0")),
        Err(Rejected::Duplicate)
    );
    // A duplicate means our ACK was lost: ACK at once.
    let (h, _) = next(&mut a, 1).unwrap();
    assert_eq!((h.kind, h.ack), (FrameKind::Ack, 1));
    // Buffered out-of-order frame received twice.
    a.handle_datagram(Micros(2), &data(3, 0, b"m3")).unwrap();
    assert_eq!(
        a.handle_datagram(Micros(2), &data(3, 0, b"m3")),
        Err(Rejected::Duplicate)
    );
    // The window is the 8 sequence numbers from the next expected one (1): 1..=8.
    assert_eq!(a.handle_datagram(Micros(3), &data(8, 0, b"in")), Ok(()));
    assert_eq!(
        a.handle_datagram(Micros(3), &data(9, 0, b"out")),
        Err(Rejected::OutOfWindow)
    );
    assert_eq!(
        a.handle_datagram(Micros(3), &data(u32::MAX - 20, 0, b"old")),
        Err(Rejected::OutOfWindow)
    );
    assert_eq!(delivered(&mut a), vec![b"m0".to_vec()]);
    let s = a.conn_stats(conn);
    assert_eq!(
        (s.duplicates, s.out_of_window, s.frames_accepted),
        (2, 2, 3)
    );
    assert_eq!(
        s.data_frames_received,
        s.frames_accepted + s.duplicates + s.out_of_window
    );
}

/// One frame (sequence 0, one fragment when it carries a payload) of `kind` on `conn`
/// under `epoch`, MACed with `key`.
fn frame(kind: FrameKind, epoch: u64, conn: ConnId, payload: &[u8], key: [u8; 32]) -> Vec<u8> {
    let h = Header {
        kind,
        epoch,
        conn,
        seq: 0,
        ack: 0,
        frag_index: 0,
        frag_count: u16::from(!payload.is_empty()),
    };
    let mut buf = vec![0; 64];
    let sealer = wire::DatagramKey::new(&wire::MacKey::new(key), epoch);
    let n = wire::encode(&h, payload, &sealer, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// A DATA datagram from `B` to `A` of this run's epoch, sealed under another secret than
/// the job's (forged without it).
fn forged_data() -> Vec<u8> {
    frame(
        FrameKind::Data,
        EPOCH,
        ConnId { src: B, dst: A },
        b"x",
        [2; 32],
    )
}

#[test]
fn foreign_and_damaged_datagrams_are_rejected_and_counted() {
    let (mut a, _) = ini_a(config());
    // A datagram of an earlier run: its epoch, its secret.
    let earlier_run = frame(
        FrameKind::Data,
        EPOCH ^ 1,
        ConnId { src: B, dst: A },
        b"x",
        [1; 32],
    );
    assert_eq!(
        a.handle_datagram(Micros(0), &earlier_run),
        Err(Rejected::Decode(wire::DecodeError::WrongEpoch {
            found: EPOCH ^ 1,
            expected: EPOCH
        }))
    );
    let forged = forged_data();
    assert_eq!(
        a.handle_datagram(Micros(0), &forged),
        Err(Rejected::Decode(wire::DecodeError::BadMac))
    );
    let misdirected = frame(FrameKind::Data, EPOCH, ConnId { src: B, dst: C }, b"x", KEY);
    assert_eq!(
        a.handle_datagram(Micros(0), &misdirected),
        Err(Rejected::Misdirected(C))
    );
    let from_stranger = frame(FrameKind::Ack, EPOCH, ConnId { src: C, dst: A }, &[], KEY);
    assert_eq!(
        a.handle_datagram(Micros(0), &from_stranger),
        Err(Rejected::UnknownPeer(C))
    );
    let mut corrupt = data(0, 0, b"hello");
    corrupt[34] ^= 0x10;
    assert!(matches!(
        a.handle_datagram(Micros(0), &corrupt),
        Err(Rejected::Decode(wire::DecodeError::BadMac))
    ));
    assert!(matches!(
        a.handle_datagram(Micros(0), b"not a datagram"),
        Err(Rejected::Decode(wire::DecodeError::TooShort(14)))
    ));
    let s = a.stats();
    assert_eq!(
        (
            s.wrong_epoch,
            s.misdirected,
            s.unknown_peer,
            s.bad_mac,
            s.decode_failures,
            s.datagrams_received
        ),
        (1, 1, 1, 2, 1, 6)
    );
    assert_eq!(s.connections.data_frames_received, 0);
    assert!(delivered(&mut a).is_empty());
}

/// The UDP runtime passes the connection registered at the datagram's source address:
/// a datagram from no peer's address, or whose authenticated header names another peer
/// than the one registered there, is dropped and counted as `unknown_source`, before
/// anything else is checked for the first.
#[test]
fn datagrams_from_unregistered_addresses_are_rejected_and_counted() {
    let mut a = Ini::new(A, config()).unwrap();
    let conn_b = a.add_peer(B).unwrap();
    let conn_c = a.add_peer(C).unwrap();
    assert_eq!(
        a.handle_datagram_from(Micros(0), &data(0, 0, b"m0"), None),
        Err(Rejected::UnknownSource)
    );
    assert_eq!(
        a.handle_datagram_from(Micros(0), b"junk", None),
        Err(Rejected::UnknownSource)
    );
    assert_eq!(
        a.handle_datagram_from(Micros(0), &data(0, 0, b"m0"), Some(conn_c)),
        Err(Rejected::UnknownSource)
    );
    assert!(delivered(&mut a).is_empty());
    assert_eq!(
        a.handle_datagram_from(Micros(0), &data(0, 0, b"m0"), Some(conn_b)),
        Ok(())
    );
    assert_eq!(delivered(&mut a), vec![b"m0".to_vec()]);
    let s = a.stats();
    assert_eq!(
        (
            s.unknown_source,
            s.decode_failures,
            s.bad_mac,
            s.datagrams_received
        ),
        (3, 0, 0, 4)
    );
}

#[test]
fn enqueue_gives_the_message_back() {
    let (mut a, conn) = ini_a(WindowConfig {
        send_queue_capacity: 2,
        ..config()
    });
    a.enqueue(conn, vec![1]).unwrap();
    a.enqueue(conn, vec![2]).unwrap();
    let e = a.enqueue(conn, vec![3]).unwrap_err();
    assert!(matches!(e, EnqueueError::Full(_)));
    assert_eq!(e.into_inner(), vec![3]);
    // Sending makes room (queued messages move into the window).
    while next(&mut a, 0).is_some() {}
    assert_eq!(a.queued(conn), 0);
    a.enqueue(conn, vec![3]).unwrap();
    let big = vec![0; a.config().max_message_len + 1];
    let e = a.enqueue(conn, big).unwrap_err();
    assert!(matches!(e, EnqueueError::TooLarge(_)));
    assert_eq!(e.into_inner().len(), a.config().max_message_len + 1);
    // A handle from an INI with more connections names nothing here.
    let mut other = Ini::new(B, config()).unwrap();
    other.add_peer(A).unwrap();
    let foreign = other.add_peer(C).unwrap();
    assert!(matches!(
        a.enqueue(foreign, vec![4]),
        Err(EnqueueError::UnknownConnection(m)) if m == vec![4]
    ));
    // The message is shown by length, not dumped.
    assert_eq!(
        format!("{:?}", EnqueueError::Full(vec![0; 5])),
        "Full(<5 bytes>)"
    );
    assert_eq!(a.take_unacknowledged(conn), Vec::<Vec<u8>>::new());
}

#[test]
fn a_full_window_lets_other_connections_go_first() {
    let mut a = Ini::new(
        A,
        WindowConfig {
            window: 2,
            ack_every: 2,
            ..config()
        },
    )
    .unwrap();
    let to_b = a.add_peer(B).unwrap();
    let to_c = a.add_peer(C).unwrap();
    for i in 0..5u8 {
        a.enqueue(to_b, vec![i]).unwrap();
    }
    for i in 0..2u8 {
        a.enqueue(to_c, vec![10 + i]).unwrap();
    }
    let mut buf = vec![0; a.config().mtu];
    let order: Vec<IniAddr> = std::iter::from_fn(|| a.poll_transmit(Micros(0), &mut buf))
        .map(|t| t.peer)
        .collect();
    // Round-robin while both have room; then B's window is full and C still goes.
    assert_eq!(order, vec![B, C, B, C]);
    assert_eq!((a.in_flight(to_b), a.queued(to_b)), (2, 3));
    assert_eq!((a.in_flight(to_c), a.queued(to_c)), (2, 0));
    // An ACK from B opens its window again.
    a.handle_datagram(Micros(50), &from_b(FrameKind::Ack, 0, 2, (0, 0), &[]))
        .unwrap();
    let order: Vec<IniAddr> = std::iter::from_fn(|| a.poll_transmit(Micros(50), &mut buf))
        .map(|t| t.peer)
        .collect();
    assert_eq!(order, vec![B, B]);
}

/// What the emulated gap asks before it lets a late injection catch up (paper 001 §3.2):
/// DATA to send, held back or not by the window — not an owed ACK.
#[test]
fn data_waiting_counts_data_not_acks() {
    let (mut a, conn) = ini_a(WindowConfig {
        window: 2,
        ack_every: 2,
        ..config()
    });
    assert!(!a.data_waiting(), "nothing queued");
    // An owed ACK is not DATA.
    a.handle_datagram(Micros(0), &data(0, 0, b"x")).unwrap();
    delivered(&mut a);
    assert!(!a.data_waiting(), "only an ACK owed");
    for i in 0..3u8 {
        a.enqueue(conn, vec![i]).unwrap();
    }
    assert!(a.data_waiting());
    next(&mut a, 10).unwrap();
    next(&mut a, 10).unwrap();
    // The third waits behind the full window: still DATA waiting (the window's stall,
    // like a late INI thread, is time the emulated interface makes up).
    assert_eq!((a.in_flight(conn), a.queued(conn)), (2, 1));
    assert!(a.data_waiting(), "window full");
    a.handle_datagram(Micros(20), &from_b(FrameKind::Ack, 1, 2, (0, 0), &[]))
        .unwrap();
    next(&mut a, 30).unwrap();
    // All sent: frames in flight await their ACK, but nothing is left to send.
    assert_eq!(a.queued(conn), 0);
    assert!(!a.data_waiting(), "everything sent");
}

#[test]
fn peers_are_added_once_and_never_self() {
    let mut a = Ini::new(A, config()).unwrap();
    assert_eq!(a.add_peer(A), Err(AddPeerError::IsLocal(A)));
    let b = a.add_peer(B).unwrap();
    assert_eq!(a.add_peer(B), Err(AddPeerError::AlreadyConnected(b)));
    let c = a.add_peer(C).unwrap();
    assert_eq!(
        (a.conn(B), a.conn(C), a.conn(IniAddr::new(9, 9))),
        (Some(b), Some(c), None)
    );
    assert_eq!((a.peer(b), a.peer(c), a.num_connections()), (B, C, 2));
    assert!(
        Ini::new(
            A,
            WindowConfig {
                window: 0,
                ..config()
            }
        )
        .is_err()
    );
}

#[test]
fn time_going_backwards_is_treated_as_the_latest_time() {
    let (mut a, conn) = ini_a(config());
    a.enqueue(conn, vec![1]).unwrap();
    next(&mut a, 5_000).unwrap();
    a.handle_timeout(Micros(10));
    assert!(next(&mut a, 10).is_none(), "no timeout fired in the past");
    assert_eq!(a.poll_timeout(), Some(Micros(6_000)));
}

#[test]
#[should_panic(expected = "below the mtu")]
fn a_short_transmit_buffer_is_a_caller_bug() {
    let (mut a, _) = ini_a(config());
    let mut buf = [0u8; 100];
    a.poll_transmit(Micros(0), &mut buf);
}

/// An arbitrary datagram from `B`: valid MAC, epoch and addresses, anything else.
fn arb_frame() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![
            Just(FrameKind::Data),
            Just(FrameKind::Ack),
            Just(FrameKind::Nak),
            Just(FrameKind::Batch)
        ],
        prop_oneof![0u32..40, any::<u32>()],
        prop_oneof![0u32..40, any::<u32>()],
        (1u16..5, any::<u16>()),
        proptest::collection::vec(any::<u8>(), 0..50),
    )
        .prop_map(|(kind, seq, ack, (count, idx), payload)| match kind {
            FrameKind::Data => from_b(kind, seq, ack, (idx % count, count), &payload),
            FrameKind::Ack => from_b(kind, seq, ack, (0, 0), &payload),
            FrameKind::Nak => from_b(kind, seq, ack, (0, 0), &[]),
            FrameKind::Batch => {
                // `count + 1` frames (2 to 5) sharing the payload; each a fragment of a
                // message of 1 to 3 fragments.
                let frames = usize::from(count) + 1;
                let fc = 1 + idx % 3;
                let mut body = Vec::new();
                for i in 0..frames {
                    let chunk =
                        &payload[i * payload.len() / frames..(i + 1) * payload.len() / frames];
                    body.extend_from_slice(&(i as u16 % fc).to_be_bytes());
                    body.extend_from_slice(&fc.to_be_bytes());
                    body.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
                    body.extend_from_slice(chunk);
                }
                from_b(kind, seq, ack, (0, frames as u16), &body)
            }
        })
}

#[derive(Debug, Clone)]
enum Op {
    Datagram(Vec<u8>),
    Garbage(Vec<u8>),
    Enqueue(usize),
    Transmit,
    Advance(u64),
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => arb_frame().prop_map(Op::Datagram),
        1 => proptest::collection::vec(any::<u8>(), 0..80).prop_map(Op::Garbage),
        2 => (0usize..3000).prop_map(Op::Enqueue),
        3 => Just(Op::Transmit),
        2 => (0u64..3000).prop_map(Op::Advance),
    ]
}

proptest! {
    /// Arbitrary operation sequences with arbitrary (checksum-valid) peer frames: no
    /// panic, and the invariants of the window and the statistics hold throughout.
    #[test]
    fn arbitrary_operations_keep_the_invariants(ops in proptest::collection::vec(arb_op(), 1..120)) {
        let cfg = config();
        let (mut a, conn) = ini_a(cfg.clone());
        let mut now = 0u64;
        let mut buf = vec![0; cfg.mtu];
        let mut enqueued = 0u64;
        for op in ops {
            match op {
                Op::Datagram(d) | Op::Garbage(d) => {
                    let _ = a.handle_datagram(Micros(now), &d);
                }
                Op::Enqueue(len) => {
                    if a.enqueue(conn, vec![7; len]).is_ok() {
                        enqueued += 1;
                    }
                }
                Op::Transmit => {
                    while let Some(t) = a.poll_transmit(Micros(now), &mut buf) {
                        prop_assert!(t.len <= cfg.mtu);
                        let key = wire::DatagramKey::new(&wire::MacKey::new(KEY), EPOCH);
                        prop_assert!(wire::decode(&buf[..t.len], &key, EPOCH, &mut Vec::new()).is_ok());
                    }
                }
                Op::Advance(dt) => {
                    now += dt;
                    if a.poll_timeout().is_some_and(|t| t.as_u64() <= now) {
                        a.handle_timeout(Micros(now));
                        // Every timer due was handled.
                        prop_assert!(a.poll_timeout().is_none_or(|t| t.as_u64() > now));
                    }
                }
            }
            while let Some(e) = a.poll_event() {
                if let Event::PeerUnresponsive { conn: c, peer } = e {
                    prop_assert_eq!((c, peer), (conn, B));
                }
            }
            prop_assert!(a.in_flight(conn) <= cfg.window as usize);
            let s = a.conn_stats(conn);
            prop_assert_eq!(s.msgs_enqueued, enqueued);
            prop_assert!(s.msgs_acked <= s.msgs_sent && s.msgs_sent <= s.msgs_enqueued);
            prop_assert_eq!(
                s.data_frames_received,
                s.frames_accepted + s.duplicates + s.out_of_window
            );
        }
    }
}

/// Evidence that the peer's process lives (`note_alive`) postpones the unresponsive
/// verdict to `peer_timeout` after the latest evidence; without more of it the peer is
/// reported then, exactly as without evidence.
#[test]
fn note_alive_postpones_the_peer_timeout_from_the_latest_evidence() {
    let cfg = config();
    let timeout = cfg.peer_timeout.as_u64();
    let (mut a, conn) = ini_a(cfg);
    let mut buf = vec![0u8; 2048];
    a.enqueue(conn, b"never acknowledged".to_vec()).unwrap();
    assert!(a.poll_transmit(Micros(0), &mut buf).is_some());
    let unresponsive = |a: &mut Ini, now: u64| {
        if a.poll_timeout().is_some_and(|t| t.as_u64() <= now) {
            a.handle_timeout(Micros(now));
        }
        let mut seen = false;
        while let Some(e) = a.poll_event() {
            seen |= matches!(e, Event::PeerUnresponsive { .. });
            while a.poll_transmit(Micros(now), &mut buf.clone()).is_some() {}
        }
        seen
    };
    // Alive at 0.8 × the timeout: not declared dead at the timeout...
    a.note_alive(conn, Micros(timeout * 8 / 10));
    assert!(!unresponsive(&mut a, timeout));
    assert!(!unresponsive(&mut a, timeout * 17 / 10));
    // ...but at the timeout after that evidence.
    assert!(unresponsive(&mut a, timeout * 18 / 10));
}

/// `config()` with BATCH datagrams on and a 256-byte MTU (208 payload bytes).
fn coalescing() -> WindowConfig {
    WindowConfig {
        coalesce: true,
        mtu: 256,
        max_message_len: 1 << 20,
        ..config()
    }
}

#[test]
fn coalesce_packs_queued_messages_into_one_batch() {
    let (mut a, conn) = ini_a(coalescing());
    // 3 × (6 + 60) = 198 bytes fit in 208; the fourth message does not.
    for i in 0..4u8 {
        a.enqueue(conn, vec![i; 60]).unwrap();
    }
    let mut buf = vec![0; 256];
    let t = a.poll_transmit(Micros(0), &mut buf).unwrap();
    assert!(t.data);
    assert_eq!(t.messages_started, 3);
    let key = wire::DatagramKey::new(&wire::MacKey::new(KEY), EPOCH);
    let mut scratch = Vec::new();
    let f = wire::decode(&buf[..t.len], &key, EPOCH, &mut scratch).unwrap();
    assert_eq!(
        (f.header.kind, f.header.seq, f.header.frag_count),
        (FrameKind::Batch, 0, 3)
    );
    let frames: Vec<_> = wire::BatchFrames::new(0, f.payload).collect();
    for (i, fr) in frames.iter().enumerate() {
        assert_eq!((fr.seq, fr.frag_index, fr.frag_count), (i as u32, 0, 1));
        assert_eq!(fr.data, &[i as u8; 60][..]);
    }
    // The fourth goes alone, as a plain DATA frame.
    let (h, payload) = next(&mut a, 0).unwrap();
    assert_eq!((h.kind, h.seq), (FrameKind::Data, 3));
    assert_eq!(payload, vec![3; 60]);
    let s = a.conn_stats(conn);
    assert_eq!(
        (s.data_frames_sent, s.batches_sent, s.frames_in_batches_sent),
        (4, 1, 3)
    );
    assert_eq!(a.stats().datagrams_sent, 2);
}

#[test]
fn coalesce_stops_at_the_window_and_never_batches_a_full_frame() {
    let cfg = WindowConfig {
        window: 2,
        ack_every: 2,
        ..coalescing()
    };
    let (mut a, conn) = ini_a(cfg);
    for _ in 0..3 {
        a.enqueue(conn, vec![1; 10]).unwrap();
    }
    let (h, _) = next(&mut a, 0).unwrap();
    assert_eq!(
        (h.kind, h.frag_count),
        (FrameKind::Batch, 2),
        "the window holds two"
    );
    assert!(next(&mut a, 0).is_none(), "the window is full");
    // A message of two fragments: each fragment fills a frame, so none is batched.
    let (mut a, conn) = ini_a(coalescing());
    a.enqueue(conn, vec![2; 300]).unwrap();
    let kinds: Vec<_> = std::iter::from_fn(|| next(&mut a, 0))
        .map(|(h, p)| (h.kind, h.frag_index, h.frag_count, p.len()))
        .collect();
    let full = coalescing().mtu - wire::OVERHEAD;
    assert_eq!(
        kinds,
        vec![
            (FrameKind::Data, 0, 2, full),
            (FrameKind::Data, 1, 2, 300 - full)
        ]
    );
}

#[test]
fn a_batch_is_delivered_frame_by_frame_and_a_lost_one_resent_alone() {
    let (mut a, conn_ab) = ini_a(coalescing());
    let mut b = Ini::new(B, coalescing()).unwrap();
    b.add_peer(A).unwrap();
    for i in 0..3u8 {
        a.enqueue(conn_ab, vec![i; 40]).unwrap();
    }
    let mut buf = vec![0; 256];
    let t = a.poll_transmit(Micros(0), &mut buf).unwrap();
    assert_eq!(t.messages_started, 3);
    // B receives the batch: three messages, in order.
    b.handle_datagram(Micros(10), &buf[..t.len]).unwrap();
    let got = delivered(&mut b);
    assert_eq!(got, vec![vec![0; 40], vec![1; 40], vec![2; 40]]);
    assert_eq!(b.stats().connections.frames_in_batches_received, 3);
    // Replayed, every frame is a duplicate and nothing is delivered again.
    assert_eq!(
        b.handle_datagram(Micros(20), &buf[..t.len]),
        Err(Rejected::Duplicate)
    );
    assert!(delivered(&mut b).is_empty());
    // A never hears an ACK: at the SEND timeout it resends each frame alone.
    a.handle_timeout(Micros(1_000));
    let resent: Vec<_> = std::iter::from_fn(|| next(&mut a, 1_000))
        .map(|(h, _)| (h.kind, h.seq))
        .collect();
    assert_eq!(
        resent,
        vec![
            (FrameKind::Data, 0),
            (FrameKind::Data, 1),
            (FrameKind::Data, 2)
        ]
    );
}

/// Every event `ini` has: a delivered message's bytes, `None` for a peer declared
/// unresponsive (the only peer is `B`).
fn events(ini: &mut Ini) -> Vec<Option<Vec<u8>>> {
    std::iter::from_fn(|| ini.poll_event())
        .map(|e| match e {
            Event::Delivered { msg, .. } => Some(msg),
            Event::PeerUnresponsive { peer, .. } => {
                assert_eq!(peer, B);
                None
            }
        })
        .collect()
}

/// Feeds `datagram` to `ini` through [`Ini::handle_datagram_in_place`] from the
/// connection `conn`, on a copy (the call decrypts it in place); returns the result and
/// the messages handed to the sink, with the connection and peer each came from.
fn in_place(
    ini: &mut Ini,
    now: u64,
    datagram: &[u8],
    conn: ConnHandle,
) -> (Result<(), Rejected>, Vec<Vec<u8>>) {
    let mut copy = datagram.to_vec();
    let mut got = Vec::new();
    let r = ini.handle_datagram_in_place(Micros(now), &mut copy, Some(conn), &mut |c, peer, m| {
        assert_eq!(
            (c, peer),
            (conn, B),
            "the sink names the message's connection"
        );
        got.push(m.to_vec());
    });
    (r, got)
}

/// A message in one fragment goes to the sink, read in place, and not to the events; a
/// message of several fragments, and any message while an event waits, still comes as
/// an event, so that a connection's messages keep their order.
#[test]
fn in_place_delivery_hands_single_fragments_to_the_sink_in_order() {
    let (mut a, conn) = ini_a(config());
    let (r, got) = in_place(&mut a, 0, &data(0, 0, b"m0"), conn);
    assert_eq!((r, got), (Ok(()), vec![b"m0".to_vec()]));
    assert!(
        delivered(&mut a).is_empty(),
        "no event for what the sink took"
    );
    // Two fragments: reassembled, delivered as an event.
    let frag = |seq: u32, i: u16, bytes: &[u8]| from_b(FrameKind::Data, seq, 0, (i, 2), bytes);
    assert!(in_place(&mut a, 1, &frag(1, 0, b"ab"), conn).1.is_empty());
    assert!(in_place(&mut a, 2, &frag(2, 1, b"cd"), conn).1.is_empty());
    // m3 arrives while the event of "abcd" waits: it queues behind it.
    let (r, got) = in_place(&mut a, 3, &data(3, 0, b"m3"), conn);
    assert_eq!((r, got.len()), (Ok(()), 0));
    assert_eq!(delivered(&mut a), vec![b"abcd".to_vec(), b"m3".to_vec()]);
    // Out of order: m5 is buffered, m4 completes the gap; both reach the sink in order.
    assert!(in_place(&mut a, 4, &data(5, 0, b"m5"), conn).1.is_empty());
    let (r, got) = in_place(&mut a, 5, &data(4, 0, b"m4"), conn);
    assert_eq!((r, got), (Ok(()), vec![b"m4".to_vec(), b"m5".to_vec()]));
    let s = a.conn_stats(conn);
    assert_eq!((s.msgs_delivered, s.bytes_delivered), (5, 12));
    assert_eq!(a.expected_seq(conn), 6);
}

/// Decrypting in place checks what the copying path checks: a forged or damaged
/// datagram, or one of another run, is rejected and counted and nothing reaches the sink.
#[test]
fn in_place_delivery_rejects_forged_and_damaged_datagrams() {
    let (mut a, conn) = ini_a(config());
    let forged = forged_data();
    let mut corrupt = data(0, 0, b"hello");
    corrupt[44] ^= 0x01;
    let earlier_run = frame(
        FrameKind::Data,
        EPOCH ^ 1,
        ConnId { src: B, dst: A },
        b"x",
        KEY,
    );
    for (d, want) in [
        (&forged, wire::DecodeError::BadMac),
        (&corrupt, wire::DecodeError::BadMac),
        (
            &earlier_run,
            wire::DecodeError::WrongEpoch {
                found: EPOCH ^ 1,
                expected: EPOCH,
            },
        ),
    ] {
        let (r, got) = in_place(&mut a, 0, d, conn);
        assert_eq!(r, Err(Rejected::Decode(want)));
        assert!(got.is_empty());
    }
    // From no peer's address: rejected before any decryption.
    let mut copy = data(0, 0, b"ok");
    let before = copy.clone();
    let r = a.handle_datagram_in_place(Micros(0), &mut copy, None, &mut |_, _, _| {
        panic!("nothing from an unknown source is delivered")
    });
    assert_eq!(r, Err(Rejected::UnknownSource));
    assert_eq!(
        copy, before,
        "an unknown source's datagram is not decrypted"
    );
    let s = a.stats();
    assert_eq!(
        (
            s.bad_mac,
            s.wrong_epoch,
            s.unknown_source,
            s.datagrams_received
        ),
        (2, 1, 1, 4)
    );
    // The genuine datagram still gets through afterwards.
    assert_eq!(
        in_place(&mut a, 1, &data(0, 0, b"ok"), conn).1,
        vec![b"ok".to_vec()]
    );
}

proptest! {
    /// The in-place path delivers exactly what the copying path delivers, in the same
    /// order, with the same verdicts and statistics, for arbitrary (valid, foreign and
    /// garbage) datagram sequences: the sink's messages and then the events, after each
    /// datagram, against the events alone.
    #[test]
    fn in_place_delivery_matches_the_copying_path(ops in proptest::collection::vec(arb_op(), 1..120)) {
        let (mut copying, conn) = ini_a(config());
        let (mut placing, conn2) = ini_a(config());
        prop_assert_eq!(conn, conn2);
        let mut now = 0u64;
        let mut buf = vec![0; config().mtu];
        for op in ops {
            match op {
                Op::Datagram(d) | Op::Garbage(d) => {
                    let r1 = copying.handle_datagram_from(Micros(now), &d, Some(conn));
                    let (r2, got) = in_place(&mut placing, now, &d, conn);
                    prop_assert_eq!(r1, r2);
                    let mut got: Vec<_> = got.into_iter().map(Some).collect();
                    got.extend(events(&mut placing));
                    prop_assert_eq!(events(&mut copying), got);
                }
                Op::Enqueue(len) => {
                    let r1 = copying.enqueue(conn, vec![7; len]).is_ok();
                    prop_assert_eq!(r1, placing.enqueue(conn, vec![7; len]).is_ok());
                }
                Op::Transmit => {
                    while let Some(t) = copying.poll_transmit(Micros(now), &mut buf) {
                        prop_assert_eq!(Some(t.len), placing.poll_transmit(Micros(now), &mut buf).map(|t| t.len));
                    }
                    prop_assert!(placing.poll_transmit(Micros(now), &mut buf).is_none());
                }
                Op::Advance(dt) => {
                    now += dt;
                    copying.handle_timeout(Micros(now));
                    placing.handle_timeout(Micros(now));
                    prop_assert_eq!(events(&mut copying), events(&mut placing));
                }
            }
            prop_assert_eq!(copying.stats(), placing.stats());
        }
    }
}
