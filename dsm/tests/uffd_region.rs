//! Integration tests of the userfaultfd layer: region creation, every page operation,
//! fault detection in all delivery modes, concurrency, and deterministic shutdown.

use multigrain_dsm::uffd::*;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

/// A base address private to one test (tests run in parallel in one process).
fn base(slot: usize) -> usize {
    0x3000_0000_0000 + slot * (1 << 32)
}

fn pattern(page: PageIndex) -> [u8; PAGE_SIZE] {
    let mut p = [0u8; PAGE_SIZE];
    for (i, b) in p.iter_mut().enumerate() {
        *b = (page.0.wrapping_mul(131) ^ i.wrapping_mul(7)) as u8;
    }
    p
}

fn addr(region: &Region, page: usize, offset: usize) -> *mut u8 {
    region.as_ptr().wrapping_add(page * PAGE_SIZE + offset)
}

fn read(region: &Region, page: usize, offset: usize) -> u8 {
    // SAFETY: the address lies inside the mapped region (callers pass page < pages and
    // offset < PAGE_SIZE); a fault is served by the test's resolver.
    unsafe { addr(region, page, offset).read_volatile() }
}

fn write(region: &Region, page: usize, offset: usize, value: u8) {
    // SAFETY: as in `read`.
    unsafe { addr(region, page, offset).write_volatile(value) }
}

const MODES: [(&str, Delivery); 4] = [
    ("signal", Delivery::Signal),
    ("blocking", Delivery::BLOCKING),
    (
        "hybrid",
        Delivery::Threads {
            threads: 1,
            spin: Duration::from_micros(50),
        },
    ),
    (
        "two-threads",
        Delivery::Threads {
            threads: 2,
            spin: Duration::from_micros(20),
        },
    ),
];

#[test]
fn kernel_features_are_detected() {
    let k = probe(true).expect("userfaultfd available");
    println!("userfaultfd source: {:?}", k.source);
    println!("available features: {}", k.available);
    println!("ioctls: {:#x}", k.ioctls);
    assert!(
        k.available
            .contains(Features::PAGEFAULT_FLAG_WP.union(Features::SIGBUS))
    );
}

#[test]
fn taken_address_range_is_named_in_the_error() {
    let noop = Arc::new(|_: &RegionOps, _: Fault| {});
    let a = Region::new(RegionConfig::new(base(1), 16 * PAGE_SIZE), noop.clone()).unwrap();
    let err = Region::new(
        RegionConfig::new(base(1) + 8 * PAGE_SIZE, 16 * PAGE_SIZE),
        noop.clone(),
    )
    .unwrap_err();
    let msg = err.to_string();
    let start = format!("{:#x}", base(1) + 8 * PAGE_SIZE);
    let end = format!("{:#x}", base(1) + 24 * PAGE_SIZE);
    assert!(
        matches!(err, RegionError::Map(MapError::AddressTaken { .. })),
        "{err:?}"
    );
    assert!(
        msg.contains(&start) && msg.contains(&end),
        "message names the range: {msg}"
    );
    drop(a);
    // After the drop the range is free again.
    let b = Region::new(
        RegionConfig::new(base(1) + 8 * PAGE_SIZE, 16 * PAGE_SIZE),
        noop,
    );
    assert!(b.is_ok(), "{b:?}");
}

