//! `multigrain experiment cluster-size`: paper 002 Tables 5.8–5.9.
use super::{CommonArgs, Context, Outcome};
use anyhow::Result;

/// Flags of `multigrain experiment cluster-size` (see its `--help`).
#[derive(clap::Args, Debug)]
pub struct ClusterSizeArgs {
    #[command(flatten)]
    pub(super) common: CommonArgs,
}

/// Runs the experiment.
pub fn run(_ctx: &Context, _a: &ClusterSizeArgs) -> Result<Outcome> {
    anyhow::bail!("not yet")
}
