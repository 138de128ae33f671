//! The report: per-configuration times and speedups, the ratios per round with
//! their verdicts, as a table or JSON.

use super::*;
use crate::text_table::aligned;

/// One configuration in the report.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigReport {
    /// How it ran.
    pub setup: Setup,
    /// Its label.
    pub label: String,
    /// `run_s` of each round (`null`: the run failed).
    pub run_s: Vec<Option<f64>>,
    /// The successful runs' times, s.
    pub time: Option<Summary>,
    /// Each round's whole command, s: `multigrain run` from its start to its exit
    /// ([`Measure::Command`]; `null`: the run failed).
    pub command_s: Vec<Option<f64>>,
    /// The successful runs' whole commands, s.
    pub command: Option<Summary>,
    /// Water: each round's time adding the private forces under the molecule locks in
    /// INTERF, on thread 0, s ([`water::PhaseTimes::interf_locked_s`]: where a lock
    /// moving between clusters costs); empty for EM3D.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub locked_s: Vec<Option<f64>>,
    /// The successful runs' `locked_s`, s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locked: Option<Summary>,
    /// Per round, the reference's time over this one's (rounds where both succeeded).
    pub speedup: Option<Summary>,
    /// The correctness verdict.
    pub check: Check,
}

/// One issue-10 ratio in the report.
#[derive(Clone, Debug, Serialize)]
pub struct RatioReport {
    /// The ratio and its target.
    #[serde(flatten)]
    pub spec: RatioSpec,
    /// Per round (`null`: a run of that round failed).
    pub per_round: Vec<Option<f64>>,
    /// Over the rounds where both runs succeeded.
    pub summary: Option<Summary>,
    /// Whether the median meets the target.
    pub met: Option<bool>,
}

/// One problem in the report.
#[derive(Clone, Debug, Serialize)]
pub struct ProblemReport {
    /// The problem.
    pub problem: Problem,
    /// Its title.
    pub title: String,
    /// Its configurations in table order.
    pub configurations: Vec<ConfigReport>,
    /// The issue-10 ratios.
    pub ratios: Vec<RatioReport>,
    /// With `--compare`: per DSM topology, its (B) runs against its (A) runs.
    pub comparisons: Vec<ComparisonReport>,
}

/// A DSM topology's (B) runs (with the `--compare` values) against its (A) runs.
#[derive(Clone, Debug, Serialize)]
pub struct ComparisonReport {
    /// The topology.
    pub topology: Topology,
    /// The ratio, as printed.
    pub name: String,
    /// Per round, time of (B) / time of (A) (`null`: a run of that round failed).
    pub per_round: Vec<Option<f64>>,
    /// Over the rounds where both runs succeeded.
    pub summary: Option<Summary>,
}

/// The whole report (the `--json` file).
#[derive(Clone, Debug, Serialize)]
pub struct AppsReport {
    /// The command.
    pub command: &'static str,
    /// What ran.
    pub plan: Plan,
    /// Per problem.
    pub problems: Vec<ProblemReport>,
    /// Configurations marked FAILED.
    pub failed: usize,
}

/// Per round, `num_r / den_r` of `measure` where both succeeded.
fn per_round(num: &Record, den: &Record, measure: Measure) -> Vec<Option<f64>> {
    num.runs
        .iter()
        .zip(&den.runs)
        .map(|(a, b)| match (a, b) {
            (Ok(a), Ok(b)) => Some(a.time(measure) / b.time(measure)),
            _ => None,
        })
        .collect()
}

/// The summary of the rounds that have a value.
fn summary_of(values: &[Option<f64>]) -> Option<Summary> {
    let v: Vec<f64> = values.iter().flatten().copied().collect();
    (!v.is_empty()).then(|| Summary::of(&v))
}

