//! The thesis's equations 6.1–6.10 (paper 002 §6.3), solved by fixed-point iteration.
//!
//! A compute/request cycle (Figure 6-2): the thread computes (residence `R_w`), its
//! request crosses the intra-cluster network (`l`), the sending INI and the receiving INI
//! (`R_o` each), the inter-cluster network (`L`), is handled at the destination PE
//! (`R_q`), and the reply comes back the same way (`l`, `L`, two more INI passes) to be
//! handled at the requester (`R_y`):
//!
//! ```text
//! (6.1)  R   = R_w + 2l + R_q + 2L + 4 R_o + R_y
//! (6.2)  λ   = 1 / R
//! (6.3)  Q_q = λ R_q                (6.6)  R_q = o (1 + Q_q + Q_y)
//! (6.4)  Q_y = λ R_y                (6.7)  R_y = o (1 + Q_q)
//! (6.5)  Q_o = 4 N λ R_o            (6.8)  R_o = O (1 + Q_o)
//! (6.9)  R_w = (W + o Q_q) / (1 − U_q)   (the BKT approximation, as in LoPC)
//! (6.10) U_q = o / R
//! ```
//!
//! [`Pattern::Homogeneous`] is the thesis's system exactly. [`Pattern::ClientServer`] is
//! the same derivation for `multigrain bench mva`'s synthetic application, in which the N
//! threads of cluster 0 make the requests and one server thread in cluster 1 answers
//! them all (K = 1 INI per cluster): see [`Pattern`] for the four equations that change.
//!
//! Equation 6.8 lets an arriving message see the INI's time-average queue `Q_o`, its own
//! customer's share included, so that even a lone thread queues behind itself
//! ([`Arrival::Thesis`], the equations as printed). [`Arrival::Schweitzer`] applies the
//! arrival theorem the standard approximate way (Schweitzer 1979, Bard 1979): a message
//! of one of `n` customers that visit a station sees `Q·(n−1)/n` there; it is exact for a
//! lone customer and close to [`crate::exact`] for any `N`.

use serde::Serialize;

/// Which threads make requests and which serve them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Pattern {
    /// The thesis's homogeneous pattern (§6.3, Figure 6-1): every PE runs a thread that
    /// computes and requests, and also handles requests from other clusters' PEs; each
    /// INI carries four messages per cycle of each of its `N` PEs (its requests and
    /// replies out, the other cluster's requests in and replies back): equations
    /// 6.1–6.10 exactly as printed.
    Homogeneous,
    /// `multigrain bench mva`'s synthetic application: `N` client threads in cluster 0
    /// compute and request; one server thread in cluster 1 only answers; one INI per
    /// cluster, each carrying two of a cycle's four INI passes. The derivation of §6.3
    /// with four equations changed:
    /// * (6.3′) `Q_q = N λ R_q`: all `N` clients' requests queue at the one server;
    /// * (6.5′) `Q_o = 2 N λ R_o`: each INI sees two messages per client cycle;
    /// * (6.6′) `R_q = o (1 + Q_q)` and (6.7′) `R_y = o`: the server receives no
    ///   replies, a client receives only its own reply;
    /// * (6.9′, 6.10′) `R_w = W`, `U_q = 0`: no request interrupts a client.
    ClientServer,
}

/// What an arriving message sees at a queue (equations 6.6–6.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Arrival {
    /// As printed in the thesis: the time-average queue, its own customer's share
    /// included (`R_o = O (1 + Q_o)`). Pessimistic: a lone thread queues behind itself.
    Thesis,
    /// Schweitzer–Bard: a customer of the `n` that visit the station sees `Q·(n−1)/n`:
    /// at an INI `n = 2N` ([`Pattern::Homogeneous`]) or `n = N`
    /// ([`Pattern::ClientServer`]), at the ClientServer server `n = N`; the
    /// Homogeneous PEs' handler queues (6.6, 6.7) stay as printed.
    Schweitzer,
}

/// The model's inputs (Table 6.1), times in µs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Inputs {
    /// `N`: PEs (compute threads) per INI node; at least 1.
    pub n: u32,
    /// `W`: mean compute (service) time between blocking requests, µs.
    pub w: f64,
    /// `o`: mean message-handling overhead at a PE, µs (request handler at the server,
    /// reply handler at the requester).
    pub o: f64,
    /// `O`: mean message-processing overhead at an INI, per message per INI pass, µs.
    pub big_o: f64,
    /// `l`: mean intra-cluster wire time (latency), one way, µs.
    pub l: f64,
    /// `L`: mean inter-cluster wire time (latency), one way, µs.
    pub big_l: f64,
    /// Which threads request and which serve.
    pub pattern: Pattern,
    /// What an arriving message sees at a queue.
    pub arrival: Arrival,
}

