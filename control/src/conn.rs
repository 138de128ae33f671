//! One control connection: its socket, the writer shared by the threads that send on it,
//! and how a connection is lost.

use crate::*;

/// One control connection, seen from this end.
pub(crate) struct Conn {
    /// The cluster at the other end.
    pub(crate) cluster: usize,
    /// Its address.
    pub(crate) peer: SocketAddr,
    /// The job label frames carry.
    pub(crate) label: u64,
    /// Frames are written whole under this lock, with a MAC once it holds the secret.
    pub(crate) writer: Mutex<Writer>,
    /// A handle for `shutdown`, usable while a write blocks.
    pub(crate) ctl: TcpStream,
}

/// The writing side of a connection.
pub(crate) struct Writer {
    pub(crate) stream: TcpStream,
    /// Frames carry a MAC under this secret (`None`: before the bootstrap `Welcome`).
    pub(crate) key: Option<Secret>,
}

impl Conn {
    /// Wraps `stream`; returns the connection and a handle for its reader. Frames carry
    /// a MAC under `key` when given.
    pub(crate) fn new(
        stream: TcpStream,
        cluster: usize,
        label: u64,
        key: Option<Secret>,
        write_timeout: Duration,
    ) -> io::Result<(Arc<Conn>, TcpStream)> {
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(write_timeout))?;
        let peer = stream.peer_addr()?;
        let conn = Conn {
            cluster,
            peer,
            label,
            writer: Mutex::new(Writer {
                stream: stream.try_clone()?,
                key,
            }),
            ctl: stream.try_clone()?,
        };
        Ok((Arc::new(conn), stream))
    }

    pub(crate) fn send(&self, msg: &Message) -> io::Result<()> {
        let mut w = self.writer.lock();
        let frame = wire::encode(self.label, w.key.as_ref(), msg);
        w.stream.write_all(&frame)
    }

    /// Sends `msg`, then authenticates every later frame under `key` (the bootstrap
    /// `Welcome` and the switch, atomically with respect to other senders).
    pub(crate) fn send_then_authenticate(&self, msg: &Message, key: &Secret) -> io::Result<()> {
        let mut w = self.writer.lock();
        let frame = wire::encode(self.label, w.key.as_ref(), msg);
        let sent = w.stream.write_all(&frame);
        w.key = Some(key.clone());
        sent
    }

    /// Authenticates every later frame under `key`.
    pub(crate) fn authenticate(&self, key: &Secret) {
        self.writer.lock().key = Some(key.clone());
    }

    pub(crate) fn shutdown(&self) {
        let _ = self.ctl.shutdown(Shutdown::Both);
    }
}

/// How a connection ended.
pub(crate) enum Lost {
    Closed,
    Reset(io::Error),
    Silent,
    Read(io::Error),
    Send(io::Error),
    Frame(FrameError),
}

impl From<ReadError> for Lost {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Closed => Lost::Closed,
            ReadError::Frame(f) => Lost::Frame(f),
            ReadError::Io(e) => match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Lost::Silent,
                io::ErrorKind::UnexpectedEof => Lost::Closed,
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe => Lost::Reset(e),
                _ => Lost::Read(e),
            },
        }
    }
}
