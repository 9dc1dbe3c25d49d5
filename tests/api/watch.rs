//! `GET /locks/{resource}/watch`: answers at once unless the lease with the given fence is
//! live, then when it ends (release, expiry, takeover) or the timeout passes; on every
//! instance, within the bound of the change. Timing margins as in `waiting`.

use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::{Value, json};

use crate::helpers::{StoreKind, TTL, TestApp, assert_invalid, assert_public_lock, fence};
use crate::waiting::{assert_handovers, at};

async fn watch(app: &TestApp, query: &str) -> Value {
    let response = app.get(&format!("/locks/job/watch{query}")).await;
    assert_eq!(response.status(), 200);
    response.json().await.expect("a JSON answer")
}

/// Without a fence, or with one that is not the live lease's, the answer comes at once.
async fn a_watch_answers_at_once_unless_its_lease_is_live(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    assert_eq!(
        watch(&app, "").await,
        json!({ "changed": false, "lock": null })
    );
    assert_eq!(
        watch(&app, "?fence=1&timeout_ms=60000").await,
        json!({ "changed": true, "lock": null })
    );
    let lock = app.acquire_ok("job", "a", TTL).await;
    let shown = watch(&app, "").await;
    assert_eq!(shown["changed"], false);
    assert_public_lock(&shown["lock"], &lock);
    let start = Instant::now();
    let other = watch(
        &app,
        &format!("?fence={}&timeout_ms=60000", fence(&lock) + 1),
    )
    .await;
    assert_eq!(other["changed"], true);
    assert_public_lock(&other["lock"], &lock);
    assert!(start.elapsed() < Duration::from_secs(5));
}

/// A watch on the live lease times out with `changed: false` and the lease.
async fn a_watch_times_out_unchanged(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let lock = app.acquire_ok("job", "a", TTL).await;
    let start = Instant::now();
    let answer = watch(&app, &format!("?fence={}&timeout_ms=300", fence(&lock))).await;
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert_eq!(answer["changed"], false);
    assert_public_lock(&answer["lock"], &lock);
}

/// A release on another instance ends the watch, soon after it.
async fn a_watch_ends_with_a_release_elsewhere(kind: StoreKind) {
    let a = TestApp::spawn(kind).await;
    let b = TestApp::spawn_on(a.db.clone(), |_| {}).await;
    let mut delays = Vec::new();
    for _ in 0..3 {
        let lock = a.acquire_ok("job", "a", TTL).await;
        let watching = b.watch_in_background("job", &lock, 60_000);
        // The watch has looked at the lease once it is registered; give it that moment.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !watching.is_finished(),
            "the watch ended before the release"
        );
        let released_before = Utc::now();
        a.release_ok("job", json!({ "owner": "a" })).await;
        let (answer, ended) = tokio::time::timeout(Duration::from_secs(10), watching)
            .await
            .expect("the watch ends")
            .unwrap();
        assert_eq!(answer, json!({ "changed": true, "lock": null }));
        delays.push((ended - released_before).num_milliseconds());
    }
    assert_handovers(&delays);
}

/// An expiry ends the watch (nobody announces it: the watch's own timer on `expires_at`), and
/// so does a takeover.
async fn a_watch_ends_with_an_expiry_and_a_takeover(kind: StoreKind) {
    let a = TestApp::spawn(kind).await;
    let b = TestApp::spawn_on(a.db.clone(), |_| {}).await;
    let lock = a.acquire_ok("job", "a", 1).await;
    let answer = watch(&b, &format!("?fence={}&timeout_ms=10000", fence(&lock))).await;
    let late = (Utc::now() - at(&lock["expires_at"])).num_milliseconds();
    assert_eq!(answer, json!({ "changed": true, "lock": null }));
    assert!(
        (0..crate::waiting::LOADED_BOUND_MS).contains(&late),
        "{late} ms"
    );

    let lock = a.acquire_ok("job", "a", TTL).await;
    let watching = b.watch_in_background("job", &lock, 60_000);
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.db.age("job", 1).await;
    let taken = a.acquire_ok("job", "b", TTL).await;
    let (answer, _) = tokio::time::timeout(Duration::from_secs(10), watching)
        .await
        .expect("the watch ends")
        .unwrap();
    assert_eq!(answer["changed"], true);
    // The ageing is an expiry of its own, which a store that sees writes made from outside
    // it (SQLite's poll of the file compares each watched lease's expiry) may announce
    // before the takeover: the watch then ends with no live lease, as it should. Otherwise
    // the takeover ends it, with the new lease.
    if !answer["lock"].is_null() {
        assert_public_lock(&answer["lock"], &taken);
    }
}

