//! Every file in `examples/` is a valid job, and its name tells the truth.

use std::path::{Path, PathBuf};

use multigrain_cluster_config::{EMBEDDED_DEFAULT_TOML, IniPolicy, JobConfig, Substrate};

/// All `examples/*.toml`, sorted; new examples are picked up automatically.
fn example_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

/// What a name `NxT[-Kini-POLICY]` promises.
#[derive(Debug, PartialEq)]
struct Promise {
    clusters: usize,
    threads: usize,
    /// INIs per cluster and policy, when the name has them.
    ini: Option<(usize, IniPolicy)>,
}

fn parse_name(stem: &str) -> Option<Promise> {
    let (shape, rest) = stem
        .split_once('-')
        .map_or((stem, None), |(s, r)| (s, Some(r)));
    let (n, t) = shape.split_once('x')?;
    let ini = match rest {
        None => None,
        Some(rest) => {
            let (k, policy) = rest.split_once("ini-")?;
            Some((k.parse().ok()?, policy.parse().ok()?))
        }
    };
    Some(Promise {
        clusters: n.parse().ok()?,
        threads: t.parse().ok()?,
        ini,
    })
}

#[test]
fn every_example_is_valid_and_matches_its_name() {
    let files = example_files();
    assert!(
        files.len() >= 6,
        "expected the six shipped examples, found {files:?}"
    );
    for path in &files {
        let cfg = JobConfig::from_path(path).unwrap_or_else(|e| panic!("{e}"));
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("UTF-8 file name");
        let Promise {
            clusters: n,
            threads: t,
            ini,
        } = parse_name(stem)
            .unwrap_or_else(|| panic!("{stem}: name examples NxT or NxT-Kini-POLICY"));
        assert_eq!(cfg.clusters.len(), n, "{stem}: clusters");
        assert!(
            cfg.clusters.iter().all(|c| c.threads == t),
            "{stem}: threads"
        );
        if let Some((k, policy)) = ini {
            assert_eq!(cfg.ini.per_cluster, k, "{stem}: INIs per cluster");
            assert_eq!(cfg.ini.policy, policy, "{stem}: policy");
        }
        assert_eq!(cfg.job.name.as_deref(), Some(stem), "{stem}: job.name");
        // Every example documents itself.
        let text = std::fs::read_to_string(path).unwrap();
        assert!(
            text.starts_with("# multigrain job: "),
            "{stem}: header comment"
        );
        // The rendering lists every cluster.
        let table = cfg.render_table();
        assert_eq!(
            table.lines().filter(|l| l.contains("127.0.0.1")).count(),
            n,
            "{stem}"
        );
    }
}

#[test]
fn the_shipped_examples_exist() {
    let names: Vec<String> = example_files()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for expected in [
        "1x2.toml",
        "2x2.toml",
        "4x1.toml",
        "2x4-1ini-static.toml",
        "2x4-2ini-static.toml",
        "2x4-2ini-round-robin.toml",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "missing examples/{expected}"
        );
    }
}

#[test]
fn embedded_default_is_the_2x2_example() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/2x2.toml");
    assert_eq!(
        EMBEDDED_DEFAULT_TOML,
        std::fs::read_to_string(&path).unwrap()
    );
    let cfg = JobConfig::embedded_default();
    assert_eq!(cfg, JobConfig::from_path(&path).unwrap());
    assert_eq!(cfg.clusters.len(), 2);
    assert_eq!(cfg.total_threads(), 4);
    assert_eq!(cfg.ini.per_cluster, 1);
    assert_eq!(cfg.ini.policy, IniPolicy::Static);
    assert_eq!(cfg.ini.substrate, Substrate::Udp);
    assert_eq!(cfg.ini.mtu, 8972);
    assert!(
        cfg.clusters
            .iter()
            .all(|c| c.host == "127.0.0.1" && c.port == 0)
    );
}

#[test]
fn name_parsing() {
    let promise = |clusters, threads, ini| Promise {
        clusters,
        threads,
        ini,
    };
    assert_eq!(parse_name("2x4"), Some(promise(2, 4, None)));
    assert_eq!(
        parse_name("2x4-2ini-round-robin"),
        Some(promise(2, 4, Some((2, IniPolicy::RoundRobin))))
    );
    assert_eq!(parse_name("water"), None);
    assert_eq!(parse_name("2x4-2ini-fastest"), None);
}
