//! Purging leases that expired longer ago than the grace.

use std::time::Duration;

use serde_json::json;

use crate::helpers::{
    StoreKind, TTL, TestApp, TestDb, assert_problem, eventually, fence, first_column, pg_connect,
};

const HOUR_MS: i64 = 3600 * 1000;

/// Only leases expired for longer than the grace go; until then renew says `lease-expired`,
/// afterwards `not-found`. Live leases are untouched and fences keep increasing.
async fn purge_removes_only_long_expired_leases(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let mut highest = 0;
    for resource in ["old", "recent", "live"] {
        highest = fence(&app.acquire_ok(resource, "a", TTL).await);
    }
    app.db.age("old", 2 * HOUR_MS).await;
    app.db.age("recent", 60_000).await;

    let purged = app
        .store
        .purge_expired(Duration::from_secs(3600))
        .await
        .expect("purge runs");
    assert_eq!(purged, 1);
    assert_eq!(app.db.rows("old").await, 0);
    assert_eq!(app.db.rows("recent").await, 1);
    assert_eq!(app.db.rows("live").await, 1);

    let renew =
        |resource: &'static str| app.renew(resource, json!({ "owner": "a", "ttl_seconds": TTL }));
    assert_problem(renew("old").await, 404, "not-found").await;
    assert_problem(renew("recent").await, 409, "lease-expired").await;
    assert_eq!(renew("live").await.status(), 200);

    let next = fence(&app.acquire_ok("old", "b", TTL).await);
    assert!(next > highest);
}

/// The server purges by itself, on its interval.
async fn purge_runs_periodically(kind: StoreKind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn_on(db, |s| s.purge_interval = Duration::from_millis(50)).await;
    app.acquire_ok("old", "a", TTL).await;
    app.acquire_ok("live", "a", TTL).await;
    app.db.age("old", 2 * HOUR_MS).await;
    eventually(
        "the expired lease was never purged",
        Duration::from_secs(20),
        async || app.db.rows("old").await == 0,
    )
    .await;
    assert_eq!(app.inspect("live").await.status(), 200);
}

/// Many one-off resources: purging empties the table in batches.
async fn purge_handles_many_rows(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let before = fence(&app.acquire_ok("keep", "a", TTL).await);
    app.db.insert_expired(25_000, 2 * HOUR_MS).await;
    assert_eq!(app.db.total_rows().await, 25_001);
    let purged = app
        .store
        .purge_expired(Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(purged, 25_000);
    assert_eq!(app.db.total_rows().await, 1);
    assert!(fence(&app.acquire_ok("next", "a", TTL).await) > before);
}

/// On PostgreSQL, what instances that died left behind goes with the purge once it expired
/// more than a minute ago: waiters' tickets and watches' registrations. Newer ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_what_departed_instances_left() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    let db = pg_connect(&app.db.url()).await;
    db.batch_execute(
        "INSERT INTO lease_waiters (resource, expires_at)
         VALUES ('departed', now() - interval '2 minutes'), ('recent', now() - interval '10 seconds');
         INSERT INTO lease_watchers (resource, expires_at)
         VALUES ('departed', now() - interval '2 minutes'), ('recent', now() - interval '10 seconds')",
    )
    .await
    .unwrap();
    app.store
        .purge_expired(Duration::from_secs(3600))
        .await
        .expect("purge runs");
    let left: Vec<String> = first_column(
        &db,
        "SELECT 'waiter ' || resource FROM lease_waiters
         UNION ALL SELECT 'watcher ' || resource FROM lease_watchers ORDER BY 1",
        &[],
    )
    .await;
    assert_eq!(left, ["waiter recent", "watcher recent"]);
}

contract!(
    purge_removes_only_long_expired_leases,
    purge_runs_periodically,
    purge_handles_many_rows,
);
