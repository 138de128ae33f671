//! A blocking send's deadline, read from the clock only once the send has to wait.
//!
//! Nearly every send finds room at once; reading the clock up front cost three
//! `clock_gettime` calls per bulk fragment (a quarter of the DSM's bulk-send time in
//! EM3D's barrier flushes, `perf`). The timeout therefore counts from the first attempt
//! that found the queue full or the pool empty.

use std::time::{Duration, Instant};

/// The deadline of a send that may wait at most `timeout` (`None`: forever), started
/// at its first wait.
#[derive(Debug)]
pub(crate) struct Deadline {
    timeout: Option<Duration>,
    at: Option<Instant>,
}

impl Deadline {
    /// A deadline `timeout` after the first [`Deadline::passed`] call.
    pub(crate) fn new(timeout: Option<Duration>) -> Self {
        Deadline { timeout, at: None }
    }

    /// Whether the deadline has passed; the first call starts it (and returns `false`
    /// unless `timeout` is zero).
    pub(crate) fn passed(&mut self) -> bool {
        let Some(t) = self.timeout else {
            return false;
        };
        let now = Instant::now();
        now >= *self.at.get_or_insert(now + t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_timeout_never_passes() {
        let mut d = Deadline::new(None);
        assert!(!d.passed());
        assert!(!d.passed());
    }

    #[test]
    fn it_starts_at_the_first_wait_and_passes_after_the_timeout() {
        let mut d = Deadline::new(Some(Duration::from_millis(20)));
        std::thread::sleep(Duration::from_millis(30));
        assert!(
            !d.passed(),
            "the clock starts at the first wait, not at new"
        );
        std::thread::sleep(Duration::from_millis(30));
        assert!(d.passed());
        let mut z = Deadline::new(Some(Duration::ZERO));
        assert!(z.passed(), "a zero timeout passes at once");
    }
}
