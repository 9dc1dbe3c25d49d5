//! Races: exactly one winner, distinct and increasing fences, and several instances on one
//! store agreeing on everything.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::helpers::{StoreKind, TTL, TestApp, TestDb, fence, release_status, renew_status};

/// Races `contenders` acquisitions of one free resource, spread over `apps`; returns the
/// winners' fences.
async fn race(apps: &[Arc<TestApp>], resource: &str, contenders: usize) -> Vec<i64> {
    let mut tasks = Vec::new();
    for i in 0..contenders {
        let app = apps[i % apps.len()].clone();
        let resource = resource.to_owned();
        tasks.push(tokio::spawn(async move {
            let response = app.acquire(&resource, &format!("owner-{i}"), TTL).await;
            assert_eq!(response.status(), 200);
            response.json::<Value>().await.unwrap()
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        let body = task.await.unwrap();
        match body["acquired"].as_bool() {
            Some(true) => winners.push(fence(&body["lock"])),
            Some(false) => assert_eq!(body["resource"], json!(resource)),
            None => panic!("unexpected answer {body}"),
        }
    }
    winners
}

/// 64 tasks race for one free resource, over many resources: exactly one wins each time.
async fn exactly_one_of_64_racers_wins(kind: StoreKind) {
    let app = Arc::new(TestApp::spawn(kind).await);
    for round in 0..10 {
        let resource = format!("race-{round}");
        let winners = race(std::slice::from_ref(&app), &resource, 64).await;
        assert_eq!(winners.len(), 1, "{resource}: {winners:?}");
        assert_eq!(app.fence_of(&resource).await, winners[0]);
    }
}

/// 1,000 acquisitions over mixed resources from 20 interleaved tasks: all fences distinct,
/// and increasing in issue order within each task.
async fn a_thousand_fences_are_distinct_and_ordered(kind: StoreKind) {
    let app = Arc::new(TestApp::spawn(kind).await);
    let mut tasks = Vec::new();
    for task in 0..20 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let mut fences = Vec::new();
            for i in 0..50 {
                let resource = format!("mixed-{task}-{}", i % 5);
                let lock = app.acquire_ok(&resource, &format!("t{task}"), TTL).await;
                fences.push(fence(&lock));
            }
            fences
        }));
    }
    let mut all = HashSet::new();
    for task in tasks {
        let fences = task.await.unwrap();
        assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
        for f in fences {
            assert!(all.insert(f), "fence {f} issued twice");
        }
    }
    assert_eq!(all.len(), 1000);
}

/// Two instances on one store agree on every lease and share one fence sequence.
async fn two_instances_share_leases_and_fences(kind: StoreKind) {
    let db = TestDb::new(kind).await;
    let a = Arc::new(TestApp::spawn_on(db.clone(), |_| {}).await);
    let b = Arc::new(TestApp::spawn_on(db, |_| {}).await);

    let lock = a.acquire_ok("shared", "x", TTL).await;
    assert_eq!(b.fence_of("shared").await, fence(&lock));
    let refused: Value = b.acquire("shared", "y", TTL).await.json().await.unwrap();
    assert_eq!(refused["acquired"], json!(false));
    assert_eq!(renew_status(&b, "shared", "x").await, 200);
    assert_eq!(release_status(&b, "shared", "x").await, 204);
    assert_eq!(a.inspect("shared").await.status(), 404);

    // Alternating instances: one sequence, strictly increasing.
    let mut last = fence(&lock);
    for i in 0..20 {
        let app = if i % 2 == 0 { &a } else { &b };
        let f = fence(&app.acquire_ok(&format!("alt-{i}"), "x", TTL).await);
        assert!(f > last, "fence {f} after {last}");
        last = f;
    }

    // A race spread over both instances still has one winner.
    let apps = [a.clone(), b.clone()];
    for round in 0..5 {
        let winners = race(&apps, &format!("both-{round}"), 64).await;
        assert_eq!(winners.len(), 1);
    }
}

/// Concurrent re-acquisitions by one owner (retries after unclear answers) all succeed, and
/// the lease left standing carries the greatest fence issued: a fence for a resource is never
/// lower than the fence of the lease it replaced, however the requests interleave.
async fn concurrent_reacquires_leave_the_greatest_fence(kind: StoreKind) {
    let app = Arc::new(TestApp::spawn(kind).await);
    for round in 0..5 {
        let resource = format!("retry-{round}");
        let mut tasks = Vec::new();
        for _ in 0..32 {
            let (app, resource) = (app.clone(), resource.clone());
            tasks.push(tokio::spawn(async move {
                fence(&app.acquire_ok(&resource, "same-owner", TTL).await)
            }));
        }
        let mut fences = Vec::new();
        for task in tasks {
            fences.push(task.await.unwrap());
        }
        let greatest = *fences.iter().max().unwrap();
        assert_eq!(app.fence_of(&resource).await, greatest, "{fences:?}");
    }
}

contract!(
    concurrent_reacquires_leave_the_greatest_fence,
    exactly_one_of_64_racers_wins,
    a_thousand_fences_are_distinct_and_ordered,
    two_instances_share_leases_and_fences,
);

// The same rules through PgBouncer, in transaction and in session pooling.
through_pgbouncer!(
    exactly_one_of_64_racers_wins,
    a_thousand_fences_are_distinct_and_ordered,
    two_instances_share_leases_and_fences,
    concurrent_reacquires_leave_the_greatest_fence,
);
