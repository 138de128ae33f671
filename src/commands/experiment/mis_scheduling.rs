//! `multigrain experiment mis-scheduling`: paper 002 Tables 5.6–5.7.
use super::{CommonArgs, Context, Outcome};
use anyhow::Result;

/// Flags of `multigrain experiment mis-scheduling` (see its `--help`).
#[derive(clap::Args, Debug)]
pub struct MisSchedulingArgs {
    #[command(flatten)]
    pub(super) common: CommonArgs,
}

/// Runs the experiment.
pub fn run(_ctx: &Context, _a: &MisSchedulingArgs) -> Result<Outcome> {
    anyhow::bail!("not yet")
}
