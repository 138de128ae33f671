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
//!
//! # Bundles
//!
//! Every bulk coherence message travels in a [`RuntimeOp::Bundle`]: the bulk messages
//! that one event sends to the same cluster go together, as one message-layer bulk
//! message (each bulk send costs fragment headers and a doorbell wake-up of the
//! receiver) — to a cluster reached through the network, those that all the messages of
//! one received bundle send (a datagram each saved; see `Core::handle_events`). Its body
//! is a sequence number, then at least one part:
//!
//! ```text
//! [seq u32 LE] then per part
//! [handler u8][len u32 LE][len bytes: the bulk body —
//!                          the 5-byte payload prefix, then the coherence body]
//! ```
//!
//! and the receiver handles the parts in order, each as if it had arrived alone from
//! the bundle's sender. Parts are bulk coherence messages, and Express coherence
//! messages that follow bulk ones of the same event to the same cluster (a recall
//! after a grant, an acknowledgement after a diff): such a part is the 5-byte payload
//! alone, and the bundle, which would have left right before it, leaves with it as its
//! last part — one message-layer message (one datagram through INIs) instead of two.
//! No runtime message, no nested bundle, no unknown opcode, and no body on a part of a
//! kind that has none. The sender ([`Bundle`]) stops adding to a bundle at
//! [`MAX_BUNDLE_BYTES`] (a longer message goes alone, in a bundle of its own). A bundle
//! longer than the message layer's bulk limit goes in pieces, one number each
//! ([`crate::pieces`]).
//!
//! **Sequence numbers.** A cluster numbers its bundles to each destination 0, 1, 2, …
//! (wrapping), and the receiver handles them in that order, whichever of its threads
//! received them: a thread holding a bundle that is not the next one leaves it for the
//! thread handling its predecessor. Threads of a cluster receive from its protocol queue
//! concurrently and then race for the coherence machine, so without the numbers a
//! later bundle could be handled first — and the machine's calling contract (point 5)
//! needs the messages of one event to one cluster handled in the order emitted, which
//! spans several bundles when the event's messages exceed [`MAX_BUNDLE_BYTES`] or an
//! Express message to the same cluster comes between them. (Water 4096 × 3 on 8 × 2
//! clusters, 16 cores, failed about once in 18 runs with "interval record … leaves a
//! gap": a lock release whose records an earlier release of the same batch carried was
//! handled first.)

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
    /// Bulk: several bulk coherence messages to the same cluster, in order (see
    /// [Bundles](self#bundles)): a sequence of parts `[handler u8][len u32 LE][len
    /// bytes of bulk body]`.
    Bundle = 0xF4,
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
            0xF4 => Some(RuntimeOp::Bundle),
            _ => None,
        }
    }
}

/// A short name for a handler, for statistics ("GetPage", "Diff", ...; "unknown" for a
/// handler neither the coherence protocol nor the runtime defines).
pub fn op_name(handler: u8) -> &'static str {
    known_op_name(handler).unwrap_or("unknown")
}

/// The name of a handler the coherence protocol or the runtime defines; `None` for any
/// other.
pub(crate) fn known_op_name(handler: u8) -> Option<&'static str> {
    Some(match handler {
        0x01 => "HomeQuery",
        0x02 => "HomeIs",
        0x10 => "GetPage",
        0x11 => "PageData",
        0x12 => "Diff",
        0x13 => "Update",
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
        0xF4 => "Bundle",
        _ => return None,
    })
}

/// A bulk body: the payload's low 5 bytes, then `body`.
#[cfg(test)]
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

/// Largest bundle body the sender builds: a bulk message that would take a bundle past
/// it goes into the next one (a message longer than this is sent alone). 32 KiB keeps a
/// bundle's fragments well within the buffer pool and its latency near one send, while
/// a batch of lock releases or grants (a few hundred bytes each) still fits.
pub(crate) const MAX_BUNDLE_BYTES: usize = 32 * 1024;

/// Bytes of a bundle part's header: the handler (u8), then the length (u32 LE).
pub(crate) const BUNDLE_PART_HEADER: usize = 5;

/// Bytes of a bundle's header: its sequence number (u32 LE).
pub(crate) const BUNDLE_HEADER: usize = 4;

/// Bulk coherence messages to one destination, encoded as a Bundle body as they are
/// added (see [Bundles](self#bundles)), and the sequence number of the next bundle to
/// that destination.
#[derive(Debug, Default)]
pub(crate) struct Bundle {
    /// The bundle header, then the encoded parts; empty while no part is held.
    buf: Vec<u8>,
    /// Each part's handler and bulk-body length, in order.
    parts: Vec<(Handler, usize)>,
    /// Sequence number of the next bundle sealed.
    next_seq: u32,
}

