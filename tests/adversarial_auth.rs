//! Authenticated INI traffic (issue 13), end to end: a Water job on 2×1 over UDP is
//! sprayed, while it runs, with datagrams built as an earlier run of the same job would
//! have sent them (that run's epoch, that run's secret), with frames forged under this
//! run's epoch (read from its log, as anyone watching the wire could) but without its
//! secret, and with junk — once from an ordinary UDP socket of **another user**
//! (`nobody`, through `setpriv`, when the test runs as root; else of the same user), and
//! once with the source address of the registered peer INI spoofed through a raw IP
//! socket (root only: the attacker who gets past the address check; the address an INI
//! sends from — its send port, `ini.connected_sends` — read from the job's debug log, as
//! anyone watching the wire could). The job must
//! finish with energies identical to an undisturbed run of the same job, and the
//! cluster-0 report's INI table must show the rejections by reason: `src` (unregistered
//! address), and with spoofing also `epoch` (the earlier run), `mac` (forged) and `bad`
//! (junk).
//!
//! The sprayer that runs as another user is this test binary itself, re-run with
//! `MG_SPRAY` set on [`spray_helper`], which does nothing without it.

mod common;

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use common::{HANG, Proc, Stream, TempDir, bin, launched_pids};
use multigrain_messaging::window::IniAddr;
use multigrain_messaging::window::wire::{self, ConnId, FrameKind, Header, MacKey};

/// Bound on one job.
const JOB: Duration = Duration::from_secs(180);
/// Water: enough steps for a few seconds of traffic to spray into.
const STEPS: &str = "120";
/// The environment variable that turns [`spray_helper`] into the sprayer:
/// `PORT0,PORT1;EPOCH_HEX`.
const SPRAY_VAR: &str = "MG_SPRAY";

/// Two base ports free for UDP and TCP on 127.0.0.1 (cluster 0's also hosts the
/// coordinator's TCP listener).
fn free_ports() -> [u16; 2] {
    let mut out = Vec::new();
    while out.len() < 2 {
        let udp = UdpSocket::bind("127.0.0.1:0").expect("a UDP port");
        let port = udp.local_addr().expect("its address").port();
        if TcpListener::bind(("127.0.0.1", port)).is_ok() && !out.contains(&port) {
            out.push(port);
        }
    }
    [out[0], out[1]]
}

fn config(dir: &TempDir, ports: [u16; 2]) -> PathBuf {
    dir.write(
        "job.toml",
        &format!(
            "[job]\nname = \"auth\"\nstartup_timeout_ms = 20000\npeer_timeout_ms = 10000\n\n\
             [[cluster]]\nhost = \"127.0.0.1\"\nport = {}\nthreads = 1\n\n\
             [[cluster]]\nhost = \"127.0.0.1\"\nport = {}\nthreads = 1\n\n\
             [ini]\nsubstrate = \"udp\"\n",
            ports[0], ports[1]
        ),
    )
}

/// `multigrain run water` on `config`, the control plane logging its session.
fn water(name: &str, config: &Path) -> Proc {
    let mut cmd = Command::new(bin());
    cmd.args([
        "run",
        "water",
        "--molecules",
        "343",
        "--steps",
        STEPS,
        "--config",
    ])
    .arg(config)
    .env(
        "RUST_LOG",
        "warn,multigrain_control=debug,multigrain_messaging::job=debug",
    );
    for var in common::launch_vars() {
        cmd.env_remove(var);
    }
    Proc::spawn(name, cmd)
}

/// The energy lines of the report (between the layout header and the run time).
fn energies(p: &Proc) -> Vec<String> {
    let out = p.lines(Stream::Out);
    let start = out
        .iter()
        .position(|l| l.starts_with("energies every"))
        .unwrap_or_else(|| panic!("no energies in:\n{}", p.transcript()));
    out[start..]
        .iter()
        .take_while(|l| !l.starts_with("run time"))
        .cloned()
        .collect()
}

/// Per INI line of the report: (name, [mac, epoch, src, bad]).
fn rejections(p: &Proc) -> Vec<(String, [u64; 4])> {
    p.lines(Stream::Out)
        .iter()
        .filter_map(|l| {
            let (head, tail) = l.split_once("rejected:")?;
            let name = head.split_whitespace().next()?.to_owned();
            // The INIs' four reasons; INI 0's line then goes on with the liveness
            // thread's counters.
            let nums: Vec<u64> = tail
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .take(4)
                .collect();
            Some((name, nums.try_into().ok()?))
        })
        .collect()
}

