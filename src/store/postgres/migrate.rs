//! Applying the migrations: one instance at a time, under a lock that is waited for within a
//! bound, in the log, and that can never outlive the migration.
//!
//! # The lock
//!
//! Instances starting together on one database must not run the same migrations twice, so
//! migrations run under an advisory lock on [`MIGRATION_LOCK_KEY`]. The lock is a
//! *transaction* lock (`pg_try_advisory_xact_lock`) taken in the transaction that applies
//! every pending migration, on a session of its own (never a pooled one), and it ends with
//! that transaction's commit or rollback, whatever happens to this process:
//!
//! - A session-level lock (`pg_advisory_lock`, as before) outlives the work it guards
//!   whenever the session does. Through PgBouncer in transaction pooling, the "session" is
//!   any server connection PgBouncer picks for each transaction: the lock stays on a server
//!   connection that goes back to PgBouncer's pool, an explicit `pg_advisory_unlock` may run
//!   on another one, and every later start, direct or not, waits on a lock nobody will
//!   release. A transaction runs on one server connection from `BEGIN` to its end in every
//!   pooling mode, and the lock ends with it.
//! - refinery runs each migration in a transaction of its own, which would end a transaction
//!   lock at the first commit; here its statements run through [`InOneTransaction`], so the
//!   whole run (the history table, the read of what is applied, each migration and its
//!   history row) is one transaction: all pending migrations apply, or none.
//!
//! Every statement here is sent unnamed (`query_typed`), so that a migration through a pooler
//! in transaction pooling depends on no prepared statement outliving its transaction, and the
//! migration's transaction sets `synchronous_commit` itself, since a pooler passes no startup
//! options.
//!
//! The lock is *tried*, never waited for inside PostgreSQL: a held lock is logged with its
//! holder (pid, application, client address) and tried again every [`POLL`], up to the
//! migration lock timeout, after which the migration fails with
//! [`MigrationLockTimeout`] (start-up then stops with one line). A blocking
//! `pg_advisory_lock` would wait silently and for ever.

use std::time::{Duration, Instant};

use refinery_core::Migration;
use refinery_core::traits::r#async::{AsyncMigrate, AsyncQuery, AsyncTransaction};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

use super::{READ_ONLY, classify};
use crate::store::StoreError;

/// Serialises migrations of instances starting at once on one database. Advisory locks are
/// database-wide, which is what we want here.
const MIGRATION_LOCK_KEY: i64 = 0x6665_6e63_656c_6f63; // "fencloc"

/// How often a held migration lock is tried again.
const POLL: Duration = Duration::from_millis(250);

/// How often the wait is logged again while it lasts (the first attempt that finds the lock
/// held is always logged).
const LOG_EVERY: Duration = Duration::from_secs(10);

const TRY_LOCK: &str = "SELECT pg_try_advisory_xact_lock($1)";

/// A migration commits durably whatever the database default, as every decision does.
const DURABLE: &str = "SET LOCAL synchronous_commit = on";

/// Who holds the migration lock, as far as this login may see (`pg_stat_activity` shows
/// another role's sessions with most fields empty, unless the login has `pg_read_all_stats`).
/// A bigint advisory key is kept as `classid` (high half), `objid` (low half), `objsubid` 1.
const HOLDER: &str = "
SELECT l.pid, a.application_name, host(a.client_addr), a.state
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ($1::bigint >> 32)::oid
  AND l.objid = ($1::bigint & 4294967295)::oid
LIMIT 1";

/// The migration lock was held by another session for longer than the migration lock
/// timeout. Fatal at start-up: the server would serve `503` for as long as it lasts.
#[derive(Debug, thiserror::Error)]
#[error(
    "the migration lock is still held by {holder} after {waited_s} s (--migration-lock-timeout-seconds): end that session (SELECT pg_terminate_backend(pid), or restart the PgBouncer that holds it), then start again"
)]
pub(crate) struct MigrationLockTimeout {
    holder: String,
    waited_s: u64,
}

/// Whether `error` is a migration that gave up waiting for the migration lock.
pub(crate) fn is_lock_timeout(error: &StoreError) -> bool {
    matches!(error, StoreError::Unavailable(cause) if cause.downcast_ref::<MigrationLockTimeout>().is_some())
}

/// Applies the pending migrations on `client`, a session of its own, waiting at most
/// `lock_timeout` for another session's migration lock. `waiting` is told the holder while
/// the lock is held elsewhere, and `None` once it is not.
pub(super) async fn run(
    client: &mut Client,
    lock_timeout: Duration,
    waiting: &(dyn Fn(Option<String>) + Sync),
) -> Result<(), StoreError> {
    // A standby cannot be migrated, and could not take a lease anyway: say so, and try again
    // on the next request (it may be promoted).
    let read_only: bool = client
        .query_typed_one(READ_ONLY, &[])
        .await
        .map_err(classify)?
        .get(0);
    if read_only {
        return Err(StoreError::NotWritable(anyhow::anyhow!(
            "PostgreSQL accepts only reads (a hot standby, or transaction_read_only is on)"
        )));
    }
    let started = Instant::now();
    let mut logged: Option<Instant> = None;
    loop {
        let transaction = client.transaction().await.map_err(classify)?;
        transaction.batch_execute(DURABLE).await.map_err(classify)?;
        let locked: bool = transaction
            .query_typed_one(TRY_LOCK, &[(&MIGRATION_LOCK_KEY, Type::INT8)])
            .await
            .map_err(classify)?
            .get(0);
        if locked {
            waiting(None);
            return apply(transaction).await;
        }
        transaction.rollback().await.map_err(classify)?;
        let holder = holder(client).await;
        waiting(Some(format!(
            "waiting for the migration lock held by {holder}"
        )));
        let waited = started.elapsed();
        if waited >= lock_timeout {
            return Err(StoreError::Unavailable(anyhow::Error::new(
                MigrationLockTimeout {
                    holder,
                    waited_s: waited.as_secs(),
                },
            )));
        }
        if logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
            logged = Some(Instant::now());
            tracing::warn!(
                waited_s = waited.as_secs(),
                timeout_s = lock_timeout.as_secs(),
                "waiting for the migration lock held by {holder}; serving 503 meanwhile"
            );
        }
        tokio::time::sleep(POLL.min(lock_timeout - waited)).await;
    }
}

