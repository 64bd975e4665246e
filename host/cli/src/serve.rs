//! `fencekeeper serve` (being built; see the issue that owns it).

use std::process::ExitCode;

/// Arguments of `fencekeeper serve`.
#[derive(clap::Args)]
pub struct Args {}

/// Run the subcommand.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("fencekeeper serve is not built yet")
}
