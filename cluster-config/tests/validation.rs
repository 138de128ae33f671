//! Every validation rule, checked by its full one-line message: origin,
//! line:column, key path, value as written, and what is allowed.

use std::path::Path;

use multigrain_cluster_config::{ConfigError, JobConfig, Link, Substrate};

const ORIGIN: &str = "jobs/t.toml";

/// The error message for `text`, which must be rejected.
fn err(text: &str) -> String {
    match JobConfig::from_str_named(text, ORIGIN) {
        Ok(cfg) => panic!("accepted:\n{text}\nas {cfg:?}"),
        Err(e) => e.to_string(),
    }
}

/// `section` followed by a valid two-cluster `[local]` list, so that the
/// section's lines keep their numbers.
fn with_local(section: &str) -> String {
    format!("{section}\n[local]\nclusters = 2\n")
}

fn ok(text: &str) -> JobConfig {
    JobConfig::from_str_named(text, ORIGIN).unwrap_or_else(|e| panic!("rejected: {e}"))
}

// ---- syntax, unknown keys, types, missing keys -------------------------------

#[test]
fn syntax_errors_name_line_column_and_key() {
    assert_eq!(
        err("[ini]\nwindow = = 3\n"),
        "jobs/t.toml:2:10: ini.window: TOML syntax error: extra `=`, expected nothing"
    );
    assert_eq!(
        err("[[cluster]]\nhost = 'a'\n[[cluster]]\nport = 1__0\n"),
        "jobs/t.toml:4:9: cluster[1].port: TOML syntax error: `_` may only go between digits, expected nothing"
    );
    assert_eq!(
        err("[job]\nname = 'a'\n\n[ini\n"),
        "jobs/t.toml:4:5: TOML syntax error: unclosed table, expected `]`"
    );
    assert_eq!(
        err("[ini]\nwindow = 1\nwindow = 2\n"),
        "jobs/t.toml:3:1: ini.window: TOML syntax error: duplicate key"
    );
}

#[test]
fn unknown_keys_are_rejected_with_the_allowed_keys() {
    assert_eq!(
        err(&with_local("[ini]\nwindw = 3")),
        "jobs/t.toml:2:1: ini.windw: unknown key; allowed here: per_cluster, policy, substrate, \
         window, send_timeout_us, ack_timeout_us, mtu, queue_capacity, inline, coalesce, \
         offload, connected_sends, trace_dir, trace_records, poll_interval_min, poll_interval_max \
         (did you mean `window`?)"
    );
    assert_eq!(
        err("[[clusters]]\nhost = 'a'\n"),
        "jobs/t.toml:1:3: clusters: unknown key; allowed here: job, local, cluster, ini, dsm, \
         emulation, faults, launch (did you mean `cluster`?)"
    );
    assert_eq!(
        err("[[cluster]]\nhost = 'a'\n[[cluster]]\nhost = 'b'\ncores = 4\n"),
        "jobs/t.toml:5:1: cluster[1].cores: unknown key; allowed here: host, port, threads, inis"
    );
    assert_eq!(
        err(&with_local("[dsm]\nregion = 5")),
        "jobs/t.toml:2:1: dsm.region: unknown key; allowed here: protocol, home, region_base, \
         region_size, page_size, prefetch, write_ahead, idle_flushes, release_batch, \
         barrier_updates, flush_ahead, populate, protocol_priority, thread_policy, event_profile, \
         wait_spin_us"
    );
    assert_eq!(
        err(&with_local("emulation = { latency = 1 }")),
        "jobs/t.toml:1:15: emulation.latency: unknown key; allowed here: send_overhead_us, \
         recv_overhead_us, gap_us, latency_us, per_byte_gap_ns"
    );
}

#[test]
fn wrong_types_say_what_was_expected() {
    assert_eq!(
        err(&with_local("[ini]\nwindow = \"32\"")),
        "jobs/t.toml:2:10: ini.window = \"32\": wrong type: expected an integer, found string \"32\""
    );
    assert_eq!(
        err(&with_local("[ini]\npolicy = 1")),
        "jobs/t.toml:2:10: ini.policy = 1: wrong type: expected a string, found integer `1`"
    );
    assert_eq!(
        err(&with_local("[faults]\ndrop = \"none\"")),
        "jobs/t.toml:2:8: faults.drop = \"none\": wrong type: expected a number, found string \"none\""
    );
    assert_eq!(
        err("ini = 5\n[local]\nclusters = 1\n"),
        "jobs/t.toml:1:7: ini = 5: wrong type: expected a table, found integer `5`"
    );
    assert_eq!(
        err(&with_local("[launch]\nssh = \"ssh -x\"")),
        "jobs/t.toml:2:7: launch.ssh = \"ssh -x\": wrong type: expected a sequence, found string \"ssh -x\""
    );
}

#[test]
fn required_keys() {
    assert_eq!(
        err("[[cluster]]\nhost = 'a'\n\n[[cluster]]\nport = 7000\n"),
        "jobs/t.toml:4:1: cluster[1].host: missing: this key is required"
    );
    assert_eq!(
        err("[local]\nthreads = 2\n"),
        "jobs/t.toml:1:1: local.clusters: missing: this key is required"
    );
}

