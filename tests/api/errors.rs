//! Errors the HTTP layer promises beyond the input rules: `HEAD` is not served, and a server
//! fault is a `500 internal` whose body gives nothing of the server away.

use reqwest::Method;

use serde_json::json;

use crate::helpers::{StoreKind, TTL, TestApp, assert_problem, fence};

/// `HEAD` is not served on any route: `405` with the route's `Allow` list.
async fn head_is_not_allowed(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.acquire_ok("job:1", "a", TTL).await;
    for (path, allow) in [
        ("/locks/job:1", "GET, POST, DELETE"),
        ("/locks/job:1/renew", "POST"),
        ("/healthz", "GET"),
    ] {
        let response = app
            .client
            .request(Method::HEAD, app.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 405, "HEAD {path}");
        assert_eq!(response.headers()["allow"], allow, "HEAD {path}");
    }
}

/// A broken schema (a column renamed behind the server's back) makes acquire fail inside the
/// store: the client gets `500 internal` with a fixed text, and nothing of the cause (no SQL,
/// no table or column name, no driver message).
async fn internal_error_shows_no_internals(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.acquire_ok("job:1", "a", TTL).await;
    app.db
        .execute("ALTER TABLE leases RENAME COLUMN owner TO sabotaged_owner_column")
        .await;

    let response = app.acquire("job:2", "b", TTL).await;
    let body = assert_problem(response, 500, "internal").await;
    assert_eq!(body["detail"], "internal error");
    let text = body.to_string().to_lowercase();
    for secret in [
        "sabotaged",
        "column",
        "leases",
        "select",
        "sqlite",
        "postgres",
        "error:",
    ] {
        assert!(!text.contains(secret), "{secret:?} leaked in {body}");
    }
}

/// A stale-fence answer says which way the fence is wrong: a lower one belongs to an older
/// lease of the owner; a higher one was never issued for the live lease.
async fn stale_fence_detail_tells_which_way(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let older = fence(&app.acquire_ok("job:1", "a", TTL).await);
    let live = fence(&app.acquire_ok("job:1", "a", TTL).await);
    let cases = [
        (older, "belongs to an older lease"),
        (live + 100, "was not issued"),
    ];
    for (given, says) in cases {
        let renewed = app
            .renew(
                "job:1",
                json!({ "owner": "a", "ttl_seconds": TTL, "fence": given }),
            )
            .await;
        let released = app
            .release("job:1", json!({ "owner": "a", "fence": given }))
            .await;
        for response in [renewed, released] {
            let problem = assert_problem(response, 409, "stale-fence").await;
            let detail = problem["detail"].as_str().unwrap();
            assert!(detail.contains(says), "fence {given}: {detail}");
            assert_eq!(problem["current_fence"], json!(live), "{problem}");
        }
    }
}

contract!(
    head_is_not_allowed,
    internal_error_shows_no_internals,
    stale_fence_detail_tells_which_way
);

/// `/v1` serves the lock routes only: health, readiness and unknown paths under it are `404`,
/// while a lease taken under `/v1` is the same lease as without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_serves_the_lock_routes_only() {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    for path in ["/v1/healthz", "/v1/readyz", "/v1/metrics", "/v1/nothing"] {
        assert_problem(app.get(path).await, 404, "not-found").await;
    }
    let taken = app
        .json(
            Method::POST,
            "/v1/locks/job:1",
            &serde_json::json!({ "owner": "a", "ttl_seconds": TTL }),
        )
        .await;
    assert_eq!(taken.status(), 200);
    let unprefixed = app
        .client
        .get(format!("{}/locks/job:1", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(unprefixed.status(), 200, "the /v1 lease is the lease");
}
