//! `multigrain run` end to end with real cluster processes talking UDP through their
//! INIs: Water and EM3D on 2×2 (the embedded default job) and 4×1 agree with their
//! sequential references (Water to at least 9 significant digits, EM3D bitwise); the
//! runtime conformance suite passes on the DSM; the sequential Water prints SPLASH-3's
//! reference energies; `multigrain launch` and srun-style rank variables start the same
//! command as one cluster per process; bad input is reported naming the flag, file or
//! value. Problem sizes are small: every DSM job here takes a few seconds at most.
//!
//! The DSM jobs of this file run one at a time (a lock), so that a 2-core machine is not
//! oversubscribed by several jobs at once; every job's processes are checked gone.

mod common;

use multigrain_apps::water::StepEnergies;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use common::{
    HANG, Proc, Stream, TempDir, assert_gone, assert_no_segments, bin, free_port, launched_pids,
};

/// Bound on one small DSM job (start-up, run, statistics, shutdown).
const JOB: Duration = Duration::from_secs(120);

/// One DSM job at a time.
static JOBS: Mutex<()> = Mutex::new(());

fn one_job_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    JOBS.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `multigrain run ARGS…`, started as a user would (no launcher variables).
fn run_cmd(name: &str, args: &[&str]) -> Proc {
    let mut cmd = Command::new(bin());
    cmd.arg("run").args(args);
    for var in common::launch_vars() {
        cmd.env_remove(var);
    }
    Proc::spawn(name, cmd)
}

/// Runs `multigrain run ARGS… --json FILE` to success and returns the JSON report and
/// the process (for its output). With `clusters`, it is a DSM job whose processes must
/// all be gone afterwards.
fn run_ok(name: &str, args: &[&str], clusters: Option<usize>) -> (serde_json::Value, Proc) {
    let dir = TempDir::new("apps-run");
    let json = dir.path().join("report.json");
    let mut all: Vec<&str> = args.to_vec();
    let json_arg = json.to_string_lossy().into_owned();
    all.extend(["--json", &json_arg]);
    let mut p = run_cmd(name, &all);
    let pids = clusters.map(|n| launched_pids(&p, n));
    if let Some(pids) = &pids {
        p.adopt(pids);
    }
    let status = p.wait_exit(JOB);
    assert!(
        status.success(),
        "{name}: {status}; output:\n{}",
        p.transcript()
    );
    if let Some(pids) = &pids {
        assert_gone(pids, HANG, name);
    }
    let text = std::fs::read_to_string(&json)
        .unwrap_or_else(|e| panic!("{name}: no JSON report {}: {e}", json.display()));
    (serde_json::from_str(&text).expect("valid JSON"), p)
}

/// A configuration file of the workspace's examples.
fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("cluster-config/examples")
        .join(name)
}

/// SPLASH's `random.in` from the project's shared data folder (see
/// `multigrain_apps::shared_data`).
fn random_in() -> PathBuf {
    multigrain_apps::shared_data::find(
        Path::new(env!("CARGO_MANIFEST_DIR")),
        "splash2-water-random.in",
    )
    .unwrap_or_else(|e| panic!("SPLASH's velocity table is missing: {e}"))
}

fn energies(report: &serde_json::Value) -> Vec<Vec<f64>> {
    report["outcome"]["result"]["energies"]
        .as_array()
        .expect("energies")
        .iter()
        .map(|e| {
            StepEnergies::NAMES
                .iter()
                .map(|k| e[*k].as_f64().unwrap())
                .collect()
        })
        .collect()
}

/// Significant decimal digits on which `a` agrees with the reference `b` (17 if equal).
fn digits(a: f64, b: f64) -> f64 {
    if a == b {
        return 17.0;
    }
    let rel = ((a - b) / b).abs();
    (-rel.log10()).clamp(0.0, 17.0)
}

