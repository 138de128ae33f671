//! `--set KEY=VALUE` over a file: the same schema, errors located at the flag.

use multigrain_cluster_config::{JobConfig, Override};

const ORIGIN: &str = "jobs/t.toml";
const TWO_CLUSTERS: &str =
    "[[cluster]]\nhost = \"127.0.0.1\"\n\n[[cluster]]\nhost = \"127.0.0.1\"\n";

fn set(flags: &[&str]) -> Vec<Override> {
    flags
        .iter()
        .map(|f| f.parse().expect("KEY=VALUE"))
        .collect()
}

fn ok(text: &str, flags: &[&str]) -> JobConfig {
    JobConfig::from_str_with_overrides(text, ORIGIN, &set(flags))
        .unwrap_or_else(|e| panic!("rejected: {e}"))
}

fn err(text: &str, flags: &[&str]) -> String {
    match JobConfig::from_str_with_overrides(text, ORIGIN, &set(flags)) {
        Ok(cfg) => panic!("accepted {flags:?} as {cfg:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn values_replace_the_files_and_bare_words_are_strings() {
    let cfg = ok(
        "[local]\nclusters = 2\n[ini]\npolicy = \"static\"\n",
        &[
            "ini.policy=round-robin",
            "local.threads=3",
            "dsm.protocol=\"sc\"",
        ],
    );
    assert_eq!(cfg.ini.policy.as_str(), "round-robin");
    assert_eq!(cfg.total_threads(), 6);
    assert_eq!(cfg.dsm.protocol.as_str(), "sc");
}

#[test]
fn missing_tables_are_created_and_the_last_flag_wins() {
    let cfg = ok(
        "[local]\nclusters = 2\n",
        &[
            "emulation.latency_us=5",
            "local.clusters=3",
            "local.clusters=4",
        ],
    );
    assert_eq!(cfg.emulation.latency_us, 5.0);
    assert_eq!(cfg.clusters.len(), 4);
}

#[test]
fn an_element_of_a_list_of_tables_is_named_by_its_index() {
    let cfg = ok(TWO_CLUSTERS, &["cluster.1.threads=3"]);
    assert_eq!(
        cfg.clusters.iter().map(|c| c.threads).collect::<Vec<_>>(),
        [1, 3]
    );
    assert_eq!(
        err(TWO_CLUSTERS, &["cluster.2.threads=3"]),
        "--set cluster.2.threads=3: cluster[2].threads = 3: `cluster` has 2 entries (indexes 0..2); 2 is not one"
    );
    assert!(err(TWO_CLUSTERS, &["cluster.threads=3"]).contains("name one by its index"));
}

#[test]
fn schema_errors_name_the_flag() {
    let local = "[local]\nclusters = 2\n";
    assert_eq!(
        err(local, &["local.clusters=0"]),
        "--set local.clusters=0: local.clusters = 0: must be between 1 and 1024"
    );
    assert_eq!(
        err(local, &["ini.policy=fastest"]),
        "--set ini.policy=fastest: ini.policy = fastest: must be one of: static, round-robin, least-loaded"
    );
    let unknown = err(local, &["ini.polcy=static"]);
    assert!(
        unknown.starts_with("--set ini.polcy=static: ini.polcy: unknown key")
            && unknown.contains("did you mean `policy`?"),
        "{unknown}"
    );
    let wrong_type = err(local, &["local.clusters=four"]);
    assert!(
        wrong_type.starts_with("--set local.clusters=four: local.clusters"),
        "{wrong_type}"
    );
    let with_policy = "[local]\nclusters = 2\n[ini]\npolicy = \"static\"\n";
    assert!(err(with_policy, &["ini.policy.x=1"]).contains("`ini.policy` is a value, not a table"));
    let nested = err(local, &["ini.policy.x=1"]);
    assert!(
        nested.starts_with("--set ini.policy.x=1: ini.policy"),
        "{nested}"
    );
}

#[test]
fn rules_across_keys_see_the_flags() {
    // [local] and [[cluster]] cannot be used together, whichever wrote them.
    let both = err(TWO_CLUSTERS, &["local.clusters=2"]);
    assert!(both.starts_with("--set local.clusters=2"), "{both}");
}

#[test]
fn errors_in_the_file_keep_their_position() {
    let text = "[local]\nclusters = 2\n[ini]\nwindow = 0\n";
    assert_eq!(
        err(text, &["ini.policy=round-robin"]),
        err(text, &[]),
        "a flag does not move the file's own errors"
    );
    assert!(err(text, &[]).starts_with("jobs/t.toml:4:10: ini.window = 0"));
}

#[test]
fn malformed_flags_are_rejected() {
    for bad in ["ini.policy", "=x", "a..b=1", ".a=1", "a b=1"] {
        let e = bad.parse::<Override>().unwrap_err().to_string();
        assert!(e.contains("is not KEY=VALUE"), "{bad}: {e}");
    }
}
