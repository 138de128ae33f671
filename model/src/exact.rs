//! Exact mean value analysis (Reiser and Lavenberg, *Mean-Value Analysis of Closed
//! Multichain Queuing Networks*, JACM 1980) of a closed single-class network: `n`
//! customers (compute threads) cycle through one delay station (no queueing: compute time
//! and wire latencies) and FCFS queueing stations with exponential service (the INIs, a
//! server). For population `k = 1, 2, …`:
//!
//! ```text
//! R_i(k) = D_i (1 + Q_i(k−1))     queueing station i (arrival theorem)
//! R_i(k) = D_i                    delay station
//! X(k)   = k / Σ_i R_i(k)         cycles per µs, all customers together
//! Q_i(k) = X(k) R_i(k)            Little's result
//! ```
//!
//! where `D_i` is the service demand per cycle (visits × service time, µs). By the
//! arrival theorem a customer arriving at station `i` sees `Q_i(k−1)`; [`ExactSolution`]
//! reports both. [`ExactSolution::for_inputs`] builds the network that equations
//! 6.1–6.10 describe, where it is one: for [`Pattern::ClientServer`], and for
//! [`Pattern::Homogeneous`] without PE overhead (`o = 0`: the BKT approximation of 6.9
//! for handlers that pre-empt computation has no product-form counterpart).

use crate::equations::{Inputs, Pattern};
use serde::Serialize;

/// Whether a station queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum StationKind {
    /// Infinite server: every customer is served at once (compute time, latency).
    Delay,
    /// One FCFS server with exponential service: customers queue.
    Queue,
}

/// One station of the network.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Station {
    /// A name for reports.
    pub name: &'static str,
    /// Delay or queueing.
    pub kind: StationKind,
    /// Service demand per cycle of one customer (visits × mean service time), µs.
    pub demand: f64,
}

/// The network's mean values at one population.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExactSolution {
    /// Customers.
    pub population: u32,
    /// Mean cycle time of one customer (`k / X`), µs.
    pub cycle: f64,
    /// Throughput, cycles per µs, all customers together.
    pub throughput: f64,
    /// Per station, in the order given: mean residence per cycle, µs.
    pub residence: Vec<f64>,
    /// Per station: mean customers there (in service included), time average.
    pub queue: Vec<f64>,
    /// Per station: mean customers an arriving customer finds there (the time average at
    /// one customer fewer).
    pub seen_on_arrival: Vec<f64>,
}

/// Solves the network for `population` customers (exact MVA recursion from 0).
///
/// # Panics
/// If a demand is negative or not finite, or every demand is 0 with `population > 0`.
pub fn solve(stations: &[Station], population: u32) -> ExactSolution {
    assert!(
        stations
            .iter()
            .all(|s| s.demand.is_finite() && s.demand >= 0.0),
        "exact MVA: demands must be finite and non-negative"
    );
    let mut q = vec![0.0; stations.len()];
    let mut prev = q.clone();
    let mut out = ExactSolution {
        population: 0,
        cycle: stations.iter().map(|s| s.demand).sum(),
        throughput: 0.0,
        residence: stations.iter().map(|s| s.demand).collect(),
        queue: q.clone(),
        seen_on_arrival: q.clone(),
    };
    for k in 1..=population {
        let r: Vec<f64> = stations
            .iter()
            .zip(&q)
            .map(|(s, &qi)| match s.kind {
                StationKind::Delay => s.demand,
                StationKind::Queue => s.demand * (1.0 + qi),
            })
            .collect();
        let cycle: f64 = r.iter().sum();
        assert!(cycle > 0.0, "exact MVA: all demands are 0");
        let x = f64::from(k) / cycle;
        prev.clone_from(&q);
        q = r.iter().map(|ri| x * ri).collect();
        out = ExactSolution {
            population: k,
            cycle,
            throughput: x,
            residence: r,
            queue: q.clone(),
            seen_on_arrival: prev.clone(),
        };
    }
    out
}

/// Index of the first INI among [`network`]'s stations.
pub const INI: usize = 1;

/// The network that equations 6.1–6.10 describe for `x`, with its population, or `None`
/// where they describe none ([`Pattern::Homogeneous`] with `o > 0`). Stations: the delay
/// (compute `W`, wire times `2l + 2L`, and for ClientServer the client's own reply
/// handler `o`), INI of cluster 0 and INI of cluster 1 (demand `2 O` each: two passes
/// per cycle), and for ClientServer the server (demand `o`). Population: `N` clients
/// (ClientServer) or `2N` threads, N per cluster (Homogeneous).
pub fn network(x: &Inputs) -> Option<(Vec<Station>, u32)> {
    let wire = 2.0 * x.l + 2.0 * x.big_l;
    let ini = |name| Station {
        name,
        kind: StationKind::Queue,
        demand: 2.0 * x.big_o,
    };
    match x.pattern {
        Pattern::ClientServer => Some((
            vec![
                Station {
                    name: "compute, wires, reply handler",
                    kind: StationKind::Delay,
                    demand: x.w + wire + x.o,
                },
                ini("INI of cluster 0"),
                ini("INI of cluster 1"),
                Station {
                    name: "server",
                    kind: StationKind::Queue,
                    demand: x.o,
                },
            ],
            x.n,
        )),
        Pattern::Homogeneous if x.o == 0.0 => Some((
            vec![
                Station {
                    name: "compute, wires",
                    kind: StationKind::Delay,
                    demand: x.w + wire,
                },
                ini("INI of cluster 0"),
                ini("INI of cluster 1"),
            ],
            2 * x.n,
        )),
        Pattern::Homogeneous => None,
    }
}

