//! Liveness and readiness.

use actix_web::{HttpResponse, web};
use serde_json::json;

use super::AppState;
use crate::http::ApiError;

/// `200` while the process runs; touches nothing else.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

/// `200` when the store accepts a write in time, else `503 store-unavailable` whose detail
/// names the cause: a store that can be read but not written cannot hand out leases.
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    match state.ask(state.store.ping()).await {
        Ok(()) => Ok(HttpResponse::Ok().json(json!({ "status": "ready" }))),
        Err(e) => Err(e.naming_the_cause()),
    }
}
