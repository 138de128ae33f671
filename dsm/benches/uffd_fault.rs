//! The fault-serving experiment of issue 4: how fast can a userfaultfd fault be served,
//! and what does it cost while idle?
//!
//! Measured in one run, each through the `multigrain_dsm::uffd` API:
//!
//! 1. a handler thread that blocks in `poll(2)` (`Delivery::BLOCKING`);
//! 2. a busy-polling handler thread (`Delivery::BUSY_POLL`);
//! 3. a hybrid handler thread that spins 50 µs after each event, then blocks: faults
//!    back to back (inside the spin window) and after a 250 µs idle gap (outside it);
//! 4. `SIGBUS` (`UFFD_FEATURE_SIGBUS`, `Delivery::Signal`): the faulting thread serves its
//!    own fault — a write to a missing page installed writable at once (read/write from
//!    the page-fault error code), the same write installed read-only first and then
//!    re-faulting as a write-protect fault, and a read;
//! 5. bare `UFFDIO_COPY` (and with `UFFDIO_COPY_MODE_WP`), no fault;
//! 6. write-protect fault → unprotect, with `SIGBUS` and with handler threads;
//! 7. `MADV_DONTNEED` over 64 present pages: 64 calls vs one call, and the same for
//!    `UFFDIO_WRITEPROTECT`; reading a page with loads vs `process_vm_readv`;
//! 9. write tracking on shared memory (the runtime's backing): the write-protect fault
//!    with `SIGBUS` → unprotect, against the asynchronous one that the kernel resolves
//!    itself ([`WriteTracker`]: `UFFD_FEATURE_WP_ASYNC`, Linux ≥ 6.7), and the
//!    `PAGEMAP_SCAN` that lists 64 written pages of 8192 and protects them again (time
//!    per written page).
//!
//! Cases 1-4 also run with one spinning thread per CPU (`*_cpu_loaded`), the situation of
//! a DSM application whose compute threads occupy every core: a handler thread must then
//! be scheduled before the fault is served, the faulting thread itself need not.
//!
//! Criterion reports the mean per operation; every single operation is also timed and
//! the per-operation percentiles (p10, median, p90, p99) are printed at the end.

use criterion::Criterion;
use multigrain_dsm::uffd::*;
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Pages per benchmark region; the region is reset (invalidated) when all are used.
const POOL: usize = 8192;
const BATCH: usize = 64;
const BASE: usize = 0x4000_0000_0000;

static PAGE: [u8; PAGE_SIZE] = [0xAB; PAGE_SIZE];

/// Per-operation samples in nanoseconds, by benchmark name.
static SAMPLES: Mutex<BTreeMap<&'static str, Vec<u64>>> = Mutex::new(BTreeMap::new());

fn record(name: &'static str, samples: &[u64]) {
    SAMPLES
        .lock()
        .unwrap()
        .entry(name)
        .or_default()
        .extend_from_slice(samples);
}

/// Installs on a missing fault (writable on a write, read-only on a read, or always
/// read-only), unprotects on a write-protect fault.
struct Serve {
    read_only_first: bool,
}

impl FaultResolver for Serve {
    fn resolve(&self, region: &RegionOps, fault: Fault) {
        match fault.kind {
            FaultKind::Missing => {
                let prot = if fault.access == Access::Write && !self.read_only_first {
                    Protection::Writable
                } else {
                    Protection::ReadOnly
                };
                let _ = region.install(fault.page, &PAGE, prot).unwrap();
            }
            FaultKind::WriteProtect => region.unprotect(PageRange::one(fault.page)).unwrap(),
        }
    }
}

struct Pool {
    region: Region,
    next: usize,
}

impl Pool {
    fn new(slot: usize, delivery: Delivery, read_only_first: bool) -> Pool {
        Pool::with(slot, delivery, read_only_first, Backing::Anonymous)
    }

    fn with(slot: usize, delivery: Delivery, read_only_first: bool, backing: Backing) -> Pool {
        let cfg = RegionConfig::new(BASE + slot * (1 << 32), POOL * PAGE_SIZE)
            .with_delivery(delivery)
            .with_backing(backing);
        let region = Region::new(cfg, Arc::new(Serve { read_only_first })).unwrap();
        Pool { region, next: 0 }
    }

