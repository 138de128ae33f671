//! How coherence messages travel through the message layer.
//!
//! The coherence opcode (`0x01..=0x39`) is the message-layer handler index, so a
//! receiver dispatches on it without decoding, and the 40-bit coherence payload rides
//! where the message kind has room for it:
//!
//! | coherence body                              | message-layer kind | 40-bit payload in       |
//! |---------------------------------------------|--------------------|-------------------------|
//! | none (acks, recalls)                        | Express            | the Express payload     |
//! | a page                                      | Tag-On             | the buffer's 64-bit tag |
//! | bulk (vector times, write notices, diffs)   | bulk               | the first 5 bytes (LE)  |
//!
//! The sender's cluster id is the message's source id: every cluster's destination
//! table maps virtual name *c* to `(site c, protocol queue, source = own id)`, so the
//! receiver's source id names the sending cluster (paper 004 §4.1).
//!
//! The runtime adds a few opcodes of its own above `0xF0` ([`RuntimeOp`]).

use multigrain_coherence::{Attachment, Body, Message, PAGE_SIZE, Parts};
use multigrain_messaging::Handler;

/// Bytes of the payload prefix of a bulk body.
pub(crate) const BULK_PAYLOAD_BYTES: usize = 5;

/// Runtime messages (not part of the coherence protocol).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum RuntimeOp {
    /// Express, no payload: rings the receiver's doorbell so that a sleeping waiter wakes
    /// and re-checks its state (a completion made by another thread, or a stop request).
    Noop = 0xF0,
    /// Express, payload = the sender's configuration fingerprint (40 bits), at start-up.
    Hello = 0xF1,
    /// Bulk: u16 LE failed cluster, then a UTF-8 reason. The sender aborts the job.
    Abort = 0xF2,
    /// Bulk: the sender's [`crate::ClusterStats`] as JSON, at shutdown.
    Stats = 0xF3,
}

impl RuntimeOp {
    pub(crate) fn handler(self) -> Handler {
        Handler(self as u8)
    }

    pub(crate) fn from_handler(h: Handler) -> Option<RuntimeOp> {
        match h.0 {
            0xF0 => Some(RuntimeOp::Noop),
            0xF1 => Some(RuntimeOp::Hello),
            0xF2 => Some(RuntimeOp::Abort),
            0xF3 => Some(RuntimeOp::Stats),
            _ => None,
        }
    }
}

/// A short name for a handler, for statistics ("GetPage", "Diff", ...).
pub fn op_name(handler: u8) -> &'static str {
    match handler {
        0x01 => "HomeQuery",
        0x02 => "HomeIs",
        0x10 => "GetPage",
        0x11 => "PageData",
        0x12 => "Diff",
        0x14 => "DiffAck",
        0x20 => "ScRead",
        0x21 => "ScWrite",
        0x22 => "ScUpgrade",
        0x23 => "ScInvalidate",
        0x24 => "ScInvAck",
        0x25 => "ScRecall",
        0x26 => "ScWriteBack",
        0x30 => "LockAcquire",
        0x31 => "LockGrant",
        0x32 => "LockRelease",
        0x33 => "LockRecall",
        0x38 => "BarrierArrive",
        0x39 => "BarrierDepart",
        0xF0 => "Noop",
        0xF1 => "Hello",
        0xF2 => "Abort",
        0xF3 => "Stats",
        _ => "unknown",
    }
}

/// A bulk body: the payload's low 5 bytes, then `body`.
pub(crate) fn bulk_body(payload: u64, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(BULK_PAYLOAD_BYTES + body.len());
    v.extend_from_slice(&payload.to_le_bytes()[..BULK_PAYLOAD_BYTES]);
    v.extend_from_slice(body);
    v
}

/// Splits a bulk body into payload and coherence body.
pub(crate) fn split_bulk(data: &[u8]) -> Option<(u64, &[u8])> {
    let (head, rest) = data.split_at_checked(BULK_PAYLOAD_BYTES)?;
    let mut p = [0u8; 8];
    p[..BULK_PAYLOAD_BYTES].copy_from_slice(head);
    Some((u64::from_le_bytes(p), rest))
}

/// What a coherence message needs on the wire.
pub(crate) enum Outgoing {
    /// An Express word.
    Express { handler: Handler, payload: u64 },
    /// A Tag-On message carrying the page's current contents.
    Page {
        handler: Handler,
        tag: u64,
        page: u32,
    },
    /// A bulk message.
    Bulk { handler: Handler, data: Vec<u8> },
}

