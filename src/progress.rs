//! Progress bars on a terminal, plain lines otherwise.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// How often a bar redraws by itself, so its clock moves between steps.
const TICK: Duration = Duration::from_millis(200);

/// A progress bar of `len` steps labelled `what`, drawn only when stderr is a terminal:
/// elapsed time (ticking steadily, not only when a step ends), the bar, steps done, the
/// step rate and the estimated time left.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
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
