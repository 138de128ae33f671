//! SPLASH-2 Water-Nsquared: molecular dynamics of liquid water (flexible three-site H₂O
//! molecules with intra-molecular bond and angle forces, an inter-molecular Coulomb plus
//! exponential pair potential with a spherical cutoff and reaction field, periodic cubic
//! box), integrated with a sixth-order Gear predictor-corrector.
//!
//! A port of SPLASH-3's `water-nsquared` that prints the same energies to every printed
//! digit: constants and units (`cnstnt`, `syscons`), lattice start (`initia`), forces
//! (`intraf`, `interf` with `cshift` minimum image), integration (`predic`, `correc`),
//! boundary wrap (`bndry`), energies (`kineti`, `poteng`), and the per-step output of
//! `mdmain` in SPLASH's `printf` layout ([`format_step`]).
//!
//! [`run_sequential`] is the reference; [`run_parallel`] is SPLASH's parallel program on a
//! [`Runtime`]: molecules split in contiguous blocks (SPLASH's `StartMol`), each thread
//! accumulates pair forces in a private array and adds them to the shared molecules under
//! one lock per molecule (`MolLock`), shared sums under global locks, barriers where
//! SPLASH has them. The printed sums are added in lock order, so parallel runs agree with
//! the sequential one to rounding (≈ 12+ significant digits), not bit for bit.
//!
//! Differences from SPLASH, none of which changes a printed number: SPLASH also evaluates
//! the potential energy on steps divisible by NSAVE (without printing or saving anything);
//! this port evaluates it on print steps only. SPLASH keeps the private force arrays in
//! shared memory; here they are thread-private (only their owner touches them).

mod consts;
mod format;
mod init;
mod input;
mod kernels;

use std::ops::Range;
use std::path::PathBuf;
use std::time::Instant;

use consts::{Consts, TEMP};
pub use format::{format_banner, format_step};
pub use init::Lattice;
pub use input::{InputDeck, InputError, parse_input_file, parse_input_str};
use kernels::{ACC, FORCES, MOL_WORDS, PF_WORDS};

use crate::progress::{Progress, Silent};
use crate::storage::{F64Words, LocalF64s};
use crate::team::{Runtime, RuntimeError, Team};

/// Highest supported predictor-corrector order (SPLASH's `MAXODR - 1`).
pub const MAX_ORDER: usize = 6;

/// Seed of the default velocity generator.
pub const DEFAULT_VELOCITY_SEED: u64 = 0x5350_4c41_5348_3200;

/// SPLASH's lock-array size: molecule `m` uses lock `m % MAXLCKS`.
const MAXLCKS: usize = 65536;

/// Where the initial velocities come from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum VelocitySource {
    /// SPLASH's `random.in`: whitespace-separated numbers; the first is skipped, then vx,
    /// vy, vz for atoms H1, O, H2 of each molecule (9 per molecule). Reproduces SPLASH.
    File(PathBuf),
    /// Numbers uniform in [-4, 4) (the range of `random.in`) from a ChaCha8 generator
    /// with this seed; works for any molecule count.
    Seeded(u64),
}

impl Default for VelocitySource {
    fn default() -> Self {
        Self::Seeded(DEFAULT_VELOCITY_SEED)
    }
}

/// Simulation parameters (the fields of SPLASH's input deck that shape the run).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Params {
    /// NMOL: number of molecules; must be a perfect cube (lattice start). Default 343.
    pub molecules: usize,
    /// NSTEP: number of time steps. Default 2.
    pub steps: usize,
    /// TSTEP: time step in seconds. Default 1.5e-16 s.
    pub timestep_s: f64,
    /// NORDER: predictor-corrector order, 3..=6. Default 6.
    pub order: usize,
    /// NPRINT: energies are computed and printed every this many steps (≥ 1). Default 1.
    pub print_every: usize,
    /// CUTOFF: spherical cutoff radius in Å; 0 means half the box; capped at 11 Å.
    /// Default 6.212752 Å.
    pub cutoff_angstrom: f64,
    /// Initial velocities. Default: seeded generator.
    pub velocities: VelocitySource,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            molecules: 343,
            steps: 2,
            timestep_s: 1.5e-16,
            order: 6,
            print_every: 1,
            cutoff_angstrom: 6.212752,
            velocities: VelocitySource::default(),
        }
    }
}

