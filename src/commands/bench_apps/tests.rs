use super::*;
use crate::measure::Bound;
use clap::Parser;

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    args: BenchAppsArgs,
}

fn parse(args: &[&str]) -> Result<BenchAppsArgs, clap::Error> {
    Cli::try_parse_from(std::iter::once("bench-apps").chain(args.iter().copied())).map(|c| c.args)
}

fn plan(args: &[&str]) -> Result<Plan> {
    Plan::from_args(&parse(args).map_err(|e| anyhow!("{e}"))?)
}

#[test]
fn water_sizes_parse_and_are_checked() {
    assert_eq!(
        parse_water_size("512x50"),
        Ok(Some(WaterSize {
            molecules: 512,
            steps: 50
        }))
    );
    assert_eq!(
        parse_water_size("4096×3"),
        Ok(Some(WaterSize {
            molecules: 4096,
            steps: 3
        }))
    );
    assert_eq!(parse_water_size("none"), Ok(None));
    let e = parse_water_size("500x50").unwrap_err();
    assert!(
        e.contains("500 molecules is not a positive perfect cube"),
        "{e}"
    );
    let e = parse_water_size("512x0").unwrap_err();
    assert!(e.contains("at least 1 time step"), "{e}");
    let e = parse_water_size("512").unwrap_err();
    assert!(e.contains("expected MOLECULESxSTEPS"), "{e}");
    let e = parse_water_size("ax3").unwrap_err();
    assert!(e.contains("is not a number of molecules"), "{e}");
}

#[test]
fn defaults_run_the_issue_10_problems_on_every_topology() {
    let p = plan(&[]).unwrap();
    assert_eq!(p.repeat, 3);
    assert_eq!(p.topologies, Topology::ALL.to_vec());
    assert_eq!(
        p.problems,
        vec![
            Problem::Water {
                role: WaterRole::Small,
                size: WaterSize {
                    molecules: 512,
                    steps: 50
                }
            },
            Problem::Water {
                role: WaterRole::Large,
                size: WaterSize {
                    molecules: 4096,
                    steps: 3
                }
            },
            Problem::Em3d {
                nodes_per_thread: 20_000,
                iterations: 100,
                layout: "good".into(),
                variant: "read".into()
            },
        ]
    );
    // Water: sequential, threads, 4 topologies; EM3D also a 4-partition sequential.
    assert_eq!(p.runs(), 3 * (6 + 6 + 7));
    assert_eq!(p.timeout_s, 600);
}

#[test]
fn topologies_only_and_sizes_restrict_the_plan() {
    let p = plan(&[
        "--only",
        "em3d",
        "--topologies",
        "4x1,2x1-shm",
        "--repeat",
        "1",
    ])
    .unwrap();
    assert_eq!(p.topologies, vec![Topology::Shm2x1, Topology::Udp4x1]);
    assert_eq!(p.problems.len(), 1);
    let setups = p.problems[0].setups(&p.topologies, false);
    assert_eq!(
        setups.iter().map(|s| s.label()).collect::<Vec<_>>(),
        [
            "--sequential (2 partitions)",
            "--threads 2",
            "DSM 2×1 shm",
            "--sequential (4 partitions)",
            "DSM 4×1 udp"
        ]
    );
    assert_eq!(
        p.problems[0].reference_of(Setup::Dsm {
            topology: Topology::Udp4x1,
            compared: true,
        }),
        Setup::Sequential {
            partitions: Some(4)
        }
    );
    // Only the (4) ratio whose configurations ran.
    let ratios = p.problems[0].ratios(&setups);
    assert_eq!(ratios.len(), 1);
    assert_eq!(ratios[0].target.bound, Bound::AtLeast(0.7));

    let p = plan(&["--only", "water", "--water-large", "none"]).unwrap();
    assert_eq!(p.problems.len(), 1);
    let water = &p.problems[0];
    let ids: Vec<&str> = water
        .ratios(&water.setups(&p.topologies, false))
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, ["(2)", "(2)", "(2)", "(2)", "(3)", "(3)"]);
}

