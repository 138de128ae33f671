//! Cross-process tests of the shared-memory substrate. This binary is its own peer: run
//! normally it runs the tests, each of which re-executes the binary with `MG_XPROC_ROLE`
//! set to play the other process. Every wait has a timeout and the child is killed if the
//! test fails, so nothing hangs and no process is left behind.

use multigrain_messaging::*;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const EXPRESS: u64 = 100_000;
const TAG_ON: u64 = 10_000;
const TIMEOUT: Duration = Duration::from_secs(120);

/// A child process killed when dropped (so a failing test leaves no orphan).
struct Peer {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Peer {
    fn spawn(role: &str, env: &[(&str, &str)]) -> Peer {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.env("MG_XPROC_ROLE", role)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn peer process");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Peer { child, lines }
    }

    fn line(&self, what: &str) -> String {
        self.lines
            .recv_timeout(TIMEOUT)
            .unwrap_or_else(|_| panic!("peer process did not report {what} within {TIMEOUT:?}"))
    }

    fn wait_success(mut self) {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "peer process failed: {status}");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "peer process did not exit within {TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn shared_site(id: u16) -> Site {
    Site::new(SiteConfig {
        site: SiteId(id),
        shared: true,
        pool_slots: 512,
        ..SiteConfig::default()
    })
    .unwrap()
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn page(i: u64) -> Vec<u8> {
    (0..4096u64)
        .map(|j| (i.wrapping_mul(131) ^ j.wrapping_mul(7)) as u8)
        .collect()
}

/// Checks the peer's stream: Express payloads 0.. in order, Tag-On tags 0.. in order with
/// their exact page contents.
#[derive(Default)]
struct Verifier {
    express: u64,
    tag_on: u64,
}

impl Verifier {
    fn take(&mut self, m: Message) {
        match m {
            Message::Express(e) => {
                assert_eq!(e.payload, self.express, "Express out of order or lost");
                self.express += 1;
            }
            Message::TagOn(t) => {
                assert_eq!(t.data.tag(), self.tag_on, "Tag-On out of order or lost");
                assert!(
                    *t.data == page(self.tag_on)[..],
                    "Tag-On {} payload corrupted",
                    self.tag_on
                );
                self.tag_on += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    fn done(&self) -> bool {
        self.express == EXPRESS && self.tag_on == TAG_ON
    }
}

/// Both processes run this: send the full stream to the peer while verifying the peer's.
fn exchange(site: &Site, peer: u16) {
    let (ep, w) = site.create_endpoint(&[QueueId(0)]).unwrap();
    w.map(
        VirtualName(0),
        Destination {
            site: SiteId(peer),
            queue: QueueId(0),
            source: SourceId::new(0).unwrap(),
        },
    )
    .unwrap();
    assert!(
        !ep.reaches_over_network(VirtualName(0)),
        "the peer process shares a segment: no datagrams"
    );
    let mut v = Verifier::default();
    let mut tag = 0;
    for i in 0..EXPRESS {
        ep.send_express_blocking(
            VirtualName(0),
            Express::new(Handler(1), i).unwrap(),
            Some(TIMEOUT),
            |m| v.take(m),
        )
        .unwrap();
        if i % (EXPRESS / TAG_ON) == 0 {
            let deadline = Instant::now() + TIMEOUT;
            let mut buf = loop {
                match ep.alloc() {
                    Ok(b) => break b,
                    Err(e) => {
                        assert!(Instant::now() < deadline, "{e}");
                        while let Some(m) = ep.try_recv() {
                            v.take(m);
                        }
                        std::thread::yield_now();
                    }
                }
            };
            buf.fill(&page(tag));
            buf.set_tag(tag);
            ep.send_tag_on_blocking(VirtualName(0), Handler(2), buf, Some(TIMEOUT), |m| {
                v.take(m)
            })
            .unwrap();
            tag += 1;
        }
    }
    let deadline = Instant::now() + TIMEOUT;
    while !v.done() {
        assert!(
            Instant::now() < deadline,
            "received {} Express and {} Tag-On of the peer's stream",
            v.express,
            v.tag_on
        );
        if let Some(m) = ep.recv_timeout(Duration::from_millis(100)) {
            v.take(m);
        }
    }
    // The peer must have consumed our buffers before we report success and unmap.
    wait_until("the peer to release our Tag-On buffers", || {
        site.pool().free_slots() == site.pool().slots() as usize
    });
    let stats = site.stats();
    assert_eq!((stats.sent.express, stats.sent.tag_on), (EXPRESS, TAG_ON));
    assert_eq!(
        (stats.received.express, stats.received.tag_on),
        (EXPRESS, TAG_ON)
    );
    assert_eq!(stats.substrate.shm, EXPRESS + TAG_ON);
    assert_eq!(stats.rejected.total(), 0);
}

fn express_and_tag_on_both_ways() {
    let site = shared_site(0);
    let mine = site.segment_name().unwrap().to_owned();
    let peer = Peer::spawn("exchange", &[("MG_PEER_SEGMENT", &mine)]);
    let theirs = peer.line("its segment name");
    site.attach_peer(SiteId(1), &theirs).unwrap();
    wait_until("the peer to map our segment", || site.attached_peers() == 1);
    site.unlink_segment();
    assert!(
        !std::path::Path::new(&format!("/dev/shm/{mine}")).exists(),
        "unlinked once attached"
    );
    exchange(&site, 1);
    peer.wait_success();
    assert!(
        !std::path::Path::new(&format!("/dev/shm/{theirs}")).exists(),
        "the peer unlinked its segment"
    );
}

fn child_exchange() {
    let site = shared_site(1);
    site.attach_peer(SiteId(0), &std::env::var("MG_PEER_SEGMENT").unwrap())
        .unwrap();
    println!("{}", site.segment_name().unwrap());
    std::io::stdout().flush().unwrap();
    wait_until("the parent to map our segment", || {
        site.attached_peers() == 1
    });
    site.unlink_segment();
    exchange(&site, 0);
}

fn killed_creator_leaves_nothing_behind() {
    let peer = Peer::spawn("create-and-hang", &[]);
    let name = peer.line("its segment name");
    let path = format!("/dev/shm/{name}");
    assert!(std::path::Path::new(&path).exists());
    let pid = peer.child.id();
    drop(peer); // SIGKILL: the creator never unlinks
    wait_until("the killed peer to be reaped", || {
        !segment::process_alive(pid as i32)
    });
    // The next site created on this machine sweeps what dead processes left behind.
    let _site = shared_site(5);
    assert!(
        !std::path::Path::new(&path).exists(),
        "stale segment {name} of a killed process was not removed"
    );
}

fn child_create_and_hang() {
    let site = shared_site(7);
    println!("{}", site.segment_name().unwrap());
    std::io::stdout().flush().unwrap();
    std::thread::sleep(TIMEOUT);
}

fn garbage_segment_is_refused_with_a_clear_error() {
    let name = segment::unique_name("garbage");
    let seg = segment::Segment::create_shared(&name, 1 << 16).unwrap();
    let site = shared_site(2);
    let err = site.attach_peer(SiteId(3), &name).unwrap_err().to_string();
    assert!(
        err.contains(&name) && err.contains("not a multigrain site"),
        "{err}"
    );
    let err = site
        .attach_peer(SiteId(3), "multigrain-does-not-exist")
        .unwrap_err()
        .to_string();
    assert!(err.contains("ENOENT"), "{err}");
    drop(seg);
}

fn main() {
    match std::env::var("MG_XPROC_ROLE").as_deref() {
        Ok("exchange") => return child_exchange(),
        Ok("create-and-hang") => return child_create_and_hang(),
        Ok(other) => panic!("unknown role {other}"),
        Err(_) => {}
    }
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let tests: [(&str, fn()); 3] = [
        ("express_and_tag_on_both_ways", express_and_tag_on_both_ways),
        (
            "killed_creator_leaves_nothing_behind",
            killed_creator_leaves_nothing_behind,
        ),
        (
            "garbage_segment_is_refused_with_a_clear_error",
            garbage_segment_is_refused_with_a_clear_error,
        ),
    ];
    let mut failed = 0;
    for (name, test) in tests {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let t0 = Instant::now();
        let ok = std::panic::catch_unwind(test).is_ok();
        println!(
            "test {name} ... {} ({:.2?})",
            if ok { "ok" } else { "FAILED" },
            t0.elapsed()
        );
        failed += usize::from(!ok);
    }
    if failed > 0 {
        eprintln!("{failed} cross-process test(s) failed");
        std::process::exit(1);
    }
}
