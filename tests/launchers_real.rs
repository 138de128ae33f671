//! The real launchers: a single-node Slurm (`scripts/slurm-single-node.sh` installs and
//! starts munge, slurmctld and slurmd) and Open MPI's `mpirun` (installed with apt when
//! missing). Each test forms jobs with no config at all — hosts, ports and cluster ids
//! come from the launcher — and fails loudly, never passing, when its launcher cannot be
//! installed or started.

mod common;

use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use common::{TempDir, bin};

/// Runs `cmd` to completion with a time limit (the `timeout` utility), returning its output.
fn run(what: &str, cmd: &mut Command, limit: Duration) -> Output {
    let mut wrapped = Command::new("timeout");
    wrapped
        .arg("-k")
        .arg("5")
        .arg(limit.as_secs().to_string())
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => wrapped.env(k, v),
            None => wrapped.env_remove(k),
        };
    }
    for var in common::launch_vars() {
        wrapped.env_remove(var);
    }
    let out = wrapped
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    if out.status.code() == Some(124) {
        panic!("{what}: did not finish within {limit:?}:\n{}", text(&out));
    }
    out
}

fn text(out: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok(what: &str, out: &Output) -> String {
    assert!(out.status.success(), "{what} failed:\n{}", text(out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Held while apt runs for a test of this process (the tests run in parallel and apt
/// takes one lock); apt's own lock timeout covers other processes.
static APT: Mutex<()> = Mutex::new(());

/// Slurm is up (started once per test process), or the test fails saying why.
fn slurm() {
    static UP: OnceLock<Result<(), String>> = OnceLock::new();
    let up = UP.get_or_init(|| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/slurm-single-node.sh");
        let _apt = APT.lock().unwrap_or_else(|e| e.into_inner());
        let out = Command::new(script)
            .output()
            .map_err(|e| format!("cannot run {script}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(text(&out))
        }
    });
    if let Err(e) = up {
        panic!("SLURM COULD NOT BE STARTED, so the srun/sbatch tests cannot run:\n{e}");
    }
}

/// Installs `packages` with apt unless `present` says they are there; the outcome is
/// kept per test process in `once`. Tests run in parallel and each installs what it
/// needs, so apt waits (up to 10 min) for another apt's lock instead of failing.
/// Panics, loudly naming `what`, when they cannot be had.
fn installed(
    once: &OnceLock<Result<(), String>>,
    what: &str,
    present: fn() -> bool,
    packages: &str,
) {
    let up = once.get_or_init(|| {
        if present() {
            return Ok(());
        }
        let _apt = APT.lock().unwrap_or_else(|e| e.into_inner());
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "export DEBIAN_FRONTEND=noninteractive; apt='apt-get -o DPkg::Lock::Timeout=600'; \
                 $apt install -y --no-install-recommends {packages} \
                 || ($apt update && $apt install -y --no-install-recommends {packages})"
            ))
            .output()
            .map_err(|e| format!("cannot run apt-get: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(text(&out))
        }
    });
    if let Err(e) = up {
        panic!("{what} COULD NOT BE INSTALLED, so the tests that need it cannot run:\n{e}");
    }
}

/// `mpirun` exists (installed with apt when missing), or the test fails saying why.
fn open_mpi() {
    static UP: OnceLock<Result<(), String>> = OnceLock::new();
    installed(
        &UP,
        "OPEN MPI",
        || Command::new("mpirun").arg("--version").output().is_ok(),
        "openmpi-bin",
    );
}

const LIMIT: Duration = Duration::from_secs(120);

fn srun(args: &[&str]) -> Command {
    let mut c = Command::new("srun");
    c.args(["--overcommit", "-n", "2", "-t", "5"])
        .arg(bin())
        .args(args);
    c
}

fn mpirun(args: &[&str]) -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe", "-n", "2"])
        .arg(bin())
        .args(args);
    c
}

/// What cluster 0 of a `hello` job printed: both clusters joined, one line each.
fn check_hello(out: &str, launcher: &str) {
    assert!(
        out.contains("2 cluster(s) joined; coordinator at"),
        "{launcher} hello:\n{out}"
    );
    assert!(out.contains("cluster 0 of 2: hello from pid"), "{out}");
    assert!(out.contains("cluster 1 of 2: hello from pid"), "{out}");
}

const WATER: [&str; 6] = ["run", "water", "--molecules", "64", "--steps", "2"];

#[test]
fn srun_forms_host_less_jobs_two_at_a_time() {
    slurm();
    let a = std::thread::spawn(|| run("srun hello (job A)", &mut srun(&["hello"]), LIMIT));
    let b = run("srun hello (job B)", &mut srun(&["hello"]), LIMIT);
    let a = a.join().expect("job A");
    check_hello(&ok("srun hello (job A)", &a), "srun");
    check_hello(&ok("srun hello (job B)", &b), "srun");
    let water = ok(
        "srun run water",
        &run("srun run water", &mut srun(&WATER), LIMIT),
    );
    assert!(
        water.contains("on DSM: 2 cluster(s) × 1 thread(s) (Slurm ranks"),
        "{water}"
    );
}

#[test]
fn sbatch_runs_the_readme_command_and_srun_inside() {
    slurm();
    let dir = TempDir::new("sbatch");
    let out_file = dir.path().join("batch.out");
    let script = dir.write(
        "job.sh",
        &format!(
            "#!/bin/bash\n#SBATCH -n 2\n#SBATCH --overcommit\n#SBATCH -t 5\n#SBATCH -o {out}\n\
             set -e\n{bin} {water}\nsrun {bin} {water}\n",
            out = out_file.display(),
            bin = bin(),
            water = WATER.join(" ")
        ),
    );
    let sub = run(
        "sbatch --wait",
        Command::new("sbatch").arg("--wait").arg(&script),
        LIMIT,
    );
    let log = std::fs::read_to_string(&out_file).unwrap_or_default();
    assert!(
        sub.status.success(),
        "sbatch:\n{}\n--- batch output\n{log}",
        text(&sub)
    );
    // The batch shell ran the embedded default job itself; srun ran one cluster per task.
    assert!(
        log.contains("on DSM: 2 cluster(s) × 2 thread(s) (embedded default job"),
        "{log}"
    );
    assert!(
        log.contains("on DSM: 2 cluster(s) × 1 thread(s) (Slurm ranks"),
        "{log}"
    );
}

#[test]
fn mpirun_forms_host_less_jobs_two_at_a_time() {
    open_mpi();
    let a = std::thread::spawn(|| run("mpirun hello (job A)", &mut mpirun(&["hello"]), LIMIT));
    let b = run("mpirun hello (job B)", &mut mpirun(&["hello"]), LIMIT);
    let a = a.join().expect("job A");
    check_hello(&ok("mpirun hello (job A)", &a), "mpirun");
    check_hello(&ok("mpirun hello (job B)", &b), "mpirun");
    let water = ok(
        "mpirun run water",
        &run("mpirun run water", &mut mpirun(&WATER), LIMIT),
    );
    assert!(
        water.contains("on DSM: 2 cluster(s) × 1 thread(s) (Open MPI ranks"),
        "{water}"
    );
}

#[test]
fn srun_with_a_mismatched_host_list_fails_fast_naming_it() {
    slurm();
    let dir = TempDir::new("srun-mismatch");
    let cfg = dir.write(
        "job.toml",
        "[[cluster]]\nhost = \"127.0.0.1\"\nport = 0\n\n[[cluster]]\nhost = \"192.0.2.7\"\n",
    );
    let t0 = std::time::Instant::now();
    let out = run(
        "srun with a wrong host",
        &mut srun(&["hello", "--config", cfg.to_str().unwrap()]),
        LIMIT,
    );
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cluster 1 (Slurm rank 1) runs on") && err.contains("192.0.2.7"),
        "{err}"
    );
    // Cluster 1 tells the coordinator, so nobody waits for the 10 s start-up timeout.
    assert!(err.contains("cluster 1 failed: could not start"), "{err}");
    // (srun may queue the job behind the other tests' jobs: a generous bound, below the
    // 10 s start-up timeout that the message above already rules out.)
    assert!(
        t0.elapsed() < Duration::from_secs(9),
        "took {:?}",
        t0.elapsed()
    );
}

/// `mpirun` on two "nodes" — network namespaces joined by a veth pair, `orted` started in
/// the second through an ssh stand-in (`plm_rsh_agent`) — with no config: the ranks find
/// rank 0's coordinator through PMIx and Water runs through the INIs over the veth.
#[test]
fn mpirun_across_two_network_namespaces_needs_no_hosts() {
    open_mpi();
    // Disjoint from the other namespace test of this binary (95,000..98,999): both run
    // at once in one process.
    let tag = 90_000 + std::process::id() % 4_000;
    let (ns, addrs) = common::Netns::create(tag).unwrap_or_else(|why| {
        panic!("NETWORK NAMESPACES COULD NOT BE CREATED ({why}): this test needs them")
    });
    let dir = TempDir::new("mpirun-netns");
    let agent = dir.write(
        "fake-ssh",
        &format!(
            "#!/bin/sh\n# Stands in for ssh: [options] host command\n\
             while [ \"${{1#-}}\" != \"$1\" ]; do shift; done\nhost=$1; shift\n\
             case \"$host\" in {a0}) ns={n0};; {a1}) ns={n1};; *) echo \"no route to $host\" >&2; exit 255;; esac\n\
             exec ip netns exec \"$ns\" sh -c \"$*\"\n",
            a0 = addrs[0],
            a1 = addrs[1],
            n0 = ns.names[0],
            n1 = ns.names[1],
        ),
    );
    let mut perms = std::fs::metadata(&agent).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&agent, perms).unwrap();
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns",
        "exec",
        &ns.names[0],
        "mpirun",
        "--allow-run-as-root",
    ])
    .args(["--oversubscribe", "--mca", "plm_rsh_agent"])
    .arg(&agent)
    .args(["--mca", "plm_rsh_no_tree_spawn", "1", "--host"])
    .arg(format!("{}:1,{}:1", addrs[0], addrs[1]))
    .args(["-n", "2"])
    .arg(bin())
    .args(["-vv"])
    .args(WATER);
    let out = run("mpirun across namespaces", &mut cmd, LIMIT);
    let stdout = ok("mpirun across namespaces", &out);
    assert!(
        stdout.contains("on DSM: 2 cluster(s) × 1 thread(s) (Open MPI ranks"),
        "{stdout}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("coordinator at {}:", addrs[0])),
        "the ranks did not meet at rank 0's namespace address:\n{err}"
    );
}

