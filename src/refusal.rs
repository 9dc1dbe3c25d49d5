//! Problem documents for the requests actix-http's HTTP/1 parser refuses before any route
//! sees them (bad bytes, a head too large or too slow).
//!
//! Stock actix-http answers those with an empty body and no hook to change it; the server
//! builds on a patched copy (`vendor/actix-http`, see its README) that calls
//! [`refused_by_parser`] instead. Only the server does: the `fencelock` library builds on
//! stock actix-http, and a service that uses the guard keeps the framework's empty answers.

use std::fmt::Write as _;

use actix_http::Extensions;
use actix_http::h1::Refusal;
use actix_web::http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use actix_web::http::{Method, StatusCode};
use actix_web::web::Bytes;
use fencelock::http::ApiError;
use fencelock::http::metrics::HttpMetrics;
use fencelock::http::middleware::{REQUEST_ID, request_id};
use fencelock::http::problem::PROBLEM_JSON;

/// Longest request target quoted back as a problem's `instance`.
const MAX_INSTANCE_BYTES: usize = 256;

/// The longest URI the HTTP layer takes (the `http` crate's bound). A longer target is
/// refused by the parser as a bad request, or, longer still, as a head too large; it is
/// answered as what it is, `414`.
const MAX_URI_BYTES: usize = 65_534;

/// Makes every server in this process answer the requests its HTTP parser refuses with a
/// problem document (see [`refused_by_parser`]).
pub fn install_refusal_renderer() {
    actix_http::h1::set_refusal_renderer(refused_by_parser);
}

/// Makes the refusals of a connection count in `metrics`: for the `on_connect` hook of every
/// server that installs the renderer, with its app's [`HttpMetrics`].
pub fn count_refusals(connection: &mut Extensions, metrics: &HttpMetrics) {
    connection.insert(metrics.clone());
}

/// The answer to a request refused by the HTTP/1 parser before any route sees it: bad bytes
/// in the request line or a header, bad or conflicting framing headers (`400`), a head too
/// large (`431`) or too slow (`408`), a target too long for a URI (`414`). `received` is what
/// the client sent, from its start. A client's mistake, so logged at WARN: any client can
/// send these. The answer carries its request id in `X-Request-Id`, as every answer does: the
/// client's own when its head gave a valid one.
///
/// It is counted in `fencelock_http_requests_total` under the route `unmatched`, as an answer
/// of this server, when the connection's data hold the server's [`HttpMetrics`]
/// ([`count_refusals`]).
pub(crate) fn refused_by_parser(
    status: StatusCode,
    received: &[u8],
    connection: Option<&Extensions>,
) -> Refusal {
    let too_long = matches!(
        status,
        StatusCode::BAD_REQUEST | StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    ) && target(received).len() > MAX_URI_BYTES;
    let status = if too_long {
        StatusCode::URI_TOO_LONG
    } else {
        status
    };
    let error = match status {
        StatusCode::BAD_REQUEST => ApiError::Malformed(
            "the request is not valid HTTP/1.1: a bad byte in the request line or a header, no Host header, or an invalid or conflicting Content-Length or Transfer-Encoding".to_owned(),
        ),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => ApiError::HeadersTooLarge(
            "the request head has too many or too large header fields".to_owned(),
        ),
        StatusCode::REQUEST_TIMEOUT => ApiError::RequestTimeout(
            "the request head did not arrive within the request timeout".to_owned(),
        ),
        StatusCode::URI_TOO_LONG => ApiError::UriTooLong(format!(
            "the request target is longer than {MAX_URI_BYTES} bytes"
        )),
        other => ApiError::from_status(other),
    };
    let instance = request_target(received);
    // The client's id is kept by the same rule as on every other request: the value alone is
    // checked, so a refused head does not make a valid id untrustworthy.
    let id = request_id(given_request_id(received).as_ref());
    tracing::warn!(
        http.status = status.as_u16(),
        http.target = %instance,
        request_id = %id,
        detail = %error,
        "request refused by the HTTP parser"
    );
    if let Some(metrics) = connection.and_then(Extensions::get::<HttpMetrics>) {
        let method = method(received);
        metrics.count_unrouted(method.as_ref(), status.as_u16());
    }
    let mut headers = vec![(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON))];
    if let Ok(value) = HeaderValue::from_str(&id) {
        headers.push((HeaderName::from_static(REQUEST_ID), value));
    }
    Refusal {
        status,
        headers,
        body: Bytes::from(error.problem_json(&instance, &id)),
    }
}

