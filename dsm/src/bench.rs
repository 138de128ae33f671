//! Measurement kernels of the DSM runtime, shared by the criterion benchmarks
//! (`dsm/benches/dsm.rs`) and any command that reports them, so both measure the same
//! code beside its baselines in the same run.
//!
//! Every kernel times single operations and returns their durations in nanoseconds;
//! [`summarize`] gives the median and spread. The kernels:
//!
//! * baselines: [`udp_round_trips`] (two threads, UDP on loopback, 8-byte messages,
//!   busy-polled or with blocking sockets) and [`udp_page_round_trips`] (the same with
//!   a 4 KiB answer), [`BareFault`] (a read of a missing page served in the faulting
//!   thread with `UFFDIO_COPY`, no protocol), [`BareWriteFault`] (a write to a
//!   write-protected page, the protection lifted in the writing thread) and
//!   [`PageCopy`] (copying a 4 KiB page);
//! * [`Pair`]: a two-cluster job in this process (shared-memory substrate): local fault
//!   service, remote read fault, write fault (twin + unprotect), release (barrier) cost
//!   per page;
//! * [`LockHandoff`]: a lock passed back and forth between two clusters in this process
//!   (over shared memory or INIs), each holder checking and rewriting the 64 bytes it
//!   protects; built on the public API only ([`Dsm`], [`Worker::lock`](crate::Worker::lock),
//!   [`SharedArray`], [`DsmOptions`]);
//! * [`BarrierPair`]: two clusters in this process (over shared memory or INIs) passing
//!   barriers with nothing written between them, the synchronization alone;
//! * [`diff_encode`], [`diff_apply`]: diff throughput on 4 KiB pages with a given share
//!   of words changed, and their baseline [`page_copy_warm`];
//! * [`ApplyChoice`]: the two ways a home can apply a diff without changing what its
//!   application threads see (shared-memory runtime view vs. write-protect → copy → zap
//!   → reinstall on anonymous memory), and the install/invalidate costs of both
//!   backings.

use crate::SharedArray;
use crate::error::DsmError;
use crate::runtime::{Dsm, DsmOptions};
use crate::transport::local_transports;
use crate::uffd::{
    Backing, Fault, FaultKind, PAGE_SIZE, PageIndex, PageRange, Protection, Region, RegionConfig,
    RegionOps,
};
use multigrain_bench::network::UdpWait;
use multigrain_cluster_config::{HomePolicy, JobConfig, Protocol};
use multigrain_coherence::copy::copy_bytes;
use multigrain_coherence::diff;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Median and spread of a set of samples, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// 10th percentile.
    pub p10: f64,
    /// Median.
    pub median: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Mean.
    pub mean: f64,
}

