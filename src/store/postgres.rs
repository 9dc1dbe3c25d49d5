//! The PostgreSQL store.
//!
//! Each decision is taken inside one SQL statement, so the check and the write are one atomic step.
//! Acquisitions, renewals and releases that arrive together share one statement, one transaction
//! and one commit ([`batch`], group commit); a request that arrives alone goes at once, as a batch
//! of one. Expiry is decided by the database's clock, read by each decision once it holds its
//! resource's lock (docs/design/0002-database-clock.md), so that store time follows commit
//! order: instances with skewed clocks still agree. Fences come from the `lease_fence` sequence,
//! which is store-wide, crash-safe and never reused. The lease table is its own history (one row
//! per acquisition, docs/design/0009-leases-as-history.md).
//!
//! Here: the store handle and its `LeaseStore` impl, with the statements they send. Beside
//! it: [`connect`] (settings and pool), [`batch`] (group commit), [`errors`], [`unwatch`],
//! [`listen`], [`migrate`], [`sequence`], [`statements`], [`clock`], [`tls`], [`conninfo`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use fencelock::guard::postgres as guard_pg;
use guard_pg::POOL_TIMEOUT;
use tokio::sync::OnceCell;
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::{Deadline, LeaseStore, Result, StoreError, TICKET_LIFE};
use crate::wake::{Changes, Registration, Watching};
use fencelock::domain::{
    AcquireOutcome, AcquireRequest, Acquisition, Fence, HistoryRequest, Inspection, Lease,
    LeaseHistory, Owner, PastLease, RecordedEnd, ReleaseOutcome, ReleaseRequest, RenewOutcome,
    RenewRequest, ResourceName, Ticket,
};
use fencelock::domain::{LeasePage, ListRequest, ListedLease};
use fencelock::metrics::Registry;

mod apply;
mod batch;
mod clock;
mod connect;
pub(crate) mod conninfo;
mod errors;
mod listen;
pub(crate) mod migrate;
pub(crate) mod sequence;
mod statements;
pub(crate) mod tls;
mod unwatch;

pub use batch::COMMITTERS;
use batch::{BatchMetrics, Batcher, Queued};
use clock::DbClock;
use connect::DRIVERS;
pub use connect::{PgConfig, pool};
pub(crate) use errors::is_pooling_mismatch;
pub use errors::{classify, classify_pool};
pub use statements::Pooling;
use statements::{Sql, Statements};
use unwatch::Unwatches;

mod embedded {
    refinery::embed_migrations!("migrations/postgres");
}

pub(crate) struct PgStore {
    db: Arc<Db>,
    /// Decides concurrent acquisitions, renewals and releases together (see [`batch`]);
    /// `None` when batches are limited to one request: each is then a statement of its own.
    batcher: Option<Batcher>,
    /// Shown (at zero) also without batches.
    batch_metrics: BatchMetrics,
    /// Where the changes this database announces go (see [`listen`]).
    changes: Arc<Changes>,
    /// The LISTEN session, once [`PgStore::listen`] started it; it ends with the store.
    listener: std::sync::Mutex<Option<listen::Listener>>,
    unwatches: Arc<Unwatches>,
}

/// Rounds of the start's check that the sessions are what `--pg-pooling` says.
const POOLING_PROBES: usize = 3;

/// The pool and what every statement needs: shared by the store's requests and its
/// committers.
struct Db {
    pool: Pool,
    config: PgConfig,
    /// How statements are sent, by what stands between (see [`statements`]).
    statements: Statements,
    /// Set once the migrations have been applied; until then every operation tries to apply
    /// them first, so a server started before its database comes up heals by itself.
    schema: OnceCell<()>,
    clock: DbClock,
    /// Each session's `statement_timeout`: no statement runs longer on the server.
    statement_timeout: Duration,
    /// Longest a migration waits for another session's migration lock.
    migration_lock_timeout: Duration,
    /// While a migration waits for another session's migration lock: what it waits for.
    lock_wait: std::sync::Mutex<Option<String>>,
}

