//! UDP segmentation offload: one `sendmsg` for a run of datagrams to one peer, one
//! `recvfrom` for a run the kernel coalesced.
//!
//! Most of a small datagram's cost on Linux is per datagram — the system call, the
//! socket and IP layers, the wake-up — not per byte. With generic segmentation offload
//! (GSO, `UDP_SEGMENT`, Linux 4.18) an INI hands the kernel up to [`MAX_SEGMENTS`]
//! equal-size datagrams for one peer laid end to end in one buffer, and the kernel cuts
//! them apart as late as it can (in the NIC where it supports UDP segmentation). With
//! generic receive offload (GRO, `UDP_GRO`, Linux 5.0) the receiving kernel hands
//! consecutive datagrams of one flow to one read; the INI cuts them apart again where
//! their headers say (each states its length; see [`gro_stride`]). Every datagram on the
//! wire stays an ordinary datagram with its own header and MAC, so a peer without
//! offload reads them one by one, and a lost one costs one frame as before. The
//! datagrams of a send batch are those the sliding window releases together (a burst of
//! fragments, a barrier's updates).
//!
//! Measured here (a throwaway C loopback microbenchmark, 2 vCPUs): at a 1,472-byte MTU,
//! 3.5–7× the bytes per CPU-second of one `sendto` and one `recvfrom` per datagram; at
//! 8,972 bytes, 1.0–1.5× (copy-bound).
//!
//! The INI uses this only where datagrams leave exactly when the window releases them:
//! not under an emulated gap or latency (paper 001 §3.2: per-datagram timing) and not
//! while the fault shim drops, duplicates or reorders datagrams (`ini.offload`).

use super::senders::Senders;
use crate::window::wire;
use nix::errno::Errno;
use nix::sys::socket::{ControlMessage, setsockopt, sockopt};
use std::io::{ErrorKind, IoSlice};
use std::net::{SocketAddr, UdpSocket};

/// Most datagrams in one segmented send (the kernel's `UDP_MAX_SEGMENTS`).
pub(crate) const MAX_SEGMENTS: usize = 64;

/// Most bytes in one segmented send: a UDP payload's limit over IPv4 (65,535 less the
/// IPv4 and UDP headers).
pub(crate) const MAX_BATCH_BYTES: usize = 65_507;

/// What one socket read returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Read {
    /// Bytes read: one datagram, or several of `stride` bytes each (the last one may be
    /// shorter) that the kernel coalesced.
    pub(crate) len: usize,
    /// The sender's address.
    pub(crate) from: SocketAddr,
    /// Size of each datagram in the read (= `len` for a single datagram).
    pub(crate) stride: usize,
}

/// Segmentation offload state of one INI socket, and the send batch being built.
#[derive(Debug)]
pub(crate) struct Offload {
    /// Whether sends are batched (GSO): asked for, and not refused by the kernel yet.
    gso: bool,
    /// Whether the socket was asked to coalesce receives (GRO) and accepted.
    gro: bool,
    batch: Vec<u8>,
    /// The connection (peer INI) the batch goes to.
    dest: Option<usize>,
    /// Size of every datagram of the batch but the last.
    segment: usize,
    count: usize,
    /// The batch ends with a datagram shorter than `segment`: nothing may follow it.
    closed: bool,
    /// Segmented sends made, and the datagrams they carried.
    pub(crate) batches: u64,
    pub(crate) batched: u64,
}

impl Offload {
    /// Offload for `socket` if `enabled`: turns GRO on (ignored where the kernel
    /// refuses it) and batches sends until a segmented send fails.
    pub(crate) fn new(socket: &UdpSocket, enabled: bool) -> Offload {
        let gro = enabled
            && setsockopt(socket, sockopt::UdpGroSegment, &true)
                .inspect_err(|e| tracing::debug!("INI socket: UDP_GRO refused: {e}"))
                .is_ok();
        Offload {
            gso: enabled,
            gro,
            batch: Vec::new(),
            dest: None,
            segment: 0,
            count: 0,
            closed: false,
            batches: 0,
            batched: 0,
        }
    }

