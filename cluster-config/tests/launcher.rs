//! Launcher rank detection from Slurm, PMI and Open MPI variables.

use std::collections::HashMap;

use multigrain_cluster_config::{JobConfig, LaunchRank, Launcher, RankError, detect_rank};

fn detect(vars: &[(&str, &str)]) -> Result<Option<LaunchRank>, RankError> {
    let env: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    detect_rank(|k| env.get(k).cloned())
}

fn rank(launcher: Launcher, rank: usize, size: usize) -> Option<LaunchRank> {
    Some(LaunchRank {
        launcher,
        rank,
        size,
    })
}

#[test]
fn each_launcher_is_recognised() {
    assert_eq!(
        detect(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "4")]),
        Ok(rank(Launcher::Slurm, 1, 4))
    );
    assert_eq!(
        detect(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]),
        Ok(rank(Launcher::Pmi, 0, 2))
    );
    assert_eq!(
        detect(&[("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "3")]),
        Ok(rank(Launcher::OpenMpi, 2, 3))
    );
}

#[test]
fn no_launcher_means_none() {
    assert_eq!(detect(&[]), Ok(None));
    // A size alone does not identify a launcher.
    assert_eq!(
        detect(&[("SLURM_NTASKS", "4"), ("PMI_SIZE", "2")]),
        Ok(None)
    );
}

#[test]
fn first_match_wins_in_order_slurm_pmi_openmpi() {
    let all = [
        ("OMPI_COMM_WORLD_RANK", "2"),
        ("OMPI_COMM_WORLD_SIZE", "3"),
        ("PMI_RANK", "1"),
        ("PMI_SIZE", "5"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "7"),
    ];
    assert_eq!(detect(&all), Ok(rank(Launcher::Slurm, 0, 7)));
    assert_eq!(detect(&all[..4]), Ok(rank(Launcher::Pmi, 1, 5)));
    assert_eq!(detect(&all[..2]), Ok(rank(Launcher::OpenMpi, 2, 3)));
    // A broken first match is reported, not skipped.
    assert!(matches!(
        detect(&[("SLURM_PROCID", "x"), ("PMI_RANK", "0"), ("PMI_SIZE", "1")]),
        Err(RankError::NotANumber {
            launcher: Launcher::Slurm,
            ..
        })
    ));
}

#[test]
fn garbage_values_are_errors() {
    for bad in [
        "",
        "x",
        "-1",
        "+1",
        " 1",
        "1 ",
        "1.0",
        "0x1",
        "99999999999999999999999",
    ] {
        let e = detect(&[("PMI_RANK", bad), ("PMI_SIZE", "4")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("PMI_RANK = {bad:?} (set by PMI): expected a non-negative decimal integer")
        );
        let e = detect(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", bad)]).unwrap_err();
        assert_eq!(
            e,
            RankError::NotANumber {
                launcher: Launcher::Slurm,
                var: "SLURM_NTASKS",
                value: bad.to_owned()
            }
        );
    }
}

#[test]
fn size_must_be_present_positive_and_above_rank() {
    assert_eq!(
        detect(&[("OMPI_COMM_WORLD_RANK", "0")])
            .unwrap_err()
            .to_string(),
        "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not: cannot tell how many \
         processes Open MPI started"
    );
    assert_eq!(
        detect(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "0")])
            .unwrap_err()
            .to_string(),
        "SLURM_NTASKS = 0 (set by Slurm): at least one process is needed"
    );
    assert_eq!(
        detect(&[("SLURM_PROCID", "4"), ("SLURM_NTASKS", "4")])
            .unwrap_err()
            .to_string(),
        "SLURM_PROCID = 4 is not below SLURM_NTASKS = 4 (set by Slurm)"
    );
}

#[test]
fn size_must_match_the_cluster_count() {
    let cfg = JobConfig::embedded_default();
    let r = detect(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2")])
        .unwrap()
        .unwrap();
    assert_eq!(cfg.check_launch_rank(&r), Ok(()));
    let r = detect(&[("PMI_RANK", "1"), ("PMI_SIZE", "3")])
        .unwrap()
        .unwrap();
    assert_eq!(
        cfg.check_launch_rank(&r).unwrap_err().to_string(),
        "PMI_SIZE = 3 (set by PMI), but the config defines 2 clusters: start exactly one process \
         per cluster (e.g. srun -n 2 or mpirun -n 2)"
    );
    assert_eq!(r.check_cluster_count(3), Ok(()));
}
