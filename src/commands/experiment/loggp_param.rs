//! The LogGP parameters that `loggp-calibrate` and `loggp-sensitivity` turn up one at a
//! time (paper 001 §3.1–3.2), and the `[emulation]` keys that set each.

use multigrain_cluster_config::EmulationConfig;
use std::fmt::Display;

/// An emulated LogGP parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// Overhead o: `send_overhead_us` and `recv_overhead_us` together (paper 001 pays o
    /// at both ends), µs.
    O,
    /// Gap g: `gap_us`, µs.
    Gap,
    /// Latency L: `latency_us`, µs.
    L,
    /// Gap per byte G: `per_byte_gap_ns`, ns per byte.
    PerByte,
}

impl Param {
    /// Every parameter, in table order.
    pub const ALL: [Param; 4] = [Param::O, Param::Gap, Param::L, Param::PerByte];

    /// The paper's letter.
    pub fn name(self) -> &'static str {
        match self {
            Param::O => "o",
            Param::Gap => "g",
            Param::L => "L",
            Param::PerByte => "G",
        }
    }

    /// The unit of its values.
    pub fn unit(self) -> &'static str {
        match self {
            Param::PerByte => "ns/B",
            _ => "µs",
        }
    }

    /// The `[emulation]` keys it sets.
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            Param::O => &["emulation.send_overhead_us", "emulation.recv_overhead_us"],
            Param::Gap => &["emulation.gap_us"],
            Param::L => &["emulation.latency_us"],
            Param::PerByte => &["emulation.per_byte_gap_ns"],
        }
    }

    /// The `--set` values that give it the value `v`.
    pub fn sets(self, v: impl Display) -> Vec<String> {
        self.keys().iter().map(|k| format!("{k}={v}")).collect()
    }

    /// An emulation with this parameter at `v` and every other at zero.
    pub fn emulation(self, v: f64) -> EmulationConfig {
        let mut e = EmulationConfig::default();
        match self {
            Param::O => {
                e.send_overhead_us = v;
                e.recv_overhead_us = v;
            }
            Param::Gap => e.gap_us = v,
            Param::L => e.latency_us = v,
            Param::PerByte => e.per_byte_gap_ns = v,
        }
        e
    }
}
