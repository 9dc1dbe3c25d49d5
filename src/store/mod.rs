//! Lease stores. Both keep the same contract, decided in one atomic step each:
//!
//! - [`postgres::PgStore`] for production: any number of stateless server instances share one
//!   database; the database clock (`now()`) decides expiry; fences come from a sequence.
//! - [`sqlite::SqliteStore`], the embedded default: one file, a fence counter row, and the
//!   server process's clock.
//!
//! Around either: [`metered::Metered`] times every operation and counts its failures, and
//! two chores run beside the server ([`chore::Chore`]): [`purge::Purge`] and
//! [`live::LiveLeases`].

pub(crate) mod chore;
mod config;
pub(crate) mod heartbeat;
pub(crate) mod live;
pub(crate) mod metered;
pub(crate) mod postgres;
pub(crate) mod purge;
mod schema;
pub(crate) mod sqlite;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::wake::{Changes, Registration, Watching};

pub(crate) use config::{DEFAULT_MIGRATION_LOCK_TIMEOUT_SECONDS, DEFAULT_PG_BATCH_MAX};
pub use config::{DEFAULT_POOL_SIZE, DEFAULT_STORE_TIMEOUT_MS, StoreConfig, StoreOptions};
use fencelock::domain::{
    AcquireOutcome, AcquireRequest, HistoryRequest, Inspection, Lease, LeaseHistory, LeasePage,
    ListRequest, ReleaseOutcome, ReleaseRequest, RenewOutcome, RenewRequest, ResourceName, Ticket,
};

pub use fencelock::StoreError;

/// What a store operation answers; `E` only where it is not the store's own error.
pub(crate) type Result<T, E = StoreError> = std::result::Result<T, E>;

/// How long a waiter's ticket counts without a heartbeat ([`LeaseStore::beat`]): a ticket of
/// a process that died stops holding its queue up (and being granted the lease) this long
/// after the last beat. PostgreSQL gives a provisional grant the same time (`fencelock_apply`).
pub(crate) const TICKET_LIFE: Duration = Duration::from_secs(2);

/// How often a process's waiters' tickets are extended: four beats per [`TICKET_LIFE`], so
/// that a beat held up by a slow store, or two, costs no ticket its place.
pub(crate) const BEAT_EVERY: Duration = Duration::from_millis(500);

/// The most history rows the purge keeps per resource (its newest leases).
pub(crate) const HISTORY_PER_RESOURCE: u64 = 1000;

/// Rows one purge step deletes at most.
pub(crate) const PURGE_BATCH: u64 = 10_000;

/// The moment after which a request's work must not take effect any more.
///
/// A request that is answered `503` tells its client "unknown; retry". If the store still
/// carried the work out afterwards (a statement that reached PostgreSQL late, a job that sat
/// in the SQLite queue behind a held write lock), a lease would be taken by nobody and block
/// the resource for a whole TTL. So every write carries its deadline into the store, and the
/// store refuses to act on it once the deadline has passed. The HTTP layer waits a little
/// longer than the deadline (see `routes::AppState`), so the store's own refusal, not the
/// HTTP timeout, is what normally ends a late request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Deadline(Instant);

impl Deadline {
    /// `budget` from now.
    pub fn after(budget: Duration) -> Self {
        Self(Instant::now() + budget)
    }

    pub fn instant(self) -> Instant {
        self.0
    }

    pub fn has_passed(self) -> bool {
        Instant::now() >= self.0
    }

    /// Time left; zero once passed.
    pub fn remaining(self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }
}

