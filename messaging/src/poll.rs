//! The adaptive network-polling strategy of paper 000 §3.4.
//!
//! Polling memory costs a few cycles; polling the network costs a system call. A receive
//! loop (an endpoint's `try_recv`, an INI thread's pass) polls its shared-memory queues
//! on every pass but the network (the UDP sockets) only on one pass in `N`, where `N`
//! moves between [`PollBounds::min`] (network busy) and [`PollBounds::max`] (network
//! quiet) according to how many of the last 32 network polls found a message. When the
//! loop is about to sleep it always waits on the socket too, so quiet periods lose
//! nothing. Equal bounds give a fixed-fraction strategy (1 and 1: every poll), the
//! alternatives the paper compared; the job sets the bounds with `ini.poll_interval_min`
//! and `ini.poll_interval_max`.

/// How many network polls of the history count as "busy": with at least this many hits
/// among the last 32, the interval is [`PollBounds::min`].
const BUSY_HITS: u32 = 24;

/// The bounds of the network-polling interval, in receive polls per network poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollBounds {
    /// Most frequent network polling (the network is busy): once in `min` polls, ≥ 1.
    pub min: u32,
    /// Least frequent network polling (the network is quiet): once in `max` polls,
    /// ≥ `min`.
    pub max: u32,
}

impl PollBounds {
    /// Paper 000 §3.4's choice: between one in 8 and one in 32.
    pub const DEFAULT: PollBounds = PollBounds { min: 8, max: 32 };

    /// Bounds `min` ..= `max`, each raised to at least 1 and `max` to at least `min` (the
    /// configuration rejects anything else; see `ini.poll_interval_min`).
    pub fn new(min: u32, max: u32) -> PollBounds {
        let min = min.max(1);
        PollBounds {
            min,
            max: max.max(min),
        }
    }
}

impl Default for PollBounds {
    fn default() -> Self {
        PollBounds::DEFAULT
    }
}

/// Decides on which passes to poll the network.
#[derive(Clone, Copy, Debug, Default)]
pub struct AdaptivePoller {
    /// Bit i set: the i-th most recent network poll found a message.
    history: u32,
    countdown: u32,
}

impl AdaptivePoller {
    /// Current interval within `b`: `b.min` when at least 24 of the last 32 network polls
    /// found messages, `b.max` when none did, linear in between.
    pub fn interval(&self, b: PollBounds) -> u32 {
        let hits = self.history.count_ones().min(BUSY_HITS);
        let span = b.max - b.min;
        b.max - (u64::from(hits) * u64::from(span) / u64::from(BUSY_HITS)) as u32
    }

    /// Called once per pass: true if this pass should poll the network.
    #[inline]
    pub fn tick(&mut self, b: PollBounds) -> bool {
        if self.countdown == 0 {
            self.countdown = self.interval(b) - 1;
            true
        } else {
            self.countdown -= 1;
            false
        }
    }

    /// Makes the next [`AdaptivePoller::tick`] poll the network (after a wake-up).
    pub fn force(&mut self) {
        self.countdown = 0;
    }

    /// Records the outcome of a network poll.
    pub fn record(&mut self, found: bool) {
        self.history = (self.history << 1) | u32::from(found);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: PollBounds = PollBounds::DEFAULT;

    #[test]
    fn interval_follows_the_hit_history() {
        let mut p = AdaptivePoller::default();
        assert_eq!(p.interval(D), 32);
        for _ in 0..32 {
            p.record(true);
        }
        assert_eq!(p.interval(D), 8);
        for _ in 0..16 {
            p.record(false);
        }
        assert_eq!(p.interval(D), 32 - 16);
        for _ in 0..32 {
            p.record(false);
        }
        assert_eq!(p.interval(D), 32);
    }

    #[test]
    fn polls_once_per_interval() {
        let mut p = AdaptivePoller::default();
        let polls = (0..320).filter(|_| p.tick(D)).count();
        assert_eq!(polls, 10, "quiet network: 1 in 32");
        for _ in 0..32 {
            p.record(true);
        }
        let polls = (0..320).filter(|_| p.tick(D)).count();
        assert!(
            (39..=41).contains(&polls),
            "busy network: about 1 in 8, got {polls}"
        );
    }

    #[test]
    fn a_forced_poll_comes_next_and_the_interval_resumes_after_it() {
        // `Endpoint::poll_network_next`: a waiting thread that yields polls the network
        // at its next poll, then every 32nd again (quiet network).
        let mut p = AdaptivePoller::default();
        assert!(p.tick(D), "the first pass polls");
        assert!(!p.tick(D) && !p.tick(D), "then 1 in 32");
        p.force();
        assert!(p.tick(D), "forced");
        assert!(
            !(0..31).any(|_| p.tick(D)),
            "no poll in the 31 passes after it"
        );
        assert!(p.tick(D), "the 32nd");
    }

    #[test]
    fn equal_bounds_poll_a_fixed_fraction_whatever_the_history() {
        for n in [1, 8, 32] {
            let b = PollBounds::new(n, n);
            let mut p = AdaptivePoller::default();
            let quiet = (0..320).filter(|_| p.tick(b)).count();
            for _ in 0..32 {
                p.record(true);
            }
            let busy = (0..320).filter(|_| p.tick(b)).count();
            assert_eq!(
                (quiet, busy),
                (320 / n as usize, 320 / n as usize),
                "1 in {n}"
            );
        }
    }

    #[test]
    fn bounds_never_cross_and_the_widest_range_works() {
        assert_eq!(PollBounds::new(0, 0), PollBounds { min: 1, max: 1 });
        assert_eq!(PollBounds::new(9, 3), PollBounds { min: 9, max: 9 });
        let b = PollBounds::new(1, 1024);
        let mut p = AdaptivePoller::default();
        assert_eq!(p.interval(b), 1024);
        for _ in 0..32 {
            p.record(true);
        }
        assert_eq!(p.interval(b), 1);
    }
}
