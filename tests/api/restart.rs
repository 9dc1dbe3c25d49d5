//! Leases and fences survive restarts, including `kill -9` in the middle of a load.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};

use crate::helpers::{StoreKind, TTL, TestApp, TestDb, client, fence};
use crate::process::ServerProcess;

/// A lease taken before a restart is live after it with the same fence, and the first
/// acquisition after the restart gets a greater fence than any before.
async fn leases_and_fences_survive_a_restart(kind: StoreKind) {
    let db = TestDb::new(kind).await;
    let first = TestApp::spawn_on(db.clone(), |_| {}).await;
    let held = first.acquire_ok("held", "a", 3600).await;
    let mut highest = fence(&held);
    for i in 0..10 {
        highest = fence(&first.acquire_ok(&format!("r{i}"), "a", TTL).await);
        first
            .release(&format!("r{i}"), json!({ "owner": "a" }))
            .await;
    }
    drop(first);

    let second = TestApp::spawn_on(db, |_| {}).await;
    let shown: Value = second.inspect("held").await.json().await.unwrap();
    assert_eq!(fence(&shown), fence(&held));
    assert_eq!(shown["expires_at"], held["expires_at"]);
    let next = second.acquire_ok("new", "b", TTL).await;
    assert!(fence(&next) > highest, "{} after {highest}", fence(&next));
}

/// `kill -9` of the real server mid-load: every acknowledged lease is there afterwards with
/// its fence, and no fence is ever issued again.
async fn fences_survive_kill_9_mid_load(kind: StoreKind) {
    let db = TestDb::new(kind).await;
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(Some(&db.url()), dir.path());
    let url = server.address.clone();
    let stop = Arc::new(AtomicBool::new(false));

    let mut workers = Vec::new();
    for worker in 0..8 {
        let (url, stop) = (url.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let http = client();
            let mut acknowledged = Vec::new();
            for i in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let resource = format!("load-{worker}-{i}");
                let sent = http
                    .post(format!("{url}/locks/{resource}"))
                    .json(&json!({ "owner": "w", "ttl_seconds": 3600 }))
                    .send()
                    .await;
                let Ok(response) = sent else { break };
                let Ok(body) = response.json::<Value>().await else {
                    break;
                };
                acknowledged.push((resource, fence(&body["lock"])));
            }
            acknowledged
        }));
    }
    // Let the load run until a few hundred leases were acknowledged, then kill.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let log_lines = server.log.lock().unwrap().len();
        if log_lines > 400 || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    server.kill9();
    stop.store(true, Ordering::Relaxed);
    let mut acknowledged = Vec::new();
    for worker in workers {
        acknowledged.extend(worker.await.unwrap());
    }
    assert!(
        acknowledged.len() > 50,
        "only {} acquisitions before the kill",
        acknowledged.len()
    );
    let highest = acknowledged.iter().map(|(_, f)| *f).max().unwrap();
    eprintln!(
        "{kind:?}: {} leases acknowledged before kill -9, highest fence {highest}",
        acknowledged.len()
    );

    let app = TestApp::spawn_on(db, |_| {}).await;
    for (resource, f) in &acknowledged {
        assert_eq!(
            app.fence_of(resource).await,
            *f,
            "{resource} lost its lease"
        );
    }
    let next = fence(&app.acquire_ok("after-kill", "x", TTL).await);
    assert!(next > highest, "fence {next} after {highest}");
}

contract!(
    leases_and_fences_survive_a_restart,
    fences_survive_kill_9_mid_load,
);
