//! End-to-end tests of the inter-cluster path with real cluster processes: `multigrain
//! selftest` under `multigrain launch` sends Express and 4 KiB Tag-On messages all-to-all and
//! verifies every one (exactly once, in order per sender thread and destination queue,
//! intact) — through INIs over UDP on loopback, through shared memory, with injected
//! datagram faults, between two network namespaces joined by a veth pair, and with a
//! cluster killed mid-run.

mod common;

use common::{HANG, Proc, Stream, TempDir, assert_gone, launch, launched_pids};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Selftests are heavier than `hello`: allow more time on a loaded 2-core machine.
const RUN: Duration = Duration::from_secs(240);

fn config(dir: &TempDir, clusters: usize, threads: usize, extra: &str) -> std::path::PathBuf {
    dir.write("job.toml", &format!("[job]\nstartup_timeout_ms = 30000\npeer_timeout_ms = 3000\n[local]\nclusters = {clusters}\nthreads = {threads}\n{extra}"))
}

/// Runs `selftest` on `cfg` and checks that every cluster verified its messages.
fn selftest_passes(name: &str, cfg: &Path, clusters: usize, args: &[&str]) -> Proc {
    // The selftest gives up before the test does, so that a stall is reported by the
    // stuck cluster with what it waits for.
    let mut cmd = vec!["multigrain", "selftest", "--timeout-s", "200"];
    cmd.extend_from_slice(args);
    let mut p = launch(name, cfg, &[], &cmd);
    let status = p.wait_exit(RUN);
    assert!(
        status.success(),
        "{name}: launch failed ({status}):\n{}",
        p.transcript()
    );
    let done = p
        .lines(Stream::Out)
        .into_iter()
        .filter(|l| l.contains("each exactly once and in order"))
        .count();
    assert_eq!(
        done,
        clusters,
        "{name}: every cluster must verify its messages:\n{}",
        p.transcript()
    );
    p
}

#[test]
fn two_clusters_of_two_threads_through_inis() {
    let dir = TempDir::new("e2e-2x2");
    let cfg = config(&dir, 2, 2, "[ini]\nsubstrate = \"udp\"\nmtu = 8972\n");
    let p = selftest_passes(
        "2x2 udp",
        &cfg,
        2,
        &["--express", "100000", "--tag-on", "10000", "--stats"],
    );
    let t = p.transcript();
    assert!(
        t.contains("received 100000 Express and 10000 Tag-On messages from 1 cluster(s)"),
        "{t}"
    );
    assert!(
        t.contains("links 1:Network") && t.contains("c0/ini0"),
        "{t}"
    );
}

#[test]
fn four_clusters_through_inis_with_two_inis_round_robin() {
    let dir = TempDir::new("e2e-4x1");
    let cfg = config(
        &dir,
        4,
        1,
        "[ini]\nsubstrate = \"udp\"\nper_cluster = 2\npolicy = \"round-robin\"\nmtu = 8972\n",
    );
    let p = selftest_passes(
        "4x1 udp 2 INIs round-robin",
        &cfg,
        4,
        &["--express", "100000", "--tag-on", "10000"],
    );
    assert!(
        p.transcript()
            .contains("received 300000 Express and 30000 Tag-On messages from 3 cluster(s)")
    );
}

#[test]
fn clusters_on_one_machine_use_shared_memory() {
    let dir = TempDir::new("e2e-shm");
    let cfg = config(&dir, 2, 2, "[ini]\nsubstrate = \"auto\"\n");
    let p = selftest_passes(
        "2x2 shm",
        &cfg,
        2,
        &["--express", "100000", "--tag-on", "10000"],
    );
    assert!(p.transcript().contains("links 1:Shm"), "{}", p.transcript());
}

#[test]
fn injected_datagram_faults_lose_nothing() {
    let dir = TempDir::new("e2e-faults");
    let cfg = config(
        &dir,
        2,
        1,
        "[ini]\nsubstrate = \"udp\"\n[faults]\ndrop = 0.1\ncorrupt = 0.01\nduplicate = 0.05\nreorder = 0.05\nseed = 9\n",
    );
    let json = dir.path().join("stats.json");
    let json_arg = json.to_str().expect("utf-8 path").to_owned();
    let p = selftest_passes(
        "faults",
        &cfg,
        2,
        &[
            "--express",
            "20000",
            "--tag-on",
            "2000",
            "--stats-json",
            &json_arg,
        ],
    );
    drop(p);
    // Both clusters wrote the same path; whichever wrote last, its INI counted the work.
    let text = std::fs::read_to_string(&json).expect("stats JSON written");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let ini = &v[0];
    assert!(
        ini["window"]["connections"]["retransmissions"]
            .as_u64()
            .unwrap()
            > 0,
        "{text}"
    );
    assert!(ini["injected"]["dropped"].as_u64().unwrap() > 0, "{text}");
    // A corrupted datagram fails the MAC, or (a flipped magic, version or epoch bit) an
    // earlier check.
    let rejected = ["bad_mac", "decode_failures", "wrong_epoch"]
        .iter()
        .map(|k| ini["window"][*k].as_u64().unwrap())
        .sum::<u64>();
    assert!(
        rejected > 0,
        "corrupted datagrams are rejected and counted: {text}"
    );
}

