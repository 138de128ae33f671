//! Write-ahead of hlrc: a write fault that continues a sweep of write faults also opens
//! the next read-only pages, so that the sweep takes one fault per `window + 1` pages.
//!
//! Opening a page is what its write fault would do — take its twin, lift its write
//! protection — done before the write instead of in the `SIGBUS` handler of the writing
//! thread (≈ 4.8 µs a fault on the development VM, nearly all of it the kernel's signal
//! delivery and `UFFDIO_WRITEPROTECT`; the twin and the unprotect alone are ≈ 1.3 µs).
//! A page opened ahead and not written costs its twin and the diffs of the next
//! flushes, which find it unchanged and close it ([`crate::Config::idle_flushes`]), so
//! only a fault that continues the previous one's pages opens any: one at the page
//! right after them, or within one window past it (pages written since the previous
//! fault may have stayed open, so a sweep skips them). Water's force sweep writes every
//! molecule's page in turn (512 molecules × 50 steps on 2×1: 14,000 write faults, 5,000
//! with a window of 2, 3,400 with 4); a cluster's threads share one state, so two
//! interleaved sweeps mostly open nothing.
//!
//! Source: this project's (issue 10), modelled on sequential read-ahead
//! ([`crate::readahead`]); writes only ever make pages open earlier, which the
//! protocol allows at any time (a flush diffs every open page against its twin).

/// The write-ahead state of one cluster: the page after the last one the previous
/// write fault opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct WriteAhead {
    next: Option<u32>,
}

impl WriteAhead {
    /// How many pages after `page` a write fault on it may open, given the configured
    /// `window`: `window` if `page` lies at or at most `window` pages past the page
    /// after the previous fault's pages, else 0 (and always 0 when `window` is 0).
    pub(crate) fn window(&self, page: u32, window: u32) -> u32 {
        match self.next {
            Some(next)
                if window > 0
                    && page >= next
                    && u64::from(page) <= u64::from(next) + u64::from(window) =>
            {
                window
            }
            _ => 0,
        }
    }

    /// Notes that a write fault opened pages up to `last` (itself included).
    pub(crate) fn opened(&mut self, last: u32) {
        self.next = last.checked_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_fault_that_continues_the_previous_pages_opens_ahead() {
        let mut w = WriteAhead::default();
        assert_eq!(w.window(10, 4), 0, "the first fault of a sweep");
        w.opened(10);
        assert_eq!(w.window(11, 4), 4, "the next page");
        w.opened(15);
        assert_eq!(w.window(16, 4), 4);
        assert_eq!(w.window(20, 4), 4, "pages 16–19 may still be open");
        assert_eq!(w.window(21, 4), 0, "beyond one window past");
        assert_eq!(w.window(15, 4), 0, "backwards");
        assert_eq!(w.window(16, 0), 0, "off");
        w.opened(u32::MAX);
        assert_eq!(w.window(0, 4), 0);
    }
}
