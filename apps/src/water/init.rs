//! Initial state (SPLASH's `INITIA`): molecules on a cubic lattice, random velocities
//! scaled to the temperature with no bulk momentum.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::consts::{ANGLE, BOLTZ, Consts, HMAS, NATOMS, OMAS, ROH, TEMP, UNITL, UNITM, UNITT, sq};
use super::kernels::{DISP, H1, H2, MOL_WORDS, O, VEL, fidx};
use super::{Params, VelocitySource, WaterError};

/// Lattice geometry SPLASH prints before the run.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Lattice {
    /// `NS`: cube root of the molecule count minus 1e-5 (molecules per edge, as a float).
    pub ns: f64,
    /// Box edge, Å.
    pub boxl: f64,
    /// Cutoff radius actually used, Å.
    pub cutoff: f64,
    /// Lattice spacing, Å.
    pub xs: f64,
    /// Offset of the first lattice site from the box corner, Å.
    pub zero: f64,
    /// x offset of the hydrogens from the oxygen, Å.
    pub wcos: f64,
    /// ± y offset of the hydrogens from the oxygen, Å.
    pub wsin: f64,
}

impl Lattice {
    pub(crate) fn new(c: &Consts) -> Self {
        let ns = (c.nmol as f64).powf(1.0 / 3.0) - 0.00001;
        let xs = c.boxl / ns;
        Self {
            ns,
            boxl: c.boxl,
            cutoff: c.cutoff,
            xs,
            zero: xs * 0.50,
            wcos: ROH * (ANGLE * 0.5).cos(),
            wsin: ROH * (ANGLE * 0.5).sin(),
        }
    }

    /// Lattice sites per edge (SPLASH's loop `for (i = 0; i < NS; i++)`).
    pub(crate) fn per_edge(&self) -> usize {
        let mut k = 0usize;
        while (k as f64) < self.ns {
            k += 1;
        }
        k
    }
}

/// Checks that `molecules` fills SPLASH's cubic lattice exactly.
pub(crate) fn check_cube(params: &Params) -> Result<(), WaterError> {
    let c = Consts::new(params);
    let edge = Lattice::new(&c).per_edge();
    if edge.checked_pow(3) != Some(params.molecules) {
        return Err(WaterError::InvalidParams(format!(
            "{} molecules do not fill a cubic lattice (SPLASH's \"Lattice init error\"); use a cube such as 343, 512, 4096 or 8000",
            params.molecules
        )));
    }
    Ok(())
}

/// Initial velocity numbers: SPLASH skips the first, then reads vx, vy, vz per atom
/// (H1, O, H2) per molecule.
pub(crate) fn velocity_numbers(params: &Params) -> Result<Vec<f64>, WaterError> {
    let needed = 1 + 3 * NATOMS * params.molecules;
    match &params.velocities {
        VelocitySource::File(path) => read_numbers(path, needed),
        VelocitySource::Seeded(seed) => {
            let mut rng = ChaCha8Rng::seed_from_u64(*seed);
            Ok((0..needed).map(|_| rng.random_range(-4.0..4.0)).collect())
        }
    }
}

/// The first `needed` numbers of a whitespace-separated file (SPLASH's `random.in`).
fn read_numbers(path: &Path, needed: usize) -> Result<Vec<f64>, WaterError> {
    let text = std::fs::read_to_string(path).map_err(|source| WaterError::VelocityIo {
        path: path.to_owned(),
        source,
    })?;
    let mut out = Vec::with_capacity(needed);
    'lines: for (i, line) in text.lines().enumerate() {
        for tok in line.split_whitespace() {
            if out.len() == needed {
                break 'lines;
            }
            let v: f64 = tok.parse().map_err(|_| WaterError::VelocityFormat {
                path: path.to_owned(),
                line: i + 1,
                problem: format!("{tok:?} is not a number"),
            })?;
            out.push(v);
        }
    }
    if out.len() < needed {
        return Err(WaterError::VelocityFormat {
            path: path.to_owned(),
            line: text.lines().count(),
            problem: format!(
                "the file has {} numbers; {} molecules need {needed} (1 skipped + 9 per molecule)",
                out.len(),
                needed.saturating_sub(1) / 9
            ),
        });
    }
    Ok(out)
}

