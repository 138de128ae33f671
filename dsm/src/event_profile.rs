//! Where the runtime's handling time goes, by kind of event and of action
//! (`dsm.event_profile`): each event a cluster's runtime hands its coherence machine — a
//! page fault, an acquire, a release, a barrier arrival, a received message — is timed as
//! a whole (under the machine lock: the machine's decision, the actions executed for it,
//! a follow-up flush's result), and so is the machine's part of it and each action.
//!
//! The clock is the TSC (`quanta`), two reads per event, per machine call and per action
//! (≈ 10 ns each), so the profile is off unless the job's configuration asks for it.

use multigrain_coherence::{Action, Event};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::AddAssign;

/// The handling of one kind of event, summed over a cluster (or a job).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EventTime {
    /// Events of this kind handled.
    pub count: u64,
    /// Their whole handling under the machine lock, in ns: the machine's part, the
    /// actions executed for them (flushes, sends, diffs applied, page operations, wake-ups)
    /// and the follow-up events the machine's calling contract chains to them (a flush's
    /// result, an idle cached lock given back).
    pub ns: u64,
    /// Of `ns`, the coherence machine's own part (`Machine::handle` for the event and its
    /// follow-ups), in ns.
    pub machine_ns: u64,
}

impl AddAssign<&EventTime> for EventTime {
    fn add_assign(&mut self, o: &EventTime) {
        self.count += o.count;
        self.ns += o.ns;
        self.machine_ns += o.machine_ns;
    }
}

/// A cluster's handling time by kind of event and by kind of action
/// ([`crate::ClusterStats::event_profile`]; `dsm.event_profile`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EventProfile {
    /// By kind of event: `read fault`, `write fault`, `acquire`, `release`, `barrier`
    /// (the cluster's arrival), and each received protocol message by its kind
    /// ([`crate::op_name`]: `LockGrant`, `Update`, ...). Kinds never handled are absent.
    pub events: BTreeMap<String, EventTime>,
    /// By kind of action, in ns: `flush` (open pages compared with their twins, diffs
    /// encoded), `send` (messages encoded into their bundles, or sent), `apply diff` and
    /// `other` (installs, invalidations, protections, completions), executed inside the
    /// events above and counted in their `ns`; and `post bundles` (the bundles handed to
    /// the message layer after each event or received bundle, under the machine lock but
    /// outside the events' `ns`). Kinds never executed are absent.
    pub actions_ns: BTreeMap<String, u64>,
}

impl AddAssign<&EventProfile> for EventProfile {
    fn add_assign(&mut self, o: &EventProfile) {
        for (k, t) in &o.events {
            *self.events.entry(k.clone()).or_default() += t;
        }
        for (k, ns) in &o.actions_ns {
            *self.actions_ns.entry(k.clone()).or_default() += ns;
        }
    }
}

/// The local events' kinds, in [`Profiler`]'s slots before the messages' 256.
/// (`flushed`: a flush's result, which the runtime chains to the event whose flush it
/// answers and times with it; it never comes first.)
const LOCAL_EVENTS: [&str; 6] = [
    "read fault",
    "write fault",
    "acquire",
    "release",
    "barrier",
    "flushed",
];

/// The kinds of action [`Profiler`] tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActionKind {
    /// `Action::Flush`: open pages compared with their twins, diffs encoded.
    Flush = 0,
    /// `Action::Send`: a message encoded into its bundle, or sent.
    Send = 1,
    /// `Action::ApplyDiff`.
    ApplyDiff = 2,
    /// Every other action: installs, invalidations, protections, completions.
    Other = 3,
    /// Not an action: the bundles handed to the message layer after an event.
    PostBundles = 4,
}

/// [`ActionKind`]'s names, by its discriminant.
const ACTION_NAMES: [&str; 5] = ["flush", "send", "apply diff", "other", "post bundles"];

impl ActionKind {
    /// The kind of `a`.
    pub(crate) fn of(a: &Action) -> Self {
        match a {
            Action::Flush { .. } => ActionKind::Flush,
            Action::Send { .. } => ActionKind::Send,
            Action::ApplyDiff { .. } => ActionKind::ApplyDiff,
            _ => ActionKind::Other,
        }
    }
}