/// Percentiles of `samples` (nanoseconds), reported in microseconds. All zero for no
/// samples.
pub fn summarize(samples: &[u64]) -> Summary {
    if samples.is_empty() {
        return Summary {
            n: 0,
            p10: 0.0,
            median: 0.0,
            p90: 0.0,
            p99: 0.0,
            mean: 0.0,
        };
    }
    let mut v = samples.to_vec();
    v.sort_unstable();
    let q = |f: f64| v[((v.len() - 1) as f64 * f).round() as usize] as f64 / 1000.0;
    Summary {
        n: v.len(),
        p10: q(0.10),
        median: q(0.50),
        p90: q(0.90),
        p99: q(0.99),
        mean: v.iter().sum::<u64>() as f64 / v.len() as f64 / 1000.0,
    }
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// Baseline: `n` round trips of 8-byte datagrams between two threads on loopback,
/// waiting as `wait` says; one sample per round trip (ns). The two threads are pinned to
/// different CPUs (as the two ends of the INI benchmarks are), the placement of two
/// clusters. With blocking sockets (the *weak* baseline) every arrival wakes a sleeping
/// thread: ≈ 45 µs a round trip on the development VM, a quarter of that when the
/// scheduler puts both threads on one CPU; busy-polled (non-blocking `recv` in a spin
/// loop), a round trip costs the kernel's UDP path alone.
///
/// # Panics
/// If the sockets cannot be set up or a datagram is lost (loopback does not lose them).
pub fn udp_round_trips(n: usize, wait: UdpWait) -> Vec<u64> {
    multigrain_bench::network::udp_round_trips(n, 8, wait)
}

/// Baseline: as [`udp_round_trips`], but each 8-byte datagram is answered by a
/// [`PAGE_SIZE`]-byte one, the shape of a remote read fault's messages (a request, a
/// page back) without any protocol around them: no headers, no sealing, no copy into
/// a page. The floor of a page fetched over UDP, beside the 8-byte one.
///
/// # Panics
/// As [`udp_round_trips`].
pub fn udp_page_round_trips(n: usize, wait: UdpWait) -> Vec<u64> {
    multigrain_bench::network::udp_request_reply_round_trips(n, 8, PAGE_SIZE, wait)
}

/// Baseline: copying a 4 KiB page, what a page reply costs beyond its messages (into a
/// pool buffer at the home, or between processes over shared memory), through
/// [`multigrain_coherence::copy::copy_bytes`] (never the slow `memcpy` path). Copies run
/// between two buffers of [`PageCopy::PAGES`] pages each (1 MiB: a page is not still in
/// the first-level cache when it is copied again), page after page.
pub struct PageCopy {
    from: Vec<u8>,
    to: Vec<u8>,
    next: usize,
}

impl Default for PageCopy {
    fn default() -> Self {
        Self::new()
    }
}

impl PageCopy {
    /// Pages in each buffer.
    pub const PAGES: usize = 256;

    /// Two buffers, every page of both written once (no first-touch faults timed).
    pub fn new() -> PageCopy {
        let len = Self::PAGES * PAGE_SIZE;
        PageCopy {
            from: (0..len).map(|i| (i * 31) as u8).collect(),
            to: vec![1u8; len],
            next: 0,
        }
    }

    /// Times `n` page copies; returns the mean per copy (ns). One clock read per batch:
    /// a clock read costs a sizeable share of a copy.
    pub fn copies(&mut self, n: usize) -> f64 {
        let n = n.max(1);
        let t = Instant::now();
        for _ in 0..n {
            let p = self.next * PAGE_SIZE;
            self.next = (self.next + 1) % Self::PAGES;
            copy_bytes(
                &mut self.to[p..p + PAGE_SIZE],
                black_box(&self.from[p..p + PAGE_SIZE]),
            );
            black_box(&self.to[p]);
        }
        t.elapsed().as_nanos() as f64 / n as f64
    }
}

static FILLED: [u8; PAGE_SIZE] = [0x5A; PAGE_SIZE];

/// A benchmark's region could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BenchRegionError {
    /// Creating the region failed.
    #[error(transparent)]
    Region(#[from] crate::uffd::RegionError),
    /// A page operation preparing it failed.
    #[error(transparent)]
    Op(#[from] crate::uffd::OpError),
}

/// Baseline: a bare userfaultfd fault — a read of a missing page of an anonymous region,
/// delivered as `SIGBUS` to the faulting thread, which installs the page read-only with
/// `UFFDIO_COPY`. No protocol, no messages.
pub struct BareFault {
    region: Region,
    next: usize,
}

impl BareFault {
    /// Pages in the region; it is invalidated in one call when all were touched.
    pub const PAGES: usize = 4096;

    /// A region of [`BareFault::PAGES`] pages of private anonymous memory at `base`: the
    /// cheapest install (`UFFDIO_COPY` into an anonymous page), the baseline the issue's
    /// targets name.
    ///
    /// # Errors
    /// If the region cannot be created.
    pub fn new(base: usize) -> Result<Self, crate::uffd::RegionError> {
        Self::with_backing(base, Backing::Anonymous)
    }

    /// The same on `backing`: [`Backing::SharedMemory`] is what the DSM runtime's regions
    /// use (a memfd with a second, unregistered view through which homes apply diffs), whose
    /// `UFFDIO_COPY` also inserts the page into the memfd's page cache (≈ 0.6 µs more a
    /// fault on the Zen 5 VM, forty-fourth session: 4.5 against 3.9 µs).
    ///
    /// # Errors
    /// If the region cannot be created.
    pub fn with_backing(base: usize, backing: Backing) -> Result<Self, crate::uffd::RegionError> {
        Self::build(RegionConfig::new(base, Self::PAGES * PAGE_SIZE).with_backing(backing))
    }

    /// The same as the DSM runtime's regions install pages: shared memory with minor
    /// faults where the kernel offers them (Linux ≥ 6.4), every page populated up front
    /// as `dsm.populate` does, so each fault writes the page through the runtime view and
    /// maps it with `UFFDIO_CONTINUE` (3.7 against 4.45 µs for `UFFDIO_COPY` on shared
    /// memory and 3.8 µs on anonymous memory, a throwaway loop on the Zen 5 VM, 46th
    /// session). Without minor faults it is [`BareFault::with_backing`] on shared memory.
    ///
    /// # Errors
    /// If the region cannot be created or populated.
    pub fn like_dsm(base: usize) -> Result<Self, BenchRegionError> {
        let bare = Self::build(
            RegionConfig::new(base, Self::PAGES * PAGE_SIZE)
                .with_backing(Backing::SharedMemory)
                .with_minor_faults(true),
        )?;
        if bare.region.minor_faults() {
            bare.region
                .populate(PageRange::new(PageIndex(0), Self::PAGES))?;
        }
        Ok(bare)
    }

    fn build(config: RegionConfig) -> Result<Self, crate::uffd::RegionError> {
        let resolver = |r: &RegionOps, f: Fault| {
            if f.kind == FaultKind::Missing {
                let _ = r.install(f.page, &FILLED, Protection::ReadOnly);
            }
        };
        let region = Region::new(config, Arc::new(resolver))?;
        Ok(BareFault { region, next: 0 })
    }

    /// Times one read fault (ns).
    pub fn fault(&mut self) -> u64 {
        if self.next == Self::PAGES {
            self.region
                .invalidate(PageRange::new(PageIndex(0), Self::PAGES))
                .expect("invalidate");
            self.next = 0;
        }
        let p = self.region.as_ptr().wrapping_add(self.next * PAGE_SIZE);
        self.next += 1;
        let t = Instant::now();
        // SAFETY: `p` is a page of the mapped region; the fault is served by the
        // resolver above.
        black_box(unsafe { p.read_volatile() });
        ns(t.elapsed())
    }
}

/// Baseline: a bare userfaultfd write-protect fault — a write to a present,
/// write-protected page of a shared-memory region (the runtime's backing), delivered as
/// `SIGBUS` to the writing thread, which lifts the protection of that page with
/// `UFFDIO_WRITEPROTECT`. No protocol, no twin: the floor under the DSM's write fault.
pub struct BareWriteFault {
    region: Region,
    next: usize,
}

impl BareWriteFault {
    /// Pages in the region; all are protected again in one call when all were written.
    pub const PAGES: usize = 4096;

    /// A region of [`BareWriteFault::PAGES`] pages at `base`, every page present (written
    /// once, not timed).
    ///
    /// # Errors
    /// If the region cannot be created.
    pub fn new(base: usize) -> Result<Self, crate::uffd::RegionError> {
        let resolver = |r: &RegionOps, f: Fault| match f.kind {
            FaultKind::Missing => {
                let _ = r.install(f.page, &FILLED, Protection::Writable);
            }
            FaultKind::WriteProtect => {
                let _ = r.unprotect(PageRange::one(f.page));
            }
        };
        let region = Region::new(
            RegionConfig::new(base, Self::PAGES * PAGE_SIZE).with_backing(Backing::SharedMemory),
            Arc::new(resolver),
        )?;
        for p in 0..Self::PAGES {
            // SAFETY: `p` is a page of the mapped region; the missing fault is served by
            // the resolver above.
            unsafe { region.as_ptr().add(p * PAGE_SIZE).write_volatile(1) };
        }
        Ok(BareWriteFault {
            region,
            next: Self::PAGES,
        })
    }

    /// Times one write-protect fault (ns).
    pub fn fault(&mut self) -> u64 {
        if self.next == Self::PAGES {
            self.region
                .write_protect(PageRange::new(PageIndex(0), Self::PAGES))
                .expect("write-protect");
            self.next = 0;
        }
        let p = self.region.as_ptr().wrapping_add(self.next * PAGE_SIZE + 8);
        self.next += 1;
        let t = Instant::now();
        // SAFETY: `p` is inside a present page of the mapped region; the write-protect
        // fault is served by the resolver above.
        unsafe { p.write_volatile(self.next as u8) };
        ns(t.elapsed())
    }
}

/// A two-cluster job in this process, connected through shared memory: cluster 0 is
/// measured (from the calling thread), cluster 1 is the home of the upper half of the
/// region (block home policy) and serves it from its protocol thread — or, in
/// [`Pair::remote_read_faults_home_polling`], from its compute thread waiting in the
/// runtime.
pub struct Pair {
    a: Option<Dsm>,
    b: Option<Dsm>,
    a_words: SharedArray<u64>,
    b_words: SharedArray<u64>,
    /// Next remote page to read (index into the upper half).
    next_remote: usize,
    /// Next untouched local page (lower half).
    next_local: usize,
    round: u64,
    /// The INIs when the pair runs over the network; declared last so they are dropped
    /// after the clusters.
    _inis: Vec<multigrain_messaging::net::IniGroup>,
}

const WORDS_PER_PAGE: usize = PAGE_SIZE / 8;

impl Pair {
    /// Region size of a pair: 64 MiB, 8192 pages homed at each cluster.
    pub const REGION: usize = 64 << 20;
    /// How long the pair's threads poll while they wait before they sleep
    /// ([`DsmOptions::wait_spin`]): long enough that cluster 1's thread, waiting at a
    /// barrier in [`Pair::remote_read_faults_home_polling`], polls through a whole batch
    /// of faults (a job's default, 1 ms, is over after about 70 of them).
    pub const WAIT_SPIN: Duration = Duration::from_secs(10);
    /// How long cluster 0 sleeps after cluster 1's thread entered its barrier, before the
    /// first timed fault: the arrival it sent is handled by then.
    const SETTLE: Duration = Duration::from_millis(5);
    /// Pages homed at each cluster.
    pub const HALF: usize = Self::REGION / PAGE_SIZE / 2;

    /// Builds the pair with `protocol`, its regions at `base` and `base + 2^32`; the
    /// pages homed at cluster 1 hold data (written by it), so replies carry whole pages.
    ///
    /// # Errors
    /// If a cluster cannot join.
    pub fn new(protocol: Protocol, base: usize) -> Result<Pair, DsmError> {
        Pair::over(protocol, base, false)
    }

    /// As [`Pair::new`]; with `network`, the two clusters talk through INI threads over
    /// UDP on loopback (one INI each, MTU 8972) instead of shared memory.
    ///
    /// # Errors
    /// If a cluster cannot join.
    pub fn over(protocol: Protocol, base: usize, network: bool) -> Result<Pair, DsmError> {
        let mut cfg = JobConfig::local(2, 1);
        cfg.dsm.protocol = protocol;
        cfg.dsm.home = HomePolicy::Block;
        cfg.dsm.region_size = Self::REGION as u64;
        // Each timed fault is one request and one page: no prefetch of the next pages
        // (which the following samples read).
        cfg.dsm.prefetch = 0;
        // Nor write-ahead: each timed write is one write fault (the pages are written in
        // order, which write-ahead would open ahead of the writes).
        cfg.dsm.write_ahead = 0;
        cfg.ini.mtu = 8972;
        let (mut a, mut b, inis) = join_two(&cfg, base, network, Some(Self::WAIT_SPIN))?;
        let words = Self::REGION / 8;
        let a_words = a.alloc::<u64>(words)?;
        let b_words = b.alloc::<u64>(words)?;
        let mut pair = Pair {
            _inis: inis,
            a: Some(a),
            b: Some(b),
            a_words,
            b_words,
            next_remote: 0,
            next_local: 0,
            round: 0,
        };
        pair.refill()?;
        Ok(pair)
    }

    fn a(&self) -> &Dsm {
        self.a.as_ref().expect("the pair is live until finish")
    }

    /// The home (cluster 1) writes every page it owns, then both clusters pass a
    /// barrier: cluster 0's copies are invalidated (one call), the next reads fetch
    /// whole pages.
    fn refill(&mut self) -> Result<(), DsmError> {
        self.round += 1;
        let (round, words) = (self.round, &self.b_words);
        let (a, b) = (self.a(), self.b.as_ref().expect("live"));
        let (ra, rb) = std::thread::scope(|s| {
            let hb = s.spawn(|| {
                for p in Self::HALF..2 * Self::HALF {
                    words.set(p * WORDS_PER_PAGE + 1, round);
                }
                b.barrier()
            });
            (a.barrier(), hb.join().expect("cluster 1 thread"))
        });
        ra?;
        rb?;
        self.next_remote = 0;
        Ok(())
    }

    /// A remote page not valid here, fetched by the next read (refills when all were
    /// read).
    fn next_remote_page(&mut self, need: usize) -> Result<usize, DsmError> {
        if self.next_remote + need > Self::HALF {
            self.refill()?;
        }
        self.next_remote += need;
        Ok(Self::HALF + self.next_remote - need)
    }

    fn read_remote(&self, page: usize) -> u64 {
        let v = self.a_words.get(page * WORDS_PER_PAGE + 1);
        assert_eq!(v, self.round, "remote page {page} has stale contents");
        v
    }

    /// Times `n` reads of pages homed at the other cluster and not valid here, each a
    /// fault served with a request to the home and a page reply; `idle` is slept
    /// (untimed) before each, to let both clusters' threads fall asleep (ns).
    ///
    /// # Errors
    /// If the job fails.
    pub fn remote_read_faults(&mut self, n: usize, idle: Duration) -> Result<Vec<u64>, DsmError> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let page = self.next_remote_page(1)?;
            if !idle.is_zero() {
                std::thread::sleep(idle);
            }
            let t = Instant::now();
            black_box(self.read_remote(page));
            out.push(ns(t.elapsed()));
        }
        Ok(out)
    }

    /// As [`Pair::remote_read_faults`] with nothing slept, while the home's compute
    /// thread waits in the runtime (at a barrier that cluster 0 joins after the last
    /// read) and serves each request as it polls its queues (paper 000 §3.3): no thread
    /// is woken, as in the Express round trip the fault is compared with. In an
    /// application this is the home whose threads wait for a lock, a page or a barrier;
    /// [`Pair::remote_read_faults`] is the home whose threads all sleep or compute,
    /// served by its protocol thread, woken by the request. The faulting thread and the
    /// home's thread are pinned to different CPUs, as the ends of the baselines'
    /// ping-pongs are: confined to one CPU (`taskset -c 0`) each fault took ≈ 23 µs, the
    /// faulting thread's yields not handing the CPU to the home's thread for ≈ 20 µs
    /// (Linux's EEVDF scheduler; forty-first session).
    ///
    /// # Errors
    /// If the job fails.
    pub fn remote_read_faults_home_polling(&mut self, n: usize) -> Result<Vec<u64>, DsmError> {
        let pages = (0..n)
            .map(|_| self.next_remote_page(1))
            .collect::<Result<Vec<_>, _>>()?;
        let (a, b) = (self.a(), self.b.as_ref().expect("live"));
        let this = &*self;
        let (ra, rb) = std::thread::scope(|s| {
            let hb = s.spawn(|| {
                let _pin = multigrain_bench::pin_to_cpu(1);
                b.barrier()
            });
            let _pin = multigrain_bench::pin_to_cpu(0);
            std::thread::sleep(Self::SETTLE);
            let out: Vec<u64> = pages
                .iter()
                .map(|&page| {
                    let t = Instant::now();
                    black_box(this.read_remote(page));
                    ns(t.elapsed())
                })
                .collect();
            (
                a.barrier().map(|()| out),
                hb.join().expect("cluster 1 thread"),
            )
        });
        rb?;
        ra
    }

    /// Times up to `n` reads of untouched pages homed here (zero-filled locally, no
    /// messages); fewer when every local page has been touched (build a new pair).
    pub fn local_read_faults(&mut self, n: usize) -> Vec<u64> {
        let n = n.min(Self::HALF - self.next_local);
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let i = self.next_local * WORDS_PER_PAGE;
            self.next_local += 1;
            let t = Instant::now();
            let v = self.a_words.get(i);
            out.push(ns(t.elapsed()));
            assert_eq!(v, 0);
        }
        out
    }

    /// Times `n` first writes to pages held read-only here and homed at the other
    /// cluster, inside a held lock: hlrc makes a twin and unprotects (ns); under sc it
    /// is an ownership request to the home. The pages are fetched (untimed) in batches
    /// of 256, written, and released.
    ///
    /// # Errors
    /// If the job fails.
    pub fn write_faults(&mut self, n: usize) -> Result<Vec<u64>, DsmError> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let batch = (n - out.len()).min(256);
            let first = self.next_remote_page(batch)?;
            for p in first..first + batch {
                black_box(self.read_remote(p));
            }
            let g = self.a().lock(0)?;
            for p in first..first + batch {
                let t = Instant::now();
                self.a_words.set(p * WORDS_PER_PAGE + 2, self.round);
                out.push(ns(t.elapsed()));
            }
            g.unlock()?;
        }
        Ok(out)
    }

    /// Fetches `pages` remote pages, writes one word in each, and times the release
    /// that flushes them: write-protect, diff and send each page to its home. The
    /// release is a barrier of both clusters (a lock released here stays cached in the
    /// cluster and flushes nothing until another cluster asks for it): cluster 0's
    /// flush before its arrival, from its own statistics
    /// ([`crate::PhaseTimes::barrier_flush_ns`]), divided by `pages` (ns per page).
    /// The homes apply the diffs after the arrival, before the departure; that is not
    /// counted. (A barrier's time with the dirty pages minus that of a clean one read
    /// 0 in two of three samples of a short run: the clean barrier's wait for the
    /// other cluster's thread outweighed the flush.)
    ///
    /// # Errors
    /// If the job fails.
    pub fn release_per_page(&mut self, pages: usize) -> Result<u64, DsmError> {
        let pages = pages.clamp(1, 512);
        let first = self.next_remote_page(pages)?;
        for p in first..first + pages {
            black_box(self.read_remote(p));
        }
        // Flush whatever earlier measurements left dirty.
        self.both_barrier()?;
        for p in first..first + pages {
            self.a_words.set(p * WORDS_PER_PAGE + 3, self.round);
        }
        let flushed = || self.a().stats().time.barrier_flush_ns;
        let before = flushed();
        self.both_barrier()?;
        Ok((flushed() - before) / pages as u64)
    }

    /// A barrier of both clusters.
    fn both_barrier(&self) -> Result<(), DsmError> {
        let (a, b) = (self.a(), self.b.as_ref().expect("live"));
        let (ra, rb) = std::thread::scope(|s| {
            let hb = s.spawn(|| b.barrier());
            (a.barrier(), hb.join().expect("cluster 1 thread"))
        });
        ra?;
        rb
    }

    /// Finishes both clusters and returns the job's statistics.
    ///
    /// # Errors
    /// If the job fails.
    pub fn finish(mut self) -> Result<crate::JobStats, DsmError> {
        finish_two(self.a.take().expect("live"), self.b.take().expect("live"))
    }
}