/// openssh-server and the client are installed (with apt when missing), or the test
/// fails saying why.
fn openssh() {
    static UP: OnceLock<Result<(), String>> = OnceLock::new();
    installed(
        &UP,
        "OPENSSH",
        || {
            std::path::Path::new("/usr/sbin/sshd").exists()
                && Command::new("ssh").arg("-V").output().is_ok()
        },
        "openssh-server openssh-client",
    );
}

/// A real sshd in network namespace `ns` at `addr`, with its own host key and one client
/// key accepted (files in `dir`); stopped on drop. `ssh` is the client command line.
struct Sshd {
    child: std::process::Child,
    ssh: String,
}

impl Sshd {
    /// Starts it and waits (at most 10 s) until a client in namespace `client_ns` can
    /// connect to it.
    fn start(dir: &TempDir, ns: &str, addr: &str, client_ns: &str) -> Sshd {
        openssh();
        let d = dir.path();
        let keygen = |file: &str| {
            let out = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(d.join(file))
                .output()
                .expect("ssh-keygen");
            assert!(out.status.success(), "ssh-keygen: {}", text(&out));
        };
        keygen("host_key");
        keygen("client_key");
        std::fs::copy(d.join("client_key.pub"), d.join("authorized_keys")).unwrap();
        let cfg = dir.write(
            "sshd_config",
            &format!(
                "ListenAddress {addr}\nPort 22\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n\
                 PermitRootLogin prohibit-password\nPasswordAuthentication no\nStrictModes no\n\
                 UsePAM no\nPidFile none\n",
                d = d.display()
            ),
        );
        std::fs::create_dir_all("/run/sshd").unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", ns, "/usr/sbin/sshd", "-D", "-e", "-f"])
            .arg(&cfg)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting sshd");
        let ssh = format!(
            "ssh -i {}/client_key -o BatchMode=yes -o StrictHostKeyChecking=no \
             -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
            d.display()
        );
        let mut sshd = Sshd { child, ssh };
        let t0 = std::time::Instant::now();
        loop {
            let probe = Command::new("ip")
                .args(["netns", "exec", client_ns, "bash", "-c"])
                .arg(format!("exec 3<>/dev/tcp/{addr}/22"))
                .stderr(std::process::Stdio::null())
                .status();
            if probe.is_ok_and(|s| s.success()) {
                return sshd;
            }
            if let Ok(Some(status)) = sshd.child.try_wait() {
                panic!("SSHD COULD NOT BE STARTED: it exited with {status}");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "SSHD COULD NOT BE STARTED: not listening at {addr}:22 after 10 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `multigrain launch` over real ssh: the launcher runs in one network namespace, both
/// clusters are started through sshd in the other (so no local cluster's death can stop
/// them through the job's own failure detection). Sharing that host, with
/// `launch.cpu_bind = "split"`, they bind themselves to two different shares of its
/// CPUs (each says which). Killing the launcher (-9, then in a second job SIGINT) leaves
/// no cluster behind: each sees its ssh channel close.
#[test]
fn clusters_started_over_real_ssh_do_not_outlive_the_launcher() {
    let tag = 95_000 + std::process::id() % 4_000;
    let (ns, addrs) = common::Netns::create(tag).unwrap_or_else(|why| {
        panic!("NETWORK NAMESPACES COULD NOT BE CREATED ({why}): this test needs them")
    });
    let dir = TempDir::new("real-ssh");
    let sshd = Sshd::start(&dir, &ns.names[1], &addrs[1], &ns.names[0]);
    let config = dir.write(
        "job.toml",
        &format!(
            "[job]\nname = \"ssh\"\npeer_timeout_ms = 3000\n\n[[cluster]]\nhost = \"{0}\"\n\n\
             [[cluster]]\nhost = \"{0}\"\n\n[launch]\ncpu_bind = \"split\"\n",
            addrs[1]
        ),
    );
    for signal in [
        nix::sys::signal::Signal::SIGKILL,
        nix::sys::signal::Signal::SIGINT,
    ] {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.names[0]])
            .arg(bin())
            .args(["launch", "--config"])
            .arg(&config)
            .args([
                "--ssh",
                &sshd.ssh,
                "--",
                "multigrain",
                "hello",
                "--sleep-ms",
                "60000",
            ]);
        for var in common::launch_vars() {
            cmd.env_remove(var);
        }
        let job = common::Proc::spawn("launch over ssh", cmd);
        let (pids, cpus): (Vec<i32>, Vec<String>) = (0..2)
            .map(|c| {
                let (line, _) = job.wait_line(
                    &format!("[c{c}] cluster {c} of 2: hello from pid "),
                    common::HANG,
                );
                let tail = line.split("hello from pid ").nth(1).unwrap_or_default();
                let pid = tail
                    .split_whitespace()
                    .next()
                    .and_then(|p| p.parse::<i32>().ok())
                    .unwrap_or_else(|| panic!("no pid in {line:?}"));
                let cpus = line.split(", CPUs ").nth(1).unwrap_or_default().trim();
                (pid, cpus.to_owned())
            })
            .unzip();
        let err = job.lines(common::Stream::Err).join("\n");
        assert!(
            err.contains("cluster 0: pid ") && err.contains(&format!("ssh to {}", addrs[1])),
            "{err}"
        );
        assert!(
            err.contains("binds itself to its share of that host's CPUs"),
            "{err}"
        );
        // Two shares of the host's CPUs: different ones, unless it has a single CPU,
        // which they then share.
        let host_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(
            cpus.iter().all(|c| !c.is_empty() && c != "?") && (host_cpus < 2 || cpus[0] != cpus[1]),
            "the two clusters on one host ({host_cpus} CPUs) did not bind to two shares of \
             its CPUs: {cpus:?}"
        );
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(job.pid), signal).unwrap();
        common::assert_gone(
            &pids,
            Duration::from_secs(10),
            &format!("clusters after {signal} of a launcher that used real ssh"),
        );
    }
}

/// A TCP socket bound to a free port of 127.0.0.1, not listening, and that port.
fn bound_not_listening() -> (std::os::fd::OwnedFd, u16) {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrIn, bind, getsockname, socket,
    };
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("a TCP socket");
    bind(fd.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, 0)).expect("bind 127.0.0.1:0");
    let addr: SockaddrIn = getsockname(fd.as_raw_fd()).expect("its address");
    (fd, addr.port())
}

