//! Creating a userfaultfd, the feature handshake, and saying clearly why it failed.
//!
//! Order of attempts (issue 4): `userfaultfd(UFFD_USER_MODE_ONLY)` first, which works
//! unprivileged on Linux ≥ 5.11 whatever `vm.unprivileged_userfaultfd` says; on a kernel
//! that rejects the flag (`EINVAL`, Linux < 5.11) the plain system call; and when the
//! system call is refused, `/dev/userfaultfd` (Linux ≥ 6.1, governed by the file's
//! permissions). The features a caller needs are checked before the descriptor is used,
//! by a handshake on a throw-away descriptor (the kernel accepts `UFFDIO_API` once per
//! descriptor and reports the full feature set in that answer).

use super::sys;
use nix::errno::Errno;
use std::fmt;
use std::os::fd::{AsFd, IntoRawFd, OwnedFd};
use std::os::unix::io::FromRawFd;

/// A set of `UFFD_FEATURE_*` bits as reported or requested in the `UFFDIO_API` handshake.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Features(u64);

macro_rules! features {
    ($($(#[$doc:meta])* $name:ident = $bit:expr;)*) => {
        impl Features {
            $($(#[$doc])* pub const $name: Features = Features(1 << $bit);)*
            const NAMED: &'static [(&'static str, Features)] = &[$((stringify!($name), Features::$name)),*];
        }
    };
}

features! {
    /// Write-protect faults are reported (`UFFD_FEATURE_PAGEFAULT_FLAG_WP`, Linux 5.7 for
    /// anonymous memory).
    PAGEFAULT_FLAG_WP = 0;
    /// `UFFD_FEATURE_EVENT_FORK`.
    EVENT_FORK = 1;
    /// `UFFD_FEATURE_EVENT_REMAP`.
    EVENT_REMAP = 2;
    /// `UFFD_FEATURE_EVENT_REMOVE`.
    EVENT_REMOVE = 3;
    /// `UFFD_FEATURE_MISSING_HUGETLBFS`.
    MISSING_HUGETLBFS = 4;
    /// `UFFD_FEATURE_MISSING_SHMEM`.
    MISSING_SHMEM = 5;
    /// `UFFD_FEATURE_EVENT_UNMAP`.
    EVENT_UNMAP = 6;
    /// Faults raise `SIGBUS` in the faulting thread instead of queueing an event
    /// (`UFFD_FEATURE_SIGBUS`, Linux 4.14).
    SIGBUS = 7;
    /// `UFFD_FEATURE_THREAD_ID`.
    THREAD_ID = 8;
    /// `UFFD_FEATURE_MINOR_HUGETLBFS`.
    MINOR_HUGETLBFS = 9;
    /// `UFFD_FEATURE_MINOR_SHMEM`.
    MINOR_SHMEM = 10;
    /// `UFFD_FEATURE_EXACT_ADDRESS`.
    EXACT_ADDRESS = 11;
    /// `UFFD_FEATURE_WP_HUGETLBFS_SHMEM`.
    WP_HUGETLBFS_SHMEM = 12;
    /// `UFFD_FEATURE_WP_UNPOPULATED` (Linux 6.4): write-protecting a never-touched
    /// anonymous page leaves a marker, so its first *write* reports a write-protect fault
    /// instead of a missing fault. The layer does **not** request it (see
    /// [`RegionOps::write_protect`](super::RegionOps::write_protect)).
    WP_UNPOPULATED = 13;
    /// `UFFD_FEATURE_POISON`.
    POISON = 14;
    /// `UFFD_FEATURE_WP_ASYNC`.
    WP_ASYNC = 15;
    /// `UFFD_FEATURE_MOVE`.
    MOVE = 16;
}

impl Features {
    /// The empty set.
    pub const fn empty() -> Self {
        Features(0)
    }

    /// The raw bits.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// The set with exactly these bits (unknown bits are kept).
    pub const fn from_bits(bits: u64) -> Self {
        Features(bits)
    }

    /// Whether every feature of `other` is in `self`.
    pub const fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }

    /// Features in `self` or `other`.
    pub const fn union(self, other: Features) -> Self {
        Features(self.0 | other.0)
    }

    /// Features in `self` but not in `other`.
    pub const fn difference(self, other: Features) -> Self {
        Features(self.0 & !other.0)
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The names of the features in the set (without the `UFFD_FEATURE_` prefix).
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        Self::NAMED
            .iter()
            .filter(move |(_, f)| self.contains(*f))
            .map(|(n, _)| *n)
    }

    /// The kernel release that introduced the feature for anonymous memory, for messages.
    fn since(self) -> &'static str {
        match self {
            Features::PAGEFAULT_FLAG_WP => "Linux 5.7",
            Features::SIGBUS | Features::THREAD_ID => "Linux 4.14",
            Features::WP_UNPOPULATED => "Linux 6.4",
            Features::WP_HUGETLBFS_SHMEM => "Linux 5.19",
            Features::MOVE => "Linux 6.8",
            _ => "a newer kernel",
        }
    }
}

