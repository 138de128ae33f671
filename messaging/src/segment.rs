//! Memory segments that hold a site's receive rings, doorbells and Tag-On pool.
//!
//! A segment is one contiguous mapping. Everything inside is found by byte offset from the
//! segment's start, never by pointer, so the same bytes work at whatever address each
//! process maps them (paper 000 §3.1). Two kinds:
//!
//! * **private** — anonymous memory, for a site no other process needs to reach;
//! * **shared** — a POSIX shared-memory object (`shm_open`, mode `0600`, created with
//!   `O_EXCL`) that other cluster processes on the same machine map to deposit messages
//!   directly (paper 000's shared-memory substrate).
//!
//! Shared objects must not outlive the job. The creator removes the name as soon as every
//! expected peer has mapped the segment ([`Segment::unlink`]), and in `Drop`; a process that
//! dies before that leaves a name behind, so [`sweep_stale`] — run by every creator — removes
//! names whose creating process no longer exists. Names carry the uid, the creator's pid and
//! a nonce, so a leftover can never collide with a new segment.

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::mman::{
    MapFlags, MmapAdvise, ProtFlags, madvise, mmap, mmap_anonymous, munmap, shm_open, shm_unlink,
};
use nix::sys::stat::{Mode, fstat};
use nix::unistd::ftruncate;
use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::ptr::NonNull;

/// Prefix of every shared-memory object name multigrain creates (under `/dev/shm`).
pub const SHM_PREFIX: &str = "multigrain";

/// Why a segment could not be created or mapped.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    /// `shm_open`, `ftruncate`, `fstat` or `mmap` failed.
    #[error("{op} of shared-memory segment {name:?} failed: {errno}")]
    Os {
        /// The failing operation.
        op: &'static str,
        /// The segment name (empty for private segments).
        name: String,
        /// The OS error.
        errno: Errno,
    },
    /// Requested size is zero or overflows.
    #[error("segment size {0} bytes is not allowed (must be > 0 and fit the address space)")]
    BadSize(usize),
}

/// One mapped segment (see the module docs). Unmapped on drop; a shared segment created by
/// this process is also unlinked on drop.
#[derive(Debug)]
pub struct Segment {
    base: NonNull<u8>,
    len: usize,
    name: Option<String>,
    owner: bool,
    unlinked: parking_lot::Mutex<bool>,
}

// SAFETY: the mapping is plain memory; all concurrent access to its contents goes through
// atomics in the structures built on it. The handle itself is immutable but for `unlinked`.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

fn os_err<'a>(op: &'static str, name: &'a str) -> impl FnOnce(Errno) -> SegmentError + 'a {
    move |errno| SegmentError::Os {
        op,
        name: name.to_owned(),
        errno,
    }
}

impl Segment {
    /// An anonymous private segment of `len` bytes, zero-filled.
    ///
    /// # Errors
    /// [`SegmentError`] if `len` is zero or the mapping fails.
    pub fn private(len: usize) -> Result<Segment, SegmentError> {
        let size = NonZeroUsize::new(len).ok_or(SegmentError::BadSize(len))?;
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing aliases
        // nothing in this process.
        let ptr = unsafe {
            mmap_anonymous(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
            )
        }
        .map_err(os_err("mmap", ""))?;
        Ok(Segment {
            base: ptr.cast(),
            len,
            name: None,
            owner: true,
            unlinked: parking_lot::Mutex::new(true),
        })
    }

