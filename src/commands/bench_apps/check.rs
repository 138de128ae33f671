//! A run's answer checked against its problem's sequential reference: Water's energies
//! to at least 9 significant digits, EM3D's checksum bit for bit.

use super::*;

/// What a run computed, for the correctness check.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Answer {
    Water(Vec<water::StepEnergies>),
    Em3d(em3d::Checksum),
}

/// A run that ended successfully.
#[derive(Clone, Debug)]
pub(super) struct RunOk {
    pub(super) run_s: f64,
    /// The whole `multigrain run` command, from its start to its exit, as `time` would
    /// show it: process start-up, the clusters' joining and leaving included.
    pub(super) command_s: f64,
    /// Water: INTERF's adding of the private forces under the molecule locks on thread 0,
    /// s ([`water::PhaseTimes::interf_locked_s`]); `None` for EM3D.
    pub(super) locked_s: Option<f64>,
    pub(super) answer: Answer,
}

impl RunOk {
    /// The run's time by `measure`, s.
    pub(super) fn time(&self, measure: Measure) -> f64 {
        match measure {
            Measure::Run => self.run_s,
            Measure::Command => self.command_s,
        }
    }
}

/// One configuration's runs, round by round.
#[derive(Clone, Debug)]
pub(super) struct Record {
    pub(super) setup: Setup,
    pub(super) runs: Vec<Result<RunOk, String>>,
}

/// Significant decimal digits on which every Water energy of a run must agree with the
/// sequential reference (parallel runs add the sums in another order; they agree to 12+
/// digits today).
const MIN_DIGITS: f64 = 9.0;

/// Significant decimal digits on which `a` agrees with the reference `b` (17 if equal).
pub fn digits(a: f64, b: f64) -> f64 {
    if a == b {
        return 17.0;
    }
    if b == 0.0 {
        return 0.0;
    }
    let rel = ((a - b) / b).abs();
    (-rel.log10()).clamp(0.0, 17.0)
}

/// Compares a run's answer with the reference's: the fewest agreeing digits (Water) or
/// 17 (EM3D, equal), or why they disagree.
pub(super) fn agreement(got: &Answer, reference: &Answer) -> Result<f64, String> {
    match (got, reference) {
        (Answer::Water(g), Answer::Water(r)) => {
            if g.len() != r.len() {
                return Err(format!(
                    "{} printed steps, the reference {}",
                    g.len(),
                    r.len()
                ));
            }
            let mut fewest = 17.0f64;
            for (a, b) in g.iter().zip(r) {
                for (k, (x, y)) in a.values().into_iter().zip(b.values()).enumerate() {
                    let d = digits(x, y);
                    if d < MIN_DIGITS || a.step != b.step {
                        return Err(format!(
                            "step {} {}: {x:e} vs the sequential {y:e}, {d:.1} digits agree (at least {MIN_DIGITS} needed)",
                            b.step,
                            water::StepEnergies::NAMES[k]
                        ));
                    }
                    fewest = fewest.min(d);
                }
            }
            Ok(fewest)
        }
        (Answer::Em3d(g), Answer::Em3d(r)) => {
            if g == r {
                Ok(17.0)
            } else {
                Err(format!(
                    "checksum {:#018x} (E sum {:e}, H sum {:e}) vs the sequential {:#018x} (E sum {:e}, H sum {:e})",
                    g.fnv1a,
                    g.e_sum(),
                    g.h_sum(),
                    r.fnv1a,
                    r.e_sum(),
                    r.h_sum()
                ))
            }
        }
        _ => Err("the run computed another application".to_owned()),
    }
}

/// The verdict on one configuration's results.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Check {
    /// A sequential reference whose runs agree with each other bit for bit.
    Reference,
    /// Every run agrees with the reference.
    Agrees {
        /// Fewest significant digits on which a run agrees (17: bitwise equal).
        min_digits: f64,
    },
    /// A run failed or disagreed.
    Failed {
        /// Why, per failed run.
        reasons: Vec<String>,
    },
    /// No run of the reference succeeded: nothing to check against.
    Unchecked,
}

impl Check {
    pub(super) fn text(&self) -> String {
        match self {
            Check::Reference => "reference".to_owned(),
            Check::Agrees { min_digits } if *min_digits >= 17.0 => "agrees (bitwise)".to_owned(),
            Check::Agrees { min_digits } => format!("agrees (≥ {min_digits:.1} digits)"),
            Check::Failed { reasons } => format!("FAILED: {}", reasons.join("; ")),
            Check::Unchecked => "unchecked (no sequential result)".to_owned(),
        }
    }
}
