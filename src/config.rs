//! Command line and environment. Every setting is a flag and an environment variable:
//!
//! | flag | variable | default |
//! |---|---|---|
//! | `--bind` | `FENCELOCK_BIND` | `127.0.0.1:8080` |
//! | `--database-url` | `DATABASE_URL` | unset: SQLite file `fencelock.db` |
//! | `--pg-pooling` | `FENCELOCK_PG_POOLING` | `direct` (`session`, `transaction`: through PgBouncer) |
//! | `--listen-database-url` | `FENCELOCK_LISTEN_DATABASE_URL` | unset: the LISTEN session uses `--database-url` |
//! | `--max-ttl-seconds` | `FENCELOCK_MAX_TTL_SECONDS` | `86400` |
//! | `--max-wait-ms` | `FENCELOCK_MAX_WAIT_MS` | `60000` (at most 3600000) |
//! | `--pool-size` | `FENCELOCK_POOL_SIZE` | `16` |
//! | `--pg-batch-max` | `FENCELOCK_PG_BATCH_MAX` | `64` |
//! | `--log-format` | `FENCELOCK_LOG_FORMAT` | `text` |
//! | `--purge-grace-seconds` | `FENCELOCK_PURGE_GRACE_SECONDS` | `3600` |
//! | `--purge-interval-seconds` | `FENCELOCK_PURGE_INTERVAL_SECONDS` | `60` |
//! | `--history-retention-seconds` | `FENCELOCK_HISTORY_RETENTION_SECONDS` | `604800` (7 days) |
//! | `--store-timeout-ms` | `FENCELOCK_STORE_TIMEOUT_MS` | `5000` |
//! | `--request-timeout-ms` | `FENCELOCK_REQUEST_TIMEOUT_MS` | `10000` |
//! | `--max-connections` | `FENCELOCK_MAX_CONNECTIONS` | the open-file limit less a reserve |
//! | `--max-connections-per-peer` | `FENCELOCK_MAX_CONNECTIONS_PER_PEER` | a quarter of `--max-connections`, at least 64 (`0`: no cap) |
//! | `--migration-lock-timeout-seconds` | `FENCELOCK_MIGRATION_LOCK_TIMEOUT_SECONDS` | `60` |
//! | `--live-leases-interval-seconds` | `FENCELOCK_LIVE_LEASES_INTERVAL_SECONDS` | `10` (1 to 15) |
//! | `--auth-file` | `FENCELOCK_AUTH_FILE` | unset: no tokens checked |
//! | `--allow-unauthenticated` | `FENCELOCK_ALLOW_UNAUTHENTICATED` | off |
//! | `--tls-cert` | `FENCELOCK_TLS_CERT` | unset: plain HTTP |
//! | `--tls-key` | `FENCELOCK_TLS_KEY` | unset: plain HTTP |
//! | `--fence-key` | `FENCELOCK_FENCE_KEY` | unset: no `fence_token` |
//!
//! `--auth-file` names the TOML file of bearer tokens (see [`crate::auth`]); it is read at
//! start (a bad file stops start-up) and again on `SIGHUP` (a bad file then keeps the tokens
//! in force). Without it the server serves anyone, so it refuses to listen on an address
//! other than loopback unless `--allow-unauthenticated` says that is meant.
//!
//! `--tls-cert` and `--tls-key` go together: both serve HTTPS only (TLS 1.2 and 1.3), with
//! the PEM certificate chain and private key they name (see [`crate::tls`]); one alone is
//! refused at start. TLS to PostgreSQL is set in `DATABASE_URL` (`sslmode`, `sslrootcert`;
//! see [`crate::store::postgres::tls`]).
//!
//! `--max-connections-per-peer` caps the connections of one client IP address (see
//! `startup::PeerCap`), so that one client cannot take every connection; behind a proxy or a
//! load balancer that connects from one address, every client is that one peer: give `0`
//! there (no cap) and let the proxy limit its clients.
//!
//! `--pg-pooling` says what stands between the server and PostgreSQL: `direct` (PostgreSQL
//! itself), or a pooler such as PgBouncer in `session` or `transaction` pooling, through which
//! no session setting or prepared statement may be relied on (see
//! `store::postgres::statements`). `--listen-database-url` is where the LISTEN session
//! (waiting, watch) connects instead, around the pooler; transaction pooling requires it.
//! Sessions that are not what `--pg-pooling` says (settings lost on the way, two connections
//! sharing one session) stop start-up with one line.
//!
//! `--migration-lock-timeout-seconds` bounds how long PostgreSQL migrations wait for the
//! migration lock that another session holds (another instance migrating, or a session that
//! kept it); the wait is logged with the holder, the server answers `503` meanwhile, and
//! past the bound start-up stops with one line. `0`: one attempt.
//!
//! `--live-leases-interval-seconds` is how often the live leases are counted for the
//! `fencelock_live_leases` gauge of `GET /metrics`; at most 15, as API.md promises.
//!
//! `--fence-key FILE` names a file of at least 32 secret bytes (`head -c 32 /dev/urandom >
//! fence.key`); with it, every lock object given to its holder carries a `fence_token`
//! signed with it (see [`fencelock::domain::fence_token`]). A file that is missing, unreadable
//! or too short stops start-up.
//!
//! Everything is parsed into typed values here, so a bad value stops start-up with one line
//! that names the setting, before anything is opened.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};

