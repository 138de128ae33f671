//! The numeric kernels of SPLASH-2 Water-Nsquared, generic over the storage of SPLASH's
//! `VAR` array. Each works on a range of molecules (a thread's share) and returns its local
//! partial sums; the drivers add those into the shared sums under locks.
//!
//! Every expression keeps SPLASH's operands, association and evaluation order, so results
//! are bit-identical to the C code compiled without fused multiply-add (x86-64 `gcc -O2`).

// SPLASH's statements `x = x + expr` are kept literally (they are `x += expr`).
#![allow(clippy::assign_op_pattern)]

use std::ops::Range;

use super::consts::{
    A1, A2, A3, A4, AB1, AB2, AB3, AB4, ANGLE, B1, B2, B3, B4, C1, C2, Consts, FC11, FC12, FC13,
    FC33, FC111, FC112, FC113, FC123, FC133, FC333, FC1111, FC1112, FC1113, FC1122, FC1123, FC1133,
    FC1233, FC1333, FC3333, HMAS, OMAS, QQ, QQ2, QQ4, ROH, ROHI, ROHI2,
};
use crate::storage::F64Words;

/// Atom index of the first hydrogen.
pub(crate) const H1: usize = 0;
/// Atom index of the oxygen.
pub(crate) const O: usize = 1;
/// Atom index of the second hydrogen.
pub(crate) const H2: usize = 2;
/// Derivative index: displacement.
pub(crate) const DISP: usize = 0;
/// Derivative index: velocity (scaled by TSTEP).
pub(crate) const VEL: usize = 1;
/// Derivative index: acceleration (scaled by TSTEP²/2).
pub(crate) const ACC: usize = 2;
/// Slot of the computed forces (scaled accelerations after INTERF).
pub(crate) const FORCES: usize = 7;
/// Derivative slots per molecule (SPLASH's `MXOD2`).
const MXOD2: usize = 9;
/// Words per molecule in `VAR`: `VM[3]` (centre of charge) then `F[MXOD2][3 dirs][3 atoms]`,
/// SPLASH's `molecule_type` (672 bytes).
pub(crate) const MOL_WORDS: usize = 3 + MXOD2 * 9;
/// Words per molecule in a private force array (`PFORCES[mol][dir][atom]`).
pub(crate) const PF_WORDS: usize = 9;

/// Index of `F[func][dir][atom]` of `mol` in `VAR`.
#[inline(always)]
pub(crate) const fn fidx(mol: usize, func: usize, dir: usize, atom: usize) -> usize {
    mol * MOL_WORDS + 3 + func * 9 + dir * 3 + atom
}

/// Index of `VM[dir]` of `mol` in `VAR`.
#[inline(always)]
pub(crate) const fn vmidx(mol: usize, dir: usize) -> usize {
    mol * MOL_WORDS + dir
}

/// `x += d` on a storage word.
#[inline(always)]
fn add<A: F64Words>(a: &A, i: usize, d: f64) {
    a.set(i, a.get(i) + d);
}

/// PREDIC: Taylor-series prediction of the displacement and its derivatives.
pub(crate) fn predic<A: F64Words>(var: &A, c: &Consts, mols: Range<usize>) {
    let norder = c.norder;
    let nor1 = norder + 1;
    // SPLASH loops func outermost; every element's update reads only its own higher
    // derivatives, which are updated later, so molecule-outer order gives identical bits.
    for mol in mols {
        for dir in 0..3 {
            for atom in 0..3 {
                let mut jiz = 2;
                for func in 0..norder {
                    let mut s = 0.0;
                    for (ji, l) in (jiz..).zip(func..norder) {
                        s += c.tlc[ji] * var.get(fidx(mol, l + 1, dir, atom));
                    }
                    add(var, fidx(mol, func, dir, atom), s);
                    jiz += nor1;
                }
            }
        }
    }
}

/// CORREC: correct the predicted values with the computed accelerations.
pub(crate) fn correc<A: F64Words>(var: &A, c: &Consts, mols: Range<usize>) {
    let nor1 = c.norder + 1;
    for mol in mols {
        for dir in 0..3 {
            for atom in 0..3 {
                let y = var.get(fidx(mol, FORCES, dir, atom)) - var.get(fidx(mol, ACC, dir, atom));
                for func in 0..nor1 {
                    add(var, fidx(mol, func, dir, atom), c.pcc[func] * y);
                }
            }
        }
    }
}

