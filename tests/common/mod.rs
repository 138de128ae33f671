//! Helpers for the end-to-end tests of `multigrain launch` and
//! `multigrain hello`: unique temp dirs, processes whose output is
//! collected line by line, bounded waits, and checks that no process of a
//! job is left.

#![allow(dead_code)]

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Bound on any wait that should succeed: a hang fails the test.
pub const HANG: Duration = Duration::from_secs(40);

/// The `multigrain` binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_multigrain")
}

/// A unique directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "multigrain-{tag}-{}-{}-{nanos}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::SeqCst)
        ));
        fs::create_dir_all(&dir).expect("create a temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `text` to `name` in the directory; returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        fs::write(&path, text).expect("write a temp file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A TCP port free on 127.0.0.1 now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A UDP socket on 127.0.0.1 that keeps its port busy, for a cluster whose INI must
/// fail to bind: a port whose TCP twin was free when chosen. A coordinator listens for
/// its members on the TCP port of the same number, and an ephemeral port (UDP) can
/// collide with a TCP connection another test holds, which then takes that listener's
/// place (seen once: the members waited out the start-up timeout).
pub fn busy_udp_port() -> std::net::UdpSocket {
    for _ in 0..100 {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
        let port = udp.local_addr().expect("its address").port();
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return udp;
        }
    }
    panic!("no UDP port whose TCP twin is free on 127.0.0.1 in 100 tries");
}

/// Which stream a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Out,
    Err,
}

#[derive(Default)]
struct Lines {
    lines: Vec<(Stream, String, Instant)>,
    closed: usize,
}

/// A child process whose output is collected; killed (with the pids it
/// adopted) on drop.
pub struct Proc {
    name: String,
    child: Child,
    pub pid: i32,
    out: Arc<(Mutex<Lines>, Condvar)>,
    adopted: Vec<i32>,
    status: Option<ExitStatus>,
}

impl Proc {
    /// Starts `cmd` with piped output.
    pub fn spawn(name: &str, mut cmd: Command) -> Proc {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let out = Arc::new((Mutex::new(Lines::default()), Condvar::new()));
        let streams: [(Box<dyn Read + Send>, Stream); 2] = [
            (Box::new(child.stdout.take().unwrap()), Stream::Out),
            (Box::new(child.stderr.take().unwrap()), Stream::Err),
        ];
        for (reader, which) in streams {
            let out = Arc::clone(&out);
            thread::spawn(move || {
                for line in BufReader::new(reader).lines() {
                    let Ok(line) = line else { break };
                    let (lock, cond) = &*out;
                    lock.lock()
                        .unwrap()
                        .lines
                        .push((which, line, Instant::now()));
                    cond.notify_all();
                }
                let (lock, cond) = &*out;
                lock.lock().unwrap().closed += 1;
                cond.notify_all();
            });
        }
        let pid = i32::try_from(child.id()).unwrap();
        Proc {
            name: name.to_owned(),
            child,
            pid,
            out,
            adopted: Vec::new(),
            status: None,
        }
    }

    /// Kills these pids too when this is dropped.
    pub fn adopt(&mut self, pids: &[i32]) {
        self.adopted.extend_from_slice(pids);
    }

    /// Every line so far, as `stdout: …` / `stderr: …`.
    pub fn transcript(&self) -> String {
        let lines = self.out.0.lock().unwrap();
        lines
            .lines
            .iter()
            .map(|(s, l, _)| format!("  {}: {l}\n", if *s == Stream::Out { "out" } else { "err" }))
            .collect()
    }

    /// The lines of one stream.
    pub fn lines(&self, which: Stream) -> Vec<String> {
        let lines = self.out.0.lock().unwrap();
        lines
            .lines
            .iter()
            .filter(|(s, _, _)| *s == which)
            .map(|(_, l, _)| l.clone())
            .collect()
    }

