//! `multigrain launch -- multigrain hello` end to end with real processes:
//! 1x2 and 4x1 jobs start, every output line is prefixed with its cluster,
//! everything exits 0 and no process is left; remote clusters go through
//! the ssh command (a stand-in that runs the command here).

mod common;

use std::process::Command;

use common::{HANG, Proc, Stream, TempDir, assert_gone, bin, launch, launched_pids, local_config};

fn check_hello_job(clusters: usize, threads: usize, command: &[&str]) {
    let dir = TempDir::new("launch-hello");
    let name = format!("hello-{clusters}x{threads}");
    let config = local_config(&dir, &name, clusters, threads, 3_000);
    let mut job = launch(&name, &config, &[], command);
    let pids = launched_pids(&job, clusters);
    job.adopt(&pids);
    let status = job.wait_exit(HANG);
    assert!(
        status.success(),
        "{name}: {status}; output:\n{}",
        job.transcript()
    );
    let out = job.lines(Stream::Out);
    for line in &out {
        let ok = (0..clusters).any(|c| line.starts_with(&format!("[c{c}] ")));
        assert!(ok, "{name}: unprefixed line {line:?}");
    }
    assert!(
        out.contains(&format!(
            "[c0] job {name}: {clusters} cluster(s) joined; coordinator at 127.0.0.1:"
        )) || out
            .iter()
            .any(|l| l.starts_with(&format!("[c0] job {name}: {clusters} cluster(s) joined"))),
        "{name}: no join line; output:\n{}",
        job.transcript()
    );
    for (c, pid) in pids.iter().enumerate() {
        let table = format!("[c0] cluster {c}: host ");
        let row = out
            .iter()
            .find(|l| l.starts_with(&table))
            .unwrap_or_else(|| {
                panic!(
                    "{name}: no row for cluster {c}; output:\n{}",
                    job.transcript()
                )
            });
        assert!(row.contains(&format!(", pid {pid}")), "{name}: {row}");
        let hello = format!("[c{c}] cluster {c} of {clusters}: hello from pid {pid} on ");
        assert!(
            out.iter().any(|l| l.starts_with(&hello)),
            "{name}: no {hello:?}; output:\n{}",
            job.transcript()
        );
    }
    assert!(out.contains(&format!("[c0] all {clusters} cluster(s) finished")));
    assert_gone(&pids, HANG, &name);
}

#[test]
fn one_cluster_of_two_threads() {
    // `multigrain` as the command runs the launcher's own executable.
    check_hello_job(1, 2, &["multigrain", "hello"]);
}

#[test]
fn four_clusters_of_one_thread() {
    check_hello_job(4, 1, &[bin(), "hello"]);
}

#[test]
fn config_errors_name_the_file() {
    let dir = TempDir::new("launch-badconfig");
    let bad = dir.write("bad.toml", "[local]\nclusters = 0\n");
    let mut job = launch("bad-config", &bad, &[], &["multigrain", "hello"]);
    let status = job.wait_exit(HANG);
    assert_eq!(status.code(), Some(1));
    let err = job.lines(Stream::Err).join("\n");
    assert!(err.contains("bad.toml:2:12: local.clusters = 0"), "{err}");
    let good = local_config(&dir, "no-such-command", 2, 1, 1_000);
    let mut job = launch("bad-command", &good, &[], &["/nonexistent/program"]);
    assert_eq!(job.wait_exit(HANG).code(), Some(1));
    let err = job.lines(Stream::Err).join("\n");
    assert!(
        err.contains("cannot start cluster 0 on 127.0.0.1: `/nonexistent/program`: No such file"),
        "{err}"
    );
    let missing = dir.path().join("missing.toml");
    let mut job = launch("missing-config", &missing, &[], &["multigrain", "hello"]);
    assert_eq!(job.wait_exit(HANG).code(), Some(1));
    let err = job.lines(Stream::Err).join("\n");
    assert!(err.contains("missing.toml"), "{err}");
}

#[test]
fn hello_without_a_launcher_explains_how_to_start() {
    let dir = TempDir::new("hello-alone");
    let config = local_config(&dir, "alone", 2, 1, 1_000);
    let mut cmd = Command::new(bin());
    cmd.arg("hello").arg("--config").arg(&config);
    for var in [
        "MULTIGRAIN_CLUSTER_ID",
        "SLURM_PROCID",
        "PMI_RANK",
        "OMPI_COMM_WORLD_RANK",
    ] {
        cmd.env_remove(var);
    }
    let mut p = Proc::spawn("hello-alone", cmd);
    assert_eq!(p.wait_exit(HANG).code(), Some(1));
    let err = p.lines(Stream::Err).join("\n");
    assert!(err.contains("does not know which cluster it is"), "{err}");
    assert!(err.contains("multigrain launch --config FILE"), "{err}");
}

