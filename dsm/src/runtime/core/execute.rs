//! Events and actions: a thread hands an event to the coherence machine and executes
//! the actions it returns, under the machine mutex (sends, flushes with their diffs,
//! installs, protections), then handles what was received meanwhile.

use super::*;

/// The most marked lines (of a page's 64) for which a flush reads, compares and diffs
/// only the marked lines of a page that stays open (see `Core::flush`). Past half the
/// page the whole page is read as one block and diffed with `diff::encode`, whose
/// comparisons the compiler vectorizes, and the twin is swapped instead of copied line
/// by line.
const LINE_DIFF_MAX: u32 = 32;

impl Core {
    /// Handles `event` (with the received Tag-On buffer `attachment`, if any) and
    /// executes its actions, then dispatches the messages received meanwhile.
    pub(crate) fn handle(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        event: Event,
        attachment: Attached<'_>,
    ) -> Result<(), DsmError> {
        let mut pending = Pending::default();
        self.handle_one(ops, ep, event, attachment, &mut pending)?;
        self.drain_pending(ops, ep, &mut pending)
    }

    pub(super) fn drain_pending(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        while let Some(m) = pending.0.pop_front() {
            self.dispatch_one(ops, ep, m, pending)?;
        }
        Ok(())
    }

    /// Handles `event` and executes its actions under the machine lock, in order (see
    /// [`Core::handle_events`]).
    pub(super) fn handle_one(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        event: Event,
        attachment: Attached<'_>,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        self.handle_events(ops, ep, attachment, std::iter::once(Ok(event)), pending)
    }