    /// Waits for a line containing `needle` on either stream; returns it and
    /// when it arrived.
    pub fn wait_line(&self, needle: &str, timeout: Duration) -> (String, Instant) {
        let deadline = Instant::now() + timeout;
        let (lock, cond) = &*self.out;
        let mut lines = lock.lock().unwrap();
        loop {
            if let Some((_, l, at)) = lines.lines.iter().find(|(_, l, _)| l.contains(needle)) {
                return (l.clone(), *at);
            }
            let now = Instant::now();
            if now >= deadline || lines.closed == 2 {
                drop(lines);
                panic!(
                    "{}: no line containing {needle:?} within {timeout:?}; output:\n{}",
                    self.name,
                    self.transcript()
                );
            }
            lines = cond.wait_timeout(lines, deadline - now).unwrap().0;
        }
    }

    /// Waits for the process to exit and its output to end.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                self.status = Some(s);
                break;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!(
                    "{} still running after {timeout:?}; output:\n{}",
                    self.name,
                    self.transcript()
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
        // The output ends when every holder of the pipes is gone.
        let (lock, cond) = &*self.out;
        let mut lines = lock.lock().unwrap();
        while lines.closed < 2 && Instant::now() < deadline {
            lines = cond
                .wait_timeout(lines, Duration::from_millis(50))
                .unwrap()
                .0;
        }
        self.status.unwrap()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) with a pid this test started and still holds
        // (not yet reaped, so the pid cannot have been reused).
        let r = unsafe { libc::kill(self.pid, signal) };
        assert_eq!(r, 0, "kill({}, {signal}) failed", self.pid);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        for &pid in &self.adopted {
            if is_job_process(pid) {
                // SAFETY: kill(2) on a pid that is, per its command line, a
                // multigrain process this test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Whether `pid` runs (not a zombie) a multigrain command.
pub fn is_job_process(pid: i32) -> bool {
    alive(pid)
        && fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains("multigrain"))
}

/// Whether `pid` exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the command name in parentheses.
            let state = stat.rsplit_once(')').map(|(_, r)| r.trim_start());
            !matches!(state.and_then(|s| s.chars().next()), Some('Z' | 'X') | None)
        }
        Err(_) => false,
    }
}

/// Waits until none of `pids` is alive; panics naming the survivors.
pub fn assert_gone(pids: &[i32], timeout: Duration, what: &str) {
    let deadline = Instant::now() + timeout;
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            let cmds: Vec<String> = left
                .iter()
                .map(|p| {
                    let c = fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                    format!("{p}: {}", String::from_utf8_lossy(&c).replace('\0', " "))
                })
                .collect();
            panic!("{what}: processes left after {timeout:?}: {cmds:?}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// No shared-memory name in `/dev/shm` was created by any of `pids` (names carry their
/// creator's pid: `multigrain-{uid}-{pid}-…`); call after the processes are gone.
pub fn assert_no_segments(pids: &[i32], what: &str) {
    let left: Vec<String> = fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    n.starts_with("multigrain-")
                        && pids.iter().any(|p| n.contains(&format!("-{p}-")))
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "{what}: shared-memory names left: {left:?}"
    );
}

/// The cluster pids `multigrain launch` reported, by cluster id.
pub fn launched_pids(launch: &Proc, clusters: usize) -> Vec<i32> {
    (0..clusters)
        .map(|c| {
            let (line, _) =
                launch.wait_line(&format!("multigrain launch: cluster {c}: pid "), HANG);
            let rest = line.split("pid ").nth(1).expect("pid in the line");
            rest.split_whitespace()
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("no pid in {line:?}"))
        })
        .collect()
}

/// `multigrain launch --config CONFIG [extra…] -- COMMAND…`, started.
pub fn launch(name: &str, config: &Path, extra: &[&str], command: &[&str]) -> Proc {
    let mut cmd = Command::new(bin());
    cmd.arg("launch").arg("--config").arg(config);
    cmd.args(extra).arg("--").args(command);
    for var in [
        "MULTIGRAIN_CLUSTER_ID",
        "MULTIGRAIN_CLUSTERS",
        "MULTIGRAIN_COORDINATOR",
        "MULTIGRAIN_CONFIG",
        "MULTIGRAIN_KEY_FILE",
    ] {
        cmd.env_remove(var);
    }
    Proc::spawn(name, cmd)
}

