//! A DSM region: the reserved range, its userfaultfd, the page operations, and how faults
//! reach the resolver.

use super::handler::Handlers;
use super::kernel::{self, Attempt, Features, KernelSupport, OpenError};
use super::layout::{
    DEFAULT_REGION_BASE, DEFAULT_REGION_LEN, LayoutError, OutOfRange, PAGE_SIZE, PageIndex,
    PageRange, RegionLayout, coalesce,
};
use super::mapping::{Backing, MapError, Mapping};
use super::marks::WriteMarks;
use super::resolver::FaultResolver;
use super::signal::{self, SignalError, Slot};
use super::sys;
use nix::errno::Errno;
use std::ffi::c_void;
use std::fmt;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use userfaultfd::{IoctlFlags, RegisterMode};

/// How faults reach the resolver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// `UFFD_FEATURE_SIGBUS`: the faulting thread gets `SIGBUS` and runs the resolver
    /// itself, in the process-wide handler ([`install_sigbus_handler`]). Fastest (one
    /// signal delivery, no thread switch) and costs nothing while idle. See the
    /// [`FaultResolver`] contract. Threads that touch the region must not block `SIGBUS`
    /// (the kernel kills a process whose fault signal is blocked), and system calls that
    /// access a missing page fail with `EFAULT` (touch the page first).
    ///
    /// [`install_sigbus_handler`]: super::install_sigbus_handler
    Signal,
    /// Fault events are read from the userfaultfd by `threads` handler threads. After
    /// each event a thread keeps polling for `spin` before it sleeps in `poll(2)` again:
    /// `Duration::ZERO` always sleeps (slow wake-up), `Duration::MAX` never sleeps (burns
    /// a core per thread), in between is the hybrid.
    Threads {
        /// Number of handler threads (at least 1).
        threads: usize,
        /// How long a handler thread busy-polls after an event before it blocks.
        spin: Duration,
    },
}

impl Delivery {
    /// One handler thread that always blocks in `poll(2)`.
    pub const BLOCKING: Delivery = Delivery::Threads {
        threads: 1,
        spin: Duration::ZERO,
    };
    /// One handler thread that never blocks.
    pub const BUSY_POLL: Delivery = Delivery::Threads {
        threads: 1,
        spin: Duration::MAX,
    };

    /// One handler thread that spins for `spin` after each event, then blocks.
    pub const fn hybrid(spin: Duration) -> Delivery {
        Delivery::Threads { threads: 1, spin }
    }
}

/// Where and how to create a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionConfig {
    /// Base address, the same in every cluster process; page-aligned.
    pub base: usize,
    /// Length in bytes; a multiple of [`PAGE_SIZE`].
    pub len: usize,
    /// How faults reach the resolver.
    pub delivery: Delivery,
    /// Create the userfaultfd with `UFFD_USER_MODE_ONLY` (default `true`): works without
    /// privileges on Linux ≥ 5.11. Kernel-mode accesses to a missing page (a `read(2)`
    /// into the region, a `futex` on it) then fail with `EFAULT` instead of faulting;
    /// touch such pages first. With [`Delivery::Signal`] that is the case either way.
    pub user_mode_only: bool,
    /// What memory backs the region (default [`Backing::Anonymous`]).
    pub backing: Backing,
    /// With [`Backing::SharedMemory`]: serve pages the memfd already holds as *minor*
    /// faults (default `false`; see [`RegionOps::minor_faults`] for what changes and for
    /// the stricter install precondition). Used only where the kernel offers
    /// `UFFD_FEATURE_MINOR_SHMEM` and `UFFDIO_CONTINUE_MODE_WP` (Linux ≥ 6.4); elsewhere
    /// the region works as without it.
    pub minor_faults: bool,
}

impl Default for RegionConfig {
    fn default() -> Self {
        RegionConfig {
            base: DEFAULT_REGION_BASE,
            len: DEFAULT_REGION_LEN,
            delivery: Delivery::Signal,
            user_mode_only: true,
            backing: Backing::Anonymous,
            minor_faults: false,
        }
    }
}

impl RegionConfig {
    /// A region of `len` bytes at `base`, signal delivery, user-mode-only descriptor.
    pub fn new(base: usize, len: usize) -> Self {
        RegionConfig {
            base,
            len,
            ..RegionConfig::default()
        }
    }

    /// The same configuration with another delivery.
    pub fn with_delivery(self, delivery: Delivery) -> Self {
        RegionConfig { delivery, ..self }
    }

    /// The same configuration with another backing.
    pub fn with_backing(self, backing: Backing) -> Self {
        RegionConfig { backing, ..self }
    }

    /// The same configuration with minor faults asked for or not (see
    /// [`RegionConfig::minor_faults`]).
    pub fn with_minor_faults(self, minor_faults: bool) -> Self {
        RegionConfig {
            minor_faults,
            ..self
        }
    }
}

