use super::*;
use proptest::prelude::*;

fn send(ini: u16, seq: u32, t: [u64; 4]) -> TraceRecord {
    TraceRecord {
        side: Side::Send,
        kind: 2,
        cluster: 0,
        ini,
        peer_cluster: 1,
        peer_ini: 0,
        lane: 3,
        seq,
        bytes: 4096,
        t,
    }
}

fn receive(cluster: u16, origin: u16, seq: u32, arrived: u64, delivered: u64) -> TraceRecord {
    TraceRecord {
        side: Side::Receive,
        kind: 2,
        cluster,
        ini: 0,
        peer_cluster: origin,
        peer_ini: 0,
        lane: 3,
        seq,
        bytes: 4096,
        t: [arrived, delivered, 0, 0],
    }
}

fn ini(records: Vec<TraceRecord>, span: (u64, u64)) -> IniTrace {
    IniTrace {
        records,
        dropped: 0,
        span,
    }
}

/// Paper 002 Figure 5-3: C arrives at INI 0 while B is being processed there and INI 1 is
/// idle, so C is mis-scheduled and its queue wait is wasted.
fn figure_5_3(ini1: Vec<TraceRecord>) -> ClusterTrace {
    let b = send(0, 0, [0, 0, 10, 100]);
    let c = send(0, 1, [50, 100, 110, 150]);
    ClusterTrace {
        cluster: 0,
        inis: vec![ini(vec![b, c], (0, 300)), ini(ini1, (0, 300))],
    }
}

#[test]
fn a_message_queued_behind_work_while_another_ini_idles_is_misscheduled() {
    let s = summarize(&[figure_5_3(Vec::new())]);
    let c = &s.clusters[0];
    assert_eq!((c.sent, c.misscheduled), (2, 1));
    assert!((c.wasted_us - 0.050).abs() < 1e-9, "C waited 50 ns: {c:?}");
    // INI 0 processed [0, 150); INI 1 nothing.
    assert!((c.busy_us - 0.150).abs() < 1e-9);
    assert!((c.misscheduled_time_rate - 1.0 / 3.0).abs() < 1e-9);
    assert!((c.misscheduled_count_rate - 0.5).abs() < 1e-9);
    let i0 = &s.inis[0];
    // B found an empty INI, C found B.
    assert!((i0.mean_queue_len - 0.5).abs() < 1e-9);
    assert!((i0.utilization - 0.5).abs() < 1e-9);
    assert!((i0.mean_time_us - 0.1).abs() < 1e-9, "(100 + 100) / 2 ns");
    assert_eq!(s.inis[1].utilization, 0.0);
}

#[test]
fn no_message_is_misscheduled_when_every_other_ini_is_busy() {
    let busy = send(1, 7, [40, 40, 45, 60]);
    let s = summarize(&[figure_5_3(vec![busy])]);
    assert_eq!(s.clusters[0].misscheduled, 0);
    assert_eq!(s.misscheduled_time_rate, 0.0);
}

#[test]
fn an_ini_outside_its_traced_span_is_not_idle() {
    let mut t = figure_5_3(Vec::new());
    t.inis[1].span = (60, 300);
    assert_eq!(summarize(&[t]).clusters[0].misscheduled, 0);
}

#[test]
fn one_ini_per_cluster_is_never_misscheduled() {
    let t = ClusterTrace {
        cluster: 0,
        inis: vec![ini(
            vec![send(0, 0, [0, 0, 1, 100]), send(0, 1, [10, 100, 101, 200])],
            (0, 200),
        )],
    };
    let s = summarize(&[t]);
    assert_eq!(s.misscheduled_count_rate, 0.0);
    assert!((s.mean_utilization - 1.0).abs() < 1e-9);
}

#[test]
fn message_time_adds_the_sending_and_the_receiving_ini() {
    let a = ClusterTrace {
        cluster: 0,
        inis: vec![ini(
            vec![send(0, 0, [0, 5, 6, 1_000]), send(0, 1, [0, 5, 6, 3_000])],
            (0, 5_000),
        )],
    };
    // Only message 0 reached cluster 1's trace.
    let b = ClusterTrace {
        cluster: 1,
        inis: vec![ini(vec![receive(1, 0, 0, 2_000, 2_500)], (0, 5_000))],
    };
    let s = summarize(&[a, b]);
    assert_eq!((s.messages, s.joined), (2, 1));
    assert!((s.mean_message_time_us - 1.5).abs() < 1e-9, "1000 + 500 ns");
    assert!(
        (s.mean_service_time_us - 1.495).abs() < 1e-9,
        "without the 5 ns in the queue"
    );
    assert_eq!(s.inis[1].received, 1);
    // The run report carries the summary in its JSON and reads it back.
    let json = serde_json::to_string(&s).unwrap();
    let back: TraceSummary = serde_json::from_str(&json).unwrap();
    assert_eq!(back, s);
}