// ---- the cluster list --------------------------------------------------------

#[test]
fn a_job_needs_clusters() {
    let expected = "jobs/t.toml:1:1: cluster: missing: a job needs at least one cluster: add a \
                    [local] section (clusters = N, threads = T) or one [[cluster]] table per cluster";
    assert_eq!(err(""), expected);
    assert_eq!(err("[ini]\nwindow = 8\n"), expected);
    assert_eq!(
        err("cluster = []\n"),
        "jobs/t.toml:1:11: cluster = []: at least one cluster is required"
    );
}

#[test]
fn local_and_explicit_clusters_are_exclusive() {
    assert_eq!(
        err("[local]\nclusters = 2\n\n[[cluster]]\nhost = 'a'\n"),
        "jobs/t.toml:4:1: cluster: [local] and [[cluster]] cannot both be given ([local] is at \
         line 1): use [local] for N clusters on 127.0.0.1, or one [[cluster]] per cluster"
    );
    assert_eq!(
        err("[[cluster]]\nhost = 'a'\n[local]\nclusters = 2\n"),
        "jobs/t.toml:3:1: local: [local] and [[cluster]] cannot both be given ([[cluster]] is at \
         line 1): use [local] for N clusters on 127.0.0.1, or one [[cluster]] per cluster"
    );
}

#[test]
fn network_poll_interval_bounds_are_checked_and_must_not_cross() {
    assert_eq!(
        err(&with_local("[ini]\npoll_interval_min = 0")),
        "jobs/t.toml:2:21: ini.poll_interval_min = 0: must be between 1 and 1024 (receive \
         polls per network poll)"
    );
    assert_eq!(
        err(&with_local("[ini]\npoll_interval_min = 40")),
        "jobs/t.toml:2:21: ini.poll_interval_min = 40: must be at most ini.poll_interval_max \
         (32); equal bounds poll the network a fixed fraction of the time"
    );
    assert_eq!(
        err(&with_local("[ini]\npoll_interval_max = 4")),
        "jobs/t.toml:2:21: ini.poll_interval_max = 4: must be at least ini.poll_interval_min \
         (8); equal bounds poll the network a fixed fraction of the time"
    );
    let every = ok(&with_local(
        "[ini]\npoll_interval_min = 1\npoll_interval_max = 1",
    ));
    assert_eq!(
        (every.ini.poll_interval_min, every.ini.poll_interval_max),
        (1, 1)
    );
    let d = ok(&with_local(""));
    assert_eq!((d.ini.poll_interval_min, d.ini.poll_interval_max), (8, 32));
}

#[test]
fn ini_trace_and_inline_keys() {
    let e = err(&with_local("[ini]\ntrace_records = 0"));
    assert!(
        e.starts_with("jobs/t.toml:2:17: ini.trace_records = 0: must be between 1 and 16777216"),
        "{e}"
    );
    let e = err(&with_local("[ini]\ninline = 'no'"));
    assert!(e.contains("ini.inline") && e.contains("bool"), "{e}");
    let e = err(&with_local("[ini]\ntrace_dir = 3"));
    assert!(e.contains("ini.trace_dir") && e.contains("string"), "{e}");
}

#[test]
fn cluster_and_thread_counts() {
    assert_eq!(
        err("[local]\nclusters = 0\n"),
        "jobs/t.toml:2:12: local.clusters = 0: must be between 1 and 1024"
    );
    assert_eq!(
        err("[local]\nclusters = 99999999999999999999\n"),
        "jobs/t.toml:2:12: local.clusters = 99999999999999999999: must be between 1 and 1024"
    );
    assert_eq!(
        err("[local]\nclusters = 2\nthreads = 0\n"),
        "jobs/t.toml:3:11: local.threads = 0: must be between 1 and 1024"
    );
    assert_eq!(
        err("[[cluster]]\nhost = 'a'\nthreads = 1025\n"),
        "jobs/t.toml:3:11: cluster[0].threads = 1025: must be between 1 and 1024"
    );
}

#[test]
fn hosts_must_be_hostnames_or_addresses() {
    assert_eq!(
        err("[[cluster]]\nhost = ''\n"),
        "jobs/t.toml:2:8: cluster[0].host = '': must not be empty: give a hostname or IP address"
    );
    assert_eq!(
        err("[[cluster]]\nhost = '-oProxyCommand=x'\n"),
        "jobs/t.toml:2:8: cluster[0].host = '-oProxyCommand=x': must not start with '-' (ssh \
         would read it as an option)"
    );
    assert_eq!(
        err("[[cluster]]\nhost = 'node 1'\n"),
        "jobs/t.toml:2:8: cluster[0].host = 'node 1': must be a hostname or IP address: letters, \
         digits, '.', '-', '_', ':' and '%' only"
    );
    let cfg = ok("[[cluster]]\nhost = 'fe80::1%eth0'\n[[cluster]]\nhost = 'node-01.example.org'\n");
    assert_eq!(cfg.clusters[0].host, "fe80::1%eth0");
}

