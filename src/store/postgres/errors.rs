//! Sorting PostgreSQL's failures into the store's errors.

use deadpool_postgres::PoolError;

use super::{statements, tls};
use crate::store::StoreError;

/// Whether `error` is a database URL that leads somewhere other than `--pg-pooling` says.
pub(crate) fn is_pooling_mismatch(error: &StoreError) -> bool {
    matches!(error, StoreError::Misconfigured(cause) if cause.downcast_ref::<statements::PoolingMismatch>().is_some())
}

/// The one place PostgreSQL failures are sorted, by SQLSTATE and connection state, never by
/// the server's message text: a TLS setting that cannot work (a failed handshake, a server
/// without TLS for an `sslmode` that requires it) and a refused login or database are
/// `Misconfigured` (`503`, reported loudly); connection loss, timeouts and a busy or
/// restarting server are `Unavailable` (`503`); a database that refuses writes is
/// `NotWritable` (`503`); anything else (a bad statement, a broken schema) is `Internal`
/// (`500`). Public so that services beside the lease store (the demo store) sort their own
/// failures the same way.
pub fn classify(e: tokio_postgres::Error) -> StoreError {
    if let Some(cause) = tls::handshake_failure(&e) {
        // Not `e` itself: its text ("error performing TLS handshake") adds nothing.
        return StoreError::Misconfigured(anyhow::anyhow!(
            "TLS with PostgreSQL failed ({cause}); check sslmode, sslrootcert and the server's certificate"
        ));
    }
    if tls::server_refused_tls(&e) {
        return StoreError::Misconfigured(anyhow::anyhow!(
            "the PostgreSQL server does not support TLS (its ssl setting is off), but \
             sslmode=require (or verify-ca, verify-full) insists on it; turn ssl on at the \
             server, or use sslmode=prefer or disable"
        ));
    }
    match e.code() {
        Some(code) if code.code() == DEADLINE_PASSED => StoreError::too_late(),
        Some(code) if code.code() == CHANGED_MEANWHILE => StoreError::unavailable(
            "a lease was changed or held from outside fencelock while it was decided; try again",
        ),
        // PgBouncer refuses the `options` startup parameter (unless told to ignore it): said
        // with the lease server's own remedy.
        Some(code)
            if code == &tokio_postgres::error::SqlState::PROTOCOL_VIOLATION
                && e.as_db_error()
                    .is_some_and(|db| db.message().contains("unsupported startup parameter")) =>
        {
            StoreError::Misconfigured(anyhow::Error::new(e).context(
                "the server at the database URL refuses the `options` startup parameter, as PgBouncer does, which carries each session's settings (statement_timeout, synchronous_commit): through PgBouncer, start with --pg-pooling session or --pg-pooling transaction, as its pool_mode; or connect to PostgreSQL itself",
            ))
        }
        // A prepared statement this connection made is gone from its session, or one it never
        // made is there: the session is another client's too, as behind a pooler in
        // transaction pooling that the start did not detect (`statements::pooling_mismatch`
        // finds it often, not always). Not a fault of the request: `503`, said loudly.
        Some(code)
            if code == &tokio_postgres::error::SqlState::DUPLICATE_PSTATEMENT
                || code == &tokio_postgres::error::SqlState::INVALID_SQL_STATEMENT_NAME =>
        {
            StoreError::Misconfigured(anyhow::Error::new(statements::PoolingMismatch::shared(e)))
        }
        _ => fencelock::guard::postgres::classify(e),
    }
}

/// Raised by `fencelock_apply` when a request's deadline passed before its decision was
/// committed (see the migration): nothing was written.
const DEADLINE_PASSED: &str = "FL408";

/// Raised by `fencelock_apply` when a lease was changed between its look and its write, or its
/// row held past the request's deadline, by a writer that did not take the resource's lock
/// (see the migration): nothing was written.
const CHANGED_MEANWHILE: &str = "FL409";

/// A failure to get a connection, sorted as [`classify`] sorts the database's own refusals
/// (none of them a reason for a `500`).
pub fn classify_pool(e: PoolError) -> StoreError {
    fencelock::guard::postgres::classify_pool_with(e, classify)
}
