//! Page-grain coherence protocols of multigrain as pure, sans-I/O state machines.
//!
//! Each cluster (one OS process with several compute threads sharing one copy of
//! each page) runs one [`Machine`]. The runtime (`multigrain-dsm`) feeds it
//! [`Event`]s — page faults from userfaultfd, lock and barrier calls, received
//! protocol [`Message`]s — and executes the [`Action`]s it returns: sending
//! messages, installing, protecting and invalidating pages, making twins, computing
//! and applying [`diff`]s, waking threads. The machine never touches page memory,
//! clocks or sockets, so tests and the model checker drive it directly.
//!
//! Two protocols ([`Protocol`]):
//!
//! * [`hlrc`] (default): home-based lazy release consistency with multiple writers,
//!   twins and diffs, write notices carried by locks and barriers with vector
//!   timestamps ([`interval`]), per-page versions so that releases never wait for
//!   homes, diffs carried by the lock to its next holder, single-writer home
//!   migration at barriers, and private home pages (no write tracking while no
//!   other cluster holds a copy).
//! * [`sc`]: sequential consistency, single writer / multiple readers,
//!   write-invalidate, the home as directory (Ivy).
//!
//! Locks are cached by the cluster that was granted them, given back eagerly when
//! contended, and pushed, with the diffs of the intervals they protected, to the
//! cluster predicted to want them next ([`sync`]).
//!
//! The calling contract is in the [`Machine`] documentation; each [`Action`] says
//! what the runtime must do. Messages encode to one 64-bit Express word (8-bit
//! opcode, 40-bit payload) plus an optional Tag-On buffer or bulk body
//! ([`message`]).
//!
//! # References
//!
//! * MGS — D. Yeung, J. Kubiatowicz, A. Agarwal, "MGS: A Multigrain Shared Memory
//!   System", ISCA 1996 (used on Alewife in the thesis of paper 002, §4.2).
//! * HLRC — Y. Zhou, L. Iftode, K. Li, "Performance Evaluation of Two Home-Based
//!   Lazy Release Consistency Protocols for Shared Virtual Memory Systems", OSDI
//!   1996.
//! * LRC — P. Keleher, A. Cox, W. Zwaenepoel, "Lazy Release Consistency for Software
//!   Distributed Shared Memory", ISCA 1992.
//! * Munin — J. Carter, J. Bennett, W. Zwaenepoel, "Implementation and Performance
//!   of Munin", SOSP 1991 (twins and diffs).
//! * Ivy — K. Li, P. Hudak, "Memory Coherence in Shared Virtual Memory Systems", ACM
//!   TOCS 7(4), 1989.
//! * JIAJIA home migration — W. Hu, W. Shi, Z. Tang, "Home Migration in Home-based
//!   Software DSMs", WSDSM 1999.
//! * ArgoDSM — github.com/etascale/argodsm (first-touch directory, write-back
//!   before self-invalidation, private/shared page classification); S. Kaxiras, D.
//!   Klaftenegger, M. Norgren, A. Ros, K. Sagonas, "Turning Centralized Coherence and
//!   Distributed Critical-Section Execution on their Head", HPDC 2015.
//! * TreadMarks — P. Keleher, A. Cox, S. Dwarkadas, W. Zwaenepoel, "TreadMarks:
//!   Distributed Shared Memory on Standard Workstations and Operating Systems",
//!   USENIX Winter 1994 (lock caching at the last releaser).
//! * Migratory data — A. Cox, R. Fowler, "Adaptive Cache Coherency for Detecting
//!   Migratory Shared Data", ISCA 1993.
#![forbid(unsafe_code)]

mod action;
mod barrier;
mod carried;
mod config;
pub mod copy;
pub mod diff;
mod error;
mod flush;
pub mod hlrc;
pub mod home;
mod home_lookup;
mod ids;
pub mod interval;
mod lock_table;
mod locks;
mod machine;
pub mod message;
mod page_table;
pub mod readahead;
pub mod sc;
mod small_map;
mod stats;
pub mod sync;
pub mod write_ahead;

pub use action::{Action, Event, FlushPage, MAX_MOVED_BYTES, Source};
pub use config::{
    Config, ConfigError, DEFAULT_IDLE_FLUSHES, DEFAULT_PREFETCH, DEFAULT_RELEASE_BATCH,
    DEFAULT_WRITE_AHEAD, HomePolicy, MAX_IDLE_FLUSHES, MAX_RELEASE_BATCH, MAX_SWEEP_RECALL,
    MAX_WRITE_AHEAD, Protocol,
};
pub use error::ProtocolError;
pub use ids::{
    ClusterId, FaultToken, LockId, MAX_CLUSTERS, MAX_LOCKS, MAX_PAGES, PAGE_SIZE, PageId,
    PageRange, SyncToken, WORD_SIZE, WORDS_PER_PAGE,
};
pub use interval::{DiffBytes, GapError, IntervalDiff, IntervalRecord, VectorTime};
pub use machine::{Machine, PageAccess};
pub use message::{Attachment, Body, DecodeError, Message, Parts};
pub use stats::Stats;
