//! Bundles longer than one message: sent in pieces, put back together in order.
//!
//! A bundle (the wire module's [Bundles](crate::wire#bundles)) travels as one
//! message-layer bulk message, which the layer bounds (`Endpoint::max_bulk`: 16 bytes
//! per page of the region plus 64 KiB, within 1–8 MiB). Lock and barrier messages carry
//! the interval records their receiver lacks (one per interval a cluster closed, at
//! least 14 bytes each), up to all of those since the last barrier: a cluster that
//! closes more than ≈ 75,000 intervals between two barriers in a job with a 1 MiB region
//! (≈ 300,000 with the default 1 GiB one) makes a `BarrierArrive` longer than one
//! message. Such a bundle goes as consecutive numbered bundles, each one piece:
//!
//! ```text
//! [seq u32 LE][PIECE u8 = 0x00][total u32 LE][offset u32 LE][bytes]
//! ```
//!
//! The pieces' bytes, in order, are the bundle's parts (its body after the sequence
//! number), `total` bytes in all, at most [`MAX_MESSAGE_BYTES`]. `0x00` is not a bulk
//! coherence opcode, so a piece is never read as a bundle of parts, nor a bundle as a
//! piece. The receiver handles each sender's bundles in the order they were numbered
//! (`runtime::reseq`), so the pieces of one bundle reach it one after the other, with
//! nothing between them; it appends each to that sender's [`Assembly`] and handles the
//! parts once all `total` bytes are there. A piece out of place (a gap, a second
//! total, a bundle between two pieces) fails the job as a malformed bundle, like any
//! other bundle that cannot be right.
//!
//! Source: this project (the fifty-eighth session of issue 10 found the limit: 200,000
//! lock hand-offs between two barriers made a 1.4 MB `BarrierArrive`); the INIs'
//! fragments (`multigrain-window`) and IP fragmentation work the same way.

use crate::wire::BUNDLE_HEADER;

/// The first byte after a piece's sequence number (where a bundle has its first
/// part's handler, a bulk coherence opcode, never `0x00`).
pub(crate) const PIECE: u8 = 0x00;

/// Bytes of a piece's header after its sequence number: the marker, the total length
/// and the offset of its bytes (u32 LE each).
pub(crate) const PIECE_HEADER: usize = 1 + 4 + 4;

/// Largest bundle body (after the sequence number) that is sent in pieces: 1 GiB,
/// ≈ 76 million interval records of one page. A longer one fails its sender's job with
/// an error naming the message; the receiver refuses a piece that announces more.
pub(crate) const MAX_MESSAGE_BYTES: usize = 1 << 30;

/// Cuts `parts` (a bundle's body after its sequence number) into pieces of at most `max`
/// bytes each (`max` > [`BUNDLE_HEADER`] + [`PIECE_HEADER`]), numbered from `*next_seq`
/// on (advanced past each piece built), and hands each piece's body to `send`, in
/// order, built in one buffer reused for all: a long message is not copied whole
/// first. Stops at the first error of `send`.
///
/// # Errors
/// The first error `send` returns.
///
/// # Panics
/// If `parts` is longer than [`MAX_MESSAGE_BYTES`] or `max` leaves no room for bytes
/// after the headers (the caller checks both).
pub(crate) fn send_split<E>(
    parts: &[u8],
    max: usize,
    next_seq: &mut u32,
    mut send: impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), E> {
    assert!(parts.len() <= MAX_MESSAGE_BYTES, "checked by the caller");
    let room = max
        .checked_sub(BUNDLE_HEADER + PIECE_HEADER)
        .filter(|&r| r > 0)
        .expect("a bulk limit longer than a piece's headers");
    let total = parts.len() as u32;
    let mut piece = Vec::with_capacity(max.min(BUNDLE_HEADER + PIECE_HEADER + parts.len()));
    for (i, bytes) in parts.chunks(room).enumerate() {
        piece.clear();
        piece.extend_from_slice(&next_seq.to_le_bytes());
        *next_seq = next_seq.wrapping_add(1);
        piece.push(PIECE);
        piece.extend_from_slice(&total.to_le_bytes());
        // `i * room` < `total`, which fits a u32.
        piece.extend_from_slice(&((i * room) as u32).to_le_bytes());
        piece.extend_from_slice(bytes);
        send(&piece)?;
    }
    Ok(())
}

