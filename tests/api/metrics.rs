//! `GET /metrics`: each answer counted once under its outcome, the lease events, the live
//! lease gauge, and nothing of a request's content in any label.
//!
//! Every test has a server of its own, with a registry of its own, so exact counts hold
//! however many tests run at once in this process.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::helpers::{
    Exposition, StoreKind, TTL, TestApp, TestDb, assert_unlabelled, fence, release_status,
    renew_status,
};

const ACQUIRE: &str = "fencelock_acquire_total";
const RENEW: &str = "fencelock_renew_total";
const RELEASE: &str = "fencelock_release_total";
const REQUESTS: &str = "fencelock_http_requests_total";

/// The route label of a `/locks...` route pattern as this test sends it: `/locks/...`, or
/// `/v1/locks/...` when `contract!` runs the rule under `/v1`.
fn route(app: &TestApp, pattern: &str) -> String {
    app.url(pattern)
        .strip_prefix(&app.address)
        .expect("a URL of this server")
        .to_owned()
}

fn outcome(metrics: &Exposition, family: &str, outcome: &str) -> f64 {
    metrics.value(family, &[("outcome", outcome)])
}

/// One acquire, one refused acquire, one renew, one release: each outcome counted once,
/// every other outcome shown at 0, the histograms observed, the build and store named.
async fn each_answer_is_counted_once_under_its_outcome(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let lock = app.acquire_ok("job", "a", TTL).await;
    let held = app.acquire("job", "b", TTL).await;
    assert_eq!(held.status(), 200);
    let renew = json!({ "owner": "a", "ttl_seconds": TTL, "fence": fence(&lock) });
    app.renew_ok("job", renew).await;
    let release = app.release("job", json!({ "owner": "a" })).await;
    assert_eq!(release.status(), 204);

    let metrics = app.metrics().await;
    for (family, counted, others) in [
        (
            ACQUIRE,
            &["acquired", "held"][..],
            &["reacquired", "taken_over", "error"][..],
        ),
        (
            RENEW,
            &["renewed"],
            &[
                "not_found",
                "expired",
                "owner_mismatch",
                "stale_fence",
                "error",
            ],
        ),
        (
            RELEASE,
            &["released"],
            &["not_found", "not_owner", "stale_fence", "error"],
        ),
    ] {
        for name in counted {
            assert_eq!(outcome(&metrics, family, name), 1.0, "{family} {name}");
        }
        for name in others {
            assert_eq!(outcome(&metrics, family, name), 0.0, "{family} {name}");
        }
        assert_eq!(metrics.family(family).len(), counted.len() + others.len());
    }

    let store = match kind {
        StoreKind::Postgres => "postgres",
        StoreKind::Sqlite => "sqlite",
    };
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        metrics.value(
            "fencelock_build_info",
            &[("version", version), ("store", store)]
        ),
        1.0
    );
    assert_eq!(metrics.family("fencelock_build_info").len(), 1);

    assert_unlabelled(
        &metrics,
        &[
            ("fencelock_lease_held_seconds_count", 1.0),
            ("fencelock_leases_expired_while_held_total", 0.0),
        ],
    );
    for op in ["acquire", "renew", "release"] {
        let count = metrics.value("fencelock_store_seconds_count", &[("op", op)]);
        assert!(count >= 1.0, "{op}: {count}");
    }
    assert_eq!(
        metrics.value("fencelock_store_seconds_count", &[("op", "acquire")]),
        2.0
    );
    // PostgreSQL decided the four requests, one after the other, as four batches of one;
    // SQLite has no such family.
    let batches = |part: &str| metrics.get(&format!("fencelock_store_batch_size_{part}"), &[]);
    match kind {
        StoreKind::Postgres => {
            assert_eq!(batches("count"), Some(4.0));
            assert_eq!(batches("sum"), Some(4.0));
            assert_eq!(
                metrics.get("fencelock_store_batches_refused_total", &[]),
                Some(0.0)
            );
        }
        StoreKind::Sqlite => {
            assert_eq!(batches("count"), None);
            assert_eq!(
                metrics.get("fencelock_store_batches_refused_total", &[]),
                None
            );
        }
    }

    let lock_route = route(&app, "/locks/{resource}");
    let renew_route = route(&app, "/locks/{resource}/renew");
    let answered = |route: &str, method: &str, status: &str| {
        metrics
            .get(
                REQUESTS,
                &[("route", route), ("method", method), ("status", status)],
            )
            .unwrap_or(0.0)
    };
    assert_eq!(answered(&lock_route, "POST", "200"), 2.0);
    assert_eq!(answered(&renew_route, "POST", "200"), 1.0);
    assert_eq!(answered(&lock_route, "DELETE", "204"), 1.0);
    // The other spelling of the route, unprefixed or under `/v1`, was never asked for.
    let other_route = match lock_route.strip_prefix("/v1") {
        Some(unprefixed) => unprefixed.to_owned(),
        None => format!("/v1{lock_route}"),
    };
    assert!(
        metrics
            .family(REQUESTS)
            .iter()
            .all(|s| s.labels["route"] != other_route),
        "{other_route} counted"
    );
    let requests = metrics.value(
        "fencelock_http_request_seconds_count",
        &[("route", &lock_route), ("method", "POST")],
    );
    assert_eq!(requests, 2.0);
    // The scrape itself is answered after the exposition is made: the next one shows it.
    let next = app.metrics().await;
    assert_eq!(
        next.value(
            REQUESTS,
            &[("route", "/metrics"), ("method", "GET"), ("status", "200")]
        ),
        1.0
    );
}

