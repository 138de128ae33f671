//! The control plane's wire format: length-prefixed frames, each carrying
//! a protocol version, the job's label, a keyed MAC and one serde-encoded [`Message`].
//!
//! ```text
//! offset  size  field
//! 0       4     L: length of the rest of the frame, big-endian u32,
//!               HEADER_LEN ..= MAX_FRAME
//! 4       4     magic b"MGcp"
//! 8       2     protocol version, big-endian u16 (VERSION)
//! 10      1     flags: bit 0 set = the MAC field is a MAC; clear = no MAC (zeros)
//! 11      1     reserved, 0
//! 12      8     job label (config `job.key`), big-endian u64
//! 20      16    MAC: BLAKE3 keyed hash under the job's secret of bytes 4..20 and the
//!               body, first 16 bytes (see `Secret::mac`)
//! 36      L-32  body: one Message as JSON
//! ```
//!
//! The job label only tells jobs apart for friendlier errors (a process of another job
//! is refused naming both labels); it is no secret. Authentication is the MAC: once a
//! connection's end knows the job's secret and the other end has started
//! authenticating ([`Auth`]), a frame without a valid MAC ends the connection. How the
//! secret is agreed is in [`crate::secret`].
//!
//! The header is checked before the body is read, so a connection from a
//! process of another job (another label), another protocol version,
//! another program (no magic), or one without a MAC where one is required, is
//! rejected without buffering its data. Decoding never panics, whatever the bytes (the
//! control tests check this with proptest).

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use super::Registration;
use super::secret::{MAC_LEN, Secret};

/// The first four bytes after the length prefix.
pub const MAGIC: [u8; 4] = *b"MGcp";
/// Version of this wire format; peers with another version are rejected (1 had no MAC).
pub const VERSION: u16 = 2;
/// Bytes of header (magic, version, flags, label, MAC) after the length prefix.
pub const HEADER_LEN: usize = 32;
/// Largest frame, length prefix excluded: 16 MiB.
pub const MAX_FRAME: usize = 16 << 20;
/// Flag bit: the frame carries a MAC.
const FLAG_MAC: u8 = 1;
/// Header bytes the MAC covers (all but the MAC itself).
const AUTHED_HEADER: usize = HEADER_LEN - MAC_LEN;

/// How a reader treats MACs.
#[derive(Clone, Copy, Debug)]
pub struct Auth<'a> {
    /// The job's secret, when this end knows it: a frame with a MAC is verified under it
    /// (without it, a frame with a MAC is refused: [`FrameError::UnexpectedMac`]).
    pub key: Option<&'a Secret>,
    /// Frames without a MAC are refused ([`FrameError::MissingMac`]): always with a
    /// pre-shared secret; with a bootstrapped one, from the other end's first
    /// authenticated frame on.
    pub required: bool,
}

impl<'a> Auth<'a> {
    /// No secret known: frames must carry no MAC (a member before the bootstrap
    /// `Welcome`, and the tests of the framing itself).
    pub const NONE: Auth<'static> = Auth {
        key: None,
        required: false,
    };

    /// Every frame must carry a valid MAC under `key`.
    pub const fn required(key: &'a Secret) -> Auth<'a> {
        Auth {
            key: Some(key),
            required: true,
        }
    }

    /// A pre-shared secret, if any: [`Auth::required`] under it, else [`Auth::NONE`]
    /// (a start-up frame, sent before any bootstrap).
    pub const fn preshared(key: Option<&'a Secret>) -> Auth<'a> {
        match key {
            Some(key) => Auth::required(key),
            None => Auth::NONE,
        }
    }
}

/// A frame that was read, and whether it carried a valid MAC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// The message.
    pub msg: Message,
    /// It carried a MAC that verified under the job's secret.
    pub authenticated: bool,
}

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
        /// The run's random epoch, drawn by cluster 0 (every INI datagram carries it).
        epoch: u64,
        /// The job's secret (as hex on the wire), when cluster 0 bootstraps it (no key
        /// file: see [`crate::secret`]); `None` when every cluster has it from its key
        /// file.
        secret: Option<Secret>,
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
    /// No MAC where one is required: the peer does not know the job's secret (a process
    /// not started with this job's key file, or a forged frame).
    #[error(
        "control frame without a MAC: the sender does not authenticate with this job's \
         secret (start every cluster of the job the same way, with the same `{}` or none)",
        crate::secret::ENV_KEY_FILE
    )]
    MissingMac,
    /// A MAC where this end knows no secret: the sender has a key file and this process
    /// has none.
    #[error(
        "control frame with a MAC, but this process has no job secret (only some clusters \
         were given `{}`)",
        crate::secret::ENV_KEY_FILE
    )]
    UnexpectedMac,
    /// The MAC does not verify: forged, altered, or made under another secret.
    #[error(
        "control frame MAC does not verify under this job's secret (forged, altered, or another job's key file)"
    )]
    BadMac,
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

