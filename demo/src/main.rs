use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use fencelock_demo::app::DemoServer;
use fencelock_demo::docs::{self, Guarding};
use fencelock_demo::story::{self, StoryOptions, Verdict};

/// The fencelock demo: a protected store that uses the write guard, and the paused-worker
/// story that shows what fencing prevents.
#[derive(Parser)]
#[command(name = "fencelock-demo", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the demo store: PUT/GET /docs/{key}, GET /docs/{key}/writes.
    Store {
        /// Address and port to listen on.
        #[arg(long, env = "FENCELOCK_DEMO_BIND", default_value = "127.0.0.1:8081")]
        bind: SocketAddr,
        /// `postgres://...` or `sqlite://PATH`; unset: the SQLite file `fencelock-demo.db`.
        #[arg(long, env = "FENCELOCK_DEMO_DATABASE_URL", hide_env_values = true)]
        database_url: Option<String>,
        /// Accept every write, whatever its fence (to show the damage; never in production).
        #[arg(long)]
        no_guard: bool,
    },
    /// Play the paused-worker story and print its timeline.
    PausedWorker {
        /// Run the story with the write guard switched off.
        #[arg(long)]
        no_guard: bool,
        /// A running fencelock server to use instead of an in-process one.
        #[arg(long)]
        lease_url: Option<String>,
        /// A running demo store to use instead of an in-process one.
        #[arg(long)]
        store_url: Option<String>,
        /// The workers' lease TTL; worker A pauses for longer than this.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=60))]
        ttl_seconds: u32,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The story prints its own timeline; the servers it starts only speak up when something
    // is wrong.
    let default_filter = match cli.command {
        Command::Store { .. } => "info",
        Command::PausedWorker { .. } => "warn",
    };
    fencelock::telemetry::init_with_default(fencelock::config::LogFormat::Text, default_filter);
    actix_web::rt::System::new().block_on(async move {
        match cli.command {
            Command::Store {
                bind,
                database_url,
                no_guard,
            } => match serve(bind, database_url.as_deref(), guarding(no_guard)).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("fencelock-demo: {e:#}");
                    ExitCode::FAILURE
                }
            },
            Command::PausedWorker {
                no_guard,
                lease_url,
                store_url,
                ttl_seconds,
            } => {
                let options = StoryOptions {
                    guarding: guarding(no_guard),
                    lease_url,
                    store_url,
                    ttl_seconds,
                };
                match story::run(options).await {
                    Ok(Verdict::Protected | Verdict::DamageShown) => ExitCode::SUCCESS,
                    Ok(verdict) => {
                        eprintln!(
                            "fencelock-demo: the story did not end as it should: {verdict:?}"
                        );
                        ExitCode::FAILURE
                    }
                    Err(e) => {
                        eprintln!("fencelock-demo: {e:#}");
                        ExitCode::FAILURE
                    }
                }
            }
        }
    })
}

fn guarding(no_guard: bool) -> Guarding {
    if no_guard {
        Guarding::Off
    } else {
        Guarding::On
    }
}

async fn serve(bind: SocketAddr, url: Option<&str>, guarding: Guarding) -> anyhow::Result<()> {
    let docs = docs::open(url, guarding).await?;
    let server = DemoServer::build(bind, docs)?;
    tracing::info!(port = server.port(), ?guarding, "demo store serving");
    let handle = server.handle();
    actix_web::rt::spawn(async move {
        let signal = fencelock::shutdown::signal().await;
        tracing::info!(signal, "shutting down");
        handle.stop(true).await;
    });
    server.run_until_stopped().await
}
