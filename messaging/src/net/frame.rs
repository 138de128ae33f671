//! The inter-cluster message format: what an INI puts inside one sliding-window message.
//!
//! | offset | bytes | field |
//! |-------:|------:|-------|
//! | 0 | 1 | kind: 1 Express, 2 Tag-On, 3 Basic, 4 bulk fragment |
//! | 1 | 1 | flags (0) |
//! | 2 | 2 | destination queue at the receiving site |
//! | 4 | 2 | origin site |
//! | 6 | 2 | origin lane (the sending endpoint) |
//! | 8 | 4 | sequence number per (origin lane, destination site) |
//! | 12 | 8 | the Express word (handler, source id, payload; buffer bits rewritten on arrival) |
//! | 20 | 8 | Tag-On tag (0 for other kinds) |
//! | 28 | 4 | data length in bytes |
//! | 32 | n | data: the Tag-On buffer, the Basic payload or the bulk fragment |
//!
//! Little-endian. The sliding window authenticates and reassembles; this layer adds the
//! destination queue and the per-lane sequence number that restores the sender's order
//! when a scheduling policy spreads one lane's messages over several INIs.

/// Bytes before the data.
pub const HEADER: usize = 32;

/// What kind of message a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// One Express word, no data.
    Express = 1,
    /// A Tag-On message: word + tag + buffer data.
    TagOn = 2,
    /// A Basic message: word (handler, source) + up to 256 bytes.
    Basic = 3,
    /// One fragment of a bulk message (data = fragment header + payload).
    Bulk = 4,
}

/// A decoded frame borrowing its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Kind.
    pub kind: FrameKind,
    /// Destination queue.
    pub queue: u16,
    /// Origin site.
    pub origin: u16,
    /// Origin lane.
    pub lane: u16,
    /// Sequence number in the lane.
    pub seq: u32,
    /// Express word.
    pub word: u64,
    /// Tag-On tag.
    pub tag: u64,
    /// Data.
    pub data: &'a [u8],
}

/// A frame that cannot be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Shorter than the header.
    #[error("frame of {0} bytes is shorter than the {HEADER}-byte header")]
    Short(usize),
    /// Unknown kind byte.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// Length field disagrees with the frame size.
    #[error("frame says {said} data bytes but carries {has}")]
    Length {
        /// Length field.
        said: u32,
        /// Actual.
        has: usize,
    },
    /// An Express frame with data, or data over the limit for its kind.
    #[error("{kind:?} frame with {len} data bytes (limit {max})")]
    TooLong {
        /// Kind.
        kind: FrameKind,
        /// Length.
        len: usize,
        /// Limit.
        max: usize,
    },
}

impl Frame<'_> {
    /// Encodes into a new vector (the window keeps it for retransmission).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER + self.data.len());
        v.push(self.kind as u8);
        v.push(0);
        v.extend_from_slice(&self.queue.to_le_bytes());
        v.extend_from_slice(&self.origin.to_le_bytes());
        v.extend_from_slice(&self.lane.to_le_bytes());
        v.extend_from_slice(&self.seq.to_le_bytes());
        v.extend_from_slice(&self.word.to_le_bytes());
        v.extend_from_slice(&self.tag.to_le_bytes());
        v.extend_from_slice(&(self.data.len() as u32).to_le_bytes());
        v.extend_from_slice(self.data);
        v
    }

    /// Decodes `bytes`, checking every field against `max_data` (the slot size); never
    /// panics.
    ///
    /// # Errors
    /// [`FrameError`] describing the first inconsistency.
    pub fn decode(bytes: &[u8], max_data: usize) -> Result<Frame<'_>, FrameError> {
        if bytes.len() < HEADER {
            return Err(FrameError::Short(bytes.len()));
        }
        let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let kind = match bytes[0] {
            1 => FrameKind::Express,
            2 => FrameKind::TagOn,
            3 => FrameKind::Basic,
            4 => FrameKind::Bulk,
            k => return Err(FrameError::Kind(k)),
        };
        let data = &bytes[HEADER..];
        let said = u32_at(28);
        if said as usize != data.len() {
            return Err(FrameError::Length {
                said,
                has: data.len(),
            });
        }
        let max = match kind {
            FrameKind::Express => 0,
            FrameKind::Basic => crate::BASIC_MAX,
            FrameKind::TagOn | FrameKind::Bulk => max_data,
        };
        if data.len() > max {
            return Err(FrameError::TooLong {
                kind,
                len: data.len(),
                max,
            });
        }
        Ok(Frame {
            kind,
            queue: u16_at(2),
            origin: u16_at(4),
            lane: u16_at(6),
            seq: u32_at(8),
            word: u64_at(12),
            tag: u64_at(20),
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(kind in 1u8..=4, queue in any::<u16>(), origin in any::<u16>(), lane in any::<u16>(), seq in any::<u32>(), word in any::<u64>(), tag in any::<u64>(), len in 0usize..300) {
            let kind = match kind { 1 => FrameKind::Express, 2 => FrameKind::TagOn, 3 => FrameKind::Basic, _ => FrameKind::Bulk };
            let len = if kind == FrameKind::Express { 0 } else { len.min(crate::BASIC_MAX) };
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let f = Frame { kind, queue, origin, lane, seq, word, tag, data: &data };
            let bytes = f.encode();
            prop_assert_eq!(Frame::decode(&bytes, 4096), Ok(f));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            let _ = Frame::decode(&bytes, 4096);
        }
    }

    #[test]
    fn inconsistencies_are_reported() {
        let f = Frame {
            kind: FrameKind::Express,
            queue: 0,
            origin: 0,
            lane: 0,
            seq: 0,
            word: 0,
            tag: 0,
            data: &[],
        };
        let mut b = f.encode();
        assert_eq!(Frame::decode(&b[..10], 4096), Err(FrameError::Short(10)));
        b.push(1);
        assert!(matches!(
            Frame::decode(&b, 4096),
            Err(FrameError::Length { .. })
        ));
        b[28] = 1;
        assert!(matches!(
            Frame::decode(&b, 4096),
            Err(FrameError::TooLong { .. })
        ));
        b[0] = 9;
        assert_eq!(Frame::decode(&b, 4096), Err(FrameError::Kind(9)));
    }
}