    /// Handles `events` one after the other and executes each one's actions, in order,
    /// under one hold of the machine lock; the messages of a received bundle come here
    /// together. An `Err` item (a part that does not decode) ends the batch: the events
    /// before it stay handled and their messages are sent, and the error is returned
    /// (the caller fails the job); an error while handling fails the job here.
    ///
    /// # Bundling
    ///
    /// A bulk coherence message is not sent at once: it joins the bundle of its
    /// destination ([`State::outbox`], [`wire::Bundle`]). The bundle for a cluster is
    /// sent, as one message-layer message ([`RuntimeOp::Bundle`], or the plain bulk
    /// message when it holds one),
    ///
    /// * before any other message (Express, Tag-On) to that cluster, so that what one
    ///   cluster sends another arrives in the order the machine emitted it;
    /// * when the next bulk message would take it past [`wire::MAX_BUNDLE_BYTES`]
    ///   (a message longer than that is sent alone, after the bundle);
    /// * before a diff is applied or pages are flushed, when the bundles hold a lock or
    ///   barrier message: the barrier manager's departure to another cluster goes out
    ///   before the manager applies the updates of its own departure, so both clusters
    ///   apply theirs at the same time (EM3D: ≈ 40 updates of 4 KiB per phase each way),
    ///   and a grant leaves before the diffs that came with the release it follows are
    ///   applied;
    /// * at the end of the batch's actions (the follow-up `Flushed` events' included),
    ///   still under the lock, so no later event's message to that cluster can
    ///   overtake it; to a cluster reached through shared memory, at the end of each
    ///   event's actions already. The replies to the messages of one received bundle
    ///   share the bundles to clusters reached through the network: a lock manager
    ///   handling a bundle of releases sends the grants and pushes it decides on in one
    ///   datagram per destination, where each took one before (Water 512 × 50 on 4 × 1
    ///   over UDP: 88,500 bundles, 1.9 messages each, before; 77,000–79,000 bundles and
    ///   0.94–0.95 of the time after, forty-ninth session). Over shared memory a send
    ///   costs little and the first grant would wait for the rest of the batch (the same
    ///   batching over shared memory: 4 × 1 1.04–1.07 × the time). Bundles leave in
    ///   cluster order, so messages to *different* clusters may leave in another order
    ///   than emitted: the machine's calling contract lets the network reorder
    ///   messages. A held message's bytes were encoded when its action executed (only
    ///   Tag-On sends read the region, and those are not held).
    ///
    /// `attachment` is the received Tag-On buffer of the batch's first event (a Tag-On
    /// message is handled alone; a bundle's messages have none). The events come as an
    /// exact-size iterator of bare events, not of pairs with their buffers behind a
    /// `Peekable`: a pair of an event and its buffer, and the peeked item, are over 128
    /// bytes, whose every move was a `memcpy` call (see
    /// [`multigrain_coherence::MAX_MOVED_BYTES`]).
    ///
    /// Messages received while a send blocks go to `pending`, as for any send.
    pub(super) fn handle_events(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        attachment: Attached<'_>,
        mut events: impl ExactSizeIterator<Item = Result<Event, DsmError>>,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        // Slots whose owners sleep and must be woken once the machine is unlocked.
        let mut wake: Vec<u32> = Vec::new();
        let mut refused = None;
        {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let arrivals = st.machine.stats().barrier_arrivals;
            let mut result = Ok(());
            // A lock or barrier message waits in a bundle (see Bundling).
            let mut sync_held = false;
            let mut attachment = attachment;
            while let Some(item) = events.next() {
                let event = match item {
                    Ok(e) => e,
                    Err(e) => {
                        refused = Some(e);
                        break;
                    }
                };
                result = self.handle_locked(
                    ops,
                    ep,
                    st,
                    event,
                    attachment.take(),
                    pending,
                    &mut wake,
                    &mut sync_held,
                );
                // Over shared memory, what this event sent leaves before the next event
                // of the batch; after the last one, everything leaves below.
                if result.is_ok() && events.len() > 0 {
                    let t = st.profile.is_some().then(FastInstant::now);
                    result = self.send_bundles(ep, &mut st.outbox, pending, true);
                    note_action(st, t, ActionKind::PostBundles);
                }
                if result.is_err() {
                    break;
                }
            }
            if result.is_ok() {
                let t = st.profile.is_some().then(FastInstant::now);
                result = self.send_bundles(ep, &mut st.outbox, pending, false);
                note_action(st, t, ActionKind::PostBundles);
            }
            // The arrival left in this call's bundles, or went to this cluster's own
            // barrier manager (no message): the flush before it is over.
            if st.machine.stats().barrier_arrivals != arrivals {
                self.barrier_arrival_sent
                    .store(self.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            // After a failure, what is still held is dropped: the job is failing.
            st.outbox.iter_mut().for_each(wire::Bundle::clear);
            st.reclaim.clear();
            if let Err(e) = result {
                drop(guard);
                self.fail_with(ep, &e);
                return Err(e);
            }
        }
        for slot in wake {
            self.wake_slot(ep, slot);
        }
        refused.map_or(Ok(()), Err)
    }

    /// Handles one event of [`Core::handle_events`] with the machine locked (`st`):
    /// executes its actions, holding bulk messages in the outbox; `sync_held` says
    /// whether the outbox holds a lock or barrier message (see Bundling).
    #[allow(clippy::too_many_arguments)]
    fn handle_locked(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        st: &mut State,
        event: Event,
        attachment: Attached<'_>,
        pending: &mut Pending,
        wake: &mut Vec<u32>,
        sync_held: &mut bool,
    ) -> Result<(), DsmError> {
        // With `dsm.event_profile`: when the event's handling began, and its kind.
        let profiled = st
            .profile
            .is_some()
            .then(|| (FastInstant::now(), Profiler::slot(&event)));
        let mut machine_ns = 0u64;
        let mut actions = std::mem::take(&mut st.actions);
        let spurious = st.machine.stats().spurious_faults;
        let faulted = match event {
            Event::ReadFault { page, .. } | Event::WriteFault { page, .. } => Some(page),
            _ => None,
        };
        let (mut event, mut attachment) = (event, attachment);
        let mut result = Ok(());
        // An action list that ends with a flush is followed by the flush's result
        // (the machine's calling contract), under the same lock.
        loop {
            actions.clear();
            let t = profiled.map(|_| FastInstant::now());
            let handled = st.machine.handle(event, &mut actions);
            if let Some(t) = t {
                machine_ns += t.elapsed().as_nanos() as u64;
            }
            if let Err(e) = handled {
                result = Err(DsmError::Violation {
                    cluster: self.me,
                    source: e,
                });
                break;
            }
            let mut flushed = None;
            let mut lift = UnprotectRun::default();
            for a in actions.drain(..) {
                let ready = match &a {
                    Action::Unprotect { page } => lift.add(PageIndex(page.index())),
                    // Twins read through the runtime view, whatever the protection.
                    Action::MakeTwin { .. } => None,
                    _ => lift.take(),
                };
                if let Some(run) = ready
                    && let Err(e) = self.lift_protection(ops, run)
                {
                    result = Err(e);
                    break;
                }
                if matches!(a, Action::Unprotect { .. }) {
                    continue;
                }
                if *sync_held && matches!(a, Action::ApplyDiff { .. } | Action::Flush { .. }) {
                    // A grant or departure waits for no page work of this batch.
                    *sync_held = false;
                    if let Err(e) = self.send_bundles(ep, &mut st.outbox, pending, false) {
                        result = Err(e);
                        break;
                    }
                }
                let timed = profiled.map(|_| (FastInstant::now(), ActionKind::of(&a)));
                let r = match a {
                    Action::Flush { pages } => {
                        self.flush(ops, st, &pages).map(|d| flushed = Some(d))
                    }
                    a => {
                        *sync_held |= matches!(&a, Action::Send { msg, .. } if msg.is_sync());
                        self.execute(ops, ep, st, a, attachment, pending, wake)
                    }
                };
                if let Some((t, kind)) = timed {
                    note_action(st, Some(t), kind);
                }
                if let Err(e) = r {
                    result = Err(e);
                    break;
                }
            }
            if result.is_ok()
                && let Some(run) = lift.take()
                && let Err(e) = self.lift_protection(ops, run)
            {
                result = Err(e);
            }
            match flushed {
                Some(diffs) if result.is_ok() => {
                    event = Event::Flushed { diffs };
                    attachment = None;
                }
                // An idle cached lock the machine wants back: the runtime releases
                // it, under the same lock (a thread that found it gone asks the
                // machine next, which must know it is free by then).
                None if result.is_ok() && !st.reclaim.is_empty() => {
                    let lock = st.reclaim.pop().expect("checked non-empty");
                    event = Event::Release {
                        lock,
                        token: SyncToken(RUNTIME_TOKEN),
                    };
                    attachment = None;
                }
                _ => break,
            }
        }
        st.actions = actions;
        if let (Some((t, slot)), Some(p)) = (profiled, st.profile.as_mut()) {
            p.event(slot, t.elapsed().as_nanos() as u64, machine_ns);
        }
        if result.is_ok()
            && let Some(page) = faulted
            && st.machine.stats().spurious_faults != spurious
        {
            result = self.remap_present(ops, st, page);
        }
        result
    }

    /// Sends a no-op to this cluster's own protocol queue: wakes every thread sleeping on
    /// its doorbell.
    pub(crate) fn ring_own_doorbell(&self, ep: &Endpoint) {
        let noop = Express::new(RuntimeOp::Noop.handler(), 0).expect("zero payload");
        // A full queue wakes sleepers by itself.
        let _ = ep.send_express(name(self.me), noop);
    }

    /// After a fault on `page` that the machine found spurious (the page is present for
    /// it): maps the page again if the kernel dropped its mapping, which a region with
    /// minor faults reports as a fault (a page written to swap by reclaim; without
    /// minor faults the kernel maps such a page back by itself). The access would
    /// otherwise fault again forever. A page still mapped (the usual spurious fault: a
    /// fault raced with the page's install) costs one `UFFDIO_CONTINUE` that changes
    /// nothing.
    fn remap_present(&self, ops: &RegionOps, st: &State, page: PageId) -> Result<(), DsmError> {
        if !ops.minor_faults() {
            return Ok(());
        }
        let protection = match st.machine.access(page) {
            Some(multigrain_coherence::PageAccess::ReadWrite) => Protection::Writable,
            Some(multigrain_coherence::PageAccess::ReadOnly) => Protection::ReadOnly,
            _ => return Ok(()),
        };
        match ops.remap(PageIndex(page.index()), protection) {
            Ok(Install::Installed) => {
                bump(&self.counters.pages_remapped, 1);
                Ok(())
            }
            Ok(Install::AlreadyPresent) => Ok(()),
            Err(source) => Err(DsmError::PageOp {
                cluster: self.me,
                source,
            }),
        }
    }

    /// Lifts the write protection of `run` in one `UFFDIO_WRITEPROTECT`.
    fn lift_protection(&self, ops: &RegionOps, run: PageRange) -> Result<(), DsmError> {
        ops.unprotect(run).map_err(|source| DsmError::PageOp {
            cluster: self.me,
            source,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        st: &mut State,
        action: Action,
        attachment: Attached<'_>,
        pending: &mut Pending,
        wake: &mut Vec<u32>,
    ) -> Result<(), DsmError> {
        let op_err = |source| DsmError::PageOp {
            cluster: self.me,
            source,
        };
        let idx = |p: PageId| PageIndex(p.index());
        let range = |r: multigrain_coherence::PageRange| {
            PageRange::new(PageIndex(r.start.index()), r.count as usize)
        };
        match action {
            Action::Send { to, msg } => {
                self.send_message(ops, ep, to.index(), &msg, pending, &mut st.outbox)
            }
            Action::Install {
                page,
                source,
                writable,
            } => {
                let prot = if writable {
                    Protection::Writable
                } else {
                    Protection::ReadOnly
                };
                let in_place = ops.installs_in_place(idx(page));
                let outcome = match source {
                    Source::Zero => ops.install_zero(idx(page), prot),
                    Source::Attached => {
                        let data: &[u8; PAGE_SIZE] = attachment
                            .and_then(|(_, d)| d.try_into().ok())
                            .ok_or_else(|| {
                                self.internal(format!("install of {page:?} without a page buffer"))
                            })?;
                        // UFFDIO_COPY straight from the received pool buffer: the page's
                        // only copy since the sender filled the buffer.
                        ops.install(idx(page), data, prot)
                    }
                }
                .map_err(op_err)?;
                if outcome == Install::AlreadyPresent {
                    return Err(self.internal(format!(
                        "{page:?} was present although the protocol had it missing"
                    )));
                }
                bump(&self.counters.pages_installed, 1);
                if in_place {
                    bump(&self.counters.pages_installed_in_place, 1);
                }
                Ok(())
            }
            Action::MakeTwin { page } => ops
                .view_read(idx(page), st.twins.make(page.get()))
                .map_err(op_err),
            Action::DropTwin { page } => {
                if st.twins.remove(page.get()) {
                    Ok(())
                } else {
                    Err(self.internal(format!("drop of {page:?} without a twin")))
                }
            }
            Action::ShareHomePage { to, page } => {
                self.share_home_page(ops, ep, st, to.index(), page, pending)
            }
            // Lifted by `handle_one`, in runs (see `UnprotectRun`).
            Action::Unprotect { page } => {
                Err(self.internal(format!("an Unprotect of {page:?} outside its run")))
            }
            Action::WriteProtect { pages } => ops.write_protect(range(pages)).map_err(op_err),
            Action::Invalidate { pages } => {
                ops.invalidate(range(pages)).map_err(op_err)?;
                bump(&self.counters.invalidations, u64::from(pages.count));
                bump(&self.counters.invalidate_calls, 1);
                Ok(())
            }
            Action::ApplyDiff { page, data, twin } => self.apply_diff(ops, st, page, &data, twin),
            Action::Flush { .. } => {
                Err(self.internal("a flush that is not the last action".into()))
            }
            Action::Wake { tokens, .. } => {
                for t in tokens {
                    if let Some(slot) = self.slots.complete(t.0) {
                        wake.push(slot);
                    }
                }
                Ok(())
            }
            Action::AcquireDone { lock, token } => {
                if st.machine.lock_cacheable(lock) {
                    self.lock_cache.adopt(lock.get());
                }
                if let Some(slot) = self.slots.complete(token.0) {
                    wake.push(slot);
                }
                Ok(())
            }
            Action::ReleaseDone { token, .. } if token.0 == RUNTIME_TOKEN => Ok(()),
            Action::LockWanted { lock } => {
                if self.lock_cache.want(lock.get()) == Wanted::ReleaseNow {
                    st.reclaim.push(lock);
                }
                Ok(())
            }
            Action::ReleaseDone { token, .. } | Action::BarrierDone { token } => {
                if let Some(slot) = self.slots.complete(token.0) {
                    wake.push(slot);
                }
                Ok(())
            }
        }
    }

    pub(super) fn internal(&self, detail: String) -> DsmError {
        DsmError::Internal {
            cluster: self.me,
            detail,
        }
    }

    /// Executes a flush: diffs each page that an application store marked since the
    /// last flush (see [`WriteMarks`](crate::uffd::WriteMarks)) against its twin
    /// (through the runtime view, which never faults), then refreshes the twin to
    /// exactly the contents diffed (`keep_open`) or discards it (the page was
    /// write-protected by an earlier action). A page that stays open with at most
    /// [`LINE_DIFF_MAX`] marked lines has only those lines read, compared and diffed
    /// (`diff::encode_lines`, which copies them into the twin); any other marked or
    /// closing page is read whole. A word a local thread writes meanwhile is read as its
    /// old or its new value; a new value lands in both diff and twin, an old one shows up
    /// in the next flush.
    fn flush(
        &self,
        ops: &RegionOps,
        st: &mut State,
        pages: &[FlushPage],
    ) -> Result<Vec<DiffBytes>, DsmError> {
        let mut diffs = Vec::with_capacity(pages.len());
        let mut unmarked = 0u64;
        let mut by_lines = 0u64;
        for fp in pages {
            let index = PageIndex(fp.page.index());
            // Taken before the page is read (see `WriteMarks`).
            let lines = ops.marks().take_lines(index);
            if lines == 0 && fp.keep_open {
                // Unchanged since the last flush and staying open: nothing to read, the
                // twin stays as it is.
                unmarked += 1;
                diffs.push(DiffBytes::default());
                continue;
            }
            let key = fp.page.get();
            let (twin, scratch) = st
                .twins
                .with_scratch(key)
                .ok_or_else(|| self.internal(format!("flush of {:?} without a twin", fp.page)))?;
            let op_err = |source| DsmError::PageOp {
                cluster: self.me,
                source,
            };
            let diff_err = |e| self.internal(format!("diff of {:?}: {e}", fp.page));
            st.diff_buf.clear();
            // A page that closes here is compared whole, whatever its marks say: a store
            // that has landed but whose mark has not yet (its thread preempted between
            // the two, as when a cluster's threads share a CPU) would be lost with the
            // twin, since no later flush reads a closed page; stores after the write
            // protection that precedes a close fault instead. Trusting the mark here
            // lost about one Water run in 150 on 2×2 (energies wrong in the 7th digit;
            // with `dsm.idle_flushes = 0`, a close at every flush, 26 of 600 runs;
            // thirty-ninth session).
            if fp.keep_open && lines.count_ones() <= LINE_DIFF_MAX {
                // A few lines written (a lock-protected update): read, compare and diff
                // only those; `encode_lines` refreshes them in the twin.
                by_lines += 1;
                ops.view_read_lines(index, lines, scratch).map_err(op_err)?;
                diff::encode_lines(&mut twin[..], &scratch[..], lines, &mut st.diff_buf)
                    .map_err(diff_err)?;
            } else if !ops.view_equals(index, twin).map_err(op_err)? {
                // Compared with the twin first, without the copy and the diff (see
                // `view_equals`): a page whose marked lines were rewritten with the same
                // values is left alone.
                ops.view_read(index, scratch).map_err(op_err)?;
                diff::encode(&twin[..], &scratch[..], &mut st.diff_buf).map_err(diff_err)?;
                if fp.keep_open && !st.diff_buf.is_empty() {
                    // The contents just diffed become the twin; the old twin, the next
                    // scratch buffer (no copy).
                    st.twins.swap_scratch(key);
                }
            }
            if !fp.keep_open {
                st.twins.remove(key);
            }
            // Encoded into a buffer with room for the largest diff (a vector grown by
            // doubling took ten reallocations for a page rewritten whole): a small diff
            // is copied out, a large one takes the buffer along.
            diffs.push(if st.diff_buf.is_empty() {
                DiffBytes::default()
            } else if st.diff_buf.len() < diff::MAX_ENCODED / 2 {
                DiffBytes::new(&st.diff_buf)
            } else {
                DiffBytes::from_vec(std::mem::replace(
                    &mut st.diff_buf,
                    Vec::with_capacity(diff::MAX_ENCODED),
                ))
            });
        }
        bump(&self.counters.flush_unmarked, unmarked);
        bump(&self.counters.flush_by_lines, by_lines);
        Ok(diffs)
    }

    /// Sends a private home page's first copy to `to` and makes the same copy its
    /// twin (see [`Action::ShareHomePage`]).
    fn share_home_page(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        st: &mut State,
        to: usize,
        page: PageId,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        self.send_held(ep, to, &mut st.outbox, pending)?;
        let mut buf = self.alloc_buffer(ep, pending)?;
        let dst: &mut [u8; PAGE_SIZE] = (&mut buf.as_mut_capacity()[..PAGE_SIZE])
            .try_into()
            .expect("pool slots hold a page");
        ops.view_read(PageIndex(page.index()), dst)
            .map_err(|source| DsmError::PageOp {
                cluster: self.me,
                source,
            })?;
        multigrain_coherence::copy::copy_bytes(&mut st.twins.make(page.get())[..], &dst[..]);
        let parts = Message::PageData {
            page,
            writable: false,
            zero: false,
        }
        .to_parts();
        buf.set_len(PAGE_SIZE);
        buf.set_tag(parts.payload);
        self.send_tag_on(ep, to, Handler(parts.opcode), buf, pending)
    }

    /// Applies an encoded diff to a page through the runtime view (only the diff's
    /// words are stored, so the protection application threads see is unchanged and
    /// their concurrent writes to other words survive), and to its twin when `twin`.
    fn apply_diff(
        &self,
        ops: &RegionOps,
        st: &mut State,
        page: PageId,
        data: &DiffBytes,
        twin: bool,
    ) -> Result<(), DsmError> {
        let data = data.as_slice();
        diff::validate(data, PAGE_SIZE)
            .map_err(|e| self.internal(format!("diff of {page:?}: {e}")))?;
        let p = PageIndex(page.index());
        if twin {
            let t = st.twins.get_mut(page.get()).ok_or_else(|| {
                self.internal(format!("diff for the twin of {page:?}, which has none"))
            })?;
            diff::apply(&mut t[..], data)
                .map_err(|e| self.internal(format!("diff of {page:?}: {e}")))?;
        }
        // Run encoding of `multigrain_coherence::diff` (validated above): a 4-byte LE
        // header, bits 0..16 the first word and 16..32 the word count, then the words.
        let mut pos = 0;
        while pos < data.len() {
            let h = u32::from_le_bytes(data[pos..pos + 4].try_into().expect("4 bytes"));
            let (first, words) = ((h & 0xffff) as usize, (h >> 16) as usize);
            pos += 4;
            ops.view_write_words(p, first, &data[pos..pos + words * 8])
                .map_err(|source| DsmError::PageOp {
                    cluster: self.me,
                    source,
                })?;
            pos += words * 8;
        }
        Ok(())
    }
}

/// The `Unprotect` actions of one action list that name consecutive pages, lifted
/// together in one `UFFDIO_WRITEPROTECT`: write-ahead (the coherence machine's
/// `write_ahead` module) opens a run of pages — twin, unprotect, twin, unprotect — and
/// each call costs ≈ 1 µs. An `Unprotect` is held back only past the twins of the pages
/// after it (made through the runtime view, whatever the protection); any other action
/// lifts the run first, so nothing else sees a page still protected that the machine
/// has made writable.
#[derive(Default)]
struct UnprotectRun(Option<PageRange>);

impl UnprotectRun {
    /// Adds `page`; returns the run to lift now if `page` does not continue it.
    fn add(&mut self, page: PageIndex) -> Option<PageRange> {
        match &mut self.0 {
            Some(run) if run.end() == Some(page.0) => {
                run.count += 1;
                None
            }
            _ => self.0.replace(PageRange::one(page)),
        }
    }

    /// The run held, if any, to lift now.
    fn take(&mut self) -> Option<PageRange> {
        self.0.take()
    }
}

/// Adds the time since `start` to `st`'s profile under `kind` (nothing without a
/// profile, whose `start` is `None`).
fn note_action(st: &mut State, start: Option<FastInstant>, kind: ActionKind) {
    if let (Some(t), Some(p)) = (start, st.profile.as_mut()) {
        p.action(kind, t.elapsed().as_nanos() as u64);
    }
}
