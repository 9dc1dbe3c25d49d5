//! The demo's documents: a value per key, written only through the write guard.
//!
//! Every write attempt is logged with its fence and outcome, applied or rejected, so that a
//! rejected late write stays visible after the fact.

mod postgres;
mod sqlite;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use fencelock::config::StoreConfig;
use fencelock::domain::{Fence, ResourceName};
use serde::Serialize;
use serde_json::Value;

/// The SQLite file used when no database URL is given.
pub const DEFAULT_SQLITE_FILE: &str = "fencelock-demo.db";

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

    fn parse(text: &str) -> anyhow::Result<Self> {
        match text {
            "applied" => Ok(Self::Applied),
            "rejected" => Ok(Self::Rejected),
            other => anyhow::bail!("unknown write outcome {other:?}"),
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

#[async_trait]
pub trait DocStore: Send + Sync + 'static {
    /// Writes `value` under `key` if the guard admits `fence`, and logs the attempt; both in
    /// one transaction.
    async fn put(&self, key: &ResourceName, value: &Value, fence: Fence) -> anyhow::Result<Put>;
    async fn get(&self, key: &ResourceName) -> anyhow::Result<Option<Doc>>;
    /// Every write attempt on `key`, oldest first.
    async fn writes(&self, key: &ResourceName) -> anyhow::Result<Vec<WriteRecord>>;
}

pub type SharedDocs = Arc<dyn DocStore>;

/// Opens the store a URL names: unset → [`DEFAULT_SQLITE_FILE`], `sqlite://PATH`, or
/// `postgres://...`, as the lease server reads its own `DATABASE_URL`.
pub async fn open(url: Option<&str>, guarding: Guarding) -> anyhow::Result<SharedDocs> {
    let config = match url.map(str::trim).filter(|u| !u.is_empty()) {
        None => StoreConfig::Sqlite(PathBuf::from(DEFAULT_SQLITE_FILE)),
        Some(url) => StoreConfig::from_url(Some(url))?,
    };
    Ok(match config {
        StoreConfig::Postgres(pg) => Arc::new(postgres::PgDocs::open(*pg, guarding).await?),
        StoreConfig::Sqlite(path) => {
            let docs =
                tokio::task::spawn_blocking(move || sqlite::SqliteDocs::open(&path, guarding))
                    .await??;
            Arc::new(docs)
        }
    })
}