/// A `[local]` job of `clusters` × `threads` with the given timeouts.
pub fn local_config(
    dir: &TempDir,
    name: &str,
    clusters: usize,
    threads: usize,
    peer_ms: u64,
) -> PathBuf {
    dir.write(
        "job.toml",
        &format!(
            "[job]\nname = \"{name}\"\nstartup_timeout_ms = 20000\npeer_timeout_ms = {peer_ms}\n\n\
             [local]\nclusters = {clusters}\nthreads = {threads}\n"
        ),
    )
}

/// Variables that make a `multigrain` process a cluster of a launched job (set by
/// `multigrain launch`, Slurm, PMI or Open MPI): tests remove them from child
/// environments so that each child gets only the identity the test gives it.
pub fn launch_vars() -> impl Iterator<Item = &'static str> {
    [
        "MULTIGRAIN_CLUSTER_ID",
        "MULTIGRAIN_CLUSTERS",
        "MULTIGRAIN_COORDINATOR",
        "MULTIGRAIN_CONFIG",
        "MULTIGRAIN_KEY_FILE",
    ]
    .into_iter()
    .chain(multigrain_cluster_config::LAUNCHER_VARIABLES)
}

/// Runs `multigrain ARGS… FILE` outside any launched job (the [`launch_vars`] removed)
/// and waits for it, at most `limit`; panics with its output unless it exits with status
/// 0. Returns the finished process, for its output.
pub fn run_ok(what: &str, args: &[&str], file: &Path, limit: Duration) -> Proc {
    let mut cmd = Command::new(bin());
    cmd.args(args).arg(file);
    for var in launch_vars() {
        cmd.env_remove(var);
    }
    let mut p = Proc::spawn(what, cmd);
    let status = p.wait_exit(limit);
    assert!(
        status.success(),
        "{what}: {status}; output:\n{}",
        p.transcript()
    );
    p
}

/// Panics, showing `text`, unless it contains every one of `needles`.
pub fn assert_contains_all(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "no {needle:?} in\n{text}");
    }
}

/// Two network namespaces joined by a veth pair, torn down on drop.
pub struct Netns {
    /// The two namespaces' names.
    pub names: [String; 2],
}

impl Netns {
    /// Namespaces `mg<tag>a` and `mg<tag>b` with addresses 10.x.y.1 and 10.x.y.2 (from
    /// `tag`), returned with them; an error in words when not root or `ip` fails.
    pub fn create(tag: u32) -> Result<(Netns, [String; 2]), String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("not running as root".into());
        }
        let ip = |args: &[&str]| -> Result<(), String> {
            let out = Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| format!("cannot run `ip`: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "`ip {}` failed: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        let names = [format!("mg{tag}a"), format!("mg{tag}b")];
        let veth = [format!("mgv{tag}a"), format!("mgv{tag}b")];
        let (x, y) = (10 + (tag >> 8) % 200, tag % 250 + 1);
        let addrs = [format!("10.{x}.{y}.1"), format!("10.{x}.{y}.2")];
        let ns = Netns {
            names: names.clone(),
        };
        for n in &names {
            ip(&["netns", "add", n])?;
        }
        ip(&[
            "link", "add", &veth[0], "type", "veth", "peer", "name", &veth[1],
        ])?;
        for i in 0..2 {
            ip(&["link", "set", &veth[i], "netns", &names[i]])?;
            ip(&[
                "-n",
                &names[i],
                "addr",
                "add",
                &format!("{}/24", addrs[i]),
                "dev",
                &veth[i],
            ])?;
            ip(&["-n", &names[i], "link", "set", &veth[i], "up"])?;
            ip(&["-n", &names[i], "link", "set", "lo", "up"])?;
        }
        Ok((ns, addrs))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}