use crate::auth::Auth;
use crate::store::postgres::Pooling;
pub(crate) use crate::store::{
    DEFAULT_MIGRATION_LOCK_TIMEOUT_SECONDS, DEFAULT_PG_BATCH_MAX, DEFAULT_POOL_SIZE,
    DEFAULT_STORE_TIMEOUT_MS,
};
use crate::store::{StoreConfig, StoreOptions};
use fencelock::domain::ttl::{DEFAULT_MAX_TTL_SECONDS, TTL_CEILING_SECONDS};
use fencelock::domain::wait::{DEFAULT_MAX_WAIT_MS, WAIT_CEILING_MS};
use fencelock::domain::{FenceKey, Ttl};

pub(crate) const DEFAULT_BIND: &str = "127.0.0.1:8080";
pub(crate) const DEFAULT_PURGE_GRACE_SECONDS: u64 = 3600;
pub(crate) const DEFAULT_PURGE_INTERVAL_SECONDS: u64 = 60;
pub(crate) const DEFAULT_HISTORY_RETENTION_SECONDS: u64 = 7 * 24 * 3600;
pub(crate) use fencelock::http::body::DEFAULT_REQUEST_TIMEOUT_MS;
pub(crate) const DEFAULT_LIVE_LEASES_INTERVAL_SECONDS: u64 = 10;
/// The contract samples live leases at least this often.
pub(crate) const MAX_LIVE_LEASES_INTERVAL_SECONDS: u64 = 15;

#[derive(Debug, Parser)]
#[command(
    name = "fencelock",
    version,
    about = "A lease server that hands out time-limited locks with fencing tokens",
    long_about = None
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub server: ServerArgs,
}

impl Cli {
    /// The command line, parsed. The server's settings are global (`fencelock check
    /// --database-url ...` works) but mean nothing to `fencelock lock`, so its `--help` hides
    /// them; `fencelock guard`'s shows only the ones it reads.
    pub(crate) fn try_parse_command_line() -> Result<Self, clap::Error> {
        use clap::{CommandFactory as _, FromArgMatches as _};
        Self::from_arg_matches(&Self::command_line(Self::command()).try_get_matches()?)
    }

    /// The command line's definition as the completion scripts and the manual pages show it:
    /// the parser's, without the hidden watchdog command (a manual page or a completion of
    /// its own is what `hide` keeps it out of) and without the `help` subcommands (`--help`
    /// stays), which would otherwise get a manual page of their own under every command.
    pub(crate) fn documented() -> clap::Command {
        use clap::CommandFactory as _;
        // clap can hide a subcommand but not take one out: the root is made again with the
        // parser's arguments and its shown subcommands.
        let parsed = Self::command();
        let mut root = clap::Command::new("fencelock")
            .version(env!("CARGO_PKG_VERSION"))
            .args(parsed.get_arguments().cloned())
            .subcommands(
                parsed
                    .get_subcommands()
                    .filter(|sub| !sub.is_hide_set())
                    .cloned(),
            );
        if let Some(about) = parsed.get_about() {
            root = root.about(about.clone());
        }
        fn without_help(command: clap::Command) -> clap::Command {
            let names: Vec<String> = command
                .get_subcommands()
                .map(|sub| sub.get_name().to_owned())
                .collect();
            names
                .into_iter()
                .fold(command.disable_help_subcommand(true), |command, name| {
                    command.mut_subcommand(name, without_help)
                })
        }
        Self::command_line(without_help(root))
    }

