//! Applications for multigrain: SPLASH-2 Water-Nsquared and EM3D.
//!
//! Each app has a sequential reference ([`water::run_sequential`], [`em3d::run_sequential`])
//! and a parallel version written once against the [`team::Runtime`] / [`team::Team`]
//! traits ([`water::run_parallel`], [`em3d::run_parallel`]). The numeric kernels are generic
//! over the word storage ([`storage::F64Words`]), so the sequential references run on plain
//! local memory and the parallel versions on whatever shared memory the runtime provides:
//! plain threads in one process ([`threads::ThreadsRuntime`]) or the clusters of a DSM job
//! ([`dsm_backend::DsmRuntime`]). [`conformance`] checks that a backend keeps the
//! guarantees the apps rely on; [`progress`] lets a caller watch a run's phases.
#![forbid(unsafe_code)]

pub(crate) mod cfmt;
pub mod conformance;
pub mod dsm_backend;
pub mod em3d;
pub mod progress;
pub mod shared_data;
pub mod storage;
pub mod team;
pub mod threads;
pub mod water;