/// Creating a region failed.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// Base or length is not usable.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// No userfaultfd with the needed features.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The address range could not be reserved.
    #[error(transparent)]
    Map(#[from] MapError),
    /// `UFFDIO_REGISTER` for missing and write-protect (and minor) faults failed.
    #[error(
        "registering {start:#x}..{end:#x} with userfaultfd for MISSING|WP faults (and MINOR \
         with minor faults on) failed: {errno} (write-protection of anonymous memory needs \
         Linux >= 5.7 with CONFIG_HAVE_ARCH_USERFAULTFD_WP)"
    )]
    Register {
        /// First address.
        start: usize,
        /// One past the last address.
        end: usize,
        /// The error.
        errno: Errno,
    },
    /// The registered range lacks ioctls the operations need.
    #[error(
        "the registered range lacks userfaultfd ioctls {missing:?} (needs COPY, ZEROPAGE, \
         WAKE, WRITE_PROTECT, and CONTINUE with minor faults on)"
    )]
    MissingIoctls {
        /// The missing ioctls.
        missing: IoctlFlags,
    },
    /// The process-wide `SIGBUS` handler could not be used.
    #[error(transparent)]
    Signal(#[from] SignalError),
    /// `threads` was 0.
    #[error("Delivery::Threads needs at least one handler thread")]
    NoHandlerThreads,
    /// A handler thread could not be started.
    #[error("starting a fault-handler thread failed: {0}")]
    Spawn(#[source] std::io::Error),
}

/// Protection of a page being installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protection {
    /// Write-protected: reads proceed, the first write faults
    /// ([`FaultKind::WriteProtect`](super::FaultKind::WriteProtect)).
    ReadOnly,
    /// Reads and writes proceed.
    Writable,
}

/// Outcome of an install: both are success for the fault being served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum Install {
    /// This call mapped the page (and woke threads waiting for it).
    Installed,
    /// The page was already present (`EEXIST`): another thread installed it first; this
    /// call changed nothing.
    AlreadyPresent,
}

/// Which operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`RegionOps::install`].
    Install,
    /// [`RegionOps::install_zero`].
    InstallZero,
    /// [`RegionOps::write_protect`].
    WriteProtect,
    /// [`RegionOps::unprotect`].
    Unprotect,
    /// [`RegionOps::invalidate`].
    Invalidate,
    /// [`RegionOps::wake`].
    Wake,
    /// [`RegionOps::try_read_page`].
    Read,
    /// [`RegionOps::view_read`] or [`RegionOps::view_write_words`].
    View,
    /// [`RegionOps::populate`].
    Populate,
    /// [`RegionOps::remap`], or an install of a page the memfd holds.
    Continue,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Install => "UFFDIO_COPY",
            Op::InstallZero => "zero-fill install",
            Op::WriteProtect => "UFFDIO_WRITEPROTECT (protect)",
            Op::Unprotect => "UFFDIO_WRITEPROTECT (unprotect)",
            Op::Invalidate => "madvise(MADV_DONTNEED or MADV_REMOVE)",
            Op::Wake => "UFFDIO_WAKE",
            Op::Read => "process_vm_readv",
            Op::View => "runtime-view access",
            Op::Populate => "madvise(MADV_POPULATE_WRITE) of the runtime view",
            Op::Continue => "UFFDIO_CONTINUE",
        })
    }
}

/// A page operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// The pages are outside the region.
    #[error(transparent)]
    OutOfRange(#[from] OutOfRange),
    /// The kernel refused (e.g. `ENOMEM`; `ENOENT`/`EINVAL` if the range is no longer
    /// registered).
    #[error("{op} of {range} failed: {errno}")]
    Kernel {
        /// The operation.
        op: Op,
        /// The pages.
        range: PageRange,
        /// The error.
        errno: Errno,
    },
    /// [`RegionOps::try_read_page`]: the page is not present.
    #[error("{0} is not present")]
    NotPresent(PageIndex),
    /// A runtime-view operation on a region without a view ([`Backing::Anonymous`]).
    #[error("the region has no runtime view (create it with Backing::SharedMemory)")]
    NoView,
    /// [`RegionOps::populate`] or [`RegionOps::remap`] on a region without minor faults.
    #[error(
        "the region serves no minor faults (create it with Backing::SharedMemory and \
         minor_faults on a kernel that offers them, Linux >= 6.4)"
    )]
    NoMinorFaults,
    /// [`RegionOps::view_write_words`]: the words do not fit the page, or the byte count
    /// is not a multiple of 8.
    #[error("{bytes} bytes at word {first_word} do not fit {page} as whole 8-byte words")]
    BadWords {
        /// The page.
        page: PageIndex,
        /// First word index.
        first_word: usize,
        /// Number of bytes given.
        bytes: usize,
    },
}

/// How many times an `EAGAIN` ("mapping changing, retry") is retried before it is
/// reported. The layer enables no non-cooperative event features, so the kernel has no
/// reason to return it at all; the bound only keeps a kernel bug from spinning forever.
const EAGAIN_RETRIES: usize = 1000;