    /// `command`, the command line's definition, as the parser uses it: the globals hidden
    /// where they mean nothing.
    fn command_line(mut command: clap::Command) -> clap::Command {
        // Copies the global arguments into every subcommand, where they can then be hidden.
        command.build();
        let command = command
            .mut_subcommand("lock", |lock| lock.mut_args(|arg| hide_global(arg, &[])))
            .mut_subcommand("guard", |guard| {
                let guard_arg =
                    |arg: clap::Arg| guard_help(hide_global(arg, &["fence_key", "database_url"]));
                guard
                    .mut_args(guard_arg)
                    .mut_subcommand("sql", |sql| {
                        sql.mut_args(|arg| guard_help(hide_global(arg, &["fence_key"])))
                    })
                    .mut_subcommand("install", |install| install.mut_args(guard_arg))
            });
        // The files these two write are about the other commands: none of the server's
        // settings, which are global, apply to them.
        command
            .mut_subcommand("completions", |completions| {
                completions.mut_args(|arg| hide_global(arg, &[]))
            })
            .mut_subcommand("man", |man| man.mut_args(|arg| hide_global(arg, &[])))
    }
}

/// `arg` hidden from `--help` if it is a global argument not named in `shown`.
fn hide_global(arg: clap::Arg, shown: &[&str]) -> clap::Arg {
    if arg.is_global_set() && !shown.contains(&arg.get_id().as_str()) {
        arg.hide(true)
    } else {
        arg
    }
}

