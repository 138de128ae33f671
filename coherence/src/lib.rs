//! Page-grain coherence protocols as pure state machines (no I/O).
#![forbid(unsafe_code)]