/// Every pending migration in `transaction`, which holds the migration lock; committed
/// together.
async fn apply(transaction: Transaction<'_>) -> Result<(), StoreError> {
    let runner = super::embedded::migrations::runner();
    let mut migrating = InOneTransaction(transaction);
    newer_than_known(&mut migrating, &runner).await?;
    let report = runner
        .run_async(&mut migrating)
        .await
        .map_err(|e| {
            StoreError::Misconfigured(anyhow::Error::new(e).context(
                "the database's schema is not one fencelock can migrate (a table of another application named like fencelock's, or a changed migration)",
            ))
        })?;
    migrating.0.commit().await.map_err(classify)?;
    for migration in report.applied_migrations() {
        tracing::info!(migration = %migration, "applied PostgreSQL migration");
    }
    Ok(())
}

/// A database a newer build has migrated: refinery would call the newer migration missing
/// from this build, where the remedy is a newer fencelock (as `fencelock check` says).
async fn newer_than_known(
    migrating: &mut InOneTransaction<'_>,
    runner: &refinery::Runner,
) -> Result<(), StoreError> {
    let history: bool = migrating
        .0
        .query_typed_one(
            "SELECT to_regclass('refinery_schema_history') IS NOT NULL",
            &[],
        )
        .await
        .map_err(classify)?
        .get(0);
    if !history {
        return Ok(());
    }
    let applied = runner
        .get_applied_migrations_async(migrating)
        .await
        .map_err(|e| StoreError::Misconfigured(anyhow::Error::new(e)))?;
    let latest = runner
        .get_migrations()
        .iter()
        .map(refinery::Migration::version)
        .max()
        .unwrap_or_default();
    match applied.iter().map(refinery::Migration::version).max() {
        Some(at) if at > latest => Err(StoreError::Misconfigured(
            crate::store::schema::newer_schema(at, latest),
        )),
        _ => Ok(()),
    }
}

/// The session holding the migration lock, in words: `pid N (application_name "x", client
/// 10.0.0.5, idle)`, with what this login may see of it.
async fn holder(client: &Client) -> String {
    // Released between the attempt and this look, or the catalog cannot be read: the next
    // attempt tells.
    let rows = client
        .query_typed(HOLDER, &[(&MIGRATION_LOCK_KEY, Type::INT8)])
        .await;
    let Some(row) = rows.ok().and_then(|rows| rows.into_iter().next()) else {
        return "another session".to_owned();
    };
    let pid: Option<i32> = row.get(0);
    let Some(pid) = pid else {
        return "a prepared transaction (see pg_prepared_xacts)".to_owned();
    };
    let application: Option<String> = row.get(1);
    let client_addr: Option<String> = row.get(2);
    let state: Option<String> = row.get(3);
    format!(
        "pid {pid} (application_name {:?}, client {}, {})",
        application.unwrap_or_default(),
        client_addr.as_deref().unwrap_or("local"),
        state
            .as_deref()
            .unwrap_or("state not visible to this login"),
    )
}

/// refinery's runner on one open transaction: each "transaction" refinery asks for is a run
/// of statements inside it, so that the run's work and the migration lock end together (see
/// the module's documentation).
pub(super) struct InOneTransaction<'c>(pub(super) Transaction<'c>);

impl AsyncTransaction for InOneTransaction<'_> {
    type Error = tokio_postgres::Error;

    async fn execute<'a, T: Iterator<Item = &'a str> + Send + 'a>(
        &'a mut self,
        queries: T,
    ) -> Result<usize, Self::Error> {
        let mut count = 0;
        for query in queries {
            self.0.batch_execute(query).await?;
            count += 1;
        }
        Ok(count)
    }
}

impl AsyncQuery<Vec<Migration>> for InOneTransaction<'_> {
    async fn query<'a>(&'a mut self, query: &'a str) -> Result<Vec<Migration>, Self::Error> {
        // As refinery's own driver reads its history table: version, name, applied_on
        // (RFC 3339 text), checksum (decimal text).
        let rows = self.0.query_typed(query, &[]).await?;
        // Every column but the version may be NULL in a history damaged by hand: read as
        // empty, never a panic.
        Ok(rows
            .iter()
            .map(|row| {
                let name: Option<String> = row.get(1);
                let applied_on: Option<String> = row.get(2);
                let checksum: Option<String> = row.get(3);
                Migration::applied(
                    row.get(0),
                    name.unwrap_or_default(),
                    applied_on
                        .and_then(|text| {
                            time::OffsetDateTime::parse(
                                &text,
                                &time::format_description::well_known::Rfc3339,
                            )
                            .ok()
                        })
                        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH),
                    // A checksum that does not parse matches no migration: refinery then
                    // refuses the run as divergent, which is what such a history deserves.
                    checksum.and_then(|c| c.parse().ok()).unwrap_or_default(),
                )
            })
            .collect())
    }
}

impl AsyncMigrate for InOneTransaction<'_> {}
