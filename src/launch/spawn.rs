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
}

impl Plan {
    /// A cluster on this machine: `command` run directly. A command named
    /// `multigrain` runs this same executable.
    pub fn local(
        cluster: usize,
        host: &str,
        command: &[String],
        env: Vec<(String, String)>,
    ) -> Plan {
        let mut argv: Vec<OsString> = command.iter().map(OsString::from).collect();
        if command[0] == "multigrain"
            && let Ok(me) = std::env::current_exe()
        {
            argv[0] = me.into_os_string();
        }
        Plan {
            cluster,
            host: host.to_owned(),
            remote: false,
            argv,
            env,
        }
    }

    /// A cluster on another host: `ssh… host 'cd CWD && exec env VAR=… command…'`.
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
        for word in command {
            line.push(' ');
            line.push_str(&quote(word));
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

    /// Starts the process with piped stdout and stderr, no stdin, in its own
    /// process group, and with `PR_SET_PDEATHSIG(SIGKILL)`: when the thread
    /// that started it (the launcher's main thread) ends, even by SIGKILL,
    /// the kernel kills it. Call from the launcher's main thread.
    pub fn spawn(&self) -> io::Result<Child> {
        let mut cmd = Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let launcher = Pid::this();
        // SAFETY: the closure runs in the child between fork and exec, where
        // only async-signal-safe operations are allowed: it makes two system
        // calls (prctl, getppid) through nix wrappers that neither allocate
        // nor lock, and builds an io::Error from a raw errno, which does not
        // allocate either.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Some(Signal::SIGKILL))
                    .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
                // The launcher may have died before the line above: then
                // nobody would kill this process later.
                if getppid() != launcher {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
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
    fn remote_plan_puts_env_and_cwd_in_the_command_line() {
        let plan = Plan::remote(
            2,
            "node7",
            &["ssh".into(), "-o".into(), "BatchMode=yes".into()],
            Path::new("/home/me/my job"),
            &["multigrain".into(), "hello".into()],
            vec![("MULTIGRAIN_CLUSTER_ID".into(), "2".into())],
        );
        assert_eq!(
            plan.display(),
            "ssh -o BatchMode=yes node7 cd '/home/me/my job' && exec env MULTIGRAIN_CLUSTER_ID=2 \
             multigrain hello"
        );
        assert!(plan.remote && plan.env.is_empty());
    }
}
