//! The multigrain message layer, in the style of StarT-Voyager (paper 004) and
//! multi-protocol Active Messages (paper 000).
//!
//! * **Express** messages ([`Express`], [`word`]): one 64-bit word — handler, source id,
//!   40-bit payload — sent and received with one claim each on a bounded lock-free MPMC
//!   ring shared by any number of threads (paper 004 §5.1).
//! * **Tag-On** messages ([`TagOnBuf`], [`TagOnData`]): an Express header plus a page-sized
//!   buffer from a registered pool, read in place by the receiver and released by a guard;
//!   multicast without copying (paper 004 §5.2).
//! * **Basic** messages: up to 256 bytes in a lock-guarded ring — the baseline (paper 004 §6).
//! * **Bulk** messages ([`bulk`]): any length up to 1 MiB, fragmented over Tag-On slots.
//! * **Virtual queue names** and per-endpoint **destination tables** ([`names`], paper 004
//!   §4.1), written only by the runtime.
//! * **OnePoll** over an endpoint's queues in priority order (paper 004 §4.3).
//! * **Active-Message dispatch** ([`dispatch`], paper 000 §2.2).
//! * Two substrates with the same queue code: threads of one process, and processes on one
//!   machine through a shared segment ([`segment`], paper 000 §3).
//! * Blocking receive on a futex **doorbell** (paper 003 §4).
//! * A real-time **liveness** thread per cluster process ([`liveness`]) whose
//!   authenticated probes keep a live cluster with starved protocol threads from being
//!   declared dead.
//!
//! Start at [`Site`]: one per process.

#![deny(unsafe_op_in_unsafe_fn)]

/// The job's control plane (re-exported from `multigrain-control`).
pub use multigrain_control as control;
/// The sliding-window protocol, sans I/O (re-exported from `multigrain-window`).
pub use multigrain_window as window;

mod basic;
pub mod bulk;
mod deadline;
mod delay;
pub mod dispatch;
mod doorbell;
mod endpoint;
#[cfg(not(loom))]
mod futex;
pub mod job;
mod layout;
pub mod liveness;
mod message;
pub mod names;
pub mod net;
pub mod poll;
mod pool;
mod remote;
mod ring;
pub mod sched;
pub mod segment;
mod shm_safe;
mod site;
pub mod stats;
mod sync;
pub mod word;

pub use basic::{BASIC_MAX, BasicMsg, BasicTooLong};
pub use dispatch::{Ctx, Dispatcher, HandlerKind, Undeliverable, UndeliverableReason};
pub use doorbell::Doorbell;
pub use endpoint::{DEFAULT_SPIN, Endpoint, NotOwnQueue, PollSet, PollSource};
pub use layout::{LayoutError, QueueSpec};
pub use message::{BasicSendError, BulkMsg, BulkSendError, Message, SendError, TagOnMsg};
pub use names::{Destination, DestinationTable, QueueId, SiteId, TableWriter, VirtualName};
pub use pool::{BadSlot, DEFAULT_SLOT_SIZE, Pool, PoolExhausted, TagOnBuf, TagOnData};
pub use ring::{HeapRing, RingLayoutError};
pub use shm_safe::ShmSafe;
pub use site::{Site, SiteConfig, SiteError, Substrate};
pub use stats::MessageStats;
pub use word::{Express, ExpressMsg, Handler, PayloadTooWide, SourceId, Word, WordKind};

#[cfg(all(test, not(loom)))]
mod tests;
