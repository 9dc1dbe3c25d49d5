//! A document store on one SQLite file whose writes the fencelock guard protects: a write
//! lands only when the writer's fence is not older than the last one accepted for its key.
//!
//! The guard's check and the write are one `BEGIN IMMEDIATE` transaction: SQLite's write
//! lock is taken when it begins and held until it commits, so no writer with a lower fence
//! can get between the check and the write.

use std::path::Path;

use fencelock::domain::FenceKeys;
use fencelock::guard::sqlite::classify;
use fencelock::guard::{self, Admission, FencingToken, Guard, GuardError, GuardMetrics};
use fencelock::metrics::Registry;
use rusqlite::{Connection, OptionalExtension as _, TransactionBehavior};

/// The documents. The guard's table (`fence_guard`) stands beside it.
pub const DOCS_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS docs (
    key  TEXT NOT NULL PRIMARY KEY,
    body TEXT NOT NULL
)";

/// The documents in one SQLite file, and the guard of their writes.
pub struct Store {
    conn: Connection,
    guard: Guard,
}

impl Store {
    /// Opens (or creates) the store at `path`, with its tables. The guard accepts tokens
    /// signed with `keys` (none: bare fences) and counts its decisions in `registry`.
    pub fn open(path: &Path, keys: FenceKeys, registry: &Registry) -> rusqlite::Result<Self> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.execute_batch(guard::sqlite::SCHEMA)?;
        conn.execute_batch(DOCS_SCHEMA)?;
        let guard = Guard::new(keys, GuardMetrics::register(registry));
        Ok(Self { conn, guard })
    }

    /// Writes `body` to `key` if `token` (the writer's `Fencing-Token`) may: its fence is
    /// checked and recorded in the write's own transaction. Every refusal is a
    /// [`GuardError`] (`409 stale-fence` for a lower fence), and nothing is written then.
    pub fn put(&mut self, key: &str, token: &FencingToken, body: &str) -> Result<(), GuardError> {
        // 400 (not a fence) or 403 (not signed for this key) before any database work.
        let fence = self.guard.check(key, token)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(classify)?;
        let admission =
            guard::sqlite::admit(&tx, &fence, self.guard.metrics()).map_err(classify)?;
        if let Admission::Stale { current } = admission {
            return Err(guard::stale_write(key, current)); // tx rolls back: nothing written
        }
        tx.execute(
            "INSERT INTO docs (key, body) VALUES (?1, ?2)
             ON CONFLICT (key) DO UPDATE SET body = excluded.body",
            (key, body),
        )
        .map_err(classify)?;
        tx.commit().map_err(classify)?;
        Ok(())
    }

    /// The document at `key`, as last written. Reading needs no fence.
    pub fn get(&self, key: &str) -> rusqlite::Result<Option<String>> {
        self.conn
            .query_row("SELECT body FROM docs WHERE key = ?1", [key], |row| {
                row.get(0)
            })
            .optional()
    }
}
