//! The cost of authenticating INI datagrams (issues 13 and 10): per datagram, the
//! sender's sealing and the receiver's check — wire v3, AES-256-GCM (`wire::encode` and
//! `wire::decode` of a DATA datagram: the payload copied in and encrypted, copied out and
//! decrypted) — beside wire v2's BLAKE3 keyed MAC over the same bytes (16 bytes, both
//! ends) and wire v1's CRC32C (hardware CRC32C where the CPU has it). Samples alternate
//! v3 / v2 / v1 in one run and the report gives medians with p25–p75.
//!
//! Sizes are whole datagrams: 80 (an Express message's: a 24-byte frame in 40 header +
//! 16 tag bytes), 1472 (one Ethernet-MTU fragment), 4184 (a 4 KiB Tag-On message in one
//! datagram: 4096 data + 32 frame header + 56 window header and tag) and 8972 (a full
//! jumbo datagram, the default job's MTU).
//!
//! `cargo bench -p multigrain-window --bench mac`; results in the README (*Authenticated
//! traffic*).

use multigrain_window::IniAddr;
use multigrain_window::wire::{self, ConnId, DatagramKey, FrameKind, Header, MacKey};
use std::hint::black_box;
use std::time::Instant;

/// Datagrams per sample.
const ITERS: u32 = 20_000;
/// Samples per method and size.
const SAMPLES: usize = 9;
const EPOCH: u64 = 0x5eed;

/// The header of the benchmark's DATA datagrams (one single-fragment message).
fn header() -> Header {
    Header {
        kind: FrameKind::Data,
        epoch: EPOCH,
        conn: ConnId {
            src: IniAddr::new(0, 0),
            dst: IniAddr::new(1, 0),
        },
        seq: 1,
        ack: 0,
        frag_index: 0,
        frag_count: 1,
    }
}

fn aead_both_ends(
    key: &DatagramKey,
    h: &Header,
    payload: &[u8],
    buf: &mut [u8],
    scratch: &mut Vec<u8>,
) -> bool {
    let n = wire::encode(h, black_box(payload), key, buf).expect("a valid datagram");
    wire::decode(black_box(&buf[..n]), key, EPOCH, scratch).is_ok()
}

fn mac_both_ends(key: &MacKey, body: &[u8]) -> bool {
    let tag = key.mac(black_box(body));
    key.verify(black_box(body), &tag)
}

fn crc_both_ends(body: &[u8]) -> bool {
    let sent = crc32c::crc32c(black_box(body));
    crc32c::crc32c(black_box(body)) == sent
}

/// ns per datagram of one sample of `f`.
fn sample(mut f: impl FnMut() -> bool) -> f64 {
    let t = Instant::now();
    let mut ok = true;
    for _ in 0..ITERS {
        ok &= f();
    }
    assert!(black_box(ok));
    t.elapsed().as_nanos() as f64 / f64::from(ITERS)
}

fn quartiles(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.25), at(0.75))
}

fn main() {
    let secret = MacKey::new([0x42; 32]);
    let key = DatagramKey::new(&secret, EPOCH);
    println!("per datagram, sender + receiver; {SAMPLES} alternating samples of {ITERS} datagrams");
    println!("| datagram | AES-256-GCM seal + open (v3) | BLAKE3 keyed MAC (v2) | CRC32C (v1) |");
    println!("|---:|---|---|---|");
    let mut scratch = Vec::new();
    for len in [80usize, 1472, 4184, 8972] {
        let payload: Vec<u8> = (0..len - wire::OVERHEAD).map(|i| (i * 7) as u8).collect();
        let h = header();
        let mut buf = vec![0u8; len];
        let body: Vec<u8> = (0..len - 16).map(|i| (i * 7) as u8).collect();
        let (mut aead, mut mac, mut crc) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..SAMPLES {
            aead.push(sample(|| {
                aead_both_ends(&key, &h, &payload, &mut buf, &mut scratch)
            }));
            mac.push(sample(|| mac_both_ends(&secret, &body)));
            crc.push(sample(|| crc_both_ends(&body)));
        }
        let gbs = |ns: f64| 2.0 * len as f64 / ns;
        let cell = |v: Vec<f64>| {
            let (m, lo, hi) = quartiles(v);
            format!("{m:.0} ns ({lo:.0}–{hi:.0}), {:.2} GB/s", gbs(m))
        };
        println!(
            "| {len} B | {} | {} | {} |",
            cell(aead),
            cell(mac),
            cell(crc)
        );
    }
}