#[test]
fn ports_are_16_bit() {
    assert_eq!(
        err("[[cluster]]\nhost = 'a'\nport = 65536\n"),
        "jobs/t.toml:3:8: cluster[0].port = 65536: must be between 0 and 65535 (0 picks a free \
         port for each INI)"
    );
    assert_eq!(
        err("[[cluster]]\nhost = 'a'\nport = -1\n"),
        "jobs/t.toml:3:8: cluster[0].port = -1: must be between 0 and 65535 (0 picks a free port \
         for each INI)"
    );
    assert_eq!(
        err("[ini]\nper_cluster = 2\n[[cluster]]\nhost = 'a'\nport = 65535\n"),
        "jobs/t.toml:5:8: cluster[0].port = 65535: with 2 INIs this cluster would use ports \
         65535..=65536, past 65535: INI k uses base port + k"
    );
    // A cluster's own INI count decides its port range.
    assert_eq!(
        err("[[cluster]]\nhost = 'a'\nport = 65534\ninis = 3\n"),
        "jobs/t.toml:3:8: cluster[0].port = 65534: with 3 INIs this cluster would use ports \
         65534..=65536, past 65535: INI k uses base port + k"
    );
}

#[test]
fn cluster_ini_counts_may_differ() {
    let cfg = ok(
        "[ini]\nper_cluster = 2\n[[cluster]]\nhost = 'h'\nport = 7000\ninis = 1\n\
         [[cluster]]\nhost = 'h'\nport = 7001\nthreads = 4\n[[cluster]]\nhost = 'h'\n\
         inis = 4\n",
    );
    assert_eq!(
        (0..3).map(|c| cfg.inis_of(c)).collect::<Vec<_>>(),
        vec![1, 2, 4]
    );
    assert_eq!(cfg.total_inis(), 7);
    assert!(!cfg.uniform_inis());
    assert_eq!(
        err("[[cluster]]\nhost = 'a'\ninis = 0\n"),
        "jobs/t.toml:3:8: cluster[0].inis = 0: must be between 1 and 64 (this cluster's INI \
         threads; default ini.per_cluster)"
    );
    // Its port range is its own: cluster 1 (7001) no longer overlaps cluster 0's one INI.
    assert!(
        err(
            "[[cluster]]\nhost = 'h'\nport = 7000\ninis = 2\n[[cluster]]\nhost = 'h'\nport = \
             7001\n"
        )
        .starts_with("jobs/t.toml:7:8: cluster[1].port = 7001: INI ports 7001..=7001 overlap ports 7000..=7001 of cluster[0]")
    );
}

#[test]
fn clusters_on_one_host_need_distinct_ports() {
    assert_eq!(
        err("[[cluster]]\nhost = 'a'\nport = 7000\n[[cluster]]\nhost = 'A'\nport = 7000\n"),
        "jobs/t.toml:6:8: cluster[1].port = 7000: cluster[0] on the same host (a) already uses \
         port 7000: give each cluster on a host its own port, or 0 to pick a free one"
    );
    // Loopback names are one host; INI k uses base port + k.
    assert_eq!(
        err(
            "[ini]\nper_cluster = 2\n[[cluster]]\nhost = 'localhost'\nport = 7000\n\
             [[cluster]]\nhost = '127.0.0.1'\nport = 7001\n"
        ),
        "jobs/t.toml:8:8: cluster[1].port = 7001: INI ports 7001..=7002 overlap ports \
         7000..=7001 of cluster[0] on the same host (localhost): INI k uses base port + k (INIs per \
         cluster: ini.per_cluster or the cluster's inis); use base ports further apart, or 0"
    );
    // A clash with a cluster that is not the previous one, lower base port.
    assert!(
        err(
            "[ini]\nper_cluster = 3\n[[cluster]]\nhost = 'h'\nport = 100\n[[cluster]]\nhost = \
             'g'\nport = 100\n[[cluster]]\nhost = 'h'\nport = 98\n"
        )
        .starts_with("jobs/t.toml:11:8: cluster[2].port = 98: INI ports 98..=100 overlap ports 100..=102 of cluster[0]")
    );
    // Same port on different hosts, adjacent ranges, and port 0 are fine.
    ok("[[cluster]]\nhost = 'a'\nport = 7000\n[[cluster]]\nhost = 'b'\nport = 7000\n");
    ok(
        "[ini]\nper_cluster = 2\n[[cluster]]\nhost = 'a'\nport = 7000\n[[cluster]]\nhost = 'a'\nport = 7002\n",
    );
    ok("[[cluster]]\nhost = 'a'\nport = 0\n[[cluster]]\nhost = 'a'\nport = 0\n");
}

// ---- [ini] ---------------------------------------------------------------------

