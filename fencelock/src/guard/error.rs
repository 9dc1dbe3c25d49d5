//! The guard's one error type, and its problem response.

use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use crate::StoreError;
use crate::domain::Fence;
use crate::http::ApiError;
use crate::http::problem::PROBLEM_JSON;

/// Why the guard refused a write, or could not decide. Nothing was written in any case.
///
/// As an actix-web error it answers with its own problem document. A service that renders
/// its errors through the HTTP toolkit converts it into an [`ApiError`] with `?`.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// No `Fencing-Token` header: `428 fencing-token-required`.
    #[error("{0}")]
    TokenRequired(String),
    /// The header is not a fence (nor, with keys, a token): `400 malformed-request`.
    #[error("{0}")]
    NotAToken(String),
    /// The guard has keys, and the token is not one of them signed for the key written:
    /// forged, of another key, or a bare fence. `403 invalid-fence-token`.
    #[error("{0}")]
    InvalidToken(String),
    /// A greater fence has written to `key` already: the writer's lease has passed.
    /// `409 stale-fence` with `current_fence`.
    #[error(
        "a write with fence {current} has been accepted for {key}; this writer's lease has passed"
    )]
    Stale { key: String, current: Fence },
    /// The guard's table could not be read or written: `503` while a retry may help (with
    /// `Retry-After`), `500` for a bug. Sort database errors with
    /// `guard::postgres::classify` or `guard::sqlite::classify`.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Seconds a writer should wait before retrying when the guard's store is unavailable.
const RETRY_AFTER_SECONDS: &str = "1";

impl GuardError {
    /// The HTTP status of this refusal.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::TokenRequired(_) => StatusCode::PRECONDITION_REQUIRED,
            Self::NotAToken(_) => StatusCode::BAD_REQUEST,
            Self::InvalidToken(_) => StatusCode::FORBIDDEN,
            Self::Stale { .. } => StatusCode::CONFLICT,
            Self::Store(StoreError::Internal(_)) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The problem type's slug (API.md, *Errors*).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::TokenRequired(_) => "fencing-token-required",
            Self::NotAToken(_) => "malformed-request",
            Self::InvalidToken(_) => "invalid-fence-token",
            Self::Stale { .. } => "stale-fence",
            Self::Store(StoreError::Internal(_)) => "internal",
            Self::Store(_) => "store-unavailable",
        }
    }

    /// The detail shown to the writer: a store failure's cause stays in the log.
    fn detail(&self) -> String {
        match self {
            Self::Store(StoreError::Internal(_)) => "internal error".to_owned(),
            Self::Store(_) => "the guard's store is unavailable; retry shortly".to_owned(),
            other => other.to_string(),
        }
    }
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    detail: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_fence: Option<Fence>,
}

impl ResponseError for GuardError {
    fn status_code(&self) -> StatusCode {
        self.status()
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status();
        if let Self::Store(cause) = self {
            tracing::warn!(error = %cause, "the guard could not decide a write");
        }
        let current_fence = match self {
            Self::Stale { current, .. } => Some(*current),
            _ => None,
        };
        let body = Problem {
            kind: self.kind(),
            title: status.canonical_reason().unwrap_or("Error"),
            status: status.as_u16(),
            detail: &self.detail(),
            current_fence,
        };
        let mut response = HttpResponse::build(status);
        response.insert_header((header::CONTENT_TYPE, PROBLEM_JSON));
        if matches!(self, Self::Store(e) if !matches!(e, StoreError::Internal(_))) {
            response.insert_header((header::RETRY_AFTER, RETRY_AFTER_SECONDS));
        }
        response.body(serde_json::to_vec(&body).expect("a problem document serialises"))
    }
}

/// For services that render their errors through the HTTP toolkit (which adds `instance`
/// and `request_id` to every problem).
impl From<GuardError> for ApiError {
    fn from(e: GuardError) -> Self {
        match e {
            GuardError::TokenRequired(detail) => Self::FencingTokenRequired(detail),
            GuardError::NotAToken(detail) => Self::Malformed(detail),
            GuardError::InvalidToken(detail) => Self::InvalidFenceToken(detail),
            stale @ GuardError::Stale { current, .. } => Self::StaleFence {
                detail: stale.to_string(),
                current_fence: Some(current),
            },
            GuardError::Store(e) => e.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use actix_web::body::MessageBody as _;

    use super::*;

    fn problem(error: GuardError) -> (StatusCode, serde_json::Value) {
        let response = error.error_response();
        let status = response.status();
        let bytes = response.into_body().try_into_bytes().expect("a fixed body");
        (status, serde_json::from_slice(&bytes).expect("JSON"))
    }

    #[test]
    fn every_refusal_answers_with_its_problem_document() {
        let current = Fence::new(7).unwrap();
        let (status, body) = problem(GuardError::Stale {
            key: "k".to_owned(),
            current,
        });
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(body["type"], "stale-fence");
        assert_eq!(body["status"], 409);
        assert_eq!(body["current_fence"], 7);
        let (status, body) = problem(GuardError::TokenRequired("send it".to_owned()));
        assert_eq!(
            (status.as_u16(), &body["type"]),
            (428, &"fencing-token-required".into())
        );
        let (status, body) = problem(GuardError::Store(StoreError::unavailable("down")));
        assert_eq!(
            (status.as_u16(), &body["type"]),
            (503, &"store-unavailable".into())
        );
        assert!(!body["detail"].as_str().unwrap().contains("down"));
        let (status, body) = problem(GuardError::Store(StoreError::Internal(anyhow::anyhow!(
            "secret"
        ))));
        assert_eq!((status.as_u16(), &body["type"]), (500, &"internal".into()));
        assert!(!body.to_string().contains("secret"));
    }

    #[test]
    fn the_toolkit_renders_the_same_problem_types() {
        for error in [
            GuardError::TokenRequired(String::new()),
            GuardError::NotAToken(String::new()),
            GuardError::InvalidToken(String::new()),
            GuardError::Stale {
                key: "k".to_owned(),
                current: Fence::new(1).unwrap(),
            },
            GuardError::Store(StoreError::unavailable("down")),
        ] {
            let (status, kind) = (error.status(), error.kind());
            assert_eq!(ApiError::from(error).status_and_type(), (status, kind));
        }
    }
}
