//! EM3D (Culler et al., Split-C): electromagnetic wave propagation on an irregular
//! bipartite graph of electric (E) and magnetic (H) nodes. Each iteration updates every E
//! node from its H neighbours, `e -= Σₖ coefₖ · h[nbrₖ]` (edges in a fixed order), then
//! every H node from its E neighbours the same way.
//!
//! # Problem and partitioning
//!
//! The graph has `P` partitions (`P` = number of threads of the parallel run; the
//! sequential reference takes `P` as a parameter) of `nodes_per_thread` E and as many H
//! nodes. Partitions sit on a 3-D grid ([`Grid::for_parts`], e.g. 32 → 4×4×2 as in
//! paper 000 §5.2). Each node has `degree` edges; an edge is *remote* with probability
//! `percent_remote`% and then leads to a random node of a random grid-adjacent partition
//! (26-neighbourhood, no wrap-around), otherwise to a random node of its own partition.
//! Graph, coefficients and initial values come from ChaCha8 streams keyed by the seed and
//! node id (see `Graph::build`), so every process and every thread count that uses the
//! same `P` builds the same graph.
//!
//! # Layouts (paper 000 §5.2)
//!
//! A layout maps partitions to threads and so decides how many remote edges cross
//! clusters. The graph and every field value are the same for both layouts.
//!
//! * [`Layout::Naive`]: partition `p` → thread `p`. With cluster-major thread numbering a
//!   cluster owns a run of consecutive partitions, i.e. a slab (4×2×1 of the 4×4×2 grid
//!   for 4 clusters of 8).
//! * [`Layout::Good`]: each cluster owns a compact block `bx×by×bz` of the grid (the one
//!   with the smallest `bx+by+bz` that divides the grid and holds one cluster's threads;
//!   ties go to the larger `bx`, then `by`): blocks are numbered x-fastest and block `c`
//!   goes to cluster `c`; inside a block, partitions in x-fastest order go to the
//!   cluster's threads in ascending id. 4×8 threads → 2×2×2 blocks. It needs clusters of
//!   equal size whose block tiles the grid, else [`Em3dError::LayoutUnsupported`].
//!
//! # Variants (paper 001 §4.1)
//!
//! * [`Variant::Read`]: a thread reads its neighbours' values straight from the shared
//!   value arrays (remote reads), writes only its own nodes; barrier between phases.
//! * [`Variant::Write`]: each consumer partition owns ghost slots (boundary copies), one per
//!   distinct remote node it reads. After a thread updates its E nodes it writes ("pushes")
//!   each updated value into the ghost slots of every consumer, then a barrier; the next
//!   phase reads only its own partition's values and its own ghosts. Same for H.
//!
//! Both variants and the sequential reference evaluate each node's update with the same
//! kernel in the same edge order from the same inputs, so their fields are bit-identical;
//! [`Checksum`] records the sums and a hash of every bit pattern.

mod graph;

use std::fmt;
use std::ops::Range;
use std::time::Instant;

pub use graph::Grid;
use graph::{E, GHOST, GhostPlan, Graph, H, Placement, place};

use crate::progress::{Progress, Silent};
use crate::storage::{F64Words, LocalF64s, U64Words};
use crate::team::{Runtime, RuntimeError, Team, Topology};

/// How partitions are assigned to threads (and so to clusters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Layout {
    /// Partition `p` on thread `p`: clusters own slabs of the grid.
    Naive,
    /// Clusters own compact blocks of the grid.
    Good,
}

/// How values reach the threads that need them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Variant {
    /// Pull: read neighbour values from the owners' arrays.
    Read,
    /// Push: owners write updated values into consumers' ghost slots.
    Write,
}

/// EM3D parameters.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Params {
    /// E nodes per partition (= per thread), and as many H nodes. Default 2,500 (paper 000
    /// Table 3).
    pub nodes_per_thread: usize,
    /// Edges per node. Default 20.
    pub degree: usize,
    /// Percentage (0..=100) of edges that lead to another partition. Default 40.
    pub percent_remote: u32,
    /// Thread layout. Default naive.
    pub layout: Layout,
    /// Communication variant. Default read.
    pub variant: Variant,
    /// Iterations (each = E phase + H phase). Default 100, the step count of paper 001's
    /// EM3D runs.
    pub iterations: usize,
    /// Seed of the graph and initial values.
    pub seed: u64,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            nodes_per_thread: 2500,
            degree: 20,
            percent_remote: 40,
            layout: Layout::Naive,
            variant: Variant::Read,
            iterations: 100,
            seed: 0x454d_3344,
        }
    }
}

