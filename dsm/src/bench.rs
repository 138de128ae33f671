//! Measurement kernels of the DSM runtime, shared by the criterion benchmarks
//! (`dsm/benches/dsm.rs`) and any command that reports them, so both measure the same
//! code beside its baselines in the same run.
//!
//! Every kernel times single operations and returns their durations in nanoseconds;
//! [`summarize`] gives the median and spread. The kernels:
//!
//! * baselines: [`udp_round_trips`] (two threads, blocking UDP sockets on loopback,
//!   8-byte messages) and [`BareFault`] (a read of a missing page served in the faulting
//!   thread with `UFFDIO_COPY`, no protocol);
//! * [`Pair`]: a two-cluster job in this process (shared-memory substrate): local fault
//!   service, remote read fault, write fault (twin + unprotect), release (barrier) cost
//!   per page;
//! * [`diff_encode`], [`diff_apply`]: diff throughput on 4 KiB pages with a given share
//!   of words changed;
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
use multigrain_cluster_config::{HomePolicy, JobConfig, Protocol};
use multigrain_coherence::diff;
use std::hint::black_box;
use std::net::UdpSocket;
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

/// Baseline: `n` round trips of 8-byte datagrams between two threads with blocking UDP
/// sockets on loopback; one sample per round trip. The two threads are pinned to
/// different CPUs (as the two ends of the INI benchmarks are), the placement of two
/// clusters: left to the scheduler, both sometimes share one CPU, where a blocking
/// round trip costs a quarter as much (≈ 10 µs instead of ≈ 45 µs on the development VM)
/// because no cross-CPU wake-up is needed.
///
/// # Panics
/// If the sockets cannot be set up or a datagram is lost (loopback does not lose them).
pub fn udp_round_trips(n: usize) -> Vec<u64> {
    use multigrain_messaging::bench::pin_to_cpu;
    let _pin = pin_to_cpu(0);
    let a = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let b = UdpSocket::bind("127.0.0.1:0").expect("bind");
    a.connect(b.local_addr().expect("addr")).expect("connect");
    b.connect(a.local_addr().expect("addr")).expect("connect");
    for s in [&a, &b] {
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
    }
    let echo = std::thread::spawn(move || {
        let _pin = pin_to_cpu(1);
        let mut buf = [0u8; 64];
        for _ in 0..n {
            let k = b.recv(&mut buf).expect("echo recv");
            b.send(&buf[..k]).expect("echo send");
        }
    });
    let msg = [7u8; 8];
    let mut buf = [0u8; 64];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        a.send(&msg).expect("send");
        a.recv(&mut buf).expect("recv");
        out.push(ns(t.elapsed()));
    }
    echo.join().expect("echo thread");
    out
}

static FILLED: [u8; PAGE_SIZE] = [0x5A; PAGE_SIZE];

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

    /// A region of [`BareFault::PAGES`] pages at `base`.
    ///
    /// # Errors
    /// If the region cannot be created.
    pub fn new(base: usize) -> Result<Self, crate::uffd::RegionError> {
        let resolver = |r: &RegionOps, f: Fault| {
            if f.kind == FaultKind::Missing {
                let _ = r.install(f.page, &FILLED, Protection::ReadOnly);
            }
        };
        let region = Region::new(
            RegionConfig::new(base, Self::PAGES * PAGE_SIZE),
            Arc::new(resolver),
        )?;
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

/// A two-cluster job in this process, connected through shared memory: cluster 0 is
/// measured (from the calling thread), cluster 1 is the home of the upper half of the
/// region (block home policy) and serves it from its protocol thread.
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
        cfg.ini.mtu = 8972;
        let config_error = |cluster: usize, reason: String| DsmError::Config { cluster, reason };
        let (ts, inis) = if network {
            crate::transport::loopback_network_transports(&cfg)
                .map_err(|e| config_error(0, e.to_string()))?
        } else {
            (
                local_transports(&cfg).map_err(|e| config_error(e.cluster, e.to_string()))?,
                Vec::new(),
            )
        };
        let mut dsms = std::thread::scope(|s| {
            let hs: Vec<_> = ts
                .into_iter()
                .enumerate()
                .map(|(c, t)| {
                    let cfg = &cfg;
                    s.spawn(move || {
                        let o = DsmOptions {
                            region_base: Some(base + (c << 32)),
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
        let mut b = dsms.pop().expect("two clusters");
        let mut a = dsms.pop().expect("two clusters");
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
    /// that flushes them: write-protect, diff and send each page, wait for the home's
    /// acknowledgements. The release is a barrier of both clusters (a lock released
    /// here stays cached in the cluster and flushes nothing until another cluster asks
    /// for it, and its thread never waits for the acknowledgements): the time of a
    /// barrier with the dirty pages minus that of a clean one, just before, divided by
    /// `pages` (ns per page).
    ///
    /// # Errors
    /// If the job fails.
    pub fn release_per_page(&mut self, pages: usize) -> Result<u64, DsmError> {
        let pages = pages.clamp(1, 512);
        let first = self.next_remote_page(pages)?;
        for p in first..first + pages {
            black_box(self.read_remote(p));
        }
        // Flush whatever earlier measurements left dirty, then time a clean barrier.
        self.both_barrier()?;
        let clean = self.both_barrier()?;
        for p in first..first + pages {
            self.a_words.set(p * WORDS_PER_PAGE + 3, self.round);
        }
        let dirty = self.both_barrier()?;
        Ok(dirty.saturating_sub(clean) / pages as u64)
    }

    /// A barrier of both clusters; returns how long cluster 0's arrival took (ns).
    fn both_barrier(&self) -> Result<u64, DsmError> {
        let (a, b) = (self.a(), self.b.as_ref().expect("live"));
        let (ra, rb) = std::thread::scope(|s| {
            let hb = s.spawn(|| b.barrier());
            let t = Instant::now();
            let r = a.barrier().map(|()| ns(t.elapsed()));
            (r, hb.join().expect("cluster 1 thread"))
        });
        rb?;
        ra
    }

    /// Finishes both clusters and returns the job's statistics.
    ///
    /// # Errors
    /// If the job fails.
    pub fn finish(mut self) -> Result<crate::JobStats, DsmError> {
        let a = self.a.take().expect("live");
        let b = self.b.take().expect("live");
        let (ra, rb) = std::thread::scope(|s| {
            let hb = s.spawn(|| b.finish());
            (a.finish(), hb.join().expect("cluster 1 thread"))
        });
        rb?;
        ra
    }
}

/// A twin and a current page that differ in `fraction` (0.0..=1.0) of their words,
/// spread evenly.
pub fn diff_pages(fraction: f64) -> (Vec<u8>, Vec<u8>) {
    let twin: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7) as u8).collect();
    let mut cur = twin.clone();
    let changed = ((WORDS_PER_PAGE as f64 * fraction).round() as usize).min(WORDS_PER_PAGE);
    if changed > 0 {
        let step = WORDS_PER_PAGE as f64 / changed as f64;
        for k in 0..changed {
            let w = (k as f64 * step) as usize;
            cur[w * 8] ^= 0xFF;
        }
    }
    (twin, cur)
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
