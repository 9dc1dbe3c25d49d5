//! Which store to open, and how: parsed from `DATABASE_URL` and the pool settings, owned by
//! the store so that every service that opens one (the lease server, the demo store) reads
//! the same URL the same way.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

use super::postgres::{PgConfig, Pooling};

/// The SQLite file the lease server uses when no database URL is given.
pub(super) const DEFAULT_SQLITE_FILE: &str = "fencelock.db";
pub const DEFAULT_POOL_SIZE: u16 = 16;
pub const DEFAULT_STORE_TIMEOUT_MS: u64 = 5000;
pub(crate) const DEFAULT_PG_BATCH_MAX: u16 = 64;
/// How long a migration waits for another session's migration lock by default: far longer
/// than migrating takes (a fresh database: well under a second), far shorter than an
/// operator would wait for a start that says nothing.
pub(crate) const DEFAULT_MIGRATION_LOCK_TIMEOUT_SECONDS: u64 = 60;

/// Which store to open.
#[derive(Clone)]
pub enum StoreConfig {
    Postgres(Box<PgConfig>),
    Sqlite(PathBuf),
}

impl StoreConfig {
    /// `None` (or empty) → the SQLite file [`DEFAULT_SQLITE_FILE`]; otherwise as [`parse`].
    ///
    /// [`parse`]: Self::parse
    pub fn from_url(url: Option<&str>) -> anyhow::Result<Self> {
        match url.map(str::trim).filter(|u| !u.is_empty()) {
            None => Ok(Self::Sqlite(PathBuf::from(DEFAULT_SQLITE_FILE))),
            Some(url) => Self::parse(url),
        }
    }

    /// `sqlite://PATH`, `postgres://` / `postgresql://`, or a PostgreSQL key-value connection
    /// string (`host=a,b port=5432,5433 dbname=x target_session_attrs=read-write`);
    /// anything else is refused.
    pub fn parse(url: &str) -> anyhow::Result<Self> {
        let url = url.trim();
        if let Some(path) = url.strip_prefix("sqlite://") {
            if path.is_empty() {
                anyhow::bail!(
                    "DATABASE_URL: sqlite:// needs a file path, e.g. sqlite://fencelock.db"
                );
            }
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        if url.starts_with("postgres://")
            || url.starts_with("postgresql://")
            || super::postgres::conninfo::is_key_value(url)
        {
            return Ok(Self::Postgres(Box::new(PgConfig::parse(url)?)));
        }
        let scheme = url.split_once(':').map_or(url, |(s, _)| s);
        anyhow::bail!(
            "DATABASE_URL: unsupported scheme {scheme:?}; use postgres://... or sqlite://PATH"
        )
    }
}

impl StoreConfig {
    /// `pooling` (`--pg-pooling`) and the LISTEN session's own URL (`--listen-database-url`),
    /// which a SQLite store refuses unless they are the defaults.
    pub fn with_pooling(self, pooling: Pooling, listen_url: Option<&str>) -> anyhow::Result<Self> {
        let listen_url = listen_url.map(str::trim).filter(|u| !u.is_empty());
        match self {
            Self::Postgres(mut pg) => {
                pg.pooling = pooling;
                if let Some(url) = listen_url {
                    if !(url.starts_with("postgres://")
                        || url.starts_with("postgresql://")
                        || super::postgres::conninfo::is_key_value(url))
                    {
                        anyhow::bail!(
                            "--listen-database-url: a PostgreSQL URL (postgres://...) to PostgreSQL itself"
                        );
                    }
                    let listen = PgConfig::parse(url).context("--listen-database-url")?;
                    pg.listen = Some(Box::new(listen));
                }
                Ok(Self::Postgres(pg))
            }
            Self::Sqlite(_) if pooling != Pooling::Direct || listen_url.is_some() => anyhow::bail!(
                "--pg-pooling and --listen-database-url are for PostgreSQL; this DATABASE_URL is SQLite"
            ),
            sqlite => Ok(sqlite),
        }
    }
}

/// How a store is used on the request path.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    /// Most PostgreSQL connections one process opens.
    pub pool_size: usize,
    /// Longest a request waits for the store; also PostgreSQL's `statement_timeout`.
    pub timeout: Duration,
    /// Most requests PostgreSQL decides in one statement and commit (group commit); 1: each
    /// request alone.
    pub batch_max: usize,
    /// Longest PostgreSQL migrations wait for another session's migration lock.
    pub migration_lock_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            pool_size: usize::from(DEFAULT_POOL_SIZE),
            timeout: Duration::from_millis(DEFAULT_STORE_TIMEOUT_MS),
            batch_max: usize::from(DEFAULT_PG_BATCH_MAX),
            migration_lock_timeout: Duration::from_secs(DEFAULT_MIGRATION_LOCK_TIMEOUT_SECONDS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_is_chosen_by_url() {
        assert!(matches!(
            StoreConfig::from_url(None).unwrap(),
            StoreConfig::Sqlite(p) if p.as_path() == std::path::Path::new("fencelock.db")
        ));
        assert!(matches!(
            StoreConfig::from_url(Some("")).unwrap(),
            StoreConfig::Sqlite(_)
        ));
        assert!(matches!(
            StoreConfig::from_url(Some("sqlite:///tmp/x.db")).unwrap(),
            StoreConfig::Sqlite(p) if p.as_path() == std::path::Path::new("/tmp/x.db")
        ));
        assert!(matches!(
            StoreConfig::from_url(Some("postgres://u@localhost/db")).unwrap(),
            StoreConfig::Postgres(_)
        ));
        assert!(matches!(
            StoreConfig::from_url(Some(
                "host=a,b port=5432,5433 dbname=x target_session_attrs=read-write"
            ))
            .unwrap(),
            StoreConfig::Postgres(_)
        ));
        assert!(StoreConfig::from_url(Some("mysql://x")).is_err());
        assert!(StoreConfig::from_url(Some("sqlite://")).is_err());
    }
}
