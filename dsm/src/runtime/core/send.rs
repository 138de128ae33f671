//! Sending: protocol messages held per destination in bundles until the event's
//! actions are done, Express, Tag-On and bulk sends, and what a send that cannot
//! complete does (messages received meanwhile wait in [`Pending`]).

use super::*;

impl Core {
    /// Sends `msg` to `to`, or holds it in `to`'s bundle (see [`Core::handle_one`]).
    pub(super) fn send_message(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        to: usize,
        msg: &Message,
        pending: &mut Pending,
        outbox: &mut [wire::Bundle],
    ) -> Result<(), DsmError> {
        let bundle = outbox.get_mut(to).ok_or_else(|| {
            self.internal(format!(
                "a message to cluster {to} of a job of {}",
                self.clusters
            ))
        })?;
        match bundle.push_message(msg) {
            wire::Push::Added => return Ok(()),
            wire::Push::Full(part) => {
                self.send_bundle(ep, to, bundle, pending)?;
                bundle.push_part(part);
                return Ok(());
            }
            wire::Push::NotBulk => {}
        }
        match wire::outgoing(msg) {
            Some(Outgoing::Express { handler, payload }) => {
                if bundle.parts().is_empty() {
                    return self.send_express(ep, to, handler, payload, pending);
                }
                // It follows bulk messages to the same cluster: they leave now, as they
                // would before an Express message of its own, with it as their last
                // part — one message-layer message (a datagram through INIs) instead
                // of two, and the Express message arrives with them, not after.
                bundle.push_express(handler, payload);
                bump(&self.counters.express_bundled_sent, 1);
                self.send_bundle(ep, to, bundle, pending)
            }
            Some(Outgoing::Page { handler, tag, page }) => {
                self.send_held(ep, to, outbox, pending)?;
                let mut buf = self.alloc_buffer(ep, pending)?;
                let dst: &mut [u8; PAGE_SIZE] = (&mut buf.as_mut_capacity()[..PAGE_SIZE])
                    .try_into()
                    .expect("pool slots hold a page");
                // The one copy of the page on its way: from the master (or the writer's
                // copy) into the pool buffer, through the runtime view.
                ops.view_read(PageIndex(page as usize), dst)
                    .map_err(|source| DsmError::PageOp {
                        cluster: self.me,
                        source,
                    })?;
                buf.set_len(PAGE_SIZE);
                buf.set_tag(tag);
                self.send_tag_on(ep, to, handler, buf, pending)
            }
            // `push_message` above took every bulk message.
            None => Err(self.internal(format!(
                "a bulk {} message the bundle did not take",
                wire::op_name(msg.to_parts().opcode)
            ))),
        }
    }

    /// Sends the bulk messages held for `to`, if any.
    pub(super) fn send_held(
        &self,
        ep: &Endpoint,
        to: usize,
        outbox: &mut [wire::Bundle],
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        match outbox.get_mut(to) {
            Some(bundle) => self.send_bundle(ep, to, bundle, pending),
            None => Ok(()),
        }
    }

    /// Sends every bundle held, in cluster order; with `keep_network`, only those to
    /// clusters reached through shared memory, keeping those to clusters reached through
    /// the network (see [`Core::handle_events`]).
    pub(super) fn send_bundles(
        &self,
        ep: &Endpoint,
        outbox: &mut [wire::Bundle],
        pending: &mut Pending,
        keep_network: bool,
    ) -> Result<(), DsmError> {
        for (to, bundle) in outbox.iter_mut().enumerate() {
            if keep_network && (bundle.parts().is_empty() || ep.reaches_over_network(name(to))) {
                continue;
            }
            self.send_bundle(ep, to, bundle, pending)?;
        }
        Ok(())
    }

    /// Sends `bundle` to `to` as the next numbered [`RuntimeOp::Bundle`] (nothing if it
    /// is empty) and empties it. The per-kind counters count the messages inside.
    /// Called with the machine locked, so bundles to a cluster leave in the order of
    /// their numbers.
    fn send_bundle(
        &self,
        ep: &Endpoint,
        to: usize,
        bundle: &mut wire::Bundle,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        let (len, max) = (bundle.body().len(), ep.max_bulk());
        if len > max {
            return self.send_in_pieces(ep, to, bundle, max, pending);
        }
        let Some(data) = bundle.seal() else {
            return Ok(());
        };
        let sent = self
            .post_bulk(ep, to, RuntimeOp::Bundle.handler(), data, pending)
            .map(|()| self.count_bundle_sent(bundle));
        bundle.clear();
        sent
    }

