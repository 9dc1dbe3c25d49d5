//! Reading request bodies and turning their fields into domain types, once, at the edge.
//!
//! The order of checks is the contract's: media type and content encoding (`415`), size
//! (`413`), JSON syntax and shape (`400`), then every field rule at once (`422`, listing each
//! bad field). All of it happens before the store is asked.
//!
//! Fields are kept as their raw JSON text until a field rule reads them: serde_json cannot
//! hold a number beyond the float range (`1e400`, 400 digits) in a `Value`, and such a number
//! is valid JSON whose only fault is its size, a `422` like any other out-of-range value.

use std::collections::BTreeMap;
use std::time::Duration;

use actix_web::HttpRequest;
use actix_web::http::header;
use actix_web::web::{self, BytesMut};
use futures_util::StreamExt as _;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::domain::{Fence, Owner, ResourceName, Ttl};
use crate::problem::{ApiError, FieldError};

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// Longest a request body may take to arrive once its handler starts reading it; an app sets
/// it with `App::app_data`, else the default of `--request-timeout-ms` holds. Without it a
/// client sending one byte every few seconds would hold its connection (and a file handle)
/// for ever.
#[derive(Debug, Clone, Copy)]
pub struct RequestTimeout(pub Duration);

impl Default for RequestTimeout {
    fn default() -> Self {
        Self(Duration::from_millis(
            crate::config::DEFAULT_REQUEST_TIMEOUT_MS,
        ))
    }
}

/// The fields of a JSON object body, each as its raw JSON text, ordered by name.
pub type Object = BTreeMap<String, Box<RawValue>>;

/// Reads a JSON object body, enforcing media type, size and syntax. A field given twice is
/// refused: which of two owners was meant cannot be guessed.
pub async fn read_object(req: &HttpRequest, payload: web::Payload) -> Result<Object, ApiError> {
    let body = read_body(req, payload).await?;
    let refusal = match serde_json::from_slice::<UniqueKeys>(&body) {
        Ok(UniqueKeys(map)) => return Ok(map),
        Err(refusal) => refusal,
    };
    // Only to word the answer: is it no JSON at all, not an object, or a repeated field?
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

/// Reads a body holding any JSON value, enforcing media type, size and syntax.
///
/// A number beyond the float range is valid JSON that a `Value` cannot hold; it is refused
/// as a `422` on `value` (it could not be stored and shown back as it was sent), not as a
/// `400`, which is only for bodies that are not JSON.
pub async fn read_json(req: &HttpRequest, payload: web::Payload) -> Result<Value, ApiError> {
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

/// A JSON object whose keys are all distinct.
struct UniqueKeys(Object);

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Keys;
        impl<'de> serde::de::Visitor<'de> for Keys {
            type Value = Object;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut access: A,
            ) -> Result<Self::Value, A::Error> {
                let mut map = Object::new();
                while let Some((key, value)) = access.next_entry::<String, Box<RawValue>>()? {
                    if map.contains_key(&key) {
                        return Err(serde::de::Error::custom(format!(
                            "field {key:?} is given more than once"
                        )));
                    }
                    map.insert(key, value);
                }
                Ok(map)
            }
        }
        deserializer.deserialize_map(Keys).map(UniqueKeys)
    }
}

