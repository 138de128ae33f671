//! The control plane's wire format: length-prefixed frames, each carrying
//! the job key, a protocol version and one serde-encoded [`Message`].
//!
//! ```text
//! offset  size  field
//! 0       4     L: length of the rest of the frame, big-endian u32,
//!               HEADER_LEN ..= MAX_FRAME
//! 4       4     magic b"MGcp"
//! 8       2     protocol version, big-endian u16 (VERSION)
//! 10      2     reserved, 0
//! 12      8     job key (config `job.key`), big-endian u64
//! 20      L-16  body: one Message as JSON
//! ```
//!
//! The header is checked before the body is read, so a connection from a
//! process of another job (another key), another protocol version or
//! another program (no magic) is rejected without buffering its data.
//! Decoding never panics, whatever the bytes (the control tests check
//! this with proptest).

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use super::Registration;

/// The first four bytes after the length prefix.
pub const MAGIC: [u8; 4] = *b"MGcp";
/// Version of this wire format; peers with another version are rejected.
pub const VERSION: u16 = 2;
/// Bytes of header (magic, version, reserved, key) after the length prefix.
pub const HEADER_LEN: usize = 16;
/// Largest frame, length prefix excluded: 16 MiB.
pub const MAX_FRAME: usize = 16 << 20;

/// One control-plane message.
///
/// Start-up: a member (cluster ≠ 0) sends [`Message::Register`]; the
/// coordinator (cluster 0) answers with [`Message::StartupStatus`] (repeated
/// every `peer_timeout / 4`, which doubles as its heartbeat), then
/// [`Message::Welcome`] to everyone once all have registered, or
/// [`Message::StartupFailed`] / [`Message::Rejected`]. After start-up every
/// connection carries [`Message::Heartbeat`]s both ways, barriers
/// ([`Message::Barrier`] up, [`Message::Release`] down), failures
/// ([`Message::Abort`] up, [`Message::Failed`] down) and the end of the job
/// ([`Message::Finish`] up, [`Message::Done`] down).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// Member → coordinator: the first frame on a connection.
    Register {
        /// The member's registration.
        registration: Registration,
        /// The number of clusters the member believes the job has.
        clusters: usize,
    },
    /// Coordinator → member during start-up: who has not registered yet.
    StartupStatus {
        /// Cluster ids still missing.
        missing: Vec<usize>,
    },
    /// Coordinator → member: start-up timed out.
    StartupFailed {
        /// Cluster ids that never registered.
        missing: Vec<usize>,
        /// The coordinator's start-up timeout in milliseconds.
        timeout_ms: u64,
    },
    /// Coordinator → a connecting process: registration refused.
    Rejected {
        /// Why, in words.
        reason: String,
    },
    /// Coordinator → every member: the configuration broadcast (paper 002
    /// §3.2), every cluster's registration indexed by cluster id.
    Welcome {
        /// One registration per cluster, in cluster order.
        registrations: Vec<Registration>,
    },
    /// Either way: "still alive", sent every `peer_timeout / 4`.
    Heartbeat,
    /// Member → coordinator: arrived at barrier `tag`.
    Barrier {
        /// The barrier's tag.
        tag: u32,
    },
    /// Coordinator → every member: every cluster reached barrier `tag`.
    Release {
        /// The barrier's tag.
        tag: u32,
    },
    /// Member → coordinator: this cluster failed.
    Abort {
        /// Why, in words.
        reason: String,
    },
    /// Coordinator → every member: a cluster failed or died.
    Failed {
        /// The cluster that failed.
        cluster: usize,
        /// Why, in words.
        reason: String,
    },
    /// Member → coordinator: this cluster is done.
    Finish,
    /// Coordinator → every member: every cluster is done.
    Done,
    /// Member → coordinator, the only frame on its connection: this cluster cannot
    /// start (its host is not this machine, its INIs cannot bind…); the coordinator
    /// fails the start-up at once instead of waiting out its timeout.
    CannotStart {
        /// The cluster that cannot start.
        cluster: usize,
        /// Why, in words.
        reason: String,
    },
    /// Member → coordinator, every watchdog period while `job.progress_timeout_ms`
    /// is on: whether every compute thread of this cluster waits in the DSM (the
    /// progress watchdog's evidence; see [`crate::Control::report_progress`]).
    Progress {
        /// `None` while a thread of the cluster computes or nothing waits.
        stall: Option<StallReport>,
    },
}

/// A cluster whose every compute thread waits, as [`Message::Progress`] carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StallReport {
    /// Milliseconds since a wait of the cluster last began or ended.
    pub for_ms: u64,
    /// One line per waiting thread: what it waits for and for how long.
    pub waits: Vec<String>,
}

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length prefix is below [`HEADER_LEN`] (or the buffer is shorter).
    #[error("frame of {len} bytes is shorter than the {HEADER_LEN}-byte header")]
    Short {
        /// The length found.
        len: usize,
    },
    /// The length prefix exceeds [`MAX_FRAME`].
    #[error("frame length {len} exceeds the limit of {MAX_FRAME} bytes")]
    TooLong {
        /// The length found.
        len: usize,
    },
    /// The magic is wrong: the peer is not a multigrain control plane.
    #[error("not a multigrain control-plane frame (magic {found:02x?}, expected {MAGIC:02x?})")]
    BadMagic {
        /// The four bytes found.
        found: [u8; 4],
    },
    /// Another protocol version.
    #[error(
        "control-plane protocol version {found}, this build speaks version {VERSION}: \
         run the same multigrain build on every cluster"
    )]
    Version {
        /// The version found.
        found: u16,
    },
    /// Another job's key.
    #[error("frame carries job key {found:#018x}, this job's key is {expected:#018x}")]
    ForeignKey {
        /// The key in the frame.
        found: u64,
        /// This job's key.
        expected: u64,
    },
    /// The body is not a valid message.
    #[error("undecodable message body: {0}")]
    Body(String),
}

