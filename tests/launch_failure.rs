//! Failures of a launched job, with real processes: a cluster that fails,
//! a cluster killed with SIGKILL (a member and the coordinator), stragglers
//! that ignore the failure, Ctrl-C to the launcher, and SIGKILL of the
//! launcher itself. After each, no process of the job may be left.

mod common;

use std::time::{Duration, Instant};

use common::{
    HANG, Stream, TempDir, assert_gone, assert_no_segments, launch, launched_pids, local_config,
};

/// The peer timeout of these jobs.
const PEER: Duration = Duration::from_millis(1000);

#[test]
fn failing_cluster_fails_every_cluster_and_the_launch() {
    let dir = TempDir::new("launch-fail");
    let config = local_config(&dir, "fail", 3, 1, PEER.as_millis() as u64);
    let mut job = launch("fail", &config, &[], &["multigrain", "hello", "--fail=1"]);
    let pids = launched_pids(&job, 3);
    job.adopt(&pids);
    let status = job.wait_exit(HANG);
    assert_eq!(status.code(), Some(1), "output:\n{}", job.transcript());
    let err = job.lines(Stream::Err);
    let has = |s: &str| err.iter().any(|l| l.contains(s));
    assert!(
        has("[c1] multigrain: error: cluster 1: failing on purpose"),
        "{err:#?}"
    );
    for c in [0, 2] {
        assert!(
            has(&format!(
                "[c{c}] multigrain: error: cluster 1 failed: failing on purpose (multigrain hello --fail)"
            )),
            "cluster {c}: {err:#?}"
        );
    }
    let summary = err.last().expect("a summary");
    assert_eq!(
        summary,
        &format!(
            "multigrain: error: 3 of 3 clusters failed: cluster 1 (pid {} on 127.0.0.1) exited \
             with code 1; clusters 0, 2 then stopped because another cluster failed (exit code 3)",
            pids[1]
        ),
    );
    assert_gone(&pids, HANG, "fail job");
}

/// A launched job of `clusters` × 1 thread running `multigrain hello --sleep-ms 60000`,
/// once every cluster said hello: the launch, the cluster pids (adopted), and the
/// directory of its config (kept alive by the caller).
fn sleeping_job(dir_tag: &str, name: &str, clusters: usize) -> (common::Proc, Vec<i32>, TempDir) {
    let dir = TempDir::new(dir_tag);
    let config = local_config(&dir, name, clusters, 1, PEER.as_millis() as u64);
    let mut job = launch(
        name,
        &config,
        &[],
        &["multigrain", "hello", "--sleep-ms", "60000"],
    );
    let pids = launched_pids(&job, clusters);
    job.adopt(&pids);
    for c in 0..clusters {
        job.wait_line(
            &format!("[c{c}] cluster {c} of {clusters}: hello from pid"),
            HANG,
        );
    }
    (job, pids, dir)
}

fn kill_one(victim: usize) {
    let name = format!("kill-{victim}");
    let (mut job, pids, _dir) = sleeping_job("launch-kill", &name, 3);
    let t0 = Instant::now();
    // SAFETY: kill(2) on a cluster process this test's launcher started and
    // that is still running (it printed its hello and sleeps).
    assert_eq!(unsafe { libc::kill(pids[victim], libc::SIGKILL) }, 0);
    let expected = if victim == 0 {
        "cluster 0 failed: cluster 0 (the coordinator) died"
    } else {
        "cluster 2 failed: its control connection closed before it finished"
    };
    for c in (0..3).filter(|&c| c != victim) {
        let (line, at) = job.wait_line(&format!("[c{c}] multigrain: error: {expected}"), HANG);
        let took = at - t0;
        eprintln!("{name}: cluster {c} reported the death after {took:?}: {line}");
        assert!(
            took <= PEER + Duration::from_millis(500),
            "{name}: cluster {c} reported after {took:?}, peer timeout {PEER:?}"
        );
    }
    let status = job.wait_exit(HANG);
    let took = t0.elapsed();
    eprintln!("{name}: launch exited after {took:?}");
    assert_eq!(status.code(), Some(1), "output:\n{}", job.transcript());
    assert!(took < PEER + Duration::from_secs(2), "launch took {took:?}");
    let summary = job.lines(Stream::Err).last().cloned().unwrap_or_default();
    let others: Vec<String> = (0..3)
        .filter(|&c| c != victim)
        .map(|c| c.to_string())
        .collect();
    assert_eq!(
        summary,
        format!(
            "multigrain: error: 3 of 3 clusters failed: cluster {victim} (pid {} on 127.0.0.1) was \
             killed by signal 9 (SIGKILL); clusters {} then stopped because another cluster \
             failed (exit code 3)",
            pids[victim],
            others.join(", ")
        ),
    );
    assert_gone(&pids, HANG, &name);
    assert_no_segments(&pids, &name);
}