impl Bundle {
    /// The messages held: handler and bulk-body length of each, in order.
    pub(crate) fn parts(&self) -> &[(Handler, usize)] {
        &self.parts
    }

    /// Makes room for the bundle header before the first part.
    fn start(&mut self) {
        if self.buf.is_empty() {
            self.buf.extend_from_slice(&[0; BUNDLE_HEADER]);
        }
    }

    /// Appends the bulk message `handler`, `data` (a bulk body as [`bulk_body`] makes
    /// it), unless that would take the encoded bundle past [`MAX_BUNDLE_BYTES`]; returns
    /// whether it was added.
    #[cfg(test)]
    pub(crate) fn try_push(&mut self, handler: Handler, data: &[u8]) -> bool {
        let fits = self
            .buf
            .len()
            .max(BUNDLE_HEADER)
            .checked_add(BUNDLE_PART_HEADER)
            .and_then(|n| n.checked_add(data.len()))
            .is_some_and(|n| n <= MAX_BUNDLE_BYTES);
        let Some(len) = u32::try_from(data.len()).ok().filter(|_| fits) else {
            return false;
        };
        self.start();
        self.buf.push(handler.0);
        self.buf.extend_from_slice(&len.to_le_bytes());
        self.buf.extend_from_slice(data);
        self.parts.push((handler, data.len()));
        true
    }

    /// Encodes the bulk message `msg` straight into the bundle (no intermediate body
    /// or bulk-body copy): [`Push::NotBulk`] for an Express or Tag-On message (nothing
    /// added); [`Push::Full`] when it would take the bundle past
    /// [`MAX_BUNDLE_BYTES`] (the bundle is as before; the message is handed back
    /// encoded, to go after the bundle is sent).
    pub(crate) fn push_message(&mut self, msg: &Message) -> Push {
        let fresh = self.buf.is_empty();
        self.start();
        let start = self.buf.len();
        self.buf
            .extend_from_slice(&[0; BUNDLE_PART_HEADER + BULK_PAYLOAD_BYTES]);
        let Some((opcode, payload)) = msg.encode_bulk_into(&mut self.buf) else {
            self.buf.truncate(if fresh { 0 } else { start });
            return Push::NotBulk;
        };
        let len = self.buf.len() - start - BUNDLE_PART_HEADER;
        let handler = Handler(opcode);
        let head = &mut self.buf[start..start + BUNDLE_PART_HEADER + BULK_PAYLOAD_BYTES];
        head[0] = opcode;
        // A bulk body is at most a bulk message long (far below 4 GiB).
        head[1..BUNDLE_PART_HEADER].copy_from_slice(&(len as u32).to_le_bytes());
        head[BUNDLE_PART_HEADER..].copy_from_slice(&payload.to_le_bytes()[..BULK_PAYLOAD_BYTES]);
        if self.buf.len() > MAX_BUNDLE_BYTES && !fresh {
            let encoded = self.buf.split_off(start);
            return Push::Full(Part { handler, encoded });
        }
        self.parts.push((handler, len));
        Push::Added
    }

    /// Appends the Express coherence message `handler`, `payload` as a part of its own:
    /// its 5-byte payload prefix and no body. Only to a bundle that holds parts already
    /// (an Express message that follows bulk messages of the same event to the same
    /// cluster, which the bundle then carries with them instead of a message-layer
    /// message of its own); past [`MAX_BUNDLE_BYTES`] by at most its 10 bytes.
    pub(crate) fn push_express(&mut self, handler: Handler, payload: u64) {
        debug_assert!(!self.parts.is_empty(), "an Express part follows bulk parts");
        self.start();
        self.buf.push(handler.0);
        self.buf
            .extend_from_slice(&(BULK_PAYLOAD_BYTES as u32).to_le_bytes());
        self.buf
            .extend_from_slice(&payload.to_le_bytes()[..BULK_PAYLOAD_BYTES]);
        self.parts.push((handler, BULK_PAYLOAD_BYTES));
    }

    /// Appends a part that [`Bundle::push_message`] handed back, even past
    /// [`MAX_BUNDLE_BYTES`] (call it on an empty bundle: a part over the bound then
    /// travels alone, since the next push finds the bundle full).
    pub(crate) fn push_part(&mut self, part: Part) {
        self.start();
        self.parts.push((part.handler, part.bulk_body().len()));
        self.buf.extend_from_slice(&part.encoded);
    }

