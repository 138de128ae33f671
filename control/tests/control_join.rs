//! Start-up of the control plane with threads acting as clusters: joins of
//! 1, 2 and 4 clusters, the configuration broadcast, start-up timeouts that
//! name the missing clusters, refused processes (other job key, duplicate
//! cluster id, other cluster count), barriers and finish, and the session (secret and
//! epoch) every cluster agrees on: bootstrapped by cluster 0, or from key files, with
//! clusters of another or no key refused.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use multigrain_cluster_config::JobSettings;
use multigrain_control::{
    Control, ControlError, Identity, Registration, Secret, free_loopback_port,
};

/// Every wait on a cluster thread is bounded by this.
const HANG: Duration = Duration::from_secs(30);

fn settings(key: u64, startup_ms: u64, peer_ms: u64) -> JobSettings {
    JobSettings {
        name: Some("control-test".into()),
        key,
        startup_timeout_ms: startup_ms,
        peer_timeout_ms: peer_ms,
        progress_timeout_ms: 0,
    }
}

fn coordinator_addr() -> SocketAddr {
    let port = free_loopback_port().expect("a free loopback port");
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn identity(cluster: usize, clusters: usize, coordinator: SocketAddr) -> Identity {
    Identity {
        cluster,
        clusters,
        coordinator,
        listen: None,
        placed: None,
        launcher: None,
        doubt: None,
        secret: None,
    }
}

type Joined = Result<(Control, Vec<Registration>), ControlError>;

/// Starts cluster `cluster` of `clusters` joining on its own thread.
fn start(
    cluster: usize,
    clusters: usize,
    addr: SocketAddr,
    s: &JobSettings,
) -> (Receiver<(Joined, Duration)>, usize) {
    start_with(cluster, clusters, addr, s, None)
}

/// [`start`], with `secret` as if read from a key file.
fn start_with(
    cluster: usize,
    clusters: usize,
    addr: SocketAddr,
    s: &JobSettings,
    secret: Option<Secret>,
) -> (Receiver<(Joined, Duration)>, usize) {
    let (tx, rx) = mpsc::channel();
    let s = s.clone();
    thread::Builder::new()
        .name(format!("cluster-{cluster}"))
        .spawn(move || {
            let t0 = Instant::now();
            let payload = format!("payload of cluster {cluster}").into_bytes();
            let id = Identity {
                secret,
                ..identity(cluster, clusters, addr)
            };
            let r = Control::join(&id, &s, Registration::local(cluster, payload));
            let _ = tx.send((r, t0.elapsed()));
        })
        .expect("spawn a cluster thread");
    (rx, cluster)
}

fn wait<T>(rx: &Receiver<T>, what: &str) -> T {
    rx.recv_timeout(HANG)
        .unwrap_or_else(|_| panic!("{what} did not return within {HANG:?}: it hangs"))
}

fn join_all(clusters: usize, s: &JobSettings) -> Vec<(Control, Vec<Registration>)> {
    let addr = coordinator_addr();
    let pending: Vec<_> = (0..clusters).map(|c| start(c, clusters, addr, s)).collect();
    pending
        .into_iter()
        .map(|(rx, c)| {
            let (r, _) = wait(&rx, &format!("join of cluster {c}"));
            r.unwrap_or_else(|e| panic!("cluster {c} failed to join: {e}"))
        })
        .collect()
}

/// Runs `f` on every control at once, each on its own thread.
fn on_each<T: Send + 'static>(
    controls: Vec<Control>,
    f: impl Fn(&Control) -> T + Send + Sync + 'static,
) -> Vec<(Control, T)> {
    let f = Arc::new(f);
    let pending: Vec<_> = controls
        .into_iter()
        .map(|c| {
            let (tx, rx) = mpsc::channel();
            let f = Arc::clone(&f);
            let id = c.cluster();
            thread::spawn(move || {
                let r = f(&c);
                let _ = tx.send((c, r));
            });
            (rx, id)
        })
        .collect();
    pending
        .into_iter()
        .map(|(rx, id)| wait(&rx, &format!("cluster {id}")))
        .collect()
}