/// A lease taken over after it expired, never released: its holder lost it.
async fn a_takeover_after_expiry_counts_a_lease_expired_while_held(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.acquire_ok("job", "a", TTL).await;
    app.db.age("job", 1000).await;
    app.acquire_ok("job", "b", TTL).await;
    // Re-acquiring one's own live lease is not a loss.
    app.acquire_ok("job", "b", TTL).await;

    let metrics = app.metrics().await;
    assert_eq!(outcome(&metrics, ACQUIRE, "acquired"), 1.0);
    assert_eq!(outcome(&metrics, ACQUIRE, "taken_over"), 1.0);
    assert_eq!(outcome(&metrics, ACQUIRE, "reacquired"), 1.0);
    assert_unlabelled(
        &metrics,
        &[
            ("fencelock_leases_expired_while_held_total", 1.0),
            ("fencelock_lease_held_seconds_count", 0.0),
        ],
    );
}

/// Refusals of renew and release are counted under their own outcomes.
async fn refusals_are_counted_under_their_outcomes(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let lock = app.acquire_ok("job", "a", TTL).await;
    let renew = |owner: &'static str, fence: i64| {
        app.renew(
            "job",
            json!({ "owner": owner, "ttl_seconds": TTL, "fence": fence }),
        )
    };
    assert_eq!(renew("b", fence(&lock)).await.status(), 409);
    assert_eq!(renew("a", fence(&lock) + 1).await.status(), 409);
    assert_eq!(renew_status(&app, "none", "a").await, 404);
    assert_eq!(release_status(&app, "job", "b").await, 403);
    assert_eq!(
        app.release("none", json!({ "owner": "a" })).await.status(),
        404
    );
    app.db.age("job", 1000).await;
    assert_eq!(renew("a", fence(&lock)).await.status(), 409);

    let metrics = app.metrics().await;
    for (family, name) in [
        (RENEW, "owner_mismatch"),
        (RENEW, "stale_fence"),
        (RENEW, "not_found"),
        (RENEW, "expired"),
        (RELEASE, "not_owner"),
        (RELEASE, "not_found"),
    ] {
        assert_eq!(outcome(&metrics, family, name), 1.0, "{family} {name}");
    }
}