/// Water on the DSM vs the sequential reference: returns the fewest agreeing digits.
fn water_agrees(name: &str, topology: &[&str], clusters: usize) -> f64 {
    let size = ["--molecules", "125", "--steps", "3"];
    let _one = one_job_at_a_time();
    let (seq, _) = run_ok(
        &format!("{name} sequential"),
        &[&["water", "--sequential"][..], &size].concat(),
        None,
    );
    let (dsm, p) = run_ok(
        name,
        &[&["water"][..], topology, &size].concat(),
        Some(clusters),
    );
    assert_eq!(dsm["backend"]["kind"], "dsm");
    let threads: u64 = dsm["backend"]["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .sum();
    assert_eq!(dsm["outcome"]["result"]["threads"].as_u64(), Some(threads));
    let (s, d) = (energies(&seq), energies(&dsm));
    assert_eq!(s.len(), 3, "{name}: three printed steps");
    assert_eq!(s.len(), d.len());
    let mut fewest = 17.0f64;
    for (step, (a, b)) in d.iter().zip(&s).enumerate() {
        for (k, (&x, &y)) in a.iter().zip(b).enumerate() {
            let got = digits(x, y);
            assert!(
                got >= 9.0,
                "{name}: step {} {}: DSM {x:e} vs sequential {y:e}: only {got:.1} digits agree",
                step + 1,
                StepEnergies::NAMES[k]
            );
            fewest = fewest.min(got);
        }
    }
    // The printed report: SPLASH's step lines, the statistics, the INIs.
    let out = p.lines(Stream::Out).join("\n");
    for needle in [
        "energies every 1 step(s), SPLASH's layout",
        "DSM statistics",
        "remote fetches (pages)",
    ] {
        assert!(out.contains(needle), "{name}: no {needle:?} in\n{out}");
    }
    if clusters > 1 {
        for needle in ["LockAcquire", "INI utilization: c0/ini0"] {
            assert!(out.contains(needle), "{name}: no {needle:?} in\n{out}");
        }
        let stats = &dsm["stats"]["total"];
        assert!(stats["remote_fetches"].as_u64().unwrap() > 0, "{stats}");
        // The threads' network polls (paper 000 §3.4) of the inline INIs, in the JSON
        // and printed.
        assert!(
            stats["layer"]["network_polls"].as_u64().unwrap() > 0,
            "{stats}"
        );
        assert!(
            out.contains("receive polls reading the network"),
            "{name}: no network polls row in\n{out}"
        );
        assert!(stats["diffs_sent"].as_u64().unwrap() > 0, "{stats}");
        // The bytes of the grants, printed under their own heading as in the JSON.
        let grant_bytes = stats["bulk_bytes_sent"]["LockGrant"].as_u64().unwrap();
        assert!(grant_bytes > 0, "{stats}");
        let bytes_table = out
            .split("bulk message bytes sent, by kind")
            .nth(1)
            .unwrap_or_else(|| panic!("{name}: no bulk bytes table in\n{out}"));
        let grant_row = bytes_table
            .lines()
            .find(|l| l.trim_start().starts_with("LockGrant"))
            .unwrap_or_else(|| panic!("{name}: no LockGrant bytes row in\n{out}"));
        assert_eq!(
            grant_row.split_whitespace().nth(1),
            Some(grant_bytes.to_string().as_str()),
            "{name}: {grant_row}"
        );
    }
    let inis = if clusters > 1 { clusters } else { 0 };
    assert_eq!(
        dsm["inis"].as_array().unwrap().len(),
        inis,
        "one INI per cluster of a multi-cluster job"
    );
    eprintln!("{name}: Water DSM vs sequential: at least {fewest:.1} significant digits agree");
    fewest
}

#[test]
fn water_on_2x2_embedded_default_agrees_with_the_sequential_reference() {
    water_agrees("water 2x2", &[], 2);
}

#[test]
fn water_on_4x1_agrees_with_the_sequential_reference() {
    let cfg = example("4x1.toml");
    water_agrees("water 4x1", &["--config", cfg.to_str().unwrap()], 4);
}

#[test]
fn water_on_1x1_1x2_and_2x4_agrees_with_the_sequential_reference() {
    let dir = TempDir::new("apps-topologies");
    for (name, clusters, threads) in [("1x1", 1, 1), ("1x2", 1, 2), ("2x4", 2, 4)] {
        let cfg = dir.write(
            &format!("{name}.toml"),
            &format!(
                "[job]\nname = \"{name}\"\nstartup_timeout_ms = 20000\n[local]\nclusters = {clusters}\nthreads = {threads}\n[ini]\nsubstrate = \"udp\"\n"
            ),
        );
        water_agrees(
            &format!("water {name}"),
            &["--config", cfg.to_str().unwrap()],
            clusters,
        );
    }
}

fn checksum(report: &serde_json::Value) -> serde_json::Value {
    report["outcome"]["result"]["checksum"].clone()
}

/// EM3D on the DSM of `config` (None: the embedded default) in each (layout, variant)
/// is bitwise equal to the sequential reference on the same graph.
fn em3d_bitwise(name: &str, config: Option<&Path>, clusters: usize, cases: &[(&str, &str)]) {
    let size = [
        "--nodes-per-thread",
        "400",
        "--degree",
        "10",
        "--iterations",
        "5",
    ];
    let cfg: Vec<&str> = config
        .map(|c| vec!["--config", c.to_str().unwrap()])
        .unwrap_or_default();
    let _one = one_job_at_a_time();
    // The graph depends only on the partition count (the topology's thread count).
    let (seq, _) = run_ok(
        &format!("{name} sequential"),
        &[&["em3d", "--sequential"][..], &cfg, &size].concat(),
        None,
    );
    for (layout, variant) in cases {
        let case = format!("{name} {layout}/{variant}");
        let (dsm, p) = run_ok(
            &case,
            &[
                &["em3d", "--layout", layout, "--variant", variant][..],
                &cfg,
                &size,
            ]
            .concat(),
            Some(clusters),
        );
        assert_eq!(
            checksum(&dsm),
            checksum(&seq),
            "{case}: the DSM's fields differ from the sequential reference's"
        );
        let line = p
            .lines(Stream::Out)
            .into_iter()
            .find(|l| l.starts_with("checksum: "))
            .unwrap_or_else(|| panic!("{case}: no checksum line:\n{}", p.transcript()));
        let fnv = format!("{:016x}", checksum(&seq)["fnv1a"].as_u64().unwrap());
        assert!(line.contains(&fnv), "{case}: {line} lacks {fnv}");
        let edges = &dsm["outcome"]["result"]["edge_stats"];
        assert!(
            edges["cross_cluster_edges"].as_u64().unwrap() > 0,
            "{edges}"
        );
    }
}

#[test]
fn em3d_on_2x2_is_bitwise_equal_to_the_sequential_reference() {
    em3d_bitwise("em3d 2x2", None, 2, &[("naive", "read"), ("good", "write")]);
}

#[test]
fn em3d_on_4x1_is_bitwise_equal_to_the_sequential_reference() {
    em3d_bitwise(
        "em3d 4x1",
        Some(&example("4x1.toml")),
        4,
        &[("good", "read"), ("naive", "write")],
    );
}

#[test]
fn the_conformance_suite_passes_on_the_dsm() {
    for (name, config, clusters) in [
        ("conformance 2x2", None, 2),
        ("conformance 4x1", Some(example("4x1.toml")), 4),
    ] {
        let _one = one_job_at_a_time();
        let mut args = vec!["conformance"];
        if let Some(c) = &config {
            args.extend(["--config", c.to_str().unwrap()]);
        }
        let (r, _) = run_ok(name, &args, Some(clusters));
        let checks: Vec<&str> = r["outcome"]["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            checks,
            [
                "results_in_thread_order",
                "fresh_allocations",
                "barrier_publishes_writes",
                "locks_serialise_updates"
            ],
            "{name}"
        );
        assert!(r["stats"]["total"]["lock_acquires"].as_u64().unwrap() > 0);
    }
}

/// A small Water run on plain threads (no DSM, no cluster processes).
const SMALL_PLAIN_THREADS: &[&str] = &[
    "water",
    "--threads",
    "2",
    "--molecules",
    "64",
    "--steps",
    "2",
];

/// `-q` leaves stderr to errors: the same run prints its phases on stderr without it and
/// nothing with it, and the report on stdout either way.
#[test]
fn quiet_runs_print_the_report_and_no_progress() {
    for quiet in [false, true] {
        let mut args = if quiet { vec!["-q"] } else { vec![] };
        args.extend(SMALL_PLAIN_THREADS);
        let name = if quiet { "quiet" } else { "not-quiet" };
        let mut p = run_cmd(name, &args);
        let status = p.wait_exit(JOB);
        assert!(
            status.success(),
            "{name}: {status}; output:\n{}",
            p.transcript()
        );
        let out = p.lines(Stream::Out);
        assert!(
            out.iter()
                .any(|l| l.starts_with("energies every 1 step(s)")),
            "{name}: no report on stdout: {out:?}"
        );
        let err = p.lines(Stream::Err);
        if quiet {
            assert!(err.is_empty(), "{name}: stderr under -q: {err:?}");
        } else {
            assert!(
                err.iter().any(|l| l == "water: time steps (2 steps)…"),
                "{name}: no progress lines: {err:?}"
            );
        }
    }
}

#[test]
fn sequential_water_prints_splash_reference_energies() {
    let v = random_in();
    let v = v.to_str().unwrap();
    // ../shared/data/README.md: SPLASH-3 Water-Nsquared, gcc -O2.
    let cases: [(&str, &str, &[&str]); 2] = [
        (
            "512",
            "3",
            &[
                "         1        1.50940      0.00567     10.63575                      -2.12451",
                "           10.026        299.86725        -19.17021",
                "         2        1.53253      0.02268     10.61507                      -2.14571",
                "           10.025        302.16501        -19.33583",
                "         3        1.57495      0.05127     10.55761                      -2.15831",
                "           10.026        305.74022        -19.57198",
            ],
        ),
        (
            "343",
            "2",
            &[
                "         1        1.51255      0.00425     10.63337                      -2.12437",
                "           10.026        300.49293        -19.13468",
                "         2        1.54276      0.01706     10.61012                      -2.14544",
                "           10.025        303.49403        -19.28035",
            ],
        ),
    ];
    for (molecules, steps, want) in cases {
        let name = format!("water --sequential {molecules}x{steps}");
        let mut p = run_cmd(
            &name,
            &[
                "water",
                "--sequential",
                "--velocities",
                v,
                "--molecules",
                molecules,
                "--steps",
                steps,
            ],
        );
        let status = p.wait_exit(HANG);
        assert!(status.success(), "{name}: {status}\n{}", p.transcript());
        let out = p.lines(Stream::Out);
        let first = out
            .iter()
            .position(|l| l == want[0])
            .unwrap_or_else(|| panic!("{name}: no line {:?} in\n{}", want[0], out.join("\n")));
        assert_eq!(&out[first..first + want.len()], want, "{name}");
    }
    // The same from SPLASH's own input deck.
    let dir = TempDir::new("apps-deck");
    let deck = dir.write("n512", "1.5e-16 512 3 6\n-1 3000 1 0\n1 6.212752\n");
    let mut p = run_cmd(
        "water --input",
        &[
            "water",
            "--sequential",
            "--velocities",
            v,
            "--input",
            deck.to_str().unwrap(),
        ],
    );
    assert!(p.wait_exit(HANG).success(), "{}", p.transcript());
    assert!(
        p.lines(Stream::Out).iter().any(|l| l == cases[0].2[4]),
        "{}",
        p.transcript()
    );
}

#[test]
fn launch_and_srun_start_cluster_processes_of_the_same_command() {
    let size = ["--nodes-per-thread", "300", "--iterations", "3"];
    let _one = one_job_at_a_time();
    let dir = TempDir::new("apps-launch");
    let cfg = dir.write(
        "2x1.toml",
        "[job]\nname = \"2x1\"\nstartup_timeout_ms = 20000\n[local]\nclusters = 2\nthreads = 1\n[ini]\nsubstrate = \"udp\"\n",
    );
    let cfg_arg = cfg.to_str().unwrap();
    let (seq, _) = run_ok(
        "em3d 2x1 sequential",
        &[&["em3d", "--sequential", "--config", cfg_arg][..], &size].concat(),
        None,
    );
    let fnv = format!("{:016x}", checksum(&seq)["fnv1a"].as_u64().unwrap());

    // multigrain launch: cluster 0 prints the report, prefixed.
    let mut cmd = Command::new(bin());
    cmd.args([
        "launch",
        "--config",
        cfg_arg,
        "--",
        "multigrain",
        "run",
        "em3d",
    ])
    .args(size);
    for var in common::launch_vars() {
        cmd.env_remove(var);
    }
    let mut job = Proc::spawn("launch run em3d", cmd);
    let pids = launched_pids(&job, 2);
    job.adopt(&pids);
    let status = job.wait_exit(JOB);
    assert!(status.success(), "{status}\n{}", job.transcript());
    let out = job.lines(Stream::Out);
    assert!(
        out.iter()
            .any(|l| l.starts_with("[c0] checksum: ") && l.contains(&fnv)),
        "{}",
        job.transcript()
    );
    assert!(
        out.iter().any(|l| l.starts_with("[c0] DSM statistics")),
        "{}",
        job.transcript()
    );
    assert!(!out.iter().any(|l| l.starts_with("[c1] checksum")));
    assert_gone(&pids, HANG, "launch run em3d");

    // srun: each process finds its cluster from SLURM_PROCID; cluster 0 has a fixed port.
    let port = free_port();
    let srun_cfg = dir.write(
        "srun.toml",
        &format!(
            "[job]\nname = \"srun\"\nstartup_timeout_ms = 20000\n\n[[cluster]]\nhost = \"127.0.0.1\"\nport = {port}\n\n[[cluster]]\nhost = \"127.0.0.1\"\n\n[ini]\nsubstrate = \"udp\"\n"
        ),
    );
    let mut ranks: Vec<Proc> = (0..2)
        .rev()
        .map(|r| {
            let mut cmd = Command::new(bin());
            cmd.args(["run", "em3d", "--config", srun_cfg.to_str().unwrap()])
                .args(size);
            for var in common::launch_vars() {
                cmd.env_remove(var);
            }
            cmd.env("SLURM_PROCID", r.to_string())
                .env("SLURM_NTASKS", "2")
                .env("SLURM_STEP_ID", "0");
            Proc::spawn(&format!("srun rank {r}"), cmd)
        })
        .collect();
    ranks.reverse();
    let pids: Vec<i32> = ranks.iter().map(|p| p.pid).collect();
    for (r, p) in ranks.iter_mut().enumerate() {
        let status = p.wait_exit(JOB);
        assert!(status.success(), "rank {r}: {status}\n{}", p.transcript());
    }
    let out = ranks[0].lines(Stream::Out);
    assert!(
        out.iter()
            .any(|l| l.starts_with("checksum: ") && l.contains(&fnv)),
        "{}",
        ranks[0].transcript()
    );
    assert!(
        ranks[1].lines(Stream::Out).is_empty(),
        "only cluster 0 reports"
    );
    assert_gone(&pids, HANG, "srun-style run em3d");
}

/// Runs a command that must fail with exit code `code` and returns its stderr.
fn failing(name: &str, args: &[&str], code: i32) -> String {
    let mut p = run_cmd(name, args);
    let status = p.wait_exit(HANG);
    assert_eq!(status.code(), Some(code), "{name}\n{}", p.transcript());
    p.lines(Stream::Err).join("\n")
}

#[test]
fn set_values_change_the_job_every_cluster_runs() {
    let _one = one_job_at_a_time();
    let args = [
        "water",
        "--set",
        "local.clusters=3",
        "--set",
        "local.threads=1",
        "--set",
        "ini.policy=round-robin",
        "--set",
        "dsm.event_profile=true",
        "--molecules",
        "64",
        "--steps",
        "1",
    ];
    let (report, p) = run_ok("water --set", &args, Some(3));
    // Every cluster timed its events: as many acquires and barrier arrivals as its
    // machine counted, each with a handling time that contains the machine's part.
    for c in report["stats"]["clusters"].as_array().expect("clusters") {
        let events = &c["event_profile"]["events"];
        let acquires = &events["acquire"];
        assert_eq!(acquires["count"], c["protocol"]["lock_acquires"], "{c}");
        assert!(acquires["count"].as_u64().is_some_and(|n| n > 0), "{c}");
        assert_eq!(
            events["barrier"]["count"], c["protocol"]["barrier_arrivals"],
            "{c}"
        );
        for (kind, t) in events.as_object().expect("events by kind") {
            assert!(
                t["ns"].as_u64() >= t["machine_ns"].as_u64(),
                "{kind}: the whole handling contains the machine's part: {t}"
            );
        }
        assert!(
            c["event_profile"]["actions_ns"]["post bundles"].as_u64() > Some(0),
            "{c}"
        );
    }
    assert!(
        p.lines(Stream::Out)
            .iter()
            .any(|l| l.starts_with("handling by event (dsm.event_profile)")),
        "the report shows the profile: {}",
        p.transcript()
    );
    let b = &report["backend"];
    assert_eq!(b["threads"], serde_json::json!([1, 1, 1]), "{b}");
    assert_eq!(b["policy"], "round-robin", "{b}");
    assert!(
        b["config"]
            .as_str()
            .is_some_and(|c| c.contains("--set ini.policy=round-robin")),
        "{b}"
    );
    let e = failing("bad --set", &["water", "--set", "local.clusters=0"], 1);
    assert!(
        e.contains("--set local.clusters=0: local.clusters = 0: must be between 1 and 1024"),
        "{e}"
    );
    let e = failing("not KEY=VALUE", &["water", "--set", "local.clusters"], 2);
    assert!(e.contains("is not KEY=VALUE"), "{e}");
}

/// 2 clusters × 256 compute threads on this machine (hundreds of threads per core), over
/// UDP through the INIs and over shared memory: the job completes, with every cluster
/// alive throughout (no peer is declared dead because its INI or heartbeat got too
/// little CPU), and the energies agree with the sequential reference (issue 13).
#[test]
fn water_on_2x256_threads_completes_and_agrees_with_the_sequential_reference() {
    let _one = one_job_at_a_time();
    let size = ["--molecules", "64", "--steps", "2"];
    let (seq, _) = run_ok(
        "water 64x2 sequential",
        &[&["water", "--sequential"][..], &size].concat(),
        None,
    );
    for substrate in ["udp", "shm"] {
        let name = format!("water 2x256 over {substrate}");
        let substrate = format!("ini.substrate={substrate}");
        let (report, _p) = run_ok(
            &name,
            &[
                &["water"][..],
                &size,
                &[
                    "--set",
                    "local.clusters=2",
                    "--set",
                    "local.threads=256",
                    "--set",
                    &substrate,
                ],
            ]
            .concat(),
            Some(2),
        );
        assert_eq!(
            report["backend"]["threads"],
            serde_json::json!([256, 256]),
            "{name}: {}",
            report["backend"]
        );
        assert_eq!(report["outcome"]["result"]["threads"].as_u64(), Some(512));
        assert_energies_agree(&report, &seq, &name);
    }
}

/// A traced job over UDP with dedicated INI threads (paper 002 chapter 3): every cluster
/// writes its trace file, every message is found at both ends, the run report carries the
/// summary `multigrain trace summarize` prints from the same files, and the energies
/// still agree with the sequential run.
/// `report`'s Water energies agree with the sequential run's `seq` to at least 9
/// significant digits (parallel sums are added in another order).
fn assert_energies_agree(report: &serde_json::Value, seq: &serde_json::Value, what: &str) {
    let (a, b) = (energies(report), energies(seq));
    assert_eq!(a.len(), b.len(), "{what}: steps differ");
    for (a, b) in a.iter().flatten().zip(b.iter().flatten()) {
        assert!(digits(*a, *b) >= 9.0, "{what}: {a:e} vs sequential {b:e}");
    }
}

#[test]
fn clusters_with_different_ini_counts_use_every_ini_both_ways() {
    let _one = one_job_at_a_time();
    let dir = TempDir::new("apps-inis");
    let trace_dir = dir.path().join("traces");
    let config = dir.path().join("inis.toml");
    std::fs::write(
        &config,
        format!(
            "[[cluster]]\nhost = \"127.0.0.1\"\ninis = 1\n\
             [[cluster]]\nhost = \"127.0.0.1\"\ninis = 2\n\
             [[cluster]]\nhost = \"127.0.0.1\"\ninis = 3\nthreads = 2\n\
             [ini]\nsubstrate = \"udp\"\npolicy = \"round-robin\"\ninline = false\n\
             mtu = 8972\ntrace_dir = \"{}\"\n",
            trace_dir.display()
        ),
    )
    .expect("write the config");
    let common = ["water", "--molecules", "64", "--steps", "2"];
    let (seq, _) = run_ok(
        "water sequential",
        &[&common[..], &["--sequential"]].concat(),
        None,
    );
    let config = config.to_string_lossy().into_owned();
    let (report, _p) = run_ok(
        "water 1+2+3 INIs",
        &[&common[..], &["--config", &config]].concat(),
        Some(3),
    );
    assert_energies_agree(&report, &seq, "1+2+3 INIs");
    assert_eq!(
        report["backend"]["inis"],
        serde_json::json!([1, 2, 3]),
        "{}",
        report["backend"]
    );
    let t = &report["trace"];
    assert_eq!(
        t["joined"], t["messages"],
        "every message at both ends: {t}"
    );
    let inis = t["inis"].as_array().expect("trace.inis");
    assert_eq!(inis.len(), 6, "1 + 2 + 3 INIs: {t}");
    for i in inis {
        for dir in ["sent", "received"] {
            assert!(
                i[dir].as_u64().unwrap_or(0) > 0,
                "INI {}/{} {dir} nothing: any INI must reach any remote INI: {t}",
                i["cluster"],
                i["ini"]
            );
        }
    }
}

#[test]
fn traced_dedicated_inis_report_message_times_from_both_ends() {
    let _one = one_job_at_a_time();
    let dir = TempDir::new("apps-trace");
    let trace_dir = dir.path().join("traces");
    let trace_set = format!("ini.trace_dir={}", trace_dir.display());
    let common = ["water", "--molecules", "64", "--steps", "2"];
    let (seq, _) = run_ok(
        "water sequential",
        &[&common[..], &["--sequential"]].concat(),
        None,
    );
    let mut args: Vec<&str> = common.to_vec();
    for set in [
        "local.clusters=2",
        "local.threads=2",
        "ini.substrate=udp",
        "ini.per_cluster=2",
        "ini.policy=least-loaded",
        "ini.inline=false",
        &trace_set,
    ] {
        args.extend(["--set", set]);
    }
    let (report, _p) = run_ok("water traced", &args, Some(2));
    assert_energies_agree(&report, &seq, "traced run");
    let t = &report["trace"];
    let messages = t["messages"].as_u64().expect("trace.messages");
    assert!(messages > 100, "too few traced messages: {t}");
    assert_eq!(
        t["joined"], t["messages"],
        "every message at both ends: {t}"
    );
    assert_eq!(t["dropped"], 0, "{t}");
    let inis = t["inis"].as_array().expect("trace.inis");
    assert_eq!(inis.len(), 4, "2 clusters × 2 INIs: {t}");
    for i in inis {
        assert!(
            i["sent"].as_u64().unwrap_or(0) > 0,
            "an INI sent nothing: {i}"
        );
        let util = i["utilization"].as_f64().unwrap_or(-1.0);
        assert!((0.0..=1.0).contains(&util), "utilization {util}: {i}");
    }
    let time = t["mean_message_time_us"].as_f64().unwrap_or(-1.0);
    assert!(time > 0.0 && time.is_finite(), "message time {time}: {t}");
    // The command-line summary of the same files says the same.
    let files: Vec<String> = (0..2)
        .map(|c| {
            trace_dir
                .join(format!("trace-cluster-{c}.mgtrace"))
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let out = dir.path().join("summary.json");
    let mut cmd = Command::new(bin());
    cmd.args(["trace", "summarize"])
        .args(&files)
        .arg("--json")
        .arg(&out);
    let mut p = Proc::spawn("trace summarize", cmd);
    assert!(p.wait_exit(HANG).success(), "{}", p.transcript());
    let again: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("summary written"))
            .expect("valid JSON");
    assert_eq!(&again, t, "the report and `trace summarize` disagree");
}

#[test]
fn bad_input_is_reported_naming_the_flag_file_or_value() {
    let dir = TempDir::new("apps-bad");
    let e = failing("not a cube", &["water", "--molecules", "500"], 1);
    assert!(
        e.contains("--molecules: 500 molecules do not fill a cubic lattice")
            && e.contains("343, 512, 4096"),
        "{e}"
    );
    let e = failing("bad layout", &["em3d", "--layout", "diagonal"], 2);
    assert!(
        e.contains("invalid value 'diagonal' for '--layout <LAYOUT>'") && e.contains("naive"),
        "{e}"
    );
    let e = failing("remote > 100", &["em3d", "--percent-remote", "101"], 2);
    assert!(
        e.contains("--percent-remote") && e.contains("0..=100"),
        "{e}"
    );
    let e = failing("bad timestep", &["water", "--timestep=-1e-16"], 1);
    assert!(e.contains("--timestep -1e-16: must be a positive"), "{e}");
    let e = failing(
        "missing velocities",
        &["water", "--velocities", "/nonexistent/random.in"],
        1,
    );
    assert!(
        e.contains("--velocities /nonexistent/random.in: cannot open the velocity file"),
        "{e}"
    );
    let short = dir.write("short.in", "0 1 2 3\n");
    let e = failing(
        "short velocities",
        &["water", "--velocities", short.to_str().unwrap()],
        1,
    );
    assert!(e.contains("short.in"), "{e}");
    let deck = dir.write("deck", "1.5e-16 512 3 6\n-1 3000 x 0\n1 6.2\n");
    let e = failing(
        "bad deck",
        &["water", "--sequential", "--input", deck.to_str().unwrap()],
        1,
    );
    assert!(
        e.contains("deck:2: field NPRINT = \"x\": not an integer"),
        "{e}"
    );
    let unequal = dir.write(
        "unequal.toml",
        "[[cluster]]\nhost = \"127.0.0.1\"\nthreads = 1\n\n[[cluster]]\nhost = \"127.0.0.1\"\nthreads = 2\n",
    );
    let e = failing(
        "good layout on unequal clusters",
        &[
            "em3d",
            "--layout",
            "good",
            "--config",
            unequal.to_str().unwrap(),
        ],
        1,
    );
    assert!(
        e.contains("--layout good does not fit this topology"),
        "{e}"
    );
    let e = failing(
        "bad config",
        &[
            "water",
            "--config",
            dir.write("bad.toml", "[local]\nclusters = 0\n")
                .to_str()
                .unwrap(),
        ],
        1,
    );
    assert!(e.contains("bad.toml:2:12: local.clusters = 0"), "{e}");
    let e = failing(
        "threads and config",
        &["water", "--threads", "2", "--config", "x"],
        2,
    );
    assert!(e.contains("cannot be used with"), "{e}");
    let e = failing(
        "sequential conformance",
        &["conformance", "--sequential"],
        1,
    );
    assert!(e.contains("drop --sequential"), "{e}");
}

#[test]
fn plain_threads_run_on_one_process() {
    let (r, p) = run_ok("water --threads 2", SMALL_PLAIN_THREADS, None);
    assert_eq!(
        r["backend"],
        serde_json::json!({"kind": "threads", "threads": 2})
    );
    assert!(r["stats"].is_null());
    assert!(
        p.lines(Stream::Out)
            .iter()
            .any(|l| l.contains("no DSM statistics")),
        "{}",
        p.transcript()
    );
}

#[test]
fn json_to_stdout_carries_metadata_and_no_sentinels() {
    let _one = one_job_at_a_time();
    let mut p = run_cmd(
        "water --json -",
        &[
            "water",
            "--molecules",
            "64",
            "--steps",
            "1",
            "--set",
            "local.threads=1",
            "--json",
            "-",
        ],
    );
    let pids = launched_pids(&p, 2);
    p.adopt(&pids);
    let status = p.wait_exit(JOB);
    assert!(status.success(), "{status}: {}", p.transcript());
    assert_gone(&pids, HANG, "clusters of the --json - run");
    // stdout is the JSON alone (the text report went to stderr).
    let out = p.lines(Stream::Out).join("\n");
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{out}"));
    assert!(
        p.lines(Stream::Err)
            .iter()
            .any(|l| l.starts_with("Water-Nsquared:")),
        "the text report goes to stderr: {}",
        p.transcript()
    );
    assert!(
        report["stats"]["clusters"][0]
            .get("event_profile")
            .is_none(),
        "no event profile unless dsm.event_profile asks for one"
    );
    let meta = &report["meta"];
    assert_eq!(meta["schema_version"], 1, "{meta}");
    assert!(
        meta["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{meta}"
    );
    assert_eq!(
        meta["cluster_hosts"],
        serde_json::json!(["127.0.0.1", "127.0.0.1"])
    );
    assert!(
        meta["argv"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "--json")),
        "{meta}"
    );
    let config = meta["config"].as_str().expect("the resolved config");
    assert!(
        config.contains("threads = 1") && config.contains("[ini]"),
        "{config}"
    );
    // The job total has no cluster number; each cluster has its own.
    let stats = &report["stats"];
    assert!(
        stats["total"].get("cluster").is_none(),
        "{}",
        stats["total"]
    );
    assert_eq!(stats["clusters"][1]["cluster"], 1);
    // Each cluster says which CPUs it ran on (its own mask, as the kernel lists it);
    // the total does not.
    assert!(stats["total"].get("cpus").is_none(), "{}", stats["total"]);
    for c in 0..2 {
        let cpus = stats["clusters"][c]["cpus"].as_str().unwrap_or_default();
        assert!(
            !cpus.is_empty()
                && cpus
                    .chars()
                    .all(|ch| ch.is_ascii_digit() || ",-".contains(ch)),
            "cluster {c}: cpus {cpus:?}"
        );
    }
}

#[test]
fn completions_and_man_pages_are_generated() {
    let dir = TempDir::new("apps-man");
    let mut cmd = Command::new(bin());
    cmd.args(["completions", "bash"]);
    let mut p = Proc::spawn("completions bash", cmd);
    assert!(p.wait_exit(HANG).success(), "{}", p.transcript());
    let script = p.lines(Stream::Out).join("\n");
    // Subcommands and their flags are completed.
    for word in ["_multigrain", "summarize", "--molecules", "--json"] {
        assert!(script.contains(word), "no {word} in the bash completions");
    }
    let mut cmd = Command::new(bin());
    cmd.args(["man", "--out"]).arg(dir.path());
    let mut p = Proc::spawn("man", cmd);
    assert!(p.wait_exit(HANG).success(), "{}", p.transcript());
    for page in [
        "multigrain.1",
        "multigrain-run.1",
        "multigrain-trace-summarize.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(page))
            .unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{page} is not roff"
        );
    }
}

/// The limits `config check` accepts run: the smallest and largest `ini.window` (1 frame,
/// the sliding window's own limit) over the INIs, and the largest `dsm.region_size` (what
/// the coherence protocol can number, 64 GiB).
#[test]
fn the_limits_the_schema_accepts_run() {
    let _one = one_job_at_a_time();
    for set in [
        "ini.window=1",
        "ini.window=32768",
        "dsm.region_size=\"64GiB\"",
    ] {
        let (report, _) = run_ok(
            set,
            &["water", "--molecules", "64", "--steps", "1", "--set", set],
            Some(2),
        );
        assert!(
            report["run_s"].as_f64().is_some_and(|s| s > 0.0),
            "{report}"
        );
    }
}

/// Ctrl-C of `multigrain run` stops every cluster, exits with 130 and leaves no scratch
/// directory (the resolved config and the progress socket) behind.
#[test]
fn interrupted_run_exits_130_and_leaves_no_scratch_directory() {
    let _one = one_job_at_a_time();
    let mut p = run_cmd(
        "interrupted",
        &[
            "water",
            "--molecules",
            "1000",
            "--steps",
            "50",
            "--set",
            "ini.window=64",
        ],
    );
    p.wait_line("water: time steps", JOB);
    let scratch = format!("multigrain-run-{}-", p.pid);
    let ours = || -> Vec<String> {
        std::fs::read_dir(std::env::temp_dir())
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&scratch))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        ours().len(),
        1,
        "the run's scratch directory exists while it runs"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(p.pid),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = p.wait_exit(JOB);
    assert_eq!(status.code(), Some(130), "{}", p.transcript());
    assert!(ours().is_empty(), "left behind: {:?}", ours());
}

