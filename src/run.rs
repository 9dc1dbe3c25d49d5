//! The `fencelock` binary's command line: which command runs, with which settings, and its
//! exit code.

use std::process::ExitCode;

use clap::error::ErrorKind;

use crate::config::{Cli, Command, Settings, TokenCommand};
use crate::startup::{self, Application};
use crate::store;
use crate::{cli_files, guard_command, lock_command, shutdown, telemetry};

/// The `fencelock` command: parses its arguments, then serves, migrates, checks, makes a
/// token, prints or installs the guard's SQL, runs `fencelock lock`, or prints completions
/// or manual pages.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse_command_line() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("fencelock: {}", usage_error(&e.to_string()));
            return ExitCode::from(2);
        }
    };
    let cli = match cli {
        // A client of the server: none of the server's settings apply.
        Cli {
            command: Some(Command::Lock(args)),
            ..
        } => return lock_command::main(args),
        Cli {
            command: Some(Command::LockSentinel { join }),
            ..
        } => return lock_command::sentinel(join),
        cli => cli,
    };
    match &cli.command {
        Some(Command::Completions { shell }) => return cli_files::completions(*shell),
        Some(Command::Man { dir }) => return cli_files::man(dir.as_deref()),
        _ => {}
    }
    if let Some(Command::Token(TokenCommand::New { name })) = &cli.command {
        return new_token(name);
    }
    if let Some(Command::Guard(command)) = &cli.command {
        return guard_command::main(command, &cli.server);
    }
    let settings = match Settings::from_args(&cli.server) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("fencelock: {e:#}");
            return ExitCode::from(2);
        }
    };
    let command = cli.command.unwrap_or(Command::Serve);
    // A check's answer is its one line on stdout; its logs only speak of trouble.
    let default_filter = match command {
        Command::Check => "warn",
        Command::Serve
        | Command::Migrate
        | Command::Token(_)
        | Command::Guard(_)
        | Command::Lock(_)
        | Command::LockSentinel { .. }
        | Command::Completions { .. }
        | Command::Man { .. } => "info",
    };
    let logs = match telemetry::init_with_default(settings.log_format, default_filter) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("fencelock: {e:#}");
            return ExitCode::from(2);
        }
    };

    let result = actix_web::rt::System::new().block_on(async move {
        match command {
            Command::Serve => serve(settings).await,
            Command::Migrate => migrate(settings).await,
            Command::Check => check(settings).await,
            Command::Token(_)
            | Command::Guard(_)
            | Command::Lock(_)
            | Command::LockSentinel { .. }
            | Command::Completions { .. }
            | Command::Man { .. } => {
                unreachable!("answered before the runtime starts")
            }
        }
    });
    // Every buffered log line is out before the last line below.
    drop(logs);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, whatever the cause's own text holds (PostgreSQL's DETAIL and HINT
            // come on lines of their own).
            let cause = format!("{e:#}").replace('\n', "; ");
            eprintln!("fencelock: {cause}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(settings: Settings) -> anyhow::Result<()> {
    match startup::raise_open_file_limit() {
        Ok(limit) => tracing::debug!(limit, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open-file limit"),
    }
    let app = Application::build(settings).await?;
    if let Some(auth) = app.auth() {
        actix_web::rt::spawn(shutdown::hangups(move || auth.reload_logged()));
    }
    shutdown::stop_on_signal(app.handle());
    app.run_until_stopped().await
}

async fn check(settings: Settings) -> anyhow::Result<()> {
    let found = store::check(&settings.store, settings.store_options()).await?;
    println!("fencelock check: ok: {found}");
    Ok(())
}

async fn migrate(settings: Settings) -> anyhow::Result<()> {
    let opened = store::open(&settings.store, settings.store_options()).await?;
    opened.migrate().await?;
    tracing::info!(store = %opened.store.describe(), "migrations applied");
    Ok(())
}

/// `fencelock token new NAME`: the secret on the first line, then the block for the file.
fn new_token(name: &str) -> ExitCode {
    match crate::auth::new_token(name) {
        Ok(token) => {
            println!("{}\n\n{}", token.secret, token.block);
            eprintln!(
                "fencelock: the first line is the secret, shown only now: clients send it as `Authorization: Bearer <secret>`. Paste the block into the auth file, narrow its prefixes and permissions, and send the server SIGHUP."
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fencelock: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// clap's message for bad arguments, in one line as every start-up error is: its first
/// paragraph with the lines under it (the arguments missing, the values possible) and its
/// tips, then the usage. Only the first line would leave "the following required arguments
/// were not provided:" naming none.
fn usage_error(rendered: &str) -> String {
    let mut line = String::new();
    let mut usage = None;
    for part in rendered.lines().map(str::trim) {
        if part.is_empty() || part.starts_with("For more information") {
            continue;
        }
        if let Some(rest) = part.strip_prefix("Usage: ") {
            usage = Some(rest);
            continue;
        }
        let part = part.trim_start_matches("error: ");
        let separator = if line.is_empty() {
            ""
        } else if line.ends_with(':') {
            " "
        } else if part.starts_with("tip: ") {
            "; "
        } else {
            ", "
        };
        line.push_str(separator);
        line.push_str(part);
    }
    if line.is_empty() {
        line.push_str("invalid arguments");
    }
    if let Some(usage) = usage {
        line.push_str(&format!(" (usage: {usage})"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::usage_error;

    #[test]
    fn a_usage_error_keeps_the_lines_under_its_first() {
        let rendered = "error: the following required arguments were not provided:\n  \
            <RESOURCE>\n  <CMD>...\n\nUsage: fencelock lock <RESOURCE> -- <CMD>...\n\n\
            For more information, try '--help'.\n";
        assert_eq!(
            usage_error(rendered),
            "the following required arguments were not provided: <RESOURCE>, <CMD>... \
             (usage: fencelock lock <RESOURCE> -- <CMD>...)"
        );
        let rendered = "error: unexpected argument '--ttl' found\n\n  tip: a similar argument \
            exists: '--ttl-seconds'\n\nUsage: fencelock lock [OPTIONS] <RESOURCE> -- <CMD>...\n";
        assert_eq!(
            usage_error(rendered),
            "unexpected argument '--ttl' found; tip: a similar argument exists: \
             '--ttl-seconds' (usage: fencelock lock [OPTIONS] <RESOURCE> -- <CMD>...)"
        );
    }
}
