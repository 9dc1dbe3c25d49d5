use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use fencelock::domain::{FenceKey, FenceKeys};
use fencelock_demo::app::DemoServer;
use fencelock_demo::chaos::{self, ChaosOptions};
use fencelock_demo::docs::Guarding;
use fencelock_demo::lease_server;
use fencelock_demo::page::{PageOptions, stage};
use fencelock_demo::story::{self, StoryOptions, Verdict};
use fencelock_server::StoreOptions;
use fencelock_server::{DEFAULT_POOL_SIZE, DEFAULT_STORE_TIMEOUT_MS};

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
    ///
    /// An unreachable PostgreSQL does not stop it: it starts, answers `503 store-unavailable`
    /// until the database answers, then creates its tables and serves.
    Store {
        /// Address and port to listen on.
        #[arg(long, env = "FENCELOCK_DEMO_BIND", default_value = "127.0.0.1:8081")]
        bind: SocketAddr,
        /// `postgres://...` or `sqlite://PATH`; unset: the SQLite file `fencelock-demo.db`.
        #[arg(long, env = "FENCELOCK_DEMO_DATABASE_URL", hide_env_values = true)]
        database_url: Option<String>,
        /// Most PostgreSQL connections this store opens (as the lease server's flag).
        #[arg(
            long,
            env = "FENCELOCK_POOL_SIZE",
            default_value_t = DEFAULT_POOL_SIZE,
            value_parser = clap::value_parser!(u16).range(1..=1000)
        )]
        pool_size: u16,
        /// Longest a request waits for the store before answering `503 store-unavailable`
        /// (as the lease server's flag); also PostgreSQL's statement timeout.
        #[arg(
            long,
            env = "FENCELOCK_STORE_TIMEOUT_MS",
            default_value_t = DEFAULT_STORE_TIMEOUT_MS,
            value_parser = clap::value_parser!(u64).range(1..)
        )]
        store_timeout_ms: u64,
        /// Accept every write, whatever its fence (to show the damage; never in production).
        #[arg(long)]
        no_guard: bool,
        /// A fence key file (at least 32 bytes) of the lease server: only tokens it signed
        /// are accepted (a bare fence or a token it did not sign: `403 invalid-fence-token`).
        /// Repeat it (or list the files, comma-separated) to rotate keys: the current first,
        /// then the previous ones.
        #[arg(
            long = "fence-key",
            value_name = "FILE",
            env = "FENCELOCK_DEMO_FENCE_KEYS",
            value_delimiter = ','
        )]
        fence_keys: Vec<PathBuf>,
        #[command(flatten)]
        page: PageFlags,
    },
    /// Serve the paused-worker stories as a page: starts a lease server and a demo store
    /// in-process (on temporary SQLite files) and prints the page's URL.
    Page {
        /// Address and port of the page (and of the demo store that serves it).
        #[arg(long, env = "FENCELOCK_DEMO_BIND", default_value = "127.0.0.1:8081")]
        bind: SocketAddr,
        #[command(flatten)]
        page: PageFlags,
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
        /// The bearer secret for a lease server that runs with `--auth-file` (lock and read
        /// on `report:`).
        #[arg(long, env = "FENCELOCK_DEMO_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// A fence key file for the in-process lease server (which then signs fences) and
        /// the in-process store (which then takes only signed fences).
        #[arg(long, value_name = "FILE")]
        fence_key: Option<PathBuf>,
    },
    /// Several lease servers on one store, workers that acquire (some waiting, some with a
    /// lock delay), renew, write with their fence, pause past their TTL and release, while
    /// instances are killed with SIGKILL and the store's connections cut; then a check of the
    /// whole history, and its replay against the model's transition rules. Exits non-zero on
    /// any violation or any step the model cannot explain.
    Chaos {
        /// Lease-server instances (real `fencelock` processes) sharing the store.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=64))]
        instances: u16,
        /// Concurrent workers.
        #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=1024))]
        workers: u16,
        /// Resources the workers contend for.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1024))]
        resources: u16,
        /// How long the workers run, in seconds.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(3..=86400))]
        seconds: u64,
        /// A `postgres://` URL (one host) for the lease servers, which reach it through a
        /// proxy the run cuts; unset: one SQLite file in a scratch directory.
        #[arg(long, hide_env_values = true)]
        database_url: Option<String>,
        /// Seed for the workers' and the faults' choices (printed when not given).
        #[arg(long)]
        seed: Option<u64>,
        /// The `fencelock` binary; default: the one beside this program.
        #[arg(long, env = "FENCELOCK_BIN")]
        fencelock_bin: Option<PathBuf>,
        /// Write every request and its answer, one JSON object a line, to this file.
        #[arg(long, value_name = "FILE")]
        history_out: Option<PathBuf>,
        /// Run the demo store without its guard (to see the checks catch stale writes).
        #[arg(long)]
        no_guard: bool,
    },
}

