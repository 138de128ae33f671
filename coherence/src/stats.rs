//! Protocol statistics counted by a [`crate::Machine`].

use std::ops::AddAssign;

/// Declares [`Stats`] (one documented `u64` counter per field) and its field-wise sum.
macro_rules! counters {
    ($($(#[doc = $doc:literal])* $field:ident,)*) => {
        /// Counters kept by one cluster's machine. Sum them over clusters for job
        /// totals.
        ///
        /// Source: statistics of issue 4 and design.md, *dsm* (faults, remote fetches,
        /// diffs, invalidations, messages); the categories follow the MGS evaluation
        /// (ISCA 1996 §6) and HLRC (OSDI 1996 §5).
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
        )]
        #[serde(default)]
        pub struct Stats {
            $($(#[doc = $doc])* pub $field: u64,)*
        }

        impl AddAssign for Stats {
            fn add_assign(&mut self, o: Stats) {
                $(self.$field += o.$field;)*
            }
        }

        impl AddAssign<&Stats> for Stats {
            fn add_assign(&mut self, o: &Stats) {
                *self += *o;
            }
        }
    };
}

counters! {
    /// Read faults handled (including spurious and coalesced ones).
    read_faults,
    /// Write faults handled (including spurious and coalesced ones).
    write_faults,
    /// Faults on a page that was already accessible (answered with a wake).
    spurious_faults,
    /// Faults that joined a fetch already in progress for the page.
    coalesced_faults,
    /// Page requests sent to a home (hlrc `GetPage`, sc `ScRead`/`ScWrite`).
    remote_fetches,
    /// hlrc fetch replies discarded and re-requested because a write notice for the
    /// page arrived while the fetch was in flight.
    stale_refetches,
    /// First-touch home queries sent.
    home_queries,
    /// Pages sent by this cluster as home (with data).
    pages_served,
    /// Zero-page replies sent by this cluster as home (no data).
    zero_pages_served,
    /// hlrc: pages requested ahead of a fault (see [`crate::Config::prefetch`]).
    prefetches,
    /// hlrc: prefetched pages installed with no fault waiting for them.
    prefetches_installed,
    /// hlrc: faults that found their page being prefetched and waited for it (faults
    /// avoided altogether by an installed prefetch are not counted).
    prefetch_hits,
    /// Barrier arrivals: sent to the barrier manager, or, at the manager, delivered to
    /// its own barrier state (one per barrier once the cluster's flush is done).
    barrier_arrivals,
    /// hlrc: barrier arrivals that waited for prefetches in flight.
    arrivals_held,
    /// hlrc: prefetched pages dropped on arrival because a write notice made the reply
    /// stale on its way.
    prefetches_dropped,
    /// hlrc: fetches this home held until diffs they needed had arrived.
    fetches_deferred,
    /// Twins made.
    twins,
    /// hlrc: pages opened ahead of a write fault on the page before them (see
    /// [`crate::Config::write_ahead`]).
    write_ahead_pages,
    /// hlrc: write faults at the home on a page no other cluster has fetched: the
    /// page stays writable without a twin and produces no write notices.
    private_home_writes,
    /// hlrc: private writable home pages another cluster fetched (from then on the
    /// home's writes are tracked).
    home_pages_shared,
    /// hlrc: flushes (interval closes with open pages, and acquires that had to
    /// flush open pages before invalidating them).
    flushes,
    /// hlrc: of `flushes`, those that closed the interval while a thread waited for a
    /// lock requested from its manager ([`crate::Config::flush_ahead`]).
    flushes_ahead,
    /// hlrc: pages diffed at a flush and kept writable with a refreshed twin.
    pages_kept_open,
    /// hlrc: pages diffed at a flush and closed (write-protected, twin dropped).
    pages_closed,
    /// hlrc: diffs sent to homes.
    diffs_sent,
    /// hlrc: diffs not sent on their own because the lock release that closed their
    /// interval carried them to its manager, the page's home.
    diffs_via_release,
    /// hlrc: diffs that reached a cluster after their page's home had moved away (at
    /// a barrier) and were dropped (the new home's copy has their words).
    stale_diffs_dropped,
    /// hlrc: bytes of the diffs sent to homes.
    diff_bytes_sent,
    /// hlrc: pages flushed at an acquire because a write notice without a diff
    /// invalidated them while they were open.
    diffs_at_acquire,
    /// hlrc: diffs applied at this home from `Diff` messages.
    diffs_applied,
    /// hlrc: diffs that reached this home before one they depend on and waited.
    diffs_buffered,
    /// hlrc: diffs carried by lock grants and applied to a copy here (instead of
    /// invalidating the page).
    carried_diffs_applied,
    /// hlrc: diffs this cluster sent with its lock releases.
    carried_diffs_sent,
    /// hlrc: bytes of diffs applied here (at the home or carried).
    diff_bytes_applied,
    /// Pages invalidated.
    invalidations,
    /// Write notices (page entries of interval records) received and not yet
    /// reflected.
    write_notices_received,
    /// hlrc: acquires that waited for diffs of pages homed here.
    acquires_held,
    /// hlrc: barrier departures whose local threads waited for diffs of pages homed
    /// here.
    barriers_held,
    /// Intervals with writes closed by this cluster (interval records created).
    intervals,
    /// hlrc and sc: interval records received with lock grants (into this cluster's
    /// log, local grants included) and with lock releases (into this cluster's lock
    /// manager's store).
    records_received,
    /// Of `records_received`, those already held: sent again because the sender could
    /// not know the receiver had them.
    records_known,
    /// Interval records left out of a grant or release because an earlier message of
    /// the same event to the same cluster carried them.
    records_skipped,
    /// Lock acquires by this cluster's threads (`Event::Acquire`).
    lock_acquires,
    /// Of `lock_acquires`, those served inside the cluster without a message: the
    /// cluster owned the lock (cached after an earlier use, or pushed) or a local
    /// holder passed it on. The others were served by a grant, one per request
    /// (`lock_acquires = lock_local_acquires + lock_requests` when no request is
    /// pending).
    lock_local_acquires,
    /// Lock requests (`LockAcquire`) sent by this cluster to lock managers
    /// (including itself).
    lock_requests,
    /// Lock grants issued by this cluster as lock manager.
    lock_grants,
    /// Lock recalls sent by this cluster as lock manager (an owning cluster was asked
    /// to give a cached lock back).
    lock_recalls,
    /// Of `lock_recalls`, those sent ahead of any request: the next locks of a sweep,
    /// recalled with the one asked for ([`crate::sync::SWEEP_RECALL`]).
    lock_sweep_recalls,
    /// Of `lock_sweep_recalls`, those of locks pushed to a quiet cluster (see
    /// [`crate::sync::SWEEP_RECALL`]).
    lock_sweep_pushed_recalls,
    /// Contended or pushed locks this cluster gave back at a release without being
    /// asked (eager release).
    lock_eager_releases,
    /// Releases of a contended or pushed lock that kept it here instead of giving it
    /// back: in its last visit here (the tenures granted here in a row) this cluster's
    /// threads took it more often than in the current one so far (see [`crate::sync`],
    /// *Visits*).
    lock_visit_keeps,
    /// Flushes that gave back several eager locks at once, or one with the locks
    /// waiting for a batch ([`crate::Config::release_batch`]).
    release_batches,
    /// hlrc: updates sent at barrier arrivals (diffs of home pages to the other
    /// clusters of their copysets; [`crate::Config::barrier_updates`]).
    updates_sent,
    /// hlrc: updates applied (a copy kept valid instead of invalidated), at barrier
    /// departures or with a lock grant (`updates_at_grant`).
    updates_applied,
    /// hlrc: of `updates_applied`, those applied with a lock grant that brought their
    /// write notice before the departure did (the barrier flush that sent them also
    /// gave back a lock another cluster waited for; see [`crate::hlrc`]).
    updates_at_grant,
    /// hlrc: of `updates_applied`, those applied when they arrived, while this cluster
    /// waited at the barrier whose departure would have applied them (see
    /// [`crate::hlrc`]).
    updates_early,
    /// hlrc: updates dropped (no valid copy that reflects their base, stale, or
    /// surplus).
    updates_dropped,
    /// hlrc: of `updates_dropped`, those whose copy already held them when a lock
    /// grant brought their write notice: the same diff came with the grant (carried
    /// with the lock) and was applied from there.
    updates_redundant,
    /// hlrc: barrier departures that waited for updates still on their way from other
    /// clusters (the departure overtook them; see [`crate::Message::BarrierDepart`]).
    departures_held_for_updates,
    /// Locks pushed to this cluster by their manager without a request (predicted to
    /// be wanted here next).
    lock_pushes_received,
    /// Locks this cluster, as their manager, pushed back to the cluster that had just
    /// released them (predicted to take them again next while contended; see
    /// [`crate::sync`]). Counted also in that cluster's `lock_pushes_received`.
    lock_pushes_back,
    /// Lock requests this cluster dropped as manager because a push had already
    /// answered them.
    lock_stale_requests,
    /// Pushed locks this cluster gave back unused (recalled before any of its
    /// threads took them).
    lock_pushes_returned,
    /// Pushed locks this cluster gave back unused and asked for instead, because
    /// their records left a gap in its log (an earlier push that carried the missing
    /// ones had not arrived or was given back before it took effect): at their first
    /// local acquire, or on arrival when the push answered a request.
    lock_pushes_refused,
    /// Barriers completed.
    barriers,
    /// hlrc single-writer home migrations applied at this cluster (counted at the
    /// new home).
    home_migrations,
    /// sc invalidation requests sent by this cluster as home.
    sc_invalidations_sent,
    /// sc recalls (downgrade or invalidate of the writer) sent by this home.
    sc_recalls,
    /// sc ownership transfers granted by this home to another cluster.
    sc_ownership_grants,
    /// Messages sent to other clusters.
    messages_sent,
    /// Of `messages_sent`, lock and barrier messages.
    sync_messages_sent,
    /// Messages received from other clusters.
    messages_received,
}