#[test]
fn a_killed_cluster_is_reported_by_the_others() {
    let dir = TempDir::new("e2e-kill");
    let cfg = dir.write(
        "job.toml",
        "[job]\nstartup_timeout_ms = 30000\npeer_timeout_ms = 1000\n[local]\nclusters = 3\nthreads = 1\n[ini]\nsubstrate = \"udp\"\n",
    );
    let mut p = launch(
        "kill",
        &cfg,
        &[],
        &[
            "multigrain",
            "selftest",
            "--express",
            "100000000",
            "--tag-on",
            "0",
        ],
    );
    let pids = launched_pids(&p, 3);
    // Let traffic flow, then kill cluster 1 outright.
    std::thread::sleep(Duration::from_millis(1500));
    let killed_at = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[1]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill cluster 1");
    let status = p.wait_exit(HANG);
    assert!(!status.success(), "launch must fail:\n{}", p.transcript());
    let t = p.transcript();
    for c in [0, 2] {
        let (line, at) = p.wait_line(
            &format!("[c{c}] multigrain: error: cluster 1"),
            Duration::from_secs(1),
        );
        assert!(
            at.duration_since(killed_at) < Duration::from_millis(1000 + 500),
            "cluster {c} reported late: {line}\n{t}"
        );
    }
    assert!(t.contains("cluster 1"), "{t}");
    assert_gone(&pids, HANG, "cluster processes");
}

#[test]
fn two_network_namespaces_joined_by_a_veth_pair() {
    let tag = std::process::id() % 100_000;
    let (ns, addrs) = match common::Netns::create(tag) {
        Ok(v) => v,
        Err(why) => {
            println!(
                "SKIPPED two_network_namespaces_joined_by_a_veth_pair: {why}; the loopback tests above cover the INI path"
            );
            return;
        }
    };
    let dir = TempDir::new("e2e-netns");
    let port = 40_000 + (tag % 20_000) as u16;
    let cfg = dir.write(
        "job.toml",
        &format!(
            "[job]\nstartup_timeout_ms = 30000\npeer_timeout_ms = 3000\n[[cluster]]\nhost = \"{}\"\nport = {port}\nthreads = 2\n[[cluster]]\nhost = \"{}\"\nport = {port}\nthreads = 2\n[ini]\nsubstrate = \"udp\"\n",
            addrs[0], addrs[1]
        ),
    );
    // Each cluster runs in its own namespace, started as Slurm would (rank variables).
    let mut procs: Vec<Proc> = (0..2)
        .map(|c| {
            let mut cmd = Command::new("ip");
            cmd.args([
                "netns",
                "exec",
                &ns.names[c],
                common::bin(),
                "selftest",
                "--express",
                "100000",
                "--tag-on",
                "10000",
                "--config",
            ])
            .arg(&cfg);
            for var in [
                "MULTIGRAIN_CLUSTER_ID",
                "MULTIGRAIN_CLUSTERS",
                "MULTIGRAIN_COORDINATOR",
                "MULTIGRAIN_CONFIG",
            ] {
                cmd.env_remove(var);
            }
            cmd.env("SLURM_PROCID", c.to_string())
                .env("SLURM_NTASKS", "2")
                .env("SLURM_STEP_ID", "0");
            Proc::spawn(&format!("netns cluster {c}"), cmd)
        })
        .collect();
    for (c, p) in procs.iter_mut().enumerate() {
        let status = p.wait_exit(RUN);
        assert!(
            status.success(),
            "cluster {c} in namespace {} failed ({status}):\n{}",
            ns.names[c],
            p.transcript()
        );
        assert!(
            p.transcript().contains("each exactly once and in order"),
            "{}",
            p.transcript()
        );
        assert!(
            p.transcript().contains(&format!("links {}:Network", 1 - c)),
            "{}",
            p.transcript()
        );
    }
}
