//! Issue 13, the liveness thread, with real processes: two clusters whose compute
//! threads busy-spin without pause for several peer timeouts (far more spinning threads
//! than CPUs, while messages are in flight both ways) are not declared dead; a cluster
//! paused with SIGSTOP is still reported within the peer timeout.
//!
//! Each test re-executes this binary twice (`MG_LIVENESS_ROLE`) to play the two
//! clusters: the control plane on a free loopback port, INIs and liveness sockets on port
//! 0, every wait under a timeout, and children killed when their handle drops.

// The crate's loom shim for atomics is crate-private; this test never runs under loom.
#![allow(clippy::disallowed_types)]

use multigrain_cluster_config::{JobConfig, Substrate};
use multigrain_messaging::control::{Identity, free_loopback_port};
use multigrain_messaging::job::Job;
use multigrain_messaging::*;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

const ROLE: &str = "MG_LIVENESS_ROLE";
/// Bound on every wait of the parent.
const HANG: Duration = Duration::from_secs(60);

/// A cluster process, SIGKILLed and reaped when dropped.
struct Cluster {
    child: Child,
    lines: mpsc::Receiver<(String, Instant)>,
}

impl Cluster {
    fn spawn(test: &str, role: &str, cluster: usize, port: u16, peer_ms: u64) -> Cluster {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE, format!("{role} {cluster} {port} {peer_ms}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn a cluster process");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((l, Instant::now()));
            }
        });
        Cluster { child, lines }
    }

    /// Waits for a line containing `prefix` (others are echoed); returns it from
    /// `prefix` on (libtest's own words may precede it) and when it was read.
    fn line(&self, prefix: &str) -> (String, Instant) {
        let deadline = Instant::now() + HANG;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((l, at)) if l.contains(prefix) => {
                    let i = l.find(prefix).expect("contains it");
                    return (l[i..].to_owned(), at);
                }
                Ok((l, _)) => eprintln!("  | {l}"),
                Err(_) => panic!("no line {prefix:?} within {HANG:?}"),
            }
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn wait_success(&mut self) {
        let deadline = Instant::now() + HANG;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                assert!(s.success(), "cluster process failed: {s}");
                return;
            }
            assert!(Instant::now() < deadline, "cluster process did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The role this process plays, if it is a cluster process.
fn role() -> Option<(String, usize, u16, u64)> {
    let r = std::env::var(ROLE).ok()?;
    let mut w = r.split(' ');
    Some((
        w.next()?.to_owned(),
        w.next()?.parse().ok()?,
        w.next()?.parse().ok()?,
        w.next()?.parse().ok()?,
    ))
}

/// Joins a 2-cluster job over UDP on loopback as `cluster`, with an endpoint whose name
/// `p` reaches queue 0 of cluster `p`.
fn join(cluster: usize, port: u16, peer_ms: u64) -> (Job, Endpoint) {
    let mut cfg = JobConfig::local(2, 1);
    cfg.job.peer_timeout_ms = peer_ms;
    cfg.ini.substrate = Substrate::Udp;
    let id = Identity {
        cluster,
        clusters: 2,
        coordinator: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        listen: None,
        placed: None,
        launcher: None,
        doubt: None,
        secret: None,
    };
    let site = SiteConfig {
        queues: vec![QueueSpec::default(); 1],
        pool_slots: 256,
        ..SiteConfig::default()
    };
    let job = Job::join(&cfg, id, site).expect("join the job");
    let (ep, w) = job.site().create_endpoint(&[QueueId(0)]).unwrap();
    for s in 0..2u16 {
        w.map(
            VirtualName(s),
            Destination {
                site: SiteId(s),
                queue: QueueId(0),
                source: SourceId::new(cluster as u16).unwrap(),
            },
        )
        .unwrap();
    }
    std::mem::forget(w);
    (job, ep)
}

/// Sends an Express message to the peer every millisecond and drains its own queue,
/// until `stop`; counts what it received.
fn traffic(
    ep: Endpoint,
    peer: u16,
    stop: Arc<AtomicBool>,
    got: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let _ = ep.send_express(VirtualName(peer), Express::new(Handler(1), n).unwrap());
            while ep.try_recv().is_some() {
                got.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    })
}

/// Cluster processes of the spinning test: `SPINNERS` threads busy-spin (no yield, no
/// system call) for `SPIN_TIMEOUTS` peer timeouts while messages flow both ways; then
/// the job must finish without a failure.
const SPINNERS: usize = 64;
const SPIN_TIMEOUTS: u32 = 6;

