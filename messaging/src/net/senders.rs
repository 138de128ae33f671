//! The sockets an INI's datagrams leave from: one connected UDP socket per peer INI
//! (`ini.connected_sends`, default on).
//!
//! An INI receives on one unconnected socket, to which every peer INI sends. Sending from
//! that socket too — `sendto` with the peer's address — makes the kernel look up the route
//! to the destination for every datagram (and run the hooks of an unconnected send); a
//! connected socket keeps its route. Measured here (a throwaway raw UDP ping-pong on
//! loopback, 80-byte datagrams, busy-polled, 2 vCPUs, 2026-12-05, three alternating runs
//! each): one-way 2.59–2.73 µs sending with `sendto` from the receiving socket,
//! 2.29–2.37 µs sending from connected sockets bound apart — ≈ 0.35 µs a datagram, on
//! the critical path of every message between clusters.
//!
//! So each INI binds a second port, its *send port* ([`SendPort`]), and at start connects
//! one socket per peer INI to the peer's receive address, all bound to the send port
//! (`SO_REUSEPORT`, which Linux grants only to sockets of the same user). The send port is
//! registered beside the receive address ([`super::IniEndpoint::sends_from`]) and peers
//! accept the INI's datagrams from there (issue 13: a datagram is accepted only from an
//! address its claimed sender registered). Nothing is sent to a send port: the kernel
//! hands a connected socket only datagrams from its peer's receive address, which peers
//! never send from, so the sending sockets are never read. An ICMP error (a peer's port
//! closed) is reported by the next send on that socket, whose datagram is then lost like
//! any other: the sliding window resends it and reports a dead peer after the timeout.
//!
//! With `ini.connected_sends = false` an INI sends every datagram from its receive
//! socket, to the peer's address ([`Senders::shared`]).

use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, SockaddrStorage, bind, sendmsg,
    setsockopt, socket, sockopt,
};
use std::io::{self, ErrorKind, IoSlice};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};

/// An INI's bound send port: the first of its sending sockets, holding the port until
/// [`SendPort::connect`] adds the others.
#[derive(Debug)]
pub(crate) struct SendPort {
    first: UdpSocket,
    addr: SocketAddr,
}

impl SendPort {
    /// Binds a send port on `ip`: a port no other socket holds.
    ///
    /// The first socket is bound without `SO_REUSEPORT` and turns it on only once bound.
    /// Asked for port 0 with `SO_REUSEPORT` already on, Linux may pick a port that another
    /// `SO_REUSEPORT` socket of the same user holds — another INI's send port, of this
    /// job or of another — and two INIs would then send from one address, which their
    /// peers refuse at start ("registered for two peer INIs"; 157 of 3,000 such binds
    /// here got a port taken before, against none this way). Bound without it, the port
    /// is one no socket holds; every later bind to port 0 by an INI also goes without it,
    /// so none can land on this port. (Another program of the same user binding port 0
    /// with `SO_REUSEPORT` on still could: nothing is sent to a send port, and what that
    /// program sent from it would fail the peers' authentication.)
    ///
    /// # Errors
    /// The socket, `SO_REUSEPORT` or bind error.
    pub(crate) fn bind(ip: IpAddr) -> io::Result<SendPort> {
        let fd = udp_socket(SocketAddr::new(ip, 0))?;
        bind(
            fd.as_raw_fd(),
            &SockaddrStorage::from(SocketAddr::new(ip, 0)),
        )?;
        setsockopt(&fd, sockopt::ReusePort, &true)?;
        let first = UdpSocket::from(fd);
        let addr = first.local_addr()?;
        Ok(SendPort { first, addr })
    }

    /// The address the INI's datagrams come from (its IP unspecified where the INI is
    /// bound to every address of its host: the kernel picks the source IP per route).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// One socket per address of `peers`, bound to this port and connected to it.
    ///
    /// # Errors
    /// A socket that cannot be bound to the port or connected to its peer (no route to
    /// the peer's address), naming the peer.
    pub(crate) fn connect(self, peers: Vec<SocketAddr>) -> io::Result<Senders> {
        let mut sockets = Vec::with_capacity(peers.len());
        let mut first = Some(self.first);
        for &peer in &peers {
            let s = match first.take() {
                Some(s) => s,
                None => reuse_port_socket(self.addr)?,
            };
            s.connect(peer).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot connect a sending socket to peer INI {peer}: {e}"),
                )
            })?;
            super::grow_socket_buffers(&s, false);
            sockets.push(s);
        }
        Ok(Senders {
            peers,
            ways: Ways::Connected(sockets),
        })
    }
}