    fn all(&self) -> PageRange {
        PageRange::new(PageIndex(0), POOL)
    }

    /// A page that is missing (the pool is invalidated when used up).
    fn missing_page(&mut self) -> usize {
        if self.next == POOL {
            self.region.invalidate(self.all()).unwrap();
            self.next = 0;
        }
        self.next += 1;
        self.next - 1
    }

    fn ptr(&self, page: usize) -> *mut u8 {
        self.region.as_ptr().wrapping_add(page * PAGE_SIZE)
    }
}

fn touch_write(p: *mut u8) {
    // SAFETY: `p` is inside a benchmark region (mapped read/write); the fault is served
    // by the region's resolver.
    unsafe { p.write_volatile(1) }
}

fn touch_read(p: *mut u8) -> u8 {
    // SAFETY: as in `touch_write`.
    unsafe { p.read_volatile() }
}

/// Times `iters` faults on fresh missing pages; `gap` idles before each one (untimed).
fn fault_bench(
    c: &mut Criterion,
    name: &'static str,
    pool: &mut Pool,
    write: bool,
    gap: Option<Duration>,
) {
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut samples = Vec::with_capacity(iters as usize);
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let page = pool.missing_page();
                let p = pool.ptr(page);
                if let Some(gap) = gap {
                    std::thread::sleep(gap);
                }
                let t = Instant::now();
                if write {
                    touch_write(p);
                } else {
                    black_box(touch_read(p));
                }
                let d = t.elapsed();
                total += d;
                samples.push(d.as_nanos() as u64);
            }
            record(name, &samples);
            total
        })
    });
}

/// Times write-protect faults: every page of the pool is present and write-protected.
fn wp_bench(c: &mut Criterion, name: &'static str, pool: &mut Pool) {
    for p in 0..POOL {
        let _ = pool
            .region
            .install(PageIndex(p), &PAGE, Protection::ReadOnly)
            .unwrap();
    }
    // Pages that earlier benchmarks left present and writable.
    pool.region.write_protect(pool.all()).unwrap();
    pool.next = 0;
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut samples = Vec::with_capacity(iters as usize);
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                if pool.next == POOL {
                    // All pages are present and writable again: protect them in one call.
                    pool.region.write_protect(pool.all()).unwrap();
                    pool.next = 0;
                }
                let p = pool.ptr(pool.next);
                pool.next += 1;
                let t = Instant::now();
                touch_write(p);
                let d = t.elapsed();
                total += d;
                samples.push(d.as_nanos() as u64);
            }
            record(name, &samples);
            total
        })
    });
}

/// Times asynchronous write-protect faults (every page present and protected; a write
/// goes through without a signal), then `PAGEMAP_SCAN` collecting and re-protecting 64
/// written pages of [`POOL`] (time per written page; the writes are not timed).
fn wp_async_bench(c: &mut Criterion, t: &mut WriteTracker) {
    for p in 0..POOL {
        touch_write(t.as_ptr().wrapping_add(p * PAGE_SIZE));
    }
    t.protect_all().unwrap();
    let mut next = 0;
    c.bench_function("9_wp_async_shm", |b| {
        b.iter_custom(|iters| {
            let mut samples = Vec::with_capacity(iters as usize);
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                if next == POOL {
                    t.protect_all().unwrap();
                    next = 0;
                }
                let p = t.as_ptr().wrapping_add(next * PAGE_SIZE);
                next += 1;
                let t0 = Instant::now();
                touch_write(p);
                let d = t0.elapsed();
                total += d;
                samples.push(d.as_nanos() as u64);
            }
            record("9_wp_async_shm", &samples);
            total
        })
    });
    t.protect_all().unwrap();
    let mut runs = Vec::new();
    let name = "9_pagemap_scan_per_written_page";
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut samples = Vec::with_capacity(iters as usize);
            let mut total = Duration::ZERO;
            for i in 0..iters as usize {
                for k in 0..BATCH {
                    let page = (k * (POOL / BATCH) + i) % POOL;
                    touch_write(t.as_ptr().wrapping_add(page * PAGE_SIZE));
                }
                runs.clear();
                let t0 = Instant::now();
                let written = t.take_written(&mut runs).unwrap();
                let d = t0.elapsed() / BATCH as u32;
                assert_eq!(written, BATCH);
                total += d;
                samples.push(d.as_nanos() as u64);
            }
            record(name, &samples);
            total
        })
    });
}

