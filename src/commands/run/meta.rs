//! What a `--json` report says about how it was made: schema version, time, hosts, the
//! command line and the resolved job.

use multigrain_cluster_config::JobConfig;
use serde::Serialize;

/// Version of the `--json` report's layout: raised when a field changes meaning or goes.
/// 1: the first versioned layout (2026-11).
pub const SCHEMA_VERSION: u32 = 1;

/// The `meta` object of a `--json` report.
#[derive(Clone, Debug, Serialize)]
pub struct Meta {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The `multigrain` version that wrote it.
    pub multigrain_version: &'static str,
    /// When the report was written, RFC 3339 in UTC, e.g. `2026-11-24T19:40:02Z`.
    pub timestamp: String,
    /// The host that wrote it (node name).
    pub host: String,
    /// Each cluster's host, by cluster id (DSM runs; empty otherwise).
    pub cluster_hosts: Vec<String>,
    /// The command line, program name first.
    pub argv: Vec<String>,
    /// The resolved job in TOML (DSM runs: file, embedded default and `--set` values
    /// applied; `None` for `--sequential` and `--threads`).
    pub config: Option<String>,
}

impl Meta {
    /// The metadata of a report written now, of a run of `cfg` (if a DSM run).
    pub fn now(cfg: Option<&JobConfig>) -> Meta {
        Meta {
            schema_version: SCHEMA_VERSION,
            multigrain_version: env!("CARGO_PKG_VERSION"),
            timestamp: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            host: nix::sys::utsname::uname()
                .map(|u| u.nodename().to_string_lossy().into_owned())
                .unwrap_or_default(),
            cluster_hosts: cfg
                .map(|c| c.clusters.iter().map(|s| s.host.clone()).collect())
                .unwrap_or_default(),
            argv: std::env::args().collect(),
            config: cfg.map(JobConfig::to_toml_string),
        }
    }
}
