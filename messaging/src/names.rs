//! Virtual queue names and destination tables (paper 004 §4.1, Figure 2).
//!
//! Job code never addresses a physical queue. It sends to a [`VirtualName`], a small
//! integer private to the job; the sending endpoint's [`DestinationTable`] translates it
//! into a [`Destination`]: `(site, receive queue, source id)`. The source id is stamped into
//! the message by the send path, so a receiver can trust it and reply through it: at the
//! receiver it is itself a virtual name that leads back to the sender.
//!
//! Only the runtime writes tables: writing needs a [`TableWriter`], which only
//! [`Site::create_endpoint`](crate::Site::create_endpoint) hands out, to the runtime that
//! creates the endpoint; job code is given the [`Endpoint`](crate::Endpoint) alone, which
//! can reach exactly the names in its table. Several names may map to one physical queue.
//!
//! Each entry is one atomic word, so lookups on the send path are a single load and the
//! runtime may remap a name while the job runs (paper 004: queues can move between
//! resources transparently).

use crate::sync::{AtomicU64, Ordering};
use crate::word::{MAX_SOURCE, SourceId};
use std::fmt;
use std::sync::Arc;

/// A virtual queue name: an index into the sender's destination table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct VirtualName(pub u16);

impl fmt::Display for VirtualName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "virtual name {}", self.0)
    }
}

impl From<SourceId> for VirtualName {
    /// A received source id is a name in the receiver's table (paper 004 §4.1).
    fn from(s: SourceId) -> VirtualName {
        VirtualName(s.get())
    }
}

/// A site: one cluster process, numbered by its index in the topology.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SiteId(pub u16);

impl fmt::Display for SiteId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "site {}", self.0)
    }
}

/// A receive queue at a site (an Express ring and a Basic ring).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct QueueId(pub u16);

impl fmt::Display for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "queue {}", self.0)
    }
}

/// A physical destination: where a virtual name leads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Destination {
    /// The receiving site.
    pub site: SiteId,
    /// The receive queue at that site.
    pub queue: QueueId,
    /// The source id the receiver sees (its name for the sender).
    pub source: SourceId,
}

const VALID: u64 = 1 << 63;

impl Destination {
    fn pack(self) -> u64 {
        VALID
            | (u64::from(self.site.0) << 32)
            | (u64::from(self.queue.0) << 16)
            | u64::from(self.source.get())
    }

    #[inline]
    fn unpack(bits: u64) -> Option<Destination> {
        if bits & VALID == 0 {
            return None;
        }
        Some(Destination {
            site: SiteId((bits >> 32) as u16),
            queue: QueueId((bits >> 16) as u16),
            source: SourceId::new((bits as u16) & MAX_SOURCE).expect("masked to 14 bits"),
        })
    }
}

/// A name outside the table's capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{name} is outside this destination table (capacity {capacity} names)")]
pub struct NameOutOfRange {
    /// The name.
    pub name: VirtualName,
    /// The table's capacity.
    pub capacity: usize,
}

/// An endpoint's translation from virtual names to destinations. Read by the endpoint on
/// every send; written only through a [`TableWriter`].
pub struct DestinationTable {
    entries: Box<[AtomicU64]>,
}

impl fmt::Debug for DestinationTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mapped: Vec<_> = (0..self.entries.len())
            .filter_map(|i| self.lookup(VirtualName(i as u16)).map(|d| (i, d)))
            .collect();
        f.debug_struct("DestinationTable")
            .field("capacity", &self.entries.len())
            .field("mapped", &mapped)
            .finish()
    }
}

impl DestinationTable {
    pub(crate) fn new(capacity: usize) -> Arc<DestinationTable> {
        assert!(capacity <= usize::from(u16::MAX) + 1, "at most 65536 names");
        Arc::new(DestinationTable {
            entries: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// The destination of `name`, or `None` if unmapped or out of range.
    #[inline]
    pub fn lookup(&self, name: VirtualName) -> Option<Destination> {
        let bits = self
            .entries
            .get(usize::from(name.0))?
            .load(Ordering::Acquire);
        Destination::unpack(bits)
    }

    /// Number of names the table can hold.
    pub fn capacity(&self) -> usize {
        self.entries.len()
    }
}

/// The capability to write one endpoint's destination table. Not `Clone`; created only by
/// [`Site::create_endpoint`](crate::Site::create_endpoint) and held by the runtime.
#[derive(Debug)]
pub struct TableWriter {
    table: Arc<DestinationTable>,
}

impl TableWriter {
    pub(crate) fn new(table: Arc<DestinationTable>) -> TableWriter {
        TableWriter { table }
    }

    /// Maps `name` to `dest` (replacing any earlier mapping).
    ///
    /// # Errors
    /// [`NameOutOfRange`] if the table is too small.
    pub fn map(&self, name: VirtualName, dest: Destination) -> Result<(), NameOutOfRange> {
        let slot = self.entry(name)?;
        slot.store(dest.pack(), Ordering::Release);
        Ok(())
    }

    /// Removes `name`'s mapping; later sends to it fail with `UnknownDestination`.
    ///
    /// # Errors
    /// [`NameOutOfRange`] if the table is too small.
    pub fn unmap(&self, name: VirtualName) -> Result<(), NameOutOfRange> {
        self.entry(name)?.store(0, Ordering::Release);
        Ok(())
    }

    /// Reads the table (the same view the endpoint has).
    pub fn table(&self) -> &DestinationTable {
        &self.table
    }

    fn entry(&self, name: VirtualName) -> Result<&AtomicU64, NameOutOfRange> {
        self.table
            .entries
            .get(usize::from(name.0))
            .ok_or(NameOutOfRange {
                name,
                capacity: self.table.entries.len(),
            })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn entries_round_trip(site in any::<u16>(), queue in any::<u16>(), source in 0..=MAX_SOURCE, name in 0u16..64) {
            let table = DestinationTable::new(64);
            let writer = TableWriter::new(table.clone());
            let dest = Destination { site: SiteId(site), queue: QueueId(queue), source: SourceId::new(source).unwrap() };
            prop_assert_eq!(table.lookup(VirtualName(name)), None);
            writer.map(VirtualName(name), dest).unwrap();
            prop_assert_eq!(table.lookup(VirtualName(name)), Some(dest));
            writer.unmap(VirtualName(name)).unwrap();
            prop_assert_eq!(table.lookup(VirtualName(name)), None);
        }
    }

    #[test]
    fn out_of_range_names() {
        let table = DestinationTable::new(4);
        let writer = TableWriter::new(table.clone());
        let dest = Destination {
            site: SiteId(0),
            queue: QueueId(0),
            source: SourceId::default(),
        };
        assert_eq!(
            writer.map(VirtualName(4), dest),
            Err(NameOutOfRange {
                name: VirtualName(4),
                capacity: 4
            })
        );
        assert_eq!(table.lookup(VirtualName(4)), None);
        assert_eq!(table.lookup(VirtualName(u16::MAX)), None);
    }
}
