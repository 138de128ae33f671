//! Opt-in per-message traces of the INIs (paper 002 §4.4.2) and what they say (§5.3–5.4).
//!
//! With tracing on, every INI keeps a [`TraceBuffer`] of fixed-size [`TraceRecord`]s, one
//! per message it sends or delivers, with the message's timestamps at each checkpoint:
//! enqueued by the compute thread, taken off the INI's queue, accepted by the sliding
//! window, first datagram on the wire; at the receiving INI, last datagram read and
//! delivered to its receive queue. At the end of the run each cluster writes its buffers
//! as one [`ClusterTrace`] file; [`summarize`] turns the files of a job into the
//! quantities of Tables 5.3/5.4 and 5.6/5.7 ([`TraceSummary`]), which
//! `multigrain trace summarize` prints and the run report shows.

mod file;
mod record;
mod summary;

#[cfg(test)]
mod tests;

pub use file::{ClusterTrace, IniTrace};
pub use record::{RECORD_BYTES, Side, TraceBuffer, TraceRecord};
pub use summary::{ClusterSummary, IniSummary, TraceSummary, summarize};

/// A trace file that cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Reading or writing failed.
    #[error("trace I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The bytes do not start with the trace magic `MGTRACE1`.
    #[error("not a multigrain trace file (it does not start with `MGTRACE1`)")]
    NotATrace,
    /// A format version this build cannot read.
    #[error("trace format version {0}; this build reads version 1")]
    Version(u32),
    /// The size does not match what the header announces.
    #[error("truncated or padded trace file: {0}")]
    Size(String),
    /// One record is malformed.
    #[error("trace record {index} is malformed: {why}")]
    BadRecord {
        /// Position of the record in the file, from 0.
        index: u64,
        /// What is wrong with it.
        why: &'static str,
    },
    /// More INIs than the format can name.
    #[error("a cluster has more than 65,535 INIs")]
    TooManyInis,
}
