//! API.md, *Waiting and lock delay, made exact*: a hand-over goes only to a waiter that is
//! alive and still waiting (a waiter's ticket lives by its instance's heartbeat, and a grant
//! nobody takes is undone); a lease counts against its token's quota until its lock delay has
//! passed, and the delay shows as `delayed_until`; a resource's history is bounded.

use std::time::{Duration, Instant};

use fencelock_server::{Settings, StoreConfig};
use fencelock_testkit::{Proxy, pg_connect};
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{
    StoreKind, TestApp, TestDb, assert_problem, client, eventually, fence, json_answer,
    postgres_addr, token_entry,
};
use crate::process::ServerProcess;
use crate::waiting::{at, until_queued};

/// How soon after a release or an expiry the resource must be the next live waiter's, or
/// free, whatever happened to the waiters before it (API.md).
const LIVENESS_BOUND: Duration = Duration::from_secs(3);

/// A waiting acquisition in flight, answered on its task.
type Waiter = tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>;

/// `POST /locks/{resource}` waiting up to `wait_ms`, answered on the returned task.
fn wait_on(client: &reqwest::Client, url: String, owner: &str, ttl: i64, wait_ms: i64) -> Waiter {
    let request = client
        .post(url)
        .json(&json!({ "owner": owner, "ttl_seconds": ttl, "wait_ms": wait_ms }));
    tokio::spawn(request.send())
}

/// Two server processes on one store: a waiter for `r` on the first, which is then killed
/// with `kill -9`; the holder, on the second, releases. Another owner gets `r` within the
/// bound of the release: the dead waiter's ticket was not handed the lease (PostgreSQL), nor
/// holds the queue up for the rest of its wait (both stores).
async fn a_waiter_whose_instance_died_gets_nothing(kind: StoreKind) {
    let survivor = TestApp::spawn(kind).await;
    let dir = tempfile::tempdir().unwrap();
    let mut doomed = ServerProcess::start(Some(&survivor.db.url()), dir.path());
    let holder = survivor.acquire_ok("r", "holder", 60).await;
    let client = client();
    let _dead = wait_on(&client, doomed.url("/locks/r"), "dead", 600, 60_000);
    until_queued(&survivor, "r", 1).await;
    doomed.kill9();
    assert!(!doomed.is_running());

    let released_at = released(&survivor, &holder).await;
    let next = next_within_the_bound(&client, &survivor, released_at).await;
    assert_eq!(next["lock"]["owner"], "next");
}

/// The holder of `r` releases it; when.
async fn released(app: &TestApp, holder: &Value) -> Instant {
    let released = app
        .release("r", json!({ "owner": "holder", "fence": fence(holder) }))
        .await;
    assert_eq!(released.status(), 204);
    Instant::now()
}

/// Another owner, waiting for `r` on `app`, gets it within [`LIVENESS_BOUND`] of `since`.
async fn next_within_the_bound(client: &reqwest::Client, app: &TestApp, since: Instant) -> Value {
    let next = json_answer(client.post(app.url("/locks/r")).json(&json!({
        "owner": "next", "ttl_seconds": 60, "wait_ms": 10_000
    })))
    .await;
    let took = since.elapsed();
    assert_eq!(next["acquired"], true, "{next}");
    assert!(
        took < LIVENESS_BOUND,
        "the next owner got the resource {took:?} after the release"
    );
    next
}