impl ExactSolution {
    /// The exact MVA of the network [`network`] builds for `x`, or `None` where the
    /// equations describe no product-form network.
    pub fn for_inputs(x: &Inputs) -> Option<ExactSolution> {
        let (stations, n) = network(x)?;
        Some(solve(&stations, n))
    }

    /// Mean messages at one INI (time average, in service included): the counterpart of
    /// the equations' `Q_o` (6.5).
    pub fn ini_queue(&self) -> f64 {
        self.queue[INI]
    }

    /// Mean messages an arriving message finds at one INI.
    pub fn ini_seen_on_arrival(&self) -> f64 {
        self.seen_on_arrival[INI]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::equations::{Arrival, solve as equations};

    fn queue(name: &'static str, demand: f64) -> Station {
        Station {
            name,
            kind: StationKind::Queue,
            demand,
        }
    }

    fn delay(demand: f64) -> Station {
        Station {
            name: "think",
            kind: StationKind::Delay,
            demand,
        }
    }

    #[test]
    fn one_customer_never_waits() {
        let s = solve(&[delay(100.0), queue("a", 10.0), queue("b", 5.0)], 1);
        assert_eq!(s.cycle, 115.0);
        assert_eq!(s.residence, vec![100.0, 10.0, 5.0]);
        assert!((s.queue[1] - 10.0 / 115.0).abs() < 1e-15);
        assert_eq!(s.seen_on_arrival, vec![0.0; 3]);
    }

    #[test]
    fn littles_result_and_bounds_hold() {
        let st = [delay(50.0), queue("a", 10.0), queue("b", 20.0)];
        for n in 1..=40 {
            let s = solve(&st, n);
            let total: f64 = s.queue.iter().sum();
            assert!((total - f64::from(n)).abs() < 1e-9);
            // Asymptotic bounds: X ≤ 1 / D_max and X ≤ n / (Z + D).
            assert!(s.throughput <= 1.0 / 20.0 + 1e-12);
            assert!(s.throughput <= f64::from(n) / 80.0 + 1e-12);
        }
    }

    #[test]
    fn two_customers_one_queue_by_hand() {
        // Machine-repairman, Z = 1, D = 1: Q(1) = 1/2, R(2) = 1.5, X = 2/2.5.
        let s = solve(&[delay(1.0), queue("q", 1.0)], 2);
        assert!((s.residence[1] - 1.5).abs() < 1e-15);
        assert!((s.throughput - 0.8).abs() < 1e-15);
        assert!((s.seen_on_arrival[1] - 0.5).abs() < 1e-15);
    }

    fn inputs(n: u32, w: f64, o: f64, big_o: f64, pattern: Pattern, arrival: Arrival) -> Inputs {
        Inputs {
            n,
            w,
            o,
            big_o,
            l: 2.0,
            big_l: 8.0,
            pattern,
            arrival,
        }
    }

    #[test]
    fn equations_agree_with_exact_mva_where_they_model_the_same_network() {
        // Schweitzer's approximation of the same network: within a few per cent.
        for (pattern, o) in [(Pattern::ClientServer, 3.0), (Pattern::Homogeneous, 0.0)] {
            for big_o in [2.0, 10.0, 40.0] {
                for n in 1..=8 {
                    let x = inputs(n, 200.0, o, big_o, pattern, Arrival::Schweitzer);
                    let eq = equations(&x).unwrap();
                    let ex = ExactSolution::for_inputs(&x).unwrap();
                    let rel_r = (eq.r - ex.cycle).abs() / ex.cycle;
                    let rel_q = (eq.q_o - ex.ini_queue()).abs() / ex.ini_queue();
                    assert!(rel_r < 0.05, "{x:?}: R {} vs exact {}", eq.r, ex.cycle);
                    assert!(
                        rel_q < 0.15,
                        "{x:?}: Q {} vs exact {}",
                        eq.q_o,
                        ex.ini_queue()
                    );
                    if n == 1 && pattern == Pattern::ClientServer {
                        assert!(rel_r < 1e-12 && rel_q < 1e-12);
                    }
                    // The equations as printed are pessimistic (an arrival sees itself).
                    let th = equations(&Inputs {
                        arrival: Arrival::Thesis,
                        ..x
                    })
                    .unwrap();
                    assert!(th.q_o >= ex.ini_queue() * (1.0 - 1e-12));
                    assert!(th.r >= ex.cycle * (1.0 - 1e-12));
                }
            }
        }
    }

    #[test]
    fn homogeneous_with_pe_overhead_is_no_product_form_network() {
        let x = inputs(2, 100.0, 1.0, 5.0, Pattern::Homogeneous, Arrival::Thesis);
        assert!(ExactSolution::for_inputs(&x).is_none());
    }
}
