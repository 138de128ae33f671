//! `multigrain bench dsm`: the DSM runtime's fault path and lock hand-off beside their
//! baselines, sampled in alternation with them in the same run — raw UDP round trips
//! (busy-polled, also answered by a 4 KiB datagram; blocking as the weak baseline), a
//! bare userfaultfd fault, a 4 KiB copy, Express round trips over shared memory, a
//! one-way bulk message of a hand-off's size over shared memory and one-way Express
//! through INIs — plus a barrier of two clusters, write fault and release cost per page
//! and diff throughput (issues 4 and 10; kernels in `multigrain_dsm::bench`).

use crate::measure::{Summary, Table, Target, interleave_with, sum_series, write_json};
use anyhow::{Context, Result};
use multigrain_bench::cross_process::PingPong;
use multigrain_bench::network::{self as net, UdpWait};
use multigrain_bench::sizes::Kind as MessageKind;
use multigrain_cluster_config::{IniPolicy, Protocol};
use multigrain_dsm::bench::{
    self as kernels, BareFault, BareWriteFault, BarrierPair, LockHandoff, PageCopy, Pair,
};
use std::time::Duration;

/// How much work each row does.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Operations timed per row, over all its samples.
    pub ops: usize,
    /// Samples per row (rounds of the alternation).
    pub samples: usize,
}

/// Local (home) pages of a pair: the local-fault row can time at most this many faults.
const LOCAL_PAGES: usize = Pair::HALF;

/// The median of per-operation samples (ns), in µs.
fn median_us(samples: &[u64]) -> Result<f64> {
    anyhow::ensure!(!samples.is_empty(), "a kernel timed no operation");
    let v: Vec<f64> = samples.iter().map(|&ns| ns as f64 / 1e3).collect();
    Ok(Summary::of(&v).median)
}

/// Bytes of the bulk-message baseline: about what one hand-off sends over shared memory
/// (a bundle with a grant or a release carrying the 64 bytes' diff and its write notice:
/// 134–146 bytes of coherence messages in `bench dsm`'s hand-off, 2026-12-02, plus the
/// bundle's framing), rounded up.
const HANDOFF_BULK_BYTES: usize = 256;

/// Untimed hand-offs (barriers) before each round's timed ones: the ping-pong baselines'
/// warm-up.
const HANDOFF_WARM_UP: usize = multigrain_bench::WARM_UP as usize;

/// Virtual addresses for the benchmark regions, away from the job default.
fn base(slot: usize) -> usize {
    0x4800_0000_0000 + slot * (1 << 36)
}

/// One protocol's jobs: fault pairs, lock hand-offs and barrier pairs, over shared memory
/// and over INIs.
struct Subjects {
    protocol: Protocol,
    fault_shm: Pair,
    fault_net: Pair,
    handoff_shm: LockHandoff,
    handoff_net: LockHandoff,
    barrier_shm: BarrierPair,
    barrier_net: BarrierPair,
}

impl Subjects {
    /// The jobs of `protocol`: fault pairs and hand-offs at [`base`] slots `first_slot`
    /// to `first_slot + 3`, barrier pairs at `barrier_slot` and `barrier_slot + 1`.
    fn new(protocol: Protocol, first_slot: usize, barrier_slot: usize) -> Result<Subjects> {
        let p = protocol.as_str();
        Ok(Subjects {
            protocol,
            fault_shm: Pair::new(protocol, base(first_slot))
                .with_context(|| format!("{p}: two clusters over shared memory"))?,
            fault_net: Pair::over(protocol, base(first_slot + 1), true)
                .with_context(|| format!("{p}: two clusters over INIs"))?,
            handoff_shm: LockHandoff::new(protocol, base(first_slot + 2), false)
                .with_context(|| format!("{p}: lock hand-off over shared memory"))?,
            handoff_net: LockHandoff::new(protocol, base(first_slot + 3), true)
                .with_context(|| format!("{p}: lock hand-off over INIs"))?,
            barrier_shm: BarrierPair::new(protocol, base(barrier_slot), false)
                .with_context(|| format!("{p}: barriers over shared memory"))?,
            barrier_net: BarrierPair::new(protocol, base(barrier_slot + 1), true)
                .with_context(|| format!("{p}: barriers over INIs"))?,
        })
    }

