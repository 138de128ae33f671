//! Progress of a run: a bar per phase on a terminal, plain lines on stderr otherwise
//! ([`Display`]); and forwarding cluster 0's progress over a Unix socket to the process
//! that spawned the job ([`Forward`], [`serve`]), whose stderr is the user's terminal.

use crate::progress;
use indicatif::ProgressBar;
use multigrain_apps::progress::Progress;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Without a terminal, a running phase prints its progress at most this often.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// Cluster 0 forwards a phase's progress at most this often (its last step always).
/// Sending every step cost EM3D's thread 0 15–24 µs per iteration (a JSON line, a
/// `write(2)` and the spawning process's wake-up, on the compute thread, against
/// iterations of about 1.2 ms on 2×1), and the bar redraws at most 20 times a second
/// anyway.
const FORWARD_EVERY: Duration = Duration::from_millis(50);

/// One progress event, a JSON line on the socket.
#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    Begin {
        phase: String,
        steps: u64,
    },
    Advance {
        done: u64,
    },
    /// The run ended normally (a connection closed without it was cut short).
    End,
}

struct Current {
    phase: String,
    steps: u64,
    started: Instant,
    last_line: Instant,
    bar: Option<ProgressBar>,
}

/// Shows phases: a bar each on a terminal, a line at the start and end (and every few
/// seconds) otherwise, nothing under `-q` but a phase cut short by a failure.
pub struct Display {
    label: String,
    shown: progress::Shown,
    current: Mutex<Option<Current>>,
}

