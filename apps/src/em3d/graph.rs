//! The EM3D graph: partitions on a 3-D processor grid, nodes and edges generated from a
//! seed, the thread layouts, and the ghost (boundary-copy) plan of the write variant.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Em3dError, Layout, Params};
use crate::team::Topology;

/// Node kinds.
pub(crate) const E: usize = 0;
pub(crate) const H: usize = 1;

/// Tag bit of a write-variant edge source that names a ghost slot (else a value index).
pub(crate) const GHOST: u32 = 1 << 31;

/// A 3-D grid of partitions, numbered x-fastest: partition `x + gx·(y + gy·z)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Grid {
    /// Partitions along x, y, z.
    pub dims: [usize; 3],
}

impl Grid {
    /// The grid for `parts` partitions: `gx ≥ gy ≥ gz` with `gx·gy·gz = parts` and the
    /// smallest `gx + gy + gz` (the most cube-like), e.g. 32 → 4×4×2, 16 → 4×2×2,
    /// 8 → 2×2×2, 6 → 3×2×1, 7 → 7×1×1.
    #[must_use]
    pub fn for_parts(parts: usize) -> Self {
        let mut best = [parts.max(1), 1, 1];
        for gz in 1..=parts {
            if gz * gz * gz > parts {
                break;
            }
            if !parts.is_multiple_of(gz) {
                continue;
            }
            for gy in gz..=parts / gz {
                if gy * gy * gz > parts {
                    break;
                }
                if !(parts / gz).is_multiple_of(gy) {
                    continue;
                }
                let gx = parts / gz / gy;
                if gx + gy + gz < best.iter().sum::<usize>() {
                    best = [gx, gy, gz];
                }
            }
        }
        Self { dims: best }
    }

    /// Number of partitions.
    #[must_use]
    pub fn parts(&self) -> usize {
        self.dims.iter().product()
    }

    /// Grid coordinates of partition `p`.
    #[must_use]
    pub fn coords(&self, p: usize) -> [usize; 3] {
        let [gx, gy, _] = self.dims;
        [p % gx, (p / gx) % gy, p / (gx * gy)]
    }

    /// Partition at grid coordinates `c`.
    #[must_use]
    pub fn part_at(&self, c: [usize; 3]) -> usize {
        let [gx, gy, _] = self.dims;
        c[0] + gx * (c[1] + gy * c[2])
    }

    /// The partitions adjacent to `p` (26-neighbourhood: every other partition at most one
    /// step away along each axis, clipped at the grid's faces, no wrap-around), ascending.
    #[must_use]
    pub fn neighbours(&self, p: usize) -> Vec<usize> {
        let c = self.coords(p);
        let range = |axis: usize| {
            let lo = c[axis].saturating_sub(1);
            let hi = (c[axis] + 1).min(self.dims[axis] - 1);
            lo..=hi
        };
        let mut out = Vec::with_capacity(26);
        for z in range(2) {
            for y in range(1) {
                for x in range(0) {
                    let q = self.part_at([x, y, z]);
                    if q != p {
                        out.push(q);
                    }
                }
            }
        }
        out
    }
}

/// Edge coefficients are uniform in `[-COEF_SCALE/degree, COEF_SCALE/degree)`: small
/// enough that the fields grow only ≈ 1 % per iteration at degree 20 (values stay
/// finite for tens of thousands of iterations), large enough that every update changes
/// every value.
const COEF_SCALE: f64 = 0.1;

/// The whole graph, built identically in every process from the parameters.
#[derive(Debug, Clone)]
pub(crate) struct Graph {
    pub parts: usize,
    pub n: usize,
    pub d: usize,
    pub grid: Grid,
    /// `nbr[kind][g·d + k]`: global index of node `g`'s k-th neighbour (other kind).
    pub nbr: [Vec<u32>; 2],
    /// `coef[kind][g·d + k]`: its coefficient.
    pub coef: [Vec<f64>; 2],
    /// `init[kind][g]`: initial value of node `g`.
    pub init: [Vec<f64>; 2],
}

