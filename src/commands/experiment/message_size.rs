//! `multigrain experiment message-size`: one-way latency and streaming bandwidth against
//! message size for the four message kinds (Express, Basic, Tag-On, bulk) on the three
//! paths (threads of one cluster, two processes over a shared segment, two clusters
//! through INIs over UDP loopback), and the half-power point n½ (paper 004 §6, Figures
//! 4–7; paper 003 §4).
//!
//! Like `mva`, the runs are in this process (the kernels of [`multigrain_bench::sizes`]),
//! not `multigrain run` jobs. Every (path, kind, size, measurement) point is sampled once
//! per round, the three paths of a (kind, size, measurement) one after the other, and the
//! rounds in different orders, so every point sees the machine's speed regimes alike;
//! the tables show median (min–max) over the rounds.

use super::plot::{Figure, Kind as Draw, Legend, Series, Style};
use super::table::{Cell, Column, Fmt, Table};
use super::{CommonArgs, Context, Outcome};
use crate::measure::Summary;
use anyhow::{Context as _, Result, bail};
use multigrain_bench::cross_process::PingPong;
use multigrain_bench::network::{Pair, sized_pingpong, sized_stream};
use multigrain_bench::sizes::{EXPRESS_MAX, Kind, Threads};
use multigrain_cluster_config::IniPolicy;
use serde_json::json;
use std::collections::HashMap;
use std::time::Instant;

/// Largest message of the full size: 1 MiB (bulk's limit, `max_bulk`).
const FULL_MAX: usize = 1 << 20;
/// Largest message of `--quick`: 32 KiB.
const QUICK_MAX: usize = 32 << 10;

/// A path between sender and receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Path {
    /// Two threads of one cluster (one site; in-process queues, busy polling).
    Threads,
    /// Two cluster processes on this machine over a shared segment (busy polling).
    Shm,
    /// Two clusters through one dedicated INI thread each, UDP on loopback.
    Inis,
}

impl Path {
    const ALL: [Path; 3] = [Path::Threads, Path::Shm, Path::Inis];

    fn label(self) -> &'static str {
        match self {
            Path::Threads => "threads",
            Path::Shm => "shm (2 processes)",
            Path::Inis => "INIs (UDP loopback)",
        }
    }

    fn id(self) -> &'static str {
        match self {
            Path::Threads => "threads",
            Path::Shm => "shm",
            Path::Inis => "inis",
        }
    }
}

/// Flags of `multigrain experiment message-size` (see its `--help`).
#[derive(clap::Args, Debug)]
pub struct MessageSizeArgs {
    #[command(flatten)]
    pub(super) common: CommonArgs,
    /// Largest message size in bytes: sizes 8, 16, 32, … (powers of two) up to this, at
    /// most 1 MiB [default: 1048576; with --quick 32768, and only 8, 64, 512, 4096, 32768].
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(8..=1 << 20))]
    pub max_size: Option<u64>,
    /// Sender threads of the streams, comma-separated (each into one receiver)
    /// [default: 1,2,4; with --quick 1,2].
    #[arg(long, value_name = "N,…", value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=64))]
    pub senders: Vec<u64>,
    /// Paths to measure, comma-separated [default: all three].
    #[arg(long, value_name = "PATH,…", value_delimiter = ',', value_enum)]
    pub paths: Vec<Path>,
}

/// What one sample measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Measure {
    /// Ping-pong: one-way latency, µs.
    Latency,
    /// A stream from this many sender threads: bandwidth, MB/s.
    Stream(usize),
}

/// One point: a path, a kind, a size and what is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Point {
    path: Path,
    kind: Kind,
    size: usize,
    measure: Measure,
}

/// How much work one sample does.
#[derive(Clone, Copy, Debug)]
struct Budget {
    /// Bytes moved one way by a ping-pong sample (round trips = this ÷ size, clamped).
    latency_bytes: usize,
    /// Round trips per ping-pong sample, at least and at most.
    round_trips: (u64, u64),
    /// Bytes of a stream sample (messages = this ÷ size, clamped).
    stream_bytes: usize,
    /// Messages per stream sample, at least and at most (over all senders).
    messages: (u64, u64),
    /// Most messages of the kinds' natural sequences per sample (one way), before the
    /// lower clamps: keeps Express and Basic sequences through the INIs in bounds.
    wire: u64,
}

