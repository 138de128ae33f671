//! Fault-handler threads of [`Delivery::Threads`](super::Delivery::Threads): read fault
//! events from the userfaultfd and call the resolver; spin for a bounded time after each
//! event, then sleep in `poll(2)`. Stopped and joined when the region drops.

use super::region::Shared;
use super::resolver::{Access, Fault, FaultContext, FaultKind};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use userfaultfd::{Event, EventBuffer, ReadWrite};

/// Events read per `read(2)`.
const EVENTS_PER_READ: usize = 16;

/// The handler threads of one region.
pub(crate) struct Handlers {
    stop: Arc<Stop>,
    threads: Vec<JoinHandle<()>>,
}

struct Stop {
    flag: AtomicBool,
    event: EventFd,
}

impl Handlers {
    pub(crate) fn spawn(
        shared: &Arc<Shared>,
        count: usize,
        spin: Duration,
    ) -> std::io::Result<Handlers> {
        let stop = Arc::new(Stop {
            flag: AtomicBool::new(false),
            event: EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?,
        });
        let mut handlers = Handlers {
            stop,
            threads: Vec::with_capacity(count),
        };
        for i in 0..count {
            let shared = Arc::clone(shared);
            let stop = Arc::clone(&handlers.stop);
            let t = std::thread::Builder::new()
                .name(format!("uffd-handler-{i}"))
                .spawn(move || serve(&shared, &stop, spin))?;
            // On error `handlers` drops here and joins the threads already started.
            handlers.threads.push(t);
        }
        Ok(handlers)
    }

    pub(crate) fn len(&self) -> usize {
        self.threads.len()
    }
}

impl Drop for Handlers {
    fn drop(&mut self) {
        self.stop.flag.store(true, Ordering::SeqCst);
        // Wakes every thread sleeping in poll (the counter stays readable).
        let _ = self.stop.event.write(1);
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::error!("a userfaultfd handler thread panicked");
            }
        }
    }
}

fn serve(shared: &Shared, stop: &Stop, spin: Duration) {
    let uffd = shared.ops.uffd();
    let mut buf = EventBuffer::new(EVENTS_PER_READ);
    loop {
        // Busy phase: poll without sleeping until `spin` has passed since the last event.
        let mut last_event = Instant::now();
        loop {
            if stop.flag.load(Ordering::Relaxed) {
                return;
            }
            match drain(shared, uffd, &mut buf) {
                Ok(0) => {}
                Ok(_) => {
                    last_event = Instant::now();
                    continue;
                }
                Err(e) => {
                    tracing::error!("reading userfaultfd events failed: {e}; handler stops");
                    return;
                }
            }
            if spin.is_zero() || last_event.elapsed() >= spin {
                break;
            }
            std::hint::spin_loop();
        }
        // Sleeping phase.
        let mut fds = [
            PollFd::new(uffd.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.event.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                tracing::error!("poll on userfaultfd failed: {e}; handler stops");
                return;
            }
        }
    }
}

/// Reads the pending events (non-blocking) and serves them; returns how many.
fn drain(
    shared: &Shared,
    uffd: &userfaultfd::Uffd,
    buf: &mut EventBuffer,
) -> Result<usize, userfaultfd::Error> {
    let mut n = 0;
    for event in uffd.read_events(buf)? {
        n += 1;
        if let Event::Pagefault { kind, rw, addr } = event? {
            let addr = addr as usize;
            let Some(page) = shared.ops.page_of(addr) else {
                tracing::error!("fault event at {addr:#x} outside the region");
                continue;
            };
            let kind = match kind {
                // A minor fault (a page the memfd holds, not mapped) is served as a
                // missing page is: the resolver installs it.
                userfaultfd::FaultKind::Missing | userfaultfd::FaultKind::Minor => {
                    FaultKind::Missing
                }
                userfaultfd::FaultKind::WriteProtected => FaultKind::WriteProtect,
            };
            let access = match rw {
                ReadWrite::Read => Access::Read,
                ReadWrite::Write => Access::Write,
            };
            let fault = Fault {
                page,
                addr,
                kind,
                access,
                context: FaultContext::HandlerThread,
            };
            shared.resolver.resolve(&shared.ops, fault);
        }
    }
    Ok(n)
}
