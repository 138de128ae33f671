//! Sample statistics for the `bench` commands: medians and spread of repeated runs, and
//! ratios against a baseline measured in the same run.

use serde::Serialize;

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