impl Params {
    /// Checks the ranges.
    ///
    /// # Errors
    /// [`Em3dError::InvalidParams`] naming the bad value.
    pub fn validate(&self) -> Result<(), Em3dError> {
        if self.nodes_per_thread == 0 {
            return Err(Em3dError::InvalidParams(
                "nodes per thread must be at least 1".to_owned(),
            ));
        }
        if self.degree == 0 {
            return Err(Em3dError::InvalidParams(
                "degree must be at least 1".to_owned(),
            ));
        }
        if self.percent_remote > 100 {
            return Err(Em3dError::InvalidParams(format!(
                "percent remote {} must be 0..=100",
                self.percent_remote
            )));
        }
        Ok(())
    }
}

/// Fingerprint of the final fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Checksum {
    /// Sum of all E values in node order (bits of the f64).
    pub e_sum_bits: u64,
    /// Sum of all H values in node order (bits of the f64).
    pub h_sum_bits: u64,
    /// FNV-1a (64-bit) over the bit patterns of all E values then all H values, in node
    /// order, each as 8 little-endian bytes.
    pub fnv1a: u64,
}

impl Checksum {
    /// Sum of the E values (field units).
    #[must_use]
    pub fn e_sum(&self) -> f64 {
        f64::from_bits(self.e_sum_bits)
    }

    /// Sum of the H values (field units).
    #[must_use]
    pub fn h_sum(&self) -> f64 {
        f64::from_bits(self.h_sum_bits)
    }

    fn of<A: F64Words>(e: &A, h: &A) -> Self {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut sums = [0.0f64; 2];
        for (arr, sum) in [e, h].into_iter().zip(&mut sums) {
            for i in 0..arr.len() {
                let v = arr.get(i);
                *sum += v;
                for byte in v.to_bits().to_le_bytes() {
                    hash ^= u64::from(byte);
                    hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
                }
            }
        }
        Self {
            e_sum_bits: sums[0].to_bits(),
            h_sum_bits: sums[1].to_bits(),
            fnv1a: hash,
        }
    }
}

impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "E sum {:.17e}  H sum {:.17e}  fnv1a {:016x}",
            self.e_sum(),
            self.h_sum(),
            self.fnv1a
        )
    }
}

/// How edges fall relative to threads and clusters for one layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EdgeStats {
    /// All edges (E→H and H→E).
    pub edges: u64,
    /// Edges whose neighbour lives on another thread.
    pub remote_edges: u64,
    /// Edges whose neighbour lives in another cluster (remote reads in the read variant).
    pub cross_cluster_edges: u64,
    /// Ghost slots: distinct (remote value, consumer thread) pairs = values pushed per
    /// iteration in the write variant.
    pub ghost_slots: u64,
    /// Ghost slots whose producer is in another cluster than the consumer.
    pub cross_cluster_ghosts: u64,
}

/// Wall-clock times in seconds (of this process's first thread for parallel runs).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Times {
    /// Building the graph (and the ghost plan), s.
    pub setup_s: f64,
    /// Writing the initial values (and first ghost pushes) into the arrays, s.
    pub init_s: f64,
    /// All iterations, s.
    pub compute_s: f64,
    /// E phases (update, pushes, barrier), s.
    pub e_phase_s: f64,
    /// H phases (update, pushes, barrier), s.
    pub h_phase_s: f64,
}

/// Result of an EM3D run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunResult {
    /// Partitions = threads of the parallel run.
    pub partitions: usize,
    /// The partition grid.
    pub grid: Grid,
    /// Layout (parallel runs; `None` for the sequential reference).
    pub layout: Option<Layout>,
    /// Variant (parallel runs; `None` for the sequential reference).
    pub variant: Option<Variant>,
    /// Cluster block of the good layout, x, y, z.
    pub cluster_block: Option<[usize; 3]>,
    /// Edge placement statistics (parallel runs).
    pub edge_stats: Option<EdgeStats>,
    /// Fingerprint of the final fields.
    pub checksum: Checksum,
    /// Timing.
    pub times: Times,
}