impl Inputs {
    /// The inputs of the thesis's Figure 6-3 (a synthetic application on Alewife; times in
    /// processor cycles, not µs): `W = 41789`, `o = 742`, `O = 2336`, `l = L = 0`,
    /// homogeneous pattern, equations as printed.
    pub fn figure_6_3(n: u32) -> Inputs {
        Inputs {
            n,
            w: 41_789.0,
            o: 742.0,
            big_o: 2_336.0,
            l: 0.0,
            big_l: 0.0,
            pattern: Pattern::Homogeneous,
            arrival: Arrival::Thesis,
        }
    }

    /// INI passes each INI sees per cycle of each of its `N` threads: 4 (6.5) or 2 (6.5′).
    pub fn ini_visits(&self) -> f64 {
        match self.pattern {
            Pattern::Homogeneous => 4.0,
            Pattern::ClientServer => 2.0,
        }
    }

    /// Customers whose messages visit one INI: `2N` (Homogeneous: the cluster's own
    /// threads and the other cluster's) or `N` (ClientServer).
    pub fn ini_population(&self) -> f64 {
        match self.pattern {
            Pattern::Homogeneous => 2.0 * f64::from(self.n),
            Pattern::ClientServer => f64::from(self.n),
        }
    }

    /// Fraction of a queue an arrival sees among `n` customers ([`Arrival`]).
    fn seen(&self, n: f64) -> f64 {
        match self.arrival {
            Arrival::Thesis => 1.0,
            Arrival::Schweitzer => (n - 1.0) / n,
        }
    }

    fn check(&self) -> Result<(), ModelError> {
        if self.n == 0 {
            return Err(ModelError::Input("N must be at least 1"));
        }
        let all = [self.w, self.o, self.big_o, self.l, self.big_l];
        if all.iter().any(|x| !x.is_finite() || *x < 0.0) {
            return Err(ModelError::Input(
                "W, o, O, l and L must be finite and non-negative",
            ));
        }
        if all.iter().sum::<f64>() <= 0.0 {
            return Err(ModelError::Input(
                "at least one of W, o, O, l, L must be positive (else R = 0)",
            ));
        }
        Ok(())
    }
}

/// The ten unknowns of equations 6.1–6.10 (Table 6.2), times in µs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Solution {
    /// `R`: mean compute/request cycle time, µs (6.1).
    pub r: f64,
    /// `λ`: requests per µs from one compute thread (6.2).
    pub lambda: f64,
    /// `R_w`: mean residence time of the computation, µs (6.9).
    pub r_w: f64,
    /// `R_q`: mean response time of a request handler, µs (6.6).
    pub r_q: f64,
    /// `R_y`: mean response time of a reply handler, µs (6.7).
    pub r_y: f64,
    /// `R_o`: mean residence time of a message at an INI, per pass, µs (6.8).
    pub r_o: f64,
    /// `Q_q`: mean requests queued at a (serving) PE (6.3).
    pub q_q: f64,
    /// `Q_y`: mean replies queued at a PE (6.4).
    pub q_y: f64,
    /// `Q_o`: mean messages at an INI, in service included (6.5): the INI queue length.
    pub q_o: f64,
    /// `U_q`: CPU utilization of a PE by request handlers (6.10).
    pub u_q: f64,
    /// Fixed-point iterations used.
    pub iterations: u32,
}

/// Inputs the model cannot take, or an iteration that did not settle.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelError {
    /// An input out of range.
    Input(&'static str),
    /// The fixed-point iteration did not converge within its bound.
    NoConvergence {
        /// Iterations run.
        iterations: u32,
        /// Last change of `R`, relative.
        change: f64,
    },
}

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelError::Input(why) => write!(f, "model inputs: {why}"),
            ModelError::NoConvergence { iterations, change } => write!(
                f,
                "the model's fixed-point iteration did not converge in {iterations} iterations (last relative change {change:e})"
            ),
        }
    }
}

impl std::error::Error for ModelError {}

/// Relative change of `R` and absolute change of the queues under which the iteration stops.
const TOLERANCE: f64 = 1e-13;
/// Bound on the iterations.
const MAX_ITERATIONS: u32 = 1_000_000;