    /// Creates a new shared segment named `/{name}` of `len` bytes, mode 0600, failing if
    /// the name exists. Call [`unique_name`] for a fresh name.
    ///
    /// # Errors
    /// [`SegmentError::Os`] naming the failing call (e.g. `EEXIST`, `ENOSPC` on `/dev/shm`).
    pub fn create_shared(name: &str, len: usize) -> Result<Segment, SegmentError> {
        let size = NonZeroUsize::new(len).ok_or(SegmentError::BadSize(len))?;
        let path = format!("/{name}");
        let fd = shm_open(
            path.as_str(),
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .map_err(os_err("shm_open", name))?;
        let off = i64::try_from(len).map_err(|_| SegmentError::BadSize(len))?;
        let mapped = ftruncate(&fd, off)
            .map_err(os_err("ftruncate", name))
            .and_then(|()| {
                // SAFETY: mapping a freshly created object we own, at a kernel-chosen address.
                unsafe {
                    mmap(
                        None,
                        size,
                        ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                        MapFlags::MAP_SHARED,
                        &fd,
                        0,
                    )
                }
                .map_err(os_err("mmap", name))
            });
        match mapped {
            Ok(ptr) => Ok(Segment {
                base: ptr.cast(),
                len,
                name: Some(name.to_owned()),
                owner: true,
                unlinked: parking_lot::Mutex::new(false),
            }),
            Err(e) => {
                let _ = shm_unlink(path.as_str());
                Err(e)
            }
        }
    }

    /// Maps an existing shared segment created by another process.
    ///
    /// # Errors
    /// [`SegmentError::Os`] if it does not exist (`ENOENT`), is not ours (`EACCES`), or
    /// cannot be mapped.
    pub fn open_shared(name: &str) -> Result<Segment, SegmentError> {
        let path = format!("/{name}");
        let fd = shm_open(path.as_str(), OFlag::O_RDWR, Mode::empty())
            .map_err(os_err("shm_open", name))?;
        let st = fstat(&fd).map_err(os_err("fstat", name))?;
        let len = usize::try_from(st.st_size).map_err(|_| SegmentError::BadSize(0))?;
        let size = NonZeroUsize::new(len).ok_or(SegmentError::BadSize(len))?;
        // SAFETY: mapping a shared object at a kernel-chosen address aliases nothing here;
        // its contents are validated by the caller before use.
        let ptr = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &fd,
                0,
            )
        }
        .map_err(os_err("mmap", name))?;
        Ok(Segment {
            base: ptr.cast(),
            len,
            name: Some(name.to_owned()),
            owner: false,
            unlinked: parking_lot::Mutex::new(true),
        })
    }

    /// First byte of the mapping.
    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Maps the first `len` bytes of the segment now (at most its length), writable
    /// (`MADV_POPULATE_WRITE`), so that the structures there — rings, the pool's
    /// bookkeeping and its first slots ([`Pool::warm_end`](crate::pool::Pool::warm_end))
    /// — pay no page fault, and over shared memory no page clear, when first used. (With
    /// the whole pool mapped ahead, a DSM cluster's 16 MiB, the page faults of its first
    /// use were gone — ≈ 13,000 faults, 3–4 % of the CPU time of a Water 512 × 50 run on
    /// 2 × 1 over shared memory; `bench dsm`'s remote fault 39.6 → 17.6 µs — but mapping
    /// and clearing the 16 MiB in every cluster, and mapping the peers' pools again, took
    /// ≈ 40 % of the CPU time of starting and stopping the job.) Best effort: kernels
    /// before 5.14 refuse the advice, and the pages are then mapped on first use.
    pub(crate) fn populate(&self, len: usize) {
        let len = len.min(self.len);
        if len == 0 {
            return;
        }
        // SAFETY: `base..base + len` lies inside this segment's mapping, which this
        // handle keeps alive; the advice only maps its pages (allocating zeroed pages
        // where the object has none), it does not change their contents.
        let _ = unsafe { madvise(self.base.cast(), len, MmapAdvise::MADV_POPULATE_WRITE) };
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length segment (never: constructors refuse size 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The shared-memory name, `None` for a private segment.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Pointer `offset` bytes into the segment, if `offset + size <= len`.
    pub fn at(&self, offset: usize, size: usize) -> Option<NonNull<u8>> {
        if offset.checked_add(size)? <= self.len {
            // SAFETY: `offset` is within the mapping (checked just above).
            Some(unsafe { self.base.add(offset) })
        } else {
            None
        }
    }

    /// Removes the segment's name so no further process can map it; existing mappings stay
    /// valid. Idempotent; a no-op for private segments and for segments this process did
    /// not create.
    pub fn unlink(&self) {
        if self.owner
            && !std::mem::replace(&mut *self.unlinked.lock(), true)
            && let Some(name) = &self.name
        {
            let _ = shm_unlink(format!("/{name}").as_str());
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.unlink();
        // SAFETY: `base`/`len` describe exactly the mapping made in the constructor, and
        // every structure built on it borrows or Arc-holds this Segment, so nothing uses
        // the memory after this point.
        unsafe {
            let _ = munmap(self.base.cast::<c_void>(), self.len);
        }
    }
}

/// A fresh segment name: `multigrain-{uid}-{pid}-{tag}-{nonce}`.
pub fn unique_name(tag: &str) -> String {
    static NONCE: parking_lot::Mutex<u64> = parking_lot::Mutex::new(0);
    let n = {
        let mut g = NONCE.lock();
        *g += 1;
        *g
    };
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{SHM_PREFIX}-{}-{}-{tag}-{n}x{t:08x}",
        nix::unistd::getuid(),
        std::process::id()
    )
}

/// Removes shared-memory names of this user whose creating process has exited (left by a
/// process killed before it could unlink). Returns the names removed.
pub fn sweep_stale() -> Vec<String> {
    sweep_stale_in(std::path::Path::new("/dev/shm"))
}

fn sweep_stale_in(dir: &std::path::Path) -> Vec<String> {
    let prefix = format!("{SHM_PREFIX}-{}-", nix::unistd::getuid());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if !process_alive(pid) && shm_unlink(format!("/{name}").as_str()).is_ok() {
            removed.push(name);
        }
    }
    removed
}

