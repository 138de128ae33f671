//! The INI thread: runs passes of its [`IniCore`](super::core::IniCore) while there is
//! work, then sleeps in `epoll_wait` on its UDP socket and hand-off eventfd until the next
//! timer deadline (paper 002 §3.2.2) or until woken.

use super::core::{IniSlot, SocketRead, TIMER_SLACK_US};
use super::sleep_watch::SleepWatch;
use super::{Net, RELEASE_SPIN};
use crate::poll::{AdaptivePoller, PollBounds};
use crate::sync::Ordering;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An emulated gap *g* or latency *L* that ends within this long is waited for in a
/// spin loop rather than by yielding between passes (each of which would add its own
/// microseconds to *g* and *L*).
const PRECISE_SPIN: Duration = Duration::from_micros(20);

/// Longest sleep of an idle INI with no timer pending, µs (also bounds shutdown latency).
const IDLE_SLEEP_US: u64 = 100_000;

pub(crate) fn run(net: Arc<Net>, slot: Arc<IniSlot>, index: usize, spin: Duration) {
    // The socket joins the set for each sleep only (module `sleep_watch`).
    let epoll = match Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).and_then(|e| {
        e.add(&slot.handoff.efd, EpollEvent::new(EpollFlags::EPOLLIN, 1))?;
        Ok(e)
    }) {
        Ok(e) => e,
        Err(e) => return net.fail(net.site.0, format!("INI {index}: epoll setup failed: {e}")),
    };
    let mut poller = AdaptivePoller::default();
    let mut last_work = Instant::now();
    let mut last_report = Instant::now();
    loop {
        let stop = net.stop.load(Ordering::Acquire);
        let (work, idle, next_timer, release) = {
            let mut core = slot.core.lock();
            if stop == 2
                || (stop == 1 && core.idle(&slot.handoff) && net.held.load(Ordering::Relaxed) == 0)
            {
                core.flush_faults();
                core.publish(&slot.handoff, &mut slot.report.lock());
                return;
            }
            let poll_socket = poller.tick(PollBounds::DEFAULT);
            let read = if poll_socket {
                SocketRead::Drain
            } else {
                SocketRead::Skip
            };
            let work = slot.run_pass(&mut core, &net, read);
            if poll_socket {
                poller.record(work);
            }
            if last_report.elapsed() >= Duration::from_millis(100) {
                core.publish(&slot.handoff, &mut slot.report.lock());
                last_report = Instant::now();
            }
            (
                work,
                core.idle(&slot.handoff),
                core.ini.poll_timeout(),
                core.next_release(),
            )
        };
        let t = Instant::now();
        if work {
            last_work = t;
            continue;
        }
        // A datagram held for the emulated latency L is due, or the emulated gap g ends,
        // within a sleep's grain: stay awake, so that neither grows by a sleep (paper 001
        // §3.2).
        if let Some(r) = release.filter(|&r| r < t + PRECISE_SPIN) {
            // Due within a few µs: wait for it exactly, without a yield's reschedule or a
            // pass's work in between, so that g and L are not stretched.
            while Instant::now() < r {
                std::hint::spin_loop();
            }
            continue;
        }
        if t - last_work < spin || release.is_some_and(|r| r < t + RELEASE_SPIN) {
            std::thread::yield_now();
            continue;
        }
        // Sleep until the next timer, a datagram, or a hand-off.
        if !slot.handoff.prepare_sleep() {
            continue;
        }
        let now = net.now().as_u64();
        let mut wait_us = next_timer
            .map_or(IDLE_SLEEP_US, |d| d.as_u64().saturating_sub(now))
            .min(IDLE_SLEEP_US);
        if !idle || net.held.load(Ordering::Relaxed) > 0 {
            // Emulated latency queue or held deliveries: come back soon.
            wait_us = wait_us.min(TIMER_SLACK_US);
        }
        if let Some(r) = release {
            wait_us = wait_us.min(r.saturating_duration_since(t).as_micros() as u64);
        }
        slot.sleep_until_us
            .store(now + wait_us.max(1), Ordering::Release);
        let watch = SleepWatch::new(&epoll, [&slot.socket_fd]);
        let wait_us = watch.cap(Duration::from_micros(wait_us)).as_micros() as u64;
        let ms = wait_us.div_ceil(1000).clamp(1, 100) as u16;
        let mut events = [EpollEvent::empty(); 2];
        let _ = epoll.wait(&mut events, EpollTimeout::from(ms));
        drop(watch);
        slot.sleep_until_us.store(0, Ordering::Release);
        slot.handoff.woke();
        // Whatever woke us, poll the socket on the next pass.
        poller.force();
    }
}