impl fmt::Display for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for name in self.names() {
            if !first {
                f.write_str("|")?;
            }
            f.write_str(name)?;
            first = false;
        }
        let known = Self::NAMED.iter().fold(0, |acc, (_, f)| acc | f.0);
        let unknown = self.0 & !known;
        if unknown != 0 {
            if !first {
                f.write_str("|")?;
            }
            write!(f, "{unknown:#x}")?;
            first = false;
        }
        if first {
            f.write_str("(none)")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Features({self})")
    }
}

/// How the userfaultfd was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UffdSource {
    /// `userfaultfd(UFFD_USER_MODE_ONLY)`: unprivileged on Linux ≥ 5.11; kernel-mode
    /// accesses (system calls reading or writing a missing page) fail with `EFAULT`.
    SyscallUserModeOnly,
    /// `userfaultfd(0)`: needs `vm.unprivileged_userfaultfd = 1` or `CAP_SYS_PTRACE`.
    Syscall,
    /// `ioctl(USERFAULTFD_IOC_NEW)` on `/dev/userfaultfd` (Linux ≥ 6.1).
    Device,
}

/// What the kernel offers, learned from the `UFFDIO_API` handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSupport {
    /// Every feature the kernel supports (not only the requested ones).
    pub available: Features,
    /// The features enabled on the descriptor in use (requested in the handshake).
    pub enabled: Features,
    /// The `UFFDIO_*` ioctls the descriptor supports, as the kernel's bit mask
    /// (bit `n` = ioctl number `n`).
    pub ioctls: u64,
    /// How the descriptor was created.
    pub source: UffdSource,
}

/// Why `/dev/userfaultfd` could not be used.
#[derive(Debug)]
pub enum DeviceError {
    /// Opening the device failed (`ENOENT`: no such device, Linux < 6.1; `EACCES`: the
    /// file's permissions exclude this user).
    Open(std::io::Error),
    /// The `USERFAULTFD_IOC_NEW` ioctl failed.
    Ioctl(Errno),
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::Open(e) => write!(f, "open(/dev/userfaultfd): {e}"),
            DeviceError::Ioctl(e) => write!(f, "ioctl(/dev/userfaultfd, USERFAULTFD_IOC_NEW): {e}"),
        }
    }
}

/// No userfaultfd could be created: both the system call and `/dev/userfaultfd` failed.
/// The message says why and what to do.
#[derive(Debug)]
pub struct UnavailableError {
    /// Whether the system call was tried with `UFFD_USER_MODE_ONLY`.
    pub user_mode_only: bool,
    /// The error of the `userfaultfd(2)` system call.
    pub syscall: Errno,
    /// The error of the `/dev/userfaultfd` path.
    pub device: DeviceError,
}

impl UnavailableError {
    /// Advice for the operator, one line per cause that applies.
    pub fn advice(&self) -> Vec<String> {
        let mut out = Vec::new();
        match self.syscall {
            Errno::ENOSYS => out.push(
                "userfaultfd(2) returned ENOSYS: the kernel is built without CONFIG_USERFAULTFD, \
                 or a seccomp filter (e.g. a container runtime's default profile) blocks the \
                 system call; allow `userfaultfd` in the seccomp profile"
                    .to_string(),
            ),
            Errno::EPERM if self.user_mode_only => out.push(
                "userfaultfd(UFFD_USER_MODE_ONLY) returned EPERM although Linux >= 5.11 allows it \
                 unprivileged: a security module or seccomp policy forbids it"
                    .to_string(),
            ),
            Errno::EPERM => out.push(
                "userfaultfd(2) returned EPERM: unprivileged userfaultfd is disabled; run \
                 `sysctl -w vm.unprivileged_userfaultfd=1` (or put it in /etc/sysctl.d/), or give \
                 the process CAP_SYS_PTRACE; on Linux >= 5.11 use UFFD_USER_MODE_ONLY"
                    .to_string(),
            ),
            e => out.push(format!("userfaultfd(2) failed: {e}")),
        }
        match &self.device {
            DeviceError::Open(e) if e.kind() == std::io::ErrorKind::NotFound => out.push(
                "/dev/userfaultfd does not exist (it needs Linux >= 6.1 with CONFIG_USERFAULTFD)"
                    .to_string(),
            ),
            DeviceError::Open(e) if e.kind() == std::io::ErrorKind::PermissionDenied => out.push(
                "/dev/userfaultfd is not accessible to this user (it is usually mode 0600 root): \
                 give the user read/write access, e.g. a group owning the device with mode 0660 \
                 or a udev rule"
                    .to_string(),
            ),
            d => out.push(d.to_string()),
        }
        out
    }
}