impl Params {
    /// Checks ranges and that the molecule count fills the cubic lattice.
    ///
    /// # Errors
    /// [`WaterError::InvalidParams`] saying which value is wrong.
    pub fn validate(&self) -> Result<(), WaterError> {
        let bad = |m: String| Err(WaterError::InvalidParams(m));
        if self.molecules == 0 {
            return bad("molecules must be at least 1".to_owned());
        }
        if !(self.timestep_s.is_finite() && self.timestep_s > 0.0) {
            return bad(format!("timestep {} s must be positive", self.timestep_s));
        }
        if !(3..=MAX_ORDER).contains(&self.order) {
            return bad(format!(
                "predictor-corrector order {} must be 3..={MAX_ORDER}",
                self.order
            ));
        }
        if self.print_every == 0 {
            return bad("print-every must be at least 1".to_owned());
        }
        if !(self.cutoff_angstrom.is_finite() && self.cutoff_angstrom >= 0.0) {
            return bad(format!(
                "cutoff {} Å must be 0 (half box) or positive",
                self.cutoff_angstrom
            ));
        }
        init::check_cube(self)
    }

    /// [`Params::validate`], then reads the velocity file (if any) and checks that it has
    /// enough numbers: everything that can make a run fail before it starts.
    ///
    /// # Errors
    /// [`WaterError::InvalidParams`], [`WaterError::VelocityIo`] or
    /// [`WaterError::VelocityFormat`].
    pub fn check_inputs(&self) -> Result<(), WaterError> {
        self.validate()?;
        init::velocity_numbers(self).map(drop)
    }

    /// The lattice geometry SPLASH prints (box, cutoff actually used, spacing).
    ///
    /// # Errors
    /// [`WaterError::InvalidParams`] if the parameters are invalid.
    pub fn lattice(&self) -> Result<Lattice, WaterError> {
        self.validate()?;
        Ok(Lattice::new(&Consts::new(self)))
    }
}

/// Energies of one printed step, as SPLASH prints them.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepEnergies {
    /// Step number, 1-based.
    pub step: usize,
    /// TEN: kinetic energy, units of N_atom·kT.
    pub kinetic: f64,
    /// POTA: intra-molecular potential energy, units of N_atom·kT.
    pub intra_potential: f64,
    /// POTR: inter-molecular potential energy, units of N_atom·kT.
    pub inter_potential: f64,
    /// POTRF: reaction-field energy, units of N_atom·kT.
    pub reaction_field: f64,
    /// XTT: total energy (sum of the four above), units of N_atom·kT.
    pub total: f64,
    /// AVGT: average temperature since the start, K.
    pub avg_temperature_k: f64,
    /// XVIR: average virial since the start, units of N_atom·kT.
    pub virial: f64,
}

impl StepEnergies {
    /// The energy fields, in SPLASH's printing order, by their names (as serialized).
    pub const NAMES: [&'static str; 7] = [
        "kinetic",
        "intra_potential",
        "inter_potential",
        "reaction_field",
        "total",
        "avg_temperature_k",
        "virial",
    ];

    /// The energy fields in the order of [`StepEnergies::NAMES`] (units as on each field).
    pub fn values(&self) -> [f64; 7] {
        [
            self.kinetic,
            self.intra_potential,
            self.inter_potential,
            self.reaction_field,
            self.total,
            self.avg_temperature_k,
            self.virial,
        ]
    }
}