/// Errors of an EM3D run.
#[derive(Debug, thiserror::Error)]
pub enum Em3dError {
    /// A parameter is out of range.
    #[error("invalid EM3D parameters: {0}")]
    InvalidParams(String),
    /// The layout cannot be applied to this topology.
    #[error("layout not applicable: {0}")]
    LayoutUnsupported(String),
    /// The runtime failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The runtime ran no compute thread in this process.
    #[error("the runtime ran no compute thread in this process")]
    NoLocalThread,
}

/// The update kernel: for each node `g` in `nodes`, `dst[g] -= Σₖ coef[g·d+k] ·
/// source(edges[g·d+k])`, subtracting term by term in edge order.
#[inline]
fn update_nodes<D: F64Words>(
    dst: &D,
    nodes: Range<usize>,
    d: usize,
    edges: &[u32],
    coefs: &[f64],
    source: impl Fn(u32) -> f64,
) {
    for g in nodes {
        let es = &edges[g * d..(g + 1) * d];
        let cs = &coefs[g * d..(g + 1) * d];
        let mut v = dst.get(g);
        for (&e, &c) in es.iter().zip(cs) {
            v -= c * source(e);
        }
        dst.set(g, v);
    }
}

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// Names of the phases reported to a [`Progress`], in order.
pub const PHASES: [&str; 3] = ["graph", "initial values", "iterations"];

/// The sequential reference on the graph of `partitions` partitions.
///
/// # Errors
/// [`Em3dError::InvalidParams`].
pub fn run_sequential(params: &Params, partitions: usize) -> Result<RunResult, Em3dError> {
    run_sequential_with(params, partitions, &Silent)
}

/// [`run_sequential`], reporting its [`PHASES`] to `progress` (the iterations counted).
///
/// # Errors
/// As [`run_sequential`].
pub fn run_sequential_with(
    params: &Params,
    partitions: usize,
    progress: &dyn Progress,
) -> Result<RunResult, Em3dError> {
    params.validate()?;
    if partitions == 0 {
        return Err(Em3dError::InvalidParams(
            "partitions must be at least 1".to_owned(),
        ));
    }
    progress.begin(PHASES[0], 0);
    let t = Instant::now();
    let g = Graph::build(params, partitions)?;
    let mut times = Times {
        setup_s: secs(t),
        ..Times::default()
    };
    progress.begin(PHASES[1], 0);
    let t = Instant::now();
    let e = LocalF64s::from_slice(&g.init[E]);
    let h = LocalF64s::from_slice(&g.init[H]);
    times.init_s = secs(t);
    let all = 0..partitions * g.n;
    progress.begin(PHASES[2], params.iterations as u64);
    let t_all = Instant::now();
    for it in 1..=params.iterations {
        let t = Instant::now();
        update_nodes(&e, all.clone(), g.d, &g.nbr[E], &g.coef[E], |x| {
            h.get(x as usize)
        });
        times.e_phase_s += secs(t);
        let t = Instant::now();
        update_nodes(&h, all.clone(), g.d, &g.nbr[H], &g.coef[H], |x| {
            e.get(x as usize)
        });
        times.h_phase_s += secs(t);
        progress.advance(it as u64);
    }
    times.compute_s = secs(t_all);
    Ok(RunResult {
        partitions,
        grid: g.grid,
        layout: None,
        variant: None,
        cluster_block: None,
        edge_stats: None,
        checksum: Checksum::of(&e, &h),
        times,
    })
}

/// Checks `params` and their layout on `topology` without building the graph: what a
/// launcher checks before any process starts (building the graph of the issue-10 EM3D
/// job, 2 × 20,000 nodes of each kind with 20 edges each, takes ≈ 0.1 s, and every
/// cluster builds it again).
///
/// # Errors
/// Invalid parameters, a graph over the node limit, or a layout the topology cannot take.
pub fn check(params: &Params, topology: &Topology) -> Result<(), Em3dError> {
    params.validate()?;
    let parts = topology.num_threads();
    graph::node_count(params, parts)?;
    place(params.layout, Grid::for_parts(parts), topology).map(|_| ())
}

