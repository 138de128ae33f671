//! Sample statistics for the `bench` commands: medians and spread of repeated runs, and
//! ratios against a baseline measured in the same run.

use serde::Serialize;
use std::time::Duration;

/// Summary of repeated measurements of one quantity (all in the same unit).
#[derive(Clone, Copy, Debug, Serialize)]
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

    /// `self.median / base.median`.
    pub fn ratio_to(&self, base: &Summary) -> f64 {
        self.median / base.median
    }
}

/// One row of a benchmark report: a quantity's summary, and how it compares with its
/// baseline measured in the same run.
#[derive(Debug, Serialize)]
pub struct Row {
    group: &'static str,
    name: String,
    unit: &'static str,
    summary: Summary,
    baseline: Option<String>,
    ratio: Option<f64>,
    target: Option<String>,
    met: Option<bool>,
}

/// A benchmark report, printed as groups of rows with medians, quartiles, ratios and targets.
#[derive(Debug, Default)]
pub struct Table {
    /// The rows in print order.
    pub rows: Vec<Row>,
}

impl Table {
    /// Adds a baseline row.
    pub fn push(
        &mut self,
        group: &'static str,
        name: impl Into<String>,
        unit: &'static str,
        summary: Summary,
    ) {
        self.rows.push(Row {
            group,
            name: name.into(),
            unit,
            summary,
            baseline: None,
            ratio: None,
            target: None,
            met: None,
        });
    }

    /// Adds a row compared with `base` (ratio of medians); `target` is (text, met).
    pub fn compare(
        &mut self,
        group: &'static str,
        name: impl Into<String>,
        unit: &'static str,
        summary: Summary,
        base: (&str, &Summary),
        target: Option<(String, bool)>,
    ) {
        let ratio = summary.ratio_to(base.1);
        let (target, met) = target.map_or((None, None), |(t, m)| (Some(t), Some(m)));
        self.rows.push(Row {
            group,
            name: name.into(),
            unit,
            summary,
            baseline: Some(base.0.to_owned()),
            ratio: Some(ratio),
            target,
            met,
        });
    }

    /// Prints the report to stdout.
    pub fn print(&self) {
        let mut group = "";
        for r in &self.rows {
            if r.group != group {
                group = r.group;
                println!("\n{group}");
                println!(
                    "  {:<38} {:>13} {:>21} {:>7}  target",
                    "", "median", "p25 – p75", "ratio"
                );
            }
            let s = &r.summary;
            let ratio = r.ratio.map_or(String::new(), |x| format!("{x:.2}×"));
            let target = match (&r.target, r.met) {
                (Some(t), Some(true)) => format!("{t}  met"),
                (Some(t), Some(false)) => format!("{t}  NOT MET"),
                _ => String::new(),
            };
            println!(
                "  {:<38} {:>8} {:<4} {:>9} – {:<9} {:>7}  {}",
                r.name,
                num(s.median),
                r.unit,
                num(s.p25),
                num(s.p75),
                ratio,
                target
            );
        }
    }
}

/// A number with 3 significant digits (at least one decimal).
fn num(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.1}")
    } else if x.abs() >= 10.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// Nanoseconds per operation.
pub fn ns_per(d: Duration, ops: u64) -> f64 {
    d.as_nanos() as f64 / ops as f64
}

/// Runs `kernels` alternately for `samples` rounds; returns one Summary per kernel.
pub fn alternate(
    samples: usize,
    kernels: &[&dyn Fn() -> f64],
    progress: &indicatif::ProgressBar,
) -> Vec<Summary> {
    let mut data = vec![Vec::with_capacity(samples); kernels.len()];
    for _ in 0..samples {
        for (k, f) in kernels.iter().enumerate() {
            data[k].push(f());
            progress.inc(1);
        }
    }
    data.iter().map(|d| Summary::of(d)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
