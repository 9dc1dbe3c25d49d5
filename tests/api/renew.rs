//! Renew — `POST /locks/{resource}/renew`.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::helpers::{StoreKind, TTL, TestApp, assert_problem, fence};

fn at(lock: &Value, field: &str) -> DateTime<Utc> {
    lock[field].as_str().unwrap().parse().unwrap()
}

/// Renew keeps the fence and `acquired_at` and sets `expires_at` to now + ttl.
async fn renew_extends_the_live_lease(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let lock = app.acquire_ok("job:1", "a", 10).await;
    let renewed = app
        .renew_ok("job:1", json!({ "owner": "a", "ttl_seconds": 120 }))
        .await;
    assert_eq!(renewed["resource"], json!("job:1"));
    assert_eq!(renewed["owner"], json!("a"));
    assert_eq!(fence(&renewed), fence(&lock));
    assert_eq!(renewed["acquired_at"], lock["acquired_at"]);
    assert!(at(&renewed, "expires_at") > at(&lock, "expires_at"));
    let left = renewed["expires_in_ms"].as_i64().unwrap();
    assert!(
        (115_000..=120_000).contains(&left),
        "expires_in_ms = {left}"
    );
    // GET agrees.
    let shown: Value = app.inspect("job:1").await.json().await.unwrap();
    assert_eq!(shown["expires_at"], renewed["expires_at"]);
}

/// A shorter TTL shortens the lease: `expires_at` is now + ttl, not the later of the two.
async fn renew_can_shorten_the_lease(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let lock = app.acquire_ok("job:1", "a", 3600).await;
    let body: Value = app
        .renew("job:1", json!({ "owner": "a", "ttl_seconds": 5 }))
        .await
        .json()
        .await
        .unwrap();
    assert!(at(&body["lock"], "expires_at") < at(&lock, "expires_at"));
    assert!(body["lock"]["expires_in_ms"].as_i64().unwrap() <= 5000);
}

async fn renew_with_matching_fence(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let lock = app.acquire_ok("job:1", "a", TTL).await;
    let body = json!({ "owner": "a", "ttl_seconds": TTL, "fence": fence(&lock) });
    assert_eq!(app.renew("job:1", body).await.status(), 200);
}

async fn renew_of_unknown_lease_is_not_found(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let body = json!({ "owner": "a", "ttl_seconds": TTL });
    assert_problem(app.renew("never", body).await, 404, "not-found").await;
}

/// An expired lease is never renewed, even if nobody took it over: the holder must acquire
/// again and gets a new fence.
async fn expired_lease_is_not_renewed(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let lock = app.acquire_ok("job:1", "a", TTL).await;
    app.db.age("job:1", 1).await;
    for fence_given in [None, Some(fence(&lock))] {
        let mut body = json!({ "owner": "a", "ttl_seconds": TTL });
        if let Some(f) = fence_given {
            body["fence"] = json!(f);
        }
        assert_problem(app.renew("job:1", body).await, 409, "lease-expired").await;
    }
    // Still expired: the refused renew changed nothing.
    assert_problem(app.inspect("job:1").await, 404, "not-found").await;
    let again = app.acquire_ok("job:1", "a", TTL).await;
    assert!(fence(&again) > fence(&lock));
}

/// Another owner's live lease: `409 owner-mismatch` (the caller lost it), lease unchanged.
async fn other_owner_gets_owner_mismatch(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let lock = app.acquire_ok("job:1", "a", TTL).await;
    let body = json!({ "owner": "b", "ttl_seconds": 3600 });
    assert_problem(app.renew("job:1", body).await, 409, "owner-mismatch").await;
    let shown: Value = app.inspect("job:1").await.json().await.unwrap();
    assert_eq!(shown["expires_at"], lock["expires_at"]);
}

/// The lost-lease story: A's lease expires, B takes over, A's late renew is refused.
async fn late_renew_after_takeover_is_refused(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let a = app.acquire_ok("job:1", "a", TTL).await;
    app.db.age("job:1", 1).await;
    let b = app.acquire_ok("job:1", "b", TTL).await;
    let late = json!({ "owner": "a", "ttl_seconds": TTL, "fence": fence(&a) });
    assert_problem(app.renew("job:1", late).await, 409, "owner-mismatch").await;
    assert_eq!(app.fence_of("job:1").await, fence(&b));
}

/// The owner with an older lease's fence: `409 stale-fence`, lease unchanged.
async fn stale_fence_is_refused(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let old = app.acquire_ok("job:1", "a", TTL).await;
    let new = app.acquire_ok("job:1", "a", TTL).await;
    let stale = json!({ "owner": "a", "ttl_seconds": 3600, "fence": fence(&old) });
    let problem = assert_problem(app.renew("job:1", stale).await, 409, "stale-fence").await;
    assert_eq!(problem["current_fence"], json!(fence(&new)));
    let shown: Value = app.inspect("job:1").await.json().await.unwrap();
    assert_eq!(shown["expires_at"], new["expires_at"]);
}

contract!(
    renew_extends_the_live_lease,
    renew_can_shorten_the_lease,
    renew_with_matching_fence,
    renew_of_unknown_lease_is_not_found,
    expired_lease_is_not_renewed,
    other_owner_gets_owner_mismatch,
    late_renew_after_takeover_is_refused,
    stale_fence_is_refused,
);