    fn finish(self) -> Result<()> {
        let p = self.protocol.as_str();
        self.fault_shm
            .finish()
            .with_context(|| format!("{p}: finishing the shared-memory pair"))?;
        self.fault_net
            .finish()
            .with_context(|| format!("{p}: finishing the INI pair"))?;
        self.handoff_shm
            .finish()
            .with_context(|| format!("{p}: finishing the shared-memory lock hand-off"))?;
        self.handoff_net
            .finish()
            .with_context(|| format!("{p}: finishing the INI lock hand-off"))?;
        self.barrier_shm
            .finish()
            .with_context(|| format!("{p}: finishing the shared-memory barrier pair"))?;
        self.barrier_net
            .finish()
            .with_context(|| format!("{p}: finishing the INI barrier pair"))?;
        Ok(())
    }
}

/// The protocols measured, in order (`K`'s protocol index).
const PROTOCOLS: [Protocol; 2] = [Protocol::Hlrc, Protocol::Sc];

/// The shares of a page's words changed in the diff rows, % (`K`'s diff index).
const DIFF_SHARES: [u32; 3] = [1, 10, 100];

/// The diff rows of the hand-off's data path: a hand-off changes 64 bytes of a page.
const HANDOFF_DIFF: usize = 0;
const _: () = assert!(
    DIFF_SHARES[HANDOFF_DIFF] == 1,
    "the data path's diff share is 1 %"
);

/// A kernel of a round; a subject's field is its protocol's index in [`PROTOCOLS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum K {
    UdpBusy,
    /// A busy-polled UDP round trip whose answer is a page (informational floor of the
    /// fault through INIs).
    UdpBusyPage,
    UdpBlocking,
    BareFault,
    /// The bare fault as the DSM region installs pages (shared memory, minor faults;
    /// informational).
    BareFaultShm,
    BareWriteFault,
    PageCopy,
    ExpressShmRtt,
    /// One-way bulk message of [`HANDOFF_BULK_BYTES`] between two processes over shared
    /// memory (ping-pong ÷ 2).
    BulkShmOneWay,
    ExpressIniOneWay,
    Local(usize),
    RemoteShm(usize),
    RemoteNet(usize),
    /// The remote read faults again, the home's compute thread polling in the runtime.
    RemoteShmPolling(usize),
    RemoteNetPolling(usize),
    Write(usize),
    Release(usize),
    HandoffShm(usize),
    HandoffNet(usize),
    /// Barriers of two clusters with nothing written between them.
    BarrierShm(usize),
    BarrierNet(usize),
    /// Copying a page warm in the cache: the diff rows' baseline.
    WarmCopy,
    /// Encoding the diff of a page with [`DIFF_SHARES`]`[i]` % of its words changed.
    Encode(usize),
    /// Applying that diff to a page.
    Apply(usize),
}

/// The kernels of one round, in order: each subject runs right after the baselines it is
/// compared with or after the previous subject, all within one round.
fn kernel_order() -> Vec<K> {
    let mut order = vec![
        K::UdpBusy,
        K::UdpBusyPage,
        K::UdpBlocking,
        K::BareFault,
        K::BareFaultShm,
        K::BareWriteFault,
        K::PageCopy,
        K::ExpressShmRtt,
        K::BulkShmOneWay,
        K::ExpressIniOneWay,
    ];
    for i in 0..PROTOCOLS.len() {
        order.extend([
            K::Local(i),
            K::RemoteShm(i),
            K::RemoteShmPolling(i),
            K::RemoteNet(i),
            K::RemoteNetPolling(i),
            K::Write(i),
            K::Release(i),
            K::HandoffShm(i),
            K::HandoffNet(i),
            K::BarrierShm(i),
            K::BarrierNet(i),
        ]);
    }
    order.push(K::WarmCopy);
    for j in 0..DIFF_SHARES.len() {
        order.extend([K::Encode(j), K::Apply(j)]);
    }
    order
}