/// How the page at `/` plays its stories.
#[derive(Args)]
struct PageFlags {
    /// A running fencelock server for the page's stories; unset: one started in-process on a
    /// temporary SQLite file (by `store`, when the first story is played).
    #[arg(long, value_name = "URL")]
    lease_url: Option<String>,
    /// The bearer secret for a lease server that runs with `--auth-file` (lock and read on
    /// `report:`).
    #[arg(long, env = "FENCELOCK_DEMO_TOKEN", hide_env_values = true)]
    lease_token: Option<String>,
    /// The stories' lease TTL; worker A pauses for longer than this.
    #[arg(
        long,
        default_value_t = stage::DEFAULT_TTL_SECONDS,
        value_parser = clap::value_parser!(u32).range(1..=60)
    )]
    story_ttl_seconds: u32,
    /// The pause after each step of a story, so that a person can follow.
    #[arg(
        long,
        default_value_t = stage::DEFAULT_BEAT_MS,
        value_parser = clap::value_parser!(u64).range(0..=10_000)
    )]
    beat_ms: u64,
}

impl PageFlags {
    fn options(
        self,
        guarding: Guarding,
        fence_key: Option<FenceKey>,
    ) -> anyhow::Result<PageOptions> {
        if let Some(url) = &self.lease_url {
            // A bad URL is refused now, not at the first story.
            fencelock::client::Client::new(url.clone())
                .map_err(|e| anyhow::anyhow!("--lease-url {url}: {e}"))?;
        }
        Ok(PageOptions {
            lease_url: self.lease_url,
            token: self.lease_token,
            fence_key,
            ttl: Duration::from_secs(u64::from(self.story_ttl_seconds)),
            beat: Duration::from_millis(self.beat_ms),
            guarding,
        })
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The story prints its own timeline; the servers it starts only speak up when something
    // is wrong.
    let default_filter = match cli.command {
        Command::Store { .. } => "info",
        Command::Page { .. } | Command::PausedWorker { .. } => "warn",
        // The report is the output; the in-process demo store's warnings about the run's own
        // cut connections are expected.
        Command::Chaos { .. } => "error",
    };
    let _logs = match fencelock_server::init_logs_with_default(
        fencelock_server::LogFormat::Text,
        default_filter,
    ) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("fencelock-demo: {e:#}");
            return ExitCode::from(2);
        }
    };
    actix_web::rt::System::new().block_on(async move {
        match cli.command {
            Command::Store {
                bind,
                database_url,
                pool_size,
                store_timeout_ms,
                no_guard,
                fence_keys,
                page,
            } => {
                let settings = StoreOptions {
                    pool_size: usize::from(pool_size),
                    timeout: Duration::from_millis(store_timeout_ms),
                    ..StoreOptions::default()
                };
                let keys = match read_keys(&fence_keys) {
                    Ok(keys) => keys,
                    Err(e) => {
                        eprintln!("fencelock-demo: {e:#}");
                        return ExitCode::from(2);
                    }
                };
                let guarding = guarding(no_guard);
                let page = match page.options(guarding, keys.first().cloned()) {
                    Ok(page) => page,
                    Err(e) => {
                        eprintln!("fencelock-demo: {e:#}");
                        return ExitCode::from(2);
                    }
                };
                let served = serve(bind, database_url.as_deref(), keys, settings, page).await;
                match served {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("fencelock-demo: {e:#}");
                        ExitCode::FAILURE
                    }
                }
            }
            Command::Page { bind, page } => {
                let page = match page.options(Guarding::On, None) {
                    Ok(page) => page,
                    Err(e) => {
                        eprintln!("fencelock-demo: {e:#}");
                        return ExitCode::from(2);
                    }
                };
                match serve_page(bind, page).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("fencelock-demo: {e:#}");
                        ExitCode::FAILURE
                    }
                }
            }
            Command::Chaos {
                instances,
                workers,
                resources,
                seconds,
                database_url,
                seed,
                fencelock_bin,
                history_out,
                no_guard,
            } => {
                let options = ChaosOptions {
                    instances: usize::from(instances),
                    workers: usize::from(workers),
                    resources: usize::from(resources),
                    seconds,
                    database_url,
                    seed,
                    fencelock_bin,
                    guarding: guarding(no_guard),
                    history_out,
                };
                match chaos::run(options).await {
                    Ok(summary) if summary.passed() => ExitCode::SUCCESS,
                    Ok(_) => ExitCode::FAILURE,
                    Err(e) => {
                        eprintln!("fencelock-demo: chaos: {e:#}");
                        ExitCode::from(2)
                    }
                }
            }
            Command::PausedWorker {
                no_guard,
                lease_url,
                store_url,
                ttl_seconds,
                token,
                fence_key,
            } => {
                let fence_key = match read_keys(fence_key.as_slice()) {
                    Ok(mut keys) => keys.pop(),
                    Err(e) => {
                        eprintln!("fencelock-demo: {e:#}");
                        return ExitCode::from(2);
                    }
                };
                let options = StoryOptions {
                    guarding: guarding(no_guard),
                    store_given: store_url.is_some(),
                    ttl_seconds,
                    token,
                    signed: fence_key.is_some(),
                };
                match paused_worker(lease_url, store_url, fence_key, options).await {
                    // No damage against a store whose own guard is on is the guard working,
                    // and the story says so in its last line.
                    Ok(Verdict::Protected | Verdict::DamageShown | Verdict::NoDamage) => {
                        ExitCode::SUCCESS
                    }
                    Ok(Verdict::NotProtected) => {
                        eprintln!(
                            "fencelock-demo: the store's guard did not stop the late write; see the write log above"
                        );
                        ExitCode::FAILURE
                    }
                    // The reader went away (`| head`): the story ends there, as `cat` would.
                    Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("fencelock-demo: {e:#}");
                        ExitCode::FAILURE
                    }
                }
            }
        }
    })
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn guarding(no_guard: bool) -> Guarding {
    if no_guard {
        Guarding::Off
    } else {
        Guarding::On
    }
}

