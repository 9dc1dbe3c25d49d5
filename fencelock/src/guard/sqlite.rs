//! The guard on SQLite.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS fence_guard (
//!     key        TEXT    NOT NULL PRIMARY KEY,
//!     fence      INTEGER NOT NULL CHECK (fence > 0),
//!     updated_at INTEGER NOT NULL  -- Unix milliseconds
//! );
//! ```
//!
//! ```no_run
//! # use fencelock::guard::{self, Admission, CheckedFence};
//! use rusqlite::TransactionBehavior;
//!
//! fn write(
//!     conn: &mut rusqlite::Connection,
//!     guard: &guard::Guard,
//!     // From `guard.check(key, &token)?`, where `token` is the request's `FencingToken`
//!     // and `key` the one this write is for: the token must be signed for that key.
//!     fence: &CheckedFence,
//!     body: &str,
//! ) -> rusqlite::Result<Admission> {
//!     let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
//!     let admission = guard::sqlite::admit(&tx, fence, guard.metrics())?;
//!     if let Admission::Stale { .. } = admission {
//!         return Ok(admission); // dropping tx rolls back: nothing was written
//!     }
//!     tx.execute("UPDATE documents SET body = ?2 WHERE key = ?1", (fence.key(), body))?;
//!     tx.commit()?;
//!     Ok(admission)
//! }
//! ```

use rusqlite::{ErrorCode, OptionalExtension, Transaction, params};

use super::{Admission, CheckedFence, GuardMetrics};
use crate::StoreError;
use crate::domain::Fence;

/// The guard's table; idempotent, for a service's own migrations or start-up.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fence_guard (
    key        TEXT    NOT NULL PRIMARY KEY,
    fence      INTEGER NOT NULL CHECK (fence > 0),
    updated_at INTEGER NOT NULL
)";

const ADMIT: &str = "
INSERT INTO fence_guard (key, fence, updated_at) VALUES (?1, ?2, ?3)
ON CONFLICT (key) DO UPDATE SET fence = excluded.fence, updated_at = excluded.updated_at
    WHERE fence_guard.fence <= excluded.fence
RETURNING fence";

/// Admits a write with `checked`'s fence to its key, or reports the greater fence already
/// accepted. [`super::Guard::check`] made `checked` from the writer's token, for this key.
///
/// It takes the transaction that performs the write (best begun `IMMEDIATE`, so that
/// SQLite's write lock is held from the check to the commit): call it before the write, and
/// write only when admitted. The decision is counted in `metrics`.
pub fn admit(
    tx: &Transaction<'_>,
    checked: &CheckedFence,
    metrics: &GuardMetrics,
) -> rusqlite::Result<Admission> {
    let (key, fence) = (checked.key(), checked.fence());
    let now = chrono::Utc::now().timestamp_millis();
    let admitted = tx
        .prepare_cached(ADMIT)?
        .query_row(params![key, fence.get(), now], |r| r.get::<_, i64>(0))
        .optional()?;
    if admitted.is_some() {
        return Ok(metrics.decided(Admission::Admitted));
    }
    let current: i64 =
        tx.query_row("SELECT fence FROM fence_guard WHERE key = ?1", [key], |r| {
            r.get(0)
        })?;
    Ok(metrics.decided(Admission::Stale {
        current: Fence::new(current).unwrap_or(fence),
    }))
}

/// Sorts SQLite failures by result code: busy, locked, I/O and the like are `Unavailable`
/// (`503`); a read-only file or a full disk `NotWritable` (`503`); anything else is
/// `Internal` (`500`). The lease server's SQLite store sorts its failures with it too.
pub fn classify(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::SystemIoFailure
            | ErrorCode::CannotOpen
            | ErrorCode::OutOfMemory,
        ) => StoreError::Unavailable(e.into()),
        Some(ErrorCode::ReadOnly) => StoreError::NotWritable(
            anyhow::Error::new(e).context("the SQLite file or its file system is read-only"),
        ),
        Some(ErrorCode::DiskFull) => {
            StoreError::NotWritable(anyhow::Error::new(e).context("the disk is full"))
        }
        _ => StoreError::Internal(e.into()),
    }
}