/// Why [`read_frame`] returned no message.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The peer closed the connection cleanly between frames.
    #[error("connection closed")]
    Closed,
    /// Reading failed (reset, timeout, or closed in the middle of a frame).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// A frame arrived but was refused.
    #[error("{0}")]
    Frame(#[from] FrameError),
}

/// Encodes `msg` as a whole frame, length prefix included.
pub fn encode(key: u64, msg: &Message) -> Vec<u8> {
    let mut out = vec![0u8; 4 + HEADER_LEN];
    // Writing JSON into a Vec cannot fail: the messages hold no maps and no floats.
    serde_json::to_writer(&mut out, msg).expect("serializing a control message to memory");
    let len = u32::try_from(out.len() - 4).unwrap_or(u32::MAX);
    out[0..4].copy_from_slice(&len.to_be_bytes());
    out[4..8].copy_from_slice(&MAGIC);
    out[8..10].copy_from_slice(&VERSION.to_be_bytes());
    out[12..20].copy_from_slice(&key.to_be_bytes());
    out
}

/// Checks a frame header (the [`HEADER_LEN`] bytes after the length
/// prefix) against this job's `key`.
///
/// # Errors
///
/// [`FrameError::Short`], [`FrameError::BadMagic`], [`FrameError::Version`]
/// or [`FrameError::ForeignKey`].
pub fn check_header(key: u64, header: &[u8]) -> Result<(), FrameError> {
    let Some(header) = header.get(..HEADER_LEN) else {
        return Err(FrameError::Short { len: header.len() });
    };
    let mut magic = [0u8; 4];
    magic.copy_from_slice(&header[0..4]);
    if magic != MAGIC {
        return Err(FrameError::BadMagic { found: magic });
    }
    let version = u16::from_be_bytes([header[4], header[5]]);
    if version != VERSION {
        return Err(FrameError::Version { found: version });
    }
    let mut found = [0u8; 8];
    found.copy_from_slice(&header[8..16]);
    let found = u64::from_be_bytes(found);
    if found != key {
        return Err(FrameError::ForeignKey {
            found,
            expected: key,
        });
    }
    Ok(())
}

/// Decodes the bytes after a frame's length prefix (header and body).
///
/// # Errors
///
/// As [`check_header`], [`FrameError::TooLong`] above [`MAX_FRAME`], and
/// [`FrameError::Body`] for a body that is not a [`Message`].
pub fn decode(key: u64, frame: &[u8]) -> Result<Message, FrameError> {
    if frame.len() > MAX_FRAME {
        return Err(FrameError::TooLong { len: frame.len() });
    }
    check_header(key, frame)?;
    serde_json::from_slice(&frame[HEADER_LEN..]).map_err(|e| FrameError::Body(e.to_string()))
}

/// Decodes one whole frame from the start of `bytes`, length prefix
/// included; returns the message and the bytes it took, or `Ok(None)` when
/// `bytes` holds only the start of a frame.
///
/// # Errors
///
/// As [`decode`]; a bad length prefix is refused before the frame is
/// complete.
pub fn decode_prefixed(key: u64, bytes: &[u8]) -> Result<Option<(Message, usize)>, FrameError> {
    let Some(prefix) = bytes.get(..4) else {
        return Ok(None);
    };
    let len = frame_len(prefix)?;
    match bytes.get(4..4 + len) {
        Some(frame) => decode(key, frame).map(|m| Some((m, 4 + len))),
        None => Ok(None),
    }
}

/// Reads the length prefix.
fn frame_len(prefix: &[u8]) -> Result<usize, FrameError> {
    let mut len = [0u8; 4];
    len.copy_from_slice(&prefix[..4]);
    let len = u32::from_be_bytes(len) as usize;
    if len < HEADER_LEN {
        return Err(FrameError::Short { len });
    }
    if len > MAX_FRAME {
        return Err(FrameError::TooLong { len });
    }
    Ok(len)
}

/// Reads one frame from `r`. The header is checked before the body is read.
///
/// # Errors
///
/// [`ReadError::Closed`] when `r` ends before the first byte,
/// [`ReadError::Io`] for a read error or an end inside a frame,
/// [`ReadError::Frame`] for a refused frame.
pub fn read_frame(r: &mut impl Read, key: u64) -> Result<Message, ReadError> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < prefix.len() {
        match r.read(&mut prefix[got..]) {
            Ok(0) if got == 0 => return Err(ReadError::Closed),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = frame_len(&prefix)?;
    let mut header = [0u8; HEADER_LEN];
    r.read_exact(&mut header)?;
    check_header(key, &header)?;
    let body_len = len - HEADER_LEN;
    let mut body = Vec::with_capacity(body_len.min(64 << 10));
    r.take(body_len as u64).read_to_end(&mut body)?;
    if body.len() != body_len {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
    }
    serde_json::from_slice(&body).map_err(|e| FrameError::Body(e.to_string()).into())
}

/// Writes `msg` as one frame.
///
/// # Errors
///
/// The writer's error.
pub fn write_frame(w: &mut impl Write, key: u64, msg: &Message) -> io::Result<()> {
    w.write_all(&encode(key, msg))
}