/// A cluster's accumulating profile, kept under the machine lock (so plain integers).
pub(crate) struct Profiler {
    /// [`LOCAL_EVENTS`], then one slot per message opcode.
    events: Box<[EventTime; LOCAL_EVENTS.len() + 256]>,
    /// ns by [`ActionKind`].
    actions_ns: [u64; ACTION_NAMES.len()],
}

impl Profiler {
    /// An empty profile.
    pub(crate) fn new() -> Self {
        Profiler {
            events: Box::new([EventTime::default(); LOCAL_EVENTS.len() + 256]),
            actions_ns: [0; ACTION_NAMES.len()],
        }
    }

    /// The slot that counts `event`.
    pub(crate) fn slot(event: &Event) -> usize {
        match event {
            Event::ReadFault { .. } => 0,
            Event::WriteFault { .. } => 1,
            Event::Acquire { .. } => 2,
            Event::Release { .. } => 3,
            Event::Barrier { .. } => 4,
            Event::Message { msg, .. } => LOCAL_EVENTS.len() + usize::from(msg.opcode()),
            Event::Flushed { .. } => 5,
        }
    }

    /// Counts one event of `slot` that took `ns`, `machine_ns` of it in the machine.
    pub(crate) fn event(&mut self, slot: usize, ns: u64, machine_ns: u64) {
        let e = &mut self.events[slot];
        e.count += 1;
        e.ns += ns;
        e.machine_ns += machine_ns;
    }

    /// Adds `ns` to the actions of `kind`.
    pub(crate) fn action(&mut self, kind: ActionKind, ns: u64) {
        self.actions_ns[kind as usize] += ns;
    }

    /// The profile so far, by name.
    pub(crate) fn snapshot(&self) -> EventProfile {
        let events = self
            .events
            .iter()
            .enumerate()
            .filter(|(_, t)| t.count > 0)
            .map(|(i, t)| {
                let name = match LOCAL_EVENTS.get(i) {
                    Some(n) => (*n).to_owned(),
                    None => crate::wire::op_name((i - LOCAL_EVENTS.len()) as u8).to_owned(),
                };
                (name, *t)
            })
            .collect();
        let actions_ns = ACTION_NAMES
            .iter()
            .zip(self.actions_ns)
            .filter(|&(_, ns)| ns > 0)
            .map(|(n, ns)| ((*n).to_owned(), ns))
            .collect();
        EventProfile { events, actions_ns }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use multigrain_coherence::{ClusterId, LockId, Message, SyncToken};

    #[test]
    fn events_are_named_by_kind_and_messages_by_opcode() {
        let lock = LockId::new(3).unwrap();
        let mut p = Profiler::new();
        let acquire = Event::Acquire {
            lock,
            token: SyncToken(1),
        };
        let recall = Event::Message {
            from: ClusterId::new(1).unwrap(),
            msg: Message::LockRecall { lock, tenure: 2 },
        };
        p.event(Profiler::slot(&acquire), 500, 200);
        p.event(Profiler::slot(&acquire), 700, 300);
        p.event(Profiler::slot(&recall), 900, 400);
        p.action(ActionKind::Flush, 40);
        p.action(ActionKind::PostBundles, 60);
        let s = p.snapshot();
        assert_eq!(
            s.events.keys().collect::<Vec<_>>(),
            ["LockRecall", "acquire"],
            "kinds never handled are absent"
        );
        assert_eq!(
            s.events["acquire"],
            EventTime {
                count: 2,
                ns: 1200,
                machine_ns: 500
            }
        );
        assert_eq!(s.events["LockRecall"].count, 1);
        assert_eq!(
            s.actions_ns,
            BTreeMap::from([("flush".to_owned(), 40), ("post bundles".to_owned(), 60)])
        );
        let mut total = s.clone();
        total += &s;
        assert_eq!(total.events["acquire"].ns, 2400);
        assert_eq!(total.actions_ns["flush"], 80);
    }
}
