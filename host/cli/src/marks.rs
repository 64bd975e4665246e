//! `fencekeeper marks` (being built; see the issue that owns it).

use std::process::ExitCode;

/// Arguments of `fencekeeper marks`.
#[derive(clap::Args)]
pub struct Args {}

/// Run the subcommand.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("fencekeeper marks is not built yet")
}
