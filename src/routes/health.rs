//! Liveness and readiness.

use actix_web::{HttpResponse, web};
use serde_json::json;

use super::AppState;
use crate::problem::ApiError;

/// `200` while the process runs; touches nothing else.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

/// `200` when the store answers a trivial query in time, else `503 store-unavailable`.
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    state.ask(state.store.ping()).await?;
    Ok(HttpResponse::Ok().json(json!({ "status": "ready" })))
}