/// Wall-clock time of each phase, in seconds, summed over all steps (measured on the
/// reporting thread; in parallel runs phases that end in a barrier include waiting).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PhaseTimes {
    /// Copying the initial state into the (shared) `VAR` array, s.
    pub init_s: f64,
    /// Initial INTRAF + INTERF that estimate the starting accelerations, s.
    pub initial_forces_s: f64,
    /// PREDIC + INTRAF, s.
    pub predic_intraf_s: f64,
    /// INTERF (pair forces, adding them under locks, scaling), s.
    pub interf_s: f64,
    /// Of `interf_s`: the pair forces, computed into the thread's private array, s.
    #[serde(default)]
    pub interf_pairs_s: f64,
    /// Of `interf_s`: adding the private forces into the shared ones, one molecule at a
    /// time under its `MolLock` (and the virial under `InterfVir`), s. On a DSM this is
    /// where a lock moving between clusters costs: one acquire a step for each molecule
    /// the thread touched (all of them with two threads, 3 in 4 with four).
    #[serde(default)]
    pub interf_locked_s: f64,
    /// Of `interf_s`: waiting at `InterfBar` for the other threads, then scaling the
    /// thread's own molecules' forces, s (the sequential run has no barrier: scaling).
    #[serde(default)]
    pub interf_barrier_s: f64,
    /// CORREC + BNDRY + KINETI, s.
    pub correc_kineti_s: f64,
    /// POTENG on print steps, s.
    pub poteng_s: f64,
    /// The whole time-step loop, s.
    pub steps_s: f64,
}

/// The three parts of one INTERF call on one thread, s (see [`PhaseTimes`]).
#[derive(Debug, Clone, Copy, Default)]
struct InterfTimes {
    pairs_s: f64,
    locked_s: f64,
    barrier_s: f64,
}

impl PhaseTimes {
    fn add_interf(&mut self, split: InterfTimes) {
        self.interf_pairs_s += split.pairs_s;
        self.interf_locked_s += split.locked_s;
        self.interf_barrier_s += split.barrier_s;
    }
}

/// Result of a Water run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunResult {
    /// Number of compute threads (1 for the sequential reference).
    pub threads: usize,
    /// Energies of the printed steps, in order.
    pub energies: Vec<StepEnergies>,
    /// Phase timing.
    pub times: PhaseTimes,
}

