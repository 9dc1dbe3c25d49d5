//! Acquire — `POST /locks/{resource}`.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::helpers::{StoreKind, TTL, TestApp, assert_problem, fence};

fn time(lock: &Value, field: &str) -> DateTime<Utc> {
    let text = lock[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} missing in {lock}"));
    // RFC 3339, UTC, exactly millisecond precision: 2026-11-30T01:02:03.456Z
    let shape = regex_lite::Regex::new(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$").unwrap();
    assert!(
        shape.is_match(text),
        "{field} = {text:?} is not RFC 3339 UTC with milliseconds"
    );
    text.parse().expect("timestamp parses")
}

/// A free resource is granted with a fence, both timestamps and the time left.
async fn free_resource_is_granted(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let response = app.acquire("job:42", "worker-a", 30).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["acquired"], json!(true));
    let lock = &body["lock"];
    assert_eq!(lock["resource"], json!("job:42"));
    assert_eq!(lock["owner"], json!("worker-a"));
    assert!(fence(lock) >= 1);
    let (acquired_at, expires_at) = (time(lock, "acquired_at"), time(lock, "expires_at"));
    assert_eq!((expires_at - acquired_at).num_milliseconds(), 30_000);
    let left = lock["expires_in_ms"].as_i64().expect("expires_in_ms");
    assert!((25_000..=30_000).contains(&left), "expires_in_ms = {left}");
}

/// A live lease of another owner: `acquired: false`, not an error, and the lease is untouched.
async fn held_resource_is_refused_without_error(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let first = app.acquire_ok("report:monthly-2026-05", "a", TTL).await;
    let response = app.acquire("report:monthly-2026-05", "b", TTL).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body,
        json!({ "acquired": false, "resource": "report:monthly-2026-05" })
    );
    assert_eq!(app.fence_of("report:monthly-2026-05").await, fence(&first));
}

/// The same owner acquiring again (a retry after an unclear answer) gets a new, greater fence
/// and fresh timestamps.
async fn same_owner_reacquires_with_a_greater_fence(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let first = app.acquire_ok("job:1", "a", 10).await;
    let again = app.acquire_ok("job:1", "a", 50).await;
    assert!(fence(&again) > fence(&first));
    assert!(time(&again, "acquired_at") >= time(&first, "acquired_at"));
    assert_eq!(
        (time(&again, "expires_at") - time(&again, "acquired_at")).num_seconds(),
        50
    );
    assert_eq!(app.fence_of("job:1").await, fence(&again));
}

/// Owners are trimmed: " a " is the same owner as "a", and responses show the trimmed form.
async fn owner_is_trimmed(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let first = app.acquire_ok("job:1", "  a\t", TTL).await;
    assert_eq!(first["owner"], json!("a"));
    let again = app.acquire_ok("job:1", "a", TTL).await;
    assert!(fence(&again) > fence(&first));
}

/// An expired lease is absent: another owner takes it over with a greater fence.
async fn expired_lease_is_taken_over_with_a_greater_fence(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let old = app.acquire_ok("job:1", "a", TTL).await;
    app.db.age("job:1", 1).await;
    let new = app.acquire_ok("job:1", "b", TTL).await;
    assert_eq!(new["owner"], json!("b"));
    assert!(fence(&new) > fence(&old));
    // The old holder is out.
    let refused = app
        .acquire("job:1", "a", TTL)
        .await
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(refused["acquired"], json!(false));
}

/// A lease whose expiry has just passed is free for another owner. (The instant itself,
/// `now == expires_at`, counts as expired: the rules' unit tests show it with a controlled
/// clock, and `postgres_lease_is_expired_at_its_expiry_instant` in PostgreSQL's own SQL.)
async fn lease_is_free_once_its_expiry_has_passed(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.acquire_ok("job:1", "a", TTL).await;
    app.db.age("job:1", 1).await;
    app.acquire_ok("job:1", "b", TTL).await;
}