/// The full initial `VAR` array (`molecules × MOL_WORDS` words): positions on the lattice,
/// velocities from the velocity source, all higher derivatives, forces and centres zero.
pub(crate) fn initial_state(params: &Params, c: &Consts) -> Result<Vec<f64>, WaterError> {
    check_cube(params)?;
    let nmol = c.nmol;
    let mut var = vec![0.0; nmol * MOL_WORDS];
    let lat = Lattice::new(c);
    let edge = lat.per_edge();

    // Assign positions.
    let mut xt = [0.0f64; 4];
    let mut yt = [0.0f64; 4];
    xt[2] = lat.zero;
    let mut mol = 0;
    for _i in 0..edge {
        xt[1] = xt[2] + lat.wcos;
        xt[3] = xt[1];
        yt[2] = lat.zero;
        for _j in 0..edge {
            yt[1] = yt[2] + lat.wsin;
            yt[3] = yt[2] - lat.wsin;
            let mut z = lat.zero;
            for _k in 0..edge {
                for atom in 0..NATOMS {
                    var[fidx(mol, DISP, 0, atom)] = xt[atom + 1];
                    var[fidx(mol, DISP, 1, atom)] = yt[atom + 1];
                    var[fidx(mol, DISP, 2, atom)] = z;
                }
                mol += 1;
                z += lat.xs;
            }
            yt[2] += lat.xs;
        }
        xt[2] += lat.xs;
    }
    debug_assert_eq!(mol, nmol);

    // Assign random momenta.
    let numbers = velocity_numbers(params)?;
    let mut next = numbers[1..].iter().copied();
    let (mut sumx, mut sumy, mut sumz) = (0.0, 0.0, 0.0);
    for mol in 0..nmol {
        for atom in 0..NATOMS {
            let vx = next.next().expect("count checked");
            let vy = next.next().expect("count checked");
            let vz = next.next().expect("count checked");
            var[fidx(mol, VEL, 0, atom)] = vx;
            var[fidx(mol, VEL, 1, atom)] = vy;
            var[fidx(mol, VEL, 2, atom)] = vz;
            sumx += vx;
            sumy += vy;
            sumz += vz;
        }
    }
    // Average momenta per atom.
    let natmo = (NATOMS * nmol) as f64;
    sumx /= natmo;
    sumy /= natmo;
    sumz /= natmo;
    // Normalisation so that <k.e.> = kT/2.
    let (mut sux, mut suy, mut suz) = (0.0, 0.0, 0.0);
    let v = |var: &[f64], mol, dir, atom| var[fidx(mol, VEL, dir, atom)];
    for mol in 0..nmol {
        sux = sux
            + (sq(v(&var, mol, 0, H1) - sumx) + sq(v(&var, mol, 0, H2) - sumx)) / HMAS
            + sq(v(&var, mol, 0, O) - sumx) / OMAS;
        suy = suy
            + (sq(v(&var, mol, 1, H1) - sumy) + sq(v(&var, mol, 1, H2) - sumy)) / HMAS
            + sq(v(&var, mol, 1, O) - sumy) / OMAS;
        suz = suz
            + (sq(v(&var, mol, 2, H1) - sumz) + sq(v(&var, mol, 2, H2) - sumz)) / HMAS
            + sq(v(&var, mol, 2, O) - sumz) / OMAS;
    }
    let fac = BOLTZ * TEMP * natmo / UNITM * sq(UNITT * c.tstep / UNITL);
    let sux = (fac / sux).sqrt();
    let suy = (fac / suy).sqrt();
    let suz = (fac / suz).sqrt();
    // Remove bulk momenta.
    let xmas = [HMAS, OMAS, HMAS];
    for mol in 0..nmol {
        for (atom, &mass) in xmas.iter().enumerate() {
            for (dir, (sum, su)) in [(sumx, sux), (sumy, suy), (sumz, suz)]
                .into_iter()
                .enumerate()
            {
                let i = fidx(mol, VEL, dir, atom);
                var[i] = (var[i] - sum) * su / mass;
            }
        }
    }
    Ok(var)
}
