//! Start-up while another session holds the migration lock (an instance stuck mid-migration,
//! or a lock left on a pooled connection): the wait is logged with the holder, the server
//! answers `/healthz` and `503` meanwhile, becomes ready once the lock is free, and gives up
//! with one line once the wait passes `--migration-lock-timeout-seconds`.

use std::time::Duration;

use serde_json::Value;

use crate::helpers::{StoreKind, TestDb, client, eventually, pg_connect};
use crate::process::{ServerProcess, command};

/// The key of the migration lock (`store::postgres::migrate`): part of how instances of
/// different versions agree, so it is spelled out here rather than imported.
const MIGRATION_LOCK_KEY: i64 = 0x6665_6e63_656c_6f63;

/// Far above what a wait takes to be logged or to end on this machine.
const WITHIN: Duration = Duration::from_secs(30);

/// A session of `application_name` `name` holding the migration lock; returns it and its pid.
async fn hold_the_migration_lock(db: &TestDb, name: &str) -> (tokio_postgres::Client, i32) {
    let session = pg_connect(&db.url()).await;
    session
        .batch_execute(&format!("SET application_name = '{name}'"))
        .await
        .unwrap();
    session
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await
        .unwrap();
    let pid: i32 = session
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    (session, pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_migration_lock_is_waited_for_in_the_open() {
    let db = TestDb::new(StoreKind::Postgres).await;
    let (holder, pid) = hold_the_migration_lock(&db, "stuck-migrator").await;
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_listening(Some(&db.url()), dir.path(), &[]);
    let waiting = format!("waiting for the migration lock held by pid {pid}");
    eventually("the wait is logged with its holder", WITHIN, async || {
        server.log_text().contains(&waiting)
    })
    .await;
    let log = server.log_text();
    let line = log.lines().find(|l| l.contains(&waiting)).unwrap();
    assert!(line.contains("stuck-migrator"), "{line}");
    assert!(line.contains(r#""level":"WARN""#), "{line}");

    let client = client();
    let health = client.get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let response = server.acquire(&client, "job:1", "a").await;
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "store-unavailable", "{problem}");
    let ready = client.get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let problem: Value = ready.json().await.unwrap();
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(&waiting), "{detail}");

    drop(holder);
    eventually("ready once the lock is free", WITHIN, async || {
        let ready = client.get(server.url("/readyz")).send().await.unwrap();
        ready.status() == 200
    })
    .await;
    assert_eq!(server.acquire(&client, "job:1", "a").await.status(), 200);
    server.assert_logged("fencelock serving").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_lock_held_past_the_timeout_stops_start_up_with_one_line() {
    let db = TestDb::new(StoreKind::Postgres).await;
    let (_holder, pid) = hold_the_migration_lock(&db, "stuck-migrator").await;
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["--bind", "127.0.0.1:0"][..],
        // `fencelock migrate` waits within the same bound.
        &["migrate"][..],
    ] {
        let mut fencelock = command(Some(&db.url()), dir.path());
        fencelock
            .args(args)
            .args(["--migration-lock-timeout-seconds", "1"]);
        let output =
            tokio::time::timeout(WITHIN, tokio::process::Command::from(fencelock).output())
                .await
                .unwrap_or_else(|_| panic!("{args:?}: still waiting after {WITHIN:?}"))
                .unwrap();
        assert!(!output.status.success(), "{args:?}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().last().unwrap_or_default();
        assert!(
            last.starts_with(&format!(
                "fencelock: the migration lock is still held by pid {pid}"
            )) && last.contains("--migration-lock-timeout-seconds"),
            "{args:?}: {stderr}"
        );
    }
}