/// A zero page to install read-only with `UFFDIO_COPY_MODE_WP`.
static ZERO_PAGE: [u8; PAGE_SIZE] = [0; PAGE_SIZE];

/// The page operations of a region. Obtained from [`Region`] (it dereferences to this)
/// or, inside a resolver, as the `region` argument. All methods take `&self` and may be
/// called from any thread concurrently; per-page ordering (e.g. never invalidate a page
/// while another thread makes its twin) is the coherence runtime's job.
///
/// None of the methods touches region memory with ordinary loads or stores except
/// [`read_page`](Self::read_page), so they are all usable inside a resolver.
pub struct RegionOps {
    // Field order is drop order: unmap first (threads still blocked in a fault then get
    // SIGSEGV instead of silently mapped zero pages), then close the descriptor.
    mapping: Mapping,
    uffd: userfaultfd::Uffd,
    kernel: KernelSupport,
    marks: Arc<WriteMarks>,
    /// Minor faults are on: one bit per page, set once the memfd holds the page (it
    /// was installed or populated; invalidation keeps it). Empty when off.
    cached: Box<[AtomicU64]>,
    minor: bool,
}

impl fmt::Debug for RegionOps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = self.layout();
        f.debug_struct("RegionOps")
            .field("start", &format_args!("{:#x}", l.base()))
            .field("end", &format_args!("{:#x}", l.end()))
            .field("kernel", &self.kernel)
            .finish()
    }
}

/// The errno behind a `userfaultfd` crate error (`EIO` when it carries none).
pub(super) fn errno_of(e: userfaultfd::Error) -> Errno {
    match e {
        userfaultfd::Error::CopyFailed(e) | userfaultfd::Error::ZeropageFailed(e) => {
            Errno::from_raw(e as i32)
        }
        userfaultfd::Error::SystemError(e) => Errno::from_raw(e as i32),
        userfaultfd::Error::PartiallyCopied(_) => Errno::EAGAIN,
        _ => Errno::EIO,
    }
}

impl RegionOps {
    /// Where the region lies.
    pub fn layout(&self) -> RegionLayout {
        self.mapping.layout()
    }

    /// The first byte of the region. Application data lives behind this pointer; every
    /// access to it may fault and be served by the resolver.
    pub fn as_ptr(&self) -> *mut u8 {
        self.layout().base() as *mut u8
    }

    /// The page holding `addr`, if the region holds it.
    pub fn page_of(&self, addr: usize) -> Option<PageIndex> {
        self.layout().page_of(addr)
    }

    /// What the kernel supports and how the descriptor was made.
    pub fn kernel(&self) -> &KernelSupport {
        &self.kernel
    }

    /// The region's write marks, which application stores set and flushes take (see
    /// [`WriteMarks`]).
    pub fn marks(&self) -> &Arc<WriteMarks> {
        &self.marks
    }

    pub(crate) fn uffd(&self) -> &userfaultfd::Uffd {
        &self.uffd
    }

    fn page_addr(&self, page: PageIndex) -> Result<usize, OpError> {
        Ok(self.layout().range_bytes(PageRange::one(page))?.0)
    }

    fn retry_eagain(
        &self,
        op: Op,
        page: PageIndex,
        mut f: impl FnMut() -> Result<(), Errno>,
    ) -> Result<Install, OpError> {
        for _ in 0..EAGAIN_RETRIES {
            match f() {
                Ok(()) => return Ok(Install::Installed),
                Err(Errno::EEXIST) => return Ok(Install::AlreadyPresent),
                Err(Errno::EAGAIN) => std::hint::spin_loop(),
                Err(errno) => {
                    return Err(OpError::Kernel {
                        op,
                        range: PageRange::one(page),
                        errno,
                    });
                }
            }
        }
        Err(OpError::Kernel {
            op,
            range: PageRange::one(page),
            errno: Errno::EAGAIN,
        })
    }

    /// Installs `page` with the contents of `data` (`UFFDIO_COPY`; read-only in the same
    /// call with `UFFDIO_COPY_MODE_WP`) and wakes threads waiting for it. With minor
    /// faults on and the page already in the memfd, the contents are written through the
    /// runtime view and the page is mapped with `UFFDIO_CONTINUE` instead (see
    /// [`minor_faults`](Self::minor_faults)).
    ///
    /// Precondition: the page is missing (never installed, or invalidated). If it is
    /// present the call returns [`Install::AlreadyPresent`] (`EEXIST`: another thread won
    /// the race) and, without minor faults, changes nothing; with minor faults the
    /// precondition is the caller's to keep (the contents would already be written).
    /// `data` may have any alignment.
    pub fn install(
        &self,
        page: PageIndex,
        data: &[u8; PAGE_SIZE],
        protection: Protection,
    ) -> Result<Install, OpError> {
        let dst = self.page_addr(page)?;
        if self.is_cached(page) {
            return self.install_cached(page, Some(data), protection);
        }
        let out = self.retry_eagain(Op::Install, page, || match protection {
            Protection::ReadOnly => sys::copy(self.uffd.as_fd(), dst, data, true).map(drop),
            // SAFETY: `data` is a readable PAGE_SIZE buffer; `dst` is a page of the
            // range registered with this descriptor (checked above) and the kernel
            // refuses (EEXIST) to overwrite a present page, so no memory a Rust
            // reference covers is written.
            Protection::Writable => unsafe {
                self.uffd
                    .copy(data.as_ptr().cast(), dst as *mut c_void, PAGE_SIZE, true)
            }
            .map(drop)
            .map_err(errno_of),
        })?;
        self.after_copy(page, out, Some(data), protection)
    }