/// Whether a received bundle body (sequence number first) is a piece.
pub(crate) fn is_piece(data: &[u8]) -> bool {
    data.get(BUNDLE_HEADER) == Some(&PIECE)
}

/// One sender's bundle being put back together from its pieces (empty between two).
#[derive(Debug, Default)]
pub(crate) struct Assembly {
    /// The bundle's total length after its sequence number; 0: no piece pending.
    total: usize,
    /// A zero sequence number, then the bytes received so far.
    bytes: Vec<u8>,
}

impl Assembly {
    /// Takes the sender's next bundle body, in the sender's order: a whole bundle to
    /// handle now (the one given, or the bundle its last piece completes, with a zero
    /// sequence number, as `wire::decode_bundle` reads it), or `None` for a piece kept
    /// until the rest arrives.
    ///
    /// # Errors
    /// A reason, for a bundle between two pieces, a piece that is truncated, empty,
    /// announces no bytes or more than [`MAX_MESSAGE_BYTES`], starts elsewhere than
    /// where the bytes so far end, announces another total than the pieces before it,
    /// or runs past its total.
    pub(crate) fn take(&mut self, data: Vec<u8>) -> Result<Option<Vec<u8>>, String> {
        if !is_piece(&data) {
            if self.total > 0 {
                return Err(format!(
                    "a bundle between the pieces of another ({} of {} bytes received)",
                    self.received(),
                    self.total
                ));
            }
            return Ok(Some(data));
        }
        let Some(([_, t0, t1, t2, t3, o0, o1, o2, o3], bytes)) = data
            .get(BUNDLE_HEADER..)
            .and_then(|d| d.split_first_chunk::<PIECE_HEADER>())
        else {
            return Err(format!(
                "a piece of {} bytes, shorter than its header",
                data.len()
            ));
        };
        let total = u32::from_le_bytes([*t0, *t1, *t2, *t3]) as usize;
        let offset = u32::from_le_bytes([*o0, *o1, *o2, *o3]) as usize;
        if total == 0 || total > MAX_MESSAGE_BYTES {
            return Err(format!(
                "a piece of a bundle of {total} bytes (1 to {MAX_MESSAGE_BYTES} allowed)"
            ));
        }
        if self.total != 0 && total != self.total {
            return Err(format!(
                "a piece of a bundle of {total} bytes among those of one of {}",
                self.total
            ));
        }
        if bytes.is_empty() || offset != self.received() || offset + bytes.len() > total {
            return Err(format!(
                "a piece of {} bytes at byte {offset} of {total}, after {} bytes received",
                bytes.len(),
                self.received()
            ));
        }
        if self.total == 0 {
            self.total = total;
            self.bytes.extend_from_slice(&[0; BUNDLE_HEADER]);
        }
        self.bytes.extend_from_slice(bytes);
        if self.received() < total {
            return Ok(None);
        }
        self.total = 0;
        Ok(Some(std::mem::take(&mut self.bytes)))
    }

