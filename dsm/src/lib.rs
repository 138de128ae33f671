//! The DSM runtime: userfaultfd region, fault handling, synchronization.
#![deny(unsafe_op_in_unsafe_fn)]