#[test]
fn bad_layouts_and_out_of_range_operations_are_errors() {
    let noop = Arc::new(|_: &RegionOps, _: Fault| {});
    let e = Region::new(RegionConfig::new(base(2) + 1, PAGE_SIZE), noop.clone()).unwrap_err();
    assert!(
        matches!(e, RegionError::Layout(LayoutError::BadBase(_))),
        "{e:?}"
    );
    let e = Region::new(
        RegionConfig::new(base(2), PAGE_SIZE).with_delivery(Delivery::Threads {
            threads: 0,
            spin: Duration::ZERO,
        }),
        noop.clone(),
    )
    .unwrap_err();
    assert!(matches!(e, RegionError::NoHandlerThreads), "{e:?}");

    let r = Region::new(RegionConfig::new(base(2), 4 * PAGE_SIZE), noop).unwrap();
    let data = [1u8; PAGE_SIZE];
    let oob = PageIndex(4);
    assert!(matches!(
        r.install(oob, &data, Protection::Writable),
        Err(OpError::OutOfRange(_))
    ));
    assert!(matches!(
        r.install_zero(oob, Protection::ReadOnly),
        Err(OpError::OutOfRange(_))
    ));
    for res in [
        r.write_protect(PageRange::new(PageIndex(3), 2)),
        r.unprotect(PageRange::new(PageIndex(3), 2)),
        r.invalidate(PageRange::new(PageIndex(3), 2)),
        r.wake(PageRange::new(PageIndex(3), 2)),
    ] {
        assert!(matches!(res, Err(OpError::OutOfRange(_))), "{res:?}");
    }
    let mut buf = [0u8; PAGE_SIZE];
    assert!(matches!(
        r.read_page(oob, &mut buf),
        Err(OpError::OutOfRange(_))
    ));
    // Empty ranges are no-ops, also at the end of the region.
    r.invalidate(PageRange::new(PageIndex(4), 0)).unwrap();
}

#[test]
fn install_outcomes_and_reading_pages() {
    let faults = Arc::new(AtomicUsize::new(0));
    let f = faults.clone();
    let r = Region::new(
        RegionConfig::new(base(3), 8 * PAGE_SIZE),
        Arc::new(move |_: &RegionOps, _: Fault| {
            f.fetch_add(1, Ordering::SeqCst);
        }),
    )
    .unwrap();
    let p = PageIndex(3);
    let mut buf = [0u8; PAGE_SIZE];
    assert_eq!(r.try_read_page(p, &mut buf), Err(OpError::NotPresent(p)));
    // Source buffers need no alignment.
    let mut unaligned = vec![0u8; PAGE_SIZE + 1];
    unaligned[1..].copy_from_slice(&pattern(p));
    let src: &[u8; PAGE_SIZE] = unaligned[1..].try_into().unwrap();
    assert_eq!(
        r.install(p, src, Protection::ReadOnly),
        Ok(Install::Installed)
    );
    assert_eq!(
        r.install(p, &[9; PAGE_SIZE], Protection::Writable),
        Ok(Install::AlreadyPresent)
    );
    assert_eq!(
        r.install_zero(p, Protection::Writable),
        Ok(Install::AlreadyPresent)
    );
    r.try_read_page(p, &mut buf).unwrap();
    assert_eq!(buf, pattern(p));
    buf.fill(0);
    r.read_page(p, &mut buf).unwrap();
    assert_eq!(buf, pattern(p));
    assert_eq!(read(&r, 3, 100), pattern(p)[100]);
    assert_eq!(
        faults.load(Ordering::SeqCst),
        0,
        "a present page does not fault"
    );
    // Invalidate makes it missing again.
    r.invalidate(PageRange::one(p)).unwrap();
    assert_eq!(r.try_read_page(p, &mut buf), Err(OpError::NotPresent(p)));
    assert_eq!(
        r.install(p, &pattern(p), Protection::Writable),
        Ok(Install::Installed)
    );
}

/// Records faults and serves them like the HLRC runtime would: install read-only on a
/// read, writable on a write, twin + unprotect on a write-protect fault.
#[derive(Default)]
struct Recorder {
    log: Mutex<Vec<(usize, FaultKind, Access)>>,
    twins: Mutex<Vec<(usize, Box<[u8; PAGE_SIZE]>)>>,
}

impl FaultResolver for Recorder {
    fn resolve(&self, region: &RegionOps, fault: Fault) {
        self.log
            .lock()
            .push((fault.page.0, fault.kind, fault.access));
        match fault.kind {
            FaultKind::Missing => {
                let prot = match fault.access {
                    Access::Read => Protection::ReadOnly,
                    Access::Write => Protection::Writable,
                };
                let _ = region
                    .install(fault.page, &pattern(fault.page), prot)
                    .unwrap();
            }
            FaultKind::WriteProtect => {
                let mut twin = Box::new([0u8; PAGE_SIZE]);
                region.read_page(fault.page, &mut twin).unwrap();
                self.twins.lock().push((fault.page.0, twin));
                region.unprotect(PageRange::one(fault.page)).unwrap();
            }
        }
    }
}