    /// Bytes of the pending bundle received so far.
    fn received(&self) -> usize {
        self.bytes.len().saturating_sub(BUNDLE_HEADER)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A bundle body: a sequence number, then `parts`.
    fn bundle(seq: u32, parts: &[u8]) -> Vec<u8> {
        let mut b = seq.to_le_bytes().to_vec();
        b.extend_from_slice(parts);
        b
    }

    /// A piece body by hand.
    fn piece(seq: u32, total: u32, offset: u32, bytes: &[u8]) -> Vec<u8> {
        let mut p = seq.to_le_bytes().to_vec();
        p.push(PIECE);
        p.extend_from_slice(&total.to_le_bytes());
        p.extend_from_slice(&offset.to_le_bytes());
        p.extend_from_slice(bytes);
        p
    }

    proptest! {
        /// Split at any limit and put back together, the pieces give the bundle's parts
        /// (under a zero sequence number), numbered on from the sender's next number,
        /// each within the limit.
        #[test]
        fn pieces_put_back_together_give_the_bundle(
            parts in proptest::collection::vec(1u8..=255, 1..3000),
            max in (BUNDLE_HEADER + PIECE_HEADER + 1)..700,
            first in any::<u32>(),
        ) {
            let mut next = first;
            let mut pieces = Vec::new();
            send_split(&parts, max, &mut next, |p| {
                pieces.push(p.to_vec());
                Ok::<(), ()>(())
            })
            .unwrap();
            prop_assert_eq!(next, first.wrapping_add(pieces.len() as u32));
            let mut a = Assembly::default();
            for (i, p) in pieces.into_iter().enumerate() {
                prop_assert!(p.len() <= max);
                prop_assert!(is_piece(&p));
                prop_assert_eq!(crate::wire::bundle_seq(&p), Some(first.wrapping_add(i as u32)));
                let last = a.received() + p.len() - BUNDLE_HEADER - PIECE_HEADER == parts.len();
                match a.take(p).unwrap() {
                    Some(whole) => {
                        prop_assert!(last);
                        prop_assert_eq!(&whole, &bundle(0, &parts));
                    }
                    None => prop_assert!(!last),
                }
            }
            // The next bundle passes as it is.
            let b = bundle(7, &[0x30, 1, 2]);
            prop_assert_eq!(a.take(b.clone()).unwrap(), Some(b));
        }
    }

    #[test]
    fn a_bundle_is_not_a_piece_and_passes_unchanged() {
        let mut a = Assembly::default();
        let b = bundle(3, &[0x38, 5, 0, 0, 0, 1, 2, 3, 4, 5]);
        assert!(!is_piece(&b));
        assert_eq!(a.take(b.clone()), Ok(Some(b)));
        // Shorter than a sequence number: not a piece (the bundle decoder refuses it).
        assert!(!is_piece(&[0, 0, 0]));
    }

    /// Every piece that cannot be right is refused with a reason, never kept or
    /// handled as a bundle.
    #[test]
    fn pieces_out_of_place_are_refused() {
        let started = || {
            let mut a = Assembly::default();
            assert_eq!(a.take(piece(0, 10, 0, &[1, 2, 3, 4])), Ok(None));
            a
        };
        let cases: [(Assembly, Vec<u8>, &str); 9] = [
            (started(), bundle(1, &[0x38, 1]), "between the pieces"),
            (started(), piece(1, 10, 5, &[5]), "at byte 5 of 10, after 4"),
            (started(), piece(1, 10, 0, &[5]), "at byte 0"),
            (started(), piece(1, 11, 4, &[5]), "among those of one of 10"),
            (
                started(),
                piece(1, 10, 4, &[0; 7]),
                "7 bytes at byte 4 of 10",
            ),
            (started(), piece(1, 10, 4, &[]), "0 bytes"),
            (
                Assembly::default(),
                piece(0, 0, 0, &[1]),
                "bundle of 0 bytes",
            ),
            (
                Assembly::default(),
                piece(0, MAX_MESSAGE_BYTES as u32 + 1, 0, &[1]),
                "1 to 1073741824 allowed",
            ),
            (
                Assembly::default(),
                piece(0, 4, 0, &[]).into_iter().take(8).collect(),
                "shorter than its header",
            ),
        ];
        for (mut a, data, needle) in cases {
            let e = a.take(data).expect_err(needle);
            assert!(e.contains(needle), "{needle:?} not in {e:?}");
        }
        // A first piece that starts elsewhere than at byte 0.
        let e = Assembly::default().take(piece(0, 10, 4, &[1])).unwrap_err();
        assert!(e.contains("at byte 4 of 10, after 0"), "{e}");
    }
}