/// The progress watchdog end to end: an application deadlock (`multigrain run
/// deadlock`: whoever holds the lock waits at a barrier, everyone else waits for the
/// lock) on 2×1 over UDP fails within `job.progress_timeout_ms` plus a watchdog
/// period or two, with a report naming what every cluster's thread waits for, and
/// leaves no process behind.
#[test]
fn a_deadlocked_job_fails_naming_every_wait() {
    let _one = one_job_at_a_time();
    let (p, pids, took, err) = failing_job(
        "deadlock",
        "[job]\nprogress_timeout_ms = 1500\n[local]\nclusters = 2\nthreads = 1\n",
    );
    for what in [
        "no progress for 1.5 s (job.progress_timeout_ms)",
        "dsm-c0-t0",
        "dsm-c1-t0",
        "acquiring lock 0",
        "at a barrier",
        "2 of 2 clusters failed",
    ] {
        assert!(err.contains(what), "missing {what:?} in:\n{err}");
    }
    // 1.5 s of stall, reports every 375 ms, start-up and teardown: well under 20 s
    // unless the watchdog did not fire (the launcher's own teardown takes 5 s more).
    assert!(took < Duration::from_secs(20), "took {took:?}:\n{err}");
    assert_gone(&pids, HANG, "deadlock");
    assert_no_leftovers(p.pid, &pids, "deadlock");
}

