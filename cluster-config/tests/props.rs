//! Properties: any valid configuration survives `to_toml_string` and
//! parsing, and no input makes the parser panic or point outside the text.

use multigrain_cluster_config::{
    BarrierUpdates, ClusterSpec, CpuBind, DsmConfig, EMBEDDED_DEFAULT_TOML, EmulationConfig,
    FaultConfig, HomePolicy, IniConfig, IniPolicy, JobConfig, JobSettings, LaunchConfig,
    MAX_IDLE_FLUSHES, MAX_POLL_INTERVAL, MAX_PREFETCH, MAX_RELEASE_BATCH, MAX_TRACE_RECORDS,
    MAX_WAIT_SPIN_US, MAX_WRITE_AHEAD, PAGE_SIZE, Protocol, ProtocolPriority, Substrate,
    ThreadPolicy,
};
use proptest::prelude::*;
use proptest::sample::select;

const HOSTS: [&str; 5] = ["127.0.0.1", "localhost", "node-a", "10.1.2.3", "::1"];

fn choice<T: Copy + std::fmt::Debug + 'static>(all: &'static [T]) -> impl Strategy<Value = T> {
    select(all)
}

fn probability() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), Just(1.0), 0.0..=1.0f64]
}

fn non_negative() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), 0.0..1e6f64, 0.0..1e-3f64]
}

prop_compose! {
    /// A valid configuration: ports are either 0 or spaced so that the INI
    /// ranges of clusters never overlap, `shm` only with a single host,
    /// timeouts in a consistent order.
    fn valid_config()(
        n in 1usize..6,
        inis in 1usize..5,
        hosts in prop::collection::vec(select(&HOSTS[..]), 6),
        threads in prop::collection::vec(1usize..64, 6),
        fixed_ports in prop::collection::vec(any::<bool>(), 6),
        cluster_inis in prop::collection::vec(prop::option::of(1usize..=8), 6),
        name in prop::option::of("[a-zA-Z0-9 _\"'\\\\-]{0,12}"),
        key in any::<u64>(),
        startup in 1u64..1_000_000,
        ack in 1u64..10_000,
        send_extra in 1u64..100_000,
        peer_extra in 1u64..10_000,
        progress in prop_oneof![Just(0u64), 1u64..10_000_000],
        policy in choice(IniPolicy::ALL),
        substrate in choice(Substrate::ALL),
        window in 1u32..=multigrain_window::MAX_WINDOW,
        mtu in 512usize..=65507,
        queue in 1usize..100_000,
        inline in any::<bool>(),
        trace_dir in "[a-zA-Z0-9/ ._\"-]{0,12}",
        trace_records in 1usize..=MAX_TRACE_RECORDS,
        poll_min in 1u32..=MAX_POLL_INTERVAL,
        poll_extra in 0u32..64,
        protocol in choice(Protocol::ALL),
        home in choice(HomePolicy::ALL),
        prefetch in 0u32..=MAX_PREFETCH,
        protocol_priority in choice(ProtocolPriority::ALL),
        base_page in (0x10u64..0x4000_0000),
        pages in 1u64..(1 << 20),
        emu in prop::array::uniform5(non_negative()),
        probs in prop::array::uniform4(probability()),
        seed in any::<u64>(),
        ssh in prop::collection::vec("[a-zA-Z0-9=/ _.-]{1,8}", 1..4),
    ) -> JobConfig {
        let single_host = substrate == Substrate::Shm;
        let clusters = (0..n).map(|id| ClusterSpec {
            id,
            host: if single_host { hosts[0] } else { hosts[id] }.to_owned(),
            port: if fixed_ports[id] { u16::try_from(20_000 + id * 10).unwrap() } else { 0 },
            threads: threads[id],
            inis: cluster_inis[id],
        }).collect();
        let send = ack + send_extra;
        let mut cfg = JobConfig {
            job: JobSettings {
                name,
                key,
                startup_timeout_ms: startup,
                peer_timeout_ms: send / 1000 + peer_extra,
                progress_timeout_ms: progress,
            },
            clusters,
            ini: IniConfig {
                per_cluster: inis,
                policy,
                substrate,
                window,
                send_timeout_us: send,
                ack_timeout_us: ack,
                mtu,
                queue_capacity: queue,
                inline,
                coalesce: (seed >> 20) & 1 == 1,
                offload: (seed >> 21) & 1 == 1,
                connected_sends: (seed >> 22) & 1 == 1,
                trace_dir,
                trace_records,
                poll_interval_min: poll_min,
                poll_interval_max: (poll_min + poll_extra).min(MAX_POLL_INTERVAL),
            },
            dsm: DsmConfig {
                protocol,
                home,
                region_base: base_page * PAGE_SIZE,
                region_size: pages * PAGE_SIZE,
                page_size: PAGE_SIZE,
                prefetch,
                // Every value in range, drawn from the seed (proptest's argument list
                // is full).
                write_ahead: ((seed >> 20) % (u64::from(MAX_WRITE_AHEAD) + 1)) as u32,
                idle_flushes: ((seed >> 28) % (u64::from(MAX_IDLE_FLUSHES) + 1)) as u32,
                release_batch: 1 + (seed % u64::from(MAX_RELEASE_BATCH)) as u32,
                barrier_updates: [BarrierUpdates::Auto, BarrierUpdates::On, BarrierUpdates::Off]
                    [(seed >> 40) as usize % 3],
                flush_ahead: (seed >> 44) % 2 == 0,
                populate: (seed >> 45) % 2 == 0,
                protocol_priority,
                thread_policy: ThreadPolicy::ALL[(seed >> 46) as usize % ThreadPolicy::ALL.len()],
                event_profile: (seed >> 48) % 2 == 0,
                wait_spin_us: (seed >> 8) % (MAX_WAIT_SPIN_US + 1),
            },
            emulation: EmulationConfig {
                send_overhead_us: emu[0],
                recv_overhead_us: emu[1],
                gap_us: emu[2],
                latency_us: emu[3],
                per_byte_gap_ns: emu[4],
            },
            faults: FaultConfig {
                drop: probs[0],
                duplicate: probs[1],
                reorder: probs[2],
                corrupt: probs[3],
                seed,
            },
            launch: LaunchConfig {
                ssh: ssh.into_iter().map(|w| format!("x{w}")).collect(),
                cpu_bind: [CpuBind::Auto, CpuBind::None][(seed >> 44) as usize % 2],
            },
        };
        // g and G are refused on shared-memory links.
        if cfg.check_emulation().is_err() {
            cfg.emulation.gap_us = 0.0;
            cfg.emulation.per_byte_gap_ns = 0.0;
        }
        cfg
    }
}

