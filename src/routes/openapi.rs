//! `GET /openapi.json`: the lease server's OpenAPI 3.1 document, generated from the code.
//!
//! The handlers carry `#[utoipa::path]`, the response types derive `ToSchema`, and the
//! shapes of what they read and the problem answers of each operation (sample errors,
//! [`fencelock::http::openapi::problems`]) are in [`super::wire`]. This module stands above
//! all of them: it gathers the handlers' paths into one document. What the derives cannot
//! say is added by [`document`] from the same source: the `/v1` copy of every lock path,
//! `POST .../release` (the handler of `DELETE`), and the configured TTL maximum; the lease
//! without its owner that inspect shows is [`super::view::LiveLease`].

use actix_web::{HttpResponse, web};
use serde_json::Value;
use utoipa::OpenApi;

use super::view::LiveLease;
use super::wire::{AcquireBody, ReleaseBody, RenewBody};
use super::{AppState, health, history, listing, locks, watch};
use fencelock::domain::Ttl;
use fencelock::http::openapi::finish;

/// The prefix every lock path is also served under.
pub(crate) const VERSION_PREFIX: &str = "/v1";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "fencelock",
        description = "A lease server that hands out time-limited locks with fencing tokens. \
            Every lock path is also served under `/v1`. Errors are RFC 9457 problem documents.",
        license(name = "MIT OR Apache-2.0", identifier = "MIT OR Apache-2.0"),
    ),
    paths(
        locks::acquire,
        locks::inspect,
        locks::release,
        locks::renew,
        watch::watch,
        listing::list,
        history::history,
        health::healthz,
        health::readyz,
    ),
    components(schemas(AcquireBody, RenewBody, ReleaseBody, LiveLease)),
    tags(
        (name = "locks", description = "Acquire, inspect, renew, release and list leases, and read a resource's history"),
        (name = "operations", description = "Health, readiness, metrics, this document"),
    )
)]
struct LeaseServerApi;

/// `GET /openapi.json`
pub(crate) async fn serve(state: web::Data<AppState>) -> HttpResponse {
    fencelock::http::openapi::serve(&document(state.max_ttl, state.max_wait_ms))
}

/// The whole document, for a server whose longest TTL is `max_ttl` and longest wait
/// `max_wait_ms`.
pub(crate) fn document(max_ttl: Ttl, max_wait_ms: u32) -> Value {
    let mut doc = finish(LeaseServerApi::openapi());
    for body in ["AcquireBody", "RenewBody"] {
        doc["components"]["schemas"][body]["properties"]["ttl_seconds"]["maximum"] =
            Value::from(max_ttl.seconds());
    }
    doc["components"]["schemas"]["AcquireBody"]["properties"]["wait_ms"]["maximum"] =
        Value::from(max_wait_ms);
    // An untagged enum's variants: closed, and told apart by `acquired` too.
    let answers = &mut doc["components"]["schemas"]["AcquireResponse"]["oneOf"];
    for (variant, acquired) in answers
        .as_array_mut()
        .into_iter()
        .flatten()
        .zip([true, false])
    {
        variant["additionalProperties"] = Value::Bool(false);
        variant["properties"]["acquired"]["enum"] = serde_json::json!([acquired]);
    }
    doc["components"]["securitySchemes"]["bearer"] = bearer_scheme();
    let paths = doc["paths"].as_object_mut().expect("paths is an object");
    for (_, item) in paths
        .iter_mut()
        .filter(|(path, _)| path.starts_with("/locks"))
    {
        for (_, operation) in item.as_object_mut().expect("an object").iter_mut() {
            if operation.get("responses").is_some() {
                operation["security"] = serde_json::json!([{ "bearer": [] }, {}]);
            }
        }
    }

    // The handler of DELETE /locks/{resource} also serves POST .../release.
    let mut release = paths["/locks/{resource}"]["delete"].clone();
    release["operationId"] = Value::from("release_post");
    release["summary"] = Value::from(
        "Release a lease (for clients that cannot send a body with DELETE); as DELETE /locks/{resource}",
    );
    let allow = paths["/locks/{resource}/renew"]["description"].clone();
    paths.insert(
        "/locks/{resource}/release".to_owned(),
        serde_json::json!({ "post": release, "description": allow }),
    );

    // Every lock path again under /v1, with the same operations.
    let prefixed: Vec<(String, Value)> = paths
        .iter()
        .filter(|(path, _)| path.starts_with("/locks"))
        .map(|(path, item)| {
            let mut item = item.clone();
            for (_, operation) in item.as_object_mut().expect("an object").iter_mut() {
                if let Some(id) = operation.get("operationId").and_then(Value::as_str) {
                    operation["operationId"] = Value::from(format!("{id}_v1"));
                }
            }
            (format!("{VERSION_PREFIX}{path}"), item)
        })
        .collect();
    paths.extend(prefixed);
    doc
}

/// The bearer scheme of `--auth-file`. Without the file the server checks no token, so each
/// lock operation lists both the scheme and no requirement at all.
fn bearer_scheme() -> Value {
    serde_json::json!({
        "type": "http",
        "scheme": "bearer",
        "description": "`Authorization: Bearer <secret>`, checked when the server runs with \
            `--auth-file`: no or an unknown token is `401`, a resource outside the token's \
            prefixes or a missing permission `403 forbidden-scope`, a `lock` token at its \
            `max_leases` `429 quota-exceeded`.",
    })
}
