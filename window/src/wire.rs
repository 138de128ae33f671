//! Datagram wire format of the INI sliding-window protocol.
//!
//! The thesis header (§3.2.1, §4.3) has four one-byte fields: opcode, connection id,
//! SEND sequence number, ACK sequence number; UDP supplies the checksum and IP the
//! fragmentation (§3.1). Here one datagram carries all of it, so the protocol runs over
//! plain UDP: 32-bit sequence numbers (§4.3 notes 22 bits are needed to avoid aliasing
//! within an IP packet lifetime), an explicit connection id of both INIs, the run's
//! epoch, fragment fields, the sender's datagram counter, and an AEAD tag that
//! authenticates all of it and the encrypted payload. One
//! addition to the thesis: a standalone ACK carries a selective-ACK bitmap of the frames
//! the receiver holds beyond the cumulative ACK, so a SEND timeout behind a lost frame
//! resends only what is really missing (the thesis assumes a low loss rate and needs none).
//!
//! **Authentication and encryption (issues 13 and 10).** Every datagram is sealed with
//! AES-256-GCM ([`DatagramKey`]): the payload is encrypted, the header and the payload are
//! authenticated, and the 16-byte tag ([`TAG_LEN`]) is the trailer. Nobody without the
//! job's secret can make a datagram the receiver accepts (a forger's chance is 2^-128 per
//! datagram, and the receiver never answers a rejected one, so guesses cannot be checked
//! faster than they are sent) or read what one carries.
//!
//! - *Key.* Each run seals under its own AES-256 key, `BLAKE3-derive_key(context, secret ‖
//!   epoch)`: the job's 32-byte secret ([`MacKey`]) and the run's random epoch (agreed at
//!   registration). The epoch is also in every header, compared before any decryption, so
//!   a datagram of an earlier run of the same job is counted as such and costs nothing;
//!   rewritten to this run's epoch it fails the tag (another key, and the epoch is
//!   authenticated).
//! - *Nonce.* GCM needs a nonce that never repeats under a key. The 96-bit nonce is the
//!   sending INI's site (2 bytes) and index (1), a zero byte, and the sender's *datagram
//!   counter* (8), which the header carries (offset 32) and the tag authenticates. Every
//!   datagram an INI seals — DATA, BATCH, ACK, NAK, every retransmission — takes the next
//!   value of its counter, which starts at a random value when the INI starts; one sender
//!   per INI address per run (one [`crate::Ini`] per INI) makes the nonces unique.
//! - *Why not a MAC over the plain datagram, as wire version 2 did* (BLAKE3 keyed mode,
//!   truncated to 16 bytes): BLAKE3 is slow on datagram-sized inputs, whose few 1 KiB
//!   chunks leave its SIMD lanes idle; AES-GCM runs on the CPU's AES and carry-less
//!   multiply instructions. `cargo bench -p multigrain-window --bench mac` (sender +
//!   receiver, forty-fifth session, the Zen 5 VM): 1472 B 3.58 µs (v2) → 0.46 µs (v3),
//!   4184 B 3.15 → 0.96 µs, 8972 B 5.18 → 1.88 µs; an 80-byte Express datagram 0.15 →
//!   0.23 µs (v3's figure includes writing and copying the datagram). GCM over
//!   associated data only (a MAC without encryption) was no faster than BLAKE3 at 4 KiB and
//!   more in the `ring` and RustCrypto implementations (their GHASH takes associated data
//!   a block at a time), so the payload is encrypted: confidentiality comes with it.
//!
//! The control channel and the liveness probes keep [`MacKey`]'s BLAKE3 MACs (their
//! messages are few and small).
//!
//! All integers are big-endian (network order). Offsets and sizes are in bytes.
//!
//! | offset | size | field | notes |
//! |---:|---:|---|---|
//! | 0 | 2 | magic | `0x4D47` ("MG") |
//! | 2 | 1 | version | [`VERSION`] (2) |
//! | 3 | 1 | kind | 1 DATA, 2 ACK, 3 NAK, 4 BATCH |
//! | 4 | 8 | epoch | the run's random id; datagrams of another run are rejected |
//! | 12 | 2 | source site | connection id: sender INI |
//! | 14 | 2 | destination site | connection id: receiver INI |
//! | 16 | 1 | source INI | |
//! | 17 | 1 | destination INI | |
//! | 18 | 2 | payload length | must equal datagram length − 56 |
//! | 20 | 4 | sequence number | DATA: the frame's; BATCH: its first frame's; NAK: the frame asked for; ACK: 0 |
//! | 24 | 4 | cumulative ACK | next sequence number the sender of this datagram expects |
//! | 28 | 2 | fragment index | DATA: 0..count; ACK/NAK/BATCH: 0 |
//! | 30 | 2 | fragment count | DATA: ≥ 1; BATCH: the frames it carries, ≥ 2; ACK/NAK: 0 |
//! | 32 | 8 | datagram counter | the sending INI's, one per datagram it seals; in the nonce |
//! | 40 | n | payload | encrypted; DATA: message bytes; BATCH: its frames (below); ACK: selective-ACK bitmap (below); NAK: none |
//! | 40+n | 16 | tag | AES-256-GCM tag over bytes 0..40 (associated data) and the payload |
//!
//! A BATCH datagram carries `count` DATA frames with consecutive sequence numbers, the
//! first one's in the header, each as a [`BATCH_ENTRY_HEADER`]-byte entry header —
//! fragment index (2), fragment count (2), length `m` (2) — and its `m` bytes; the
//! entries fill the payload exactly. The sender packs new frames that fit together into
//! one datagram ([`crate::WindowConfig::coalesce`]): on loopback and on a LAN most of a
//! small datagram's cost is per datagram (a system call, the kernel's per-packet work
//! and the tag's fixed cost at each end), so two 4 KiB pages in one 8972-byte
//! datagram cost little more than one. Each frame is still acknowledged, buffered and
//! retransmitted on its own (a retransmission is a plain DATA datagram), so the sliding
//! window works on frames exactly as without batching: a BATCH is the same as its
//! frames arriving back to back, in order, with the same fate on the network.
//!
//! Selective-ACK bitmap of an ACK: bit `i` (least significant first) of byte `j` set means
//! the frame with sequence number `ack + 1 + 8j + i` was received. Any length, 0 included.
//!
//! [`decode`] checks, in order: length ≥ [`OVERHEAD`], magic, version (these three:
//! malformed), epoch ([`DecodeError::WrongEpoch`]), tag ([`DecodeError::BadMac`]), kind,
//! payload length, fragment fields. The epoch is compared before anything is decrypted,
//! so that a replay of another run is counted as such and costs nothing. It never
//! panics, whatever the input.

