//! What every fencelock service's OpenAPI document shares: the problem document's schema, the
//! problem answers of an operation, and the final touches that the derives cannot express.
//!
//! A service derives its document with `utoipa` (`ToSchema` on its wire types,
//! `#[utoipa::path]` on its handlers, one `#[derive(OpenApi)]` listing them) and passes it
//! through [`finish`]. An operation lists its problem answers as sample errors
//! ([`problems`]): their statuses and slugs come from [`ApiError::status_and_type`], the one
//! mapping that also renders them, so the document cannot name a slug the code does not send.

use std::collections::BTreeMap;

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderName};
use serde_json::{Value, json};
use utoipa::openapi::schema::{Schema, Type};
use utoipa::openapi::{ObjectBuilder, OpenApi, RefOr, Response};

use super::problem::{ApiError, FieldError, PROBLEM_JSON};

/// The path every service serves its document at.
pub const DOCUMENT_PATH: &str = "/openapi.json";

/// Largest fence: below 2^53, so that every JSON client reads it exactly.
pub const MAX_FENCE: i64 = (1 << 53) - 1;

/// The schema of a [`crate::domain::ResourceName`] in a path (the lease server's `{resource}`,
/// the demo store's `{key}`): 1-255 characters of `A-Z a-z 0-9 . _ - : @ + = ~`, not `.` or
/// `..`. A parameter takes it with `#[param(value_type = ResourceNameSchema, inline)]`.
pub struct ResourceNameSchema;

impl utoipa::PartialSchema for ResourceNameSchema {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(255))
            .pattern(Some(r"^(?!\.\.?$)[A-Za-z0-9._:@+=~-]{1,255}$"))
            .into()
    }
}

impl utoipa::ToSchema for ResourceNameSchema {}

/// An RFC 9457 problem document as fencelock services send it (`application/problem+json`).
/// Each answer narrows `type` and `status` to what that operation can send.
#[derive(utoipa::ToSchema)]
#[schema(as = Problem)]
#[expect(
    dead_code,
    reason = "the wire shape of problem::Problem for the document; never built"
)]
struct ProblemSchema {
    /// The problem type's slug.
    #[schema(rename = "type")]
    kind: String,
    /// The status's reason phrase.
    title: String,
    /// The HTTP status, as sent in the status line.
    #[schema(minimum = 400, maximum = 599)]
    status: u16,
    /// What went wrong, for a person.
    detail: String,
    /// The request path.
    instance: String,
    /// `validation-failed`: every invalid field, one entry each.
    errors: Option<Vec<FieldError>>,
    /// `stale-fence`: the fence of the live lease, or the highest fence the guard has
    /// accepted.
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_i64)]
    current_fence: Option<i64>,
    /// `not-found` of a resource inside another owner's lock delay (RFC 3339, milliseconds,
    /// UTC): until then no other owner can acquire it.
    #[schema(format = DateTime)]
    delayed_until: Option<String>,
    /// The request's id, as in its `X-Request-Id` answer header.
    request_id: Option<String>,
}

/// The refusals of a JSON request body (see [`super::body`]): media type or content coding
/// (`415`), size (`413`), too slow (`408`), not a JSON object (`400`).
pub fn body_refusals() -> Vec<ApiError> {
    vec![
        ApiError::Malformed(String::new()),
        ApiError::RequestTimeout(String::new()),
        ApiError::PayloadTooLarge { limit: 0 },
        ApiError::UnsupportedMediaType(String::new()),
    ]
}

/// A store that cannot answer: `503` with `Retry-After` while a retry may succeed, `500` for
/// a bug.
pub fn store_failures() -> Vec<ApiError> {
    vec![
        ApiError::StoreUnavailable(anyhow::anyhow!("")),
        ApiError::Internal(anyhow::anyhow!("")),
    ]
}

/// A field or parameter breaks the input rules: `422`.
pub fn invalid_input() -> ApiError {
    ApiError::Validation(Vec::new())
}

/// What the HTTP layer itself may refuse on any path, before a route sees the request (see
/// [`super::middleware::refused_by_parser`]): bad bytes or framing (`400`), a head that is too
/// slow (`408`), a target too long for a URI (`414`) or a head too large (`431`).
fn http_layer_refusals() -> Vec<ApiError> {
    vec![
        ApiError::Malformed(String::new()),
        ApiError::RequestTimeout(String::new()),
        ApiError::UriTooLong(String::new()),
        ApiError::HeadersTooLarge(String::new()),
    ]
}