/// A non-blocking, close-on-exec UDP socket of `addr`'s family, not bound.
fn udp_socket(addr: SocketAddr) -> io::Result<OwnedFd> {
    let family = if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    Ok(socket(
        family,
        SockType::Datagram,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?)
}

/// A non-blocking UDP socket bound to `addr` with `SO_REUSEPORT` (close-on-exec): one
/// more socket on a send port already bound.
fn reuse_port_socket(addr: SocketAddr) -> io::Result<UdpSocket> {
    let fd = udp_socket(addr)?;
    setsockopt(&fd, sockopt::ReusePort, &true)?;
    bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
    Ok(UdpSocket::from(fd))
}

/// Where an INI's datagrams to each peer INI leave from, by connection index.
#[derive(Debug)]
pub(crate) struct Senders {
    /// Each peer INI's receive address.
    peers: Vec<SocketAddr>,
    ways: Ways,
}

#[derive(Debug)]
enum Ways {
    /// One socket connected to each peer.
    Connected(Vec<UdpSocket>),
    /// Every datagram from this socket (the INI's receive socket), with `sendto`.
    Shared(UdpSocket),
}

impl Senders {
    /// Every datagram leaves from `socket`, addressed to its peer among `peers`.
    pub(crate) fn shared(socket: UdpSocket, peers: Vec<SocketAddr>) -> Senders {
        Senders {
            peers,
            ways: Ways::Shared(socket),
        }
    }

    /// `sendmsg` of `iov` (with `cmsgs`) to connection `conn`'s peer, once.
    ///
    /// # Panics
    /// If `conn` is not the index of one of the peers this was made with.
    pub(crate) fn sendmsg(
        &self,
        conn: usize,
        iov: &[IoSlice<'_>],
        cmsgs: &[ControlMessage<'_>],
    ) -> nix::Result<usize> {
        match &self.ways {
            Ways::Connected(sockets) => sendmsg::<SockaddrStorage>(
                sockets[conn].as_raw_fd(),
                iov,
                cmsgs,
                MsgFlags::empty(),
                None,
            ),
            Ways::Shared(socket) => sendmsg(
                socket.as_raw_fd(),
                iov,
                cmsgs,
                MsgFlags::empty(),
                Some(&SockaddrStorage::from(self.peers[conn])),
            ),
        }
    }

    /// Sends datagram `d` to connection `conn`'s peer, waiting out a full socket buffer.
    /// Any other error loses the datagram (the sliding window resends it and eventually
    /// reports the peer unresponsive).
    ///
    /// # Panics
    /// If `conn` is not the index of one of the peers this was made with.
    pub(crate) fn send(&self, conn: usize, d: &[u8]) {
        loop {
            let r = match &self.ways {
                Ways::Connected(sockets) => sockets[conn].send(d),
                Ways::Shared(socket) => socket.send_to(d, self.peers[conn]),
            };
            match r {
                Ok(_) => return,
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Waits up to 5 s for a datagram on `s`; returns it and its source.
    fn read(s: &UdpSocket) -> (Vec<u8>, SocketAddr) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut buf = [0u8; 64];
        loop {
            match s.recv_from(&mut buf) {
                Ok((n, from)) => return (buf[..n].to_vec(), from),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline, "no datagram arrived");
                    std::thread::sleep(Duration::from_micros(100));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    fn receiver() -> UdpSocket {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_nonblocking(true).unwrap();
        s
    }

    /// Datagrams to two peers leave from one send port, each through its own connected
    /// socket, and a peer's datagram from its own send port reaches the receive socket.
    #[test]
    fn every_peer_hears_the_send_port_and_the_receive_socket_hears_the_peers() {
        let (own, p0, p1) = (receiver(), receiver(), receiver());
        let port = SendPort::bind("127.0.0.1".parse().unwrap()).unwrap();
        let from = port.addr();
        assert_ne!(from.port(), 0);
        assert_ne!(from, own.local_addr().unwrap());
        let senders = port
            .connect(vec![p0.local_addr().unwrap(), p1.local_addr().unwrap()])
            .unwrap();
        assert_eq!(senders.peers.len(), 2);
        senders.send(1, b"to p1");
        senders.send(0, b"to p0");
        assert_eq!(read(&p0), (b"to p0".to_vec(), from));
        assert_eq!(read(&p1), (b"to p1".to_vec(), from));
        let theirs = SendPort::bind("127.0.0.1".parse().unwrap())
            .unwrap()
            .connect(vec![own.local_addr().unwrap()])
            .unwrap();
        theirs.send(0, b"from p0's send port");
        assert_eq!(read(&own).0, b"from p0's send port");
    }

    /// Send ports bound one after another never share a port, though each takes more
    /// sockets on its port with `SO_REUSEPORT`. (Bound with `SO_REUSEPORT` already on,
    /// 500 ports out of Linux's 28,232 ephemeral ones share one 99 times in 100; this
    /// test failed three runs of three that way here.)
    #[test]
    fn send_ports_never_share_a_port() {
        let mut seen = std::collections::HashSet::new();
        let mut held = Vec::new();
        for _ in 0..500 {
            let port = SendPort::bind("127.0.0.1".parse().unwrap()).unwrap();
            assert!(seen.insert(port.addr()), "{} bound twice", port.addr());
            held.push(port);
        }
        // The port still takes the sockets connected to the peers.
        let p = receiver();
        let senders = held
            .pop()
            .unwrap()
            .connect(vec![p.local_addr().unwrap(); 2]);
        assert!(senders.is_ok(), "{senders:?}");
    }

    /// `ini.connected_sends = false`: datagrams leave from the socket given, by `sendto`.
    #[test]
    fn shared_senders_send_from_the_receive_socket() {
        let (own, p0) = (receiver(), receiver());
        let senders = Senders::shared(own.try_clone().unwrap(), vec![p0.local_addr().unwrap()]);
        senders.send(0, b"x");
        assert_eq!(read(&p0), (b"x".to_vec(), own.local_addr().unwrap()));
    }

    /// A peer address the host has no route to is an error at start, naming the peer.
    #[test]
    fn an_unreachable_peer_is_an_error_naming_it() {
        let port = SendPort::bind("127.0.0.1".parse().unwrap()).unwrap();
        // IPv4 to an IPv6 peer: no route from this socket.
        let peer: SocketAddr = "[::1]:9".parse().unwrap();
        let e = port.connect(vec![peer]).unwrap_err();
        assert!(e.to_string().contains("[::1]:9"), "{e}");
    }
}