fn wp_detection_and_invalidate_refault(
    slot: usize,
    delivery: Delivery,
    backing: Backing,
    minor: bool,
) {
    use Access::*;
    use FaultKind::*;
    let rec = Arc::new(Recorder::default());
    let r = Region::new(
        RegionConfig::new(base(slot), 8 * PAGE_SIZE)
            .with_delivery(delivery)
            .with_backing(backing)
            .with_minor_faults(minor),
        rec.clone(),
    )
    .unwrap();
    assert_eq!(r.backing(), backing);
    let expected = minor && backing == Backing::SharedMemory && minor_faults_offered();
    assert_eq!(r.minor_faults(), expected, "{:?}", r.kernel());
    let p0 = pattern(PageIndex(0));

    assert_eq!(read(&r, 0, 5), p0[5]); // missing read -> read-only install
    assert_eq!(read(&r, 0, 6), p0[6]); // no fault
    write(&r, 0, 5, 0xAA); // write-protect fault -> twin, unprotect
    write(&r, 0, 6, 0xBB); // no fault
    assert_eq!(read(&r, 0, 5), 0xAA);
    r.write_protect(PageRange::one(PageIndex(0))).unwrap();
    assert_eq!(read(&r, 0, 6), 0xBB); // reads still fine
    write(&r, 0, 7, 0xCC); // write-protect fault again
    r.invalidate(PageRange::one(PageIndex(0))).unwrap();
    assert_eq!(read(&r, 0, 5), p0[5]); // refault, fresh contents
    write(&r, 1, 0, 0x11); // missing write -> writable at once
    write(&r, 1, 1, 0x12); // no fault
    r.write_protect(PageRange::one(PageIndex(2))).unwrap(); // never touched: no effect
    write(&r, 2, 0, 0x21); // missing (not write-protect) fault
    assert_eq!(read(&r, 2, 0), 0x21);

    let log = rec.log.lock().clone();
    assert_eq!(
        log,
        vec![
            (0, Missing, Read),
            (0, WriteProtect, Write),
            (0, WriteProtect, Write),
            (0, Missing, Read),
            (1, Missing, Write),
            (2, Missing, Write),
        ],
        "{delivery:?} {backing:?}"
    );
    let twins = rec.twins.lock();
    assert_eq!(twins.len(), 2);
    assert_eq!(*twins[0].1, p0, "first twin is the installed contents");
    let mut expect = p0;
    expect[5] = 0xAA;
    expect[6] = 0xBB;
    assert_eq!(*twins[1].1, expect, "second twin has the first writes");
}

#[test]
fn write_protect_detection_and_invalidate_refault_in_every_mode() {
    for (i, (name, delivery)) in MODES.into_iter().enumerate() {
        println!("mode {name}");
        wp_detection_and_invalidate_refault(10 + i, delivery, Backing::Anonymous, false);
        println!("mode {name}, shared memory");
        wp_detection_and_invalidate_refault(40 + i, delivery, Backing::SharedMemory, false);
        // Minor faults: the invalidated page stays in the memfd, its refault is a minor
        // fault (reported as missing) and the install maps it with UFFDIO_CONTINUE.
        println!("mode {name}, shared memory, minor faults");
        wp_detection_and_invalidate_refault(60 + i, delivery, Backing::SharedMemory, true);
        // Asking for minor faults on anonymous memory changes nothing.
        wp_detection_and_invalidate_refault(70 + i, delivery, Backing::Anonymous, true);
    }
}

/// Whether this kernel offers what minor faults need (shmem minor faults and Linux >= 6.4
/// for `UFFDIO_CONTINUE_MODE_WP`); says so loudly when it does not.
fn minor_faults_offered() -> bool {
    let k = probe(true).expect("userfaultfd available");
    let offered = k.available.contains(Features::MINOR_SHMEM)
        && k.available.contains(Features::WP_UNPOPULATED);
    if !offered {
        eprintln!(
            "NOTE: this kernel's userfaultfd offers no minor faults on shared memory with \
             UFFDIO_CONTINUE_MODE_WP ({}); regions fall back to UFFDIO_COPY and the \
             minor-fault checks test that fallback only",
            k.available
        );
    }
    offered
}