fn check_join(clusters: usize) {
    let s = settings(0x1234_5678, 20_000, 3_000);
    let joined = join_all(clusters, &s);
    for (c, (control, regs)) in joined.iter().enumerate() {
        assert_eq!(control.cluster(), c);
        assert_eq!(control.clusters(), clusters);
        assert_eq!(regs.len(), clusters, "cluster {c} got {regs:?}");
        for (i, r) in regs.iter().enumerate() {
            assert_eq!(r.cluster, i);
            assert_eq!(r.payload, format!("payload of cluster {i}").into_bytes());
            assert_eq!(r.pid, std::process::id());
            assert!(r.same_machine(&regs[0]), "boot ids differ: {regs:?}");
            assert!(!r.host.is_empty());
        }
        assert_eq!(regs, &joined[0].1, "cluster {c} saw another broadcast");
        assert_eq!(
            control.session(),
            joined[0].0.session(),
            "cluster {c} agreed on another secret or epoch"
        );
        assert_ne!(control.session().epoch, 0);
        assert!(control.failure().is_none());
    }
    let controls = joined.into_iter().map(|(c, _)| c).collect();
    for (c, r) in on_each(controls, |c| c.finish(Duration::from_secs(20))) {
        r.unwrap_or_else(|e| panic!("finish of cluster {}: {e}", c.cluster()));
        assert!(c.failure().is_none(), "cluster {}", c.cluster());
    }
}

#[test]
fn join_one_cluster() {
    check_join(1);
}

#[test]
fn join_two_clusters() {
    check_join(2);
}

#[test]
fn join_four_clusters() {
    check_join(4);
}

#[test]
fn startup_timeout_names_the_missing_clusters() {
    let timeout = Duration::from_millis(1500);
    let s = settings(7, timeout.as_millis() as u64, 1_000);
    let addr = coordinator_addr();
    // Clusters 2 and 3 of 4 are never started.
    let pending = [start(0, 4, addr, &s), start(1, 4, addr, &s)];
    for (rx, c) in pending {
        let (r, took) = wait(&rx, &format!("join of cluster {c}"));
        let e = r.expect_err("start-up cannot complete");
        let text = e.to_string();
        assert!(
            matches!(e, ControlError::StartupTimeout { .. }),
            "cluster {c}: {text}"
        );
        assert!(
            text.contains("clusters 2, 3 never registered"),
            "cluster {c}: {text}"
        );
        assert!(took >= timeout - Duration::from_millis(100), "{took:?}");
        assert!(
            took <= timeout + Duration::from_millis(1000),
            "cluster {c} took {took:?} with a {timeout:?} start-up timeout"
        );
    }
}

#[test]
fn member_without_coordinator_names_cluster_0() {
    let timeout = Duration::from_millis(800);
    let s = settings(7, timeout.as_millis() as u64, 1_000);
    let (rx, _) = start(1, 2, coordinator_addr(), &s);
    let (r, took) = wait(&rx, "join of cluster 1");
    let text = r.expect_err("nobody listens").to_string();
    assert!(
        text.contains("could not reach the coordinator (cluster 0)"),
        "{text}"
    );
    assert!(took <= timeout + Duration::from_millis(1000), "{took:?}");
}

#[test]
fn process_of_another_job_is_refused() {
    let s = settings(0xaaaa, 20_000, 3_000);
    let addr = coordinator_addr();
    let (coord, _) = start(0, 2, addr, &s);
    // A stray that speaks garbage is ignored.
    let deadline = Instant::now() + HANG;
    let mut garbage = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("coordinator never listened at {addr}: {e}"),
        }
    };
    garbage
        .write_all(b"GET / HTTP/1.0\r\n\r\n")
        .expect("write garbage");
    // A process of another job (other key) claiming cluster 1 is refused.
    let other = settings(0xbbbb, 5_000, 3_000);
    let (stray, _) = start(1, 2, addr, &other);
    let (r, took) = wait(&stray, "join of the stray");
    let e = r.expect_err("another job's process must not join");
    let text = e.to_string();
    assert!(matches!(e, ControlError::ForeignJob { .. }), "{text}");
    assert!(text.contains("belongs to another job"), "{text}");
    assert!(text.contains("0x000000000000aaaa"), "{text}");
    assert!(took < Duration::from_secs(4), "refusal took {took:?}");
    // The real cluster 1 still joins.
    let (member, _) = start(1, 2, addr, &s);
    let (m, _) = wait(&member, "join of cluster 1");
    let (c, _) = wait(&coord, "join of cluster 0");
    let (m, regs) = m.expect("cluster 1 joins");
    let (c, _) = c.expect("cluster 0 joins");
    assert_eq!(regs.len(), 2);
    for (ctl, r) in on_each(vec![c, m], |c| c.finish(HANG)) {
        r.unwrap_or_else(|e| panic!("cluster {}: {e}", ctl.cluster()));
    }
}

