//! Inspect — `GET /locks/{resource}`.

use serde_json::{Value, json};

use crate::helpers::{StoreKind, TTL, TestApp, assert_problem, assert_public_lock};

/// The live lease is shown without its owner.
async fn live_lease_is_shown_without_owner(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let lock = app.acquire_ok("job:7", "secret-owner", TTL).await;
    let response = app.inspect("job:7").await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let text = response.text().await.unwrap();
    assert!(!text.contains("secret-owner"), "owner leaked: {text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["resource"], json!("job:7"));
    assert_public_lock(&body, &lock);
}

async fn unknown_resource_is_not_found(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    assert_problem(app.inspect("never-taken").await, 404, "not-found").await;
}

/// An expired lease is treated as absent.
async fn expired_lease_is_not_found(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.acquire_ok("job:1", "a", TTL).await;
    app.db.age("job:1", 1).await;
    assert_problem(app.inspect("job:1").await, 404, "not-found").await;
}

contract!(
    live_lease_is_shown_without_owner,
    unknown_resource_is_not_found,
    expired_lease_is_not_found,
);