use super::IniAddr;
use thiserror::Error;

/// Magic number at offset 0: "MG".
pub const MAGIC: u16 = 0x4D47;
/// Protocol version at offset 2 (1 had a job key and a CRC32C trailer; 2 a BLAKE3 MAC
/// over the plain datagram).
pub const VERSION: u8 = 3;
/// Header length in bytes.
pub const HEADER_LEN: usize = 40;
/// Length in bytes of a [`MacKey`] MAC: BLAKE3's 32-byte keyed hash truncated to 16 (the
/// control channel's and the liveness probes' authentication; see the module docs).
pub const MAC_LEN: usize = 16;
/// Length in bytes of a datagram's authentication tag (AES-256-GCM's).
pub const TAG_LEN: usize = 16;
/// Trailer (tag) length in bytes.
pub const TRAILER_LEN: usize = TAG_LEN;
/// Per-datagram overhead in bytes: header plus trailer.
pub const OVERHEAD: usize = HEADER_LEN + TRAILER_LEN;
/// Offset in bytes of the header's payload length field (2 bytes, big-endian; the
/// layout table above), which [`stated_len`] reads before authentication.
pub const PAYLOAD_LEN_AT: usize = 18;
/// Bytes before each frame's data inside a BATCH datagram: fragment index, fragment
/// count and data length, 2 bytes each (see the module doc).
pub const BATCH_ENTRY_HEADER: usize = 6;
/// Smallest supported MTU in bytes (72 payload bytes per frame, so 65 535 fragments still
/// carry more than 1 MiB).
pub const MIN_MTU: usize = 128;
/// Largest supported MTU in bytes: the largest UDP payload over IPv4.
pub const MAX_MTU: usize = 65_507;

/// Frame kind: the thesis opcode (§3.2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// A fragment of a message, with a piggy-backed cumulative ACK.
    Data = 1,
    /// A standalone cumulative ACK, sent when the ACK timer expires with no reverse DATA;
    /// its payload is a selective-ACK bitmap (see the module doc).
    Ack = 2,
    /// A request to retransmit the frame named by the sequence number field.
    Nak = 3,
    /// Two or more consecutive DATA frames in one datagram (see the module doc), with a
    /// piggy-backed cumulative ACK.
    Batch = 4,
}

impl FrameKind {
    fn from_u8(b: u8) -> Option<FrameKind> {
        match b {
            1 => Some(FrameKind::Data),
            2 => Some(FrameKind::Ack),
            3 => Some(FrameKind::Nak),
            4 => Some(FrameKind::Batch),
            _ => None,
        }
    }
}

/// Connection id: the sending and the receiving INI (thesis §3.2.1 "connection id").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId {
    /// The INI that sent the datagram.
    pub src: IniAddr,
    /// The INI the datagram is for.
    pub dst: IniAddr,
}

/// The job's 32-byte secret: the control channel's and the liveness probes' MACs use it
/// directly (BLAKE3 keyed mode), and each run's datagram key is derived from it
/// ([`DatagramKey::new`]). `Debug` prints no key bytes. [`MacKey::default`] is all zeros:
/// for tests and simulations only — a job uses the fresh random secret its launcher or
/// coordinator hands out.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct MacKey([u8; 32]);

impl MacKey {
    /// The key with these bytes.
    pub const fn new(bytes: [u8; 32]) -> MacKey {
        MacKey(bytes)
    }

    /// The key bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The [`MAC_LEN`]-byte MAC of `bytes`: the same value as
    /// [`mac_parts`](Self::mac_parts) of `[bytes]`, through BLAKE3's one-shot keyed hash,
    /// which skips the incremental hasher's set-up and finalization: 66 against 98 ns for
    /// 64 bytes (one BLAKE3 block; measured on the Zen 5 VM, forty-fourth session).
    pub fn mac(&self, bytes: &[u8]) -> [u8; MAC_LEN] {
        truncate(blake3::keyed_hash(&self.0, bytes))
    }

    /// The [`MAC_LEN`]-byte MAC of the concatenation of `parts` (BLAKE3 in keyed mode,
    /// truncated), without concatenating them.
    pub fn mac_parts(&self, parts: &[&[u8]]) -> [u8; MAC_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        for p in parts {
            h.update(p);
        }
        truncate(h.finalize())
    }

    /// Whether `tag` is the MAC of `bytes`, compared in constant time.
    pub fn verify(&self, bytes: &[u8], tag: &[u8]) -> bool {
        tags_equal(&self.mac(bytes), tag)
    }

    /// Whether `tag` is the MAC of the concatenation of `parts`, compared in constant
    /// time.
    pub fn verify_parts(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        tags_equal(&self.mac_parts(parts), tag)
    }
}

/// The first [`MAC_LEN`] bytes of a BLAKE3 output.
fn truncate(hash: blake3::Hash) -> [u8; MAC_LEN] {
    let mut out = [0u8; MAC_LEN];
    out.copy_from_slice(&hash.as_bytes()[..MAC_LEN]);
    out
}

/// Whether `tag` equals `want`, compared in constant time (every byte is read whatever
/// the first difference).
fn tags_equal(want: &[u8; MAC_LEN], tag: &[u8]) -> bool {
    tag.len() == MAC_LEN && want.iter().zip(tag).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

impl std::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MacKey(<secret>)")
    }
}

