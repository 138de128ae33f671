//! Bulk messages: payloads larger than one buffer slot, fragmented over Tag-On slots and
//! reassembled at the receiving queue.
//!
//! Each fragment is a pool slot whose data starts with a 16-byte [`FragmentHeader`]
//! followed by up to `slot_size - 16` payload bytes, announced by a word of kind
//! [`WordKind::Bulk`](crate::WordKind). Fragments may arrive in any order (an INI policy can
//! spread them over several INIs), so reassembly places each at its offset and completes
//! when every byte has arrived; the receiver copies a fragment out and releases its slot at
//! once, so partial messages never pin the sender's pool.
//!
//! Memory is bounded: a message may be at most `max_bulk` bytes (1 MiB by default, checked
//! by the sender before it sends anything and again by the receiver), and a queue
//! reassembles at most `max_reassemblies` messages at once. A sender sends one bulk message
//! at a time, so the number in flight to a queue is at most the number of sending
//! threads; the limit only trips on a misbehaving peer, whose fragments are then rejected
//! and counted.

use std::collections::HashMap;

/// Bytes of fragment header at the start of each bulk slot.
pub const FRAGMENT_HEADER: usize = 16;

/// The header at the start of every bulk fragment (little-endian on the wire and in slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragmentHeader {
    /// Site that sent the message (with `sequence`, identifies the message).
    pub origin: u16,
    /// Per-origin message sequence number.
    pub sequence: u32,
    /// Total message length in bytes.
    pub total: u32,
    /// Offset of this fragment's payload in the message, bytes.
    pub offset: u32,
}

impl FragmentHeader {
    /// Encodes into the first [`FRAGMENT_HEADER`] bytes of `out`.
    ///
    /// # Panics
    /// If `out` is shorter than [`FRAGMENT_HEADER`].
    pub fn encode(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.origin.to_le_bytes());
        out[2..4].copy_from_slice(&0u16.to_le_bytes());
        out[4..8].copy_from_slice(&self.sequence.to_le_bytes());
        out[8..12].copy_from_slice(&self.total.to_le_bytes());
        out[12..16].copy_from_slice(&self.offset.to_le_bytes());
    }

    /// Decodes a header; `None` if `bytes` is too short or the reserved field is not zero.
    pub fn decode(bytes: &[u8]) -> Option<FragmentHeader> {
        let b = bytes.get(..FRAGMENT_HEADER)?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if b[2] != 0 || b[3] != 0 {
            return None;
        }
        Some(FragmentHeader {
            origin: u16::from_le_bytes([b[0], b[1]]),
            sequence: u32_at(4),
            total: u32_at(8),
            offset: u32_at(12),
        })
    }
}

/// Why a fragment was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FragmentReject {
    /// Inconsistent header (bad offsets, lengths disagreeing with earlier fragments).
    Malformed,
    /// Over `max_bulk` or `max_reassemblies`.
    Limit,
}

#[derive(Debug)]
struct Partial {
    data: Vec<u8>,
    received: usize,
}

/// Reassembly state of one receive queue.
#[derive(Debug, Default)]
pub(crate) struct Reassembly {
    partial: HashMap<(u16, u32), Partial>,
}

impl Reassembly {
    /// Adds one fragment (`bytes` = header + payload). Returns the whole message when this
    /// fragment completes it.
    pub(crate) fn add(
        &mut self,
        bytes: &[u8],
        max_bulk: usize,
        max_reassemblies: usize,
    ) -> Result<Option<Vec<u8>>, FragmentReject> {
        let h = FragmentHeader::decode(bytes).ok_or(FragmentReject::Malformed)?;
        let payload = &bytes[FRAGMENT_HEADER..];
        let total = h.total as usize;
        let offset = h.offset as usize;
        if total > max_bulk {
            return Err(FragmentReject::Limit);
        }
        if offset
            .checked_add(payload.len())
            .is_none_or(|end| end > total)
            || (payload.is_empty() && total != 0)
        {
            return Err(FragmentReject::Malformed);
        }
        let key = (h.origin, h.sequence);
        if !self.partial.contains_key(&key) {
            if payload.len() == total {
                return Ok(Some(payload.to_vec()));
            }
            if self.partial.len() >= max_reassemblies {
                return Err(FragmentReject::Limit);
            }
            self.partial.insert(
                key,
                Partial {
                    data: vec![0; total],
                    received: 0,
                },
            );
        }
        let p = self.partial.get_mut(&key).expect("inserted above");
        if p.data.len() != total {
            self.partial.remove(&key);
            return Err(FragmentReject::Malformed);
        }
        p.data[offset..offset + payload.len()].copy_from_slice(payload);
        p.received += payload.len();
        if p.received >= total {
            let done = self.partial.remove(&key).expect("present");
            return Ok(Some(done.data));
        }
        Ok(None)
    }

    /// Messages partly received.
    #[cfg(test)]
    pub(crate) fn in_progress(&self) -> usize {
        self.partial.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frag(origin: u16, seq: u32, total: u32, offset: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0; FRAGMENT_HEADER];
        FragmentHeader {
            origin,
            sequence: seq,
            total,
            offset,
        }
        .encode(&mut v);
        v.extend_from_slice(payload);
        v
    }

    proptest! {
        #[test]
        fn any_fragment_order_reassembles(len in 0usize..20_000, chunk in 1usize..5000, seed in any::<u64>()) {
            let msg: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
            let mut frags: Vec<Vec<u8>> = if len == 0 {
                vec![frag(1, 9, 0, 0, &[])]
            } else {
                msg.chunks(chunk).enumerate().map(|(i, c)| frag(1, 9, len as u32, (i * chunk) as u32, c)).collect()
            };
            // Deterministic shuffle from the seed.
            let mut s = seed;
            for i in (1..frags.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                frags.swap(i, (s >> 33) as usize % (i + 1));
            }
            let mut r = Reassembly::default();
            let mut out = None;
            for (i, f) in frags.iter().enumerate() {
                let got = r.add(f, 1 << 20, 4).unwrap();
                if i + 1 < frags.len() { prop_assert!(got.is_none()); } else { out = got; }
            }
            prop_assert_eq!(out.unwrap(), msg);
            prop_assert_eq!(r.in_progress(), 0);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut r = Reassembly::default();
            let _ = r.add(&bytes, 1 << 20, 2);
        }
    }

    #[test]
    fn limits_and_malformed_fragments() {
        let mut r = Reassembly::default();
        assert_eq!(
            r.add(&frag(1, 1, 100, 90, &[0; 20]), 1 << 20, 4),
            Err(FragmentReject::Malformed)
        );
        assert_eq!(
            r.add(&frag(1, 1, 2 << 20, 0, &[0; 20]), 1 << 20, 4),
            Err(FragmentReject::Limit)
        );
        assert_eq!(r.add(&frag(1, 1, 100, 0, &[0; 10]), 1 << 20, 1), Ok(None));
        assert_eq!(
            r.add(&frag(1, 2, 100, 0, &[0; 10]), 1 << 20, 1),
            Err(FragmentReject::Limit),
            "second reassembly over the limit"
        );
        assert_eq!(
            r.add(&frag(1, 1, 50, 10, &[0; 10]), 1 << 20, 1),
            Err(FragmentReject::Malformed),
            "total disagrees"
        );
        assert_eq!(
            r.add(&frag(1, 3, 5, 0, &[]), 1 << 20, 1),
            Err(FragmentReject::Malformed),
            "empty fragment of a non-empty message"
        );
    }
}
