//! PostgreSQL outages: a bounded `503`, never `acquired: false`, and recovery without restart.

use std::time::{Duration, Instant};

use fencelock_server::Settings;
use fencelock_server::StoreConfig;
use fencelock_testkit::closed_port;
use serde_json::{Value, json};

use crate::helpers::{RowLock, StoreKind, TTL, TestApp, TestDb, admin, assert_problem, fence};

async fn assert_unavailable(response: reqwest::Response) {
    assert!(
        response.headers().contains_key("retry-after"),
        "503 without Retry-After"
    );
    assert_problem(response, 503, "store-unavailable").await;
}

/// Pointed at a closed port, the server still starts; it answers `503` quickly everywhere
/// the store is needed, and `/healthz` stays `200`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_database_answers_503_quickly() {
    let url = format!("postgres://postgres@127.0.0.1:{}/fencelock", closed_port());
    let mut settings = Settings::for_store(StoreConfig::from_url(Some(&url)).unwrap());
    settings.bind = "127.0.0.1:0".parse().unwrap();
    // The app needs some TestDb to own; this one is never used.
    let app = TestApp::spawn_with(TestDb::new(StoreKind::Sqlite).await, settings).await;

    let started = Instant::now();
    assert_unavailable(app.get("/readyz").await).await;
    assert_unavailable(app.acquire("job:1", "a", TTL).await).await;
    assert_unavailable(app.inspect("job:1").await).await;
    assert_unavailable(
        app.renew("job:1", json!({ "owner": "a", "ttl_seconds": TTL }))
            .await,
    )
    .await;
    assert_unavailable(app.release("job:1", json!({ "owner": "a" })).await).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(app.get("/healthz").await.status(), 200);
    // Validation still comes first.
    assert_problem(app.acquire("job:1", "a", 0).await, 422, "validation-failed").await;
}

/// The database goes away (connections cut, new ones refused) and comes back: meanwhile
/// every answer is `503`, afterwards the same server serves again with its leases intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_recovers_when_the_database_returns() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    let TestDb::Postgres { name, .. } = app.db.as_ref() else {
        unreachable!()
    };
    let before = app.acquire_ok("held", "a", 3600).await;

    let admin = admin().await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} ALLOW_CONNECTIONS false;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}';"
        ))
        .await
        .unwrap();

    for i in 0..5 {
        let response = app.acquire(&format!("down-{i}"), "b", TTL).await;
        assert_unavailable(response).await;
    }
    assert_unavailable(app.get("/readyz").await).await;

    admin
        .batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let response = app.acquire("after", "b", TTL).await;
        match response.status().as_u16() {
            200 => {
                let body: Value = response.json().await.unwrap();
                assert!(fence(&body["lock"]) > fence(&before));
                break;
            }
            503 => assert!(Instant::now() < deadline, "no recovery within 20 s"),
            other => panic!("unexpected status {other} while recovering"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(app.get("/readyz").await.status(), 200);
    // The lease taken before the outage is intact.
    assert_eq!(app.fence_of("held").await, fence(&before));
    let refused: Value = app.acquire("held", "b", TTL).await.json().await.unwrap();
    assert_eq!(refused["acquired"], json!(false));
}

/// A store that does not answer in time gives a `503` after the store timeout, not a hang:
/// here a row lock held by another session blocks the acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_store_answers_503_within_the_timeout() {
    let db = TestDb::new(StoreKind::Postgres).await;
    let app = TestApp::spawn_on(db, |s| s.store_timeout = Duration::from_millis(500)).await;
    app.acquire_ok("job:1", "a", 1).await;

    let lock = RowLock::take(&app.db, "job:1").await;

    let started = Instant::now();
    let response = app.acquire("job:1", "a", TTL).await;
    assert_unavailable(response).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    lock.release().await;
}

/// Several instances starting at once on an empty database all come up and agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_starting_together_all_come_up() {
    let db = TestDb::new(StoreKind::Postgres).await;
    let (a, b, c, d) = tokio::join!(
        TestApp::spawn_on(db.clone(), |_| {}),
        TestApp::spawn_on(db.clone(), |_| {}),
        TestApp::spawn_on(db.clone(), |_| {}),
        TestApp::spawn_on(db.clone(), |_| {}),
    );
    let mut last = 0;
    for app in [&a, &b, &c, &d] {
        assert_eq!(app.get("/readyz").await.status(), 200);
        let f = fence(&app.acquire_ok("job:1", "same-owner", TTL).await);
        assert!(f > last);
        last = f;
    }
    let recorded: i64 = admin_of(&db)
        .await
        .query_one("SELECT count(*) FROM refinery_schema_history", &[])
        .await
        .unwrap()
        .get(0);
    let migrations = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres"))
        .unwrap()
        .count();
    assert_eq!(recorded, migrations as i64, "each migration recorded once");
}

async fn admin_of(db: &TestDb) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}
