//! `multigrain experiment NAME --quick` end to end: every experiment runs its small
//! sweep of real runs and writes its tables (CSV, JSON, text) and figure (PNG, SVG).
//! Only the shape of the output is checked, never a timing: every expected row is
//! there, numbers are finite and positive where they must be, utilizations and count
//! rates lie in [0, 1], the model's bound Q ≤ N holds (mva), and the figure files are
//! non-empty.
//!
//! The experiments run one at a time (a lock): each already puts several cluster
//! processes on the machine.

mod common;

use common::{Proc, TempDir, bin};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

/// Bound on one quick experiment (under a minute on a 2-core machine when idle).
const LIMIT: Duration = Duration::from_secs(300);

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `multigrain experiment NAME --quick --out DIR EXTRA…` to success and returns
/// the JSON document it wrote.
fn experiment(name: &str, dir: &Path, extra: &[&str]) -> Value {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cmd = Command::new(bin());
    cmd.args(["experiment", name, "--quick", "--out"])
        .arg(dir)
        .args(extra);
    for var in common::launch_vars() {
        cmd.env_remove(var);
    }
    let mut p = Proc::spawn(name, cmd);
    let status = p.wait_exit(LIMIT);
    assert!(status.success(), "{name}: {status}\n{}", p.transcript());
    for ext in ["png", "svg"] {
        let f = dir.join(format!("{name}.{ext}"));
        let len = std::fs::metadata(&f).map_or(0, |m| m.len());
        assert!(len > 1000, "{}: {len} bytes", f.display());
    }
    let text = std::fs::read_to_string(dir.join(format!("{name}.txt"))).unwrap();
    assert!(text.contains("core(s)"), "no core count:\n{text}");
    let json = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
    let doc: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(doc["experiment"], name);
    assert_eq!(doc["failed_runs"], 0);
    doc
}

/// The table `id` of a document, and its CSV's data lines (as many as rows).
fn table<'a>(doc: &'a Value, dir: &Path, id: &str) -> &'a [Value] {
    let t = doc["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id)
        .unwrap_or_else(|| panic!("no table {id}"));
    let rows = t["rows"].as_array().unwrap();
    let csv = std::fs::read_to_string(dir.join(format!("{id}.csv"))).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), rows.len() + 1, "{id}.csv:\n{csv}");
    let width = lines[0].split(',').count();
    assert!(width >= t["columns"].as_array().unwrap().len());
    rows
}

/// The median of a `{median, min, max}` cell, checked finite with min ≤ median ≤ max.
fn median(row: &Value, key: &str) -> f64 {
    let c = &row[key];
    let (m, lo, hi) = (c["median"].as_f64(), c["min"].as_f64(), c["max"].as_f64());
    let (Some(m), Some(lo), Some(hi)) = (m, lo, hi) else {
        panic!("{key} is not a summary in {row}");
    };
    assert!(m.is_finite() && lo <= m && m <= hi, "{key} in {row}");
    m
}

