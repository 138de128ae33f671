//! `PAGEMAP_SCAN` (Linux 6.7): the `ioctl` on `/proc/self/pagemap` that lists the pages
//! of a range in given categories and, with `PM_SCAN_WP_MATCHING`, write-protects the
//! pages it lists in the same walk. With a userfaultfd in `UFFD_FEATURE_WP_ASYNC` mode it
//! answers "which pages were written since I last protected them?" in one system call
//! (see [`WriteTracker`](super::WriteTracker)).
//!
//! Values from `include/uapi/linux/fs.h` (Linux 6.18); the kernel's documentation is
//! `Documentation/admin-guide/mm/pagemap.rst`, "Pagemap Scan IOCTL".

use nix::errno::Errno;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `PAGE_IS_WRITTEN`: the page was written since it was last write-protected through an
/// asynchronous-write-protect userfaultfd (or was never protected).
pub(crate) const PAGE_IS_WRITTEN: u64 = 1 << 1;
/// `PM_SCAN_WP_MATCHING`: write-protect the pages that match, in the same walk.
const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
/// `PM_SCAN_CHECK_WPASYNC`: fail with `EPERM` unless the range is registered with an
/// asynchronous-write-protect userfaultfd.
const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;

/// `struct pm_scan_arg`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `struct page_region`: one run of pages `[start, end)` (addresses) with the categories
/// of `return_mask` it has.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PageRegion {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Categories of the run (masked by the request's `return_mask`).
    pub categories: u64,
}

nix::ioctl_readwrite!(
    /// `PAGEMAP_SCAN`.
    ///
    /// # Safety
    ///
    /// `fd` must be an open `/proc/<pid>/pagemap`, `data` must point to a writable
    /// `PmScanArg` whose `vec` points to `vec_len` writable `PageRegion`s.
    ioctl_pagemap_scan,
    b'f',
    16,
    PmScanArg
);

/// Lists the written pages of `[start, end)` into `out` and write-protects them, in one
/// walk; returns the number of runs written to `out` and the address where the walk
/// stopped (`end` unless `out` filled up: call again from there).
///
/// # Errors
/// `EPERM` when the range is not registered with an asynchronous-write-protect
/// userfaultfd, `EINVAL` for an unaligned range, `ENOTTY` before Linux 6.7.
pub(crate) fn take_written(
    pagemap: BorrowedFd<'_>,
    start: usize,
    end: usize,
    out: &mut [PageRegion],
) -> Result<(usize, usize), Errno> {
    let mut arg = PmScanArg {
        size: std::mem::size_of::<PmScanArg>() as u64,
        flags: PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
        start: start as u64,
        end: end as u64,
        vec: out.as_mut_ptr() as u64,
        vec_len: out.len() as u64,
        category_mask: PAGE_IS_WRITTEN,
        return_mask: PAGE_IS_WRITTEN,
        ..PmScanArg::default()
    };
    // SAFETY: `pagemap` is this process's pagemap file (the caller's contract, kept by
    // `WriteTracker`), `arg` is a live `struct pm_scan_arg`, and `vec`/`vec_len` describe
    // `out`, a writable slice the kernel fills with at most `vec_len` entries. The walk
    // only changes page protections of the range, which no Rust reference relies on
    // (the range is reached through raw pointers).
    let runs = unsafe { ioctl_pagemap_scan(pagemap.as_raw_fd(), &mut arg) }?;
    let runs = usize::try_from(runs).map_err(|_| Errno::EOVERFLOW)?;
    Ok((runs.min(out.len()), arg.walk_end as usize))
}