    /// Sends `bundle`, longer than the message layer's bulk limit `max`, in pieces (see
    /// [`crate::pieces`]), each the next numbered [`RuntimeOp::Bundle`], and empties it.
    /// One longer than [`pieces::MAX_MESSAGE_BYTES`] fails with an error that names the
    /// message it holds and why such a message grows.
    fn send_in_pieces(
        &self,
        ep: &Endpoint,
        to: usize,
        bundle: &mut wire::Bundle,
        max: usize,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        let len = bundle.body().len();
        if len - wire::BUNDLE_HEADER > pieces::MAX_MESSAGE_BYTES {
            // Only a message over the bundle bound travels alone in one, so this is the
            // one message: say which, and why it grew. Not numbered: nothing more goes
            // to `to` after this error.
            let (h, part) = bundle
                .parts()
                .iter()
                .copied()
                .max_by_key(|p| p.1)
                .unwrap_or_default();
            let reason = too_long(len, wire::op_name(h.0), part);
            bundle.clear();
            return Err(self.send_error(to, wire::op_name(RuntimeOp::Bundle.handler().0), reason));
        }
        let sent = bundle.seal_pieces(max, |piece| {
            self.post_bulk(ep, to, RuntimeOp::Bundle.handler(), piece, pending)?;
            bump(&self.counters.bundle_pieces_sent, 1);
            Ok(())
        });
        if sent.is_ok() {
            self.count_bundle_sent(bundle);
        }
        bundle.clear();
        sent
    }

    /// Counts a bundle sent and the messages in it.
    fn count_bundle_sent(&self, bundle: &wire::Bundle) {
        for &(h, len) in bundle.parts() {
            bump(&self.counters.sent[usize::from(h.0)], 1);
            // Bulk bodies only: an Express part (its payload) has none.
            if Message::opcode_has_bulk_body(h.0) {
                bump(&self.counters.sent_bytes[usize::from(h.0)], len as u64);
            }
        }
        bump(&self.counters.bundles_sent, 1);
        bump(&self.counters.bundled_sent, bundle.parts().len() as u64);
    }

    fn send_error(&self, to: usize, what: &'static str, reason: String) -> DsmError {
        DsmError::Send {
            cluster: self.me,
            to,
            what,
            reason,
        }
    }

    /// Waited too long on a send or a buffer, with the machine locked: is every cluster
    /// still alive? (Messages queued meanwhile are kept for later, not handled here.)
    fn send_stalled(
        &self,
        ep: &Endpoint,
        pending: &mut Pending,
        context: &dyn Fn() -> String,
    ) -> Result<(), DsmError> {
        self.fail_on_peer_failure(ep, context, |m| pending.push(m))
    }

    /// The liveness oracle's report, unless it names this cluster or one that finished.
    pub(super) fn peer_failure(&self) -> Option<Failure> {
        let (cluster, reason) = self.liveness.failure()?;
        // A failure of this cluster that it did not record itself was declared by the
        // job (the progress watchdog, or a coordinator that stopped hearing from it):
        // this cluster stops too.
        let ours = cluster == self.me && !self.is_failed();
        ((cluster != self.me || ours) && !self.peer_finished(cluster))
            .then_some(Failure { cluster, reason })
    }

    fn send_express(
        &self,
        ep: &Endpoint,
        to: usize,
        handler: Handler,
        payload: u64,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        let msg = Express::new(handler, payload)
            .map_err(|e| self.send_error(to, wire::op_name(handler.0), e.to_string()))?;
        self.send_retrying(ep, to, handler, msg, pending, |msg, pending| {
            ep.send_express_blocking(name(to), msg, Some(self.tuning.send_slice), |m| {
                pending.push(m)
            })
            .into()
        })?;
        bump(&self.counters.sent[usize::from(handler.0)], 1);
        Ok(())
    }

    /// The one retry path of every blocking send: `attempt` tries to send `item` for
    /// at most [`Tuning::send_slice`](super::Tuning) (taking the messages received
    /// meanwhile into `pending`); while it stalls — the destination's queue stays full,
    /// or no buffer is free — the job's liveness is checked between attempts, so a dead
    /// peer fails the send instead of hanging it. A refused send is a
    /// [`DsmError::Send`] naming `to` and the message kind.
    fn send_retrying<T>(
        &self,
        ep: &Endpoint,
        to: usize,
        handler: Handler,
        mut item: T,
        pending: &mut Pending,
        mut attempt: impl FnMut(T, &mut Pending) -> Attempt<T>,
    ) -> Result<(), DsmError> {
        let before = ep.network_sent();
        loop {
            match attempt(item, pending) {
                Attempt::Sent => {
                    self.note_sent(ep, before);
                    return Ok(());
                }
                Attempt::Stalled(back) => {
                    item = back;
                    self.send_stalled(ep, pending, &|| format!("sending to cluster {to}"))?;
                }
                Attempt::Refused(reason) => {
                    return Err(self.send_error(to, wire::op_name(handler.0), reason));
                }
            }
        }
    }

