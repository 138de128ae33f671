//! The reserved address range of a region: `mmap(MAP_FIXED_NOREPLACE)`, `madvise`,
//! `munmap`. All unsafe code of the mapping lives here.

use super::layout::RegionLayout;
use nix::errno::Errno;
use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags, madvise, mmap_anonymous, munmap};
use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::ptr::NonNull;

/// Reserving the address range failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// Something is already mapped in the range (`MAP_FIXED_NOREPLACE` returned `EEXIST`).
    #[error(
        "the DSM region {start:#x}..{end:#x} cannot be reserved: part of that address range is \
         already mapped in this process (choose another base address in the cluster \
         configuration; every cluster must use the same one)"
    )]
    AddressTaken {
        /// First address of the requested range.
        start: usize,
        /// One past the last address.
        end: usize,
    },
    /// The kernel ignored `MAP_FIXED_NOREPLACE` (Linux < 4.17) and mapped elsewhere.
    #[error(
        "the DSM region {start:#x}..{end:#x} cannot be reserved: the kernel placed the mapping \
         at {got:#x} (MAP_FIXED_NOREPLACE needs Linux >= 4.17)"
    )]
    Misplaced {
        /// First address of the requested range.
        start: usize,
        /// One past the last address.
        end: usize,
        /// Where the kernel put it (already unmapped again).
        got: usize,
    },
    /// Another `mmap` error (`ENOMEM`: address beyond the task size or map count limit).
    #[error("mmap of the DSM region {start:#x}..{end:#x} failed: {errno}")]
    Mmap {
        /// First address of the requested range.
        start: usize,
        /// One past the last address.
        end: usize,
        /// The error.
        errno: Errno,
    },
}

/// An anonymous private read/write mapping at a fixed address, unmapped on drop.
///
/// Invariant: `layout.base() .. layout.end()` is a mapping this value created and owns;
/// nothing else unmaps or remaps it while the value lives.
#[derive(Debug)]
pub(crate) struct Mapping {
    layout: RegionLayout,
}

impl Mapping {
    /// Reserves `layout` with `MAP_FIXED_NOREPLACE | MAP_NORESERVE`; transparent huge pages
    /// are disabled on it so that every install, protection and invalidation acts on
    /// 4 KiB pages.
    pub(crate) fn reserve(layout: RegionLayout) -> Result<Mapping, MapError> {
        let (start, end) = (layout.base(), layout.end());
        let addr = NonZeroUsize::new(start).expect("layout base is non-zero");
        let len = NonZeroUsize::new(layout.len()).expect("layout length is non-zero");
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping, so no memory
        // that Rust or anyone else uses can be affected; the new mapping is owned by the
        // returned value.
        let got = unsafe {
            mmap_anonymous(
                Some(addr),
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE | MapFlags::MAP_FIXED_NOREPLACE,
            )
        };
        let got = match got {
            Ok(p) => p,
            Err(Errno::EEXIST) => return Err(MapError::AddressTaken { start, end }),
            Err(errno) => return Err(MapError::Mmap { start, end, errno }),
        };
        if got.as_ptr() as usize != start {
            // SAFETY: `got` is the mapping of `len` bytes that the call above just created.
            let _ = unsafe { munmap(got, len.get()) };
            return Err(MapError::Misplaced {
                start,
                end,
                got: got.as_ptr() as usize,
            });
        }
        let mapping = Mapping { layout };
        // Best effort: a kernel without THP returns EINVAL, which changes nothing.
        let _ = mapping.advise(start, layout.len(), MmapAdvise::MADV_NOHUGEPAGE);
        Ok(mapping)
    }

    /// The layout.
    pub(crate) fn layout(&self) -> RegionLayout {
        self.layout
    }

    /// `madvise(MADV_DONTNEED)` on `addr .. addr + len`, which must lie inside the
    /// mapping (checked). Private anonymous pages are dropped; the next access faults as
    /// a missing page.
    pub(crate) fn discard(&self, addr: usize, len: usize) -> Result<(), Errno> {
        self.advise(addr, len, MmapAdvise::MADV_DONTNEED)
    }

    fn advise(&self, addr: usize, len: usize, advice: MmapAdvise) -> Result<(), Errno> {
        if len == 0 {
            return Ok(());
        }
        let inside = addr >= self.layout.base()
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.layout.end());
        if !inside {
            return Err(Errno::EINVAL);
        }
        let ptr = NonNull::new(addr as *mut c_void).ok_or(Errno::EINVAL)?;
        // SAFETY: the range lies inside the mapping this value owns (checked above). The
        // advice used here only drops page contents of private anonymous memory (the
        // region is memory addressed through raw pointers only, and its contents are
        // re-supplied through userfaultfd) or changes huge-page policy.
        unsafe { madvise(ptr, len, advice) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let ptr = NonNull::new(self.layout.base() as *mut c_void).expect("non-zero base");
        // SAFETY: the mapping was created by `reserve` and is owned by `self`; after drop
        // nothing refers to it (the region's owner joins its users first).
        if let Err(e) = unsafe { munmap(ptr, self.layout.len()) } {
            tracing::error!(
                "munmap of DSM region {:#x}..{:#x} failed: {e}",
                self.layout.base(),
                self.layout.end()
            );
        }
    }
}
