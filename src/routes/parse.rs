//! One parser per request type: the path and the body's fields into a domain request, or the
//! full list of what is wrong with them (`422`, one entry per bad field, unknown fields
//! included). Nothing here touches the store: the input rules come first.

use serde_json::value::RawValue;

use crate::domain::{
    AcquireRequest, Fence, Owner, ReleaseRequest, RenewRequest, ResourceName, Ttl,
};
use crate::http::body::{self, Object};
use crate::http::problem::{ApiError, FieldError};

/// `POST /locks/{resource}` `{"owner", "ttl_seconds"}`
pub fn acquire(resource: &str, body: Object, max_ttl: Ttl) -> Result<AcquireRequest, ApiError> {
    let mut fields = Fields::new(body);
    let resource = fields.resource(resource);
    let owner = fields.required("owner", owner);
    let ttl = fields.required("ttl_seconds", |raw| ttl(raw, max_ttl));
    fields.finish()?;
    Ok(AcquireRequest {
        resource: present(resource)?,
        owner: present(owner)?,
        ttl: present(ttl)?,
        token: None,
    })
}

/// `POST /locks/{resource}/renew` `{"owner", "ttl_seconds", "fence"?}`
pub fn renew(resource: &str, body: Object, max_ttl: Ttl) -> Result<RenewRequest, ApiError> {
    let mut fields = Fields::new(body);
    let resource = fields.resource(resource);
    let owner = fields.required("owner", owner);
    let ttl = fields.required("ttl_seconds", |raw| ttl(raw, max_ttl));
    let fence = fields.optional("fence", fence);
    fields.finish()?;
    Ok(RenewRequest {
        resource: present(resource)?,
        owner: present(owner)?,
        ttl: present(ttl)?,
        fence,
    })
}

/// `DELETE /locks/{resource}` or `POST /locks/{resource}/release`, `{"owner", "fence"?}`
pub fn release(resource: &str, body: Object) -> Result<ReleaseRequest, ApiError> {
    let mut fields = Fields::new(body);
    let resource = fields.resource(resource);
    let owner = fields.required("owner", owner);
    let fence = fields.optional("fence", fence);
    fields.finish()?;
    Ok(ReleaseRequest {
        resource: present(resource)?,
        owner: present(owner)?,
        fence,
    })
}

/// A `{resource}` path segment alone, for requests without a body.
pub fn resource(raw: &str) -> Result<ResourceName, ApiError> {
    ResourceName::parse(raw).map_err(|e| ApiError::validation("resource", e))
}

fn owner(raw: &RawValue) -> Result<Owner, String> {
    Owner::parse(&body::string(raw)?).map_err(|e| e.to_string())
}

fn ttl(raw: &RawValue, max: Ttl) -> Result<Ttl, String> {
    Ttl::new(body::integer(raw)?, max).map_err(|e| e.to_string())
}

fn fence(raw: &RawValue) -> Result<Fence, String> {
    Fence::new(body::integer(raw)?).map_err(|e| e.to_string())
}

/// After [`Fields::finish`] succeeded, every required field is there.
fn present<T>(field: Option<T>) -> Result<T, ApiError> {
    field.ok_or_else(|| ApiError::Internal(anyhow::anyhow!("a checked field went missing")))
}

/// The fields of one request, taken one by one; every problem is collected so that a `422`
/// lists them all, and fields nobody took are reported as unknown.
struct Fields {
    map: Object,
    errors: Vec<FieldError>,
}

impl Fields {
    fn new(map: Object) -> Self {
        Self {
            map,
            errors: Vec::new(),
        }
    }

    fn resource(&mut self, raw: &str) -> Option<ResourceName> {
        ResourceName::parse(raw)
            .map_err(|e| self.reject("resource", e))
            .ok()
    }

    /// A field that must be given (`null` counts as missing).
    fn required<T>(
        &mut self,
        name: &str,
        parse: impl FnOnce(&RawValue) -> Result<T, String>,
    ) -> Option<T> {
        let Some(raw) = self.take(name) else {
            self.reject(name, "is required");
            return None;
        };
        parse(&raw).map_err(|m| self.reject(name, m)).ok()
    }

