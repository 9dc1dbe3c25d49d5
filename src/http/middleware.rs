//! The one middleware: writes every error's problem document, once, for its request path;
//! logs server-side errors once (with their cause, which the client never sees); and writes
//! one line per request.
//!
//! Requests the HTTP parser refuses never reach the middleware: actix-http answers them
//! itself. [`refused_by_parser`] renders those answers as problem documents too, through the
//! hook of the vendored actix-http (see `vendor/README.md`).

use std::fmt::Write as _;
use std::time::Instant;

use actix_web::Error;
use actix_web::HttpMessage as _;
use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::web::Bytes;
use tracing::Instrument as _;

use super::problem::{ApiError, PROBLEM_JSON};

/// Longest request target quoted back as a problem's `instance`.
const MAX_INSTANCE_BYTES: usize = 256;

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

/// Makes every server in this process answer the requests its HTTP parser refuses with a
/// problem document (see [`refused_by_parser`]).
pub fn install_refusal_renderer() {
    actix_http::h1::set_refusal_renderer(refused_by_parser);
}

/// The answer to a request refused by the HTTP/1 parser before any route sees it: bad bytes
/// in the request line or a header, bad or conflicting framing headers (`400`), a head too
/// large (`431`) or too slow (`408`). `received` is what the client sent, from its start. A
/// client's mistake, so logged at WARN: any client can send these.
pub fn refused_by_parser(status: StatusCode, received: &[u8]) -> (HeaderValue, Bytes) {
    let error = match status {
        StatusCode::BAD_REQUEST => ApiError::Malformed(
            "the request is not valid HTTP/1.1: a bad byte in the request line or a header, or an invalid or conflicting Content-Length or Transfer-Encoding".to_owned(),
        ),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => ApiError::HeadersTooLarge(
            "the request head has too many or too large header fields".to_owned(),
        ),
        StatusCode::REQUEST_TIMEOUT => ApiError::RequestTimeout(
            "the request head did not arrive within the request timeout".to_owned(),
        ),
        other => ApiError::from_status(other),
    };
    let instance = request_target(received);
    // The parser refused the head, so no header of it is trusted; the id is new.
    let id = request_id(None);
    tracing::warn!(
        http.status = status.as_u16(),
        http.target = %instance,
        request_id = %id,
        detail = %error,
        "request refused by the HTTP parser"
    );
    (
        HeaderValue::from_static(PROBLEM_JSON),
        Bytes::from(error.problem_json(&instance, &id)),
    )
}

/// The target of the request line at the start of `received`, as far as it can be told, with
/// every byte that may not stand in a URI percent-encoded, and cut short if long: it is the
/// client's own text, going into a response and a log line.
fn request_target(received: &[u8]) -> String {
    let line = received.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Some(target) = line.split(|b| *b == b' ').nth(1) else {
        return String::new();
    };
    let mut instance = String::with_capacity(target.len().min(MAX_INSTANCE_BYTES));
    for &byte in target {
        if instance.len() >= MAX_INSTANCE_BYTES {
            instance.push_str("...");
            break;
        }
        if byte.is_ascii_graphic() && !matches!(byte, b'"' | b'\\' | b'<' | b'>' | b'`') {
            instance.push(char::from(byte));
        } else {
            let _ = write!(instance, "%{byte:02X}");
        }
    }
    instance
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_target_is_quoted_safely() {
        assert_eq!(request_target(b"GET /locks/a HTTP/1.1\r\n"), "/locks/a");
        assert_eq!(request_target(b"GET /lo\x01cks HTTP/1.1\r\n"), "/lo%01cks");
        assert_eq!(request_target(b"GET /a\r\n"), "/a");
        assert_eq!(request_target(b"GET /a b\r\n"), "/a");
        assert_eq!(request_target(b"garbage"), "");
        assert_eq!(request_target(b""), "");
        let long = format!("GET /{} HTTP/1.1", "a".repeat(100_000));
        let quoted = request_target(long.as_bytes());
        assert!(quoted.len() <= MAX_INSTANCE_BYTES + 3 && quoted.ends_with("..."));
    }

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

    #[test]
    fn refusals_are_problem_documents() {
        for (status, kind) in [
            (StatusCode::BAD_REQUEST, "malformed-request"),
            (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "headers-too-large",
            ),
            (StatusCode::REQUEST_TIMEOUT, "request-timeout"),
        ] {
            let (content_type, body) = refused_by_parser(status, b"GET /x HTTP/1.1\r\n");
            assert_eq!(content_type, PROBLEM_JSON);
            let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(problem["type"], kind);
            assert_eq!(problem["status"], status.as_u16());
            assert_eq!(problem["instance"], "/x");
        }
    }
}