/// The right-hand sides of the equations for the queues `(Q_q, Q_y, Q_o)` and the previous
/// cycle time `r_prev` (for `U_q`, 6.10): the responses, then `R` and `λ`, then the queues
/// again by Little's result.
fn step(x: &Inputs, q_q: f64, q_y: f64, q_o: f64, r_prev: f64) -> Solution {
    let n = f64::from(x.n);
    let (r_q, r_y, u_q, r_w) = match x.pattern {
        Pattern::Homogeneous => {
            let r_q = x.o * (1.0 + q_q + q_y); // (6.6)
            let r_y = x.o * (1.0 + q_q); // (6.7)
            let u_q = if r_prev > 0.0 { x.o / r_prev } else { 0.0 }; // (6.10)
            let r_w = (x.w + x.o * q_q) / (1.0 - u_q); // (6.9)
            (r_q, r_y, u_q, r_w)
        }
        Pattern::ClientServer => {
            let r_q = x.o * (1.0 + q_q * x.seen(n)); // (6.6′)
            (r_q, x.o, 0.0, x.w) // (6.7′, 6.10′, 6.9′)
        }
    };
    let r_o = x.big_o * (1.0 + q_o * x.seen(x.ini_population())); // (6.8)
    let r = r_w + 2.0 * x.l + r_q + 2.0 * x.big_l + 4.0 * r_o + r_y; // (6.1)
    let lambda = 1.0 / r; // (6.2)
    let q_q = match x.pattern {
        Pattern::Homogeneous => lambda * r_q,      // (6.3)
        Pattern::ClientServer => n * lambda * r_q, // (6.3′)
    };
    let q_y = lambda * r_y; // (6.4)
    let q_o = x.ini_visits() * n * lambda * r_o; // (6.5) / (6.5′)
    Solution {
        r,
        lambda,
        r_w,
        r_q,
        r_y,
        r_o,
        q_q,
        q_y,
        q_o,
        u_q,
        iterations: 0,
    }
}

/// Solves equations 6.1–6.10 for `inputs` by fixed-point iteration from empty queues.
///
/// Each iteration evaluates the responses (6.6–6.10) from the current queues and cycle
/// time, then `R` (6.1), `λ` (6.2) and new queues by Little's result (6.3–6.5). The map
/// is increasing and bounded (every queue is at most its population), so the iterates
/// rise monotonically to the fixed point.
///
/// # Errors
/// [`ModelError::Input`] for inputs out of range; [`ModelError::NoConvergence`] if the
/// iteration has not settled after a million steps.
pub fn solve(inputs: &Inputs) -> Result<Solution, ModelError> {
    inputs.check()?;
    let (mut q_q, mut q_y, mut q_o, mut r) = (0.0, 0.0, 0.0, 0.0);
    let mut change = f64::INFINITY;
    for i in 1..=MAX_ITERATIONS {
        let s = step(inputs, q_q, q_y, q_o, r);
        change = if r > 0.0 {
            ((s.r - r) / r).abs()
        } else {
            f64::INFINITY
        };
        let dq = (s.q_q - q_q)
            .abs()
            .max((s.q_y - q_y).abs())
            .max((s.q_o - q_o).abs());
        (q_q, q_y, q_o, r) = (s.q_q, s.q_y, s.q_o, s.r);
        if change < TOLERANCE && dq < TOLERANCE {
            // One more evaluation so the responses and the queues belong to one point.
            let mut fin = step(inputs, q_q, q_y, q_o, r);
            fin.iterations = i;
            return Ok(fin);
        }
    }
    Err(ModelError::NoConvergence {
        iterations: MAX_ITERATIONS,
        change,
    })
}

impl Solution {
    /// How far `self` is from satisfying each of equations 6.1–6.10 for `x` (left side −
    /// right side, in that order; µs for the times, customers for the queues, per µs for
    /// `λ`); all ≈ 0 at a solution.
    pub fn residuals(&self, x: &Inputs) -> [f64; 10] {
        let s = step(x, self.q_q, self.q_y, self.q_o, self.r);
        let n = f64::from(x.n);
        let q_q = match x.pattern {
            Pattern::Homogeneous => self.lambda * self.r_q,
            Pattern::ClientServer => n * self.lambda * self.r_q,
        };
        [
            self.r - (self.r_w + 2.0 * x.l + self.r_q + 2.0 * x.big_l + 4.0 * self.r_o + self.r_y),
            self.lambda - 1.0 / self.r,
            self.q_q - q_q,
            self.q_y - self.lambda * self.r_y,
            self.q_o - x.ini_visits() * n * self.lambda * self.r_o,
            self.r_q - s.r_q,
            self.r_y - s.r_y,
            self.r_o - s.r_o,
            self.r_w - s.r_w,
            self.u_q - s.u_q,
        ]
    }