/// Nodes of each kind in a graph of `parts` partitions of `params`.
///
/// # Errors
/// [`Em3dError::InvalidParams`] at 2^31 nodes or more (node ids are 31 bits).
pub(crate) fn node_count(params: &Params, parts: usize) -> Result<usize, Em3dError> {
    let n = params.nodes_per_thread;
    parts
        .checked_mul(n)
        .filter(|&t| t < GHOST as usize)
        .ok_or_else(|| {
            Em3dError::InvalidParams(format!(
                "{parts} partitions × {n} nodes exceed the 2^31 node limit"
            ))
        })
}

impl Graph {
    /// Generates the graph of `parts` partitions. Node `g` (global index `part·n + local`)
    /// of kind `kind` draws from ChaCha8 seeded with `seed`, stream `2·g + kind`:
    /// its initial value uniform in [-1, 1), then per edge: "remote" with probability
    /// `percent_remote`% (a uniform integer in 0..100 below it); a remote edge picks a
    /// partition uniformly among [`Grid::neighbours`] of the node's partition (a local one
    /// if there is none), a local edge the node's own partition; then a node uniformly in
    /// that partition, then a coefficient uniform in [-0.1/degree, 0.1/degree).
    pub(crate) fn build(params: &Params, parts: usize) -> Result<Self, Em3dError> {
        let n = params.nodes_per_thread;
        let d = params.degree;
        let total = node_count(params, parts)?;
        let grid = Grid::for_parts(parts);
        let neighbours: Vec<Vec<usize>> = (0..parts).map(|p| grid.neighbours(p)).collect();
        let base = ChaCha8Rng::seed_from_u64(params.seed);
        let coef_hi = COEF_SCALE / d.max(1) as f64;
        let mut nbr = [Vec::with_capacity(total * d), Vec::with_capacity(total * d)];
        let mut coef = [Vec::with_capacity(total * d), Vec::with_capacity(total * d)];
        let mut init = [Vec::with_capacity(total), Vec::with_capacity(total)];
        for kind in [E, H] {
            for g in 0..total {
                let part = g / n;
                let mut rng = base.clone();
                rng.set_stream((2 * g + kind) as u64);
                init[kind].push(rng.random_range(-1.0..1.0));
                for _ in 0..d {
                    let remote = rng.random_range(0..100u32) < params.percent_remote;
                    let near = &neighbours[part];
                    let q = if remote && !near.is_empty() {
                        near[rng.random_range(0..near.len())]
                    } else {
                        part
                    };
                    let j = rng.random_range(0..n);
                    nbr[kind].push((q * n + j) as u32);
                    coef[kind].push(rng.random_range(-coef_hi..coef_hi));
                }
            }
        }
        Ok(Self {
            parts,
            n,
            d,
            grid,
            nbr,
            coef,
            init,
        })
    }

    /// Partition owning global node `g`.
    pub(crate) fn part_of(&self, g: u32) -> usize {
        g as usize / self.n
    }
}

/// Which thread works on each partition, and the cluster block of the good layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    /// `thread_of_part[p]`: the thread that owns partition `p`.
    pub thread_of_part: Vec<usize>,
    /// `part_of_thread[t]`: the partition thread `t` owns.
    pub part_of_thread: Vec<usize>,
    /// Block of partitions each cluster owns (good layout), x, y, z.
    pub cluster_block: Option<[usize; 3]>,
}

