//! The guard on PostgreSQL, through the guard's SQL function (see [`super::sql`]):
//! [`admit`] calls `fencelock_guard.admit(key, token)` in the write's own transaction, so a
//! Rust service shares the guard's table and rule with services in any other language.
//! Create the schema once with [`SCHEMA`] (idempotent: at every start will do), or install
//! it with `fencelock guard install`, which also installs the fence keys.
//!
//! ```no_run
//! # use fencelock::guard::{self, Admission, CheckedFence, GuardError};
//! # use fencelock::guard::postgres::classify;
//! async fn write(
//!     client: &mut tokio_postgres::Client,
//!     guard: &guard::Guard,
//!     // From `guard.check(key, &token)?`, where `token` is the request's `FencingToken`
//!     // and `key` the one this write is for: the token must be signed for that key.
//!     fence: &CheckedFence,
//!     body: &str,
//! ) -> Result<Admission, GuardError> {
//!     let tx = client.transaction().await.map_err(classify)?;
//!     let admission = guard::postgres::admit(&tx, fence, guard.metrics()).await?;
//!     if let Admission::Stale { .. } = admission {
//!         return Ok(admission); // dropping tx rolls back: nothing was written
//!     }
//!     tx.execute("UPDATE documents SET body = $2 WHERE key = $1", &[&fence.key(), &body])
//!         .await
//!         .map_err(classify)?;
//!     tx.commit().await.map_err(classify)?;
//!     Ok(admission)
//! }
//! ```

use std::time::Duration;

use anyhow::Context as _;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Socket, Transaction};

use super::sql::{INVALID_TOKEN, NOT_A_TOKEN, STALE};
use super::{Admission, CheckedFence, GuardError, GuardMetrics};
use crate::StoreError;
use crate::domain::Fence;

/// How long a request may wait for a pooled connection, for a new connection, or for a
/// connection check, before it answers `503`. Short, so an outage is reported rather than
/// queued behind.
pub const POOL_TIMEOUT: Duration = Duration::from_secs(2);

/// The guard's schema (`fencelock_guard`: the `fences` and `fence_keys` tables, the `admit`
/// function); idempotent, for a service's own migrations or start-up. It leaves the
/// installed fence keys as they are.
pub const SCHEMA: &str = super::sql::POSTGRES;

const ADMIT: &str = "SELECT fencelock_guard.admit($1, $2)";

/// `fencelock_guard.admit` refuses by raising an error, which would end the caller's
/// transaction; inside a savepoint, a refusal leaves the transaction usable, so that the
/// caller may still record it (the demo logs every refused write).
const SAVEPOINT: &str = "SAVEPOINT fencelock_guard_admit";
const RELEASE: &str = "RELEASE SAVEPOINT fencelock_guard_admit";
const ROLL_BACK: &str =
    "ROLLBACK TO SAVEPOINT fencelock_guard_admit; RELEASE SAVEPOINT fencelock_guard_admit";

/// Admits a write with `checked`'s fence to its key, or reports the greater fence already
/// admitted, through `fencelock_guard.admit`. [`super::Guard::check`] made `checked` from the
/// writer's token, for this key; the database checks that token again by the keys installed
/// in it (none: any fence).
///
/// It takes the transaction that performs the write: call it before the write, and write
/// only when admitted. The key's guard row stays locked until that transaction ends; after a
/// refusal the transaction is still usable (the call ran in a savepoint). The decision is
/// counted in `metrics`. A token the database refuses is `403` (or `400`), as
/// [`super::Guard::check`] would have refused it with the database's keys.
pub async fn admit(
    tx: &Transaction<'_>,
    checked: &CheckedFence,
    metrics: &GuardMetrics,
) -> Result<Admission, GuardError> {
    let (key, token) = (checked.key(), checked.token());
    let params: [(&(dyn ToSql + Sync), Type); 2] = [(&key, Type::TEXT), (&token, Type::TEXT)];
    // One round trip: the savepoint, the call and the release are sent together, in order.
    let (saved, called, released) = tokio::join!(
        tx.batch_execute(SAVEPOINT),
        tx.query_typed_one(ADMIT, &params),
        tx.batch_execute(RELEASE),
    );
    saved.map_err(classify)?;
    let refused = match called {
        Ok(_) => {
            released.map_err(classify)?;
            return Ok(metrics.decided(Admission::Admitted));
        }
        Err(e) => refusal(e)?,
    };
    tx.batch_execute(ROLL_BACK).await.map_err(classify)?;
    match refused {
        Refusal::Stale(current) => Ok(metrics.decided(Admission::Stale { current })),
        Refusal::Token(e) => {
            if let GuardError::InvalidToken(_) = e {
                metrics.refused();
            }
            Err(e)
        }
    }
}

/// Why `fencelock_guard.admit` refused.
enum Refusal {
    Stale(Fence),
    Token(GuardError),
}

/// Reads a refusal of `fencelock_guard.admit` from its SQLSTATE; any other error is the
/// store's, sorted by [`classify`].
fn refusal(e: tokio_postgres::Error) -> Result<Refusal, GuardError> {
    let Some(db) = e.as_db_error() else {
        return Err(classify(e).into());
    };
    let message = db.message().to_owned();
    match db.code().code() {
        STALE => {
            let current = db.detail().and_then(|d| d.parse::<i64>().ok());
            match current.map(Fence::new) {
                Some(Ok(current)) => Ok(Refusal::Stale(current)),
                _ => Err(StoreError::Internal(anyhow::Error::new(e).context(
                    "fencelock_guard.admit refused a stale fence without the current one in DETAIL",
                ))
                .into()),
            }
        }
        INVALID_TOKEN => Ok(Refusal::Token(GuardError::InvalidToken(message))),
        NOT_A_TOKEN => Ok(Refusal::Token(GuardError::NotAToken(message))),
        _ => Err(classify(e).into()),
    }
}