/// The same with a waiter that is alive but cannot reach PostgreSQL (its instance's store
/// connection frozen, a partition): the release grants it the lease, provisionally. The grant
/// it cannot take is undone, and the next waiter, on the other instance, gets the resource
/// within the bound. When the partition heals, nothing is left of the grant: no ticket holds a
/// grant of a lease that is live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_its_waiter_cannot_take_is_undone() {
    let Partitioned {
        _cut_off: _serving,
        proxy,
        other,
        holder,
        client,
        waiter: stranded,
    } = waiting_behind_a_partition("stranded", 8_000).await;
    let db = pg_connect(&other.db.url()).await;

    proxy.freeze();
    let released_at = released(&other, &holder).await;
    let granted: Option<i64> = db
        .query_one(
            "SELECT max(granted_fence) FROM lease_waiters WHERE resource = 'r'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let granted = granted.expect("the release granted the live (not yet lapsed) ticket");
    let next = next_within_the_bound(&client, &other, released_at).await;
    assert!(fence(&next["lock"]) > granted);
    proxy.thaw();

    let answer = answered(stranded).await;
    let status = answer.status();
    let answer: Value = answer.json().await.unwrap();
    assert!(
        status == 503 || answer["acquired"] == false,
        "the stranded waiter was told it holds a lease: {status} {answer}"
    );
    let history: Value = other.get("/locks/r/history").await.json().await.unwrap();
    let undone = history["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|lease| lease["fence"] == granted)
        .expect("the grant is in the history");
    assert_eq!(undone["end"], "taken_over", "{history}");
    let left: i64 = db
        .query_one(
            "SELECT count(*) FROM lease_waiters w JOIN leases l ON l.fence = w.granted_fence
             WHERE l.expires_at > now()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "a ticket holds a grant of a live lease");
}

/// A partition shorter than a grant's life: the waiter takes the grant once it can reach the
/// database again and answers with it, for its own TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_taken_after_a_short_partition_is_the_waiters() {
    let Partitioned {
        _cut_off: _serving,
        proxy,
        other,
        holder,
        waiter,
        ..
    } = waiting_behind_a_partition("waiter", 20_000).await;

    proxy.freeze();
    released(&other, &holder).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.thaw();

    let answer = answered(waiter).await;
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.unwrap();
    assert_eq!(answer["acquired"], true, "{answer}");
    let lock = &answer["lock"];
    assert_eq!(
        (at(&lock["expires_at"]) - at(&lock["acquired_at"])).num_seconds(),
        30,
        "{answer}"
    );
    let shown: Value = other.inspect("r").await.json().await.unwrap();
    assert_eq!(shown["fence"], lock["fence"]);
    assert_eq!(
        shown["expires_at"], lock["expires_at"],
        "taken for its own TTL"
    );
}

/// The answer of a waiter started by [`wait_on`], within 30 s.
async fn answered(waiter: Waiter) -> reqwest::Response {
    tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter answers in time")
        .expect("the waiter's task")
        .expect("the waiter's request")
}

/// Two servers on one database: `cut_off`, whose PostgreSQL connections go through `proxy`,
/// and `other`, which reaches it directly. `holder` holds `r` (through `other`) and `waiter`
/// waits for it on `cut_off`, with a TTL of 30 s.
struct Partitioned {
    /// Serves `waiter`; kept to the end of the test.
    _cut_off: TestApp,
    proxy: Proxy,
    other: TestApp,
    holder: Value,
    client: reqwest::Client,
    waiter: Waiter,
}

/// Two servers on one fresh database: the first reaches PostgreSQL through the proxy (with a
/// store timeout of 1 s), the second directly.
async fn a_pair_one_behind_a_proxy() -> (TestApp, Proxy, TestApp) {
    let db = TestDb::new(StoreKind::Postgres).await;
    let proxy = Proxy::start(postgres_addr());
    let url = db.url_via(proxy.addr());
    let mut settings = Settings::for_store(StoreConfig::from_url(Some(&url)).unwrap());
    settings.bind = "127.0.0.1:0".parse().unwrap();
    settings.store_timeout = Duration::from_secs(1);
    let cut_off = TestApp::spawn_with(db.clone(), settings).await;
    let other = TestApp::spawn_on(db, |_| {}).await;
    (cut_off, proxy, other)
}

async fn waiting_behind_a_partition(owner: &str, wait_ms: i64) -> Partitioned {
    let (cut_off, proxy, other) = a_pair_one_behind_a_proxy().await;
    let holder = other.acquire_ok("r", "holder", 60).await;
    let client = client();
    let waiter = wait_on(&client, cut_off.url("/locks/r"), owner, 30, wait_ms);
    until_queued(&other, "r", 1).await;
    Partitioned {
        _cut_off: cut_off,
        proxy,
        other,
        holder,
        client,
        waiter,
    }
}

/// How a crowd's waiter ended: with the fence of the lease it took (and released at once),
/// or without one at its deadline.
type Served = Option<i64>;

