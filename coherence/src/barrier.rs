//! Barriers at a cluster: sending the arrival once its flush is done, and completing
//! (or holding) the departure the barrier manager sends back.

use std::mem;

use crate::action::Action;
use crate::config::Protocol;
use crate::error::ProtocolError;
use crate::ids::ClusterId;
use crate::machine::{Held, HeldDepart, Machine};
use crate::message::Message;

impl Machine {
    /// Sends the barrier arrival (the flush is done; the diffs need not have reached
    /// their homes: the departure waits for those a home needs, see
    /// [`Machine::on_barrier_depart`]).
    pub(crate) fn arrive(&mut self, out: &mut Vec<Action>) {
        let records = self.log.owned_after(self.me, 0);
        let migratable = if self.cfg.protocol == Protocol::Hlrc && self.cfg.migrate_single_writer {
            self.hlrc_migratable(&records)
        } else {
            Vec::new()
        };
        let msg = Message::BarrierArrive {
            episode: self.barrier.episode,
            time: self.time.clone(),
            records,
            migratable,
            updates_sent: self.updates_out.iter().map(|(&c, &n)| (c, n)).collect(),
        };
        self.stats.barrier_arrivals += 1;
        self.send(self.cfg.barrier_manager, msg, out);
        if self.cfg.protocol == Protocol::Hlrc {
            self.hlrc_apply_held_updates(out);
        }
    }

    /// Completes a barrier departure `d` — or holds it, if an update another cluster
    /// had sent here when it arrived has not been received yet (the departure, from
    /// the manager, overtook it; see [`Message::BarrierDepart`]): the update then
    /// keeps its copy valid instead of the departure's notice invalidating it.
    pub(crate) fn on_barrier_depart(
        &mut self,
        d: HeldDepart,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let from = d.from;
        if from != self.cfg.barrier_manager || self.barrier.waiting.is_none() {
            return Err(ProtocolError::Unexpected {
                what: "barrier departure",
                from,
                page: None,
            });
        }
        if d.episode != self.barrier.episode {
            return Err(ProtocolError::BarrierEpisode {
                expected: self.barrier.episode,
                got: d.episode,
            });
        }
        for &p in d
            .records
            .iter()
            .flat_map(|r| r.pages.iter())
            .chain(d.migrations.iter().map(|(p, _)| p))
        {
            self.check_page(p)?;
        }
        for &(_, c) in &d.migrations {
            if !self.cfg.has_cluster(c) {
                return Err(ProtocolError::NoSuchCluster(c));
            }
        }
        if d.records.iter().any(|r| r.owner == self.me) {
            return Err(ProtocolError::Unexpected {
                what: "barrier departure with this cluster's own records",
                from,
                page: None,
            });
        }
        for &(c, _) in &d.updates_due {
            if c == self.me || !self.cfg.has_cluster(c) {
                return Err(ProtocolError::Unexpected {
                    what: "barrier departure awaiting updates from this cluster or from no cluster",
                    from,
                    page: None,
                });
            }
        }
        if !self.updates_received(&d.updates_due) {
            // (A second departure meanwhile is refused in `on_message`.)
            self.stats.departures_held_for_updates += 1;
            self.barrier.held_depart = Some(d);
            return Ok(());
        }
        let HeldDepart {
            time,
            records,
            migrations,
            ..
        } = d;
        if self.cfg.protocol == Protocol::Hlrc {
            self.hlrc_migrate(from, &migrations, &time, out)?;
            self.hlrc_depart_notices(&records, out)?;
        }
        let waits = self.unreflected_before(&time);
        for r in records {
            self.log.insert(r)?;
        }
        self.time.merge(&time);
        self.check_log_covers_time()?;
        // Only what the departure's time covers has been seen by every cluster: this
        // cluster's own time may already be ahead (a cached lock given back while it
        // waited at the barrier closes an interval after its arrival).
        self.log.collect_garbage(&time);
        self.locks.collect_garbage(&time);
        self.recent
            .retain(|r| r.diff.index > time.get(r.diff.owner));
        self.barrier.episode = self.barrier.episode.wrapping_add(1);
        self.barrier.depart_time = time.clone();
        self.stats.barriers += 1;
        if let Some(token) = self.barrier.waiting.take() {
            // Pages homed here whose diffs are still on their way: the local threads
            // resume once the master copies have them.
            let done = Action::BarrierDone { token };
            if waits.is_empty() {
                out.push(done);
            } else {
                self.stats.barriers_held += 1;
                self.held.push(Held { waits, done });
            }
        }
        let deferred = mem::take(&mut self.barrier.deferred);
        self.inbox.extend(deferred);
        Ok(())
    }

    /// Completes the held barrier departure (see [`crate::machine::BarrierState::held_depart`]) once
    /// every update it waits for has been received.
    pub(crate) fn resume_held_departure(
        &mut self,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let ready = self
            .barrier
            .held_depart
            .as_ref()
            .is_some_and(|d| self.updates_received(&d.updates_due));
        match self.barrier.held_depart.take_if(|_| ready) {
            Some(d) => self.on_barrier_depart(d, out),
            None => Ok(()),
        }
    }

    /// Whether every update a departure lists (`(sender, count)`, cumulative) has
    /// been received here.
    fn updates_received(&self, due: &[(ClusterId, u64)]) -> bool {
        due.iter()
            .all(|&(c, n)| self.updates_in.get(&c).copied().unwrap_or(0) >= n)
    }
}