/// Acquires `job:1` for `owner`, by the decision's own SQL, in `tx`; returns what it did (`how`).
async fn acquire_in(tx: &tokio_postgres::Transaction<'_>, owner: &str) -> Option<String> {
    tx.query_opt(
        "SELECT outcome FROM fencelock_apply('{acquire}', '{job:1}', ARRAY[$1], '{60}', '{NULL}',
             '{NULL}', '{NULL}', '{NULL}', '{0}', ARRAY[now() + interval '1 minute'], 0)",
        &[&owner],
    )
    .await
    .unwrap()
    .map(|row| row.get(0))
}

/// PostgreSQL decides expiry in SQL, on its clock as read once the decision holds the row
/// (docs/design/0002-database-clock.md): a lease whose expiry has come (here the transaction's
/// start, `now()`) is free, and one whose expiry is still ahead is not (ten seconds ahead of the
/// clock: more than this transaction's next statement can take on a loaded machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lease_is_expired_at_its_expiry_instant() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    app.acquire_ok("job:1", "a", TTL).await;
    let (mut client, connection) = tokio_postgres::connect(&app.db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let tx = client.transaction().await.unwrap();
    tx.execute(
        "UPDATE leases SET expires_at = now() WHERE resource = 'job:1' AND ended_at IS NULL",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(acquire_in(&tx, "b").await, Some("taken_over".to_owned()));
    tx.execute(
        "UPDATE leases SET expires_at = clock_timestamp() + interval '10 seconds'
         WHERE resource = 'job:1' AND ended_at IS NULL",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(
        acquire_in(&tx, "c").await,
        Some("held".to_owned()),
        "a lease ten seconds from expiry was taken"
    );
}

/// Fences increase across resources, not only within one.
async fn fences_increase_across_resources(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let mut last = 0;
    for i in 0..20 {
        let lock = app
            .acquire_ok(&format!("res-{}", i % 7), &format!("o{i}"), TTL)
            .await;
        let f = fence(&lock);
        assert!(f > last, "fence {f} after {last}");
        last = f;
        // Free the resource for the next owner that maps to it.
        let released = app
            .release(
                &format!("res-{}", i % 7),
                json!({ "owner": format!("o{i}") }),
            )
            .await;
        assert_eq!(released.status(), 204);
    }
}

/// Fences stay below 2^53 and are exact JSON integers, up to the last one: with the counter
/// just below the limit, the last two fences are issued exactly and the store then refuses
/// to issue any more rather than reach 2^53.
async fn fences_are_json_safe_integers(kind: StoreKind) {
    const LAST: u64 = (1 << 53) - 1;
    let app = TestApp::spawn(kind).await;
    app.db.set_last_fence(LAST as i64 - 2).await;
    for (resource, expected) in [("job:1", LAST - 1), ("job:2", LAST)] {
        let lock = app.acquire_ok(resource, "a", TTL).await;
        let f = lock["fence"]
            .as_u64()
            .expect("fence is a non-negative JSON integer");
        assert_eq!(f, expected);
    }
    let exhausted = app.acquire("job:3", "a", TTL).await;
    assert_problem(exhausted, 500, "internal").await;
}

/// Acquire never blocks: a refused acquire answers at once.
async fn refused_acquire_answers_at_once(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.acquire_ok("job:1", "a", TTL).await;
    let started = std::time::Instant::now();
    let body: Value = app.acquire("job:1", "b", TTL).await.json().await.unwrap();
    assert_eq!(body["acquired"], json!(false));
    // Generous: this only catches a blocking acquire (which would wait out the 60 s TTL).
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

contract!(
    free_resource_is_granted,
    held_resource_is_refused_without_error,
    same_owner_reacquires_with_a_greater_fence,
    owner_is_trimmed,
    expired_lease_is_taken_over_with_a_greater_fence,
    lease_is_free_once_its_expiry_has_passed,
    fences_increase_across_resources,
    fences_are_json_safe_integers,
    refused_acquire_answers_at_once,
);