/// BNDRY: move molecules whose oxygen left the box back in (periodic boundaries).
pub(crate) fn bndry<A: F64Words>(var: &A, c: &Consts, mols: Range<usize>) {
    let boxl = c.boxl;
    for mol in mols {
        for dir in 0..3 {
            let o = var.get(fidx(mol, DISP, dir, O));
            let shift = if o > boxl {
                -boxl
            } else if o < 0.00 {
                boxl
            } else {
                continue;
            };
            for atom in [H1, O, H2] {
                add(var, fidx(mol, DISP, dir, atom), shift);
            }
        }
    }
}

/// KINETI: this range's kinetic-energy sums per direction (scaled units).
pub(crate) fn kineti<A: F64Words>(var: &A, mols: Range<usize>) -> [f64; 3] {
    let mut s = [0.0; 3];
    for mol in mols {
        for (dir, s) in s.iter_mut().enumerate() {
            let [h1, o, h2] = var.get_array::<3>(fidx(mol, VEL, dir, 0));
            *s += (h1 * h1 + h2 * h2) * HMAS + (o * o) * OMAS;
        }
    }
    s
}

/// INTRAF: intra-molecular forces into `F[FORCES]`, centres of charge into `VM`; returns
/// this range's virial contribution.
pub(crate) fn intraf<A: F64Words>(var: &A, mols: Range<usize>) -> f64 {
    for mol in mols.clone() {
        let mut sum = 0.0;
        let mut r1 = 0.0;
        let mut r2 = 0.0;
        let mut vr1 = [0.0; 3];
        let mut vr2 = [0.0; 3];
        for dir in 0..3 {
            let [h1, o, h2] = var.get_array::<3>(fidx(mol, DISP, dir, 0));
            var.set(vmidx(mol, dir), C1 * o + C2 * (h1 + h2));
            vr1[dir] = o - h1;
            r1 += vr1[dir] * vr1[dir];
            vr2[dir] = o - h2;
            r2 += vr2[dir] * vr2[dir];
            sum += vr1[dir] * vr2[dir];
        }
        let r1 = r1.sqrt();
        let r2 = r2.sqrt();

        // cos(THETA), sin(THETA), delta(R1), delta(R2), delta(THETA)
        let cos = sum / (r1 * r2);
        let sin = (1.0 - cos * cos).sqrt();
        let dt = (cos.acos() - ANGLE) * ROH;
        let dts = dt * dt;
        let dr1 = r1 - ROH;
        let dr1s = dr1 * dr1;
        let dr2 = r2 - ROH;
        let dr2s = dr2 * dr2;

        // Derivatives of R1/X1, R2/X3, THETA/X1 and THETA/X3.
        let r1s = ROH / (r1 * sin);
        let r2s = ROH / (r2 * sin);
        let mut dr11 = [0.0; 3];
        let mut dr23 = [0.0; 3];
        let mut dt1 = [0.0; 3];
        let mut dt3 = [0.0; 3];
        for dir in 0..3 {
            dr11[dir] = vr1[dir] / r1;
            dr23[dir] = vr2[dir] / r2;
            dt1[dir] = (-dr23[dir] + dr11[dir] * cos) * r1s;
            dt3[dir] = (-dr11[dir] + dr23[dir] * cos) * r2s;
        }

        // Forces.
        let mut f1 = FC11 * dr1 + FC12 * dr2 + FC13 * dt;
        let mut f2 = FC33 * dt + FC13 * (dr1 + dr2);
        let mut f3 = FC11 * dr2 + FC12 * dr1 + FC13 * dt;
        f1 = f1
            + (3.0 * FC111 * dr1s
                + FC112 * (2.0 * dr1 + dr2) * dr2
                + 2.0 * FC113 * dr1 * dt
                + FC123 * dr2 * dt
                + FC133 * dts)
                * ROHI;
        f2 = f2
            + (3.0 * FC333 * dts
                + FC113 * (dr1s + dr2s)
                + FC123 * dr1 * dr2
                + 2.0 * FC133 * (dr1 + dr2) * dt)
                * ROHI;
        f3 = f3
            + (3.0 * FC111 * dr2s
                + FC112 * (2.0 * dr2 + dr1) * dr1
                + 2.0 * FC113 * dr2 * dt
                + FC123 * dr1 * dt
                + FC133 * dts)
                * ROHI;
        f1 = f1
            + (4.0 * FC1111 * dr1s * dr1
                + FC1112 * (3.0 * dr1s + dr2s) * dr2
                + 2.0 * FC1122 * dr1 * dr2s
                + 3.0 * FC1113 * dr1s * dt
                + FC1123 * (2.0 * dr1 + dr2) * dr2 * dt
                + (2.0 * FC1133 * dr1 + FC1233 * dr2 + FC1333 * dt) * dts)
                * ROHI2;
        f2 = f2
            + (4.0 * FC3333 * dts * dt
                + FC1113 * (dr1s * dr1 + dr2s * dr2)
                + FC1123 * (dr1 + dr2) * dr1 * dr2
                + 2.0 * FC1133 * (dr1s + dr2s) * dt
                + 2.0 * FC1233 * dr1 * dr2 * dt
                + 3.0 * FC1333 * (dr1 + dr2) * dts)
                * ROHI2;
        f3 = f3
            + (4.0 * FC1111 * dr2s * dr2
                + FC1112 * (3.0 * dr2s + dr1s) * dr1
                + 2.0 * FC1122 * dr1s * dr2
                + 3.0 * FC1113 * dr2s * dt
                + FC1123 * (2.0 * dr2 + dr1) * dr1 * dt
                + (2.0 * FC1133 * dr2 + FC1233 * dr1 + FC1333 * dt) * dts)
                * ROHI2;

        for dir in 0..3 {
            let t1 = f1 * dr11[dir] + f2 * dt1[dir];
            let t2 = f3 * dr23[dir] + f2 * dt3[dir];
            var.set(fidx(mol, FORCES, dir, H1), t1);
            var.set(fidx(mol, FORCES, dir, H2), t2);
            var.set(fidx(mol, FORCES, dir, O), -(t1 + t2));
        }
    }

    // Virial: sum of displacement × force over molecules, directions, atoms.
    let mut lvir = 0.0;
    for mol in mols {
        for dir in 0..3 {
            for atom in 0..3 {
                lvir += var.get(fidx(mol, DISP, dir, atom)) * var.get(fidx(mol, FORCES, dir, atom));
            }
        }
    }
    lvir
}