    /// Installs a zero-filled `page` and wakes threads waiting for it.
    ///
    /// [`Protection::Writable`] maps the kernel's shared zero page (`UFFDIO_ZEROPAGE`,
    /// no allocation); the first write then takes an ordinary kernel copy-on-write fault
    /// (not a userfaultfd fault). [`Protection::ReadOnly`] copies a zero page with
    /// `UFFDIO_COPY_MODE_WP` so that the first write is a write-protect fault. With
    /// minor faults on and the page in the memfd, zeros are written through the view and
    /// the page mapped with `UFFDIO_CONTINUE`.
    /// Precondition and outcome as for [`install`](Self::install).
    pub fn install_zero(
        &self,
        page: PageIndex,
        protection: Protection,
    ) -> Result<Install, OpError> {
        if protection == Protection::ReadOnly {
            // A copy of a zero page: `install` takes the memfd's page when it holds one.
            return self.install(page, &ZERO_PAGE, Protection::ReadOnly);
        }
        if self.is_cached(page) {
            return self.install_cached(page, None, protection);
        }
        let dst = self.page_addr(page)?;
        let out = self.retry_eagain(Op::InstallZero, page, || {
            // SAFETY: `dst` is a page of the registered range (checked above); the kernel
            // refuses (EEXIST) to replace a present page.
            unsafe { self.uffd.zeropage(dst as *mut c_void, PAGE_SIZE, true) }
                .map(drop)
                .map_err(errno_of)
        })?;
        self.after_copy(page, out, None, protection)
    }

    /// The end of an install by `UFFDIO_COPY` or `UFFDIO_ZEROPAGE` (`data`: its contents,
    /// zeros for `None`): marks the page as held by the memfd. `EEXIST` for a missing page
    /// (the precondition) with minor faults on means the memfd holds it although this
    /// region had not seen it there — a `populate` of its range allocated it meanwhile
    /// (it marks pages after allocating them) — so the page is mapped from the memfd.
    fn after_copy(
        &self,
        page: PageIndex,
        out: Install,
        data: Option<&[u8; PAGE_SIZE]>,
        protection: Protection,
    ) -> Result<Install, OpError> {
        self.mark_cached(PageRange::one(page));
        if out == Install::AlreadyPresent && self.minor {
            return self.install_cached(page, data, protection);
        }
        Ok(out)
    }

    /// Whether the region serves minor faults ([`RegionConfig::minor_faults`], granted
    /// by the kernel): it is registered for missing, write-protect *and* minor faults
    /// (`UFFDIO_REGISTER_MODE_MINOR`, `UFFD_FEATURE_MINOR_SHMEM`), and then
    ///
    /// * [`invalidate`](Self::invalidate) unmaps pages with `MADV_DONTNEED` and the memfd
    ///   keeps them (0.12 against 0.63 µs a page for `MADV_REMOVE`, issue-10 log, 44th
    ///   session); the next access is a minor fault, reported like a missing one;
    /// * [`install`](Self::install) and [`install_zero`](Self::install_zero) of a page the
    ///   memfd holds write the contents through the runtime view and map the page with
    ///   `UFFDIO_CONTINUE` (`_MODE_WP` for [`Protection::ReadOnly`]): no page allocation
    ///   or page-cache insertion on the fault's path; pages not yet in the memfd are
    ///   installed with `UFFDIO_COPY` as without minor faults;
    /// * [`populate`](Self::populate) puts pages in the memfd ahead of their first fault;
    /// * a page the kernel unmapped by itself (reclaim writing it to swap) faults as a
    ///   minor fault although the caller considers it present: [`remap`](Self::remap)
    ///   maps it again.
    ///
    /// An install's precondition (the page missing) must then hold: an install of a
    /// present page would overwrite its contents before `UFFDIO_CONTINUE` refuses it.
    /// A page that reached the memfd another way (a concurrent [`populate`](Self::populate)
    /// of its range, or words written through the view) is installed from the memfd:
    /// `UFFDIO_COPY` refuses it with `EEXIST`, and the install writes it through the view
    /// and maps it instead.
    pub fn minor_faults(&self) -> bool {
        self.minor
    }

    /// Whether an install of `page` now maps memory already in place: minor faults are on
    /// and the memfd holds the page (it was populated, or installed before), so
    /// [`install`](Self::install) writes it through the view and maps it with
    /// `UFFDIO_CONTINUE` instead of allocating it with `UFFDIO_COPY`.
    pub fn installs_in_place(&self, page: PageIndex) -> bool {
        self.is_cached(page)
    }

