use std::process::ExitCode;

use clap::Parser as _;
use clap::error::ErrorKind;

use fencelock::config::{Cli, Command, Settings};
use fencelock::startup::{self, Application};
use fencelock::store::{self, StoreConfig};
use fencelock::{shutdown, telemetry};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap's own message spans several lines; start-up errors are one line.
            let rendered = e.to_string();
            let first = rendered.lines().next().unwrap_or("invalid arguments");
            eprintln!("fencelock: {}", first.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    let settings = match Settings::from_args(&cli.server) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("fencelock: {e:#}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = telemetry::init(settings.log_format) {
        eprintln!("fencelock: {e:#}");
        return ExitCode::from(2);
    }

    let result = actix_web::rt::System::new().block_on(async move {
        match cli.command.unwrap_or(Command::Serve) {
            Command::Serve => serve(settings).await,
            Command::Migrate => migrate(settings).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fencelock: {e:#}");
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
    let handle = app.handle();
    actix_web::rt::spawn(async move {
        let signal = shutdown::signal().await;
        tracing::info!(signal, "shutting down: finishing in-flight requests");
        handle.stop(true).await;
    });
    app.run_until_stopped().await
}

async fn migrate(settings: Settings) -> anyhow::Result<()> {
    let store = store::open(&settings.store, settings.store_options()).await?;
    if let StoreConfig::Postgres(_) = settings.store {
        // open() tolerates an unreachable database; an explicit migrate must not.
        store.ping().await?;
    }
    tracing::info!(store = %store.describe(), "migrations applied");
    Ok(())
}
