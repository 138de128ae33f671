//! The StarT-Voyager-style message layer.
#![deny(unsafe_op_in_unsafe_fn)]
