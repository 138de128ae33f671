//! Receiving: what arrives on the protocol queue is dispatched here: bundles in the
//! order their sender numbered them, then each protocol or runtime message.

use super::*;

impl Core {
    /// Handles one received message and everything received while handling it.
    pub(crate) fn dispatch(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        m: Received,
    ) -> Result<(), DsmError> {
        let t0 = FastInstant::now();
        let mut pending = Pending::default();
        let r = self
            .dispatch_one(ops, ep, Incoming::Msg(m), &mut pending)
            .and_then(|()| self.drain_pending(ops, ep, &mut pending));
        bump(&self.counters.dispatched, 1);
        bump(&self.counters.dispatch_ns, t0.elapsed().as_nanos() as u64);
        r
    }

    pub(super) fn dispatch_one(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        m: Incoming,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        let (from, handler) = match &m {
            Incoming::Msg(m) => (usize::from(m.source().get()), m.handler()),
            Incoming::Copied {
                source, handler, ..
            } => (*source, *handler),
        };
        let malformed = |reason: String| DsmError::Malformed {
            cluster: self.me,
            from,
            reason,
        };
        if from >= self.clusters {
            return Err(malformed(format!("source id {from} is not a cluster")));
        }
        let bundle = handler == RuntimeOp::Bundle.handler();
        if !bundle {
            // A bundle's messages are counted one by one below.
            bump(&self.counters.received[usize::from(handler.0)], 1);
        }
        let m = match m {
            Incoming::Msg(m) => m,
            Incoming::Copied { tag, data, .. } => {
                return self.protocol_message(ops, ep, from, handler, tag, Some(&data), pending);
            }
        };
        if bundle {
            return self.bundle_message(ops, ep, from, m, pending);
        }
        if let Some(op) = RuntimeOp::from_handler(handler) {
            return self.runtime_message(ep, op, from, m);
        }
        match m {
            Received::Express(e) => {
                self.protocol_message(ops, ep, from, handler, e.payload, None, pending)
            }
            Received::TagOn(t) => self.protocol_message(
                ops,
                ep,
                from,
                handler,
                t.data.tag(),
                Some(t.data.as_slice()),
                pending,
            ),
            // Every bulk coherence message travels in a numbered bundle, so that the
            // receiver can handle them in the order sent.
            Received::Bulk(_) => Err(malformed(format!(
                "a bulk {} message outside a bundle",
                wire::op_name(handler.0)
            ))),
            Received::Basic(_) => Err(malformed("the DSM protocol sends no Basic messages".into())),
        }
    }

    /// Handles a received [`RuntimeOp::Bundle`] in its sender's order: if it is the
    /// sender's next one, handles it and then every later one already received (see
    /// [`crate::runtime::reseq`]); otherwise leaves it to the thread that handles its
    /// predecessor. A piece of a bundle sent in pieces is kept until the bundle is whole
    /// (see [`crate::pieces`]).
    fn bundle_message(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        from: usize,
        m: Received,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        let malformed = |reason: String| self.malformed_bundle(from, reason);
        let Received::Bulk(b) = m else {
            return Err(malformed("wrong message kind".into()));
        };
        let seq = wire::bundle_seq(&b.data)
            .ok_or_else(|| malformed(format!("{} bytes, no sequence number", b.data.len())))?;
        let offer = self.reseq[from]
            .lock()
            .offer(seq, b.data)
            .map_err(malformed)?;
        let Offer::Take(mut data) = offer else {
            return Ok(());
        };
        loop {
            if pieces::is_piece(&data) {
                bump(&self.counters.bundle_pieces_received, 1);
            }
            let whole = self.assembly[from].lock().take(data).map_err(malformed)?;
            if let Some(data) = whole {
                // Shared, not copied, by the large updates decoded from it.
                self.bundle_parts(ops, ep, from, &Arc::new(data), pending)?;
            }
            match self.reseq[from].lock().done() {
                Some(next) => data = next,
                None => return Ok(()),
            }
        }
    }

    /// The error for a bundle from `from` that cannot be right.
    fn malformed_bundle(&self, from: usize, reason: String) -> DsmError {
        DsmError::Malformed {
            cluster: self.me,
            from,
            reason: format!("Bundle: {reason}"),
        }
    }