#[test]
fn duplicate_cluster_and_wrong_size_are_refused() {
    let s = settings(5, 20_000, 3_000);
    let addr = coordinator_addr();
    let (coord, _) = start(0, 3, addr, &s);
    let (first, _) = start(1, 3, addr, &s);
    thread::sleep(Duration::from_millis(400));
    let (dup, _) = start(1, 3, addr, &s);
    let (r, _) = wait(&dup, "join of the duplicate cluster 1");
    let text = r.expect_err("a second cluster 1 is refused").to_string();
    assert!(text.contains("already registered"), "{text}");
    assert!(
        text.contains("two processes were started as cluster 1"),
        "{text}"
    );
    let (wrong, _) = start(2, 5, addr, &s);
    let (r, _) = wait(&wrong, "join of a cluster with another size");
    let text = r.expect_err("another cluster count is refused").to_string();
    assert!(text.contains("believes the job has 5 clusters"), "{text}");
    let (last, _) = start(2, 3, addr, &s);
    let mut controls = Vec::new();
    for (rx, c) in [(coord, 0), (first, 1), (last, 2)] {
        let (r, _) = wait(&rx, &format!("join of cluster {c}"));
        controls.push(r.unwrap_or_else(|e| panic!("cluster {c}: {e}")).0);
    }
    for (ctl, r) in on_each(controls, |c| c.finish(HANG)) {
        r.unwrap_or_else(|e| panic!("cluster {}: {e}", ctl.cluster()));
    }
}

#[test]
fn barrier_holds_everyone_until_all_arrive() {
    let n = 4;
    let s = settings(9, 20_000, 3_000);
    let controls: Vec<Control> = join_all(n, &s).into_iter().map(|(c, _)| c).collect();
    let arrived = Arc::new(Mutex::new(vec![0usize; 3]));
    let seen = Arc::clone(&arrived);
    let results = on_each(controls, move |c| {
        let mut log = Vec::new();
        for (round, tag) in [1u32, 2, 2].into_iter().enumerate() {
            if c.cluster() == n - 1 {
                thread::sleep(Duration::from_millis(150));
            }
            seen.lock().unwrap()[round] += 1;
            c.barrier(tag, HANG)?;
            log.push(seen.lock().unwrap()[round]);
        }
        c.finish(HANG)?;
        Ok::<_, ControlError>(log)
    });
    for (c, r) in results {
        let log = r.unwrap_or_else(|e| panic!("cluster {}: {e}", c.cluster()));
        assert_eq!(
            log,
            vec![n; 3],
            "cluster {} left a barrier before everyone arrived",
            c.cluster()
        );
    }
    assert_eq!(*arrived.lock().unwrap(), vec![n; 3]);
}

#[test]
fn barrier_timeout_names_the_missing_cluster() {
    let s = settings(11, 20_000, 3_000);
    let mut joined = join_all(3, &s).into_iter().map(|(c, _)| c);
    let (c0, c1, c2) = (
        joined.next().unwrap(),
        joined.next().unwrap(),
        joined.next().unwrap(),
    );
    let t1 = thread::spawn(move || {
        let r = c1.barrier(4, HANG);
        (c1, r)
    });
    thread::sleep(Duration::from_millis(200));
    let e = c0
        .barrier(4, Duration::from_millis(300))
        .expect_err("cluster 2 never arrives");
    let text = e.to_string();
    assert!(
        text.contains("barrier 4 was not reached by cluster 2"),
        "{text}"
    );
    // Cluster 2 arrives late; the barrier still completes for everyone.
    c2.barrier(4, HANG).expect("cluster 2 passes");
    let (c1, r) = t1.join().expect("cluster 1 thread");
    r.expect("cluster 1 passes");
    for (ctl, r) in on_each(vec![c0, c1, c2], |c| c.finish(HANG)) {
        r.unwrap_or_else(|e| panic!("cluster {}: {e}", ctl.cluster()));
    }
}

