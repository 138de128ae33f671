//! The userfaultfd layer: a DSM region at a fixed address whose missing-page and
//! write-protect faults are served by a [`FaultResolver`], plus the page operations the
//! coherence runtime executes (install, zero-fill, write-protect, unprotect, invalidate,
//! wake, read / twin).
//!
//! # How faults are served
//!
//! Measured on the development VM (Linux 6.18, 2 vCPUs, other builds running: load
//! average 6–7; `cargo bench -p multigrain-dsm --bench uffd_fault`): time from the
//! faulting write to a missing page until it completes, page installed with
//! `UFFDIO_COPY`, per fault, in µs:
//!
//! | how the fault is served                         | median | p10–p90     | p99  |
//! |-------------------------------------------------|-------:|-------------|-----:|
//! | handler thread blocking in `poll`, back to back |    8.6 | 7.9–9.8     | 16.5 |
//! | … after 2 ms idle                               |   19.1 | 16.2–22.1   | 36.8 |
//! | … every CPU busy with compute threads           |    9.5 | 8.1–12.1    | 21.2 |
//! | busy-polling handler thread                     |    8.5 | 8.4–8.8     | 22.6 |
//! | hybrid (spin 50 µs, then block), back to back   |    8.6 | 8.1–11.3    | 60.3 |
//! | … after 2 ms idle                               |   20.2 | 18.0–24.0   | 94.5 |
//! | `SIGBUS`, resolved in the faulting thread       |    5.6 | 5.5–5.8     |  8.5 |
//! | … after 2 ms idle                               |   14.7 | 8.3–17.4    | 34.2 |
//! | … every CPU busy with compute threads           |    5.6 | 5.5–5.9     |  8.5 |
//! | … installed read-only, write re-faults as WP    |    9.6 | 9.5–9.9     | 12.7 |
//! | `SIGBUS`, read of a missing page                |    5.0 | 4.9–5.3     |  7.9 |
//! | bare `UFFDIO_COPY` (no fault)                   |    1.7 | 1.5–1.9     |  4.4 |
//! | write-protect fault → unprotect, `SIGBUS`       |    4.1 | 4.0–4.3     |  4.6 |
//! | write-protect fault → unprotect, blocking thread|    6.4 | 6.3–7.0     |  9.6 |
//!
//! Delivering the fault as `SIGBUS` to the faulting thread (`UFFD_FEATURE_SIGBUS`) and
//! resolving it there wins in every condition (no thread switch, no wake-up, nothing to
//! schedule), has the tightest tail, costs nothing while idle, and scales with the
//! number of faulting threads (each serves its own fault; no single handler thread to
//! saturate). It is the default ([`Delivery::Signal`]). The x86-64 page-fault error code
//! says read or write, so a write to a missing page is installed writable in one fault
//! (5.6 µs) instead of read-only plus a write-protect fault (9.6 µs). Handler threads
//! ([`Delivery::Threads`]: blocking, busy or hybrid) remain available; busy polling
//! bought nothing here over blocking and burns a core.
//!
//! Memory: private anonymous by default, or a memfd with a second, unregistered *runtime
//! view* of the same pages ([`Backing::SharedMemory`], what the DSM runtime uses: a home
//! applies diffs and every page is read for sending through the view, which never
//! faults).
//!
//! Minor faults ([`RegionConfig::minor_faults`], what the DSM runtime uses where the
//! kernel offers them, Linux ≥ 6.4): a shared-memory region registered for minor faults
//! as well keeps a page in its memfd when it is invalidated (`MADV_DONTNEED` instead of
//! punching a hole), and installs a page the memfd holds by writing it through the view
//! and mapping it with `UFFDIO_CONTINUE`; [`RegionOps::populate`] puts pages there before
//! their first fault. A throwaway loop on the Zen 5 VM (46th session; 2,000 `SIGBUS` read
//! faults a round, 8 rounds, medians): `UFFDIO_COPY` into anonymous memory 3.73–3.84 µs,
//! into shared memory 4.36–4.48 µs, write through the view + `UFFDIO_CONTINUE` (`_MODE_WP`)
//! of a populated page 3.65–3.75 µs; invalidation per page, 2,000 in one call, 0.24 µs
//! anonymous, 0.68–0.70 µs `MADV_REMOVE`, 0.14–0.15 µs `MADV_DONTNEED` on the memfd.
//!
//! Range operations: `MADV_DONTNEED` of 64 pages takes 13 µs in one call and 94 µs in
//! 64 calls; `UFFDIO_WRITEPROTECT` 5 µs vs 56 µs; so the range operations take
//! [`PageRange`]s and [`RegionOps::invalidate_pages`] coalesces. Copying a present page
//! with loads ([`RegionOps::read_page`]) takes 0.13 µs, with `process_vm_readv`
//! ([`RegionOps::try_read_page`], never faults) 1.4 µs.
//!
//! Write tracking on shared memory (the same benchmark, case 9; 2026-11-27, load average
//! ≈ 1.3), per operation in µs, median (p10–p90) and p99: a write-protect fault with
//! `SIGBUS` → unprotect 4.80 (4.72–4.94), 6.33 (on anonymous memory, the same run: 4.28);
//! the same write when the kernel resolves the fault itself ([`WriteTracker`],
//! `UFFD_FEATURE_WP_ASYNC`, Linux ≥ 6.7) 0.72 (0.71–0.79), 0.96; and listing the written
//! pages with `PAGEMAP_SCAN`, which protects them again in the same walk, 0.21 per written
//! page (64 of 8192), 0.35. Tracking a page's writes that way costs ≈ 0.9 µs per interval
//! instead of ≈ 4.8; the runtime still uses the synchronous fault (see [`WriteTracker`]).
//!
//! # Serving a remote fault with `SIGBUS` delivery
//!
//! The resolver runs on the faulting thread and must not return before the page is
//! usable (else the access faults again). For a page that lives elsewhere it sends the
//! request and waits (e.g. a futex on the page's coherence state); whichever thread
//! receives the reply calls [`RegionOps::install`] (any thread may) and wakes it; other
//! threads that faulted on the same page meanwhile wait on the same state, or get
//! [`Install::AlreadyPresent`]. See [`FaultResolver`] for what a resolver may do.
//!
//! # Use
//!
//! ```no_run
//! use multigrain_dsm::uffd::*;
//! use std::sync::Arc;
//!
//! let resolver = |region: &RegionOps, fault: Fault| {
//!     let protection = match fault.access {
//!         Access::Write => Protection::Writable,
//!         Access::Read => Protection::ReadOnly,
//!     };
//!     match fault.kind {
//!         FaultKind::Missing => {
//!             let _ = region.install_zero(fault.page, protection);
//!         }
//!         FaultKind::WriteProtect => region.unprotect(PageRange::one(fault.page)).unwrap(),
//!     }
//! };
//! let region = Region::new(RegionConfig::default(), Arc::new(resolver))?;
//! // SAFETY: the region is mapped read/write; the fault is served by the resolver.
//! unsafe { region.as_ptr().write(7) };
//! # Ok::<(), RegionError>(())
//! ```

mod handler;
mod kernel;
mod layout;
mod mapping;
mod marks;
mod pagemap;
mod region;
mod resolver;
mod signal;
mod sys;
mod written;

pub use kernel::{
    DeviceError, Features, KernelSupport, OpenError, UffdSource, UnavailableError, probe,
};
pub use layout::{
    Coalesce, DEFAULT_REGION_BASE, DEFAULT_REGION_LEN, LayoutError, OutOfRange, PAGE_SIZE,
    PageIndex, PageRange, RegionLayout, coalesce, resolve,
};
pub use mapping::{Backing, MapError};
pub use marks::{ArrayMarks, MARK_BYTES, WriteMarks};
pub use region::{
    Delivery, Install, Op, OpError, Protection, Region, RegionConfig, RegionError, RegionOps,
};
pub use resolver::{Access, Fault, FaultContext, FaultKind, FaultResolver};
pub use signal::{
    MAX_SIGNAL_REGIONS, SignalError, install_sigbus_handler, sigbus_handler_installed,
};
pub use written::{TrackerError, WriteTracker};
