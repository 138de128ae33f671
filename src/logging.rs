//! Logging (`tracing`) and how errors are printed.
//!
//! The filter is `RUST_LOG` when set (the `tracing-subscriber` `EnvFilter` syntax, e.g.
//! `RUST_LOG=multigrain_messaging=debug`), else `MULTIGRAIN_LOG` (the older name), else the
//! level of the global flags: `-q` errors only, default warnings, `-v` info, `-vv` debug,
//! `-vvv` trace. Cluster processes started by `launch`/`run` get the same filter through
//! `RUST_LOG`, so one flag on the command a user types reaches every cluster.

use std::sync::OnceLock;

static FILTER: OnceLock<String> = OnceLock::new();

/// The filter directive for `verbose` `-v` flags and `quiet`, unless the environment
/// gives one.
pub fn filter_for(verbose: u8, quiet: bool, env: impl Fn(&str) -> Option<String>) -> String {
    if let Some(f) = env("RUST_LOG").or_else(|| env("MULTIGRAIN_LOG")) {
        return f;
    }
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        (false, _) => "trace",
    };
    level.to_owned()
}

/// Installs the subscriber (stderr; colours only on a terminal) with `filter`.
pub fn init(filter: String) {
    let env_filter = tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("multigrain: warning: log filter `{filter}` is not valid ({e}); using `warn`");
        tracing_subscriber::EnvFilter::new("warn")
    });
    tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let _ = FILTER.set(filter);
}

/// The filter in force, for the environment (`RUST_LOG`) of cluster processes.
pub fn filter() -> Option<&'static str> {
    FILTER.get().map(String::as_str)
}

/// The lines that report `e`: its message, then each cause that adds something (a cause
/// whose text the line before already holds, as `io::Error`s quoted by their wrappers are,
/// is left out so nothing is printed twice).
pub fn error_lines(e: &anyhow::Error) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if lines.last().is_some_and(|prev| prev.contains(&text)) {
            continue;
        }
        lines.push(text);
    }
    lines
}

/// Prints `e` once: `multigrain: error: …` and a `caused by: …` line per further cause.
pub fn print_error(e: &anyhow::Error) {
    let lines = error_lines(e);
    let mut out = format!("multigrain: error: {}", lines[0]);
    for l in &lines[1..] {
        out.push_str("\n  caused by: ");
        out.push_str(l);
    }
    eprintln!("{out}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_pick_the_level_unless_the_environment_does() {
        let none = |_: &str| None;
        assert_eq!(filter_for(0, false, none), "warn");
        assert_eq!(filter_for(0, true, none), "error");
        assert_eq!(filter_for(1, false, none), "info");
        assert_eq!(filter_for(2, false, none), "debug");
        assert_eq!(filter_for(5, false, none), "trace");
        let rust_log = |k: &str| (k == "RUST_LOG").then(|| "multigrain_dsm=trace".to_owned());
        assert_eq!(filter_for(2, false, rust_log), "multigrain_dsm=trace");
        let old = |k: &str| (k == "MULTIGRAIN_LOG").then(|| "info".to_owned());
        assert_eq!(filter_for(0, true, old), "info");
    }

    #[test]
    fn a_cause_already_quoted_is_not_printed_again() {
        let io = std::io::Error::from_raw_os_error(99);
        let e = anyhow::Error::new(io).context(format!(
            "cannot bind 10.0.0.1:0: {}",
            std::io::Error::from_raw_os_error(99)
        ));
        let lines = error_lines(&e);
        assert_eq!(lines.len(), 1, "{lines:?}");
        let e = anyhow::anyhow!("root cause").context("reading job.toml");
        assert_eq!(error_lines(&e), ["reading job.toml", "root cause"]);
    }
}