/// With minor faults, a missing page the memfd holds although the region never installed
/// or populated it — a `populate` of its range running concurrently with the install (the
/// race a runtime test hit: a home applying a diff while its own allocation populated the
/// array), or words written through the view — is still installed, from the memfd, with
/// the contents given.
#[test]
fn minor_faults_install_a_page_that_reached_the_memfd_another_way() {
    let r = Region::new(
        RegionConfig::new(base(82), 4 * PAGE_SIZE)
            .with_backing(Backing::SharedMemory)
            .with_minor_faults(true),
        Arc::new(Recorder::default()),
    )
    .unwrap();
    if !minor_faults_offered() {
        assert!(!r.minor_faults());
        return;
    }
    let p = PageIndex(1);
    r.view_write_words(p, 0, &[0xEE; 16]).unwrap();
    assert!(!r.installs_in_place(p));
    assert_eq!(
        r.install(p, &pattern(p), Protection::ReadOnly),
        Ok(Install::Installed)
    );
    assert!(r.installs_in_place(p));
    assert_eq!(
        (read(&r, 1, 3), read(&r, 1, 9)),
        (pattern(p)[3], pattern(p)[9])
    );
    let q = PageIndex(2);
    r.view_write_words(q, 0, &[0xEE; 8]).unwrap();
    assert_eq!(
        r.install_zero(q, Protection::Writable),
        Ok(Install::Installed)
    );
    assert_eq!(read(&r, 2, 0), 0);
    // A page that really is present: refused, as without minor faults.
    assert_eq!(
        r.install_zero(q, Protection::Writable),
        Ok(Install::AlreadyPresent)
    );
}

/// A region with minor faults: populated pages and invalidated pages stay in the memfd,
/// yet every access to a page not installed still faults (also after words were
/// written to it through the view), installs put the given contents there, and `remap`
/// maps a page whose mapping was dropped with its contents and the protection asked for.
#[test]
fn minor_faults_keep_pages_in_the_memfd_and_trap_every_access() {
    /// Installs like `Recorder`; pages in `present` are remapped read-only instead (the
    /// runtime's answer to a page whose mapping the kernel dropped).
    #[derive(Default)]
    struct Remapper {
        rec: Recorder,
        present: Mutex<Vec<usize>>,
    }
    impl FaultResolver for Remapper {
        fn resolve(&self, region: &RegionOps, fault: Fault) {
            if fault.kind == FaultKind::Missing && self.present.lock().contains(&fault.page.0) {
                self.rec
                    .log
                    .lock()
                    .push((fault.page.0, fault.kind, fault.access));
                let _ = region.remap(fault.page, Protection::ReadOnly).unwrap();
            } else {
                self.rec.resolve(region, fault);
            }
        }
    }
    let offered = minor_faults_offered();
    let res = Arc::new(Remapper::default());
    let r = Region::new(
        RegionConfig::new(base(80), 8 * PAGE_SIZE)
            .with_backing(Backing::SharedMemory)
            .with_minor_faults(true),
        res.clone(),
    )
    .unwrap();
    assert_eq!(r.minor_faults(), offered);
    if !offered {
        assert_eq!(
            r.populate(PageRange::new(PageIndex(0), 4)),
            Err(OpError::NoMinorFaults)
        );
        return;
    }
    let (p0, p1) = (PageIndex(0), PageIndex(1));
    r.populate(PageRange::new(p0, 4)).unwrap();
    // Words written through the view to a populated page that is not installed: the
    // application's access still faults, and the install's contents replace them.
    r.view_write_words(p0, 0, &[0xEE; 16]).unwrap();
    assert_eq!(read(&r, 0, 3), pattern(p0)[3]);
    assert_eq!(read(&r, 0, 9), pattern(p0)[9]);
    // A zero-fill install of a page holding other bytes in the memfd gives zeros.
    r.view_write_words(PageIndex(2), 0, &[0xEE; 8]).unwrap();
    assert_eq!(
        r.install_zero(PageIndex(2), Protection::ReadOnly),
        Ok(Install::Installed)
    );
    assert_eq!(read(&r, 2, 0), 0);
    // Invalidated, written through the view, read again: a fault and fresh contents.
    write(&r, 0, 3, 0x77); // write-protect fault, unprotect
    r.invalidate(PageRange::one(p0)).unwrap();
    assert_eq!(read(&r, 0, 3), pattern(p0)[3]);
    // A page whose mapping is dropped behind the protocol's back (reclaim; here the same
    // zap): its next access faults, `remap` maps the memfd's page with its contents.
    write(&r, 1, 5, 0x11); // missing write: installed writable
    r.invalidate(PageRange::one(p1)).unwrap();
    res.present.lock().push(1);
    assert_eq!(read(&r, 1, 5), 0x11, "the remapped page keeps its contents");
    assert_eq!(read(&r, 1, 6), pattern(p1)[6]);
    write(&r, 1, 6, 0x22); // remapped read-only: a write-protect fault
    assert_eq!(
        r.remap(p1, Protection::ReadOnly),
        Ok(Install::AlreadyPresent)
    );
    let log = res.rec.log.lock().clone();
    use Access::*;
    use FaultKind::*;
    assert_eq!(
        log,
        vec![
            (0, Missing, Read),
            (0, WriteProtect, Write),
            (0, Missing, Read),
            (1, Missing, Write),
            (1, Missing, Read),
            (1, WriteProtect, Write),
        ]
    );
    // Without minor faults: no populate, no remap.
    let plain = Region::new(
        RegionConfig::new(base(81), PAGE_SIZE).with_backing(Backing::SharedMemory),
        Arc::new(|_: &RegionOps, _: Fault| {}),
    )
    .unwrap();
    assert!(!plain.minor_faults());
    assert_eq!(
        plain.populate(PageRange::one(PageIndex(0))),
        Err(OpError::NoMinorFaults)
    );
    assert_eq!(
        plain.remap(PageIndex(0), Protection::Writable),
        Err(OpError::NoMinorFaults)
    );
}