/// One waiter of a crowd, as a worker runs it: asks for `r` on `url`, waiting at most until
/// `deadline`; a `503` (its instance cannot reach the store) is asked again after a pause.
/// A lease it gets is released at once, with its fence.
async fn crowd_waiter(
    client: reqwest::Client,
    url: String,
    owner: String,
    deadline: Instant,
) -> Served {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        let wait_ms = i64::try_from(left.as_millis()).unwrap();
        let body = json!({ "owner": owner, "ttl_seconds": 30, "wait_ms": wait_ms });
        let answer = client.post(&url).json(&body).send().await;
        let Ok(answer) = answer else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if answer.status() == 503 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        assert_eq!(answer.status(), 200, "{owner}");
        let answer: Value = answer.json().await.unwrap();
        if answer["acquired"] != true {
            return None;
        }
        let fence = fence(&answer["lock"]);
        let release = json!({ "owner": owner, "fence": fence });
        loop {
            let released = client.delete(&url).json(&release).send().await;
            match released.map(|r| r.status().as_u16()) {
                Ok(204) => return Some(fence),
                // The lease is gone already (an undone grant's waiter does not get it).
                Ok(status @ (404 | 409 | 403)) => {
                    panic!("{owner}: its lease {fence} was refused release: {status}")
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

/// The reproduction of a lost hand-over, at its scale: two instances on one database, the
/// first's connections to it through a proxy frozen for 8 s; 200 waiters (TTL 30 s) and 100
/// watches of `r`, half on each instance; the holder releases during the freeze. Every
/// waiter gets the lease before its deadline (30 s after it began), each releasing it at
/// once; every grant recorded was either received by its waiter or undone within the
/// liveness bound (none sat with nobody for its TTL); every watch ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_of_waiters_behind_a_partition_is_served() {
    const WAITERS: usize = 200;
    const WATCHES: usize = 100;
    let (cut_off, proxy, other) = a_pair_one_behind_a_proxy().await;
    let apps = [&cut_off, &other];
    let holder = other.acquire_ok("r", "holder", 60).await;
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let waiters: Vec<_> = (0..WAITERS)
        .map(|i| {
            let url = apps[i % 2].url("/locks/r");
            tokio::spawn(crowd_waiter(client.clone(), url, format!("w{i}"), deadline))
        })
        .collect();
    let watches: Vec<_> = (0..WATCHES)
        .map(|i| apps[i % 2].watch_in_background("r", &holder, 60_000))
        .collect();
    until_queued(&other, "r", i64::try_from(WAITERS).unwrap()).await;

    proxy.freeze();
    released(&other, &holder).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    proxy.thaw();

    let mut received = std::collections::HashSet::new();
    let mut starved = Vec::new();
    for (i, waiter) in waiters.into_iter().enumerate() {
        let served = tokio::time::timeout(Duration::from_secs(60), waiter)
            .await
            .expect("the waiter ends")
            .expect("the waiter's task");
        match served {
            Some(fence) => assert!(received.insert(fence), "fence {fence} received twice"),
            None => starved.push(format!("w{i}")),
        }
    }
    assert!(
        starved.is_empty(),
        "{} of {WAITERS} waiters starved: {starved:?}",
        starved.len()
    );
    for watch in watches {
        let (answer, _) = tokio::time::timeout(Duration::from_secs(60), watch)
            .await
            .expect("the watch ends")
            .expect("the watch's task");
        assert!(
            answer["changed"] == true || answer["status"] == 503,
            "a watch answered {answer}"
        );
    }

    let db = pg_connect(&other.db.url()).await;
    let rows = db
        .query(
            "SELECT fence, extract(epoch FROM coalesce(ended_at, now()) - acquired_at)::float8
             FROM leases WHERE resource = 'r' AND fence <> $1",
            &[&fence(&holder)],
        )
        .await
        .unwrap();
    assert!(rows.len() >= WAITERS, "{} grants recorded", rows.len());
    for row in rows {
        let (granted, lasted): (i64, f64) = (row.get(0), row.get(1));
        assert!(
            received.contains(&granted) || lasted < LIVENESS_BOUND.as_secs_f64(),
            "the grant {granted} was received by nobody, and sat for {lasted:.1} s"
        );
    }
}

const LOCKER: &str = "locker-secret-0123456789";

/// A token with a quota of 3 takes three leases with a TTL of 1 s and a lock delay of a
/// minute. Once they have expired, they still count while in their delay: a fourth
/// acquisition is `429`. Inspect shows the delay (`404` with `delayed_until`), and so does a
/// refused acquisition of another owner; a refusal of a live lease has no `delayed_until`.
async fn a_lease_counts_against_the_quota_until_its_lock_delay_passes(kind: StoreKind) {
    let file = [
        token_entry("lockers", LOCKER, &[""], &["lock", "read"]),
        "max_leases = 3\n".to_owned(),
    ]
    .concat();
    let (app, _dir) = TestApp::spawn_with_auth(kind, &file).await;
    let acquire = async |resource: &str, owner: &str, ttl: i64, delay: i64| {
        let body = json!({ "owner": owner, "ttl_seconds": ttl, "lock_delay_ms": delay });
        let path = format!("/locks/{resource}");
        app.send_as(Some(LOCKER), Method::POST, &path, Some(&body))
            .await
    };
    let mut expiries = Vec::new();
    for i in 0..3 {
        let answer: Value = acquire(&format!("job:{i}"), "worker", 1, 60_000)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(answer["acquired"], true, "{answer}");
        expiries.push(at(&answer["lock"]["expires_at"]));
    }
    eventually(
        "the leases never expired",
        Duration::from_secs(10),
        async || {
            let listed: Value = app
                .send_as(Some(LOCKER), Method::GET, "/locks?limit=10", None)
                .await
                .json()
                .await
                .unwrap();
            listed["locks"].as_array().unwrap().is_empty()
        },
    )
    .await;

    assert_problem(
        acquire("job:3", "worker", 30, 0).await,
        429,
        "quota-exceeded",
    )
    .await;

    let delayed_until = expiries[0] + chrono::Duration::milliseconds(60_000);
    let shown = app
        .send_as(Some(LOCKER), Method::GET, "/locks/job:0", None)
        .await;
    let problem = assert_problem(shown, 404, "not-found").await;
    let text = problem["delayed_until"].as_str().expect("delayed_until");
    assert!(
        text.ends_with('Z') && text.len() == "2026-01-01T00:00:00.000Z".len(),
        "RFC 3339 in UTC with milliseconds: {text}"
    );
    assert_eq!(at(&problem["delayed_until"]), delayed_until, "{problem}");

    let refused: Value = acquire("job:0", "someone-else", 30, 0)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        refused,
        json!({
            "acquired": false,
            "resource": "job:0",
            "delayed_until": problem["delayed_until"],
        })
    );

    // Its own owner may still take it again; it then counts as a live lease, as before.
    let again: Value = acquire("job:0", "worker", 30, 0)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again["acquired"], true, "{again}");
    let held: Value = acquire("job:0", "someone-else", 30, 0)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(held, json!({ "acquired": false, "resource": "job:0" }));
    let live = app
        .send_as(Some(LOCKER), Method::GET, "/locks/job:0", None)
        .await;
    assert_eq!(live.status(), 200);
}

/// The history of a resource acquired again and again keeps its newest
/// [`HISTORY_PER_RESOURCE`] leases: the purge trims the rest.
async fn a_resource_keeps_a_bounded_history(kind: StoreKind) {
    const HISTORY_PER_RESOURCE: i64 = 1000;
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn_on(db.clone(), |settings| {
        settings.purge_interval = Duration::from_secs(1);
    })
    .await;
    // Older leases of the resource, below the fences the server will issue.
    db.set_last_fence(10_000).await;
    // An hour ago: well inside the history's retention.
    // PostgreSQL's lease table is its own history; SQLite keeps the history apart.
    let (long_ago, history, owner, looper) = match kind {
        StoreKind::Postgres => (
            "now() - interval '1 hour'".to_owned(),
            "leases",
            "owner, ",
            "'looper', ",
        ),
        StoreKind::Sqlite => (
            (chrono::Utc::now().timestamp_millis() - 3_600_000).to_string(),
            "lease_history",
            "",
            "",
        ),
    };
    db.execute(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1100)
         INSERT INTO {history} (fence, resource, {owner}acquired_at, expires_at, ended_at, end_kind)
         SELECT i, 'loop', {looper}{long_ago}, {long_ago}, {long_ago}, 'released' FROM n"
    ))
    .await;
    let mut fences = Vec::new();
    for _ in 0..20 {
        let lock = app.acquire_ok("loop", "looper", 30).await;
        fences.push(fence(&lock));
    }
    eventually(
        "the history was never trimmed",
        Duration::from_secs(20),
        async || app.db.history_rows("loop").await == HISTORY_PER_RESOURCE,
    )
    .await;
    let history: Value = app
        .get("/locks/loop/history?limit=1000")
        .await
        .json()
        .await
        .unwrap();
    let kept: Vec<i64> = history["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|lease| lease["fence"].as_i64().unwrap())
        .collect();
    assert_eq!(kept.len(), 1000);
    assert_eq!(
        kept[..20],
        fences.iter().rev().copied().collect::<Vec<_>>()[..]
    );
    assert_eq!(*kept.last().unwrap(), 1100 - 980 + 1, "the newest are kept");
}

fencelock_testkit::contract_stores!(
    a_waiter_whose_instance_died_gets_nothing,
    a_lease_counts_against_the_quota_until_its_lock_delay_passes,
    a_resource_keeps_a_bounded_history,
);
