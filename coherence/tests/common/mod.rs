//! A simulated runtime for the coherence machines: page memories with protection and
//! twins, compute threads running small programs, and an unordered in-memory
//! network carrying messages in wire form (`to_parts`/`from_parts`). It executes
//! every action the way the real runtime must (and checks that each action is legal
//! for the simulated page state), and keeps a happens-before ghost to check reads.
//!
//! Used by the stateright model (`tests/model.rs`) and the random-program property
//! tests (`tests/random_programs.rs`).
#![allow(dead_code)]

use std::collections::BTreeMap;

use multigrain_coherence::{
    Action, Attachment, Body, ClusterId, Config, DiffBytes, Event, FaultToken, LockId, Machine,
    Message, PageAccess, PageId, Protocol, Source, SyncToken, diff,
};

/// One operation of a thread's program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Read {
        page: u32,
        word: usize,
    },
    Write {
        page: u32,
        word: usize,
        value: u64,
    },
    /// Read-modify-write `word += delta` (one step; needs write access).
    Add {
        page: u32,
        word: usize,
        delta: u64,
    },
    Acquire(u32),
    Release(u32),
    Barrier,
}

/// A job: configuration, page size in words, and one program per thread.
#[derive(Clone, Debug)]
pub struct Spec {
    pub cfg: Config,
    pub words: usize,
    /// `(cluster, program)` per thread.
    pub threads: Vec<(u16, Vec<Op>)>,
}

