//! The raw userfaultfd ABI pieces that the `userfaultfd` crate (0.9) does not expose.
//!
//! The crate covers registration, `UFFDIO_COPY` without flags, `UFFDIO_ZEROPAGE`,
//! `UFFDIO_WAKE`, `UFFDIO_WRITEPROTECT` and event parsing; the layer uses it for those.
//! What it lacks, and what lives here:
//!
//! - creating the descriptor with `UFFD_USER_MODE_ONLY` through the system call *first*
//!   and only then through `/dev/userfaultfd` (the crate tries the device first and does
//!   not fall back when the device exists but is not accessible);
//! - the `UFFDIO_API` handshake that *reports* the kernel's feature set (the crate only
//!   checks a required set), and feature bits newer than the crate's bindings
//!   (`UFFD_FEATURE_WP_UNPOPULATED`, `..._POISON`, `..._WP_ASYNC`, `..._MOVE`);
//! - `UFFDIO_COPY` with `UFFDIO_COPY_MODE_WP` (install read-only in one call);
//! - `UFFDIO_CONTINUE` with `UFFDIO_CONTINUE_MODE_WP` (map a page already in the page
//!   cache read-only in one call; the crate's `continue` takes no mode);
//! - reading the calling process's own memory with `process_vm_readv(2)`, which fails
//!   with `EFAULT` instead of faulting when a page is missing.
//!
//! Values from `include/uapi/linux/userfaultfd.h` (Linux 6.18).

use nix::errno::Errno;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

/// `UFFD_API`: the only API version.
pub(crate) const UFFD_API: u64 = 0xAA;
/// `UFFD_USER_MODE_ONLY` (Linux 5.11): the descriptor handles user-mode faults only,
/// which lets an unprivileged process create it even with
/// `vm.unprivileged_userfaultfd = 0`.
pub(crate) const UFFD_USER_MODE_ONLY: libc::c_int = 1;

/// `UFFDIO_COPY_MODE_DONTWAKE`.
const UFFDIO_COPY_MODE_DONTWAKE: u64 = 1 << 0;
/// `UFFDIO_COPY_MODE_WP` (Linux 5.7): map the copied page write-protected.
const UFFDIO_COPY_MODE_WP: u64 = 1 << 1;

/// `UFFDIO_CONTINUE_MODE_WP` (Linux 6.4): map the page write-protected.
const UFFDIO_CONTINUE_MODE_WP: u64 = 1 << 1;

/// `struct uffdio_api`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct UffdioApi {
    pub api: u64,
    pub features: u64,
    pub ioctls: u64,
}

/// `struct uffdio_copy`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

/// `struct uffdio_continue` (its `struct uffdio_range` inlined).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct UffdioContinue {
    start: u64,
    len: u64,
    mode: u64,
    mapped: i64,
}

const UFFDIO: u8 = 0xAA;
const UFFDIO_API_NR: u8 = 0x3F;
const UFFDIO_COPY_NR: u8 = 0x03;
const UFFDIO_CONTINUE_NR: u8 = 0x07;
/// `UFFDIO_CONTINUE`'s bit in a registered range's ioctl mask (the crate's `IoctlFlags`
/// has no name for it).
pub(crate) const UFFDIO_CONTINUE_IOCTL: u64 = 1 << UFFDIO_CONTINUE_NR;

nix::ioctl_readwrite!(
    /// `UFFDIO_API`.
    ///
    /// # Safety
    ///
    /// `fd` must be a userfaultfd and `data` must point to a writable `UffdioApi`.
    ioctl_api,
    UFFDIO,
    UFFDIO_API_NR,
    UffdioApi
);
nix::ioctl_readwrite!(
    /// `UFFDIO_COPY`.
    ///
    /// # Safety
    ///
    /// `fd` must be a userfaultfd, `data` must point to a writable `UffdioCopy` whose
    /// `src..src+len` is readable memory of this process.
    ioctl_copy,
    UFFDIO,
    UFFDIO_COPY_NR,
    UffdioCopy
);
nix::ioctl_readwrite!(
    /// `UFFDIO_CONTINUE`.
    ///
    /// # Safety
    ///
    /// `fd` must be a userfaultfd and `data` must point to a writable `UffdioContinue`.
    ioctl_continue,
    UFFDIO,
    UFFDIO_CONTINUE_NR,
    UffdioContinue
);
nix::ioctl_write_int_bad!(
    /// `USERFAULTFD_IOC_NEW` on `/dev/userfaultfd`: returns a new userfaultfd; the
    /// argument takes the flags of the `userfaultfd(2)` system call.
    ///
    /// # Safety
    ///
    /// `fd` must be an open `/dev/userfaultfd`.
    ioctl_new_uffd,
    nix::request_code_none!(0xAA, 0x00)
);

