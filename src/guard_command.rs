//! `fencelock guard sql postgres|mysql [--fence-key FILE]...` and `fencelock guard install
//! --database-url URL [--fence-key FILE]...`: the write guard for a protected service's own
//! database, which a service in any language calls in its write transaction (see
//! [`fencelock::guard::sql`], where the SQL and its rules are).
//!
//! Each `--fence-key` names a key to install; together they are the installed keys from then
//! on. Without one, the installed keys stay as they are. Everything `fencelock guard` says
//! besides the SQL is one line on stderr, prefixed `fencelock guard:`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use fencelock::domain::{FenceKey, FenceKeys};
use fencelock::guard::sql;

use crate::config::{GuardCommand, GuardDatabase, ServerArgs};
use crate::store::StoreConfig;
use crate::store::postgres;

/// Runs `command` with the keys and database of `args`.
pub(crate) fn main(command: &GuardCommand, args: &ServerArgs) -> ExitCode {
    let keys = match read_keys(&args.fence_key) {
        Ok(keys) => keys,
        Err(e) => {
            eprintln!("fencelock guard: {e:#}");
            return ExitCode::from(2);
        }
    };
    match command {
        GuardCommand::Sql { database } => {
            print!("{}", script(*database, &keys));
            ExitCode::SUCCESS
        }
        GuardCommand::Install => {
            let timeout = Duration::from_millis(args.store_timeout_ms);
            let installed = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting a runtime")
                .and_then(|runtime| {
                    runtime.block_on(install(args.database_url.as_deref(), &keys, timeout))
                });
            match installed {
                Ok(database) => {
                    let keys = match args.fence_key.len() {
                        0 => "the installed fence keys, if any, left as they were".to_owned(),
                        n => format!("{n} fence key(s) installed, and no other"),
                    };
                    eprintln!("fencelock guard: installed into {database}; {keys}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    // One line, whatever the cause's own text holds.
                    eprintln!("fencelock guard: {}", format!("{e:#}").replace('\n', "; "));
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn script(database: GuardDatabase, keys: &FenceKeys) -> String {
    match database {
        GuardDatabase::Postgres => sql::postgres(keys),
        GuardDatabase::Mysql => sql::mysql(keys),
    }
}

fn read_keys(files: &[PathBuf]) -> anyhow::Result<FenceKeys> {
    let keys = files
        .iter()
        .map(|path| FenceKey::read(path).context("--fence-key"))
        .collect::<anyhow::Result<_>>()?;
    Ok(FenceKeys::new(keys))
}

/// Applies the PostgreSQL script to the database `url` names, in one transaction; answers
/// the database's URL without its password.
async fn install(url: Option<&str>, keys: &FenceKeys, timeout: Duration) -> anyhow::Result<String> {
    let url = url.map(str::trim).filter(|u| !u.is_empty()).context(
        "guard install needs the PostgreSQL database: --database-url URL (or DATABASE_URL)",
    )?;
    let StoreConfig::Postgres(pg) = StoreConfig::parse(url)? else {
        anyhow::bail!(
            "guard install applies the guard to PostgreSQL; for MySQL or MariaDB, apply `fencelock guard sql mysql` with their client"
        );
    };
    let pool = postgres::pool(&pg, 1, timeout)?;
    // Sorted as the server sorts it: a pool error's text repeats its cause's, which
    // anyhow's chain would print twice.
    let client = pool
        .get()
        .await
        .map_err(postgres::classify_pool)
        .with_context(|| format!("connecting to {}", pg.redacted_url))?;
    client
        .batch_execute(&sql::postgres(keys))
        .await
        .map_err(postgres::classify)
        .with_context(|| format!("installing the guard into {}", pg.redacted_url))?;
    Ok(pg.redacted_url.clone())
}