/// Errors of a Water run.
#[derive(Debug, thiserror::Error)]
pub enum WaterError {
    /// A parameter is out of range.
    #[error("invalid Water parameters: {0}")]
    InvalidParams(String),
    /// The velocity file could not be read.
    #[error("{}: cannot read the velocity file", path.display())]
    VelocityIo {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The velocity file has a bad or missing number.
    #[error("{}:{line}: {problem}", path.display())]
    VelocityFormat {
        /// The file.
        path: PathBuf,
        /// Line of the problem (1-based).
        line: usize,
        /// What is wrong.
        problem: String,
    },
    /// The runtime failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The runtime ran no compute thread in this process.
    #[error("the runtime ran no compute thread in this process")]
    NoLocalThread,
}

// Shared sums (SPLASH's `gl` scalars), one f64 array.
const GL_VIR: usize = 0;
const GL_SUM: usize = 1; // 3 words
const GL_POTA: usize = 4;
const GL_POTR: usize = 5;
const GL_POTRF: usize = 6;
const GL_WORDS: usize = 7;

/// Values SPLASH's MDMAIN prints from the shared sums (scaled to N_atom·kT).
#[allow(clippy::too_many_arguments)]
fn step_energies(
    c: &Consts,
    step: usize,
    ttmv: f64,
    tkin: f64,
    tvir: f64,
    sum: [f64; 3],
    pota: f64,
    potr: f64,
    potrf: f64,
) -> StepEnergies {
    let pota = pota * c.fpot;
    let potr = potr * c.fpot;
    let potrf = potrf * c.fpot;
    let xvir = tvir * c.fpot * 0.50 / ttmv;
    let avgt = tkin * c.fkin * TEMP * 2.00 / (3.00 * ttmv);
    let ten = (sum[0] + sum[1] + sum[2]) * c.fkin;
    let xtt = pota + potr + potrf + ten;
    StepEnergies {
        step,
        kinetic: ten,
        intra_potential: pota,
        inter_potential: potr,
        reaction_field: potrf,
        total: xtt,
        avg_temperature_k: avgt,
        virial: xvir,
    }
}

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// Names of the phases reported to a [`Progress`], in order.
pub const PHASES: [&str; 3] = ["initial state", "initial forces", "time steps"];

/// The sequential reference: SPLASH's program with one processor, on local memory.
///
/// # Errors
/// Invalid parameters or an unreadable velocity file.
pub fn run_sequential(params: &Params) -> Result<RunResult, WaterError> {
    run_sequential_with(params, &Silent)
}

/// [`run_sequential`], reporting its [`PHASES`] to `progress` (the time steps counted).
///
/// # Errors
/// As [`run_sequential`].
pub fn run_sequential_with(
    params: &Params,
    progress: &dyn Progress,
) -> Result<RunResult, WaterError> {
    params.validate()?;
    let c = Consts::new(params);
    let init = init::initial_state(params, &c)?;
    let nmol = c.nmol;
    let all = 0..nmol;
    let mut times = PhaseTimes::default();
    progress.begin(PHASES[0], 0);
    let t = Instant::now();
    let var = LocalF64s::from_slice(&init);
    drop(init);
    let mut pforces = vec![0.0; nmol * PF_WORDS];
    times.init_s = secs(t);

    let interf = |dest: usize, pforces: &mut [f64]| -> (f64, InterfTimes) {
        let mut split = InterfTimes::default();
        let t = Instant::now();
        let lvir = kernels::interf_pairs(&var, &c, all.clone(), pforces);
        split.pairs_s = secs(t);
        let t = Instant::now();
        for r in kernels::touched_molecules(&all, nmol) {
            for mol in r {
                kernels::add_private_forces(&var, dest, mol, pforces);
            }
        }
        split.locked_s = secs(t);
        let t = Instant::now();
        kernels::scale_forces(&var, &c, dest, all.clone());
        split.barrier_s = secs(t);
        (lvir, split)
    };

    // Estimate the starting accelerations from F/m.
    progress.begin(PHASES[1], 0);
    let t = Instant::now();
    kernels::intraf(&var, all.clone());
    interf(ACC, &mut pforces);
    times.initial_forces_s = secs(t);

    let mut energies = Vec::new();
    let (mut ttmv, mut tkin, mut tvir) = (0.0, 0.0, 0.0);
    progress.begin(PHASES[2], params.steps as u64);
    let t_steps = Instant::now();
    for step in 1..=params.steps {
        ttmv += 1.00;
        let t = Instant::now();
        kernels::predic(&var, &c, all.clone());
        let mut vir = 0.0 + kernels::intraf(&var, all.clone());
        times.predic_intraf_s += secs(t);

        let t = Instant::now();
        let (lvir, split) = interf(FORCES, &mut pforces);
        vir += lvir;
        times.interf_s += secs(t);
        times.add_interf(split);

        let t = Instant::now();
        kernels::correc(&var, &c, all.clone());
        kernels::bndry(&var, &c, all.clone());
        let s = kernels::kineti(&var, all.clone());
        let sum = [0.0 + s[0], 0.0 + s[1], 0.0 + s[2]];
        times.correc_kineti_s += secs(t);

        tkin = tkin + sum[0] + sum[1] + sum[2];
        tvir -= vir;
        if step % params.print_every == 0 {
            let t = Instant::now();
            let pota = 0.0 + kernels::poteng_intra(&var, all.clone());
            let (lpotr, lptrf) = kernels::poteng_inter(&var, &c, all.clone());
            times.poteng_s += secs(t);
            energies.push(step_energies(
                &c,
                step,
                ttmv,
                tkin,
                tvir,
                sum,
                pota,
                0.0 + lpotr,
                0.0 + lptrf,
            ));
        }
        progress.advance(step as u64);
    }
    times.steps_s = secs(t_steps);
    Ok(RunResult {
        threads: 1,
        energies,
        times,
    })
}

/// SPLASH's static partition: thread `p` of `threads` owns molecules
/// `p·⌊N/P⌋ .. (p+1)·⌊N/P⌋`, the last thread also the remainder.
#[must_use]
pub fn molecules_of(thread: usize, threads: usize, nmol: usize) -> Range<usize> {
    let per = nmol / threads;
    let start = thread * per;
    let end = if thread + 1 == threads {
        nmol
    } else {
        start + per
    };
    start..end
}

/// Lock ids used by the parallel program.
#[derive(Clone, Copy)]
struct Locks {
    /// First of the per-molecule locks (`MolLock`, `min(NMOL, 65536)` of them).
    mol: usize,
    intraf_vir: usize,
    interf_vir: usize,
    kineti_sum: usize,
    poteng_sum: usize,
}

impl Locks {
    fn of_mol(&self, mol: usize) -> usize {
        self.mol + mol % MAXLCKS
    }
}

/// The parallel program (SPLASH's `MDMAIN` on every thread) on `rt`.
///
/// Shared memory: `VAR` (`NMOL × 84` f64 words: molecule centres and the position
/// derivatives and forces of its three atoms, SPLASH's `molecule_type`) and 7 words of
/// shared sums. Locks: one per molecule plus four for the sums. Every thread returns the
/// same energies (computed from the shared sums after barriers); the result is that of this
/// process's first thread, timings included.
///
/// # Errors
/// Invalid parameters, an unreadable velocity file, or a runtime failure.
pub fn run_parallel<R: Runtime>(rt: &mut R, params: &Params) -> Result<RunResult, WaterError> {
    run_parallel_with(rt, params, &Silent)
}

/// [`run_parallel`], with thread 0 reporting the [`PHASES`] to `progress` (the time
/// steps counted).
///
/// # Errors
/// As [`run_parallel`].
pub fn run_parallel_with<R: Runtime>(
    rt: &mut R,
    params: &Params,
    progress: &dyn Progress,
) -> Result<RunResult, WaterError> {
    params.validate()?;
    let c = Consts::new(params);
    // Every process computes the same initial state locally; each thread copies its own
    // molecules into shared memory.
    let init = init::initial_state(params, &c)?;
    let nmol = c.nmol;
    let threads = rt.topology().num_threads();

    let var = rt.alloc_f64s(nmol * MOL_WORDS)?;
    let gl = rt.alloc_f64s(GL_WORDS)?;
    let locks = Locks {
        mol: rt.alloc_locks(nmol.min(MAXLCKS))?,
        intraf_vir: rt.alloc_locks(1)?,
        interf_vir: rt.alloc_locks(1)?,
        kineti_sum: rt.alloc_locks(1)?,
        poteng_sum: rt.alloc_locks(1)?,
    };
    let shared = Shared {
        c: &c,
        init: &init,
        var: &var,
        gl: &gl,
        locks,
        params,
        progress,
    };
    let outs = rt.run(|team| shared.mdmain(team))?;
    let (energies, times) = outs.into_iter().next().ok_or(WaterError::NoLocalThread)?;
    Ok(RunResult {
        threads,
        energies,
        times,
    })
}

/// What every thread of the parallel program borrows.
struct Shared<'a, A> {
    c: &'a Consts,
    init: &'a [f64],
    var: &'a A,
    gl: &'a A,
    locks: Locks,
    params: &'a Params,
    progress: &'a dyn Progress,
}