/// BLAKE3 key-derivation context of a run's datagram key (see [`DatagramKey::new`]).
const DATAGRAM_KEY_CONTEXT: &str = "multigrain 2026-12-05 INI datagrams AES-256-GCM key v3";

/// The key that seals one run's datagrams: AES-256-GCM under a key derived from the job's
/// secret and the run's epoch, with the sending INI's own datagram counter in every
/// nonce (see the module docs, *Authentication*). Clones share the counter. `Debug`
/// prints no key bytes.
///
/// Invariant the nonces rest on: within a run, only one sender seals datagrams as a given
/// INI address (one [`crate::Ini`] per INI). Each key also starts its counter at a random
/// value, so that even a second sender with the same address would repeat a nonce only if
/// its 64-bit counter range met the first's.
#[derive(Clone)]
pub struct DatagramKey {
    aead: ring::aead::LessSafeKey,
    sent: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl DatagramKey {
    /// The datagram key of the run with `epoch` under the job secret `secret`: the
    /// AES-256 key is `BLAKE3-derive_key(context, secret ‖ epoch)` (epoch big-endian), so
    /// each run seals under its own key and a counter that restarts with a run never
    /// repeats a nonce under an earlier run's key.
    pub fn new(secret: &MacKey, epoch: u64) -> DatagramKey {
        let mut material = [0u8; 40];
        material[..32].copy_from_slice(secret.as_bytes());
        material[32..].copy_from_slice(&epoch.to_be_bytes());
        let key = blake3::derive_key(DATAGRAM_KEY_CONTEXT, &material);
        let unbound = ring::aead::UnboundKey::new(&ring::aead::AES_256_GCM, &key)
            .expect("AES-256-GCM takes any 32-byte key");
        let mut start = [0u8; 8];
        // A failed draw leaves 0: the nonces stay unique under the invariant above.
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut start);
        DatagramKey {
            aead: ring::aead::LessSafeKey::new(unbound),
            sent: std::sync::Arc::new(std::sync::atomic::AtomicU64::new(u64::from_be_bytes(start))),
        }
    }

    /// The counter value for the next datagram this key seals.
    fn next_counter(&self) -> u64 {
        self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }
}

impl std::fmt::Debug for DatagramKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DatagramKey(<secret>)")
    }
}

/// The 96-bit AES-GCM nonce of the datagram that INI `src` sealed with counter value
/// `counter`: site (2 bytes), INI (1), zero (1), counter (8), big-endian.
fn nonce(src: IniAddr, counter: u64) -> ring::aead::Nonce {
    let mut n = [0u8; ring::aead::NONCE_LEN];
    n[0..2].copy_from_slice(&src.site.to_be_bytes());
    n[2] = src.ini;
    n[4..12].copy_from_slice(&counter.to_be_bytes());
    ring::aead::Nonce::assume_unique_for_key(n)
}

/// Every header field except magic, version and payload length (see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// DATA, ACK, NAK or BATCH.
    pub kind: FrameKind,
    /// The run's epoch.
    pub epoch: u64,
    /// Source and destination INI.
    pub conn: ConnId,
    /// DATA: this frame's sequence number. BATCH: its first frame's. NAK: the sequence
    /// number asked for. ACK: 0.
    pub seq: u32,
    /// Cumulative ACK: every frame before this sequence number was received.
    pub ack: u32,
    /// DATA: index of this fragment in its message. ACK/NAK/BATCH: 0.
    pub frag_index: u16,
    /// DATA: number of fragments of the message (≥ 1). BATCH: number of frames it
    /// carries (≥ 2). ACK/NAK: 0.
    pub frag_count: u16,
}

/// A decoded datagram borrowing its payload from the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The header.
    pub header: Header,
    /// The payload: message bytes (DATA), frames ([`BatchFrames`], BATCH), selective-ACK
    /// bitmap (ACK), empty (NAK).
    pub payload: &'a [u8],
}

/// One DATA frame of a BATCH datagram, as [`BatchFrames`] yields it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchFrame<'a> {
    /// Sequence number: the BATCH header's plus the frame's position.
    pub seq: u32,
    /// Fragment index in its message.
    pub frag_index: u16,
    /// Fragments of its message (≥ 1).
    pub frag_count: u16,
    /// The fragment's bytes.
    pub data: &'a [u8],
}

/// The frames of a BATCH datagram's payload, in order. [`decode`] has checked them, so a
/// [`Frame`] it returned yields all `header.frag_count` frames; on any other bytes the
/// iterator stops at the first malformed entry.
#[derive(Clone, Debug)]
pub struct BatchFrames<'a> {
    rest: &'a [u8],
    seq: u32,
}

impl<'a> BatchFrames<'a> {
    /// The frames of `payload`, the first with sequence number `first_seq`.
    pub fn new(first_seq: u32, payload: &'a [u8]) -> BatchFrames<'a> {
        BatchFrames {
            rest: payload,
            seq: first_seq,
        }
    }
}

impl<'a> Iterator for BatchFrames<'a> {
    type Item = BatchFrame<'a>;

    fn next(&mut self) -> Option<BatchFrame<'a>> {
        let b = self.rest;
        if b.len() < BATCH_ENTRY_HEADER {
            return None;
        }
        let (frag_index, frag_count) = (be16(b, 0), be16(b, 2));
        let len = usize::from(be16(b, 4));
        if frag_count == 0 || frag_index >= frag_count || b.len() - BATCH_ENTRY_HEADER < len {
            return None;
        }
        let data = &b[BATCH_ENTRY_HEADER..BATCH_ENTRY_HEADER + len];
        self.rest = &b[BATCH_ENTRY_HEADER + len..];
        let seq = self.seq;
        self.seq = seq.wrapping_add(1);
        Some(BatchFrame {
            seq,
            frag_index,
            frag_count,
            data,
        })
    }
}

/// Whether `payload` is exactly `count` well-formed BATCH entries.
fn batch_valid(count: u16, payload: &[u8]) -> bool {
    let mut it = BatchFrames::new(0, payload);
    (0..count).all(|_| it.next().is_some()) && it.rest.is_empty()
}

