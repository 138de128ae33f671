//! `multigrain bench dsm` end to end with few operations: it starts its peer process and
//! its two-cluster jobs (over shared memory and through INIs over UDP loopback), prints
//! every row beside its same-run baseline and writes the rows as JSON. Only the
//! structure of the table and the JSON is checked, never a timing.

mod common;

use common::{Stream, TempDir};
use std::time::Duration;

/// Bound on the whole command (3 rounds of 10 operations per kernel).
const LIMIT: Duration = Duration::from_secs(180);

#[test]
fn bench_dsm_prints_and_writes_every_row_with_its_baseline() {
    let dir = TempDir::new("bench-dsm");
    let json = dir.path().join("dsm.json");
    let args = ["bench", "dsm", "--ops", "30", "--samples", "3", "--json"];
    let p = common::run_ok("bench dsm", &args, &json, LIMIT);

    let out = p.lines(Stream::Out).join("\n");
    common::assert_contains_all(
        &out,
        &[
            "multigrain bench dsm: 3 samples per row",
            "Express round trip, shared memory (process↔process)",
            "bulk message one-way, 256 B, shared memory (process↔process)",
            "= one-way bulk message + diff encode + apply (1 % of a page)",
            "lock hand-off + 64 B, shared memory",
            "the same, against its data path",
            "lock hand-off + 64 B, INIs over UDP",
            "remote read fault, INIs over UDP",
            "remote read fault, shared memory, the home's thread polling",
            "remote read fault, INIs over UDP, the home's thread polling",
            "barrier of two clusters, nothing written, shared memory",
            "barrier of two clusters, nothing written, INIs over UDP",
        ],
    );

    let text = std::fs::read_to_string(&json).expect("the --json file");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&text).expect("valid JSON");
    let row = |group: &str, name: &str| -> &serde_json::Value {
        rows.iter()
            .find(|r| {
                r["group"].as_str().unwrap().starts_with(group)
                    && r["name"].as_str().unwrap().trim() == name
            })
            .unwrap_or_else(|| panic!("no row {group:?} / {name:?} in {text}"))
    };
    // Every timed row has a positive median.
    for r in &rows {
        let m = r["summary"]["median"].as_f64().unwrap_or(f64::NAN);
        assert!(m > 0.0 && m.is_finite(), "{r}");
    }
    // The data path is the bulk message plus the diff rows of 1 %, round by round: more
    // than the message alone.
    let bulk = row(
        "Baselines",
        "bulk message one-way, 256 B, shared memory (process↔process)",
    );
    let path = row(
        "Baselines",
        "= one-way bulk message + diff encode + apply (1 % of a page)",
    );
    assert!(
        path["summary"]["median"].as_f64().unwrap() > bulk["summary"]["median"].as_f64().unwrap(),
        "{path} vs {bulk}"
    );
    // The hand-off is paired with both of its baselines, and only the first has a target.
    let against_express = row("hlrc", "lock hand-off + 64 B, shared memory");
    let against_path = row("hlrc", "the same, against its data path");
    for r in [against_express, against_path] {
        assert!(r["ratio"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(against_express["met"].is_boolean(), "{against_express}");
    assert!(against_path["met"].is_null(), "{against_path}");
    // The remote read faults are timed twice, the home's threads asleep and polling,
    // each against the same baseline and target.
    for via in ["shared memory", "INIs over UDP"] {
        let asleep = row("hlrc", &format!("remote read fault, {via}"));
        let polling = row(
            "hlrc",
            &format!("remote read fault, {via}, the home's thread polling"),
        );
        assert_eq!(
            asleep["paired"]["baseline_summary"], polling["paired"]["baseline_summary"],
            "{asleep} / {polling}"
        );
        assert_eq!(asleep["target"], polling["target"], "{asleep} / {polling}");
        assert!(polling["met"].is_boolean(), "{polling}");
    }
    // The barriers of both protocols are compared, without a target, with a round trip
    // of the same substrate: the Express round trip over shared memory, and through the
    // INIs twice the one-way Express row (round by round, so its median is twice that
    // row's).
    let express_ini = row("Baselines", "Express one-way through INIs (UDP loopback)");
    let express_ini = express_ini["summary"]["median"].as_f64().unwrap();
    for protocol in ["hlrc", "sc"] {
        for via in ["shared memory", "INIs over UDP"] {
            let r = row(
                protocol,
                &format!("barrier of two clusters, nothing written, {via}"),
            );
            assert!(r["ratio"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["met"].is_null(), "{r}");
        }
        let r = row(
            protocol,
            "barrier of two clusters, nothing written, INIs over UDP",
        );
        let baseline = r["paired"]["baseline_summary"]["median"].as_f64().unwrap();
        assert!(
            (baseline - 2.0 * express_ini).abs() <= 1e-9 * baseline.max(1.0),
            "{r}: baseline {baseline} against one-way Express {express_ini}"
        );
    }
    // The bare fault as the DSM region installs pages (shared memory, minor faults) is
    // an informational floor beside the target's: the polling fault is compared with
    // both, the target stays with the anonymous fault.
    row(
        "Baselines",
        "the same as the DSM region installs pages (shm, minor faults)",
    );
    let on_backing = row(
        "hlrc",
        "the same, against the floor with the DSM region's bare fault",
    );
    assert!(on_backing["ratio"].as_f64().unwrap() > 0.0, "{on_backing}");
    assert!(on_backing["met"].is_null(), "{on_backing}");
    // Likewise the UDP round trip answered by a page: the polling fault through INIs is
    // compared with that floor too, without a target, and the floor is that round
    // trip plus the bare fault, round by round.
    let page_rtt = row(
        "Baselines",
        "the same, answered by 4 KiB (a page fetch's shape)",
    );
    let bare = row("Baselines", "bare userfaultfd read fault");
    let page_floor = row(
        "Baselines",
        "= busy UDP round trip with a 4 KiB answer + bare fault",
    );
    let median = |r: &serde_json::Value| r["summary"]["median"].as_f64().unwrap();
    assert!(
        median(page_floor) > median(page_rtt) && median(page_floor) > median(bare),
        "{page_floor} against {page_rtt} and {bare}"
    );
    let on_page = row("hlrc", "the same, against the floor with a 4 KiB answer");
    assert!(on_page["ratio"].as_f64().unwrap() > 0.0, "{on_page}");
    assert!(on_page["met"].is_null(), "{on_page}");
    assert_eq!(
        on_page["paired"]["baseline_summary"], page_floor["summary"],
        "{on_page} / {page_floor}"
    );
}
