//! `GET /openapi.json`: a valid OpenAPI 3.1 document of exactly what the server serves, with
//! every status each operation can answer.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_testkit::openapi::{
    assert_serves_exactly, assert_slugs, fetch_document, parameter_names, parameters, statuses,
};
use serde_json::Value;

use crate::helpers::{StoreKind, TestApp, TestDb, sorted_keys};

/// The HTTP layer's own refusals, which any request may get: `400` (bad bytes or framing),
/// `408` (a head too slow), `414` (a target too long for a URI) and `431` (a head too large).
const HTTP_LAYER: [u16; 4] = [400, 408, 414, 431];

/// What each operation can answer, per the contract, beyond [`HTTP_LAYER`]; every lock
/// operation also [`AUTH`].
const OPERATIONS: [(&str, &str, &[u16]); 12] = [
    (
        "POST",
        "/locks/{resource}",
        &[200, 413, 415, 422, 429, 500, 503],
    ),
    ("GET", "/locks/{resource}", &[200, 404, 422, 500, 503]),
    (
        "DELETE",
        "/locks/{resource}",
        &[204, 403, 404, 409, 413, 415, 422, 500, 503],
    ),
    (
        "POST",
        "/locks/{resource}/release",
        &[204, 403, 404, 409, 413, 415, 422, 500, 503],
    ),
    (
        "POST",
        "/locks/{resource}/renew",
        &[200, 404, 409, 413, 415, 422, 500, 503],
    ),
    ("GET", "/locks", &[200, 422, 500, 503]),
    ("GET", "/locks/{resource}/history", &[200, 422, 500, 503]),
    ("GET", "/locks/{resource}/watch", &[200, 422, 500, 503]),
    ("GET", "/healthz", &[200]),
    ("GET", "/readyz", &[200, 503]),
    ("GET", "/metrics", &[200]),
    ("GET", "/openapi.json", &[200]),
];

/// With `--auth-file`: no or an unknown token, and a token outside its scope.
const AUTH: [u16; 2] = [401, 403];

fn expected() -> BTreeMap<String, BTreeSet<u16>> {
    let mut all = BTreeMap::new();
    for (method, path, statuses) in OPERATIONS {
        let mut statuses: BTreeSet<u16> = statuses.iter().chain(&HTTP_LAYER).copied().collect();
        if path.starts_with("/locks") {
            statuses.extend(AUTH);
            all.insert(format!("{method} /v1{path}"), statuses.clone());
        }
        all.insert(format!("{method} {path}"), statuses);
    }
    all
}