fn spinning_cluster(cluster: usize, port: u16, peer_ms: u64) {
    let (job, ep) = join(cluster, port, peer_ms);
    let peer = 1 - cluster as u16;
    let (stop, got) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let t = traffic(ep, peer, stop.clone(), got.clone());
    let spin = Duration::from_millis(peer_ms) * SPIN_TIMEOUTS;
    let t0 = Instant::now();
    let spinners: Vec<_> = (0..SPINNERS)
        .map(|_| {
            std::thread::spawn(move || {
                let mut x = 0u64;
                while t0.elapsed() < spin {
                    for _ in 0..1000 {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                }
                x
            })
        })
        .collect();
    for s in spinners {
        let _ = s.join();
    }
    let spun = t0.elapsed();
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    if let Some(f) = job.failure() {
        println!("failed cluster {}: {}", f.cluster, f.reason);
        std::process::exit(1);
    }
    let l = job.liveness_stats().expect("a liveness thread");
    println!(
        "spun {spun:?} with {SPINNERS} threads; received {} messages; liveness: realtime {}, \
         {} answers, {} probes answered",
        got.load(Ordering::Relaxed),
        l.realtime,
        l.answers,
        l.probes_answered
    );
    job.finish(Duration::from_secs(10)).expect("finish");
    println!("done");
}

/// Cluster processes of the SIGSTOP test: both send; cluster 0 prints the failure it
/// finds; cluster 1 is the one paused.
fn pausing_cluster(cluster: usize, port: u16, peer_ms: u64) {
    let (job, ep) = join(cluster, port, peer_ms);
    let (stop, got) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let _t = traffic(ep, 1 - cluster as u16, stop, got);
    println!("joined");
    let deadline = Instant::now() + HANG;
    while Instant::now() < deadline {
        if let Some(f) = job.failure() {
            println!("failed cluster {}: {}", f.cluster, f.reason);
            std::process::exit(3);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    std::process::exit(4);
}

/// One multi-process test at a time (the spinning one would skew the other's timing).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs this process's role, if it has one (then exits).
fn play_role() {
    if let Some((what, cluster, port, peer_ms)) = role() {
        match what.as_str() {
            "spin" => spinning_cluster(cluster, port, peer_ms),
            "pause" => pausing_cluster(cluster, port, peer_ms),
            other => panic!("unknown role {other}"),
        }
        std::process::exit(0);
    }
}

/// Compute threads that never pause, 64 per cluster on a machine of a few CPUs, for six
/// peer timeouts of 250 ms while messages are in flight both ways: neither cluster is
/// declared dead, since each one's real-time liveness thread keeps answering the other's
/// probes; the job finishes.
#[test]
fn clusters_whose_threads_spin_past_the_peer_timeout_are_not_declared_dead() {
    play_role();
    let _one = one_at_a_time();
    let test = "clusters_whose_threads_spin_past_the_peer_timeout_are_not_declared_dead";
    let port = free_loopback_port().unwrap();
    let mut cs: Vec<Cluster> = (0..2)
        .map(|c| Cluster::spawn(test, "spin", c, port, 250))
        .collect();
    for (c, p) in cs.iter_mut().enumerate() {
        let (line, _) = p.line("spun ");
        eprintln!("cluster {c}: {line}");
        p.line("done");
        p.wait_success();
    }
}

/// A cluster paused with SIGSTOP answers no probe: the other reports it within the peer
/// timeout (plus scheduling slack) of the pause.
#[test]
fn a_paused_cluster_is_still_reported_within_the_peer_timeout() {
    play_role();
    let _one = one_at_a_time();
    let test = "a_paused_cluster_is_still_reported_within_the_peer_timeout";
    const PEER_MS: u64 = 500;
    let port = free_loopback_port().unwrap();
    let cs: Vec<Cluster> = (0..2)
        .map(|c| Cluster::spawn(test, "pause", c, port, PEER_MS))
        .collect();
    for c in &cs {
        c.line("joined");
    }
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    // SAFETY: kill(2) on a child process this test started and has not reaped (its
    // handle is alive, so the pid is not reused).
    assert_eq!(unsafe { libc::kill(cs[1].pid(), libc::SIGSTOP) }, 0);
    let (line, at) = cs[0].line("failed cluster ");
    let took = at - t0;
    eprintln!("cluster 0 reported the paused cluster after {took:?}: {line}");
    assert!(line.starts_with("failed cluster 1:"), "{line}");
    let bound = Duration::from_millis(PEER_MS + 300);
    assert!(took <= bound, "reported after {took:?}, bound {bound:?}");
    // Dropping the handles SIGKILLs (a stopped process dies of SIGKILL too) and reaps both.
}