impl fmt::Display for UnavailableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "userfaultfd is unavailable: userfaultfd({}) failed with {} and {}",
            if self.user_mode_only {
                "UFFD_USER_MODE_ONLY"
            } else {
                "0"
            },
            self.syscall,
            self.device
        )?;
        for line in self.advice() {
            write!(f, "; {line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for UnavailableError {}

/// Creating and negotiating a userfaultfd failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// No descriptor could be created.
    #[error(transparent)]
    Unavailable(#[from] UnavailableError),
    /// The `UFFDIO_API` handshake failed.
    #[error("UFFDIO_API handshake failed: {0}")]
    Handshake(Errno),
    /// The kernel lacks features the region needs.
    #[error(
        "the kernel's userfaultfd lacks {missing} ({}); it offers {available}. \
         Upgrade the kernel or choose a configuration that does not need them",
        describe_missing(.missing)
    )]
    MissingFeatures {
        /// The required features that are absent.
        missing: Features,
        /// What the kernel offers.
        available: Features,
    },
}

/// "SIGBUS needs Linux 4.14, ..." for the features in `missing`.
fn describe_missing(missing: &Features) -> String {
    Features::NAMED
        .iter()
        .filter(|(_, f)| missing.contains(*f))
        .map(|(n, f)| format!("{n} needs {}", f.since()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which creation paths to try; `user_mode_only` is what a region asks for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attempt {
    pub user_mode_only: bool,
    pub use_syscall: bool,
    pub use_device: bool,
}

impl Attempt {
    pub(crate) fn standard(user_mode_only: bool) -> Self {
        Attempt {
            user_mode_only,
            use_syscall: true,
            use_device: true,
        }
    }
}

/// Creates a descriptor following `attempt` (close-on-exec, non-blocking).
fn create(attempt: Attempt) -> Result<(OwnedFd, UffdSource), UnavailableError> {
    let base = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let mut syscall_err = Errno::ENOSYS;
    if attempt.use_syscall {
        let flags = if attempt.user_mode_only {
            base | sys::UFFD_USER_MODE_ONLY
        } else {
            base
        };
        match sys::userfaultfd_syscall(flags) {
            Ok(fd) if attempt.user_mode_only => return Ok((fd, UffdSource::SyscallUserModeOnly)),
            Ok(fd) => return Ok((fd, UffdSource::Syscall)),
            // Linux < 5.11 rejects the flag; those kernels handle kernel-mode faults anyway.
            Err(Errno::EINVAL) if attempt.user_mode_only => match sys::userfaultfd_syscall(base) {
                Ok(fd) => return Ok((fd, UffdSource::Syscall)),
                Err(e) => syscall_err = e,
            },
            Err(e) => syscall_err = e,
        }
    }
    let device = if attempt.use_device {
        let flags = if attempt.user_mode_only {
            base | sys::UFFD_USER_MODE_ONLY
        } else {
            base
        };
        match sys::userfaultfd_device(flags) {
            Ok(fd) => return Ok((fd, UffdSource::Device)),
            Err(sys::DeviceFailure::Open(e)) => DeviceError::Open(e),
            Err(sys::DeviceFailure::Ioctl(e)) => DeviceError::Ioctl(e),
        }
    } else {
        DeviceError::Open(std::io::Error::from(std::io::ErrorKind::Unsupported))
    };
    Err(UnavailableError {
        user_mode_only: attempt.user_mode_only,
        syscall: syscall_err,
        device,
    })
}

/// Learns what the kernel supports, creating a userfaultfd the way a region would
/// (`user_mode_only` as in [`RegionConfig`](super::RegionConfig)) and closing it again.
pub fn probe(user_mode_only: bool) -> Result<KernelSupport, OpenError> {
    probe_with(Attempt::standard(user_mode_only))
}

pub(crate) fn probe_with(attempt: Attempt) -> Result<KernelSupport, OpenError> {
    let (fd, source) = create(attempt)?;
    let api = sys::api_handshake(fd.as_fd(), 0).map_err(OpenError::Handshake)?;
    Ok(KernelSupport {
        available: Features(api.features),
        enabled: Features::empty(),
        ioctls: api.ioctls,
        source,
    })
}

/// Creates a userfaultfd with `required` features enabled, after checking that the
/// kernel offers them, and those of `optional` that it offers
/// ([`KernelSupport::enabled`] says which).
pub(crate) fn open(
    attempt: Attempt,
    required: Features,
    optional: Features,
) -> Result<(userfaultfd::Uffd, KernelSupport), OpenError> {
    let probed = probe_with(attempt)?;
    let missing = required.difference(probed.available);
    if !missing.is_empty() {
        return Err(OpenError::MissingFeatures {
            missing,
            available: probed.available,
        });
    }
    let requested = required.union(Features(optional.0 & probed.available.0));
    let (fd, source) = create(attempt)?;
    let api = sys::api_handshake(fd.as_fd(), requested.bits()).map_err(OpenError::Handshake)?;
    // SAFETY: `into_raw_fd` hands over sole ownership of the descriptor; `Uffd` closes
    // it on drop.
    let uffd = unsafe { userfaultfd::Uffd::from_raw_fd(fd.into_raw_fd()) };
    Ok((
        uffd,
        KernelSupport {
            available: Features(api.features),
            enabled: requested,
            ioctls: api.ioctls,
            source,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_display_names_and_unknown_bits() {
        let f = Features::SIGBUS
            .union(Features::PAGEFAULT_FLAG_WP)
            .union(Features(1 << 40));
        assert_eq!(f.to_string(), "PAGEFAULT_FLAG_WP|SIGBUS|0x10000000000");
        assert_eq!(Features::empty().to_string(), "(none)");
        assert!(f.contains(Features::SIGBUS));
        assert!(!f.contains(Features::MOVE));
        assert_eq!(f.difference(Features::SIGBUS).names().count(), 1);
    }

    #[test]
    fn unavailable_error_names_the_fixes() {
        let e = UnavailableError {
            user_mode_only: false,
            syscall: Errno::EPERM,
            device: DeviceError::Open(std::io::Error::from(std::io::ErrorKind::PermissionDenied)),
        };
        let msg = e.to_string();
        assert!(msg.contains("vm.unprivileged_userfaultfd=1"), "{msg}");
        assert!(msg.contains("/dev/userfaultfd is not accessible"), "{msg}");
        let e = UnavailableError {
            user_mode_only: true,
            syscall: Errno::ENOSYS,
            device: DeviceError::Open(std::io::Error::from(std::io::ErrorKind::NotFound)),
        };
        let msg = e.to_string();
        assert!(msg.contains("CONFIG_USERFAULTFD"), "{msg}");
        assert!(msg.contains("Linux >= 6.1"), "{msg}");
    }

    #[test]
    fn missing_features_error_names_kernel_versions() {
        let e = OpenError::MissingFeatures {
            missing: Features::PAGEFAULT_FLAG_WP.union(Features::SIGBUS),
            available: Features::EVENT_FORK,
        };
        let msg = e.to_string();
        assert!(msg.contains("PAGEFAULT_FLAG_WP needs Linux 5.7"), "{msg}");
        assert!(msg.contains("SIGBUS needs Linux 4.14"), "{msg}");
        assert!(msg.contains("offers EVENT_FORK"), "{msg}");
    }

    #[test]
    fn probe_finds_the_features_this_layer_needs() {
        let k = probe(true).expect("userfaultfd must be available on the test machine");
        assert!(
            k.available
                .contains(Features::PAGEFAULT_FLAG_WP.union(Features::SIGBUS)),
            "{k:?}"
        );
    }

    #[test]
    fn device_path_works_when_accessible() {
        // As root the device is accessible; elsewhere it must fail with a clear reason.
        let only_device = Attempt {
            user_mode_only: true,
            use_syscall: false,
            use_device: true,
        };
        match probe_with(only_device) {
            Ok(k) => assert_eq!(k.source, UffdSource::Device),
            Err(OpenError::Unavailable(e)) => {
                assert!(matches!(e.device, DeviceError::Open(_)), "{e}")
            }
            Err(e) => panic!("unexpected: {e}"),
        }
    }
}
