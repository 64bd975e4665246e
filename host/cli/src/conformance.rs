//! `fencekeeper conformance`: run the conformance vectors against any guest
//! component that implements the fencekeeper world, and print a pass/fail table.
//! Exit 0 all pass, 1 any vector fails, 2 the guest or the vectors cannot be loaded.

use crate::admit::load_validator;
use fencekeeper::conformance::{self, Vectors};
use fencekeeper::{Conformance, Policy};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `fencekeeper conformance`.
#[derive(clap::Args)]
pub struct Args {
    /// A vector file in the format of host/fencekeeper/conformance/vectors.json (default: the
    /// vectors built into this command).
    #[arg(long, value_name = "FILE")]
    vectors: Option<PathBuf>,
    /// The guest component to check.
    #[arg(value_name = "COMPONENT.wasm")]
    guest: PathBuf,
}

/// Run the subcommand.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let vectors = match &args.vectors {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read vectors {}: {e}", path.display()))?;
            Vectors::parse(&text)?
        }
        None => Vectors::bundled()?,
    };
    // Load once up front, so that a file that is not a fencekeeper guest is an error
    // (exit 2), not a table of failures. The vectors are this command's own to run,
    // so loading does not run them first (it would stop at the first failure).
    let validator = load_validator(Some(&args.guest), Policy::default(), Conformance::Skip)?;
    let info =
        validator.describe().map_err(|e| anyhow::anyhow!("guest {}: describe failed: {e}", args.guest.display()))?;
    out!("guest: {} {}", info.name, info.version);
    let report = conformance::run(&vectors, |policy| load_validator(Some(&args.guest), policy, Conformance::Skip));
    crate::output::text(report.to_string().as_bytes())?;
    Ok(if report.failed() == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
