//! Sample statistics for the `bench` commands: medians and spread of repeated runs, and
//! ratios against a baseline measured in the same run, sample by sample.
//!
//! The development VM changes speed regime now and then (the same ping-pong costs 34 ns
//! or 165 ns one way depending on where the hypervisor puts the vCPUs). A baseline
//! measured in one block of samples and its subject in the next can therefore land in
//! different regimes, and a ratio of their medians can flip a verdict. So every
//! comparison here is *paired*: the kernels run in alternation, round after round (A, B,
//! A, B, …, see [`interleave`]); sample *i* of the subject is divided by sample *i* of
//! its baseline, taken moments apart in the same regime ([`pair_ratios`]); and a row
//! reports the median of those per-pair ratios with their interquartile range (p25–p75),
//! beside each side's own median and spread. Targets are judged on the median of the
//! per-pair ratios ([`Target`]).

use anyhow::Result;
use serde::Serialize;
use std::time::Duration;

/// Summary of repeated measurements of one quantity (all in the same unit).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Median.
    pub median: f64,
    /// 25th percentile.
    pub p25: f64,
    /// 75th percentile.
    pub p75: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// Number of samples.
    pub samples: usize,
}

/// Linear-interpolated quantile `q` in `[0, 1]` of sorted data.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

impl Summary {
    /// Summarizes `samples`.
    ///
    /// # Panics
    /// If `samples` is empty or holds a NaN.
    pub fn of(samples: &[f64]) -> Summary {
        assert!(!samples.is_empty(), "no samples");
        let mut s = samples.to_vec();
        s.sort_by(|a, b| a.partial_cmp(b).expect("no NaN samples"));
        Summary {
            median: quantile(&s, 0.5),
            p25: quantile(&s, 0.25),
            p75: quantile(&s, 0.75),
            min: s[0],
            max: s[s.len() - 1],
            samples: s.len(),
        }
    }

    /// `self.median / base.median`: the ratio of medians (unpaired).
    pub fn ratio_to(&self, base: &Summary) -> f64 {
        self.median / base.median
    }
}

/// The per-pair ratios `subject[i] / base[i]` of two series sampled in alternation
/// (sample *i* of each taken in the same round).
///
/// # Panics
/// If the series differ in length.
pub fn pair_ratios(subject: &[f64], base: &[f64]) -> Vec<f64> {
    assert_eq!(
        subject.len(),
        base.len(),
        "paired series must have one sample per round each"
    );
    subject.iter().zip(base).map(|(s, b)| s / b).collect()
}

/// Element-wise sum of series sampled in the same rounds: a composite baseline such as
/// "UDP round trip + bare fault", formed round by round.
///
/// # Panics
/// If the series differ in length, or none is given.
pub fn sum_series(parts: &[&[f64]]) -> Vec<f64> {
    let n = parts.first().expect("at least one series").len();
    assert!(
        parts.iter().all(|p| p.len() == n),
        "series of one sum must have one sample per round each"
    );
    (0..n).map(|i| parts.iter().map(|p| p[i]).sum()).collect()
}

/// Which way a ratio must lie to meet a target.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// The ratio must be at most this.
    AtMost(f64),
    /// The ratio must be at least this.
    AtLeast(f64),
}

impl Bound {
    /// Whether `ratio` meets the bound.
    pub fn holds(self, ratio: f64) -> bool {
        match self {
            Bound::AtMost(x) => ratio <= x,
            Bound::AtLeast(x) => ratio >= x,
        }
    }
}

/// A target on the median of a row's per-pair ratios, with the words that state it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Target {
    /// The target as printed, e.g. `≤ 1.5× (busy UDP RTT + fault)`.
    pub text: String,
    /// The bound on the median per-pair ratio.
    pub bound: Bound,
}

impl Target {
    /// The ratio must be at most `x`.
    pub fn at_most(x: f64, text: impl Into<String>) -> Target {
        Target {
            text: text.into(),
            bound: Bound::AtMost(x),
        }
    }

    /// The ratio must be at least `x`.
    pub fn at_least(x: f64, text: impl Into<String>) -> Target {
        Target {
            text: text.into(),
            bound: Bound::AtLeast(x),
        }
    }
}

/// A subject series compared with its baseline series, sample by sample.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Paired {
    /// The baseline's name.
    pub baseline: String,
    /// The baseline's samples, summarized.
    pub baseline_summary: Summary,
    /// The per-pair ratios subject / baseline, summarized: `ratio.median` is the ratio
    /// a row reports and its target is judged on.
    pub ratio: Summary,
    /// The ratio of the two medians, for reference (not used for verdicts).
    pub ratio_of_medians: f64,
}