impl Display {
    /// A display whose lines start with `label`; bars only when stderr is a terminal,
    /// nothing under `-q` ([`progress::shown`]).
    pub fn new(label: &str) -> Display {
        Display {
            label: label.to_owned(),
            shown: progress::shown(),
            current: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn end(&self, cur: Current) {
        match cur.bar {
            Some(bar) => {
                if cur.steps == 0 {
                    bar.set_position(1);
                }
                bar.finish();
                // The finished bar stays; the next one starts on a line of its own.
                eprintln!();
            }
            None if self.shown == progress::Shown::Lines => eprintln!(
                "{}: {} done in {:.2} s",
                self.label,
                cur.phase,
                cur.started.elapsed().as_secs_f64()
            ),
            None => {}
        }
    }

    /// A phase begins (the previous one ends).
    pub fn begin_phase(&self, phase: &str, steps: u64) {
        let mut g = self.lock();
        if let Some(cur) = g.take() {
            self.end(cur);
        }
        let bar = match self.shown {
            progress::Shown::Bars => Some(progress::bar(
                steps.max(1),
                &format!("{}: {phase}", self.label),
            )),
            progress::Shown::Lines => {
                if steps > 0 {
                    eprintln!("{}: {phase} ({steps} steps)…", self.label);
                } else {
                    eprintln!("{}: {phase}…", self.label);
                }
                None
            }
            progress::Shown::Nothing => None,
        };
        let now = Instant::now();
        *g = Some(Current {
            phase: phase.to_owned(),
            steps,
            started: now,
            last_line: now,
            bar,
        });
    }

    /// `done` steps of the current phase are complete.
    pub fn advance_to(&self, done: u64) {
        let mut g = self.lock();
        let Some(cur) = g.as_mut() else { return };
        match &cur.bar {
            Some(bar) => bar.set_position(done),
            None if self.shown == progress::Shown::Lines
                && cur.last_line.elapsed() >= LINE_EVERY
                && done < cur.steps =>
            {
                cur.last_line = Instant::now();
                eprintln!(
                    "{}: {} {done}/{} after {:.1} s",
                    self.label,
                    cur.phase,
                    cur.steps,
                    cur.started.elapsed().as_secs_f64()
                );
            }
            None => {}
        }
    }

    /// Ends the current phase, if any.
    pub fn finish(&self) {
        let cur = self.lock().take();
        if let Some(cur) = cur {
            self.end(cur);
        }
    }

    /// Leaves the current phase unfinished: the run failed.
    pub fn abandon(&self) {
        let cur = self.lock().take();
        if let Some(cur) = cur {
            match cur.bar {
                Some(bar) => {
                    bar.abandon();
                    eprintln!();
                }
                None => eprintln!(
                    "{}: {} stopped after {:.2} s",
                    self.label,
                    cur.phase,
                    cur.started.elapsed().as_secs_f64()
                ),
            }
        }
    }
}

impl Progress for Display {
    fn begin(&self, phase: &'static str, steps: u64) {
        self.begin_phase(phase, steps);
    }

    fn advance(&self, done: u64) {
        self.advance_to(done);
    }
}

/// Sends progress to the spawning process's socket; silently stops if it goes away.
/// Steps are forwarded at most every [`FORWARD_EVERY`], and a phase's last step always.
pub struct Forward {
    inner: Mutex<Forwarding>,
}

/// [`Forward`]'s state, under one lock (only cluster 0's thread 0 reports progress).
struct Forwarding {
    /// The socket; `None` once a write failed.
    stream: Option<UnixStream>,
    pace: Pace,
}

/// What [`Forward`] needs to thin out a phase's steps.
struct Pace {
    /// Steps of the current phase.
    steps: u64,
    /// When a step was last forwarded (or the phase began).
    last: Instant,
}

impl Pace {
    /// Whether step `done` is forwarded: the phase's last, or the first for a while.
    fn due(&mut self, done: u64, now: Instant) -> bool {
        if done >= self.steps || now.duration_since(self.last) >= FORWARD_EVERY {
            self.last = now;
            return true;
        }
        false
    }
}

impl Forward {
    /// Connects to the socket at `path`; `None` if nobody listens.
    pub fn connect(path: &Path) -> Option<Forward> {
        UnixStream::connect(path).ok().map(|s| Forward {
            inner: Mutex::new(Forwarding {
                stream: Some(s),
                pace: Pace {
                    steps: 0,
                    last: Instant::now(),
                },
            }),
        })
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Forwarding> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Forwarding {
    fn send(&mut self, msg: &Msg) {
        if let Some(s) = self.stream.as_mut() {
            let mut line = serde_json::to_vec(msg).unwrap_or_default();
            line.push(b'\n');
            if s.write_all(&line).is_err() {
                self.stream = None;
            }
        }
    }
}

impl Progress for Forward {
    fn begin(&self, phase: &'static str, steps: u64) {
        let mut f = self.inner();
        f.pace = Pace {
            steps,
            last: Instant::now(),
        };
        f.send(&Msg::Begin {
            phase: phase.to_owned(),
            steps,
        });
    }

    fn advance(&self, done: u64) {
        let mut f = self.inner();
        if f.pace.due(done, Instant::now()) {
            f.send(&Msg::Advance { done });
        }
    }
}

/// Where a process sends its progress.
pub enum Sink {
    /// Shown here.
    Display(Display),
    /// Forwarded to the spawning process.
    Forward(Forward),
    /// Nowhere (clusters other than 0).
    Silent,
}

impl Sink {
    /// The run ended normally: ends the current phase.
    pub fn finish(&self) {
        match self {
            Sink::Display(d) => d.finish(),
            Sink::Forward(f) => f.inner().send(&Msg::End),
            Sink::Silent => {}
        }
    }

    /// The run failed: leaves the current phase unfinished (a closed connection says
    /// the same to the spawning process).
    pub fn abandon(&self) {
        if let Sink::Display(d) = self {
            d.abandon();
        }
    }
}

impl Progress for Sink {
    fn begin(&self, phase: &'static str, steps: u64) {
        match self {
            Sink::Display(d) => d.begin(phase, steps),
            Sink::Forward(f) => f.begin(phase, steps),
            Sink::Silent => {}
        }
    }

    fn advance(&self, done: u64) {
        match self {
            Sink::Display(d) => d.advance(done),
            Sink::Forward(f) => f.advance(done),
            Sink::Silent => {}
        }
    }
}

/// Shows on `display` the progress that the first process to connect to `listener`
/// sends, until it disconnects or, if nobody connected, `stop` is set.
pub fn serve(
    listener: UnixListener,
    display: Display,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name("run-progress".into())
        .spawn(move || {
            let stream = loop {
                match listener.accept() {
                    Ok((s, _)) => break s,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if stop.load(Ordering::Acquire) {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(_) => return,
                }
            };
            if stream.set_nonblocking(false).is_err() {
                return;
            }
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<Msg>(&line) {
                    Ok(Msg::Begin { phase, steps }) => display.begin_phase(&phase, steps),
                    Ok(Msg::Advance { done }) => display.advance_to(done),
                    Ok(Msg::End) => {
                        display.finish();
                        return;
                    }
                    Err(_) => {}
                }
            }
            display.abandon();
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_forwarded_at_most_every_interval_and_the_last_always() {
        let t0 = Instant::now();
        let mut pace = Pace {
            steps: 100,
            last: t0,
        };
        let ms = |n| t0 + Duration::from_millis(n);
        assert!(!pace.due(1, ms(1)), "1 ms after the phase began");
        assert!(!pace.due(2, ms(49)));
        assert!(pace.due(3, ms(50)), "a whole interval later");
        assert!(!pace.due(4, ms(60)), "10 ms after the last one forwarded");
        assert!(pace.due(100, ms(61)), "the phase's last step");
        assert!(pace.due(5, ms(111)));
    }
}