/// The server's arguments `fencelock guard` reads, as it reads them.
fn guard_help(arg: clap::Arg) -> clap::Arg {
    match arg.get_id().as_str() {
        "fence_key" => arg.help(
            "A key file of the lease server's --fence-key, to install; once for each key (the new and the old one, to rotate)",
        ),
        "database_url" => arg.help(
            "The PostgreSQL database to install the guard into: `postgres://user:pass@host/db`",
        ),
        _ => arg,
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Serve the HTTP API (the default when no subcommand is given).
    Serve,
    /// Apply the store's migrations and exit.
    Migrate,
    /// Check, changing nothing, that the store can serve leases (reachable, writable, this
    /// build's schema); exit non-zero with the cause in one line if not.
    Check,
    /// Bearer tokens for `--auth-file`.
    #[command(subcommand)]
    Token(TokenCommand),
    /// The write guard in a protected service's own database, for services in any language:
    /// one call in the write's transaction admits the writer's fence or refuses it.
    #[command(subcommand)]
    Guard(GuardCommand),
    /// Run a command while holding a lease: `fencelock lock RESOURCE -- CMD ARGS...`.
    ///
    /// Acquires RESOURCE from the lease server at --url (waiting up to --wait-seconds for
    /// another holder), runs CMD with FENCELOCK_RESOURCE, FENCELOCK_FENCE (and
    /// FENCELOCK_FENCE_TOKEN when the server signs fences) and FENCELOCK_URL in its
    /// environment, renews the lease every third of --ttl-seconds while CMD runs, and releases
    /// it when CMD ends. CMD runs in a process group of its own, which every signal meant for
    /// it reaches: SIGTERM, SIGINT, SIGHUP and SIGQUIT are passed on (a Ctrl-C at the
    /// terminal too), Ctrl-Z stops it with `fencelock lock`. If the lease is about to be lost
    /// or is lost, the group gets SIGTERM, then SIGKILL before the lease's expiry (see
    /// --grace-seconds). No process of the group outlives `fencelock lock`, even one killed
    /// with SIGKILL, unless that SIGKILL goes to `fencelock lock`'s whole process group (see
    /// docs/client.md).
    #[command(after_help = LOCK_EXIT_STATUS)]
    Lock(LockArgs),
    /// Print the shell completion script for SHELL, made from this build's command line.
    ///
    /// bash: `fencelock completions bash > /etc/bash_completion.d/fencelock` (or
    /// `~/.local/share/bash-completion/completions/fencelock`); zsh: into a directory of
    /// `$fpath` as `_fencelock`; fish: `~/.config/fish/completions/fencelock.fish`.
    Completions {
        /// The shell the script is for.
        #[arg(value_enum)]
        shell: CompletionShell,
    },
    /// Print the manual page fencelock(1), made from this build's command line; with --dir,
    /// write it and a page for each subcommand (fencelock-lock(1), ...) into DIR instead.
    ///
    /// `fencelock man | man -l -` reads it; `fencelock man --dir /usr/local/share/man/man1`
    /// installs the pages.
    Man {
        /// A directory to write every page into, one file per command (`fencelock.1`,
        /// `fencelock-lock.1`, ...).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// The watchdog of a `fencelock lock` command's process group (started by it, never by
    /// hand): kills the group if `fencelock lock` dies.
    #[command(hide = true)]
    LockSentinel {
        /// The process group of `fencelock lock`, which the watchdog joins once CMD runs.
        join: i32,
    },
}

/// The shells `fencelock completions` writes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

impl From<CompletionShell> for clap_complete::Shell {
    fn from(shell: CompletionShell) -> Self {
        match shell {
            CompletionShell::Bash => Self::Bash,
            CompletionShell::Zsh => Self::Zsh,
            CompletionShell::Fish => Self::Fish,
        }
    }
}

/// The exit statuses of `fencelock lock`, at the end of its `--help`.
const LOCK_EXIT_STATUS: &str = "\
Exit status:
  CMD's own        CMD ended; 128+N if signal N ended it
  75               RESOURCE held by another owner for the whole wait (EX_TEMPFAIL)
  69               the lease server unreachable, unavailable, or refusing the request
  124              the lease was lost while CMD ran; CMD was stopped
  126, 127         CMD could not be run, or was not found
  2                bad arguments";

/// The lease server `fencelock lock` asks when neither `--url` nor `FENCELOCK_URL` is given.
pub(crate) const DEFAULT_LOCK_URL: &str = "http://127.0.0.1:8080";
/// The TTL `fencelock lock` asks for: renewed every 10 s, lost at most 30 s after its holder
/// stopped renewing.
pub(crate) const DEFAULT_LOCK_TTL_SECONDS: u32 = 30;
/// The longest CMD has between SIGTERM and SIGKILL when `--grace-seconds` is not given.
pub(crate) const DEFAULT_LOCK_GRACE_SECONDS: u32 = 10;

/// `fencelock lock RESOURCE [options] -- CMD ARGS...`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct LockArgs {
    /// The resource to lock, e.g. `job:42` (1-255 characters of `A-Z a-z 0-9 . _ - : @ + = ~`;
    /// the server checks).
    pub resource: String,

    /// The lease server's base URL.
    #[arg(long, env = "FENCELOCK_URL", default_value = DEFAULT_LOCK_URL)]
    pub url: String,

    /// The lease's time to live. It is renewed every third of it while CMD runs; if no renewal
    /// succeeds within it, CMD is stopped.
    #[arg(
        long,
        default_value_t = DEFAULT_LOCK_TTL_SECONDS,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(TTL_CEILING_SECONDS))
    )]
    pub ttl_seconds: u32,

    /// How long to wait for another holder to let RESOURCE go. The server does the waiting
    /// (first come, first served), in rounds of at most its `--max-wait-ms` each when the
    /// wait is longer. 0: one attempt, no waiting.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=86_400))]
    pub wait_seconds: u32,

    /// The bearer secret for a server with `--auth-file`.
    #[arg(long, env = "FENCELOCK_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// How long CMD's process group has between SIGTERM and SIGKILL once the lease is lost.
    /// SIGTERM comes when the server says the lease is gone, or when no renewal has been
    /// confirmed and only this long (at most a third of the TTL) is left before the lease's
    /// expiry less a safety margin. Unset: up to 10 s, and SIGKILL never later than that
    /// expiry less the margin (at once for a lease that is gone). Given: exactly SECONDS, even
    /// past the lease's expiry, which `fencelock lock` then says.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u32).range(0..=3600))]
    pub grace_seconds: Option<u32>,

    /// A PEM file of CA certificates to trust, beside the built-in roots, for an `https`
    /// server whose certificate a private CA issued (or a self-signed one).
    #[arg(long, env = "FENCELOCK_CACERT", value_name = "FILE")]
    pub cacert: Option<std::path::PathBuf>,

    /// The command to run, and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Print a fresh random secret (first line) and the `[[tokens]]` block to paste into the
    /// auth file (the rest). The secret is shown only this once; the file keeps its SHA-256.
    New {
        /// The token's name, as logs show it: 1-64 characters of `A-Z a-z 0-9 . _ - : @`.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum GuardCommand {
    /// Print the guard's SQL for DATABASE: idempotent (apply it again at will), and with
    /// --fence-key, the keys to install (exactly those: give the new and the old key to
    /// rotate). Without --fence-key the installed keys stay as they are.
    Sql {
        /// The database the SQL is for.
        #[arg(value_enum)]
        database: GuardDatabase,
    },
    /// Apply the PostgreSQL SQL of `guard sql postgres` to the database of --database-url
    /// (or DATABASE_URL), in one transaction, as the role that is to own the guard.
    Install,
}

