//! `GET /locks/{resource}/history`: a resource's most recent leases, newest first, how each
//! ended, and nothing of their owners; kept for `--history-retention-seconds`.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{
    StoreKind, TTL, TestApp, TestDb, assert_invalid, assert_problem, eventually, fence,
    sorted_keys, token_entry,
};

/// `resource`'s history (asserting a `200` of the documented shape): its leases, newest first.
async fn history(app: &TestApp, resource: &str) -> Vec<Value> {
    history_query(app, resource, "").await
}

async fn history_query(app: &TestApp, resource: &str, query: &str) -> Vec<Value> {
    let response = app.get(&format!("/locks/{resource}/history{query}")).await;
    assert_eq!(response.status(), 200, "history of {resource}{query}");
    let body: Value = response.json().await.unwrap();
    assert_eq!(sorted_keys(&body), ["leases", "resource"], "{body}");
    assert_eq!(body["resource"], resource);
    let leases = body["leases"].as_array().unwrap().clone();
    for lease in &leases {
        assert_eq!(
            sorted_keys(lease),
            ["acquired_at", "end", "ended_at", "fence", "renewals"],
            "{lease}"
        );
        assert_timestamp(&lease["acquired_at"]);
        match lease["end"].as_str().unwrap() {
            "live" => assert_eq!(lease["ended_at"], Value::Null, "{lease}"),
            "released" | "expired" | "taken_over" => assert_timestamp(&lease["ended_at"]),
            other => panic!("unknown end {other:?}"),
        }
    }
    let fences: Vec<i64> = leases.iter().map(fence).collect();
    assert!(
        fences.windows(2).all(|pair| pair[0] > pair[1]),
        "not newest first: {fences:?}"
    );
    leases
}

/// RFC 3339 UTC with exactly millisecond precision, as every lock object's times.
fn assert_timestamp(value: &Value) {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("not a time: {value}"));
    let parsed = chrono::DateTime::parse_from_rfc3339(text).expect("RFC 3339");
    let shown = parsed
        .with_timezone(&chrono::Utc)
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    assert_eq!(text, shown, "not UTC with milliseconds: {text}");
}

fn millis(value: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(value.as_str().unwrap())
        .unwrap()
        .timestamp_millis()
}

/// (fence, end, renewals) of each lease, newest first.
fn summary(leases: &[Value]) -> Vec<(i64, String, i64)> {
    leases
        .iter()
        .map(|l| {
            let end = l["end"].as_str().unwrap().to_owned();
            (fence(l), end, l["renewals"].as_i64().unwrap())
        })
        .collect()
}

fn end(kind: &str) -> String {
    kind.to_owned()
}

/// A acquires, renews twice and releases; B acquires and its lease expires (aged on the
/// store's clock, no waiting); C takes over. Newest first: C live, B taken over (ended at its
/// expiry, before C's acquisition), A released with two renewals (ended at the release,
/// before B's acquisition). No owner appears anywhere.
async fn the_history_tells_how_each_lease_ended(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    acquisitions_renewals_release_and_takeover(&app).await;
}

async fn acquisitions_renewals_release_and_takeover(app: &TestApp) {
    let a = app.acquire_ok("r", "owner-a-secret", TTL).await;
    for _ in 0..2 {
        let body = json!({ "owner": "owner-a-secret", "ttl_seconds": TTL, "fence": fence(&a) });
        app.renew_ok("r", body).await;
    }
    let gone = app.release("r", json!({ "owner": "owner-a-secret" })).await;
    assert_eq!(gone.status(), 204);
    let b = app.acquire_ok("r", "owner-b-secret", TTL).await;
    app.db.age("r", 1_000).await;
    let c = app.acquire_ok("r", "owner-c-secret", TTL).await;

    let response = app.get("/locks/r/history").await;
    let text = response.text().await.unwrap();
    assert!(!text.contains("secret"), "an owner is shown: {text}");
    assert!(!text.contains("owner"), "{text}");
    let leases = history(app, "r").await;
    assert_eq!(
        summary(&leases),
        [
            (fence(&c), end("live"), 0),
            (fence(&b), end("taken_over"), 0),
            (fence(&a), end("released"), 2),
        ]
    );
    for (lease, lock) in leases.iter().zip([&c, &b, &a]) {
        assert_eq!(lease["acquired_at"], lock["acquired_at"]);
    }
    let (b_end, a_end) = (
        millis(&leases[1]["ended_at"]),
        millis(&leases[2]["ended_at"]),
    );
    // B's end is its expiry, set a second back by the ageing: after B's acquisition (which
    // was at least as late as A's release), before C's.
    assert!(b_end <= millis(&c["acquired_at"]), "{leases:?}");
    assert!(millis(&b["acquired_at"]) - 1_000 <= b_end, "{leases:?}");
    assert!(a_end >= millis(&a["acquired_at"]) && a_end <= millis(&b["acquired_at"]));
}

