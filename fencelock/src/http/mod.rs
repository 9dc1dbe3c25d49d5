//! The HTTP toolkit every fencelock service shares: the lease server, the demo store, and any
//! service that uses the write guard. It knows the contract's problem types, but nothing of
//! how leases are stored.
//!
//! - [`problem`]: the one error type, [`ApiError`], and its RFC 9457 rendering.
//! - [`body`]: reading a request body with the contract's order of checks, and strict
//!   readers for one field's raw JSON text.
//! - [`middleware`]: [`observe`], which every app wraps around its routes: it writes each
//!   problem document (with its `instance`) and logs each request.
//! - [`metrics`]: [`metrics::count`], the middleware that counts and times every answer
//!   by route pattern, and [`metrics::expose`], the `GET /metrics` handler.
//! - [`openapi`]: what every service's OpenAPI document shares: the problem schema, the
//!   problem answers of an operation, `/metrics` and `/openapi.json`.
//! - [`query`]: a query string's known parameters, each at most once, and plain decimals.
//! - [`resource`], [`not_found`] and [`not_allowed`]: the answers for wrong methods and
//!   unknown paths.

pub mod body;
pub mod metrics;
pub mod middleware;
pub mod openapi;
pub mod problem;
pub mod query;

use actix_web::{HttpRequest, HttpResponse};

pub use middleware::observe;

/// Largest request body accepted (`413` beyond). Here, not in `body`, because the problem
/// type names it too.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
pub use problem::{ApiError, FieldError};

/// An app's default service: no route matched the path.
pub async fn not_found(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound(format!(
        "no route for {}",
        middleware::instance_of(req.uri())
    )))
}

/// A path whose methods are added with `.route(...)`; any other method answers `405` with
/// `allow` as its `Allow` list.
pub fn resource(path: &str, allow: &'static str) -> actix_web::Resource {
    actix_web::web::resource(path).default_service(actix_web::web::to(not_allowed(allow)))
}

/// A handler answering `405` with the given `Allow` list; for a resource's default service.
pub fn not_allowed(
    allow: &'static str,
) -> impl Fn(HttpRequest) -> std::future::Ready<Result<HttpResponse, ApiError>> + Clone {
    move |req: HttpRequest| {
        std::future::ready(Err(ApiError::MethodNotAllowed {
            method: req.method().to_string(),
            allow,
        }))
    }
}
