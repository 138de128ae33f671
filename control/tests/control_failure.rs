//! Failure propagation through the control plane, threads acting as
//! clusters: a cluster dropped without finishing, an abort, the
//! coordinator's death, a silent (hung) member, failures during finish, the
//! `on_failure` callback, and a member that exits right after finishing.

use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use multigrain_cluster_config::JobSettings;
use multigrain_control::wire::{self, Message};
use multigrain_control::{
    Control, ControlError, Failure, Identity, Registration, free_loopback_port,
};

/// Every wait on a cluster thread is bounded by this.
const HANG: Duration = Duration::from_secs(30);
/// Slack allowed on top of a timeout on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(1500);

fn settings(key: u64, peer_ms: u64) -> JobSettings {
    JobSettings {
        name: None,
        key,
        startup_timeout_ms: 20_000,
        peer_timeout_ms: peer_ms,
        progress_timeout_ms: 0,
    }
}

fn coordinator_addr() -> SocketAddr {
    let port = free_loopback_port().expect("a free loopback port");
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn wait<T>(rx: &Receiver<T>, what: &str) -> T {
    rx.recv_timeout(HANG)
        .unwrap_or_else(|_| panic!("{what} did not return within {HANG:?}: it hangs"))
}

type Joined = Result<(Control, Vec<Registration>), ControlError>;

/// Joins `clusters` clusters on threads; cluster ids in `skip` are left for
/// the caller to start.
fn join_on_threads(
    clusters: usize,
    addr: SocketAddr,
    s: &JobSettings,
    skip: &[usize],
) -> Vec<(usize, Receiver<Joined>)> {
    (0..clusters)
        .filter(|c| !skip.contains(c))
        .map(|c| {
            let (tx, rx) = mpsc::channel();
            let s = s.clone();
            thread::spawn(move || {
                let id = Identity {
                    cluster: c,
                    clusters,
                    coordinator: addr,
                    listen: None,
                    placed: None,
                    launcher: None,
                    doubt: None,
                    secret: None,
                };
                let _ = tx.send(Control::join(&id, &s, Registration::local(c, Vec::new())));
            });
            (c, rx)
        })
        .collect()
}

fn join_all(clusters: usize, s: &JobSettings) -> Vec<Control> {
    let addr = coordinator_addr();
    join_on_threads(clusters, addr, s, &[])
        .into_iter()
        .map(|(c, rx)| {
            wait(&rx, &format!("join of cluster {c}"))
                .unwrap_or_else(|e| panic!("cluster {c}: {e}"))
                .0
        })
        .collect()
}

/// Waits for each control to learn a failure; returns it and how long it
/// took from `since`.
fn learn(controls: &[Control], since: Instant, limit: Duration) -> Vec<(Failure, Duration)> {
    controls
        .iter()
        .map(|c| {
            let f = c.wait_failure(limit + SLACK).unwrap_or_else(|| {
                panic!(
                    "cluster {} learned no failure within {:?}",
                    c.cluster(),
                    limit + SLACK
                )
            });
            (f, since.elapsed())
        })
        .collect()
}

#[test]
fn member_dropped_without_finish_is_reported_everywhere() {
    let peer = Duration::from_millis(1000);
    let mut controls = join_all(4, &settings(21, peer.as_millis() as u64));
    let dead = controls.remove(2);
    let t0 = Instant::now();
    drop(dead);
    for (c, (f, took)) in controls.iter().zip(learn(&controls, t0, peer)) {
        assert_eq!(f.cluster, 2, "cluster {} learned {f}", c.cluster());
        assert!(
            f.reason.contains("closed before it finished"),
            "cluster {}: {f}",
            c.cluster()
        );
        assert!(took <= peer, "cluster {} took {took:?}", c.cluster());
        eprintln!(
            "cluster {} learned of cluster 2's death after {took:?}",
            c.cluster()
        );
        let e = c.barrier(1, HANG).expect_err("no barrier after a failure");
        assert_eq!(e.to_string(), f.to_string());
        assert!(matches!(
            c.finish(HANG),
            Err(ControlError::ClusterFailed(Failure { cluster: 2, .. }))
        ));
    }
}

#[test]
fn abort_reaches_every_cluster_with_its_reason() {
    let controls = join_all(3, &settings(22, 3_000));
    let (tx, rx) = mpsc::channel();
    controls[2].on_failure(move |f| {
        let _ = tx.send(f.clone());
    });
    // Cluster 0 and 2 wait in a barrier that cluster 1 never reaches.
    let mut it = controls.into_iter();
    let (c0, c1, c2) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    let waiter = thread::spawn(move || {
        let r = c0.barrier(3, HANG);
        (c0, r)
    });
    thread::sleep(Duration::from_millis(100));
    c1.abort("out of memory in phase 2");
    assert_eq!(c1.failure().map(|f| f.cluster), Some(1), "own failure");
    let (c0, r) = waiter.join().expect("cluster 0 thread");
    let e = r.expect_err("the barrier is broken by the abort");
    assert_eq!(e.to_string(), "cluster 1 failed: out of memory in phase 2");
    let f = rx.recv_timeout(HANG).expect("on_failure called");
    assert_eq!(
        (f.cluster, f.reason.as_str()),
        (1, "out of memory in phase 2")
    );
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "on_failure called twice"
    );
    assert_eq!(c2.failure(), Some(f));
    // A callback registered after the failure is called once, at once.
    let (tx2, rx2) = mpsc::channel();
    c0.on_failure(move |f| {
        let _ = tx2.send(f.cluster);
    });
    assert_eq!(rx2.recv_timeout(HANG), Ok(1));
}