/// The single statements of PostgreSQL (`--pg-batch-max 1`) keep the same history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_statements_keep_the_same_history() {
    let db = TestDb::new(StoreKind::Postgres).await;
    let app = TestApp::spawn_on(db, |s| s.pg_batch_max = 1).await;
    acquisitions_renewals_release_and_takeover(&app).await;
}

/// A re-acquisition of a live lease releases it at the new acquisition's time; after expiry,
/// the owner's own new lease leaves the old one `expired` (nobody else took the resource); a
/// lease that expired with nobody after it is `expired` too, ended at its expiry.
async fn reacquisition_and_expiry_end_leases_as_documented(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let first = app.acquire_ok("re", "o", TTL).await;
    let second = app.acquire_ok("re", "o", TTL).await;
    let leases = history(&app, "re").await;
    assert_eq!(
        summary(&leases),
        [
            (fence(&second), end("live"), 0),
            (fence(&first), end("released"), 0)
        ]
    );
    assert_eq!(leases[1]["ended_at"], second["acquired_at"]);

    app.db.age("re", 1_000).await;
    let third = app.acquire_ok("re", "o", TTL).await;
    let leases = history(&app, "re").await;
    assert_eq!(
        summary(&leases),
        [
            (fence(&third), end("live"), 0),
            (fence(&second), end("expired"), 0),
            (fence(&first), end("released"), 0),
        ]
    );
    assert!(millis(&leases[1]["ended_at"]) <= millis(&third["acquired_at"]));

    let lone = app.acquire_ok("lone", "o", TTL).await;
    let renewed = app
        .renew_ok("lone", json!({ "owner": "o", "ttl_seconds": 2 * TTL }))
        .await;
    let live = history(&app, "lone").await;
    assert_eq!(summary(&live), [(fence(&lone), end("live"), 1)]);
    app.db.age("lone", 5_000).await;
    let expired = history(&app, "lone").await;
    assert_eq!(summary(&expired), [(fence(&lone), end("expired"), 1)]);
    // Ended at its expiry, which the renewal had moved and the ageing moved back.
    let ended = millis(&expired[0]["ended_at"]);
    assert!(ended < millis(&renewed["expires_at"]));
}

/// An unknown resource has an empty history; `limit` takes the newest, 50 by default.
async fn the_limit_takes_the_newest_leases(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    assert!(history(&app, "never").await.is_empty());
    let mut fences = Vec::new();
    for _ in 0..52 {
        fences.push(fence(&app.acquire_ok("many", "o", TTL).await));
    }
    fences.reverse();
    let all = history(&app, "many").await;
    assert_eq!(all.iter().map(fence).collect::<Vec<_>>(), fences[..50]);
    let two = history_query(&app, "many", "?limit=2").await;
    assert_eq!(two.iter().map(fence).collect::<Vec<_>>(), fences[..2]);
    let most = history_query(&app, "many", "?limit=1000").await;
    assert_eq!(most.len(), 52);
    // Another resource's leases never appear.
    app.acquire_ok("many-more", "o", TTL).await;
    assert_eq!(history_query(&app, "many", "?limit=1000").await.len(), 52);
}

/// A bad `limit`, an unknown or repeated parameter, or a bad resource: `422`.
async fn bad_queries_are_validation_failures(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.acquire_ok("q", "o", TTL).await;
    let huge = "9".repeat(40);
    for bad in ["0", "1001", "x", "-1", "1.5", "", "%205", huge.as_str()] {
        let response = app.get(&format!("/locks/q/history?limit={bad}")).await;
        assert_invalid(response, &["limit"], &format!("limit={bad}")).await;
    }
    for (query, fields) in [
        ("limt=5", &["limt"][..]),
        ("limit=5&limit=5", &["limit"][..]),
        ("limit=5&owner=o", &["owner"][..]),
    ] {
        let response = app.get(&format!("/locks/q/history?{query}")).await;
        assert_invalid(response, fields, query).await;
    }
    let response = app.get("/locks/a%2Fb/history?limit=0").await;
    assert_invalid(response, &["resource", "limit"], "bad resource").await;
    let response = app.get("/locks/../history").await;
    assert_eq!(response.status(), 404, "a path no route matches");
    let wrong = app.json(Method::POST, "/locks/q/history", &json!({})).await;
    assert_problem(wrong, 405, "method-not-allowed").await;
}

const LOCKER: &str = "locker-secret-0123456789";
const READER: &str = "reader-secret-0123456789";