/// Why a lock hand-off run failed.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    /// The job failed.
    #[error(transparent)]
    Dsm(#[from] DsmError),
    /// A holder found the protected words not as the previous holder left them.
    #[error(
        "lock hand-off: cluster {cluster} read {found:x?} under the lock, expected {expected:x?} \
         (update {update} by the previous holder): the protocol lost or tore the previous \
         holder's writes"
    )]
    Corrupt {
        /// The cluster that read them.
        cluster: usize,
        /// The update it expected to read.
        update: u64,
        /// What update `update` wrote.
        expected: Box<[u64; HANDOFF_WORDS]>,
        /// What it read.
        found: Box<[u64; HANDOFF_WORDS]>,
    },
    /// The other cluster found corrupt words and stopped.
    #[error("lock hand-off: cluster {cluster} stopped: the other cluster read corrupt words")]
    PeerStopped {
        /// The cluster that stopped.
        cluster: usize,
    },
    /// A cluster waited too long for its turn.
    #[error(
        "lock hand-off: cluster {cluster} waited {waited:?} for its turn after update {update}"
    )]
    Stuck {
        /// The waiting cluster.
        cluster: usize,
        /// The last update it saw.
        update: u64,
        /// How long it waited.
        waited: Duration,
    },
}

/// Words (of 8 bytes) that [`LockHandoff`]'s lock protects: 64 bytes.
pub const HANDOFF_WORDS: usize = 8;