/// Runs `multigrain run APP` (APP = `app`, a hidden failure scenario) on a 2-cluster job
/// whose config is `toml`, and checks that it fails. Returns the process, the cluster
/// pids, how long it took and its standard error.
fn failing_job(app: &str, toml: &str) -> (Proc, Vec<i32>, Duration, String) {
    let dir = TempDir::new(app);
    let config = dir.write("job.toml", toml);
    let config = config.to_string_lossy().into_owned();
    let t0 = std::time::Instant::now();
    let mut p = run_cmd(app, &[app, "--config", &config]);
    let pids = launched_pids(&p, 2);
    p.adopt(&pids);
    let status = p.wait_exit(JOB);
    let took = t0.elapsed();
    let err = p.lines(Stream::Err).join("\n");
    assert!(
        !status.success(),
        "{app} on {toml:?} cannot succeed:\n{err}"
    );
    (p, pids, took, err)
}

/// Entries named `multigrain-…-PID-…` of any of `pids` in the temporary directory (the
/// run's scratch directory `multigrain-run-PID-…` holds the resolved config and the
/// progress socket).
fn scratch_left(pids: &[i32]) -> Vec<String> {
    std::fs::read_dir(std::env::temp_dir())
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    n.starts_with("multigrain-")
                        && pids.iter().any(|p| n.contains(&format!("-{p}-")))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Neither `run` (pid `run`) nor its cluster processes left a shared-memory segment or
/// a scratch directory behind.
fn assert_no_leftovers(run: i32, clusters: &[i32], what: &str) {
    let mut all = clusters.to_vec();
    all.push(run);
    assert_no_segments(&all, what);
    let left = scratch_left(&all);
    assert!(left.is_empty(), "{what}: scratch left: {left:?}");
}

/// A panic in a compute thread (`multigrain run panic`: the last thread panics between
/// two barriers) fails the job at once everywhere, naming the thread and the panic, on
/// both substrates, and the cluster that panicked (exit through its failure path) and
/// the one stopped because of it leave no process, shared-memory segment (the shm
/// substrate's queues, the region) or scratch directory behind.
#[test]
fn a_panicking_compute_thread_fails_the_job_and_leaves_nothing_behind() {
    let _one = one_job_at_a_time();
    for substrate in ["shm", "udp"] {
        let (p, pids, took, err) = failing_job(
            "panic",
            &format!("[local]\nclusters = 2\nthreads = 1\n[ini]\nsubstrate = \"{substrate}\"\n"),
        );
        for what in [
            "compute thread 1 panicked: deliberate panic",
            "2 of 2 clusters failed: cluster 1",
            "cluster 0 then stopped because another cluster failed",
        ] {
            assert!(
                err.contains(what),
                "{substrate}: missing {what:?} in:\n{err}"
            );
        }
        // Reported at once, not through a timeout.
        assert!(
            took < Duration::from_secs(10),
            "{substrate}: took {took:?}:\n{err}"
        );
        assert_gone(&pids, HANG, "panic");
        assert_no_leftovers(p.pid, &pids, &format!("panic over {substrate}"));
    }
}