/// Runs the job, starts `attack` once this run's epoch and the ports each cluster's INI 0
/// sends from are known, and returns the finished process.
fn run_job(name: &str, config: &Path, attack: impl FnOnce(u64, [u16; 2])) -> Proc {
    let mut p = water(name, config);
    let pids = launched_pids(&p, 2);
    p.adopt(&pids);
    let (line, _) = p.wait_line("session: epoch 0x", HANG);
    let hex = line
        .split("epoch 0x")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_hexdigit()).next())
        .unwrap_or_else(|| panic!("no epoch in {line:?}"));
    let epoch = u64::from_str_radix(hex, 16).expect("hex epoch");
    // Each cluster logs the other's INIs as registered.
    let heard_from = |c: u16| {
        let (line, _) = p.wait_line(&format!("cluster {c} INI 0: receives at"), HANG);
        line.rsplit(':')
            .next()
            .and_then(|port| port.trim().parse::<u16>().ok())
            .unwrap_or_else(|| panic!("no source port in {line:?}"))
    };
    attack(epoch, [heard_from(0), heard_from(1)]);
    let status = p.wait_exit(JOB);
    assert!(status.success(), "{name}: {status}\n{}", p.transcript());
    p
}

/// The datagrams an attacker sends to cluster `to`'s INI 0, claiming to be cluster
/// `1 - to`'s INI 0: an earlier run's DATA, ACK and NAK frames (its epoch, its secret),
/// the same forged under this run's epoch without the secret, and junk.
fn attack_frames(to: u16, epoch: u64, seed: u64) -> Vec<Vec<u8>> {
    let earlier_epoch = epoch ^ 0x5eed_0000_0000_0001 ^ seed;
    let earlier_key = MacKey::new([seed as u8 ^ 0xa5; 32]);
    let guessed_key = MacKey::new([seed as u8 ^ 0x3c; 32]);
    let conn = ConnId {
        src: IniAddr::new(1 - to, 0),
        dst: IniAddr::new(to, 0),
    };
    let mut out = Vec::new();
    for (ep, secret) in [(earlier_epoch, &earlier_key), (epoch, &guessed_key)] {
        let key = &wire::DatagramKey::new(secret, ep);
        for seq in 0..24u32 {
            let payload: Vec<u8> = (0..64 + seq as usize * 50)
                .map(|i| (i as u64 ^ seed) as u8)
                .collect();
            for (kind, frag, data) in [
                (FrameKind::Data, (0, 1), &payload[..]),
                (FrameKind::Ack, (0, 0), &[0xff][..]),
                (FrameKind::Nak, (0, 0), &[][..]),
            ] {
                let h = Header {
                    kind,
                    epoch: ep,
                    conn,
                    seq: if kind == FrameKind::Ack { 0 } else { seq },
                    ack: seq * 3,
                    frag_index: frag.0,
                    frag_count: frag.1,
                };
                let mut buf = vec![0u8; wire::OVERHEAD + data.len()];
                let n = wire::encode(&h, data, key, &mut buf).expect("a valid header");
                buf.truncate(n);
                out.push(buf);
            }
        }
    }
    for len in [0usize, 1, 7, 20, 47, 55, 200] {
        out.push((0..len).map(|i| (i as u64 * 31 + seed) as u8).collect());
    }
    out
}

/// Sends `frames` for cluster `to` and the other cluster in turns with `send` until
/// `stop`, about 4,000 datagrams a second (the job keeps most of the 2 cores).
fn spray(ports: [u16; 2], epoch: u64, stop: &AtomicBool, mut send: impl FnMut(usize, &[u8])) {
    let frames = [attack_frames(0, epoch, 1), attack_frames(1, epoch, 2)];
    let mut sent = 0u64;
    'outer: loop {
        for (to, set) in frames.iter().enumerate() {
            for f in set {
                if stop.load(Ordering::Relaxed) {
                    break 'outer;
                }
                send(to, f);
                sent += 1;
                if sent.is_multiple_of(8) {
                    thread::sleep(Duration::from_millis(2));
                }
            }
        }
    }
    eprintln!("sprayed {sent} datagrams at ports {ports:?}");
}

/// A raw IPv4 socket that writes its own headers (root, or CAP_NET_RAW), or `None`.
fn raw_socket() -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: socket(2) with constant arguments; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Sends `payload` as a UDP datagram from 127.0.0.1:`from` to 127.0.0.1:`to` through the
/// raw socket `fd` (IP checksum and length filled in by the kernel; UDP checksum 0,
/// "none", which IPv4 allows).
fn send_spoofed(fd: &std::os::fd::OwnedFd, from: u16, to: u16, payload: &[u8]) {
    use std::os::fd::AsRawFd;
    let mut pkt = vec![
        0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1,
    ];
    pkt.extend_from_slice(&from.to_be_bytes());
    pkt.extend_from_slice(&to.to_be_bytes());
    pkt.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    pkt.extend_from_slice(&[0, 0]);
    pkt.extend_from_slice(payload);
    let total = pkt.len() as u16;
    pkt[2..4].copy_from_slice(&total.to_be_bytes());
    let dest = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `pkt` and `dest` are live for the call and their lengths are passed;
    // sendto(2) only reads them.
    unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            pkt.as_ptr().cast(),
            pkt.len(),
            0,
            (&raw const dest).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
}