/// The raw body, after the media type and size checks.
async fn read_body(req: &HttpRequest, mut payload: web::Payload) -> Result<BytesMut, ApiError> {
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
        let chunk =
            chunk.map_err(|e| ApiError::Malformed(format!("could not read the body: {e}")))?;
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(ApiError::PayloadTooLarge {
                limit: MAX_BODY_BYTES,
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
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

/// The fields of one request, taken one by one; every problem is collected so that a `422`
/// lists them all, and fields nobody took are reported as unknown.
pub struct Fields {
    map: Object,
    errors: Vec<FieldError>,
}

impl Fields {
    pub fn new(map: Object) -> Self {
        Self {
            map,
            errors: Vec::new(),
        }
    }

    /// For requests without a body: only the path is checked.
    pub fn empty() -> Self {
        Self::new(Object::new())
    }

    /// The `{resource}` path segment.
    pub fn resource(&mut self, raw: &str) -> Option<ResourceName> {
        ResourceName::parse(raw)
            .map_err(|e| self.reject("resource", e))
            .ok()
    }

    pub fn owner(&mut self) -> Option<Owner> {
        let Some(raw) = self.take("owner") else {
            self.reject("owner", "is required");
            return None;
        };
        let text = string(&raw).map_err(|m| self.reject("owner", m)).ok()?;
        Owner::parse(&text)
            .map_err(|e| self.reject("owner", e))
            .ok()
    }

    pub fn ttl(&mut self, max: Ttl) -> Option<Ttl> {
        let Some(raw) = self.take("ttl_seconds") else {
            self.reject("ttl_seconds", "is required");
            return None;
        };
        let seconds = integer(&raw)
            .map_err(|m| self.reject("ttl_seconds", m))
            .ok()?;
        Ttl::new(seconds, max)
            .map_err(|e| self.reject("ttl_seconds", e))
            .ok()
    }

    /// Optional: absent or `null` is `Some(None)`; `None` means the field was invalid.
    pub fn fence(&mut self) -> Option<Option<Fence>> {
        let Some(raw) = self.take("fence") else {
            return Some(None);
        };
        let number = integer(&raw).map_err(|m| self.reject("fence", m)).ok()?;
        Fence::new(number)
            .map(Some)
            .map_err(|e| self.reject("fence", e))
            .ok()
    }

    /// Rejects unknown fields and any collected problem; otherwise builds the request.
    pub fn finish<T>(mut self, build: impl FnOnce() -> Option<T>) -> Result<T, ApiError> {
        let unknown: Vec<String> = self.map.keys().cloned().collect();
        for field in unknown {
            self.reject(field, "is not a known field");
        }
        if !self.errors.is_empty() {
            return Err(ApiError::Validation(self.errors));
        }
        build().ok_or_else(|| ApiError::Internal(anyhow::anyhow!("a field went missing")))
    }

    /// The field's raw text; absent and `null` are both `None`.
    fn take(&mut self, field: &str) -> Option<Box<RawValue>> {
        self.map.remove(field).filter(|raw| raw.get() != "null")
    }

    fn reject(&mut self, field: impl Into<String>, message: impl ToString) {
        self.errors.push(FieldError::new(field, message));
    }
}

/// A JSON string.
fn string(raw: &RawValue) -> Result<String, String> {
    match raw_kind(raw) {
        "a string" => serde_json::from_str(raw.get()).map_err(|e| format!("is not a string: {e}")),
        other => Err(format!("must be a JSON string, got {other}")),
    }
}

/// A JSON integer, strictly: not a string, not `60.0` or `1e2`, not `true`, not beyond i64.
/// Read from the raw text, so a number of any size or precision gets here and is judged.
fn integer(raw: &RawValue) -> Result<i64, String> {
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
fn raw_kind(raw: &RawValue) -> &'static str {
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
    use serde_json::json;

    fn fields(v: Value) -> Fields {
        from_text(&v.to_string())
    }

    fn from_text(body: &str) -> Fields {
        let UniqueKeys(map) = serde_json::from_str(body).expect("tests pass objects");
        Fields::new(map)
    }

    fn day() -> Ttl {
        Ttl::max(86_400).unwrap()
    }

    #[test]
    fn ttl_must_be_a_strict_integer_in_range() {
        for bad in [
            json!(0),
            json!(-1),
            json!("60"),
            json!(60.0),
            json!(true),
            json!(1e300),
            json!(i64::MAX),
            json!(u64::MAX),
            json!(86_401),
        ] {
            let mut f = fields(json!({ "ttl_seconds": bad }));
            assert!(f.ttl(day()).is_none(), "{bad} accepted");
            assert_eq!(f.errors.len(), 1);
            assert_eq!(f.errors[0].field, "ttl_seconds");
        }
        let mut f = fields(json!({ "ttl_seconds": 30 }));
        assert_eq!(f.ttl(day()).unwrap().seconds(), 30);
    }

    #[test]
    fn numbers_beyond_float_range_are_field_errors() {
        let huge = "9".repeat(400);
        for bad in ["1e400", "-1e400", huge.as_str(), "1e2", "0.5e-400"] {
            let mut f = from_text(&format!(r#"{{"ttl_seconds": {bad}, "fence": {bad}}}"#));
            assert!(f.ttl(day()).is_none(), "{bad} accepted as ttl");
            assert_eq!(f.fence(), None, "{bad} accepted as fence");
            let fields: Vec<&str> = f.errors.iter().map(|e| e.field.as_str()).collect();
            assert_eq!(fields, ["ttl_seconds", "fence"]);
            assert!(
                f.errors.iter().all(|e| e.message.len() < 100),
                "{:?}",
                f.errors
            );
        }
        let f = from_text(r#"{"ttl": 1e400}"#);
        let Err(ApiError::Validation(errors)) = f.finish(|| Some(())) else {
            panic!("expected a validation error");
        };
        assert_eq!(errors, [FieldError::new("ttl", "is not a known field")]);
    }

    #[test]
    fn all_problems_are_listed_together() {
        let f = {
            let mut f = fields(json!({ "owner": " ", "ttl": 5, "extra": 1 }));
            let _ = f.owner();
            let _ = f.ttl(day());
            f
        };
        let Err(ApiError::Validation(errors)) = f.finish(|| Some(())) else {
            panic!("expected a validation error");
        };
        let names: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(names, ["owner", "ttl_seconds", "extra", "ttl"]);
    }

    #[test]
    fn fence_is_optional_but_positive() {
        assert_eq!(fields(json!({})).fence(), Some(None));
        assert_eq!(fields(json!({ "fence": null })).fence(), Some(None));
        assert_eq!(
            fields(json!({ "fence": 7 })).fence(),
            Some(Some(Fence::new(7).unwrap()))
        );
        for bad in [json!(0), json!(-3), json!("7"), json!(7.5)] {
            assert_eq!(fields(json!({ "fence": bad })).fence(), None);
        }
    }
}