#[test]
fn sigkill_of_a_member_is_reported_by_the_others() {
    kill_one(2);
}

#[test]
fn sigkill_of_the_coordinator_is_reported_by_the_others() {
    kill_one(0);
}

/// Commands that know nothing of the control plane keep running after a
/// cluster fails; launch stops them peer_timeout + grace later.
#[test]
fn stragglers_are_stopped_after_peer_timeout_and_grace() {
    let dir = TempDir::new("launch-straggle");
    let config = local_config(&dir, "straggle", 3, 1, 500);
    let script = "if [ \"$MULTIGRAIN_CLUSTER_ID\" = 1 ]; then sleep 0.3; exit 5; fi; \
                  trap '' TERM; echo ready; sleep 60";
    let t0 = Instant::now();
    let mut job = launch(
        "straggle",
        &config,
        &["--grace-ms", "300"],
        &["sh", "-c", script],
    );
    let pids = launched_pids(&job, 3);
    job.adopt(&pids);
    let status = job.wait_exit(HANG);
    let took = t0.elapsed();
    assert_eq!(status.code(), Some(1), "output:\n{}", job.transcript());
    // 0.3 s + peer 0.5 s + grace 0.3 s (SIGTERM, ignored) + grace 0.3 s (SIGKILL).
    assert!(took >= Duration::from_millis(1300), "{took:?}");
    assert!(took < Duration::from_secs(6), "{took:?}");
    let err = job.lines(Stream::Err).join("\n");
    assert!(
        err.contains("cluster(s) 0, 2 still running 800 ms after cluster 1 failed"),
        "{err}"
    );
    let summary = job.lines(Stream::Err).last().cloned().unwrap_or_default();
    assert!(
        summary.starts_with(&format!(
            "multigrain: error: 3 of 3 clusters failed: cluster 1 (pid {} on 127.0.0.1) exited \
             with code 5; ",
            pids[1]
        )),
        "{summary}"
    );
    assert!(
        err.contains("was killed by signal 9 (SIGKILL) by launch"),
        "{err}"
    );
    assert_gone(&pids, HANG, "straggler job");
}

#[test]
fn sigint_to_launch_stops_every_cluster() {
    let (mut job, pids, _dir) = sleeping_job("launch-sigint", "sigint", 2);
    let t0 = Instant::now();
    job.signal(libc::SIGINT);
    let status = job.wait_exit(HANG);
    let took = t0.elapsed();
    assert_eq!(status.code(), Some(130), "output:\n{}", job.transcript());
    assert!(
        took < Duration::from_secs(3),
        "launch took {took:?} to stop"
    );
    let err = job.lines(Stream::Err).join("\n");
    assert!(
        err.contains("SIGINT received: stopping every cluster"),
        "{err}"
    );
    assert!(err.contains("stopped by SIGINT"), "{err}");
    assert_gone(&pids, Duration::from_secs(5), "SIGINT job");
}

#[test]
fn sigterm_to_launch_kills_clusters_that_ignore_sigterm() {
    let dir = TempDir::new("launch-sigterm");
    let config = local_config(&dir, "sigterm", 2, 1, PEER.as_millis() as u64);
    let script = "trap '' TERM; echo ready; sleep 60";
    let mut job = launch(
        "sigterm",
        &config,
        &["--grace-ms", "300"],
        &["sh", "-c", script],
    );
    let pids = launched_pids(&job, 2);
    job.adopt(&pids);
    job.wait_line("[c0] ready", HANG);
    job.wait_line("[c1] ready", HANG);
    job.signal(libc::SIGTERM);
    let status = job.wait_exit(HANG);
    assert_eq!(status.code(), Some(143), "output:\n{}", job.transcript());
    let err = job.lines(Stream::Err).join("\n");
    for (c, pid) in pids.iter().enumerate() {
        assert!(
            err.contains(&format!(
                "cluster {c} (pid {pid} on 127.0.0.1) was killed by signal 9 (SIGKILL) by launch"
            )),
            "{err}"
        );
    }
    assert_gone(&pids, Duration::from_secs(5), "SIGTERM job");
}

#[test]
fn sigkill_of_launch_takes_the_clusters_down() {
    let (mut job, pids, _dir) = sleeping_job("launch-sigkill", "orphans", 2);
    job.signal(libc::SIGKILL);
    let status = job.wait_exit(HANG);
    assert_eq!(status.code(), None, "killed by a signal");
    assert_gone(
        &pids,
        Duration::from_secs(3),
        "clusters of a SIGKILLed launcher",
    );
}