    fn is_cached(&self, page: PageIndex) -> bool {
        self.cached
            .get(page.0 / 64)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (page.0 % 64)) != 0)
    }

    fn mark_cached(&self, range: PageRange) {
        if !self.minor {
            return;
        }
        for p in range.pages() {
            if let Some(w) = self.cached.get(p.0 / 64) {
                w.fetch_or(1 << (p.0 % 64), Ordering::Release);
            }
        }
    }

    /// Writes `data` (zeros for `None`) into the memfd's copy of the missing `page`
    /// through the runtime view, then maps it (`UFFDIO_CONTINUE`).
    fn install_cached(
        &self,
        page: PageIndex,
        data: Option<&[u8; PAGE_SIZE]>,
        protection: Protection,
    ) -> Result<Install, OpError> {
        self.view_write_words(page, 0, data.unwrap_or(&ZERO_PAGE))?;
        self.remap(page, protection)
    }

    /// Maps `page`, which the memfd holds, with `UFFDIO_CONTINUE` (write-protected for
    /// [`Protection::ReadOnly`]) and wakes threads waiting for it: for a page that the
    /// caller considers present and whose mapping the kernel dropped (a minor fault on
    /// it). [`Install::AlreadyPresent`] when it is mapped.
    ///
    /// # Errors
    /// [`OpError::NoMinorFaults`] without minor faults; [`OpError::Kernel`] (`EFAULT`)
    /// when the memfd does not hold the page.
    pub fn remap(&self, page: PageIndex, protection: Protection) -> Result<Install, OpError> {
        if !self.minor {
            return Err(OpError::NoMinorFaults);
        }
        let dst = self.page_addr(page)?;
        self.retry_eagain(Op::Continue, page, || {
            sys::continue_range(
                self.uffd.as_fd(),
                dst,
                PAGE_SIZE,
                protection == Protection::ReadOnly,
            )
        })
    }

    /// Allocates the pages of `range` in the memfd, zero-filled, and maps them in the
    /// runtime view (one `madvise(MADV_POPULATE_WRITE)` on the view), so that their first
    /// faults are minor faults too: the install writes through the view without a page
    /// fault there and maps the page with `UFFDIO_CONTINUE`, no page allocation on the
    /// fault's path. Pages the memfd already holds keep their contents. The region's
    /// mapping is left alone: each page still faults on its first access. The memory is
    /// committed now (4 KiB a page) instead of at each page's first install.
    ///
    /// # Errors
    /// [`OpError::NoMinorFaults`] without minor faults; [`OpError::Kernel`] (`ENOMEM`)
    /// when the memory is not there.
    pub fn populate(&self, range: PageRange) -> Result<(), OpError> {
        if !self.minor {
            return Err(OpError::NoMinorFaults);
        }
        self.range_op(Op::Populate, range, |addr, len| {
            self.mapping.populate(addr, len)
        })?;
        self.mark_cached(range);
        Ok(())
    }

    fn range_op(
        &self,
        op: Op,
        range: PageRange,
        f: impl FnOnce(usize, usize) -> Result<(), Errno>,
    ) -> Result<(), OpError> {
        let (addr, len) = self.layout().range_bytes(range)?;
        if len == 0 {
            return Ok(());
        }
        f(addr, len).map_err(|errno| OpError::Kernel { op, range, errno })
    }

    /// Write-protects the **present** pages of `range` in one `UFFDIO_WRITEPROTECT`:
    /// their next write faults as [`FaultKind::WriteProtect`](super::FaultKind).
    ///
    /// Pages that are missing (never touched, or invalidated) are left alone and keep
    /// faulting as missing pages: the layer deliberately does not enable
    /// `UFFD_FEATURE_WP_UNPOPULATED`, which would turn the first write to such a page into
    /// a write-protect fault on a page that has no contents. The resolver picks the
    /// protection when it installs the page instead.
    pub fn write_protect(&self, range: PageRange) -> Result<(), OpError> {
        self.range_op(Op::WriteProtect, range, |addr, len| {
            self.uffd
                .write_protect(addr as *mut c_void, len)
                .map_err(errno_of)
        })
    }

    /// Removes write protection from `range` in one `UFFDIO_WRITEPROTECT` and wakes
    /// threads waiting on a write-protect fault there. Missing pages are unaffected.
    pub fn unprotect(&self, range: PageRange) -> Result<(), OpError> {
        self.range_op(Op::Unprotect, range, |addr, len| {
            self.uffd
                .remove_write_protection(addr as *mut c_void, len, true)
                .map_err(errno_of)
        })
    }

    /// Drops the contents of `range` with one `madvise(MADV_DONTNEED)` (`MADV_REMOVE` on
    /// shared memory without minor faults): every page becomes missing (and loses any
    /// write protection); the next access faults as
    /// [`FaultKind::Missing`](super::FaultKind) (a minor fault, reported the same way,
    /// with [`minor_faults`](Self::minor_faults)).
    ///
    /// Precondition (for the protocol, not for memory safety): no thread of this process
    /// is relying on the contents, e.g. making a twin of one of these pages.
    pub fn invalidate(&self, range: PageRange) -> Result<(), OpError> {
        self.range_op(Op::Invalidate, range, |addr, len| {
            self.mapping.discard(addr, len, self.minor)
        })
    }

    /// Invalidates `pages`, one `madvise` per run of consecutive pages in the order given
    /// (sort them first for the fewest calls). Returns the number of calls made.
    pub fn invalidate_pages<I>(&self, pages: I) -> Result<usize, OpError>
    where
        I: IntoIterator<Item = PageIndex>,
    {
        let mut calls = 0;
        for run in coalesce(pages) {
            self.invalidate(run)?;
            calls += 1;
        }
        Ok(calls)
    }

    /// Wakes threads sleeping on a fault in `range` (`UFFDIO_WAKE`); they retry the
    /// access. Needed only with [`Delivery::Threads`] when a fault was resolved without an
    /// install or unprotect of that page (those wake by themselves).
    pub fn wake(&self, range: PageRange) -> Result<(), OpError> {
        self.range_op(Op::Wake, range, |addr, len| {
            self.uffd.wake(addr as *mut c_void, len).map_err(errno_of)
        })
    }

    /// Copies the current contents of `page` into `out` (making a twin, or reading a page
    /// to send), with plain loads: fast (0.13 µs measured).
    ///
    /// Preconditions:
    /// - the page is **present** — otherwise the loads fault like any access: served by
    ///   the resolver with [`Delivery::Threads`] (so never call it from a handler thread
    ///   then), and fatal inside a [`Delivery::Signal`] resolver (see the
    ///   [`FaultResolver`] contract). Use [`try_read_page`](Self::try_read_page) when
    ///   unsure;
    /// - no thread writes the page meanwhile (true while it is write-protected, which is
    ///   when a twin is made); otherwise each aligned 8-byte word is old or new.
    ///
    /// The loads are volatile word loads, as for memory shared with another agent.
    pub fn read_page(&self, page: PageIndex, out: &mut [u8; PAGE_SIZE]) -> Result<(), OpError> {
        let src = self.page_addr(page)? as *const u64;
        for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
            // SAFETY: `src` is the 4096-aligned start of a page inside the mapping, which
            // is readable (PROT_READ) for the life of `self`; `i < 512` keeps the word
            // inside the page. Region memory is reached only through raw pointers.
            let word = unsafe { src.wrapping_add(i).read_volatile() };
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        Ok(())
    }

    /// Copies the current contents of `page` into `out` without ever faulting: a page
    /// that is not present is reported as [`OpError::NotPresent`]. One
    /// `process_vm_readv(2)` system call (1.4 µs measured): a kernel-mode access, which a
    /// user-mode-only or SIGBUS-mode userfaultfd does not serve. (With
    /// [`Delivery::Threads`] and `user_mode_only: false` the kernel access is served as a
    /// fault instead.)
    pub fn try_read_page(&self, page: PageIndex, out: &mut [u8; PAGE_SIZE]) -> Result<(), OpError> {
        let addr = self.page_addr(page)?;
        match sys::read_own_memory(addr, out) {
            Ok(PAGE_SIZE) => Ok(()),
            Ok(_) | Err(Errno::EFAULT) => Err(OpError::NotPresent(page)),
            Err(errno) => Err(OpError::Kernel {
                op: Op::Read,
                range: PageRange::one(page),
                errno,
            }),
        }
    }
}