/// The databases the guard's SQL is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum GuardDatabase {
    /// PostgreSQL 11 or later: schema `fencelock_guard`, `fencelock_guard.admit(key, token)`.
    Postgres,
    /// MySQL 8.0 or MariaDB 10.5 or later: `CALL fencelock_guard_admit(key, token)`, in the
    /// current database.
    Mysql,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// Address and port to listen on: `HOST:PORT`, where HOST is an IP address or a name
    /// (`localhost:8080`).
    #[arg(
        long,
        env = "FENCELOCK_BIND",
        default_value = DEFAULT_BIND,
        value_parser = resolve_bind,
        global = true
    )]
    pub bind: SocketAddr,

    /// Lease store: `postgres://user:pass@host/db` for PostgreSQL, `sqlite://PATH` for an
    /// embedded SQLite file. Unset: the SQLite file `fencelock.db` in the working directory.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    pub database_url: Option<String>,

    /// What stands between this server and PostgreSQL: `direct`, or a pooler (PgBouncer) in
    /// `session` or `transaction` pooling, as its pool_mode. Transaction pooling needs
    /// --listen-database-url.
    #[arg(long, env = "FENCELOCK_PG_POOLING", value_enum, default_value_t = Pooling::Direct, global = true)]
    pub pg_pooling: Pooling,

    /// Where the LISTEN session (waiting, watch) connects, if not to --database-url: a URL
    /// that reaches PostgreSQL around a pooler. Always direct.
    #[arg(
        long,
        env = "FENCELOCK_LISTEN_DATABASE_URL",
        hide_env_values = true,
        global = true
    )]
    pub listen_database_url: Option<String>,

    /// Largest `ttl_seconds` a client may ask for.
    #[arg(
        long,
        env = "FENCELOCK_MAX_TTL_SECONDS",
        default_value_t = DEFAULT_MAX_TTL_SECONDS,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(TTL_CEILING_SECONDS)),
        global = true
    )]
    pub max_ttl_seconds: u32,

    /// Largest `wait_ms` an acquisition may ask for: how long a request may wait in the
    /// queue of a held resource (holding its connection all along).
    #[arg(
        long,
        env = "FENCELOCK_MAX_WAIT_MS",
        default_value_t = DEFAULT_MAX_WAIT_MS,
        value_parser = clap::value_parser!(u32).range(0..=i64::from(WAIT_CEILING_MS)),
        global = true
    )]
    pub max_wait_ms: u32,

    /// Most PostgreSQL connections this instance opens.
    #[arg(
        long,
        env = "FENCELOCK_POOL_SIZE",
        default_value_t = DEFAULT_POOL_SIZE,
        value_parser = clap::value_parser!(u16).range(1..=1000),
        global = true
    )]
    pub pool_size: u16,

    /// Most lock requests PostgreSQL decides together in one statement and one commit (group
    /// commit); 1 decides each request alone.
    #[arg(
        long,
        env = "FENCELOCK_PG_BATCH_MAX",
        default_value_t = DEFAULT_PG_BATCH_MAX,
        value_parser = clap::value_parser!(u16).range(1..=1024),
        global = true
    )]
    pub pg_batch_max: u16,

    /// Log line format.
    #[arg(long, env = "FENCELOCK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    /// Expired leases are deleted this long after their expiry. Until then, renewing one
    /// answers `409 lease-expired` rather than `404`.
    #[arg(long, env = "FENCELOCK_PURGE_GRACE_SECONDS", default_value_t = DEFAULT_PURGE_GRACE_SECONDS, global = true)]
    pub purge_grace_seconds: u64,

    /// How often expired leases are purged.
    #[arg(
        long,
        env = "FENCELOCK_PURGE_INTERVAL_SECONDS",
        default_value_t = DEFAULT_PURGE_INTERVAL_SECONDS,
        value_parser = clap::value_parser!(u64).range(1..),
        global = true
    )]
    pub purge_interval_seconds: u64,

    /// The history of a resource's leases (`GET /locks/{resource}/history`) keeps a lease
    /// this long after it ended (released, or expired); the purge deletes it afterwards.
    #[arg(
        long,
        env = "FENCELOCK_HISTORY_RETENTION_SECONDS",
        default_value_t = DEFAULT_HISTORY_RETENTION_SECONDS,
        global = true
    )]
    pub history_retention_seconds: u64,

    /// Longest a request waits for the store before answering `503 store-unavailable`.
    #[arg(
        long,
        env = "FENCELOCK_STORE_TIMEOUT_MS",
        default_value_t = DEFAULT_STORE_TIMEOUT_MS,
        value_parser = clap::value_parser!(u64).range(1..),
        global = true
    )]
    pub store_timeout_ms: u64,

    /// Longest a client may take to send a request head, and then its body; a slower request
    /// is answered `408` and its connection closed. Idle keep-alive connections are closed
    /// after it too.
    #[arg(
        long,
        env = "FENCELOCK_REQUEST_TIMEOUT_MS",
        default_value_t = DEFAULT_REQUEST_TIMEOUT_MS,
        value_parser = clap::value_parser!(u64).range(1..),
        global = true
    )]
    pub request_timeout_ms: u64,

    /// Most open client connections, across all workers. Default: the open-file limit less a
    /// reserve for the store, logs and the listener; a value above that is refused at start.
    #[arg(
        long,
        env = "FENCELOCK_MAX_CONNECTIONS",
        value_parser = clap::value_parser!(u64).range(1..),
        global = true
    )]
    pub max_connections: Option<u64>,

    /// Most open connections from one client IP address; one more is closed at once. Default:
    /// a quarter of --max-connections, at least 64. 0: no cap (behind a proxy, every client
    /// is the proxy's address).
    #[arg(long, env = "FENCELOCK_MAX_CONNECTIONS_PER_PEER", global = true)]
    pub max_connections_per_peer: Option<u64>,

    /// Longest PostgreSQL migrations wait for a migration lock another session holds (logged
    /// with the holder; 503 meanwhile); start-up then stops. 0: one attempt.
    #[arg(
        long,
        env = "FENCELOCK_MIGRATION_LOCK_TIMEOUT_SECONDS",
        default_value_t = DEFAULT_MIGRATION_LOCK_TIMEOUT_SECONDS,
        value_parser = clap::value_parser!(u64).range(0..=86_400),
        global = true
    )]
    pub migration_lock_timeout_seconds: u64,

    /// How often live leases are counted for the `fencelock_live_leases` metric.
    #[arg(
        long,
        env = "FENCELOCK_LIVE_LEASES_INTERVAL_SECONDS",
        default_value_t = DEFAULT_LIVE_LEASES_INTERVAL_SECONDS,
        value_parser = clap::value_parser!(u64).range(1..=MAX_LIVE_LEASES_INTERVAL_SECONDS),
        global = true
    )]
    pub live_leases_interval_seconds: u64,

    /// TOML file of bearer tokens (by the SHA-256 of each secret): turns authentication on.
    /// Read again on SIGHUP.
    #[arg(long, env = "FENCELOCK_AUTH_FILE", global = true)]
    pub auth_file: Option<PathBuf>,

    /// Serve without tokens on an address other than loopback (refused otherwise).
    #[arg(
        long,
        env = "FENCELOCK_ALLOW_UNAUTHENTICATED",
        value_parser = clap::builder::FalseyValueParser::new(),
        global = true
    )]
    pub allow_unauthenticated: bool,
    /// Serve HTTPS with this PEM certificate chain (the server's certificate first); needs
    /// `--tls-key`.
    #[arg(long, env = "FENCELOCK_TLS_CERT", value_name = "PEM", global = true)]
    pub tls_cert: Option<PathBuf>,

    /// The PEM private key of `--tls-cert`.
    #[arg(long, env = "FENCELOCK_TLS_KEY", value_name = "PEM", global = true)]
    pub tls_key: Option<PathBuf>,
    /// A file of at least 32 secret bytes that signs every fence given to a holder: lock
    /// objects then carry `fence_token`, which guards with the same key require. Once to the
    /// server; `guard sql` and `guard install` take it again for each key to install.
    #[arg(long, env = "FENCELOCK_FENCE_KEY", value_name = "FILE", global = true, action = clap::ArgAction::Append)]
    pub fence_key: Vec<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `HOST:PORT` to the address to listen on. A name is resolved once, at start; of its
