use std::path::PathBuf;

use super::*;
use crate::threads::ThreadsRuntime;

/// SPLASH's `random.in`, read from the shared data folder next to the workspace.
fn random_in() -> PathBuf {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    crate::shared_data::find(&workspace, "splash2-water-random.in")
        .unwrap_or_else(|e| panic!("SPLASH's velocity table is missing: {e}"))
}

fn splash_params(molecules: usize, steps: usize) -> Params {
    Params {
        molecules,
        steps,
        velocities: VelocitySource::File(random_in()),
        ..Params::default()
    }
}

fn printed(r: &RunResult) -> String {
    r.energies.iter().map(format_step).collect()
}

/// SPLASH-3 output for `1.5e-16 512 3 6 / -1 3000 1 0 / 1 6.212752` (shared/data/README.md).
const SPLASH_512X3: &str =
    "         1        1.50940      0.00567     10.63575                      -2.12451
           10.026        299.86725        -19.17021
         2        1.53253      0.02268     10.61507                      -2.14571
           10.025        302.16501        -19.33583
         3        1.57495      0.05127     10.55761                      -2.15831
           10.026        305.74022        -19.57198
";

/// SPLASH-3 output for 343 molecules, 2 steps (shared/data/README.md).
const SPLASH_343X2: &str =
    "         1        1.51255      0.00425     10.63337                      -2.12437
           10.026        300.49293        -19.13468
         2        1.54276      0.01706     10.61012                      -2.14544
           10.025        303.49403        -19.28035
";

#[test]
fn sequential_matches_splash_512x3() {
    let r = run_sequential(&splash_params(512, 3)).unwrap();
    assert_eq!(printed(&r), SPLASH_512X3);
}

#[test]
fn sequential_matches_splash_343x2() {
    let r = run_sequential(&splash_params(343, 2)).unwrap();
    assert_eq!(printed(&r), SPLASH_343X2);
}

/// SPLASH-3's energies for 343 molecules × 2 steps printed with `%.16e` (a copy of the C
/// code built outside the project with only the printf changed): the port is
/// bit-identical, not just equal to five decimals.
#[test]
#[allow(clippy::excessive_precision)] // C's %.16e output, kept verbatim
fn sequential_is_bit_identical_to_splash_343x2() {
    let splash: [[f64; 7]; 2] = [
        [
            1.5125482872254667e+00,
            4.2510904071940978e-03,
            1.0633371510549335e+01,
            -2.1243747540958644e+00,
            1.0025796134086132e+01,
            3.0049292639545939e+02,
            -1.9134676959542105e+01,
        ],
        [
            1.5427607534613366e+00,
            1.7062618512250733e-02,
            1.0610118632958669e+01,
            -2.1454365939898214e+00,
            1.0024505410942435e+01,
            3.0349403137488912e+02,
            -1.9280352277759246e+01,
        ],
    ];
    let r = run_sequential(&splash_params(343, 2)).unwrap();
    for (e, want) in r.energies.iter().zip(splash) {
        let got = e.values();
        assert_eq!(
            got.map(f64::to_bits),
            want.map(f64::to_bits),
            "step {}: {got:?}",
            e.step
        );
    }
}

/// Number of leading significant decimal digits on which `a` and `b` agree (17 = equal).
fn agreeing_digits(a: f64, b: f64) -> u32 {
    if a.to_bits() == b.to_bits() {
        return 17;
    }
    let rel = ((a - b) / a.abs().max(b.abs())).abs();
    (-rel.log10()).floor().clamp(0.0, 17.0) as u32
}

fn min_agreement(a: &RunResult, b: &RunResult) -> u32 {
    assert_eq!(a.energies.len(), b.energies.len());
    a.energies
        .iter()
        .zip(&b.energies)
        .flat_map(|(x, y)| {
            assert_eq!(x.step, y.step);
            [
                (x.kinetic, y.kinetic),
                (x.intra_potential, y.intra_potential),
                (x.inter_potential, y.inter_potential),
                (x.reaction_field, y.reaction_field),
                (x.total, y.total),
                (x.avg_temperature_k, y.avg_temperature_k),
                (x.virial, y.virial),
            ]
        })
        .map(|(x, y)| agreeing_digits(x, y))
        .min()
        .unwrap()
}