/// Maps partitions to threads for `layout` (see [`Layout`]).
pub(crate) fn place(layout: Layout, grid: Grid, topo: &Topology) -> Result<Placement, Em3dError> {
    let parts = grid.parts();
    assert_eq!(parts, topo.num_threads(), "one partition per thread");
    let (thread_of_part, cluster_block) = match layout {
        Layout::Naive => ((0..parts).collect::<Vec<_>>(), None),
        Layout::Good => {
            let clusters = topo.num_clusters();
            let t = parts / clusters;
            let members: Vec<Vec<usize>> = (0..clusters).map(|c| topo.threads_of(c)).collect();
            if members.iter().any(|m| m.len() != t) {
                return Err(Em3dError::LayoutUnsupported(format!(
                    "the good layout needs equal-sized clusters; cluster sizes are {:?}",
                    members.iter().map(Vec::len).collect::<Vec<_>>()
                )));
            }
            let [gx, gy, gz] = grid.dims;
            let mut best: Option<[usize; 3]> = None;
            for bx in (1..=gx).rev().filter(|b| gx % b == 0) {
                for by in (1..=gy).rev().filter(|b| gy % b == 0) {
                    for bz in (1..=gz).rev().filter(|b| gz % b == 0) {
                        if bx * by * bz != t {
                            continue;
                        }
                        let sum = bx + by + bz;
                        if best.is_none_or(|b| sum < b.iter().sum()) {
                            best = Some([bx, by, bz]);
                        }
                    }
                }
            }
            let Some(block) = best else {
                return Err(Em3dError::LayoutUnsupported(format!(
                    "no block of {t} partitions tiles the {gx}×{gy}×{gz} partition grid"
                )));
            };
            let nb = [gx / block[0], gy / block[1]];
            let mut owner = vec![0; parts];
            for (p, o) in owner.iter_mut().enumerate() {
                let c = grid.coords(p);
                let b = [c[0] / block[0], c[1] / block[1], c[2] / block[2]];
                let cluster = b[0] + nb[0] * (b[1] + nb[1] * b[2]);
                let off = [c[0] % block[0], c[1] % block[1], c[2] % block[2]];
                let k = off[0] + block[0] * (off[1] + block[1] * off[2]);
                *o = members[cluster][k];
            }
            (owner, Some(block))
        }
    };
    let mut part_of_thread = vec![0; parts];
    for (p, &t) in thread_of_part.iter().enumerate() {
        part_of_thread[t] = p;
    }
    Ok(Placement {
        thread_of_part,
        part_of_thread,
        cluster_block,
    })
}

/// Write-variant plan: boundary copies ("ghosts") owned by consumer partitions.
///
/// For values of kind `v`, partition `q`'s ghost slots are
/// `offset[v][q]..offset[v][q + 1]` of ghost array `v`, one per distinct remote node of
/// kind `v` that q's nodes (of the other kind) read, in ascending node order.
#[derive(Debug, Clone)]
pub(crate) struct GhostPlan {
    pub offset: [Vec<usize>; 2],
    /// `src[kind][g·d + k]`: where node g's k-th neighbour value is read: a value index, or
    /// `GHOST | slot`.
    pub src: [Vec<u32>; 2],
    /// `push[v][p]`: `(node, slot)` pairs producer partition p writes after updating its
    /// nodes of kind v.
    pub push: [Vec<Vec<(u32, u32)>>; 2],
}

impl GhostPlan {
    pub(crate) fn build(g: &Graph) -> Result<Self, Em3dError> {
        let (parts, n, d) = (g.parts, g.n, g.d);
        let mut offset = [Vec::with_capacity(parts + 1), Vec::with_capacity(parts + 1)];
        let mut src = [
            Vec::with_capacity(g.nbr[E].len()),
            Vec::with_capacity(g.nbr[H].len()),
        ];
        let mut push: [Vec<Vec<(u32, u32)>>; 2] =
            [vec![Vec::new(); parts], vec![Vec::new(); parts]];
        for v in [E, H] {
            // Readers of kind-v values are the nodes of the other kind.
            let reader = 1 - v;
            let mut next_slot = 0usize;
            for (q, edges) in g.nbr[reader].chunks(n * d).enumerate() {
                offset[v].push(next_slot);
                let mut remote: Vec<u32> = edges
                    .iter()
                    .copied()
                    .filter(|&x| g.part_of(x) != q)
                    .collect();
                remote.sort_unstable();
                remote.dedup();
                for (rank, &x) in remote.iter().enumerate() {
                    let slot = next_slot + rank;
                    if slot >= GHOST as usize {
                        return Err(Em3dError::InvalidParams(
                            "more than 2^31 ghost slots".to_owned(),
                        ));
                    }
                    push[v][g.part_of(x)].push((x, slot as u32));
                }
                src[reader].extend(edges.iter().map(|&x| {
                    if g.part_of(x) == q {
                        x
                    } else {
                        let rank = remote.binary_search(&x).expect("collected above");
                        GHOST | (next_slot + rank) as u32
                    }
                }));
                next_slot += remote.len();
            }
            offset[v].push(next_slot);
        }
        Ok(Self { offset, src, push })
    }

