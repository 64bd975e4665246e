//! `fencekeeper completions SHELL`: tab completion for every command and flag, made
//! from the same definitions the parser uses, so it never drifts from them.
//!
//! ```text
//! fencekeeper completions bash > /etc/bash_completion.d/fencekeeper
//! fencekeeper completions zsh > "${fpath[1]}/_fencekeeper"
//! fencekeeper completions fish > ~/.config/fish/completions/fencekeeper.fish
//! ```

use clap_complete::Shell;
use std::process::ExitCode;

/// `fencekeeper completions`'s arguments.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  fencekeeper completions bash > /etc/bash_completion.d/fencekeeper\n  \
                        fencekeeper completions zsh > \"${fpath[1]}/_fencekeeper\"")]
pub struct Args {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: Shell,
}

/// Print `command`'s completions for the shell.
pub fn run(args: Args, mut command: clap::Command) -> anyhow::Result<ExitCode> {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "fencekeeper", &mut script);
    crate::output::text(&script)?;
    Ok(ExitCode::SUCCESS)
}
