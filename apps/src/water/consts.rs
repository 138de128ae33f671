//! Constants of SPLASH-2 Water (`cnstnt.C`, `syscons.C`).
//!
//! Internal units: length in Å (`UNITL` = 1e-8 cm), time in fs (`UNITT` = 1e-15 s), mass
//! in a.m.u. (`UNITM` g); force constants are divided by `UNITM/UNITT²`. Derived values are
//! computed with the same floating-point operations in the same order as SPLASH, so they
//! are bit-identical to SPLASH's.

#![allow(clippy::excessive_precision)]

use super::Params;

/// O–H bond length, Å.
pub(crate) const ROH: f64 = 0.9572;
/// 1/ROH, 1/Å.
pub(crate) const ROHI: f64 = 1.0 / ROH;
/// 1/ROH², 1/Å².
pub(crate) const ROHI2: f64 = ROHI * ROHI;
/// H–O–H angle, rad.
pub(crate) const ANGLE: f64 = 1.824218;
/// Oxygen mass, a.m.u.
pub(crate) const OMAS: f64 = 15.99945;
/// Hydrogen mass, a.m.u.
pub(crate) const HMAS: f64 = 1.007825;
/// Molecular mass, a.m.u.
pub(crate) const WTMOL: f64 = OMAS + 2.0 * HMAS;

/// Time unit, s.
pub(crate) const UNITT: f64 = 1.0e-15;
/// Length unit, cm.
pub(crate) const UNITL: f64 = 1.0e-8;
/// Mass unit, g.
pub(crate) const UNITM: f64 = 1.6605655e-24;
/// Boltzmann constant, erg/K.
pub(crate) const BOLTZ: f64 = 1.380662e-16;

/// Temperature, K.
pub(crate) const TEMP: f64 = 298.0;
/// Density, g/cm³.
pub(crate) const RHO: f64 = 0.9980;

/// Atoms per molecule.
pub(crate) const NATOMS: usize = 3;

// Force constants scaled by UNITM/UNITT².
pub(crate) const FC11: f64 = 0.512596;
pub(crate) const FC33: f64 = 0.048098;
pub(crate) const FC12: f64 = -0.005823;
pub(crate) const FC13: f64 = 0.016452;
pub(crate) const FC111: f64 = -0.57191;
pub(crate) const FC333: f64 = -0.007636;
pub(crate) const FC112: f64 = -0.001867;
pub(crate) const FC113: f64 = -0.002047;
pub(crate) const FC123: f64 = -0.03083;
pub(crate) const FC133: f64 = -0.0094245;
pub(crate) const FC1111: f64 = 0.8431;
pub(crate) const FC3333: f64 = -0.00193;
pub(crate) const FC1112: f64 = -0.0030;
pub(crate) const FC1122: f64 = 0.0036;
pub(crate) const FC1113: f64 = -0.012;
pub(crate) const FC1123: f64 = 0.0060;
pub(crate) const FC1133: f64 = -0.0048;
pub(crate) const FC1233: f64 = 0.0211;
pub(crate) const FC1333: f64 = 0.006263;

// Water–water interaction parameters.
pub(crate) const QQ: f64 = 0.07152158;
pub(crate) const A1: f64 = 455.313100;
pub(crate) const B1: f64 = 5.15271070;
pub(crate) const A2: f64 = 0.27879839;
pub(crate) const B2: f64 = 2.76084370;
pub(crate) const A3: f64 = 0.60895706;
pub(crate) const B3: f64 = 2.96189550;
pub(crate) const A4: f64 = 0.11447336;
pub(crate) const B4: f64 = 2.23326410;
const CM: f64 = 0.45682590;
pub(crate) const AB1: f64 = A1 * B1;
pub(crate) const AB2: f64 = A2 * B2;
pub(crate) const AB3: f64 = A3 * B3;
pub(crate) const AB4: f64 = A4 * B4;
pub(crate) const C1: f64 = 1.0 - CM;
pub(crate) const C2: f64 = 0.50 * CM;
pub(crate) const QQ2: f64 = 2.00 * QQ;
pub(crate) const QQ4: f64 = 2.00 * QQ2;

/// Length of SPLASH's `TLC` Taylor-coefficient array.
const TLC_LEN: usize = 100;

/// Run-dependent constants (SPLASH's globals set by `CNSTNT` and `SYSCNS`).
#[derive(Debug, Clone)]
pub(crate) struct Consts {
    /// Number of molecules.
    pub nmol: usize,
    /// Predictor-corrector order (NORDER).
    pub norder: usize,
    /// Time step in fs.
    pub tstep: f64,
    /// Box edge, Å.
    pub boxl: f64,
    /// Half box edge, Å.
    pub boxh: f64,
    /// Cutoff radius, Å.
    pub cutoff: f64,
    /// Cutoff², Å².
    pub cut2: f64,
    /// Reaction-field constants.
    pub ref1: f64,
    pub ref2: f64,
    pub ref4: f64,
    /// Force → scaled-acceleration factors for H and O (TSTEP²/2/mass).
    pub fhm: f64,
    pub fom: f64,
    /// Potential-energy scale to units of N_atom·kT.
    pub fpot: f64,
    /// Kinetic-energy scale to units of N_atom·kT.
    pub fkin: f64,
    /// Taylor coefficients, SPLASH's `TLC` (1-based flat `C(N,N)`).
    pub tlc: [f64; TLC_LEN],
    /// Predictor-corrector constants, SPLASH's `PCC`.
    pub pcc: [f64; 11],
}

