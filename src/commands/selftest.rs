//! `multigrain selftest`: every compute thread of every cluster sends Express and Tag-On
//! messages to every other cluster, and every receiver checks that each arrives exactly
//! once, in order per (sender thread, destination queue), with its exact payload. Run it
//! under `multigrain launch` (or srun) to check a topology's network end to end.

use anyhow::{Context, Result, bail};
use multigrain_cluster_config::JobConfig;
use multigrain_messaging::job::Job;
use multigrain_messaging::{
    Destination, Express, Handler, Message, QueueId, QueueSpec, SendError, SiteConfig, SiteId,
    SourceId, VirtualName,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Most compute threads per cluster (the source id packs cluster × 64 + thread).
const MAX_THREADS: usize = 64;
const EXPRESS: Handler = Handler(1);
const TAG_ON: Handler = Handler(2);

/// What to send.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Express messages from each cluster to each other cluster.
    pub express: u64,
    /// 4 KiB Tag-On messages from each cluster to each other cluster.
    pub tag_on: u64,
    /// Give up (and fail) after this long.
    pub timeout: Duration,
}

/// A thread's share of `total` messages: threads split them as evenly as possible.
fn share(total: u64, threads: usize, t: usize) -> u64 {
    total / threads as u64 + u64::from((t as u64) < total % threads as u64)
}

fn page(cluster: usize, thread: usize, seq: u64) -> Vec<u8> {
    let seed = (cluster as u64) << 48 ^ (thread as u64) << 40 ^ seq;
    (0..512u64)
        .flat_map(|w| (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ w).to_le_bytes())
        .collect()
}

/// Per (source) expected next sequence numbers of one receiving thread.
struct Verifier {
    me: usize,
    queue: usize,
    next_express: Vec<u64>,
    next_tag_on: Vec<u64>,
    expected_express: u64,
    expected_tag_on: u64,
    got_express: u64,
    got_tag_on: u64,
    /// Express and Tag-On messages expected from each source (cluster × 64 + thread).
    from_source: Vec<(u64, u64)>,
}