#[test]
fn ini_counts_and_keywords() {
    assert_eq!(
        err(&with_local("[ini]\nper_cluster = 0")),
        "jobs/t.toml:2:15: ini.per_cluster = 0: must be between 1 and 64 (INI threads per cluster)"
    );
    assert_eq!(
        err(&with_local("[ini]\npolicy = \"fastest\"")),
        "jobs/t.toml:2:10: ini.policy = \"fastest\": must be one of: static, round-robin, least-loaded"
    );
    assert_eq!(
        err(&with_local("[ini]\nsubstrate = \"tcp\"")),
        "jobs/t.toml:2:13: ini.substrate = \"tcp\": must be one of: auto, shm, udp"
    );
    assert_eq!(
        err(&with_local("[ini]\nqueue_capacity = 0")),
        "jobs/t.toml:2:18: ini.queue_capacity = 0: must be between 1 and 4294967295 (messages)"
    );
}

#[test]
fn window_is_what_the_sliding_window_takes() {
    assert_eq!(
        err(&with_local("[ini]\nwindow = 0")),
        "jobs/t.toml:2:10: ini.window = 0: must be between 1 and 32768 (frames in flight per \
         INI connection)"
    );
    assert_eq!(
        err(&with_local("[ini]\nwindow = 32769")),
        "jobs/t.toml:2:10: ini.window = 32769: must be between 1 and 32768 (frames in flight \
         per INI connection)"
    );
    assert_eq!(
        ok(&with_local("[ini]\nwindow = 32768")).ini.window,
        multigrain_window::MAX_WINDOW
    );
}

#[test]
fn timeouts_are_positive_and_ordered() {
    assert_eq!(
        err(&with_local("[ini]\nsend_timeout_us = 0")),
        "jobs/t.toml:2:19: ini.send_timeout_us = 0: must be between 1 and 18446744073709551615 \
         (microseconds)"
    );
    assert_eq!(
        err(&with_local("[ini]\nack_timeout_us = 0")),
        "jobs/t.toml:2:18: ini.ack_timeout_us = 0: must be between 1 and 18446744073709551615 \
         (microseconds)"
    );
    assert_eq!(
        err(&with_local("[ini]\nack_timeout_us = 2000")),
        "jobs/t.toml:2:18: ini.ack_timeout_us = 2000: must be less than ini.send_timeout_us (2000 \
         µs), or the sender retransmits before the delayed ACK is sent"
    );
    // With the ACK timeout at its default, the SEND timeout is the one to blame.
    assert_eq!(
        err(&with_local("[ini]\nsend_timeout_us = 150")),
        "jobs/t.toml:2:19: ini.send_timeout_us = 150: must be greater than ini.ack_timeout_us \
         (200 µs), or the sender retransmits before the delayed ACK is sent"
    );
    assert_eq!(
        err(&with_local("[job]\nstartup_timeout_ms = 0")),
        "jobs/t.toml:2:22: job.startup_timeout_ms = 0: must be between 1 and 18446744073709551615 \
         (milliseconds)"
    );
    assert_eq!(
        err(&with_local("[job]\npeer_timeout_ms = 0")),
        "jobs/t.toml:2:19: job.peer_timeout_ms = 0: must be between 1 and 18446744073709551615 \
         (milliseconds)"
    );
    assert_eq!(
        err(&with_local("[job]\npeer_timeout_ms = 2")),
        "jobs/t.toml:2:19: job.peer_timeout_ms = 2: must be longer than ini.send_timeout_us (2000 \
         µs), so that a peer gets at least one retransmission before it is declared dead"
    );
    assert_eq!(
        err(&with_local("[ini]\nsend_timeout_us = 3000000")),
        "jobs/t.toml:2:19: ini.send_timeout_us = 3000000: must be shorter than \
         job.peer_timeout_ms (3000 ms), so that a peer gets at least one retransmission before \
         it is declared dead"
    );
}

#[test]
fn mtu_range() {
    assert_eq!(
        err(&with_local("[ini]\nmtu = 511")),
        "jobs/t.toml:2:7: ini.mtu = 511: must be between 512 and 65507 bytes (the largest UDP \
         payload is 65507; 1472 fits a 1500-byte Ethernet frame)"
    );
    assert!(
        err(&with_local("[ini]\nmtu = 65508"))
            .starts_with("jobs/t.toml:2:7: ini.mtu = 65508: must be between 512 and 65507")
    );
    assert_eq!(ok(&with_local("[ini]\nmtu = 512")).ini.mtu, 512);
    assert_eq!(ok(&with_local("[ini]\nmtu = 65507")).ini.mtu, 65507);
}

#[test]
fn shm_needs_one_host() {
    assert_eq!(
        err("[ini]\nsubstrate = \"shm\"\n[[cluster]]\nhost = 'n1'\n[[cluster]]\nhost = 'n2'\n"),
        "jobs/t.toml:2:13: ini.substrate = \"shm\": \"shm\" needs every cluster on one host, but \
         cluster[0] is on n1 and cluster[1] on n2: use \"auto\" (shm within a host, udp across \
         hosts) or \"udp\""
    );
    ok(
        "[ini]\nsubstrate = \"shm\"\n[[cluster]]\nhost = 'localhost'\n[[cluster]]\nhost = '127.0.0.1'\n",
    );
}

// ---- [dsm] ---------------------------------------------------------------------