    /// Numbers the bundle held (the next sequence number to its destination) and
    /// returns the [`RuntimeOp::Bundle`] body to send; `None` when empty (nothing is
    /// numbered). The caller sends it before sealing another bundle to the same
    /// destination, then [`Bundle::clear`]s it.
    pub(crate) fn seal(&mut self) -> Option<&[u8]> {
        if self.parts.is_empty() {
            return None;
        }
        self.buf[..BUNDLE_HEADER].copy_from_slice(&self.next_seq.to_le_bytes());
        self.next_seq = self.next_seq.wrapping_add(1);
        Some(&self.buf)
    }

    /// Numbers the bundle held in pieces of at most `max` bytes each (see
    /// [`crate::pieces`]) and hands each piece's body to `send`, in the order to send
    /// them, one sequence number each (nothing when the bundle is empty). The caller
    /// then [`Bundle::clear`]s it.
    ///
    /// # Errors
    /// The first error `send` returns (the pieces after it are not built).
    ///
    /// # Panics
    /// If the bundle's parts are longer than [`crate::pieces::MAX_MESSAGE_BYTES`] or
    /// `max` leaves no room after a piece's headers (the caller checks).
    pub(crate) fn seal_pieces<E>(
        &mut self,
        max: usize,
        send: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        if self.parts.is_empty() {
            return Ok(());
        }
        crate::pieces::send_split(&self.buf[BUNDLE_HEADER..], max, &mut self.next_seq, send)
    }

    /// The bundle's body as it stands, the bytes [`Bundle::seal`] returns (empty while
    /// no part is held; its header is numbered only by the seal).
    pub(crate) fn body(&self) -> &[u8] {
        &self.buf
    }

    /// Empties the bundle, keeping its buffers (and its sequence number) for reuse.
    pub(crate) fn clear(&mut self) {
        self.buf.clear();
        self.parts.clear();
    }
}

/// What [`Bundle::push_message`] did with a message.
#[derive(Debug)]
pub(crate) enum Push {
    /// Added to the bundle.
    Added,
    /// An Express or Tag-On message: not added.
    NotBulk,
    /// Too long for what the bundle holds: not added; here it is, encoded.
    Full(Part),
}

/// A bulk message encoded as a bundle part: part header, then its bulk body.
#[derive(Debug)]
pub(crate) struct Part {
    /// Its bulk coherence opcode.
    pub(crate) handler: Handler,
    encoded: Vec<u8>,
}

impl Part {
    /// The bulk body (payload prefix and coherence body).
    pub(crate) fn bulk_body(&self) -> &[u8] {
        &self.encoded[BUNDLE_PART_HEADER..]
    }
}

/// One message of a received bundle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BundlePart<'a> {
    /// A bulk coherence opcode.
    pub(crate) handler: Handler,
    /// The 40-bit payload from the bulk body's prefix.
    pub(crate) payload: u64,
    /// The coherence body (after the payload prefix).
    pub(crate) body: &'a [u8],
}

/// The sequence number of a received Bundle body; `None` if it is shorter than its
/// header.
pub(crate) fn bundle_seq(data: &[u8]) -> Option<u32> {
    data.first_chunk::<BUNDLE_HEADER>()
        .map(|h| u32::from_le_bytes(*h))
}

