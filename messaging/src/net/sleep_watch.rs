//! INI sockets in an epoll set only for the length of a sleep.
//!
//! Every epoll set that watches a socket puts an entry on the socket's wait queue, and
//! the kernel walks that queue under its lock, interrupts off, for every datagram the
//! socket receives (`sock_def_readable`) and every one it sends (`sock_wfree` →
//! `sock_def_write_space`), whether or not anyone sleeps. On this VM's loopback one idle
//! registration per socket made a busy-polled raw UDP ping-pong's one-way 0.2 µs slower
//! (2.94 → 3.15 µs; its `sendto` 2.54 → 2.90 µs), three 0.3 µs — and an INI socket had
//! one for its INI thread and one for each thread that had ever slept on the network. So
//! the INI thread and [`Net::wait`](super::Net::wait) add the socket right before
//! `epoll_wait` and remove it right after (two system calls a sleep): `bench net`'s
//! Express through INIs 1.76, 1.79, 1.79 → 1.71, 1.70, 1.68 × busy-polled UDP in three
//! alternating runs (2026-12-05). Adding reports a datagram already queued at once (the
//! kernel polls the file as it inserts it), so none that arrived before the sleep is
//! missed.

use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use std::net::UdpSocket;
use std::time::Duration;

/// The `epoll_data` the sockets are added with (the caller's sets use others for their
/// eventfds).
pub(crate) const SOCKET_TOKEN: u64 = 0;

/// The sockets of one sleep, watched by `epoll` until dropped.
pub(crate) struct SleepWatch<'a> {
    epoll: &'a Epoll,
    added: Vec<&'a UdpSocket>,
    complete: bool,
}

impl<'a> SleepWatch<'a> {
    /// Adds every socket of `sockets` to `epoll` (none may be in it already).
    pub(crate) fn new(epoll: &'a Epoll, sockets: impl IntoIterator<Item = &'a UdpSocket>) -> Self {
        let mut w = SleepWatch {
            epoll,
            added: Vec::new(),
            complete: true,
        };
        for s in sockets {
            match epoll.add(s, EpollEvent::new(EpollFlags::EPOLLIN, SOCKET_TOKEN)) {
                Ok(()) => w.added.push(s),
                Err(e) => {
                    tracing::debug!("INI socket: epoll add failed ({e}); sleeping briefly instead");
                    w.complete = false;
                }
            }
        }
        w
    }

    /// `wait`, or at most 1 ms if a socket could not be added (a datagram for it would
    /// not end the sleep).
    pub(crate) fn cap(&self, wait: Duration) -> Duration {
        if self.complete {
            wait
        } else {
            wait.min(Duration::from_millis(1))
        }
    }
}

impl Drop for SleepWatch<'_> {
    fn drop(&mut self) {
        for s in self.added.drain(..) {
            let _ = self.epoll.delete(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::epoll::{EpollCreateFlags, EpollTimeout};

    /// A datagram queued before the sleep began ends it at once; once the sleep is over
    /// the socket is out of the set again (its datagrams no longer reach the set).
    #[test]
    fn a_sleep_sees_what_arrived_before_it_and_the_set_lets_go_after() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).unwrap();
        let mut events = [EpollEvent::empty(); 2];
        tx.send_to(b"queued", rx.local_addr().unwrap()).unwrap();
        // Loopback queues it inside `sendto`; give a loaded machine a moment anyway.
        std::thread::sleep(Duration::from_millis(20));
        {
            let watch = SleepWatch::new(&epoll, [&rx]);
            assert_eq!(watch.cap(Duration::from_secs(1)), Duration::from_secs(1));
            let n = epoll
                .wait(&mut events, EpollTimeout::from(1000u16))
                .unwrap();
            assert_eq!(n, 1, "the queued datagram ends the sleep");
            assert_eq!(events[0].data(), SOCKET_TOKEN);
        }
        let n = epoll.wait(&mut events, EpollTimeout::ZERO).unwrap();
        assert_eq!(n, 0, "the socket left the set with its sleep");
        // And it can join the next sleep (not left behind in the set).
        let _again = SleepWatch::new(&epoll, [&rx]);
        assert_eq!(epoll.wait(&mut events, EpollTimeout::ZERO).unwrap(), 1);
    }
}
