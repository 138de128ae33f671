//! The reserved address range of a region: `mmap(MAP_FIXED_NOREPLACE)`, `madvise`,
//! `munmap`, and for [`Backing::SharedMemory`] the memfd and the second, unregistered
//! *runtime view* of the same memory. All unsafe code of the mapping lives here.

use super::layout::{PAGE_SIZE, PageIndex, RegionLayout};
use nix::errno::Errno;
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags, madvise, mmap, mmap_anonymous, munmap};
use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

/// What memory backs a region.
///
/// Measured on the development VM (`cargo bench -p multigrain-dsm --bench dsm`, Linux
/// 6.18, medians): `UFFDIO_COPY` of one page 1.4 µs anonymous vs 2.1 µs shared memory;
/// invalidating one page 1.9 µs (`MADV_DONTNEED`) vs 4.0 µs (`MADV_REMOVE`), 64 pages in
/// one call 15 µs vs 41 µs. In exchange the shared-memory backing has a runtime view
/// through which a home applies a diff (10% of the words) to a page that application
/// threads see read-only or are writing, in 0.16 µs and without touching their mapping;
/// on anonymous memory the same takes 3.8 µs (copy the read-only page, apply, drop it,
/// reinstall it read-only) and threads touching the page meanwhile fault
/// (`multigrain_dsm::bench::ApplyChoice`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backing {
    /// Private anonymous memory (`MAP_PRIVATE | MAP_ANONYMOUS`). Invalidation is
    /// `MADV_DONTNEED`. No runtime view: the view operations return
    /// [`OpError::NoView`](super::OpError::NoView).
    #[default]
    Anonymous,
    /// A memfd (shmem) mapped `MAP_SHARED` at the region's base (registered with
    /// userfaultfd, needs `UFFD_FEATURE_WP_HUGETLBFS_SHMEM`, Linux 5.19) and mapped a second
    /// time at an address the kernel picks: the *runtime view*, never registered, always
    /// readable and writable, showing the same pages. Invalidation punches a hole in the
    /// file (`MADV_REMOVE`): `MADV_DONTNEED` would only unmap the page, which stays in the
    /// page cache and would be mapped again without a fault — unless the region is also
    /// registered for minor faults ([`RegionConfig::minor_faults`]), which then report
    /// that access, and invalidation is `MADV_DONTNEED`.
    ///
    /// Rule for view users: never read or write a page through the view while it is
    /// missing. Without minor faults, a shmem hole touched through the view is allocated
    /// (zero-filled) in the page cache, and the application's next access then maps it
    /// without a userfaultfd fault. That breaks the coherence protocol's view of the page,
    /// not memory safety.
    ///
    /// [`RegionConfig::minor_faults`]: super::RegionConfig::minor_faults
    SharedMemory,
}

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
    /// Creating or sizing the memfd of a shared-memory region failed.
    #[error("creating the memfd backing the DSM region failed: {errno}")]
    Memfd {
        /// The error.
        errno: Errno,
    },
    /// Mapping the runtime view of a shared-memory region failed.
    #[error("mapping the runtime view of the DSM region failed: {errno}")]
    View {
        /// The error.
        errno: Errno,
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

/// The memfd and the runtime view of a [`Backing::SharedMemory`] region.
#[derive(Debug)]
struct View {
    /// Keeps the file alive (the mappings would too; this makes ownership explicit).
    _memfd: OwnedFd,
    /// Start of the second mapping of the whole file.
    base: usize,
}

/// The region's read/write mapping at a fixed address (anonymous private, or a memfd
/// mapped shared plus its runtime view), unmapped on drop.
///
/// Invariant: `layout.base() .. layout.end()` and, with a view, `view.base .. view.base +
/// layout.len()` are mappings this value created and owns; nothing else unmaps or remaps
/// them while the value lives.
#[derive(Debug)]
pub(crate) struct Mapping {
    layout: RegionLayout,
    view: Option<View>,
}

/// `mmap` at `start` without replacing anything, checking that the kernel honoured it.
fn map_fixed(
    start: usize,
    end: usize,
    len: NonZeroUsize,
    memfd: Option<&OwnedFd>,
) -> Result<(), MapError> {
    let addr = NonZeroUsize::new(start).expect("layout base is non-zero");
    let prot = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
    let fixed = MapFlags::MAP_NORESERVE | MapFlags::MAP_FIXED_NOREPLACE;
    let got = match memfd {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping, so no memory
        // that Rust or anyone else uses can be affected; the new mapping is owned by the
        // caller's `Mapping`.
        None => unsafe { mmap_anonymous(Some(addr), len, prot, MapFlags::MAP_PRIVATE | fixed) },
        // SAFETY: as above; the file is a memfd of at least `len` bytes owned by the caller.
        Some(fd) => unsafe { mmap(Some(addr), len, prot, MapFlags::MAP_SHARED | fixed, fd, 0) },
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
    Ok(())
}

impl Mapping {
    /// Reserves `layout` with `MAP_FIXED_NOREPLACE | MAP_NORESERVE` (and, for shared
    /// memory, creates the memfd and maps the runtime view); transparent huge pages are
    /// disabled on it so that every install, protection and invalidation acts on 4 KiB
    /// pages.
    pub(crate) fn reserve(layout: RegionLayout, backing: Backing) -> Result<Mapping, MapError> {
        let (start, end) = (layout.base(), layout.end());
        let len = NonZeroUsize::new(layout.len()).expect("layout length is non-zero");
        let memfd = match backing {
            Backing::Anonymous => None,
            Backing::SharedMemory => {
                let fd = memfd_create("multigrain-dsm", MFdFlags::MFD_CLOEXEC)
                    .map_err(|errno| MapError::Memfd { errno })?;
                let size = i64::try_from(layout.len()).map_err(|_| MapError::Memfd {
                    errno: Errno::EFBIG,
                })?;
                nix::unistd::ftruncate(&fd, size).map_err(|errno| MapError::Memfd { errno })?;
                Some(fd)
            }
        };
        map_fixed(start, end, len, memfd.as_ref())?;
        let mut mapping = Mapping { layout, view: None };
        if let Some(fd) = memfd {
            // SAFETY: a new shared mapping of the memfd at an address the kernel picks,
            // so nothing existing is affected; owned by `mapping` from here on.
            let view = unsafe {
                mmap(
                    None,
                    len,
                    ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                    MapFlags::MAP_SHARED | MapFlags::MAP_NORESERVE,
                    &fd,
                    0,
                )
            };
            // On error `mapping` drops here and unmaps the fixed range.
            let view = view.map_err(|errno| MapError::View { errno })?;
            mapping.view = Some(View {
                _memfd: fd,
                base: view.as_ptr() as usize,
            });
            if let Some(v) = mapping.view_base() {
                // SAFETY: the view mapping was just created and is owned by `mapping`.
                let _ = unsafe {
                    madvise(
                        NonNull::new(v as *mut c_void).expect("mmap never returns null"),
                        layout.len(),
                        MmapAdvise::MADV_NOHUGEPAGE,
                    )
                };
            }
        }
        // Best effort: a kernel without THP returns EINVAL, which changes nothing.
        let _ = mapping.advise(start, layout.len(), MmapAdvise::MADV_NOHUGEPAGE);
        Ok(mapping)
    }

    /// The layout.
    pub(crate) fn layout(&self) -> RegionLayout {
        self.layout
    }

    /// The backing.
    pub(crate) fn backing(&self) -> Backing {
        if self.view.is_some() {
            Backing::SharedMemory
        } else {
            Backing::Anonymous
        }
    }

    /// Start address of the runtime view, for shared memory.
    pub(crate) fn view_base(&self) -> Option<usize> {
        self.view.as_ref().map(|v| v.base)
    }

    /// The 8-byte words of `page` in the runtime view, or `None` without a view or for a
    /// page outside the region.
    ///
    /// The words live as long as `self`. They are shared with the application's mapping
    /// (other threads, other pointers) and must only be accessed atomically.
    pub(crate) fn view_words(&self, page: PageIndex) -> Option<&[AtomicU64]> {
        let base = self.view_base()?;
        if page.0 >= self.layout.pages() {
            return None;
        }
        let ptr = (base + page.0 * PAGE_SIZE) as *const AtomicU64;
        // SAFETY: `ptr` is the page-aligned start of a page inside the view mapping, which
        // is readable and writable for the life of `self` (the returned borrow); 512
        // AtomicU64 fill exactly one page. All accesses to the memory go through atomics
        // (this slice) or through the kernel (userfaultfd copies), never through Rust
        // references to non-atomic data, so sharing it is sound. `AtomicU64` has the size
        // and alignment of `u64` on x86-64.
        Some(unsafe { std::slice::from_raw_parts(ptr, PAGE_SIZE / 8) })
    }

    /// Drops the contents of `addr .. addr + len`, which must lie inside the mapping
    /// (checked): `MADV_DONTNEED` for anonymous memory; for shared memory `MADV_REMOVE`
    /// (punch a hole in the memfd: the next access faults as a missing page) or, with
    /// `keep_cache` (a region registered for minor faults), `MADV_DONTNEED`, which only
    /// unmaps the pages: the memfd keeps them and the next access faults as a minor fault.
    pub(crate) fn discard(&self, addr: usize, len: usize, keep_cache: bool) -> Result<(), Errno> {
        let advice = match self.backing() {
            Backing::Anonymous => MmapAdvise::MADV_DONTNEED,
            Backing::SharedMemory if keep_cache => MmapAdvise::MADV_DONTNEED,
            Backing::SharedMemory => MmapAdvise::MADV_REMOVE,
        };
        self.advise(addr, len, advice)
    }

    /// Allocates the memfd's pages behind `addr .. addr + len` (inside the mapping,
    /// checked) and maps them in the runtime view, zero-filled, with one
    /// `madvise(MADV_POPULATE_WRITE)` on the view (Linux 5.14); pages the memfd already
    /// holds keep their contents. The region's own mapping is left alone. (`fallocate`
    /// alone is not enough: it leaves the pages unzeroed and unmapped in the view, so
    /// the first write through the view still takes a page fault.) `EINVAL` for an
    /// anonymous region.
    pub(crate) fn populate(&self, addr: usize, len: usize) -> Result<(), Errno> {
        let Some(view) = self.view_base() else {
            return Err(Errno::EINVAL);
        };
        self.check_inside(addr, len)?;
        if len == 0 {
            return Ok(());
        }
        let start = view + (addr - self.layout.base());
        let ptr = NonNull::new(start as *mut c_void).ok_or(Errno::EINVAL)?;
        // SAFETY: the range lies inside the view mapping this value owns (checked above).
        // `MADV_POPULATE_WRITE` faults the pages in as a write would, without changing
        // any byte: pages the memfd holds keep their contents, new ones are zero.
        unsafe { madvise(ptr, len, MmapAdvise::MADV_POPULATE_WRITE) }
    }

    /// `EINVAL` unless `addr .. addr + len` lies inside the region's range.
    fn check_inside(&self, addr: usize, len: usize) -> Result<(), Errno> {
        let inside = addr >= self.layout.base()
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.layout.end());
        if inside { Ok(()) } else { Err(Errno::EINVAL) }
    }

    fn advise(&self, addr: usize, len: usize, advice: MmapAdvise) -> Result<(), Errno> {
        if len == 0 {
            return Ok(());
        }
        self.check_inside(addr, len)?;
        let ptr = NonNull::new(addr as *mut c_void).ok_or(Errno::EINVAL)?;
        // SAFETY: the range lies inside the mapping this value owns (checked above). The
        // advice used here only drops page contents of the region (memory addressed
        // through raw pointers and atomics only, whose contents are re-supplied through
        // userfaultfd) or changes huge-page policy.
        unsafe { madvise(ptr, len, advice) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Some(v) = self.view.take() {
            let ptr = NonNull::new(v.base as *mut c_void).expect("non-zero view");
            // SAFETY: the view was created by `reserve` and is owned by `self`; borrows of
            // it (`view_words`) end with `self`.
            if let Err(e) = unsafe { munmap(ptr, self.layout.len()) } {
                tracing::error!("munmap of the DSM runtime view failed: {e}");
            }
        }
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