/// Splits a received Bundle body into its messages (after its sequence number, see
/// [`bundle_seq`]). Rejects, with the reason, a truncated sequence number, an empty
/// bundle, a truncated header or part, a part shorter than its payload prefix, a part
/// whose handler is not a coherence opcode (a runtime message, a nested bundle, an
/// unknown one), and a part of a coherence kind without a bulk body (Express, Tag-On)
/// that holds more than its payload. Whether such a message may travel without its
/// Tag-On buffer is checked when it is decoded (a page reply may not).
pub(crate) fn decode_bundle(data: &[u8]) -> Result<Vec<BundlePart<'_>>, String> {
    let Some((_, data)) = data.split_first_chunk::<BUNDLE_HEADER>() else {
        return Err(format!(
            "truncated sequence number ({} of {BUNDLE_HEADER} bytes)",
            data.len()
        ));
    };
    if data.is_empty() {
        return Err("empty bundle".into());
    }
    let mut parts = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let i = parts.len();
        let Some((head, tail)) = rest.split_first_chunk::<BUNDLE_PART_HEADER>() else {
            return Err(format!(
                "part {i}: truncated header ({} of {BUNDLE_PART_HEADER} bytes)",
                rest.len()
            ));
        };
        let [h, l0, l1, l2, l3] = *head;
        let name = op_name(h);
        if h == RuntimeOp::Bundle as u8 {
            return Err(format!("part {i}: a Bundle inside a bundle"));
        }
        if RuntimeOp::from_handler(Handler(h)).is_some() {
            return Err(format!(
                "part {i}: runtime message {name} (0x{h:02x}) inside a bundle"
            ));
        }
        let bulk = Message::opcode_has_bulk_body(h);
        if !bulk && known_op_name(h).is_none() {
            return Err(format!(
                "part {i}: handler 0x{h:02x} is not a coherence message"
            ));
        }
        let len = u32::from_le_bytes([l0, l1, l2, l3]);
        if !bulk && len as usize != BULK_PAYLOAD_BYTES {
            return Err(format!(
                "part {i}: {name} (0x{h:02x}) is not a bulk coherence message, so its part is its {BULK_PAYLOAD_BYTES}-byte payload alone, not {len} bytes"
            ));
        }
        let Some((part, tail)) = usize::try_from(len)
            .ok()
            .and_then(|n| tail.split_at_checked(n))
        else {
            return Err(format!(
                "part {i} ({name}): length {len} exceeds the {} bytes left",
                tail.len()
            ));
        };
        let (payload, body) = split_bulk(part).ok_or_else(|| {
            format!(
                "part {i} ({name}): {len} bytes, shorter than the {BULK_PAYLOAD_BYTES}-byte payload prefix"
            )
        })?;
        parts.push(BundlePart {
            handler: Handler(h),
            payload,
            body,
        });
        rest = tail;
    }
    Ok(parts)
}

/// What an Express or Tag-On coherence message needs on the wire (bulk messages
/// travel in bundles: [`Bundle::push_message`]).
pub(crate) enum Outgoing {
    /// An Express word.
    Express { handler: Handler, payload: u64 },
    /// A Tag-On message carrying the page's current contents.
    Page {
        handler: Handler,
        tag: u64,
        page: u32,
    },
}