    /// Time the thread's own messages spend in the INIs per cycle (`4 R_o`), µs.
    pub fn ini_time(&self) -> f64 {
        4.0 * self.r_o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cs(n: u32, w: f64, o: f64, big_o: f64, arrival: Arrival) -> Inputs {
        Inputs {
            n,
            w,
            o,
            big_o,
            l: 3.0,
            big_l: 10.0,
            pattern: Pattern::ClientServer,
            arrival,
        }
    }

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-12)
    }

    #[test]
    fn solutions_satisfy_all_ten_equations() {
        for pattern in [Pattern::Homogeneous, Pattern::ClientServer] {
            for arrival in [Arrival::Thesis, Arrival::Schweitzer] {
                for n in [1, 2, 5, 16, 64] {
                    let x = Inputs {
                        pattern,
                        arrival,
                        ..cs(n, 200.0, 4.0, 12.0, arrival)
                    };
                    let s = solve(&x).unwrap();
                    for (i, r) in s.residuals(&x).iter().enumerate() {
                        assert!(r.abs() < 1e-9, "eq 6.{}: residual {r} for {x:?}", i + 1);
                    }
                }
            }
        }
    }

    #[test]
    fn lone_client_does_not_queue_schweitzer() {
        let x = cs(1, 200.0, 4.0, 12.0, Arrival::Schweitzer);
        let s = solve(&x).unwrap();
        let no_wait = 200.0 + 2.0 * 3.0 + 2.0 * 10.0 + 4.0 * 12.0 + 2.0 * 4.0;
        assert!(close(s.r, no_wait, 1e-12), "{} vs {no_wait}", s.r);
        assert!(close(s.r_o, 12.0, 1e-12));
        // Q at an INI = the lone customer's utilization share there: 2 O / R.
        assert!(close(s.q_o, 2.0 * 12.0 / no_wait, 1e-12));
    }

    #[test]
    fn thesis_equations_let_a_lone_client_queue_behind_itself() {
        let x = cs(1, 200.0, 4.0, 12.0, Arrival::Thesis);
        let s = solve(&x).unwrap();
        let share = 2.0 * 12.0 / s.r;
        assert!(s.r_o > 12.0);
        assert!(s.q_o > share * 0.999);
        assert!(s.q_o < 1.0);
    }

    #[test]
    fn bound_6_11_queue_equals_n_without_compute_or_latency() {
        for arrival in [Arrival::Thesis, Arrival::Schweitzer] {
            for n in [1, 3, 8] {
                let x = Inputs {
                    n,
                    w: 0.0,
                    o: 0.0,
                    big_o: 5.0,
                    l: 0.0,
                    big_l: 0.0,
                    pattern: Pattern::Homogeneous,
                    arrival,
                };
                let s = solve(&x).unwrap();
                assert!(
                    close(s.q_o, f64::from(n), 1e-9),
                    "{arrival:?} N={n}: {}",
                    s.q_o
                );
            }
        }
    }

    #[test]
    fn queue_and_cycle_grow_with_n() {
        for pattern in [Pattern::Homogeneous, Pattern::ClientServer] {
            for arrival in [Arrival::Thesis, Arrival::Schweitzer] {
                let mut last = (0.0, 0.0);
                for n in 1..=32 {
                    let x = Inputs {
                        pattern,
                        ..cs(n, 100.0, 2.0, 15.0, arrival)
                    };
                    let s = solve(&x).unwrap();
                    assert!(s.q_o >= last.0 && s.r >= last.1, "{x:?}");
                    assert!(s.q_o <= f64::from(n));
                    last = (s.q_o, s.r);
                }
            }
        }
    }

    #[test]
    fn figure_6_3_is_linear_once_the_ini_saturates() {
        // Heavy INI load: Q grows by about one per extra PE.
        let q = |n| solve(&Inputs::figure_6_3(n)).unwrap().q_o;
        assert!(q(1) > 0.0 && q(1) < 1.0);
        assert!(q(8) > q(4) && q(4) > q(2));
        let slope = q(64) - q(63);
        assert!(slope > 0.9 && slope <= 1.0 + 1e-9, "slope {slope}");
    }

    #[test]
    fn bad_inputs_are_refused() {
        let mut x = cs(0, 1.0, 1.0, 1.0, Arrival::Thesis);
        assert!(matches!(solve(&x), Err(ModelError::Input(_))));
        x.n = 1;
        x.w = -1.0;
        assert!(matches!(solve(&x), Err(ModelError::Input(_))));
        x = Inputs {
            w: 0.0,
            o: 0.0,
            big_o: 0.0,
            l: 0.0,
            big_l: 0.0,
            ..x
        };
        assert!(matches!(solve(&x), Err(ModelError::Input(_))));
    }
}
