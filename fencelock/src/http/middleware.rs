//! The one middleware: writes every error's problem document, once, for its request path;
//! logs server-side errors once (with their cause, which the client never sees); and writes
//! one line per request.
//!
//! Requests the HTTP parser refuses never reach the middleware: actix-http answers them
//! itself, with an empty body.

use std::time::Instant;

use actix_web::Error;
use actix_web::HttpMessage as _;
use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use tracing::Instrument as _;

use super::problem::{ApiError, PROBLEM_JSON};

/// The header a request id travels in, both ways.
pub const REQUEST_ID: &str = "x-request-id";

/// The target of the one line logged per request: `RUST_LOG=info,fencelock::access=off`
/// switches the access log off and keeps every other line.
pub const ACCESS_TARGET: &str = "fencelock::access";

/// Longest request id kept from a client.
const MAX_REQUEST_ID_LEN: usize = 128;

/// The id of the request being served, in its extensions, for handlers that want it.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

pub async fn observe(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    let started = Instant::now();
    let id = request_id(req.headers().get(REQUEST_ID));
    req.extensions_mut().insert(RequestId(id.clone()));
    // Every line logged while serving the request, by fencelock or a library, carries its id.
    let span = tracing::info_span!("request", request_id = %id);
    async move {
        let method = req.method().clone();
        let path = instance_of(req.uri());
        let response = next.call(req).await?;
        let mut response = match response.response().error() {
            None => response.map_into_boxed_body(),
            Some(_) => problem(response, &method, &path, &id),
        };
        if let Ok(value) = HeaderValue::from_str(&id) {
            response
                .headers_mut()
                .insert(HeaderName::from_static(REQUEST_ID), value);
        }
        tracing::event!(
            target: ACCESS_TARGET,
            tracing::Level::INFO,
            http.method = %method,
            http.path = %path,
            http.status = response.status().as_u16(),
            duration_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
            "request"
        );
        Ok(response)
    }
    .instrument(span)
    .await
}

/// Writes the problem document of an error response (once, here, where the request path and
/// id are known), and logs a server-side error with its cause, which the client never sees.
fn problem(
    response: ServiceResponse<impl MessageBody + 'static>,
    method: &actix_web::http::Method,
    path: &str,
    id: &str,
) -> ServiceResponse<BoxBody> {
    let Some(error) = response.response().error() else {
        return response.map_into_boxed_body();
    };
    // An error of fencelock's own has set its status and headers already; one of the
    // framework's is answered as the problem its status stands for.
    if error.as_error::<ApiError>().is_none() && is_problem(response.response().headers()) {
        // An error type with a problem document of its own (the guard's `GuardError`).
        return response.map_body(|_, body| BoxBody::new(with_instance(body, path, id)));
    }
    let fallback;
    let (api, head) = match error.as_error::<ApiError>() {
        Some(api) => (api, None),
        None => {
            fallback = ApiError::from_status(response.status());
            (&fallback, Some(fallback.response_head()))
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
    let document = api.problem_json(path, id);
    let response = match head {
        Some(head) => response.into_response(head),
        None => response.map_into_boxed_body(),
    };
    response.map_body(|_, _| BoxBody::new(document))
}

fn is_problem(headers: &actix_web::http::header::HeaderMap) -> bool {
    headers
        .get(actix_web::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == PROBLEM_JSON.as_bytes())
}

/// A problem document written by another error type, with this request's `instance` and
/// `request_id` added. A body that is not a complete JSON object is kept as it is.
fn with_instance(body: impl MessageBody + 'static, path: &str, id: &str) -> BoxBody {
    let bytes = match body.try_into_bytes() {
        Ok(bytes) => bytes,
        Err(streamed) => return BoxBody::new(streamed),
    };
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes) {
        Ok(mut problem) => {
            problem
                .entry("instance")
                .or_insert_with(|| path.to_owned().into());
            problem.insert("request_id".to_owned(), id.to_owned().into());
            BoxBody::new(serde_json::to_vec(&problem).expect("a problem document serialises"))
        }
        Err(_) => BoxBody::new(bytes),
    }
}

/// The client's `X-Request-Id` when it is 1-128 characters of `A-Z a-z 0-9 . _ -`; otherwise
/// (none, empty, too long, anything else) a fresh one: a log line must never carry a
/// client's control bytes or an id that cannot be searched for.
pub fn request_id(given: Option<&HeaderValue>) -> String {
    let valid = |id: &&str| {
        (1..=MAX_REQUEST_ID_LEN).contains(&id.len())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    };
    match given.and_then(|v| v.to_str().ok()).filter(valid) {
        Some(id) => id.to_owned(),
        None => uuid::Uuid::new_v4().to_string(),
    }
}

/// The problem `instance` for a request: its path, or the whole target when there is no
/// path (`CONNECT host:443` names an authority).
pub fn instance_of(uri: &actix_web::http::Uri) -> String {
    match uri.path() {
        "" => uri.to_string(),
        path => path.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_kept_when_safe_and_made_otherwise() {
        let kept = |text: &str| request_id(Some(&HeaderValue::from_str(text).unwrap()));
        assert_eq!(kept("abc-123_X.y"), "abc-123_X.y");
        assert_eq!(kept(&"a".repeat(128)), "a".repeat(128));
        for bad in ["", "a b", "a/b", &"a".repeat(129)] {
            let made = request_id(HeaderValue::from_str(bad).ok().as_ref());
            assert_ne!(made, bad);
            assert_eq!(made.len(), 36, "{made}");
        }
        assert_ne!(request_id(None), request_id(None));
    }
}