/// Edge statistics of `params` (layout included) on `topology`, without running.
///
/// # Errors
/// Invalid parameters or a layout the topology cannot take.
pub fn edge_stats(params: &Params, topology: &Topology) -> Result<EdgeStats, Em3dError> {
    params.validate()?;
    let g = Graph::build(params, topology.num_threads())?;
    let pl = place(params.layout, g.grid, topology)?;
    Ok(stats(&g, &GhostPlan::build(&g)?, &pl, topology))
}

fn stats(g: &Graph, plan: &GhostPlan, pl: &Placement, topo: &Topology) -> EdgeStats {
    let cluster_of_part = |p: usize| topo.cluster_of(pl.thread_of_part[p]);
    let mut s = EdgeStats {
        edges: 0,
        remote_edges: 0,
        cross_cluster_edges: 0,
        ghost_slots: 0,
        cross_cluster_ghosts: 0,
    };
    for kind in [E, H] {
        for (i, &x) in g.nbr[kind].iter().enumerate() {
            let own = i / g.d / g.n;
            let other = g.part_of(x);
            s.edges += 1;
            s.remote_edges += u64::from(own != other);
            s.cross_cluster_edges += u64::from(cluster_of_part(own) != cluster_of_part(other));
        }
    }
    for v in [E, H] {
        s.ghost_slots += plan.slots(v) as u64;
        for (p, list) in plan.push[v].iter().enumerate() {
            for &(_, slot) in list {
                let q = plan.offset[v].partition_point(|&o| o <= slot as usize) - 1;
                s.cross_cluster_ghosts += u64::from(cluster_of_part(p) != cluster_of_part(q));
            }
        }
    }
    s
}

/// The parallel program on `rt`: one partition per thread, placed by `params.layout`,
/// communicating by `params.variant`.
///
/// Shared memory: the E and H value arrays (`P × nodes_per_thread` f64 words each, a
/// partition's nodes contiguous), for the write variant the two ghost arrays, and 3 words
/// to broadcast the checksum. The graph itself (edges, coefficients) is built in every
/// process and only read by the owning thread. The result is that of this process's
/// first thread; every thread computes the same checksum.
///
/// # Errors
/// Invalid parameters, an unsupported layout, or a runtime failure.
pub fn run_parallel<R: Runtime>(rt: &mut R, params: &Params) -> Result<RunResult, Em3dError> {
    run_parallel_with(rt, params, &Silent)
}

/// [`run_parallel`], reporting the [`PHASES`] to `progress`: the graph phase from the
/// calling thread (before the parallel section), the others from thread 0 (iterations
/// counted).
///
/// # Errors
/// As [`run_parallel`].
pub fn run_parallel_with<R: Runtime>(
    rt: &mut R,
    params: &Params,
    progress: &dyn Progress,
) -> Result<RunResult, Em3dError> {
    params.validate()?;
    let topo = rt.topology().clone();
    let parts = topo.num_threads();
    progress.begin(PHASES[0], 0);
    let t = Instant::now();
    let g = Graph::build(params, parts)?;
    let pl = place(params.layout, g.grid, &topo)?;
    let plan = GhostPlan::build(&g)?;
    let setup_s = secs(t);
    let edge_stats = stats(&g, &plan, &pl, &topo);

    let total = parts * g.n;
    let values = [rt.alloc_f64s(total)?, rt.alloc_f64s(total)?];
    let ghost_len = |v| match params.variant {
        Variant::Read => 0,
        Variant::Write => plan.slots(v),
    };
    let ghosts = [rt.alloc_f64s(ghost_len(E))?, rt.alloc_f64s(ghost_len(H))?];
    let sums = rt.alloc_f64s(2)?;
    let hash = rt.alloc_u64s(1)?;
    let job = Job {
        params,
        g: &g,
        plan: &plan,
        pl: &pl,
        values: &values,
        ghosts: &ghosts,
        sums: &sums,
        hash: &hash,
        progress,
    };
    let outs = rt.run(|team| job.thread(team))?;
    let (checksum, mut times) = outs.into_iter().next().ok_or(Em3dError::NoLocalThread)?;
    times.setup_s = setup_s;
    Ok(RunResult {
        partitions: parts,
        grid: g.grid,
        layout: Some(params.layout),
        variant: Some(params.variant),
        cluster_block: pl.cluster_block,
        edge_stats: Some(edge_stats),
        checksum,
        times,
    })
}