#[test]
fn shared_memory_runtime_view() {
    let rec = Arc::new(Recorder::default());
    let r = Region::new(
        RegionConfig::new(base(50), 8 * PAGE_SIZE).with_backing(Backing::SharedMemory),
        rec.clone(),
    )
    .unwrap();
    let p = PageIndex(2);
    let view = r.view_ptr().expect("a shared-memory region has a view");
    assert!(
        !r.layout().contains(view as usize),
        "the view is a second mapping"
    );
    // Installed read-only: the view reads the contents without a fault.
    assert_eq!(read(&r, 2, 0), pattern(p)[0]);
    let mut buf = [0u8; PAGE_SIZE];
    r.view_read(p, &mut buf).unwrap();
    assert_eq!(buf, pattern(p));
    // The check a flush makes before a diff: equal to its contents, and a change in any
    // block of eight words — the first, a middle one, the last word — tells it apart.
    assert_eq!(r.view_equals(p, &buf), Ok(true));
    for word in [0, 200, 511] {
        let mut other = buf;
        other[word * 8] ^= 1;
        assert_eq!(r.view_equals(p, &other), Ok(false), "word {word}");
    }
    // Words stored through the view appear in the application's mapping at once, and
    // the page stays write-protected for the application.
    let words: Vec<u8> = (0..3u64).flat_map(|w| (0xA0A0 + w).to_ne_bytes()).collect();
    r.view_write_words(p, 10, &words).unwrap();
    assert_eq!(read(&r, 2, 80), 0xA0);
    assert_eq!(read(&r, 2, 81), 0xA0);
    assert_eq!(read(&r, 2, 96), 0xA2);
    write(&r, 2, 200, 7); // write-protect fault, twin holds the view's words
    {
        let twins = rec.twins.lock();
        assert_eq!(twins.len(), 1);
        assert_eq!(twins[0].1[80..104], words[..]);
    }
    // The application's concurrent writes to other words survive view stores.
    r.view_write_words(p, 0, &[1; 8]).unwrap();
    assert_eq!(read(&r, 2, 200), 7);
    // Invalidation punches the page out of the memfd: the next access faults and gets
    // fresh contents (not the stored words).
    r.invalidate(PageRange::one(p)).unwrap();
    assert_eq!(read(&r, 2, 80), pattern(p)[80]);
    let log = rec.log.lock().clone();
    assert_eq!(
        log.iter().filter(|l| l.1 == FaultKind::Missing).count(),
        2,
        "{log:?}"
    );
    // Argument checks.
    assert!(matches!(
        r.view_write_words(p, 511, &[0; 16]),
        Err(OpError::BadWords { .. })
    ));
    assert!(matches!(
        r.view_write_words(p, 0, &[0; 7]),
        Err(OpError::BadWords { .. })
    ));
    assert!(matches!(
        r.view_read(PageIndex(8), &mut buf),
        Err(OpError::OutOfRange(_))
    ));
    assert!(matches!(
        r.view_equals(PageIndex(8), &buf),
        Err(OpError::OutOfRange(_))
    ));
    let anon = Region::new(
        RegionConfig::new(base(51), PAGE_SIZE),
        Arc::new(|_: &RegionOps, _: Fault| {}),
    )
    .unwrap();
    assert_eq!(anon.view_ptr(), None);
    assert_eq!(anon.view_read(PageIndex(0), &mut buf), Err(OpError::NoView));
    assert_eq!(anon.view_equals(PageIndex(0), &buf), Err(OpError::NoView));
}