    /// Total ghost slots for values of kind `v`.
    pub(crate) fn slots(&self, v: usize) -> usize {
        *self.offset[v].last().expect("parts + 1 entries")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_are_cube_like() {
        let dims = |p| Grid::for_parts(p).dims;
        assert_eq!(dims(1), [1, 1, 1]);
        assert_eq!(dims(2), [2, 1, 1]);
        assert_eq!(dims(4), [2, 2, 1]);
        assert_eq!(dims(6), [3, 2, 1]);
        assert_eq!(dims(7), [7, 1, 1]);
        assert_eq!(dims(8), [2, 2, 2]);
        assert_eq!(dims(16), [4, 2, 2]);
        assert_eq!(dims(32), [4, 4, 2]);
        for p in 1..100 {
            assert_eq!(Grid::for_parts(p).parts(), p);
        }
    }

    #[test]
    fn neighbours_are_the_clipped_26_neighbourhood() {
        let g = Grid::for_parts(32); // 4×4×2
        assert_eq!(g.neighbours(0), [1, 4, 5, 16, 17, 20, 21]);
        let inner = g.part_at([1, 1, 0]);
        assert_eq!(g.neighbours(inner).len(), 17);
        for p in 0..32 {
            for q in g.neighbours(p) {
                assert!(g.neighbours(q).contains(&p));
            }
        }
        assert!(Grid::for_parts(1).neighbours(0).is_empty());
    }

    #[test]
    fn paper_layouts_on_four_clusters_of_eight() {
        // Paper 000 §5.2: 32 processors in a 4×4×2 grid; naive gives each SMP a 4×2×1
        // block, good a 2×2×2 block.
        let grid = Grid::for_parts(32);
        let topo = Topology::uniform(4, 8).unwrap();
        let naive = place(Layout::Naive, grid, &topo).unwrap();
        let good = place(Layout::Good, grid, &topo).unwrap();
        assert_eq!(good.cluster_block, Some([2, 2, 2]));
        let extent = |pl: &Placement, cluster: usize| {
            let cs: Vec<[usize; 3]> = (0..32)
                .filter(|&p| topo.cluster_of(pl.thread_of_part[p]) == cluster)
                .map(|p| grid.coords(p))
                .collect();
            std::array::from_fn::<usize, 3, _>(|a| {
                cs.iter().map(|c| c[a]).max().unwrap() - cs.iter().map(|c| c[a]).min().unwrap() + 1
            })
        };
        for c in 0..4 {
            assert_eq!(extent(&naive, c), [4, 2, 1]);
            assert_eq!(extent(&good, c), [2, 2, 2]);
        }
        // Both are bijections.
        for pl in [&naive, &good] {
            for p in 0..32 {
                assert_eq!(pl.part_of_thread[pl.thread_of_part[p]], p);
            }
        }
    }

    #[test]
    fn good_layout_needs_tileable_equal_clusters() {
        let grid = Grid::for_parts(6); // 3×2×1
        let uneven = Topology::from_cluster_of(vec![0, 0, 0, 0, 1, 1]).unwrap();
        assert!(matches!(
            place(Layout::Good, grid, &uneven),
            Err(Em3dError::LayoutUnsupported(_))
        ));
        let threes = Topology::uniform(2, 3).unwrap();
        assert_eq!(
            place(Layout::Good, grid, &threes).unwrap().cluster_block,
            Some([3, 1, 1])
        );
        // One cluster: the good layout is the identity.
        let one = Topology::uniform(1, 6).unwrap();
        assert_eq!(
            place(Layout::Good, grid, &one).unwrap().thread_of_part,
            (0..6).collect::<Vec<_>>()
        );
        // Naive works for any topology.
        assert!(place(Layout::Naive, grid, &uneven).is_ok());
    }
}
