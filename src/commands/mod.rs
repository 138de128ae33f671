//! One module per subcommand.

pub mod bench_messaging;
pub mod config;
