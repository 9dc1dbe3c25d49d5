//! Test support for fencelock and the services beside it, shared by the lease server's
//! integration tests (`tests/api`) and the demo store's tests, so that each harness exists
//! once. Used only by tests (`publish = false`).
//!
//! It depends on `fencelock` itself: [`TestApp`] builds the real server with
//! `startup::Application`, and [`TestDb`] hands out the lease store's `StoreConfig`. The
//! storage and proxy parts know nothing of the lease server's internals, so a test of any
//! service (the demo store, a service using the guard) can use them.
//!
//! # Layout
//! - `storage`: fresh storage per test. [`StoreKind`]; [`admin_url`] (from
//!   `FENCELOCK_TEST_DATABASE_URL`, where an unreachable PostgreSQL fails the test, never
//!   skips it), [`admin`], [`pg_connect`], [`first_column`], [`postgres_addr`]; [`TestDb`], a PostgreSQL
//!   database or a SQLite file dropped with the value, with the operator's tools the tests use
//!   behind the store's back (age a lease or a history, count rows, set the fence counter, run
//!   SQL); and
//!   [`RowLock`].
//! - `server`: [`TestApp`], a lease server on port 0 over a [`TestDb`], with request helpers;
//!   [`client`], [`assert_problem`], [`assert_invalid`], [`invalid_fields`], [`fence`],
//!   [`assert_public_lock`], [`sorted_keys`], [`token_entry`] (of an auth file) and [`TTL`];
//!   [`json_answer`] (any request's JSON answer) and [`watch_in_background`].
//! - [`contract!`]: runs rules written once, as `async fn rule(kind: StoreKind)`, against
//!   both stores.
//! - [`Proxy`]: a TCP proxy between a service and its upstream (PostgreSQL, a lease server)
//!   that can freeze (a network partition: bytes stop, nothing is reset), thaw and cut.
//! - `raw`: [`raw_exchange`] sends bytes no HTTP client would and parses the answer
//!   ([`RawResponse`], [`assert_raw_problem`]).
//! - `exposition`: [`Exposition`], a `GET /metrics` answer parsed into samples, looked up by
//!   name and labels; [`TestApp::metrics`] fetches one.
//! - [`curl`]: the documentation's `curl` commands, played against a fresh service.
//! - [`openapi`]: checks of a service's OpenAPI document against the live service.
//! - `cluster`: [`PrivateCluster`], a PostgreSQL cluster of the test's own (from the
//!   installed server binaries, on a free port) whose TLS rules ([`ClusterTls`]) the shared
//!   test server cannot be made to have: TLS required, or not offered.
//! - `pgbouncer`: [`PgBouncer`], Debian's PgBouncer of the test's own in front of the test
//!   server, in session or transaction pooling; [`through_pgbouncer`] runs a test with its
//!   databases behind one, and [`through_pgbouncer!`] runs contract rules that way.
//! - [`closed_port`]: a local port nothing listens on, for "unreachable" tests.
//! - `output`: [`assert_succeeded`] and [`assert_failed_in_one_line`], for a command run to
//!   its end; [`find_line`] and [`logged_field`], for one still running.
//! - `wait`: [`eventually`], a bounded wait for what happens on its own time.

mod cluster;
pub mod curl;
mod exposition;
pub mod openapi;
mod output;
mod pgbouncer;
mod proxy;
mod raw;
mod server;
mod storage;
mod wait;

pub use cluster::{ClusterOptions, ClusterTls, PrivateCluster};
pub use exposition::{Exposition, Sample, TEXT_FORMAT};
pub use fencelock_server::postgres::Pooling;
pub use output::{assert_failed_in_one_line, assert_succeeded, find_line, logged_field};
pub use pgbouncer::{PgBouncer, through_pgbouncer};
pub use proxy::Proxy;
pub use raw::{RawResponse, assert_raw_problem, parse_raw, raw_exchange};
pub use server::{
    TTL, TestApp, assert_invalid, assert_problem, assert_public_lock, client, fence,
    invalid_fields, json_answer, sorted_keys, token_entry, under_v1, watch_in_background,
};
pub use storage::{
    RowLock, StoreKind, TestDb, admin, admin_url, first_column, lock_waiters, pg_connect,
    postgres_addr,
};
pub use wait::eventually;

/// Instantiates rules of the lease server's contract: each `rule`, an
/// `async fn rule(kind: StoreKind)` in the calling module, becomes the tests
/// `postgres::rule` and `sqlite::rule`, and `postgres_v1::rule` and `sqlite_v1::rule`, which
/// send every `/locks...` request of the rule to `/v1/locks...` instead (API.md, *Paths and
/// versions*: both serve the same contract). All run on a multi-threaded runtime.
///
/// The caller depends on `tokio` with the `macros` and `rt-multi-thread` features, as
/// `#[tokio::test]` requires.
#[macro_export]
macro_rules! contract {
    ($($rule:ident),* $(,)?) => {
        $crate::contract_stores!($($rule),*);
        $crate::rule_tests!(postgres_v1, Postgres, |rule| $crate::under_v1(rule), $($rule),*);
        $crate::rule_tests!(sqlite_v1, Sqlite, |rule| $crate::under_v1(rule), $($rule),*);
    };
}

/// Instantiates rules for PostgreSQL and SQLite: each `rule`, an
/// `async fn rule(kind: StoreKind)` in the calling module, becomes the tests
/// `postgres::rule` and `sqlite::rule` on a multi-threaded runtime. For services without the
/// lease server's paths (the demo store).
#[macro_export]
macro_rules! contract_stores {
    ($($rule:ident),* $(,)?) => {
        $crate::rule_tests!(postgres, Postgres, |rule| rule, $($rule),*);
        $crate::rule_tests!(sqlite, Sqlite, |rule| rule, $($rule),*);
    };
}

/// Runs contract rules (`async fn rule(kind: StoreKind)`) on PostgreSQL behind a PgBouncer of
/// each test's own: `pgbouncer_transaction::rule` in transaction pooling and
/// `pgbouncer_session::rule` in session pooling, every server of the rule started with
/// `--pg-pooling` to match (see [`through_pgbouncer`]).
#[macro_export]
macro_rules! through_pgbouncer {
    ($($rule:ident),* $(,)?) => {
        $crate::rule_tests!(
            pgbouncer_transaction,
            Postgres,
            |rule| $crate::through_pgbouncer($crate::Pooling::Transaction, rule),
            $($rule),*
        );
        $crate::rule_tests!(
            pgbouncer_session,
            Postgres,
            |rule| $crate::through_pgbouncer($crate::Pooling::Session, rule),
            $($rule),*
        );
    };
}

/// The module `module` of tests, one per `rule`: `module::rule` runs
/// `super::rule(StoreKind::$kind)` as the future `run` makes of it (`|rule| rule` for the
/// rule as it is), on a multi-threaded runtime. What [`contract`], [`contract_stores`] and
/// [`through_pgbouncer`] are made of.
#[doc(hidden)]
#[macro_export]
macro_rules! rule_tests {
    ($module:ident, $kind:ident, |$future:ident| $run:expr, $($rule:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    let $future = super::$rule($crate::StoreKind::$kind);
                    $run.await
                }
            )*
        }
    };
}

/// A port on 127.0.0.1 that nothing listens on: connecting to it is refused at once.
///
/// The port is taken from the OS and released again, so another process could in principle
/// bind it in between; on a test machine that is rare enough not to matter.
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("local address").port()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_port_refuses_connections() {
        let port = closed_port();
        let refused = std::net::TcpStream::connect(("127.0.0.1", port));
        assert!(refused.is_err(), "something listens on {port}");
    }
}