#[test]
fn coordinator_abort_is_reported_as_cluster_0() {
    let controls = join_all(3, &settings(23, 3_000));
    controls[0].abort("bad input file");
    for c in &controls[1..] {
        let f = c.wait_failure(HANG).expect("failure learned");
        assert_eq!(f.to_string(), "cluster 0 failed: bad input file");
    }
}

#[test]
fn coordinator_death_is_reported_by_every_member() {
    let peer = Duration::from_millis(1000);
    let mut controls = join_all(3, &settings(24, peer.as_millis() as u64));
    let coordinator = controls.remove(0);
    let t0 = Instant::now();
    drop(coordinator);
    for (c, (f, took)) in controls.iter().zip(learn(&controls, t0, peer)) {
        assert_eq!(f.cluster, 0);
        assert!(
            f.reason.contains("cluster 0 (the coordinator) died"),
            "cluster {}: {f}",
            c.cluster()
        );
        assert!(took <= peer, "cluster {} took {took:?}", c.cluster());
    }
}

#[test]
fn idle_job_stays_alive_on_heartbeats() {
    let peer = Duration::from_millis(300);
    let controls = join_all(3, &settings(25, peer.as_millis() as u64));
    for c in &controls {
        assert_eq!(c.wait_failure(peer * 4), None, "cluster {}", c.cluster());
    }
    let (tx, rx) = mpsc::channel();
    for c in controls {
        let tx = tx.clone();
        thread::spawn(move || {
            let _ = tx.send((c.cluster(), c.finish(HANG)));
        });
    }
    for _ in 0..3 {
        let (c, r) = wait(&rx, "finish");
        r.unwrap_or_else(|e| panic!("cluster {c}: {e}"));
    }
}

/// A member that registers by hand and then never speaks: it is reported
/// by heartbeat timeout, not by a closed connection.
#[test]
fn silent_member_is_reported_after_peer_timeout() {
    let peer = Duration::from_millis(800);
    let key = 26;
    let s = settings(key, peer.as_millis() as u64);
    let addr = coordinator_addr();
    let pending = join_on_threads(3, addr, &s, &[2]);
    let deadline = Instant::now() + HANG;
    let mut silent = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("no coordinator at {addr}: {e}"),
        }
    };
    let register = Message::Register {
        registration: Registration::local(2, Vec::new()),
        clusters: 3,
    };
    wire::write_frame(&mut silent, key, None, &register).expect("register by hand");
    let controls: Vec<Control> = pending
        .into_iter()
        .map(|(c, rx)| {
            wait(&rx, &format!("join of cluster {c}"))
                .unwrap_or_else(|e| panic!("cluster {c}: {e}"))
                .0
        })
        .collect();
    let t0 = Instant::now();
    // Read what arrives, so the coordinator's writes never block, but never answer.
    silent
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("read timeout");
    let drain = thread::spawn(move || {
        let until = Instant::now() + peer * 4;
        while Instant::now() < until {
            let _ = wire::read_frame(&mut silent, key, wire::Auth::NONE);
        }
        silent
    });
    for (c, (f, took)) in controls.iter().zip(learn(&controls, t0, peer)) {
        assert_eq!(f.cluster, 2, "cluster {}: {f}", c.cluster());
        assert!(f.reason.contains("nothing heard from it"), "{f}");
        assert!(
            took >= peer / 2 && took <= peer + SLACK,
            "cluster {} learned after {took:?}; peer timeout {peer:?}",
            c.cluster()
        );
        eprintln!(
            "cluster {} learned of the silent cluster 2 after {took:?}",
            c.cluster()
        );
    }
    drop(drain.join().expect("drain thread"));
}