/// The keys in `files`, in order; a file that is missing, unreadable or too short is an
/// error naming it.
fn read_keys(files: &[PathBuf]) -> anyhow::Result<Vec<FenceKey>> {
    use anyhow::Context as _;
    files
        .iter()
        .map(|file| FenceKey::read(file).context("--fence-key"))
        .collect()
}

async fn serve(
    bind: SocketAddr,
    url: Option<&str>,
    keys: Vec<FenceKey>,
    settings: StoreOptions,
    page: PageOptions,
) -> anyhow::Result<()> {
    let signed = keys.len();
    let guarding = page.guarding;
    let server = DemoServer::open(bind, url, FenceKeys::new(keys), settings, page).await?;
    tracing::info!(
        port = server.port(),
        ?guarding,
        fence_keys = signed,
        "demo store serving"
    );
    run_until_signal(server).await
}

/// `fencelock-demo page`: the store on a temporary SQLite file, the lease server in-process
/// unless `--lease-url` names one, and the page's URL on stdout.
async fn serve_page(bind: SocketAddr, page: PageOptions) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let scratch = tempfile::tempdir().context("creating a scratch directory")?;
    let db = format!("sqlite://{}", scratch.path().join("docs.db").display());
    let external = page.lease_url.is_some();
    let server = DemoServer::open(
        bind,
        Some(&db),
        FenceKeys::default(),
        StoreOptions::default(),
        page,
    )
    .await?;
    let lease_url = server.prepare_page().await?;
    let shown = match bind.ip() {
        ip if ip.is_unspecified() => SocketAddr::new([127, 0, 0, 1].into(), server.port()),
        ip => SocketAddr::new(ip, server.port()),
    };
    let lease_kind = if external {
        "as given"
    } else {
        "in-process, temporary SQLite file"
    };
    println!("The paused-worker stories, as a page");
    println!("  page:         http://{shown}/");
    println!("  lease server: {lease_url} ({lease_kind})");
    println!("  demo store:   this process, temporary SQLite file, guard on");
    println!("Open the page in a browser. Ctrl-C stops.");
    let served = run_until_signal(server).await;
    drop(scratch);
    served
}

async fn run_until_signal(server: DemoServer) -> anyhow::Result<()> {
    fencelock_server::stop_on_signal(server.handle());
    server.run_until_stopped().await
}

/// `fencelock-demo paused-worker`: the story against the lease server and the demo store at
/// the URLs given, and in-process ones, on temporary SQLite files, for those not given (with
/// `fence_key`, the lease server signs fences and the store takes only signed ones). They are
/// stopped when the story ends.
async fn paused_worker(
    lease_url: Option<String>,
    store_url: Option<String>,
    fence_key: Option<FenceKey>,
    options: StoryOptions,
) -> anyhow::Result<Verdict> {
    use anyhow::Context as _;
    let scratch = tempfile::tempdir().context("creating a scratch directory")?;
    let mut stops = Vec::new();
    let lease_url = match lease_url {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None => {
            let (url, stop) = lease_server::start(scratch.path(), fence_key.clone()).await?;
            stops.push(stop);
            url
        }
    };
    let store_url = match store_url {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None => {
            let db = format!("sqlite://{}", scratch.path().join("docs.db").display());
            let page = PageOptions {
                lease_url: Some(lease_url.clone()),
                token: options.token.clone(),
                guarding: options.guarding,
                ..PageOptions::default()
            };
            let keys = FenceKeys::new(fence_key.into_iter().collect());
            let server = DemoServer::open(
                "127.0.0.1:0".parse()?,
                Some(&db),
                keys,
                StoreOptions::default(),
                page,
            )
            .await?;
            let url = format!("http://127.0.0.1:{}", server.port());
            stops.push(server.handle());
            actix_web::rt::spawn(server.run_until_stopped());
            url
        }
    };
    let result = story::run(&options, &lease_url, &store_url).await;
    for stop in stops {
        stop.stop(true).await;
    }
    result
}
