//! A harness for multi-process DSM tests. The test binary is its own cluster process:
//! run normally it is the *parent*, which starts one child per cluster by re-executing
//! itself with `MG_DSM_ROLE=cluster`; each child creates its site (shared memory, from
//! `site_config`), reports its segment name on stdout, receives every peer's name on
//! stdin, attaches them, and runs a scenario on a [`Transport`] with [`PidLiveness`].
//!
//! Every wait of the parent has a deadline (a hang fails naming the clusters that did not
//! finish), children are killed when the [`Job`] is dropped, and each child's stdout and
//! stderr are collected line by line.

#![allow(dead_code)]

use multigrain_cluster_config::{JobConfig, Protocol};
use multigrain_dsm::{PidLiveness, Transport, site_config};
use multigrain_messaging::{Site, SiteId};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Environment variable that makes the test binary a cluster process.
pub const ROLE: &str = "MG_DSM_ROLE";

/// What a child prints or exits with, as the parent sees it.
#[derive(Debug)]
pub enum Event {
    /// A line on stdout.
    Out(usize, String),
    /// A line on stderr.
    Err(usize, String),
}

/// One cluster process.
pub struct Cluster {
    child: Child,
    stdin: Option<ChildStdin>,
    /// When the process was seen to exit, and how.
    pub exit: Option<(Instant, ExitStatus)>,
    /// Everything it printed.
    pub output: Vec<String>,
}

/// A job of cluster processes (see the module documentation).
pub struct Job {
    /// The clusters, by id.
    pub clusters: Vec<Cluster>,
    events: mpsc::Receiver<Event>,
    /// Test name, for messages.
    pub name: String,
}

/// Parameters of a job.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Scenario the children run.
    pub scenario: String,
    /// Clusters.
    pub clusters: usize,
    /// Compute threads per cluster.
    pub threads: usize,
    /// Coherence protocol.
    pub protocol: Protocol,
    /// `job.peer_timeout_ms`.
    pub peer_timeout_ms: u64,
}

impl Job {
    /// Starts the children and exchanges segment names; `deadline` bounds the start.
    pub fn start(name: &str, spec: &Spec, deadline: Duration) -> Job {
        let exe = std::env::current_exe().expect("test binary path");
        let (tx, events) = mpsc::channel();
        let mut clusters = Vec::new();
        for c in 0..spec.clusters {
            let mut child = Command::new(&exe)
                .env(ROLE, "cluster")
                .env("MG_DSM_SCENARIO", &spec.scenario)
                .env("MG_DSM_CLUSTER", c.to_string())
                .env("MG_DSM_CLUSTERS", spec.clusters.to_string())
                .env("MG_DSM_THREADS", spec.threads.to_string())
                .env("MG_DSM_PROTOCOL", spec.protocol.as_str())
                .env("MG_DSM_PEER_TIMEOUT_MS", spec.peer_timeout_ms.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn a cluster process");
            let out = child.stdout.take().expect("piped");
            let err = child.stderr.take().expect("piped");
            let t = tx.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = t.send(Event::Out(c, l));
                }
            });
            let t = tx.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(err).lines().map_while(Result::ok) {
                    let _ = t.send(Event::Err(c, l));
                }
            });
            let stdin = child.stdin.take();
            clusters.push(Cluster {
                child,
                stdin,
                exit: None,
                output: Vec::new(),
            });
        }
        let mut job = Job {
            clusters,
            events,
            name: name.to_string(),
        };
        let names: Vec<String> = (0..spec.clusters)
            .map(|c| {
                job.expect_line(c, "SEGMENT ", deadline)
                    .trim_start_matches("SEGMENT ")
                    .to_string()
            })
            .collect();
        let peers = format!("PEERS {}\n", names.join(" "));
        for c in &mut job.clusters {
            let stdin = c.stdin.as_mut().expect("stdin");
            stdin.write_all(peers.as_bytes()).expect("write peers");
            stdin.flush().expect("flush");
        }
        job
    }

    fn record(&mut self, e: Event) {
        match e {
            Event::Out(c, l) => self.clusters[c].output.push(l),
            Event::Err(c, l) => self.clusters[c].output.push(format!("[stderr] {l}")),
        }
    }

    fn poll_exits(&mut self) {
        for c in &mut self.clusters {
            if c.exit.is_none()
                && let Ok(Some(status)) = c.child.try_wait()
            {
                c.exit = Some((Instant::now(), status));
            }
        }
    }

    /// Waits for a stdout line of cluster `c` starting with `prefix`.
    pub fn expect_line(&mut self, c: usize, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.clusters[c]
                .output
                .iter()
                .find(|l| l.starts_with(prefix))
            {
                return l.clone();
            }
            let now = Instant::now();
            if now >= deadline {
                self.poll_exits();
                panic!(
                    "{}: cluster {c} did not print {prefix:?} within {timeout:?}; {}",
                    self.name,
                    self.report()
                );
            }
            if let Ok(e) = self
                .events
                .recv_timeout((deadline - now).min(Duration::from_millis(50)))
            {
                self.record(e);
            }
        }
    }

    /// Waits until every cluster has exited (or `timeout` passes: then panics naming the
    /// clusters still running).
    pub fn wait_all(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            while let Ok(e) = self.events.try_recv() {
                self.record(e);
            }
            self.poll_exits();
            if self.clusters.iter().all(|c| c.exit.is_some()) {
                // Collect the last lines.
                let end = Instant::now() + Duration::from_millis(200);
                while let Ok(e) = self
                    .events
                    .recv_timeout(end.saturating_duration_since(Instant::now()))
                {
                    self.record(e);
                }
                return;
            }
            if Instant::now() >= deadline {
                let stuck: Vec<usize> = (0..self.clusters.len())
                    .filter(|&c| self.clusters[c].exit.is_none())
                    .collect();
                panic!(
                    "{}: clusters {stuck:?} still running after {timeout:?}; {}",
                    self.name,
                    self.report()
                );
            }
            if let Ok(e) = self.events.recv_timeout(Duration::from_millis(20)) {
                self.record(e);
            }
        }
    }

    /// Kills cluster `c` with `SIGKILL` and returns when.
    pub fn kill(&mut self, c: usize) -> Instant {
        let _ = self.clusters[c].child.kill();
        let t = Instant::now();
        let _ = self.clusters[c].child.wait();
        t
    }

    /// Everything the clusters printed and how they exited, for failure messages.
    pub fn report(&self) -> String {
        let mut s = String::new();
        for (i, c) in self.clusters.iter().enumerate() {
            s.push_str(&format!("\n--- cluster {i} ({:?}):", c.exit.map(|e| e.1)));
            for l in &c.output {
                s.push_str("\n  ");
                s.push_str(l);
            }
        }
        s
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for c in &mut self.clusters {
            let _ = c.child.kill();
            let _ = c.child.wait();
        }
    }
}