impl Paired {
    /// Compares `subject` with `base` (named `name`), sampled in the same rounds.
    ///
    /// # Panics
    /// If the series differ in length or are empty.
    pub fn of(subject: &[f64], name: &str, base: &[f64]) -> Paired {
        let baseline_summary = Summary::of(base);
        Paired {
            baseline: name.to_owned(),
            baseline_summary,
            ratio: Summary::of(&pair_ratios(subject, base)),
            ratio_of_medians: Summary::of(subject).ratio_to(&baseline_summary),
        }
    }

    /// Whether the median per-pair ratio meets `target`.
    pub fn meets(&self, target: &Target) -> bool {
        target.bound.holds(self.ratio.median)
    }
}

/// One row of a benchmark report: a quantity's summary, and how it compares with its
/// baseline measured in the same run (JSON: every field, the per-pair ratio summary
/// under `paired.ratio`).
#[derive(Debug, Serialize)]
pub struct Row {
    /// The group (table section) of the row.
    pub group: &'static str,
    /// What the row measures.
    pub name: String,
    /// The unit of the samples.
    pub unit: &'static str,
    /// The row's samples, summarized.
    pub summary: Summary,
    /// The comparison with its baseline, for a compared row.
    pub paired: Option<Paired>,
    /// The median per-pair ratio (`paired.ratio.median`), for a compared row.
    pub ratio: Option<f64>,
    /// The target, for a row that has one.
    pub target: Option<Target>,
    /// Whether the target is met (on the median per-pair ratio).
    pub met: Option<bool>,
}

/// A benchmark report, printed as groups of rows with medians, quartiles, ratios and targets.
#[derive(Debug, Default)]
pub struct Table {
    /// The rows in print order.
    pub rows: Vec<Row>,
}

impl Table {
    /// Adds a row without a baseline (a baseline itself, or a quantity with none).
    pub fn push(
        &mut self,
        group: &'static str,
        name: impl Into<String>,
        unit: &'static str,
        samples: &[f64],
    ) {
        self.rows.push(Row {
            group,
            name: name.into(),
            unit,
            summary: Summary::of(samples),
            paired: None,
            ratio: None,
            target: None,
            met: None,
        });
    }

    /// Adds a row whose samples `subject` are compared with `base.1` (named `base.0`),
    /// sampled in the same rounds: the ratio is the median of the per-pair ratios, and
    /// `target` is judged on it.
    pub fn compare(
        &mut self,
        group: &'static str,
        name: impl Into<String>,
        unit: &'static str,
        subject: &[f64],
        base: (&str, &[f64]),
        target: Option<Target>,
    ) {
        let paired = Paired::of(subject, base.0, base.1);
        let met = target.as_ref().map(|t| paired.meets(t));
        self.rows.push(Row {
            group,
            name: name.into(),
            unit,
            summary: Summary::of(subject),
            ratio: Some(paired.ratio.median),
            paired: Some(paired),
            target,
            met,
        });
    }