/// addresses the first IPv4 one is taken (a name such as `localhost` usually has an IPv4 and
/// an IPv6 address, and clients try both).
fn resolve_bind(text: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs as _;
    if let Ok(address) = text.parse() {
        return Ok(address);
    }
    let addresses: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| format!("{text:?} is not HOST:PORT with a host that resolves: {e}"))?
        .collect();
    addresses
        .iter()
        .find(|a| a.is_ipv4())
        .or(addresses.first())
        .copied()
        .ok_or_else(|| format!("{text:?} resolves to no address"))
}

/// Everything the server needs, validated.
#[derive(Clone)]
pub struct Settings {
    pub bind: SocketAddr,
    pub store: StoreConfig,
    pub max_ttl: Ttl,
    /// The largest `wait_ms`.
    pub max_wait_ms: u32,
    pub pool_size: usize,
    /// Most requests in one PostgreSQL batch (group commit); 1: none are batched.
    pub pg_batch_max: usize,
    pub log_format: LogFormat,
    pub purge_grace: Duration,
    pub purge_interval: Duration,
    /// How long the history keeps a lease after it ended.
    pub history_retention: Duration,
    pub store_timeout: Duration,
    pub request_timeout: Duration,
    /// `None`: derived from the open-file limit at start (see `startup`).
    pub max_connections: Option<u64>,
    /// Most connections of one client IP address: `None`, derived from the total cap (see
    /// `startup`); `Some(0)`: no cap.
    pub max_connections_per_peer: Option<u64>,
    /// Longest PostgreSQL migrations wait for another session's migration lock.
    pub migration_lock_timeout: Duration,
    /// How often the `fencelock_live_leases` gauge is sampled.
    pub live_leases_interval: Duration,
    /// The bearer tokens, when `--auth-file` is given; `None`: nothing is checked.
    pub auth: Option<Arc<Auth>>,
    /// Serve without tokens on a non-loopback address.
    pub allow_unauthenticated: bool,
    /// `Some`: serve HTTPS with this configuration (read from `--tls-cert`/`--tls-key`).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Signs the `fence_token` of lock objects; `None`: no `fence_token`.
    pub fence_key: Option<FenceKey>,
}