/// Why [`decode`] rejected a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// Shorter than header plus tag.
    #[error("datagram of {0} bytes is shorter than the {OVERHEAD}-byte minimum")]
    TooShort(usize),
    /// Wrong magic number: not a multigrain datagram.
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    /// A protocol version this build does not speak.
    #[error("unsupported protocol version {0}")]
    UnsupportedVersion(u8),
    /// Another run's epoch (a replay of an earlier run, or another job).
    #[error("epoch {found:#018x} is not this run's {expected:#018x}")]
    WrongEpoch {
        /// The epoch in the datagram.
        found: u64,
        /// This run's epoch.
        expected: u64,
    },
    /// The tag does not authenticate the datagram under this run's key: corrupted in
    /// transit, forged, or sealed in another run.
    #[error("authentication failed: corrupted or forged datagram")]
    BadMac,
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// Payload length field disagrees with the datagram length.
    #[error("payload length field {field} but {actual} payload bytes present")]
    LengthMismatch {
        /// The payload length field.
        field: u16,
        /// Payload bytes actually present.
        actual: usize,
    },
    /// DATA with fragment count 0 or index ≥ count.
    #[error("fragment {index} of {count} is invalid")]
    BadFragment {
        /// Fragment index field.
        index: u16,
        /// Fragment count field.
        count: u16,
    },
    /// ACK or NAK with non-zero fragment fields, or NAK with a payload.
    #[error("control frame with payload or fragment fields")]
    ControlFields,
    /// BATCH whose fields or entries are inconsistent: fragment index not 0, fewer than
    /// 2 frames, an entry with fragment count 0 or index ≥ count, entry lengths that do
    /// not fill the payload exactly, or not as many entries as the header says.
    #[error("malformed batch of frames")]
    BadBatch,
}

/// Why [`encode`] could not write a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum EncodeError {
    /// The buffer is shorter than the datagram.
    #[error("buffer of {have} bytes, datagram needs {need}")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Buffer length.
        have: usize,
    },
    /// Payload longer than the 16-bit length field allows.
    #[error("payload of {0} bytes exceeds 65535")]
    PayloadTooLarge(usize),
    /// Fragment fields or payload not allowed for this kind (see [`DecodeError`]).
    #[error("invalid header for its kind")]
    InvalidHeader,
}

/// Length in bytes of the datagram carrying `payload_len` payload bytes.
pub const fn datagram_len(payload_len: usize) -> usize {
    OVERHEAD + payload_len
}

/// The length in bytes that the datagram starting at `bytes` states for itself (its
/// payload length field plus [`OVERHEAD`]), unauthenticated: `None` if `bytes` ends
/// before the field. [`decode`] rejects a datagram whose stated length is not its own;
/// the INIs' receive offload reads it to cut apart a run of datagrams that the kernel
/// coalesced into one read, each of which then passes [`decode`] on its own.
pub fn stated_len(bytes: &[u8]) -> Option<usize> {
    bytes.get(..PAYLOAD_LEN_AT + 2)?;
    Some(datagram_len(usize::from(be16(bytes, PAYLOAD_LEN_AT))))
}

fn header_valid(h: &Header, payload_len: usize) -> bool {
    match h.kind {
        FrameKind::Data => h.frag_count >= 1 && h.frag_index < h.frag_count,
        FrameKind::Ack => h.frag_index == 0 && h.frag_count == 0,
        FrameKind::Nak => payload_len == 0 && h.frag_index == 0 && h.frag_count == 0,
        FrameKind::Batch => {
            h.frag_index == 0
                && h.frag_count >= 2
                && payload_len >= BATCH_ENTRY_HEADER * usize::from(h.frag_count)
        }
    }
}

/// Appends one frame to the BATCH payload being built in `buf` (after the header, `used`
/// payload bytes so far) and returns the new payload length. The caller guarantees room:
/// `HEADER_LEN + used + BATCH_ENTRY_HEADER + data.len() + MAC_LEN <= buf.len()` and
/// `data.len() <= 65 535`.
pub(crate) fn put_batch_frame(
    buf: &mut [u8],
    used: usize,
    frag_index: u16,
    frag_count: u16,
    data: &[u8],
) -> usize {
    let at = HEADER_LEN + used;
    buf[at..at + 2].copy_from_slice(&frag_index.to_be_bytes());
    buf[at + 2..at + 4].copy_from_slice(&frag_count.to_be_bytes());
    buf[at + 4..at + 6].copy_from_slice(&(data.len() as u16).to_be_bytes());
    let start = at + BATCH_ENTRY_HEADER;
    buf[start..start + data.len()].copy_from_slice(data);
    used + BATCH_ENTRY_HEADER + data.len()
}

/// Writes the datagram for `header` and `payload`, sealed under `key` (the payload
/// encrypted, header and payload authenticated), into the front of `buf` and returns its
/// length in bytes. No allocation; the payload is copied once (thesis §4.4.1: one copy
/// per send when fragmenting) and encrypted in place.
///
/// # Errors
/// [`EncodeError`]: a payload over 65 535 bytes, a buffer too small, fragment fields or a
/// payload not allowed for the kind.
pub fn encode(
    header: &Header,
    payload: &[u8],
    key: &DatagramKey,
    buf: &mut [u8],
) -> Result<usize, EncodeError> {
    let len = payload.len();
    if u16::try_from(len).is_err() {
        return Err(EncodeError::PayloadTooLarge(len));
    }
    let need = datagram_len(len);
    if buf.len() < need {
        return Err(EncodeError::BufferTooSmall {
            need,
            have: buf.len(),
        });
    }
    if !header_valid(header, len) {
        return Err(EncodeError::InvalidHeader);
    }
    Ok(write_frame(header, payload, key, buf))
}