#[test]
fn zero_fill_installs() {
    let rec = Arc::new(Recorder::default());
    let r = Region::new(RegionConfig::new(base(4), 4 * PAGE_SIZE), rec.clone()).unwrap();
    assert_eq!(
        r.install_zero(PageIndex(0), Protection::Writable),
        Ok(Install::Installed)
    );
    assert_eq!(
        r.install_zero(PageIndex(1), Protection::ReadOnly),
        Ok(Install::Installed)
    );
    assert_eq!(read(&r, 0, 9), 0);
    assert_eq!(read(&r, 1, 9), 0);
    write(&r, 0, 9, 1); // kernel copy-on-write of the zero page, no userfaultfd fault
    write(&r, 1, 9, 1); // write-protect fault
    assert_eq!((read(&r, 0, 9), read(&r, 1, 9)), (1, 1));
    assert_eq!(
        rec.log.lock().clone(),
        vec![(1, FaultKind::WriteProtect, Access::Write)]
    );
}

#[test]
fn invalidation_is_batched_per_contiguous_run() {
    let noop = Arc::new(|_: &RegionOps, _: Fault| {});
    let r = Region::new(RegionConfig::new(base(5), 128 * PAGE_SIZE), noop).unwrap();
    for p in 0..128 {
        let _ = r
            .install(PageIndex(p), &pattern(PageIndex(p)), Protection::Writable)
            .unwrap();
    }
    let calls = r
        .invalidate_pages((0..64).chain(70..80).chain([100]).map(PageIndex))
        .unwrap();
    assert_eq!(calls, 3);
    let mut buf = [0u8; PAGE_SIZE];
    for p in 0..128 {
        let gone = p < 64 || (70..80).contains(&p) || p == 100;
        assert_eq!(
            r.try_read_page(PageIndex(p), &mut buf).is_err(),
            gone,
            "page {p}"
        );
    }
}

/// Serves missing faults, counting installs per page. The first fault of each page of
/// the shared half waits a little before installing, so that the other threads fault on
/// the same page meanwhile and lose the install race.
struct Counter {
    installed: Vec<AtomicUsize>,
    already: AtomicUsize,
    calls: AtomicUsize,
    shared_pages: usize,
}