/// Builds a problem's report from its records (in `setups` order).
pub(super) fn problem_report(problem: &Problem, records: &[Record]) -> ProblemReport {
    let find = |s: Setup| records.iter().find(|r| r.setup == s);
    let mut configurations = Vec::new();
    for rec in records {
        let reference = find(problem.reference_of(rec.setup)).expect("references are run");
        let is_reference = reference.setup == rec.setup;
        let mut reasons = Vec::new();
        for (round, r) in rec.runs.iter().enumerate() {
            if let Err(e) = r {
                reasons.push(format!("round {}: {e}", round + 1));
            }
        }
        let first_ref = reference.runs.iter().find_map(|r| r.as_ref().ok());
        let mut min_digits = 17.0f64;
        if let Some(want) = first_ref {
            for (round, r) in rec.runs.iter().enumerate() {
                if let Ok(got) = r {
                    match agreement(&got.answer, &want.answer) {
                        Ok(d) if is_reference && d < 17.0 => reasons.push(format!(
                            "round {}: the sequential runs differ from each other",
                            round + 1
                        )),
                        Ok(d) => min_digits = min_digits.min(d),
                        Err(e) => reasons.push(format!("round {}: {e}", round + 1)),
                    }
                }
            }
        }
        let check = if !reasons.is_empty() {
            Check::Failed { reasons }
        } else if is_reference {
            Check::Reference
        } else if first_ref.is_none() {
            Check::Unchecked
        } else {
            Check::Agrees { min_digits }
        };
        let times = |m: Measure| -> Vec<Option<f64>> {
            rec.runs
                .iter()
                .map(|r| r.as_ref().ok().map(|r| r.time(m)))
                .collect()
        };
        let (run_s, command_s) = (times(Measure::Run), times(Measure::Command));
        let locked_s: Vec<Option<f64>> = if matches!(problem, Problem::Water { .. }) {
            rec.runs
                .iter()
                .map(|r| r.as_ref().ok().and_then(|r| r.locked_s))
                .collect()
        } else {
            Vec::new()
        };
        configurations.push(ConfigReport {
            setup: rec.setup,
            label: rec.setup.label(),
            time: summary_of(&run_s),
            run_s,
            command: summary_of(&command_s),
            command_s,
            locked: summary_of(&locked_s),
            locked_s,
            speedup: summary_of(&per_round(reference, rec, Measure::Run)),
            check,
        });
    }
    let setups: Vec<Setup> = records.iter().map(|r| r.setup).collect();
    let ratios = problem
        .ratios(&setups)
        .into_iter()
        .map(|spec| {
            let rounds = per_round(
                find(spec.numerator).expect("run"),
                find(spec.denominator).expect("run"),
                spec.measure,
            );
            let summary = summary_of(&rounds);
            RatioReport {
                met: summary.map(|s| spec.target.bound.holds(s.median)),
                spec,
                per_round: rounds,
                summary,
            }
        })
        .collect();
    let comparisons = records
        .iter()
        .filter_map(|b| match b.setup {
            Setup::Dsm {
                topology,
                compared: true,
            } => {
                let a = find(Setup::Dsm {
                    topology,
                    compared: false,
                })
                .expect("every (B) row follows its (A) row");
                let rounds = per_round(b, a, Measure::Run);
                Some(ComparisonReport {
                    topology,
                    name: format!("time of {} / time of {}", b.setup.label(), a.setup.label()),
                    summary: summary_of(&rounds),
                    per_round: rounds,
                })
            }
            _ => None,
        })
        .collect();
    ProblemReport {
        problem: problem.clone(),
        title: problem.title(),
        configurations,
        ratios,
        comparisons,
    }
}

/// The report as printed.
pub fn render(report: &AppsReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "multigrain bench apps: {} round(s); every round runs each configuration once (interleaved); \
         times are `run_s` (the computation, not process start-up) unless marked whole command \
         (`multigrain run` from its start to its exit): median (min–max) over the rounds; \
         speedups and ratios are taken per round, then median (min–max)",
        report.plan.repeat
    );
    if !report.plan.sets.is_empty() {
        let _ = writeln!(
            out,
            "every DSM run with --set {}",
            report.plan.sets.join(" --set ")
        );
    }
    if !report.plan.compare.is_empty() {
        let _ = writeln!(
            out,
            "(B): the DSM row above it, run in the same round with --set {} as well",
            report.plan.compare.join(" --set ")
        );
    }
    for p in &report.problems {
        let _ = writeln!(out, "\n{}", p.title);
        // Water's column of the MolLock loop (where a lock moving between clusters
        // costs): shown where `problem_report` kept the times, which it does for Water.
        let locks = p.configurations.iter().any(|c| !c.locked_s.is_empty());
        let rows: Vec<Vec<String>> = p
            .configurations
            .iter()
            .map(|c| {
                let mut row = vec![
                    c.label.clone(),
                    spread(c.time.as_ref(), secs),
                    if c.check == Check::Reference {
                        "1 (reference)".to_owned()
                    } else {
                        spread(c.speedup.as_ref(), ratio)
                    },
                ];
                if locks {
                    row.push(spread(c.locked.as_ref(), secs));
                }
                row.extend([spread(c.command.as_ref(), secs), c.check.text()]);
                row
            })
            .collect();
        let mut head = vec!["configuration", "run time, s", "speedup vs sequential"];
        if locks {
            head.push("adding forces under locks, s");
        }
        head.extend(["whole command, s", "result"]);
        out.push_str(&aligned(&head, &rows, 2));
        if !p.ratios.is_empty() {
            let lines: Vec<[String; 3]> = p
                .ratios
                .iter()
                .map(|r| {
                    let verdict = match r.met {
                        Some(true) => "met",
                        Some(false) => "NOT MET",
                        None => "no data",
                    };
                    [
                        format!("{} {}", r.spec.id, r.spec.name),
                        spread(r.summary.as_ref(), ratio),
                        format!("{}: {verdict}", r.spec.target.text),
                    ]
                })
                .collect();
            let head = ["issue-10 ratio (per round)", "median (min–max)", "target"];
            out.push_str(&aligned(&head, &lines, 2));
        }
        if !p.comparisons.is_empty() {
            let rows: Vec<[String; 2]> = p
                .comparisons
                .iter()
                .map(|c| [c.name.clone(), spread(c.summary.as_ref(), ratio)])
                .collect();
            let head = ["--compare (per round)", "median (min–max)"];
            out.push_str(&aligned(&head, &rows, 2));
        }
    }
    if report.failed > 0 {
        let _ = writeln!(
            out,
            "\n{} configuration(s) FAILED (see the result column)",
            report.failed
        );
    }
    out
}