/// A store that cannot answer: the request's outcome is `error`, and the store error is
/// counted by kind.
async fn store_failures_are_counted_as_errors(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.acquire_ok("job", "a", TTL).await;
    // The live-lease count runs once at start, then not again for seconds, and the purge's
    // first round is a whole interval (a minute) away: once the count has run, every store
    // error below is this test's request's.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = app.metrics().await;
        let ran = |op| {
            let count = metrics.get("fencelock_store_seconds_count", &[("op", op)]);
            count.unwrap_or(0.0) >= 1.0
        };
        if ran("count") {
            break;
        }
        assert!(Instant::now() < deadline, "the chores never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.db.execute("DROP TABLE leases").await;
    assert_eq!(app.acquire("job", "a", TTL).await.status(), 500);

    let metrics = app.metrics().await;
    assert_eq!(outcome(&metrics, ACQUIRE, "error"), 1.0);
    assert_eq!(outcome(&metrics, ACQUIRE, "acquired"), 1.0);
    assert_eq!(
        metrics.value("fencelock_store_errors_total", &[("kind", "internal")]),
        1.0
    );
    for kind in ["unavailable", "timeout"] {
        assert_eq!(
            metrics.value("fencelock_store_errors_total", &[("kind", kind)]),
            0.0
        );
    }
}

/// No resource name, owner or fence appears anywhere in the exposition: not in a label,
/// not anywhere in its text. Unknown paths and made-up methods get fixed labels.
async fn no_resource_owner_or_fence_is_exposed(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    // Fences no counter in a short test could reach.
    app.db.set_last_fence(987_654_320).await;
    let (resource, owner) = ("orders-zq7", "worker-x9k");
    let lock = app.acquire_ok(resource, owner, TTL).await;
    let issued = fence(&lock);
    app.acquire(resource, "other-k2p", TTL).await;
    app.renew(
        resource,
        json!({ "owner": owner, "ttl_seconds": TTL, "fence": issued }),
    )
    .await;
    app.release(resource, json!({ "owner": owner, "fence": issued }))
        .await;
    app.send(Method::GET, "/nowhere-zq7", None, "").await;
    let brew = Method::from_bytes(b"BREW").unwrap();
    app.send(brew, &format!("/locks/{resource}"), None, "")
        .await;

    let response = app.get("/metrics").await;
    let text = response.text().await.unwrap();
    for secret in [
        resource,
        owner,
        "other-k2p",
        "nowhere-zq7",
        "BREW",
        &issued.to_string(),
        "98765432",
    ] {
        assert!(!text.contains(secret), "{secret} in\n{text}");
    }
    let metrics = Exposition::parse(&text);
    assert!(
        metrics
            .get(
                REQUESTS,
                &[("route", "unmatched"), ("method", "GET"), ("status", "404")]
            )
            .is_some(),
        "{text}"
    );
    assert_eq!(
        metrics.value(
            REQUESTS,
            &[
                ("route", &route(&app, "/locks/{resource}")),
                ("method", "other"),
                ("status", "405")
            ]
        ),
        1.0
    );
    for value in metrics.label_values() {
        assert!(!value.contains("zq7") && !value.contains("x9k"), "{value}");
    }
}

/// `fencelock_live_leases` follows the leases in the store, on its sampling interval.
async fn the_live_lease_gauge_follows_the_store(kind: StoreKind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn_on(db, |s| {
        s.live_leases_interval = Duration::from_millis(50);
    })
    .await;
    let live = || async { app.metrics().await.value("fencelock_live_leases", &[]) };
    let becomes = |expected: f64| async move {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let now = live().await;
            if now == expected {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "live leases stay {now}, not {expected}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    becomes(0.0).await;
    app.acquire_ok("one", "a", TTL).await;
    app.acquire_ok("two", "a", TTL).await;
    becomes(2.0).await;
    assert_eq!(
        app.release("one", json!({ "owner": "a" })).await.status(),
        204
    );
    becomes(1.0).await;
    app.db.age("two", 1000).await;
    becomes(0.0).await;
    let counts = app
        .metrics()
        .await
        .value("fencelock_store_seconds_count", &[("op", "count")]);
    assert!(counts >= 1.0);
}

contract!(
    each_answer_is_counted_once_under_its_outcome,
    a_takeover_after_expiry_counts_a_lease_expired_while_held,
    refusals_are_counted_under_their_outcomes,
    store_failures_are_counted_as_errors,
    no_resource_owner_or_fence_is_exposed,
    the_live_lease_gauge_follows_the_store,
);