/// The last partner (not reduced modulo NMOL) SPLASH pairs with `mol`: each molecule
/// interacts with the next NMOL/2 molecules cyclically, with the tie for even NMOL
/// broken by parity so that every pair is computed exactly once.
#[inline]
pub(crate) fn comp_last(mol: usize, nmol: usize) -> usize {
    let half = nmol / 2;
    let mut last = mol + half;
    if nmol.is_multiple_of(2) {
        if half <= mol && mol.is_multiple_of(2) {
            last -= 1;
        }
        if mol < half && last % 2 == 1 {
            last -= 1;
        }
    }
    last
}

/// Molecules whose private forces a thread owning `mols` may have touched, as SPLASH's
/// INTERF computes them from the last `comp_last` (two ranges; the second wraps around).
pub(crate) fn touched_molecules(mols: &Range<usize>, nmol: usize) -> [Range<usize>; 2] {
    if mols.is_empty() {
        return [0..0, 0..0];
    }
    let last = comp_last(mols.end - 1, nmol);
    if last + 1 > nmol {
        let wrapped = last % nmol;
        [mols.start..nmol, 0..(wrapped + 1).min(mols.start)]
    } else {
        [mols.start..last + 1, 0..0]
    }
}

/// The 14 site-site distance components along one axis between molecules A and B (order
/// M-M, M-H1, M-H3, H1-M, H3-M, H1-H1, H1-H3, H3-H1, H3-H3, O-O, O-H1, O-H3, H1-O, H3-O;
/// M = centre of charge), shifted to the nearest image (SPLASH's CSHIFT).
#[inline(always)]
fn cshift(xa: [f64; 3], xb: [f64; 3], xma: f64, xmb: f64, boxh: f64, boxl: f64) -> [f64; 14] {
    let mut xl = [
        xma - xmb,
        xma - xb[0],
        xma - xb[2],
        xa[0] - xmb,
        xa[2] - xmb,
        xa[0] - xb[0],
        xa[0] - xb[2],
        xa[2] - xb[0],
        xa[2] - xb[2],
        xa[1] - xb[1],
        xa[1] - xb[0],
        xa[1] - xb[2],
        xa[0] - xb[1],
        xa[2] - xb[1],
    ];
    for x in &mut xl {
        if x.abs() > boxh {
            // x - sign(BOXL, x)
            *x = if *x < 0.0 { *x + boxl } else { *x - boxl };
        }
    }
    xl
}