const FULL: Budget = Budget {
    latency_bytes: 2 << 20,
    round_trips: (4, 1000),
    stream_bytes: 8 << 20,
    messages: (8, 8000),
    wire: 8192,
};

const QUICK: Budget = Budget {
    latency_bytes: 32 << 10,
    round_trips: (2, 20),
    stream_bytes: 128 << 10,
    messages: (4, 64),
    wire: 256,
};

impl Budget {
    /// How many `size`-byte messages of `kind` a sample sends: `bytes ÷ size`, at most
    /// `wire` messages of the natural sequence, clamped to `(lo, hi)`.
    fn count(self, kind: Kind, size: usize, bytes: usize, (lo, hi): (u64, u64)) -> u64 {
        let per = kind.messages(size).unwrap_or(1).max(1) as u64;
        ((bytes / size) as u64).min(self.wire / per).clamp(lo, hi)
    }

    /// (warm-up, timed) round trips of a ping-pong of `size` bytes as `kind`.
    fn round_trips(self, kind: Kind, size: usize) -> (u64, u64) {
        let n = self.count(kind, size, self.latency_bytes, self.round_trips);
        ((n / 8).max(1), n)
    }

    /// Messages per sender of a stream of `size` bytes as `kind` from `senders` threads.
    fn per_sender(self, kind: Kind, size: usize, senders: usize) -> u64 {
        let n = self.count(kind, size, self.stream_bytes, self.messages);
        n.div_ceil(senders as u64).max(1)
    }

    /// The budget in words, for the tables' notes.
    fn describe(self) -> String {
        let mib = |b: usize| {
            if b >= 1 << 20 {
                format!("{} MiB", b >> 20)
            } else {
                format!("{} KiB", b >> 10)
            }
        };
        format!(
            "per sample: ping-pong {} each way ({}–{} round trips, after an eighth as many \
             untimed), stream {} ({}–{} messages), both at most {} messages of the natural \
             sequence",
            mib(self.latency_bytes),
            self.round_trips.0,
            self.round_trips.1,
            mib(self.stream_bytes),
            self.messages.0,
            self.messages.1,
            self.wire
        )
    }
}

/// The sizes measured: powers of two from 8 to `max` (`--quick`: 8, 64, 512, 4096,
/// 32768 up to `max`).
fn sizes(max: usize, quick: bool) -> Vec<usize> {
    let step = if quick { 8 } else { 2 };
    std::iter::successors(Some(8usize), |s| Some(s * step))
        .take_while(|&s| s <= max)
        .collect()
}

/// `8 B`, `4 KiB`, `1 MiB`.
fn size_label(s: usize) -> String {
    if s >= 1 << 20 && s.is_multiple_of(1 << 20) {
        format!("{} MiB", s >> 20)
    } else if s >= 1 << 10 && s.is_multiple_of(1 << 10) {
        format!("{} KiB", s >> 10)
    } else {
        format!("{s} B")
    }
}

/// The harnesses of the paths, started once and kept across rounds.
struct Harness {
    threads: Option<Threads>,
    peer: Option<PingPong>,
    pair: Option<Pair>,
}

impl Harness {
    fn start(paths: &[Path], senders: usize) -> Result<Harness> {
        let threads = paths
            .contains(&Path::Threads)
            .then(|| Threads::new(senders));
        let peer = if paths.contains(&Path::Shm) {
            let exe = std::env::current_exe()
                .context("locating the multigrain binary to start the peer process")?;
            Some(PingPong::start(std::process::Command::new(exe)).map_err(anyhow::Error::msg)?)
        } else {
            None
        };
        let pair = paths
            .contains(&Path::Inis)
            .then(|| Pair::new(1, IniPolicy::Static));
        Ok(Harness {
            threads,
            peer,
            pair,
        })
    }

