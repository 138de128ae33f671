//! Asynchronous write tracking: which pages of a range were written since they were last
//! write-protected, without a fault delivered to user space.
//!
//! The runtime detects a cluster's writes with synchronous write-protect faults: the
//! first write to a protected page raises `SIGBUS` in the writing thread, which makes the
//! twin and lifts the protection (≈ 4–5 µs per page on the development VM, nearly all of
//! it the kernel's signal delivery and `UFFDIO_WRITEPROTECT`; Water 512 × 50 on 2×1 took
//! 14,000 of them, ≈ 12 % of its compute threads' time, and ≈ 4,000 with the coherence
//! machine's write-ahead). Linux 6.7 offers another way
//! (`UFFD_FEATURE_WP_ASYNC`): the kernel resolves a write-protect fault itself — it lifts
//! the protection and marks the page *written* — and `PAGEMAP_SCAN` later lists the
//! written pages of a range and protects them again in one walk. A [`WriteTracker`] is a
//! shared-memory range set up that way; `multigrain-dsm`'s `uffd_fault` benchmark
//! measures it against the synchronous fault. The runtime does not use it (yet): a page
//! written without a fault must already have its twin, which the coherence machine
//! does not provide today (see `docs/issue-10-log.md`, nineteenth session).

use std::fs::File;
use std::os::fd::AsFd;

use nix::errno::Errno;
use userfaultfd::{RegisterMode, Uffd};

use super::kernel::{self, Attempt, Features, OpenError};
use super::layout::{LayoutError, PageIndex, PageRange, RegionLayout};
use super::mapping::{Backing, MapError, Mapping};
use super::pagemap::{self, PageRegion};
use super::region::errno_of;

/// Creating a [`WriteTracker`] failed.
#[derive(Debug, thiserror::Error)]
pub enum TrackerError {
    /// Base or length is not usable.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// No userfaultfd with asynchronous write protection (Linux ≥ 6.7 with
    /// `CONFIG_PTE_MARKER_UFFD_WP` offers `WP_ASYNC`; shared memory also needs
    /// `WP_HUGETLBFS_SHMEM`, Linux 5.19).
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The address range could not be reserved.
    #[error(transparent)]
    Map(#[from] MapError),
    /// Registering the range, protecting it or opening `/proc/self/pagemap` failed.
    #[error("{what} failed: {errno}")]
    Setup {
        /// The step that failed.
        what: &'static str,
        /// The error.
        errno: Errno,
    },
}

/// A shared-memory range at a fixed address whose writes the kernel tracks page by page
/// (see the module documentation). Every page starts write-protected and unwritten.
pub struct WriteTracker {
    layout: RegionLayout,
    uffd: Uffd,
    pagemap: File,
    runs: Vec<PageRegion>,
    // Dropped last: the userfaultfd registration and the scans refer to it.
    _mapping: Mapping,
}

impl std::fmt::Debug for WriteTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteTracker")
            .field("base", &format_args!("{:#x}", self.layout.base()))
            .field("pages", &self.layout.pages())
            .finish()
    }
}

impl WriteTracker {
    /// The features the tracker's userfaultfd needs.
    pub const FEATURES: Features = Features::PAGEFAULT_FLAG_WP
        .union(Features::WP_ASYNC)
        .union(Features::WP_UNPOPULATED)
        .union(Features::WP_HUGETLBFS_SHMEM);

    /// Reserves `len` bytes at `base` (page-aligned; backed by a memfd, as the runtime's
    /// regions are), registers them with an asynchronous-write-protect userfaultfd and
    /// write-protects them all (never-touched pages included: `WP_UNPOPULATED`).
    ///
    /// # Errors
    /// [`TrackerError`]: the kernel lacks a feature of [`WriteTracker::FEATURES`] (the
    /// error names the missing ones), the range is taken, or a setup call failed.
    pub fn new(base: usize, len: usize) -> Result<WriteTracker, TrackerError> {
        let layout = RegionLayout::new(base, len)?;
        let (uffd, _) = kernel::open(Attempt::standard(true), Self::FEATURES, Features::empty())?;
        let mapping = Mapping::reserve(layout, Backing::SharedMemory)?;
        uffd.register_with_mode(
            layout.base() as *mut libc::c_void,
            layout.len(),
            RegisterMode::WRITE_PROTECT,
        )
        .map_err(|e| TrackerError::Setup {
            what: "registering the range for write-protect faults",
            errno: errno_of(e),
        })?;
        let pagemap = File::open("/proc/self/pagemap").map_err(|e| TrackerError::Setup {
            what: "opening /proc/self/pagemap",
            errno: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })?;
        let tracker = WriteTracker {
            layout,
            uffd,
            pagemap,
            runs: vec![PageRegion::default(); 256],
            _mapping: mapping,
        };
        tracker.protect_all().map_err(|errno| TrackerError::Setup {
            what: "write-protecting the range",
            errno,
        })?;
        Ok(tracker)
    }

