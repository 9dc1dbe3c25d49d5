//! A request answered `503` never takes effect later, and a refused acquisition costs no fence.
//!
//! `503` tells the client "unknown; retry". Work that landed after that answer would hold the
//! resource for a whole TTL with nobody working, so the store refuses work whose request's
//! deadline has passed: PostgreSQL inside the statement, SQLite in its job queue.

use std::time::Duration;

use fencelock_server::Settings;
use fencelock_server::StoreConfig;
use fencelock_testkit::Proxy;
use futures_util::StreamExt as _;
use serde_json::{Value, json};

use crate::helpers::{StoreKind, TTL, TestApp, TestDb, assert_problem, fence, postgres_addr};

const STORE_TIMEOUT: Duration = Duration::from_secs(1);

/// A statement held up in a network partition reaches PostgreSQL after its request was
/// answered `503`: the database refuses it, and the acquisition never appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_a_write_that_arrives_after_its_503() {
    let db = TestDb::new(StoreKind::Postgres).await;
    let proxy = Proxy::start(postgres_addr());
    let url = db.url_via(proxy.addr());
    let mut settings = Settings::for_store(StoreConfig::from_url(Some(&url)).unwrap());
    settings.bind = "127.0.0.1:0".parse().unwrap();
    settings.store_timeout = STORE_TIMEOUT;
    // One connection: the late statement and the next request share it, so once the next
    // request is answered, the database has dealt with the late one.
    settings.pool_size = 1;
    let app = TestApp::spawn_with(db.clone(), settings).await;
    app.acquire_ok("warm-up", "w", TTL).await;

    proxy.freeze();
    let response = app.acquire("job:1", "a", TTL).await;
    assert_problem(response, 503, "store-unavailable").await;
    proxy.thaw();

    app.acquire_ok("after", "b", TTL).await;
    assert_eq!(
        db.rows("job:1").await,
        0,
        "the late acquisition was committed"
    );
    assert_problem(app.inspect("job:1").await, 404, "not-found").await;
}

/// A SQLite job that waited behind another process's write lock until its request had been
/// answered `503` is skipped when its turn comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_skips_a_job_whose_request_was_answered_503() {
    let db = TestDb::new(StoreKind::Sqlite).await;
    let app = TestApp::spawn_on(db.clone(), |s| s.store_timeout = STORE_TIMEOUT).await;
    app.acquire_ok("warm-up", "w", TTL).await;
    let TestDb::Sqlite { path, .. } = db.as_ref() else {
        unreachable!()
    };

    let other_process = rusqlite::Connection::open(path).unwrap();
    other_process.execute_batch("BEGIN IMMEDIATE").unwrap();
    let response = app.acquire("job:1", "a", TTL).await;
    assert_problem(response, 503, "store-unavailable").await;
    other_process.execute_batch("ROLLBACK").unwrap();

    // Requests are served in queue order: once this one is answered, the job before it has
    // had its turn.
    app.acquire_ok("after", "b", TTL).await;
    assert_eq!(
        db.rows("job:1").await,
        0,
        "the late acquisition was committed"
    );
}

/// Refusals issue no fence: after 1,000 refused acquisitions of a held resource, the next
/// grant's fence follows the last one issued closely.
async fn refused_acquisitions_issue_no_fence(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let held = fence(&app.acquire_ok("job:1", "holder", TTL).await);

    let refused = futures_util::stream::iter(0..1_000)
        .map(|i| {
            let app = &app;
            async move {
                let response = app.acquire("job:1", &format!("contender-{i}"), TTL).await;
                assert_eq!(response.status(), 200);
                response.json::<Value>().await.unwrap()["acquired"] == json!(false)
            }
        })
        .buffer_unordered(16)
        .filter(|refused| std::future::ready(*refused))
        .count()
        .await;
    assert_eq!(refused, 1_000);

    let next = fence(&app.acquire_ok("job:2", "other", TTL).await);
    assert!(
        next > held && next - held <= 3,
        "fence {next} after {held}: refusals consumed fences"
    );
}

contract!(refused_acquisitions_issue_no_fence);
