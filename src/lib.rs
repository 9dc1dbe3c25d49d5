#![warn(unreachable_pub)]
//! The fencelock lease server: time-limited locks with fencing tokens over HTTP, on
//! PostgreSQL (any number of stateless instances share one database, whose clock decides
//! expiry) or on an embedded SQLite file.
//!
//! Everything here is private to the server. What other crates of this repository use (the
//! test kit, the demo, the benchmarks) is the small façade at the bottom of this file; the
//! types a worker or a protected service needs live in the `fencelock` library.
//!
//! # Layers
//! Each layer uses only the layers above it in this list (and the `fencelock` library),
//! never one below; the modules of one layer may use each other, without a circle
//! (`scripts/check-imports` checks both):
//!
//! 1. `auth` (the bearer tokens of `--auth-file`: the file's validated form, the
//!    constant-time lookup of a secret, reload on `SIGHUP`), `shutdown` and `tls`.
//! 2. `wake`: the registry of who waits for which resource to change (waiting
//!    acquisitions, watches) and the queue lines of waiters; it knows no store.
//! 3. `store`: the `LeaseStore` trait, its configuration and its chores, and the
//!    PostgreSQL and SQLite stores. It knows nothing of HTTP.
//! 4. `waiting` (on `store` and `wake`): waiting acquisitions (`wait_ms`), the loop that
//!    queues a request and tries again on every change the store announces.
//! 5. `config`: the command line and the settings it makes.
//! 6. `routes` (on all of the above): the handlers: parse, ask the store, render; and
//!    `refusal`, the problem documents for requests the HTTP parser refuses.
//! 7. `startup`, `telemetry`, `lock_command`, `guard_command`, `cli_files`, `run`: the
//!    process: the app built the same way by `main` and the tests, logging, `fencelock
//!    lock`, `fencelock guard`, the completion scripts and manual pages, the command line's
//!    dispatch.

mod auth;
mod cli_files;
mod config;
mod guard_command;
mod lock_command;
mod refusal;
mod routes;
mod run;
mod shutdown;
mod startup;
mod store;
mod telemetry;
mod tls;
mod waiting;
mod wake;

// The façade: what the test kit, the demo and the benchmarks use of the server.
pub use config::{LogFormat, Settings};
pub use refusal::{count_refusals, install_refusal_renderer};
pub use run::main;
pub use shutdown::stop_on_signal;
pub use startup::{Application, raise_open_file_limit};
pub use store::{
    DEFAULT_POOL_SIZE, DEFAULT_STORE_TIMEOUT_MS, Deadline, LeaseStore, SharedStore, StoreConfig,
    StoreError, StoreOptions,
};
pub use telemetry::{LogGuard, init as init_logs, init_with_default as init_logs_with_default};
pub use tls::server_config as tls_server_config;

/// The bearer tokens of `--auth-file`, for tests that write and reload one.
pub mod auth_file {
    pub use crate::auth::{Auth, Tokens, hex, sha256};
}

/// The PostgreSQL store's connection settings and helpers, for services beside the lease
/// store (the demo store) and tests.
pub mod postgres {
    pub use crate::store::postgres::{
        COMMITTERS, PgConfig, Pooling, classify, classify_pool, pool,
    };
}

/// The SQLite store's helpers, for services beside the lease store (the demo store).
pub mod sqlite {
    pub use crate::store::sqlite::{classify, connect};
}
