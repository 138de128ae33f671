//! Errors of [`crate::Machine::handle`].

use crate::ids::{ClusterId, LockId, PageId};
use crate::interval::GapError;
use crate::sync::SyncError;

/// A protocol violation detected by a machine: a runtime bug (an event the contract
/// forbids) or a message that cannot occur in a correct run (a peer bug or a corrupt
/// message). The machine's state is unspecified afterwards; treat it as fatal for
/// the job.
///
/// Source: issue 4 (malformed input is reported, never a panic); style.md practice 4
/// (errors name what went wrong).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A page outside the configured region.
    #[error("page {0:?} is outside the region")]
    NoSuchPage(PageId),
    /// A cluster outside the job, or a message from this cluster to itself.
    #[error("cluster {0:?} is not a peer of this cluster")]
    NoSuchCluster(ClusterId),
    /// A release of a lock this cluster does not hold.
    #[error("lock {0:?} released but not held by this cluster")]
    NotHeld(LockId),
    /// A second barrier arrival before the first completed.
    #[error("barrier entered while the previous one is still in progress")]
    BarrierBusy,
    /// A barrier message for the wrong episode.
    #[error("barrier episode {got}, expected {expected}")]
    BarrierEpisode {
        /// Episode the receiver is in.
        expected: u32,
        /// Episode in the message.
        got: u32,
    },
    /// A request that only the page's home can serve reached another cluster.
    #[error("{from:?} sent a home request for {page:?}, which is not homed here")]
    NotHome {
        /// The page.
        page: PageId,
        /// The sender.
        from: ClusterId,
    },
    /// A message that the receiver's state does not allow.
    #[error("unexpected {what} from {from:?} (page {page:?})")]
    Unexpected {
        /// What was unexpected.
        what: &'static str,
        /// The sender.
        from: ClusterId,
        /// The page concerned, if any.
        page: Option<PageId>,
    },
    /// An event other than [`crate::Event::Flushed`] while a flush is pending (the
    /// runtime must pass the flush's result first).
    #[error("an event arrived while a flush waits for its result")]
    FlushPending,
    /// [`crate::Event::Flushed`] without a pending flush, or with the wrong number of
    /// diffs.
    #[error("flush result without a matching flush")]
    UnexpectedFlush,
    /// Interval records with a gap (a write notice would be lost).
    #[error(transparent)]
    Gap(#[from] GapError),
}

impl From<SyncError> for ProtocolError {
    fn from(e: SyncError) -> Self {
        match e {
            SyncError::NotHolder(_, from) => ProtocolError::Unexpected {
                what: "lock release by a non-holder",
                from,
                page: None,
            },
            SyncError::RequestFromHolder(_, from) => ProtocolError::Unexpected {
                what: "lock request from the lock's owner before a recall",
                from,
                page: None,
            },
            SyncError::Gap(g) => ProtocolError::Gap(g),
            SyncError::Episode { expected, got } => ProtocolError::BarrierEpisode { expected, got },
            SyncError::DuplicateArrival(from) => ProtocolError::Unexpected {
                what: "second barrier arrival",
                from,
                page: None,
            },
            SyncError::ForeignRecord(from) => ProtocolError::Unexpected {
                what: "barrier arrival with another cluster's records",
                from,
                page: None,
            },
            SyncError::BadUpdateCounts(from) => ProtocolError::Unexpected {
                what: "barrier arrival counting updates to itself or to no cluster",
                from,
                page: None,
            },
        }
    }
}
