//! Building and starting one cluster process: locally, or over ssh.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use nix::sys::signal::Signal;
use nix::unistd::{Pid, getppid};

/// How a cluster process is started.
pub struct Plan {
    /// The cluster id.
    pub cluster: usize,
    /// The host it runs on.
    pub host: String,
    /// Whether it is started over ssh.
    pub remote: bool,
    /// The program and its arguments, as run locally.
    pub argv: Vec<OsString>,
    /// Variables added to the environment (locally; remotely they travel in
    /// the command line).
    pub env: Vec<(String, String)>,
    /// Its stdin is the launcher's notice channel ([`watch_stdin`]): it runs `multigrain`.
    pub notices: bool,
    /// The CPUs it is bound to (`launch.cpu_bind`; local plans only), `None`: unbound.
    pub cpus: Option<Vec<usize>>,
}

/// Set for a cluster process whose stdin is the launcher's notice channel (every
/// `multigrain` cluster that `multigrain launch` starts, locally or over ssh): see
/// [`watch_stdin`].
pub const ENV_WATCH_STDIN: &str = "MULTIGRAIN_WATCH_STDIN";

/// How long a cluster that is still joining waits after the launcher's notice of another
/// cluster's death before it stops: the control plane, when it knows more (the dead
/// cluster reported why it could not start), speaks first.
const NOTICE_DELAY: std::time::Duration = std::time::Duration::from_millis(200);

/// The line the launcher writes to a cluster's stdin (see [`watch_stdin`]) when cluster
/// `cluster` failed, `how` in words (e.g. `cluster 1 (pid 42 on 127.0.0.1) exited with
/// code 1`).
pub fn failure_notice(cluster: usize, how: &str) -> String {
    format!("failed {cluster} {}\n", how.replace('\n', " "))
}

/// Another cluster failed before the job started, and this process heard of it outside
/// the control plane (the launcher's notice, the Slurm step's signal): unless this
/// process has joined its job, or `ignore` says so, waits [`NOTICE_DELAY`], then — still
/// not joined — prints `multigrain: error: {why}; stopping this cluster` and exits with
/// [`EXIT_PEER_FAILED`](multigrain_messaging::control::EXIT_PEER_FAILED). Returns when
/// the notice is ignored.
pub(crate) fn stop_if_still_joining(ignore: impl Fn() -> bool, why: impl FnOnce() -> String) {
    let ignored = || ignore() || multigrain_messaging::control::joined();
    if ignored() {
        return;
    }
    std::thread::sleep(NOTICE_DELAY);
    if ignored() {
        return;
    }
    // stderr may be gone with the launcher: a failed write must not stop the exit
    // (eprintln! would panic this thread instead).
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("multigrain: error: {}; stopping this cluster\n", why()).as_bytes(),
    );
    std::process::exit(multigrain_messaging::control::EXIT_PEER_FAILED);
}

/// In a process started with [`ENV_WATCH_STDIN`] set: a thread that reads the
/// launcher's notices from stdin.
///
/// - A [`failure_notice`] while this process has not joined its job yet
///   ([`multigrain_messaging::control::joined`]): another cluster died before the job
///   started, which the control plane cannot see when that cluster never reached the
///   coordinator (or the coordinator died before this cluster reached it). If still not
///   joined a moment later, prints the cause naming that cluster and exits
///   with [`EXIT_PEER_FAILED`](multigrain_messaging::control::EXIT_PEER_FAILED). Once
///   joined, notices are ignored: the control plane reports failures itself. (It waits
///   200 ms first: when the dead cluster told the coordinator why it could not start,
///   the control plane's report, which says why, comes first.)
/// - End of file — the launcher's pipe or ssh channel closing because the launcher was
///   interrupted or killed: prints why and exits with status 1.
pub fn watch_stdin() {
    if std::env::var_os(ENV_WATCH_STDIN).is_none() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("mg-watch-launcher".into())
        .spawn(|| {
            let stdin = std::io::stdin().lock();
            for line in std::io::BufRead::lines(stdin) {
                let Ok(line) = line else { break };
                let Some((cluster, how)) = line
                    .strip_prefix("failed ")
                    .and_then(|rest| rest.split_once(' '))
                else {
                    continue;
                };
                stop_if_still_joining(
                    || false,
                    || {
                        format!(
                            "cluster {cluster} failed before the job started: {how} (seen by \
                             the launcher)"
                        )
                    },
                );
            }
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                b"multigrain: error: the launcher's connection (stdin) closed: the launcher was \
                  interrupted or killed; stopping this cluster\n",
            );
            std::process::exit(1);
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot watch the launcher's connection: {e}");
    }
}

impl Plan {
    /// A cluster on this machine: `command` run directly. A command named
    /// `multigrain` runs this same executable, with [`ENV_WATCH_STDIN`] set and a pipe
    /// from the launcher as stdin (other commands get no stdin).
    pub fn local(
        cluster: usize,
        host: &str,
        command: &[String],
        mut env: Vec<(String, String)>,
    ) -> Plan {
        let mut argv: Vec<OsString> = command.iter().map(OsString::from).collect();
        let notices = command[0] == "multigrain";
        if notices {
            if let Ok(me) = std::env::current_exe() {
                argv[0] = me.into_os_string();
            }
            env.push((ENV_WATCH_STDIN.to_owned(), "1".to_owned()));
        }
        Plan {
            cluster,
            host: host.to_owned(),
            remote: false,
            argv,
            env,
            notices,
            cpus: None,
        }
    }

