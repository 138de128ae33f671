//! Copies of page-sized byte runs (diff runs, twins, page contents) that stay off the
//! slow path of `memcpy` when the destination lies just after the source modulo 4 KiB.
//!
//! glibc copies 2,112 bytes or more with `rep movsb` on CPUs that report fast short
//! `rep movsb` (FSRM). On AMD Zen 3 (EPYC, family 25, model 1; glibc 2.36, measured on
//! the development VM, 2026-12-02) that instruction is 25–35 × slower when the
//! destination address minus the source address, modulo 4,096, lies in 1..=31 (and
//! about 6 × slower in 32..=63 in some runs): a 4 KiB copy took 2.2–3.1 µs instead of
//! 75–105 ns, an 8 KiB copy 3.5–5.1 µs. Copies of 2,048 bytes or less take the vector
//! path and are fast at every distance (23–40 ns). Where a diff's payload, a receive
//! buffer or a twin sits relative to its page is decided by the allocator and the
//! message layout, so any page-sized copy can land there: [`copy_bytes`] splits such a
//! copy into pieces of at most [`PIECE`] bytes, which costs ≈ 50 ns on a 4 KiB copy and
//! nothing at other distances.

/// Largest piece [`copy_bytes`] hands to `memcpy` when the distance falls in the slow
/// window: below glibc's `rep movsb` threshold for FSRM CPUs (2,112 bytes).
pub const PIECE: usize = 2048;

/// Distances (destination minus source, modulo 4,096 bytes) that [`copy_bytes`] copies
/// in pieces: `1..SLOW_WINDOW`.
pub const SLOW_WINDOW: usize = 64;

/// Whether a `len`-byte copy from address `src` to address `dst` takes the slow path:
/// longer than [`PIECE`], `dst` lying `1..SLOW_WINDOW` bytes after `src` modulo 4,096.
#[inline]
fn slow(dst: usize, src: usize, len: usize) -> bool {
    len > PIECE && (1..SLOW_WINDOW).contains(&(dst.wrapping_sub(src) % 4096))
}

/// Copies `src` into `dst`, in pieces of at most [`PIECE`] bytes when the copy is longer
/// than that and `dst` lies `1..SLOW_WINDOW` bytes after `src` modulo 4,096 (see the
/// module documentation); one `memcpy` otherwise.
///
/// # Panics
/// If the lengths differ (as [`slice::copy_from_slice`]).
#[inline]
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_bytes: lengths differ");
    if !slow(dst.as_ptr() as usize, src.as_ptr() as usize, src.len()) {
        dst.copy_from_slice(src);
        return;
    }
    for (d, s) in dst.chunks_mut(PIECE).zip(src.chunks(PIECE)) {
        d.copy_from_slice(s);
    }
}

/// Appends `src` to `out` as [`Vec::extend_from_slice`] does, through [`copy_bytes`]
/// when the bytes would land in the slow window (the new bytes are zeroed first then:
/// ≈ 40 ns for 4 KiB, paid only there).
#[inline]
pub fn extend_bytes(out: &mut Vec<u8>, src: &[u8]) {
    out.reserve(src.len());
    let at = out.len();
    if !slow(
        (out.as_ptr() as usize).wrapping_add(at),
        src.as_ptr() as usize,
        src.len(),
    ) {
        out.extend_from_slice(src);
        return;
    }
    out.resize(at + src.len(), 0);
    copy_bytes(&mut out[at..], src);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the piece size and every distance of the slow window and
    /// beyond: the copy equals the source, and nothing outside the destination changes.
    #[test]
    fn copies_exactly_at_every_distance() {
        let src_buf: Vec<u8> = (0..3 * 4096).map(|i| (i * 7 + 3) as u8).collect();
        let mut dst_buf = vec![0u8; 6 * 4096];
        let src_base = (4096 - src_buf.as_ptr() as usize % 4096) % 4096;
        let dst_base = (4096 - dst_buf.as_ptr() as usize % 4096) % 4096;
        for len in [
            0,
            1,
            PIECE - 1,
            PIECE,
            PIECE + 1,
            4096 - 8,
            4096,
            4100,
            8192,
        ] {
            for k in [0, 1, 4, 16, 31, 32, 63, 64, 65, 2048, 4095] {
                dst_buf.fill(0xAA);
                let s = &src_buf[src_base..src_base + len];
                let d0 = dst_base + k;
                copy_bytes(&mut dst_buf[d0..d0 + len], s);
                assert_eq!(&dst_buf[d0..d0 + len], s, "len {len}, distance {k}");
                assert!(dst_buf[..d0].iter().all(|&b| b == 0xAA), "len {len}, {k}");
                assert!(
                    dst_buf[d0 + len..].iter().all(|&b| b == 0xAA),
                    "len {len}, {k}"
                );
            }
        }
    }

    /// Appending at every position of the slow window and beyond gives the bytes
    /// `extend_from_slice` would.
    #[test]
    fn extends_exactly_at_every_distance() {
        let src_buf: Vec<u8> = (0..3 * 4096).map(|i| (i * 5 + 1) as u8).collect();
        for prefix in [0usize, 1, 4, 100] {
            for k in [0usize, 1, 4, 16, 31, 32, 63, 64, 2048] {
                for len in [8, PIECE, PIECE + 8, 4096] {
                    let mut out = Vec::with_capacity(3 * 4096);
                    out.extend_from_slice(&vec![9u8; prefix]);
                    // The source starts `k` bytes before the append point, modulo 4 KiB.
                    let at = out.as_ptr() as usize + prefix;
                    let first = at.wrapping_sub(k).wrapping_sub(src_buf.as_ptr() as usize) % 4096;
                    let src = &src_buf[first..first + len];
                    let mut expect = out.clone();
                    expect.extend_from_slice(src);
                    extend_bytes(&mut out, src);
                    assert_eq!(out, expect, "prefix {prefix}, distance {k}, len {len}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn unequal_lengths_panic() {
        copy_bytes(&mut [0u8; 3], &[1u8; 4]);
    }
}