/// One molecule's displacements (`[dir][atom]`) and centre of charge (`[dir]`).
#[derive(Clone, Copy)]
struct Sites {
    disp: [[f64; 3]; 3],
    vm: [f64; 3],
}

#[inline(always)]
fn sites<A: F64Words>(var: &A, mol: usize) -> Sites {
    // VM[0..3] then F[DISP][dir][atom] at words 3..12.
    let w = var.get_array::<12>(mol * MOL_WORDS);
    let d = |dir: usize| [w[3 + dir * 3], w[4 + dir * 3], w[5 + dir * 3]];
    Sites {
        disp: [d(0), d(1), d(2)],
        vm: [w[0], w[1], w[2]],
    }
}

/// Nearest-image distance components of all 14 site pairs along x, y, z.
#[inline(always)]
fn pair_distances(a: &Sites, b: &Sites, c: &Consts) -> [[f64; 14]; 3] {
    [
        cshift(a.disp[0], b.disp[0], a.vm[0], b.vm[0], c.boxh, c.boxl),
        cshift(a.disp[1], b.disp[1], a.vm[1], b.vm[1], c.boxh, c.boxl),
        cshift(a.disp[2], b.disp[2], a.vm[2], b.vm[2], c.boxh, c.boxl),
    ]
}

/// SPLASH's pair loop, shared by INTERF and POTENG: each molecule of `mols` with its
/// NMOL/2 cyclic successors ([`comp_last`]), in SPLASH's order. For every pair with at
/// least one of its first nine site pairs within the cutoff (SPLASH's `KC == 9` test)
/// calls `f(mol, comp, [xl, yl, zl], rs, kc)`: the nearest-image distance components of
/// its 14 site pairs along x, y, z, the squared distances of the first nine (the other
/// five left 0), and how many of those nine lie beyond the cutoff (0–8).
#[inline(always)]
fn for_each_near_pair<A: F64Words>(
    var: &A,
    c: &Consts,
    mols: Range<usize>,
    mut f: impl FnMut(usize, usize, [[f64; 14]; 3], [f64; 14], usize),
) {
    let nmol = c.nmol;
    let cut2 = c.cut2;
    for mol in mols {
        let a = sites(var, mol);
        for icomp in mol + 1..=comp_last(mol, nmol) {
            let comp = if icomp > nmol - 1 {
                icomp % nmol
            } else {
                icomp
            };
            let b = sites(var, comp);
            let [xl, yl, zl] = pair_distances(&a, &b, c);
            let mut rs = [0.0f64; 14];
            let mut kc = 0;
            for k in 0..9 {
                rs[k] = xl[k] * xl[k] + yl[k] * yl[k] + zl[k] * zl[k];
                if rs[k] > cut2 {
                    kc += 1;
                }
            }
            if kc == 9 {
                continue;
            }
            f(mol, comp, [xl, yl, zl], rs, kc);
        }
    }
}

