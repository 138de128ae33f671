//! The Express word: one 64-bit value carrying a whole short message.
//!
//! Paper 004 §5.1 packs the logical destination, a handler and about five bytes of data
//! into one uncached access so that a send or receive is a single atomic commit. Our
//! software version keeps the idea: everything a short message needs fits in one `u64`
//! that the ring moves with one claim and one publish.
//!
//! # Bit layout
//!
//! | bits    | width | field      | meaning                                                         |
//! |---------|-------|------------|-----------------------------------------------------------------|
//! | 63..62  | 2     | kind       | `0` Express, `1` Tag-On, `2` Bulk fragment, `3` invalid          |
//! | 61..54  | 8     | handler    | Active-Message handler index (256 handlers; 0 = error handler)   |
//! | 53..40  | 14    | source     | source id from the sender's destination table (16,384 sources)   |
//! | 39..0   | 40    | payload    | user data: **40 bits (5 bytes) remain for the payload**          |
//!
//! For Tag-On and Bulk words the payload names the attached buffer instead:
//!
//! | bits    | width | field | meaning                                                 |
//! |---------|-------|-------|---------------------------------------------------------|
//! | 39..24  | 16    | pool  | site whose buffer pool holds the slot                    |
//! | 23..0   | 24    | slot  | slot index in that pool (16 M slots of 4 KiB = 64 GiB)  |
//!
//! The source field is never chosen by the sender's code: the send path copies it from the
//! destination-table entry (paper 004 §4.1), so a receiver can trust it and reply through it.

use std::fmt;

/// Number of payload bits an Express message carries (bits 39..0).
pub const PAYLOAD_BITS: u32 = 40;
/// Largest payload an Express message can carry: `2^40 - 1`.
pub const MAX_PAYLOAD: u64 = (1 << PAYLOAD_BITS) - 1;
/// Number of source-id bits (bits 53..40).
pub const SOURCE_BITS: u32 = 14;
/// Largest source id: `2^14 - 1`.
pub const MAX_SOURCE: u16 = (1 << SOURCE_BITS) - 1;

const KIND_SHIFT: u32 = 62;
const HANDLER_SHIFT: u32 = 54;
const SOURCE_SHIFT: u32 = 40;
const POOL_SHIFT: u32 = 24;
const SLOT_MASK: u64 = (1 << POOL_SHIFT) - 1;

/// What a word on a receive ring announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WordKind {
    /// A complete Express message.
    Express,
    /// The header of a Tag-On message; the payload names a pool slot.
    TagOn,
    /// One fragment of a bulk message; the payload names a pool slot holding the fragment.
    Bulk,
}

/// Active-Message handler index (8 bits). Handler 0 is the error handler (paper 000 §2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Handler(pub u8);

impl Handler {
    /// The error handler, which receives undeliverable messages.
    pub const ERROR: Handler = Handler(0);
}

impl fmt::Display for Handler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "handler {}", self.0)
    }
}

/// The source id a receiver sees: the sender's entry in the receiver's own name space,
/// usable as a [`VirtualName`](crate::VirtualName) to reply (paper 004 §4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SourceId(u16);

impl SourceId {
    /// A source id; `None` if it does not fit in 14 bits.
    pub const fn new(id: u16) -> Option<SourceId> {
        if id <= MAX_SOURCE {
            Some(SourceId(id))
        } else {
            None
        }
    }

    /// The id as an integer.
    pub const fn get(self) -> u16 {
        self.0
    }
}

impl fmt::Display for SourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "source {}", self.0)
    }
}

/// A payload wider than [`PAYLOAD_BITS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Express payload {0:#x} does not fit in 40 bits (max {MAX_PAYLOAD:#x})")]
pub struct PayloadTooWide(pub u64);

/// An outgoing Express message before the send path stamps a source id into it:
/// a handler and a 40-bit payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Express {
    handler: Handler,
    payload: u64,
}

impl Express {
    /// A message for `handler` carrying `payload`.
    ///
    /// # Errors
    /// [`PayloadTooWide`] if `payload > MAX_PAYLOAD`.
    pub const fn new(handler: Handler, payload: u64) -> Result<Express, PayloadTooWide> {
        if payload > MAX_PAYLOAD {
            Err(PayloadTooWide(payload))
        } else {
            Ok(Express { handler, payload })
        }
    }

    /// The handler index.
    pub const fn handler(self) -> Handler {
        self.handler
    }

    /// The 40-bit payload.
    pub const fn payload(self) -> u64 {
        self.payload
    }
}

/// A received (or fully addressed) Express message: handler, source and payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExpressMsg {
    /// Handler index.
    pub handler: Handler,
    /// Who sent it, as a name in the receiver's destination table.
    pub source: SourceId,
    /// 40-bit payload.
    pub payload: u64,
}

/// A packed 64-bit word as it sits in a ring slot. See the module docs for the layout.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Word(pub u64);

impl fmt::Debug for Word {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Word({:#018x})", self.0)
    }
}

/// Why a word taken from a ring was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WordError {
    /// The kind bits hold the reserved value 3.
    #[error("word {0:#018x} has the reserved kind 3")]
    ReservedKind(u64),
}

impl Word {
    /// Packs an Express message.
    #[inline]
    pub const fn express(handler: Handler, source: SourceId, payload: u64) -> Word {
        Word(
            ((handler.0 as u64) << HANDLER_SHIFT)
                | ((source.0 as u64) << SOURCE_SHIFT)
                | (payload & MAX_PAYLOAD),
        )
    }