#[test]
fn parallel_agrees_with_sequential() {
    for (molecules, steps) in [(343, 2), (512, 3)] {
        let params = splash_params(molecules, steps);
        let seq = run_sequential(&params).unwrap();
        for threads in [1, 2, 4] {
            let mut rt = ThreadsRuntime::new(threads).unwrap();
            let par = run_parallel(&mut rt, &params).unwrap();
            assert_eq!(par.threads, threads);
            let digits = min_agreement(&seq, &par);
            eprintln!(
                "{molecules} molecules, {threads} threads: {digits} significant digits agree"
            );
            if threads == 1 {
                // One thread adds in exactly the sequential order.
                assert_eq!(par.energies, seq.energies);
            }
            assert!(
                digits >= 9,
                "{threads} threads agree to only {digits} digits"
            );
            assert_eq!(printed(&par), printed(&seq));
        }
    }
}

#[test]
fn uneven_partition_and_seeded_velocities() {
    // 27 molecules over 4 threads: blocks of 6, 6, 6 and 9.
    assert_eq!(molecules_of(3, 4, 27), 18..27);
    assert_eq!(molecules_of(0, 4, 27), 0..6);
    let params = Params {
        molecules: 27,
        steps: 4,
        print_every: 2,
        cutoff_angstrom: 0.0,
        ..Params::default()
    };
    let seq = run_sequential(&params).unwrap();
    assert_eq!(
        seq.energies.iter().map(|e| e.step).collect::<Vec<_>>(),
        [2, 4]
    );
    let mut rt = ThreadsRuntime::new(4).unwrap();
    let par = run_parallel(&mut rt, &params).unwrap();
    assert!(min_agreement(&seq, &par) >= 9);
    // A different seed gives a different trajectory.
    let other = run_sequential(&Params {
        velocities: VelocitySource::Seeded(7),
        ..params
    })
    .unwrap();
    assert_ne!(other.energies[0].kinetic, seq.energies[0].kinetic);
}

#[test]
fn temperature_starts_at_298_k() {
    // INITIA scales velocities to 298 K; after one small step AVGT is close to it.
    let r = run_sequential(&Params {
        molecules: 64,
        steps: 1,
        ..Params::default()
    })
    .unwrap();
    let t = r.energies[0].avg_temperature_k;
    assert!((t - 298.0).abs() < 15.0, "AVGT {t} K");
}

#[test]
fn more_threads_than_molecules() {
    let params = Params {
        molecules: 8,
        steps: 2,
        ..Params::default()
    };
    let seq = run_sequential(&params).unwrap();
    let mut rt = ThreadsRuntime::new(3).unwrap();
    assert!(min_agreement(&seq, &run_parallel(&mut rt, &params).unwrap()) >= 9);
    let mut rt = ThreadsRuntime::new(9).unwrap();
    assert!(min_agreement(&seq, &run_parallel(&mut rt, &params).unwrap()) >= 9);
}

#[test]
fn banner_matches_splash() {
    // SPLASH-3's output for the 343-molecule deck, up to the first step.
    let expected = "Using 1 procs on 2 steps of 343 mols
Other parameters:
\tTSTEP = 1.50e-16
\tNORDER = 6
\tNSAVE = -1
\tNRST = 3000
\tNPRINT = 1
\tNFMC = 0
\tCUTOFF = 6.212752


TEMPERATURE                =   298.00 K
DENSITY                    =  0.99800 G/C.C.
NUMBER OF MOLECULES        =      343
NUMBER OF PROCESSORS       =        1
TIME STEP                  = 1.50e-01 SEC
ORDER USED TO SOLVE F=MA   =        6 
NO. OF TIME STEPS          =        2 
FREQUENCY OF DATA SAVING   =       -1 
FREQUENCY TO WRITE RST FILE=     3000 
SPHERICAL CUTOFF RADIUS    =   6.2128 ANGSTROM

NS = 6.9999899999999995
BOXL =  21.744633
CUTOFF =   6.212752
XS =   3.106381
ZERO = 1.55319
WCOS = 0.585882
WSIN = 0.756950
***** NEW RUN STARTING FROM REGULAR LATTICE *****
";
    let deck = parse_input_str("1.5e-16 343 2 6\n-1 3000 1 0\n1 6.212752\n", "t").unwrap();
    assert_eq!(format_banner(&deck).unwrap(), expected);
    assert_eq!(InputDeck::from_params(deck.params.clone(), 1), deck);
}