    /// One sample of `p`: one-way latency in µs, or bandwidth in MB/s (10⁶ bytes/s).
    fn sample(&mut self, p: Point, budget: Budget) -> f64 {
        let (kind, size) = (p.kind, p.size);
        match p.measure {
            Measure::Latency => {
                let rt = budget.round_trips(kind, size);
                let t = match p.path {
                    Path::Threads => self.threads().pingpong(kind, size, rt),
                    Path::Shm => self.peer().sized_pingpong(kind, size, rt),
                    Path::Inis => sized_pingpong(self.pair(), kind, size, rt),
                };
                t.as_secs_f64() * 1e6 / rt.1 as f64 / 2.0
            }
            Measure::Stream(senders) => {
                let per = budget.per_sender(kind, size, senders);
                let t = match p.path {
                    Path::Threads => self.threads().stream(kind, size, senders, per),
                    Path::Shm => self.peer().sized_stream(kind, size, senders, per),
                    Path::Inis => sized_stream(self.pair(), kind, size, senders, per),
                };
                (size as u64 * per * senders as u64) as f64 / t.as_secs_f64() / 1e6
            }
        }
    }

    fn threads(&mut self) -> &mut Threads {
        self.threads.as_mut().expect("threads path started")
    }

    fn peer(&self) -> &PingPong {
        self.peer.as_ref().expect("shm path started")
    }

    fn pair(&self) -> &Pair {
        self.pair.as_ref().expect("INI path started")
    }
}

/// The samples of every point, in round order.
type Samples = HashMap<Point, Vec<f64>>;

fn summary(s: &Samples, p: &Point) -> Option<Summary> {
    s.get(p).filter(|v| !v.is_empty()).map(|v| Summary::of(v))
}

fn cell(s: &Samples, p: &Point) -> Cell {
    s.get(p).map_or(Cell::Missing, |v| Cell::stat(v))
}

/// The half-power point of a bandwidth curve (sizes ascending, medians): the peak, the
/// size it is reached at, the first size whose bandwidth is at least half the peak
/// (paper 003's definition), and that size interpolated between the two grid sizes around
/// the crossing (linear in bandwidth, logarithmic in size; `None` when the first size is
/// already past half).
#[derive(Clone, Copy, Debug, PartialEq)]
struct HalfPower {
    peak: f64,
    peak_at: usize,
    first: usize,
    interpolated: Option<f64>,
}

fn half_power(curve: &[(usize, f64)]) -> Option<HalfPower> {
    let &(peak_at, peak) = curve
        .iter()
        .filter(|(_, b)| b.is_finite())
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    let half = peak / 2.0;
    let i = curve.iter().position(|&(_, b)| b >= half)?;
    let interpolated = i.checked_sub(1).map(|j| {
        let ((s0, b0), (s1, b1)) = (curve[j], curve[i]);
        let f = ((half - b0) / (b1 - b0)).clamp(0.0, 1.0);
        2f64.powf((s0 as f64).log2() + f * ((s1 as f64).log2() - (s0 as f64).log2()))
    });
    Some(HalfPower {
        peak,
        peak_at,
        first: curve[i].0,
        interpolated,
    })
}

/// Everything a table or figure needs.
struct Results<'a> {
    ctx: &'a Context,
    budget: Budget,
    paths: Vec<Path>,
    sizes: Vec<usize>,
    senders: Vec<usize>,
    samples: Samples,
}