/// A paused cluster (SIGSTOP past the peer timeout) is the one that failed: the others
/// report it silent and stop because of it; once resumed, it learns from the
/// coordinator's message, still in its socket, that the job declared it dead — it does
/// not blame the coordinator whose connection it then finds closed — and the launch's
/// summary names it as the cause.
#[test]
fn a_paused_cluster_is_named_as_the_cause() {
    let (mut job, pids, _dir) = sleeping_job("launch-pause", "pause", 3);
    // SAFETY: kill(2) on a cluster process this test's launcher started and that is
    // still running (it printed its hello and sleeps).
    assert_eq!(unsafe { libc::kill(pids[2], libc::SIGSTOP) }, 0);
    for c in [0, 1] {
        job.wait_line(
            &format!("[c{c}] multigrain: error: cluster 2 failed: nothing heard from it"),
            HANG,
        );
    }
    // SAFETY: as above; the process is stopped, SIGCONT resumes it.
    assert_eq!(unsafe { libc::kill(pids[2], libc::SIGCONT) }, 0);
    let status = job.wait_exit(HANG);
    assert_eq!(status.code(), Some(1), "output:\n{}", job.transcript());
    let err = job.lines(Stream::Err);
    assert!(
        !err.iter()
            .any(|l| l.starts_with("[c2]") && l.contains("(the coordinator) died")),
        "the resumed cluster blamed the coordinator: {err:#?}"
    );
    let summary = err.last().cloned().unwrap_or_default();
    assert!(
        summary.starts_with(&format!(
            "multigrain: error: 3 of 3 clusters failed: cluster 2 (pid {} on 127.0.0.1)",
            pids[2]
        )) && summary
            .ends_with("clusters 0, 1 then stopped because another cluster failed (exit code 3)"),
        "{summary}\n{}",
        job.transcript()
    );
    assert_gone(&pids, HANG, "pause");
}

/// Explicit clusters on 127.0.0.1 with `ports` (0: any), a 5 s peer timeout (so that a
/// survivor that waits for the coordinator's silence, or the launcher's straggler stop,
/// takes well over the bound these tests assert) and a 20 s start-up timeout.
fn fixed_config(dir: &TempDir, name: &str, ports: &[u16]) -> std::path::PathBuf {
    let mut text = format!(
        "[job]\nname = \"{name}\"\nstartup_timeout_ms = 20000\npeer_timeout_ms = 5000\n\n\
         [ini]\nsubstrate = \"udp\"\n"
    );
    for port in ports {
        text.push_str(&format!(
            "\n[[cluster]]\nhost = \"127.0.0.1\"\nport = {port}\nthreads = 1\n"
        ));
    }
    dir.write("job.toml", &text)
}

/// How long after the first cluster's failure every survivor must have reported it and
/// every process must be gone: the 1 s the issue asks for, plus room for a loaded
/// 2-core machine (measured values are printed).
const EARLY_BOUND: Duration = Duration::from_secs(3);

/// Issue 13, "fast failure before registration": cluster 0's coordinator port is taken
/// (by another job's coordinator, here a listener of this test), so cluster 0 fails
/// before anyone registers and cannot even refuse the members. Cluster 1 never hears from
/// it (it connects to the other listener, which never answers): only the launcher knows,
/// and it tells cluster 1, which stops naming cluster 0 instead of waiting for the peer
/// timeout (5 s) or the launcher's straggler stop.
#[test]
fn coordinator_port_clash_is_reported_by_the_member_at_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
    let port = taken.local_addr().expect("its address").port();
    let dir = TempDir::new("launch-early-c0");
    let config = fixed_config(&dir, "early-c0", &[port, 0]);
    let mut job = launch("early-c0", &config, &[], &["multigrain", "hello"]);
    let pids = launched_pids(&job, 2);
    job.adopt(&pids);
    let (line, failed) = job.wait_line("[c0] multigrain: error:", HANG);
    assert!(
        line.contains(&format!("TCP port {port} is in use")),
        "cluster 0 should name its port: {line}"
    );
    let (line, told) = job.wait_line(
        "[c1] multigrain: error: cluster 0 failed before the job started: cluster 0 (pid",
        HANG,
    );
    let status = job.wait_exit(HANG);
    let gone = Instant::now();
    eprintln!(
        "early-c0: cluster 1 reported cluster 0's failure {:?} after it, launch exited {:?} \
         after it: {line}",
        told.saturating_duration_since(failed),
        gone.saturating_duration_since(failed)
    );
    assert!(
        told.saturating_duration_since(failed) < EARLY_BOUND,
        "cluster 1 took {:?}; output:\n{}",
        told.saturating_duration_since(failed),
        job.transcript()
    );
    assert!(
        gone.saturating_duration_since(failed) < EARLY_BOUND,
        "launch exited {:?} after cluster 0 failed",
        gone.saturating_duration_since(failed)
    );
    assert_eq!(status.code(), Some(1), "output:\n{}", job.transcript());
    let summary = job.lines(Stream::Err).last().cloned().unwrap_or_default();
    assert_eq!(
        summary,
        format!(
            "multigrain: error: 2 of 2 clusters failed: cluster 0 (pid {} on 127.0.0.1) exited \
             with code 1; cluster 1 then stopped because another cluster failed (exit code 3)",
            pids[0]
        ),
        "output:\n{}",
        job.transcript()
    );
    assert_gone(&pids, HANG, "early-c0 job");
    assert_no_segments(&pids, "early-c0 job");
    drop(taken);
}

