//! The one middleware: turns every error into a problem document for its request path, logs
//! server-side errors once (with their cause, which the client never sees), and writes one
//! line per request.

use std::time::Instant;

use actix_web::Error;
use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;

use crate::problem::ApiError;

pub async fn observe(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.path().to_owned();

    let response = next.call(req).await?;
    let response = match response.response().error() {
        None => response.map_into_boxed_body(),
        Some(error) => {
            let fallback;
            let api = match error.as_error::<ApiError>() {
                Some(api) => api,
                None => {
                    fallback = ApiError::from_status(response.status());
                    &fallback
                }
            };
            match api {
                ApiError::Internal(cause) => {
                    tracing::error!(http.method = %method, http.path = %path, error = ?cause, "internal error");
                }
                ApiError::StoreUnavailable(cause) | ApiError::StoreNotWritable(cause) => {
                    tracing::warn!(http.method = %method, http.path = %path, error = %format!("{cause:#}"), "store unavailable");
                }
                ApiError::NotReady(cause) => {
                    tracing::warn!(http.method = %method, http.path = %path, error = %cause, "store not ready");
                }
                _ => {}
            }
            let problem = api.to_problem(&path);
            response.into_response(problem).map_into_boxed_body()
        }
    };

    tracing::info!(
        http.method = %method,
        http.path = %path,
        http.status = response.status().as_u16(),
        duration_ms = started.elapsed().as_secs_f64() * 1000.0,
        "request"
    );
    Ok(response)
}