    /// Packs a Tag-On (or Bulk, with `kind`) header naming `slot` in `pool`'s buffer pool.
    ///
    /// # Panics
    /// If `kind` is [`WordKind::Express`] or `slot` does not fit in 24 bits (pools are sized
    /// below that at creation).
    #[inline]
    pub fn buffer(
        kind: WordKind,
        handler: Handler,
        source: SourceId,
        pool: u16,
        slot: u32,
    ) -> Word {
        assert!(kind != WordKind::Express, "buffer words are Tag-On or Bulk");
        assert!(
            u64::from(slot) <= SLOT_MASK,
            "slot index {slot} exceeds 24 bits"
        );
        let k = match kind {
            WordKind::TagOn => 1u64,
            _ => 2u64,
        };
        let payload = (u64::from(pool) << POOL_SHIFT) | u64::from(slot);
        Word((k << KIND_SHIFT) | Word::express(handler, source, payload).0)
    }

    /// The kind of message this word announces.
    ///
    /// # Errors
    /// [`WordError::ReservedKind`] for a corrupted word.
    #[inline]
    pub const fn kind(self) -> Result<WordKind, WordError> {
        match self.0 >> KIND_SHIFT {
            0 => Ok(WordKind::Express),
            1 => Ok(WordKind::TagOn),
            2 => Ok(WordKind::Bulk),
            _ => Err(WordError::ReservedKind(self.0)),
        }
    }

    /// True for an Express word (kind bits 0): the receive loop's common case, one shift.
    #[inline(always)]
    pub const fn is_express(self) -> bool {
        self.0 >> KIND_SHIFT == 0
    }

    /// The handler field.
    #[inline]
    pub const fn handler(self) -> Handler {
        Handler((self.0 >> HANDLER_SHIFT) as u8)
    }

    /// The source field.
    #[inline]
    pub const fn source(self) -> SourceId {
        SourceId(((self.0 >> SOURCE_SHIFT) as u16) & MAX_SOURCE)
    }

    /// The 40-bit payload field.
    #[inline]
    pub const fn payload(self) -> u64 {
        self.0 & MAX_PAYLOAD
    }

    /// For a buffer word: the pool (site) field.
    #[inline]
    pub const fn pool(self) -> u16 {
        (self.payload() >> POOL_SHIFT) as u16
    }

    /// For a buffer word: the slot field.
    #[inline]
    pub const fn slot(self) -> u32 {
        (self.payload() & SLOT_MASK) as u32
    }

    /// The same word with its source field replaced (used by the INI when a message
    /// crosses into another site's name space).
    #[inline]
    pub const fn with_source(self, source: SourceId) -> Word {
        Word(
            (self.0 & !((MAX_SOURCE as u64) << SOURCE_SHIFT)) | ((source.0 as u64) << SOURCE_SHIFT),
        )
    }

    /// The same buffer word pointing at another pool and slot (used when an INI copies an
    /// arriving Tag-On payload into a local buffer).
    #[inline]
    pub const fn with_buffer(self, pool: u16, slot: u32) -> Word {
        Word((self.0 & !MAX_PAYLOAD) | ((pool as u64) << POOL_SHIFT) | (slot as u64 & SLOT_MASK))
    }

    /// Unpacks the Express fields.
    #[inline]
    pub const fn express_msg(self) -> ExpressMsg {
        ExpressMsg {
            handler: self.handler(),
            source: self.source(),
            payload: self.payload(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn express_round_trips(h in any::<u8>(), s in 0..=MAX_SOURCE, p in 0..=MAX_PAYLOAD) {
            let w = Word::express(Handler(h), SourceId::new(s).unwrap(), p);
            prop_assert_eq!(w.kind(), Ok(WordKind::Express));
            prop_assert_eq!(w.handler(), Handler(h));
            prop_assert_eq!(w.source().get(), s);
            prop_assert_eq!(w.payload(), p);
        }

        #[test]
        fn buffer_round_trips(h in any::<u8>(), s in 0..=MAX_SOURCE, pool in any::<u16>(), slot in 0u32..(1 << 24), bulk in any::<bool>()) {
            let kind = if bulk { WordKind::Bulk } else { WordKind::TagOn };
            let w = Word::buffer(kind, Handler(h), SourceId::new(s).unwrap(), pool, slot);
            prop_assert_eq!(w.kind(), Ok(kind));
            prop_assert_eq!(w.handler(), Handler(h));
            prop_assert_eq!(w.source().get(), s);
            prop_assert_eq!((w.pool(), w.slot()), (pool, slot));
            let moved = w.with_buffer(pool ^ 1, slot ^ 1).with_source(SourceId::new(s ^ 1).unwrap());
            prop_assert_eq!((moved.pool(), moved.slot(), moved.source().get()), (pool ^ 1, slot ^ 1, s ^ 1));
            prop_assert_eq!((moved.kind(), moved.handler()), (Ok(kind), Handler(h)));
        }
    }

    #[test]
    fn wide_payload_is_refused() {
        assert_eq!(
            Express::new(Handler(1), MAX_PAYLOAD + 1),
            Err(PayloadTooWide(MAX_PAYLOAD + 1))
        );
        assert!(Express::new(Handler(1), MAX_PAYLOAD).is_ok());
        assert_eq!(SourceId::new(MAX_SOURCE + 1), None);
    }

    #[test]
    fn reserved_kind_is_rejected() {
        assert_eq!(
            Word(u64::MAX).kind(),
            Err(WordError::ReservedKind(u64::MAX))
        );
    }
}
