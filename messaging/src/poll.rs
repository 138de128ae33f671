//! The adaptive network-polling strategy of paper 000 §3.4.
//!
//! Polling memory costs a few cycles; polling the network costs a system call. An INI
//! polls its hand-off queue (memory) on every pass of its loop but the UDP socket only on
//! one pass in `N`, where `N` moves between 8 (network busy) and 32 (network quiet)
//! according to how many of the last 32 network polls found a message. When the loop is
//! about to sleep it always waits on the socket too, so quiet periods lose nothing.

/// Most frequent network polling: once in 8 passes.
pub const MIN_INTERVAL: u32 = 8;
/// Least frequent network polling: once in 32 passes.
pub const MAX_INTERVAL: u32 = 32;

/// Decides on which passes to poll the network.
#[derive(Clone, Copy, Debug, Default)]
pub struct AdaptivePoller {
    /// Bit i set: the i-th most recent network poll found a message.
    history: u32,
    countdown: u32,
}

impl AdaptivePoller {
    /// Current interval: 8 when at least 24 of the last 32 polls found messages, 32 when
    /// none did, linear in between.
    pub fn interval(&self) -> u32 {
        let hits = self.history.count_ones();
        let span = MAX_INTERVAL - MIN_INTERVAL;
        MAX_INTERVAL - (hits.min(24) * span / 24)
    }

    /// Called once per pass: true if this pass should poll the network.
    pub fn tick(&mut self) -> bool {
        if self.countdown == 0 {
            self.countdown = self.interval() - 1;
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

    #[test]
    fn interval_follows_the_hit_history() {
        let mut p = AdaptivePoller::default();
        assert_eq!(p.interval(), MAX_INTERVAL);
        for _ in 0..32 {
            p.record(true);
        }
        assert_eq!(p.interval(), MIN_INTERVAL);
        for _ in 0..16 {
            p.record(false);
        }
        assert_eq!(p.interval(), MAX_INTERVAL - 16 * 24 / 24);
        for _ in 0..32 {
            p.record(false);
        }
        assert_eq!(p.interval(), MAX_INTERVAL);
    }

    #[test]
    fn polls_once_per_interval() {
        let mut p = AdaptivePoller::default();
        let polls = (0..320).filter(|_| p.tick()).count();
        assert_eq!(polls, 10, "quiet network: 1 in 32");
        for _ in 0..32 {
            p.record(true);
        }
        let polls = (0..320).filter(|_| p.tick()).count();
        assert!(
            (39..=41).contains(&polls),
            "busy network: about 1 in 8, got {polls}"
        );
    }
}