impl<A: F64Words + Sync> Shared<'_, A> {
    /// `gl[i] += v` under lock `lock`.
    fn locked_add<T: Team>(&self, team: &T, lock: usize, i: usize, v: f64) {
        let _guard = team.lock(lock);
        self.gl.set(i, self.gl.get(i) + v);
    }

    /// SPLASH's INTERF on one thread: private pair forces, virial under the InterfVir
    /// lock, forces added per molecule under MolLock, barrier, then scaling own molecules.
    /// Returns the time of its three parts on this thread.
    fn interf<T: Team>(
        &self,
        team: &T,
        dest: usize,
        mols: &Range<usize>,
        pforces: &mut [f64],
    ) -> InterfTimes {
        let mut split = InterfTimes::default();
        let t = Instant::now();
        let lvir = kernels::interf_pairs(self.var, self.c, mols.clone(), pforces);
        split.pairs_s = secs(t);
        let t = Instant::now();
        self.locked_add(team, self.locks.interf_vir, GL_VIR, lvir);
        for r in kernels::touched_molecules(mols, self.c.nmol) {
            for mol in r {
                let _guard = team.lock(self.locks.of_mol(mol));
                kernels::add_private_forces(self.var, dest, mol, pforces);
            }
        }
        split.locked_s = secs(t);
        let t = Instant::now();
        team.barrier(); // InterfBar: all forces are in.
        kernels::scale_forces(self.var, self.c, dest, mols.clone());
        split.barrier_s = secs(t);
        split
    }

    fn mdmain<T: Team>(&self, team: &T) -> (Vec<StepEnergies>, PhaseTimes) {
        let (var, gl, c) = (self.var, self.gl, self.c);
        let me = team.thread_id();
        let mols = molecules_of(me, team.num_threads(), c.nmol);
        let mut times = PhaseTimes::default();
        let progress: &dyn Progress = if me == 0 { self.progress } else { &Silent };

        // Initial state: each thread writes its own molecules; thread 0 the sums.
        progress.begin(PHASES[0], 0);
        // The start line: the clock starts when every thread is here, so that cluster
        // processes started at different times do not count their start-up skew as
        // computation (SPLASH-2's LU and Cholesky likewise pass a barrier, then read the
        // clock).
        team.barrier();
        let t = Instant::now();
        for w in mols.start * MOL_WORDS..mols.end * MOL_WORDS {
            var.set(w, self.init[w]);
        }
        if me == 0 {
            for i in 0..GL_WORDS {
                gl.set(i, 0.0);
            }
        }
        let mut pforces = vec![0.0; c.nmol * PF_WORDS];
        team.barrier();
        times.init_s = secs(t);

        // Estimate the starting accelerations from F/m.
        progress.begin(PHASES[1], 0);
        let t = Instant::now();
        let lvir = kernels::intraf(var, mols.clone());
        self.locked_add(team, self.locks.intraf_vir, GL_VIR, lvir);
        team.barrier();
        self.interf(team, ACC, &mols, &mut pforces);
        team.barrier();
        times.initial_forces_s = secs(t);

        let mut energies = Vec::new();
        let (mut ttmv, mut tkin, mut tvir) = (0.0, 0.0, 0.0);
        progress.begin(PHASES[2], self.params.steps as u64);
        let t_steps = Instant::now();
        for step in 1..=self.params.steps {
            ttmv += 1.00;
            if me == 0 {
                for i in 0..GL_WORDS {
                    gl.set(i, 0.0);
                }
            }
            team.barrier();

            let t = Instant::now();
            kernels::predic(var, c, mols.clone());
            let lvir = kernels::intraf(var, mols.clone());
            self.locked_add(team, self.locks.intraf_vir, GL_VIR, lvir);
            team.barrier();
            times.predic_intraf_s += secs(t);

            let t = Instant::now();
            let split = self.interf(team, FORCES, &mols, &mut pforces);
            times.interf_s += secs(t);
            times.add_interf(split);

            let t = Instant::now();
            kernels::correc(var, c, mols.clone());
            kernels::bndry(var, c, mols.clone());
            let s = kernels::kineti(var, mols.clone());
            for (dir, s) in s.into_iter().enumerate() {
                self.locked_add(team, self.locks.kineti_sum, GL_SUM + dir, s);
            }
            team.barrier();
            times.correc_kineti_s += secs(t);

            let sum = [gl.get(GL_SUM), gl.get(GL_SUM + 1), gl.get(GL_SUM + 2)];
            tkin = tkin + sum[0] + sum[1] + sum[2];
            tvir -= gl.get(GL_VIR);
            if step % self.params.print_every == 0 {
                let t = Instant::now();
                let lpota = kernels::poteng_intra(var, mols.clone());
                team.barrier(); // PotengBar: every VM is fresh.
                let (lpotr, lptrf) = kernels::poteng_inter(var, c, mols.clone());
                {
                    let _guard = team.lock(self.locks.poteng_sum);
                    gl.set(GL_POTA, gl.get(GL_POTA) + lpota);
                    gl.set(GL_POTR, gl.get(GL_POTR) + lpotr);
                    gl.set(GL_POTRF, gl.get(GL_POTRF) + lptrf);
                }
                team.barrier();
                times.poteng_s += secs(t);
                energies.push(step_energies(
                    c,
                    step,
                    ttmv,
                    tkin,
                    tvir,
                    sum,
                    gl.get(GL_POTA),
                    gl.get(GL_POTR),
                    gl.get(GL_POTRF),
                ));
            }
            // Everyone finishes the step before thread 0 resets the sums.
            team.barrier();
            progress.advance(step as u64);
        }
        times.steps_s = secs(t_steps);
        (energies, times)
    }
}

#[cfg(test)]
mod tests;
