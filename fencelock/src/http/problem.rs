//! The one error type of the HTTP API and its one mapping to RFC 9457 problem responses.
//!
//! Handlers return `Result<_, ApiError>` and use bare `?`. An error becomes a response in two
//! halves: [`ApiError`]'s `ResponseError` sets the status and headers, and the middleware
//! ([`super::observe`]), which sees every error response together with its request, writes
//! the problem document once, with the request path as its `instance`.

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use crate::domain::Fence;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// Seconds a client should wait before retrying when the store is unavailable.
const RETRY_AFTER_SECONDS: &str = "1";

/// One invalid input field, listed in a `validation-failed` problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl ToString) -> Self {
        Self {
            field: field.into(),
            message: message.to_string(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Malformed(String),
    /// No bearer token, or one the server does not know: answered before anything else.
    #[error("{0}")]
    Unauthorized(String),
    /// The token may not touch this resource, or lacks the permission the operation needs.
    #[error("{0}")]
    ForbiddenScope(String),
    /// The token holds its `max_leases` live leases and asked for another.
    #[error("{0}")]
    QuotaExceeded(String),
    #[error("the request has {} invalid field(s)", .0.len())]
    Validation(Vec<FieldError>),
    #[error("{0}")]
    NotFound(String),
    /// `not-found` too, for a resource inside another owner's lock delay: the problem adds
    /// `delayed_until`.
    #[error("{detail}")]
    Delayed {
        detail: String,
        until: chrono::DateTime<chrono::Utc>,
    },
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    LeaseExpired(String),
    #[error("{0}")]
    OwnerMismatch(String),
    #[error("{detail}")]
    StaleFence {
        detail: String,
        current_fence: Option<Fence>,
    },
    #[error("{0}")]
    FencingTokenRequired(String),
    /// The guard has keys, and the `Fencing-Token` is not a token one of them signed for the
    /// key written: forged, of another resource, or a bare fence.
    #[error("{0}")]
    InvalidFenceToken(String),
    #[error("the request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    RequestTimeout(String),
    /// The request target is longer than a URI may be.
    #[error("{0}")]
    UriTooLong(String),
    #[error("{0}")]
    HeadersTooLarge(String),
    #[error("{method} is not allowed here; allowed: {allow}")]
    MethodNotAllowed { method: String, allow: &'static str },
    #[error("the lease store is unavailable; retry shortly")]
    StoreUnavailable(#[source] anyhow::Error),
    /// The store answers but refuses writes. The outermost context of the cause is
    /// fencelock's own wording of why (read-only, disk full), so it may be shown.
    #[error("the lease store refuses writes: {0}; retry once it is writable again")]
    StoreNotWritable(#[source] anyhow::Error),
    /// For `/readyz` only: the store is not ready, and the operator asking may see why.
    #[error("the lease store is not ready: {0}")]
    NotReady(String),
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    pub fn validation(field: impl Into<String>, message: impl ToString) -> Self {
        Self::Validation(vec![FieldError::new(field, message)])
    }

    /// The whole status and slug mapping, side by side.
    pub fn status_and_type(&self) -> (StatusCode, &'static str) {
        match self {
            Self::Malformed(_) => (StatusCode::BAD_REQUEST, "malformed-request"),
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Self::ForbiddenScope(_) => (StatusCode::FORBIDDEN, "forbidden-scope"),
            Self::QuotaExceeded(_) => (StatusCode::TOO_MANY_REQUESTS, "quota-exceeded"),
            Self::InvalidFenceToken(_) => (StatusCode::FORBIDDEN, "invalid-fence-token"),
            Self::NotFound(_) | Self::Delayed { .. } => (StatusCode::NOT_FOUND, "not-found"),
            Self::MethodNotAllowed { .. } => (StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed"),
            Self::LeaseExpired(_) => (StatusCode::CONFLICT, "lease-expired"),
            Self::OwnerMismatch(_) => (StatusCode::CONFLICT, "owner-mismatch"),
            Self::StaleFence { .. } => (StatusCode::CONFLICT, "stale-fence"),
            Self::PayloadTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large"),
            Self::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type")
            }
            Self::RequestTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "request-timeout"),
            Self::UriTooLong(_) => (StatusCode::URI_TOO_LONG, "uri-too-long"),
            Self::HeadersTooLarge(_) => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "headers-too-large",
            ),
            Self::Validation(_) => (StatusCode::UNPROCESSABLE_ENTITY, "validation-failed"),
            Self::FencingTokenRequired(_) => {
                (StatusCode::PRECONDITION_REQUIRED, "fencing-token-required")
            }
            Self::StoreUnavailable(_) | Self::StoreNotWritable(_) | Self::NotReady(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "store-unavailable")
            }
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    /// Whether this is the server's fault (logged as such) rather than the caller's.
    pub fn is_server_side(&self) -> bool {
        matches!(
            self,
            Self::StoreUnavailable(_)
                | Self::StoreNotWritable(_)
                | Self::NotReady(_)
                | Self::Internal(_)
        )
    }

    /// The same failure as a readiness answer, whose detail names the whole cause: whoever
    /// asks `/readyz` is operating the server and needs to know why it is not ready (an
    /// incompatible schema, a read-only database) without reading the log.
    pub fn naming_the_cause(self) -> Self {
        match self {
            Self::StoreUnavailable(cause)
            | Self::StoreNotWritable(cause)
            | Self::Internal(cause) => Self::NotReady(format!("{cause:#}")),
            other => other,
        }
    }

    /// The problem document for request `request_id` to `instance`, as JSON.
    pub fn problem_json(&self, instance: &str, request_id: &str) -> Vec<u8> {
        serde_json::to_vec(&self.problem(Some(instance), Some(request_id)))
            .expect("a problem document serialises")
    }

    /// The whole answer, for an error rendered away from the middleware (the guard's
    /// `GuardError`): the head and a problem document without `instance` and `request_id`,
    /// which the middleware adds where it runs.
    #[cfg(feature = "guard")]
    pub(crate) fn response_without_request(&self) -> HttpResponse {
        let document =
            serde_json::to_vec(&self.problem(None, None)).expect("a problem document serialises");
        self.response_head()
            .set_body(document)
            .map_into_boxed_body()
    }

    fn problem<'a>(
        &'a self,
        instance: Option<&'a str>,
        request_id: Option<&'a str>,
    ) -> Problem<'a> {
        let (status, kind) = self.status_and_type();
        let mut body = Problem {
            kind,
            title: title(status),
            status: status.as_u16(),
            detail: self.to_string(),
            instance,
            request_id,
            errors: None,
            current_fence: None,
            delayed_until: None,
        };
        match self {
            Self::Validation(errors) => body.errors = Some(errors),
            Self::StaleFence { current_fence, .. } => body.current_fence = *current_fence,
            Self::Delayed { until, .. } => {
                body.delayed_until =
                    Some(until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
            }
            _ => {}
        }
        body
    }

    /// The status line and headers of this error's answer; the body, the problem document,
    /// is written by the middleware, which knows the request ([`Self::problem_json`]).
    pub(super) fn response_head(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_and_type().0);
        response.insert_header((header::CONTENT_TYPE, PROBLEM_JSON));
        match self {
            Self::StoreUnavailable(_) | Self::StoreNotWritable(_) | Self::NotReady(_) => {
                response.insert_header((header::RETRY_AFTER, RETRY_AFTER_SECONDS));
            }
            Self::MethodNotAllowed { allow, .. } => {
                response.insert_header((header::ALLOW, HeaderValue::from_static(allow)));
            }
            Self::Unauthorized(_) => {
                response.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
            }
            // The rest of a body that is late may still be on its way; the connection cannot
            // carry another request, and must not stay open for the slow client.
            Self::RequestTimeout(_) => {
                response.force_close();
            }
            _ => {}
        }
        response.finish()
    }

    /// A problem for an error that did not come from fencelock's own code (the framework's
    /// own rejections): the status is kept, and the slug and a fixed text follow from it.
    pub fn from_status(status: StatusCode) -> Self {
        let detail = || title(status).to_owned();
        match status {
            StatusCode::BAD_REQUEST => Self::Malformed(detail()),
            StatusCode::FORBIDDEN => Self::Forbidden(detail()),
            StatusCode::NOT_FOUND => Self::NotFound("no such route".to_owned()),
            StatusCode::PAYLOAD_TOO_LARGE => Self::PayloadTooLarge {
                limit: super::MAX_BODY_BYTES,
            },
            StatusCode::UNSUPPORTED_MEDIA_TYPE => Self::UnsupportedMediaType(detail()),
            StatusCode::SERVICE_UNAVAILABLE => {
                Self::StoreUnavailable(anyhow::anyhow!("service unavailable"))
            }
            s if s.is_client_error() => Self::Malformed(detail()),
            _ => Self::Internal(anyhow::anyhow!("unexpected framework error {status}")),
        }
    }
}

/// A store that could not answer: `503` while a retry may succeed, `500` for a bug.
impl From<crate::StoreError> for ApiError {
    fn from(e: crate::StoreError) -> Self {
        use crate::StoreError;
        match e {
            StoreError::Unavailable(cause) => Self::StoreUnavailable(cause),
            StoreError::NotWritable(cause) => Self::StoreNotWritable(cause),
            StoreError::Misconfigured(cause) => Self::StoreUnavailable(cause),
            StoreError::Internal(cause) => Self::Internal(cause),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status_and_type().0
    }

    fn error_response(&self) -> HttpResponse {
        self.response_head()
    }
}

fn title(status: StatusCode) -> &'static str {
    status.canonical_reason().unwrap_or("Error")
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    instance: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    errors: Option<&'a [FieldError]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_fence: Option<Fence>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delayed_until: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_has_the_contract_status_and_slug() {
        let cases: Vec<(ApiError, u16, &str)> = vec![
            (ApiError::Malformed("x".into()), 400, "malformed-request"),
            (ApiError::Unauthorized("x".into()), 401, "unauthorized"),
            (ApiError::Forbidden("x".into()), 403, "forbidden"),
            (ApiError::ForbiddenScope("x".into()), 403, "forbidden-scope"),
            (ApiError::QuotaExceeded("x".into()), 429, "quota-exceeded"),
            (
                ApiError::InvalidFenceToken("x".into()),
                403,
                "invalid-fence-token",
            ),
            (ApiError::NotFound("x".into()), 404, "not-found"),
            (
                ApiError::Delayed {
                    detail: "x".into(),
                    until: chrono::DateTime::UNIX_EPOCH,
                },
                404,
                "not-found",
            ),
            (
                ApiError::MethodNotAllowed {
                    method: "PUT".into(),
                    allow: "GET",
                },
                405,
                "method-not-allowed",
            ),
            (ApiError::LeaseExpired("x".into()), 409, "lease-expired"),
            (ApiError::OwnerMismatch("x".into()), 409, "owner-mismatch"),
            (
                ApiError::StaleFence {
                    detail: "x".into(),
                    current_fence: None,
                },
                409,
                "stale-fence",
            ),
            (
                ApiError::PayloadTooLarge { limit: 1 },
                413,
                "payload-too-large",
            ),
            (
                ApiError::UnsupportedMediaType("x".into()),
                415,
                "unsupported-media-type",
            ),
            (ApiError::RequestTimeout("x".into()), 408, "request-timeout"),
            (ApiError::UriTooLong("x".into()), 414, "uri-too-long"),
            (
                ApiError::HeadersTooLarge("x".into()),
                431,
                "headers-too-large",
            ),
            (ApiError::validation("f", "m"), 422, "validation-failed"),
            (
                ApiError::FencingTokenRequired("x".into()),
                428,
                "fencing-token-required",
            ),
            (
                ApiError::StoreUnavailable(anyhow::anyhow!("down")),
                503,
                "store-unavailable",
            ),
            (
                ApiError::StoreNotWritable(anyhow::anyhow!("read-only")),
                503,
                "store-unavailable",
            ),
            (
                ApiError::NotReady("read-only".into()),
                503,
                "store-unavailable",
            ),
            (ApiError::Internal(anyhow::anyhow!("boom")), 500, "internal"),
        ];
        for (error, status, slug) in cases {
            let (s, t) = error.status_and_type();
            assert_eq!((s.as_u16(), t), (status, slug), "{error:?}");
        }
    }

    #[test]
    fn unauthorized_answers_name_the_bearer_scheme() {
        let head = ApiError::Unauthorized("x".into()).response_head();
        assert_eq!(
            head.headers().get(header::WWW_AUTHENTICATE).unwrap(),
            "Bearer"
        );
    }

    #[test]
    fn internal_errors_show_no_internals() {
        let error = ApiError::Internal(anyhow::anyhow!("password=hunter2 at db.internal"));
        assert_eq!(error.to_string(), "internal error");
        let unavailable = ApiError::StoreUnavailable(anyhow::anyhow!("connect to 10.0.0.5"));
        assert!(!unavailable.to_string().contains("10.0.0.5"));
    }
}
