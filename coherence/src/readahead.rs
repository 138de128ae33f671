//! Sequential read-ahead of hlrc prefetching: how many pages a demand fetch requests
//! after the faulting one.
//!
//! A fault that continues the pages the previous demand fetch prefetched (a sweep over
//! remote pages, like Water's inter-molecular force loop) doubles the window, up to
//! [`MAX_READAHEAD`] pages; any other fault starts again from the configured window
//! ([`crate::Config::prefetch`]). A cluster's threads share one window, so two
//! interleaved sweeps (two threads of a cluster faulting in turn) keep it at the
//! configured size.
//!
//! Source: the Linux page cache's sequential read-ahead (a window that doubles while
//! reads stay sequential; `mm/readahead.c`), applied to the per-miss prefetch of
//! ArgoDSM (Kaxiras et al., HPDC 2015, §4: 8 pages per miss).

/// The most pages a demand fetch requests after the faulting one.
pub const MAX_READAHEAD: u32 = 63;

/// The read-ahead state of one cluster: the last demand-fetched page and the window
/// its fetch used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Readahead {
    last: Option<(u32, u32)>,
}

impl Readahead {
    /// The window (pages after `page`) for a demand fetch of `page`, given the
    /// configured window `base`: twice the previous window plus one (up to
    /// [`MAX_READAHEAD`]) if `page` lies after the previous demand fetch and at most
    /// one window past the pages it prefetched, else `base`. A `base` of 0 (prefetching
    /// off) stays 0.
    pub(crate) fn window(&mut self, page: u32, base: u32) -> u32 {
        let window = match self.last {
            Some((last, w))
                if base > 0
                    && page > last
                    && u64::from(page) <= u64::from(last) + 2 * (u64::from(w) + 1) =>
            {
                (2 * w + 1).clamp(base, MAX_READAHEAD.max(base))
            }
            _ => base,
        };
        self.last = Some((page, window));
        window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_doubles_the_window_up_to_the_maximum() {
        let mut r = Readahead::default();
        let mut page = 100;
        let mut windows = Vec::new();
        for _ in 0..6 {
            let w = r.window(page, 7);
            windows.push(w);
            page += w + 1;
        }
        assert_eq!(windows, [7, 15, 31, 63, 63, 63]);
    }

    #[test]
    fn a_fault_elsewhere_starts_again_and_zero_stays_off() {
        let mut r = Readahead::default();
        assert_eq!(r.window(10, 7), 7);
        assert_eq!(r.window(18, 7), 15);
        // backwards, or beyond one window past the prefetched pages: not sequential
        assert_eq!(r.window(5, 7), 7);
        assert_eq!(r.window(13, 7), 15);
        assert_eq!(r.window(13 + 2 * 16 + 1, 7), 7);
        let mut off = Readahead::default();
        assert_eq!(off.window(1, 0), 0);
        assert_eq!(off.window(2, 0), 0);
    }

    #[test]
    fn a_configured_window_above_the_maximum_is_kept() {
        let mut r = Readahead::default();
        assert_eq!(r.window(0, 64), 64);
        assert_eq!(r.window(65, 64), 64);
    }
}
