use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use fencelock::domain::ResourceName;
use fencelock::guard::{self, Admission, GuardMetrics};
use fencelock_server::StoreError;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::{Doc, DocStore, Guarding, Outcome, Page, Put, Write, WriteRecord, WritesPage};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS docs (
    key        TEXT    NOT NULL PRIMARY KEY,
    value      TEXT    NOT NULL,
    fence      INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS doc_writes (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    key     TEXT    NOT NULL,
    fence   INTEGER NOT NULL,
    outcome TEXT    NOT NULL CHECK (outcome IN ('applied', 'rejected')),
    at      INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS doc_writes_key_id_idx ON doc_writes (key, id);";

/// One connection behind a mutex, used only from blocking threads: plenty for a demo.
pub struct SqliteDocs {
    conn: Arc<Mutex<Connection>>,
    guarding: Guarding,
    guard: GuardMetrics,
}

impl SqliteDocs {
    pub fn open(path: &Path, guarding: Guarding, guard: GuardMetrics) -> anyhow::Result<Self> {
        let conn = fencelock_server::sqlite::connect(path)?;
        conn.execute_batch(guard::sqlite::SCHEMA)?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            guarding,
            guard,
        })
    }

    /// Runs `work` on a blocking thread. Its errors are sorted here, once: SQLite's own by
    /// result code as the lease store sorts them (busy, I/O, disk full: `503`), anything else
    /// (a value that does not read back, a poisoned lock) as internal.
    async fn with<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> anyhow::Result<T> + Send + 'static,
    {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = conn
                .lock()
                .map_err(|_| anyhow::anyhow!("the SQLite connection was poisoned"))?;
            work(&mut conn)
        })
        .await
        .map_err(|e| StoreError::Internal(e.into()))?
        .map_err(classify)
    }
}

fn classify(e: anyhow::Error) -> StoreError {
    match e.downcast::<rusqlite::Error>() {
        Ok(e) => fencelock_server::sqlite::classify(e),
        Err(e) => StoreError::Internal(e),
    }
}

fn time(ms: i64) -> anyhow::Result<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms).context("stored time out of range")
}

#[async_trait]
impl DocStore for SqliteDocs {
    async fn put(&self, write: &Write) -> Result<Put, StoreError> {
        let (write, guarding, guard) = (write.clone(), self.guarding, self.guard.clone());
        self.with(move |conn| {
            let (key, fence) = (write.key.as_str(), write.fence.fence());
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let admission = match guarding {
                Guarding::On => guard::sqlite::admit(&tx, &write.fence, &guard)?,
                Guarding::Off => Admission::Admitted,
            };
            let now = Utc::now().timestamp_millis();
            let put = match admission {
                Admission::Admitted => {
                    tx.execute(
                        "INSERT INTO docs (key, value, fence, updated_at) VALUES (?1, ?2, ?3, ?4)
                         ON CONFLICT (key) DO UPDATE SET
                             value = excluded.value, fence = excluded.fence, updated_at = excluded.updated_at",
                        params![key, write.value.to_string(), fence.get(), now],
                    )?;
                    write.applied(time(now)?)
                }
                Admission::Stale { current } => Put::Stale { current },
            };
            tx.execute(
                "INSERT INTO doc_writes (key, fence, outcome, at) VALUES (?1, ?2, ?3, ?4)",
                params![key, fence.get(), put.outcome().as_str(), now],
            )?;
            tx.commit()?;
            Ok(put)
        })
        .await
    }

    async fn get(&self, key: &ResourceName) -> Result<Option<Doc>, StoreError> {
        let key = key.to_string();
        self.with(move |conn| {
            let row = conn
                .query_row(
                    "SELECT value, fence, updated_at FROM docs WHERE key = ?1",
                    [&key],
                    |r| Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()?;
            row.map(|(value, fence, updated_at)| {
                Ok(Doc {
                    key: key.clone(),
                    value: serde_json::from_str(&value)?,
                    fence,
                    updated_at: time(updated_at)?,
                })
            })
            .transpose()
        })
        .await
    }

    async fn writes(&self, key: &ResourceName, page: Page) -> Result<WritesPage, StoreError> {
        let key = key.to_string();
        let writes = self
            .with(move |conn| {
                let mut statement = conn.prepare_cached(
                    "SELECT id, fence, outcome, at FROM doc_writes
                     WHERE key = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
                )?;
                let rows = statement.query_map(
                    params![key, page.after, WritesPage::rows_to_read(page)],
                    |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, String>(2)?,
                            r.get::<_, i64>(3)?,
                        ))
                    },
                )?;
                rows.map(|row| {
                    let (id, fence, outcome, at) = row?;
                    Ok(WriteRecord {
                        id,
                        fence,
                        outcome: Outcome::parse(&outcome)?,
                        at: time(at)?,
                    })
                })
                .collect()
            })
            .await?;
        Ok(WritesPage::from_rows(writes, page))
    }
}