impl Results<'_> {
    fn point(&self, path: Path, kind: Kind, size: usize, measure: Measure) -> Point {
        Point {
            path,
            kind,
            size,
            measure,
        }
    }

    /// Median bandwidth against size of one kind on one path.
    fn curve(&self, path: Path, kind: Kind, m: Measure) -> Vec<(usize, f64)> {
        self.sizes
            .iter()
            .filter_map(|&size| {
                let s = summary(&self.samples, &self.point(path, kind, size, m))?;
                Some(match m {
                    // Paper 003's "streaming bandwidth": size ÷ one-way latency.
                    Measure::Latency => (size, size as f64 / s.median),
                    Measure::Stream(_) => (size, s.median),
                })
            })
            .collect()
    }

    fn sequences_note(&self) -> String {
        format!(
            "a kind that cannot carry a size in one message sends its natural sequence \
             (column \"messages E/B/T/b\"): Express one word per 4 bytes (up to {} B; \
             larger: —, not measured), Basic one 256-byte message per 256 bytes, Tag-On \
             one 4 KiB pool slot per 4 KiB, bulk one message fragmented into 4080-byte \
             slots and reassembled; the sender copies the bytes into the message(s), the \
             receiver reads each once (a checksum it verifies)",
            EXPRESS_MAX
        )
    }

    fn messages_cell(size: usize) -> Cell {
        Cell::text(
            Kind::ALL
                .iter()
                .map(|k| k.messages(size).map_or("—".to_owned(), |n| n.to_string()))
                .collect::<Vec<_>>()
                .join("/"),
        )
    }

    fn latency_table(&self) -> Table {
        let mut t = Table::new(
            "message-size-latency",
            format!(
                "message-size: one-way latency (ping-pong ÷ 2, µs) against message size, per \
                 kind and path (paper 004 §6 Figures 4 and 6; paper 003 §4); {} round(s), \
                 median (min–max)",
                self.ctx.repeat
            ),
            vec![
                Column::new("path", "path", Fmt::Plain),
                Column::new("size", "size (B)", Fmt::Plain),
                Column::new("messages", "messages E/B/T/b", Fmt::Plain),
                Column::new("express_us", "Express (µs)", Fmt::Num),
                Column::new("basic_us", "Basic (µs)", Fmt::Num),
                Column::new("tag_on_us", "Tag-On (µs)", Fmt::Num),
                Column::new("bulk_us", "bulk (µs)", Fmt::Num),
            ],
        );
        for &path in &self.paths {
            for &size in &self.sizes {
                let mut row = vec![
                    Cell::text(path.label()),
                    Cell::Int(size as u64),
                    Self::messages_cell(size),
                ];
                for kind in Kind::ALL {
                    row.push(cell(
                        &self.samples,
                        &self.point(path, kind, size, Measure::Latency),
                    ));
                }
                t.push(row);
            }
        }
        t.notes.push(format!(
            "ping-pong: one side sends the whole message, the other receives all of it and \
             sends it back; one-way = round trip ÷ 2; threads and shm busy-poll with the two \
             ends pinned to different CPUs; INIs: 1 dedicated INI thread per cluster, \
             receivers wait in recv_timeout; {}; {}",
            self.budget.describe(),
            self.sequences_note()
        ));
        t.notes.push(self.ctx.machine_note());
        t
    }

    fn bandwidth_table(&self) -> Table {
        // Column keys and heads must be 'static: leak the few this run makes.
        let mut columns = vec![
            Column::new("path", "path", Fmt::Plain),
            Column::new("size", "size (B)", Fmt::Plain),
        ];
        for &n in &self.senders {
            for kind in Kind::ALL {
                let key: &'static str = Box::leak(format!("{}_x{n}_mbs", kind.id()).into());
                let head: &'static str = Box::leak(format!("{} ×{n}", kind.label()).into());
                columns.push(Column::median(key, head, Fmt::Num));
            }
        }
        let mut t = Table::new(
            "message-size-bandwidth",
            format!(
                "message-size: streaming bandwidth (MB/s = 10⁶ bytes/s) against message size, \
                 per path, kind and sender threads (×N: N threads stream into one receiver; \
                 paper 004 §6 Figures 5 and 7); {} round(s), median printed, min and max in \
                 the CSV and JSON",
                self.ctx.repeat
            ),
            columns,
        );
        for &path in &self.paths {
            for &size in &self.sizes {
                let mut row = vec![Cell::text(path.label()), Cell::Int(size as u64)];
                for &n in &self.senders {
                    for kind in Kind::ALL {
                        row.push(cell(
                            &self.samples,
                            &self.point(path, kind, size, Measure::Stream(n)),
                        ));
                    }
                }
                t.push(row);
            }
        }
        t.notes.push(format!(
            "stream: the senders send back to back, bandwidth = bytes ÷ time from the start \
             until the last byte is received (shm: until the peer's one-word acknowledgement arrives); threads: \
             receiver on one CPU, every sender on the other; shm: every sender in this process, \
             the receiver in the peer; INIs: no pinning, one INI per cluster whatever the \
             senders; a full queue or pool makes a sender yield its CPU; {}; {}",
            self.budget.describe(),
            self.sequences_note()
        ));
        t.notes.push(self.ctx.machine_note());
        t
    }

    fn half_power_table(&self) -> Table {
        let mut t = Table::new(
            "message-size-half-power",
            "message-size: peak bandwidth and the half-power point n½ (the smallest message \
             size whose bandwidth is at least half the peak; paper 003 §4) per path, kind and \
             sender threads, from the medians",
            vec![
                Column::new("path", "path", Fmt::Plain),
                Column::new("kind", "kind", Fmt::Plain),
                Column::new("senders", "senders", Fmt::Plain),
                Column::new("peak_mbs", "peak (MB/s)", Fmt::Num),
                Column::new("peak_at", "at (B)", Fmt::Plain),
                Column::new("n_half", "n½ (B)", Fmt::Plain),
                Column::new("n_half_interp", "n½ interp. (B)", Fmt::Count),
                Column::new("n_half_pingpong", "n½ ping-pong (B)", Fmt::Plain),
                Column::new("note", "note", Fmt::Plain),
            ],
        );
        for &path in &self.paths {
            for kind in Kind::ALL {
                let pingpong = half_power(&self.curve(path, kind, Measure::Latency));
                for &n in &self.senders {
                    let Some(h) = half_power(&self.curve(path, kind, Measure::Stream(n))) else {
                        continue;
                    };
                    let mut notes = Vec::new();
                    if h.interpolated.is_none() {
                        notes.push("n½ ≤ smallest size".to_owned());
                    }
                    let top = self
                        .sizes
                        .iter()
                        .rev()
                        .find(|&&s| kind.messages(s).is_some());
                    if top == Some(&h.peak_at) && h.peak_at > self.sizes[0] {
                        notes.push("still rising at the largest size".to_owned());
                    }
                    t.push(vec![
                        Cell::text(path.label()),
                        Cell::text(kind.label()),
                        Cell::Int(n as u64),
                        Cell::stat(&[h.peak]),
                        Cell::Int(h.peak_at as u64),
                        Cell::Int(h.first as u64),
                        h.interpolated.map_or(Cell::Missing, |x| Cell::stat(&[x])),
                        if n == 1 {
                            pingpong.map_or(Cell::Missing, |p| Cell::Int(p.first as u64))
                        } else {
                            Cell::Missing
                        },
                        Cell::text(notes.join("; ")),
                    ]);
                }
            }
        }
        t.notes.push(format!(
            "sizes measured: {}; n½ = the first of them reaching half the peak; interp.: \
             between that size and the one before, linear in bandwidth and in log(size); \
             ping-pong: the same from paper 003's \"streaming bandwidth\", size ÷ one-way \
             latency (1 sender)",
            self.sizes
                .iter()
                .map(|&s| size_label(s))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        t.notes.push(self.ctx.machine_note());
        t
    }

    /// A figure with one line per (path, kind) through the sizes, of `value` of each point.
    fn figure(
        &self,
        title: String,
        y_label: &str,
        measure: Measure,
        value: impl Fn(Path, Kind, Summary) -> Option<Summary>,
    ) -> Figure {
        let mut series = Vec::new();
        for &path in &self.paths {
            for kind in Kind::ALL {
                let values = self
                    .sizes
                    .iter()
                    .map(|&size| {
                        let s = summary(&self.samples, &self.point(path, kind, size, measure))?;
                        value(path, kind, s)
                    })
                    .collect();
                series.push(Series {
                    name: format!("{}, {}", kind.label(), path.label()),
                    kind: Draw::Line,
                    values,
                });
            }
        }
        Figure {
            title,
            y_label: y_label.into(),
            groups: self.sizes.iter().map(|&s| size_label(s)).collect(),
            series,
        }
    }

    fn latency_figure(&self) -> Figure {
        self.figure(
            "One-way latency vs message size (ping-pong ÷ 2; paper 004 Figures 4/6, paper 003)"
                .into(),
            "one-way latency (µs, log scale)",
            Measure::Latency,
            |_, _, s| Some(s),
        )
    }

    fn bandwidth_figure(&self) -> Figure {
        self.figure(
            "Streaming bandwidth vs message size, 1 sender (paper 004 Figures 5/7)".into(),
            "bandwidth (MB/s, log scale)",
            Measure::Stream(1),
            |_, _, s| Some(s),
        )
    }

    /// Bandwidth as a fraction of its curve's peak: n½ is where a line crosses 0.5.
    fn half_power_figure(&self) -> Figure {
        let peaks: HashMap<(Path, Kind), f64> = self
            .paths
            .iter()
            .flat_map(|&p| Kind::ALL.map(|k| (p, k)))
            .filter_map(|(p, k)| {
                let h = half_power(&self.curve(p, k, Measure::Stream(1)))?;
                Some(((p, k), h.peak))
            })
            .collect();
        self.figure(
            "Bandwidth as a fraction of its peak, 1 sender: n½ where a line crosses 0.5 (paper 003)"
                .into(),
            "bandwidth ÷ peak bandwidth",
            Measure::Stream(1),
            |p, k, s| {
                let peak = *peaks.get(&(p, k))?;
                let scale = |x: f64| x / peak;
                Some(Summary {
                    median: scale(s.median),
                    p25: scale(s.p25),
                    p75: scale(s.p75),
                    min: scale(s.min),
                    max: scale(s.max),
                    samples: s.samples,
                })
            },
        )
    }
}

/// A permutation of `0..n`, the same for the same `seed` (Fisher–Yates driven by a
/// 64-bit linear congruential generator: no randomness is needed, only an order
/// unrelated to size).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..n).rev() {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        v.swap(i, ((x >> 33) as usize) % (i + 1));
    }
    v
}

