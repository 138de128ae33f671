//! Protocol statistics counted by a [`crate::Machine`].

use std::ops::AddAssign;

/// Counters kept by one cluster's machine. Sum them over clusters for job totals.
///
/// Source: statistics of issue 4 and design.md, *dsm* (faults, remote fetches,
/// diffs, invalidations, messages); the categories follow the MGS evaluation
/// (ISCA 1996 §6) and HLRC (OSDI 1996 §5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Stats {
    /// Read faults handled (including spurious and coalesced ones).
    pub read_faults: u64,
    /// Write faults handled (including spurious and coalesced ones).
    pub write_faults: u64,
    /// Faults on a page that was already accessible (answered with a wake).
    pub spurious_faults: u64,
    /// Faults that joined a fetch already in progress for the page.
    pub coalesced_faults: u64,
    /// Page requests sent to a home (hlrc `GetPage`, sc `ScRead`/`ScWrite`).
    pub remote_fetches: u64,
    /// hlrc fetch replies discarded and re-requested because a write notice for the
    /// page arrived while the fetch was in flight.
    pub stale_refetches: u64,
    /// First-touch home queries sent.
    pub home_queries: u64,
    /// Pages sent by this cluster as home (with data).
    pub pages_served: u64,
    /// Zero-page replies sent by this cluster as home (no data).
    pub zero_pages_served: u64,
    /// Twins made.
    pub twins: u64,
    /// hlrc: write faults at the home on a page no other cluster has fetched: the
    /// page stays writable across releases and produces no write notices.
    pub private_home_writes: u64,
    /// hlrc: private writable home pages another cluster fetched (from then on the
    /// home's writes are tracked).
    pub home_pages_shared: u64,
    /// Write faults that waited for the acknowledgement of this cluster's previous
    /// diff of the page before taking a twin.
    pub twin_waits: u64,
    /// Diffs sent (`SendDiff` actions).
    pub diffs_sent: u64,
    /// Diffs sent early because an acquire invalidated a dirty page.
    pub diffs_at_acquire: u64,
    /// Diffs applied at this home (run-encoded plus whole-page).
    pub diffs_applied: u64,
    /// Of `diffs_applied`, those sent as whole pages.
    pub whole_page_diffs_applied: u64,
    /// Bytes of diffs applied at this home (attachment lengths).
    pub diff_bytes_applied: u64,
    /// Pages invalidated.
    pub invalidations: u64,
    /// Write notices (page entries of interval records or barrier notices) received.
    pub write_notices_received: u64,
    /// Intervals with writes closed by this cluster (interval records created).
    pub intervals: u64,
    /// Lock acquires requested by this cluster's threads.
    pub lock_acquires: u64,
    /// Lock grants issued by this cluster as lock manager.
    pub lock_grants: u64,
    /// Barriers completed.
    pub barriers: u64,
    /// hlrc single-writer home migrations applied at this cluster (counted at the
    /// new home).
    pub home_migrations: u64,
    /// sc invalidation requests sent by this cluster as home.
    pub sc_invalidations_sent: u64,
    /// sc recalls (downgrade or invalidate of the writer) sent by this home.
    pub sc_recalls: u64,
    /// sc ownership transfers granted by this home to another cluster.
    pub sc_ownership_grants: u64,
    /// Messages sent to other clusters.
    pub messages_sent: u64,
    /// Of `messages_sent`, lock and barrier messages.
    pub sync_messages_sent: u64,
    /// Messages received from other clusters.
    pub messages_received: u64,
}

impl AddAssign for Stats {
    fn add_assign(&mut self, o: Stats) {
        let Stats {
            read_faults,
            write_faults,
            spurious_faults,
            coalesced_faults,
            remote_fetches,
            stale_refetches,
            home_queries,
            pages_served,
            zero_pages_served,
            twins,
            private_home_writes,
            home_pages_shared,
            twin_waits,
            diffs_sent,
            diffs_at_acquire,
            diffs_applied,
            whole_page_diffs_applied,
            diff_bytes_applied,
            invalidations,
            write_notices_received,
            intervals,
            lock_acquires,
            lock_grants,
            barriers,
            home_migrations,
            sc_invalidations_sent,
            sc_recalls,
            sc_ownership_grants,
            messages_sent,
            sync_messages_sent,
            messages_received,
        } = o;
        self.read_faults += read_faults;
        self.write_faults += write_faults;
        self.spurious_faults += spurious_faults;
        self.coalesced_faults += coalesced_faults;
        self.remote_fetches += remote_fetches;
        self.stale_refetches += stale_refetches;
        self.home_queries += home_queries;
        self.pages_served += pages_served;
        self.zero_pages_served += zero_pages_served;
        self.twins += twins;
        self.private_home_writes += private_home_writes;
        self.home_pages_shared += home_pages_shared;
        self.twin_waits += twin_waits;
        self.diffs_sent += diffs_sent;
        self.diffs_at_acquire += diffs_at_acquire;
        self.diffs_applied += diffs_applied;
        self.whole_page_diffs_applied += whole_page_diffs_applied;
        self.diff_bytes_applied += diff_bytes_applied;
        self.invalidations += invalidations;
        self.write_notices_received += write_notices_received;
        self.intervals += intervals;
        self.lock_acquires += lock_acquires;
        self.lock_grants += lock_grants;
        self.barriers += barriers;
        self.home_migrations += home_migrations;
        self.sc_invalidations_sent += sc_invalidations_sent;
        self.sc_recalls += sc_recalls;
        self.sc_ownership_grants += sc_ownership_grants;
        self.messages_sent += messages_sent;
        self.sync_messages_sent += sync_messages_sent;
        self.messages_received += messages_received;
    }
}