async fn the_document_lists_every_operation_and_status(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let document = fetch_document(&app.address).await;
    assert_eq!(statuses(&document), expected());
    let renew_conflicts: &[&str] = &["lease-expired", "owner-mismatch", "stale-fence"];
    assert_slugs(
        &document,
        &[
            ("/locks/{resource}/renew", "POST", 409, renew_conflicts),
            ("/v1/locks/{resource}/renew", "POST", 409, renew_conflicts),
            ("/locks/{resource}", "DELETE", 409, &["stale-fence"]),
            ("/readyz", "GET", 503, &["store-unavailable"]),
            (
                "/locks/{resource}",
                "DELETE",
                403,
                &["forbidden-scope", "forbidden"],
            ),
            ("/v1/locks/{resource}", "POST", 429, &["quota-exceeded"]),
            ("/locks", "GET", 403, &["forbidden-scope"]),
            ("/v1/locks", "GET", 403, &["forbidden-scope"]),
            ("/locks", "GET", 422, &["validation-failed"]),
            ("/v1/locks", "GET", 422, &["validation-failed"]),
            (
                "/locks/{resource}/history",
                "GET",
                403,
                &["forbidden-scope"],
            ),
            (
                "/v1/locks/{resource}/history",
                "GET",
                422,
                &["validation-failed"],
            ),
        ],
    );
    let unavailable = &document["paths"]["/locks/{resource}"]["post"]["responses"]["503"];
    assert!(unavailable["headers"]["Retry-After"]["schema"].is_object());
    let unauthorized = &document["paths"]["/locks/{resource}"]["get"]["responses"]["401"];
    assert!(unauthorized["headers"]["WWW-Authenticate"]["schema"].is_object());
    assert_eq!(
        document["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    assert_eq!(
        document["paths"]["/v1/locks/{resource}/renew"]["post"]["security"],
        serde_json::json!([{ "bearer": [] }, {}])
    );
}

async fn the_server_serves_exactly_the_document(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let document = fetch_document(&app.address).await;
    // Unprefixed only, and nothing else beside the lock paths.
    assert_serves_exactly(
        &app.address,
        &document,
        &[("resource", "job:openapi")],
        &[
            "/v1/healthz",
            "/v1/readyz",
            "/v1/metrics",
            "/v1/openapi.json",
            "/v2/locks/a",
            "/v2/locks",
            "/locks/a/b",
            "/",
        ],
    )
    .await;
}

contract!(
    the_document_lists_every_operation_and_status,
    the_server_serves_exactly_the_document,
);

/// The `minimum` and `maximum` of a number's schema.
fn bounds(schema: &Value) -> (Option<i64>, Option<i64>) {
    (schema["minimum"].as_i64(), schema["maximum"].as_i64())
}

#[tokio::test]
async fn request_bodies_are_closed_with_the_configured_ttl_bound() {
    let db = TestDb::new(StoreKind::Sqlite).await;
    let app = TestApp::spawn_on(db, |s| {
        s.max_ttl = fencelock::domain::Ttl::max(100).unwrap();
        s.max_wait_ms = 2_000;
    })
    .await;
    let document = fetch_document(&app.address).await;
    let schemas = &document["components"]["schemas"];
    for (body, required) in [
        ("AcquireBody", vec!["owner", "ttl_seconds"]),
        ("RenewBody", vec!["owner", "ttl_seconds"]),
        ("ReleaseBody", vec!["owner"]),
    ] {
        assert_eq!(schemas[body]["additionalProperties"], false, "{body}");
        assert_eq!(schemas[body]["required"], serde_json::json!(required));
    }
    for body in ["AcquireBody", "RenewBody"] {
        let ttl = &schemas[body]["properties"]["ttl_seconds"];
        assert_eq!(bounds(ttl), (Some(1), Some(100)), "{body}");
    }
    let acquire = &schemas["AcquireBody"]["properties"];
    assert_eq!(bounds(&acquire["wait_ms"]), (Some(0), Some(2_000)));
    assert_eq!(
        parameter_names(&document, "/locks/{resource}/watch", "GET"),
        ["resource", "fence", "timeout_ms"]
    );
    let answer = &schemas["WatchResponse"];
    assert_eq!(answer["additionalProperties"], false);
    assert_eq!(answer["required"], serde_json::json!(["changed", "lock"]));
    let parameter = &parameters(&document, "/locks/{resource}", "GET")[0];
    assert_eq!(parameter["name"], "resource");
    assert_eq!(parameter["schema"]["maxLength"], 255);
    // A listed lease has exactly five fields: no owner, no fence_token.
    let listed = &schemas["ListedLock"];
    assert_eq!(
        sorted_keys(&listed["properties"]),
        [
            "acquired_at",
            "expires_at",
            "expires_in_ms",
            "fence",
            "resource"
        ]
    );
    assert_eq!(listed["additionalProperties"], false);
    assert_eq!(
        parameter_names(&document, "/locks", "GET"),
        ["prefix", "limit", "after"]
    );
    // A lease in a history: five fields, no owner, no fence_token; `ended_at` may be null.
    let past = &schemas["PastLease"];
    assert_eq!(
        sorted_keys(&past["properties"]),
        ["acquired_at", "end", "ended_at", "fence", "renewals"]
    );
    assert_eq!(past["additionalProperties"], false);
    let limit = parameters(&document, "/locks/{resource}/history", "GET")
        .iter()
        .find(|p| p["name"] == "limit")
        .expect("a limit parameter");
    assert_eq!(bounds(&limit["schema"]), (Some(1), Some(1000)));
    assert_eq!(bounds(&acquire["lock_delay_ms"]), (Some(0), Some(60_000)));
    // The lock an inspect shows has no owner; the holder's has one.
    assert!(schemas["LiveLease"]["properties"].get("owner").is_none());
    assert!(
        schemas["Lock"]["required"]
            .as_array()
            .unwrap()
            .contains(&"owner".into())
    );
}