/// The problem answers of an operation, one per status: `type` is narrowed to the slugs the
/// samples have at that status.
/// Declares, for each `Name => samples;`, a type whose `IntoResponses` are the problem answers
/// of those sample errors (see [`problems`]): the problem half of one operation's
/// `responses(...)`, for every service's document.
#[macro_export]
macro_rules! problem_answers {
    ($($name:ident => $samples:expr;)*) => {$(
        pub struct $name;

        impl ::utoipa::IntoResponses for $name {
            fn responses() -> ::std::collections::BTreeMap<
                String,
                ::utoipa::openapi::RefOr<::utoipa::openapi::Response>,
            > {
                $crate::http::openapi::problems($samples)
            }
        }
    )*};
}

pub fn problems(samples: impl IntoIterator<Item = ApiError>) -> BTreeMap<String, RefOr<Response>> {
    let mut by_status: BTreeMap<u16, (ApiError, Vec<&'static str>)> = BTreeMap::new();
    for sample in samples {
        let (status, slug) = sample.status_and_type();
        let (_, slugs) = by_status
            .entry(status.as_u16())
            .or_insert_with(|| (sample, Vec::new()));
        if !slugs.contains(&slug) {
            slugs.push(slug);
        }
    }
    by_status
        .into_iter()
        .map(|(status, (sample, slugs))| {
            let response = serde_json::from_value(problem_response(status, &sample, &slugs))
                .expect("a problem answer is a valid response object");
            (status.to_string(), RefOr::T(response))
        })
        .collect()
}

fn problem_response(status: u16, sample: &ApiError, slugs: &[&str]) -> Value {
    let reason = StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    let mut response = json!({
        "description": format!("{reason}: {}", slugs.join(", ")),
        "content": { PROBLEM_JSON: { "schema": {
            "allOf": [
                { "$ref": "#/components/schemas/Problem" },
                {
                    "type": "object",
                    "required": ["type", "title", "status", "detail", "instance"],
                    "properties": {
                        "type": { "type": "string", "enum": slugs },
                        "status": { "type": "integer", "enum": [status] },
                    },
                },
            ],
        } } },
    });
    let head = sample.response_head();
    let headers: serde_json::Map<String, Value> = problem_headers()
        .into_iter()
        .filter(|(header, ..)| head.headers().contains_key(header))
        .map(|(_, name, description, schema)| {
            let documented = json!({ "description": description, "schema": schema });
            (name.to_owned(), documented)
        })
        .collect();
    if !headers.is_empty() {
        response["headers"] = Value::Object(headers);
    }
    response
}

/// The headers a problem answer may carry, as its documentation names and describes them.
fn problem_headers() -> [(HeaderName, &'static str, &'static str, Value); 3] {
    let text = || json!({ "type": "string" });
    [
        (
            header::RETRY_AFTER,
            "Retry-After",
            "Seconds to wait before retrying.",
            json!({ "type": "integer", "minimum": 0 }),
        ),
        (
            header::WWW_AUTHENTICATE,
            "WWW-Authenticate",
            "The scheme to authenticate with: `Bearer`.",
            text(),
        ),
        (
            header::ALLOW,
            "Allow",
            "The methods this path serves.",
            text(),
        ),
    ]
}

/// The answers of an operation that always succeeds, apart from the HTTP layer's refusals:
/// a `200` of `content_type` with `schema` (JSON Schema).
fn only_ok(content_type: &str, description: &str, schema: Value) -> Value {
    json!({ "200": {
        "description": description,
        "content": { content_type: { "schema": schema } },
    } })
}

/// `GET /metrics`: the Prometheus text exposition format.
fn metrics_path() -> Value {
    json!({ "get": {
        "operationId": "metrics",
        "tags": ["operations"],
        "summary": "Counters and histograms, in the Prometheus text exposition format",
        "responses": only_ok(
            "text/plain",
            "The metrics (text/plain; version=0.0.4).",
            json!({ "type": "string" }),
        ),
    } })
}

/// `GET /openapi.json`: the document itself.
fn document_path() -> Value {
    json!({ "get": {
        "operationId": "openapi",
        "tags": ["operations"],
        "summary": "This OpenAPI document",
        "responses": only_ok(
            "application/json",
            "The OpenAPI 3.1 document of this service.",
            json!({ "type": "object" }),
        ),
    } })
}

/// The last touches, on the document as JSON, that every service needs: the problem schemas,
/// `GET /metrics` and `GET /openapi.json`, the HTTP layer's refusals on every operation, and
/// the `405` of every path.
pub fn finish(document: OpenApi) -> Value {
    let mut doc = serde_json::to_value(document).expect("an OpenAPI document serialises");
    let mut components = BTreeMap::new();
    components.insert(
        "Problem",
        serde_json::to_value(<ProblemSchema as utoipa::PartialSchema>::schema())
            .expect("a schema serialises"),
    );
    components.insert(
        "FieldError",
        serde_json::to_value(<FieldError as utoipa::PartialSchema>::schema())
            .expect("a schema serialises"),
    );
    for (name, schema) in components {
        doc["components"]["schemas"][name] = schema;
    }
    doc["paths"]["/metrics"] = metrics_path();
    doc["paths"][DOCUMENT_PATH] = document_path();

    let refusals = serde_json::to_value(problems(http_layer_refusals())).expect("serialises");
    let method_not_allowed = serde_json::to_value(problems([ApiError::MethodNotAllowed {
        method: String::new(),
        allow: "",
    }]))
    .expect("serialises");
    doc["components"]["responses"]["MethodNotAllowed"] = method_not_allowed["405"].clone();

    let paths = doc["paths"].as_object_mut().expect("paths is an object");
    for item in paths.values_mut() {
        let item = item.as_object_mut().expect("a path item is an object");
        let mut methods = Vec::new();
        for (method, operation) in item.iter_mut() {
            let Some(responses) = operation
                .get_mut("responses")
                .and_then(Value::as_object_mut)
            else {
                continue;
            };
            methods.push(method.to_ascii_uppercase());
            for (status, response) in refusals.as_object().expect("a map") {
                responses
                    .entry(status.clone())
                    .or_insert_with(|| response.clone());
            }
        }
        item.insert(
            "description".into(),
            Value::String(format!(
                "Any other method is answered `405 method-not-allowed` \
                 (#/components/responses/MethodNotAllowed) with `Allow: {}`.",
                methods.join(", ")
            )),
        );
    }
    doc
}

/// The document as the answer to `GET /openapi.json`.
pub fn serve(document: &Value) -> HttpResponse {
    HttpResponse::Ok().json(document)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema_properties() -> Vec<String> {
        let schema = serde_json::to_value(<ProblemSchema as utoipa::PartialSchema>::schema())
            .expect("serialises");
        schema["properties"]
            .as_object()
            .expect("properties")
            .keys()
            .cloned()
            .collect()
    }

    #[test]
    fn every_member_of_a_rendered_problem_is_in_the_schema() {
        let properties = schema_properties();
        let samples = [
            ApiError::validation("owner", "is required"),
            ApiError::StaleFence {
                detail: "x".into(),
                current_fence: Some(crate::domain::Fence::new(3).expect("a fence")),
            },
            ApiError::NotFound("x".into()),
            ApiError::Delayed {
                detail: "x".into(),
                until: chrono::DateTime::UNIX_EPOCH,
            },
        ];
        for sample in samples {
            let document: Value =
                serde_json::from_slice(&sample.problem_json("/x", "req-1")).expect("JSON");
            for member in document.as_object().expect("an object").keys() {
                assert!(properties.contains(member), "{member} is not documented");
            }
        }
    }

    #[test]
    fn answers_narrow_the_slugs_per_status() {
        let answers = serde_json::to_value(problems([
            ApiError::LeaseExpired(String::new()),
            ApiError::OwnerMismatch(String::new()),
            ApiError::StaleFence {
                detail: String::new(),
                current_fence: None,
            },
            ApiError::StoreUnavailable(anyhow::anyhow!("")),
        ]))
        .expect("serialises");
        let conflict = &answers["409"]["content"][PROBLEM_JSON]["schema"]["allOf"][1];
        assert_eq!(
            conflict["properties"]["type"]["enum"],
            json!(["lease-expired", "owner-mismatch", "stale-fence"])
        );
        assert_eq!(conflict["properties"]["status"]["enum"], json!([409]));
        assert!(answers["503"]["headers"]["Retry-After"].is_object());
    }
}