impl Verifier {
    fn take(&mut self, m: Message) -> Result<()> {
        let src = usize::from(m.source().get());
        let (c, t) = (src / MAX_THREADS, src % MAX_THREADS);
        match m {
            Message::Express(e) if e.handler == EXPRESS => {
                let want = self.next_express[src];
                if e.payload != want {
                    bail!(
                        "cluster {} queue {}: Express from cluster {c} thread {t} out of order: got #{}, expected #{want}",
                        self.me,
                        self.queue,
                        e.payload
                    );
                }
                self.next_express[src] += 1;
                self.got_express += 1;
            }
            Message::TagOn(m) if m.handler == TAG_ON => {
                let want = self.next_tag_on[src];
                if m.data.tag() != want {
                    bail!(
                        "cluster {} queue {}: Tag-On from cluster {c} thread {t} out of order: got #{}, expected #{want}",
                        self.me,
                        self.queue,
                        m.data.tag()
                    );
                }
                if *m.data != page(c, t, want)[..] {
                    bail!(
                        "cluster {} queue {}: Tag-On #{want} from cluster {c} thread {t} has corrupted data",
                        self.me,
                        self.queue
                    );
                }
                self.next_tag_on[src] += 1;
                self.got_tag_on += 1;
            }
            other => bail!(
                "cluster {}: unexpected {} message from source {src}",
                self.me,
                other.kind_name()
            ),
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.got_express == self.expected_express && self.got_tag_on == self.expected_tag_on
    }

    /// What this receiver still waits for: each source with messages missing, and how
    /// many of its messages arrived.
    fn waiting_for(&self) -> String {
        let missing: Vec<String> = self
            .from_source
            .iter()
            .enumerate()
            .filter(|&(src, &(e, t))| self.next_express[src] < e || self.next_tag_on[src] < t)
            .map(|(src, &(e, t))| {
                format!(
                    "cluster {} thread {}: {} of {e} Express, {} of {t} Tag-On",
                    src / MAX_THREADS,
                    src % MAX_THREADS,
                    self.next_express[src],
                    self.next_tag_on[src]
                )
            })
            .collect();
        format!(
            "cluster {} queue {} waits for messages from {}",
            self.me,
            self.queue,
            missing.join("; ")
        )
    }
}

/// Runs the self-test as one cluster of the job described by `cfg`.
pub fn run(
    cfg: &JobConfig,
    opts: Options,
    stats: bool,
    stats_json: Option<&std::path::Path>,
) -> Result<()> {
    if let Some(c) = cfg.clusters.iter().find(|c| c.threads > MAX_THREADS) {
        bail!(
            "cluster {} has {} threads; selftest supports at most {MAX_THREADS} per cluster",
            c.id,
            c.threads
        );
    }
    let threads: Vec<usize> = cfg.clusters.iter().map(|c| c.threads).collect();
    let site_config = SiteConfig {
        queues: (0..threads.iter().copied().max().unwrap_or(1))
            .map(|q| QueueSpec {
                express_capacity: 4096,
                basic_capacity: 1,
                doorbell: q as u16,
            })
            .collect(),
        pool_slots: 8192,
        max_sites: cfg.clusters.len().max(2),
        ..SiteConfig::default()
    };
    let job = Job::join_from_env(cfg, site_config).context("joining the job")?;
    let me = job.cluster();
    let n = job.clusters();
    let t_me = threads[me];
    let failed = AtomicBool::new(false);
    let started = Instant::now();
    let deadline = started + opts.timeout;
    let results: Vec<Result<(u64, u64)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..t_me)
            .map(|t| {
                let (ep, w) = job
                    .site()
                    .create_endpoint(&[QueueId(t as u16)])
                    .expect("queue exists");
                for (d, &threads_d) in threads.iter().enumerate() {
                    let dest = Destination {
                        site: SiteId(d as u16),
                        queue: QueueId((t % threads_d) as u16),
                        source: SourceId::new((me * MAX_THREADS + t) as u16).expect("fits 14 bits"),
                    };
                    w.map(VirtualName(d as u16), dest).expect("table has room");
                }
                ep.set_thread_index(t);
                let (job, failed, threads) = (&job, &failed, &threads);
                scope.spawn(move || -> Result<(u64, u64)> {
                    let _keep_table = w;
                    // Express and Tag-On messages this queue receives from each source
                    // (cluster × 64 + thread): sender x of cluster s sends to queue
                    // x mod t_me.
                    let from_source: Vec<(u64, u64)> = (0..n * MAX_THREADS)
                        .map(|src| {
                            let (s, x) = (src / MAX_THREADS, src % MAX_THREADS);
                            if s == me || x >= threads[s] || x % t_me != t {
                                (0, 0)
                            } else {
                                (
                                    share(opts.express, threads[s], x),
                                    share(opts.tag_on, threads[s], x),
                                )
                            }
                        })
                        .collect();
                    let mut v = Verifier {
                        me,
                        queue: t,
                        next_express: vec![0; n * MAX_THREADS],
                        next_tag_on: vec![0; n * MAX_THREADS],
                        expected_express: from_source.iter().map(|&(e, _)| e).sum(),
                        expected_tag_on: from_source.iter().map(|&(_, t)| t).sum(),
                        got_express: 0,
                        got_tag_on: 0,
                        from_source,
                    };
                    let mut err = None;
                    // `stage` says what the thread was doing, for the timeout's report.
                    let check = |err: &Option<anyhow::Error>, stage: &dyn Fn() -> String| -> Result<()> {
                        if failed.load(Ordering::Relaxed) {
                            bail!("stopping: another thread failed");
                        }
                        if let Some(f) = job.failure() {
                            bail!("{f}");
                        }
                        if Instant::now() > deadline {
                            bail!(
                                "cluster {me} thread {t}: timed out after {:?} while {}",
                                opts.timeout,
                                stage()
                            );
                        }
                        if let Some(e) = err {
                            bail!("{e:#}");
                        }
                        Ok(())
                    };
                    let (ne, nt) = (share(opts.express, t_me, t), share(opts.tag_on, t_me, t));
                    let every = ne.checked_div(nt).map_or(u64::MAX, |e| e.max(1));
                    let mut tag_seq = vec![0u64; n];
                    for i in 0..ne.max(nt) {
                        for d in (0..n).filter(|&d| d != me) {
                            let mut on = |m: Message| {
                                if err.is_none()
                                    && let Err(e) = v.take(m)
                                {
                                    err = Some(e);
                                }
                            };
                            if i < ne {
                                let mut msg = Express::new(EXPRESS, i).expect("fits");
                                loop {
                                    match ep.send_express_blocking(
                                        VirtualName(d as u16),
                                        msg,
                                        Some(Duration::from_millis(100)),
                                        &mut on,
                                    ) {
                                        Ok(()) => break,
                                        Err(SendError::Timeout(m)) => {
                                            msg = m;
                                            check(&None, &|| {
                                                format!("sending Express #{i} of {ne} to cluster {d} (no room in its queue or in the INI hand-off)")
                                            })?;
                                        }
                                        Err(e) => bail!(
                                            "cluster {me} thread {t}: sending to cluster {d}: {e}"
                                        ),
                                    }
                                }
                            }
                            if (i % every == 0 || i >= ne) && tag_seq[d] < nt {
                                let mut buf = loop {
                                    match ep.alloc() {
                                        Ok(b) => break b,
                                        Err(_) => {
                                            while let Some(m) = ep.try_recv() {
                                                on(m);
                                            }
                                            check(&None, &|| {
                                                format!("waiting for a free buffer for Tag-On #{} to cluster {d}", tag_seq[d])
                                            })?;
                                            std::thread::yield_now();
                                        }
                                    }
                                };
                                buf.fill(&page(me, t, tag_seq[d]));
                                buf.set_tag(tag_seq[d]);
                                let mut data = buf.freeze();
                                loop {
                                    match ep.send_tag_on_blocking(
                                        VirtualName(d as u16),
                                        TAG_ON,
                                        data,
                                        Some(Duration::from_millis(100)),
                                        &mut on,
                                    ) {
                                        Ok(()) => break,
                                        Err(SendError::Timeout(back)) => {
                                            data = back;
                                            check(&None, &|| {
                                                format!("sending Tag-On #{} of {nt} to cluster {d} (no room in its queue or in the INI hand-off)", tag_seq[d])
                                            })?;
                                        }
                                        Err(e) => bail!(
                                            "cluster {me} thread {t}: sending to cluster {d}: {e}"
                                        ),
                                    }
                                }
                                tag_seq[d] += 1;
                            }
                        }
                        if i % 1024 == 0 {
                            check(&err, &|| format!("sending round {i}"))?;
                        }
                    }
                    while !v.done() {
                        check(&err, &|| v.waiting_for())?;
                        if let Some(m) = ep.recv_timeout(Duration::from_millis(50)) {
                            v.take(m)
                                .inspect_err(|_| failed.store(true, Ordering::Relaxed))?;
                        }
                    }
                    check(&err, &String::new)?;
                    Ok((v.got_express, v.got_tag_on))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a selftest thread panicked")))
            })
            .collect()
    });
    let mut got = (0, 0);
    for r in results {
        match r {
            Ok((e, t)) => {
                got.0 += e;
                got.1 += t;
            }
            Err(e) => {
                job.abort(&format!("{e:#}"));
                return Err(e);
            }
        }
    }
    let elapsed = started.elapsed();
    let link = (0..n)
        .filter(|&c| c != me)
        .map(|c| format!("{}:{:?}", c, job.link(c)))
        .collect::<Vec<_>>()
        .join(" ");
    let reports = job
        .finish(Duration::from_secs(30))
        .context("finishing the job")?;
    println!(
        "cluster {me}: received {} Express and {} Tag-On messages from {} cluster(s), each exactly once and in order, in {:.2?} (links {link})",
        got.0,
        got.1,
        n - 1,
        elapsed
    );
    if stats {
        for r in &reports {
            println!("{}", r.line());
        }
    }
    if let Some(path) = stats_json {
        crate::measure::write_json(path, &reports)?;
    }
    Ok(())
}
