//! `fencelock completions SHELL` and `fencelock man`: the shell completion scripts and the
//! manual pages, written from the command line's own definition
//! ([`Cli::documented`]), so that each flag and subcommand the parser knows is in them and
//! nothing else is.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use crate::config::{Cli, CompletionShell};

/// `fencelock completions SHELL`: the script on stdout.
pub(crate) fn completions(shell: CompletionShell) -> ExitCode {
    let mut command = Cli::documented();
    let mut script = Vec::new();
    clap_complete::generate(
        clap_complete::Shell::from(shell),
        &mut command,
        "fencelock",
        &mut script,
    );
    written(std::io::stdout().lock().write_all(&script), "the script")
}

/// `fencelock man [--dir DIR]`: fencelock(1) on stdout, or every page into `dir`.
pub(crate) fn man(dir: Option<&Path>) -> ExitCode {
    let command = Cli::documented();
    match dir {
        Some(dir) => match clap_mangen::generate_to(command, dir) {
            Ok(()) => {
                eprintln!("fencelock: manual pages written to {}", dir.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!(
                    "fencelock: writing the manual pages to {}: {e}",
                    dir.display()
                );
                ExitCode::FAILURE
            }
        },
        None => {
            let mut page = Vec::new();
            let rendered = clap_mangen::Man::new(command).render(&mut page);
            written(
                rendered.and_then(|()| std::io::stdout().lock().write_all(&page)),
                "the manual page",
            )
        }
    }
}

fn written(result: std::io::Result<()>, what: &str) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fencelock: writing {what}: {e}");
            ExitCode::FAILURE
        }
    }
}
