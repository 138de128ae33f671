//! `render_table` (for `multigrain config show`) and `to_toml_string`.

use multigrain_cluster_config::JobConfig;

fn parse(text: &str) -> JobConfig {
    JobConfig::from_str_named(text, "t.toml").unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn default_table() {
    assert_eq!(
        JobConfig::embedded_default().render_table(),
        "\
cluster  host       port  threads  INIs  policy  substrate
      0  127.0.0.1  auto        2     1  static  udp
      1  127.0.0.1  auto        2     1  static  udp

job     2x2, key 0x6d756c7469000001, start-up timeout 10000 ms, peer timeout 3000 ms, progress timeout 60000 ms
total   2 clusters, 4 compute threads, 2 INIs
dsm     protocol hlrc, home policy round-robin
region  1 GiB at 0x500000000000..0x500040000000 (262144 pages of 4096 bytes)
ini     window 32 frames, SEND timeout 2000 µs, ACK timeout 200 µs, MTU 8972 bytes, queue 4096 messages, network polled 1 in 8–32 polls (adaptive)
cpus    clusters started together on one host each bound to their own share of its CPUs, with their protocol threads on the others' shares while every compute thread has a CPU (cpu_bind = auto)
"
    );
}

#[test]
fn explicit_hosts_ports_and_optional_lines() {
    let cfg = parse(
        "[[cluster]]\nhost = 'node-a'\nport = 47000\nthreads = 16\n\
         [[cluster]]\nhost = 'node-a'\nport = 47002\nthreads = 16\n\
         [[cluster]]\nhost = 'node-b'\nthreads = 8\n\
         [ini]\nper_cluster = 2\npolicy = 'least-loaded'\n\
         [dsm]\nprotocol = 'sc'\nhome = 'first-touch'\nregion_size = '512MiB'\n\
         [emulation]\nlatency_us = 5\nrecv_overhead_us = 0.5\n\
         [faults]\ndrop = 0.01\nseed = 7\n\
         [launch]\nssh = ['ssh', '-q']\n",
    );
    let table = cfg.render_table();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0],
        "cluster  host    port         threads  INIs  policy        substrate"
    );
    assert_eq!(
        lines[1],
        "      0  node-a  47000-47001       16     2  least-loaded  auto (shm+udp)"
    );
    assert_eq!(
        lines[2],
        "      1  node-a  47002-47003       16     2  least-loaded  auto (shm+udp)"
    );
    assert_eq!(
        lines[3],
        "      2  node-b  auto               8     2  least-loaded  auto (udp)"
    );
    assert!(table.contains("\ntotal      3 clusters, 40 compute threads, 6 INIs\n"));
    assert!(table.contains("\ndsm        protocol sc, home policy first-touch\n"));
    assert!(table.contains("\nregion     512 MiB at 0x500000000000..0x500020000000 (131072 pages"));
    assert!(
        table.contains("\nemulation  send o 0 µs, recv o 0.5 µs, g 0 µs, L 5 µs, G 0 ns/byte\n")
    );
    assert!(table.contains("\nfaults     drop 0.01, duplicate 0, reorder 0, corrupt 0 (seed 7)\n"));
    assert!(table.contains("\nlaunch     ssh -q HOST COMMAND for clusters not on loopback\n"));
    // Clusters 0 and 1 share node-a.
    assert!(table.contains("\ncpus       clusters started together on one host each bound"));
    let split = parse("[local]\nclusters = 2\n[launch]\ncpu_bind = 'split'\n").render_table();
    assert!(
        split.contains("their own share of its CPUs (cpu_bind = split)\n"),
        "{split}"
    );
    let apart = parse("[local]\nclusters = 2\n[launch]\ncpu_bind = 'apart'\n").render_table();
    assert!(
        apart.contains("their protocol threads to the others' shares (cpu_bind = apart)\n"),
        "{apart}"
    );
    // Dedicated INI threads: auto does not bind.
    let dedicated = parse("[local]\nclusters = 2\n[ini]\ninline = false\n").render_table();
    assert!(!dedicated.contains("\ncpus"), "{dedicated}");
    let unbound = parse("[local]\nclusters = 2\n[launch]\ncpu_bind = 'none'\n").render_table();
    assert!(
        unbound.contains("\ncpus    no CPU binding (cpu_bind = none)\n"),
        "{unbound}"
    );
    assert!(
        table.lines().all(|l| l == l.trim_end()),
        "no trailing spaces"
    );
}

#[test]
fn off_sections_are_not_shown() {
    let table = parse("[local]\nclusters = 1\n").render_table();
    assert!(table.contains("auto (no peers)"));
    for absent in ["emulation", "faults", "launch", "cpus"] {
        assert!(!table.contains(absent), "{absent} shown:\n{table}");
    }
    assert!(table.contains("job     (unnamed), key 0x6d756c7469000001"));
}

#[test]
fn toml_output_parses_back_to_the_same_config() {
    for text in [
        multigrain_cluster_config::EMBEDDED_DEFAULT_TOML,
        "[local]\nclusters = 3\n",
        "[job]\nname = 'quote \" and \\\\'\nkey = '0xffff_ffff_ffff_ffff'\n\
         [[cluster]]\nhost = 'n1'\nport = 9000\n[faults]\nreorder = 0.1\nseed = '18446744073709551615'\n",
    ] {
        let cfg = parse(text);
        let again = parse(&cfg.to_toml_string());
        assert_eq!(cfg, again, "{}", cfg.to_toml_string());
    }
}