/// `userfaultfd(2)` with `flags`; the new descriptor is owned by the result.
pub(crate) fn userfaultfd_syscall(flags: libc::c_int) -> Result<OwnedFd, Errno> {
    // SAFETY: userfaultfd(2) takes one integer argument and touches no memory of ours; it
    // returns a new descriptor or -1 with errno set.
    let ret = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::c_long::from(flags)) };
    let fd = Errno::result(ret)?;
    let fd = RawFd::try_from(fd).map_err(|_| Errno::EOVERFLOW)?;
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Why `/dev/userfaultfd` gave no descriptor.
#[derive(Debug)]
pub(crate) enum DeviceFailure {
    /// `open("/dev/userfaultfd")` failed.
    Open(io::Error),
    /// `ioctl(USERFAULTFD_IOC_NEW)` failed.
    Ioctl(Errno),
}

/// A userfaultfd made through `/dev/userfaultfd` (Linux 6.1), whose access is governed by
/// the file's permissions instead of `vm.unprivileged_userfaultfd`.
pub(crate) fn userfaultfd_device(flags: libc::c_int) -> Result<OwnedFd, DeviceFailure> {
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/userfaultfd")
        .map_err(DeviceFailure::Open)?;
    // SAFETY: `dev` is an open /dev/userfaultfd for the duration of the call.
    let fd = unsafe { ioctl_new_uffd(dev.as_raw_fd(), flags) }.map_err(DeviceFailure::Ioctl)?;
    // SAFETY: the ioctl returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The `UFFDIO_API` handshake requesting `features`; returns what the kernel reported
/// (all features it supports and the ioctls of the descriptor).
pub(crate) fn api_handshake(fd: BorrowedFd<'_>, features: u64) -> Result<UffdioApi, Errno> {
    let mut api = UffdioApi {
        api: UFFD_API,
        features,
        ioctls: 0,
    };
    // SAFETY: `fd` is a userfaultfd (callers pass only descriptors made above) and `api`
    // is a live, writable `struct uffdio_api`.
    unsafe { ioctl_api(fd.as_raw_fd(), &mut api) }?;
    Ok(api)
}

/// `UFFDIO_COPY` of one or more whole pages from `src` to `dst`, optionally
/// write-protected; wakes threads waiting on the range. Returns the bytes copied.
///
/// The kernel checks that `dst..dst+len` lies in a range registered with `fd` (else
/// `ENOENT`/`EINVAL`) and is not yet populated (else `EEXIST`); it never writes outside
/// that range.
pub(crate) fn copy(
    fd: BorrowedFd<'_>,
    dst: usize,
    src: &[u8],
    write_protect: bool,
) -> Result<usize, Errno> {
    let mut arg = UffdioCopy {
        dst: dst as u64,
        src: src.as_ptr() as u64,
        len: src.len() as u64,
        mode: if write_protect {
            UFFDIO_COPY_MODE_WP
        } else {
            0
        },
        copy: 0,
    };
    debug_assert_eq!(arg.mode & UFFDIO_COPY_MODE_DONTWAKE, 0);
    // SAFETY: `fd` is a userfaultfd; `arg` is a live `struct uffdio_copy` whose source is
    // the readable slice `src`; the destination is checked by the kernel against the
    // ranges registered with `fd`, and those are memory reached only through raw
    // pointers (no Rust reference covers a missing page).
    match unsafe { ioctl_copy(fd.as_raw_fd(), &mut arg) } {
        Ok(_) => Ok(usize::try_from(arg.copy).unwrap_or(0)),
        Err(e) => Err(e),
    }
}

/// `UFFDIO_CONTINUE` of `len` bytes at `start`: maps the pages the file (a memfd) already
/// holds in its page cache into a range registered for minor faults, optionally
/// write-protected; wakes threads waiting on the range.
///
/// The kernel checks that the range is registered with `fd` in minor mode (else
/// `ENOENT`/`EINVAL`), that the page cache holds each page (else `EFAULT`) and that no page
/// is mapped yet (else `EEXIST`). It writes no memory: the pages' contents are what the
/// file holds.
pub(crate) fn continue_range(
    fd: BorrowedFd<'_>,
    start: usize,
    len: usize,
    write_protect: bool,
) -> Result<(), Errno> {
    let mut arg = UffdioContinue {
        start: start as u64,
        len: len as u64,
        mode: if write_protect {
            UFFDIO_CONTINUE_MODE_WP
        } else {
            0
        },
        mapped: 0,
    };
    // SAFETY: `fd` is a userfaultfd; `arg` is a live `struct uffdio_continue`. The ioctl
    // only maps pages of the file that are already in its page cache into the registered
    // range; no memory of this process changes contents.
    unsafe { ioctl_continue(fd.as_raw_fd(), &mut arg) }.map(drop)
}

/// Copies `out.len()` bytes of this process's memory at `addr` into `out` with
/// `process_vm_readv(2)`. A page that is not present is *not* faulted in through
/// userfaultfd (kernel-mode accesses are not handled for a `UFFD_USER_MODE_ONLY` or a
/// SIGBUS-mode descriptor): the call fails with `EFAULT` instead.
pub(crate) fn read_own_memory(addr: usize, out: &mut [u8]) -> Result<usize, Errno> {
    use nix::sys::uio::{RemoteIoVec, process_vm_readv};
    let len = out.len();
    let mut local = [io::IoSliceMut::new(out)];
    let remote = [RemoteIoVec { base: addr, len }];
    process_vm_readv(nix::unistd::getpid(), &mut local, &remote)
}