/// Times an operation on a fresh missing page (no fault involved).
fn copy_bench(c: &mut Criterion, name: &'static str, pool: &mut Pool, prot: Protection) {
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut samples = Vec::with_capacity(iters as usize);
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let page = PageIndex(pool.missing_page());
                let t = Instant::now();
                let r = pool.region.install(page, &PAGE, prot);
                let d = t.elapsed();
                assert_eq!(r, Ok(Install::Installed));
                total += d;
                samples.push(d.as_nanos() as u64);
            }
            record(name, &samples);
            total
        })
    });
}

/// Times `op` over 64 present, writable pages (set up untimed before each run).
fn batch_bench(
    c: &mut Criterion,
    name: &'static str,
    pool: &mut Pool,
    op: impl Fn(&Region, PageIndex),
) {
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut samples = Vec::with_capacity(iters as usize);
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                pool.region
                    .invalidate(PageRange::new(PageIndex(0), BATCH))
                    .unwrap();
                for p in 0..BATCH {
                    let _ = pool
                        .region
                        .install(PageIndex(p), &PAGE, Protection::Writable)
                        .unwrap();
                }
                let t = Instant::now();
                op(&pool.region, PageIndex(0));
                let d = t.elapsed();
                total += d;
                samples.push(d.as_nanos() as u64);
            }
            record(name, &samples);
            total
        })
    });
}

fn read_bench(c: &mut Criterion, name: &'static str, pool: &mut Pool, syscall: bool) {
    let _ = pool
        .region
        .install(PageIndex(0), &PAGE, Protection::Writable)
        .unwrap();
    let mut buf = Box::new([0u8; PAGE_SIZE]);
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut samples = Vec::with_capacity(iters as usize);
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                if syscall {
                    pool.region.try_read_page(PageIndex(0), &mut buf).unwrap();
                } else {
                    pool.region.read_page(PageIndex(0), &mut buf).unwrap();
                }
                black_box(&buf);
                let d = t.elapsed();
                total += d;
                samples.push(d.as_nanos() as u64);
            }
            record(name, &samples);
            total
        })
    });
}

/// Threads that spin until dropped: the CPU load of compute threads, under which a
/// handler thread has to be scheduled to serve a fault.
struct Hogs {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Hogs {
    fn start(n: usize) -> Hogs {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Hogs { stop, threads }
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().unwrap();
        }
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default()
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i] as f64 / 1000.0
}