impl PgStore {
    /// Builds the pool without connecting: connections are made on first use. Requests are
    /// decided in batches of at most `batch_max` (1: each alone); migrations wait at most
    /// `migration_lock_timeout` for another session's migration lock.
    pub(crate) fn connect(
        config: PgConfig,
        pool_size: usize,
        statement_timeout: Duration,
        batch_max: usize,
        migration_lock_timeout: Duration,
    ) -> anyhow::Result<Self> {
        let db = Arc::new(Db {
            pool: pool(&config, pool_size, statement_timeout)?,
            statements: Statements::new(config.pooling, statement_timeout),
            config,
            schema: OnceCell::new(),
            clock: DbClock::new(),
            statement_timeout,
            migration_lock_timeout,
            lock_wait: std::sync::Mutex::new(None),
        });
        let batch_metrics = BatchMetrics::new();
        let batcher = (batch_max > 1)
            .then(|| Batcher::start(db.clone(), pool_size, batch_max, batch_metrics.clone()));
        Ok(Self {
            db,
            batcher,
            batch_metrics,
            changes: Changes::new(),
            listener: std::sync::Mutex::new(None),
            unwatches: Arc::default(),
        })
    }

    /// Starts the session that receives the changes every instance announces (grants,
    /// releases, dequeues), for this instance's waiters and watchers. Once; the server
    /// does it, `fencelock check` does not.
    ///
    /// Refused in transaction pooling without a LISTEN session of its own
    /// (`--listen-database-url`): a LISTEN through such a pooler hears nothing once its
    /// transaction ends, and every wait and watch would run to its timeout.
    pub(crate) fn listen(&self) -> anyhow::Result<()> {
        let config = &self.db.config;
        let listen = config.listen_config();
        if listen.pooling == Pooling::Transaction {
            anyhow::bail!(
                "--pg-pooling transaction needs --listen-database-url (FENCELOCK_LISTEN_DATABASE_URL), a URL that reaches PostgreSQL around the pooler: LISTEN cannot work through transaction pooling, and waiting and watch depend on it"
            );
        }
        let mut listener = self
            .listener
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if listener.is_none() {
            *listener = Some(listen::Listener::start(
                listen.clone(),
                self.changes.clone(),
            ));
        }
        Ok(())
    }

    /// Applies the migrations once; safe when several instances start at the same time.
    pub(crate) async fn ensure_schema(&self) -> Result<()> {
        self.db.ensure_schema().await
    }

    /// Connects and verifies, without changing anything, that this database can serve
    /// leases: it accepts writes, and its schema is exactly this build's. Returns what was
    /// found, or the cause of the first problem in one line.
    pub(crate) async fn check(&self) -> anyhow::Result<String> {
        self.db.check().await
    }
}