#[test]
fn finish_waits_for_every_cluster() {
    let s = settings(13, 20_000, 3_000);
    let controls: Vec<Control> = join_all(3, &s).into_iter().map(|(c, _)| c).collect();
    let t0 = Instant::now();
    let results = on_each(controls, move |c| {
        if c.cluster() == 1 {
            thread::sleep(Duration::from_millis(400));
        }
        let r = c.finish(HANG);
        (r, t0.elapsed())
    });
    for (c, (r, took)) in results {
        r.unwrap_or_else(|e| panic!("cluster {}: {e}", c.cluster()));
        assert!(
            took >= Duration::from_millis(390),
            "cluster {} finished after {took:?}, before cluster 1 did",
            c.cluster()
        );
        assert!(c.failure().is_none());
        assert!(matches!(
            c.barrier(1, HANG),
            Err(ControlError::Finished { .. })
        ));
        // A second finish returns at once.
        c.finish(Duration::from_millis(1)).expect("finish again");
    }
}

#[test]
fn finish_timeout_names_the_missing_cluster() {
    let s = settings(15, 20_000, 3_000);
    let mut controls = join_all(2, &s).into_iter().map(|(c, _)| c);
    let (c0, c1) = (controls.next().unwrap(), controls.next().unwrap());
    let text = c0
        .finish(Duration::from_millis(300))
        .expect_err("cluster 1 never finishes")
        .to_string();
    assert!(
        text.contains("cluster 1 did not finish within 300 ms"),
        "{text}"
    );
    c1.finish(HANG).expect("cluster 1 finishes");
    c0.finish(HANG).expect("cluster 0 is done now");
}

/// Joins `secrets.len()` clusters, cluster `c` with `secrets[c]` as its key file.
fn join_with(secrets: Vec<Option<Secret>>, s: &JobSettings) -> Vec<(Joined, usize)> {
    let addr = coordinator_addr();
    let n = secrets.len();
    let pending: Vec<_> = secrets
        .into_iter()
        .enumerate()
        .map(|(c, k)| start_with(c, n, addr, s, k))
        .collect();
    pending
        .into_iter()
        .map(|(rx, c)| (wait(&rx, &format!("join of cluster {c}")).0, c))
        .collect()
}

/// Without key files, cluster 0 hands out one fresh secret and epoch per run; every
/// later frame is authenticated (barriers and finish still work).
#[test]
fn bootstrapped_sessions_are_fresh_per_run() {
    let s = settings(0x55, 20_000, 3_000);
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let joined = join_all(3, &s);
        let first = joined[0].0.session().clone();
        for (c, _) in &joined {
            assert_eq!(c.session(), &first, "cluster {}", c.cluster());
        }
        let controls = joined.into_iter().map(|(c, _)| c).collect();
        for (c, r) in on_each(controls, |c| {
            c.barrier(7, HANG)?;
            c.finish(HANG)
        }) {
            r.unwrap_or_else(|e| panic!("cluster {}: {e}", c.cluster()));
        }
        sessions.push(first);
    }
    assert_ne!(sessions[0].secret, sessions[1].secret);
    assert_ne!(sessions[0].epoch, sessions[1].epoch);
}

/// With the same key file everywhere, the session's secret is the file's and the epoch
/// is still fresh.
#[test]
fn key_file_secret_is_the_session_secret() {
    let s = settings(0x56, 20_000, 3_000);
    let key = Secret::generate().unwrap();
    let joined = join_with(vec![Some(key.clone()); 3], &s);
    let controls: Vec<Control> = joined
        .into_iter()
        .map(|(r, c)| r.unwrap_or_else(|e| panic!("cluster {c}: {e}")).0)
        .collect();
    for c in &controls {
        assert_eq!(c.session().secret, key);
        assert_eq!(c.session().epoch, controls[0].session().epoch);
    }
    for (c, r) in on_each(controls, |c| {
        c.barrier(3, HANG)?;
        c.finish(HANG)
    }) {
        r.unwrap_or_else(|e| panic!("cluster {}: {e}", c.cluster()));
    }
}

/// A member with another key file, or none, cannot join a job whose coordinator has a
/// key file; each is told why.
#[test]
fn members_with_another_or_no_key_are_refused() {
    let s = settings(0x57, 1_500, 1_000);
    let key = Secret::generate().unwrap();
    for (member, expect) in [
        (Some(Secret::generate().unwrap()), "MAC does not verify"),
        (None, "this process has no job secret"),
    ] {
        let joined = join_with(vec![Some(key.clone()), member], &s);
        let (member_result, _) = &joined[1];
        let e = member_result.as_ref().expect_err("member must be refused");
        assert!(e.to_string().contains(expect), "{e}");
        assert!(
            joined[0].0.is_err(),
            "the coordinator cannot complete start-up"
        );
    }
}