/// [`encode`] without the checks: the caller guarantees a valid header, a payload of at
/// most 65 535 bytes and a buffer of at least `datagram_len(payload.len())` bytes (the
/// slice indexing panics otherwise).
pub(crate) fn write_frame(
    header: &Header,
    payload: &[u8],
    key: &DatagramKey,
    buf: &mut [u8],
) -> usize {
    buf[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(payload);
    seal(header, payload.len(), key, buf)
}

/// Writes the header around `len` payload bytes already at `buf[HEADER_LEN..]`, encrypts
/// them in place and appends the tag; same contract as [`write_frame`].
pub(crate) fn seal(header: &Header, len: usize, key: &DatagramKey, buf: &mut [u8]) -> usize {
    let need = datagram_len(len);
    let (h, rest) = buf[..need].split_at_mut(HEADER_LEN);
    h[0..2].copy_from_slice(&MAGIC.to_be_bytes());
    h[2] = VERSION;
    h[3] = header.kind as u8;
    h[4..12].copy_from_slice(&header.epoch.to_be_bytes());
    h[12..14].copy_from_slice(&header.conn.src.site.to_be_bytes());
    h[14..16].copy_from_slice(&header.conn.dst.site.to_be_bytes());
    h[16] = header.conn.src.ini;
    h[17] = header.conn.dst.ini;
    h[PAYLOAD_LEN_AT..PAYLOAD_LEN_AT + 2].copy_from_slice(&(len as u16).to_be_bytes());
    h[20..24].copy_from_slice(&header.seq.to_be_bytes());
    h[24..28].copy_from_slice(&header.ack.to_be_bytes());
    h[28..30].copy_from_slice(&header.frag_index.to_be_bytes());
    h[30..32].copy_from_slice(&header.frag_count.to_be_bytes());
    let counter = key.next_counter();
    h[32..40].copy_from_slice(&counter.to_be_bytes());
    let (payload, trailer) = rest.split_at_mut(len);
    let tag = key
        .aead
        .seal_in_place_separate_tag(
            nonce(header.conn.src, counter),
            ring::aead::Aad::from(&*h),
            payload,
        )
        .expect("AES-GCM seals any payload under 64 GiB; a datagram's is under 64 KiB");
    trailer.copy_from_slice(tag.as_ref());
    need
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(v)
}

/// Parses, authenticates and decrypts one datagram of run `epoch` sealed under `key`,
/// leaving `datagram` as received: the datagram is copied into `scratch` (which keeps its
/// capacity from call to call) and decoded there by [`decode_in_place`], whose checks and
/// errors these are. The payload borrows from `scratch`.
///
/// # Errors
/// [`DecodeError`] naming the first check that failed.
pub fn decode<'a>(
    datagram: &[u8],
    key: &DatagramKey,
    epoch: u64,
    scratch: &'a mut Vec<u8>,
) -> Result<Frame<'a>, DecodeError> {
    scratch.clear();
    scratch.extend_from_slice(datagram);
    decode_in_place(scratch, key, epoch)
}