impl RegionOps {
    /// What memory backs the region.
    pub fn backing(&self) -> Backing {
        self.mapping.backing()
    }

    /// The first byte of the runtime view ([`Backing::SharedMemory`]): the same pages as
    /// the region, mapped a second time, unregistered and always writable. `None` for an
    /// anonymous region. Prefer [`view_read`](Self::view_read) and
    /// [`view_write_words`](Self::view_write_words).
    pub fn view_ptr(&self) -> Option<*mut u8> {
        self.mapping.view_base().map(|b| b as *mut u8)
    }

    fn view_page(&self, page: PageIndex) -> Result<&[std::sync::atomic::AtomicU64], OpError> {
        if self.mapping.view_base().is_none() {
            return Err(OpError::NoView);
        }
        self.page_addr(page)?;
        self.mapping.view_words(page).ok_or(OpError::NoView)
    }

    /// Copies `page` into `out` through the runtime view ([`Backing::SharedMemory`]) with
    /// relaxed atomic 8-byte loads. Never faults, whatever the page's state, so it is
    /// usable anywhere (resolvers included); 0.3 µs measured.
    ///
    /// Precondition (for the protocol, not for memory safety): the page is installed.
    /// Without minor faults a missing page read through the view is allocated zero-filled
    /// in the memfd, and the application's next access then finds it without a fault (see
    /// [`Backing::SharedMemory`]); with them the access still faults. Words written
    /// concurrently by other threads are read as either their old or their new value.
    pub fn view_read(&self, page: PageIndex, out: &mut [u8; PAGE_SIZE]) -> Result<(), OpError> {
        let words = self.view_page(page)?;
        for (w, chunk) in words.iter().zip(out.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
        }
        Ok(())
    }

