//! HTTP routes, and the middleware every request passes through.

mod health;
mod locks;
mod observe;

use std::time::Duration;

use actix_web::{HttpRequest, web};

pub use observe::{install_refusal_renderer, instance_of, observe};

use crate::domain::Ttl;
use crate::problem::ApiError;
use crate::store::{SharedStore, StoreError};

/// What every handler shares.
pub struct AppState {
    pub store: SharedStore,
    pub max_ttl: Ttl,
    /// Longest a request waits on the store; past it the answer is `503`, never a hang.
    pub store_timeout: Duration,
}

impl AppState {
    /// Awaits a store operation within the store timeout.
    async fn ask<T>(
        &self,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, ApiError> {
        match tokio::time::timeout(self.store_timeout, operation).await {
            Ok(result) => result.map_err(ApiError::from),
            Err(_) => Err(ApiError::StoreUnavailable(anyhow::anyhow!(
                "the store did not answer within {:?}",
                self.store_timeout
            ))),
        }
    }
}

/// Registers every route. Each resource answers other methods with `405` and an `Allow`
/// header; unknown paths get a `404` problem from the app's default service.
pub fn configure(cfg: &mut web::ServiceConfig) {
    // `[^/]*` also matches an empty segment, so `/locks/` reaches the handlers and gets the
    // contract's `422` for an empty resource name instead of a bare `404`.
    cfg.service(
        web::resource("/healthz")
            .route(web::get().to(health::healthz))
            .default_service(web::to(not_allowed("GET"))),
    )
    .service(
        web::resource("/readyz")
            .route(web::get().to(health::readyz))
            .default_service(web::to(not_allowed("GET"))),
    )
    .service(
        web::resource("/locks/{resource:[^/]*}")
            .route(web::post().to(locks::acquire))
            .route(web::get().to(locks::inspect))
            .route(web::delete().to(locks::release))
            .default_service(web::to(not_allowed("GET, POST, DELETE"))),
    )
    .service(
        web::resource("/locks/{resource:[^/]*}/release")
            .route(web::post().to(locks::release))
            .default_service(web::to(not_allowed("POST"))),
    )
    .service(
        web::resource("/locks/{resource:[^/]*}/renew")
            .route(web::post().to(locks::renew))
            .default_service(web::to(not_allowed("POST"))),
    );
}

/// The app's default service: no route matched the path.
pub async fn not_found(req: HttpRequest) -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::NotFound(format!(
        "no route for {}",
        instance_of(req.uri())
    )))
}

/// A handler answering `405` with the given `Allow` list; for a resource's default service.
pub fn not_allowed(
    allow: &'static str,
) -> impl Fn(HttpRequest) -> std::future::Ready<Result<actix_web::HttpResponse, ApiError>> + Clone {
    move |req: HttpRequest| {
        std::future::ready(Err(ApiError::MethodNotAllowed {
            method: req.method().to_string(),
            allow,
        }))
    }
}
