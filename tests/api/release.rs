//! Release — `DELETE /locks/{resource}` and `POST /locks/{resource}/release`.

use reqwest::Method;
use serde_json::json;

use crate::helpers::{StoreKind, TTL, TestApp, assert_problem, fence};

/// The owner releases, by `DELETE` or by `POST .../release` (for clients that cannot send a
/// DELETE body), with the lease's own fence or without one: `204` with no body; afterwards GET,
/// renew and another release answer `404`.
async fn owner_releases(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    for (method, path) in [
        (Method::DELETE, "/locks/job:1"),
        (Method::POST, "/locks/job:1/release"),
    ] {
        for with_fence in [false, true] {
            let lock = app.acquire_ok("job:1", "a", TTL).await;
            let mut body = json!({ "owner": "a" });
            if with_fence {
                body["fence"] = json!(fence(&lock));
            }
            let case = format!("{method} {path} {body}");
            let response = app.json(method.clone(), path, &body).await;
            assert_eq!(response.status(), 204, "{case}");
            assert!(response.bytes().await.unwrap().is_empty(), "{case}");
            assert_problem(app.inspect("job:1").await, 404, "not-found").await;
            let renew = app
                .renew("job:1", json!({ "owner": "a", "ttl_seconds": TTL }))
                .await;
            assert_problem(renew, 404, "not-found").await;
            let again = app.json(method.clone(), path, &body).await;
            assert_problem(again, 404, "not-found").await;
        }
    }
}

/// Another owner may not release: `403`, and the lease stays.
async fn other_owner_is_forbidden(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let lock = app.acquire_ok("job:1", "a", TTL).await;
    for response in [
        app.release("job:1", json!({ "owner": "b" })).await,
        app.release_by_post("job:1", json!({ "owner": "b", "fence": fence(&lock) }))
            .await,
    ] {
        assert_problem(response, 403, "forbidden").await;
    }
    assert_eq!(app.fence_of("job:1").await, fence(&lock));
}

/// The owner with an older lease's fence: `409 stale-fence`, and the lease stays.
async fn stale_fence_is_refused(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let old = app.acquire_ok("job:1", "a", TTL).await;
    let new = app.acquire_ok("job:1", "a", TTL).await;
    let stale = json!({ "owner": "a", "fence": fence(&old) });
    let problem = assert_problem(app.release("job:1", stale).await, 409, "stale-fence").await;
    assert_eq!(problem["current_fence"], json!(fence(&new)));
    assert_eq!(app.fence_of("job:1").await, fence(&new));
}

async fn unknown_lease_is_not_found(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let response = app.release("nothing-here", json!({ "owner": "a" })).await;
    assert_problem(response, 404, "not-found").await;
}

/// An expired lease is no live lease: `404`, even for its former owner.
async fn expired_lease_is_not_found(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.acquire_ok("job:1", "a", TTL).await;
    app.db.age("job:1", 1).await;
    let response = app.release("job:1", json!({ "owner": "a" })).await;
    assert_problem(response, 404, "not-found").await;
}

/// Release deletes the row but never lowers the fence counter.
async fn release_never_lowers_the_fence(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let mut last = 0;
    for _ in 0..5 {
        let lock = app.acquire_ok("job:1", "a", TTL).await;
        assert!(fence(&lock) > last);
        last = fence(&lock);
        assert_eq!(
            app.release("job:1", json!({ "owner": "a" })).await.status(),
            204
        );
    }
    assert_eq!(app.db.rows("job:1").await, 0);
}

contract!(
    owner_releases,
    other_owner_is_forbidden,
    stale_fence_is_refused,
    unknown_lease_is_not_found,
    expired_lease_is_not_found,
    release_never_lowers_the_fence,
);
