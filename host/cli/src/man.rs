//! `fencekeeper man`: the manual pages (roff), made from the same definitions the
//! parser uses: `fencekeeper.1` on standard output, or with `--dir` one page per
//! command (`fencekeeper-serve.1`, ...) written into a directory.

use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;

/// `fencekeeper man`'s arguments.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  fencekeeper man | man -l -\n  \
                        fencekeeper man --dir /usr/local/share/man/man1")]
pub struct Args {
    /// Write fencekeeper.1 and one page per command into this directory (which must
    /// exist) instead of printing fencekeeper.1.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Print or write `command`'s manual pages.
pub fn run(args: Args, command: clap::Command) -> anyhow::Result<ExitCode> {
    let Some(dir) = args.dir else {
        let mut page = Vec::new();
        clap_mangen::Man::new(command).render(&mut page).context("rendering the manual page")?;
        crate::output::text(&page)?;
        return Ok(ExitCode::SUCCESS);
    };
    anyhow::ensure!(dir.is_dir(), "--dir {}: not a directory", dir.display());
    clap_mangen::generate_to(command, &dir).with_context(|| format!("writing the pages into {}", dir.display()))?;
    Ok(ExitCode::SUCCESS)
}
