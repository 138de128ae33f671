//! Job topology: the cluster-config TOML schema and its validation.
#![forbid(unsafe_code)]
