//! The fence sequence (the SQLite store's counter) is checked before anything is served: a
//! sequence altered to a cache, made unlogged, or put behind the fences already issued
//! makes `fencelock check` and start-up refuse with one line naming the cause and the
//! statement that fixes it; running that statement lets both through again.

use std::process::Output;
use std::time::Duration;

use crate::helpers::{StoreKind, TestApp, TestDb, assert_failed_in_one_line, assert_succeeded};
use crate::process::command;

/// Far above what a refused start takes on this machine.
const WITHIN: Duration = Duration::from_secs(30);

/// `fencelock ARGS` on `db`, run to its end.
async fn fencelock(db: &TestDb, args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut fencelock = command(Some(&db.url()), dir.path());
    fencelock.args(args);
    tokio::time::timeout(WITHIN, tokio::process::Command::from(fencelock).output())
        .await
        .unwrap_or_else(|_| panic!("fencelock {args:?}: still running after {WITHIN:?}"))
        .unwrap()
}

/// `fencelock check` and a server start on `db` both refuse with one line that contains
/// every part of `cause`; returns the statement the line gives as the fix (its last
/// `` `...` ``).
async fn both_refuse(db: &TestDb, cause: &[&str]) -> String {
    let line = assert_failed_in_one_line(&fencelock(db, &["check"]).await, "check");
    for part in cause {
        assert!(line.contains(part), "check names no {part:?}: {line}");
    }
    let started = fencelock(db, &["--bind", "127.0.0.1:0"]).await;
    assert!(!started.status.success(), "the server started: {started:?}");
    let stderr = String::from_utf8_lossy(&started.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("fencelock: "), "{stderr}");
    for part in cause {
        assert!(last.contains(part), "start-up names no {part:?}: {stderr}");
    }
    let fix = line
        .rsplit('`')
        .nth(1)
        .unwrap_or_else(|| panic!("no statement to run in {line}"));
    fix.to_owned()
}

/// A store with leases taken through the server, and the highest fence issued.
async fn with_leases(kind: StoreKind) -> (std::sync::Arc<TestDb>, i64) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn_on(db.clone(), |_| {}).await;
    let mut highest = 0;
    for i in 0..5 {
        let lease = app.acquire_ok(&format!("job:{i}"), "a", 60).await;
        highest = fencelock_testkit::fence(&lease);
    }
    drop(app);
    (db, highest)
}

/// `fencelock check` on `db` passes (`when`: before the store was broken, or after the fix).
async fn check_passes(db: &TestDb, when: &str) {
    let stdout = assert_succeeded(&fencelock(db, &["check"]).await, when);
    assert!(stdout.starts_with("fencelock check: ok:"), "{stdout}");
}

/// `fencelock check` and a server start on `db` both refuse with one line that contains
/// every part of `cause` and gives `fix` as the statement to run; once it has run,
/// `fencelock check` passes again.
async fn refused_until_fixed(db: &TestDb, cause: &[&str], fix: &str) {
    assert_eq!(both_refuse(db, cause).await, fix);
    db.execute(fix).await;
    check_passes(db, "check after the fix").await;
}

/// A sequence altered to a cache, made unlogged, or allowed past 2^53 - 1 is refused until it
/// is altered back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_altered_fence_sequence_is_refused() {
    let (db, _) = with_leases(StoreKind::Postgres).await;
    for (alter, cause, fix) in [
        (
            "ALTER SEQUENCE lease_fence CACHE 20",
            "lease_fence has CACHE 20",
            "ALTER SEQUENCE lease_fence CACHE 1",
        ),
        (
            "ALTER SEQUENCE lease_fence SET UNLOGGED",
            "lease_fence is unlogged",
            "ALTER SEQUENCE lease_fence SET LOGGED",
        ),
        (
            "ALTER SEQUENCE lease_fence MAXVALUE 9223372036854775807",
            "lease_fence has MAXVALUE 9223372036854775807",
            "ALTER SEQUENCE lease_fence MAXVALUE 9007199254740991",
        ),
    ] {
        check_passes(&db, &format!("check before {alter}")).await;
        db.execute(alter).await;
        refused_until_fixed(&db, &[cause], fix).await;
    }
}

/// As a restore of the sequence from before the last leases would leave it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_sequence_behind_the_leases_is_refused() {
    let (db, highest) = with_leases(StoreKind::Postgres).await;
    // The sequence's next value is the highest fence itself: one fence would be issued twice.
    db.execute(&format!("SELECT setval('lease_fence', {})", highest - 1))
        .await;
    refused_until_fixed(
        &db,
        &[
            "lease_fence is behind the leases",
            &format!("its next value is {highest}, but fence {highest} was issued already"),
        ],
        &format!("SELECT setval('lease_fence', {highest})"),
    )
    .await;
    let app = TestApp::spawn_on(db.clone(), |_| {}).await;
    let next = fencelock_testkit::fence(&app.acquire_ok("job:next", "a", 60).await);
    assert_eq!(next, highest + 1);
}

/// The SQLite store's counter row, put back below the fences in the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_fence_counter_behind_the_leases_is_refused() {
    let (db, highest) = with_leases(StoreKind::Sqlite).await;
    check_passes(&db, "check before the counter was put back").await;
    db.execute(&format!(
        "UPDATE fence_counter SET last_fence = {} WHERE id = 1",
        highest - 2
    ))
    .await;
    refused_until_fixed(
        &db,
        &[
            "the fence counter is behind the leases",
            &format!("it is at {}, but fence {highest} was issued", highest - 2),
        ],
        &format!("UPDATE fence_counter SET last_fence = {highest} WHERE id = 1"),
    )
    .await;
}