/// Reading a history needs `read` on the resource's prefix: no token `401`, a `lock`-only
/// token or a resource outside the prefixes `403 forbidden-scope`, after the input rules.
async fn history_needs_the_read_permission(kind: StoreKind) {
    let auth = [
        token_entry("locker", LOCKER, &[""], &["lock"]),
        token_entry("reader", READER, &["job:"], &["read"]),
    ]
    .concat();
    let (app, _dir) = TestApp::spawn_with_auth(kind, &auth).await;
    let taken = app.acquire_as(Some(LOCKER), "job:1", "o", TTL).await;
    assert_eq!(taken.status(), 200);
    let read = |token, path: &'static str| app.send_as(token, Method::GET, path, None);

    assert_problem(
        read(None, "/locks/job:1/history").await,
        401,
        "unauthorized",
    )
    .await;
    let bad = read(Some(LOCKER), "/locks/job:1/history?limit=0").await;
    assert_invalid(bad, &["limit"], "input rules before scope").await;
    let locker = read(Some(LOCKER), "/locks/job:1/history").await;
    assert_problem(locker, 403, "forbidden-scope").await;
    let outside = read(Some(READER), "/locks/other:1/history").await;
    assert_problem(outside, 403, "forbidden-scope").await;
    let allowed = read(Some(READER), "/locks/job:1/history").await;
    assert_eq!(allowed.status(), 200);
    let body: Value = allowed.json().await.unwrap();
    assert_eq!(body["leases"][0]["end"], "live");
}

/// The retention purge deletes the history of leases that ended longer ago than the
/// retention (released, or expired), in batches, and never a live lease's, however old.
async fn retention_purges_only_long_ended_leases(kind: StoreKind) {
    const HOUR_MS: i64 = 3600 * 1000;
    let app = TestApp::spawn(kind).await;
    let retention = Duration::from_secs(3600);

    app.acquire_ok("released-long-ago", "o", TTL).await;
    app.release_ok("released-long-ago", json!({ "owner": "o" }))
        .await;
    app.db.age_history("released-long-ago", 2 * HOUR_MS).await;
    app.acquire_ok("expired-long-ago", "o", TTL).await;
    app.db.age("expired-long-ago", 2 * HOUR_MS).await;
    // `age` moves the expiry only; a lease that expired two hours ago was acquired before.
    app.db.age_history("expired-long-ago", 2 * HOUR_MS).await;
    app.acquire_ok("released-now", "o", TTL).await;
    app.release_ok("released-now", json!({ "owner": "o" }))
        .await;
    app.acquire_ok("expired-recently", "o", TTL).await;
    app.db.age("expired-recently", 60_000).await;
    // Live for a day, acquired long before the retention: kept.
    app.acquire_ok("live", "o", 86_400).await;
    app.db.age_history("live", 2 * HOUR_MS).await;

    let purged = app.store.purge_history(retention).await.unwrap();
    assert_eq!(purged, 2);
    for (resource, left) in [
        ("released-long-ago", 0),
        ("expired-long-ago", 0),
        ("released-now", 1),
        ("expired-recently", 1),
        ("live", 1),
    ] {
        assert_eq!(app.db.history_rows(resource).await, left, "{resource}");
    }
    assert_eq!(history(&app, "live").await[0]["end"], "live");
    assert!(history(&app, "expired-long-ago").await.is_empty());

    // In batches: many ended leases go in one call, over several batches.
    for i in 0..30 {
        let resource = format!("bulk-{i}");
        app.acquire_ok(&resource, "o", TTL).await;
        app.db.age(&resource, 2 * HOUR_MS).await;
        app.db.age_history(&resource, 2 * HOUR_MS).await;
    }
    let purged = app.store.purge_history_batch(retention, 7).await.unwrap();
    assert_eq!(purged, 7);
    assert_eq!(app.store.purge_history(retention).await.unwrap(), 23);
    assert_eq!(app.db.history_rows("live").await, 1);
}

/// The server purges the history by itself, on the purge interval, after the retention.
async fn retention_is_kept_by_the_server(kind: StoreKind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn_on(db, |s| {
        s.purge_interval = Duration::from_millis(50);
        s.history_retention = Duration::from_secs(3600);
    })
    .await;
    app.acquire_ok("old", "o", TTL).await;
    app.release_ok("old", json!({ "owner": "o" })).await;
    app.db.age_history("old", 2 * 3600 * 1000).await;
    app.acquire_ok("kept", "o", TTL).await;
    app.release_ok("kept", json!({ "owner": "o" })).await;
    eventually(
        "the old history was never purged",
        Duration::from_secs(20),
        async || app.db.history_rows("old").await == 0,
    )
    .await;
    assert_eq!(history(&app, "kept").await.len(), 1);
}

contract!(
    the_history_tells_how_each_lease_ended,
    reacquisition_and_expiry_end_leases_as_documented,
    the_limit_takes_the_newest_leases,
    bad_queries_are_validation_failures,
    history_needs_the_read_permission,
    retention_purges_only_long_ended_leases,
    retention_is_kept_by_the_server,
);