/// Two "remote hosts": network namespaces joined by a veth pair, and a stand-in for ssh
/// that runs the command in the namespace of the address it is given, detached in a
/// session of its own as sshd's child would be. Every call is appended to `ssh.log`.
/// (tests/launchers_real.rs starts clusters through a real sshd.)
fn remote_hosts(dir: &TempDir, tag: u32) -> (common::Netns, [String; 2], std::path::PathBuf) {
    let (ns, addrs) = common::Netns::create(tag).unwrap_or_else(|why| {
        panic!("NETWORK NAMESPACES COULD NOT BE CREATED ({why}): the ssh tests need them")
    });
    let log = dir.path().join("ssh.log");
    let fake = dir.write(
        "fake-ssh",
        &format!(
            "#!/bin/sh\n# Stands in for ssh: [options] host command\necho \"$@\" >> '{log}'\n\
             while [ \"${{1#-}}\" != \"$1\" ]; do shift; done\nhost=$1; shift\n\
             case \"$host\" in {a0}) ns={n0};; {a1}) ns={n1};; *) echo \"no route to $host\" >&2; exit 255;; esac\n\
             exec 3<&0\nsetsid ip netns exec \"$ns\" sh -c \"$1\" <&3 &\nwait\n",
            log = log.display(),
            a0 = addrs[0],
            a1 = addrs[1],
            n0 = ns.names[0],
            n1 = ns.names[1],
        ),
    );
    let mut perms = std::fs::metadata(&fake).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&fake, perms).unwrap();
    (ns, addrs, fake)
}

fn netns_tag() -> u32 {
    std::process::id() % 80_000
}

/// Remote clusters: the ssh prefix gets the host and one shell command that sets the
/// directory and the variables and names this executable by its absolute path.
#[test]
fn remote_clusters_start_through_the_ssh_command() {
    let dir = TempDir::new("launch-ssh");
    let (_ns, addrs, fake) = remote_hosts(&dir, netns_tag());
    let config = dir.write(
        "job.toml",
        &format!(
            "[job]\nname = \"ssh\"\npeer_timeout_ms = 3000\n\n[[cluster]]\nhost = \"{}\"\n\n\
             [[cluster]]\nhost = \"{}\"\n",
            addrs[0], addrs[1]
        ),
    );
    let ssh = format!("{} -x", fake.display());
    let mut cmd = Command::new(bin());
    cmd.current_dir(dir.path())
        .args(["launch", "--config"])
        .arg(&config)
        .args(["--ssh", &ssh, "--", "multigrain", "hello"]);
    let mut job = Proc::spawn("ssh-job", cmd);
    let status = job.wait_exit(HANG);
    assert!(status.success(), "{status}; output:\n{}", job.transcript());
    job.wait_line("[c1] cluster 1 of 2: hello from pid", HANG);
    let err = job.lines(Stream::Err).join("\n");
    let calls = std::fs::read_to_string(dir.path().join("ssh.log")).expect("the ssh stand-in ran");
    let cwd = dir.path().canonicalize().unwrap();
    let me = std::fs::canonicalize(bin()).unwrap();
    for (c, addr) in addrs.iter().enumerate() {
        assert!(err.contains(&format!("ssh to {addr}")), "{err}");
        assert!(
            calls
                .lines()
                .any(|l| l.starts_with(&format!("-x {addr} cd "))
                    && l.contains(&cwd.display().to_string())
                    && l.contains(&format!(
                        "exec env MULTIGRAIN_CLUSTER_ID={c} MULTIGRAIN_CLUSTERS=2"
                    ))
                    && l.contains(&format!("MULTIGRAIN_WATCH_STDIN=1 {} hello", me.display()))),
            "cluster {c}: {calls}"
        );
    }
}

/// This machine's own names count as local: clusters on its host name start directly,
/// never over ssh (no sshd runs here, so ssh would fail).
#[test]
fn this_machines_own_host_name_is_local() {
    let host = nix::sys::utsname::uname()
        .map(|u| u.nodename().to_string_lossy().into_owned())
        .unwrap();
    let dir = TempDir::new("launch-own-name");
    let config = dir.write(
        "job.toml",
        &format!(
            "[job]\nname = \"own\"\n\n[[cluster]]\nhost = \"{host}\"\n\n[[cluster]]\nhost = \"{host}\"\n"
        ),
    );
    let mut cmd = Command::new(bin());
    cmd.args(["launch", "--config"])
        .arg(&config)
        .args(["--", "multigrain", "hello"]);
    let mut job = Proc::spawn("own-name", cmd);
    let status = job.wait_exit(HANG);
    assert!(status.success(), "{status}; output:\n{}", job.transcript());
    let err = job.lines(Stream::Err).join("\n");
    assert!(err.contains("cluster 1: pid "), "{err}");
    assert!(err.contains(&format!(" on {host}")), "{err}");
    assert!(!err.contains("ssh to"), "{err}");
}

