//! fencelock's integration tests: one binary, real servers on port 0, real stores.
//!
//! Rules of the HTTP contract are written once, as `async fn rule(kind: StoreKind)`, and
//! [`contract!`] runs each against both stores.

/// Instantiates contract tests for PostgreSQL and SQLite.
macro_rules! contract {
    ($($rule:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    super::$rule(crate::helpers::StoreKind::Postgres).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    super::$rule(crate::helpers::StoreKind::Sqlite).await
                }
            )*
        }
    };
}

mod helpers;

mod acquire;
mod client;
mod concurrency;
mod connections;
mod health;
mod input;
mod inspect;
mod outage;
mod process;
mod protocol;
mod purge;
mod release;
mod renew;
mod restart;
