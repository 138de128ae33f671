//! Emulated latency *L* on shared-memory links (paper 001 §3.2: "a delay before
//! delivery, independent of load"), and the busy loop of the emulated overheads.
//!
//! On the network path the INIs hold datagrams for *L* (see `net::core`). Between
//! clusters on one machine there is no INI, so the receiving endpoint holds each message
//! that came from another cluster over shared memory: a message seen at time *t* is
//! delivered at *t + L*, whatever else is held, so nothing queues behind anything (the
//! thesis's "IO delay" configuration, paper 002 Table 5.3). Messages from the endpoint's
//! own cluster and from the INIs pass at once. *t* is when the receiving thread first
//! polls the message: a thread that polls late adds that lateness, as any receiver does.

use crate::message::Message;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Busy-waits `d`: the emulated overheads *o_s* and *o_r* are CPU time of the thread
/// that sends or receives (paper 001 §3.2: "loop for a specific period of time before
/// actually writing or reading the message").
pub(crate) fn spin_for(d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// Messages held until their delivery time, in arrival order (every message waits the
/// same *L*, so arrival order is delivery order).
#[derive(Debug)]
pub(crate) struct DelayLine {
    latency: Duration,
    held: VecDeque<(Instant, Message)>,
}

impl DelayLine {
    /// A line holding each message for `latency`.
    pub(crate) fn new(latency: Duration) -> DelayLine {
        DelayLine {
            latency,
            held: VecDeque::new(),
        }
    }

    /// Holds `m`, seen at `now`, until `now + L`.
    pub(crate) fn hold(&mut self, now: Instant, m: Message) {
        self.held.push_back((now + self.latency, m));
    }

    /// The oldest held message if its time has come at `now`.
    pub(crate) fn due(&mut self, now: Instant) -> Option<Message> {
        if self.held.front()?.0 <= now {
            self.held.pop_front().map(|(_, m)| m)
        } else {
            None
        }
    }

    /// When the oldest held message is due, if any is held.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.held.front().map(|(t, _)| *t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::word::{ExpressMsg, Handler, SourceId};

    fn msg(payload: u64) -> Message {
        Message::Express(ExpressMsg {
            handler: Handler(1),
            source: SourceId::new(0).unwrap(),
            payload,
        })
    }

    fn payload(m: Message) -> u64 {
        match m {
            Message::Express(e) => e.payload,
            other => panic!("not Express: {other:?}"),
        }
    }

    #[test]
    fn each_message_waits_exactly_l_from_when_it_was_seen() {
        let l = Duration::from_micros(100);
        let mut line = DelayLine::new(l);
        let t0 = Instant::now();
        line.hold(t0, msg(1));
        line.hold(t0 + Duration::from_micros(30), msg(2));
        assert_eq!(line.next_due(), Some(t0 + l));
        assert!(line.due(t0 + Duration::from_micros(99)).is_none());
        assert_eq!(payload(line.due(t0 + l).unwrap()), 1);
        // The second is not held behind the first: due 30 µs later, not 100.
        assert!(line.due(t0 + l).is_none());
        assert_eq!(
            payload(line.due(t0 + l + Duration::from_micros(30)).unwrap()),
            2
        );
        assert_eq!(line.next_due(), None);
    }
}
