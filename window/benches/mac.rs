//! The cost of authenticating INI datagrams (issue 13): per datagram, the sender's MAC
//! and the receiver's verification — BLAKE3 in keyed mode, truncated to 16 bytes (wire
//! v2) — beside what wire v1 did over the same bytes, a CRC32C at each end (hardware
//! CRC32C where the CPU has it). Samples alternate MAC / CRC (A/B/A/B) in one run and
//! the report gives medians with p25–p75.
//!
//! Sizes are whole datagrams: 80 (an Express message: 32 header + 32 frame + 16 MAC), 1472
//! (one Ethernet-MTU fragment), 4176 (a 4 KiB Tag-On
//! message in one datagram: 4096 data + 32 frame header + 48 window header and MAC) and
//! 8972 (a full jumbo datagram, the default job's MTU).
//!
//! `cargo bench -p multigrain-window --bench mac`; results of 2026-11-25 in the README
//! (Authenticated traffic): 4176 B, MAC 3.13 µs against CRC32C 0.40 µs, both ends.

use multigrain_window::wire::MacKey;
use std::hint::black_box;
use std::time::Instant;

/// Datagrams per sample.
const ITERS: u32 = 20_000;
/// Samples per method and size.
const SAMPLES: usize = 9;

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
    let key = MacKey::new([0x42; 32]);
    println!("per datagram, sender + receiver; {SAMPLES} alternating samples of {ITERS} datagrams");
    println!("| datagram | BLAKE3 keyed MAC (v2) | CRC32C (v1) | MAC − CRC |");
    println!("|---:|---|---|---:|");
    for len in [80usize, 1472, 4176, 8972] {
        let body: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
        let body = &body[..len - 16];
        let (mut mac, mut crc) = (Vec::new(), Vec::new());
        for _ in 0..SAMPLES {
            mac.push(sample(|| mac_both_ends(&key, body)));
            crc.push(sample(|| crc_both_ends(body)));
        }
        let diffs: Vec<f64> = mac.iter().zip(&crc).map(|(m, c)| m - c).collect();
        let (m, m25, m75) = quartiles(mac);
        let (c, c25, c75) = quartiles(crc);
        let (d, _, _) = quartiles(diffs);
        let gbs = |ns: f64| 2.0 * len as f64 / ns;
        println!(
            "| {len} B | {m:.0} ns ({m25:.0}–{m75:.0}), {:.2} GB/s | {c:.0} ns ({c25:.0}–{c75:.0}), {:.2} GB/s | {d:.0} ns |",
            gbs(m),
            gbs(c)
        );
    }
}