/// What every thread of the parallel program borrows.
struct Job<'a, F, U> {
    params: &'a Params,
    g: &'a Graph,
    plan: &'a GhostPlan,
    pl: &'a Placement,
    values: &'a [F; 2],
    ghosts: &'a [F; 2],
    sums: &'a F,
    hash: &'a U,
    progress: &'a dyn Progress,
}

impl<F: F64Words + Sync, U: U64Words + Sync> Job<'_, F, U> {
    /// Updates this partition's nodes of `kind` from the other kind's values.
    fn phase(&self, kind: usize, nodes: &Range<usize>) {
        let (g, dst) = (self.g, &self.values[kind]);
        let other = &self.values[1 - kind];
        match self.params.variant {
            Variant::Read => {
                update_nodes(dst, nodes.clone(), g.d, &g.nbr[kind], &g.coef[kind], |x| {
                    other.get(x as usize)
                })
            }
            Variant::Write => {
                let ghost = &self.ghosts[1 - kind];
                update_nodes(
                    dst,
                    nodes.clone(),
                    g.d,
                    &self.plan.src[kind],
                    &g.coef[kind],
                    |x| {
                        if x & GHOST == 0 {
                            other.get(x as usize)
                        } else {
                            ghost.get((x & !GHOST) as usize)
                        }
                    },
                );
            }
        }
    }

    /// Write variant: copies this partition's values of `kind` into consumers' ghosts.
    fn push(&self, kind: usize, part: usize) {
        if self.params.variant == Variant::Write {
            let (src, ghost) = (&self.values[kind], &self.ghosts[kind]);
            for &(node, slot) in &self.plan.push[kind][part] {
                ghost.set(slot as usize, src.get(node as usize));
            }
        }
    }

    fn thread<T: Team>(&self, team: &T) -> (Checksum, Times) {
        let me = team.thread_id();
        let part = self.pl.part_of_thread[me];
        let n = self.g.n;
        let nodes = part * n..(part + 1) * n;
        let mut times = Times::default();
        let progress: &dyn Progress = if me == 0 { self.progress } else { &Silent };

        progress.begin(PHASES[1], 0);
        // The start line: the clock starts when every thread is here. Cluster processes
        // build their graphs and start at different times (tens of ms apart), and that
        // skew is start-up, not computation (SPLASH-2's LU and Cholesky likewise pass a
        // barrier, then read the clock).
        team.barrier();
        let t = Instant::now();
        for kind in [E, H] {
            for i in nodes.clone() {
                self.values[kind].set(i, self.g.init[kind][i]);
            }
        }
        self.push(H, part);
        team.barrier();
        times.init_s = secs(t);

        progress.begin(PHASES[2], self.params.iterations as u64);
        let t_all = Instant::now();
        for it in 1..=self.params.iterations {
            let t = Instant::now();
            self.phase(E, &nodes);
            self.push(E, part);
            team.barrier();
            times.e_phase_s += secs(t);
            let t = Instant::now();
            self.phase(H, &nodes);
            self.push(H, part);
            team.barrier();
            times.h_phase_s += secs(t);
            progress.advance(it as u64);
        }
        times.compute_s = secs(t_all);

        // Thread 0 fingerprints the fields and broadcasts the result.
        if me == 0 {
            let c = Checksum::of(&self.values[E], &self.values[H]);
            self.sums.set(0, f64::from_bits(c.e_sum_bits));
            self.sums.set(1, f64::from_bits(c.h_sum_bits));
            self.hash.set(0, c.fnv1a);
        }
        team.barrier();
        let checksum = Checksum {
            e_sum_bits: self.sums.get(0).to_bits(),
            h_sum_bits: self.sums.get(1).to_bits(),
            fnv1a: self.hash.get(0),
        };
        (checksum, times)
    }
}

#[cfg(test)]
mod tests;