/// A member that sends `Finish` and then exits is not a failure.
#[test]
fn member_exit_after_finish_is_not_a_failure() {
    let key = 27;
    let s = settings(key, 1_000);
    let addr = coordinator_addr();
    let pending = join_on_threads(3, addr, &s, &[2]);
    let deadline = Instant::now() + HANG;
    let mut quitter = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("no coordinator at {addr}: {e}"),
        }
    };
    let register = Message::Register {
        registration: Registration::local(2, Vec::new()),
        clusters: 3,
    };
    wire::write_frame(&mut quitter, key, None, &register).expect("register by hand");
    let controls: Vec<Control> = pending
        .into_iter()
        .map(|(c, rx)| {
            wait(&rx, &format!("join of cluster {c}"))
                .unwrap_or_else(|e| panic!("cluster {c}: {e}"))
                .0
        })
        .collect();
    wire::write_frame(&mut quitter, key, None, &Message::Finish).expect("finish by hand");
    drop(quitter);
    thread::sleep(Duration::from_millis(200));
    let (tx, rx) = mpsc::channel();
    for c in controls {
        let tx = tx.clone();
        thread::spawn(move || {
            let _ = tx.send((c.cluster(), c.finish(HANG)));
        });
    }
    for _ in 0..2 {
        let (c, r) = wait(&rx, "finish");
        r.unwrap_or_else(|e| panic!("cluster {c}: {e}"));
    }
}

#[test]
fn death_during_finish_fails_the_finish() {
    let mut controls = join_all(3, &settings(28, 1_000));
    let dead = controls.remove(1);
    let (tx, rx) = mpsc::channel();
    for c in controls {
        let tx = tx.clone();
        thread::spawn(move || {
            let _ = tx.send((c.cluster(), c.finish(HANG)));
        });
    }
    thread::sleep(Duration::from_millis(200));
    drop(dead);
    for _ in 0..2 {
        let (c, r) = wait(&rx, "finish");
        let e = r.expect_err("cluster 1 died before finishing");
        assert!(
            e.to_string().starts_with("cluster 1 failed:"),
            "cluster {c}: {e}"
        );
    }
}

#[test]
fn member_death_during_startup_fails_the_start() {
    let key = 29;
    let s = settings(key, 1_000);
    let addr = coordinator_addr();
    // Cluster 3 is never started, so start-up is still under way when
    // cluster 2 registers by hand and dies.
    let pending = join_on_threads(4, addr, &s, &[2, 3]);
    let deadline = Instant::now() + HANG;
    let mut early = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("no coordinator at {addr}: {e}"),
        }
    };
    let register = Message::Register {
        registration: Registration::local(2, Vec::new()),
        clusters: 4,
    };
    wire::write_frame(&mut early, key, None, &register).expect("register by hand");
    thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    drop(early);
    for (c, rx) in pending {
        let e = wait(&rx, &format!("join of cluster {c}"))
            .expect_err("start-up cannot complete after cluster 2 died");
        let text = e.to_string();
        assert!(text.starts_with("cluster 2 failed:"), "cluster {c}: {text}");
        assert!(t0.elapsed() < SLACK, "cluster {c} took {:?}", t0.elapsed());
    }
}

fn stall(ms: u64, what: &str) -> Option<multigrain_control::Stall> {
    Some(multigrain_control::Stall {
        duration: Duration::from_millis(ms),
        waits: vec![what.to_owned()],
    })
}