/// The wire form of `msg`.
pub(crate) fn outgoing(msg: &Message) -> Outgoing {
    let Parts {
        opcode,
        payload,
        body,
    } = msg.to_parts();
    let handler = Handler(opcode);
    match body {
        Body::None => Outgoing::Express { handler, payload },
        Body::Attached(Attachment::Page(p)) => Outgoing::Page {
            handler,
            tag: payload,
            page: p.get(),
        },
        Body::Bulk(b) => Outgoing::Bulk {
            handler,
            data: bulk_body(payload, &b),
        },
    }
}

/// Checks that a received Tag-On buffer fits what `msg` says it carries.
pub(crate) fn check_attachment(msg: &Message, data: Option<&[u8]>) -> Result<(), String> {
    match (msg.attachment(), data) {
        (None, None) => Ok(()),
        (Some(Attachment::Page(_)), Some(d)) if d.len() == PAGE_SIZE => Ok(()),
        (Some(a), Some(d)) => Err(format!("{a:?} with a buffer of {} bytes", d.len())),
        (Some(a), None) => Err(format!("{a:?} expected, no buffer attached")),
        (None, Some(d)) => Err(format!(
            "a buffer of {} bytes attached to a message without one",
            d.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use multigrain_coherence::{ClusterId, LockId, PageId, VectorTime};

    #[test]
    fn bulk_payload_round_trips() {
        let body = bulk_body((1 << 40) - 1, b"xyz");
        assert_eq!(body.len(), 8);
        assert_eq!(split_bulk(&body), Some(((1 << 40) - 1, &b"xyz"[..])));
        assert_eq!(split_bulk(&[1, 2]), None);
    }

    #[test]
    fn every_message_kind_maps_to_its_wire_form() {
        let p = PageId::new(77).unwrap();
        let get = Message::GetPage {
            page: p,
            need: VectorTime::from_entries(vec![3]),
        };
        match outgoing(&get) {
            Outgoing::Bulk { handler, data } => {
                assert_eq!(op_name(handler.0), "GetPage");
                let (payload, body) = split_bulk(&data).unwrap();
                assert_eq!(
                    Message::from_parts(handler.0, payload, Some(body)).unwrap(),
                    get
                );
            }
            _ => panic!("GetPage is bulk"),
        }
        let data = Message::PageData {
            page: p,
            writable: true,
            zero: false,
        };
        match outgoing(&data) {
            Outgoing::Page { handler, tag, page } => {
                assert_eq!(page, 77);
                assert_eq!(Message::from_parts(handler.0, tag, None).unwrap(), data);
            }
            _ => panic!("PageData with contents is Tag-On"),
        }
        // the tenure fills the payload's top bits: all 40 must survive the bulk prefix
        let grant = Message::LockGrant {
            lock: LockId::new(9).unwrap(),
            time: VectorTime::from_entries(vec![1, 2]),
            records: vec![],
            diffs: vec![],
            stored: 7,
            tenure: (1 << 20) - 1,
            contended: true,
        };
        match outgoing(&grant) {
            Outgoing::Bulk { handler, data } => {
                let (payload, body) = split_bulk(&data).unwrap();
                assert_eq!(
                    Message::from_parts(handler.0, payload, Some(body)).unwrap(),
                    grant
                );
            }
            _ => panic!("LockGrant is bulk"),
        }
        let recall = Message::LockRecall {
            lock: LockId::new((1 << 20) - 1).unwrap(),
            tenure: (1 << 20) - 1,
        };
        match outgoing(&recall) {
            Outgoing::Express { handler, payload } => {
                assert_eq!(op_name(handler.0), "LockRecall");
                assert_eq!(
                    Message::from_parts(handler.0, payload, None).unwrap(),
                    recall
                );
            }
            _ => panic!("LockRecall is Express"),
        }
        let _ = ClusterId::new(0);
        for op in [
            RuntimeOp::Noop,
            RuntimeOp::Hello,
            RuntimeOp::Abort,
            RuntimeOp::Stats,
        ] {
            assert_eq!(RuntimeOp::from_handler(op.handler()), Some(op));
            assert!(Message::from_parts(op as u8, 0, None).is_err());
        }
    }
}
