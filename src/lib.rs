//! fencelock: a lease server that hands out time-limited locks with fencing tokens.
//!
//! # Layout
//! - [`config`]: flags and environment, parsed into [`config::Settings`].
//! - [`startup`]: [`startup::Application`], built the same way by `main` and the tests.
//! - [`domain`]: validated types (`ResourceName`, `Owner`, `Ttl`, `Fence`) and the store's
//!   requests and outcomes.
//! - [`input`]: request bodies into domain types, with the contract's order of checks.
//! - [`problem`]: the one error enum and its RFC 9457 rendering.
//! - [`guard`]: the write guard for protected services (`Fencing-Token`, atomic fence check).
//! - [`client`]: the worker client (acquire/renew/release/inspect, bounded retry, a
//!   self-renewing `Lease` that reports its loss).
//! - [`routes`]: HTTP handlers and the request middleware.
//! - [`store`]: the [`store::LeaseStore`] trait, PostgreSQL and SQLite.
//! - [`shutdown`], [`telemetry`]: process signals and logging.

pub mod client;
pub mod config;
pub mod domain;
pub mod guard;
pub mod input;
pub mod problem;
pub mod routes;
pub mod shutdown;
pub mod startup;
pub mod store;
pub mod telemetry;
