//! The real launchers: a single-node Slurm (`scripts/slurm-single-node.sh` installs and
//! starts munge, slurmctld and slurmd) and Open MPI's `mpirun` (installed with apt when
//! missing). Each test forms jobs with no config at all — hosts, ports and cluster ids
//! come from the launcher — and fails loudly, never passing, when its launcher cannot be
//! installed or started.

mod common;

use std::process::{Command, Output};
use std::sync::OnceLock;
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
    for var in common::LAUNCH_VARS {
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

/// Slurm is up (started once per test process), or the test fails saying why.
fn slurm() {
    static UP: OnceLock<Result<(), String>> = OnceLock::new();
    let up = UP.get_or_init(|| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/slurm-single-node.sh");
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

/// `mpirun` exists (installed with apt when missing), or the test fails saying why.
fn open_mpi() {
    static UP: OnceLock<Result<(), String>> = OnceLock::new();
    let up = UP.get_or_init(|| {
        if Command::new("mpirun").arg("--version").output().is_ok() {
            return Ok(());
        }
        let out = Command::new("sh")
            .arg("-c")
            .arg(
                "export DEBIAN_FRONTEND=noninteractive; \
                 apt-get install -y --no-install-recommends openmpi-bin \
                 || (apt-get update && apt-get install -y --no-install-recommends openmpi-bin)",
            )
            .output()
            .map_err(|e| format!("cannot run apt-get: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(text(&out))
        }
    });
    if let Err(e) = up {
        panic!("OPEN MPI COULD NOT BE INSTALLED, so the mpirun tests cannot run:\n{e}");
    }
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
    let tag = 90_000 + std::process::id() % 9_000;
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