/// INTERF, force part: pair forces between each molecule of `mols` and its NMOL/2 cyclic
/// successors, accumulated into the private array `pforces` (`NMOL × PF_WORDS`, zeroed
/// here). Returns this range's virial contribution.
pub(crate) fn interf_pairs<A: F64Words>(
    var: &A,
    c: &Consts,
    mols: Range<usize>,
    pforces: &mut [f64],
) -> f64 {
    let cut2 = c.cut2;
    pforces.fill(0.0);
    let mut lvir = 0.0;
    for_each_near_pair(var, c, mols, |mol, comp, [xl, yl, zl], mut rs, kc| {
        let mut rl = [0.0f64; 14];
        let mut ff = [0.0f64; 14];
        if rs[0] < cut2 {
            ff[0] = QQ4 / (rs[0] * rs[0].sqrt()) + c.ref4;
            lvir = lvir + ff[0] * rs[0];
        }
        for k in 1..5 {
            if rs[k] < cut2 {
                ff[k] = -QQ2 / (rs[k] * rs[k].sqrt()) - c.ref2;
                lvir = lvir + ff[k] * rs[k];
            }
            if rs[k + 4] <= cut2 {
                rl[k + 4] = rs[k + 4].sqrt();
                ff[k + 4] = QQ / (rs[k + 4] * rl[k + 4]) + c.ref1;
                lvir = lvir + ff[k + 4] * rs[k + 4];
            }
        }
        if kc == 0 {
            rs[9] = xl[9] * xl[9] + yl[9] * yl[9] + zl[9] * zl[9];
            rl[9] = rs[9].sqrt();
            ff[9] = AB1 * (-B1 * rl[9]).exp() / rl[9];
            lvir = lvir + ff[9] * rs[9];
            for k in 10..14 {
                let ftemp = AB2 * (-B2 * rl[k - 5]).exp() / rl[k - 5];
                ff[k - 5] = ff[k - 5] + ftemp;
                lvir = lvir + ftemp * rs[k - 5];
                rs[k] = xl[k] * xl[k] + yl[k] * yl[k] + zl[k] * zl[k];
                rl[k] = rs[k].sqrt();
                ff[k] = (AB3 * (-B3 * rl[k]).exp() - AB4 * (-B4 * rl[k]).exp()) / rl[k];
                lvir = lvir + ff[k] * rs[k];
            }
        }
        update_forces(mol, comp, &xl, &yl, &zl, &ff, pforces);
    });
    lvir
}

/// SPLASH's UPDATE_FORCES: add one pair's site forces to both molecules' private forces.
#[inline(always)]
fn update_forces(
    mol: usize,
    comp: usize,
    xl: &[f64; 14],
    yl: &[f64; 14],
    zl: &[f64; 14],
    ff: &[f64; 14],
    pforces: &mut [f64],
) {
    // gg[k + 1][dir] = ff[k] * l[k]
    let mut gg = [[0.0f64; 3]; 15];
    for k in 0..14 {
        gg[k + 1] = [ff[k] * xl[k], ff[k] * yl[k], ff[k] * zl[k]];
    }
    let mut a = [[0.0f64; 3]; 3];
    let mut b = [[0.0f64; 3]; 3];
    for d in 0..3 {
        let g110 = gg[10][d] + gg[1][d] * C1;
        let g23 = gg[2][d] + gg[3][d];
        let g45 = gg[4][d] + gg[5][d];
        let tt1 = gg[1][d] * C2;
        let tt = g23 * C2 + tt1;
        let tt2 = g45 * C2 + tt1;
        a[d][H1] = gg[6][d] + gg[7][d] + gg[13][d] + tt + gg[4][d];
        a[d][O] = g110 + gg[11][d] + gg[12][d] + C1 * g23;
        a[d][H2] = gg[8][d] + gg[9][d] + gg[14][d] + tt + gg[5][d];
        b[d][H1] = -gg[6][d] - gg[8][d] - gg[11][d] - tt2 - gg[2][d];
        b[d][O] = -g110 - gg[13][d] - gg[14][d] - C1 * g45;
        b[d][H2] = -gg[7][d] - gg[9][d] - gg[12][d] - tt2 - gg[3][d];
    }
    let pm = &mut pforces[mol * PF_WORDS..(mol + 1) * PF_WORDS];
    for d in 0..3 {
        for atom in 0..3 {
            pm[d * 3 + atom] += a[d][atom];
        }
    }
    let pc = &mut pforces[comp * PF_WORDS..(comp + 1) * PF_WORDS];
    for d in 0..3 {
        for atom in 0..3 {
            pc[d * 3 + atom] += b[d][atom];
        }
    }
}