impl Consts {
    /// SPLASH's `CNSTNT(NORDER+1, TLC)` followed by `SYSCNS()`. `params` must be valid
    /// (order in 3..=6).
    pub(crate) fn new(params: &Params) -> Self {
        let norder = params.order;
        let n = norder + 1;
        let mut tlc = [0.0; TLC_LEN];
        tlc[1] = 1.0;
        for n1 in 2..=n {
            let mut nn = n1 - 1;
            let mut tn = nn as f64;
            tlc[n1] = 1.0;
            let mut tk = 1.0;
            for k1 in 2..=n1 {
                tlc[(k1 - 1) * n + nn] = tlc[(k1 - 2) * n + nn + 1] * tn / tk;
                nn -= 1;
                tn -= 1.0;
                tk += 1.0;
            }
        }
        let mut pcc = [0.0; 11];
        pcc[2] = 1.0;
        match norder {
            3 => {
                pcc[0] = 1.0 / 6.00;
                pcc[1] = 5.0 / 6.00;
                pcc[3] = 1.0 / 3.00;
            }
            4 => {
                pcc[0] = 19.00 / 120.00;
                pcc[1] = 3.00 / 4.00;
                pcc[3] = 1.0 / 2.00;
                pcc[4] = 1.0 / 12.00;
            }
            5 => {
                pcc[0] = 3.00 / 20.00;
                pcc[1] = 251.00 / 360.00;
                pcc[3] = 11.00 / 18.00;
                pcc[4] = 1.0 / 6.00;
                pcc[5] = 1.0 / 60.00;
            }
            6 => {
                pcc[0] = 863.00 / 6048.00;
                pcc[1] = 665.00 / 1008.00;
                pcc[3] = 25.00 / 36.00;
                pcc[4] = 35.00 / 144.00;
                pcc[5] = 1.0 / 24.00;
                pcc[6] = 1.0 / 360.00;
            }
            _ => unreachable!("order validated to 3..=6"),
        }

        // SYSCNS
        let nmol = params.molecules;
        let tstep = params.timestep_s / UNITT;
        let natmo = (NATOMS * nmol) as f64;
        let fpot = UNITM * sq(UNITL / UNITT) / (BOLTZ * TEMP * natmo);
        let fkin = fpot * 0.50 / (tstep * tstep);
        let boxl = (nmol as f64 * WTMOL * UNITM / RHO).powf(1.00 / 3.00) / UNITL;
        let boxh = boxl * 0.50;
        let mut cutoff = params.cutoff_angstrom;
        if cutoff == 0.0 {
            cutoff = if boxh < cutoff { cutoff } else { boxh };
        }
        if cutoff > 11.0 {
            cutoff = 11.0;
        }
        let ref1 = -QQ / (cutoff * cutoff * cutoff);
        let ref2 = 2.00 * ref1;
        let ref4 = 2.00 * ref2;
        let cut2 = cutoff * cutoff;
        let fhm = (tstep * tstep * 0.50) / HMAS;
        let fom = (tstep * tstep * 0.50) / OMAS;
        Self {
            nmol,
            norder,
            tstep,
            boxl,
            boxh,
            cutoff,
            cut2,
            ref1,
            ref2,
            ref4,
            fhm,
            fom,
            fpot,
            fkin,
            tlc,
            pcc,
        }
    }
}

/// `pow(x, 2.0)`, which gcc folds to `x*x`.
#[inline]
pub(crate) fn sq(x: f64) -> f64 {
    x * x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taylor_coefficients_are_binomials() {
        let c = Consts::new(&Params::default());
        let n = 7;
        // Row k (1-based) of C(N,N) holds binomial(j, k-1) shifted; spot-check the
        // entries PREDIC reads for func = 0: C[2..=7] = 1 each (binomial(j,j)).
        for j in 2..=n {
            assert_eq!(c.tlc[j], 1.0, "C[{j}]");
        }
        // func = 1 reads C[9..=14] = 2, 3, 4, 5, 6 ... (binomial(j+1, 1)).
        assert_eq!(&c.tlc[9..14], &[2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(c.pcc[2], 1.0);
        assert_eq!(c.pcc[6], 1.0 / 360.0);
    }

    #[test]
    fn box_and_cutoff_match_splash_banner() {
        let p = Params {
            molecules: 512,
            ..Params::default()
        };
        let c = Consts::new(&p);
        // SPLASH prints BOXL = 24.851010 and CUTOFF = 6.212752 for this deck.
        assert_eq!(format!("{:.6}", c.boxl), "24.851010");
        assert_eq!(c.cutoff, 6.212752);
        let half = Consts::new(&Params {
            molecules: 343,
            cutoff_angstrom: 0.0,
            ..p.clone()
        });
        assert!(half.boxh < 11.0);
        assert_eq!(half.cutoff, half.boxh);
        let capped = Consts::new(&Params {
            molecules: 8000,
            cutoff_angstrom: 0.0,
            ..p
        });
        assert_eq!(capped.cutoff, 11.0);
    }
}