    /// A cluster on another host: `ssh… host 'cd CWD && exec env VAR=… command…'`. A
    /// command named `multigrain` becomes this executable's absolute path (the remote
    /// machine needs it at the same path, as on a shared file system; give a path to run
    /// another). The remote process gets [`ENV_WATCH_STDIN`]: it exits when its stdin —
    /// the ssh channel, which the launcher holds open — closes, so it cannot outlive a
    /// launcher that is interrupted or killed.
    pub fn remote(
        cluster: usize,
        host: &str,
        ssh: &[String],
        cwd: &Path,
        command: &[String],
        env: Vec<(String, String)>,
    ) -> Plan {
        let mut line = format!("cd {} && exec env", quote(&cwd.to_string_lossy()));
        for (k, v) in &env {
            line.push_str(&format!(" {k}={}", quote(v)));
        }
        line.push_str(&format!(" {ENV_WATCH_STDIN}=1"));
        for (i, word) in command.iter().enumerate() {
            let word = match std::env::current_exe() {
                Ok(me) if i == 0 && word == "multigrain" => me.to_string_lossy().into_owned(),
                _ => word.clone(),
            };
            line.push(' ');
            line.push_str(&quote(&word));
        }
        let mut argv: Vec<OsString> = ssh.iter().map(OsString::from).collect();
        argv.push(host.into());
        argv.push(line.into());
        Plan {
            cluster,
            host: host.to_owned(),
            remote: true,
            argv,
            env: Vec::new(),
            notices: true,
            cpus: None,
        }
    }

    /// The command line, for messages.
    pub fn display(&self) -> String {
        self.argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Starts the process with piped stdout and stderr, no stdin (a `multigrain` cluster
    /// or a remote one: a pipe the launcher keeps open for its notices, see
    /// [`watch_stdin`] and [`Plan::remote`]), in its own
    /// process group, and with `PR_SET_PDEATHSIG(SIGKILL)`: when the thread
    /// that started it (the launcher's main thread) ends, even by SIGKILL,
    /// the kernel kills it. Bound to [`Plan::cpus`] where they are set (the mask is
    /// set before `exec`, so every thread of the process inherits it). Call from the
    /// launcher's main thread.
    ///
    /// # Errors
    /// Spawning's; `EINVAL` for a CPU the kernel's mask cannot name or the process may
    /// not use.
    pub fn spawn(&self) -> io::Result<Child> {
        let cpus = match &self.cpus {
            Some(cpus) => Some(super::cpus::cpu_set(cpus).map_err(io::Error::from)?),
            None => None,
        };
        let mut cmd = Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(if self.notices {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let launcher = Pid::this();
        // SAFETY: the closure runs in the child between fork and exec, where
        // only async-signal-safe operations are allowed: it makes three system
        // calls (prctl, getppid, sched_setaffinity with a mask built before the
        // fork) through nix wrappers that neither allocate nor lock, and builds an
        // io::Error from a raw errno, which does not allocate either.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Some(Signal::SIGKILL))
                    .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
                // The launcher may have died before the line above: then
                // nobody would kill this process later.
                if getppid() != launcher {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                if let Some(set) = &cpus {
                    nix::sched::sched_setaffinity(Pid::from_raw(0), set)
                        .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
                }
                Ok(())
            });
        }
        cmd.spawn()
    }
}

/// Quotes `word` for a POSIX shell.
pub fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@,+%".contains(&b));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote("abc/d-e.toml"), "abc/d-e.toml");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("$HOME;rm"), "'$HOME;rm'");
    }

    #[test]
    fn local_multigrain_clusters_get_the_notice_channel() {
        let env = vec![("MULTIGRAIN_CLUSTER_ID".to_owned(), "1".to_owned())];
        let mg = Plan::local(1, "127.0.0.1", &["multigrain".into(), "hello".into()], env);
        assert!(mg.notices && !mg.remote);
        assert!(mg.env.iter().any(|(k, v)| k == ENV_WATCH_STDIN && v == "1"));
        let other = Plan::local(1, "127.0.0.1", &["sleep".into(), "1".into()], Vec::new());
        assert!(!other.notices && other.env.is_empty());
        assert_eq!(
            failure_notice(2, "cluster 2 exited\nwith code 1"),
            "failed 2 cluster 2 exited with code 1\n"
        );
    }

    #[test]
    fn remote_plan_puts_env_and_cwd_in_the_command_line() {
        let plan = Plan::remote(
            2,
            "node7",
            &["ssh".into(), "-o".into(), "BatchMode=yes".into()],
            Path::new("/home/me/my job"),
            &["/opt/mg/multigrain".into(), "hello".into()],
            vec![("MULTIGRAIN_CLUSTER_ID".into(), "2".into())],
        );
        assert_eq!(
            plan.display(),
            "ssh -o BatchMode=yes node7 cd '/home/me/my job' && exec env MULTIGRAIN_CLUSTER_ID=2 \
             MULTIGRAIN_WATCH_STDIN=1 /opt/mg/multigrain hello"
        );
        assert!(plan.remote && plan.env.is_empty());
        // The bare name becomes this executable's absolute path.
        let bare = Plan::remote(
            0,
            "node7",
            &["ssh".into()],
            Path::new("/tmp"),
            &["multigrain".into(), "hello".into()],
            Vec::new(),
        );
        let me = std::env::current_exe().unwrap();
        assert!(
            bare.display().ends_with(&format!(
                "MULTIGRAIN_WATCH_STDIN=1 {} hello",
                quote(&me.to_string_lossy())
            )),
            "{}",
            bare.display()
        );
    }
}