/// Parses, authenticates and decrypts one datagram of run `epoch` sealed under `key`,
/// decrypting its payload where it lies: the frame's payload borrows from `datagram`,
/// whose ciphertext becomes plaintext (the header stays as received; after an error the
/// payload bytes are unspecified). No copy of the datagram is made — a 4 KiB page
/// arriving through an INI is read out of the socket's buffer once, by its delivery.
/// Never panics; see the module doc for the order of checks: the magic, version and
/// epoch before any decryption, so sprayed datagrams and replays of another run cost no
/// AES.
///
/// # Errors
/// [`DecodeError`] naming the first check that failed.
pub fn decode_in_place<'a>(
    datagram: &'a mut [u8],
    key: &DatagramKey,
    epoch: u64,
) -> Result<Frame<'a>, DecodeError> {
    let total = datagram.len();
    if total < OVERHEAD {
        return Err(DecodeError::TooShort(total));
    }
    let magic = be16(datagram, 0);
    if magic != MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    if datagram[2] != VERSION {
        return Err(DecodeError::UnsupportedVersion(datagram[2]));
    }
    let mut ep = [0u8; 8];
    ep.copy_from_slice(&datagram[4..12]);
    let found = u64::from_be_bytes(ep);
    if found != epoch {
        return Err(DecodeError::WrongEpoch {
            found,
            expected: epoch,
        });
    }
    let body = total - TRAILER_LEN;
    let (head, sealed) = datagram.split_at_mut(HEADER_LEN);
    let head: &'a [u8] = head;
    let src = IniAddr::new(be16(head, 12), head[16]);
    let plain = match key.aead.open_in_place(
        nonce(src, be64(head, 32)),
        ring::aead::Aad::from(head),
        sealed,
    ) {
        Ok(p) => p.len(),
        Err(ring::error::Unspecified) => return Err(DecodeError::BadMac),
    };
    let Some(kind) = FrameKind::from_u8(head[3]) else {
        return Err(DecodeError::UnknownKind(head[3]));
    };
    let field = be16(head, PAYLOAD_LEN_AT);
    let actual = body - HEADER_LEN;
    if usize::from(field) != actual {
        return Err(DecodeError::LengthMismatch { field, actual });
    }
    let header = Header {
        kind,
        epoch: found,
        conn: ConnId {
            src,
            dst: IniAddr::new(be16(head, 14), head[17]),
        },
        seq: be32(head, 20),
        ack: be32(head, 24),
        frag_index: be16(head, 28),
        frag_count: be16(head, 30),
    };
    debug_assert_eq!(
        plain, actual,
        "AES-GCM's plaintext is its ciphertext's length"
    );
    let sealed: &'a [u8] = sealed;
    let payload = &sealed[..plain];
    if !header_valid(&header, actual) {
        return Err(match kind {
            FrameKind::Data => DecodeError::BadFragment {
                index: header.frag_index,
                count: header.frag_count,
            },
            FrameKind::Ack | FrameKind::Nak => DecodeError::ControlFields,
            FrameKind::Batch => DecodeError::BadBatch,
        });
    }
    if kind == FrameKind::Batch && !batch_valid(header.frag_count, payload) {
        return Err(DecodeError::BadBatch);
    }
    Ok(Frame { header, payload })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EPOCH: u64 = 0x0123_4567_89ab_cdef;

    fn secret() -> MacKey {
        MacKey::new([7; 32])
    }

    /// The datagram key of the run with `epoch` under [`secret`].
    fn key_of(epoch: u64) -> DatagramKey {
        DatagramKey::new(&secret(), epoch)
    }

    fn key() -> DatagramKey {
        key_of(EPOCH)
    }

    /// Decodes under the test secret for `epoch`, the payload copied out.
    fn decode_at(d: &[u8], epoch: u64) -> Result<(Header, Vec<u8>), DecodeError> {
        let mut scratch = Vec::new();
        super::decode(d, &key_of(epoch), epoch, &mut scratch)
            .map(|f| (f.header, f.payload.to_vec()))
    }

    fn decode(d: &[u8]) -> Result<(Header, Vec<u8>), DecodeError> {
        decode_at(d, EPOCH)
    }

    fn encode(h: &Header, p: &[u8], buf: &mut [u8]) -> Result<usize, EncodeError> {
        super::encode(h, p, &key_of(h.epoch), buf)
    }

    fn data_header() -> Header {
        Header {
            kind: FrameKind::Data,
            epoch: EPOCH,
            conn: ConnId {
                src: IniAddr::new(0x0102, 3),
                dst: IniAddr::new(0x0405, 6),
            },
            seq: 0xdead_beef,
            ack: 0x0bad_f00d,
            frag_index: 2,
            frag_count: 5,
        }
    }

    #[test]
    fn layout_matches_the_table() {
        let mut buf = [0u8; 64];
        let key = key();
        let n = super::encode(&data_header(), b"xyz", &key, &mut buf).unwrap();
        assert_eq!(n, 59);
        let expect: [u8; 32] = [
            0x4D, 0x47, 3, 1, // magic, version, kind
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, // epoch
            0x01, 0x02, 0x04, 0x05, 3, 6, // sites, INIs
            0, 3, // payload length
            0xde, 0xad, 0xbe, 0xef, // seq
            0x0b, 0xad, 0xf0, 0x0d, // ack
            0, 2, 0, 5, // fragment index, count
        ];
        assert_eq!(&buf[..32], &expect);
        assert_eq!(
            stated_len(&buf[..n]),
            Some(n),
            "the length it states is its own"
        );
        assert_eq!(
            stated_len(&buf[..PAYLOAD_LEN_AT + 1]),
            None,
            "no length field"
        );
        // The sender's counter, then the next datagram's is one more.
        let counter = be64(&buf, 32);
        let mut next = [0u8; 64];
        super::encode(&data_header(), b"xyz", &key, &mut next).unwrap();
        assert_eq!(be64(&next, 32), counter.wrapping_add(1));
        // The payload and tag: AES-256-GCM under BLAKE3-derive_key(context, secret ‖
        // epoch), nonce = source site, source INI, 0, counter; the header authenticated.
        let mut material = [7u8; 40];
        material[32..].copy_from_slice(&EPOCH.to_be_bytes());
        let aes = ring::aead::LessSafeKey::new(
            ring::aead::UnboundKey::new(
                &ring::aead::AES_256_GCM,
                &blake3::derive_key(DATAGRAM_KEY_CONTEXT, &material),
            )
            .unwrap(),
        );
        let mut nonce_bytes = [0u8; 12];
        nonce_bytes[..3].copy_from_slice(&[0x01, 0x02, 3]);
        nonce_bytes[4..].copy_from_slice(&counter.to_be_bytes());
        let mut sealed = *b"xyz";
        let tag = aes
            .seal_in_place_separate_tag(
                ring::aead::Nonce::assume_unique_for_key(nonce_bytes),
                ring::aead::Aad::from(&buf[..40]),
                &mut sealed,
            )
            .unwrap();
        assert_eq!(&buf[40..43], &sealed, "the payload is encrypted");
        assert_ne!(&sealed, b"xyz");
        assert_eq!(&buf[43..59], tag.as_ref());
    }

    #[test]
    fn round_trip_all_kinds() {
        let mut buf = [0u8; 128];
        let h = data_header();
        let n = encode(&h, b"hello", &mut buf).unwrap();
        let (header, payload) = decode(&buf[..n]).unwrap();
        assert_eq!(header, h);
        assert_eq!(payload, b"hello");
        for kind in [FrameKind::Ack, FrameKind::Nak] {
            let h = Header {
                kind,
                frag_index: 0,
                frag_count: 0,
                ..data_header()
            };
            let n = encode(&h, &[], &mut buf).unwrap();
            assert_eq!(n, OVERHEAD);
            assert_eq!(decode(&buf[..n]).unwrap().0, h);
        }
    }

    #[test]
    fn encode_rejects_bad_input() {
        let mut small = [0u8; 58];
        assert_eq!(
            encode(&data_header(), b"xyz", &mut small),
            Err(EncodeError::BufferTooSmall { need: 59, have: 58 })
        );
        let mut buf = vec![0u8; 70_000];
        assert_eq!(
            encode(&data_header(), &vec![0; 65_536], &mut buf),
            Err(EncodeError::PayloadTooLarge(65_536))
        );
        let bad_frag = Header {
            frag_index: 5,
            ..data_header()
        };
        assert_eq!(
            encode(&bad_frag, b"", &mut buf),
            Err(EncodeError::InvalidHeader)
        );
        let nak = Header {
            kind: FrameKind::Nak,
            frag_index: 0,
            frag_count: 0,
            ..data_header()
        };
        assert_eq!(
            encode(&nak, b"x", &mut buf),
            Err(EncodeError::InvalidHeader)
        );
        let ack_with_frag = Header {
            kind: FrameKind::Ack,
            ..data_header()
        };
        assert_eq!(
            encode(&ack_with_frag, b"", &mut buf),
            Err(EncodeError::InvalidHeader)
        );
        // An ACK may carry a selective-ACK bitmap.
        let ack = Header {
            kind: FrameKind::Ack,
            ..nak
        };
        let n = encode(&ack, &[0b101], &mut buf).unwrap();
        assert_eq!(decode(&buf[..n]).unwrap().1, &[0b101]);
    }

    /// Seals a tampered datagram as it stands — its header bytes as they are, the bytes
    /// between header and trailer as the plaintext — under the test run's key, so that the
    /// checks after authentication are reached.
    fn reseal(d: &mut [u8]) {
        let body = d.len() - TRAILER_LEN;
        let src = IniAddr::new(be16(d, 12), d[16]);
        let counter = be64(d, 32);
        let (h, rest) = d.split_at_mut(HEADER_LEN);
        let (payload, trailer) = rest.split_at_mut(body - HEADER_LEN);
        let tag = key()
            .aead
            .seal_in_place_separate_tag(nonce(src, counter), ring::aead::Aad::from(&*h), payload)
            .unwrap();
        trailer.copy_from_slice(tag.as_ref());
    }

    #[test]
    fn a_datagram_of_another_run_fails_authentication_even_with_this_runs_epoch() {
        // Sealed under the same secret in another run, then its epoch field rewritten:
        // the key is the run's own (derived from the epoch) and the epoch is
        // authenticated data, so the tag fails.
        let prev = Header {
            epoch: EPOCH ^ 1,
            ..data_header()
        };
        let mut buf = [0u8; 64];
        let n = encode(&prev, b"abc", &mut buf).unwrap();
        buf[4..12].copy_from_slice(&EPOCH.to_be_bytes());
        assert_eq!(decode(&buf[..n]), Err(DecodeError::BadMac));
        // And a datagram whose counter was rewritten (a replayed nonce) fails too.
        let n = encode(&data_header(), b"abc", &mut buf).unwrap();
        buf[32..40].copy_from_slice(&0u64.to_be_bytes());
        assert_eq!(decode(&buf[..n]), Err(DecodeError::BadMac));
    }

    #[test]
    fn each_check_has_its_error() {
        let mut buf = [0u8; 64];
        let n = encode(&data_header(), b"abc", &mut buf).unwrap();
        let good = buf[..n].to_vec();
        assert_eq!(decode(&good[..55]), Err(DecodeError::TooShort(55)));
        let mut d = good.clone();
        d[0] = 0;
        assert_eq!(decode(&d), Err(DecodeError::BadMagic(0x0047)));
        let mut d = good.clone();
        d[2] = 9;
        assert_eq!(decode(&d), Err(DecodeError::UnsupportedVersion(9)));
        let mut d = good.clone();
        d[11] ^= 1;
        assert_eq!(
            decode(&d),
            Err(DecodeError::WrongEpoch {
                found: EPOCH ^ 1,
                expected: EPOCH
            })
        );
        let mut d = good.clone();
        d[41] ^= 1;
        assert_eq!(decode(&d), Err(DecodeError::BadMac));
        // The counter is authenticated too.
        let mut d = good.clone();
        d[39] ^= 1;
        assert_eq!(decode(&d), Err(DecodeError::BadMac));
        // Same bytes, another key: a forger without the secret.
        assert_eq!(
            super::decode(
                &good,
                &DatagramKey::new(&MacKey::new([8; 32]), EPOCH),
                EPOCH,
                &mut Vec::new()
            )
            .map(|f| f.header),
            Err(DecodeError::BadMac)
        );
        // A previous run: its epoch, its secret.
        let mut old = [0u8; 64];
        let prev = Header {
            epoch: EPOCH ^ 0xff,
            ..data_header()
        };
        let n = super::encode(
            &prev,
            b"abc",
            &DatagramKey::new(&MacKey::new([9; 32]), prev.epoch),
            &mut old,
        )
        .unwrap();
        assert!(matches!(
            decode(&old[..n]),
            Err(DecodeError::WrongEpoch { .. })
        ));
        let mut d = good.clone();
        d[3] = 7;
        reseal(&mut d);
        assert_eq!(decode(&d), Err(DecodeError::UnknownKind(7)));
        let mut d = good.clone();
        d[19] = 4;
        reseal(&mut d);
        assert_eq!(
            decode(&d),
            Err(DecodeError::LengthMismatch {
                field: 4,
                actual: 3
            })
        );
        let mut d = good.clone();
        d[31] = 0; // fragment count 0
        reseal(&mut d);
        assert_eq!(
            decode(&d),
            Err(DecodeError::BadFragment { index: 2, count: 0 })
        );
        let mut d = good;
        d[3] = FrameKind::Nak as u8; // NAK with payload
        reseal(&mut d);
        assert_eq!(decode(&d), Err(DecodeError::ControlFields));
    }

    /// A BATCH payload of `frames` as (fragment index, fragment count, data).
    fn batch_body(frames: &[(u16, u16, &[u8])]) -> Vec<u8> {
        let mut buf = vec![0u8; 4096];
        let mut used = 0;
        for &(i, c, d) in frames {
            used = put_batch_frame(&mut buf, used, i, c, d);
        }
        buf[HEADER_LEN..HEADER_LEN + used].to_vec()
    }

    #[test]
    fn a_batch_round_trips_and_yields_its_frames_in_order() {
        let body = batch_body(&[(0, 1, b"ab"), (0, 2, b""), (1, 2, b"cde")]);
        let h = Header {
            kind: FrameKind::Batch,
            seq: u32::MAX,
            frag_index: 0,
            frag_count: 3,
            ..data_header()
        };
        let mut buf = [0u8; 128];
        let n = encode(&h, &body, &mut buf).unwrap();
        let (header, payload) = decode(&buf[..n]).unwrap();
        assert_eq!(header, h);
        let frames: Vec<_> = BatchFrames::new(header.seq, &payload).collect();
        let want = [
            (u32::MAX, 0, 1, &b"ab"[..]),
            (0, 0, 2, &b""[..]),
            (1, 1, 2, &b"cde"[..]),
        ];
        assert_eq!(frames.len(), 3);
        for (got, (seq, i, c, d)) in frames.iter().zip(want) {
            assert_eq!(
                (got.seq, got.frag_index, got.frag_count, got.data),
                (seq, i, c, d)
            );
        }
    }

    #[test]
    fn a_malformed_batch_is_rejected() {
        let h = |count| Header {
            kind: FrameKind::Batch,
            frag_index: 0,
            frag_count: count,
            ..data_header()
        };
        let sealed = |h: &Header, body: &[u8]| {
            let mut buf = vec![0u8; OVERHEAD + body.len()];
            let n = write_frame(h, body, &key(), &mut buf);
            buf.truncate(n);
            buf
        };
        let two = batch_body(&[(0, 1, b"ab"), (0, 1, b"c")]);
        assert!(decode(&sealed(&h(2), &two)).is_ok());
        // The header counts more or fewer frames than the payload holds.
        assert_eq!(decode(&sealed(&h(3), &two)), Err(DecodeError::BadBatch));
        let three = batch_body(&[(0, 1, b"ab"), (0, 1, b"c"), (0, 1, b"")]);
        assert_eq!(decode(&sealed(&h(2), &three)), Err(DecodeError::BadBatch));
        // Fewer than two frames, or a fragment index in the header.
        let one = batch_body(&[(0, 1, b"ab")]);
        assert_eq!(decode(&sealed(&h(1), &one)), Err(DecodeError::BadBatch));
        let idx = Header {
            frag_index: 1,
            ..h(2)
        };
        assert_eq!(decode(&sealed(&idx, &two)), Err(DecodeError::BadBatch));
        // An entry with fragment count 0, index ≥ count, or a length past the end.
        for bad in [
            batch_body(&[(0, 1, b"ab"), (0, 0, b"c")]),
            batch_body(&[(2, 2, b"ab"), (0, 1, b"c")]),
        ] {
            assert_eq!(decode(&sealed(&h(2), &bad)), Err(DecodeError::BadBatch));
        }
        let mut long = two.clone();
        long[5] += 1; // first entry claims 3 bytes: the entries no longer fill the payload
        assert_eq!(decode(&sealed(&h(2), &long)), Err(DecodeError::BadBatch));
        let mut trailing = two;
        trailing.push(0);
        assert_eq!(
            decode(&sealed(&h(2), &trailing)),
            Err(DecodeError::BadBatch)
        );
    }

    fn arb_header() -> impl Strategy<Value = Header> {
        (
            any::<u64>(),
            any::<(u16, u8, u16, u8)>(),
            any::<u32>(),
            any::<u32>(),
            1u16..=u16::MAX,
            any::<u16>(),
        )
            .prop_map(|(epoch, (ss, si, ds, di), seq, ack, count, idx)| Header {
                kind: FrameKind::Data,
                epoch,
                conn: ConnId {
                    src: IniAddr::new(ss, si),
                    dst: IniAddr::new(ds, di),
                },
                seq,
                ack,
                frag_index: idx % count,
                frag_count: count,
            })
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_valid_looking_prefix(
            tail in proptest::collection::vec(any::<u8>(), 0..100),
        ) {
            // Magic and version right, so the checks past them are exercised.
            let mut d = vec![0x4D, 0x47, VERSION];
            d.extend_from_slice(&tail);
            let _ = decode(&d);
            if d.len() >= OVERHEAD {
                reseal(&mut d);
                let _ = decode(&d);
            }
        }

        #[test]
        fn round_trip(h in arb_header(), payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut buf = vec![0u8; OVERHEAD + payload.len()];
            let n = encode(&h, &payload, &mut buf).unwrap();
            prop_assert_eq!(n, buf.len());
            let (header, got) = decode_at(&buf, h.epoch).unwrap();
            prop_assert_eq!(header, h);
            prop_assert_eq!(got, payload);
        }

        #[test]
        fn truncation_is_rejected(
            h in arb_header(),
            payload in proptest::collection::vec(any::<u8>(), 0..300),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut buf = vec![0u8; OVERHEAD + payload.len()];
            encode(&h, &payload, &mut buf).unwrap();
            let keep = cut.index(buf.len());
            prop_assert!(decode_at(&buf[..keep], h.epoch).is_err());
        }

        #[test]
        fn any_bit_flip_is_rejected(
            h in arb_header(),
            payload in proptest::collection::vec(any::<u8>(), 0..300),
            bit in any::<prop::sample::Index>(),
        ) {
            let mut buf = vec![0u8; OVERHEAD + payload.len()];
            encode(&h, &payload, &mut buf).unwrap();
            let bit = bit.index(buf.len() * 8);
            buf[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(decode_at(&buf, h.epoch).is_err());
        }

        #[test]
        fn another_key_is_rejected(
            h in arb_header(),
            payload in proptest::collection::vec(any::<u8>(), 0..300),
            other in any::<[u8; 32]>(),
        ) {
            prop_assume!(other != *secret().as_bytes());
            let mut buf = vec![0u8; OVERHEAD + payload.len()];
            super::encode(&h, &payload, &DatagramKey::new(&MacKey::new(other), h.epoch), &mut buf).unwrap();
            prop_assert_eq!(decode_at(&buf, h.epoch), Err(DecodeError::BadMac));
        }

        /// The one-shot MAC (what the liveness probes use) and the MAC of parts (what the
        /// control channel uses) agree wherever the bytes are split, across BLAKE3's
        /// 64-byte block and 1 KiB chunk boundaries.
        #[test]
        fn one_shot_mac_equals_mac_of_parts(
            bytes in proptest::collection::vec(any::<u8>(), 0..2100),
            cut in any::<prop::sample::Index>(),
            k in any::<[u8; 32]>(),
        ) {
            let key = MacKey::new(k);
            let (a, b) = bytes.split_at(cut.index(bytes.len() + 1));
            let tag = key.mac(&bytes);
            prop_assert_eq!(tag, key.mac_parts(&[a, b]));
            prop_assert!(key.verify(&bytes, &tag));
            prop_assert!(key.verify_parts(&[a, b], &tag));
            prop_assert!(!key.verify(&bytes, &tag[..MAC_LEN - 1]));
            let mut bad = tag;
            bad[cut.index(MAC_LEN)] ^= 1;
            prop_assert!(!key.verify(&bytes, &bad));
        }
    }
}
