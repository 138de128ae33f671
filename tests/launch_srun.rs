//! Starting clusters without `multigrain launch`, as `srun` or `mpirun`
//! would: each process takes its cluster id from the launcher's rank
//! variables and finds the coordinator at cluster 0's fixed port.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{HANG, Proc, Stream, TempDir, assert_gone, bin, free_port};

fn config(dir: &TempDir, clusters: usize, port: u16, startup_ms: u64) -> std::path::PathBuf {
    let mut text = format!(
        "[job]\nname = \"srun\"\nstartup_timeout_ms = {startup_ms}\npeer_timeout_ms = 1000\n"
    );
    for c in 0..clusters {
        let port = if c == 0 { port } else { 0 };
        text.push_str(&format!(
            "\n[[cluster]]\nhost = \"127.0.0.1\"\nport = {port}\n"
        ));
    }
    dir.write("job.toml", &text)
}

/// Starts `multigrain hello` as rank `rank` of `size` with the given
/// launcher variables.
fn rank(vars: (&str, &str), rank: usize, size: usize, config: &std::path::Path) -> Proc {
    let mut cmd = Command::new(bin());
    cmd.arg("hello").arg("--config").arg(config);
    for var in common::launch_vars() {
        cmd.env_remove(var);
    }
    cmd.env(vars.0, rank.to_string())
        .env(vars.1, size.to_string());
    if vars.0 == "SLURM_PROCID" {
        // A task of a job step, as srun starts it.
        cmd.env("SLURM_STEP_ID", "0");
    }
    Proc::spawn(&format!("{} rank {rank}", vars.0), cmd)
}

fn check_ranks(vars: (&str, &str), size: usize) {
    let dir = TempDir::new("srun");
    let cfg = config(&dir, size, free_port(), 20_000);
    // Members first: they retry until the coordinator listens.
    let mut procs: Vec<Proc> = (0..size).rev().map(|r| rank(vars, r, size, &cfg)).collect();
    procs.reverse();
    let pids: Vec<i32> = procs.iter().map(|p| p.pid).collect();
    for (r, p) in procs.iter_mut().enumerate() {
        let status = p.wait_exit(HANG);
        assert!(
            status.success(),
            "rank {r}: {status}; output:\n{}",
            p.transcript()
        );
    }
    let out = procs[0].lines(Stream::Out);
    assert!(
        out[0].starts_with(&format!(
            "job srun: {size} cluster(s) joined; coordinator at 127.0.0.1:"
        )),
        "{out:#?}"
    );
    for (c, pid) in pids.iter().enumerate() {
        assert!(
            out.iter()
                .any(|l| l.starts_with(&format!("cluster {c}: host "))
                    && l.contains(&format!("pid {pid}"))),
            "cluster {c}: {out:#?}"
        );
        procs[c].wait_line(
            &format!("cluster {c} of {size}: hello from pid {pid}"),
            HANG,
        );
    }
    assert_gone(&pids, HANG, "srun-style job");
}

#[test]
fn slurm_ranks_find_each_other() {
    check_ranks(("SLURM_PROCID", "SLURM_NTASKS"), 3);
}

