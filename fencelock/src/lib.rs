#![doc = include_str!("../README.md")]
//!
//! # This crate
//!
//! This crate is what a worker or a protected service depends on: the validated domain
//! types, the worker client of the fencelock lease server, and the write guard that lets a
//! protected service refuse writes from a holder whose lease has passed. The lease server
//! itself is the `fencelock-server` crate, whose binary is `fencelock`; nothing here depends
//! on it.
//!
//! # Layers
//! Each module uses only the modules above it in this list, never one below:
//!
//! 1. [`domain`]: validated types (`ResourceName`, `Owner`, `Ttl`, `Fence`), the lease
//!    server's requests and outcomes, and the lease rules as pure functions
//!    (`domain::decide`); with `fence-token`, `FenceKey` and the signed `fence_token` format
//!    (`domain::fence_token`).
//! 2. [`store_error`]: how a database failure is sorted (`503` while a retry may help,
//!    `500` for a bug), shared by the guard and the lease server's stores.
//! 3. [`metrics`] (with `http`): the name, help text and label values of every metric
//!    family, in one place.
//! 4. [`http`] (with `http`): the HTTP toolkit every fencelock service shares: problem
//!    documents (RFC 9457), body reading, the request middleware, `GET /metrics`, the parts
//!    every OpenAPI document shares.
//! 5. [`guard`] (with `guard-postgres` or `guard-sqlite`): the write guard
//!    (`Fencing-Token`, the signature check, the atomic fence check in the write's own
//!    transaction), with its own error type, [`guard::GuardError`].
//!
//! [`client`] stands apart, on [`domain`] alone: the worker client (acquire, renew, release,
//! inspect, list, bounded retry, waiting acquisition, a self-renewing `Lease`).
//!
//! # Features
//! - `client` (default): the worker client, without actix-web, SQLite or PostgreSQL.
//! - `guard-postgres`, `guard-sqlite`: the write guard for a service whose data lives in
//!   PostgreSQL or SQLite; either brings in `http` and `fence-token`.
//! - `fence-token`: `FenceKey` and signed fences (`hmac`, `sha2`, `base64`).
//! - `http`: the HTTP toolkit alone, with [`metrics`].
//!
//! Every dependency is a stock release from crates.io: a crate outside this repository
//! builds any of these features with no `[patch]`.

pub mod domain;
pub mod store_error;

#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "guard")]
pub mod guard;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "http")]
pub mod metrics;

pub use store_error::StoreError;