/// What a child knows about its job.
pub struct ChildSpec {
    /// Scenario name.
    pub scenario: String,
    /// This cluster.
    pub cluster: usize,
    /// The job configuration.
    pub cfg: JobConfig,
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

/// In a child: reads the job from the environment, creates and connects the site, and
/// returns the spec and transport.
pub fn child_setup() -> (ChildSpec, Transport) {
    let cluster: usize = env("MG_DSM_CLUSTER").parse().expect("cluster id");
    let clusters: usize = env("MG_DSM_CLUSTERS").parse().expect("cluster count");
    let threads: usize = env("MG_DSM_THREADS").parse().expect("threads");
    let mut cfg = JobConfig::local(clusters, threads);
    cfg.dsm.protocol = env("MG_DSM_PROTOCOL").parse().expect("protocol");
    cfg.dsm.region_size = 64 << 20;
    cfg.job.peer_timeout_ms = env("MG_DSM_PEER_TIMEOUT_MS").parse().expect("timeout");
    let site = Site::new(site_config(&cfg, cluster)).expect("create the site");
    println!("SEGMENT {}", site.segment_name().expect("a shared site"));
    std::io::stdout().flush().expect("flush");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("read peers");
    let names: Vec<&str> = line
        .trim()
        .strip_prefix("PEERS ")
        .expect("PEERS line")
        .split(' ')
        .collect();
    assert_eq!(names.len(), clusters);
    for (p, n) in names.iter().enumerate().filter(|&(p, _)| p != cluster) {
        site.attach_peer(SiteId(p as u16), n)
            .expect("attach a peer");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while site.attached_peers() < clusters as u32 - 1 {
        assert!(Instant::now() < deadline, "peers did not attach");
        std::thread::sleep(Duration::from_millis(1));
    }
    site.unlink_segment();
    let liveness = PidLiveness::new(&site, cluster, clusters).expect("watch peers");
    let spec = ChildSpec {
        scenario: env("MG_DSM_SCENARIO"),
        cluster,
        cfg,
    };
    let t = Transport {
        site,
        cluster,
        clusters,
        liveness: std::sync::Arc::new(liveness),
    };
    (spec, t)
}
