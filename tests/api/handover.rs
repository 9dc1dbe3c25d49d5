//! On PostgreSQL a release hands the lease to the first waiter in the release's own
//! transaction (docs/design/0003-handover-on-release.md): the hand-over costs no second commit.

use fencelock_testkit::pg_connect;
use serde_json::json;

use crate::helpers::{StoreKind, TTL, TestApp, fence};
use crate::waiting::{until_queued, wait_in_background};

/// A ticket left by a waiter (here written directly, as if its instance were slow to look
/// again) is granted by the release itself: the lease is the waiter's the moment the release
/// has answered, starting when the released one ended, and nobody else can take it.
#[tokio::test]
async fn a_release_grants_the_lease_to_the_first_ticket() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    let released = app.acquire_ok("job", "a", TTL).await;
    let db = pg_connect(&app.db.url()).await;
    db.batch_execute(
        "INSERT INTO lease_waiters (resource, expires_at, owner, ttl_seconds, lock_delay_ms)
         VALUES ('job', now() + interval '1 minute', 'first', 7, 0),
                ('job', now() + interval '1 minute', 'second', 7, 0)",
    )
    .await
    .unwrap();

    assert_eq!(
        app.release("job", json!({ "owner": "a" })).await.status(),
        204
    );

    let lease = db
        .query_one(
            "SELECT owner, fence, acquired_at, expires_at - acquired_at = interval '7 seconds'
             FROM leases WHERE resource = 'job' AND ended_at IS NULL",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(lease.get::<_, &str>(0), "first");
    let granted: i64 = lease.get(1);
    assert!(granted > fence(&released));
    assert!(lease.get::<_, bool>(3), "the waiter's own TTL");
    let ended: chrono::DateTime<chrono::Utc> = db
        .query_one(
            "SELECT ended_at FROM leases WHERE resource = 'job' AND fence = $1",
            &[&fence(&released)],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(lease.get::<_, chrono::DateTime<chrono::Utc>>(2), ended);
    let tickets: Vec<(String, Option<i64>)> = db
        .query(
            "SELECT owner, granted_fence FROM lease_waiters ORDER BY ticket",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(
        tickets,
        [
            ("first".to_owned(), Some(granted)),
            ("second".to_owned(), None)
        ]
    );

    // The history shows the grant; a newcomer does not barge in.
    let history = app.get("/locks/job/history").await;
    let history: serde_json::Value = history.json().await.unwrap();
    assert_eq!(history["leases"][0]["fence"], granted);
    assert_eq!(history["leases"][0]["end"], "live");
    let newcomer = app.acquire("job", "newcomer", TTL).await;
    assert_eq!(newcomer.status(), 200);
    let newcomer: serde_json::Value = newcomer.json().await.unwrap();
    assert_eq!(newcomer["acquired"], false, "{newcomer}");
}

/// A ticket whose wait has ended, and a ticket without an acquisition (a waiter with a token
/// quota, which takes the lease itself), are not granted anything by a release.
#[tokio::test]
async fn a_release_serves_only_a_live_ticket_with_its_acquisition() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    let db = pg_connect(&app.db.url()).await;
    for (resource, ticket) in [
        ("ended", "now() - interval '1 second', 'w', 7"),
        ("quota", "now() + interval '1 minute', NULL, NULL"),
    ] {
        app.acquire_ok(resource, "a", TTL).await;
        db.batch_execute(&format!(
            "INSERT INTO lease_waiters (resource, expires_at, owner, ttl_seconds)
             VALUES ('{resource}', {ticket})"
        ))
        .await
        .unwrap();
        assert_eq!(
            app.release(resource, json!({ "owner": "a" }))
                .await
                .status(),
            204
        );
        let rows: i64 = db
            .query_one(
                "SELECT count(*) FROM leases WHERE resource = $1 AND ended_at IS NULL",
                &[&resource],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(rows, 0, "{resource}: the release granted the lease");
    }
}

fn store_acquisitions(metrics: &fencelock_testkit::Exposition) -> f64 {
    metrics.value("fencelock_store_seconds_count", &[("op", "acquire")])
}

/// A waiter that gets the lease tells the next one in its instance's line what it saw: the
/// next need not look at the store (it would find the lease held) until the lease changes
/// again. Each hand-over then costs the store one attempt, the new holder's taking of its
/// grant.
#[tokio::test]
async fn the_next_in_line_does_not_look_while_the_one_before_holds() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    // A first hand-over proves the instance receives the announcements.
    let warm = app.acquire_ok("warm", "a", TTL).await;
    let warming = wait_in_background(&app, "warm", "b");
    until_queued(&app, "warm", 1).await;
    app.release("warm", json!({ "owner": "a", "fence": fence(&warm) }))
        .await;
    assert_eq!(warming.await.unwrap()["acquired"], true);

    let holder = app.acquire_ok("job", "holder", TTL).await;
    let first = wait_in_background(&app, "job", "w0");
    until_queued(&app, "job", 1).await;
    let second = wait_in_background(&app, "job", "w1");
    until_queued(&app, "job", 2).await;
    let before = store_acquisitions(&app.metrics().await);

    let released = app
        .release("job", json!({ "owner": "holder", "fence": fence(&holder) }))
        .await;
    assert_eq!(released.status(), 204);
    let first = first.await.unwrap();
    assert_eq!(first["lock"]["owner"], "w0", "{first}");
    let released = app
        .release(
            "job",
            json!({ "owner": "w0", "fence": fence(&first["lock"]) }),
        )
        .await;
    assert_eq!(released.status(), 204);
    let second = second.await.unwrap();
    assert_eq!(second["lock"]["owner"], "w1", "{second}");

    let after = store_acquisitions(&app.metrics().await);
    assert_eq!(after - before, 2.0, "one store attempt per hand-over");
}