/// True if a process with this pid exists (signal 0 probe; `EPERM` means it exists).
pub fn process_alive(pid: i32) -> bool {
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(Errno::ESRCH)
    )
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Which of the segment's pages are resident (`mincore`).
    fn resident(seg: &Segment) -> Vec<bool> {
        let pages = seg.len().div_ceil(4096);
        let mut v = vec![0u8; pages];
        // SAFETY: the range is this live mapping; `v` has one byte per page of it.
        let rc = unsafe { libc::mincore(seg.base().as_ptr().cast(), seg.len(), v.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", Errno::last());
        v.iter().map(|b| b & 1 == 1).collect()
    }

    #[test]
    fn populate_maps_the_prefix_only() {
        let name = unique_name("populate");
        let seg = Segment::create_shared(&name, 16 * 4096).unwrap();
        assert!(resident(&seg).iter().all(|&r| !r), "nothing mapped before");
        seg.populate(5 * 4096 + 1);
        let r = resident(&seg);
        assert!(
            r[..6].iter().all(|&r| r),
            "the prefix, rounded up to pages: {r:?}"
        );
        assert!(r[6..].iter().all(|&r| !r), "nothing past it: {r:?}");
        seg.populate(usize::MAX);
        assert!(resident(&seg).iter().all(|&r| r), "clamped to the segment");
    }

    #[test]
    fn shared_segment_is_0600_and_visible_to_a_second_mapping() {
        let name = unique_name("test");
        let a = Segment::create_shared(&name, 8192).unwrap();
        let mode = std::fs::metadata(format!("/dev/shm/{name}"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let b = Segment::open_shared(&name).unwrap();
        assert_eq!(b.len(), 8192);
        // SAFETY: both mappings are live and 8192 bytes long; byte 100 is in range.
        unsafe {
            a.base().add(100).write(42);
            assert_eq!(b.base().add(100).read(), 42);
        }
        a.unlink();
        assert!(
            Segment::open_shared(&name).is_err(),
            "an unlinked name cannot be opened"
        );
        // SAFETY: unlinking keeps existing mappings valid.
        unsafe { assert_eq!(b.base().add(100).read(), 42) };
    }

    #[test]
    fn create_refuses_an_existing_name() {
        let name = unique_name("excl");
        let _a = Segment::create_shared(&name, 4096).unwrap();
        let err = Segment::create_shared(&name, 4096).unwrap_err();
        assert!(
            matches!(
                err,
                SegmentError::Os {
                    errno: Errno::EEXIST,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn sweep_removes_names_of_dead_processes_only() {
        // A name that claims a pid that cannot exist (above pid_max) is stale.
        let dead = format!("{SHM_PREFIX}-{}-{}-t-0x0", nix::unistd::getuid(), i32::MAX);
        let fd = shm_open(
            format!("/{dead}").as_str(),
            OFlag::O_CREAT | OFlag::O_RDWR,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .unwrap();
        drop(fd);
        let live = unique_name("live");
        let _seg = Segment::create_shared(&live, 4096).unwrap();
        let removed = sweep_stale();
        // Another test process may sweep first; what matters is that the name is gone.
        assert!(
            !std::path::Path::new(&format!("/dev/shm/{dead}")).exists(),
            "stale {dead} not swept"
        );
        assert!(!removed.contains(&live));
        assert!(std::path::Path::new(&format!("/dev/shm/{live}")).exists());
    }

    #[test]
    fn zero_size_is_refused() {
        assert!(matches!(Segment::private(0), Err(SegmentError::BadSize(0))));
    }
}