    /// Whether sends are batched.
    pub(crate) fn batching(&self) -> bool {
        self.gso
    }

    /// Adds datagram `d` for connection `to` to the batch, sending the batch first if
    /// `d` cannot join it (another peer, longer than the batch's datagrams, after a
    /// shorter one, or the batch is full).
    pub(crate) fn push(&mut self, senders: &Senders, to: usize, d: &[u8]) {
        if self.count > 0
            && (self.dest != Some(to)
                || d.len() > self.segment
                || self.closed
                || self.count == MAX_SEGMENTS
                || self.batch.len() + d.len() > MAX_BATCH_BYTES)
        {
            self.flush(senders);
        }
        if self.count == 0 {
            self.dest = Some(to);
            self.segment = d.len();
        }
        self.batch.extend_from_slice(d);
        self.count += 1;
        self.closed = d.len() < self.segment;
    }

    /// Sends the batch: one datagram as it is, several as one segmented send (each
    /// datagram alone without segmentation, or if the kernel refuses it, which then
    /// stays off).
    pub(crate) fn flush(&mut self, senders: &Senders) {
        if let Some(to) = self.dest.take() {
            if self.count == 1 {
                senders.send(to, &self.batch);
            } else if !(self.gso && self.send_segmented(senders, to)) {
                for d in self.batch.chunks(self.segment) {
                    senders.send(to, d);
                }
            }
        }
        self.batch.clear();
        self.count = 0;
        self.closed = false;
    }

    /// One `sendmsg` with `UDP_SEGMENT`; `false` (and GSO off for good) if the kernel
    /// or the route refuses segmentation.
    fn send_segmented(&mut self, senders: &Senders, to: usize) -> bool {
        let Ok(segment) = u16::try_from(self.segment) else {
            return false;
        };
        let iov = [IoSlice::new(&self.batch)];
        let cmsg = [ControlMessage::UdpGsoSegments(&segment)];
        loop {
            match senders.sendmsg(to, &iov, &cmsg) {
                Ok(_) => {
                    self.batches += 1;
                    self.batched += self.count as u64;
                    return true;
                }
                Err(Errno::EAGAIN) => std::thread::yield_now(),
                Err(Errno::EINTR) => {}
                // No GSO in this kernel, or not on this route (EIO: the device cannot
                // checksum; EINVAL: a segment larger than the route's MTU, or no
                // UDP_SEGMENT; ENOPROTOOPT, EOPNOTSUPP): one by one from now on.
                Err(e @ (Errno::EIO | Errno::EINVAL | Errno::ENOPROTOOPT | Errno::EOPNOTSUPP)) => {
                    tracing::debug!(
                        "INI socket: UDP segmentation refused ({e}); sending datagrams one by one"
                    );
                    self.gso = false;
                    return false;
                }
                // Anything else (an unreachable peer, no buffer space): these datagrams
                // go one by one, each meeting the error as it would without offload.
                Err(_) => return false,
            }
        }
    }