impl Settings {
    /// How the store is used on the request path.
    pub fn store_options(&self) -> StoreOptions {
        StoreOptions {
            pool_size: self.pool_size,
            timeout: self.store_timeout,
            batch_max: self.pg_batch_max,
            migration_lock_timeout: self.migration_lock_timeout,
        }
    }

    pub fn from_args(args: &ServerArgs) -> anyhow::Result<Self> {
        Ok(Self {
            bind: args.bind,
            store: StoreConfig::from_url(args.database_url.as_deref())?
                .with_pooling(args.pg_pooling, args.listen_database_url.as_deref())?,
            max_ttl: Ttl::max(args.max_ttl_seconds)
                .ok_or_else(|| anyhow::anyhow!("--max-ttl-seconds is out of range"))?,
            max_wait_ms: args.max_wait_ms,
            pool_size: usize::from(args.pool_size),
            pg_batch_max: usize::from(args.pg_batch_max),
            log_format: args.log_format,
            purge_grace: Duration::from_secs(args.purge_grace_seconds),
            purge_interval: Duration::from_secs(args.purge_interval_seconds),
            history_retention: Duration::from_secs(args.history_retention_seconds),
            store_timeout: Duration::from_millis(args.store_timeout_ms),
            request_timeout: Duration::from_millis(args.request_timeout_ms),
            max_connections: args.max_connections,
            max_connections_per_peer: args.max_connections_per_peer,
            migration_lock_timeout: Duration::from_secs(args.migration_lock_timeout_seconds),
            live_leases_interval: Duration::from_secs(args.live_leases_interval_seconds),
            auth: args
                .auth_file
                .as_deref()
                .map(Auth::load)
                .transpose()?
                .map(Arc::new),
            allow_unauthenticated: args.allow_unauthenticated,
            tls: match (&args.tls_cert, &args.tls_key) {
                (Some(cert), Some(key)) => Some(Arc::new(crate::tls::server_config(cert, key)?)),
                (None, None) => None,
                _ => anyhow::bail!(
                    "--tls-cert and --tls-key go together: give both to serve HTTPS, or neither"
                ),
            },
            fence_key: match args.fence_key.as_slice() {
                [] => None,
                [path] => Some(FenceKey::read(path).context("--fence-key")?),
                _ => anyhow::bail!(
                    "--fence-key: the server signs with one key; give it once (guards take several: `fencelock guard sql`)"
                ),
            },
        })
    }

