//! PostgreSQL announces a lease change (`NOTIFY`) only while someone waits for or watches its
//! resource (docs/design/0004-announcements.md): a notifying commit is serialised with every other
//! notifying one, so announcing every change cost most of the database's throughput under
//! concurrency.

use std::time::{Duration, Instant};

use fencelock_testkit::{eventually, lock_waiters, pg_connect};
use futures_util::StreamExt as _;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;

use crate::helpers::{StoreKind, TTL, TestApp};

/// The longest a test waits for the server to reach a point.
const WITHIN: Duration = Duration::from_secs(10);

/// A session listening on the store's channel; yields the resources announced, in order.
async fn listen(url: &str) -> (tokio_postgres::Client, mpsc::UnboundedReceiver<String>) {
    let (client, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connecting the listener");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(n) = message {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    client
        .batch_execute("LISTEN fencelock_changes")
        .await
        .expect("LISTEN");
    (client, rx)
}

/// The watches registered on the store right now, as `session` reads them.
async fn watchers(session: &tokio_postgres::Client) -> i64 {
    session
        .query_one("SELECT count(*) FROM lease_watchers", &[])
        .await
        .expect("counting the watchers")
        .get(0)
}

/// Changes of a resource nobody awaits are not announced; those of a watched one are.
/// Announcements arrive in commit order, so the first one received being the watched
/// resource's shows that the earlier, unwatched changes sent none.
#[tokio::test]
async fn only_changes_someone_awaits_are_announced() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    let (_listener, mut announced) = listen(&app.db.url()).await;

    for round in 0..3 {
        let resource = format!("quiet:{round}");
        app.acquire_ok(&resource, "a", TTL).await;
        app.release_ok(&resource, json!({ "owner": "a" })).await;
    }

    let lock = app.acquire_ok("watched", "a", TTL).await;
    let watching = app.watch_in_background("watched", &lock, 60_000);
    let session = pg_connect(&app.db.url()).await;
    eventually("the watch never registered", WITHIN, async || {
        watchers(&session).await > 0
    })
    .await;
    app.release_ok("watched", json!({ "owner": "a" })).await;
    let first = tokio::time::timeout(Duration::from_secs(10), announced.recv())
        .await
        .expect("the watched release is announced")
        .unwrap();
    assert_eq!(first, "watched", "an unwatched change was announced");
    let (answer, _) = tokio::time::timeout(Duration::from_secs(10), watching)
        .await
        .expect("the watch ends")
        .unwrap();
    assert_eq!(answer["changed"], true);

    // The watch has ended: its registration goes, and so do the announcements.
    eventually("the watch's registration stayed", WITHIN, async || {
        watchers(&session).await == 0
    })
    .await;
}

/// A watch that starts while a change of its lease is under way (its trigger has already
/// looked for watchers and found none) still sees that change: the watch reads the lease
/// with a row lock after registering, so it waits for the change and answers at its commit,
/// not at the lease's expiry or the watch's timeout.
#[tokio::test]
async fn a_watch_registered_during_a_change_sees_it() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    let lock = app.acquire_ok("job", "a", TTL).await;
    let change = pg_connect(&app.db.url()).await;
    change
        .batch_execute("BEGIN; DELETE FROM leases WHERE resource = 'job'")
        .await
        .unwrap();

    let watching = app.watch_in_background("job", &lock, 30_000);
    let observer = pg_connect(&app.db.url()).await;
    eventually("the watch never waited for the row", WITHIN, async || {
        lock_waiters(&observer).await > 0
    })
    .await;
    let committed = Instant::now();
    change.batch_execute("COMMIT").await.unwrap();
    let (answer, _) = tokio::time::timeout(Duration::from_secs(10), watching)
        .await
        .expect("the watch ends with the change, long before its timeout")
        .unwrap();
    assert_eq!(answer, json!({ "changed": true, "lock": null }));
    assert!(committed.elapsed() < Duration::from_secs(5));
}
