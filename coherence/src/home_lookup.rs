//! First-touch homes: a request only the home may serve waits until this cluster knows
//! whether it is the page's home; asking the directory and becoming the home.

use crate::action::Action;
use crate::config::Protocol;
use crate::error::ProtocolError;
use crate::ids::{ClusterId, PageId};
use crate::machine::{Fetch, Machine, PageAccess, Phase, Waiter};
use crate::message::Message;

impl Machine {
    /// For a request only the home may serve: `Ok(true)` to serve it here,
    /// `Ok(false)` when it was held back because this cluster may be about to learn
    /// that it is the home (first-touch `HomeIs` or a barrier departure with a
    /// migration is on its way).
    pub(crate) fn require_home(
        &mut self,
        from: ClusterId,
        page: PageId,
        msg: &Message,
    ) -> Result<bool, ProtocolError> {
        if self.homes.get(page) == Some(self.me) {
            return Ok(true);
        }
        if msg.attachment().is_none() {
            if let Some(f) = self.fetches.get_mut(&page)
                && f.phase == Phase::AwaitHome
            {
                f.deferred.push((from, msg.clone()));
                return Ok(false);
            }
            if self.barrier.waiting.is_some() {
                self.barrier.deferred.push((from, msg.clone()));
                return Ok(false);
            }
        }
        Err(ProtocolError::NotHome { page, from })
    }

    pub(crate) fn on_home_query(
        &mut self,
        from: ClusterId,
        page: PageId,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if self.cfg.static_home(page) != self.me
            || self.cfg.home_policy != crate::config::HomePolicy::FirstTouch
        {
            return Err(Self::unexpected("home query", from, page));
        }
        let home = match self.homes.get(page) {
            Some(h) => h,
            None => {
                self.homes.set(page, from);
                from
            }
        };
        self.send(from, Message::HomeIs { page, home }, out);
        Ok(())
    }

    /// First-touch: starts a fault on a page whose home is unknown.
    pub(crate) fn start_home_lookup(
        &mut self,
        page: PageId,
        waiters: Vec<Waiter>,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let mgr = self.cfg.static_home(page);
        if mgr == self.me {
            // This cluster is the directory manager and the page is unassigned:
            // the local fault is the first touch.
            self.homes.set(page, self.me);
            self.become_home(page);
            return self.continue_after_home(page, Fetch::new(waiters, Phase::AwaitHome), out);
        }
        self.stats.home_queries += 1;
        self.fetches
            .insert(page, Fetch::new(waiters, Phase::AwaitHome));
        self.send(mgr, Message::HomeQuery { page }, out);
        Ok(())
    }

    fn become_home(&mut self, page: PageId) {
        let me = self.me;
        let e = self.entry(page);
        if e.access == PageAccess::Invalid {
            e.access = PageAccess::Untouched;
        }
        if self.cfg.protocol == Protocol::Hlrc {
            self.copysets.entry(page).or_default().insert(me);
        }
    }

    pub(crate) fn on_home_is(
        &mut self,
        from: ClusterId,
        page: PageId,
        home: ClusterId,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if from != self.cfg.static_home(page) || !self.cfg.has_cluster(home) {
            return Err(Self::unexpected("home reply", from, page));
        }
        let Some(f) = self.fetches.remove(&page) else {
            return Err(Self::unexpected("home reply without a query", from, page));
        };
        if f.phase != Phase::AwaitHome {
            return Err(Self::unexpected("home reply without a query", from, page));
        }
        self.homes.set(page, home);
        if home == self.me {
            self.become_home(page);
        }
        self.continue_after_home(page, f, out)
    }

    /// Continues a fault once the page's home is known.
    fn continue_after_home(
        &mut self,
        page: PageId,
        f: Fetch,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let Fetch {
            waiters, deferred, ..
        } = f;
        self.inbox.extend(deferred);
        match self.cfg.protocol {
            Protocol::Hlrc => self.hlrc_fetch_known_home(page, waiters, out),
            Protocol::Sc => {
                let write = waiters.iter().any(|w| w.write);
                self.sc_request(page, write, waiters, out)
            }
        }
    }
}