#[test]
fn keywords_of_dsm() {
    assert_eq!(
        err(&with_local("[dsm]\nprotocol = \"lrc\"")),
        "jobs/t.toml:2:12: dsm.protocol = \"lrc\": must be one of: hlrc, sc"
    );
    assert_eq!(
        err(&with_local("[dsm]\nhome = \"random\"")),
        "jobs/t.toml:2:8: dsm.home = \"random\": must be one of: round-robin, block, first-touch"
    );
    assert_eq!(
        err(&with_local("[dsm]\nprotocol_priority = \"high\"")),
        "jobs/t.toml:2:21: dsm.protocol_priority = \"high\": must be one of: auto, realtime, normal"
    );
    assert_eq!(
        err(&with_local("[dsm]\nthread_policy = \"fifo\"")),
        "jobs/t.toml:2:17: dsm.thread_policy = \"fifo\": must be one of: batch, normal"
    );
}

#[test]
fn wait_spin_is_at_most_a_second() {
    assert_eq!(
        err(&with_local("[dsm]\nwait_spin_us = 1000001")),
        "jobs/t.toml:2:16: dsm.wait_spin_us = 1000001: must be between 0 and 1000000 µs a \
         waiting thread polls before it sleeps (0 sleeps at once)"
    );
    assert!(err(&with_local("[dsm]\nwait_spin_us = -5")).contains("dsm.wait_spin_us = -5"));
    assert!(err(&with_local("[dsm]\nwait_spin_us = '1ms'")).contains("dsm.wait_spin_us"));
    assert_eq!(
        ok(&with_local("[dsm]\nwait_spin_us = 0")).dsm.wait_spin_us,
        0
    );
    assert_eq!(
        ok(&with_local("")).dsm.wait_spin_us,
        multigrain_cluster_config::DEFAULT_WAIT_SPIN_US
    );
}

#[test]
fn idle_flushes_is_a_small_flush_count() {
    assert_eq!(
        err(&with_local("[dsm]\nidle_flushes = 65")),
        "jobs/t.toml:2:16: dsm.idle_flushes = 65: must be between 0 and 64 unchanged flushes \
         before an open page closes (0 closes it at every flush)"
    );
    assert!(err(&with_local("[dsm]\nidle_flushes = -1")).contains("dsm.idle_flushes = -1"));
    assert_eq!(
        ok(&with_local("[dsm]\nidle_flushes = 0")).dsm.idle_flushes,
        0
    );
    assert_eq!(
        ok(&with_local("")).dsm.idle_flushes,
        multigrain_cluster_config::DEFAULT_IDLE_FLUSHES
    );
}

#[test]
fn write_ahead_is_a_small_page_count() {
    assert_eq!(
        err(&with_local("[dsm]\nwrite_ahead = 65")),
        "jobs/t.toml:2:15: dsm.write_ahead = 65: must be between 0 and 64 read-only pages \
         opened after a written one (0 turns write-ahead off)"
    );
    assert_eq!(ok(&with_local("[dsm]\nwrite_ahead = 0")).dsm.write_ahead, 0);
    assert_eq!(
        ok(&with_local("")).dsm.write_ahead,
        multigrain_cluster_config::DEFAULT_WRITE_AHEAD
    );
}

#[test]
fn prefetch_is_a_small_page_count() {
    assert_eq!(
        err(&with_local("[dsm]\nprefetch = 65")),
        "jobs/t.toml:2:12: dsm.prefetch = 65: must be between 0 and 64 pages after the faulting \
         one (0 turns prefetching off)"
    );
    assert_eq!(
        err(&with_local("[dsm]\nprefetch = -1")),
        "jobs/t.toml:2:12: dsm.prefetch = -1: must be between 0 and 64 pages after the faulting \
         one (0 turns prefetching off)"
    );
    assert_eq!(ok(&with_local("[dsm]\nprefetch = 0")).dsm.prefetch, 0);
    assert_eq!(
        ok(&with_local("")).dsm.prefetch,
        multigrain_cluster_config::DEFAULT_PREFETCH
    );
}

#[test]
fn only_4096_byte_pages() {
    assert_eq!(
        err(&with_local("[dsm]\npage_size = 8192")),
        "jobs/t.toml:2:13: dsm.page_size = 8192: only 4096 is supported now (the kernel's base \
         page size)"
    );
}

#[test]
fn region_base_is_page_aligned_user_space() {
    assert_eq!(
        err(&with_local("[dsm]\nregion_base = 0x5000_0000_0001")),
        "jobs/t.toml:2:15: dsm.region_base = 0x5000_0000_0001: must be a multiple of the page \
         size (4096 bytes); 0x500000000000 or 0x500000001000 would do"
    );
    let outside = "must be a page-aligned address in the user address space, from 0x10000 to \
                   0x7ffffffff000";
    assert_eq!(
        err(&with_local("[dsm]\nregion_base = 0")),
        format!("jobs/t.toml:2:15: dsm.region_base = 0: {outside}")
    );
    assert_eq!(
        err(&with_local("[dsm]\nregion_base = 0xffff_8000_0000_0000")),
        format!("jobs/t.toml:2:15: dsm.region_base = 0xffff_8000_0000_0000: {outside}")
    );
}

