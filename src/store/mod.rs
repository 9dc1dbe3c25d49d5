//! Lease stores. Both keep the same contract, decided in one atomic step each:
//!
//! - [`postgres::PgStore`] for production: any number of stateless server instances share one
//!   database; the database clock (`now()`) decides expiry; fences come from a sequence.
//! - [`sqlite::SqliteStore`], the embedded default: one file, a fence counter row, and the
//!   server process's clock.

pub mod postgres;
pub mod sqlite;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::config::{Settings, StoreConfig};
use crate::domain::{
    AcquireOutcome, AcquireRequest, Lease, ReleaseOutcome, ReleaseRequest, RenewOutcome,
    RenewRequest, ResourceName,
};

/// The store could not answer. Never used for an answer such as "held by another owner".
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Unreachable, timed out, or busy: the outcome is unknown and a retry may succeed.
    #[error("store unavailable: {0:#}")]
    Unavailable(anyhow::Error),
    /// A bug or a broken schema: retrying will not help.
    #[error("store error: {0:#}")]
    Internal(anyhow::Error),
}

impl StoreError {
    pub fn unavailable(message: impl std::fmt::Display) -> Self {
        Self::Unavailable(anyhow::anyhow!("{message}"))
    }
}

/// One lease store. Every method is a single atomic step in the store: there is no
/// read-then-write window between deciding and writing.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Takes the lease if there is no live lease of another owner; always issues a new fence.
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, StoreError>;

    /// The live lease of `resource`, if any. Expired leases are absent.
    async fn inspect(&self, resource: &ResourceName) -> Result<Option<Lease>, StoreError>;

    /// Extends the caller's live lease to now + ttl, keeping its fence.
    async fn renew(&self, req: &RenewRequest) -> Result<RenewOutcome, StoreError>;

    /// Deletes the caller's live lease. The fence counter is never lowered.
    async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseOutcome, StoreError>;

    /// Deletes leases that expired more than `grace` ago; returns how many.
    async fn purge_expired(&self, grace: Duration) -> Result<u64, StoreError>;

    /// Succeeds when the store answers a trivial query (readiness).
    async fn ping(&self) -> Result<(), StoreError>;

    /// What the store is and where, for logs; never contains a password.
    fn describe(&self) -> String;
}

pub type SharedStore = Arc<dyn LeaseStore>;

/// Opens the store the configuration names and applies its migrations.
///
/// An unreachable PostgreSQL is not fatal here: the server starts, answers `503` and `/readyz`
/// stays `503` until the database answers, then migrates on first use. A SQLite file that
/// cannot be opened is fatal, since nothing would change by waiting.
pub async fn open(settings: &Settings) -> anyhow::Result<SharedStore> {
    match &settings.store {
        StoreConfig::Postgres(pg) => {
            let store = postgres::PgStore::connect(
                (**pg).clone(),
                settings.pool_size,
                settings.store_timeout,
            )?;
            if let Err(e) = store.ensure_schema().await {
                tracing::warn!(error = %e, "PostgreSQL is not available yet; serving 503 until it is");
            }
            Ok(Arc::new(store))
        }
        StoreConfig::Sqlite(path) => {
            let path = path.clone();
            let store =
                tokio::task::spawn_blocking(move || sqlite::SqliteStore::open(&path)).await??;
            Ok(Arc::new(store))
        }
    }
}