/// A two-cluster job whose cluster 0 port is held until the returned socket is dropped
/// (`listen`: by a listener of this test — another job's coordinator, say — whose
/// connections hear nothing; else by a bound socket that does not listen, so that
/// connections are refused, as when cluster 0 died before it listened), with a 20 s
/// start-up and a 10 s peer timeout: a cluster 1 left to itself would wait that long.
fn port_clash_job(dir: &TempDir, listen: bool) -> (std::os::fd::OwnedFd, u16, std::path::PathBuf) {
    let (holder, port) = if listen {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
        let port = l.local_addr().expect("its address").port();
        (std::os::fd::OwnedFd::from(l), port)
    } else {
        bound_not_listening()
    };
    let cfg = dir.write(
        "job.toml",
        &format!(
            "[job]\nname = \"clash\"\nstartup_timeout_ms = 20000\npeer_timeout_ms = 10000\n\n\
             [[cluster]]\nhost = \"127.0.0.1\"\nport = {port}\n\n[[cluster]]\nhost = \"127.0.0.1\"\n"
        ),
    );
    (holder, port, cfg)
}

/// Issue 13, fast failure before registration, under srun: cluster 0 cannot listen;
/// with `-K` (`--kill-on-bad-exit`) Slurm ends the step at once, naming task 0, below
/// cluster 0's own error naming its port (measured here: 0.2 s after that error; without
/// `-K`, cluster 1 finds out itself, see the next tests).
#[test]
fn srun_kill_on_bad_exit_ends_the_job_when_cluster_0_cannot_listen() {
    let (err, _) = srun_with_port_held(&["-K"], true);
    assert!(err.contains("task 0: Exited with exit code 1"), "{err}");
}