    /// The flags' defaults with the given store; for tests and embedders that build the
    /// app without a command line (and without reading the environment).
    pub fn for_store(store: StoreConfig) -> Self {
        Self {
            bind: DEFAULT_BIND.parse().expect("the default address parses"),
            store,
            max_ttl: Ttl::max(DEFAULT_MAX_TTL_SECONDS).expect("the default is in range"),
            max_wait_ms: DEFAULT_MAX_WAIT_MS,
            pool_size: usize::from(DEFAULT_POOL_SIZE),
            pg_batch_max: usize::from(DEFAULT_PG_BATCH_MAX),
            log_format: LogFormat::Text,
            purge_grace: Duration::from_secs(DEFAULT_PURGE_GRACE_SECONDS),
            purge_interval: Duration::from_secs(DEFAULT_PURGE_INTERVAL_SECONDS),
            history_retention: Duration::from_secs(DEFAULT_HISTORY_RETENTION_SECONDS),
            store_timeout: Duration::from_millis(DEFAULT_STORE_TIMEOUT_MS),
            request_timeout: Duration::from_millis(DEFAULT_REQUEST_TIMEOUT_MS),
            max_connections: None,
            max_connections_per_peer: None,
            migration_lock_timeout: Duration::from_secs(DEFAULT_MIGRATION_LOCK_TIMEOUT_SECONDS),
            live_leases_interval: Duration::from_secs(DEFAULT_LIVE_LEASES_INTERVAL_SECONDS),
            auth: None,
            allow_unauthenticated: false,
            tls: None,
            fence_key: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_takes_addresses_and_names() {
        assert_eq!(
            resolve_bind("127.0.0.1:8080").unwrap(),
            "127.0.0.1:8080".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(
            resolve_bind("[::1]:0").unwrap(),
            "[::1]:0".parse::<SocketAddr>().unwrap()
        );
        let local = resolve_bind("localhost:8080").unwrap();
        assert!(local.ip().is_loopback() && local.port() == 8080, "{local}");
        assert!(resolve_bind("nope").is_err());
        assert!(resolve_bind("localhost").is_err());
        assert!(resolve_bind("localhost:http-alt").is_err());
    }
}
