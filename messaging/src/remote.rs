//! The route to sites on other machines, as the queues see it.
//!
//! The queue layer (sites, endpoints, rings, pools) sits below the INIs: the INI threads
//! (`net`) deliver into its queues, and it hands them the messages for other machines
//! through this small trait alone, so that the queue layer never names the INI layer
//! (the `endpoint ↔ net ↔ site` circle of the old layout). `net::Net` implements it.

use crate::message::Message;
use crate::names::{Destination, SiteId};
use crate::word::Word;
use nix::sys::epoll::Epoll;
use std::cell::Cell;
use std::time::Instant;

/// What kind of message leaves for a remote site (its frame kind on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RemoteKind {
    /// One Express word.
    Express,
    /// A Tag-On message: word + the attached buffer.
    TagOn,
    /// A Basic message, its bytes in a pool slot.
    Basic,
    /// One fragment of a bulk message, in a pool slot.
    Bulk,
}

/// A sending endpoint's side of the network path (paper 002 §3.1).
pub(crate) struct Lane {
    /// Unique per site: the unit whose order the receiving site restores.
    pub(crate) lane: u16,
    /// The compute thread this endpoint serves (the `static` policy maps it to an INI).
    pub(crate) thread_index: Cell<usize>,
    /// Rotation counter of the `round-robin` and `least-loaded` policies.
    pub(crate) rr: Cell<usize>,
    /// Next sequence number per destination site.
    pub(crate) seqs: Box<[Cell<u32>]>,
}

impl Lane {
    /// Lane `lane` of a site that routes to up to `max_sites` sites.
    pub(crate) fn new(lane: u16, max_sites: usize) -> Lane {
        Lane {
            lane,
            thread_index: Cell::new(usize::from(lane)),
            rr: Cell::new(usize::from(lane)),
            seqs: (0..max_sites).map(|_| Cell::new(0)).collect(),
        }
    }
}

/// Why a message was not handed to the route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The destination site has failed.
    Dead,
    /// The chosen INI's hand-off queue is full: try again.
    Full,
}

/// What the queue layer needs from the layer that carries messages between machines.
pub(crate) trait RemoteRoute: Send + Sync {
    /// Whether `site` has been reported dead (sends to it are refused).
    fn is_dead(&self, site: SiteId) -> bool;

    /// Hands a message for `dest` from `lane` to the route. `buffer` names the pool slot
    /// `(pool, slot)` holding its data, if any; on success the route owns that reference.
    /// `more`: the caller hands over another message right after this one (the next
    /// fragment of a bulk message), so the route may wait for it and send both together
    /// rather than send this one alone at once; the last message of a run has `more`
    /// false.
    fn submit(
        &self,
        lane: &Lane,
        dest: Destination,
        kind: RemoteKind,
        word: Word,
        buffer: Option<(u16, u32)>,
        more: bool,
    ) -> Result<(), Refused>;

    /// The emulated receive overhead *o_r* (paper 001 §3.2) a receiving thread pays for
    /// each message from this route that it takes from its queues (zero: off).
    fn recv_overhead(&self) -> std::time::Duration;

    /// One network poll from a receiving thread (paper 000 §3.4). Returns whether
    /// anything arrived or moved.
    fn poll(&self) -> bool;

    /// How often a receiving thread makes that poll among its polls of shared memory
    /// (`ini.poll_interval_min`/`max`).
    fn poll_bounds(&self) -> crate::poll::PollBounds;

    /// After a message was put in one of this site's own queues: wakes a thread that
    /// waits on the network, if any.
    fn notify_local(&self);

    /// An epoll set for [`RemoteRoute::wait`].
    fn waiter_epoll(&self) -> std::io::Result<Epoll>;

    /// Waits up to `deadline` for `check` to find a message, the calling thread acting
    /// as the network's receiver. `Err(())`: it cannot now (the caller sleeps on its
    /// doorbell instead).
    fn wait(
        &self,
        epoll: &Epoll,
        deadline: Instant,
        check: &mut dyn FnMut() -> Option<Message>,
    ) -> Result<Option<Message>, ()>;
}
