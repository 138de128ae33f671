//! SPLASH's output, byte for byte.

use super::consts::{Consts, RHO, TEMP};
use super::init::Lattice;
use super::{InputDeck, StepEnergies, WaterError};
use crate::cfmt::{exp, fixed, general};

/// The two lines SPLASH's `MDMAIN` prints for a step:
/// `"     %5ld %14.5lf %12.5lf %12.5lf  ␣×16%12.5lf\n %16.3lf %16.5lf %16.5lf\n"` with
/// step, TEN, POTA, POTR, POTRF, then XTT, AVGT, XVIR. Ends with a newline.
#[must_use]
pub fn format_step(e: &StepEnergies) -> String {
    format!(
        "     {:>5} {} {} {}  {:16}{}\n {} {} {}\n",
        e.step,
        fixed(e.kinetic, 14, 5),
        fixed(e.intra_potential, 12, 5),
        fixed(e.inter_potential, 12, 5),
        "",
        fixed(e.reaction_field, 12, 5),
        fixed(e.total, 16, 3),
        fixed(e.avg_temperature_k, 16, 5),
        fixed(e.virial, 16, 5),
    )
}

/// Everything SPLASH prints before the first step (parameters, system constants, lattice),
/// for `deck` run on `deck.num_procs` processors. Ends with a newline.
///
/// # Errors
/// [`WaterError::InvalidParams`] if the deck's parameters are invalid.
pub fn format_banner(deck: &InputDeck) -> Result<String, WaterError> {
    let p = &deck.params;
    p.validate()?;
    let c = Consts::new(p);
    let lat = Lattice::new(&c);
    let mut s = String::new();
    s += &format!(
        "Using {} procs on {} steps of {} mols\n",
        deck.num_procs, p.steps, p.molecules
    );
    s += &format!(
        "Other parameters:\n\tTSTEP = {}\n\tNORDER = {}\n\tNSAVE = {}\n",
        exp(p.timestep_s, 8, 2),
        p.order,
        deck.nsave
    );
    s += &format!(
        "\tNRST = {}\n\tNPRINT = {}\n\tNFMC = {}\n\tCUTOFF = {}\n\n",
        deck.nrst,
        p.print_every,
        deck.nfmc,
        fixed(p.cutoff_angstrom, 0, 6)
    );
    s += &format!("\nTEMPERATURE                = {} K\n", fixed(TEMP, 8, 2));
    s += &format!("DENSITY                    = {} G/C.C.\n", fixed(RHO, 8, 5));
    s += &format!("NUMBER OF MOLECULES        = {:>8}\n", p.molecules);
    s += &format!("NUMBER OF PROCESSORS       = {:>8}\n", deck.num_procs);
    s += &format!("TIME STEP                  = {} SEC\n", exp(c.tstep, 8, 2));
    s += &format!("ORDER USED TO SOLVE F=MA   = {:>8} \n", p.order);
    s += &format!("NO. OF TIME STEPS          = {:>8} \n", p.steps);
    s += &format!("FREQUENCY OF DATA SAVING   = {:>8} \n", deck.nsave);
    s += &format!("FREQUENCY TO WRITE RST FILE= {:>8} \n", deck.nrst);
    s += &format!(
        "SPHERICAL CUTOFF RADIUS    = {} ANGSTROM\n",
        fixed(c.cutoff, 8, 4)
    );
    s += &format!("\nNS = {}\n", fixed(lat.ns, 0, 16));
    s += &format!("BOXL = {}\n", fixed(lat.boxl, 10, 6));
    s += &format!("CUTOFF = {}\n", fixed(lat.cutoff, 10, 6));
    s += &format!("XS = {}\n", fixed(lat.xs, 10, 6));
    s += &format!("ZERO = {}\n", general(lat.zero));
    s += &format!("WCOS = {}\n", fixed(lat.wcos, 0, 6));
    s += &format!("WSIN = {}\n", fixed(lat.wsin, 0, 6));
    s += "***** NEW RUN STARTING FROM REGULAR LATTICE *****\n";
    Ok(s)
}