/// Runs the benchmark and prints the table (and writes JSON if asked).
pub fn run(opts: Options, json: Option<&std::path::Path>) -> Result<()> {
    anyhow::ensure!(
        opts.samples >= 3,
        "--samples must be at least 3 (median and quartiles), got {}",
        opts.samples
    );
    anyhow::ensure!(
        opts.ops >= opts.samples,
        "--ops must be at least --samples ({}): every sample times at least one operation, got {}",
        opts.samples,
        opts.ops
    );
    let batch = opts.ops / opts.samples;
    anyhow::ensure!(
        batch * opts.samples <= LOCAL_PAGES,
        "--ops {} is too large: the local-fault row touches each of a pair's {LOCAL_PAGES} home pages once (at most {LOCAL_PAGES} operations per row)",
        opts.ops
    );
    let rounds = opts.samples;
    let progress = crate::progress::bar((rounds * kernel_order().len()) as u64, "bench dsm");

    // Baseline sources.
    let mut bare = BareFault::new(base(0)).context("mapping the bare-fault region")?;
    let mut bare_shm =
        BareFault::like_dsm(base(10)).context("mapping the DSM-like bare-fault region")?;
    let mut bare_write =
        BareWriteFault::new(base(9)).context("mapping the bare write-protect-fault region")?;
    let mut copy = PageCopy::new();
    let exe = std::env::current_exe()
        .context("locating the multigrain binary to start the Express peer process")?;
    let shm_peer = PingPong::start(std::process::Command::new(exe))
        .map_err(anyhow::Error::msg)
        .context("starting the peer process of the Express round trip over shared memory")?;
    let ini_pair = net::Pair::new(1, IniPolicy::Static);
    // Subjects.
    let mut subjects = PROTOCOLS
        .iter()
        .enumerate()
        // Slots 0, 9 and 10 hold the bare-fault regions.
        .map(|(i, &p)| Subjects::new(p, 1 + 4 * i, 11 + 2 * i))
        .collect::<Result<Vec<_>>>()?;

    // (twin, current) page pairs of the diff rows.
    let diff_pages = DIFF_SHARES.map(|pct| kernels::diff_pages(f64::from(pct) / 100.0));
    let b = batch;
    let bu = b as u64;
    let us_per_op = |d: Duration| d.as_secs_f64() * 1e6 / b as f64;
    let releases = (b / 64).max(1);
    let order = kernel_order();
    let data = interleave_with(rounds, order.len(), &progress, |k| match order[k] {
        K::UdpBusy => median_us(&kernels::udp_round_trips(b, UdpWait::BusyPoll)),
        K::UdpBusyPage => median_us(&kernels::udp_page_round_trips(b, UdpWait::BusyPoll)),
        K::UdpBlocking => median_us(&kernels::udp_round_trips(b, UdpWait::Blocking)),
        K::BareFault => median_us(&(0..b).map(|_| bare.fault()).collect::<Vec<_>>()),
        K::BareFaultShm => median_us(&(0..b).map(|_| bare_shm.fault()).collect::<Vec<_>>()),
        K::BareWriteFault => median_us(&(0..b).map(|_| bare_write.fault()).collect::<Vec<_>>()),
        K::PageCopy => Ok(copy.copies(b) / 1e3),
        K::ExpressShmRtt => Ok(us_per_op(shm_peer.express(bu))),
        K::BulkShmOneWay => Ok(us_per_op(shm_peer.sized_pingpong(
            MessageKind::Bulk,
            HANDOFF_BULK_BYTES,
            (multigrain_bench::WARM_UP, bu),
        )) / 2.0),
        K::ExpressIniOneWay => Ok(us_per_op(net::express_pingpong(&ini_pair, bu)) / 2.0),
        K::Local(i) => median_us(&subjects[i].fault_shm.local_read_faults(b)),
        K::RemoteShm(i) => median_us(
            &subjects[i]
                .fault_shm
                .remote_read_faults(b, Duration::ZERO)?,
        ),
        K::RemoteNet(i) => median_us(
            &subjects[i]
                .fault_net
                .remote_read_faults(b, Duration::ZERO)?,
        ),
        K::RemoteShmPolling(i) => {
            median_us(&subjects[i].fault_shm.remote_read_faults_home_polling(b)?)
        }
        K::RemoteNetPolling(i) => {
            median_us(&subjects[i].fault_net.remote_read_faults_home_polling(b)?)
        }
        K::Write(i) => median_us(&subjects[i].fault_shm.write_faults(b)?),
        K::Release(i) => {
            let pair = &mut subjects[i].fault_shm;
            let v = (0..releases)
                .map(|_| pair.release_per_page(64))
                .collect::<Result<Vec<u64>, _>>()?;
            median_us(&v)
        }
        // Warmed up as the ping-pong baselines are (their first WARM_UP round trips are
        // not timed).
        K::HandoffShm(i) => Ok(us_per_op(
            subjects[i].handoff_shm.handoffs(HANDOFF_WARM_UP, b)?,
        )),
        K::HandoffNet(i) => Ok(us_per_op(
            subjects[i].handoff_net.handoffs(HANDOFF_WARM_UP, b)?,
        )),
        K::BarrierShm(i) => Ok(us_per_op(
            subjects[i].barrier_shm.barriers(HANDOFF_WARM_UP, b)?,
        )),
        K::BarrierNet(i) => Ok(us_per_op(
            subjects[i].barrier_net.barriers(HANDOFF_WARM_UP, b)?,
        )),
        K::WarmCopy => median_us(&kernels::page_copy_warm(&diff_pages[0].1, b)),
        K::Encode(j) => median_us(&kernels::diff_encode(&diff_pages[j].0, &diff_pages[j].1, b)),
        K::Apply(j) => median_us(&kernels::diff_apply(&diff_pages[j].0, &diff_pages[j].1, b)),
    })?;
    let col = |k: K| -> &[f64] {
        let at = order
            .iter()
            .position(|&x| x == k)
            .expect("every kernel ran");
        &data[at]
    };

    let mut t = Table::default();
    let [
        udp_busy,
        udp_blocking,
        bare_fault,
        bare_write_fault,
        page_copy,
        express_shm_rtt,
        bulk_shm,
        express_ini,
    ] = [
        K::UdpBusy,
        K::UdpBlocking,
        K::BareFault,
        K::BareWriteFault,
        K::PageCopy,
        K::ExpressShmRtt,
        K::BulkShmOneWay,
        K::ExpressIniOneWay,
    ]
    .map(col);
    let g = "Baselines (µs per operation; ends of a ping-pong pinned to different CPUs)";
    t.push(g, "UDP round trip, 8 B, busy-polled", "µs", udp_busy);
    let udp_busy_page = col(K::UdpBusyPage);
    t.push(
        g,
        "  the same, answered by 4 KiB (a page fetch's shape)",
        "µs",
        udp_busy_page,
    );
    t.push(
        g,
        "UDP round trip, 8 B, blocking (weak baseline)",
        "µs",
        udp_blocking,
    );
    t.push(g, "bare userfaultfd read fault", "µs", bare_fault);
    let bare_fault_shm = col(K::BareFaultShm);
    t.push(
        g,
        "  the same as the DSM region installs pages (shm, minor faults)",
        "µs",
        bare_fault_shm,
    );
    t.push(
        g,
        "bare write-protect fault (SIGBUS + unprotect, shm)",
        "µs",
        bare_write_fault,
    );
    t.push(g, "4 KiB page copy", "µs", page_copy);
    t.push(
        g,
        "Express round trip, shared memory (process↔process)",
        "µs",
        express_shm_rtt,
    );
    t.push(
        g,
        format!("bulk message one-way, {HANDOFF_BULK_BYTES} B, shared memory (process↔process)"),
        "µs",
        bulk_shm,
    );
    t.push(
        g,
        "Express one-way through INIs (UDP loopback)",
        "µs",
        express_ini,
    );
    let udp_fault = sum_series(&[udp_busy, bare_fault]);
    // The same floor with the page in the answer (informational: the target stays
    // against the 8-byte round trip).
    let udp_page_fault = sum_series(&[udp_busy_page, bare_fault]);
    let weak_udp_fault = sum_series(&[udp_blocking, bare_fault]);
    let shm_floor = sum_series(&[bare_fault, page_copy, express_shm_rtt]);
    // The same floor with the install the DSM's shared-memory regions pay (informational:
    // the target stays against the cheaper anonymous fault).
    let shm_backing_floor = sum_series(&[bare_fault_shm, page_copy, express_shm_rtt]);
    let handoff_shm_floor: Vec<f64> = express_shm_rtt.iter().map(|rtt| rtt + 1.0).collect();
    // A barrier of two clusters is at least an arrival and a departure: a round trip.
    let express_ini_rtt: Vec<f64> = express_ini.iter().map(|one_way| 2.0 * one_way).collect();
    // What any hand-off that moves the protected bytes as a page diff in a bulk message
    // pays before a coherence machine does anything: the diff's encoding, the message,
    // the diff's application (the diff rows of 1 % of a page's words, same round).
    let handoff_data_path = sum_series(&[
        bulk_shm,
        col(K::Encode(HANDOFF_DIFF)),
        col(K::Apply(HANDOFF_DIFF)),
    ]);
    t.push(g, "= busy UDP round trip + bare fault", "µs", &udp_fault);
    t.push(
        g,
        "= busy UDP round trip with a 4 KiB answer + bare fault",
        "µs",
        &udp_page_fault,
    );
    t.push(
        g,
        "= bare fault + 4 KiB copy + Express round trip",
        "µs",
        &shm_floor,
    );
    t.push(
        g,
        "= 2 × one-way Express (shared memory) + 1 µs",
        "µs",
        &handoff_shm_floor,
    );
    t.push(
        g,
        "= one-way bulk message + diff encode + apply (1 % of a page)",
        "µs",
        &handoff_data_path,
    );

    for (i, protocol) in PROTOCOLS.iter().enumerate() {
        let g: &'static str = match protocol {
            Protocol::Hlrc => "hlrc (µs per operation)",
            Protocol::Sc => "sc (µs per operation)",
        };
        let [
            local,
            remote_shm,
            remote_shm_polling,
            remote_net,
            remote_net_polling,
            write,
            release,
            handoff_shm,
            handoff_net,
            barrier_shm,
            barrier_net,
        ] = [
            K::Local(i),
            K::RemoteShm(i),
            K::RemoteShmPolling(i),
            K::RemoteNet(i),
            K::RemoteNetPolling(i),
            K::Write(i),
            K::Release(i),
            K::HandoffShm(i),
            K::HandoffNet(i),
            K::BarrierShm(i),
            K::BarrierNet(i),
        ]
        .map(col);
        t.compare(
            g,
            "local fault (page homed here)",
            "µs",
            local,
            ("bare fault", bare_fault),
            None,
        );
        t.compare(
            g,
            "remote read fault, shared memory",
            "µs",
            remote_shm,
            ("fault+copy+Express RTT", &shm_floor),
            Some(Target::at_most(1.5, "≤ 1.5× (fault + copy + RTT)")),
        );
        t.compare(
            g,
            "remote read fault, shared memory, the home's thread polling",
            "µs",
            remote_shm_polling,
            ("fault+copy+Express RTT", &shm_floor),
            Some(Target::at_most(1.5, "≤ 1.5× (fault + copy + RTT)")),
        );
        t.compare(
            g,
            "  the same, against the floor with the DSM region's bare fault",
            "µs",
            remote_shm_polling,
            ("DSM fault+copy+RTT", &shm_backing_floor),
            None,
        );
        t.compare(
            g,
            "remote read fault, INIs over UDP",
            "µs",
            remote_net,
            ("busy UDP RTT + fault", &udp_fault),
            Some(Target::at_most(1.5, "≤ 1.5× (busy UDP RTT + fault)")),
        );
        // Right under the row it compares (the home's threads asleep), so that "the same"
        // names that row.
        t.compare(
            g,
            "  the same, against the weak baseline",
            "µs",
            remote_net,
            ("blocking UDP RTT + fault", &weak_udp_fault),
            None,
        );
        t.compare(
            g,
            "remote read fault, INIs over UDP, the home's thread polling",
            "µs",
            remote_net_polling,
            ("busy UDP RTT + fault", &udp_fault),
            Some(Target::at_most(1.5, "≤ 1.5× (busy UDP RTT + fault)")),
        );
        t.compare(
            g,
            "  the same, against the floor with a 4 KiB answer",
            "µs",
            remote_net_polling,
            ("busy UDP 4K RTT + fault", &udp_page_fault),
            None,
        );
        t.compare(
            g,
            if *protocol == Protocol::Hlrc {
                "write fault (twin + unprotect)"
            } else {
                "write fault (ownership)"
            },
            "µs",
            write,
            ("bare write-protect fault", bare_write_fault),
            None,
        );
        t.push(g, "release, per page of 64 dirty", "µs", release);
        t.compare(
            g,
            "lock hand-off + 64 B, shared memory",
            "µs",
            handoff_shm,
            ("2×one-way Express+1µs", &handoff_shm_floor),
            Some(Target::at_most(1.0, "≤ 2 × one-way Express + 1 µs")),
        );
        t.compare(
            g,
            "  the same, against its data path",
            "µs",
            handoff_shm,
            ("bulk one-way + diff", &handoff_data_path),
            None,
        );
        t.compare(
            g,
            "lock hand-off + 64 B, INIs over UDP",
            "µs",
            handoff_net,
            ("one-way Express (INIs)", express_ini),
            Some(Target::at_most(1.5, "≤ 1.5× one-way Express (INIs)")),
        );
        t.compare(
            g,
            "barrier of two clusters, nothing written, shared memory",
            "µs",
            barrier_shm,
            ("Express RTT (shm)", express_shm_rtt),
            None,
        );
        t.compare(
            g,
            "barrier of two clusters, nothing written, INIs over UDP",
            "µs",
            barrier_net,
            ("2 × one-way Express (INIs)", &express_ini_rtt),
            None,
        );
    }
    let g = "Lock hand-off: lock acquires per hand-off, all rounds (1 = no holder took the lock out of turn)";
    for s in &subjects {
        for (via, h) in [
            ("shared memory", &s.handoff_shm),
            ("INIs over UDP", &s.handoff_net),
        ] {
            let per = h.lock_acquires() as f64 / h.updates().max(1) as f64;
            t.push(g, format!("{}, {via}", s.protocol.as_str()), "acq", &[per]);
        }
    }
    for s in subjects {
        s.finish()?;
    }
    drop((bare, bare_write, shm_peer, ini_pair));

    let g = "Diffs of a 4 KiB page (µs per page, each round's median; baseline: copying the page, warm in the cache, in the same round)";
    let warm_copy = col(K::WarmCopy);
    t.push(g, "4 KiB copy, warm (baseline)", "µs", warm_copy);
    for (j, pct) in DIFF_SHARES.iter().enumerate() {
        for (k, what) in [(K::Encode(j), "encode"), (K::Apply(j), "apply")] {
            t.compare(
                g,
                format!("{what}, {pct}% of words changed"),
                "µs",
                col(k),
                ("warm 4 KiB copy", warm_copy),
                None,
            );
        }
    }
    progress.finish_and_clear();
    println!(
        "multigrain bench dsm: {rounds} samples per row, each the median (faults, UDP round trips, releases) or mean (copies, Express, hand-offs, barriers) of {batch} operations; every kernel runs once per round, so each row's samples alternate with its baselines'; ratio = median of the per-pair ratios (sample i / baseline sample i), with their p25–p75; two clusters in this process (block homes for faults; the hand-off's 64 bytes homed at cluster 0)"
    );
    t.print();
    if let Some(path) = json {
        write_json(path, &t.rows)?;
        println!("\nwrote {}", path.display());
    }
    Ok(())
}
