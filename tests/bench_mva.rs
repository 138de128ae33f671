//! `multigrain bench mva` on a tiny configuration (N = 1, 2; a few requests): the JSON
//! report has one row per N, finite positive measurements and predictions, queue lengths
//! within the model's bound Q ≤ N (paper 002 eq. 6.11) and calibrated inputs that
//! reproduce the lone client's cycle. The INIs bind port 0 on loopback, so this runs
//! beside other tests; it takes a second or two.

use std::process::Command;
use std::time::{Duration, Instant};

fn num(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

#[test]
fn tiny_run_has_the_shape_and_bounds_of_the_model() {
    let t0 = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_multigrain"))
        .args([
            "bench",
            "mva",
            "--threads-max",
            "2",
            "--requests",
            "40",
            "--samples",
            "1",
            "--work-us",
            "100",
            "--json",
            "-",
        ])
        .output()
        .expect("run multigrain bench mva");
    assert!(
        out.status.success(),
        "bench mva failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
    let table = String::from_utf8_lossy(&out.stderr);
    assert!(
        table.contains("Q measured") && table.contains("core"),
        "{table}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let rows = report["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2);
    let cores = report["cores"].as_u64().expect("cores");
    assert!(cores >= 1);
    let cal = &report["calibration"];
    for k in ["w", "big_o", "solo_cycle"] {
        let x = num(cal, k);
        assert!(x.is_finite() && x > 0.0, "calibration {k} = {x}");
    }
    for k in ["o", "l", "big_l"] {
        let x = num(cal, k);
        assert!(x.is_finite() && x >= 0.0, "calibration {k} = {x}");
    }
    assert!(num(cal, "w") >= 100.0, "spinning W is at least --work-us");
    for (i, row) in rows.iter().enumerate() {
        let n = (i + 1) as f64;
        assert_eq!(row["n"].as_u64(), Some(i as u64 + 1));
        assert_eq!(row["threads"].as_u64(), Some(i as u64 + 4));
        assert_eq!(row["oversubscribed"].as_bool(), Some(i as u64 + 4 > cores));
        for k in [
            "r_model",
            "r_model_schweitzer",
            "r_exact",
            "ini_time_measured",
        ] {
            let x = num(row, k);
            assert!(x.is_finite() && x > 0.0, "N = {n}: {k} = {x}");
        }
        let r = num(&row["r_measured"], "median");
        assert!(r.is_finite() && r >= 100.0, "N = {n}: cycle {r}");
        for k in ["q_model", "q_model_schweitzer", "q_exact"] {
            let x = num(row, k);
            assert!(x.is_finite() && x > 0.0 && x <= n, "N = {n}: {k} = {x}");
        }
        let q = num(&row["q_measured"], "max");
        assert!(
            q.is_finite() && q > 0.0 && q <= n,
            "N = {n}: measured Q {q}"
        );
        assert!(num(row, "q_seen_measured") >= 0.0);
        assert!(num(row, "q_error").is_finite() && num(row, "r_error").is_finite());
        assert_eq!(row["q_within_n"].as_bool(), Some(true));
        assert_eq!(row["runs"].as_array().map(Vec::len), Some(1));
    }
    // The calibration closes the lone cycle: the exact MVA at N = 1 is the measured cycle
    // (unless L had to be clamped at 0).
    if num(cal, "big_l") > 0.0 {
        let r1 = num(&rows[0]["r_measured"], "median");
        let ex = num(&rows[0], "r_exact");
        assert!((ex - r1).abs() <= 1e-6 * r1, "exact {ex} vs measured {r1}");
    }
    let fig = report["figure_6_3_model"].as_array().expect("figure");
    assert_eq!(fig.len(), 2);
}