/// The protected words after update `u` (0: as allocated, all zero): word 0 is `u`, the
/// others a mix of `u` and their index, so a torn or stale copy does not pass for a
/// whole one.
pub fn handoff_words(u: u64) -> [u64; HANDOFF_WORDS] {
    let mut w = [0u64; HANDOFF_WORDS];
    if u == 0 {
        return w;
    }
    w[0] = u;
    for (k, x) in w.iter_mut().enumerate().skip(1) {
        *x = u
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(k as u32 * 8)
            ^ k as u64;
    }
    w
}

/// Word 0 of a holder that found corrupt words: the other cluster stops when it reads it.
const POISON: u64 = u64::MAX;

/// How long a cluster waits for its turn before it reports the hand-off stuck.
const TURN_TIMEOUT: Duration = Duration::from_secs(60);

/// Joins the two clusters of `cfg` (a job of two clusters of one thread each) in this
/// process, one thread each, their regions at `base` and `base + 2^32`: with
/// `network`, through one INI each over UDP on loopback (returned, to be dropped after
/// the clusters), else through shared memory; their threads poll for `wait_spin` while
/// they wait ([`DsmOptions::wait_spin`]; `None`: the configuration's `dsm.wait_spin_us`).
fn join_two(
    cfg: &JobConfig,
    base: usize,
    network: bool,
    wait_spin: Option<Duration>,
) -> Result<(Dsm, Dsm, Vec<multigrain_messaging::net::IniGroup>), DsmError> {
    let config_error = |cluster: usize, reason: String| DsmError::Config { cluster, reason };
    let (ts, inis) = if network {
        crate::transport::loopback_network_transports(cfg)
            .map_err(|e| config_error(0, e.to_string()))?
    } else {
        (
            local_transports(cfg).map_err(|e| config_error(e.cluster, e.to_string()))?,
            Vec::new(),
        )
    };
    let mut dsms = std::thread::scope(|s| {
        let hs: Vec<_> = ts
            .into_iter()
            .enumerate()
            .map(|(c, t)| {
                s.spawn(move || {
                    let o = DsmOptions {
                        region_base: Some(base + (c << 32)),
                        wait_spin,
                        ..DsmOptions::default()
                    };
                    Dsm::join_with(t, cfg, o)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("join thread"))
            .collect::<Result<Vec<_>, _>>()
    })?;
    let b = dsms.pop().expect("two clusters");
    let a = dsms.pop().expect("two clusters");
    Ok((a, b, inis))
}

/// Finishes the two clusters of [`join_two`] together (each waits for the other's
/// end of the job) and returns the job's statistics, as cluster 0 gathered them.
fn finish_two(a: Dsm, b: Dsm) -> Result<crate::JobStats, DsmError> {
    let (ra, rb) = std::thread::scope(|s| {
        let hb = s.spawn(|| b.finish());
        (a.finish(), hb.join().expect("cluster 1 thread"))
    });
    rb?;
    ra
}

/// A lock passed back and forth between two clusters of a job in this process (over
/// shared memory, or through INIs over UDP loopback), one compute thread each, pinned to
/// different CPUs. The lock protects [`HANDOFF_WORDS`] words (64 bytes); updates take
/// turns: update *u* is made by cluster *(u − 1) mod 2*, which takes the lock, checks that
/// the words are exactly what update *u − 1* wrote ([`handoff_words`]), writes those of
/// update *u*, and releases. A holder whose turn it is not releases at once, yields its
/// CPU, and takes the lock again ([`LockHandoff::lock_acquires`] counts these). Each update therefore follows a hand-off of the lock from the other
/// cluster, with the 64 bytes it protects; a broken protocol fails loudly
/// ([`HandoffError::Corrupt`]) instead of measuring garbage.
///
/// Built on the runtime's public API only ([`Dsm::join_with`], [`Dsm::alloc`],
/// [`Dsm::run`], [`Worker::lock`](crate::Worker::lock), [`SharedArray`], [`DsmOptions`]).
pub struct LockHandoff {
    a: Option<Dsm>,
    b: Option<Dsm>,
    words: [SharedArray<u64>; 2],
    /// Updates made so far (what word 0 holds).
    updates: u64,
    /// The INIs when the job runs over the network; declared last so that they are
    /// dropped after the clusters.
    _inis: Vec<multigrain_messaging::net::IniGroup>,
}

impl LockHandoff {
    /// The lock's id.
    pub const LOCK: u32 = 0;

    /// A two-cluster job with `protocol` (round-robin homes: the words' page is homed at
    /// cluster 0), its regions at `base` and `base + 2^32`; with `network`, the clusters
    /// talk through one INI each over UDP on loopback (MTU 8972), else through shared
    /// memory.
    ///
    /// # Errors
    /// If a cluster cannot join or allocate.
    pub fn new(protocol: Protocol, base: usize, network: bool) -> Result<LockHandoff, DsmError> {
        let mut cfg = JobConfig::local(2, 1);
        cfg.dsm.protocol = protocol;
        cfg.dsm.region_size = 1 << 20;
        cfg.ini.mtu = 8972;
        let (mut a, mut b, inis) = join_two(&cfg, base, network, None)?;
        let words = [
            a.alloc::<u64>(HANDOFF_WORDS)?,
            b.alloc::<u64>(HANDOFF_WORDS)?,
        ];
        Ok(LockHandoff {
            a: Some(a),
            b: Some(b),
            words,
            updates: 0,
            _inis: inis,
        })
    }

    /// Updates made so far, over every call of [`LockHandoff::handoffs`].
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// `lock` calls by both clusters so far: at least one per update; the excess counts
    /// the holders that took the lock when it was not their turn (a hand-off protocol
    /// that gives a lock back to a cluster that just released it shows up here).
    pub fn lock_acquires(&self) -> u64 {
        [&self.a, &self.b]
            .into_iter()
            .flatten()
            .map(|d| d.stats().lock_acquires)
            .sum()
    }

    /// Makes `warm + n` more updates, taking turns (so as many hand-offs of the lock
    /// between the clusters), and returns the time of the last `n`: from the update
    /// that ends the `warm` untimed ones (with `warm` 0, from a barrier of both
    /// threads) to the last update. The warm-up is the ping-pong baselines' own
    /// ([`multigrain_bench::WARM_UP`] untimed round trips a sample): `multigrain bench
    /// dsm` runs every kernel once per round, and a hand-off started cold — caches,
    /// TLB and sleeping INI threads left to the kernels in between — took 4.0 µs over
    /// shared memory where consecutive rounds took 2.5 µs (a probe touching 64 MiB
    /// between rounds of 200; 2026-12-05).
    ///
    /// # Errors
    /// [`HandoffError::Corrupt`] if a holder finds the words not as the previous holder
    /// left them; [`HandoffError::Stuck`] if a turn never comes; the job's errors.
    pub fn handoffs(&mut self, warm: usize, n: usize) -> Result<Duration, HandoffError> {
        let first = self.updates;
        let timed_from = first + warm as u64;
        let last = timed_from + n as u64;
        let (a, b) = (
            self.a.as_ref().expect("live until finish"),
            self.b.as_ref().expect("live until finish"),
        );
        let (ra, rb) = std::thread::scope(|s| {
            let words = &self.words;
            let span = Turns {
                first,
                timed_from,
                last,
            };
            let hb = s.spawn(move || b.run(|w| take_turns(w, &words[1], span)));
            let ra = a.run(|w| take_turns(w, &words[0], span));
            (ra, hb.join().expect("cluster 1 thread"))
        });
        let (mut start, mut end) = (None::<Instant>, None::<Instant>);
        let mut peer_stopped = None;
        for r in [ra?, rb?].into_iter().flatten() {
            match r {
                Ok(t) => {
                    // The cluster that made update `timed_from` saw it first.
                    if let Some(s) = t.timed_from {
                        start = Some(start.map_or(s, |x| x.min(s)));
                    }
                    end = Some(end.map_or(t.last_mine, |x| x.max(t.last_mine)));
                }
                Err(e @ HandoffError::PeerStopped { .. }) => peer_stopped = Some(e),
                Err(e) => return Err(e),
            }
        }
        if let Some(e) = peer_stopped {
            return Err(e);
        }
        self.updates = last;
        Ok(match (start, end) {
            (Some(s), Some(e)) => e.saturating_duration_since(s),
            _ => Duration::ZERO,
        })
    }

    /// Finishes both clusters and returns the job's statistics.
    ///
    /// # Errors
    /// If the job fails.
    pub fn finish(mut self) -> Result<crate::JobStats, DsmError> {
        finish_two(self.a.take().expect("live"), self.b.take().expect("live"))
    }
}

/// Two clusters of a job in this process (over shared memory, or through INIs over UDP
/// loopback), one compute thread each, pinned to different CPUs, passing global
/// barriers with nothing written between them: what the synchronization alone costs —
/// each cluster's arrival at the barrier manager (cluster 0) and the departure, with the
/// coherence machine's handling at both ends (an empty flush, no write notices). An
/// application's barrier costs this plus the flush of what it wrote and the waiting for
/// the last cluster to arrive.
///
/// Built on the runtime's public API only ([`Dsm::join_with`], [`Dsm::run`],
/// [`Worker::barrier`](crate::Worker::barrier), [`DsmOptions`]).
pub struct BarrierPair {
    a: Option<Dsm>,
    b: Option<Dsm>,
    /// The INIs when the job runs over the network; declared last so that they are
    /// dropped after the clusters.
    _inis: Vec<multigrain_messaging::net::IniGroup>,
}

impl BarrierPair {
    /// A two-cluster job with `protocol`, its regions at `base` and `base + 2^32`; with
    /// `network`, the clusters talk through one INI each over UDP on loopback (MTU 8972),
    /// else through shared memory.
    ///
    /// # Errors
    /// If a cluster cannot join.
    pub fn new(protocol: Protocol, base: usize, network: bool) -> Result<BarrierPair, DsmError> {
        let mut cfg = JobConfig::local(2, 1);
        cfg.dsm.protocol = protocol;
        cfg.dsm.region_size = 1 << 20;
        cfg.ini.mtu = 8972;
        let (a, b, inis) = join_two(&cfg, base, network, None)?;
        Ok(BarrierPair {
            a: Some(a),
            b: Some(b),
            _inis: inis,
        })
    }

    /// Both clusters' threads pass `warm + n` barriers; returns the time of the last
    /// `n`, the longer of the two threads' (each starts its clock as it leaves the last
    /// untimed barrier). `warm` plays the part of the ping-pong baselines' untimed round
    /// trips ([`multigrain_bench::WARM_UP`]).
    ///
    /// # Errors
    /// The job's errors.
    pub fn barriers(&mut self, warm: usize, n: usize) -> Result<Duration, DsmError> {
        let (a, b) = (
            self.a.as_ref().expect("live until finish"),
            self.b.as_ref().expect("live until finish"),
        );
        let pass = |w: &crate::Worker<'_>| -> Result<Duration, DsmError> {
            let _pin = multigrain_bench::pin_to_cpu(w.cluster());
            for _ in 0..warm {
                w.barrier()?;
            }
            let t = Instant::now();
            for _ in 0..n {
                w.barrier()?;
            }
            Ok(t.elapsed())
        };
        let (ra, rb) = std::thread::scope(|s| {
            let hb = s.spawn(|| b.run(pass));
            (a.run(pass), hb.join().expect("cluster 1 thread"))
        });
        let mut longest = Duration::ZERO;
        for r in ra?.into_iter().chain(rb?) {
            longest = longest.max(r?);
        }
        Ok(longest)
    }

    /// Finishes both clusters and returns the job's statistics.
    ///
    /// # Errors
    /// If the job fails.
    pub fn finish(mut self) -> Result<crate::JobStats, DsmError> {
        finish_two(self.a.take().expect("live"), self.b.take().expect("live"))
    }
}

/// The updates of one [`LockHandoff::handoffs`] call: `first + 1 ..= last`, timed from
/// the moment update `timed_from` is made.
#[derive(Clone, Copy, Debug)]
struct Turns {
    first: u64,
    timed_from: u64,
    last: u64,
}

/// When one cluster saw update [`Turns::timed_from`] (made it, or found it made; `None`
/// if it never looked in between) and made its own last update.
struct TurnTimes {
    timed_from: Option<Instant>,
    last_mine: Instant,
}

/// One cluster's side of [`LockHandoff::handoffs`]: the updates of `span` that are its
/// own (update *u* belongs to cluster *(u − 1) mod 2*).
fn take_turns(
    w: &crate::Worker<'_>,
    words: &SharedArray<u64>,
    span: Turns,
) -> Result<TurnTimes, HandoffError> {
    let Turns {
        first,
        timed_from,
        last,
    } = span;
    let me = w.cluster();
    let _pin = multigrain_bench::pin_to_cpu(me);
    // My next update after `done` updates.
    let next_mine = |done: u64| {
        if done % 2 == me as u64 {
            done + 1
        } else {
            done + 2
        }
    };
    w.barrier()?;
    let t0 = Instant::now();
    let mut done = first;
    let mut since = t0;
    let mut mine_at = t0;
    let mut timed_at = (done >= timed_from).then_some(t0);
    while next_mine(done) <= last {
        let g = w.lock(LockHandoff::LOCK)?;
        let mut found = [0u64; HANDOFF_WORDS];
        words.read(0, &mut found);
        if found[0] == POISON {
            g.unlock()?;
            return Err(HandoffError::PeerStopped { cluster: me });
        }
        // Either nothing happened since this cluster last looked, or the other cluster
        // made its one update in between.
        let seen = found[0];
        let theirs = next_mine(done) != done + 1;
        let update = if seen == done + 1 && theirs {
            seen
        } else {
            done
        };
        let expected = handoff_words(update);
        if found != expected {
            words.set(0, POISON);
            g.unlock()?;
            return Err(HandoffError::Corrupt {
                cluster: me,
                update,
                expected: Box::new(expected),
                found: Box::new(found),
            });
        }
        if seen != done {
            done = seen;
            since = Instant::now();
        }
        if next_mine(done) == done + 1 {
            words.write(0, &handoff_words(done + 1));
            g.unlock()?;
            done += 1;
            mine_at = Instant::now();
            since = mine_at;
        } else {
            g.unlock()?;
            // Out of turn: let this CPU's other threads (the cluster's protocol thread,
            // which must pass the lock on) run before taking the lock again.
            std::thread::yield_now();
            let waited = since.elapsed();
            if waited > TURN_TIMEOUT {
                return Err(HandoffError::Stuck {
                    cluster: me,
                    update: done,
                    waited,
                });
            }
        }
        // When this cluster first made or saw update `timed_from` (`since`: the latest
        // update it made or saw); the maker's time is the earlier of the two clusters'.
        if done >= timed_from {
            timed_at.get_or_insert(since);
        }
    }
    Ok(TurnTimes {
        timed_from: timed_at,
        last_mine: mine_at,
    })
}

/// A twin and a current page that differ in `fraction` (0.0..=1.0) of their words,
/// spread evenly.
pub fn diff_pages(fraction: f64) -> (Vec<u8>, Vec<u8>) {
    let twin: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7) as u8).collect();
    let mut cur = twin.clone();
    change_words(&mut cur, fraction);
    (twin, cur)
}

