//! Input rules: checked before any store access, every failure a problem document.

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{
    StoreKind, TTL, TestApp, assert_invalid, assert_problem, assert_raw_problem, invalid_fields,
};

/// The routes that take a JSON body.
fn body_routes() -> [(Method, &'static str); 4] {
    [
        (Method::POST, "/locks/job:1"),
        (Method::POST, "/locks/job:1/renew"),
        (Method::DELETE, "/locks/job:1"),
        (Method::POST, "/locks/job:1/release"),
    ]
}

/// A valid acquire or renew body.
fn lease_body() -> Value {
    json!({ "owner": "a", "ttl_seconds": TTL })
}

/// ttl 0, negative, string, float, bool, null, 1e300, i64::MAX, above the maximum, missing.
async fn invalid_ttls_are_422(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let bad = [
        "0",
        "-1",
        "\"60\"",
        "60.0",
        "60.5",
        "true",
        "null",
        "1e300",
        "9223372036854775807",
        "18446744073709551616",
        "-9223372036854775809",
        "86401",
        "[60]",
        "{}",
    ];
    for ttl in bad {
        let body = format!(r#"{{"owner":"a","ttl_seconds":{ttl}}}"#);
        for path in ["/locks/job:1", "/locks/job:1/renew"] {
            let response = app.json_text(Method::POST, path, body.clone()).await;
            assert_invalid(response, &["ttl_seconds"], &format!("{path}: ttl {ttl}")).await;
        }
    }
    let missing = app
        .json(Method::POST, "/locks/job:1", &json!({ "owner": "a" }))
        .await;
    assert_invalid(missing, &["ttl_seconds"], "no ttl").await;
    // Nothing was taken along the way.
    assert_problem(app.inspect("job:1").await, 404, "not-found").await;
}

/// The bounds themselves are fine.
async fn ttl_bounds_are_inclusive(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.acquire_ok("a", "o", 1).await;
    app.acquire_ok("b", "o", 86_400).await;
}

/// A server with a lower maximum refuses TTLs above it.
async fn configured_max_ttl_applies(kind: StoreKind) {
    let db = crate::helpers::TestDb::new(kind).await;
    let app = TestApp::spawn_on(db, |s| {
        s.max_ttl = fencelock::domain::Ttl::max(100).unwrap();
    })
    .await;
    app.acquire_ok("a", "o", 100).await;
    assert_problem(app.acquire("b", "o", 101).await, 422, "validation-failed").await;
}

/// Empty, blank, missing, non-string, control characters, over 255 bytes.
async fn invalid_owners_are_422(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let bad = [
        json!(""),
        json!("   "),
        json!("\t\n"),
        json!(null),
        json!(42),
        json!(["a"]),
        json!("a\u{0}b"),
        json!("a\nb"),
        json!("x".repeat(256)),
        json!("é".repeat(128)),
    ];
    for owner in bad {
        let body = json!({ "owner": owner, "ttl_seconds": TTL });
        let response = app.json(Method::POST, "/locks/job:1", &body).await;
        assert_invalid(response, &["owner"], &format!("owner {owner}")).await;
    }
    let missing = app
        .json(Method::POST, "/locks/job:1", &json!({ "ttl_seconds": TTL }))
        .await;
    assert_invalid(missing, &["owner"], "no owner").await;
    // 255 bytes is fine, and so is non-ASCII.
    app.acquire_ok("job:2", &"x".repeat(255), TTL).await;
    app.acquire_ok("job:3", "wörker-ß", TTL).await;
}

/// Resource names: 255 characters fine, 256 not; every character outside the set refused.
async fn resource_names_follow_the_rules(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let longest = "r".repeat(255);
    let lock = app.acquire_ok(&longest, "a", TTL).await;
    assert_eq!(lock["resource"], json!(longest));
    let all_allowed = "AZaz09._-:@+=~";
    app.acquire_ok(all_allowed, "a", TTL).await;
    assert_eq!(
        app.inspect(all_allowed).await.status(),
        200,
        "GET of a name with every allowed character"
    );

    let too_long = "r".repeat(256);
    let encoded_bad = [
        too_long.as_str(),
        "a%2Fb",
        "a%2fb",
        "a%20b",
        "a%22b",
        "a'b",
        "%C3%A9t%C3%A9",
        "a%3Bb",
        "a%25b",
        "a%00b",
        "a%5Cb",
        "a%3Fb",
        "a%23b",
    ];
    for resource in encoded_bad {
        assert_invalid(
            app.acquire(resource, "a", TTL).await,
            &["resource"],
            resource,
        )
        .await;
        for response in [
            app.inspect(resource).await,
            app.renew(resource, lease_body()).await,
            app.release(resource, json!({ "owner": "a" })).await,
        ] {
            assert_problem(response, 422, "validation-failed").await;
        }
    }
    // An empty name.
    assert_problem(app.acquire("", "a", TTL).await, 422, "validation-failed").await;
}

/// A literal `/` makes another path, which no route matches.
async fn literal_slash_is_another_path(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    assert_problem(app.inspect("a/b").await, 404, "not-found").await;
    assert_problem(app.acquire("a/b", "a", TTL).await, 404, "not-found").await;
}

/// SQL in names and owners is data: the table survives and the values round-trip.
async fn sql_injection_is_inert(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let resource = "x%27%3B%20DROP%20TABLE%20leases%3B%20--";
    assert_problem(
        app.acquire(resource, "a", TTL).await,
        422,
        "validation-failed",
    )
    .await;
    let owner = "o'); DROP TABLE leases; --";
    let lock = app.acquire_ok("job:1", owner, TTL).await;
    assert_eq!(lock["owner"], json!(owner));
    let released = app.release("job:1", json!({ "owner": owner })).await;
    assert_eq!(released.status(), 204);
    app.acquire_ok("job:1", "still-works", TTL).await;
    assert_eq!(app.db.total_rows().await, 1);
}

/// A typo such as `ttl` must not pass unnoticed.
async fn unknown_fields_are_422(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let cases = [
        (
            Method::POST,
            json!({ "owner": "a", "ttl": TTL }),
            ["ttl", "ttl_seconds"].as_slice(),
        ),
        (
            Method::POST,
            json!({ "owner": "a", "ttl_seconds": TTL, "fence": 1 }),
            &["fence"],
        ),
        // Release takes no TTL.
        (Method::DELETE, lease_body(), &["ttl_seconds"]),
    ];
    for (method, body, fields) in cases {
        let response = app.json(method.clone(), "/locks/job:1", &body).await;
        assert_invalid(response, fields, &format!("{method} {body}")).await;
    }
}

/// fence: optional, a JSON integer ≥ 1.
async fn invalid_fences_are_422(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.acquire_ok("job:1", "a", TTL).await;
    for fence in [
        "0",
        "-1",
        "\"1\"",
        "1.5",
        "true",
        "9007199254740992",
        "1e300",
    ] {
        for (method, path, body) in [
            (
                Method::POST,
                "/locks/job:1/renew",
                format!(r#"{{"owner":"a","ttl_seconds":60,"fence":{fence}}}"#),
            ),
            (
                Method::DELETE,
                "/locks/job:1",
                format!(r#"{{"owner":"a","fence":{fence}}}"#),
            ),
        ] {
            let case = format!("{method} {path}: fence {fence}");
            assert_invalid(app.json_text(method, path, body).await, &["fence"], &case).await;
        }
    }
    // The lease is still there.
    assert_eq!(app.inspect("job:1").await.status(), 200);
}

/// Bodies that are not JSON, or not an object: `400`.
async fn malformed_bodies_are_400(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    for body in [
        "",
        "{",
        "{\"owner\": }",
        "not json",
        "[]",
        "\"a\"",
        "42",
        "null",
        "{}}",
    ] {
        for (method, path) in body_routes() {
            let response = app.json_text(method, path, body).await;
            assert_problem(response, 400, "malformed-request").await;
        }
    }
    // Deep nesting is refused cleanly, not by a crash.
    let deep = format!("{}{}", "[".repeat(5_000), "]".repeat(5_000));
    let response = app.json_text(Method::POST, "/locks/job:1", deep).await;
    assert_problem(response, 400, "malformed-request").await;
}

/// A chunked body is read as any other; one whose chunked framing breaks is a `400` that
/// says so, and nothing is acquired.
async fn chunked_bodies(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let chunked = |chunks: &str| {
        format!(
            "POST /locks/job:1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{chunks}"
        )
        .into_bytes()
    };
    let body = lease_body().to_string();
    let (first, rest) = body.split_at(5);
    for broken in [
        format!("{:x}\r\n{first}\r\nzz\r\n{rest}\r\n0\r\n\r\n", first.len()),
        format!(
            "{:x}\r\n{first}\r\n{:x}\r\n{rest}\r\nnot a chunk\r\n",
            first.len(),
            rest.len()
        ),
    ] {
        let response = app.raw(&chunked(&broken)).await;
        let problem = assert_raw_problem(&response, 400, "malformed-request");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains("chunked") || detail.contains("last chunk"),
            "{detail}"
        );
        assert!(!detail.contains("None"), "{detail}");
        assert_eq!(app.inspect("job:1").await.status(), 404, "{broken:?}");
    }
    let whole = format!(
        "{:x}\r\n{first}\r\n{:x}\r\n{rest}\r\n0\r\n\r\n",
        first.len(),
        rest.len()
    );
    let response = app.raw(&chunked(&whole)).await;
    assert_eq!(response.status, 200);
    let answer: Value = serde_json::from_slice(&response.body).unwrap();
    assert_eq!(answer["acquired"], true);
}

/// The lock routes take no query: a parameter there is named in the `422`, as an unknown body
/// field is (an option such as `wait_ms` sent in the query must not pass as not asked for),
/// together with the body's own problems; nothing is taken or changed.
async fn query_parameters_on_lock_routes_are_422(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.acquire_ok("job:1", "a", TTL).await;
    for (method, path) in body_routes() {
        let releases = method == Method::DELETE || path.ends_with("/release");
        let mut body = match releases {
            true => json!({ "owner": "a" }),
            false => lease_body(),
        };
        let with_query = format!("{path}?wait_ms=5000&fence");
        let response = app
            .json_text(method.clone(), &with_query, body.to_string())
            .await;
        assert_invalid(response, &["wait_ms", "fence"], &with_query).await;
        body["owner"] = json!(" ");
        let response = app.json_text(method, &with_query, body.to_string()).await;
        assert_invalid(response, &["owner", "wait_ms", "fence"], &with_query).await;
    }
    let response = app.get("/locks/job:1?fence=1").await;
    assert_invalid(response, &["fence"], "inspect").await;
    let response = app.get("/locks/a%2Fb?fence=1").await;
    assert_invalid(response, &["resource", "fence"], "inspect of a bad name").await;
    // The lease is as it was: not renewed, released or taken again.
    let lease: Value = app.inspect("job:1").await.json().await.unwrap();
    assert_eq!(lease["fence"], 1);
    // An empty query is no query.
    assert_eq!(app.get("/locks/job:1?").await.status(), 200);
}

/// A field given twice is ambiguous, above all for the owner; but the body is still JSON
/// (RFC 8259: names SHOULD be unique), so it is that field's `422`, not a `400`.
async fn a_field_given_twice_is_its_422(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    for (method, path) in body_routes() {
        let body = r#"{"owner":"a","owner":"b","ttl_seconds":60}"#;
        let response = app.json_text(method, path, body).await;
        assert_invalid(response, &["owner"], path).await;
    }
}

/// Content-Type missing or not JSON: `415`; parameters are fine.
async fn content_type_must_be_json(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let body = lease_body().to_string();
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("application/jsonx"),
    ] {
        let response = app
            .send(Method::POST, "/locks/job:1", content_type, body.clone())
            .await;
        assert_problem(response, 415, "unsupported-media-type").await;
    }
    for content_type in ["application/json; charset=utf-8", "Application/JSON"] {
        let response = app
            .send(
                Method::POST,
                "/locks/job:1",
                Some(content_type),
                body.clone(),
            )
            .await;
        assert_eq!(response.status(), 200, "{content_type}");
        app.release("job:1", json!({ "owner": "a" })).await;
    }
}

/// Bodies over 16 KiB: `413`; just under is fine.
async fn oversized_body_is_413(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let padded = |size: usize| {
        let core = lease_body().to_string();
        format!("{}{core}", " ".repeat(size - core.len()))
    };
    for body in [padded(16 * 1024 + 1), "x".repeat(1 << 20)] {
        let response = app.json_text(Method::POST, "/locks/job:1", body).await;
        assert_problem(response, 413, "payload-too-large").await;
    }
    let limit = app
        .json_text(Method::POST, "/locks/job:1", padded(16 * 1024))
        .await;
    assert_eq!(limit.status(), 200);
}

/// Input rules come first: a `422` wins over `404`, `403` and `acquired: false`.
async fn validation_wins_over_store_outcomes(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.acquire_ok("held", "a", TTL).await;
    for response in [
        app.acquire("held", "b", 0).await,
        app.release("held", json!({ "owner": "" })).await,
        app.release("held", json!({ "owner": "b", "fence": 0 }))
            .await,
        app.renew("absent", json!({ "owner": "a", "ttl_seconds": -1 }))
            .await,
        app.release("absent", json!({ "owner": "a", "extra": true }))
            .await,
    ] {
        assert_problem(response, 422, "validation-failed").await;
    }
}

/// All problems of a request are listed together.
async fn every_invalid_field_is_listed(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let response = app
        .json(
            Method::POST,
            "/locks/bad%20name/renew",
            &json!({ "owner": " ", "ttl_seconds": 0, "fence": -1, "x": 1 }),
        )
        .await;
    let fields = ["fence", "owner", "resource", "ttl_seconds", "x"];
    let problem = assert_invalid(response, &fields, "renew").await;
    for error in problem["errors"].as_array().unwrap() {
        assert!(!error["message"].as_str().unwrap().is_empty());
    }
}

/// Wrong methods: `405` problem with an `Allow` header; unknown paths: `404` problem.
async fn wrong_methods_and_paths(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let cases = [
        (Method::PUT, "/locks/job:1", "GET, POST, DELETE"),
        (Method::PATCH, "/locks/job:1", "GET, POST, DELETE"),
        (Method::GET, "/locks/job:1/renew", "POST"),
        (Method::DELETE, "/locks/job:1/release", "POST"),
        (Method::POST, "/healthz", "GET"),
        (Method::DELETE, "/readyz", "GET"),
        (Method::POST, "/locks", "GET"),
        (Method::DELETE, "/locks", "GET"),
    ];
    for (method, path, allow) in cases {
        let response = app.send(method, path, None, "").await;
        assert_eq!(response.headers()["allow"].to_str().unwrap(), allow);
        assert_problem(response, 405, "method-not-allowed").await;
    }
    for path in [
        "/",
        "/lock",
        "/nope",
        "/locks/job:1/other",
        "/locks/a/b/renew",
    ] {
        assert_problem(app.get(path).await, 404, "not-found").await;
    }
}

/// A pile of odd requests: every answer is a 2xx or a 4xx problem, never a 5xx.
async fn odd_requests_never_get_a_500(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let bodies: Vec<Value> = vec![
        json!({ "owner": { "nested": true }, "ttl_seconds": TTL }),
        json!({ "owner": "a", "ttl_seconds": TTL, "owner2": null }),
        json!({ "owner": "\u{202e}rtl", "ttl_seconds": TTL }),
        json!({ "owner": "a", "ttl_seconds": 1, "fence": null }),
        json!({ "owner": "🦀", "ttl_seconds": 2 }),
        json!({ "": "" }),
    ];
    for body in bodies {
        for (method, path) in body_routes() {
            let response = app.json(method, path, &body).await;
            assert!(
                response.status().is_success() || response.status().is_client_error(),
                "{body} → {}",
                response.status()
            );
        }
    }
}

/// `.` and `..` are dot segments to HTTP clients (`/locks/./renew` becomes `/locks/renew`),
/// so they are no resource names: `422`, whether sent literally or percent-encoded.
async fn dot_segments_are_not_resource_names(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let lease = json!({ "owner": "a", "ttl_seconds": TTL });
    let owner = json!({ "owner": "a" });
    for name in [".", "..", "%2E", "%2e%2E"] {
        for (path, body) in [
            (format!("/locks/{name}"), &lease),
            (format!("/locks/{name}/renew"), &lease),
            (format!("/locks/{name}/release"), &owner),
        ] {
            let literal = format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.to_string().len()
            );
            let problem =
                assert_raw_problem(&app.raw(literal.as_bytes()).await, 422, "validation-failed");
            assert_eq!(invalid_fields(&problem), ["resource"], "{path}");
        }
        let inspect = format!("GET /locks/{name} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert_raw_problem(&app.raw(inspect.as_bytes()).await, 422, "validation-failed");
    }
    // Names that merely contain dots are ordinary names.
    for name in ["...", ".a", "a..b"] {
        app.acquire_ok(name, "a", TTL).await;
    }
}

/// A number of any size or precision in a field is that field's `422`: valid JSON is never a
/// `400`, however large its numbers.
async fn numbers_beyond_float_range_are_422(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let digits = "9".repeat(400);
    let negative = format!("-{digits}");
    let precise = format!("1.{digits}");
    for number in ["1e400", "-1e400", "1E+999", &digits, &negative, &precise] {
        let cases = [
            (
                "/locks/job:1",
                format!(r#"{{"owner":"a","ttl_seconds":{number}}}"#),
                "ttl_seconds",
            ),
            (
                "/locks/job:1/renew",
                format!(r#"{{"owner":"a","ttl_seconds":{number}}}"#),
                "ttl_seconds",
            ),
            (
                "/locks/job:1/renew",
                format!(r#"{{"owner":"a","ttl_seconds":60,"fence":{number}}}"#),
                "fence",
            ),
            (
                "/locks/job:1/release",
                format!(r#"{{"owner":"a","fence":{number}}}"#),
                "fence",
            ),
            (
                "/locks/job:1",
                format!(r#"{{"owner":{number},"ttl_seconds":60}}"#),
                "owner",
            ),
            // In an unknown field it is just an unknown field.
            (
                "/locks/job:1",
                format!(r#"{{"owner":"a","ttl_seconds":60,"ttl":{number}}}"#),
                "ttl",
            ),
        ];
        for (path, body, field) in cases {
            let response = app.json_text(Method::POST, path, body).await;
            let case = format!("{path} {field} {number}");
            let problem = assert_invalid(response, &[field], &case).await;
            let message = problem["errors"][0]["message"].as_str().unwrap();
            assert!(
                message.len() < 200,
                "the message quotes the number whole: {message}"
            );
        }
    }
    // Nothing was taken along the way.
    assert_problem(app.inspect("job:1").await, 404, "not-found").await;
}

/// A body in any content coding but `identity` is `415`, checked before size and syntax.
async fn content_encoded_bodies_are_415(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let valid = lease_body().to_string();
    let oversized = format!("{valid}{}", " ".repeat(20 * 1024));
    for coding in ["gzip", "deflate", "br", "x-gzip", "GZIP", "identity, gzip"] {
        for body in [
            valid.as_str(),
            oversized.as_str(),
            "not json",
            "\u{1f}\u{8b}\u{8}",
        ] {
            for (method, path) in body_routes() {
                let response = send_encoded(&app, method, path, coding, body).await;
                assert_problem(response, 415, "unsupported-media-type").await;
            }
        }
    }
    assert_problem(app.inspect("job:1").await, 404, "not-found").await;
    for coding in ["identity", "IDENTITY"] {
        let response = send_encoded(&app, Method::POST, "/locks/job:1", coding, &valid).await;
        assert_eq!(response.status(), 200, "{coding}");
    }
}

/// Sends `body` as JSON with the header `Content-Encoding: {coding}`.
async fn send_encoded(
    app: &TestApp,
    method: Method,
    path: &str,
    coding: &str,
    body: &str,
) -> reqwest::Response {
    app.client
        .request(method, app.url(path))
        .header("content-type", "application/json")
        .header("content-encoding", coding)
        .body(body.to_owned())
        .send()
        .await
        .expect("request reaches the server")
}

contract!(
    numbers_beyond_float_range_are_422,
    content_encoded_bodies_are_415,
    dot_segments_are_not_resource_names,
    invalid_ttls_are_422,
    ttl_bounds_are_inclusive,
    configured_max_ttl_applies,
    invalid_owners_are_422,
    resource_names_follow_the_rules,
    literal_slash_is_another_path,
    sql_injection_is_inert,
    unknown_fields_are_422,
    invalid_fences_are_422,
    malformed_bodies_are_400,
    chunked_bodies,
    query_parameters_on_lock_routes_are_422,
    a_field_given_twice_is_its_422,
    content_type_must_be_json,
    oversized_body_is_413,
    validation_wins_over_store_outcomes,
    every_invalid_field_is_listed,
    wrong_methods_and_paths,
    odd_requests_never_get_a_500,
);