#[test]
fn region_size_is_a_positive_multiple_of_the_page_size() {
    let allowed = "must be a positive multiple of the page size (4096 bytes) and at most 64 GiB \
                   (the protocol's page numbers), e.g. 1073741824 or \"1GiB\"";
    assert_eq!(
        err(&with_local("[dsm]\nregion_size = 0")),
        format!("jobs/t.toml:2:15: dsm.region_size = 0: {allowed}")
    );
    assert_eq!(
        err(&with_local("[dsm]\nregion_size = 4097")),
        format!("jobs/t.toml:2:15: dsm.region_size = 4097: {allowed}")
    );
    // One page above what the coherence protocol can number.
    assert_eq!(
        err(&with_local("[dsm]\nregion_size = 68719480832")),
        format!("jobs/t.toml:2:15: dsm.region_size = 68719480832: {allowed}")
    );
    assert_eq!(
        err(&with_local("[dsm]\nregion_size = -4096")),
        format!("jobs/t.toml:2:15: dsm.region_size = -4096: {allowed}")
    );
    assert_eq!(
        err(&with_local("[dsm]\nregion_size = \"1GB\"")),
        "jobs/t.toml:2:15: dsm.region_size = \"1GB\": `GB` is not a size unit: use B, KiB, MiB, \
         GiB or TiB (K, M, G, T mean the same; decimal units such as MB are not accepted)"
    );
    assert_eq!(
        err(&with_local("[dsm]\nregion_size = true")),
        "jobs/t.toml:2:15: dsm.region_size = true: wrong type: expected a byte count, or a string \
         such as \"1GiB\", found boolean `true`"
    );
}

#[test]
fn region_sizes_as_strings() {
    for (text, bytes) in [
        ("\"1GiB\"", 1u64 << 30),
        ("\"512MiB\"", 512 << 20),
        ("\"512 MiB\"", 512 << 20),
        ("\"64k\"", 64 << 10),
        ("\"64GiB\"", 64 << 30),
        ("\"8192\"", 8192),
        ("1_048_576", 1 << 20),
    ] {
        let cfg = ok(&with_local(&format!("[dsm]\nregion_size = {text}")));
        assert_eq!(cfg.dsm.region_size, bytes, "{text}");
    }
}

#[test]
fn region_ends_in_user_space() {
    assert_eq!(
        err(&with_local(
            "[dsm]\nregion_base = 0x7fff_0000_0000\nregion_size = \"8GiB\""
        )),
        "jobs/t.toml:3:15: dsm.region_size = \"8GiB\": the region 0x7fff00000000..0x800100000000 \
         (8 GiB) ends above 0x800000000000, the end of the 47-bit user address space: lower \
         dsm.region_base or dsm.region_size"
    );
    // With the size at its default, the base is blamed.
    assert_eq!(
        err(&with_local("[dsm]\nregion_base = 0x7fff_f000_0000")),
        "jobs/t.toml:2:15: dsm.region_base = 0x7fff_f000_0000: the region \
         0x7ffff0000000..0x800030000000 (1 GiB) ends above 0x800000000000, the end of the 47-bit \
         user address space: lower dsm.region_base or dsm.region_size"
    );
    let cfg = ok(&with_local(
        "[dsm]\nregion_base = 0x7fff_c000_0000\nregion_size = \"1GiB\"",
    ));
    assert_eq!(cfg.dsm.region_end(), 1 << 47);
}

// ---- [emulation], [faults], [launch], [job] ------------------------------------

#[test]
fn emulation_values_are_finite_and_not_negative() {
    let us = "must be a finite number of microseconds, at least 0 (0 turns it off)";
    assert_eq!(
        err(&with_local("[emulation]\nlatency_us = -1.0")),
        format!("jobs/t.toml:2:14: emulation.latency_us = -1.0: {us}")
    );
    assert_eq!(
        err(&with_local("[emulation]\ngap_us = nan")),
        format!("jobs/t.toml:2:10: emulation.gap_us = nan: {us}")
    );
    assert_eq!(
        err(&with_local("[emulation]\nsend_overhead_us = inf")),
        format!("jobs/t.toml:2:20: emulation.send_overhead_us = inf: {us}")
    );
    assert_eq!(
        err(&with_local("[emulation]\nrecv_overhead_us = -0.5")),
        format!("jobs/t.toml:2:20: emulation.recv_overhead_us = -0.5: {us}")
    );
    assert_eq!(
        err(&with_local("[emulation]\nper_byte_gap_ns = -2")),
        "jobs/t.toml:2:19: emulation.per_byte_gap_ns = -2: must be a finite number of \
         nanoseconds per byte, at least 0 (0 turns it off)"
    );
    // Integers are accepted where numbers are expected.
    let cfg = ok(&with_local(
        "[emulation]\nlatency_us = 5\nper_byte_gap_ns = 0.25\n[ini]\nsubstrate = \"udp\"",
    ));
    assert_eq!(cfg.emulation.latency_us, 5.0);
    assert_eq!(cfg.emulation.per_byte_gap_ns, 0.25);
    assert!(cfg.emulation.is_enabled());
}