/// Runs `srun -n 2 [extra] multigrain hello` on [`port_clash_job`]: it must fail within
/// 8 s (well below the 20 s start-up and 10 s peer timeouts that cluster 1 would otherwise
/// wait; srun may queue the job behind others), cluster 0 naming its taken port. Returns
/// srun's standard error and the port.
fn srun_with_port_held(extra: &[&str], listen: bool) -> (String, u16) {
    slurm();
    let dir = TempDir::new("srun-clash");
    let (holder, port, cfg) = port_clash_job(&dir, listen);
    let mut cmd = Command::new("srun");
    cmd.args(extra)
        .args(["--overcommit", "-n", "2", "-t", "5"])
        .arg(bin())
        .args(["hello", "--config", cfg.to_str().unwrap()]);
    let t0 = std::time::Instant::now();
    let out = run(
        &format!("srun {extra:?} with cluster 0's port held (listening: {listen})"),
        &mut cmd,
        LIMIT,
    );
    let took = t0.elapsed();
    eprintln!(
        "srun {extra:?}, port held (listening: {listen}): the step ended {took:?} after srun started"
    );
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains(&format!("TCP port {port} is in use")), "{err}");
    assert!(took < Duration::from_secs(8), "took {took:?}:\n{err}");
    drop(holder);
    (err, port)
}