/// Runs its function when dropped.
struct OnDrop<F: FnMut()>(F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

impl Db {
    async fn ensure_schema(&self) -> Result<()> {
        if self.schema.initialized() {
            return Ok(());
        }
        // While a migration waits for another session's migration lock, a request does not
        // queue behind it (holding its connection until its own timeout): it is answered at
        // once, with what the migration waits for.
        if let Some(waiting) = self.waiting_for_lock() {
            return Err(StoreError::Unavailable(anyhow::anyhow!("{waiting}")));
        }
        self.schema
            .get_or_try_init(|| self.migrate())
            .await
            .map(|_| ())
    }

    fn waiting_for_lock(&self) -> Option<String> {
        self.lock_wait
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_lock_wait(&self, waiting: Option<String>) {
        *self
            .lock_wait
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = waiting;
    }

    async fn migrate(&self) -> Result<()> {
        // A dedicated session, not a pooled one: the migration lock is a transaction lock on
        // it (see `migrate`), and nothing else ever runs there.
        // Bounded as the pool's connections are: a server that accepts the connection and
        // then says nothing would otherwise hold the start (or `fencelock migrate`) for ever,
        // without a word.
        let session = self.config.session_config();
        let connecting = session.connect(self.config.tls.connector.clone());
        let (mut client, connection) = tokio::time::timeout(POOL_TIMEOUT, connecting)
            .await
            .map_err(|_| {
                StoreError::unavailable(format!(
                    "PostgreSQL did not complete a connection within {} s",
                    POOL_TIMEOUT.as_secs()
                ))
            })?
            .map_err(classify)?;
        let driver = tokio::spawn(connection);
        // Clears the wait however the migration ends, a request that gave up on it included
        // (its future is dropped): requests must not be refused for a wait that is over.
        let _cleared = OnDrop(|| self.set_lock_wait(None));
        let mut result = migrate::run(&mut client, self.migration_lock_timeout, &|waiting| {
            self.set_lock_wait(waiting);
        })
        .await;
        if result.is_ok() {
            // Once per process, before the first fence: the sequence as the schema made it.
            result = sequence::check(&mut client).await;
        }
        drop(client);
        let _ = driver.await;
        result?;
        self.check_pooling().await
    }

    /// Refuses sessions that are not what `--pg-pooling` says (see
    /// [`statements::pooling_mismatch`]); once, before the first request is served.
    async fn check_pooling(&self) -> Result<()> {
        if self.config.pooling == Pooling::Transaction {
            return Ok(());
        }
        let session = async |client: &deadpool_postgres::Object| -> Result<(String, i32)> {
            let row = self
                .statements
                .query_opt(client, &statements::SESSION, &[])
                .await
                .map_err(classify)?
                .ok_or_else(|| StoreError::Internal(anyhow::anyhow!("no session answered")))?;
            Ok((row.get(0), row.get(1)))
        };
        let first_client = self.pool.get().await.map_err(classify_pool)?;
        // A second connection while the first is still open, when the pool may have two.
        let second_client = if self.pool.status().max_size >= 2 {
            Some(self.pool.get().await.map_err(classify_pool)?)
        } else {
            None
        };
        // Through transaction pooling the two share a session only when one asks right after
        // the other let it go (PgBouncer hands out the session released last first), which
        // another client of the pooler can get in between: asked in turn a few times.
        for _ in 0..POOLING_PROBES {
            let first = session(&first_client).await?;
            let second = match &second_client {
                Some(client) => Some(session(client).await?),
                None => None,
            };
            let second = second.as_ref().map(|(s, pid)| (s.as_str(), *pid));
            let first = (first.0.as_str(), first.1);
            if let Some(mismatch) = statements::pooling_mismatch(self.config.pooling, first, second)
            {
                return Err(StoreError::Misconfigured(anyhow::Error::new(mismatch)));
            }
        }
        Ok(())
    }

    async fn check(&self) -> anyhow::Result<String> {
        let (mut client, connection) = self
            .config
            .session_config()
            .connect(self.config.tls.connector.clone())
            .await
            .map_err(|e| anyhow::anyhow!("{:#}", classify(e)))?;
        let driver = tokio::spawn(connection);
        let result = async {
            // Unnamed statements only, as in `migrate`: this may go through a pooler.
            let read_only: bool = client.query_typed_one(READ_ONLY, &[]).await?.get(0);
            if read_only {
                anyhow::bail!(
                    "PostgreSQL accepts only reads (a hot standby, or transaction_read_only is on)"
                );
            }
            let runner = embedded::migrations::runner();
            let (history, foreign): (bool, bool) = {
                let row = client
                    .query_typed_one(
                        "SELECT to_regclass('refinery_schema_history') IS NOT NULL, to_regclass('leases') IS NOT NULL",
                        &[],
                    )
                    .await?;
                (row.get(0), row.get(1))
            };
            // Without the history table refinery's own read fails with "db error" (no such
            // relation): a database never migrated is said to be one.
            let applied = if history {
                // Read in a transaction of its own, rolled back: changes nothing.
                let mut reading = migrate::InOneTransaction(client.transaction().await?);
                runner
                    .get_applied_migrations_async(&mut reading)
                    .await
                    .map_err(|e| {
                        anyhow::anyhow!(
                            "reading the applied migrations: {:#}",
                            anyhow::Error::new(e)
                        )
                    })?
            } else {
                Vec::new()
            };
            if applied.is_empty() && foreign {
                anyhow::bail!(
                    "a table named leases already exists that fencelock did not create; use a database of its own"
                );
            }
            let version = crate::store::schema::schema_version(runner.get_migrations(), &applied)?;
            for probe in SCHEMA_PROBES {
                client.simple_query(probe).await.map_err(|e| {
                    anyhow::anyhow!(
                        "the schema is not fencelock's ({probe}): {:#}",
                        anyhow::Error::new(e)
                    )
                })?;
            }
            sequence::check(&mut client)
                .await
                .map_err(|e| anyhow::anyhow!("{}", super::cause_of(&e)))?;
            Ok(format!("{} has schema version {version}", self.describe()))
        }
        .await;
        drop(client);
        let _ = driver.await;
        result
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.ensure_schema().await?;
        self.pool.get().await.map_err(classify_pool)
    }

    async fn query_opt(&self, sql: &Sql, params: &[&(dyn ToSql + Sync)]) -> Result<Option<Row>> {
        let client = self.client().await?;
        self.statements
            .query_opt(&client, sql, params)
            .await
            .map_err(classify)
    }

    /// One batch of a purge: `sql` (`PURGE`, which `answers_count`, or `PURGE_HISTORY`) ends or deletes at most
    /// `limit` leases that ended (or expired) more than `age` ago. Returns how many.
    async fn purge(
        &self,
        client: &deadpool_postgres::Object,
        sql: &Sql,
        answers_count: bool,
        age: Duration,
        limit: u64,
    ) -> Result<u64> {
        let age_ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let params: [&(dyn ToSql + Sync); 2] = [&age_ms, &limit];
        // `PURGE` answers with its count, `PURGE_HISTORY` is counted by the driver.
        let purged = if answers_count {
            let row = self.statements.query_opt(client, sql, &params).await;
            row.map(|row| row.map_or(0, |row| u64::try_from(row.get::<_, i64>(0)).unwrap_or(0)))
        } else {
            self.statements.execute(client, sql, &params).await
        };
        purged.map_err(classify)
    }

    /// `deadline` on the database's clock, reading that clock first if it was never read.
    async fn database_deadline(&self, deadline: Deadline) -> Result<DateTime<Utc>> {
        if let Some(at) = self.clock.database_time(deadline) {
            return Ok(at);
        }
        self.read_clock(&*self.client().await?).await?;
        self.clock
            .database_time(deadline)
            .ok_or_else(|| StoreError::Internal(anyhow::anyhow!("the database clock is unset")))
    }

    /// Samples the database's clock on `client`.
    async fn read_clock(&self, client: &deadpool_postgres::ClientWrapper) -> Result<()> {
        let sent = Instant::now();
        let row = self
            .statements
            .query_opt(client, &CLOCK, &[])
            .await
            .map_err(classify)?
            .ok_or_else(|| StoreError::Internal(anyhow::anyhow!("no clock reading")))?;
        self.clock.sample(row.get(0), sent);
        Ok(())
    }

    /// Decides one request alone: `fencelock_apply` with this request only, waiting for its
    /// locks without a bound of its own (the statement timeout still holds). The answer's
    /// `observed_at` is taken as a clock sample.
    async fn apply_alone(&self, params: apply::Params<'_>, until: DateTime<Utc>) -> Result<Row> {
        let client = self.client().await?;
        let arrays = apply::Arrays::of([params]);
        let until = vec![until];
        let no_lock_wait_bound = 0_i32;
        let sent = Instant::now();
        let row = self
            .statements
            .query_opt(
                &client,
                &apply::APPLY,
                &arrays.with(&until, &no_lock_wait_bound),
            )
            .await
            .map_err(classify)?
            .ok_or_else(|| StoreError::Internal(anyhow::anyhow!("no decision was answered")))?;
        self.clock.sample(row.get(5), sent);
        Ok(row)
    }
}

/// A new ticket at the end of the resource's queue, and whether the resource has a live lease,
/// read under the resource's lock once the ticket is in (`fencelock_enqueue`,
/// docs/design/0004-announcements.md): from then on every change of that lease is announced,
/// and a change that was under way is waited for and seen. The acquisition goes with the
/// ticket, for a release to grant it (docs/design/0003-handover-on-release.md), unless it has a
/// token quota (`$3` NULL). The ticket lives by its heartbeat: `$7` ms at first, never past the
/// wait's end (`$2` ms), extended by [`BEAT`] while its waiter is alive.
const ENQUEUE: Sql = Sql {
    text: "SELECT ticket, live FROM fencelock_enqueue($1, $2, $7, $3, $4, $5, $6)",
    types: &[
        Type::TEXT,
        Type::INT8,
        Type::TEXT,
        Type::INT4,
        Type::TEXT,
        Type::INT4,
        Type::INT8,
    ],
};

/// A watch's registration, live for `$2` ms by the database's clock, and the live lease read
/// under the resource's lock after it, as `ENQUEUE` does.
const WATCH: Sql = Sql {
    text: "SELECT owner, fence, acquired_at, expires_at, observed_at, id FROM fencelock_watch($1, $2)",
    types: &[Type::TEXT, Type::INT8],
};

/// The database's clock now, for a sample (see [`clock`]).
const CLOCK: Sql = Sql {
    text: "SELECT clock_timestamp()",
    types: &[],
};

/// The database's time, for an answer that read no row.
const NOW: Sql = Sql {
    text: "SELECT now()",
    types: &[],
};

const UNWATCH: Sql = Sql {
    text: "DELETE FROM lease_watchers WHERE id = ANY($1)",
    types: &[Type::INT8_ARRAY],
};

/// The heartbeat of this process's waiters: each ticket of `$1` lives `$2` ms
/// more, never past its wait's end. One statement for all of them; a ticket another
/// transaction has locked right now (a release granting it, its waiter taking the grant) is
/// skipped, not waited for, so a beat never waits on a decision (nor closes a deadlock with
/// one) and that ticket is extended at the next beat. A ticket that had lapsed (its instance
/// could not reach the database for a while) lives again: its waiter is alive, and it keeps
/// its place. Committed without waiting for the disk: a beat lost in a crash is made up by
/// the next.
const BEAT: Sql = Sql {
    text: "
UPDATE lease_waiters w
SET expires_at = least(w.wait_until, now() + $2::bigint * interval '1 millisecond')
FROM (SELECT ticket FROM lease_waiters
      WHERE ticket = ANY($1) AND wait_until IS NOT NULL
      FOR UPDATE SKIP LOCKED) beat,
     (SELECT set_config('synchronous_commit', 'off', true)) AS no_sync
WHERE w.ticket = beat.ticket",
    types: &[Type::INT8_ARRAY, Type::INT8],
};

/// Trims each recently acquired resource's history to its newest `$1` leases
/// (`fencelock_trim_history`).
const TRIM_HISTORY: Sql = Sql {
    text: "SELECT fencelock_trim_history($1::integer, $2::bigint)",
    types: &[Type::INT4, Type::INT8],
};

/// What instances that died left behind, deleted once a minute has passed since it expired:
/// tickets of waiters that are gone without leaving the queue (skipped since their expiry),
/// and registrations of watches that ran. One statement, one round trip.
const PURGE_DEPARTED: Sql = Sql {
    text: "
WITH waiters AS (DELETE FROM lease_waiters WHERE expires_at < now() - interval '1 minute')
DELETE FROM lease_watchers WHERE expires_at < now() - interval '1 minute'",
    types: &[],
};

/// The live lease, or one of another owner in its lock delay (`expires_at` passed; the sixth
/// column is when the delay ends).
const INSPECT: Sql = Sql {
    text: "
SELECT owner, fence, acquired_at, expires_at, now(), fencelock_free_at(expires_at, lock_delay_ms)
FROM leases
WHERE resource = $1 AND ended_at IS NULL AND fencelock_free_at(expires_at, lock_delay_ms) > now()",
    types: &[Type::TEXT],
};

/// Served by the current leases' expiry index (`leases_current_expires_idx`): a range scan over
/// live leases only.
const COUNT_LIVE: Sql = Sql {
    text: "SELECT count(*) FROM leases WHERE ended_at IS NULL AND expires_at > now()",
    types: &[],
};

/// Readiness writes this row: what cannot be written here cannot take a lease either.
const PROBE: &str = "
INSERT INTO store_probe (id, checked_at) VALUES (1, now())
ON CONFLICT (id) DO UPDATE SET checked_at = EXCLUDED.checked_at";

/// What `check` reads to make sure the tables and functions the statements use are there, with
/// the columns they use. Reads only.
const SCHEMA_PROBES: [&str; 6] = [
    "SELECT resource, fence, owner, acquired_at, expires_at, ended_at, end_kind, renewals, token, lock_delay_ms FROM leases LIMIT 0",
    "SELECT ticket, resource, expires_at, wait_until FROM lease_waiters LIMIT 0",
    "SELECT id, resource, expires_at FROM lease_watchers LIMIT 0",
    "SELECT id, checked_at FROM store_probe LIMIT 0",
    "SELECT last_value FROM lease_fence",
    "SELECT 'fencelock_apply(text[],text[],text[],integer[],bigint[],text[],integer[],bigint[],integer[],timestamp with time zone[],integer)'::regprocedure,
            'fencelock_enqueue(text,bigint,bigint,text,integer,text,integer)'::regprocedure,
            'fencelock_watch(text,bigint)'::regprocedure,
            'fencelock_end_expired(bigint,bigint)'::regprocedure,
            'fencelock_trim_history(integer,bigint)'::regprocedure",
];

/// A database that accepts only reads: a hot standby, or read-only by configuration.
const READ_ONLY: &str =
    "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'";

/// Ends current leases long expired, at most `$2` (`fencelock_end_expired`): a lease inside
/// its lock delay is kept whatever the grace, since it still keeps other owners out.
const PURGE: Sql = Sql {
    text: "SELECT fencelock_end_expired($1::bigint, $2::bigint)",
    types: &[Type::INT8, Type::INT8],
};

/// A resource's history, newest first: a range scan of the primary key.
const HISTORY: Sql = Sql {
    text: r#"
SELECT fence, acquired_at, expires_at, ended_at, end_kind, renewals, now()
FROM leases
WHERE resource = $1 COLLATE "C"
ORDER BY fence DESC
LIMIT $2"#,
    types: &[Type::TEXT, Type::INT8],
};

/// Leases that ended more than the retention ago, at most `$2`, found by the acquisition
/// index (a lease that ended before the cutoff was acquired before it). A current lease that
/// expired (and passed its lock delay) that long ago has ended by then too: its row is the
/// lease itself, so after a retention shorter than the purge grace a renewal of it answers
/// `404` rather than `409` (docs/operations.md). A live lease is never among them, however
/// old.
const PURGE_HISTORY: Sql = Sql {
    text: "
DELETE FROM leases WHERE (resource, fence) IN (
    SELECT resource, fence FROM leases
    WHERE acquired_at < now() - $1::bigint * interval '1 millisecond'
      AND coalesce(ended_at, fencelock_free_at(expires_at, lock_delay_ms))
          < now() - $1::bigint * interval '1 millisecond'
    LIMIT $2
)",
    types: &[Type::INT8, Type::INT8],
};

impl Db {
    fn describe(&self) -> String {
        format!("PostgreSQL at {}", self.config.redacted_url)
    }
}

impl PgStore {
    /// Decides a write in the next batch, or alone when batches are off.
    async fn decide<R: Queued>(&self, req: &R, deadline: Deadline) -> Result<R::Outcome> {
        match &self.batcher {
            Some(batcher) => batcher.decide(req, deadline).await,
            None => req.alone(&self.db, deadline).await,
        }
    }
}

#[async_trait]
impl LeaseStore for PgStore {
    #[tracing::instrument(skip_all, fields(lease.resource = %req.resource))]
    async fn acquire(&self, req: &AcquireRequest, deadline: Deadline) -> Result<AcquireOutcome> {
        self.decide(req, deadline).await
    }

    async fn enqueue(&self, req: &AcquireRequest, wait: Duration) -> Result<Ticket> {
        let resource = &req.resource;
        let wait_ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX);
        let quota = req.token.as_ref().is_some_and(|t| t.max_leases.is_some());
        let owner = (!quota).then(|| req.owner.as_str());
        let ttl = ttl_param(req.ttl.seconds());
        let token = req.token.as_ref().map(|t| t.name.as_str());
        let lock_delay = lock_delay_param(req);
        let life_ms = i64::try_from(TICKET_LIFE.as_millis()).unwrap_or(i64::MAX);
        let row = self
            .db
            .query_opt(
                &ENQUEUE,
                &[
                    &resource.as_str(),
                    &wait_ms,
                    &owner,
                    &ttl,
                    &token,
                    &lock_delay,
                    &life_ms,
                ],
            )
            .await?
            .ok_or_else(|| StoreError::Internal(anyhow::anyhow!("no ticket was issued")))?;
        // A lease that ended before the ticket was in may have gone unannounced (nobody was
        // queued yet): the waiter is told here, so it looks again at once.
        if !row.get::<_, bool>(1) {
            self.changes.changed(resource.as_str());
        }
        Ok(Ticket::new(row.get(0)))
    }

    /// The ticket leaves the queue (its trigger announces it, so the next waiter looks
    /// again); a grant a release wrote into it, if it still stands, is the waiter's for good.
    async fn dequeue(&self, req: &AcquireRequest, ticket: Ticket) -> Result<Option<Lease>> {
        let leave = apply::Params::leave(&req.resource, &req.owner, ticket);
        let row = self.db.apply_alone(leave, NEVER).await?;
        if row.get::<_, &str>(1) != "claimed" {
            return Ok(None);
        }
        Ok(Some(Lease {
            resource: req.resource.clone(),
            owner: req.owner.clone(),
            fence: fence(&row, 2)?,
            acquired_at: row.get(3),
            expires_at: row.get(4),
            observed_at: row.get(5),
        }))
    }

    async fn beat(&self, tickets: &[Ticket]) -> Result<()> {
        let tickets: Vec<i64> = tickets.iter().map(|t| t.get()).collect();
        let life_ms = i64::try_from(TICKET_LIFE.as_millis()).unwrap_or(i64::MAX);
        let client = self.db.client().await?;
        self.db
            .statements
            .execute(&client, &BEAT, &[&tickets, &life_ms])
            .await
            .map_err(classify)?;
        Ok(())
    }

    fn changes(&self) -> Arc<Changes> {
        self.changes.clone()
    }

    #[tracing::instrument(skip_all, fields(lease.resource = %resource))]
    async fn inspect(&self, resource: &ResourceName) -> Result<Inspection> {
        let Some(row) = self.db.query_opt(&INSPECT, &[&resource.as_str()]).await? else {
            return Ok(Inspection::Absent);
        };
        let (expires_at, now): (DateTime<Utc>, DateTime<Utc>) = (row.get(3), row.get(4));
        if expires_at > now {
            inspected(resource, &row).map(Inspection::Live)
        } else {
            Ok(Inspection::Delayed { until: row.get(5) })
        }
    }

    #[tracing::instrument(skip_all, fields(lease.resource = %resource))]
    async fn watch(&self, resource: &ResourceName, timeout: Duration) -> Result<Watching> {
        let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        let row = self
            .db
            .query_opt(&WATCH, &[&resource.as_str(), &timeout_ms])
            .await?
            .ok_or_else(|| StoreError::Internal(anyhow::anyhow!("no watch was registered")))?;
        let id: i64 = row.get(5);
        let (unwatches, db) = (self.unwatches.clone(), self.db.clone());
        let registration = Registration::new(move || unwatches.end(&db, id));
        // No live lease: the joined columns are NULL.
        let lease = row
            .get::<_, Option<&str>>(0)
            .map(|_| inspected(resource, &row))
            .transpose()?;
        Ok(Watching {
            lease,
            registration,
        })
    }

    #[tracing::instrument(skip_all, fields(lease.resource = %req.resource))]
    async fn renew(&self, req: &RenewRequest, deadline: Deadline) -> Result<RenewOutcome> {
        self.decide(req, deadline).await
    }

    #[tracing::instrument(skip_all, fields(lease.resource = %req.resource))]
    async fn release(&self, req: &ReleaseRequest, deadline: Deadline) -> Result<ReleaseOutcome> {
        self.decide(req, deadline).await
    }

    async fn purge_batch(&self, grace: Duration, limit: u64) -> Result<u64> {
        let client = self.db.client().await?;
        let statements = &self.db.statements;
        statements
            .execute(&client, &PURGE_DEPARTED, &[])
            .await
            .map_err(classify)?;
        self.db.purge(&client, &PURGE, true, grace, limit).await
    }

    async fn history(&self, req: &HistoryRequest) -> Result<LeaseHistory> {
        let limit = i64::try_from(req.limit.get()).unwrap_or(i64::MAX);
        let client = self.db.client().await?;
        let statements = &self.db.statements;
        let rows = statements
            .query(&client, &HISTORY, &[&req.resource.as_str(), &limit])
            .await
            .map_err(classify)?;
        let observed_at = match rows.first() {
            Some(row) => row.get(6),
            None => statements
                .query_opt(&client, &NOW, &[])
                .await
                .map_err(classify)?
                .ok_or_else(|| StoreError::Internal(anyhow::anyhow!("no time was answered")))?
                .get(0),
        };
        let leases = rows.iter().map(past_lease).collect::<Result<_, _>>()?;
        Ok(LeaseHistory {
            leases,
            observed_at,
        })
    }

    async fn purge_history_batch(&self, retention: Duration, limit: u64) -> Result<u64> {
        let client = self.db.client().await?;
        self.db
            .purge(&client, &PURGE_HISTORY, false, retention, limit)
            .await
    }

    async fn trim_history(&self, keep: u64, recent: Duration) -> Result<u64> {
        let keep = i32::try_from(keep).unwrap_or(i32::MAX);
        let recent_ms = i64::try_from(recent.as_millis()).unwrap_or(i64::MAX);
        let row = self
            .db
            .query_opt(&TRIM_HISTORY, &[&keep, &recent_ms])
            .await?;
        let trimmed: i64 = row.map_or(0, |row| row.get(0));
        Ok(u64::try_from(trimmed).unwrap_or(0))
    }

    async fn count_live(&self) -> Result<u64> {
        let row = self.db.query_opt(&COUNT_LIVE, &[]).await?;
        let count: i64 = row.map_or(0, |row| row.get(0));
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// A real write (the probe row), committed like a lease change: a standby, a
    /// read-only database or a full disk fail it the way they would fail an acquisition.
    async fn ping(&self) -> Result<()> {
        let client = self.db.client().await?;
        self.db
            .statements
            .simple(&client, PROBE)
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn list(&self, req: &ListRequest) -> Result<LeasePage> {
        self.list_page(req).await
    }

    fn register_metrics(&self, registry: &Registry) {
        self.batch_metrics.register(registry);
    }

    fn describe(&self) -> String {
        self.db.describe()
    }
}

/// The deadline of a request that has none: a waiter leaving its queue is not answered by
/// a timer of the store's, and what it takes with it is its own to keep or give back.
const NEVER: DateTime<Utc> = DateTime::<Utc>::MAX_UTC;

/// The lease in a row of `INSPECT`'s columns (owner, fence, acquired, expires, now).
fn inspected(resource: &ResourceName, row: &Row) -> Result<Lease> {
    Ok(Lease {
        owner: Owner::parse(row.get(0)).map_err(|e| StoreError::corrupt("owner", e))?,
        resource: resource.clone(),
        fence: fence(row, 1)?,
        acquired_at: row.get(2),
        expires_at: row.get(3),
        observed_at: row.get(4),
    })
}

/// A refusal: the resource might be the caller's at `free_at`, by the database's clock, read at
/// `now` (NULL: unknown, so look again soon). `delayed_since` is the expiry of the lease whose
/// lock delay it is, if it is one (the refusal row's `acquired_at`).
fn held(
    free_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    delayed_since: Option<DateTime<Utc>>,
) -> AcquireOutcome {
    let free_in = free_at
        .and_then(|at| (at - now).to_std().ok())
        .unwrap_or_default();
    AcquireOutcome::Held {
        free_in,
        delayed_until: delayed_since.and(free_at),
    }
}

/// The event a grant names, as the SQL functions spell it.
fn acquisition(how: &str) -> Result<Acquisition> {
    match how {
        // A waiter taking the lease a release granted its ticket is a new lease to it.
        "fresh" | "claimed" => Ok(Acquisition::Fresh),
        "reacquired" => Ok(Acquisition::Reacquired),
        "taken_over" => Ok(Acquisition::TakenOver),
        other => Err(StoreError::Internal(anyhow::anyhow!(
            "the database answered an unknown acquisition event {other:?}"
        ))),
    }
}

/// The request's lock delay, in milliseconds (at most 60000).
fn lock_delay_param(req: &AcquireRequest) -> i32 {
    i32::try_from(req.lock_delay.millis()).unwrap_or(i32::MAX)
}

fn ttl_param(seconds: u32) -> i32 {
    // Ttl is capped far below i32::MAX (see TTL_CEILING_SECONDS).
    i32::try_from(seconds).unwrap_or(i32::MAX)
}

fn fence(row: &Row, index: usize) -> Result<Fence> {
    Fence::new(row.get(index)).map_err(|e| StoreError::corrupt("fence", e))
}

/// One range of a list page, `[$1, $2)`, at most `$3` leases. The bounds come from
/// `ListRequest::ranges` and hold in byte order: the column's collation is "C" (the schema), so the
/// primary key index serves the range and the order. The explicit `COLLATE "C"` repeats that for
/// whoever reads the statement; it is the column's own, so the index still applies.
const LIST: Sql = Sql {
    text: r#"
SELECT resource, fence, acquired_at, expires_at, now()
FROM leases
WHERE resource >= $1 COLLATE "C" AND resource < $2 COLLATE "C" AND ended_at IS NULL
  AND expires_at > now()
ORDER BY resource COLLATE "C"
LIMIT $3"#,
    types: &[Type::TEXT, Type::TEXT, Type::INT8],
};

impl PgStore {
    /// One page: the scope's ranges in name order, each read up to what the page still
    /// needs, plus one lease that tells whether a next page exists. Ranges are read one
    /// statement each, on one connection; a prefix of the scope that holds enough leases
    /// ends the page without a look at the others.
    #[tracing::instrument(skip_all)]
    async fn list_page(&self, req: &ListRequest) -> Result<LeasePage> {
        let client = self.db.client().await?;
        let wanted = req.limit.get() + 1;
        let mut leases = Vec::with_capacity(wanted);
        for range in req.ranges() {
            let left = i64::try_from(wanted - leases.len()).unwrap_or(i64::MAX);
            let rows = self
                .db
                .statements
                .query(&client, &LIST, &[&range.start, &range.end, &left])
                .await
                .map_err(classify)?;
            for row in rows {
                leases.push(listed(&row)?);
            }
            if leases.len() >= wanted {
                break;
            }
        }
        Ok(LeasePage::from_rows(leases, req.limit))
    }
}

fn past_lease(row: &Row) -> Result<PastLease> {
    let recorded = row
        .get::<_, Option<&str>>(4)
        .map(|kind| {
            RecordedEnd::from_stored(kind)
                .ok_or_else(|| StoreError::Internal(anyhow::anyhow!("stored lease end {kind:?}")))
        })
        .transpose()?;
    let renewals: i32 = row.get(5);
    Ok(PastLease {
        fence: fence(row, 0)?,
        acquired_at: row.get(1),
        expires_at: row.get(2),
        released_at: row.get(3),
        recorded,
        renewals: u32::try_from(renewals).unwrap_or(0),
    })
}

fn listed(row: &Row) -> Result<ListedLease> {
    let resource: &str = row.get(0);
    Ok(ListedLease {
        resource: ResourceName::parse(resource).map_err(|e| StoreError::corrupt("resource", e))?,
        fence: fence(row, 1)?,
        acquired_at: row.get(2),
        expires_at: row.get(3),
        observed_at: row.get(4),
    })
}