/// Issue 13, "fast failure before registration": cluster 1's INI port is taken (a UDP
/// socket of this test), so it fails before it registers. It tells the coordinator why
/// (a cluster that reached it: the control plane's report), and every other cluster
/// reports that reason at once, naming cluster 1 and its port — also cluster 2, which
/// the launcher may start after the coordinator has already stopped (then the launcher's
/// notice, which carries cluster 1's last error line, tells it); the job is gone well
/// before the peer timeout.
#[test]
fn member_ini_port_clash_is_reported_by_every_cluster_at_once() {
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
    let port = taken.local_addr().expect("its address").port();
    let dir = TempDir::new("launch-early-c1");
    let config = fixed_config(&dir, "early-c1", &[0, port, 0]);
    let mut job = launch("early-c1", &config, &[], &["multigrain", "hello"]);
    let pids = launched_pids(&job, 3);
    job.adopt(&pids);
    let (line, failed) = job.wait_line("[c1] multigrain: error:", HANG);
    assert!(
        line.contains(&port.to_string()),
        "cluster 1 should name its port: {line}"
    );
    for c in [0, 2] {
        let (line, told) =
            job.wait_line(&format!("[c{c}] multigrain: error: cluster 1 failed"), HANG);
        let took = told.saturating_duration_since(failed);
        eprintln!("early-c1: cluster {c} reported cluster 1's failure {took:?} after it: {line}");
        assert!(
            line.contains(&format!(
                "cannot bind INI 0 of cluster 1 to 127.0.0.1:{port}"
            )),
            "cluster {c} should say why cluster 1 failed: {line}"
        );
        assert!(took < EARLY_BOUND, "cluster {c} took {took:?}");
    }
    let status = job.wait_exit(HANG);
    let took = failed.elapsed();
    eprintln!("early-c1: launch exited {took:?} after cluster 1 failed");
    assert!(
        took < EARLY_BOUND,
        "launch exited {took:?} after the failure"
    );
    assert_eq!(status.code(), Some(1), "output:\n{}", job.transcript());
    assert_gone(&pids, HANG, "early-c1 job");
    assert_no_segments(&pids, "early-c1 job");
    drop(taken);
}

/// As [`coordinator_port_clash_is_reported_by_the_member_at_once`] for `multigrain run`,
/// which starts its cluster processes through the same launcher: cluster 1 stops at once
/// naming cluster 0 and its error (with the causes: the port), and `run` fails.
#[test]
fn coordinator_port_clash_under_run_is_reported_by_the_member_at_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
    let port = taken.local_addr().expect("its address").port();
    let dir = TempDir::new("run-early-c0");
    let config = fixed_config(&dir, "run-early-c0", &[port, 0]);
    let mut cmd = std::process::Command::new(common::bin());
    cmd.args([
        "run",
        "water",
        "--molecules",
        "64",
        "--steps",
        "2",
        "--config",
    ])
    .arg(&config);
    for var in common::launch_vars() {
        cmd.env_remove(var);
    }
    let mut run = common::Proc::spawn("run-early-c0", cmd);
    let pids = launched_pids(&run, 2);
    run.adopt(&pids);
    let (_, failed) = run.wait_line("[c0] multigrain: error:", HANG);
    let (line, told) = run.wait_line(
        "[c1] multigrain: error: cluster 0 failed before the job started: cluster 0 (pid",
        HANG,
    );
    let status = run.wait_exit(HANG);
    let took = told.saturating_duration_since(failed);
    eprintln!(
        "run-early-c0: cluster 1 reported cluster 0's failure {took:?} after it, run exited \
         {:?} after it: {line}",
        failed.elapsed()
    );
    assert!(
        line.contains(&format!("TCP port {port} is in use")),
        "cluster 1 should say why cluster 0 failed: {line}"
    );
    assert!(took < EARLY_BOUND, "cluster 1 took {took:?}");
    assert!(
        failed.elapsed() < EARLY_BOUND,
        "run took {:?}",
        failed.elapsed()
    );
    assert_eq!(status.code(), Some(1), "output:\n{}", run.transcript());
    assert_gone(&pids, HANG, "run-early-c0 job");
    assert_no_segments(&pids, "run-early-c0 job");
    drop(taken);
}