/// The sprayer process: sprays from an ordinary UDP socket until killed. Does nothing
/// unless [`SPRAY_VAR`] is set (it is then started by
/// `forged_replayed_and_spoofed_datagrams_change_nothing`, as another user).
#[test]
fn spray_helper() {
    let Ok(spec) = std::env::var(SPRAY_VAR) else {
        return;
    };
    let (ports, epoch) = spec.split_once(';').expect("PORT0,PORT1;EPOCH");
    let ports: Vec<u16> = ports.split(',').map(|p| p.parse().unwrap()).collect();
    let ports = [ports[0], ports[1]];
    let epoch = u64::from_str_radix(epoch, 16).unwrap();
    let socket = UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
    // SAFETY: getuid(2) has no preconditions.
    eprintln!("sprayer: uid {}", unsafe { libc::getuid() });
    let stop = AtomicBool::new(false);
    spray(ports, epoch, &stop, |to, f| {
        let _ = socket.send_to(f, SocketAddr::from(([127, 0, 0, 1], ports[to])));
    });
}

#[test]
fn forged_replayed_and_spoofed_datagrams_change_nothing() {
    let dir = TempDir::new("auth");
    let ports = free_ports();
    let cfg = config(&dir, ports);
    let reference = run_job("undisturbed", &cfg, |_, _| {});
    let want = energies(&reference);
    assert!(want.len() > 100, "{want:?}");
    // SAFETY: geteuid(2) has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let raw = raw_socket();
    let stop = Arc::new(AtomicBool::new(false));
    let mut sprayer: Option<std::process::Child> = None;
    let mut spoofer = None;
    let disturbed = run_job("sprayed", &cfg, |epoch, sources| {
        // Another user's process: an ordinary socket, whatever address it gets.
        let exe = std::env::current_exe().expect("this test binary");
        let start = |as_nobody: bool| {
            let mut c = if as_nobody {
                let mut c = Command::new("setpriv");
                c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                    .arg(&exe);
                c
            } else {
                Command::new(&exe)
            };
            c.args(["--exact", "spray_helper", "--nocapture", "--test-threads=1"])
                .env(SPRAY_VAR, format!("{},{};{epoch:x}", ports[0], ports[1]))
                .spawn()
        };
        let mut child = None;
        if root {
            // Falls back to this user where setpriv is missing or `nobody` cannot run
            // this binary (a private checkout): the sprayer would end at once.
            match start(true) {
                Ok(mut c) => {
                    thread::sleep(Duration::from_millis(300));
                    match c.try_wait() {
                        Ok(None) => child = Some(c),
                        other => eprintln!("the sprayer as nobody ended at once: {other:?}"),
                    }
                }
                Err(e) => eprintln!("cannot run setpriv: {e}"),
            }
        }
        if child.is_none() {
            eprintln!("the sprayer runs as this test's user");
            child = Some(start(false).expect("start the sprayer"));
        }
        sprayer = child;
        // The spoofing attacker: the address the peer INI's datagrams come from as the
        // source.
        if let Some(fd) = raw {
            let stop = Arc::clone(&stop);
            spoofer = Some(thread::spawn(move || {
                spray(ports, epoch, &stop, |to, f| {
                    send_spoofed(&fd, sources[1 - to], ports[to], f)
                });
            }));
        } else {
            eprintln!("no raw socket (not root): the spoofed-source attack is skipped");
        }
    });
    stop.store(true, Ordering::Relaxed);
    if let Some(mut s) = sprayer {
        let _ = s.kill();
        let status = s.wait().expect("reap the sprayer");
        eprintln!("sprayer ended: {status}");
    }
    if let Some(t) = spoofer {
        t.join().expect("spoofer thread");
    }
    assert_eq!(
        energies(&disturbed),
        want,
        "energies differ from the undisturbed run:\n{}",
        disturbed.transcript()
    );
    let seen = rejections(&disturbed);
    assert_eq!(seen.len(), 2, "{}", disturbed.transcript());
    for (ini, [mac, epoch, src, bad]) in &seen {
        eprintln!("{ini}: rejected mac {mac} epoch {epoch} src {src} bad {bad}");
        assert!(
            *src > 0,
            "{ini}: no unregistered-address rejections counted"
        );
        if raw_socket().is_some() {
            assert!(
                *epoch > 0 && *mac > 0 && *bad > 0,
                "{ini}: spoofed earlier-run, forged and junk datagrams are each counted: \
                 mac {mac} epoch {epoch} bad {bad}"
            );
        }
    }
    let clean = rejections(&reference);
    assert!(
        clean.iter().all(|(_, r)| *r == [0; 4]),
        "the undisturbed run rejected nothing: {clean:?}"
    );
}
