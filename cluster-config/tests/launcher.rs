//! Launcher rank detection from Slurm, PMI and Open MPI variables.

use std::collections::HashMap;

use multigrain_cluster_config::{
    JobConfig, LaunchRank, Launcher, RankError, detect_placement, detect_rank, first_host,
    instance_key, rendezvous_port, slurm_step_id,
};

/// Detection in a task of a Slurm job step (`SLURM_STEP_ID` set) unless `vars` say
/// otherwise.
fn detect(vars: &[(&str, &str)]) -> Result<Option<LaunchRank>, RankError> {
    let mut all = vec![("SLURM_STEP_ID", "0")];
    all.extend_from_slice(vars);
    detect_raw(&all)
}

fn detect_raw(vars: &[(&str, &str)]) -> Result<Option<LaunchRank>, RankError> {
    let env: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    detect_rank(|k| env.get(k).cloned())
}

#[test]
fn a_batch_or_salloc_shell_is_not_a_slurm_rank() {
    let shell = [
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_JOB_ID", "9"),
    ];
    assert_eq!(detect_raw(&shell), Ok(None));
    // The batch step's own id is not an srun step either.
    let mut batch = shell.to_vec();
    batch.push(("SLURM_STEP_ID", "4294967294"));
    assert_eq!(detect_raw(&batch), Ok(None));
    // mpirun inside the batch script: the Open MPI ranks count, not the shell's Slurm ones.
    let mut mpi = shell.to_vec();
    mpi.extend([("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")]);
    assert_eq!(detect_raw(&mpi), Ok(rank(Launcher::OpenMpi, 1, 2)));
}

#[test]
fn the_launcher_choice_narrows_or_disables_detection() {
    let task = [
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_STEP_ID", "3"),
    ];
    let with = |choice: &str| {
        let mut v = task.to_vec();
        v.push(("MULTIGRAIN_LAUNCHER", choice));
        detect_raw(&v)
    };
    assert_eq!(with("none"), Ok(None));
    assert_eq!(with("slurm"), Ok(rank(Launcher::Slurm, 1, 2)));
    assert_eq!(with("auto"), Ok(rank(Launcher::Slurm, 1, 2)));
    let e = with("mpi").unwrap_err().to_string();
    assert!(e.contains("OMPI_COMM_WORLD_RANK is not set"), "{e}");
    let e = with("lsf").unwrap_err().to_string();
    assert!(e.contains("auto, none, slurm, pmi, mpi"), "{e}");
    // --launcher slurm counts a batch shell's variables.
    let shell = [
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "1"),
        ("MULTIGRAIN_LAUNCHER", "slurm"),
    ];
    assert_eq!(detect_raw(&shell), Ok(rank(Launcher::Slurm, 0, 1)));
}

#[test]
fn slurm_host_lists_give_their_first_host() {
    assert_eq!(first_host("localhost"), Ok("localhost".into()));
    assert_eq!(first_host("node[007-012,20]"), Ok("node007".into()));
    assert_eq!(first_host("a1,b[2-3]"), Ok("a1".into()));
    assert_eq!(first_host("rack[2-3]-n[09-10]"), Ok("rack2-n09".into()));
    assert!(first_host("node[1-3").is_err());
    assert!(first_host("").is_err());
}

#[test]
fn placement_says_where_rank_0_runs_or_why_not() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let slurm = LaunchRank {
        launcher: Launcher::Slurm,
        rank: 2,
        size: 3,
    };
    let p = detect_placement(
        &slurm,
        env(&[
            ("SLURM_JOB_ID", "12"),
            ("SLURM_STEP_ID", "1"),
            ("SLURM_STEP_NODELIST", "cn[04-05]"),
            ("SLURM_CPUS_PER_TASK", "8"),
        ]),
    );
    assert_eq!(p.instance.as_deref(), Some("12.1"));
    assert_eq!(p.rank0_host.as_deref(), Ok("cn04"));
    assert_eq!(p.cpus_per_task, Some(8));
    let ompi = LaunchRank {
        launcher: Launcher::OpenMpi,
        rank: 1,
        size: 2,
    };
    let here = detect_placement(
        &ompi,
        env(&[
            ("PMIX_NAMESPACE", "prterun-vm-1@1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]),
    );
    assert_eq!(here.rank0_host.as_deref(), Ok("127.0.0.1"));
    let spread = detect_placement(&ompi, env(&[("OMPI_COMM_WORLD_LOCAL_SIZE", "1")]));
    assert_eq!(spread.instance, None);
    assert!(spread.rank0_host.unwrap_err().contains("1 elsewhere"));
}

#[test]
fn launches_get_their_own_port_and_key() {
    let (a, b) = ("100.0", "101.0");
    assert!((20_000..30_000).contains(&rendezvous_port(a)));
    assert_eq!(rendezvous_port(a), rendezvous_port(a));
    assert_ne!(rendezvous_port(a), rendezvous_port(b));
    assert_ne!(instance_key(7, a), instance_key(7, b));
    assert_ne!(instance_key(7, a), 7);
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

/// `slurm_step_id` over `vars`.
fn step_of(vars: &[(&str, &str)]) -> Option<String> {
    slurm_step_id(|k| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| (*v).to_owned())
    })
}

#[test]
fn a_task_of_an_srun_step_names_its_step() {
    let vars = [("SLURM_JOB_ID", "42"), ("SLURM_STEP_ID", "3")];
    assert_eq!(step_of(&vars).as_deref(), Some("42.3"));
}

#[test]
fn batch_extern_and_malformed_steps_name_none() {
    for step in [
        "4294967294",
        "4294967292",
        "4294967291",
        "batch",
        "",
        "1;rm",
    ] {
        let vars = [("SLURM_JOB_ID", "42"), ("SLURM_STEP_ID", step)];
        assert_eq!(step_of(&vars), None, "{step:?}");
    }
    assert_eq!(step_of(&[("SLURM_JOB_ID", "42")]), None);
    let vars = [("SLURM_JOB_ID", "4 2"), ("SLURM_STEP_ID", "0")];
    assert_eq!(step_of(&vars), None);
}