/// Runs `multigrain experiment NAME --quick EXTRA… --out DIR/refused`, which must fail;
/// its standard error.
fn refused(name: &str, dir: &Path, extra: &[&str]) -> String {
    let out = Command::new(bin())
        .args(["experiment", name, "--quick"])
        .args(extra)
        .arg("--out")
        .arg(dir.join("refused"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "{name} {extra:?} was accepted");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn positive(row: &Value, key: &str) -> f64 {
    let m = median(row, key);
    assert!(m > 0.0, "{key} = {m} in {row}");
    m
}

fn fraction(row: &Value, key: &str) -> f64 {
    let m = median(row, key);
    assert!((0.0..=1.0).contains(&m), "{key} = {m} in {row}");
    m
}

fn text(row: &Value, key: &str) -> String {
    row[key].as_str().unwrap_or_default().to_owned()
}

#[test]
fn ini_scheduling_has_every_shape_ini_count_and_policy() {
    let dir = TempDir::new("exp-ini");
    let doc = experiment("ini-scheduling", dir.path(), &[]);
    let rows = table(&doc, dir.path(), "ini-scheduling");
    // 4 threads: 4×1 (1 INI) and 2×2 (1, 2 INIs) × 3 policies, a No IO node and an IO
    // delay row per shape, and the 1×4 all-hardware row.
    assert_eq!(rows.len(), 3 + 6 + 2 * 2 + 1, "{rows:#?}");
    for (shape, k) in [("4×1", 1), ("2×2", 1), ("2×2", 2)] {
        for policy in ["static", "round-robin", "least-loaded"] {
            let r = rows
                .iter()
                .find(|r| {
                    text(r, "shape") == shape
                        && r["inis"] == k
                        && text(r, "configuration") == policy
                })
                .unwrap_or_else(|| panic!("no row {shape} {k} {policy}"));
            positive(r, "msg_len_bytes");
            positive(r, "msg_time_us");
            assert!(median(r, "queue_len") >= 0.0);
            assert!(fraction(r, "ini_utilization") > 0.0);
            positive(r, "run_s");
            positive(r, "slowdown_vs_no_io");
            positive(r, "slowdown_vs_io_delay");
        }
        let base = |c: &str| {
            rows.iter()
                .find(|r| text(r, "shape") == shape && text(r, "configuration").starts_with(c))
                .unwrap_or_else(|| panic!("no {c} row for {shape}"))
        };
        assert_eq!(median(base("No IO node"), "slowdown_vs_no_io"), 1.0);
        assert_eq!(median(base("IO delay"), "slowdown_vs_io_delay"), 1.0);
        assert!(text(base("IO delay"), "configuration").contains("µs"));
    }
    let hw = rows
        .iter()
        .find(|r| text(r, "shape") == "1×4")
        .expect("1×4 row");
    positive(hw, "run_s");
    let latency = doc["params"]["io_delay_latency_us"].as_array().unwrap();
    assert_eq!(latency.len(), 2);
    assert!(latency.iter().all(|l| l["latency_us"].as_u64() >= Some(1)));
    let pivot = table(&doc, dir.path(), "ini-scheduling-policies");
    assert_eq!(pivot.len(), 3);
    for r in pivot {
        positive(r, "round_robin_vs_static");
        positive(r, "least_loaded_vs_static");
    }
}

#[test]
fn mis_scheduling_has_rates_per_policy() {
    let dir = TempDir::new("exp-mis");
    let doc = experiment("mis-scheduling", dir.path(), &[]);
    let rows = table(&doc, dir.path(), "mis-scheduling");
    // 4 threads: 2×2 with 2 INIs × 3 policies.
    assert_eq!(rows.len(), 3, "{rows:#?}");
    for (r, policy) in rows.iter().zip(["static", "round-robin", "least-loaded"]) {
        assert_eq!(text(r, "policy"), policy);
        assert_eq!(r["inis"], 2);
        positive(r, "messages");
        fraction(r, "misscheduled_count_rate");
        // Wasted queue time over busy time: not bounded by 1, but never negative.
        assert!(median(r, "misscheduled_time_rate") >= 0.0);
        positive(r, "run_s");
    }
}

#[test]
fn cluster_size_has_every_app_shape_and_the_edge_split() {
    let dir = TempDir::new("exp-clu");
    let doc = experiment("cluster-size", dir.path(), &[]);
    let rows = table(&doc, dir.path(), "cluster-size");
    // 3 apps × (4×1: INIs + No IO, 2×2: INIs + No IO, 1×4: hardware).
    assert_eq!(rows.len(), 3 * 5, "{rows:#?}");
    for r in rows {
        positive(r, "run_s");
        positive(r, "slowdown_vs_one_cluster");
        let clustered = text(r, "shape") != "1×4";
        if clustered {
            positive(r, "slowdown_vs_no_io");
            positive(r, "remote_fetches");
            positive(r, "dsm_messages");
        }
        if text(r, "app") == "EM3D" {
            let (local, remote) = (r["edges_local"].as_u64(), r["edges_remote"].as_u64());
            assert!(local.is_some() && remote.is_some(), "{r}");
            assert_eq!(remote.unwrap() > 0, clustered, "{r}");
        } else {
            assert!(median(r, "lock_acquires") > 0.0, "{r}");
        }
    }
    for layout in ["naive", "good"] {
        assert!(rows.iter().any(|r| text(r, "layout") == layout));
    }
}

#[test]
fn mva_has_a_row_per_n_within_the_model_bound() {
    let dir = TempDir::new("exp-mva");
    let doc = experiment("mva", dir.path(), &[]);
    let rows = table(&doc, dir.path(), "mva");
    // --quick: N = 1 … 3, one round.
    assert_eq!(rows.len(), 3, "{rows:#?}");
    let cores = doc["cores"].as_u64().expect("cores");
    for (i, r) in rows.iter().enumerate() {
        let n = i as u64 + 1;
        assert_eq!(r["n"].as_u64(), Some(n), "{r}");
        assert_eq!(
            r["threads"].as_u64(),
            Some(n + 3),
            "N clients, server, 2 INIs: {r}"
        );
        for k in ["q_measured", "q_model", "q_exact"] {
            let q = positive(r, k);
            assert!(r[k]["max"].as_f64().unwrap() <= n as f64, "{k} > N in {r}");
            assert!(q <= n as f64, "{k} = {q} > N = {n}");
        }
        for k in ["r_measured", "r_model", "r_exact"] {
            positive(r, k);
        }
        for k in ["q_error", "q_exact_error", "r_error"] {
            median(r, k);
        }
        assert_eq!(text(r, "q_within_n"), "yes", "{r}");
        assert_eq!(text(r, "note") == "oversubscribed", n + 3 > cores, "{r}");
    }
    let cal = &doc["params"]["calibration"];
    for k in ["w", "big_o", "solo_cycle"] {
        let x = cal[k].as_f64().unwrap_or(f64::NAN);
        assert!(x.is_finite() && x > 0.0, "calibration {k} = {x}");
    }
    let txt = std::fs::read_to_string(dir.path().join("mva.txt")).unwrap();
    assert!(
        txt.contains("Figure 6-3") && txt.contains("model inputs"),
        "{txt}"
    );
    // The runs are not `multigrain run` jobs: a --set would change nothing, so it is
    // refused rather than ignored.
    let err = refused("mva", dir.path(), &["--set", "ini.window=64"]);
    assert!(err.contains("--set"), "{err}");
}

#[test]
fn message_size_has_every_path_kind_size_and_sender_count() {
    let dir = TempDir::new("exp-msz");
    let doc = experiment("message-size", dir.path(), &[]);
    // --quick: sizes 8, 64, 512, 4096, 32768; 1 and 2 senders; three paths.
    let sizes = [8u64, 64, 512, 4096, 32768];
    let paths = ["threads", "shm (2 processes)", "INIs (UDP loopback)"];
    let kinds = [
        ("express", "Express"),
        ("basic", "Basic"),
        ("tag_on", "Tag-On"),
        ("bulk", "bulk"),
    ];
    // Express carries at most 256 bytes (64 words); every other kind every size.
    let carries = |kind: &str, size: u64| kind != "express" || size <= 256;
    let lat = table(&doc, dir.path(), "message-size-latency");
    assert_eq!(lat.len(), paths.len() * sizes.len(), "{lat:#?}");
    let bw = table(&doc, dir.path(), "message-size-bandwidth");
    assert_eq!(bw.len(), paths.len() * sizes.len(), "{bw:#?}");
    for (i, path) in paths.iter().enumerate() {
        for (j, &size) in sizes.iter().enumerate() {
            let (l, b) = (&lat[i * sizes.len() + j], &bw[i * sizes.len() + j]);
            for r in [l, b] {
                assert_eq!(text(r, "path"), *path, "{r}");
                assert_eq!(r["size"].as_u64(), Some(size), "{r}");
            }
            assert_eq!(text(l, "messages").split('/').count(), 4, "{l}");
            for (id, _) in kinds {
                let keys = [
                    (l, format!("{id}_us")),
                    (b, format!("{id}_x1_mbs")),
                    (b, format!("{id}_x2_mbs")),
                ];
                for (r, key) in keys {
                    if carries(id, size) {
                        positive(r, &key);
                    } else {
                        assert!(r[&key].is_null(), "{key} measured in {r}");
                    }
                }
            }
        }
    }
    let half = table(&doc, dir.path(), "message-size-half-power");
    assert_eq!(half.len(), paths.len() * kinds.len() * 2, "{half:#?}");
    for r in half {
        positive(r, "peak_mbs");
        let n = r["n_half"].as_u64().expect("n½ is a size");
        let peak_at = r["peak_at"].as_u64().expect("peak size");
        assert!(sizes.contains(&n) && sizes.contains(&peak_at), "{r}");
        assert!(n <= peak_at, "n½ above the peak's size: {r}");
        if !r["n_half_interp"].is_null() {
            let x = positive(r, "n_half_interp");
            assert!(x <= n as f64 + 1e-6, "{r}");
        }
        let one_sender = r["senders"].as_u64() == Some(1);
        assert_eq!(!r["n_half_pingpong"].is_null(), one_sender, "{r}");
    }
    for what in ["latency", "bandwidth"] {
        for ext in ["png", "svg"] {
            let f = dir.path().join(format!("message-size-{what}.{ext}"));
            let len = std::fs::metadata(&f).map_or(0, |m| m.len());
            assert!(len > 1000, "{}: {len} bytes", f.display());
        }
    }
    assert_eq!(doc["params"]["sizes"].as_array().map(Vec::len), Some(5));
    // The runs are microbenchmarks, not `multigrain run` jobs: --set is refused.
    let err = refused("message-size", dir.path(), &["--set", "ini.window=64"]);
    assert!(err.contains("--set"), "{err}");
}

#[test]
fn polling_has_every_path_condition_and_policy_with_its_logp_parameters() {
    let dir = TempDir::new("exp-poll");
    // The adaptive bounds come from the job's configuration keys.
    let doc = experiment(
        "polling",
        dir.path(),
        &[
            "--set",
            "ini.poll_interval_min=16",
            "--set",
            "ini.poll_interval_max=128",
        ],
    );
    let rows = table(&doc, dir.path(), "polling");
    // Shared memory alone, then 3 settings × 4 policies.
    assert_eq!(rows.len(), 13, "{rows:#?}");
    assert_eq!(text(&rows[0], "condition"), "alone (no network)");
    let policies = ["every poll", "1 in 8", "1 in 32", "adaptive"];
    for (i, r) in rows[1..].iter().enumerate() {
        assert_eq!(text(r, "policy"), policies[i % 4], "{r}");
        let network = i >= 8;
        assert_eq!(text(r, "path").starts_with("network"), network, "{r}");
        // Only shared-memory rows are compared with shared memory alone.
        assert_eq!(r["rtt_vs_alone"].is_object(), !network, "{r}");
        if !network {
            positive(r, "rtt_vs_alone");
        }
    }
    for r in rows {
        for k in ["rtt_us", "o_s_us", "o_r_us", "g_us"] {
            positive(r, k);
        }
        // L = RTT/2 − o_s − o_r may be negative (overlapping overheads), but is bounded
        // by half the round trip.
        assert!(median(r, "l_us") <= median(r, "rtt_us") / 2.0, "{r}");
    }
    let adaptive = &doc["params"]["adaptive"];
    assert_eq!(adaptive["poll_interval_min"], 16);
    assert_eq!(adaptive["poll_interval_max"], 128);
    let txt = std::fs::read_to_string(dir.path().join("polling.txt")).unwrap();
    assert!(
        txt.contains("adaptive = 1 in 16–128") && txt.contains("paper 000's claim"),
        "{txt}"
    );
    // Bounds that cross are refused, naming the key.
    let err = refused(
        "polling",
        dir.path(),
        &["--set", "ini.poll_interval_min=64"],
    );
    assert!(err.contains("ini.poll_interval_min"), "{err}");
}

#[test]
fn loggp_calibrate_has_a_baseline_and_a_setting_per_parameter_and_the_signature() {
    let dir = TempDir::new("exp-cal");
    let doc = experiment("loggp-calibrate", dir.path(), &[]);
    let rows = table(&doc, dir.path(), "loggp-calibrate");
    // --quick: 0 and one value for each of o, g, L, G.
    assert_eq!(rows.len(), 8, "{rows:#?}");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(text(r, "param"), ["o", "g", "L", "G"][i / 2], "{r}");
        let desired = median(r, "desired");
        assert_eq!(desired == 0.0, i % 2 == 0, "{r}");
        for k in ["o_us", "g_us", "big_g_ns"] {
            positive(r, k);
        }
        let verdict = text(r, "within");
        assert!(
            ["baseline", "yes", "NO", "below the baseline"].contains(&verdict.as_str()),
            "{r}"
        );
    }
    // o is a busy loop of the sender and of the receiver: it shows up whatever the load.
    assert!(
        median(&rows[1], "o_us") >= 0.9 * median(&rows[1], "desired"),
        "{:?}",
        rows[1]
    );
    let sig = &doc["params"]["signature"];
    let rounds = sig["rounds"].as_array().expect("signature rounds");
    assert_eq!(rounds.len(), 1);
    for d in rounds[0].as_array().unwrap() {
        let v = d["interval_us"].as_array().unwrap();
        assert_eq!(v.len(), sig["burst_lengths"].as_array().unwrap().len());
        assert!(v.iter().all(|x| x.as_f64().is_some_and(|x| x > 0.0)), "{d}");
    }
}

#[test]
fn loggp_sensitivity_has_every_app_shape_and_parameter_with_the_overhead_model() {
    let dir = TempDir::new("exp-loggp");
    let doc = experiment("loggp-sensitivity", dir.path(), &[]);
    let rows = table(&doc, dir.path(), "loggp-sensitivity");
    // 3 apps × 2 shapes × (baseline + o, g, L, G with one value each under --quick).
    assert_eq!(rows.len(), 3 * 2 * 5, "{rows:#?}");
    for app in ["Water", "EM3D(read)", "EM3D(write)"] {
        for shape in ["2×1", "2×2"] {
            for param in ["—", "o", "g", "L", "G"] {
                let r = rows
                    .iter()
                    .find(|r| {
                        text(r, "app") == app
                            && text(r, "shape") == shape
                            && text(r, "param") == param
                    })
                    .unwrap_or_else(|| panic!("no row {app} {shape} {param}"));
                positive(r, "run_s");
                positive(r, "slowdown");
                if param == "o" {
                    positive(r, "predicted_s");
                    median(r, "model_error");
                } else {
                    assert!(r["predicted_s"].is_null(), "{r}");
                }
            }
        }
    }
    let sensitivity = doc["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "loggp-sensitivity")
        .unwrap();
    let notes = sensitivity["notes"].to_string();
    assert!(
        notes.contains("sent by one compute thread") && !notes.contains("not per thread"),
        "m is per thread: {notes}"
    );
    let comm = table(&doc, dir.path(), "loggp-communication");
    assert_eq!(comm.len(), 3 * 2, "{comm:#?}");
    for r in comm {
        positive(r, "msgs_per_thread");
        let m = positive(r, "max_msgs_per_thread");
        assert!(m >= median(r, "msgs_per_thread"), "{r}");
        // m counts a compute thread's own messages: the protocol threads and the thread
        // that runs the job send the rest.
        let rest = fraction(r, "protocol_share") + fraction(r, "other_share");
        assert!(rest < 1.0, "{r}");
        positive(r, "barriers");
        positive(r, "bytes_per_thread");
        fraction(r, "read_share");
    }
    let balance = table(&doc, dir.path(), "loggp-balance");
    // One row per sending cluster of each app and shape.
    assert_eq!(balance.len(), 3 * 2 * 2, "{balance:#?}");
    for r in balance {
        let to_self = if text(r, "from") == "cluster 0" {
            "to_0"
        } else {
            "to_1"
        };
        assert_eq!(median(r, to_self), 0.0, "{r}");
        fraction(r, "share");
    }
}
