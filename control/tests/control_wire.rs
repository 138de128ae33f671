//! The control plane's frames: round trips, refusal of other jobs, versions
//! and programs, MAC checks (missing, forged, altered, unexpected), and decoding of
//! arbitrary bytes without panics.

use std::io::Cursor;

use multigrain_control::wire::{
    self, Auth, FrameError, HEADER_LEN, MAX_FRAME, Message, ReadError, Received,
};
use multigrain_control::{Registration, Secret};
use proptest::prelude::*;

const KEY: u64 = 0x6d75_6c74_6900_0001;

fn registration() -> impl Strategy<Value = Registration> {
    (
        0usize..2048,
        ".{0,20}",
        "[0-9a-f-]{0,36}",
        any::<u32>(),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(cluster, host, boot_id, pid, payload)| Registration {
            cluster,
            host,
            boot_id,
            pid,
            payload,
        })
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (registration(), 0usize..2048).prop_map(|(registration, clusters)| Message::Register {
            registration,
            clusters
        }),
        proptest::collection::vec(0usize..2048, 0..8)
            .prop_map(|missing| Message::StartupStatus { missing }),
        (proptest::collection::vec(0usize..2048, 0..8), any::<u64>()).prop_map(
            |(missing, timeout_ms)| Message::StartupFailed {
                missing,
                timeout_ms
            }
        ),
        ".{0,40}".prop_map(|reason| Message::Rejected { reason }),
        (
            proptest::collection::vec(registration(), 0..4),
            any::<u64>(),
            proptest::option::of(any::<[u8; 32]>())
        )
            .prop_map(|(registrations, epoch, secret)| Message::Welcome {
                registrations,
                epoch,
                secret: secret.map(Secret::from_bytes),
            }),
        Just(Message::Heartbeat),
        any::<u32>().prop_map(|tag| Message::Barrier { tag }),
        any::<u32>().prop_map(|tag| Message::Release { tag }),
        ".{0,40}".prop_map(|reason| Message::Abort { reason }),
        (0usize..2048, ".{0,40}").prop_map(|(cluster, reason)| Message::Failed { cluster, reason }),
        Just(Message::Finish),
        Just(Message::Done),
        proptest::option::of((any::<u64>(), proptest::collection::vec(".{0,40}", 0..4))).prop_map(
            |stall| Message::Progress {
                stall: stall.map(|(for_ms, waits)| wire::StallReport { for_ms, waits }),
            }
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn round_trip(msg in message(), key in any::<u64>(), secret in proptest::option::of(any::<[u8; 32]>())) {
        let secret = secret.map(Secret::from_bytes);
        let auth = Auth { key: secret.as_ref(), required: secret.is_some() };
        let frame = wire::encode(key, secret.as_ref(), &msg);
        let want = Received { msg: msg.clone(), authenticated: secret.is_some() };
        prop_assert_eq!(wire::decode(key, auth, &frame[4..]), Ok(want.clone()));
        prop_assert_eq!(
            wire::decode_prefixed(key, auth, &frame),
            Ok(Some((want.clone(), frame.len())))
        );
        let got = wire::read_frame(&mut Cursor::new(&frame), key, auth).expect("read back");
        prop_assert_eq!(got, want);
        // Every strict prefix is incomplete, never an error or a panic.
        for cut in [0, 1, 3, 4, 4 + HEADER_LEN, frame.len() - 1] {
            prop_assert_eq!(wire::decode_prefixed(key, auth, &frame[..cut]), Ok(None));
        }
    }

    #[test]
    fn other_key_is_refused(msg in message(), key in any::<u64>(), other in any::<u64>()) {
        prop_assume!(key != other);
        let frame = wire::encode(other, None, &msg);
        prop_assert_eq!(
            wire::decode(key, Auth::NONE, &frame[4..]),
            Err(FrameError::ForeignKey { found: other, expected: key })
        );
    }

    /// Once a MAC is required, a frame without one, under another secret, or with any
    /// bit of its header or body flipped is refused.
    #[test]
    fn unauthenticated_forged_or_altered_frames_are_refused(
        msg in message(),
        secret in any::<[u8; 32]>(),
        other in any::<[u8; 32]>(),
        at in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        prop_assume!(secret != other);
        let secret = Secret::from_bytes(secret);
        let auth = Auth::required(&secret);
        let plain = wire::encode(KEY, None, &msg);
        prop_assert_eq!(wire::decode(KEY, auth, &plain[4..]), Err(FrameError::MissingMac));
        let forged = wire::encode(KEY, Some(&Secret::from_bytes(other)), &msg);
        prop_assert_eq!(wire::decode(KEY, auth, &forged[4..]), Err(FrameError::BadMac));
        let mut altered = wire::encode(KEY, Some(&secret), &msg);
        let i = 4 + at.index(altered.len() - 4);
        altered[i] ^= 1 << bit;
        prop_assert!(wire::decode(KEY, auth, &altered[4..]).is_err());
        prop_assert!(wire::read_frame(&mut Cursor::new(&altered), KEY, auth).is_err());
        // A MAC where this end knows no secret.
        let good = wire::encode(KEY, Some(&secret), &msg);
        prop_assert_eq!(wire::decode(KEY, Auth::NONE, &good[4..]), Err(FrameError::UnexpectedMac));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let secret = Secret::from_bytes([3; 32]);
        for auth in [Auth::NONE, Auth::required(&secret)] {
            let _ = wire::decode(KEY, auth, &bytes);
            let _ = wire::decode_prefixed(KEY, auth, &bytes);
            let _ = wire::check_header(KEY, auth, &bytes);
            let _ = wire::read_frame(&mut Cursor::new(&bytes), KEY, auth);
        }
    }

    #[test]
    fn arbitrary_bodies_behind_a_valid_header_never_panic(
        body in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut frame = wire::encode(KEY, None, &Message::Heartbeat);
        frame.truncate(4 + HEADER_LEN);
        frame.extend_from_slice(&body);
        let len = u32::try_from(frame.len() - 4).unwrap();
        frame[..4].copy_from_slice(&len.to_be_bytes());
        let _ = wire::decode_prefixed(KEY, Auth::NONE, &frame);
        let _ = wire::read_frame(&mut Cursor::new(&frame), KEY, Auth::NONE);
    }

    #[test]
    fn corrupted_frames_never_panic(msg in message(), at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut frame = wire::encode(KEY, None, &msg);
        let i = at.index(frame.len());
        frame[i] ^= 1 << bit;
        let _ = wire::decode_prefixed(KEY, Auth::NONE, &frame);
        let _ = wire::read_frame(&mut Cursor::new(&frame), KEY, Auth::NONE);
    }
}

#[test]
fn header_checks_name_what_is_wrong() {
    let frame = wire::encode(KEY, None, &Message::Done);
    let mut bad = frame.clone();
    bad[4] = b'X';
    assert!(matches!(
        wire::decode(KEY, Auth::NONE, &bad[4..]),
        Err(FrameError::BadMagic { .. })
    ));
    let mut v1 = frame.clone();
    v1[9] = 1;
    let e = wire::decode(KEY, Auth::NONE, &v1[4..]).unwrap_err();
    assert_eq!(e, FrameError::Version { found: 1 });
    assert!(
        e.to_string().contains("run the same multigrain build"),
        "{e}"
    );
    assert_eq!(
        wire::decode(KEY, Auth::NONE, &frame[4..10]),
        Err(FrameError::Short { len: 6 })
    );
    let e = wire::decode(KEY + 1, Auth::NONE, &frame[4..]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "frame carries job key 0x6d756c7469000001, this job's key is 0x6d756c7469000002"
    );
}

#[test]
fn length_prefix_limits() {
    let huge = u32::try_from(MAX_FRAME + 1).unwrap().to_be_bytes();
    assert_eq!(
        wire::decode_prefixed(KEY, Auth::NONE, &huge),
        Err(FrameError::TooLong { len: MAX_FRAME + 1 })
    );
    assert!(matches!(
        wire::read_frame(&mut Cursor::new(&huge), KEY, Auth::NONE),
        Err(ReadError::Frame(FrameError::TooLong { .. }))
    ));
    let tiny = 3u32.to_be_bytes();
    assert_eq!(
        wire::decode_prefixed(KEY, Auth::NONE, &tiny),
        Err(FrameError::Short { len: 3 })
    );
    assert!(matches!(
        wire::read_frame(&mut Cursor::new(&[] as &[u8]), KEY, Auth::NONE),
        Err(ReadError::Closed)
    ));
    assert!(matches!(
        wire::read_frame(&mut Cursor::new(&[0u8, 0]), KEY, Auth::NONE),
        Err(ReadError::Io(_))
    ));
}