/// Encodes `msg` as a whole frame, length prefix included, with the job label `label`
/// and, when `key` is given, a MAC under it.
pub fn encode(label: u64, key: Option<&Secret>, msg: &Message) -> Vec<u8> {
    let mut out = vec![0u8; 4 + HEADER_LEN];
    // Writing JSON into a Vec cannot fail: the messages hold no maps and no floats.
    serde_json::to_writer(&mut out, msg).expect("serializing a control message to memory");
    let len = u32::try_from(out.len() - 4).unwrap_or(u32::MAX);
    out[0..4].copy_from_slice(&len.to_be_bytes());
    out[4..8].copy_from_slice(&MAGIC);
    out[8..10].copy_from_slice(&VERSION.to_be_bytes());
    out[12..20].copy_from_slice(&label.to_be_bytes());
    if let Some(key) = key {
        out[10] = FLAG_MAC;
        let (head, body) = out.split_at(4 + HEADER_LEN);
        let mac = key.mac(&[&head[4..4 + AUTHED_HEADER], body]);
        out[4 + AUTHED_HEADER..4 + HEADER_LEN].copy_from_slice(&mac);
    }
    out
}

/// Checks a frame header (the [`HEADER_LEN`] bytes after the length
/// prefix) against this job's `label` and `auth` (the MAC itself is checked with the
/// body, [`verify`]).
///
/// # Errors
///
/// [`FrameError::Short`], [`FrameError::BadMagic`], [`FrameError::Version`],
/// [`FrameError::ForeignKey`], [`FrameError::MissingMac`] or
/// [`FrameError::UnexpectedMac`].
pub fn check_header(label: u64, auth: Auth<'_>, header: &[u8]) -> Result<(), FrameError> {
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
    if found != label {
        return Err(FrameError::ForeignKey {
            found,
            expected: label,
        });
    }
    let has_mac = header[6] & FLAG_MAC != 0;
    if has_mac && auth.key.is_none() {
        return Err(FrameError::UnexpectedMac);
    }
    if !has_mac && auth.required {
        return Err(FrameError::MissingMac);
    }
    Ok(())
}

/// Checks the MAC of a frame whose header passed [`check_header`]; returns whether the
/// frame was authenticated (`false`: it carries no MAC, which the header check allowed).
///
/// # Errors
///
/// [`FrameError::BadMac`].
pub fn verify(auth: Auth<'_>, header: &[u8], body: &[u8]) -> Result<bool, FrameError> {
    match auth.key {
        Some(key) if header[6] & FLAG_MAC != 0 => {
            if key.verify(
                &[&header[..AUTHED_HEADER], body],
                &header[AUTHED_HEADER..HEADER_LEN],
            ) {
                Ok(true)
            } else {
                Err(FrameError::BadMac)
            }
        }
        _ => Ok(false),
    }
}

/// Decodes the bytes after a frame's length prefix (header and body).
///
/// # Errors
///
/// As [`check_header`] and [`verify`], [`FrameError::TooLong`] above [`MAX_FRAME`], and
/// [`FrameError::Body`] for a body that is not a [`Message`].
pub fn decode(label: u64, auth: Auth<'_>, frame: &[u8]) -> Result<Received, FrameError> {
    if frame.len() > MAX_FRAME {
        return Err(FrameError::TooLong { len: frame.len() });
    }
    check_header(label, auth, frame)?;
    let (header, body) = frame.split_at(HEADER_LEN);
    let authenticated = verify(auth, header, body)?;
    let msg = serde_json::from_slice(body).map_err(|e| FrameError::Body(e.to_string()))?;
    Ok(Received { msg, authenticated })
}

/// Decodes one whole frame from the start of `bytes`, length prefix
/// included; returns the frame and the bytes it took, or `Ok(None)` when
/// `bytes` holds only the start of a frame.
///
/// # Errors
///
/// As [`decode`]; a bad length prefix is refused before the frame is
/// complete.
pub fn decode_prefixed(
    label: u64,
    auth: Auth<'_>,
    bytes: &[u8],
) -> Result<Option<(Received, usize)>, FrameError> {
    let Some(prefix) = bytes.get(..4) else {
        return Ok(None);
    };
    let len = frame_len(prefix)?;
    match bytes.get(4..4 + len) {
        Some(frame) => decode(label, auth, frame).map(|m| Some((m, 4 + len))),
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

/// Reads one frame from `r`. The header is checked before the body is read, the MAC
/// after.
///
/// # Errors
///
/// [`ReadError::Closed`] when `r` ends before the first byte,
/// [`ReadError::Io`] for a read error or an end inside a frame,
/// [`ReadError::Frame`] for a refused frame.
pub fn read_frame(r: &mut impl Read, label: u64, auth: Auth<'_>) -> Result<Received, ReadError> {
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
    check_header(label, auth, &header)?;
    let body_len = len - HEADER_LEN;
    let mut body = Vec::with_capacity(body_len.min(64 << 10));
    r.take(body_len as u64).read_to_end(&mut body)?;
    if body.len() != body_len {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
    }
    let authenticated = verify(auth, &header, &body)?;
    let msg = serde_json::from_slice(&body).map_err(|e| FrameError::Body(e.to_string()))?;
    Ok(Received { msg, authenticated })
}

/// Writes `msg` as one frame (with a MAC under `key` when given).
///
/// # Errors
///
/// The writer's error.
pub fn write_frame(
    w: &mut impl Write,
    label: u64,
    key: Option<&Secret>,
    msg: &Message,
) -> io::Result<()> {
    w.write_all(&encode(label, key, msg))
}
