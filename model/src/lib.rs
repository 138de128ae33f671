//! The analytical contention model of paper 002 chapter 6 (Jiang, *A Scalable Parallel
//! Inter-Cluster Communication System for Clustered Multiprocessors*, MIT 1997): mean
//! value analysis (MVA) of compute threads that compute for `W`, then make a blocking
//! inter-cluster request through the INIs (inter-cluster network interfaces, the
//! protocol processors), in the style of LoPC (Frank, Agarwal, Vernon 1997).
//!
//! * [`equations`] solves the thesis's ten equations 6.1–6.10 (inputs `N`, `W`, `o`,
//!   `O`, `l`, `L`, Table 6.1) by fixed-point iteration, for the thesis's homogeneous
//!   pattern (Figure 6-1: every PE both requests and serves) and for the client–server
//!   pattern of `multigrain bench mva`'s synthetic application (N client threads in
//!   cluster 0, one server thread in cluster 1).
//! * [`exact`] is the standard exact MVA recursion (Reiser and Lavenberg 1980) for a
//!   closed single-class network of one delay station and FCFS queueing stations: the
//!   cross-check where both describe the same network.
//!
//! Every time is in µs (the model is homogeneous in its time unit: the thesis's own
//! Figure 6-3 inputs are Alewife processor cycles, and [`equations::Inputs::figure_6_3`]
//! takes them as they are). Pure arithmetic: no I/O, no clock, no `unsafe`.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod equations;
pub mod exact;

pub use equations::{Arrival, Inputs, ModelError, Pattern, Solution};
pub use exact::{ExactSolution, Station, StationKind};
