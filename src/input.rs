//! Reading request bodies and turning their fields into domain types, once, at the edge.
//!
//! The order of checks is the contract's: media type (`415`), size (`413`), JSON syntax and
//! shape (`400`), then every field rule at once (`422`, listing each bad field). All of it
//! happens before the store is asked.

use actix_web::HttpRequest;
use actix_web::http::header;
use actix_web::web::{self, BytesMut};
use futures_util::StreamExt as _;
use serde_json::{Map, Value};

use crate::domain::{Fence, Owner, ResourceName, Ttl};
use crate::problem::{ApiError, FieldError};

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// Reads a JSON object body, enforcing media type, size and syntax. A field given twice is
/// refused: which of two owners was meant cannot be guessed.
pub async fn read_object(
    req: &HttpRequest,
    payload: web::Payload,
) -> Result<Map<String, Value>, ApiError> {
    let body = read_body(req, payload).await?;
    let refusal = match serde_json::from_slice::<UniqueKeys>(&body) {
        Ok(UniqueKeys(map)) => return Ok(map),
        Err(refusal) => refusal,
    };
    // Only to word the answer: is it no JSON at all, not an object, or a repeated field?
    Err(match serde_json::from_slice::<Value>(&body) {
        Err(e) => not_json(&e),
        Ok(Value::Object(_)) => ApiError::Malformed(format!("the body is not valid: {refusal}")),
        Ok(other) => ApiError::Malformed(format!(
            "the body must be a JSON object, got {}",
            kind(&other)
        )),
    })
}

/// Reads a body holding any JSON value, enforcing media type, size and syntax.
pub async fn read_json(req: &HttpRequest, payload: web::Payload) -> Result<Value, ApiError> {
    let body = read_body(req, payload).await?;
    serde_json::from_slice(&body).map_err(|e| not_json(&e))
}

fn not_json(e: &serde_json::Error) -> ApiError {
    ApiError::Malformed(format!("the body is not valid JSON: {e}"))
}

/// A JSON object whose keys are all distinct.
struct UniqueKeys(Map<String, Value>);

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Keys;
        impl<'de> serde::de::Visitor<'de> for Keys {
            type Value = Map<String, Value>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut access: A,
            ) -> Result<Self::Value, A::Error> {
                let mut map = Map::new();
                while let Some((key, value)) = access.next_entry::<String, Value>()? {
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
    let mut body = BytesMut::new();
    while let Some(chunk) = payload.next().await {
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

/// The fields of one request, taken one by one; every problem is collected so that a `422`
/// lists them all, and fields nobody took are reported as unknown.
pub struct Fields {
    map: Map<String, Value>,
    errors: Vec<FieldError>,
}

impl Fields {
    pub fn new(map: Map<String, Value>) -> Self {
        Self {
            map,
            errors: Vec::new(),
        }
    }

    /// For requests without a body: only the path is checked.
    pub fn empty() -> Self {
        Self::new(Map::new())
    }

    /// The `{resource}` path segment.
    pub fn resource(&mut self, raw: &str) -> Option<ResourceName> {
        ResourceName::parse(raw)
            .map_err(|e| self.reject("resource", e))
            .ok()
    }

    pub fn owner(&mut self) -> Option<Owner> {
        match self.map.remove("owner") {
            None | Some(Value::Null) => {
                self.reject("owner", "is required");
                None
            }
            Some(Value::String(s)) => Owner::parse(&s).map_err(|e| self.reject("owner", e)).ok(),
            Some(other) => {
                self.reject(
                    "owner",
                    format!("must be a JSON string, got {}", kind(&other)),
                );
                None
            }
        }
    }

    pub fn ttl(&mut self, max: Ttl) -> Option<Ttl> {
        let Some(value) = self.map.remove("ttl_seconds").filter(|v| !v.is_null()) else {
            self.reject("ttl_seconds", "is required");
            return None;
        };
        let seconds = integer(&value)
            .map_err(|m| self.reject("ttl_seconds", m))
            .ok()?;
        Ttl::new(seconds, max)
            .map_err(|e| self.reject("ttl_seconds", e))
            .ok()
    }

    /// Optional: absent or `null` is `Some(None)`; `None` means the field was invalid.
    pub fn fence(&mut self) -> Option<Option<Fence>> {
        let Some(value) = self.map.remove("fence").filter(|v| !v.is_null()) else {
            return Some(None);
        };
        let number = integer(&value).map_err(|m| self.reject("fence", m)).ok()?;
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

    fn reject(&mut self, field: impl Into<String>, message: impl ToString) {
        self.errors.push(FieldError::new(field, message));
    }
}

/// A JSON integer, strictly: not a string, not `60.0`, not `true`, not beyond i64.
fn integer(value: &Value) -> Result<i64, String> {
    match value {
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Ok(i),
            (None, Some(_)) => Err(format!("{n} is too large")),
            (None, None) => Err(format!("must be a JSON integer, got {n}")),
        },
        other => Err(format!("must be a JSON integer, got {}", kind(other))),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(v: Value) -> Fields {
        match v {
            Value::Object(map) => Fields::new(map),
            _ => unreachable!("tests pass objects"),
        }
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