/// Adds molecule `mol`'s private forces into `F[dest]` (the caller holds its lock).
#[inline]
pub(crate) fn add_private_forces<A: F64Words>(var: &A, dest: usize, mol: usize, pforces: &[f64]) {
    for dir in 0..3 {
        for atom in [H1, O, H2] {
            add(
                var,
                fidx(mol, dest, dir, atom),
                pforces[mol * PF_WORDS + dir * 3 + atom],
            );
        }
    }
}

/// Turns the summed forces of `mols` in `F[dest]` into scaled accelerations (× FHM, FOM).
pub(crate) fn scale_forces<A: F64Words>(var: &A, c: &Consts, dest: usize, mols: Range<usize>) {
    for mol in mols {
        for dir in 0..3 {
            for (atom, f) in [(H1, c.fhm), (O, c.fom), (H2, c.fhm)] {
                let i = fidx(mol, dest, dir, atom);
                var.set(i, var.get(i) * f);
            }
        }
    }
}

/// POTENG, first part: intra-molecular potential energy of `mols` (also refreshes `VM`).
pub(crate) fn poteng_intra<A: F64Words>(var: &A, mols: Range<usize>) -> f64 {
    let mut lpota = 0.0;
    for mol in mols {
        let [tx, ty, tz] = [0, 1, 2].map(|dir| var.get_array::<3>(fidx(mol, 0, dir, 0)));
        var.set(vmidx(mol, 0), C1 * tx[O] + C2 * (tx[H1] + tx[H2]));
        var.set(vmidx(mol, 1), C1 * ty[O] + C2 * (ty[H1] + ty[H2]));
        var.set(vmidx(mol, 2), C1 * tz[O] + C2 * (tz[H1] + tz[H2]));
        let dx1 = tx[O] - tx[H1];
        let dy1 = ty[O] - ty[H1];
        let dz1 = tz[O] - tz[H1];
        let dx2 = tx[O] - tx[H2];
        let dy2 = ty[O] - ty[H2];
        let dz2 = tz[O] - tz[H2];
        let r1 = dx1 * dx1 + dy1 * dy1 + dz1 * dz1;
        let r2 = dx2 * dx2 + dy2 * dy2 + dz2 * dz2;
        let rx = dx1 * dx2 + dy1 * dy2 + dz1 * dz2;
        let r1 = r1.sqrt();
        let r2 = r2.sqrt();
        let cos = rx / (r1 * r2);
        let dt = (cos.acos() - ANGLE) * ROH;
        let dr1 = r1 - ROH;
        let dr2 = r2 - ROH;
        let dr1s = dr1 * dr1;
        let dr2s = dr2 * dr2;
        let drp = dr1 + dr2;
        let dts = dt * dt;
        lpota += (FC11 * (dr1s + dr2s) + FC33 * dts) * 0.5
            + FC12 * dr1 * dr2
            + FC13 * drp * dt
            + (FC111 * (dr1s * dr1 + dr2s * dr2)
                + FC333 * dts * dt
                + FC112 * drp * dr1 * dr2
                + FC113 * (dr1s + dr2s) * dt
                + FC123 * dr1 * dr2 * dt
                + FC133 * drp * dts)
                * ROHI;
        lpota += (FC1111 * (dr1s * dr1s + dr2s * dr2s)
            + FC3333 * dts * dts
            + FC1112 * (dr1s + dr2s) * dr1 * dr2
            + FC1122 * dr1s * dr2s
            + FC1113 * (dr1s * dr1 + dr2s * dr2) * dt
            + FC1123 * drp * dr1 * dr2 * dt
            + FC1133 * (dr1s + dr2s) * dts
            + FC1233 * dr1 * dr2 * dts
            + FC1333 * drp * dts * dt)
            * ROHI2;
    }
    lpota
}