/// *g* and *G* stall an INI: refused where two clusters are linked over shared memory
/// (paper 001 §3.2); *o_s*, *o_r* and *L* apply there too.
#[test]
fn gap_keys_are_refused_on_shared_memory_links() {
    let why = |key: &str, substrate: &str| {
        format!(
            "emulated only on the network path (it stalls the sending INI), but \
             ini.substrate = \"{substrate}\" links clusters 0 and 1 over shared memory, where \
             it is not emulated; set ini.substrate = \"udp\" to emulate it between clusters \
             on one host, or set {key} = 0"
        )
    };
    assert_eq!(
        err(&with_local("[emulation]\ngap_us = 5")),
        format!(
            "jobs/t.toml:2:10: emulation.gap_us = 5: {}",
            why("emulation.gap_us", "auto")
        )
    );
    assert_eq!(
        err(&with_local(
            "[ini]\nsubstrate = \"shm\"\n[emulation]\nper_byte_gap_ns = 0.5"
        )),
        format!(
            "jobs/t.toml:4:19: emulation.per_byte_gap_ns = 0.5: {}",
            why("emulation.per_byte_gap_ns", "shm")
        )
    );
    // Over UDP, on one cluster, or on clusters on different hosts they apply.
    ok(&with_local(
        "[ini]\nsubstrate = \"udp\"\n[emulation]\ngap_us = 5\nper_byte_gap_ns = 0.5",
    ));
    ok("[emulation]\ngap_us = 5\n[local]\nclusters = 1\n");
    ok("[emulation]\ngap_us = 5\n\
        [[cluster]]\nhost = \"a\"\nport = 7000\nthreads = 1\n\
        [[cluster]]\nhost = \"b\"\nport = 7000\nthreads = 1\n");
    // The other keys apply on every link.
    ok(&with_local(
        "[emulation]\nsend_overhead_us = 1\nrecv_overhead_us = 1\nlatency_us = 1",
    ));
    // The same check, on the links a running job finds (same message, without a place).
    let mut cfg = JobConfig::local(2, 1);
    cfg.ini.substrate = Substrate::Udp;
    cfg.emulation.gap_us = 5.0;
    assert_eq!(cfg.check_emulation(), Ok(()));
    let e = cfg
        .emulation
        .check_link(Link::Shm, 0, 1, Substrate::Auto)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("emulation.gap_us = 5: {}", why("emulation.gap_us", "auto"))
    );
    assert_eq!(
        cfg.emulation.check_link(Link::Udp, 0, 1, Substrate::Auto),
        Ok(())
    );
}

#[test]
fn fault_probabilities_are_in_0_1() {
    for key in ["drop", "duplicate", "reorder", "corrupt"] {
        let col = key.len() + 4;
        assert_eq!(
            err(&with_local(&format!("[faults]\n{key} = 1.5"))),
            format!(
                "jobs/t.toml:2:{col}: faults.{key} = 1.5: must be a probability between 0 and 1"
            )
        );
        assert_eq!(
            err(&with_local(&format!("[faults]\n{key} = -0.1"))),
            format!(
                "jobs/t.toml:2:{col}: faults.{key} = -0.1: must be a probability between 0 and 1"
            )
        );
    }
    let cfg = ok(&with_local(
        "[faults]\ndrop = 1\ncorrupt = 0.001\nseed = 42",
    ));
    assert_eq!(
        (cfg.faults.drop, cfg.faults.corrupt, cfg.faults.seed),
        (1.0, 0.001, 42)
    );
    assert!(err(&with_local("[faults]\nseed = -3")).starts_with(
        "jobs/t.toml:2:8: faults.seed = -3: must be an integer from 0 to 18446744073709551615"
    ));
}

#[test]
fn launch_prefix_is_a_command() {
    let allowed = "must start with a command, e.g. [\"ssh\", \"-o\", \"BatchMode=yes\"]";
    assert_eq!(
        err(&with_local("[launch]\nssh = []")),
        format!("jobs/t.toml:2:7: launch.ssh = []: {allowed}")
    );
    assert_eq!(
        err(&with_local("[launch]\nssh = [\" \", \"-q\"]")),
        format!("jobs/t.toml:2:7: launch.ssh = [\" \", \"-q\"]: {allowed}")
    );
    assert_eq!(
        err(&with_local("[launch]\nssh = [\"ssh\", 3]")),
        "jobs/t.toml:2:15: launch.ssh[1] = 3: wrong type: expected a string, found integer `3`"
    );
    let cfg = ok(&with_local(
        "[launch]\nssh = [\"/usr/bin/ssh\", \"-p\", \"2222\"]",
    ));
    assert_eq!(cfg.launch.ssh, ["/usr/bin/ssh", "-p", "2222"]);
}