    /// Copies the [`LINE_SIZE`](multigrain_coherence::diff::LINE_SIZE)-byte lines of
    /// `page` that `lines` names (bit `k`: bytes `64k .. 64k + 64`) into the same bytes
    /// of `out`, through the runtime view as [`view_read`](Self::view_read) does; the
    /// other bytes of `out` are left as they were. For a flush that diffs only the
    /// lines the write marks name ([`WriteMarks::take_lines`]). Never faults; the same
    /// precondition as [`view_read`](Self::view_read).
    ///
    /// # Errors
    /// As [`view_read`](Self::view_read).
    pub fn view_read_lines(
        &self,
        page: PageIndex,
        lines: u64,
        out: &mut [u8; PAGE_SIZE],
    ) -> Result<(), OpError> {
        const LINE_WORDS: usize = multigrain_coherence::diff::LINE_SIZE / 8;
        let words = self.view_page(page)?;
        for line in multigrain_coherence::diff::line_indices(lines) {
            let first = line * LINE_WORDS;
            let line = &mut out[first * 8..(first + LINE_WORDS) * 8];
            for (w, chunk) in words[first..first + LINE_WORDS]
                .iter()
                .zip(line.chunks_exact_mut(8))
            {
                chunk.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
            }
        }
        Ok(())
    }

