//! Progress bars on a terminal, plain lines otherwise, nothing under `-q`.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// `-q` was given: no progress on stderr, bars or lines (errors still are).
static QUIET: AtomicBool = AtomicBool::new(false);

/// Records `-q` for every later [`shown`] (set once, by `main`).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// How a command shows its progress on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shown {
    /// Bars that redraw in place: stderr is a terminal.
    Bars,
    /// A plain line per run or phase: stderr is a file or a pipe (logs of batch jobs).
    Lines,
    /// Nothing: `-q`.
    Nothing,
}

/// Whether `-q` was given: print start-up notices and per-run lines only without it.
pub fn quiet() -> bool {
    shown() == Shown::Nothing
}

/// How progress is shown now: nothing under `-q`, else bars on a terminal and lines
/// elsewhere.
pub fn shown() -> Shown {
    if QUIET.load(Ordering::Relaxed) {
        Shown::Nothing
    } else if std::io::stderr().is_terminal() {
        Shown::Bars
    } else {
        Shown::Lines
    }
}

/// How often a bar redraws by itself, so its clock moves between steps.
const TICK: Duration = Duration::from_millis(200);

/// A progress bar of `len` steps labelled `what`, drawn only when stderr is a terminal
/// (and not under `-q`): elapsed time (ticking steadily, not only when a step ends), the
/// bar, steps done, the step rate and the estimated time left.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    if shown() != Shown::Bars {
        return ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden());
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} ({rate}, ETA {eta})",
        )
        .expect("valid template")
        .with_key(
            "rate",
            |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{:.2}/s", s.per_sec());
            },
        ),
    );
    bar.set_prefix(what.to_owned());
    bar.enable_steady_tick(TICK);
    bar
}
