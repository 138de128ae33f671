//! The INIs as the queue layer's route to other machines ([`RemoteRoute`]).

use super::Net;
use super::frame::FrameKind;
use super::handoff::{NO_SLOT, OutMsg};
use crate::message::Message;
use crate::names::{Destination, SiteId};
use crate::remote::{Lane, Refused, RemoteKind, RemoteRoute};
use crate::word::Word;
use nix::sys::epoll::Epoll;
use std::time::Instant;

impl From<RemoteKind> for FrameKind {
    fn from(k: RemoteKind) -> FrameKind {
        match k {
            RemoteKind::Express => FrameKind::Express,
            RemoteKind::TagOn => FrameKind::TagOn,
            RemoteKind::Basic => FrameKind::Basic,
            RemoteKind::Bulk => FrameKind::Bulk,
        }
    }
}

impl RemoteRoute for Net {
    #[inline]
    fn is_dead(&self, site: SiteId) -> bool {
        Net::is_dead(self, site.0)
    }

    /// Pays the emulated send overhead, picks an INI by the job's policy (paper 002
    /// §3.1), stamps the lane's next sequence number for `dest`'s site and hands the
    /// message to that INI's hand-off queue. With `more`, an inline sender leaves the
    /// message queued for the pass its next message runs, which packs both into one
    /// datagram where they fit (`WindowConfig::coalesce`).
    #[inline]
    fn submit(
        &self,
        lane: &Lane,
        dest: Destination,
        kind: RemoteKind,
        word: Word,
        buffer: Option<(u16, u32)>,
        more: bool,
    ) -> Result<(), Refused> {
        if Net::is_dead(self, dest.site.0) {
            return Err(Refused::Dead);
        }
        self.emulate_send_overhead();
        let (ini, misscheduled) = self.choose(lane.thread_index.get(), &lane.rr);
        let seq = &lane.seqs[usize::from(dest.site.0)];
        let (pool, slot) = buffer.unwrap_or((0, NO_SLOT));
        let out = OutMsg {
            kind: kind.into(),
            misscheduled,
            dest_site: dest.site.0,
            dest_queue: dest.queue.0,
            lane: lane.lane,
            seq: seq.get(),
            word: word.0,
            pool,
            slot,
            enqueued_ns: self.now_ns(),
        };
        Net::submit(self, ini, out, more).map_err(|_| Refused::Full)?;
        seq.set(seq.get().wrapping_add(1));
        Ok(())
    }

    #[inline]
    fn recv_overhead(&self) -> std::time::Duration {
        self.recv_overhead
    }

    fn poll(&self) -> bool {
        Net::poll(self)
    }

    #[inline]
    fn poll_bounds(&self) -> crate::poll::PollBounds {
        self.poll
    }

    #[inline]
    fn notify_local(&self) {
        Net::notify_local(self);
    }

    fn waiter_epoll(&self) -> std::io::Result<Epoll> {
        Net::waiter_epoll(self)
    }

    fn wait(
        &self,
        epoll: &Epoll,
        deadline: Instant,
        check: &mut dyn FnMut() -> Option<Message>,
    ) -> Result<Option<Message>, ()> {
        Net::wait(self, epoll, deadline, check)
    }
}
