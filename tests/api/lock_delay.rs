//! `"lock_delay_ms"` on acquire: after a lease ends by expiry, no other owner acquires the
//! resource until the delay has passed too; its own owner may at once; a release imposes
//! none.

use std::time::{Duration, Instant};

use reqwest::{Method, Response};
use serde_json::{Value, json};

use crate::helpers::{
    NOT_INTEGERS, StoreKind, TTL, TestApp, assert_invalid, assert_problem, fence,
};

async fn acquire_with(app: &TestApp, resource: &str, body: Value) -> Response {
    app.json(Method::POST, &format!("/locks/{resource}"), &body)
        .await
}

/// Acquires with a lock delay; returns the lock.
async fn acquire_delayed(
    app: &TestApp,
    resource: &str,
    owner: &str,
    ttl: i64,
    delay: i64,
) -> Value {
    let body = json!({ "owner": owner, "ttl_seconds": ttl, "lock_delay_ms": delay });
    let response = acquire_with(app, resource, body).await;
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["acquired"], true, "{answer}");
    answer["lock"].clone()
}

/// Whether `owner` acquires `resource` now (no lock delay of its own).
async fn acquires(app: &TestApp, resource: &str, owner: &str) -> bool {
    let response = app.acquire(resource, owner, TTL).await;
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    answer["acquired"].as_bool().unwrap()
}

/// A lease that expired a second ago with a 30 s delay keeps others out (and shows no live
/// lease); 31 s after its expiry it no longer does. Times are set on the store's clock by
/// ageing the lease, so the margins are whole seconds, not scheduling luck.
async fn a_lock_delay_keeps_other_owners_out_after_expiry(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let first = acquire_delayed(&app, "d", "a", TTL, 30_000).await;
    assert!(!acquires(&app, "d", "b").await, "taken while live");
    app.db.age("d", 1_000).await;
    assert!(!acquires(&app, "d", "b").await, "taken inside the delay");
    assert_problem(app.inspect("d").await, 404, "not-found").await;
    let renew = json!({ "owner": "a", "ttl_seconds": TTL });
    assert_problem(app.renew("d", renew).await, 409, "lease-expired").await;
    app.db.age("d", 31_000).await;
    let taken = app.acquire_ok("d", "b", TTL).await;
    assert!(fence(&taken) > fence(&first));
}

/// The owner itself may acquire again at once, inside its delay; its new lease takes the new
/// request's delay (none here).
async fn the_owner_may_reacquire_inside_its_delay(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    acquire_delayed(&app, "d", "a", TTL, 30_000).await;
    app.db.age("d", 1_000).await;
    assert!(acquires(&app, "d", "a").await);
    app.db.age("d", 1_000).await;
    assert!(acquires(&app, "d", "b").await, "the new lease has no delay");
}

/// Inside its lock delay the resource is free for nobody else, the waiters included: its
/// owner re-acquires it ahead of the queue, and the queue still waits.
async fn the_owner_reacquires_inside_its_delay_ahead_of_the_queue(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    acquire_delayed(&app, "d", "a", TTL, 30_000).await;
    app.db.age("d", 1_000).await;
    app.db.queue_ticket("d", 20_000).await;
    assert!(!acquires(&app, "d", "b").await, "taken inside the delay");
    let again = app.acquire_ok("d", "a", TTL).await;
    assert_eq!(again["owner"], "a", "{again}");
    assert_eq!(app.db.waiters("d").await, 1, "the queue is left as it was");
}

/// A released lease imposes no delay; a renewed one keeps its delay.
async fn release_imposes_none_and_renew_keeps_it(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    acquire_delayed(&app, "released", "a", TTL, 60_000).await;
    let gone = app.release("released", json!({ "owner": "a" })).await;
    assert_eq!(gone.status(), 204);
    assert!(acquires(&app, "released", "b").await);

    acquire_delayed(&app, "renewed", "a", TTL, 30_000).await;
    app.renew_ok("renewed", json!({ "owner": "a", "ttl_seconds": TTL }))
        .await;
    app.db.age("renewed", 1_000).await;
    assert!(!acquires(&app, "renewed", "b").await);
}

/// The purge never deletes a lease inside its lock delay, whatever the grace: the row is what
/// keeps others out.
async fn the_purge_keeps_a_lease_inside_its_delay(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    acquire_delayed(&app, "d", "a", TTL, 60_000).await;
    app.db.age("d", 1_000).await;
    assert_eq!(app.store.purge_expired(Duration::ZERO).await.unwrap(), 0);
    assert_eq!(app.db.rows("d").await, 1);
    assert!(!acquires(&app, "d", "b").await);
    app.db.age("d", 61_000).await;
    assert_eq!(app.store.purge_expired(Duration::ZERO).await.unwrap(), 1);
}

/// In real time: a 1 s lease with a 1.5 s delay. Whenever another owner gets the resource,
/// the store's own clock says it was at least 1.5 s after the lease's `expires_at` (exact:
/// both times come from the store, so no scheduling margin is needed).
async fn another_owner_gets_it_only_after_expiry_plus_delay(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let first = acquire_delayed(&app, "rt", "a", 1, 1_500).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let taken = loop {
        let response = app.acquire("rt", "b", TTL).await;
        let answer: Value = response.json().await.unwrap();
        if answer["acquired"] == true {
            break answer["lock"].clone();
        }
        assert!(Instant::now() < deadline, "never free again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let at = |lock: &Value, field: &str| {
        chrono::DateTime::parse_from_rfc3339(lock[field].as_str().unwrap())
            .unwrap()
            .timestamp_millis()
    };
    let free_at = at(&first, "expires_at") + 1_500;
    assert!(
        at(&taken, "acquired_at") >= free_at,
        "taken at {} before {free_at}",
        taken["acquired_at"]
    );
}

/// `lock_delay_ms` is a JSON integer from 0 to 60000, by the rules of `ttl_seconds`; only
/// acquire takes it.
async fn lock_delay_is_validated(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    for bad in ["-1", "60001", "9223372036854775807"]
        .into_iter()
        .chain(NOT_INTEGERS)
    {
        let body = format!(r#"{{"owner": "a", "ttl_seconds": 5, "lock_delay_ms": {bad}}}"#);
        let response = app.json_text(Method::POST, "/locks/v", body).await;
        assert_invalid(response, &["lock_delay_ms"], bad).await;
    }
    for good in [0, 60_000] {
        acquire_delayed(&app, &format!("v-{good}"), "a", 5, good).await;
    }
    let renew = json!({ "owner": "a", "ttl_seconds": 5, "lock_delay_ms": 5 });
    assert_invalid(app.renew("v-0", renew).await, &["lock_delay_ms"], "renew").await;
}

contract!(
    a_lock_delay_keeps_other_owners_out_after_expiry,
    the_owner_may_reacquire_inside_its_delay,
    the_owner_reacquires_inside_its_delay_ahead_of_the_queue,
    release_imposes_none_and_renew_keeps_it,
    the_purge_keeps_a_lease_inside_its_delay,
    another_owner_gets_it_only_after_expiry_plus_delay,
    lock_delay_is_validated,
);