/// Changes `fraction` (0.0..=1.0) of the words of `page`, spread evenly (the first byte
/// of each flipped).
fn change_words(page: &mut [u8], fraction: f64) {
    let changed = ((WORDS_PER_PAGE as f64 * fraction).round() as usize).min(WORDS_PER_PAGE);
    if changed > 0 {
        let step = WORDS_PER_PAGE as f64 / changed as f64;
        for k in 0..changed {
            page[(k as f64 * step) as usize * 8] ^= 0xFF;
        }
    }
}

/// Times `iters` encodings of the diff of `cur` against `twin` into a reused buffer;
/// one sample per encoding (ns).
pub fn diff_encode(twin: &[u8], cur: &[u8], iters: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(diff::MAX_ENCODED);
    (0..iters)
        .map(|_| {
            out.clear();
            let t = Instant::now();
            black_box(diff::encode(black_box(twin), black_box(cur), &mut out).expect("encode"));
            ns(t.elapsed())
        })
        .collect()
}

/// Baseline of [`diff_encode`] and [`diff_apply`]: times `iters` copies of `page` (4 KiB)
/// into a reused buffer, one sample per copy (ns) — the same page, as warm in the cache,
/// and the same clock read per sample as theirs; copied as the diffs copy, off the slow
/// `memcpy` path of [`multigrain_coherence::copy`], so that the baseline is never the
/// slow one. ([`PageCopy`] copies pages the first-level
/// cache no longer holds, as a page reply does.)
pub fn page_copy_warm(page: &[u8], iters: usize) -> Vec<u64> {
    let mut to = vec![0u8; page.len()];
    (0..iters)
        .map(|_| {
            let t = Instant::now();
            copy_bytes(&mut to, black_box(page));
            black_box(&to);
            ns(t.elapsed())
        })
        .collect()
}

