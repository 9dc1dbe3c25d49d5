//! Liveness and readiness.

use actix_web::{HttpResponse, web};
use serde::Serialize;

use super::{AppState, wire};
use fencelock::http::ApiError;

/// The answer of `/healthz` (`ok`) and `/readyz` (`ready`).
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct Status {
    #[schema(value_type = String, examples("ok", "ready"))]
    status: &'static str,
}

/// `200` while the process runs; touches nothing else.
#[utoipa::path(
    get, path = "/healthz", tag = "operations", summary = "200 while the process runs",
    responses((status = 200, body = Status, description = "The process runs")),
)]
pub(super) async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Status { status: "ok" })
}

/// `200` when the store accepts a write in time, else `503 store-unavailable` whose detail
/// names the cause: a store that can be read but not written cannot hand out leases.
#[utoipa::path(
    get, path = "/readyz", tag = "operations",
    summary = "200 when the store accepts writes, else 503",
    responses((status = 200, body = Status, description = "Store writable"), wire::ReadyProblems),
)]
pub(super) async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    match state.ask(state.store.ping()).await {
        Ok(()) => Ok(HttpResponse::Ok().json(Status { status: "ready" })),
        Err(e) => Err(e.naming_the_cause()),
    }
}
