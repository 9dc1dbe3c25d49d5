//! Reading request bodies, with the contract's order of checks: media type and content
//! encoding (`415`), size (`413`), JSON syntax and shape (`400`). The field rules (`422`)
//! belong to each service (the lease server's are in `routes::parse`); the helpers at the end
//! read one field's raw JSON text strictly.
//!
//! Fields are kept as their raw JSON text until a field rule reads them: serde_json cannot
//! hold a number beyond the float range (`1e400`, 400 digits) in a `Value`, and such a number
//! is valid JSON whose only fault is its size, a `422` like any other out-of-range value.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::time::Duration;

use actix_web::HttpRequest;
use actix_web::error::PayloadError;
use actix_web::http::header;
use actix_web::web::{self, BytesMut};
use futures_util::StreamExt as _;
use serde_json::Value;
use serde_json::value::RawValue;

use super::problem::ApiError;

pub use super::MAX_BODY_BYTES;

/// The default of `--request-timeout-ms`.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 10_000;

/// Longest a request body may take to arrive once its handler starts reading it; an app sets
/// it with `App::app_data`, else the default of `--request-timeout-ms` holds. Without it a
/// client sending one byte every few seconds would hold its connection (and a file handle)
/// for ever.
#[derive(Debug, Clone, Copy)]
pub struct RequestTimeout(pub Duration);

impl Default for RequestTimeout {
    fn default() -> Self {
        Self(Duration::from_millis(DEFAULT_REQUEST_TIMEOUT_MS))
    }
}

/// A request body as it arrives: `web::Payload` in a handler, `dev::Payload` in an extractor.
pub trait Body: futures_util::Stream<Item = Result<web::Bytes, PayloadError>> + Unpin {}

impl<S: futures_util::Stream<Item = Result<web::Bytes, PayloadError>> + Unpin> Body for S {}

/// The fields of a JSON object body, each as its raw JSON text, ordered by name.
pub type Object = BTreeMap<String, Box<RawValue>>;

/// Reads a JSON object body, enforcing media type, size and syntax. A field given twice is
/// refused (`422`, the body being JSON still): which of two owners was meant cannot be
/// guessed.
pub async fn read_object(req: &HttpRequest, payload: impl Body) -> Result<Object, ApiError> {
    let body = read_body(req, payload).await?;
    let refusal = match serde_json::from_slice::<UniqueKeys>(&body) {
        Ok(UniqueKeys(Ok(map))) => return Ok(map),
        // Still JSON (RFC 8259 only says names SHOULD be unique), so a field's refusal.
        Ok(UniqueKeys(Err(repeated))) => {
            return Err(ApiError::validation(repeated, "is given more than once"));
        }
        Err(refusal) => refusal,
    };
    // Only to word the answer: is it no JSON at all, or not an object?
    Err(match serde_json::from_slice::<Box<RawValue>>(&body) {
        Err(e) => not_json(&e),
        Ok(raw) if raw_kind(&raw) == "an object" => {
            ApiError::Malformed(format!("the body is not valid: {refusal}"))
        }
        Ok(other) => ApiError::Malformed(format!(
            "the body must be a JSON object, got {}",
            raw_kind(&other)
        )),
    })
}

/// A JSON object body as a handler argument, read by [`read_object`]'s rules: its refusals
/// (`415`, `413`, `408`, `400`) come before anything the handler checks.
pub struct JsonObject(pub Object);

impl actix_web::FromRequest for JsonObject {
    type Error = ApiError;
    type Future = futures_util::future::LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut actix_web::dev::Payload) -> Self::Future {
        let req = req.clone();
        let payload = payload.take();
        Box::pin(async move { read_object(&req, payload).await.map(Self) })
    }
}

/// Reads a body holding any JSON value, enforcing media type, size and syntax.
///
/// A number beyond the float range is valid JSON that a `Value` cannot hold; it is refused
/// as a `422` on `value` (it could not be stored and shown back as it was sent), not as a
/// `400`, which is only for bodies that are not JSON.
pub async fn read_json(req: &HttpRequest, payload: impl Body) -> Result<Value, ApiError> {
    let body = read_body(req, payload).await?;
    serde_json::from_slice(&body).map_err(|e| {
        if serde_json::from_slice::<Box<RawValue>>(&body).is_ok() {
            ApiError::validation("value", format!("cannot be held: {e}"))
        } else {
            not_json(&e)
        }
    })
}

fn not_json(e: &serde_json::Error) -> ApiError {
    ApiError::Malformed(format!("the body is not valid JSON: {e}"))
}

/// A JSON object, or the first of its keys that it gives more than once.
struct UniqueKeys(Result<Object, String>);

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Keys;
        impl<'de> serde::de::Visitor<'de> for Keys {
            type Value = Result<Object, String>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut access: A,
            ) -> Result<Self::Value, A::Error> {
                let mut map = Object::new();
                let mut repeated = None;
                while let Some((key, value)) = access.next_entry::<String, Box<RawValue>>()? {
                    match map.entry(key) {
                        Entry::Occupied(given) => {
                            repeated.get_or_insert_with(|| given.key().clone());
                        }
                        Entry::Vacant(new) => {
                            new.insert(value);
                        }
                    }
                }
                Ok(repeated.map_or(Ok(map), Err))
            }
        }
        deserializer.deserialize_map(Keys).map(UniqueKeys)
    }
}