    pub(super) fn alloc_buffer(
        &self,
        ep: &Endpoint,
        pending: &mut Pending,
    ) -> Result<TagOnBuf, DsmError> {
        let mut since = Instant::now();
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            match ep.alloc() {
                Ok(b) => return Ok(b),
                Err(_) => {
                    // Our buffers come back as the receivers handle them; keep our own
                    // queue moving meanwhile.
                    while let Some(m) = ep.try_recv() {
                        pending.push(m);
                    }
                    if since.elapsed() >= self.tuning.send_slice {
                        self.send_stalled(ep, pending, &|| {
                            "waiting for a free message buffer".into()
                        })?;
                        since = Instant::now();
                    }
                    // Sleep once spinning is over: a real-time protocol thread that only
                    // yielded would keep the threads that free buffers off its CPU.
                    if backoff.is_completed() {
                        std::thread::sleep(Duration::from_micros(50));
                    } else {
                        backoff.snooze();
                    }
                }
            }
        }
    }

    pub(super) fn send_tag_on(
        &self,
        ep: &Endpoint,
        to: usize,
        handler: Handler,
        buf: TagOnBuf,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        self.send_retrying(ep, to, handler, buf.freeze(), pending, |data, pending| {
            ep.send_tag_on_blocking(name(to), handler, data, Some(self.tuning.send_slice), |m| {
                pending.push(m)
            })
            .into()
        })?;
        bump(&self.counters.sent[usize::from(handler.0)], 1);
        Ok(())
    }

    /// Sends one bulk message and counts it.
    fn send_bulk(
        &self,
        ep: &Endpoint,
        to: usize,
        handler: Handler,
        data: &[u8],
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        self.post_bulk(ep, to, handler, data, pending)?;
        bump(&self.counters.sent[usize::from(handler.0)], 1);
        bump(
            &self.counters.sent_bytes[usize::from(handler.0)],
            data.len() as u64,
        );
        Ok(())
    }

    /// Sends one bulk message (uncounted).
    fn post_bulk(
        &self,
        ep: &Endpoint,
        to: usize,
        handler: Handler,
        data: &[u8],
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        self.send_retrying(ep, to, handler, (), pending, |(), pending| {
            match ep.send_bulk(name(to), handler, data, Some(self.tuning.send_slice), |m| {
                pending.push(m)
            }) {
                Ok(()) => Attempt::Sent,
                // Fragments already sent are discarded by the receiver; send it all again.
                Err(BulkSendError::Pool(_)) | Err(BulkSendError::Send(SendError::Timeout(()))) => {
                    Attempt::Stalled(())
                }
                Err(e) => Attempt::Refused(e.to_string()),
            }
        })
    }

    /// Sends a runtime bulk message (statistics) to `to`.
    pub(crate) fn send_runtime_bulk(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        to: usize,
        op: RuntimeOp,
        data: &[u8],
    ) -> Result<(), DsmError> {
        let mut pending = Pending::default();
        self.send_bulk(ep, to, op.handler(), data, &mut pending)?;
        self.drain_pending(ops, ep, &mut pending)
    }
}

/// What one attempt of a blocking send came to (see [`Core::send_retrying`]).
enum Attempt<T> {
    Sent,
    /// Not sent within the attempt's time; the item comes back for the next attempt.
    Stalled(T),
    /// Refused for good, with the message layer's reason.
    Refused(String),
}

impl<T> From<Result<(), SendError<T>>> for Attempt<T> {
    fn from(r: Result<(), SendError<T>>) -> Self {
        match r {
            Ok(()) => Attempt::Sent,
            Err(SendError::Timeout(item)) => Attempt::Stalled(item),
            Err(e) => Attempt::Refused(e.to_string()),
        }
    }
}

/// Why a bundle of `len` bytes cannot be sent (over [`pieces::MAX_MESSAGE_BYTES`], the
/// most the runtime sends in pieces), whose largest message is a `kind` of `part` bytes.
fn too_long(len: usize, kind: &str, part: usize) -> String {
    format!(
        "a bundle of {len} bytes is over the {} bytes the runtime sends in pieces: it \
         holds a {kind} of {part} bytes. Lock and barrier messages carry the interval \
         records (one per interval a cluster closed, at least 14 bytes each) not yet known \
         to their receiver, at most those since the last barrier: a job that closes more \
         intervals between two barriers than one message holds cannot go on (see the \
         README's *Honest notes*)",
        pieces::MAX_MESSAGE_BYTES
    )
}