    /// Whether `page`, read through the runtime view ([`Backing::SharedMemory`]) with
    /// relaxed atomic 8-byte loads, holds exactly the bytes of `twin`: compared eight words
    /// at a time, stopping at the first block that differs. A flush asks this first of
    /// every page it diffs: most open pages at a release batch's flush are unchanged since
    /// the previous flush, and for an unchanged page this check costs less than
    /// [`view_read`](Self::view_read) and a diff of the copy — 0.17 against 0.36 µs with
    /// the page in the cache, 0.25 against 0.30 µs (medians, the `flush_diff` rows of `cargo
    /// bench -p multigrain-dsm --bench dsm`) with pages mostly out of the first-level cache
    /// (the AMD EPYC development VM, issue-10 log, thirtieth session). Never faults; the
    /// same precondition as [`view_read`](Self::view_read). A word written concurrently is
    /// read as either its old or its new value.
    ///
    /// # Errors
    /// As [`view_read`](Self::view_read).
    pub fn view_equals(&self, page: PageIndex, twin: &[u8; PAGE_SIZE]) -> Result<bool, OpError> {
        const BLOCK: usize = 8;
        let words = self.view_page(page)?;
        for (w, t) in words.chunks_exact(BLOCK).zip(twin.chunks_exact(BLOCK * 8)) {
            let mut differ = 0u64;
            for (k, word) in w.iter().enumerate() {
                let tw = u64::from_ne_bytes(t[k * 8..k * 8 + 8].try_into().expect("8 bytes"));
                differ |= word.load(Ordering::Relaxed) ^ tw;
            }
            if differ != 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Stores `bytes` (whole 8-byte words, native byte order) into `page` starting at word
    /// `first_word`, through the runtime view, with relaxed atomic stores: only those words
    /// change, whatever the page's protection as application threads see it, and writes
    /// that application threads make to other words concurrently are kept. Used by a home
    /// to apply a diff to its master copy.
    ///
    /// Precondition (for the protocol): the page is installed, as for
    /// [`view_read`](Self::view_read).
    pub fn view_write_words(
        &self,
        page: PageIndex,
        first_word: usize,
        bytes: &[u8],
    ) -> Result<(), OpError> {
        let words = self.view_page(page)?;
        let bad = OpError::BadWords {
            page,
            first_word,
            bytes: bytes.len(),
        };
        if !bytes.len().is_multiple_of(8) {
            return Err(bad);
        }
        let Some(target) = words.get(first_word..first_word.saturating_add(bytes.len() / 8)) else {
            return Err(bad);
        };
        for (w, chunk) in target.iter().zip(bytes.chunks_exact(8)) {
            let v = u64::from_ne_bytes(chunk.try_into().expect("chunks of 8 bytes"));
            w.store(v, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// What a registered region shares with the threads and the signal handler that serve
/// its faults.
pub(crate) struct Shared {
    pub(crate) ops: RegionOps,
    pub(crate) resolver: Arc<dyn FaultResolver>,
}

/// A DSM region: reserved at a fixed address, registered with userfaultfd for missing
/// and write-protect faults, its faults served by a [`FaultResolver`]. Dereferences to
/// [`RegionOps`] for the page operations.
///
/// Dropping it is deterministic: it stops fault delivery (unregisters from the `SIGBUS`
/// handler and waits for resolvers running there; or stops and joins the handler
/// threads), then unmaps the range and closes the descriptor. Application threads must
/// have stopped touching the region by then.
pub struct Region {
    // Drop order: signal slot, then handler threads, then the shared state.
    slot: Option<Slot>,
    handlers: Option<Handlers>,
    shared: Arc<Shared>,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("ops", &self.shared.ops)
            .field("signal", &self.slot.is_some())
            .field(
                "handler_threads",
                &self.handlers.as_ref().map(Handlers::len),
            )
            .finish()
    }
}

impl Region {
    /// Creates a region: checks the layout, creates the userfaultfd (with the features
    /// the delivery needs, checked up front), reserves the range with
    /// `MAP_FIXED_NOREPLACE`, registers it for missing and write-protect faults, and
    /// starts delivery to `resolver` (installing the process-wide `SIGBUS` handler if
    /// needed).
    pub fn new(
        config: RegionConfig,
        resolver: Arc<dyn FaultResolver>,
    ) -> Result<Self, RegionError> {
        let layout = RegionLayout::new(config.base, config.len)?;
        let mut required = match config.delivery {
            Delivery::Signal => Features::PAGEFAULT_FLAG_WP.union(Features::SIGBUS),
            Delivery::Threads { threads: 0, .. } => return Err(RegionError::NoHandlerThreads),
            Delivery::Threads { .. } => Features::PAGEFAULT_FLAG_WP,
        };
        if config.backing == Backing::SharedMemory {
            required = required.union(Features::WP_HUGETLBFS_SHMEM);
        }
        // `UFFD_FEATURE_WP_UNPOPULATED` is not enabled: it only stands for Linux >= 6.4,
        // the release that added `UFFDIO_CONTINUE_MODE_WP`, which has no feature bit.
        let minor_wanted = config.minor_faults && config.backing == Backing::SharedMemory;
        let optional = if minor_wanted {
            Features::MINOR_SHMEM
        } else {
            Features::empty()
        };
        if config.delivery == Delivery::Signal {
            signal::install_sigbus_handler()?;
        }
        let (uffd, kernel) =
            kernel::open(Attempt::standard(config.user_mode_only), required, optional)?;
        let minor = minor_wanted
            && kernel.enabled.contains(Features::MINOR_SHMEM)
            && kernel.available.contains(Features::WP_UNPOPULATED);
        if minor_wanted && !minor {
            tracing::info!(
                "the kernel's userfaultfd lacks minor faults on shared memory with \
                 UFFDIO_CONTINUE_MODE_WP (Linux >= 6.4; it offers {}): pages are installed \
                 with UFFDIO_COPY",
                kernel.available
            );
        }
        let mapping = Mapping::reserve(layout, config.backing)?;
        let mode = if minor {
            RegisterMode::MISSING | RegisterMode::WRITE_PROTECT | RegisterMode::MINOR
        } else {
            RegisterMode::MISSING | RegisterMode::WRITE_PROTECT
        };
        let ioctls = uffd
            .register_with_mode(layout.base() as *mut c_void, layout.len(), mode)
            .map_err(|e| RegionError::Register {
                start: layout.base(),
                end: layout.end(),
                errno: errno_of(e),
            })?;
        let mut needed =
            IoctlFlags::COPY | IoctlFlags::ZEROPAGE | IoctlFlags::WAKE | IoctlFlags::WRITE_PROTECT;
        if minor {
            needed |= IoctlFlags::from_bits_retain(sys::UFFDIO_CONTINUE_IOCTL);
        }
        if !ioctls.contains(needed) {
            return Err(RegionError::MissingIoctls {
                missing: needed.difference(ioctls),
            });
        }
        let shared = Arc::new(Shared {
            ops: RegionOps {
                mapping,
                uffd,
                kernel,
                marks: Arc::new(WriteMarks::new(layout)),
                cached: if minor {
                    (0..layout.pages().div_ceil(64))
                        .map(|_| AtomicU64::new(0))
                        .collect()
                } else {
                    Box::default()
                },
                minor,
            },
            resolver,
        });
        let mut region = Region {
            slot: None,
            handlers: None,
            shared,
        };
        match config.delivery {
            Delivery::Signal => region.slot = Some(signal::register(&region.shared)?),
            Delivery::Threads { threads, spin } => {
                region.handlers = Some(
                    Handlers::spawn(&region.shared, threads, spin).map_err(RegionError::Spawn)?,
                )
            }
        }
        Ok(region)
    }

    /// The page operations (also reachable through `Deref`).
    pub fn ops(&self) -> &RegionOps {
        &self.shared.ops
    }
}

impl std::ops::Deref for Region {
    type Target = RegionOps;

    fn deref(&self) -> &RegionOps {
        &self.shared.ops
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Stop delivery first; both wait for resolvers still running.
        drop(self.slot.take());
        drop(self.handlers.take());
        debug_assert_eq!(
            Arc::strong_count(&self.shared),
            1,
            "no fault path may keep the region alive past its owner"
        );
        // `shared` drops next: munmap, then close the descriptor.
    }
}