/// The value of the first `X-Request-Id` header line that arrived whole in the head at the
/// start of `received` (the name in any case; the value without the spaces around it), as
/// the router takes the first of several. A line cut short (a head too slow or too large)
/// is not read.
fn given_request_id(received: &[u8]) -> Option<HeaderValue> {
    // After the last newline comes a line not yet whole.
    let whole = received.iter().filter(|b| **b == b'\n').count();
    received
        .split(|b| *b == b'\n')
        .take(whole)
        .skip(1)
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
        .take_while(|line| !line.is_empty())
        .find_map(|line| {
            let (name, value) = line.split_at_checked(REQUEST_ID.len() + 1)?;
            let name = name.strip_suffix(b":")?;
            name.eq_ignore_ascii_case(REQUEST_ID.as_bytes())
                .then(|| HeaderValue::from_bytes(value.trim_ascii()).ok())
                .flatten()
        })
}

/// The request line at the start of `received`, as far as it arrived.
fn request_line(received: &[u8]) -> &[u8] {
    let line = received.split(|b| *b == b'\n').next().unwrap_or_default();
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The target of the request line at the start of `received`, as far as it arrived (empty
/// when there is none).
fn target(received: &[u8]) -> &[u8] {
    request_line(received)
        .split(|b| *b == b' ')
        .nth(1)
        .unwrap_or_default()
}

/// The method of the request line at the start of `received`, if one arrived whole (a space
/// follows it) and is a valid token.
fn method(received: &[u8]) -> Option<Method> {
    let line = request_line(received);
    let end = line.iter().position(|b| *b == b' ')?;
    Method::from_bytes(&line[..end]).ok()
}

/// The target of the request line at the start of `received`, as far as it can be told, with
/// every byte that may not stand in a URI percent-encoded, and cut short if long: it is the
/// client's own text, going into a response and a log line.
fn request_target(received: &[u8]) -> String {
    let target = target(received);
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
    fn a_whole_request_id_line_of_the_head_is_read() {
        let id =
            |received: &[u8]| given_request_id(received).map(|v| v.to_str().unwrap().to_owned());
        let head =
            b"GET /x HTTP/1.1\r\nHost: x\r\nx-REQUEST-id:  abc-1 \r\nX-Request-Id: two\r\n\r\n";
        assert_eq!(id(head).as_deref(), Some("abc-1"));
        assert_eq!(
            id(b"GET /x HTTP/1.1\nX-Request-Id:abc\n").as_deref(),
            Some("abc")
        );
        // Cut short, after the head, or in the request line: not a header of this request.
        assert_eq!(id(b"GET /x HTTP/1.1\r\nX-Request-Id: abc"), None);
        assert_eq!(id(b"GET /x HTTP/1.1\r\n\r\nX-Request-Id: abc\r\n"), None);
        assert_eq!(id(b"X-Request-Id: abc\r\n"), None);
        assert_eq!(id(b"GET /x HTTP/1.1\r\nX-Request-Ids: abc\r\n"), None);
        assert_eq!(id(b"GET /x HTTP/1.1\r\nX-Request-Id : abc\r\n"), None);
        // What the value may be is the router's rule, `request_id`.
        let refusal = refused_by_parser(StatusCode::BAD_REQUEST, head, None);
        let header = refusal.headers.iter().find(|(n, _)| n == REQUEST_ID);
        assert_eq!(header.unwrap().1, "abc-1");
        let refusal = refused_by_parser(
            StatusCode::BAD_REQUEST,
            b"GET / HTTP/1.1\r\nX-Request-Id: a b\r\n",
            None,
        );
        let header = refusal.headers.iter().find(|(n, _)| n == REQUEST_ID);
        assert_ne!(header.unwrap().1, "a b");
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
            let Refusal {
                status: answered,
                headers,
                body,
            } = refused_by_parser(status, b"GET /x HTTP/1.1\r\n", None);
            assert_eq!(answered, status);
            let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let header = |name| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v);
            assert_eq!(header(&CONTENT_TYPE).unwrap(), PROBLEM_JSON);
            let id = header(&HeaderName::from_static(REQUEST_ID)).unwrap();
            assert_eq!(problem["request_id"], id.to_str().unwrap());
            assert_eq!(problem["type"], kind);
            assert_eq!(problem["status"], status.as_u16());
            assert_eq!(problem["instance"], "/x");
        }
    }
}