/// The progress watchdog: while any cluster reports progress (or a stall shorter
/// than `job.progress_timeout_ms`) the job lives; once every cluster reports a stall
/// of at least the timeout, every cluster — the blamed one too — learns one failure
/// that blames the cluster stalled longest and names every cluster's waits.
#[test]
fn every_cluster_stalled_past_the_timeout_fails_the_job_with_their_waits() {
    let mut s = settings(27, 3_000);
    s.progress_timeout_ms = 500;
    let controls = join_all(3, &s);
    assert_eq!(
        controls[1].progress_timeout(),
        Some(Duration::from_millis(500))
    );
    // Cluster 1 computes: no failure however long the others wait.
    controls[0].report_progress(stall(5_000, "dsm-c0-t0 at a barrier (for 5.0 s)"));
    controls[1].report_progress(None);
    controls[2].report_progress(stall(5_000, "dsm-c2-t0 at a barrier (for 5.0 s)"));
    // A stall shorter than the timeout is not enough either.
    controls[1].report_progress(stall(100, "dsm-c1-t0 acquiring lock 7 (for 0.1 s)"));
    for c in &controls {
        assert_eq!(c.wait_failure(Duration::from_millis(300)), None);
    }
    let t0 = Instant::now();
    controls[1].report_progress(stall(600, "dsm-c1-t0 acquiring lock 7 (for 0.6 s)"));
    for (c, (f, took)) in controls
        .iter()
        .zip(learn(&controls, t0, Duration::from_millis(500)))
    {
        assert_eq!(f.cluster, 0, "cluster {}: {f}", c.cluster());
        for what in [
            "no progress for",
            "job.progress_timeout_ms",
            "cluster 0: dsm-c0-t0 at a barrier",
            "cluster 1: dsm-c1-t0 acquiring lock 7",
            "cluster 2: dsm-c2-t0 at a barrier",
        ] {
            assert!(f.reason.contains(what), "cluster {}: {f}", c.cluster());
        }
        eprintln!("cluster {} learned the stall after {took:?}", c.cluster());
    }
}

/// With the watchdog off (0), stall reports change nothing.
#[test]
fn stall_reports_are_ignored_when_the_watchdog_is_off() {
    let controls = join_all(2, &settings(28, 3_000));
    assert_eq!(controls[0].progress_timeout(), None);
    for c in &controls {
        c.report_progress(stall(1_000_000, "a thread at a barrier"));
    }
    for c in &controls {
        assert_eq!(c.wait_failure(Duration::from_millis(300)), None);
    }
}

/// After the bootstrap a member's frames must carry the MAC: once it has sent one
/// authenticated frame, a frame without a MAC, or with one under another secret, ends
/// its connection as a bad frame — the forged `Abort` is never taken for the member's.
#[test]
fn unauthenticated_or_forged_frames_after_the_bootstrap_are_refused() {
    use multigrain_control::Secret;
    use multigrain_control::wire::{Auth, Received};
    for (forger, expect) in [
        (None, "without a MAC"),
        (Some(Secret::from_bytes([7; 32])), "does not verify"),
    ] {
        let key = 28;
        let s = settings(key, 5_000);
        let addr = coordinator_addr();
        let mut pending = join_on_threads(2, addr, &s, &[1]);
        let deadline = Instant::now() + HANG;
        let mut member = loop {
            match TcpStream::connect(addr) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("no coordinator at {addr}: {e}"),
            }
        };
        let register = Message::Register {
            registration: Registration::local(1, Vec::new()),
            clusters: 2,
        };
        wire::write_frame(&mut member, key, None, &register).expect("register by hand");
        let secret = loop {
            match wire::read_frame(&mut member, key, Auth::NONE).expect("a frame") {
                Received {
                    msg: Message::Welcome { secret, .. },
                    authenticated: false,
                } => break secret.expect("the bootstrap hands out the secret"),
                _ => continue,
            }
        };
        let (_, rx) = pending.pop().unwrap();
        let (control, _) = wait(&rx, "join of cluster 0").expect("cluster 0 joins");
        assert_eq!(control.session().secret, secret);
        wire::write_frame(&mut member, key, Some(&secret), &Message::Heartbeat)
            .expect("an authenticated heartbeat");
        let forged = Message::Abort {
            reason: "forged abort".into(),
        };
        wire::write_frame(&mut member, key, forger.as_ref(), &forged).expect("forged frame");
        let f = control
            .wait_failure(HANG)
            .expect("the forged frame ends the member's connection");
        assert_eq!(f.cluster, 1, "{f}");
        assert!(f.reason.contains("bad control frame"), "{f}");
        assert!(f.reason.contains(expect), "{f}");
        assert!(!f.reason.contains("forged abort"), "{f}");
        drop(member);
    }
}
