//! `fencekeeper admit` (being built; see the issue that owns it).

use std::process::ExitCode;

/// Arguments of `fencekeeper admit`.
#[derive(clap::Args)]
pub struct Args {}

/// Run the subcommand.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("fencekeeper admit is not built yet")
}
