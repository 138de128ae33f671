//! Forwarding a cluster's output line by line with a `[cN] ` prefix.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread;

/// What the launcher keeps of a cluster's stderr: its last error line, for the notice
/// that tells the other clusters why it died.
#[derive(Default)]
pub struct ErrorTail {
    /// The text of the last `multigrain: error: …` line, without that prefix.
    pub last: Option<String>,
    /// The stream has ended.
    pub ended: bool,
    /// The last line read was part of an error message.
    in_error: bool,
}

impl ErrorTail {
    /// Takes note of `line` of the stream: an error line starts a new message, its
    /// `  caused by: ` lines are added to it (`error: cause: cause`).
    fn keep(&mut self, line: &str) {
        if let Some(text) = line.strip_prefix(ERROR_PREFIX) {
            self.last = Some(text.to_owned());
            self.in_error = true;
        } else if let (true, Some(cause), Some(last)) = (
            self.in_error,
            line.strip_prefix(CAUSE_PREFIX),
            self.last.as_mut(),
        ) {
            last.push_str(": ");
            last.push_str(cause);
        } else {
            self.in_error = false;
        }
    }
}

/// The line prefix of each cause under a `multigrain` process's error message.
const CAUSE_PREFIX: &str = "  caused by: ";

/// The line prefix of a `multigrain` process's error message.
const ERROR_PREFIX: &str = "multigrain: error: ";

/// Which of the launcher's streams a child's stream goes to.
#[derive(Clone, Copy)]
pub enum Sink {
    /// The launcher's stdout.
    Stdout,
    /// The launcher's stderr.
    Stderr,
}

/// Copies `from` to `sink` line by line, each line prefixed with
/// `[c<cluster>] ` and written whole, on its own thread. Sends `()` on
/// `done` at the end of the stream. With `tail`, keeps the last error line there and
/// marks the end of the stream.
pub fn forward(
    cluster: usize,
    from: impl Read + Send + 'static,
    sink: Sink,
    done: Sender<()>,
    tail: Option<Arc<Mutex<ErrorTail>>>,
) -> io::Result<()> {
    thread::Builder::new()
        .name(format!("launch-out-c{cluster}"))
        .spawn(move || {
            let prefix = format!("[c{cluster}] ");
            let mut reader = BufReader::new(from);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if line.last() != Some(&b'\n') {
                            line.push(b'\n');
                        }
                        if let Some(tail) = &tail
                            && let Ok(mut t) = tail.lock()
                        {
                            t.keep(String::from_utf8_lossy(&line).trim_end());
                        }
                        let mut out = Vec::with_capacity(prefix.len() + line.len());
                        out.extend_from_slice(prefix.as_bytes());
                        out.extend_from_slice(&line);
                        // The launcher's own output may be closed; the
                        // cluster keeps running regardless.
                        let _ = match sink {
                            Sink::Stdout => io::stdout().lock().write_all(&out),
                            Sink::Stderr => io::stderr().lock().write_all(&out),
                        };
                    }
                }
            }
            if let Some(Ok(mut t)) = tail.as_ref().map(|t| t.lock()) {
                t.ended = true;
            }
            let _ = done.send(());
        })
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_last_error_with_its_causes() {
        let mut t = ErrorTail::default();
        for line in [
            "multigrain: error: first",
            "water: joining the job…",
            "multigrain: error: joining the job",
            "  caused by: cannot listen on TCP 127.0.0.1:9",
            "  caused by: in use",
            "water: joining the job stopped after 0.00 s",
            "  caused by: not a cause: the error ended",
        ] {
            t.keep(line);
        }
        assert_eq!(
            t.last.as_deref(),
            Some("joining the job: cannot listen on TCP 127.0.0.1:9: in use")
        );
    }
}