#[test]
fn bad_flags_are_named_with_what_is_allowed() {
    let e = parse(&["--topologies", "2x1-shm,3x3"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown topology \"3x3\" (allowed: 2x1-shm, 2x1-udp, 2x2, 4x1)"),
        "{e}"
    );
    assert!(e.contains("--topologies"), "{e}");
    let e = parse(&["--water-small", "100x2"]).unwrap_err().to_string();
    assert!(
        e.contains("--water-small") && e.contains("perfect cube"),
        "{e}"
    );
    let e = parse(&["--repeat", "0"]).unwrap_err().to_string();
    assert!(e.contains("--repeat"), "{e}");
    let e = parse(&["--only", "fft"]).unwrap_err().to_string();
    assert!(e.contains("possible values: water, em3d"), "{e}");
    let e = parse(&["--em3d-layout", "diagonal"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("naive") && e.contains("good"), "{e}");
    let e = plan(&["--topologies", "2x2,2x2"]).unwrap_err().to_string();
    assert_eq!(e, "--topologies: 2x2 is named twice");
    let e = plan(&[
        "--only",
        "water",
        "--water-small",
        "none",
        "--water-large",
        "none",
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("nothing to run"), "{e}");
}

#[test]
fn sets_reach_only_the_dsm_runs_and_topology_keys_are_refused() {
    let p = plan(&[
        "--set",
        "dsm.release_batch=64",
        "--set",
        "dsm.protocol=sc",
        "--compare",
        "dsm.prefetch=0",
    ])
    .unwrap();
    assert_eq!(p.sets, ["dsm.release_batch=64", "dsm.protocol=sc"]);
    assert_eq!(p.compare, ["dsm.prefetch=0"]);
    let dir = Path::new("/configs");
    let water = &p.problems[0];
    let setups = water.setups(&p.topologies, true);
    // Every DSM row is followed by its (B) twin; the ratios stay on the A rows.
    assert_eq!(
        setups.iter().map(|s| s.label()).collect::<Vec<_>>(),
        [
            "--sequential",
            "--threads 2",
            "DSM 2×1 shm",
            "DSM 2×1 shm (B)",
            "DSM 2×1 udp",
            "DSM 2×1 udp (B)",
            "DSM 2×2 udp (default job)",
            "DSM 2×2 udp (default job) (B)",
            "DSM 4×1 udp",
            "DSM 4×1 udp (B)",
        ]
    );
    // EM3D: 2 sequential references, --threads 2 and 8 DSM rows.
    assert_eq!(p.runs(), 3 * (10 + 10 + 11));
    for r in water.ratios(&setups) {
        for s in [r.numerator, r.denominator] {
            assert!(!matches!(s, Setup::Dsm { compared: true, .. }), "{r:?}");
        }
    }
    for setup in setups {
        let args = run_args(dir, water, setup, &p.sets, &p.compare);
        let sets: Vec<&str> = args
            .windows(2)
            .filter(|w| w[0] == "--set")
            .map(|w| w[1].as_str())
            .collect();
        match setup {
            Setup::Dsm {
                compared: false, ..
            } => assert_eq!(
                sets,
                ["dsm.release_batch=64", "dsm.protocol=sc"],
                "{args:?}"
            ),
            Setup::Dsm { compared: true, .. } => assert_eq!(
                sets,
                ["dsm.release_batch=64", "dsm.protocol=sc", "dsm.prefetch=0"],
                "{args:?}"
            ),
            _ => assert!(sets.is_empty(), "{setup:?} got {args:?}"),
        }
    }
    let e = plan(&["--compare", "local.clusters=3"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--compare local.clusters=3"), "{e}");
    for key in [
        "local.threads=2",
        "cluster.0.threads=3",
        "ini.substrate=shm",
    ] {
        let e = plan(&["--set", key]).unwrap_err().to_string();
        assert!(
            e.contains(&format!("--set {key}")) && e.contains("--topologies"),
            "{e}"
        );
    }
    let e = parse(&["--set", "dsm.release_batch"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--set"), "{e}");
    // A value the schema refuses is named against the topology it breaks.
    let bad: Override = "dsm.release_batch=0".parse().unwrap();
    let text = Topology::Shm2x1.config_toml().unwrap();
    let e = JobConfig::from_str_with_overrides(&text, "2x1-shm", &[bad])
        .unwrap_err()
        .to_string();
    assert!(e.contains("release_batch"), "{e}");
}

#[test]
fn generated_configurations_are_valid_jobs() {
    for t in Topology::ALL {
        let Some(text) = t.config_toml() else {
            assert_eq!(t, Topology::Udp2x2, "only 2x2 uses the embedded job");
            continue;
        };
        let cfg = JobConfig::from_str_named(&text, t.name()).unwrap();
        assert_eq!(cfg.total_threads(), t.threads());
        let substrate = if t == Topology::Shm2x1 { "shm" } else { "udp" };
        assert_eq!(cfg.ini.substrate.as_str(), substrate);
    }
    assert_eq!(JobConfig::embedded_default().total_threads(), 4);
}

/// A run whose whole command took 0.1 s more than its computation.
fn ok(run_s: f64, answer: &Answer) -> Result<RunOk, String> {
    Ok(RunOk {
        run_s,
        command_s: run_s + 0.1,
        locked_s: matches!(answer, Answer::Water(_)).then_some(run_s / 4.0),
        answer: answer.clone(),
    })
}

fn energies(total: f64) -> Answer {
    Answer::Water(vec![water::StepEnergies {
        step: 1,
        kinetic: 1.5,
        intra_potential: 0.006,
        inter_potential: 10.6,
        reaction_field: -2.1,
        total,
        avg_temperature_k: 299.3,
        virial: -19.2,
    }])
}

#[test]
fn results_are_checked_and_ratios_taken_per_round() {
    let problem = Problem::Water {
        role: WaterRole::Small,
        size: WaterSize {
            molecules: 64,
            steps: 1,
        },
    };
    let seq = Setup::Sequential { partitions: None };
    let thr = Setup::Threads { threads: 2 };
    let shm = Setup::Dsm {
        topology: Topology::Shm2x1,
        compared: false,
    };
    let shm_b = Setup::Dsm {
        topology: Topology::Shm2x1,
        compared: true,
    };
    let udp = Setup::Dsm {
        topology: Topology::Udp2x1,
        compared: false,
    };
    let good = energies(10.0);
    let close = energies(10.000_000_000_01);
    let wrong = energies(10.01);
    let records = vec![
        Record {
            setup: seq,
            runs: vec![ok(1.0, &good), ok(4.0, &good)],
        },
        Record {
            setup: thr,
            runs: vec![ok(0.5, &close), ok(2.0, &good)],
        },
        Record {
            setup: shm,
            // A regime change: round 2 is 4× slower for everyone.
            runs: vec![ok(1.0, &good), ok(4.0, &good)],
        },
        Record {
            setup: udp,
            runs: vec![ok(3.0, &wrong), Err("exit status: 1: boom".into())],
        },
        Record {
            setup: shm_b,
            // Twice as fast as the A row in both rounds.
            runs: vec![ok(0.5, &good), ok(2.0, &good)],
        },
    ];
    let r = problem_report(&problem, &records);
    assert_eq!(r.comparisons.len(), 1);
    assert_eq!(r.comparisons[0].per_round, vec![Some(0.5), Some(0.5)]);
    assert_eq!(r.comparisons[0].topology, Topology::Shm2x1);
    let c = &r.configurations;
    assert_eq!(c[0].check, Check::Reference);
    assert!(
        matches!(c[1].check, Check::Agrees { min_digits } if (11.0..13.0).contains(&min_digits)),
        "{:?}",
        c[1].check
    );
    assert_eq!(c[2].check, Check::Agrees { min_digits: 17.0 });
    let Check::Failed { reasons } = &c[3].check else {
        panic!("{:?}", c[3].check)
    };
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons[0].contains("round 2: exit status: 1: boom"),
        "{reasons:?}"
    );
    assert!(reasons[1].contains("round 1: step 1 total"), "{reasons:?}");
    assert_eq!(c[1].speedup.unwrap().median, 2.0);
    assert_eq!(c[3].run_s, vec![Some(3.0), None]);
    // (2) shm / threads: 2.0 in both rounds despite the regime change.
    let shm_ratio = &r.ratios[0];
    assert_eq!(shm_ratio.per_round, vec![Some(2.0), Some(2.0)]);
    assert_eq!(shm_ratio.met, Some(false));
    // (2) udp / threads: only round 1 has both runs.
    assert_eq!(r.ratios[1].per_round, vec![Some(6.0), None]);
    assert_eq!(r.ratios[1].summary.unwrap().samples, 1);
    // (2) again on the whole commands: (1.0 + 0.1) / (0.5 + 0.1), (4.0 + 0.1) / (2.0 + 0.1).
    let whole = &r.ratios[2];
    assert_eq!(whole.spec.measure, Measure::Command);
    let want = [1.1 / 0.6, 4.1 / 2.1];
    for (got, want) in whole.per_round.iter().zip(want) {
        assert!((got.unwrap() - want).abs() < 1e-12, "{got:?} {want}");
    }
    assert_eq!(c[2].command_s, vec![Some(1.1), Some(4.1)]);
    assert_eq!(c[3].command_s, vec![Some(3.1), None]);
    // Water's time under the molecule locks, per round, a failed round left out.
    assert_eq!(c[3].locked_s, vec![Some(0.75), None]);
    assert_eq!(c[2].locked.unwrap().median, 0.625);

    let report = AppsReport {
        command: "multigrain bench apps",
        plan: Plan {
            repeat: 2,
            problems: vec![problem],
            topologies: vec![Topology::Shm2x1, Topology::Udp2x1],
            timeout_s: 600,
            sets: vec!["dsm.release_batch=64".to_owned()],
            compare: vec!["dsm.prefetch=0".to_owned()],
        },
        problems: vec![r],
        failed: 1,
    };
    let text = render(&report);
    for needle in [
        "Water 64 molecules × 1 step (",
        "--threads 2",
        "2.00 (2.00–2.00)",
        "agrees (bitwise)",
        "FAILED: round 2: exit status: 1: boom",
        "(2) time of 2×1 shm / time of --threads 2",
        "≤ 1.5: NOT MET",
        "1 configuration(s) FAILED",
        "every DSM run with --set dsm.release_batch=64",
        "(B): the DSM row above it, run in the same round with --set dsm.prefetch=0 as well",
        "DSM 2×1 shm (B)",
        "time of DSM 2×1 shm (B) / time of DSM 2×1 shm  0.50 (0.50–0.50)",
        "adding forces under locks, s",
    ] {
        assert!(text.contains(needle), "no {needle:?} in\n{text}");
    }
    let json = serde_json::to_value(&report).unwrap();
    let shm_json = &json["problems"][0]["configurations"][2];
    assert_eq!(shm_json["setup"]["topology"], "2x1-shm");
    assert_eq!(shm_json["check"]["status"], "agrees");
    assert_eq!(shm_json["locked_s"][1], 1.0);
    assert_eq!(json["problems"][0]["ratios"][0]["id"], "(2)");
    assert_eq!(json["plan"]["sets"][0], "dsm.release_batch=64");
    assert_eq!(
        json["problems"][0]["ratios"][0]["target"]["bound"]["at_most"],
        1.5
    );
}

#[test]
fn seconds_keep_three_significant_digits() {
    assert_eq!(secs(12.345), "12.3");
    assert_eq!(secs(0.6213), "0.621");
    assert_eq!(secs(0.000_123_4), "0.000123");
    assert_eq!(secs(345.6), "346");
}

#[test]
fn digits_of_agreement() {
    assert_eq!(digits(1.0, 1.0), 17.0);
    assert!((digits(1.000_001, 1.0) - 6.0).abs() < 0.01);
    assert_eq!(digits(1.0, 0.0), 0.0);
}
