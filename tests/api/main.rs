//! fencelock's integration tests: one binary, real servers on port 0, real stores.
//!
//! Rules of the HTTP contract are written once, as `async fn rule(kind: StoreKind)`, and
//! `contract!` (from `fencelock_testkit`) runs each against both stores.

#[macro_use]
extern crate fencelock_testkit;

mod helpers;

mod acquire;
mod announcements;
mod auth;
mod client;
mod cluster_tls;
mod concurrency;
mod connections;
mod decisions;
mod errors;
mod fence_sequence;
mod group_commit;
mod guard_mysql;
mod guard_sql;
mod half_close;
mod handover;
mod health;
mod history;
mod input;
mod inspect;
mod late_work;
mod listing;
mod liveness;
mod lock_command;
mod lock_delay;
mod metrics;
mod migration_lock;
mod misconfig;
mod openapi;
mod outage;
mod packaging;
mod pgbouncer;
mod plans;
pub mod process;
mod protocol;
mod purge;
mod read_only;
mod readme;
mod release;
mod renew;
mod restart;
mod signed_fences;
mod tls;
mod waiting;
mod watch;
