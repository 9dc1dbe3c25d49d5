//! PostgreSQL announces a lease change (`NOTIFY`) only while someone waits for or watches its
//! resource (migration V9): a notifying commit is serialised with every other notifying one,
//! so announcing every change cost most of the database's throughput under concurrency.

use std::time::{Duration, Instant};

use fencelock_testkit::{lock_waiters, pg_connect};
use futures_util::StreamExt as _;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;

use crate::helpers::{StoreKind, TTL, TestApp, fence};

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

/// Starts a watch of `resource`'s lease `lock` for up to `timeout_ms`; its answer arrives on
/// the returned task.
fn watch_in_background(
    app: &TestApp,
    resource: &str,
    lock: &Value,
    timeout_ms: u64,
) -> tokio::task::JoinHandle<Value> {
    let (client, url) = (
        app.client.clone(),
        app.url(&format!(
            "/locks/{resource}/watch?fence={}&timeout_ms={timeout_ms}",
            fence(lock)
        )),
    );
    tokio::spawn(async move { client.get(url).send().await.unwrap().json().await.unwrap() })
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
        assert_eq!(
            app.release(&resource, json!({ "owner": "a" }))
                .await
                .status(),
            204
        );
    }

    let lock = app.acquire_ok("watched", "a", TTL).await;
    let watching = watch_in_background(&app, "watched", &lock, 60_000);
    let session = pg_connect(&app.db.url()).await;
    let registered = Instant::now();
    while session
        .query_one("SELECT count(*) FROM lease_watchers", &[])
        .await
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        assert!(
            registered.elapsed() < Duration::from_secs(10),
            "the watch never registered"
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(
        app.release("watched", json!({ "owner": "a" }))
            .await
            .status(),
        204
    );
    let first = tokio::time::timeout(Duration::from_secs(10), announced.recv())
        .await
        .expect("the watched release is announced")
        .unwrap();
    assert_eq!(first, "watched", "an unwatched change was announced");
    let answer = tokio::time::timeout(Duration::from_secs(10), watching)
        .await
        .expect("the watch ends")
        .unwrap();
    assert_eq!(answer["changed"], true);

    // The watch has ended: its registration goes, and so do the announcements.
    let gone = Instant::now();
    while session
        .query_one("SELECT count(*) FROM lease_watchers", &[])
        .await
        .unwrap()
        .get::<_, i64>(0)
        > 0
    {
        assert!(
            gone.elapsed() < Duration::from_secs(10),
            "the watch's registration stayed"
        );
        tokio::task::yield_now().await;
    }
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

    let watching = watch_in_background(&app, "job", &lock, 30_000);
    let observer = pg_connect(&app.db.url()).await;
    let started = Instant::now();
    while lock_waiters(&observer).await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the watch never waited for the row"
        );
        tokio::task::yield_now().await;
    }
    let committed = Instant::now();
    change.batch_execute("COMMIT").await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), watching)
        .await
        .expect("the watch ends with the change, long before its timeout")
        .unwrap();
    assert_eq!(answer, json!({ "changed": true, "lock": null }));
    assert!(committed.elapsed() < Duration::from_secs(5));
}