#[test]
fn invalid_params_are_rejected() {
    let e = run_sequential(&Params {
        molecules: 100,
        ..Params::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("cubic lattice"), "{e}");
    for p in [
        Params {
            order: 7,
            ..Params::default()
        },
        Params {
            print_every: 0,
            ..Params::default()
        },
        Params {
            timestep_s: 0.0,
            ..Params::default()
        },
        Params {
            cutoff_angstrom: -1.0,
            ..Params::default()
        },
    ] {
        assert!(
            matches!(p.validate(), Err(WaterError::InvalidParams(_))),
            "{p:?}"
        );
    }
}

#[test]
fn velocity_file_errors_name_the_file() {
    let missing = Params {
        velocities: VelocitySource::File("/nonexistent/random.in".into()),
        ..Params::default()
    };
    let e = run_sequential(&missing).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/random.in"), "{e}");
    // random.in holds numbers for 588 molecules; 729 need more.
    let e = run_sequential(&splash_params(729, 1)).unwrap_err();
    assert!(
        e.to_string()
            .contains("5299 numbers; 729 molecules need 6562"),
        "{e}"
    );
}

#[test]
fn step_line_layout() {
    let e = StepEnergies {
        step: 12,
        kinetic: -1.0,
        intra_potential: 2.0,
        inter_potential: 3.0,
        reaction_field: 4.0,
        total: 5.0,
        avg_temperature_k: 6.0,
        virial: 7.0,
    };
    assert_eq!(
        format_step(&e),
        "        12       -1.00000      2.00000      3.00000                       4.00000\n            5.000          6.00000          7.00000\n"
    );
}

#[test]
fn progress_reports_the_phases_and_every_step_from_one_thread() {
    use crate::progress::testing::Recorder;
    let p = Params {
        molecules: 27,
        steps: 3,
        ..Params::default()
    };
    let want: Vec<(String, u64)> = vec![
        ("begin initial state".into(), 0),
        ("begin initial forces".into(), 0),
        ("begin time steps".into(), 3),
        ("advance".into(), 1),
        ("advance".into(), 2),
        ("advance".into(), 3),
    ];
    let seq = Recorder::default();
    run_sequential_with(&p, &seq).unwrap();
    assert_eq!(*seq.0.lock().unwrap(), want);
    let par = Recorder::default();
    run_parallel_with(&mut ThreadsRuntime::new(3).unwrap(), &p, &par).unwrap();
    assert_eq!(*par.0.lock().unwrap(), want);
}

#[test]
fn check_inputs_reads_the_velocity_file() {
    let mut p = splash_params(512, 1);
    p.check_inputs().unwrap();
    // random.in has numbers for 588 molecules only.
    p.molecules = 729;
    let e = p.check_inputs().unwrap_err();
    assert!(matches!(e, WaterError::VelocityFormat { .. }), "{e}");
    p.velocities = VelocitySource::File(PathBuf::from("/nonexistent/random.in"));
    let e = p.check_inputs().unwrap_err();
    assert!(e.to_string().contains("/nonexistent/random.in"), "{e}");
}

/// A thread whose cluster process starts late must not count its start-up in the timed
/// phases: the clock starts at a start barrier.
#[test]
fn a_late_starting_thread_is_not_timed() {
    let delay = std::time::Duration::from_millis(400);
    let mut rt = crate::threads::LateStart::second_of_two(delay);
    let params = splash_params(64, 2);
    let r = run_parallel(&mut rt, &params).unwrap();
    assert_eq!(printed(&r), printed(&run_sequential(&params).unwrap()));
    let t = &r.times;
    let timed = t.init_s + t.initial_forces_s + t.steps_s;
    assert!(
        timed < delay.as_secs_f64() / 2.0,
        "thread 0 timed {timed:.3} s (initial state {:.3} s): the other thread's {delay:?} late start was counted",
        t.init_s
    );
}

/// INTERF's three parts (pair forces, adding under the molecule locks, InterfBar and
/// scaling) are each timed, inside INTERF's own time and never counted twice, in the
/// sequential and the parallel run; reports written before they existed still read.
#[test]
fn interf_is_split_into_its_three_parts() {
    let params = splash_params(64, 3);
    let seq = run_sequential(&params).unwrap();
    let par = run_parallel(&mut ThreadsRuntime::new(2).unwrap(), &params).unwrap();
    for (name, t) in [("sequential", &seq.times), ("2 threads", &par.times)] {
        let parts = [t.interf_pairs_s, t.interf_locked_s, t.interf_barrier_s];
        assert!(
            parts.iter().all(|&p| p > 0.0),
            "{name}: a part of INTERF was not timed: {t:?}"
        );
        assert!(
            parts.iter().sum::<f64>() <= t.interf_s,
            "{name}: INTERF's parts add up to more than INTERF: {t:?}"
        );
    }
    let old: PhaseTimes = serde_json::from_str(
        r#"{"init_s":0.1,"initial_forces_s":0.2,"predic_intraf_s":0.3,"interf_s":0.4,
            "correc_kineti_s":0.5,"poteng_s":0.6,"steps_s":1.8}"#,
    )
    .unwrap();
    assert_eq!((old.interf_s, old.interf_locked_s), (0.4, 0.0));
}