#[test]
fn job_key_and_name() {
    assert_eq!(
        err(&with_local("[job]\nkey = -1")),
        "jobs/t.toml:2:7: job.key = -1: must be an integer from 0 to 18446744073709551615 (write \
         values above 9223372036854775807 as a string such as \"0xffff_ffff_ffff_ffff\")"
    );
    assert!(err(&with_local("[job]\nkey = \"0xfg\"")).starts_with(
        "jobs/t.toml:2:7: job.key = \"0xfg\": must be an integer from 0 to 18446744073709551615"
    ));
    assert_eq!(
        ok(&with_local("[job]\nkey = \"0xffff_ffff_ffff_fffe\""))
            .job
            .key,
        u64::MAX - 1
    );
    assert_eq!(ok(&with_local("[job]\nkey = 0x1234")).job.key, 0x1234);
    assert_eq!(
        err(&with_local("[job]\nname = \"a\\tb\"")),
        "jobs/t.toml:2:8: job.name = \"a\\tb\": must not contain control characters such as \
         newlines or tabs"
    );
}

// ---- error structure, files ----------------------------------------------------

#[test]
fn errors_expose_location_and_key() {
    let e = JobConfig::from_str_named(&with_local("\n[ini]\nmtu = 1"), "x.toml").unwrap_err();
    let at = e.location().expect("a text error has a location");
    assert_eq!((at.origin.as_str(), at.line, at.column), ("x.toml", 3, 7));
    assert_eq!(e.key(), Some("ini.mtu"));
    assert!(matches!(e, ConfigError::Invalid { ref value, .. } if value == "1"));
}

#[test]
fn file_errors_name_the_path() {
    let dir = std::env::temp_dir().join(format!("mg-cluster-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(&path, "[local]\nclusters = 2\n\n[ini]\nwindow = 0\n").unwrap();
    let msg = JobConfig::from_path(&path).unwrap_err().to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        msg,
        format!(
            "{}:5:10: ini.window = 0: must be between 1 and 32768 (frames in flight per INI \
             connection)",
            path.display()
        )
    );

    let missing = Path::new("/nonexistent/multigrain/job.toml");
    let e = JobConfig::from_path(missing).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }));
    assert!(
        e.to_string()
            .starts_with("/nonexistent/multigrain/job.toml: cannot read the cluster config: ")
    );
    assert_eq!(e.location(), None);
}

// ---- resolution ----------------------------------------------------------------

#[test]
fn shorthand_expands_to_local_clusters() {
    let cfg = ok("[local]\nclusters = 3\nthreads = 4\n");
    assert_eq!(cfg, JobConfig::local(3, 4));
    assert_eq!(cfg.clusters.len(), 3);
    for (i, c) in cfg.clusters.iter().enumerate() {
        assert_eq!(
            (c.id, c.host.as_str(), c.port, c.threads),
            (i, "127.0.0.1", 0, 4)
        );
    }
    assert_eq!(cfg.total_threads(), 12);
    assert_eq!(ok("[local]\nclusters = 2\n").clusters[1].threads, 1);
}

#[test]
fn explicit_clusters_keep_order_and_defaults() {
    let cfg = ok("[[cluster]]\nhost = 'n1'\nport = 9000\nthreads = 8\n[[cluster]]\nhost = 'n2'\n");
    assert_eq!(cfg.clusters[0].id, 0);
    assert_eq!(
        (
            cfg.clusters[0].host.as_str(),
            cfg.clusters[0].port,
            cfg.clusters[0].threads
        ),
        ("n1", 9000, 8)
    );
    assert_eq!(
        (
            cfg.clusters[1].id,
            cfg.clusters[1].port,
            cfg.clusters[1].threads
        ),
        (1, 0, 1)
    );
    assert!(!cfg.clusters_on_same_host(0, 1));
    assert_eq!(cfg.total_threads(), 9);
}

#[test]
fn omitted_sections_take_their_defaults() {
    let cfg = ok("[local]\nclusters = 1\n");
    let local = JobConfig::local(1, 1);
    assert_eq!(cfg, local);
    assert_eq!(cfg.job.key, multigrain_cluster_config::DEFAULT_JOB_KEY);
    assert_eq!(cfg.ini.mtu, 1472);
    assert_eq!(
        cfg.ini.substrate,
        multigrain_cluster_config::Substrate::Auto
    );
    assert_eq!(cfg.dsm.region_base, 0x5000_0000_0000);
    assert_eq!(cfg.dsm.region_size, 1 << 30);
    assert!(!cfg.emulation.is_enabled() && !cfg.faults.is_enabled());
    assert_eq!(cfg.launch.ssh, ["ssh", "-o", "BatchMode=yes"]);
}

#[test]
fn dotted_and_inline_forms_point_at_the_value() {
    assert_eq!(
        err(&with_local("ini.window = 0")),
        "jobs/t.toml:1:14: ini.window = 0: must be between 1 and 32768 (frames in flight per \
         INI connection)"
    );
    assert_eq!(
        err("cluster = [{ host = 'a' }, { host = 'b', threads = 0 }]\n"),
        "jobs/t.toml:1:52: cluster[1].threads = 0: must be between 1 and 1024"
    );
}