/// One lease store. Every method is a single atomic step in the store: there is no
/// read-then-write window between deciding and writing.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Takes the lease if there is no live lease of another owner, issuing a new fence; a
    /// refused acquisition issues none. Nothing is written once `deadline` has passed.
    async fn acquire(&self, req: &AcquireRequest, deadline: Deadline) -> Result<AcquireOutcome>;

    /// Puts the waiting acquisition `req` at the end of its resource's queue, for at most
    /// `wait` (by the store's clock, after which its ticket is skipped); returns its ticket.
    /// Pass it in [`AcquireRequest::ticket`] and [`LeaseStore::dequeue`] it when the wait
    /// ends without a grant (a grant takes it out of the queue itself). A store may grant
    /// the lease to the ticket when the holder releases it; the waiter's next `acquire` (or
    /// its `dequeue`) then answers with that lease.
    async fn enqueue(&self, req: &AcquireRequest, wait: Duration) -> Result<Ticket>;

    /// Takes the ticket of the waiting acquisition `req` out of the queue (it has stopped
    /// waiting), and returns the lease a release granted to it meanwhile, if one did: the
    /// lease is the waiter's, to answer with or to release. Taking out a ticket that is gone
    /// already is no error.
    async fn dequeue(&self, req: &AcquireRequest, ticket: Ticket) -> Result<Option<Lease>>;

    /// The waiters of this process are alive: extends the life of each of their `tickets` (a
    /// heartbeat, [`TICKET_LIFE`] from now, never past the ticket's wait), in one step. A
    /// ticket that no heartbeat extends stops counting once its life has passed: it holds no
    /// queue up and is granted nothing.
    async fn beat(&self, tickets: &[Ticket]) -> Result<()>;

    /// The wake registry this store announces changes to: the grants, releases and
    /// dequeues of every process sharing the store (see the `wake` module).
    fn changes(&self) -> Arc<Changes>;

    /// The live lease of `resource`, or the end of the lock delay of another owner's lease
    /// that expired; otherwise absent.
    async fn inspect(&self, resource: &ResourceName) -> Result<Inspection>;

    /// Starts a watch of `resource` for at most `timeout`: from its return until the
    /// registration is dropped, every change of the resource's lease reaches
    /// [`LeaseStore::changes`]. Returns the live lease as it is once the watch is registered.
    /// A store that announces every change anyway registers nothing.
    async fn watch(&self, resource: &ResourceName, timeout: Duration) -> Result<Watching> {
        let _ = timeout;
        Ok(Watching {
            lease: self.inspect(resource).await?.live(),
            registration: Registration::none(),
        })
    }

    /// Extends the caller's live lease to now + ttl, keeping its fence. Nothing is written
    /// once `deadline` has passed.
    async fn renew(&self, req: &RenewRequest, deadline: Deadline) -> Result<RenewOutcome>;

    /// Deletes the caller's live lease. The fence counter is never lowered. Nothing is
    /// written once `deadline` has passed.
    async fn release(&self, req: &ReleaseRequest, deadline: Deadline) -> Result<ReleaseOutcome>;

    /// Deletes at most `limit` leases that expired more than `grace` ago; returns how many.
    async fn purge_batch(&self, grace: Duration, limit: u64) -> Result<u64>;

    /// Deletes every lease that expired more than `grace` ago, in batches of
    /// [`PURGE_BATCH`] so that purging millions of one-off resources never holds one huge
    /// transaction (nor, on SQLite, the write lock for long); returns how many.
    async fn purge_expired(&self, grace: Duration) -> Result<u64> {
        in_batches(|limit| self.purge_batch(grace, limit)).await
    }

    /// The most recent leases of `req.resource`, newest first, at most `req.limit`: a range
    /// scan of the history's index. Owners are not kept there.
    async fn history(&self, req: &HistoryRequest) -> Result<LeaseHistory>;

    /// Deletes at most `limit` history rows of leases that ended (released, or expired) more
    /// than `retention` ago; never a live lease's. Returns how many.
    async fn purge_history_batch(&self, retention: Duration, limit: u64) -> Result<u64>;

    /// Deletes the history of every lease that ended more than `retention` ago, in batches of
    /// [`PURGE_BATCH`], as [`LeaseStore::purge_expired`] does; returns how many rows.
    async fn purge_history(&self, retention: Duration) -> Result<u64> {
        in_batches(|limit| self.purge_history_batch(retention, limit)).await
    }

    /// Trims the history of every resource acquired in the last `recent` to its newest
    /// `keep` leases; returns how many rows it deleted.
    async fn trim_history(&self, keep: u64, recent: Duration) -> Result<u64>;

    /// How many live leases the store holds: a range scan of the expiry index, for the
    /// `fencelock_live_leases` gauge.
    async fn count_live(&self) -> Result<u64>;

    /// One page of live leases in the request's scope, in byte order of their names, after
    /// `req.after`: one range scan of the primary key per prefix of the scope, until the page
    /// is full. Expired leases are absent; owners are never read.
    async fn list(&self, req: &ListRequest) -> Result<LeasePage>;

    /// Succeeds when the store accepts a durable write (readiness): a store that can be read
    /// but not written is not ready to hand out leases.
    async fn ping(&self) -> Result<()>;

    /// Adds the store's own metric families, if it has any, to an app's registry (see
    /// [`fencelock::metrics`]): the PostgreSQL store's batches.
    fn register_metrics(&self, _registry: &fencelock::metrics::Registry) {}

    /// What the store is and where, for logs; never contains a password.
    fn describe(&self) -> String;
}

pub type SharedStore = Arc<dyn LeaseStore>;

/// Runs `batch` (which deletes at most the `limit` it is given, and says how many it did)
/// with a limit of [`PURGE_BATCH`] until one deletes fewer; returns how many in all.
async fn in_batches<F>(mut batch: impl FnMut(u64) -> F) -> Result<u64>
where
    F: Future<Output = Result<u64>>,
{
    let mut total = 0;
    loop {
        let deleted = batch(PURGE_BATCH).await?;
        total += deleted;
        if deleted < PURGE_BATCH {
            return Ok(total);
        }
    }
}

/// Logs at ERROR a store failure that will not heal by waiting (the store refuses writes, or
/// cannot be used as configured), at most once per [`LASTING_REPORT_EVERY`] in this process:
/// an operator must hear of it, with the store's own words, but one line says it all and a
/// line per request would bury everything else (each request still gets its WARN line).
pub(crate) fn report_lasting(what: &str, cause: &anyhow::Error) {
    static LAST_REPORT: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    let mut last = LAST_REPORT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if last.is_none_or(|at| at.elapsed() >= LASTING_REPORT_EVERY) {
        *last = Some(Instant::now());
        tracing::error!(error = %format!("{cause:#}"), "{what}");
    }
}