async fn watch_parameters_follow_the_input_rules(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    for (query, fields) in [
        ("?fence=0", &["fence"][..]),
        ("?fence=-1", &["fence"]),
        ("?fence=x", &["fence"]),
        ("?fence=9007199254740992", &["fence"]),
        ("?timeout_ms=0", &["timeout_ms"]),
        ("?timeout_ms=300001", &["timeout_ms"]),
        ("?timeout_ms=1.5", &["timeout_ms"]),
        ("?fence=1&fence=2", &["fence"]),
        ("?timeout=5", &["timeout"]),
        ("?fence=0&timeout_ms=0", &["fence", "timeout_ms"]),
    ] {
        let response = app.get(&format!("/locks/job/watch{query}")).await;
        assert_invalid(response, fields, query).await;
    }
    let response = app.get("/locks/a%2Fb/watch?fence=0").await;
    assert_invalid(response, &["resource", "fence"], "bad resource").await;
}

/// The watches of a resource that a release wakes share their look at the store: 200 of them
/// all answer `changed: true`, and beyond each watch's own first look (which registers it)
/// the store is read a few times for all of them, not 200. A second announcement of the same
/// release (from the database, or SQLite's poll of the file) may cost another shared look,
/// and so may the poll's first sight of the resource while the watches arrive.
async fn watches_woken_together_share_one_look(kind: StoreKind) {
    const WATCHES: f64 = 200.0;
    let app = TestApp::spawn(kind).await;
    let lock = app.acquire_ok("job", "a", TTL).await;
    let query = format!("?fence={}&timeout_ms=60000", fence(&lock));
    let client = reqwest::Client::new();
    let url = app.url(&format!("/locks/job/watch{query}"));
    let before = inspections(&app).await;
    let watches: Vec<_> = (0..200)
        .map(|_| tokio::spawn(client.get(url.clone()).send()))
        .collect();
    // A watch's first look counts as an inspection.
    crate::helpers::eventually(
        "the watches never all looked",
        Duration::from_secs(30),
        async || inspections(&app).await - before >= WATCHES,
    )
    .await;
    app.release_ok("job", json!({ "owner": "a", "fence": fence(&lock) }))
        .await;
    for watch in watches {
        let answer: Value = watch.await.unwrap().unwrap().json().await.unwrap();
        assert_eq!(answer, json!({ "changed": true, "lock": null }));
    }
    let shared = inspections(&app).await - before - WATCHES;
    assert!(
        shared <= 5.0,
        "200 watches, woken by one release, read the store {shared} times beyond their first looks"
    );
}

/// The store's inspections so far (none before the first).
async fn inspections(app: &TestApp) -> f64 {
    let metrics = app.metrics().await;
    metrics
        .get("fencelock_store_seconds_count", &[("op", "inspect")])
        .unwrap_or(0.0)
}

contract!(
    watches_woken_together_share_one_look,
    a_watch_answers_at_once_unless_its_lease_is_live,
    a_watch_times_out_unchanged,
    a_watch_ends_with_a_release_elsewhere,
    a_watch_ends_with_an_expiry_and_a_takeover,
    watch_parameters_follow_the_input_rules,
);

// A watch ended from another instance through PgBouncer (see `waiting.rs`).
through_pgbouncer!(a_watch_ends_with_a_release_elsewhere);
