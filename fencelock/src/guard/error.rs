//! The guard's one error type, and its problem response.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

use crate::StoreError;
use crate::domain::Fence;
use crate::http::ApiError;

/// Why the guard refused a write, or could not decide. Nothing was written in any case.
///
/// As an actix-web error it answers with its own problem document. A service that renders
/// its errors through the HTTP toolkit converts it into an [`ApiError`] with `?`.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// No `Fencing-Token` header: `428 fencing-token-required`.
    #[error("{0}")]
    TokenRequired(String),
    /// The header is no token at all, whether or not the guard has keys: neither a fence
    /// nor a well-formed `<fence>.<signature>`. `400 malformed-request` (SQL: `FL400`).
    #[error("{0}")]
    NotAToken(String),
    /// The guard has keys, and the token is not one of them signed for the key written:
    /// forged, of another key, tampered, or a bare fence. `403 invalid-fence-token` (SQL:
    /// `FL403`).
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

impl GuardError {
    /// The HTTP status of this refusal.
    pub fn status(&self) -> StatusCode {
        self.answer().status_and_type().0
    }

    /// The problem type's slug (API.md, *Errors*).
    pub fn kind(&self) -> &'static str {
        self.answer().status_and_type().1
    }

    /// The toolkit's error this refusal answers as. A store failure's cause stays in the log:
    /// the answer carries none (the conversion into an [`ApiError`] keeps it).
    fn answer(&self) -> ApiError {
        match self {
            Self::TokenRequired(detail) => ApiError::FencingTokenRequired(detail.clone()),
            Self::NotAToken(detail) => ApiError::Malformed(detail.clone()),
            Self::InvalidToken(detail) => ApiError::InvalidFenceToken(detail.clone()),
            Self::Stale { current, .. } => ApiError::StaleFence {
                detail: self.to_string(),
                current_fence: Some(*current),
            },
            Self::Store(StoreError::Internal(_)) => {
                ApiError::Internal(anyhow::anyhow!("the guard's store failed"))
            }
            Self::Store(_) => {
                ApiError::StoreUnavailable(anyhow::anyhow!("the guard's store is unavailable"))
            }
        }
    }
}

/// The toolkit's head and problem document, without the `instance` and `request_id` that
/// `fencelock::http::observe` adds where it runs.
impl ResponseError for GuardError {
    fn status_code(&self) -> StatusCode {
        self.status()
    }

    fn error_response(&self) -> HttpResponse {
        if let Self::Store(cause) = self {
            tracing::warn!(error = %cause, "the guard could not decide a write");
        }
        self.answer().response_without_request()
    }
}

/// For services that render their errors through the HTTP toolkit (which adds `instance`
/// and `request_id` to every problem). A store failure keeps its cause, for the toolkit's
/// log.
impl From<GuardError> for ApiError {
    fn from(e: GuardError) -> Self {
        match e {
            GuardError::Store(e) => e.into(),
            refusal => refusal.answer(),
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
    fn only_an_unavailable_store_asks_for_a_retry() {
        let retry_after = |error: GuardError| {
            let response = error.error_response();
            let value = response.headers().get(actix_web::http::header::RETRY_AFTER);
            value.map(|v| v.to_str().unwrap().to_owned())
        };
        let unavailable = GuardError::Store(StoreError::unavailable("down"));
        assert_eq!(retry_after(unavailable).as_deref(), Some("1"));
        let internal = GuardError::Store(StoreError::Internal(anyhow::anyhow!("bug")));
        assert_eq!(retry_after(internal), None);
        assert_eq!(retry_after(GuardError::NotAToken("x".to_owned())), None);
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
