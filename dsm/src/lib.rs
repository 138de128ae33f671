//! The DSM runtime: userfaultfd region, fault handling, synchronization.
//!
//! [`uffd`] is the low layer: a region mapped at the same address in every cluster
//! process, registered with userfaultfd for missing and write-protect faults, and the
//! page operations (install, protect, invalidate, twin) the coherence runtime executes.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod uffd;