/// `Cpus_allowed_list` of /proc/PID/status (`0-3,8`) as CPU numbers.
fn cpu_list(text: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
        cpus.extend(a..=b);
    }
    cpus
}

/// Each cluster's `Cpus_allowed_list` under `launch.cpu_bind = bind`, 2 clusters of
/// `threads` threads each, and the launcher's launch lines.
fn cluster_cpus(bind: &str, threads: usize) -> (Vec<Vec<usize>>, String) {
    let dir = TempDir::new("launch-cpus");
    let name = format!("cpus-{bind}-{threads}");
    let config = dir.write(
        "job.toml",
        &format!(
            "[job]\nname = \"{name}\"\nstartup_timeout_ms = 20000\n\n[local]\nclusters = 2\n\
             threads = {threads}\n\n[launch]\ncpu_bind = \"{bind}\"\n"
        ),
    );
    let script = "grep Cpus_allowed_list /proc/self/status";
    let mut job = launch(&name, &config, &[], &["sh", "-c", script]);
    let pids = launched_pids(&job, 2);
    job.adopt(&pids);
    let status = job.wait_exit(HANG);
    assert!(status.success(), "{name}: {status}\n{}", job.transcript());
    let out = job.lines(Stream::Out);
    let cpus = (0..2)
        .map(|c| {
            let prefix = format!("[c{c}] Cpus_allowed_list:");
            let line = out
                .iter()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| {
                    panic!("{name}: no CPU list of cluster {c}\n{}", job.transcript())
                });
            cpu_list(&line[prefix.len()..])
        })
        .collect();
    assert_gone(&pids, HANG, &name);
    (cpus, job.lines(Stream::Err).join("\n"))
}

/// Asserts that two clusters were bound to disjoint halves of `mine` (the same single
/// CPU where there is only one), and that their launch lines say so.
fn assert_split(bound: &[Vec<usize>], err: &str, mine: &[usize]) {
    for (c, cpus) in bound.iter().enumerate() {
        assert!(
            !cpus.is_empty() && cpus.iter().all(|x| mine.contains(x)),
            "{bound:?}"
        );
        let line = err
            .lines()
            .find(|l| l.contains(&format!("cluster {c}: pid ")))
            .unwrap_or_else(|| panic!("no launch line of cluster {c}:\n{err}"));
        assert!(line.contains(", CPUs "), "{line} (bound to {cpus:?})");
    }
    if mine.len() >= 2 {
        assert!(bound[0].iter().all(|x| !bound[1].contains(x)), "{bound:?}");
        assert_eq!(bound[0].len() + bound[1].len(), mine.len(), "{bound:?}");
    } else {
        eprintln!("one CPU here: both clusters are bound to it ({bound:?})");
        assert_eq!(bound[0], bound[1]);
    }
}

#[test]
fn clusters_started_together_split_the_launchers_cpus() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in /proc/self/status");
    let mine = cpu_list(line);
    // split: two clusters of one thread each get half of the CPUs each, none shared.
    let (bound, err) = cluster_cpus("split", 1);
    assert_split(&bound, &err, &mine);
    // auto: split once the clusters' threads outnumber the CPUs …
    let (bound, err) = cluster_cpus("auto", mine.len().min(1024));
    assert_split(&bound, &err, &mine);
    assert!(!err.contains("its protocol thread"), "{err}");
    // … apart while every thread can have a CPU: the same shares, and each cluster's
    // protocol thread on the other's (the launch line says which) …
    if mine.len() >= 2 {
        let (bound, err) = cluster_cpus("auto", mine.len() / 2);
        assert_split(&bound, &err, &mine);
        for (c, other) in [(0, &bound[1]), (1, &bound[0])] {
            let line = err
                .lines()
                .find(|l| l.contains(&format!("cluster {c}: pid ")))
                .unwrap();
            let protocol = line
                .split_once(", its protocol thread on CPUs ")
                .unwrap_or_else(|| panic!("{line}"))
                .1;
            assert_eq!(&cpu_list(protocol), other, "{line}");
        }
    } else {
        eprintln!("one CPU here: no other cluster's CPU for a protocol thread");
    }
    // … and never bound with none.
    let (unbound, err) = cluster_cpus("none", mine.len());
    assert_eq!(unbound, vec![mine.clone(), mine.clone()]);
    assert!(!err.contains(", CPUs "), "{err}");
}