/// Runs the experiment.
///
/// # Errors
/// Bad flags (`--set`, which has nothing to change here), a peer process or INI pair that
/// does not start, or a figure that cannot be written.
pub fn run(ctx: &Context, a: &MessageSizeArgs) -> Result<Outcome> {
    if !ctx.sets.is_empty() {
        bail!(
            "experiment message-size takes no --set: its runs are microbenchmarks in this \
             process and one peer process (the message layer's own sites; INIs over UDP \
             loopback), not `multigrain run` jobs; its knobs are --max-size, --senders and \
             --paths"
        );
    }
    let max = a
        .max_size
        .map_or(if ctx.quick { QUICK_MAX } else { FULL_MAX }, |m| m as usize);
    let sizes = sizes(max, ctx.quick);
    let mut senders: Vec<usize> = if a.senders.is_empty() {
        if ctx.quick { vec![1, 2] } else { vec![1, 2, 4] }
    } else {
        a.senders.iter().map(|&n| n as usize).collect()
    };
    senders.sort_unstable();
    senders.dedup();
    let paths: Vec<Path> = if a.paths.is_empty() {
        Path::ALL.to_vec()
    } else {
        Path::ALL
            .into_iter()
            .filter(|p| a.paths.contains(p))
            .collect()
    };
    let budget = if ctx.quick { QUICK } else { FULL };
    // Paths innermost: the three are sampled moments apart, and none idles for long (the
    // shm peer process gives up after a minute without a message).
    let measures: Vec<Measure> = std::iter::once(Measure::Latency)
        .chain(senders.iter().map(|&n| Measure::Stream(n)))
        .collect();
    let mut points = Vec::new();
    for &size in &sizes {
        for kind in Kind::ALL {
            if kind.messages(size).is_none() {
                continue;
            }
            for &measure in &measures {
                for &path in &paths {
                    points.push(Point {
                        path,
                        kind,
                        size,
                        measure,
                    });
                }
            }
        }
    }
    let mut harness = Harness::start(&paths, senders.last().copied().unwrap_or(1))?;
    let total = (ctx.repeat * points.len()) as u64;
    let progress = crate::progress::bar(total, &format!("experiment {}", ctx.name));
    let lines = crate::progress::shown() == crate::progress::Shown::Lines;
    let started = Instant::now();
    let mut samples: Samples = HashMap::new();
    for round in 0..ctx.repeat {
        // Each round in its own order (paths kept together), so that a change of the
        // machine's speed regime during a round is not read as an effect of size or kind.
        let order = shuffled(points.len() / paths.len(), round as u64);
        for p in order
            .iter()
            .flat_map(|&g| &points[g * paths.len()..(g + 1) * paths.len()])
        {
            let x = harness.sample(*p, budget);
            samples.entry(*p).or_default().push(x);
            progress.inc(1);
        }
        if lines {
            eprintln!(
                "experiment {}: round {}/{} done ({} points), {:.1} s",
                ctx.name,
                round + 1,
                ctx.repeat,
                points.len(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    progress.finish_and_clear();
    drop(harness);
    let wall_s = started.elapsed().as_secs_f64();
    if !crate::progress::quiet() {
        eprintln!("experiment {}: {total} samples in {wall_s:.0} s", ctx.name);
    }
    let r = Results {
        ctx,
        budget,
        paths,
        sizes,
        senders,
        samples,
    };
    let tables = vec![r.latency_table(), r.bandwidth_table(), r.half_power_table()];
    let log = Style {
        log_y: true,
        legend: Legend::UpperLeft,
    };
    let extra = [
        ("latency", r.latency_figure(), log),
        (
            "bandwidth",
            r.bandwidth_figure(),
            Style {
                log_y: true,
                legend: Legend::LowerRight,
            },
        ),
    ];
    for (what, fig, style) in &extra {
        super::plot::write_styled(fig, &ctx.out.join(format!("{}-{what}", ctx.name)), *style)?;
    }
    Ok(Outcome {
        tables,
        figure: r.half_power_figure(),
        params: json!({
            "paths": r.paths.iter().map(|p| p.id()).collect::<Vec<_>>(),
            "sizes": r.sizes,
            "senders": r.senders,
            "express_max": EXPRESS_MAX,
            "budget": {
                "latency_bytes": budget.latency_bytes,
                "round_trips": budget.round_trips,
                "stream_bytes": budget.stream_bytes,
                "messages": budget.messages,
            },
            "figures": [format!("{}-latency", ctx.name), format!("{}-bandwidth", ctx.name)],
            "wall_s": wall_s,
        }),
        points: Vec::new(),
        failed: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_power_is_the_first_size_at_half_the_peak() {
        let h = half_power(&[(8, 1.0), (16, 3.0), (32, 8.0), (64, 10.0), (128, 9.0)]).unwrap();
        assert_eq!((h.peak, h.peak_at, h.first), (10.0, 64, 32));
        let x = h.interpolated.unwrap();
        assert!(x > 16.0 && x < 32.0, "{x}");
        // Half of 10 is 5, 2/5 of the way from 3 to 8: 16 · 2^0.4.
        assert!((x - 16.0 * 2f64.powf(0.4)).abs() < 1e-9, "{x}");
        let flat = half_power(&[(8, 6.0), (16, 10.0)]).unwrap();
        assert_eq!((flat.first, flat.interpolated), (8, None));
        assert!(half_power(&[]).is_none());
    }

    #[test]
    fn rounds_are_permutations() {
        let mut a = shuffled(100, 1);
        assert_ne!(a, shuffled(100, 2));
        assert_ne!(a, (0..100).collect::<Vec<_>>());
        a.sort_unstable();
        assert_eq!(a, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn sizes_and_labels() {
        assert_eq!(sizes(64, false), [8, 16, 32, 64]);
        assert_eq!(sizes(QUICK_MAX, true), [8, 64, 512, 4096, 32768]);
        assert_eq!(sizes(FULL_MAX, false).len(), 18);
        assert_eq!(size_label(8), "8 B");
        assert_eq!(size_label(4096), "4 KiB");
        assert_eq!(size_label(1 << 20), "1 MiB");
        assert_eq!(size_label(1536), "1536 B");
    }

    #[test]
    fn budgets_are_clamped() {
        assert_eq!(FULL.round_trips(Kind::TagOn, 8), (125, 1000));
        assert_eq!(FULL.round_trips(Kind::TagOn, 1 << 20), (1, 4));
        assert_eq!(FULL.per_sender(Kind::TagOn, 8, 1), 8000);
        assert_eq!(FULL.per_sender(Kind::Express, 8, 1), 4096, "2 words each");
        assert_eq!(
            FULL.per_sender(Kind::Basic, 1 << 20, 1),
            8,
            "4096 Basic each"
        );
        assert_eq!(FULL.per_sender(Kind::TagOn, 1 << 20, 4), 2);
        assert_eq!(QUICK.per_sender(Kind::Bulk, 32768, 2), 2);
    }
}