/// The raw body, after the media type and size checks.
async fn read_body(req: &HttpRequest, mut payload: impl Body) -> Result<BytesMut, ApiError> {
    require_json(req)?;
    require_identity(req)?;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_BODY_BYTES as u64) {
        return Err(ApiError::PayloadTooLarge {
            limit: MAX_BODY_BYTES,
        });
    }
    let limit = req
        .app_data::<RequestTimeout>()
        .copied()
        .unwrap_or_default()
        .0;
    let deadline = tokio::time::Instant::now() + limit;
    let mut body = BytesMut::new();
    loop {
        let chunk = match tokio::time::timeout_at(deadline, payload.next()).await {
            Err(_) => {
                return Err(ApiError::RequestTimeout(format!(
                    "the request body did not arrive within {} ms",
                    limit.as_millis()
                )));
            }
            Ok(None) => break,
            Ok(Some(chunk)) => chunk,
        };
        let chunk = chunk.map_err(|e| ApiError::Malformed(unreadable(&e)))?;
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(ApiError::PayloadTooLarge {
                limit: MAX_BODY_BYTES,
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Why a body could not be read, in the client's terms: the HTTP layer's own text for a body
/// that ended early ends in `None`.
fn unreadable(error: &PayloadError) -> String {
    match error {
        PayloadError::Incomplete(_) => {
            "the body ended before it was complete: fewer bytes than its Content-Length, or chunked framing that broke off before its last chunk".to_owned()
        }
        // Content encodings are refused before the body is read: what can be corrupt here is
        // the chunked framing.
        PayloadError::EncodingCorrupted => {
            "the body's chunked transfer coding is not valid".to_owned()
        }
        other => format!("could not read the body: {other}"),
    }
}

fn require_json(req: &HttpRequest) -> Result<(), ApiError> {
    let Some(value) = req.headers().get(header::CONTENT_TYPE) else {
        return Err(ApiError::UnsupportedMediaType(
            "Content-Type is missing; send application/json".to_owned(),
        ));
    };
    let essence = value
        .to_str()
        .ok()
        .and_then(|v| v.split(';').next())
        .map(str::trim)
        .unwrap_or_default();
    if essence.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType(format!(
            "Content-Type {essence:?} is not supported; send application/json"
        )))
    }
}

/// Bodies are read as sent: a compressed body would be taken for its compressed bytes (and
/// could expand far past the size limit if it were inflated), so any coding but `identity`
/// is refused.
fn require_identity(req: &HttpRequest) -> Result<(), ApiError> {
    for value in req.headers().get_all(header::CONTENT_ENCODING) {
        let text = value.to_str().unwrap_or_default();
        let coding = text
            .split(',')
            .map(str::trim)
            .find(|c| !c.eq_ignore_ascii_case("identity"));
        if let Some(coding) = coding {
            return Err(ApiError::UnsupportedMediaType(format!(
                "Content-Encoding {coding:?} is not supported; send the body uncompressed"
            )));
        }
    }
    Ok(())
}

/// A JSON string.
pub fn string(raw: &RawValue) -> Result<String, String> {
    match raw_kind(raw) {
        "a string" => serde_json::from_str(raw.get()).map_err(|e| format!("is not a string: {e}")),
        other => Err(format!("must be a JSON string, got {other}")),
    }
}

/// A JSON integer, strictly: not a string, not `60.0` or `1e2`, not `true`, not beyond i64.
/// Read from the raw text, so a number of any size or precision gets here and is judged.
pub fn integer(raw: &RawValue) -> Result<i64, String> {
    let text = raw.get();
    match raw_kind(raw) {
        "a number" => {}
        other => return Err(format!("must be a JSON integer, got {other}")),
    }
    if text.contains(['.', 'e', 'E']) {
        return Err(format!("must be a JSON integer, got {}", shown(text)));
    }
    text.parse::<i64>()
        .map_err(|_| format!("{} is out of range", shown(text)))
}

/// A number as it may be quoted back in a message: a 400-digit one is shortened.
fn shown(text: &str) -> String {
    const MAX_SHOWN: usize = 24;
    match text.char_indices().nth(MAX_SHOWN) {
        Some((end, _)) => format!("{}… ({} characters)", &text[..end], text.len()),
        None => text.to_owned(),
    }
}

/// What kind of JSON value the raw text is; its first character tells, as the text is valid
/// JSON and starts at the value.
pub fn raw_kind(raw: &RawValue) -> &'static str {
    match raw.get().as_bytes().first() {
        Some(b'n') => "null",
        Some(b't' | b'f') => "a boolean",
        Some(b'"') => "a string",
        Some(b'[') => "an array",
        Some(b'{') => "an object",
        _ => "a number",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn integers_are_strict_and_any_size_is_judged() {
        assert_eq!(integer(&raw("30")), Ok(30));
        assert_eq!(integer(&raw("-3")), Ok(-3));
        let huge = "9".repeat(400);
        for bad in [
            "60.0",
            "1e2",
            "1e400",
            "-1e400",
            "0.5e-400",
            huge.as_str(),
            "\"60\"",
            "true",
        ] {
            let message = integer(&raw(bad)).unwrap_err();
            assert!(message.len() < 100, "{message}");
        }
    }

    #[test]
    fn strings_are_strings() {
        assert_eq!(string(&raw("\"a b\"")), Ok("a b".to_owned()));
        assert!(string(&raw("5")).is_err());
        assert!(string(&raw("null")).is_err());
    }

    #[test]
    fn a_field_given_twice_is_named() {
        let keys = |json| serde_json::from_str::<UniqueKeys>(json).unwrap().0;
        assert!(keys(r#"{"a": 1, "b": 2}"#).is_ok());
        assert_eq!(
            keys(r#"{"a": 1, "b": 2, "a": 3, "b": 4}"#).err().as_deref(),
            Some("a")
        );
    }
}