/// POTENG, second part: inter-molecular potential energy and reaction-field term of the
/// pairs owned by `mols` (reads every molecule's `VM`, so it runs after a barrier).
pub(crate) fn poteng_inter<A: F64Words>(var: &A, c: &Consts, mols: Range<usize>) -> (f64, f64) {
    let cut2 = c.cut2;
    let mut lpotr = 0.0;
    let mut lptrf = 0.0;
    for_each_near_pair(var, c, mols, |_, _, [xl, yl, zl], mut rs, kc| {
        let mut rl = [0.0f64; 14];
        for k in 0..9 {
            if rs[k] <= cut2 {
                rl[k] = rs[k].sqrt();
            } else {
                rl[k] = c.cutoff;
                rs[k] = cut2;
            }
        }
        lpotr = lpotr - QQ2 / rl[1] - QQ2 / rl[2] - QQ2 / rl[3] - QQ2 / rl[4]
            + QQ / rl[5]
            + QQ / rl[6]
            + QQ / rl[7]
            + QQ / rl[8]
            + QQ4 / rl[0];
        lptrf = lptrf
            - c.ref2 * rs[0]
            - c.ref1 * ((rs[5] + rs[6] + rs[7] + rs[8]) * 0.5 - rs[1] - rs[2] - rs[3] - rs[4]);
        if kc == 0 {
            for k in 9..14 {
                rl[k] = (xl[k] * xl[k] + yl[k] * yl[k] + zl[k] * zl[k]).sqrt();
            }
            lpotr = lpotr
                + A1 * (-B1 * rl[9]).exp()
                + A2 * ((-B2 * rl[5]).exp()
                    + (-B2 * rl[6]).exp()
                    + (-B2 * rl[7]).exp()
                    + (-B2 * rl[8]).exp())
                + A3 * ((-B3 * rl[10]).exp()
                    + (-B3 * rl[11]).exp()
                    + (-B3 * rl[12]).exp()
                    + (-B3 * rl[13]).exp())
                - A4 * ((-B4 * rl[10]).exp()
                    + (-B4 * rl[11]).exp()
                    + (-B4 * rl[12]).exp()
                    + (-B4 * rl[13]).exp());
        }
    });
    (lpotr, lptrf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every unordered pair of distinct molecules is visited exactly once.
    #[test]
    fn pair_schedule_covers_each_pair_once() {
        for nmol in [1usize, 2, 3, 8, 27, 64, 125] {
            let mut seen = vec![0u32; nmol * nmol];
            for mol in 0..nmol {
                for icomp in mol + 1..=comp_last(mol, nmol) {
                    let comp = icomp % nmol;
                    let (a, b) = (mol.min(comp), mol.max(comp));
                    assert_ne!(a, b);
                    seen[a * nmol + b] += 1;
                }
            }
            for a in 0..nmol {
                for b in a + 1..nmol {
                    assert_eq!(seen[a * nmol + b], 1, "nmol {nmol} pair ({a},{b})");
                }
            }
        }
    }

    /// The touched ranges of each thread cover every partner it writes forces for.
    #[test]
    fn touched_ranges_cover_written_partners() {
        for nmol in [8usize, 27, 64, 343] {
            for threads in 1..=5usize {
                let per = nmol / threads;
                for p in 0..threads {
                    let start = p * per;
                    let end = if p + 1 == threads { nmol } else { start + per };
                    let mols = start..end;
                    let touched = touched_molecules(&mols, nmol);
                    let covered = |m: usize| touched.iter().any(|r| r.contains(&m));
                    for mol in mols.clone() {
                        assert!(covered(mol));
                        for icomp in mol + 1..=comp_last(mol, nmol) {
                            assert!(covered(icomp % nmol), "nmol {nmol} p {p} comp {icomp}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn cshift_takes_nearest_image() {
        let xl = cshift([0.0, 9.0, 0.0], [0.0; 3], 1.0, -9.5, 5.0, 10.0);
        assert_eq!(xl[0], 10.5 - 10.0);
        assert_eq!(xl[9], 9.0 - 10.0);
        assert_eq!(xl[5], 0.0);
        let xl = cshift([-6.0, 0.0, 0.0], [0.0; 3], 0.0, 0.0, 5.0, 10.0);
        assert_eq!(xl[3], 4.0);
    }
}