/// A connection pool for the request path of a protected service: no request waits longer
/// than [`POOL_TIMEOUT`] for a connection, and no statement runs longer than
/// `statement_timeout`, so an outage is answered with `503` rather than a hang. Connections
/// are made on first use, not here.
pub fn pool<T>(
    mut config: tokio_postgres::Config,
    tls: T,
    size: usize,
    statement_timeout: Duration,
) -> anyhow::Result<Pool>
where
    T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
    T::Stream: Sync + Send,
    T::TlsConnect: Sync + Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    with_statement_timeout(&mut config, statement_timeout);
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(POOL_TIMEOUT);
    }
    let manager = Manager::from_config(config, tls, manager_config());
    pool_of(manager, size)
}

/// Adds `statement_timeout` to the session options `config` already carries.
pub fn with_statement_timeout(config: &mut tokio_postgres::Config, timeout: Duration) {
    let options = format!(
        "{} -c statement_timeout={}",
        config.get_options().unwrap_or_default(),
        timeout.as_millis()
    );
    config.options(options.trim_start());
}

/// How pooled connections are checked on their way out of the pool: a closed connection is
/// detected without a round trip; one that dies while idle fails its next statement with a
/// `503`, and the pool replaces it.
pub fn manager_config() -> ManagerConfig {
    ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    }
}

/// A pool of `size` connections from `manager`, with [`POOL_TIMEOUT`] on every wait.
pub fn pool_of(manager: Manager, size: usize) -> anyhow::Result<Pool> {
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(POOL_TIMEOUT))
        .create_timeout(Some(POOL_TIMEOUT))
        .recycle_timeout(Some(POOL_TIMEOUT))
        .build()
        .context("building the PostgreSQL pool")
}

/// Sorts a PostgreSQL failure by SQLSTATE and connection state, never by the server's
/// message text: a database that refuses writes is `NotWritable`, a refused login or
/// database `Misconfigured` (both `503`, reported loudly); connection loss, timeouts and a
/// busy or restarting server are `Unavailable` (`503`); anything else (a bad statement, a
/// broken schema) is `Internal` (`500`).
pub fn classify(e: tokio_postgres::Error) -> StoreError {
    match e.code() {
        Some(code) if code == &SqlState::READ_ONLY_SQL_TRANSACTION => {
            return StoreError::NotWritable(anyhow::Error::new(e).context(
                "PostgreSQL accepts only reads (a hot standby, or transaction_read_only is on)",
            ));
        }
        Some(code)
            if code == &SqlState::INVALID_PASSWORD
                || code == &SqlState::INVALID_AUTHORIZATION_SPECIFICATION
                || code == &SqlState::INVALID_CATALOG_NAME
                || code == &SqlState::INSUFFICIENT_PRIVILEGE =>
        {
            return StoreError::Misconfigured(
                anyhow::Error::new(e).context("PostgreSQL refuses this login or database"),
            );
        }
        // PgBouncer refuses the `options` startup parameter (unless told to ignore it) with
        // a connection exception, which would read as an outage that waiting heals; it is a
        // setting to change.
        Some(code)
            if code == &SqlState::PROTOCOL_VIOLATION
                && e.as_db_error()
                    .is_some_and(|db| db.message().contains("unsupported startup parameter")) =>
        {
            return StoreError::Misconfigured(anyhow::Error::new(e).context(
                "the server at the database URL refuses the `options` startup parameter, as PgBouncer does, which sets each session's statement_timeout (and the lease server's synchronous_commit); connect to PostgreSQL itself (the pool is fencelock's own), or give PgBouncer `ignore_startup_parameters = options`, session pooling, and those settings on the role (ALTER ROLE ... SET)",
            ));
        }
        Some(code) if code == &SqlState::DISK_FULL => {
            return StoreError::NotWritable(
                anyhow::Error::new(e).context("PostgreSQL's disk is full"),
            );
        }
        _ => {}
    }
    let transient = e.is_closed()
        || e.as_db_error().is_none()
        || e.code().is_some_and(|code| {
            code == &SqlState::T_R_SERIALIZATION_FAILURE
                || code == &SqlState::T_R_DEADLOCK_DETECTED
                || code == &SqlState::ADMIN_SHUTDOWN
                || code == &SqlState::CRASH_SHUTDOWN
                || code == &SqlState::CANNOT_CONNECT_NOW
                || code == &SqlState::TOO_MANY_CONNECTIONS
                || code == &SqlState::QUERY_CANCELED
                || code == &SqlState::LOCK_NOT_AVAILABLE
                || code.code().starts_with("08") // connection exceptions
                || code.code().starts_with("53") // insufficient resources
                || code.code().starts_with("57") // operator intervention
        });
    if transient {
        StoreError::Unavailable(e.into())
    } else {
        StoreError::Internal(e.into())
    }
}

/// A failure to get a connection from the pool, sorted with [`classify`].
pub fn classify_pool(e: PoolError) -> StoreError {
    classify_pool_with(e, classify)
}

/// A failure to get a connection: the database's own refusal is sorted by `classify` (a
/// refused login is a misconfiguration, a server shutting down is transient); everything
/// else about the pool (timeouts, closed) means the database cannot be reached right now.
/// None of them is a reason for a `500`.
pub fn classify_pool_with(
    e: PoolError,
    classify: impl FnOnce(tokio_postgres::Error) -> StoreError,
) -> StoreError {
    match e {
        PoolError::Backend(e) => match classify(e) {
            StoreError::Internal(cause) => StoreError::Unavailable(cause),
            other => other,
        },
        other => StoreError::Unavailable(other.into()),
    }
}