    /// Checks all of a bundle body from `from`, then handles its messages in order,
    /// each as a bulk message received alone from `from` (decoded with
    /// [`Message::from_shared_parts`]: a large update keeps its diff in `data`), in one
    /// batch ([`Core::handle_events`]: the replies share bundles).
    fn bundle_parts(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        from: usize,
        data: &Arc<Vec<u8>>,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        let parts = wire::decode_bundle(data).map_err(|r| self.malformed_bundle(from, r))?;
        bump(&self.counters.bundles_received, 1);
        bump(&self.counters.bundled_received, parts.len() as u64);
        let events = parts.into_iter().map(|p| {
            bump(&self.counters.received[usize::from(p.handler.0)], 1);
            // Where the part's body lies in the bundle (a subslice of it).
            let start = p.body.as_ptr() as usize - data.as_ptr() as usize;
            let msg = if Message::opcode_has_bulk_body(p.handler.0) {
                Message::from_shared_parts(
                    p.handler.0,
                    p.payload,
                    data,
                    start..start + p.body.len(),
                )
            } else {
                // An Express message carried by the bundle (`decode_bundle` checked
                // that the part is its payload alone); one that would need a Tag-On
                // buffer fails `message_event`'s check below.
                Message::from_parts(p.handler.0, p.payload, None)
            }
            .map_err(|e| DsmError::malformed(self.me, from, e))?;
            self.message_event(from, msg, None)
        });
        self.handle_events(ops, ep, None, events, pending)
    }

    /// Decodes an Express or Tag-On coherence message (`data`: its attached buffer) and
    /// hands it to the machine.
    #[allow(clippy::too_many_arguments)]
    fn protocol_message(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        from: usize,
        handler: Handler,
        payload: u64,
        data: Option<&[u8]>,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        let msg = Message::from_parts(handler.0, payload, None)
            .map_err(|e| DsmError::malformed(self.me, from, e))?;
        self.decoded_message(ops, ep, from, msg, data, pending)
    }

    /// Hands a decoded coherence message from `from` (with its attached buffer, for a
    /// Tag-On message) to the machine.
    fn decoded_message(
        &self,
        ops: &RegionOps,
        ep: &Endpoint,
        from: usize,
        msg: Message,
        data: Option<&[u8]>,
        pending: &mut Pending,
    ) -> Result<(), DsmError> {
        let event = self.message_event(from, msg, data)?;
        self.handle_one(ops, ep, event, data.map(|d| (from, d)), pending)
    }

    /// The machine's event for `msg` from `from`, once its attached buffer (`data`, for
    /// a Tag-On message) is checked against it.
    fn message_event(
        &self,
        from: usize,
        msg: Message,
        data: Option<&[u8]>,
    ) -> Result<Event, DsmError> {
        wire::check_attachment(&msg, data).map_err(|reason| DsmError::Malformed {
            cluster: self.me,
            from,
            reason,
        })?;
        Ok(Event::Message {
            from: ClusterId::new(from as u16).expect("below the cluster count"),
            msg,
        })
    }

    fn runtime_message(
        &self,
        ep: &Endpoint,
        op: RuntimeOp,
        from: usize,
        m: Received,
    ) -> Result<(), DsmError> {
        let malformed = |reason: &str| DsmError::Malformed {
            cluster: self.me,
            from,
            reason: format!("{}: {reason}", wire::op_name(op as u8)),
        };
        match (op, m) {
            (RuntimeOp::Noop, _) => Ok(()),
            (RuntimeOp::Hello, Received::Express(e)) => {
                self.hellos.lock()[from] = Some(e.payload);
                Ok(())
            }
            (RuntimeOp::Abort, Received::Bulk(b)) => {
                let (c, reason) = b
                    .data
                    .split_first_chunk::<2>()
                    .ok_or_else(|| malformed("truncated"))?;
                let cluster = usize::from(u16::from_le_bytes(*c));
                let reason = String::from_utf8_lossy(reason);
                self.record_failure(
                    ep,
                    Failure {
                        cluster,
                        reason: format!("{reason} (reported by cluster {from})"),
                    },
                    false,
                );
                Ok(())
            }
            (RuntimeOp::Stats, Received::Bulk(b)) => {
                let stats: ClusterStats =
                    serde_json::from_slice(&b.data).map_err(|e| malformed(&e.to_string()))?;
                self.peer_stats.lock()[from] = Some(stats);
                Ok(())
            }
            _ => Err(malformed("wrong message kind")),
        }
    }
}
