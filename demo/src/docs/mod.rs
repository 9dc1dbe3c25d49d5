//! The demo's documents: a value per key, written only through the write guard.
//!
//! Every write attempt is logged with its fence and outcome, applied or rejected, so that a
//! rejected late write stays visible after the fact.

mod postgres;
mod sqlite;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use fencelock::config::{DEFAULT_POOL_SIZE, DEFAULT_STORE_TIMEOUT_MS, StoreConfig};
use fencelock::domain::{Fence, ResourceName};
use fencelock::store::StoreError;
use serde::Serialize;
use serde_json::Value;

/// The SQLite file used when no database URL is given.
pub const DEFAULT_SQLITE_FILE: &str = "fencelock-demo.db";

/// How the demo store uses its database; the lease server's settings, with its defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreSettings {
    /// Most PostgreSQL connections (`--pool-size`).
    pub pool_size: usize,
    /// Longest a request waits for the store before answering `503 store-unavailable`; also
    /// PostgreSQL's `statement_timeout` (`--store-timeout-ms`).
    pub store_timeout: Duration,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            pool_size: usize::from(DEFAULT_POOL_SIZE),
            store_timeout: Duration::from_millis(DEFAULT_STORE_TIMEOUT_MS),
        }
    }
}

/// Whether writes go through the fence check. `Off` exists only to show the damage fencing
/// prevents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guarding {
    On,
    Off,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Doc {
    pub key: String,
    pub value: Value,
    /// The fence of the write that set this value.
    pub fence: i64,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Applied,
    Rejected,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Rejected => "rejected",
        }
    }

    fn parse(text: &str) -> Result<Self, StoreError> {
        match text {
            "applied" => Ok(Self::Applied),
            "rejected" => Ok(Self::Rejected),
            other => Err(StoreError::Internal(anyhow::anyhow!(
                "unknown write outcome {other:?}"
            ))),
        }
    }
}

/// One write attempt, as the log keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteRecord {
    pub fence: i64,
    pub outcome: Outcome,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Put {
    Applied(Doc),
    /// A greater fence has written already; nothing was written.
    Stale {
        current: Fence,
    },
}

/// The documents. Errors are the lease store's: `Unavailable` (the database cannot answer
/// now: `503`) or `Internal` (a bug or a broken schema: `500`), never an outcome.
#[async_trait]
pub trait DocStore: Send + Sync + 'static {
    /// Writes `value` under `key` if the guard admits `fence`, and logs the attempt; both in
    /// one transaction.
    async fn put(&self, key: &ResourceName, value: &Value, fence: Fence)
    -> Result<Put, StoreError>;
    async fn get(&self, key: &ResourceName) -> Result<Option<Doc>, StoreError>;
    /// Every write attempt on `key`, oldest first.
    async fn writes(&self, key: &ResourceName) -> Result<Vec<WriteRecord>, StoreError>;
}

/// A stored value the store cannot read back: a bug or a damaged row, never an outage.
fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Internal(anyhow::anyhow!("stored {what}: {e}"))
}

pub type SharedDocs = Arc<dyn DocStore>;

/// Opens the store a URL names: unset → [`DEFAULT_SQLITE_FILE`], `sqlite://PATH`, or
/// `postgres://...`, as the lease server reads its own `DATABASE_URL`.
///
/// Like the lease server, an unreachable PostgreSQL is not fatal: the store starts, answers
/// `503 store-unavailable` until the database answers, and creates its tables on first
/// contact. A SQLite file that cannot be opened is fatal, since nothing would change by
/// waiting.
pub async fn open(
    url: Option<&str>,
    guarding: Guarding,
    settings: StoreSettings,
) -> anyhow::Result<SharedDocs> {
    let config = match url.map(str::trim).filter(|u| !u.is_empty()) {
        None => StoreConfig::Sqlite(PathBuf::from(DEFAULT_SQLITE_FILE)),
        Some(url) => StoreConfig::from_url(Some(url))?,
    };
    Ok(match config {
        StoreConfig::Postgres(pg) => {
            Arc::new(postgres::PgDocs::open(&pg, guarding, settings).await?)
        }
        StoreConfig::Sqlite(path) => {
            let docs =
                tokio::task::spawn_blocking(move || sqlite::SqliteDocs::open(&path, guarding))
                    .await??;
            Arc::new(docs)
        }
    })
}
