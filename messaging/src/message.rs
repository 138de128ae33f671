//! What a receiver gets, and the errors a sender gets back.

use crate::basic::{BasicMsg, BasicTooLong};
use crate::names::{Destination, VirtualName};
use crate::pool::{PoolExhausted, TagOnData};
use crate::word::{ExpressMsg, Handler, SourceId};

/// A received Tag-On message: the header fields plus the attached buffer, released to its
/// pool when the last reference drops (paper 004 §5.2).
#[derive(Debug)]
pub struct TagOnMsg {
    /// Handler index.
    pub handler: Handler,
    /// Who sent it (a name in the receiver's table).
    pub source: SourceId,
    /// The attached data; its [`tag`](TagOnData::tag) carries the sender's 64-bit tag.
    pub data: TagOnData,
}

/// A received bulk message, reassembled.
#[derive(Debug)]
pub struct BulkMsg {
    /// Handler index.
    pub handler: Handler,
    /// Who sent it (a name in the receiver's table).
    pub source: SourceId,
    /// The whole payload.
    pub data: Vec<u8>,
}

/// Any received message.
#[derive(Debug)]
pub enum Message {
    /// One word.
    Express(ExpressMsg),
    /// Header plus a pool buffer.
    TagOn(TagOnMsg),
    /// Up to 256 bytes, copied out of a Basic ring (boxed so that the common Express and
    /// Tag-On messages stay small to move around).
    Basic(Box<BasicMsg>),
    /// A reassembled bulk payload.
    Bulk(BulkMsg),
}

impl Message {
    /// The handler index.
    pub fn handler(&self) -> Handler {
        match self {
            Message::Express(m) => m.handler,
            Message::TagOn(m) => m.handler,
            Message::Basic(m) => m.handler,
            Message::Bulk(m) => m.handler,
        }
    }

    /// The source id (the receiver's name for the sender; reply through it).
    pub fn source(&self) -> SourceId {
        match self {
            Message::Express(m) => m.source,
            Message::TagOn(m) => m.source,
            Message::Basic(m) => m.source,
            Message::Bulk(m) => m.source,
        }
    }

    /// The kind, as a short name (for logs and statistics).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Message::Express(_) => "express",
            Message::TagOn(_) => "tag-on",
            Message::Basic(_) => "basic",
            Message::Bulk(_) => "bulk",
        }
    }
}

/// Why a send failed. Every variant hands the message back: nothing is dropped silently
/// (style.md practice 4, after crossbeam's `TrySendError`).
#[derive(Debug, thiserror::Error)]
pub enum SendError<M> {
    /// The destination's receive queue is full; try again (after polling your own queues).
    #[error("the destination's receive queue is full")]
    Full(M),
    /// The name is not in this endpoint's destination table.
    #[error("{0} is not in this endpoint's destination table")]
    UnknownDestination(VirtualName, M),
    /// The table entry leads to a site or queue this site has no route to.
    #[error("no route to queue {} at site {} (is the peer attached?)", .0.queue.0, .0.site.0)]
    Unreachable(Destination, M),
    /// A blocking send gave up after its timeout.
    #[error("the send timed out with the receive queue still full")]
    Timeout(M),
}

impl<M> SendError<M> {
    /// The message that was not sent.
    pub fn into_inner(self) -> M {
        match self {
            SendError::Full(m)
            | SendError::UnknownDestination(_, m)
            | SendError::Unreachable(_, m)
            | SendError::Timeout(m) => m,
        }
    }

    /// True for [`SendError::Full`].
    pub fn is_full(&self) -> bool {
        matches!(self, SendError::Full(_))
    }

    /// The same error carrying another message value.
    pub fn map<N>(self, f: impl FnOnce(M) -> N) -> SendError<N> {
        match self {
            SendError::Full(m) => SendError::Full(f(m)),
            SendError::UnknownDestination(n, m) => SendError::UnknownDestination(n, f(m)),
            SendError::Unreachable(d, m) => SendError::Unreachable(d, f(m)),
            SendError::Timeout(m) => SendError::Timeout(f(m)),
        }
    }
}

/// Why a Basic send failed.
#[derive(Debug, thiserror::Error)]
pub enum BasicSendError {
    /// The payload exceeds the Basic limit.
    #[error(transparent)]
    TooLong(#[from] BasicTooLong),
    /// Routing or queue failure (the payload is still the caller's).
    #[error(transparent)]
    Send(#[from] SendError<()>),
}

/// Why a bulk send failed (fragments already sent are reassembled or discarded by the
/// receiver; the caller still holds the payload).
#[derive(Debug, thiserror::Error)]
pub enum BulkSendError {
    /// The payload exceeds the site's `max_bulk`.
    #[error("bulk message of {len} bytes exceeds the limit of {max} bytes")]
    TooLong {
        /// Payload length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// Routing or queue failure.
    #[error(transparent)]
    Send(#[from] SendError<()>),
    /// The pool stayed exhausted until the timeout.
    #[error(transparent)]
    Pool(#[from] PoolExhausted),
}