impl FaultResolver for Counter {
    fn resolve(&self, region: &RegionOps, fault: Fault) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        match fault.kind {
            FaultKind::Missing => {
                if fault.page.0 < self.shared_pages {
                    std::thread::sleep(Duration::from_micros(300));
                }
                let prot = if fault.access == Access::Write {
                    Protection::Writable
                } else {
                    Protection::ReadOnly
                };
                match region
                    .install(fault.page, &pattern(fault.page), prot)
                    .unwrap()
                {
                    Install::Installed => {
                        self.installed[fault.page.0].fetch_add(1, Ordering::SeqCst);
                    }
                    Install::AlreadyPresent => {
                        self.already.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            FaultKind::WriteProtect => region.unprotect(PageRange::one(fault.page)).unwrap(),
        }
    }
}

fn exactly_once(slot: usize, delivery: Delivery) {
    const PAGES: usize = 256;
    const THREADS: usize = 8;
    let counter = Arc::new(Counter {
        installed: (0..PAGES).map(|_| AtomicUsize::new(0)).collect(),
        already: AtomicUsize::new(0),
        calls: AtomicUsize::new(0),
        shared_pages: 16,
    });
    let r = Arc::new(
        Region::new(
            RegionConfig::new(base(slot), PAGES * PAGE_SIZE).with_delivery(delivery),
            counter.clone(),
        )
        .unwrap(),
    );
    for round in 1..=2 {
        let barrier = Arc::new(Barrier::new(THREADS));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let r = Arc::clone(&r);
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    barrier.wait();
                    // First half: every thread walks the same pages in the same order
                    // (same-page races); second half: each its own permutation.
                    for i in 0..PAGES {
                        let page = if i < PAGES / 2 {
                            i
                        } else {
                            PAGES / 2 + (i * 37 + t * 11) % (PAGES / 2)
                        };
                        let off = (t * 8 + i) % PAGE_SIZE;
                        if (t + i) % 3 == 0 {
                            write(&r, page, 4000 + t, t as u8);
                        }
                        assert_eq!(read(&r, page, off), pattern(PageIndex(page))[off]);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // An install wakes the faulting threads before the resolver counts it, so a handler
        // thread preempted between the two may still owe its count: wait for it (bounded).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while counter
            .installed
            .iter()
            .any(|n| n.load(Ordering::SeqCst) < round)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        for (p, n) in counter.installed.iter().enumerate() {
            assert_eq!(n.load(Ordering::SeqCst), round, "{delivery:?}: page {p}");
        }
        // Invalidate everything in one call; the next round refaults every page.
        assert_eq!(r.invalidate_pages((0..PAGES).map(PageIndex)).unwrap(), 1);
    }
    let lost = counter.already.load(Ordering::Relaxed);
    println!(
        "{delivery:?}: {} resolver calls, {lost} lost install races (EEXIST)",
        counter.calls.load(Ordering::Relaxed),
    );
    assert!(lost > 0, "the same-page races must have happened");
}

#[test]
fn concurrent_faults_install_each_page_exactly_once_signal() {
    exactly_once(20, Delivery::Signal);
}

#[test]
fn concurrent_faults_install_each_page_exactly_once_threads() {
    exactly_once(
        21,
        Delivery::Threads {
            threads: 2,
            spin: Duration::from_micros(20),
        },
    );
}

#[test]
fn drop_stops_delivery_and_unmaps() {
    for (i, (_, delivery)) in MODES.into_iter().enumerate() {
        let marker = Arc::new(());
        let m = marker.clone();
        let resolver = Arc::new(move |region: &RegionOps, fault: Fault| {
            let _keep = &m;
            let _ = region.install_zero(fault.page, Protection::Writable);
        });
        let cfg = RegionConfig::new(base(30 + i), 4 * PAGE_SIZE).with_delivery(delivery);
        let r = Region::new(cfg, resolver).unwrap();
        write(&r, 1, 0, 3);
        assert_eq!(read(&r, 1, 0), 3);
        assert!(Arc::strong_count(&marker) > 1);
        drop(r);
        // Handler threads joined, signal slot released: the resolver is gone.
        assert_eq!(Arc::strong_count(&marker), 1, "{delivery:?}");
        // The range is unmapped: it can be reserved again.
        let again = Region::new(cfg, Arc::new(|_: &RegionOps, _: Fault| {}));
        assert!(again.is_ok(), "{again:?}");
    }
}

#[test]
fn signal_handler_is_installed_and_current() {
    install_sigbus_handler().unwrap();
    assert!(sigbus_handler_installed());
}