/// The wire form of `msg`; `None` for a bulk message.
pub(crate) fn outgoing(msg: &Message) -> Option<Outgoing> {
    let Parts {
        opcode,
        payload,
        body,
    } = msg.to_parts();
    let handler = Handler(opcode);
    match body {
        Body::None => Some(Outgoing::Express { handler, payload }),
        Body::Attached(Attachment::Page(p)) => Some(Outgoing::Page {
            handler,
            tag: payload,
            page: p.get(),
        }),
        Body::Bulk(_) => None,
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

    /// A grant whose tenure fills the payload's top bits.
    fn grant_with_full_tenure() -> Message {
        Message::LockGrant {
            lock: LockId::new(9).unwrap(),
            time: VectorTime::from_entries(vec![1, 2]),
            records: vec![],
            diffs: vec![],
            stored: 7,
            tenure: (1 << 20) - 1,
            contended: true,
        }
    }

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
        assert!(outgoing(&get).is_none(), "GetPage is bulk");
        let (handler, data) = bulk_of(&get);
        assert_eq!(op_name(handler.0), "GetPage");
        let (payload, body) = split_bulk(&data).unwrap();
        assert_eq!(
            Message::from_parts(handler.0, payload, Some(body)).unwrap(),
            get
        );
        let data = Message::PageData {
            page: p,
            writable: true,
            zero: false,
        };
        match outgoing(&data) {
            Some(Outgoing::Page { handler, tag, page }) => {
                assert_eq!(page, 77);
                assert_eq!(Message::from_parts(handler.0, tag, None).unwrap(), data);
            }
            _ => panic!("PageData with contents is Tag-On"),
        }
        // the tenure fills the payload's top bits: all 40 must survive the bulk prefix
        let grant = grant_with_full_tenure();
        assert!(outgoing(&grant).is_none(), "LockGrant is bulk");
        let (handler, data) = bulk_of(&grant);
        let (payload, body) = split_bulk(&data).unwrap();
        assert_eq!(
            Message::from_parts(handler.0, payload, Some(body)).unwrap(),
            grant
        );
        let recall = Message::LockRecall {
            lock: LockId::new((1 << 20) - 1).unwrap(),
            tenure: (1 << 20) - 1,
        };
        match outgoing(&recall) {
            Some(Outgoing::Express { handler, payload }) => {
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
            RuntimeOp::Bundle,
        ] {
            assert_eq!(RuntimeOp::from_handler(op.handler()), Some(op));
            assert!(known_op_name(op as u8).is_some());
            assert!(Message::from_parts(op as u8, 0, None).is_err());
        }
        assert_eq!(op_name(0xF4), "Bundle");
    }

    // ----- bundles -----------------------------------------------------------------

    const DIFF: u8 = 0x12;
    const LOCK_GRANT: u8 = 0x31;
    const LOCK_RELEASE: u8 = 0x32;

    /// A bundle body (sequence number 0) from raw parts (handler, bulk body), without
    /// any check.
    fn raw(parts: &[(u8, &[u8])]) -> Vec<u8> {
        let mut v = vec![0; BUNDLE_HEADER];
        for (h, d) in parts {
            v.push(*h);
            v.extend_from_slice(&(d.len() as u32).to_le_bytes());
            v.extend_from_slice(d);
        }
        v
    }

    fn rejected(data: &[u8], what: &str) {
        match decode_bundle(data) {
            Err(reason) => assert!(reason.contains(what), "{reason:?} lacks {what:?}"),
            Ok(p) => panic!("accepted {p:?}"),
        }
    }

    #[test]
    fn a_bundle_round_trips_its_messages_in_order() {
        let msgs = [
            (LOCK_RELEASE, bulk_body(7, b"first")),
            (LOCK_GRANT, bulk_body((1 << 40) - 1, b"")),
            (DIFF, bulk_body(3, &[9; 100])),
        ];
        let mut b = Bundle::default();
        assert!(b.seal().is_none());
        for (h, d) in &msgs {
            assert!(b.try_push(Handler(*h), d));
        }
        assert_eq!(b.parts().len(), 3);
        assert_eq!(b.parts()[2], (Handler(DIFF), 105));
        let data = b.seal().unwrap();
        assert_eq!(bundle_seq(data), Some(0));
        let raw_parts: Vec<(u8, &[u8])> = msgs.iter().map(|(h, d)| (*h, &d[..])).collect();
        assert_eq!(data, raw(&raw_parts));
        let parts = decode_bundle(data).unwrap();
        assert_eq!(parts.len(), 3);
        for (p, (h, d)) in parts.iter().zip(&msgs) {
            assert_eq!(p.handler, Handler(*h));
            assert_eq!(Some((p.payload, p.body)), split_bulk(d));
        }
        b.clear();
        assert!(b.parts().is_empty() && b.seal().is_none());
    }

    /// Messages encoded straight into a bundle decode to themselves, in order; an
    /// Express message is refused; a message past the size bound comes back encoded
    /// as the same bulk body, the bundle unchanged.
    #[test]
    fn messages_pushed_into_a_bundle_decode_to_themselves() {
        let p = PageId::new(77).unwrap();
        let get = Message::GetPage {
            page: p,
            need: VectorTime::from_entries(vec![3]),
        };
        let grant = grant_with_full_tenure();
        let recall = Message::LockRecall {
            lock: LockId::new(9).unwrap(),
            tenure: 3,
        };
        let mut b = Bundle::default();
        assert!(matches!(b.push_message(&get), Push::Added));
        assert!(matches!(b.push_message(&recall), Push::NotBulk));
        assert!(matches!(b.push_message(&grant), Push::Added));
        let data = b.seal().unwrap().to_vec();
        let parts = decode_bundle(&data).unwrap();
        let back: Vec<Message> = parts
            .iter()
            .map(|p| Message::from_parts(p.handler.0, p.payload, Some(p.body)).unwrap())
            .collect();
        assert_eq!(back, vec![get.clone(), grant]);
        // Fill the bundle to its bound, then one more message: handed back whole.
        let before = data[BUNDLE_HEADER..].to_vec();
        let update = Message::Update {
            diff: multigrain_coherence::IntervalDiff {
                page: p,
                owner: ClusterId::new(1).unwrap(),
                index: 4,
                base: VectorTime::new(),
                data: multigrain_coherence::DiffBytes::new(vec![5; MAX_BUNDLE_BYTES - 64]),
            },
        };
        match b.push_message(&update) {
            Push::Full(part) => {
                assert_eq!(&b.seal().unwrap()[BUNDLE_HEADER..], &before[..]);
                assert_eq!(part.bulk_body(), &outgoing_bulk(&update)[..]);
                // It goes into the next bundle.
                b.clear();
                b.push_part(part);
                let alone = b.seal().unwrap();
                let parts = decode_bundle(alone).unwrap();
                assert_eq!(parts.len(), 1);
                let p = parts[0];
                let whole = outgoing_bulk(&update);
                assert_eq!(Some((p.payload, p.body)), split_bulk(&whole));
            }
            other => panic!("{other:?}"),
        }
        // A message over the bound is taken by an empty bundle, and fills it.
        let Message::Update { mut diff } = update else {
            unreachable!()
        };
        diff.data = multigrain_coherence::DiffBytes::new(vec![5; MAX_BUNDLE_BYTES + 100]);
        b.clear();
        assert!(matches!(
            b.push_message(&Message::Update { diff }),
            Push::Added
        ));
        assert!(matches!(b.push_message(&get), Push::Full(_)));
    }

    fn outgoing_bulk(m: &Message) -> Vec<u8> {
        bulk_of(m).1
    }

    /// The handler and bulk body (payload prefix, then body) of a bulk message, as a
    /// bundle part carries them.
    fn bulk_of(m: &Message) -> (Handler, Vec<u8>) {
        let Parts {
            opcode,
            payload,
            body: Body::Bulk(b),
        } = m.to_parts()
        else {
            panic!("not bulk: {m:?}")
        };
        (Handler(opcode), bulk_body(payload, &b))
    }

    /// Bundles to a destination are numbered 0, 1, 2, … as they are sealed (a bundle
    /// of one message too), and the numbers wrap.
    #[test]
    fn bundles_are_numbered_in_sending_order() {
        let d = bulk_body(5, b"body");
        let mut b = Bundle::default();
        for seq in 0..3u32 {
            assert!(b.try_push(Handler(LOCK_RELEASE), &d));
            let data = b.seal().unwrap();
            assert_eq!(bundle_seq(data), Some(seq));
            assert_eq!(data, raw_seq(seq, &[(LOCK_RELEASE, &d)]));
            b.clear();
        }
        // Clearing keeps the number; an empty bundle takes none.
        assert!(b.seal().is_none());
        b.next_seq = u32::MAX;
        assert!(b.try_push(Handler(LOCK_RELEASE), &d));
        assert_eq!(bundle_seq(b.seal().unwrap()), Some(u32::MAX));
        b.clear();
        assert!(b.try_push(Handler(LOCK_RELEASE), &d));
        assert_eq!(bundle_seq(b.seal().unwrap()), Some(0));
    }

    /// A bundle sealed in pieces takes one number per piece, and its pieces put back
    /// together decode to the messages it holds; the bundle after it takes the next
    /// number. A piece is never read as a bundle of parts.
    #[test]
    fn a_bundle_sealed_in_pieces_numbers_them_and_decodes_whole() {
        let d = bulk_body(5, &[9; 100]);
        let mut b = Bundle {
            next_seq: 7,
            ..Bundle::default()
        };
        for _ in 0..3 {
            assert!(b.try_push(Handler(LOCK_RELEASE), &d));
        }
        let whole = raw(&[(LOCK_RELEASE, &d), (LOCK_RELEASE, &d), (LOCK_RELEASE, &d)]);
        let mut pieces = Vec::new();
        b.seal_pieces(100, |p| {
            pieces.push(p.to_vec());
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(
            pieces.len(),
            (whole.len() - BUNDLE_HEADER).div_ceil(100 - 13)
        );
        let mut a = crate::pieces::Assembly::default();
        let mut out = None;
        for (i, p) in pieces.into_iter().enumerate() {
            assert_eq!(bundle_seq(&p), Some(7 + i as u32));
            assert!(
                decode_bundle(&p).unwrap_err().contains("0x00"),
                "a piece is no bundle"
            );
            out = a.take(p).unwrap();
        }
        let out = out.expect("whole after the last piece");
        assert_eq!(out, whole);
        assert_eq!(decode_bundle(&out).unwrap().len(), 3);
        b.clear();
        let mut handed = 0;
        b.seal_pieces(100, |_| {
            handed += 1;
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(handed, 0, "an empty bundle takes no number");
        assert!(b.try_push(Handler(LOCK_RELEASE), &d));
        assert_eq!(bundle_seq(b.seal().unwrap()), Some(11));
    }

    fn raw_seq(seq: u32, parts: &[(u8, &[u8])]) -> Vec<u8> {
        let mut v = raw(parts);
        v[..BUNDLE_HEADER].copy_from_slice(&seq.to_le_bytes());
        v
    }

    #[test]
    fn bundles_stop_at_the_size_bound() {
        let mut b = Bundle::default();
        // A message too long for any bundle is refused even by an empty one.
        let long = vec![0; MAX_BUNDLE_BYTES - BUNDLE_HEADER - BUNDLE_PART_HEADER + 1];
        assert!(!b.try_push(Handler(DIFF), &long));
        assert!(b.parts().is_empty() && b.seal().is_none());
        let exact = vec![0; MAX_BUNDLE_BYTES - BUNDLE_HEADER - BUNDLE_PART_HEADER];
        assert!(b.try_push(Handler(DIFF), &exact));
        assert!(!b.try_push(Handler(DIFF), &bulk_body(0, b"")));
        b.clear();
        let half = vec![0; (MAX_BUNDLE_BYTES - BUNDLE_HEADER) / 2 - BUNDLE_PART_HEADER];
        assert!(b.try_push(Handler(DIFF), &half));
        assert!(b.try_push(Handler(DIFF), &half));
        assert_eq!(b.seal().unwrap().len(), MAX_BUNDLE_BYTES);
        assert!(!b.try_push(Handler(DIFF), &[0; 5]));
    }

    #[test]
    fn malformed_bundles_are_rejected_with_a_reason() {
        let ok = bulk_body(1, b"ok");
        rejected(&[], "truncated sequence number (0 of 4 bytes)");
        rejected(&[7, 0, 0], "truncated sequence number (3 of 4 bytes)");
        rejected(&[7, 0, 0, 0], "empty bundle");
        // truncated header
        rejected(
            &[0, 0, 0, 0, LOCK_RELEASE, 1, 0],
            "part 0: truncated header",
        );
        let mut two = raw(&[(LOCK_RELEASE, &ok)]);
        two.push(LOCK_GRANT);
        rejected(&two, "part 1: truncated header");
        // truncated part / length beyond the body
        let mut cut = raw(&[(LOCK_RELEASE, &ok)]);
        cut.pop();
        rejected(
            &cut,
            "part 0 (LockRelease): length 7 exceeds the 6 bytes left",
        );
        let mut huge = vec![0, 0, 0, 0, DIFF];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&ok);
        rejected(&huge, "length 4294967295 exceeds");
        // a part shorter than the payload prefix
        rejected(
            &raw(&[(DIFF, &[1, 2, 3, 4])]),
            "shorter than the 5-byte payload",
        );
        // an Express coherence opcode with a body, an unknown opcode
        rejected(
            &raw(&[(LOCK_RELEASE, &ok), (0x33, &ok)]),
            "part 1: LockRecall (0x33) is not a bulk coherence message, so its part is its 5-byte payload alone, not 7 bytes",
        );
        rejected(
            &raw(&[(0x11, &ok)]),
            "PageData (0x11) is not a bulk coherence message",
        );
        rejected(
            &raw(&[(0x77, &bulk_body(0, b""))]),
            "part 0: handler 0x77 is not a coherence message",
        );
        // nested bundle, runtime messages
        let inner = raw(&[(LOCK_RELEASE, &ok), (LOCK_GRANT, &ok)])[BUNDLE_HEADER..].to_vec();
        rejected(
            &raw(&[(LOCK_RELEASE, &ok), (0xF4, &inner)]),
            "part 1: a Bundle inside a bundle",
        );
        rejected(&raw(&[(0xF3, &ok)]), "runtime message Stats (0xf3) inside");
        rejected(&raw(&[(0xF2, &ok)]), "runtime message Abort (0xf2) inside");
        rejected(&raw(&[(0xF0, &ok)]), "runtime message Noop (0xf0) inside");
    }

    /// A part is a bulk coherence message, or a coherence message of another kind as
    /// its payload alone (an Express message carried by the bundle); never a runtime
    /// message or an unknown opcode.
    #[test]
    fn parts_are_coherence_messages_and_only_bulk_ones_have_a_body() {
        let bare = bulk_body(0, b"");
        let with_body = bulk_body(0, b"x");
        for h in 0..=u8::MAX {
            let coherence =
                known_op_name(h).is_some() && RuntimeOp::from_handler(Handler(h)).is_none();
            let bulk = Message::opcode_has_bulk_body(h);
            assert!(!bulk || coherence, "0x{h:02x}");
            assert_eq!(
                decode_bundle(&raw(&[(h, &bare)])).is_ok(),
                coherence,
                "0x{h:02x}"
            );
            assert_eq!(
                decode_bundle(&raw(&[(h, &with_body)])).is_ok(),
                bulk,
                "0x{h:02x}"
            );
        }
    }

    /// A page reply has no bulk body, so a bundle may hold it as a bare part, but it
    /// travels with its page as a Tag-On buffer: decoded from a part it lacks that
    /// buffer, and the runtime's check of the attachment rejects it (as it rejects a
    /// Tag-On message without its buffer).
    #[test]
    fn a_page_reply_without_its_page_fails_the_attachment_check() {
        let data = Message::PageData {
            page: PageId::new(77).unwrap(),
            writable: false,
            zero: false,
        };
        let Some(Outgoing::Page { handler, tag, .. }) = outgoing(&data) else {
            panic!("a page reply with contents is Tag-On");
        };
        let body = raw(&[
            (LOCK_RELEASE, &bulk_body(1, b"ok")),
            (handler.0, &bulk_body(tag, b"")),
        ]);
        let parts = decode_bundle(&body).unwrap();
        let msg = Message::from_parts(parts[1].handler.0, parts[1].payload, None).unwrap();
        assert_eq!(msg, data);
        assert!(
            check_attachment(&msg, None)
                .unwrap_err()
                .contains("no buffer attached")
        );
        // Its zero-page form is Express and may ride in a bundle.
        let zero = Message::PageData {
            page: PageId::new(77).unwrap(),
            writable: false,
            zero: true,
        };
        let Some(Outgoing::Express { handler, payload }) = outgoing(&zero) else {
            panic!("a zero-page notice is Express");
        };
        let msg = Message::from_parts(handler.0, payload, None).unwrap();
        assert_eq!(check_attachment(&msg, None), Ok(()));
    }

    /// An Express message pushed after a bulk one travels as the bundle's last part,
    /// its payload alone, and decodes to the same message.
    #[test]
    fn an_express_message_rides_in_the_bundle_it_follows() {
        let grant = grant_with_full_tenure();
        let recall = Message::LockRecall {
            lock: LockId::new((1 << 20) - 1).unwrap(),
            tenure: (1 << 20) - 1,
        };
        let Some(Outgoing::Express { handler, payload }) = outgoing(&recall) else {
            panic!("LockRecall is Express");
        };
        let mut b = Bundle::default();
        assert!(matches!(b.push_message(&grant), Push::Added));
        b.push_express(handler, payload);
        assert_eq!(
            b.parts().iter().map(|p| p.0).collect::<Vec<_>>(),
            [Handler(LOCK_GRANT), handler]
        );
        let body = b.seal().unwrap().to_vec();
        let parts = decode_bundle(&body).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(
            Message::from_parts(parts[0].handler.0, parts[0].payload, Some(parts[0].body)).unwrap(),
            grant
        );
        assert_eq!((parts[1].handler, parts[1].payload), (handler, payload));
        assert!(parts[1].body.is_empty());
        assert_eq!(
            Message::from_parts(parts[1].handler.0, parts[1].payload, None).unwrap(),
            recall
        );
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_or_fail_without_panicking(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)
        ) {
            let _ = decode_bundle(&data);
        }

        #[test]
        fn every_prefix_of_a_bundle_is_a_shorter_bundle_or_rejected(
            bodies in proptest::collection::vec(
                (proptest::sample::select(vec![0x10u8, 0x12, 0x30, 0x31, 0x32, 0x38, 0x39]),
                 proptest::prelude::any::<u64>(),
                 proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)),
                1..6)
        ) {
            let msgs: Vec<(u8, Vec<u8>)> = bodies
                .iter()
                .map(|(h, p, b)| (*h, bulk_body(*p, b)))
                .collect();
            let mut b = Bundle::default();
            for (h, d) in &msgs {
                proptest::prop_assert!(b.try_push(Handler(*h), d));
            }
            let whole = raw(&msgs.iter().map(|(h, d)| (*h, &d[..])).collect::<Vec<_>>());
            let parts = decode_bundle(&whole).unwrap();
            proptest::prop_assert_eq!(parts.len(), msgs.len());
            for (p, (h, d)) in parts.iter().zip(&msgs) {
                proptest::prop_assert_eq!(p.handler, Handler(*h));
                proptest::prop_assert_eq!(Some((p.payload, p.body)), split_bulk(d));
            }
            for cut in 0..whole.len() {
                if let Ok(prefix) = decode_bundle(&whole[..cut]) {
                    proptest::prop_assert!(prefix.len() < parts.len());
                    proptest::prop_assert_eq!(&prefix[..], &parts[..prefix.len()]);
                }
            }
        }
    }
}