const LASTING_REPORT_EVERY: Duration = Duration::from_secs(30);

/// Verifies, changing nothing, that the configured store can serve leases: reachable,
/// writable, and with exactly this build's schema. `Ok` tells what was found; `Err` the cause
/// of the first problem, in one line (for `fencelock check` in a deploy script).
pub(crate) async fn check(config: &StoreConfig, options: StoreOptions) -> anyhow::Result<String> {
    match config {
        StoreConfig::Postgres(pg) => {
            let store = postgres::PgStore::connect(
                (**pg).clone(),
                1,
                options.timeout,
                1,
                options.migration_lock_timeout,
            )?;
            tokio::time::timeout(options.timeout.max(Duration::from_secs(5)), store.check())
                .await
                .map_err(|_| {
                    anyhow::anyhow!("{}: no answer within the store timeout", store.describe())
                })?
        }
        StoreConfig::Sqlite(path) => {
            let path = path.clone();
            tokio::task::spawn_blocking(move || sqlite::check(&path)).await?
        }
    }
}

/// A store as [`open`] opens it: SQLite migrated, PostgreSQL not yet (see
/// [`Opened::prepare`] and [`Opened::migrate`]).
pub(crate) struct Opened {
    pub(crate) store: SharedStore,
    postgres: Option<Arc<postgres::PgStore>>,
}

/// Opens the store the configuration names. A SQLite file is opened and migrated (a file
/// that cannot be opened is fatal, since nothing would change by waiting); a PostgreSQL pool
/// is built without connecting, its migrations left to [`Opened::prepare`], so that the
/// server can listen (and answer `/healthz`) while they wait for the database or for
/// another instance's migration lock.
pub(crate) async fn open(config: &StoreConfig, options: StoreOptions) -> anyhow::Result<Opened> {
    match config {
        StoreConfig::Postgres(pg) => {
            let store = Arc::new(postgres::PgStore::connect(
                (**pg).clone(),
                options.pool_size,
                options.timeout,
                options.batch_max,
                options.migration_lock_timeout,
            )?);
            Ok(Opened {
                store: store.clone(),
                postgres: Some(store),
            })
        }
        StoreConfig::Sqlite(path) => {
            let path = path.clone();
            let store =
                tokio::task::spawn_blocking(move || sqlite::SqliteStore::open(&path)).await??;
            Ok(Opened {
                store: Arc::new(store),
                postgres: None,
            })
        }
    }
}

impl Opened {
    /// Readies a starting server's store: starts PostgreSQL's LISTEN session and applies its
    /// migrations.
    ///
    /// An unreachable PostgreSQL is not fatal: the server serves, answers `503` and `/readyz`
    /// stays `503` until the database answers, then migrates on first use. Nor is one that
    /// cannot be used as configured (it heals once fixed). A migration lock that another
    /// session holds past the migration lock timeout is: no request could be served until
    /// someone ends that session, and a start that fails says so where a deploy sees it.
    pub(crate) async fn prepare(&self) -> anyhow::Result<()> {
        let Some(store) = &self.postgres else {
            return Ok(());
        };
        // First: a LISTEN session that cannot work refuses the start before anything is done.
        store.listen()?;
        match store.ensure_schema().await {
            Ok(()) => {}
            // None heals by waiting, and serving on would either answer nothing or issue
            // fences that may not increase: start-up stops with the cause and the fix.
            Err(e)
                if postgres::migrate::is_lock_timeout(&e)
                    || postgres::is_pooling_mismatch(&e)
                    || postgres::sequence::is_unsafe(&e) =>
            {
                return Err(anyhow::anyhow!("{}", cause_of(&e)));
            }
            Err(StoreError::Misconfigured(cause) | StoreError::NotWritable(cause)) => {
                report_lasting(
                    "PostgreSQL cannot be used as configured; serving 503 until it is fixed",
                    &cause,
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "PostgreSQL is not available yet; serving 503 until it is");
            }
        }
        Ok(())
    }

    /// `fencelock migrate`: applies PostgreSQL's migrations; any failure is an error.
    pub(crate) async fn migrate(&self) -> anyhow::Result<()> {
        match &self.postgres {
            Some(store) => {
                match store.ensure_schema().await {
                    Err(e)
                        if postgres::migrate::is_lock_timeout(&e)
                            || postgres::is_pooling_mismatch(&e)
                            || postgres::sequence::is_unsafe(&e) =>
                    {
                        anyhow::bail!("{}", cause_of(&e))
                    }
                    result => result?,
                }
                // The migrations may have been applied by another instance: the store must
                // still accept a write.
                store.ping().await?;
                Ok(())
            }
            None => Ok(()),
        }
    }
}

/// A store error's cause, without the kind's prefix ("store unavailable: ...").
fn cause_of(error: &StoreError) -> String {
    match error {
        StoreError::Unavailable(cause)
        | StoreError::NotWritable(cause)
        | StoreError::Misconfigured(cause)
        | StoreError::Internal(cause) => format!("{cause:#}"),
    }
}