/// Times `iters` applications of the diff of `cur` against `twin` to a page; one sample
/// per application (ns).
pub fn diff_apply(twin: &[u8], cur: &[u8], iters: usize) -> Vec<u64> {
    let d = diff::create(twin, cur).expect("diff");
    let mut page = twin.to_vec();
    (0..iters)
        .map(|_| {
            let t = Instant::now();
            black_box(diff::apply(&mut page, &d).expect("apply"));
            ns(t.elapsed())
        })
        .collect()
}

/// The two ways a home can apply a diff to a page its application threads see
/// read-only, and the page-operation costs of both backings.
pub struct ApplyChoice {
    shared: Region,
    anon: Region,
}

impl ApplyChoice {
    /// Pages per region.
    pub const PAGES: usize = 1024;

    /// Two regions of [`ApplyChoice::PAGES`] pages at `base` (shared memory) and
    /// `base + 2^32` (anonymous), every page installed read-only.
    ///
    /// # Errors
    /// If a region cannot be created.
    pub fn new(base: usize) -> Result<Self, crate::uffd::RegionError> {
        let noop = Arc::new(|_: &RegionOps, _: Fault| {});
        let len = Self::PAGES * PAGE_SIZE;
        let shared = Region::new(
            RegionConfig::new(base, len).with_backing(Backing::SharedMemory),
            noop.clone(),
        )?;
        let anon = Region::new(RegionConfig::new(base + (1 << 32), len), noop)?;
        for r in [&shared, &anon] {
            for p in 0..Self::PAGES {
                let _ = r.install(PageIndex(p), &FILLED, Protection::ReadOnly);
            }
        }
        Ok(ApplyChoice { shared, anon })
    }