    /// A field that may be left out or `null`; `None` then, and also when it is invalid (the
    /// problem is collected, so [`Fields::finish`] fails).
    fn optional<T>(
        &mut self,
        name: &str,
        parse: impl FnOnce(&RawValue) -> Result<T, String>,
    ) -> Option<T> {
        let raw = self.take(name)?;
        parse(&raw).map_err(|m| self.reject(name, m)).ok()
    }

    /// Every problem collected, unknown fields included, as one `422`.
    fn finish(mut self) -> Result<(), ApiError> {
        let unknown: Vec<String> = self.map.keys().cloned().collect();
        for field in unknown {
            self.reject(field, "is not a known field");
        }
        match self.errors.is_empty() {
            true => Ok(()),
            false => Err(ApiError::Validation(self.errors)),
        }
    }

    /// The field's raw text; absent and `null` are both `None`.
    fn take(&mut self, field: &str) -> Option<Box<RawValue>> {
        self.map.remove(field).filter(|raw| raw.get() != "null")
    }

    fn reject(&mut self, field: impl Into<String>, message: impl ToString) {
        self.errors.push(FieldError::new(field, message));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn object(text: &str) -> Object {
        serde_json::from_str(text).expect("tests pass objects")
    }

    fn day() -> Ttl {
        Ttl::max(86_400).unwrap()
    }

    /// The fields a `422` names, in order.
    fn invalid(result: Result<impl std::fmt::Debug, ApiError>) -> Vec<String> {
        match result {
            Err(ApiError::Validation(errors)) => errors.into_iter().map(|e| e.field).collect(),
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    fn acquire_with(ttl: &Value) -> Result<AcquireRequest, ApiError> {
        let body = format!(r#"{{"owner": "a", "ttl_seconds": {ttl}}}"#);
        acquire("job:1", object(&body), day())
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
            assert_eq!(invalid(acquire_with(&bad)), ["ttl_seconds"], "{bad}");
        }
        assert_eq!(acquire_with(&json!(30)).unwrap().ttl.seconds(), 30);
    }

    #[test]
    fn numbers_beyond_float_range_are_field_errors() {
        let huge = "9".repeat(400);
        for bad in ["1e400", "-1e400", huge.as_str(), "1e2", "0.5e-400"] {
            let body = format!(r#"{{"owner": "a", "ttl_seconds": {bad}, "fence": {bad}}}"#);
            let result = renew("job:1", object(&body), day());
            assert_eq!(invalid(result), ["ttl_seconds", "fence"], "{bad}");
        }
        let unknown = acquire(
            "job:1",
            object(r#"{"owner": "a", "ttl_seconds": 5, "ttl": 1e400}"#),
            day(),
        );
        let Err(ApiError::Validation(errors)) = unknown else {
            panic!("expected a validation error");
        };
        assert_eq!(errors, [FieldError::new("ttl", "is not a known field")]);
    }

    #[test]
    fn all_problems_are_listed_together() {
        let result = acquire("", object(r#"{"owner": " ", "ttl": 5, "extra": 1}"#), day());
        assert_eq!(
            invalid(result),
            ["resource", "owner", "ttl_seconds", "extra", "ttl"]
        );
    }

    #[test]
    fn fence_is_optional_but_positive() {
        let with = |fence: &str| {
            let body = format!(r#"{{"owner": "a"{fence}}}"#);
            release("job:1", object(&body))
        };
        assert_eq!(with("").unwrap().fence, None);
        assert_eq!(with(r#", "fence": null"#).unwrap().fence, None);
        assert_eq!(
            with(r#", "fence": 7"#).unwrap().fence,
            Some(Fence::new(7).unwrap())
        );
        for bad in ["0", "-3", "\"7\"", "7.5"] {
            assert_eq!(
                invalid(with(&format!(r#", "fence": {bad}"#))),
                ["fence"],
                "{bad}"
            );
        }
    }
}
