//! The lease server's routes: each handler parses its request (`parse`), asks the store,
//! and renders the outcome. The HTTP toolkit they stand on is [`fencelock::http`].
//!
//! The handlers (`locks`, `listing`, `history`, `watch`, `health`) stand on what they share:
//! `parse`, `auth`, `metrics`, `wire` (the shapes of their requests and their problem
//! answers, for the OpenAPI document) and `view` (the lock object). `openapi` stands above
//! them all: it gathers their paths into the document.

pub(crate) mod auth;
mod health;
mod history;
mod listing;
mod locks;
pub(crate) mod metrics;
pub(crate) mod openapi;
mod parse;
mod view;
mod watch;
mod wire;

use std::time::Duration;

use actix_web::middleware::from_fn;
use actix_web::web;

use crate::store::metered::StoreMetrics;
use crate::store::{self, Deadline, SharedStore, StoreError};
use fencelock::domain::{FenceKey, Ttl};
use fencelock::http::{self, ApiError, resource};

/// How much longer than a write's deadline its request waits for the store's answer. The
/// store refuses work whose deadline has passed, so normally its own answer (done, or `503`
/// and not done) arrives in time; this bound only ends the wait for a store that does not
/// answer at all. Work that began just before the deadline gets this long to commit, so
/// that its real outcome, not a `503`, reaches the client.
const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// What every handler shares.
pub(crate) struct AppState {
    pub store: SharedStore,
    pub max_ttl: Ttl,
    /// `--max-wait-ms`: the largest `wait_ms` of an acquisition.
    pub max_wait_ms: u32,
    /// Longest a request waits on the store; past it the answer is `503`, never a hang.
    pub store_timeout: Duration,
    pub metrics: metrics::LeaseMetrics,
    /// Signs the `fence_token` of the lock objects given to holders; `None`: none is given.
    pub fence_key: Option<FenceKey>,
}

impl AppState {
    /// The bounds a request's fields are checked against.
    fn limits(&self) -> parse::Limits {
        parse::Limits {
            max_ttl: self.max_ttl,
            max_wait_ms: self.max_wait_ms,
        }
    }

    /// Awaits a store read within the store timeout.
    async fn ask<T>(
        &self,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, ApiError> {
        bounded(self.store_timeout, &self.metrics.store, operation).await
    }

    /// Runs a store write that must not take effect after `store_timeout` (see [`Deadline`]).
    async fn write<T, F>(&self, operation: impl FnOnce(Deadline) -> F) -> Result<T, ApiError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        let deadline = Deadline::after(self.store_timeout);
        bounded(
            self.store_timeout + ANSWER_GRACE,
            &self.metrics.store,
            operation(deadline),
        )
        .await
    }
}

/// Awaits `operation` for at most `limit`; giving up is counted as a store timeout.
async fn bounded<T>(
    limit: Duration,
    metrics: &StoreMetrics,
    operation: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, ApiError> {
    match tokio::time::timeout(limit, operation).await {
        Ok(result) => store_answer(result),
        Err(_) => {
            metrics.timed_out();
            Err(ApiError::StoreUnavailable(anyhow::anyhow!(
                "the store did not answer within {limit:?}"
            )))
        }
    }
}

/// The store's answer as the handler's: failures that will not heal by waiting are reported
/// loudly (once in a while) before they become a `503`.
fn store_answer<T>(result: Result<T, StoreError>) -> Result<T, ApiError> {
    match result {
        Err(StoreError::NotWritable(cause)) => {
            store::report_lasting(
                "the lease store refuses writes; every write answers 503 until it is writable again",
                &cause,
            );
            Err(ApiError::StoreNotWritable(cause))
        }
        Err(StoreError::Misconfigured(cause)) => {
            store::report_lasting(
                "the lease store cannot be used as configured; every request that needs it answers 503 until it is fixed",
                &cause,
            );
            Err(ApiError::StoreUnavailable(cause))
        }
        result => result.map_err(ApiError::from),
    }
}

/// Registers every route: health and readiness, the metrics and the OpenAPI document
/// (unprefixed only), and the lock routes both as `/locks...` and as `/v1/locks...`. Each path
/// answers other methods with `405` and an `Allow` header;
/// unknown paths get a `404` problem from the app's default service.
pub(crate) fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/healthz", "GET").route(web::get().to(health::healthz)))
        .service(resource("/readyz", "GET").route(web::get().to(health::readyz)))
        .service(resource("/metrics", "GET").route(web::get().to(http::metrics::expose)))
        .service(resource("/openapi.json", "GET").route(web::get().to(openapi::serve)))
        .configure(lock_routes)
        // The same contract under a version prefix; the unprefixed paths stay.
        .service(web::scope("/v1").configure(lock_routes));
}

/// `/locks/...` and `GET /locks` (the list). `[^/]*` also matches an empty segment, so
/// `/locks/` reaches the handlers and gets the contract's `422` for an empty resource name
/// instead of a bare `404`. Every lock route checks the bearer token first
/// ([`auth::authenticate`]), before its `405`, its body and its path.
fn lock_routes(cfg: &mut web::ServiceConfig) {
    let guarded = |path: &str, allow| resource(path, allow).wrap(from_fn(auth::authenticate));
    cfg.service(
        guarded("/locks/{resource:[^/]*}", "GET, POST, DELETE")
            .route(web::post().to(locks::acquire))
            .route(web::get().to(locks::inspect))
            .route(web::delete().to(locks::release)),
    )
    .service(
        guarded("/locks/{resource:[^/]*}/release", "POST").route(web::post().to(locks::release)),
    )
    .service(guarded("/locks/{resource:[^/]*}/renew", "POST").route(web::post().to(locks::renew)))
    .service(
        guarded("/locks/{resource:[^/]*}/history", "GET").route(web::get().to(history::history)),
    )
    .service(guarded("/locks/{resource:[^/]*}/watch", "GET").route(web::get().to(watch::watch)))
    .service(guarded("/locks", "GET").route(web::get().to(listing::list)));
}