    /// Reads what the socket has (non-blocking) into `buf`: `None` when nothing is
    /// there (or on an error, which the next read reports again or clears).
    ///
    /// One `recvfrom` in both cases. A run that GRO coalesced is cut apart where its
    /// datagrams' own headers say ([`gro_stride`]) instead of by the segment size in a
    /// control message, which only `recvmsg` returns: on this 2-vCPU VM a `recvmsg` that
    /// finds the socket empty — most reads of a waiting thread's network polls — took
    /// 0.48 µs against 0.32 µs for `recvfrom` (a C loop of 200,000 reads, three runs;
    /// copying in the message header and its iovec is the difference).
    pub(crate) fn recv(&mut self, socket: &UdpSocket, buf: &mut [u8]) -> Option<Read> {
        loop {
            match socket.recv_from(buf) {
                Ok((len, from)) => {
                    let stride = if self.gro {
                        gro_stride(&buf[..len])
                    } else {
                        len
                    };
                    return Some(Read { len, from, stride });
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
    }
}

/// The size of each datagram in `read`, one read of a socket with GRO on: the length
/// the first datagram states for itself ([`wire::stated_len`]) where that cuts `read`
/// into datagrams that each state exactly their own length — as a run that the kernel
/// coalesced does, every datagram the same size but the last, which may be shorter —
/// else `read.len()`: one datagram, handed on whole (a datagram whose length field is
/// not its own fails authentication as one datagram, as it would without GRO).
///
/// The lengths are read before authentication. A forger who could inject a datagram
/// into a peer's flow (its source address and port) and have the kernel coalesce it
/// with the peer's could only make the run's datagrams fail authentication, each
/// counted and dropped: the sliding window resends them, as after a loss.
fn gro_stride(read: &[u8]) -> usize {
    let len = read.len();
    match wire::stated_len(read) {
        // A stated length is at least the 56 bytes of header and tag.
        Some(stride) if stride < len => {
            let cut_right = read
                .chunks(stride)
                .all(|d| wire::stated_len(d) == Some(d.len()));
            if cut_right { stride } else { len }
        }
        _ => len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn pair() -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        (a, b)
    }

    /// Reads until `want` datagrams from `from` arrived (cut apart at their stride) or
    /// 5 s pass.
    fn read_all(o: &mut Offload, s: &UdpSocket, from: SocketAddr, want: usize) -> Vec<Vec<u8>> {
        let mut buf = vec![0u8; 65_536];
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < want {
            assert!(
                Instant::now() < deadline,
                "only {} of {want} datagrams",
                got.len()
            );
            match o.recv(s, &mut buf) {
                Some(r) => {
                    assert_eq!(r.from, from);
                    got.extend(buf[..r.len].chunks(r.stride).map(<[u8]>::to_vec));
                }
                None => std::thread::sleep(Duration::from_micros(100)),
            }
        }
        got
    }

    /// Senders from `a` to `peers`: connected sockets on a send port of their own, or
    /// `a` itself; with the address their datagrams come from.
    fn senders(a: &UdpSocket, peers: Vec<SocketAddr>, connected: bool) -> (Senders, SocketAddr) {
        if connected {
            let port = super::super::senders::SendPort::bind(a.local_addr().unwrap().ip()).unwrap();
            let from = port.addr();
            (port.connect(peers).unwrap(), from)
        } else {
            let from = a.local_addr().unwrap();
            (Senders::shared(a.try_clone().unwrap(), peers), from)
        }
    }

    /// Where a datagram's header states its payload length.
    const LEN: usize = wire::PAYLOAD_LEN_AT;

    /// `d` with its length stated where a sealed datagram states it ([`wire::stated_len`]),
    /// which the receive offload reads to cut a coalesced run apart.
    fn stating_its_len(mut d: Vec<u8>) -> Vec<u8> {
        let payload = u16::try_from(d.len() - wire::OVERHEAD).expect("a datagram's payload");
        d[LEN..LEN + 2].copy_from_slice(&payload.to_be_bytes());
        d
    }

    fn datagrams(n: usize, len: usize, last: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let l = if i + 1 == n { last } else { len };
                stating_its_len((0..l).map(|j| (i * 31 + j) as u8).collect())
            })
            .collect()
    }

    /// A read cuts at the length its first datagram states only where every piece then
    /// states its own length; otherwise it stays one datagram (whose authentication
    /// fails as one).
    #[test]
    fn a_read_is_cut_only_where_every_datagram_states_its_own_length() {
        let run: Vec<u8> = datagrams(3, 1_000, 400).concat();
        assert_eq!(gro_stride(&run), 1_000, "two of 1,000 bytes and one of 400");
        let one = datagrams(1, 1_000, 1_000).concat();
        assert_eq!(gro_stride(&one), 1_000, "a single datagram");
        // A single datagram stating a shorter length, or a longer one.
        for stated in [500u16, 2_000] {
            let mut d = one.clone();
            d[LEN..LEN + 2].copy_from_slice(&(stated - wire::OVERHEAD as u16).to_be_bytes());
            assert_eq!(gro_stride(&d), 1_000, "states {stated}: one datagram");
        }
        // A run whose second datagram states another length: not cut.
        let mut bad = run.clone();
        bad[1_000 + LEN..1_000 + LEN + 2].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(gro_stride(&bad), run.len());
        // A first datagram stating an empty payload (56 bytes), and reads too short to
        // state a length.
        let mut tiny = run.clone();
        tiny[LEN..LEN + 2].copy_from_slice(&0u16.to_be_bytes());
        assert_eq!(gro_stride(&tiny), run.len());
        for short in [&run[..0], &run[..LEN + 1], &run[..LEN + 2]] {
            assert_eq!(gro_stride(short), short.len());
        }
    }

    /// A batch of equal datagrams and a shorter last one arrives as the same datagrams,
    /// in order, whether or not the kernel segments and coalesces them, from connected
    /// sockets or the shared one.
    #[test]
    fn a_batch_arrives_as_its_datagrams_in_order() {
        for (enabled, connected) in [(true, true), (true, false), (false, true), (false, false)] {
            let (a, b) = pair();
            let mut tx = Offload::new(&a, enabled);
            let mut rx = Offload::new(&b, enabled);
            let (out, from) = senders(&a, vec![b.local_addr().unwrap()], connected);
            let want = datagrams(20, 1_472, 300);
            for d in &want {
                tx.push(&out, 0, d);
            }
            tx.flush(&out);
            let got = read_all(&mut rx, &b, from, want.len());
            assert_eq!(got, want, "offload {enabled}, connected {connected}");
            if enabled && tx.batching() {
                assert_eq!((tx.batches, tx.batched), (1, 20));
            } else {
                assert_eq!(tx.batches, 0);
            }
        }
    }

    /// A longer datagram, another peer, a full batch or a datagram after a shorter one
    /// each start a new send; nothing is lost or reordered.
    #[test]
    fn a_batch_ends_where_a_datagram_cannot_join_it() {
        for connected in [true, false] {
            a_batch_ends_where_a_datagram_cannot_join_it_from(connected);
        }
    }

    fn a_batch_ends_where_a_datagram_cannot_join_it_from(connected: bool) {
        let (a, b) = pair();
        let c = UdpSocket::bind("127.0.0.1:0").unwrap();
        c.set_nonblocking(true).unwrap();
        let mut tx = Offload::new(&a, true);
        let mut rb = Offload::new(&b, true);
        let mut rc = Offload::new(&c, true);
        let (out, from) = senders(
            &a,
            vec![b.local_addr().unwrap(), c.local_addr().unwrap()],
            connected,
        );
        let (to_b, to_c) = (0, 1);
        let mut want_b = Vec::new();
        let mut want_c = Vec::new();
        // 70 of 1,000 bytes (a full batch of 64, then 6), one of 100, one of 1,000
        // after it, two for c, then one of 2,000 for b.
        for d in datagrams(70, 1_000, 1_000) {
            tx.push(&out, to_b, &d);
            want_b.push(d);
        }
        for d in [vec![1u8; 100], vec![2u8; 1_000]].map(stating_its_len) {
            tx.push(&out, to_b, &d);
            want_b.push(d);
        }
        for d in datagrams(2, 500, 500) {
            tx.push(&out, to_c, &d);
            want_c.push(d);
        }
        let long = stating_its_len(vec![3u8; 2_000]);
        tx.push(&out, to_b, &long);
        want_b.push(long);
        tx.flush(&out);
        assert_eq!(read_all(&mut rb, &b, from, want_b.len()), want_b);
        assert_eq!(read_all(&mut rc, &c, from, want_c.len()), want_c);
        if tx.batching() {
            // 64; 6 + the 100-byte one; the 1,000 after it alone; c's two; the long one.
            assert_eq!((tx.batches, tx.batched), (3, 64 + 7 + 2));
        }
    }
}
