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
use fencelock::domain::{Fence, ResourceName};
use fencelock::guard::{CheckedFence, Guard};
use fencelock_server::StoreError;
use fencelock_server::{StoreConfig, StoreOptions};
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
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
    /// The entry's place in the log: increasing with every attempt, on every key. Pages of a
    /// key's log are read after an id ([`Page::after`]).
    pub id: i64,
    pub fence: i64,
    pub outcome: Outcome,
    pub at: DateTime<Utc>,
}

/// How many write-log entries a page holds when the caller does not say.
pub const DEFAULT_PAGE_LIMIT: u32 = 100;
/// The most write-log entries one page may hold.
pub const MAX_PAGE_LIMIT: u32 = 1000;

/// Which part of a key's write log to read: the entries with an id greater than `after`
/// (`0`: from the start), oldest first, at most `limit` (1..=[`MAX_PAGE_LIMIT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    pub after: i64,
    pub limit: u32,
}

impl Default for Page {
    /// The first page, of the default size.
    fn default() -> Self {
        Self {
            after: 0,
            limit: DEFAULT_PAGE_LIMIT,
        }
    }
}

/// One page of a key's write log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WritesPage {
    pub writes: Vec<WriteRecord>,
    /// The `after` of the next page; `None` on the last page.
    pub next: Option<i64>,
}

impl WritesPage {
    /// The store reads one entry more than the page holds: it only tells whether another
    /// page follows, so the last page is known as such without reading an empty one.
    fn rows_to_read(page: Page) -> i64 {
        i64::from(page.limit) + 1
    }

    /// From the entries read with [`Self::rows_to_read`], in id order.
    fn from_rows(mut writes: Vec<WriteRecord>, page: Page) -> Self {
        let limit = usize::try_from(page.limit).unwrap_or(usize::MAX);
        let next = if writes.len() > limit {
            writes.truncate(limit);
            writes.last().map(|w| w.id)
        } else {
            None
        };
        Self { writes, next }
    }
}

/// A write attempt: `value` for `key`, by the holder of the lease with `fence` (which the
/// guard checked for `key`).
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub key: ResourceName,
    pub value: Value,
    pub fence: CheckedFence,
}

impl Write {
    /// The answer to this write once the guard admitted it and the store wrote it at
    /// `updated_at`.
    fn applied(&self, updated_at: DateTime<Utc>) -> Put {
        Put::Applied(Doc {
            key: self.key.to_string(),
            value: self.value.clone(),
            fence: self.fence.fence().get(),
            updated_at,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Put {
    Applied(Doc),
    /// A greater fence has written already; nothing was written.
    Stale {
        current: Fence,
    },
}

impl Put {
    /// What the write log records for this answer.
    fn outcome(&self) -> Outcome {
        match self {
            Self::Applied(_) => Outcome::Applied,
            Self::Stale { .. } => Outcome::Rejected,
        }
    }
}

/// The documents. Errors are the lease store's: `Unavailable` (the database cannot answer
/// now: `503`) or `Internal` (a bug or a broken schema: `500`), never an outcome.
#[async_trait]
pub trait DocStore: Send + Sync + 'static {
    /// Writes the value under its key if the guard admits the write's fence, and logs the
    /// attempt; both in one transaction.
    async fn put(&self, write: &Write) -> Result<Put, StoreError>;
    async fn get(&self, key: &ResourceName) -> Result<Option<Doc>, StoreError>;
    /// One page of the write attempts on `key`, oldest first; index-backed by
    /// `(key, id)`, so a page costs the same however long the log is.
    async fn writes(&self, key: &ResourceName, page: Page) -> Result<WritesPage, StoreError>;
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
///
/// The guard counts its decisions in `guard`'s metrics, in the registry the store's
/// `GET /metrics` serves (see [`crate::app::DemoServer::build`]).
pub async fn open(
    url: Option<&str>,
    guarding: Guarding,
    settings: StoreOptions,
    guard: &Guard,
) -> anyhow::Result<SharedDocs> {
    let guard = guard.metrics().clone();
    let config = match url.map(str::trim).filter(|u| !u.is_empty()) {
        None => StoreConfig::Sqlite(PathBuf::from(DEFAULT_SQLITE_FILE)),
        Some(url) => StoreConfig::parse(url)?,
    };
    Ok(match config {
        StoreConfig::Postgres(pg) => {
            Arc::new(postgres::PgDocs::open(&pg, guarding, settings, guard).await?)
        }
        StoreConfig::Sqlite(path) => {
            let docs = tokio::task::spawn_blocking(move || {
                sqlite::SqliteDocs::open(&path, guarding, guard)
            })
            .await??;
            Arc::new(docs)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(ids: std::ops::RangeInclusive<i64>) -> Vec<WriteRecord> {
        ids.map(|id| WriteRecord {
            id,
            fence: id,
            outcome: Outcome::Applied,
            at: DateTime::UNIX_EPOCH,
        })
        .collect()
    }

    #[test]
    fn a_page_says_where_the_next_begins_and_the_last_says_none() {
        let page = Page { after: 0, limit: 3 };
        assert_eq!(WritesPage::rows_to_read(page), 4);
        let full = WritesPage::from_rows(rows(1..=4), page);
        assert_eq!(full.writes, rows(1..=3));
        assert_eq!(full.next, Some(3));
        let last = WritesPage::from_rows(rows(4..=6), page);
        assert_eq!((last.writes.len(), last.next), (3, None));
        let empty = WritesPage::from_rows(Vec::new(), page);
        assert_eq!((empty.writes.len(), empty.next), (0, None));
    }
}
