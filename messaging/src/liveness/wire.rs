//! The liveness datagram: a probe or its answer, authenticated like an INI datagram.
//!
//! | offset | bytes | field |
//! |-------:|------:|-------|
//! | 0 | 2 | magic `0x4C56` ("LV") |
//! | 2 | 1 | version (1) |
//! | 3 | 1 | kind: 1 probe, 2 answer |
//! | 4 | 2 | sending cluster |
//! | 6 | 2 | receiving cluster |
//! | 8 | 8 | the run's epoch |
//! | 16 | 8 | probe number (an answer echoes the probe's) |
//! | 24 | 16 | keyed BLAKE3 MAC under the job's secret over bytes 0..24 |
//!
//! Little-endian. The key and epoch are those of the INIs' sliding window
//! ([`crate::window::wire`]): agreed by the control plane at registration, fresh for
//! every run, so a datagram of another job or an earlier run fails the epoch or MAC check.

use crate::window::wire::{MAC_LEN, MacKey};

/// Bytes of a liveness datagram.
pub const LEN: usize = BODY + MAC_LEN;
/// Bytes covered by the MAC.
const BODY: usize = 24;
const MAGIC: u16 = 0x4C56;
const VERSION: u8 = 1;

/// Whether a datagram asks or answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// "Are you alive?" — sent by every cluster to every other one each period.
    Probe = 1,
    /// "Yes": the receiver of a probe echoes its number.
    Answer = 2,
}

/// A decoded, authenticated liveness datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Datagram {
    /// Probe or answer.
    pub kind: Kind,
    /// Sending cluster.
    pub from: u16,
    /// Receiving cluster.
    pub to: u16,
    /// The probe's number.
    pub seq: u64,
}

/// Why a datagram was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Wrong length, magic, version or kind, or addressed to another cluster.
    #[error("malformed or misdirected liveness datagram")]
    Malformed,
    /// Another run's epoch (a replay from an earlier run).
    #[error("liveness datagram of another run (epoch {0:#x})")]
    WrongEpoch(u64),
    /// The MAC does not verify (forged or corrupted).
    #[error("liveness datagram with a bad MAC")]
    BadMac,
}

impl Datagram {
    /// Encodes and authenticates under `key` and `epoch`.
    pub fn encode(&self, key: &MacKey, epoch: u64) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2] = VERSION;
        b[3] = self.kind as u8;
        b[4..6].copy_from_slice(&self.from.to_le_bytes());
        b[6..8].copy_from_slice(&self.to.to_le_bytes());
        b[8..16].copy_from_slice(&epoch.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        let mac = key.mac(&b[..BODY]);
        b[BODY..].copy_from_slice(&mac);
        b
    }

    /// Decodes `bytes` sent to cluster `me`, checking in order the format, the epoch and
    /// the MAC (as the window checks its datagrams); never panics.
    ///
    /// # Errors
    /// [`Refused`] naming the first check that failed.
    pub fn decode(bytes: &[u8], key: &MacKey, epoch: u64, me: u16) -> Result<Datagram, Refused> {
        let b: &[u8; LEN] = bytes.try_into().map_err(|_| Refused::Malformed)?;
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let kind = match b[3] {
            1 => Kind::Probe,
            2 => Kind::Answer,
            _ => return Err(Refused::Malformed),
        };
        if u16_at(0) != MAGIC || b[2] != VERSION || u16_at(6) != me {
            return Err(Refused::Malformed);
        }
        let theirs = u64_at(8);
        if theirs != epoch {
            return Err(Refused::WrongEpoch(theirs));
        }
        if !key.verify(&b[..BODY], &b[BODY..]) {
            return Err(Refused::BadMac);
        }
        Ok(Datagram {
            kind,
            from: u16_at(4),
            to: me,
            seq: u64_at(16),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEY: MacKey = MacKey::new([3; 32]);

    #[test]
    fn round_trip_and_every_refusal() {
        let d = Datagram {
            kind: Kind::Answer,
            from: 1,
            to: 2,
            seq: 77,
        };
        let b = d.encode(&KEY, 9);
        assert_eq!(Datagram::decode(&b, &KEY, 9, 2), Ok(d));
        assert_eq!(Datagram::decode(&b, &KEY, 9, 3), Err(Refused::Malformed));
        assert_eq!(
            Datagram::decode(&b[1..], &KEY, 9, 2),
            Err(Refused::Malformed)
        );
        assert_eq!(
            Datagram::decode(&b, &KEY, 10, 2),
            Err(Refused::WrongEpoch(9))
        );
        assert_eq!(
            Datagram::decode(&b, &MacKey::new([4; 32]), 9, 2),
            Err(Refused::BadMac)
        );
        let mut forged = b;
        forged[16] ^= 1;
        assert_eq!(Datagram::decode(&forged, &KEY, 9, 2), Err(Refused::BadMac));
    }

    proptest! {
        #[test]
        fn garbage_is_refused(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            prop_assert!(Datagram::decode(&bytes, &KEY, 9, 2).is_err());
        }
    }
}