    /// The runtime's way: store the diff's words through the runtime view of the
    /// shared-memory region (ns per application).
    pub fn apply_through_view(&self, twin: &[u8], cur: &[u8], iters: usize) -> Vec<u64> {
        let d = diff::create(twin, cur).expect("diff");
        (0..iters)
            .map(|k| {
                let page = PageIndex(k % Self::PAGES);
                let t = Instant::now();
                let mut pos = 0;
                while pos < d.len() {
                    let h = u32::from_le_bytes(d[pos..pos + 4].try_into().expect("4 bytes"));
                    let (first, words) = ((h & 0xffff) as usize, (h >> 16) as usize);
                    pos += 4;
                    self.shared
                        .view_write_words(page, first, &d[pos..pos + words * 8])
                        .expect("view write");
                    pos += words * 8;
                }
                ns(t.elapsed())
            })
            .collect()
    }

    /// What a flush pays to diff one page of the shared-memory region against a twin
    /// that differs from it in `fraction` of its words (spread as [`diff_pages`] spreads
    /// them): the page copied out through the runtime view and the copy diffed
    /// (`check` false, the runtime's flush before the thirtieth session), or first
    /// compared through the view ([`RegionOps::view_equals`]) and copied and diffed only
    /// if it differs (`check` true, the runtime's flush now). One sample per page, the
    /// pages taken in turn, so most are not in the first-level cache (ns).
    pub fn flush_diff(&self, fraction: f64, check: bool, iters: usize) -> Vec<u64> {
        let mut twin = Box::new(FILLED);
        change_words(&mut twin[..], fraction);
        let mut copy = Box::new([0u8; PAGE_SIZE]);
        let mut out = Vec::with_capacity(diff::MAX_ENCODED);
        (0..iters)
            .map(|k| {
                let page = PageIndex(k % Self::PAGES);
                out.clear();
                let t = Instant::now();
                self.diff_whole_page(page, &twin, &mut copy, &mut out, check);
                black_box(&out);
                ns(t.elapsed())
            })
            .collect()
    }

