//! `multigrain bench apps` end to end on a tiny problem: it runs `multigrain run` for
//! every configuration (Water 64 molecules × 1 step and a small EM3D, sequentially, on 2
//! plain threads and on the DSM 2×1 over shared memory, one round), checks every result
//! against the sequential one, and prints and writes its tables. Only the structure of
//! the table and the JSON is checked, never a timing.

mod common;

use common::{Stream, TempDir, bin};
use std::process::Command;
use std::time::Duration;

/// Bound on the whole command (six tiny runs, two of them DSM jobs).
const LIMIT: Duration = Duration::from_secs(240);

#[test]
fn bench_apps_prints_and_writes_every_configuration_and_ratio() {
    let dir = TempDir::new("bench-apps");
    let json = dir.path().join("apps.json");
    let args = [
        "bench",
        "apps",
        "--water-small",
        "64x1",
        "--water-large",
        "none",
        "--em3d-nodes-per-thread",
        "100",
        "--em3d-iterations",
        "2",
        "--repeat",
        "1",
        "--topologies",
        "2x1-shm",
        "--json",
    ];
    let p = common::run_ok("bench apps", &args, &json, LIMIT);

    let out = p.lines(Stream::Out).join("\n");
    common::assert_contains_all(
        &out,
        &[
            "multigrain bench apps: 1 round(s)",
            "Water 64 molecules × 1 step (--water-small",
            "EM3D good layout, read variant, 100 nodes per thread, 2 iterations",
            "configuration",
            "speedup vs sequential",
            "adding forces under locks, s",
            "--sequential (2 partitions)",
            "--threads 2",
            "DSM 2×1 shm",
            "agrees (bitwise)",
            "(2) time of 2×1 shm / time of --threads 2",
            "(4) speedup of 2×1 shm / speedup of --threads 2",
        ],
    );
    assert!(!out.contains("FAILED"), "{out}");
    // Ratios whose configurations were not run are left out.
    assert!(!out.contains("2×1 udp"), "{out}");
    let err = p.lines(Stream::Err).join("\n");
    for needle in ["bench apps: run 1/6 (round 1/1)", "bench apps: run 6/6"] {
        assert!(err.contains(needle), "no {needle:?} in stderr:\n{err}");
    }

    let text = std::fs::read_to_string(&json).expect("the --json file");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(v["failed"], 0);
    assert_eq!(v["plan"]["repeat"], 1);
    assert_eq!(v["plan"]["topologies"], serde_json::json!(["2x1-shm"]));
    let problems = v["problems"].as_array().expect("problems");
    assert_eq!(problems.len(), 2);
    assert_eq!(problems[0]["problem"]["app"], "water");
    assert_eq!(problems[1]["problem"]["app"], "em3d");
    for p in problems {
        let configs = p["configurations"].as_array().expect("configurations");
        let kinds: Vec<&str> = configs
            .iter()
            .map(|c| c["setup"]["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["sequential", "threads", "dsm"], "{p}");
        assert_eq!(configs[0]["check"]["status"], "reference");
        for c in &configs[1..] {
            assert_eq!(c["check"]["status"], "agrees", "{c}");
            assert!(c["speedup"]["median"].as_f64().unwrap() > 0.0, "{c}");
        }
        for c in configs {
            let runs = c["run_s"].as_array().unwrap();
            assert_eq!(runs.len(), 1, "one run per round: {c}");
            let run = runs[0].as_f64().unwrap();
            assert!(run > 0.0, "{c}");
            assert_eq!(c["time"]["samples"], 1);
            let command = c["command_s"][0].as_f64().unwrap();
            assert!(command > run, "the whole command contains the run: {c}");
            // Water's time under the molecule locks, inside its run; none for EM3D.
            if p["problem"]["app"] == "water" {
                let locked = c["locked_s"][0].as_f64().unwrap();
                assert!(locked > 0.0 && locked < run, "{c}");
            } else {
                assert!(c.get("locked_s").is_none(), "{c}");
            }
        }
        let ratios = p["ratios"].as_array().expect("ratios");
        // Water's (2) on run times and on whole commands; EM3D's (4) shm.
        let measures: Vec<&str> = ratios
            .iter()
            .map(|r| r["measure"].as_str().unwrap())
            .collect();
        let want: &[&str] = if p["problem"]["app"] == "water" {
            &["run", "command"]
        } else {
            &["run"]
        };
        assert_eq!(measures, want, "only the ratios with shm runs: {p}");
        for r in ratios {
            assert!(r["numerator"]["kind"].is_string(), "{r}");
            assert!(r["summary"]["median"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["met"].is_boolean(), "{r}");
            assert!(r["target"]["bound"].is_object(), "{r}");
        }
    }
    assert_eq!(problems[0]["ratios"][0]["id"], "(2)");
    assert_eq!(problems[1]["ratios"][0]["id"], "(4)");
}

#[test]
fn bench_apps_rejects_bad_flags_naming_them() {
    for (args, needle) in [
        (
            &["--topologies", "3x3"][..],
            "unknown topology \"3x3\" (allowed: 2x1-shm, 2x1-udp, 2x2, 4x1)",
        ),
        (&["--water-small", "100x5"], "not a positive perfect cube"),
        (
            &["--topologies", "2x2,2x2"],
            "--topologies: 2x2 is named twice",
        ),
    ] {
        let out = Command::new(bin())
            .args(["bench", "apps"])
            .args(args)
            .output()
            .expect("run multigrain");
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: no {needle:?} in {err}");
    }
}
