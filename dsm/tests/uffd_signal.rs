//! Process-level behaviour of the `SIGBUS` path, each case in a child process (the test
//! binary re-executed with one test selected): a `SIGBUS` that is not a DSM fault still
//! crashes or reaches the handler installed before ours, and an unprivileged process
//! gets a working userfaultfd through `UFFD_USER_MODE_ONLY` (or a clear error).

use multigrain_dsm::uffd::*;
use std::ffi::c_int;
use std::num::NonZeroUsize;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};
use std::sync::Arc;

const CHILD_ENV: &str = "MULTIGRAIN_UFFD_CHILD";

fn base(slot: usize) -> usize {
    0x3800_0000_0000 + slot * (1 << 32)
}

/// Runs `test` of this binary in a child process with `CHILD_ENV` set.
fn run_child(test: &str, configure: impl FnOnce(&mut Command)) -> (ExitStatus, String) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1");
    configure(&mut cmd);
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, text)
}

fn in_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// A region with signal delivery whose pages are served zero-filled.
fn zero_region(slot: usize) -> Region {
    Region::new(
        RegionConfig::new(base(slot), 4 * PAGE_SIZE),
        Arc::new(|r: &RegionOps, f: Fault| {
            let _ = r.install_zero(f.page, Protection::Writable);
        }),
    )
    .unwrap()
}

/// Touches a shared file mapping beyond the end of its (empty) file: a genuine SIGBUS
/// that has nothing to do with DSM.
fn foreign_sigbus() -> u8 {
    use nix::sys::memfd::{MFdFlags, memfd_create};
    use nix::sys::mman::{MapFlags, ProtFlags, mmap};
    let fd = memfd_create("empty", MFdFlags::MFD_CLOEXEC).unwrap();
    // SAFETY: a new shared mapping of a memfd at an address the kernel picks.
    let p = unsafe {
        mmap(
            None,
            NonZeroUsize::new(PAGE_SIZE).unwrap(),
            ProtFlags::PROT_READ,
            MapFlags::MAP_SHARED,
            &fd,
            0,
        )
    }
    .unwrap();
    // SAFETY: the address is mapped; the file is empty, so the kernel raises SIGBUS.
    unsafe { p.as_ptr().cast::<u8>().read_volatile() }
}

#[test]
fn foreign_sigbus_still_crashes_with_the_default_action() {
    if in_child() {
        let r = zero_region(0);
        // SAFETY: inside the region; served by the resolver.
        unsafe { r.as_ptr().write_volatile(1) };
        println!("dsm fault served");
        let v = foreign_sigbus();
        println!("not reached {v}");
        return;
    }
    let (status, out) = run_child(
        "foreign_sigbus_still_crashes_with_the_default_action",
        |_| {},
    );
    assert!(out.contains("dsm fault served"), "{out}");
    assert!(!out.contains("not reached"), "{out}");
    assert_eq!(status.signal(), Some(libc::SIGBUS), "{status:?}\n{out}");
}

extern "C" fn previous_handler(_: c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: SA_SIGINFO handler: the kernel passes a valid siginfo_t.
    let code = unsafe { (*info).si_code };
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(if code == libc::BUS_ADRERR { 42 } else { 43 }) };
}

#[test]
fn foreign_sigbus_is_chained_to_the_previous_handler() {
    if in_child() {
        use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
        let act = SigAction::new(
            SigHandler::SigAction(previous_handler),
            SaFlags::empty(),
            SigSet::empty(),
        );
        // SAFETY: `previous_handler` only calls _exit.
        unsafe { sigaction(Signal::SIGBUS, &act) }.unwrap();
        let r = zero_region(1);
        // SAFETY: inside the region; served by the resolver.
        unsafe { r.as_ptr().write_volatile(1) };
        println!("dsm fault served");
        foreign_sigbus();
        return;
    }
    let (status, out) = run_child("foreign_sigbus_is_chained_to_the_previous_handler", |_| {});
    assert!(out.contains("dsm fault served"), "{out}");
    assert_eq!(status.code(), Some(42), "{status:?}\n{out}");
}

#[test]
fn sigbus_sent_by_kill_is_not_swallowed() {
    if in_child() {
        use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
        // Start from the default disposition (Rust's runtime installs a SIGBUS handler
        // for stack-overflow detection that consumes a signal sent by `kill`; chaining
        // reproduces whatever the previous disposition does).
        let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
        // SAFETY: installing SIG_DFL runs no code.
        unsafe { sigaction(Signal::SIGBUS, &dfl) }.unwrap();
        let _r = zero_region(2);
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGBUS).unwrap();
        println!("not reached");
        return;
    }
    let (status, out) = run_child("sigbus_sent_by_kill_is_not_swallowed", |_| {});
    assert!(!out.contains("not reached"), "{out}");
    assert_eq!(status.signal(), Some(libc::SIGBUS), "{status:?}\n{out}");
}

#[test]
fn unprivileged_process_uses_user_mode_only() {
    if in_child() {
        let uid = nix::unistd::geteuid();
        println!("uid {uid}");
        let k = probe(true).unwrap();
        assert_eq!(k.source, UffdSource::SyscallUserModeOnly);
        let r = zero_region(3);
        // SAFETY: inside the region; served by the resolver.
        unsafe { r.as_ptr().write_volatile(5) };
        // SAFETY: as above; the page is now present.
        assert_eq!(unsafe { r.as_ptr().read_volatile() }, 5);
        // Without UFFD_USER_MODE_ONLY an unprivileged process needs the sysctl or the
        // device; report what the error says.
        match probe(false) {
            Ok(k) => println!("privileged path also available: {:?}", k.source),
            Err(e) => println!("without user-mode-only: {e}"),
        }
        println!("child ok");
        return;
    }
    let root = nix::unistd::geteuid().is_root();
    let (status, out) = run_child("unprivileged_process_uses_user_mode_only", |cmd| {
        if root {
            cmd.uid(65534).gid(65534);
        }
    });
    assert!(
        status.success() && out.contains("child ok"),
        "{status:?}\n{out}"
    );
    let sysctl_off = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
        .is_ok_and(|s| s.trim() == "0");
    let dev_private = std::fs::metadata("/dev/userfaultfd")
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o006 == 0)
        .unwrap_or(true);
    if root && sysctl_off && dev_private {
        // Both privileged paths are closed to uid 65534: the error must say why and how.
        assert!(out.contains("vm.unprivileged_userfaultfd=1"), "{out}");
        assert!(out.contains("/dev/userfaultfd is not accessible"), "{out}");
    }
}

#[test]
fn replaced_handler_is_detected() {
    if in_child() {
        use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
        let first = zero_region(4);
        assert!(sigbus_handler_installed());
        let act = SigAction::new(
            SigHandler::SigAction(previous_handler),
            SaFlags::empty(),
            SigSet::empty(),
        );
        // SAFETY: `previous_handler` only calls _exit.
        unsafe { sigaction(Signal::SIGBUS, &act) }.unwrap();
        assert!(!sigbus_handler_installed());
        let err = Region::new(
            RegionConfig::new(base(5), PAGE_SIZE),
            Arc::new(|_: &RegionOps, _: Fault| {}),
        )
        .unwrap_err();
        assert!(
            matches!(err, RegionError::Signal(SignalError::Replaced)),
            "{err:?}"
        );
        println!("{err}");
        drop(first);
        println!("child ok");
        return;
    }
    let (status, out) = run_child("replaced_handler_is_detected", |_| {});
    assert!(
        status.success() && out.contains("child ok"),
        "{status:?}\n{out}"
    );
}