impl Spec {
    pub fn local_threads(&self, c: usize) -> usize {
        self.threads
            .iter()
            .filter(|t| usize::from(t.0) == c)
            .count()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Prot {
    None,
    Ro,
    Rw,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SimPage {
    pub prot: Prot,
    pub data: Vec<u64>,
    pub twin: Option<Vec<u64>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SimCluster {
    pub machine: Machine,
    pub mem: Vec<SimPage>,
    /// Local threads that reached the current barrier.
    pub arrived: usize,
    /// Locks the runtime passes among this cluster's threads without the machine
    /// (`Machine::lock_cacheable`), as the real runtime does.
    pub cached: BTreeMap<u32, Cached>,
}

/// A lock the runtime passes among a cluster's threads without the machine, which
/// sees one holder (see `Action::LockWanted`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cached {
    /// No thread holds it.
    Idle,
    /// A thread holds it; `wanted`: its release goes through the machine.
    Held { wanted: bool },
}

/// The token of a release the runtime itself makes (an idle cached lock wanted back).
pub const RUNTIME_TOKEN: SyncToken = SyncToken(u64::MAX);

/// One message in wire form.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Wire {
    pub opcode: u8,
    pub payload: u64,
    pub bulk: Option<Vec<u8>>,
    pub attach: Option<Vec<u8>>,
}

/// Messages in flight from one cluster to another, emitted by one `Machine::handle`
/// call: delivered one at a time, in the order emitted (the calling contract's
/// exception, point 5), and in any order against every other packet.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Packet {
    pub from: u16,
    pub to: u16,
    pub msgs: Vec<Wire>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Block {
    No,
    Fault,
    Sync,
    Barrier,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Thread {
    pub cluster: u16,
    pub pc: usize,
    pub block: Block,
    /// Ghost vector clock (happens-before), one entry per thread.
    pub vc: Vec<u32>,
    pub barriers: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GhostWord {
    pub value: u64,
    pub writer: usize,
    pub clock: u32,
}

/// Happens-before ghost state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    pub mem: BTreeMap<(u32, usize), GhostWord>,
    pub locks: BTreeMap<u32, Vec<u32>>,
    pub barriers: BTreeMap<u32, Vec<u32>>,
}

/// Interesting things seen so far (for `Sometimes` properties).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Seen {
    /// A race-free read returned a value written by another cluster.
    pub remote_value: bool,
    /// Two clusters had twins of the same page at the same time.
    pub concurrent_twins: bool,
    pub stale_refetch: bool,
    pub diff_at_acquire: bool,
    pub migration: bool,
    pub coalesced_fault: bool,
    /// hlrc: an acquirer applied a diff carried by the lock instead of invalidating.
    pub carried_diff: bool,
    /// hlrc: a barrier update kept a copy valid at a departure.
    pub update_applied: bool,
    /// hlrc: a barrier update kept a copy valid at a lock grant that brought its
    /// write notice before the departure.
    pub update_at_grant: bool,
    /// hlrc: a diff reached its home before one it depends on and waited.
    pub diff_buffered: bool,
    /// hlrc: a home held a fetch until a diff it needed arrived.
    pub fetch_deferred: bool,
    /// hlrc: an acquire waited for a diff of a page homed at the acquirer.
    pub acquire_held: bool,
    /// hlrc: a barrier departure waited for a diff of a page homed at the cluster.
    pub barrier_held: bool,
    /// hlrc: a flush kept a page open (writable, twin refreshed).
    pub kept_open: bool,
    pub sc_recall: bool,
    pub sc_invalidation: bool,
    /// hlrc: a home wrote a page no other cluster had fetched (kept writable,
    /// untracked).
    pub private_home_write: bool,
    /// hlrc: a write fault opened the page after it ahead of any write to it
    /// (write-ahead).
    pub write_ahead: bool,
    /// hlrc: a private writable home page was fetched by another cluster (its writes
    /// are tracked from then on).
    pub home_page_shared: bool,
    /// An acquire was served inside a cluster without a message (cached lock or
    /// local hand-off).
    pub local_lock_acquire: bool,
    /// A lock manager recalled a cached lock.
    pub lock_recall: bool,
    /// A lock manager recalled the next locks of a sweep ahead of their requests.
    pub sweep_recall: bool,
    /// Among them, locks pushed to a quiet cluster.
    pub sweep_pushed: bool,
    /// A cluster closed its interval while a thread waited for a lock it had asked
    /// another cluster for (`Config::flush_ahead`).
    pub flush_ahead: bool,
    /// A thread took a lock cached by the runtime, without the machine.
    pub runtime_lock_acquire: bool,
    /// The runtime released an idle cached lock that was wanted back.
    pub runtime_lock_release: bool,
    /// A lock manager pushed a lock to the cluster predicted to want it next.
    pub lock_push: bool,
    /// A lock manager pushed a lock back to the cluster that had just released it.
    pub lock_push_back: bool,
    /// A cluster kept a contended or pushed lock at its release, for its visit's next
    /// local use.
    pub lock_visit_keep: bool,
    /// A lock manager dropped a request that a push had answered.
    pub stale_lock_request: bool,
    /// A cluster gave a pushed lock back at its first use because the push's records
    /// left a gap, and asked for the lock instead.
    pub push_refused: bool,
    /// hlrc: a barrier update was applied while its cluster waited at the barrier,
    /// before the departure.
    pub update_early: bool,
    /// hlrc: a barrier departure overtook an update from a third cluster and waited
    /// for it.
    pub departure_held: bool,
    /// hlrc: a prefetched page was installed with no fault waiting for it.
    pub prefetch_installed: bool,
    /// hlrc: a prefetch made stale by a write notice was dropped on arrival.
    pub prefetch_dropped: bool,
    /// hlrc: a fault found its page being prefetched and waited for it.
    pub prefetch_hit: bool,
    /// hlrc: a barrier arrival waited for a prefetch in flight.
    pub arrival_held: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct World {
    pub clusters: Vec<SimCluster>,
    pub threads: Vec<Thread>,
    /// Unordered network: a sorted multiset of packets (each keeps the order of the
    /// messages one `Machine::handle` call sent to one cluster).
    pub net: Vec<Packet>,
    /// The packets of the `Machine::handle` call being executed (empty between
    /// steps).
    pub sending: Vec<Packet>,
    /// Idle cached locks wanted back during the `Machine::handle` call being executed:
    /// the runtime releases them in the same call (empty between steps).
    pub reclaim: Vec<LockId>,
    pub ghost: Ghost,
    pub seen: Seen,
    /// Race-free reads checked so far.
    pub checked_reads: u32,
    pub error: Option<String>,
}

fn join(a: &mut Vec<u32>, b: &[u32]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, &y) in a.iter_mut().zip(b) {
        *x = (*x).max(y);
    }
}

fn bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn words(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

pub fn page(n: u32) -> PageId {
    PageId::new(n).expect("page id")
}

pub fn cluster(n: u16) -> ClusterId {
    ClusterId::new(n).expect("cluster id")
}

impl World {
    pub fn new(spec: &Spec) -> World {
        let n = spec.cfg.clusters;
        let clusters = (0..n)
            .map(|c| SimCluster {
                machine: Machine::new(cluster(c), spec.cfg.clone()).expect("valid config"),
                mem: (0..spec.cfg.pages)
                    .map(|_| SimPage {
                        prot: Prot::None,
                        data: vec![0; spec.words],
                        twin: None,
                    })
                    .collect(),
                arrived: 0,
                cached: BTreeMap::new(),
            })
            .collect();
        let nt = spec.threads.len();
        let threads = spec
            .threads
            .iter()
            .enumerate()
            .map(|(i, (c, _))| {
                let mut vc = vec![0; nt];
                vc[i] = 1;
                Thread {
                    cluster: *c,
                    pc: 0,
                    block: Block::No,
                    vc,
                    barriers: 0,
                }
            })
            .collect();
        World {
            clusters,
            threads,
            net: Vec::new(),
            sending: Vec::new(),
            reclaim: Vec::new(),
            ghost: Ghost::default(),
            seen: Seen::default(),
            checked_reads: 0,
            error: None,
        }
    }

    /// Threads that can take a step.
    pub fn runnable(&self, spec: &Spec) -> Vec<usize> {
        if self.error.is_some() {
            return Vec::new();
        }
        (0..self.threads.len())
            .filter(|&t| {
                self.threads[t].block == Block::No && self.threads[t].pc < spec.threads[t].1.len()
            })
            .collect()
    }

    /// Indices of distinct packets that can be delivered.
    pub fn deliverable(&self) -> Vec<usize> {
        if self.error.is_some() {
            return Vec::new();
        }
        (0..self.net.len())
            .filter(|&i| i == 0 || self.net[i] != self.net[i - 1])
            .collect()
    }

    pub fn threads_done(&self, spec: &Spec) -> bool {
        (0..self.threads.len()).all(|t| self.threads[t].pc == spec.threads[t].1.len())
    }

    pub fn is_terminal(&self, spec: &Spec) -> bool {
        self.error.is_none() && self.threads_done(spec) && self.net.is_empty()
    }

    fn fail(&mut self, msg: String) {
        if self.error.is_none() {
            self.error = Some(msg);
        }
    }

    fn check_read(&mut self, t: usize, p: u32, w: usize, got: u64) {
        let th = &self.threads[t];
        let (expected, remote) = match self.ghost.mem.get(&(p, w)) {
            None => (Some(0), false),
            Some(g) => {
                if g.writer == t || th.vc.get(g.writer).copied().unwrap_or(0) >= g.clock {
                    let wc = self.threads[g.writer].cluster;
                    (Some(g.value), wc != th.cluster && g.value != 0)
                } else {
                    (None, false)
                }
            }
        };
        if let Some(e) = expected {
            self.checked_reads += 1;
            if e != got {
                let c = self.threads[t].cluster;
                self.fail(format!(
                    "thread {t} (cluster {c}) read page {p} word {w} = {got}, expected {e} (last write happens-before the read)"
                ));
            } else if remote {
                self.seen.remote_value = true;
            }
        }
    }

    fn ghost_write(&mut self, t: usize, p: u32, w: usize, value: u64) {
        let clock = self.threads[t].vc[t];
        self.ghost.mem.insert(
            (p, w),
            GhostWord {
                value,
                writer: t,
                clock,
            },
        );
    }

    /// Runs one step of thread `t`.
    pub fn step_thread(&mut self, spec: &Spec, t: usize) {
        let op = spec.threads[t].1[self.threads[t].pc];
        let c = usize::from(self.threads[t].cluster);
        match op {
            Op::Read { page: p, word } => {
                let pg = &self.clusters[c].mem[p as usize];
                if pg.prot != Prot::None {
                    let v = pg.data[word];
                    self.check_read(t, p, word, v);
                    self.threads[t].pc += 1;
                } else {
                    self.threads[t].block = Block::Fault;
                    self.handle(
                        spec,
                        c,
                        Event::ReadFault {
                            page: page(p),
                            token: FaultToken(t as u64),
                        },
                        None,
                    );
                }
            }
            Op::Write {
                page: p,
                word,
                value,
            }
            | Op::Add {
                page: p,
                word,
                delta: value,
            } => {
                let pg = &self.clusters[c].mem[p as usize];
                if pg.prot == Prot::Rw {
                    let v = if matches!(op, Op::Add { .. }) {
                        let old = pg.data[word];
                        self.check_read(t, p, word, old);
                        old.wrapping_add(value)
                    } else {
                        value
                    };
                    self.clusters[c].mem[p as usize].data[word] = v;
                    self.ghost_write(t, p, word, v);
                    self.threads[t].pc += 1;
                } else {
                    self.threads[t].block = Block::Fault;
                    self.handle(
                        spec,
                        c,
                        Event::WriteFault {
                            page: page(p),
                            token: FaultToken(t as u64),
                        },
                        None,
                    );
                }
            }
            Op::Acquire(l) => {
                if self.clusters[c].cached.get(&l) == Some(&Cached::Idle) {
                    self.clusters[c]
                        .cached
                        .insert(l, Cached::Held { wanted: false });
                    self.seen.runtime_lock_acquire = true;
                    self.threads[t].pc += 1;
                    let lv = self.ghost.locks.get(&l).cloned().unwrap_or_default();
                    join(&mut self.threads[t].vc, &lv);
                    return;
                }
                self.threads[t].block = Block::Sync;
                self.handle(
                    spec,
                    c,
                    Event::Acquire {
                        lock: LockId::new(l).expect("lock"),
                        token: SyncToken(t as u64),
                    },
                    None,
                );
            }
            Op::Release(l) => {
                let vc = self.threads[t].vc.clone();
                join(self.ghost.locks.entry(l).or_default(), &vc);
                self.threads[t].vc[t] += 1;
                match self.clusters[c].cached.get(&l) {
                    Some(Cached::Held { wanted: false }) => {
                        self.clusters[c].cached.insert(l, Cached::Idle);
                        self.threads[t].pc += 1;
                        return;
                    }
                    Some(Cached::Held { wanted: true }) => {
                        self.clusters[c].cached.remove(&l);
                    }
                    Some(Cached::Idle) => {
                        return self.fail(format!("thread {t} releases idle cached lock {l}"));
                    }
                    None => {}
                }
                self.threads[t].block = Block::Sync;
                self.handle(
                    spec,
                    c,
                    Event::Release {
                        lock: LockId::new(l).expect("lock"),
                        token: SyncToken(t as u64),
                    },
                    None,
                );
            }
            Op::Barrier => {
                let ep = self.threads[t].barriers;
                let vc = self.threads[t].vc.clone();
                join(self.ghost.barriers.entry(ep).or_default(), &vc);
                self.threads[t].vc[t] += 1;
                self.threads[t].block = Block::Barrier;
                self.clusters[c].arrived += 1;
                if self.clusters[c].arrived == spec.local_threads(c) {
                    self.handle(
                        spec,
                        c,
                        Event::Barrier {
                            token: SyncToken(c as u64),
                        },
                        None,
                    );
                }
            }
        }
    }

    /// Delivers packet `i`.
    pub fn deliver(&mut self, spec: &Spec, i: usize) {
        let mut packet = self.net.remove(i);
        let pk = packet.msgs.remove(0);
        let (from, to) = (packet.from, packet.to);
        if !packet.msgs.is_empty() {
            let pos = self.net.partition_point(|x| x < &packet);
            self.net.insert(pos, packet);
        }
        let msg = match Message::from_parts(pk.opcode, pk.payload, pk.bulk.as_deref()) {
            Ok(m) => m,
            Err(e) => return self.fail(format!("decode error {e} for {pk:?}")),
        };
        if msg.attachment().is_some() != pk.attach.is_some() {
            return self.fail(format!("attachment mismatch for {msg:?}"));
        }
        self.handle(
            spec,
            usize::from(to),
            Event::Message {
                from: cluster(from),
                msg,
            },
            pk.attach,
        );
    }

    fn handle(&mut self, spec: &Spec, c: usize, ev: Event, attach: Option<Vec<u8>>) {
        let mut ev = ev;
        loop {
            let mut out = Vec::new();
            if let Err(e) = self.clusters[c].machine.handle(ev.clone(), &mut out) {
                return self.fail(format!("cluster {c}: protocol error {e} on {ev:?}"));
            }
            self.note_stats(c);
            let flush = out.iter().position(|a| matches!(a, Action::Flush { .. }));
            if let Some(i) = flush
                && i + 1 != out.len()
            {
                return self.fail(format!("cluster {c}: actions after a flush: {out:?}"));
            }
            for a in out {
                match a {
                    Action::Flush { pages } => match self.flush(c, &pages) {
                        Ok(diffs) => ev = Event::Flushed { diffs },
                        Err(e) => return self.fail(format!("cluster {c}: {e}")),
                    },
                    a => {
                        if let Err(e) = self.execute(spec, c, a, attach.as_deref()) {
                            return self.fail(format!("cluster {c}: {e}"));
                        }
                    }
                }
            }
            for packet in std::mem::take(&mut self.sending) {
                let pos = self.net.partition_point(|x| x < &packet);
                self.net.insert(pos, packet);
            }
            if flush.is_none() {
                match self.reclaim.pop() {
                    Some(lock) => {
                        self.seen.runtime_lock_release = true;
                        ev = Event::Release {
                            lock,
                            token: RUNTIME_TOKEN,
                        };
                        continue;
                    }
                    None => break,
                }
            }
            if !self.clusters[c].machine.is_flushing() {
                return self.fail(format!("cluster {c}: flush without a pending flush"));
            }
        }
        for p in 0..spec.cfg.pages as usize {
            if self
                .clusters
                .iter()
                .filter(|k| k.mem[p].twin.is_some())
                .count()
                >= 2
            {
                self.seen.concurrent_twins = true;
            }
        }
    }

    /// Executes a flush: diffs each page against its twin, refreshing or dropping the
    /// twin, as the runtime must.
    fn flush(
        &mut self,
        c: usize,
        pages: &[multigrain_coherence::FlushPage],
    ) -> Result<Vec<DiffBytes>, String> {
        let mut diffs = Vec::new();
        for fp in pages {
            let pg = &mut self.clusters[c].mem[fp.page.index()];
            let want = if fp.keep_open { Prot::Rw } else { Prot::Ro };
            if pg.prot != want {
                return Err(format!(
                    "flush of {:?} (keep open {}) in state {:?}",
                    fp.page, fp.keep_open, pg.prot
                ));
            }
            let twin = pg
                .twin
                .take()
                .ok_or(format!("flush of {:?} without a twin", fp.page))?;
            let d = diff::create(&bytes(&twin), &bytes(&pg.data)).map_err(|e| e.to_string())?;
            if fp.keep_open {
                pg.twin = Some(pg.data.clone());
            }
            diffs.push(DiffBytes::new(d));
        }
        Ok(diffs)
    }

    fn note_stats(&mut self, c: usize) {
        let st = self.clusters[c].machine.take_stats();
        self.seen.stale_refetch |= st.stale_refetches > 0;
        self.seen.diff_at_acquire |= st.diffs_at_acquire > 0;
        self.seen.migration |= st.home_migrations > 0;
        self.seen.coalesced_fault |= st.coalesced_faults > 0;
        self.seen.carried_diff |= st.carried_diffs_applied > 0;
        self.seen.update_applied |= st.updates_applied > 0;
        self.seen.update_at_grant |= st.updates_at_grant > 0;
        self.seen.diff_buffered |= st.diffs_buffered > 0;
        self.seen.fetch_deferred |= st.fetches_deferred > 0;
        self.seen.acquire_held |= st.acquires_held > 0;
        self.seen.barrier_held |= st.barriers_held > 0;
        self.seen.kept_open |= st.pages_kept_open > 0;
        self.seen.sc_recall |= st.sc_recalls > 0;
        self.seen.sc_invalidation |= st.sc_invalidations_sent > 0;
        self.seen.private_home_write |= st.private_home_writes > 0;
        self.seen.write_ahead |= st.write_ahead_pages > 0;
        self.seen.home_page_shared |= st.home_pages_shared > 0;
        self.seen.local_lock_acquire |= st.lock_local_acquires > 0;
        self.seen.lock_recall |= st.lock_recalls > 0;
        self.seen.sweep_recall |= st.lock_sweep_recalls > 0;
        self.seen.sweep_pushed |= st.lock_sweep_pushed_recalls > 0;
        self.seen.flush_ahead |= st.flushes_ahead > 0;
        self.seen.lock_push |= st.lock_pushes_received > 0;
        self.seen.lock_push_back |= st.lock_pushes_back > 0;
        self.seen.lock_visit_keep |= st.lock_visit_keeps > 0;
        self.seen.stale_lock_request |= st.lock_stale_requests > 0;
        self.seen.push_refused |= st.lock_pushes_refused > 0;
        self.seen.update_early |= st.updates_early > 0;
        self.seen.departure_held |= st.departures_held_for_updates > 0;
        self.seen.prefetch_installed |= st.prefetches_installed > 0;
        self.seen.prefetch_dropped |= st.prefetches_dropped > 0;
        self.seen.prefetch_hit |= st.prefetch_hits > 0;
        self.seen.arrival_held |= st.arrivals_held > 0;
    }

    fn send(&mut self, c: usize, to: ClusterId, msg: &Message, attach: Option<Vec<u8>>) {
        let parts = msg.to_parts();
        let bulk = match parts.body {
            Body::Bulk(b) => Some(b),
            Body::None | Body::Attached(_) => None,
        };
        let wire = Wire {
            opcode: parts.opcode,
            payload: parts.payload,
            bulk,
            attach,
        };
        let (from, to) = (c as u16, to.get());
        match self
            .sending
            .iter_mut()
            .find(|p| p.from == from && p.to == to)
        {
            Some(p) => p.msgs.push(wire),
            None => self.sending.push(Packet {
                from,
                to,
                msgs: vec![wire],
            }),
        }
    }

    /// Executes one action as the runtime must, checking that it is legal.
    fn execute(
        &mut self,
        spec: &Spec,
        c: usize,
        a: Action,
        attached: Option<&[u8]>,
    ) -> Result<(), String> {
        let me = cluster(c as u16);
        match a {
            Action::Send { to, msg } => {
                let attach = match msg.attachment() {
                    Some(Attachment::Page(p)) => {
                        let pg = &self.clusters[c].mem[p.index()];
                        if pg.prot == Prot::None {
                            return Err(format!("send of missing page {p:?}"));
                        }
                        Some(bytes(&pg.data))
                    }
                    None => None,
                };
                self.send(c, to, &msg, attach);
            }
            Action::Install {
                page: p,
                source,
                writable,
            } => {
                let pg = &mut self.clusters[c].mem[p.index()];
                if pg.prot != Prot::None || pg.twin.is_some() {
                    return Err(format!("install over a present page {p:?}"));
                }
                pg.data = match source {
                    Source::Zero => vec![0; spec.words],
                    Source::Attached => words(attached.ok_or("install without attachment")?),
                };
                if pg.data.len() != spec.words {
                    return Err("installed page of the wrong size".into());
                }
                pg.prot = if writable { Prot::Rw } else { Prot::Ro };
            }
            Action::MakeTwin { page: p } => {
                let pg = &mut self.clusters[c].mem[p.index()];
                if pg.prot != Prot::Ro || pg.twin.is_some() {
                    return Err(format!(
                        "twin of {p:?} in state {:?}/{}",
                        pg.prot,
                        pg.twin.is_some()
                    ));
                }
                pg.twin = Some(pg.data.clone());
            }
            Action::Unprotect { page: p } => {
                let home = self.clusters[c].machine.home_of(p) == Some(me);
                let hlrc = spec.cfg.protocol == Protocol::Hlrc;
                let pg = &mut self.clusters[c].mem[p.index()];
                if pg.prot != Prot::Ro {
                    return Err(format!("unprotect of {p:?} in state {:?}", pg.prot));
                }
                if hlrc && !home && pg.twin.is_none() {
                    return Err(format!("unprotect of non-home {p:?} without a twin"));
                }
                pg.prot = Prot::Rw;
            }
            Action::WriteProtect { pages } => {
                for p in pages.pages() {
                    let pg = &mut self.clusters[c].mem[p.index()];
                    if pg.prot != Prot::Rw {
                        return Err(format!("write-protect of {p:?} in state {:?}", pg.prot));
                    }
                    pg.prot = Prot::Ro;
                }
            }
            Action::Invalidate { pages } => {
                for p in pages.pages() {
                    let pg = &mut self.clusters[c].mem[p.index()];
                    if pg.twin.is_some() {
                        return Err(format!("invalidate of {p:?} with a twin"));
                    }
                    pg.prot = Prot::None;
                    pg.data = vec![0; spec.words];
                }
            }
            Action::ApplyDiff {
                page: p,
                data,
                twin,
            } => {
                let pg = &mut self.clusters[c].mem[p.index()];
                if pg.prot == Prot::None {
                    return Err(format!("apply diff to missing {p:?}"));
                }
                if twin != pg.twin.is_some() {
                    return Err(format!(
                        "apply diff to {p:?} (twin {twin}) that has a twin: {}",
                        pg.twin.is_some()
                    ));
                }
                let mut b = bytes(&pg.data);
                diff::apply(&mut b, data.as_slice()).map_err(|e| e.to_string())?;
                pg.data = words(&b);
                if let Some(t) = &mut pg.twin {
                    let mut b = bytes(t);
                    diff::apply(&mut b, data.as_slice()).map_err(|e| e.to_string())?;
                    *t = words(&b);
                }
            }
            Action::ShareHomePage { to, page: p } => {
                let pg = &mut self.clusters[c].mem[p.index()];
                if pg.prot != Prot::Rw || pg.twin.is_some() {
                    return Err(format!(
                        "share of home page {p:?} in state {:?}/{}",
                        pg.prot,
                        pg.twin.is_some()
                    ));
                }
                pg.twin = Some(pg.data.clone());
                let data = bytes(&pg.data);
                let msg = Message::PageData {
                    page: p,
                    writable: false,
                    zero: false,
                };
                self.send(c, to, &msg, Some(data));
            }
            Action::DropTwin { page: p } => {
                let pg = &mut self.clusters[c].mem[p.index()];
                let twin = pg
                    .twin
                    .take()
                    .ok_or(format!("drop of {p:?} without a twin"))?;
                if twin != pg.data {
                    return Err(format!("drop of the twin of {p:?}, which was written"));
                }
            }
            Action::Flush { .. } => return Err("flush executed out of place".into()),
            Action::Wake { page: p, tokens } => {
                for FaultToken(t) in tokens {
                    let th = &mut self.threads[t as usize];
                    if th.block != Block::Fault {
                        return Err(format!("wake of thread {t} not blocked in a fault ({p:?})"));
                    }
                    th.block = Block::No;
                }
            }
            Action::AcquireDone { lock, token } => {
                let t = token.0 as usize;
                let th = &mut self.threads[t];
                if th.block != Block::Sync || spec.threads[t].1[th.pc] != Op::Acquire(lock.get()) {
                    return Err(format!(
                        "acquire done for thread {t} that is not acquiring {lock:?}"
                    ));
                }
                th.block = Block::No;
                th.pc += 1;
                if self.clusters[c].machine.lock_cacheable(lock) {
                    self.clusters[c]
                        .cached
                        .insert(lock.get(), Cached::Held { wanted: false });
                }
                let lv = self
                    .ghost
                    .locks
                    .get(&lock.get())
                    .cloned()
                    .unwrap_or_default();
                join(&mut self.threads[t].vc, &lv);
            }
            Action::ReleaseDone { token, .. } if token == RUNTIME_TOKEN => {}
            Action::LockWanted { lock } => match self.clusters[c].cached.get(&lock.get()) {
                Some(Cached::Idle) => {
                    self.clusters[c].cached.remove(&lock.get());
                    self.reclaim.push(lock);
                }
                Some(Cached::Held { .. }) => {
                    self.clusters[c]
                        .cached
                        .insert(lock.get(), Cached::Held { wanted: true });
                }
                None => {}
            },
            Action::ReleaseDone { lock, token } => {
                let t = token.0 as usize;
                let th = &mut self.threads[t];
                if th.block != Block::Sync || spec.threads[t].1[th.pc] != Op::Release(lock.get()) {
                    return Err(format!(
                        "release done for thread {t} that is not releasing {lock:?}"
                    ));
                }
                th.block = Block::No;
                th.pc += 1;
            }
            Action::BarrierDone { token } => {
                if token.0 as usize != c {
                    return Err("barrier done with a foreign token".into());
                }
                self.clusters[c].arrived = 0;
                for t in 0..self.threads.len() {
                    if usize::from(self.threads[t].cluster) != c {
                        continue;
                    }
                    let th = &mut self.threads[t];
                    if th.block != Block::Barrier {
                        return Err(format!(
                            "barrier done while thread {t} is not at the barrier"
                        ));
                    }
                    let bv = self
                        .ghost
                        .barriers
                        .get(&th.barriers)
                        .cloned()
                        .unwrap_or_default();
                    th.block = Block::No;
                    th.pc += 1;
                    th.barriers += 1;
                    join(&mut th.vc, &bv);
                }
            }
        }
        Ok(())
    }

    /// The value of every word as the protocol holds it: hlrc, the home's master copy
    /// with the words a cluster wrote and has not yet flushed overlaid (they differ
    /// from its twin: a cluster that caches a lock keeps its writes until the lock
    /// leaves it or a barrier); sc, the writer's copy if any, else the home's.
    pub fn final_memory(&self, spec: &Spec) -> Vec<Vec<u64>> {
        (0..spec.cfg.pages)
            .map(|p| {
                let pid = page(p);
                let owner = self.clusters.iter().find(|k| {
                    k.mem[p as usize].prot == Prot::Rw && spec.cfg.protocol == Protocol::Sc
                });
                let home = self
                    .clusters
                    .iter()
                    .find(|k| k.machine.home_of(pid) == Some(k.machine.me()));
                let holder = owner.or(home);
                let mut data = match holder {
                    Some(k) if k.machine.access(pid) != Some(PageAccess::Untouched) => {
                        k.mem[p as usize].data.clone()
                    }
                    _ => vec![0; spec.words],
                };
                for k in &self.clusters {
                    let pg = &k.mem[p as usize];
                    if let Some(twin) = &pg.twin {
                        for (w, (&cur, &old)) in pg.data.iter().zip(twin).enumerate() {
                            if cur != old {
                                data[w] = cur;
                            }
                        }
                    }
                }
                data
            })
            .collect()
    }

    /// The ghost memory (last write of each word).
    pub fn ghost_memory(&self, spec: &Spec) -> Vec<Vec<u64>> {
        let mut m = vec![vec![0; spec.words]; spec.cfg.pages as usize];
        for (&(p, w), g) in &self.ghost.mem {
            m[p as usize][w] = g.value;
        }
        m
    }

    /// At a terminal state: machines quiescent and memory equal to the ghost.
    pub fn check_terminal(&self, spec: &Spec) -> Result<(), String> {
        for (i, k) in self.clusters.iter().enumerate() {
            if !k.machine.is_quiescent() {
                return Err(format!("cluster {i} not quiescent at the end"));
            }
        }
        let got = self.final_memory(spec);
        let want = self.ghost_memory(spec);
        if got != want {
            return Err(format!("final memory {got:?} != expected {want:?}"));
        }
        Ok(())
    }

    /// sc invariant: per page, at most one writable copy, and then no other valid
    /// copy; every valid copy equals the last write.
    pub fn check_sc(&self, spec: &Spec) -> Result<(), String> {
        for (p, latest) in self.ghost_memory(spec).iter().enumerate() {
            let writers = self
                .clusters
                .iter()
                .filter(|k| k.mem[p].prot == Prot::Rw)
                .count();
            let valid = self
                .clusters
                .iter()
                .filter(|k| k.mem[p].prot != Prot::None)
                .count();
            if writers > 1 || (writers == 1 && valid > 1) {
                return Err(format!("page {p}: {writers} writers, {valid} valid copies"));
            }
            for (i, k) in self.clusters.iter().enumerate() {
                if k.mem[p].prot != Prot::None && &k.mem[p].data != latest {
                    return Err(format!(
                        "page {p} at cluster {i} is {:?}, latest is {latest:?}",
                        k.mem[p].data
                    ));
                }
            }
        }
        Ok(())
    }

    /// hlrc invariant of private home pages: a home page held writable without a twin
    /// (its writes are not tracked) has a copyset naming no other cluster, and no
    /// other cluster holds a valid copy — except a cluster waiting at a barrier, whose
    /// copy of a page that migrated meanwhile is dropped by the departure before any
    /// of its threads runs again.
    pub fn check_private_pages(&self, spec: &Spec) -> Result<(), String> {
        if spec.cfg.protocol != Protocol::Hlrc {
            return Ok(());
        }
        for p in 0..spec.cfg.pages {
            let pid = page(p);
            for (h, k) in self.clusters.iter().enumerate() {
                let me = k.machine.me();
                let pg = &k.mem[p as usize];
                if k.machine.home_of(pid) != Some(me) || pg.prot != Prot::Rw || pg.twin.is_some() {
                    continue;
                }
                if k.machine.copyset(pid).iter().any(|&c| c != me) {
                    return Err(format!(
                        "page {p} is writable without a twin at its home {h}, but its copyset is {:?}",
                        k.machine.copyset(pid)
                    ));
                }
                for (i, other) in self.clusters.iter().enumerate() {
                    if i == h || other.mem[p as usize].prot == Prot::None {
                        continue;
                    }
                    let at_barrier = self
                        .threads
                        .iter()
                        .filter(|t| usize::from(t.cluster) == i)
                        .all(|t| t.block == Block::Barrier);
                    if !at_barrier {
                        return Err(format!(
                            "page {p} is private and writable at its home {h}, but cluster {i} holds a copy"
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// hlrc invariant: the machine's view of twins matches the memory (a page has a
    /// twin exactly when the machine says so, and then it is writable).
    pub fn check_twins(&self, spec: &Spec) -> Result<(), String> {
        if spec.cfg.protocol != Protocol::Hlrc {
            return Ok(());
        }
        for (i, k) in self.clusters.iter().enumerate() {
            for p in 0..spec.cfg.pages {
                let pg = &k.mem[p as usize];
                if k.machine.has_twin(page(p)) != pg.twin.is_some()
                    || (pg.twin.is_some() && pg.prot != Prot::Rw)
                {
                    return Err(format!(
                        "cluster {i} page {p}: machine twin {}, memory {:?}/{}",
                        k.machine.has_twin(page(p)),
                        pg.prot,
                        pg.twin.is_some()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Runs the job to completion with `choose(n)` picking among `n` enabled steps;
    /// returns an error on a violated check or a deadlock.
    pub fn run(spec: &Spec, mut choose: impl FnMut(usize) -> usize) -> Result<World, String> {
        let mut w = World::new(spec);
        let mut steps = 0u64;
        loop {
            if let Some(e) = &w.error {
                return Err(e.clone());
            }
            if spec.cfg.protocol == Protocol::Sc {
                w.check_sc(spec)?;
            }
            w.check_private_pages(spec)?;
            w.check_twins(spec)?;
            let threads = w.runnable(spec);
            let packets = w.deliverable();
            let n = threads.len() + packets.len();
            if n == 0 {
                if w.is_terminal(spec) {
                    w.check_terminal(spec)?;
                    return Ok(w);
                }
                return Err(format!(
                    "deadlock: threads {:?}, network {:?}",
                    w.threads, w.net
                ));
            }
            let i = choose(n);
            if i < threads.len() {
                let t = threads[i];
                w.step_thread(spec, t);
            } else {
                w.deliver(spec, packets[i - threads.len()]);
            }
            steps += 1;
            if steps > 10_000_000 {
                return Err("livelock".into());
            }
        }
    }
}