    /// First address of the range (the application writes through raw pointers from
    /// here; a write never faults to user space).
    pub fn as_ptr(&self) -> *mut u8 {
        self.layout.base() as *mut u8
    }

    /// Pages in the range.
    pub fn pages(&self) -> usize {
        self.layout.pages()
    }

    /// Write-protects every page (one `UFFDIO_WRITEPROTECT`): afterwards no page counts
    /// as written.
    ///
    /// # Errors
    /// The `ioctl`'s error.
    pub fn protect_all(&self) -> Result<(), Errno> {
        self.uffd
            .write_protect(self.layout.base() as *mut libc::c_void, self.layout.len())
            .map_err(errno_of)
    }

    /// Appends to `out` the runs of pages written since they were last protected, in
    /// address order, and protects them again — one `PAGEMAP_SCAN` walk (more only when
    /// the written pages form over 256 runs). Returns the number of pages written.
    ///
    /// A write racing with the walk is either listed now or at the next call, never lost:
    /// the walk protects a page in the same step that reads its written bit.
    ///
    /// # Errors
    /// The `ioctl`'s error.
    pub fn take_written(&mut self, out: &mut Vec<PageRange>) -> Result<usize, Errno> {
        let (base, end) = (self.layout.base(), self.layout.end());
        let mut from = base;
        let mut pages = 0;
        while from < end {
            let (n, walk_end) =
                pagemap::take_written(self.pagemap.as_fd(), from, end, &mut self.runs)?;
            for r in &self.runs[..n] {
                let first = (r.start as usize - base) / super::PAGE_SIZE;
                let count = (r.end - r.start) as usize / super::PAGE_SIZE;
                out.push(PageRange::new(PageIndex(first), count));
                pages += count;
            }
            if walk_end <= from {
                break;
            }
            from = walk_end;
        }
        Ok(pages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uffd::{PAGE_SIZE, probe};

    /// Whether this kernel offers asynchronous write protection; says so loudly when not.
    fn supported() -> bool {
        match probe(true) {
            Ok(k) if k.available.contains(WriteTracker::FEATURES) => true,
            other => {
                eprintln!(
                    "NOT TESTED: this kernel offers no asynchronous write protection \
                     (needs Linux >= 6.7): {other:?}"
                );
                false
            }
        }
    }

    fn write(t: &WriteTracker, page: usize, value: u8) {
        assert!(page < t.pages());
        // SAFETY: the page lies inside the tracker's mapping, which lives as long as `t`;
        // only raw pointers reach it.
        unsafe { t.as_ptr().add(page * PAGE_SIZE + 8).write_volatile(value) };
    }

    fn read(t: &WriteTracker, page: usize) -> u8 {
        assert!(page < t.pages());
        // SAFETY: as in `write`.
        unsafe { t.as_ptr().add(page * PAGE_SIZE + 8).read_volatile() }
    }

    #[test]
    fn written_pages_are_listed_once_and_reads_are_not() {
        if !supported() {
            return;
        }
        let mut t = WriteTracker::new(0x4c00_0000_0000, 64 * PAGE_SIZE).expect("tracker");
        let mut runs = Vec::new();
        assert_eq!(t.take_written(&mut runs).unwrap(), 0, "{runs:?}");
        for p in [3, 4, 10, 63] {
            write(&t, p, 7);
        }
        assert_eq!(read(&t, 20), 0);
        assert_eq!(t.take_written(&mut runs).unwrap(), 4);
        assert_eq!(
            runs,
            [
                PageRange::new(PageIndex(3), 2),
                PageRange::new(PageIndex(10), 1),
                PageRange::new(PageIndex(63), 1)
            ]
        );
        // Protected again by the walk: nothing new until the next write.
        runs.clear();
        assert_eq!(t.take_written(&mut runs).unwrap(), 0, "{runs:?}");
        write(&t, 4, 9);
        assert_eq!(read(&t, 4), 9, "the write went through without a fault");
        assert_eq!(t.take_written(&mut runs).unwrap(), 1);
        assert_eq!(runs, [PageRange::new(PageIndex(4), 1)]);
    }

    #[test]
    fn more_runs_than_one_walk_holds_are_all_listed() {
        if !supported() {
            return;
        }
        let mut t = WriteTracker::new(0x4c40_0000_0000, 1024 * PAGE_SIZE).expect("tracker");
        // 512 runs of one page each: two walks of 256.
        for p in (0..1024).step_by(2) {
            write(&t, p, 1);
        }
        let mut runs = Vec::new();
        assert_eq!(t.take_written(&mut runs).unwrap(), 512);
        assert_eq!(runs.len(), 512);
        assert!(
            runs.iter()
                .zip((0..1024).step_by(2))
                .all(|(r, p)| *r == PageRange::one(PageIndex(p)))
        );
        t.protect_all().unwrap();
        runs.clear();
        assert_eq!(t.take_written(&mut runs).unwrap(), 0);
    }
}