/// The line of a member stopped by the step's signal (`src/launch/step_notice.rs`).
const STEP_NOTICE: &str = "another task of Slurm step";

/// As [`srun_kill_on_bad_exit_ends_the_job_when_cluster_0_cannot_listen`] without `-K`
/// (Slurm's default: the other tasks go on), the port held by a listener: cluster 1
/// reaches it, registers and hears nothing; it stops either on the signal cluster 0
/// sends the step as it fails (`scancel --signal=USR1`, 0.2 s later) or on its own,
/// [`multigrain_control::FIRST_ANSWER`] after registering, naming the port, whichever
/// comes first (before either, it waited for the peer timeout, 10 s here).
#[test]
fn srun_without_kill_on_bad_exit_reports_a_taken_coordinator_port_at_once() {
    let (err, port) = srun_with_port_held(&[], true);
    assert!(
        err.contains(STEP_NOTICE) || err.contains(&format!("is not answering at 127.0.0.1:{port}")),
        "{err}"
    );
    assert!(err.contains("task 1: Exited with exit code 3"), "{err}");
}

/// Issue 13, fast failure before registration, under srun without `-K`, when nothing
/// listens at cluster 0's port (cluster 0 failed before it listened: here its port is
/// held by a socket that does not listen, so cluster 1's connections are refused, as
/// when cluster 0 is still starting): cluster 0 signals the step as it fails, and
/// cluster 1, still joining, stops naming the step (before, it retried until the
/// start-up timeout, 20 s here). Measured here: the whole step in 0.25 s.
#[test]
fn srun_without_kill_on_bad_exit_stops_the_step_when_cluster_0_dies_before_listening() {
    let (err, _) = srun_with_port_held(&[], false);
    assert!(err.contains(STEP_NOTICE), "{err}");
    assert!(err.contains("task 1: Exited with exit code 3"), "{err}");
}

/// As [`srun_kill_on_bad_exit_ends_the_job_when_cluster_0_cannot_listen`] under Open MPI's
/// `mpirun`, which aborts the job when a rank exits non-zero
/// (its default; measured here: 0.15 s after cluster 0's error).
#[test]
fn mpirun_aborts_the_job_when_cluster_0_cannot_listen() {
    open_mpi();
    let dir = TempDir::new("mpirun-clash");
    let (taken, port, cfg) = port_clash_job(&dir, true);
    let t0 = std::time::Instant::now();
    let out = run(
        "mpirun with cluster 0's port taken",
        &mut mpirun(&["hello", "--config", cfg.to_str().unwrap()]),
        LIMIT,
    );
    let took = t0.elapsed();
    eprintln!("mpirun: the job ended {took:?} after mpirun started");
    assert!(!out.status.success(), "{}", text(&out));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains(&format!("TCP port {port} is in use")), "{all}");
    assert!(all.contains("the job has been aborted"), "{all}");
    assert!(took < Duration::from_secs(8), "took {took:?}:\n{all}");
    drop(taken);
}