    /// The report as printed: per group, a header, then one line per row with the
    /// median and p25–p75 of its samples, the median per-pair ratio with its p25–p75 and
    /// the baseline's name, and the target with its verdict.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let ratio_text = |r: &Row| {
            r.paired.as_ref().map_or(String::new(), |p| {
                format!(
                    "{} ({}–{}) × {}",
                    ratio(p.ratio.median),
                    ratio(p.ratio.p25),
                    ratio(p.ratio.p75),
                    p.baseline
                )
            })
        };
        let name_w = self
            .rows
            .iter()
            .map(|r| r.name.chars().count())
            .max()
            .unwrap_or(0);
        let ratio_w = self
            .rows
            .iter()
            .map(|r| ratio_text(r).chars().count())
            .max()
            .unwrap_or(0)
            .max("ratio (p25–p75) × baseline".chars().count());
        let mut out = String::new();
        let mut group = "";
        for r in &self.rows {
            if r.group != group {
                group = r.group;
                let _ = writeln!(out, "\n{group}");
                let _ = writeln!(
                    out,
                    "  {:<name_w$} {:>13}  {:^19}  {:<ratio_w$}  target",
                    "", "median", "p25 – p75", "ratio (p25–p75) × baseline"
                );
            }
            let s = &r.summary;
            let target = match (&r.target, r.met) {
                (Some(t), Some(true)) => format!("{}: met", t.text),
                (Some(t), Some(false)) => format!("{}: NOT MET", t.text),
                _ => String::new(),
            };
            let line = format!(
                "  {:<name_w$} {:>8} {:<4}  {:>8} – {:<8}  {:<ratio_w$}  {}",
                r.name,
                num(s.median),
                r.unit,
                num(s.p25),
                num(s.p75),
                ratio_text(r),
                target
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }

    /// Prints the report to stdout.
    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// A number with 3 significant digits (at least one decimal below 1000, none from 1000).
pub fn num(x: f64) -> String {
    if x.abs() >= 1000.0 {
        format!("{x:.0}")
    } else if x.abs() >= 100.0 {
        format!("{x:.1}")
    } else if x.abs() >= 10.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// A ratio with 2 decimals (3 significant digits below 0.1).
pub fn ratio(x: f64) -> String {
    if x.abs() < 0.1 {
        format!("{x:.3}")
    } else {
        format!("{x:.2}")
    }
}

/// `median (min–max)` of a summary, formatted by `f`, or `—`.
pub fn spread(s: Option<&Summary>, f: impl Fn(f64) -> String) -> String {
    s.map_or("—".to_owned(), |s| {
        format!("{} ({}–{})", f(s.median), f(s.min), f(s.max))
    })
}

/// Seconds with 3 significant digits (no exponent; at most 6 decimals).
pub fn secs(x: f64) -> String {
    let decimals = if x > 0.0 {
        (2 - x.log10().floor() as i64).clamp(0, 6) as usize
    } else {
        3
    };
    format!("{x:.decimals$}")
}

/// Nanoseconds per operation.
pub fn ns_per(d: Duration, ops: u64) -> f64 {
    d.as_nanos() as f64 / ops as f64
}

/// A measurement kernel: takes one sample (or fails).
pub type Kernel<'a> = &'a mut dyn FnMut() -> Result<f64>;

/// Runs `kernels` in alternation, round after round (A, B, C, A, B, C, … for `rounds`
/// rounds), so that every kernel samples every speed regime the machine passes through
/// alike. Returns each kernel's samples in round order (feed pairs of them to
/// [`Table::compare`] or [`pair_ratios`]).
///
/// # Errors
/// The first kernel error.
pub fn interleave(
    rounds: usize,
    kernels: &mut [Kernel<'_>],
    progress: &indicatif::ProgressBar,
) -> Result<Vec<Vec<f64>>> {
    interleave_with(rounds, kernels.len(), progress, |k| kernels[k]())
}

/// As [`interleave`], with the kernels given as one function of the kernel's index
/// `0..kernels` (for kernels that share mutable state).
///
/// # Errors
/// The first kernel error.
pub fn interleave_with(
    rounds: usize,
    kernels: usize,
    progress: &indicatif::ProgressBar,
    mut sample: impl FnMut(usize) -> Result<f64>,
) -> Result<Vec<Vec<f64>>> {
    let mut data = vec![Vec::with_capacity(rounds); kernels];
    for _ in 0..rounds {
        for (k, series) in data.iter_mut().enumerate() {
            series.push(sample(k)?);
            progress.inc(1);
        }
    }
    Ok(data)
}

/// Writes `value` as pretty JSON to `path` (`-`: stdout), naming the file in an error.
pub fn write_json(path: &std::path::Path, value: &impl Serialize) -> Result<()> {
    use anyhow::Context as _;
    use std::io::Write as _;
    let text = serde_json::to_string_pretty(value)? + "\n";
    if path.as_os_str() == "-" {
        let mut out = std::io::stdout().lock();
        return out
            .write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .context("--json -: writing to stdout");
    }
    // Written whole to a file of this process's own beside it, then renamed over the
    // path: processes writing one path at once (every cluster of a job given the same
    // file) leave one complete file, never an interleaving of theirs, and an interrupted
    // write leaves the old file.
    let name = path
        .file_name()
        .map_or_else(Default::default, |n| n.to_string_lossy());
    let tmp = path.with_file_name(format!(
        ".{name}.{}.{:?}.tmp",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
        .with_context(|| format!("--json: writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_of_one_json_file_at_once_leave_one_complete_file() {
        let dir = std::env::temp_dir().join(format!("mg-write-json-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stats.json");
        for _ in 0..200 {
            std::thread::scope(|s| {
                for n in [1usize, 4000] {
                    let path = &path;
                    s.spawn(move || write_json(path, &vec![n; n]).unwrap());
                }
            });
            let text = std::fs::read_to_string(&path).unwrap();
            let v: Vec<usize> = serde_json::from_str(&text).expect("one writer's whole file");
            assert!(v == vec![1] || v == vec![4000; 4000], "{} values", v.len());
        }
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn median_and_quartiles() {
        let s = Summary::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(
            (s.median, s.p25, s.p75, s.min, s.max, s.samples),
            (3.0, 2.0, 4.0, 1.0, 5.0, 5)
        );
        let even = Summary::of(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(even.median, 2.5);
        assert_eq!(Summary::of(&[4.0, 4.0]).ratio_to(&Summary::of(&[2.0])), 2.0);
    }

    #[test]
    fn pair_ratios_divide_sample_by_sample() {
        assert_eq!(
            pair_ratios(&[2.0, 9.0, 4.0], &[1.0, 3.0, 8.0]),
            vec![2.0, 3.0, 0.5]
        );
    }

    #[test]
    #[should_panic(expected = "one sample per round")]
    fn pair_ratios_need_series_of_one_length() {
        pair_ratios(&[1.0, 2.0], &[1.0]);
    }

    /// The point of pairing: the machine switches regime halfway (everything 5× slower),
    /// the subject is always 1.2× its baseline. Blocks (all baseline samples, then all
    /// subject samples) would straddle the switch; pairs do not.
    #[test]
    fn a_regime_change_between_rounds_does_not_move_the_paired_ratio() {
        let regime = [1.0, 1.0, 1.0, 5.0, 5.0, 5.0, 5.0];
        let base: Vec<f64> = regime.iter().map(|r| 10.0 * r).collect();
        let subject: Vec<f64> = base.iter().map(|b| 1.2 * b).collect();
        let p = Paired::of(&subject, "base", &base);
        for x in [
            p.ratio.median,
            p.ratio.p25,
            p.ratio.p75,
            p.ratio.min,
            p.ratio.max,
        ] {
            assert!((x - 1.2).abs() < 1e-12, "{p:?}");
        }
        assert!(p.meets(&Target::at_most(1.25, "≤ 1.25×")));
        assert!(!p.meets(&Target::at_most(1.15, "≤ 1.15×")));
        assert!(p.meets(&Target::at_least(1.2, "≥ 1.2×")));
        // Unpaired, the baseline measured in the fast block and the subject in the slow
        // one would read 6×.
        let blocks = Summary::of(&subject[3..]).ratio_to(&Summary::of(&base[..3]));
        assert!((blocks - 6.0).abs() < 1e-12);
    }

    #[test]
    fn paired_summary_reports_the_spread_of_the_ratios() {
        let p = Paired::of(&[2.0, 3.0, 8.0, 5.0, 1.0], "b", &[1.0, 1.0, 2.0, 1.0, 1.0]);
        // Ratios 2, 3, 4, 5, 1.
        assert_eq!(
            (p.ratio.median, p.ratio.p25, p.ratio.p75, p.ratio.samples),
            (3.0, 2.0, 4.0, 5)
        );
        assert_eq!(p.baseline_summary.median, 1.0);
        assert_eq!(p.ratio_of_medians, 3.0);
    }

    #[test]
    fn sums_are_formed_round_by_round() {
        assert_eq!(
            sum_series(&[&[1.0, 2.0], &[10.0, 20.0], &[100.0, 200.0]]),
            vec![111.0, 222.0]
        );
    }

    #[test]
    fn bounds() {
        assert!(Bound::AtMost(1.5).holds(1.5));
        assert!(!Bound::AtMost(1.5).holds(1.51));
        assert!(Bound::AtLeast(0.8).holds(0.8));
        assert!(!Bound::AtLeast(0.8).holds(0.79));
    }

    #[test]
    fn interleave_alternates_kernels_round_by_round() {
        let order = std::cell::RefCell::new(Vec::new());
        let mut a = || {
            order.borrow_mut().push('a');
            Ok(1.0)
        };
        let mut b = || {
            order.borrow_mut().push('b');
            Ok(2.0)
        };
        let bar = indicatif::ProgressBar::hidden();
        let data = interleave(3, &mut [&mut a, &mut b], &bar).unwrap();
        assert_eq!(data, vec![vec![1.0; 3], vec![2.0; 3]]);
        assert_eq!(order.into_inner(), vec!['a', 'b', 'a', 'b', 'a', 'b']);
    }

    #[test]
    fn a_compared_row_carries_the_paired_ratio_and_verdict_into_json() {
        let mut t = Table::default();
        t.push("g", "base", "µs", &[1.0, 2.0, 4.0]);
        t.compare(
            "g",
            "subject",
            "µs",
            &[1.5, 3.0, 6.0],
            ("base", &[1.0, 2.0, 4.0]),
            Some(Target::at_most(1.4, "≤ 1.4× base")),
        );
        let v = serde_json::to_value(&t.rows).unwrap();
        assert_eq!(v[1]["ratio"], 1.5);
        assert_eq!(v[1]["paired"]["ratio"]["p25"], 1.5);
        assert_eq!(v[1]["paired"]["baseline"], "base");
        assert_eq!(v[1]["met"], false);
        assert_eq!(v[1]["target"]["bound"]["at_most"], 1.4);
        assert!(v[0]["paired"].is_null());
        let text = t.render();
        assert!(text.contains("1.50 (1.50–1.50) × base"), "{text}");
        assert!(text.contains("NOT MET"), "{text}");
    }
}
