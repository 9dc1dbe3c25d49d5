//! fencelock: a lease server that hands out time-limited locks with fencing tokens, the write
//! guard for the services it protects, and a client for the workers that hold leases.
//!
//! # Layers
//! Each layer uses only the layers above it in this list, never one below:
//!
//! 1. [`domain`]: validated types (`ResourceName`, `Owner`, `Ttl`, `Fence`), the store's
//!    requests and outcomes, and the lease rules as pure functions (`domain::decide`); with
//!    `fence-token`, `FenceKey` and the signed `fence_token` format shared by the lease
//!    server and the guard (`domain::fence_token`).
//! 2. [`store`]: the [`store::LeaseStore`] trait, its configuration and its purge chore, and
//!    the PostgreSQL and SQLite stores. It knows nothing of HTTP.
//! 3. [`http`]: the HTTP toolkit every fencelock service shares: the one error type and its
//!    RFC 9457 rendering (a store failure is a `503` or a `500`), body reading, the request
//!    middleware, the HTTP metrics and `GET /metrics`, `404`/`405` answers, the parts every
//!    OpenAPI document shares.
//!
//! [`metrics`] stands beside them all: the name, help text and label values of every metric
//! family, in one place, on [`domain`] alone; each app keeps its metrics in a registry of
//! its own.
//! 4. [`guard`] (on [`http`] and [`domain`]): the write guard for protected services
//!    (`Fencing-Token`, the signature check of `Guard`, the atomic fence check for
//!    PostgreSQL and SQLite).
//! 5. [`waiting`] (on [`store`]): waiting acquisitions (`wait_ms`), the loop that queues a
//!    request and tries again on every change the store announces.
//! 5. [`routes`] (on all of the above): the lease server's handlers: parse, ask the store,
//!    render.
//! 6. [`config`], [`startup`], [`shutdown`], [`telemetry`], [`tls`]: the server process:
//!    settings, the app built the same way by `main` and the tests, signals, logging, HTTPS.
//!
//! [`auth`] (with `server`, on [`domain`] alone) is the bearer tokens of `--auth-file`: the
//! file's validated form, the constant-time lookup of a secret, reload on `SIGHUP`. Its
//! HTTP side (the `401` before anything else, the `403` scope check) is `routes::auth`.
//!
//! [`client`] stands apart: the worker client (acquire/renew/release/inspect/list, bounded retry,
//! waiting acquisition, a self-renewing `Lease` and work run while holding it) on [`domain`]
//! alone. [`lock_command`] is `fencelock lock RESOURCE -- CMD`: [`client`] and a child
//! process (with `server`, whose binary it is part of).
//!
//! # Features
//! - `server` (default): the lease server, both stores, `fencelock lock` (so `client` too),
//!   and everything below.
//! - `client` (default): the worker client. `default-features = false, features =
//!   ["client"]` builds it without actix-web, SQLite or PostgreSQL.
//! - `guard-postgres`, `guard-sqlite` (both in `server`): the write guard for a service whose
//!   data lives in PostgreSQL or SQLite; either brings in `http`.
//! - `fence-token` (in `server` and in both `guard-*`): `FenceKey`, signed fences
//!   (`hmac`, `sha2`, `base64`; nothing of the server).
//! - `http`: the HTTP toolkit alone, with [`metrics`] (the `prometheus` crate). The
//!   `client` feature builds without either.

pub mod domain;

#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "guard")]
pub mod guard;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "http")]
pub mod metrics;

#[cfg(feature = "server")]
pub mod auth;
#[cfg(feature = "server")]
pub mod config;
#[cfg(feature = "server")]
pub mod lock_command;
#[cfg(feature = "server")]
pub mod routes;
#[cfg(feature = "server")]
pub mod shutdown;
#[cfg(feature = "server")]
pub mod startup;
#[cfg(feature = "server")]
pub mod store;
#[cfg(feature = "server")]
pub mod telemetry;
#[cfg(feature = "server")]
pub mod tls;
#[cfg(feature = "server")]
pub mod waiting;