fn any_record() -> impl Strategy<Value = TraceRecord> {
    (
        any::<bool>(),
        1u8..=4,
        any::<[u16; 5]>(),
        any::<u32>(),
        any::<u32>(),
        proptest::collection::vec(0u64..1 << 40, 4),
    )
        .prop_map(|(is_send, kind, ids, seq, bytes, mut t)| {
            t.sort_unstable();
            let side = if is_send { Side::Send } else { Side::Receive };
            if side == Side::Receive {
                t[2] = 0;
                t[3] = 0;
            }
            TraceRecord {
                side,
                kind,
                cluster: ids[0],
                ini: ids[1],
                peer_cluster: ids[2],
                peer_ini: ids[3],
                lane: ids[4],
                seq,
                bytes,
                t: [t[0], t[1], t[2], t[3]],
            }
        })
}

proptest! {
    #[test]
    fn records_round_trip(r in any_record()) {
        let mut b = [0u8; RECORD_BYTES];
        r.encode(&mut b);
        prop_assert_eq!(TraceRecord::decode(&b, 0).unwrap(), r);
    }

    #[test]
    fn files_round_trip(rs in proptest::collection::vec(any_record(), 0..40), split in 0usize..40) {
        let split = split.min(rs.len());
        let mut inis = vec![
            ini(rs[..split].to_vec(), (1, 2)),
            ini(rs[split..].to_vec(), (3, 4)),
        ];
        for (k, i) in inis.iter_mut().enumerate() {
            for r in &mut i.records {
                r.cluster = 9;
                r.ini = k as u16;
            }
        }
        let t = ClusterTrace { cluster: 9, inis };
        let mut bytes = Vec::new();
        t.write(&mut bytes).unwrap();
        prop_assert_eq!(ClusterTrace::parse(&bytes).unwrap(), t);
    }

    /// Whatever bytes a file holds, reading it returns an error or a trace, never panics.
    #[test]
    fn garbage_is_an_error_not_a_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..600), magic in any::<bool>()) {
        if magic && bytes.len() >= 12 {
            bytes[..8].copy_from_slice(b"MGTRACE1");
            bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
        }
        let _ = ClusterTrace::parse(&bytes);
    }
}

fn one_record_file() -> Vec<u8> {
    let mut r = send(0, 0, [1, 2, 3, 4]);
    r.cluster = 0;
    let t = ClusterTrace {
        cluster: 0,
        inis: vec![ini(vec![r], (0, 10))],
    };
    let mut bytes = Vec::new();
    t.write(&mut bytes).unwrap();
    bytes
}

#[test]
fn damaged_files_are_rejected_with_the_reason() {
    let good = one_record_file();
    assert!(ClusterTrace::parse(&good).is_ok());
    let err = |b: &[u8]| ClusterTrace::parse(b).unwrap_err().to_string();
    assert!(err(&good[..good.len() - 1]).contains("truncated"));
    assert!(err(b"ELF\x7f....").contains("not a multigrain trace"));
    let mut v2 = good.clone();
    v2[8] = 2;
    assert!(err(&v2).contains("version 2"));
    let rec = good.len() - RECORD_BYTES;
    let mut wrong_ini = good.clone();
    wrong_ini[rec + 4] = 1;
    assert!(err(&wrong_ini).contains("record 0"), "{}", err(&wrong_ini));
    let mut backwards = good.clone();
    backwards[rec + 24..rec + 32].copy_from_slice(&99u64.to_le_bytes());
    assert!(err(&backwards).contains("checkpoint order"));
}

#[test]
fn a_full_buffer_counts_what_it_drops() {
    let mut b = TraceBuffer::new(1, 5);
    b.push(send(0, 0, [5, 6, 7, 8]));
    b.push(send(0, 1, [5, 6, 7, 8]));
    b.close(20);
    assert_eq!((b.records().len(), b.dropped(), b.span()), (1, 1, (5, 20)));
}