fn print_summary() {
    let samples = SAMPLES.lock().unwrap();
    println!();
    println!("per-operation latency (µs), all timed operations of the run:");
    println!(
        "{:<34} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "benchmark", "n", "p10", "median", "p90", "p99", "p99.9", "mean"
    );
    for (name, v) in samples.iter() {
        let mut v = v.clone();
        v.sort_unstable();
        if v.is_empty() {
            continue;
        }
        let mean = v.iter().sum::<u64>() as f64 / v.len() as f64 / 1000.0;
        println!(
            "{:<34} {:>9} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            name,
            v.len(),
            percentile(&v, 0.10),
            percentile(&v, 0.50),
            percentile(&v, 0.90),
            percentile(&v, 0.99),
            percentile(&v, 0.999),
            mean
        );
    }
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1500))
        .configure_from_args();
    // Faults after a long idle gap: few samples, or the run takes minutes.
    let mut idle = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let long_gap = Some(Duration::from_millis(2));
    let hybrid = Delivery::hybrid(Duration::from_micros(50));
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    println!("load average at start: {}", loadavg());

    // 1-3: handler threads, write faults on missing pages.
    let mut p = Pool::new(0, Delivery::BLOCKING, false);
    fault_bench(&mut c, "1_thread_blocking", &mut p, true, None);
    fault_bench(
        &mut idle,
        "1_thread_blocking_after_idle2ms",
        &mut p,
        true,
        long_gap,
    );
    wp_bench(&mut c, "6_wp_thread_blocking", &mut p);
    let hogs = Hogs::start(cpus);
    fault_bench(&mut c, "1_thread_blocking_cpu_loaded", &mut p, true, None);
    drop(hogs);
    drop(p);
    let mut p = Pool::new(1, Delivery::BUSY_POLL, false);
    fault_bench(&mut c, "2_thread_busy_poll", &mut p, true, None);
    wp_bench(&mut c, "6_wp_thread_busy_poll", &mut p);
    let hogs = Hogs::start(cpus);
    fault_bench(&mut c, "2_thread_busy_poll_cpu_loaded", &mut p, true, None);
    drop(hogs);
    drop(p);
    let mut p = Pool::new(2, hybrid, false);
    fault_bench(&mut c, "3_thread_hybrid50us_b2b", &mut p, true, None);
    fault_bench(
        &mut c,
        "3_thread_hybrid50us_after_idle",
        &mut p,
        true,
        Some(Duration::from_micros(250)),
    );
    fault_bench(
        &mut idle,
        "3_thread_hybrid50us_after_idle2ms",
        &mut p,
        true,
        long_gap,
    );
    let hogs = Hogs::start(cpus);
    fault_bench(&mut c, "3_thread_hybrid50us_cpu_loaded", &mut p, true, None);
    drop(hogs);
    drop(p);

    // 4: SIGBUS in the faulting thread.
    let mut p = Pool::new(3, Delivery::Signal, false);
    fault_bench(&mut c, "4_sigbus_write_errcode", &mut p, true, None);
    fault_bench(&mut c, "4_sigbus_read", &mut p, false, None);
    fault_bench(
        &mut c,
        "4_sigbus_write_after_idle",
        &mut p,
        true,
        Some(Duration::from_micros(250)),
    );
    fault_bench(
        &mut idle,
        "4_sigbus_write_after_idle2ms",
        &mut p,
        true,
        long_gap,
    );
    let hogs = Hogs::start(cpus);
    fault_bench(&mut c, "4_sigbus_write_cpu_loaded", &mut p, true, None);
    drop(hogs);
    wp_bench(&mut c, "6_wp_sigbus", &mut p);
    drop(p);
    let mut p = Pool::new(4, Delivery::Signal, true);
    fault_bench(&mut c, "4_sigbus_write_ro_then_wp", &mut p, true, None);
    drop(p);

    // 5: the install alone.
    let mut p = Pool::new(5, Delivery::Signal, false);
    copy_bench(&mut c, "5_uffdio_copy", &mut p, Protection::Writable);
    copy_bench(&mut c, "5_uffdio_copy_wp", &mut p, Protection::ReadOnly);

    // 7: batched range operations over 64 pages, reading pages.
    batch_bench(&mut c, "7_dontneed_64_calls_x1page", &mut p, |r, s| {
        for i in 0..BATCH {
            r.invalidate(PageRange::one(PageIndex(s.0 + i))).unwrap();
        }
    });
    batch_bench(&mut c, "7_dontneed_1_call_x64pages", &mut p, |r, s| {
        r.invalidate(PageRange::new(s, BATCH)).unwrap();
    });
    batch_bench(&mut c, "7_writeprotect_64_calls_x1page", &mut p, |r, s| {
        for i in 0..BATCH {
            r.write_protect(PageRange::one(PageIndex(s.0 + i))).unwrap();
        }
    });
    batch_bench(&mut c, "7_writeprotect_1_call_x64pages", &mut p, |r, s| {
        r.write_protect(PageRange::new(s, BATCH)).unwrap();
    });
    read_bench(&mut c, "8_read_page_loads", &mut p, false);
    read_bench(&mut c, "8_try_read_page_process_vm_readv", &mut p, true);
    drop(p);

    // 9: write tracking on shared memory, synchronous against asynchronous.
    let mut p = Pool::with(6, Delivery::Signal, false, Backing::SharedMemory);
    wp_bench(&mut c, "9_wp_sigbus_shm", &mut p);
    drop(p);
    match WriteTracker::new(BASE + 7 * (1 << 32), POOL * PAGE_SIZE) {
        Ok(mut t) => wp_async_bench(&mut c, &mut t),
        Err(e) => println!("NOT MEASURED: asynchronous write tracking ({e})"),
    }

    c.final_summary();
    idle.final_summary();
    println!("load average at end: {}", loadavg());
    print_summary();
}