#[test]
fn open_mpi_ranks_find_each_other() {
    check_ranks(("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), 2);
}

#[test]
fn missing_rank_fails_within_the_startup_timeout_naming_it() {
    let dir = TempDir::new("srun-missing");
    let startup = Duration::from_millis(1500);
    let cfg = config(&dir, 3, free_port(), startup.as_millis() as u64);
    let vars = ("SLURM_PROCID", "SLURM_NTASKS");
    let t0 = Instant::now();
    let mut procs = [rank(vars, 0, 3, &cfg), rank(vars, 1, 3, &cfg)];
    for (r, p) in procs.iter_mut().enumerate() {
        let status = p.wait_exit(HANG);
        let took = t0.elapsed();
        assert_eq!(
            status.code(),
            Some(1),
            "rank {r}: output:\n{}",
            p.transcript()
        );
        assert!(
            took <= startup + Duration::from_millis(1500),
            "rank {r} gave up after {took:?}; start-up timeout {startup:?}"
        );
        let err = p.lines(Stream::Err).join("\n");
        assert!(
            err.contains("start-up did not complete within 1.5 s"),
            "rank {r}: {err}"
        );
        assert!(
            err.contains("cluster 2 never registered"),
            "rank {r}: {err}"
        );
    }
}

#[test]
fn port_zero_without_a_launch_id_is_explained() {
    let dir = TempDir::new("srun-port0");
    let cfg = config(&dir, 2, 0, 5_000);
    let mut p = rank(("SLURM_PROCID", "SLURM_NTASKS"), 1, 2, &cfg);
    assert_eq!(p.wait_exit(HANG).code(), Some(1));
    let err = p.lines(Stream::Err).join("\n");
    assert!(
        err.contains(
            "cluster 0 has no fixed port in the config, but it does not identify the launch"
        ),
        "{err}"
    );
    assert!(err.contains("fixed `port`"), "{err}");
}

/// Starts `multigrain ARGS` as rank `rank` of `size` of the Slurm job step `job`.0 on
/// this node, with no config.
fn slurm_task(job: u32, rank: usize, size: usize, args: &[&str]) -> Proc {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    for var in common::launch_vars() {
        cmd.env_remove(var);
    }
    cmd.env("SLURM_PROCID", rank.to_string())
        .env("SLURM_NTASKS", size.to_string())
        .env("SLURM_JOB_ID", job.to_string())
        .env("SLURM_STEP_ID", "0")
        .env("SLURM_STEP_NODELIST", "localhost")
        .env("SLURM_CPUS_PER_TASK", "2");
    Proc::spawn(&format!("job {job} rank {rank}"), cmd)
}

/// Waits for every process, asserting that each fails and that all have ended within
/// `limit` of `t0`; returns each one's stderr, in order.
fn all_fail_within(mut procs: Vec<Proc>, t0: Instant, limit: Duration) -> Vec<String> {
    for p in &mut procs {
        assert!(!p.wait_exit(HANG).success(), "{}", p.transcript());
    }
    let took = t0.elapsed();
    assert!(
        took < limit,
        "the job took {took:?} to stop:\n{}",
        procs
            .iter()
            .map(Proc::transcript)
            .collect::<Vec<_>>()
            .join("\n")
    );
    procs
        .iter()
        .map(|p| p.lines(Stream::Err).join("\n"))
        .collect()
}

/// Starts `multigrain ARGS` as Slurm rank `rank` of 2 inside a job step, with `extra`
/// launcher variables.
fn step_rank(rank: usize, args: &[&str], extra: &[(&str, &str)]) -> Proc {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    for var in common::launch_vars() {
        cmd.env_remove(var);
    }
    cmd.env("SLURM_PROCID", rank.to_string())
        .env("SLURM_NTASKS", "2")
        .env("SLURM_STEP_ID", "0")
        .envs(extra.iter().copied());
    Proc::spawn(&format!("rank {rank}"), cmd)
}

#[test]
fn two_host_less_jobs_on_one_node_form_from_the_launcher_alone() {
    // Two jobs of 2 ranks at once, no config, no port: each forms its own job.
    let base = std::process::id() % 100_000;
    let jobs = [base * 2, base * 2 + 1];
    let mut procs: Vec<(u32, usize, Proc)> = Vec::new();
    for &job in &jobs {
        for r in (0..2).rev() {
            procs.push((job, r, slurm_task(job, r, 2, &["hello"])));
        }
    }
    for (job, r, p) in &mut procs {
        let status = p.wait_exit(HANG);
        assert!(
            status.success(),
            "job {job} rank {r}: {status}; output:\n{}",
            p.transcript()
        );
    }
    for (job, r, p) in &procs {
        if *r == 0 {
            let out = p.lines(Stream::Out);
            assert!(
                out[0].contains("2 cluster(s) joined; coordinator at 127.0.0.1:"),
                "job {job}: {out:#?}"
            );
        }
    }
}

#[test]
fn a_batch_shell_is_not_a_launcher_rank() {
    // sbatch's shell has SLURM_PROCID and SLURM_NTASKS but no SLURM_STEP_ID: the
    // README's run command there starts its own cluster processes (the embedded 2×2 job).
    let mut cmd = Command::new(bin());
    cmd.args(["run", "water", "--molecules", "64", "--steps", "1"]);
    for var in common::launch_vars() {
        cmd.env_remove(var);
    }
    cmd.env("SLURM_PROCID", "0")
        .env("SLURM_NTASKS", "4")
        .env("SLURM_JOB_ID", "5")
        .env("SLURM_NODELIST", "localhost");
    let mut p = Proc::spawn("batch shell", cmd);
    assert!(p.wait_exit(HANG).success(), "{}", p.transcript());
    let out = p.lines(Stream::Out).join("\n");
    assert!(out.contains("2 cluster(s) × 2 thread(s)"), "{out}");
}

#[test]
fn a_forced_launcher_without_its_variables_is_explained() {
    let mut cmd = Command::new(bin());
    cmd.args(["--launcher", "mpi", "hello"]);
    for var in common::launch_vars() {
        cmd.env_remove(var);
    }
    let mut p = Proc::spawn("forced mpi", cmd);
    assert_eq!(p.wait_exit(HANG).code(), Some(1));
    let err = p.lines(Stream::Err).join("\n");
    assert!(
        err.contains("the launcher is set to Open MPI but OMPI_COMM_WORLD_RANK is not set"),
        "{err}"
    );
}

#[test]
fn wrong_task_count_is_explained() {
    let dir = TempDir::new("srun-count");
    let cfg = config(&dir, 2, free_port(), 5_000);
    let mut p = rank(("SLURM_PROCID", "SLURM_NTASKS"), 0, 3, &cfg);
    assert_eq!(p.wait_exit(HANG).code(), Some(1));
    let err = p.lines(Stream::Err).join("\n");
    assert!(err.contains("SLURM_NTASKS = 3"), "{err}");
    assert!(err.contains("srun -n 2"), "{err}");
}

#[test]
fn a_rank_on_the_wrong_host_stops_the_whole_job_at_once() {
    // Cluster 1's config host is not this machine: it says so, tells the coordinator,
    // and both ranks exit long before the 20 s start-up timeout.
    let dir = TempDir::new("srun-wrong-host");
    let port = free_port();
    let cfg = dir.write(
        "job.toml",
        &format!(
            "[job]\nstartup_timeout_ms = 20000\n\n[[cluster]]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
             [[cluster]]\nhost = \"192.0.2.7\"\n"
        ),
    );
    let vars = ("SLURM_PROCID", "SLURM_NTASKS");
    let t0 = Instant::now();
    let procs = vec![rank(vars, 0, 2, &cfg), rank(vars, 1, 2, &cfg)];
    let errs = all_fail_within(procs, t0, Duration::from_secs(5));
    let rank1 = &errs[1];
    assert!(
        rank1.contains("cluster 1 (Slurm rank 1) runs on") && rank1.contains("192.0.2.7"),
        "{rank1}"
    );
    let rank0 = &errs[0];
    assert!(
        rank0.contains("cluster 1 failed: could not start: cluster 1 (Slurm rank 1)"),
        "{rank0}"
    );
}

#[test]
fn a_coordinator_that_cannot_start_stops_the_members_at_once() {
    // Cluster 0's INI port is taken: it cannot start, answers the member's registration
    // with the cause, and both exit long before the 20 s start-up timeout.
    let busy = common::busy_udp_port();
    let port = busy.local_addr().unwrap().port();
    let dir = TempDir::new("srun-c0-fails");
    let cfg = dir.write(
        "job.toml",
        &format!(
            "[job]\nstartup_timeout_ms = 20000\n\n[[cluster]]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
             [[cluster]]\nhost = \"127.0.0.1\"\n"
        ),
    );
    let cfg = cfg.to_str().unwrap();
    let water = [
        "run",
        "water",
        "--molecules",
        "64",
        "--steps",
        "1",
        "--config",
        cfg,
    ];
    // `hello` checks what `run` needs before joining, so it fails the same way.
    let hello = ["hello", "--config", cfg];
    for args in [&water[..], &hello[..]] {
        let t0 = Instant::now();
        let procs: Vec<Proc> = (0..2).rev().map(|r| step_rank(r, args, &[])).collect();
        let errs = all_fail_within(procs, t0, Duration::from_secs(5));
        let member = &errs[0];
        assert!(
            member.contains("cluster 0 failed: could not start: cannot bind INI 0 of cluster 0"),
            "{args:?}: {member}"
        );
    }
    drop(busy);
}

#[test]
fn a_coordinator_and_a_member_that_both_cannot_start_stop_at_once() {
    // Both INI ports are taken: the member reports that it cannot start to the
    // coordinator, which cannot start either and answers it; both exit long before the
    // 20 s start-up timeout (the coordinator used to wait for a registration).
    let busy: Vec<std::net::UdpSocket> = (0..2).map(|_| common::busy_udp_port()).collect();
    let ports: Vec<u16> = busy
        .iter()
        .map(|b| b.local_addr().unwrap().port())
        .collect();
    let dir = TempDir::new("srun-both-fail");
    let cfg = dir.write(
        "job.toml",
        &format!(
            "[job]\nstartup_timeout_ms = 20000\n\n[[cluster]]\nhost = \"127.0.0.1\"\nport = {}\n\n\
             [[cluster]]\nhost = \"127.0.0.1\"\nport = {}\n",
            ports[0], ports[1]
        ),
    );
    let args = ["hello", "--config", cfg.to_str().unwrap()];
    let t0 = Instant::now();
    let procs: Vec<Proc> = (0..2).rev().map(|r| step_rank(r, &args, &[])).collect();
    let errs = all_fail_within(procs, t0, Duration::from_secs(5));
    assert!(
        errs[0].contains("cannot bind INI 0 of cluster 1"),
        "{}",
        errs[0]
    );
    assert!(
        errs[1].contains("cannot bind INI 0 of cluster 0"),
        "{}",
        errs[1]
    );
    drop(busy);
}

#[test]
fn a_config_that_puts_cluster_0_elsewhere_stops_every_rank_within_seconds() {
    // srun placed rank 0 here (first node of the step: localhost), the config puts
    // cluster 0 on 192.0.2.7: rank 0 says so at once, rank 1 gives up on that address
    // after 2 s naming both, not after the 20 s start-up timeout.
    let dir = TempDir::new("srun-c0-elsewhere");
    let cfg = dir.write(
        "job.toml",
        "[job]\nstartup_timeout_ms = 20000\n\n[[cluster]]\nhost = \"192.0.2.7\"\n\n\
         [[cluster]]\nhost = \"127.0.0.1\"\n",
    );
    let t0 = Instant::now();
    let hello = ["hello", "--config", cfg.to_str().unwrap()];
    let placed = [
        ("SLURM_JOB_ID", "4242"),
        ("SLURM_STEP_NODELIST", "localhost"),
    ];
    let procs: Vec<Proc> = (0..2).map(|r| step_rank(r, &hello, &placed)).collect();
    let errs = all_fail_within(procs, t0, Duration::from_secs(6));
    let rank0 = &errs[0];
    assert!(
        rank0.contains("cluster 0 (Slurm rank 0) runs on"),
        "{rank0}"
    );
    let rank1 = &errs[1];
    assert!(
        rank1.contains(
            "Slurm placed rank 0 on localhost, but the config places cluster 0 on 192.0.2.7"
        ),
        "{rank1}"
    );
}