    /// The whole-page diff of [`flush_diff`](Self::flush_diff) and
    /// [`flush_diff_lines`](Self::flush_diff_lines): `page` compared with `twin` through
    /// the view first when `check`, and if it differs (or unchecked) copied into `copy`
    /// and diffed into `out`.
    fn diff_whole_page(
        &self,
        page: PageIndex,
        twin: &[u8; PAGE_SIZE],
        copy: &mut [u8; PAGE_SIZE],
        out: &mut Vec<u8>,
        check: bool,
    ) {
        if !(check && self.shared.view_equals(page, twin).expect("view")) {
            self.shared.view_read(page, copy).expect("view");
            diff::encode(&twin[..], &copy[..], out).expect("encode");
        }
    }

    /// What a flush pays to diff one page of the shared-memory region whose twin differs
    /// from it in one word of each line that `lines` names (bit `k`: bytes `64k ..`),
    /// the lines an application's stores marked: only those lines read through the
    /// runtime view and diffed ([`RegionOps::view_read_lines`],
    /// `diff::encode_lines`, which also refreshes them in the twin; `by_lines` true, the
    /// runtime's flush of an open page with at most 32 marked lines since the
    /// fifty-sixth session), or the whole page compared with the twin, copied out and
    /// diffed (`by_lines` false, as [`flush_diff`](Self::flush_diff) with `check`, the
    /// flush before). The twin is restored untimed after each sample. One sample per
    /// page, the pages taken in turn (ns).
    pub fn flush_diff_lines(&self, lines: u64, by_lines: bool, iters: usize) -> Vec<u64> {
        let mut master = Box::new(FILLED);
        for k in diff::line_indices(lines) {
            // The line's third word.
            master[k * diff::LINE_SIZE + 16] ^= 0xff;
        }
        let mut twin = master.clone();
        let mut copy = Box::new([0u8; PAGE_SIZE]);
        let mut out = Vec::with_capacity(diff::MAX_ENCODED);
        (0..iters)
            .map(|k| {
                let page = PageIndex(k % Self::PAGES);
                out.clear();
                twin.copy_from_slice(&master[..]);
                let t = Instant::now();
                if by_lines {
                    self.shared
                        .view_read_lines(page, lines, &mut copy)
                        .expect("view");
                    diff::encode_lines(&mut twin[..], &copy[..], lines, &mut out).expect("encode");
                } else {
                    self.diff_whole_page(page, &twin, &mut copy, &mut out, true);
                }
                black_box(&out);
                let t = ns(t.elapsed());
                assert_eq!(
                    out.len(),
                    lines.count_ones() as usize * 12,
                    "one run of one word a line"
                );
                t
            })
            .collect()
    }

    /// The alternative on anonymous memory: the page is read-only, so no application
    /// thread writes it; copy it out, apply the diff to the copy, drop the page
    /// (`MADV_DONTNEED`) and install the copy read-only (`UFFDIO_COPY_MODE_WP`) (ns per
    /// application). Threads touching the page meanwhile fault and wait.
    pub fn apply_by_reinstall(&self, twin: &[u8], cur: &[u8], iters: usize) -> Vec<u64> {
        let d = diff::create(twin, cur).expect("diff");
        let mut copy = Box::new([0u8; PAGE_SIZE]);
        (0..iters)
            .map(|k| {
                let page = PageIndex(k % Self::PAGES);
                let t = Instant::now();
                self.anon.read_page(page, &mut copy).expect("read");
                diff::apply(&mut copy[..], &d).expect("apply");
                self.anon.invalidate(PageRange::one(page)).expect("zap");
                let _ = self
                    .anon
                    .install(page, &copy, Protection::ReadOnly)
                    .expect("reinstall");
                ns(t.elapsed())
            })
            .collect()
    }

    fn region(&self, backing: Backing) -> &Region {
        match backing {
            Backing::SharedMemory => &self.shared,
            Backing::Anonymous => &self.anon,
        }
    }

    /// Times invalidating `run` consecutive pages in one call and reinstalling them
    /// (untimed); one sample per call (ns).
    pub fn invalidate(&self, backing: Backing, run: usize, iters: usize) -> Vec<u64> {
        let r = self.region(backing);
        let run = run.clamp(1, Self::PAGES);
        (0..iters)
            .map(|k| {
                let start = (k * run) % (Self::PAGES - run + 1);
                let range = PageRange::new(PageIndex(start), run);
                let t = Instant::now();
                r.invalidate(range).expect("invalidate");
                let d = ns(t.elapsed());
                for p in range.pages() {
                    let _ = r.install(p, &FILLED, Protection::ReadOnly);
                }
                d
            })
            .collect()
    }

    /// Times installing one missing page read-only with `UFFDIO_COPY` (the page is
    /// invalidated untimed first); one sample per install (ns).
    pub fn install(&self, backing: Backing, iters: usize) -> Vec<u64> {
        let r = self.region(backing);
        (0..iters)
            .map(|k| {
                let page = PageIndex(k % Self::PAGES);
                r.invalidate(PageRange::one(page)).expect("invalidate");
                let t = Instant::now();
                let _ = r
                    .install(page, &FILLED, Protection::ReadOnly)
                    .expect("install");
                ns(t.elapsed())
            })
            .collect()
    }
}