/// Checks that an error, if any, points inside the text.
fn check_no_panic(text: &str) {
    if let Err(e) = JobConfig::from_str_named(text, "fuzz.toml") {
        let at = e.location().expect("text errors have a location");
        assert!(at.line >= 1 && at.column >= 1);
        assert!(at.line <= text.lines().count() + 1, "{e}");
        assert!(!e.to_string().is_empty());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn valid_configs_round_trip(cfg in valid_config()) {
        let text = cfg.to_toml_string();
        let parsed = JobConfig::from_str_named(&text, "generated.toml");
        prop_assert_eq!(parsed.as_ref().ok(), Some(&cfg), "{}\n{:?}", text, parsed.as_ref().err());
        let table = cfg.render_table();
        prop_assert_eq!(table.lines().filter(|l| l.trim_start().starts_with(char::is_numeric)).count() >= cfg.clusters.len(), true);
        for c in &cfg.clusters {
            let row = table.lines().nth(1 + c.id).unwrap();
            prop_assert!(row.split_whitespace().next() == Some(c.id.to_string().as_str()), "{}", row);
            prop_assert!(row.contains(&c.host), "{}", row);
        }
    }

    #[test]
    fn random_text_never_panics(text in any::<String>()) {
        check_no_panic(&text);
    }

    #[test]
    fn mutated_default_never_panics(
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0usize..4, "[ -~\n]{0,6}"), 1..6)
    ) {
        let mut text = EMBEDDED_DEFAULT_TOML.to_owned();
        for (at, kind, insert) in edits {
            let mut i = at.index(text.len() + 1);
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            match kind {
                0 => text.insert_str(i, &insert),
                1 => { let end = (i + insert.len()).min(text.len()); if text.is_char_boundary(end) { text.replace_range(i..end, ""); } }
                _ => { let end = (i + insert.len()).min(text.len()); if text.is_char_boundary(end) { text.replace_range(i..end, &insert); } }
            }
        }
        check_no_panic(&text);
    }

    #[test]
    fn any_key_with_any_value_never_panics(
        section in select(&["job", "local", "ini", "dsm", "emulation", "faults", "launch", "cluster"][..]),
        key in select(&["name", "key", "clusters", "threads", "host", "port", "per_cluster", "policy",
                        "window", "mtu", "region_base", "region_size", "page_size", "drop", "seed",
                        "ssh", "latency_us"][..]),
        value in prop_oneof![
            any::<i64>().prop_map(|v| v.to_string()),
            any::<f64>().prop_map(|v| format!("{v:?}")),
            "\"[ -~]{0,12}\"",
            Just("[]".to_owned()),
            Just("{}".to_owned()),
            Just("0xffff_ffff_ffff_ffff".to_owned()),
            Just("-inf".to_owned()),
        ],
    ) {
        let header = if section == "cluster" { "[[cluster]]\nhost = 'h'".to_owned() } else { format!("[{section}]") };
        let tail = if section == "cluster" || section == "local" { "" } else { "\n[local]\nclusters = 2" };
        check_no_panic(&format!("{header}\n{key} = {value}{tail}\n"));
    }
}
