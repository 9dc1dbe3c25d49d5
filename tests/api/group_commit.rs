//! Group commit: concurrent lock requests to PostgreSQL are decided together, in one statement
//! and one commit, with the same answers as alone. These tests talk to the server's store
//! directly, so that many requests are in flight at exactly the same time.
//!
//! The PostgreSQL-only tests make batches on purpose: every committer is first held up on a
//! row lock taken by another session ([`HeldCommitters`]), the requests are queued behind
//! them, and once they are let go the first committer free takes everything queued as one
//! batch.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use fencelock::domain::{
    AcquireOutcome, AcquireRequest, Acquisition, Fence, HistoryLimit, HistoryRequest, Inspection,
    LockDelay, Owner, PastLease, RecordedEnd, ReleaseOutcome, ReleaseRequest, RenewOutcome,
    RenewRequest, ResourceName, TokenQuota, Ttl,
};
use fencelock_server::postgres::COMMITTERS;
use fencelock_server::{Deadline, SharedStore, StoreError};
use futures_util::future::{JoinAll, join_all};

use crate::helpers::{Exposition, RowLock, StoreKind, TTL, TestApp};

fn acquire(resource: &str, owner: &str) -> AcquireRequest {
    AcquireRequest {
        resource: ResourceName::parse(resource).unwrap(),
        owner: Owner::parse(owner).unwrap(),
        ttl: ttl(),
        lock_delay: LockDelay::NONE,
        token: None,
        wait: Default::default(),
        ticket: None,
    }
}

fn acquire_with_token(resource: &str, token: &str, max_leases: Option<u32>) -> AcquireRequest {
    AcquireRequest {
        token: Some(TokenQuota {
            name: token.to_owned(),
            max_leases,
        }),
        ..acquire(resource, "worker")
    }
}

fn renew(resource: &str, owner: &str, fence: Option<Fence>) -> RenewRequest {
    RenewRequest {
        resource: ResourceName::parse(resource).unwrap(),
        owner: Owner::parse(owner).unwrap(),
        ttl: ttl(),
        fence,
    }
}

fn release(resource: &str, owner: &str, fence: Option<Fence>) -> ReleaseRequest {
    ReleaseRequest {
        resource: ResourceName::parse(resource).unwrap(),
        owner: Owner::parse(owner).unwrap(),
        fence,
    }
}

fn ttl() -> Ttl {
    Ttl::new(TTL, Ttl::max(86_400).unwrap()).unwrap()
}

/// The deadline of a request answered within the default store timeout.
fn in_time() -> Deadline {
    Deadline::after(Duration::from_secs(5))
}

fn granted(outcome: Result<AcquireOutcome, StoreError>) -> (i64, Acquisition) {
    match outcome {
        Ok(AcquireOutcome::Acquired { lease, how }) => (lease.fence.get(), how),
        other => panic!("not granted: {other:?}"),
    }
}

fn assert_too_late<T: std::fmt::Debug>(outcome: Result<T, StoreError>) {
    match outcome {
        Err(e @ StoreError::Unavailable(_)) => {
            assert!(e.to_string().contains("deadline passed"), "{e}");
        }
        other => panic!("not refused as too late: {other:?}"),
    }
}

/// How many batches of more than `above` requests (and at most `up_to`) were sent.
fn batches_between(metrics: &Exposition, above: &str, up_to: &str) -> f64 {
    let bucket = |le| metrics.value("fencelock_store_batch_size_bucket", &[("le", le)]);
    bucket(up_to) - bucket(above)
}

/// Three waves of 200 acquisitions of distinct free resources, all at once: every one is
/// granted, their fences are distinct, and every fence of a wave is above every fence of the
/// wave before. On PostgreSQL they went in batches.
async fn concurrent_acquisitions_get_distinct_increasing_fences(kind: StoreKind) {
    const WAVE: usize = 200;
    let app = TestApp::spawn(kind).await;
    let mut before = 0;
    for wave in 0..3 {
        let outcomes = join_all((0..WAVE).map(|i| {
            let store = app.store.clone();
            async move {
                store
                    .acquire(&acquire(&format!("wave-{wave}-{i}"), "o"), in_time())
                    .await
            }
        }))
        .await;
        let mut fences = HashSet::new();
        for outcome in outcomes {
            let (fence, how) = granted(outcome);
            assert_eq!(how, Acquisition::Fresh);
            assert!(
                fence > before,
                "fence {fence} of wave {wave} after {before}"
            );
            assert!(fences.insert(fence), "fence {fence} issued twice");
        }
        before = *fences.iter().max().unwrap();
    }
    if kind == StoreKind::Postgres {
        let metrics = app.metrics().await;
        let requests = metrics.value("fencelock_store_batch_size_sum", &[]);
        let batches = metrics.value("fencelock_store_batch_size_count", &[]);
        assert_eq!(requests, 3.0 * WAVE as f64);
        assert!(
            batches * 2.0 <= requests,
            "{requests} requests in {batches} batches: hardly batched"
        );
    }
}

/// Sixteen tasks fight over one resource with acquire, renew and release. Whoever is granted
/// it finds itself the holder (inspect, and renew and release with its fence succeed), so
/// there were never two; whoever is refused can neither renew nor release it; and each fence
/// granted is above the fence of every lease released before.
async fn contention_on_one_resource_never_gives_two_holders(kind: StoreKind) {
    const RESOURCE: &str = "contended";
    let app = TestApp::spawn(kind).await;
    let released = Arc::new(AtomicI64::new(0));
    let grants = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..16)
        .map(|task| {
            let (store, released, grants) = (app.store.clone(), released.clone(), grants.clone());
            tokio::spawn(async move {
                let me = format!("owner-{task}");
                for _ in 0..25 {
                    contend(&store, RESOURCE, &me, &released, &grants).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let grants = grants.lock().unwrap().clone();
    assert!(!grants.is_empty(), "nobody was ever granted the resource");
    assert_eq!(
        grants.iter().collect::<HashSet<_>>().len(),
        grants.len(),
        "a fence was granted twice: {grants:?}"
    );
    assert_eq!(
        app.store
            .inspect(&ResourceName::parse(RESOURCE).unwrap())
            .await
            .unwrap(),
        Inspection::Absent
    );
}

async fn contend(
    store: &SharedStore,
    resource: &str,
    me: &str,
    released: &AtomicI64,
    grants: &Mutex<Vec<i64>>,
) {
    match store.acquire(&acquire(resource, me), in_time()).await {
        Ok(AcquireOutcome::Acquired { lease, how }) => {
            // Every holder releases before its task goes on: no row is left to reacquire or
            // take over.
            assert_eq!(how, Acquisition::Fresh);
            let fence = lease.fence;
            let before = released.load(Ordering::SeqCst);
            assert!(
                fence.get() > before,
                "fence {fence} after released {before}"
            );
            let seen = store
                .inspect(&lease.resource)
                .await
                .unwrap()
                .live()
                .expect("the holder's lease is live");
            assert_eq!((seen.owner.as_str(), seen.fence), (me, fence));
            match store
                .renew(&renew(resource, me, Some(fence)), in_time())
                .await
            {
                Ok(RenewOutcome::Renewed(lease)) => assert_eq!(lease.fence, fence),
                other => panic!("{me} holds {fence} but could not renew: {other:?}"),
            }
            match store
                .release(&release(resource, me, Some(fence)), in_time())
                .await
            {
                Ok(ReleaseOutcome::Released { fence: gone, .. }) => assert_eq!(gone, fence),
                other => panic!("{me} holds {fence} but could not release: {other:?}"),
            }
            released.fetch_max(fence.get(), Ordering::SeqCst);
            grants.lock().unwrap().push(fence.get());
        }
        Ok(AcquireOutcome::Held { .. }) => {
            let renewed = store.renew(&renew(resource, me, None), in_time()).await;
            assert!(
                !matches!(renewed, Ok(RenewOutcome::Renewed(_))),
                "{me} renewed a lease it was refused: {renewed:?}"
            );
            let gone = store.release(&release(resource, me, None), in_time()).await;
            assert!(
                !matches!(gone, Ok(ReleaseOutcome::Released { .. })),
                "{me} released a lease it was refused: {gone:?}"
            );
        }
        other => panic!("unexpected answer: {other:?}"),
    }
}

/// Twenty acquisitions at once under a token with `max_leases = 3` (decided alone, each under
/// the token's lock) get exactly three leases, while twenty under a token without a quota
/// (batched) all get theirs; the batched leases count towards their token's quota.
async fn quotas_hold_under_concurrency(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let store = &app.store;
    let limited = join_all((0..20).map(|i| async move {
        let req = acquire_with_token(&format!("limited-{i}"), "limited", Some(3));
        store.acquire(&req, in_time()).await
    }));
    let free = join_all((0..20).map(|i| async move {
        let req = acquire_with_token(&format!("free-{i}"), "free", None);
        store.acquire(&req, in_time()).await
    }));
    let (limited, free) = tokio::join!(limited, free);
    let mut granted_under_quota = 0;
    for outcome in limited {
        match outcome.unwrap() {
            AcquireOutcome::Acquired { .. } => granted_under_quota += 1,
            AcquireOutcome::QuotaExceeded { max_leases } => assert_eq!(max_leases, 3),
            AcquireOutcome::Held { .. } => panic!("a free resource was held"),
        }
    }
    assert_eq!(granted_under_quota, 3);
    for outcome in free {
        granted(outcome);
    }
    let over = store
        .acquire(&acquire_with_token("free-20", "free", Some(20)), in_time())
        .await
        .unwrap();
    assert_eq!(over, AcquireOutcome::QuotaExceeded { max_leases: 20 });
    granted(
        store
            .acquire(&acquire_with_token("free-20", "free", Some(21)), in_time())
            .await,
    );
}

contract_stores!(
    concurrent_acquisitions_get_distinct_increasing_fences,
    contention_on_one_resource_never_gives_two_holders,
    quotas_hold_under_concurrency,
);

/// Futures whose requests are queued now (each is polled once), to be awaited together
/// later.
async fn queued<F: Future>(futures: impl IntoIterator<Item = F>) -> Pin<Box<JoinAll<F>>> {
    let mut all = Box::pin(join_all(futures));
    std::future::poll_fn(|cx| {
        assert!(all.as_mut().poll(cx).is_pending(), "answered before queued");
        Poll::Ready(())
    })
    .await;
    all
}

/// Every committer of a PostgreSQL store (the test server's pool is larger than their number),
/// each waiting for a row lock that another session holds, so that requests queue behind them.
struct HeldCommitters {
    locks: Vec<RowLock>,
    waiting: Vec<tokio::task::JoinHandle<Result<AcquireOutcome, StoreError>>>,
}

impl HeldCommitters {
    async fn hold(app: &TestApp) -> Self {
        let mut held = Self {
            locks: Vec::new(),
            waiting: Vec::new(),
        };
        for i in 0..COMMITTERS {
            let gate = format!("gate-{i}");
            granted(
                app.store
                    .acquire(&acquire(&gate, "gatekeeper"), in_time())
                    .await,
            );
            let lock = RowLock::take(&app.db, &gate).await;
            let store = app.store.clone();
            held.waiting.push(tokio::spawn(async move {
                store
                    .acquire(&acquire(&gate, "gatekeeper"), in_time())
                    .await
            }));
            wait_for_waiters(&lock, i64::try_from(i + 1).unwrap()).await;
            held.locks.push(lock);
        }
        held
    }

    /// Lets every committer go; their requests are granted.
    async fn release(self) {
        for lock in self.locks {
            lock.release().await;
        }
        for waiting in self.waiting {
            let (_, how) = granted(waiting.await.unwrap());
            assert_eq!(how, Acquisition::Reacquired);
        }
    }
}

/// Waits until `count` sessions of the database wait for a lock.
async fn wait_for_waiters(lock: &RowLock, count: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while lock.waiters().await < count {
        assert!(Instant::now() < deadline, "nothing waits for the row lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The scene of a batch that meets a locked row: `x` acquired by `w` (its fence returned), its
/// row then locked by another session, and every committer held.
async fn x_held_and_locked(app: &TestApp) -> (i64, RowLock, HeldCommitters) {
    let (before, _) = granted(app.store.acquire(&acquire("x", "w"), in_time()).await);
    let x = RowLock::take(&app.db, "x").await;
    (before, x, HeldCommitters::hold(app).await)
}

/// Five acquisitions of resources nobody holds, queued behind the held committers.
async fn five_others(
    store: &SharedStore,
) -> Pin<Box<JoinAll<impl Future<Output = Result<AcquireOutcome, StoreError>> + '_>>> {
    queued((0..5).map(|i| async move {
        let req = acquire(&format!("a-{i}"), "o");
        store.acquire(&req, in_time()).await
    }))
    .await
}

/// In one batch, a request whose deadline passes while the batch waits for its row is
/// answered "too late" and changes nothing, and one whose deadline had passed before the
/// batch was sent is not sent; the others in the batch are granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_request_in_a_batch_fails_alone() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    let (before, x, committers) = x_held_and_locked(&app).await;

    let late = Deadline::after(Duration::from_millis(600));
    let store = &app.store;
    let others = five_others(store).await;
    let reacquire_x = acquire("x", "w");
    let expired = acquire("passed", "o");
    let refused = queued([
        store.acquire(&reacquire_x, late),
        store.acquire(&expired, Deadline::after(Duration::ZERO)),
    ])
    .await;
    committers.release().await;

    // The batch now waits for x's row (sorted last in it); x's deadline passes meanwhile.
    // (On a machine too slow for that, x is refused before it is sent, or once the batch
    // gives up waiting and x is decided alone: the same answers.)
    tokio::time::sleep_until(tokio::time::Instant::from_std(late.instant())).await;
    x.release().await;

    for outcome in others.await {
        granted(outcome);
    }
    for outcome in refused.await {
        assert_too_late(outcome);
    }
    assert_eq!(app.fence_of("x").await, before, "x changed");
    assert_eq!(app.db.rows("passed").await, 0);
    let metrics = app.metrics().await;
    assert_eq!(
        batches_between(&metrics, "4", "8"),
        1.0,
        "the five and x were not one batch"
    );
}

/// A batch the database refuses (here: it waits too long for a row lock held from outside)
/// commits nothing, and its requests are then decided alone: the others are granted while
/// the row is still locked, and the request for that row is granted once it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_batch_is_decided_request_by_request() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    let (before, x, committers) = x_held_and_locked(&app).await;

    let store = &app.store;
    let others = five_others(store).await;
    let reacquire_x = acquire("x", "w");
    let mut blocked = queued([store.acquire(&reacquire_x, in_time())]).await;
    committers.release().await;

    // Only possible if the batch was rolled back: in it, the five would commit with x.
    let others = tokio::time::timeout(Duration::from_secs(10), others)
        .await
        .expect("the others were answered while x's row was locked");
    for outcome in others {
        granted(outcome);
    }
    std::future::poll_fn(|cx| {
        assert!(
            blocked.as_mut().poll(cx).is_pending(),
            "x was decided while its row was locked"
        );
        Poll::Ready(())
    })
    .await;
    x.release().await;
    let (fence, how) = granted(blocked.await.pop().unwrap());
    assert_eq!(how, Acquisition::Reacquired);
    assert!(fence > before);
    let metrics = app.metrics().await;
    assert_eq!(
        batches_between(&metrics, "4", "8"),
        1.0,
        "the five and x were not one batch"
    );
    assert_eq!(
        metrics.value("fencelock_store_batches_refused_total", &[]),
        1.0
    );
}

/// An acquisition of a lease another owner holds is answered from a plain read
/// (docs/design/0005-what-a-decision-costs.md): it neither takes the lease's row lock nor waits for
/// it. Here another session holds that lock; under load it is the holder's own release or renewal,
/// which a refusal would otherwise hold up until the refusal's batch committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_does_not_wait_for_the_row_lock() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    granted(app.store.acquire(&acquire("x", "w"), in_time()).await);
    let x = RowLock::take(&app.db, "x").await;
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        app.store.acquire(&acquire("x", "other"), in_time()),
    )
    .await
    .expect("the refusal waited for the locked row");
    held(refused);
    assert_eq!(x.waiters().await, 0, "a session still waits for the row");
    x.release().await;
}

/// One committer, the lead, takes the batches; while its batch waits for a row that another
/// session holds, the standby decides the requests queued behind it, so one held-up batch
/// does not hold up the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_behind_a_held_up_batch_are_decided_meanwhile() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    granted(
        app.store
            .acquire(&acquire("gate", "gatekeeper"), in_time())
            .await,
    );
    let gate = RowLock::take(&app.db, "gate").await;
    let store = app.store.clone();
    let held_up = tokio::spawn(async move {
        store
            .acquire(&acquire("gate", "gatekeeper"), in_time())
            .await
    });
    wait_for_waiters(&gate, 1).await;

    let others = join_all((0..5).map(|i| {
        let req = acquire(&format!("a-{i}"), "o");
        let store = &app.store;
        async move { store.acquire(&req, in_time()).await }
    }))
    .await;
    for outcome in others {
        granted(outcome);
    }
    // Had they waited for the lead, they would have been answered only once its batch gave up
    // waiting for the row (after a second) and was refused.
    let metrics = app.metrics().await;
    assert_eq!(
        metrics.value("fencelock_store_batches_refused_total", &[]),
        0.0,
        "the others waited until the held-up batch gave up"
    );
    assert!(!held_up.is_finished(), "the gate was decided while locked");
    gate.release().await;
    let (_, how) = granted(held_up.await.unwrap());
    assert_eq!(how, Acquisition::Reacquired);
}

/// Thirty-two tasks acquire and release five hot resources, in every order: batches running
/// at the same time keep meeting on the same rows, and since each takes its rows in resource
/// order, none ever deadlocks (a deadlock would make the database refuse a batch). Every
/// grant gets a fence of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_on_hot_resources_never_deadlock() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    let tasks: Vec<_> = (0..32)
        .map(|task| {
            let store = app.store.clone();
            tokio::spawn(async move {
                let me = format!("owner-{task}");
                let mut fences = Vec::new();
                for i in 0..30 {
                    let resource = format!("hot-{}", (task * 7 + i * 3) % 5);
                    if let Ok(AcquireOutcome::Acquired { lease, .. }) =
                        store.acquire(&acquire(&resource, &me), in_time()).await
                    {
                        fences.push(lease.fence.get());
                        let gone = store
                            .release(&release(&resource, &me, Some(lease.fence)), in_time())
                            .await;
                        assert!(
                            matches!(gone, Ok(ReleaseOutcome::Released { .. })),
                            "{gone:?}"
                        );
                    }
                }
                fences
            })
        })
        .collect();
    let mut fences = Vec::new();
    for task in tasks {
        fences.extend(task.await.unwrap());
    }
    assert!(fences.len() >= 5, "hardly any grant: {fences:?}");
    assert_eq!(fences.iter().collect::<HashSet<_>>().len(), fences.len());
    let metrics = app.metrics().await;
    assert_eq!(
        metrics.value("fencelock_store_batches_refused_total", &[]),
        0.0
    );
    let (requests, batches) = (
        metrics.value("fencelock_store_batch_size_sum", &[]),
        metrics.value("fencelock_store_batch_size_count", &[]),
    );
    assert!(
        requests > batches,
        "{requests} requests in {batches} batches"
    );
}

/// With `--pg-batch-max 1` every request is a statement of its own: answered the same, and no
/// batch is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_of_one_are_single_statements() {
    let db = crate::helpers::TestDb::new(StoreKind::Postgres).await;
    let app = TestApp::spawn_on(db, |s| s.pg_batch_max = 1).await;
    let store = &app.store;
    let outcomes = join_all((0..20).map(|i| async move {
        let req = acquire(&format!("r-{i}"), "o");
        store.acquire(&req, in_time()).await
    }))
    .await;
    for outcome in outcomes {
        granted(outcome);
    }
    let (fence, _) = granted(store.acquire(&acquire("r-0", "o"), in_time()).await);
    let fence = Fence::new(fence).unwrap();
    assert!(matches!(
        store
            .renew(&renew("r-0", "o", Some(fence)), in_time())
            .await,
        Ok(RenewOutcome::Renewed(_))
    ));
    assert!(matches!(
        store
            .release(&release("r-0", "o", Some(fence)), in_time())
            .await,
        Ok(ReleaseOutcome::Released { .. })
    ));
    let metrics = app.metrics().await;
    assert_eq!(metrics.value("fencelock_store_batch_size_count", &[]), 0.0);
}

/// `resource`'s history as the store keeps it, newest first: (fence, recorded end, renewals).
async fn history_of(store: &SharedStore, resource: &str) -> Vec<(i64, Option<RecordedEnd>, u32)> {
    let request = HistoryRequest {
        resource: ResourceName::parse(resource).unwrap(),
        limit: HistoryLimit::default(),
    };
    let history = store.history(&request).await.expect("history is read");
    let row = |lease: &PastLease| (lease.fence.get(), lease.recorded, lease.renewals);
    history.leases.iter().map(row).collect()
}

/// `AcquireOutcome::Held`, or a panic.
fn held(outcome: Result<AcquireOutcome, StoreError>) {
    assert!(
        matches!(outcome, Ok(AcquireOutcome::Held { .. })),
        "{outcome:?}"
    );
}

/// Requests decided in one batch each write their history in it: a fresh grant (with its
/// lock delay kept), a renewal, a release and a re-acquisition of a live lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_writes_the_history_of_every_request() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    let store = &app.store;
    let (renewing, _) = granted(store.acquire(&acquire("h-renew", "o"), in_time()).await);
    let (releasing, _) = granted(store.acquire(&acquire("h-release", "o"), in_time()).await);
    let (replaced, _) = granted(store.acquire(&acquire("h-reacquire", "o"), in_time()).await);

    let committers = HeldCommitters::hold(&app).await;
    let delayed = AcquireRequest {
        lock_delay: LockDelay::new(60_000).unwrap(),
        ..acquire("h-fresh", "o")
    };
    let (fresh, reacquire, also_fresh) =
        (delayed, acquire("h-reacquire", "o"), acquire("h-more", "o"));
    let renewal = renew("h-renew", "o", Fence::new(renewing).ok());
    let release_it = release("h-release", "o", Fence::new(releasing).ok());
    let acquisitions = queued([
        store.acquire(&fresh, in_time()),
        store.acquire(&reacquire, in_time()),
        store.acquire(&also_fresh, in_time()),
    ])
    .await;
    let renewed = queued([store.renew(&renewal, in_time())]).await;
    let released = queued([store.release(&release_it, in_time())]).await;
    committers.release().await;

    let fences: Vec<i64> = acquisitions
        .await
        .into_iter()
        .map(|o| granted(o).0)
        .collect();
    assert!(matches!(renewed.await[0], Ok(RenewOutcome::Renewed(_))));
    assert!(matches!(
        released.await[0],
        Ok(ReleaseOutcome::Released { .. })
    ));
    let metrics = app.metrics().await;
    assert_eq!(
        batches_between(&metrics, "4", "8"),
        1.0,
        "the five requests were not one batch"
    );

    assert_eq!(history_of(store, "h-fresh").await, [(fences[0], None, 0)]);
    assert_eq!(
        history_of(store, "h-reacquire").await,
        [
            (fences[1], None, 0),
            (replaced, Some(RecordedEnd::Released), 0)
        ]
    );
    assert_eq!(history_of(store, "h-renew").await, [(renewing, None, 1)]);
    assert_eq!(
        history_of(store, "h-release").await,
        [(releasing, Some(RecordedEnd::Released), 0)]
    );
    // The lock delay went in with the batch: a second after expiry, others are kept out.
    app.db.age("h-fresh", 1_000).await;
    held(store.acquire(&acquire("h-fresh", "p"), in_time()).await);
}

/// With `--pg-batch-max 1` (the single statements a refused batch also falls back to), every
/// lease change writes its history too, and the lock delay holds; and so does an acquisition
/// under a quota, which is always decided alone (`fencelock_acquire`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_statements_write_history() {
    let db = crate::helpers::TestDb::new(StoreKind::Postgres).await;
    let app = TestApp::spawn_on(db, |s| s.pg_batch_max = 1).await;
    let store = &app.store;
    let (first, _) = granted(store.acquire(&acquire("s", "o"), in_time()).await);
    let renewal = renew("s", "o", Fence::new(first).ok());
    assert!(matches!(
        store.renew(&renewal, in_time()).await,
        Ok(RenewOutcome::Renewed(_))
    ));
    let (second, how) = granted(store.acquire(&acquire("s", "o"), in_time()).await);
    assert_eq!(how, Acquisition::Reacquired);
    app.db.age("s", 1_000).await;
    let (third, how) = granted(store.acquire(&acquire("s", "p"), in_time()).await);
    assert_eq!(how, Acquisition::TakenOver);
    let release_it = release("s", "p", Fence::new(third).ok());
    assert!(matches!(
        store.release(&release_it, in_time()).await,
        Ok(ReleaseOutcome::Released { .. })
    ));
    assert_eq!(
        history_of(store, "s").await,
        [
            (third, Some(RecordedEnd::Released), 0),
            (second, Some(RecordedEnd::TakenOver), 0),
            (first, Some(RecordedEnd::Released), 1),
        ]
    );

    let delayed = AcquireRequest {
        lock_delay: LockDelay::new(60_000).unwrap(),
        ..acquire("d", "o")
    };
    granted(store.acquire(&delayed, in_time()).await);
    app.db.age("d", 1_000).await;
    held(store.acquire(&acquire("d", "p"), in_time()).await);
    let (_, how) = granted(store.acquire(&acquire("d", "o"), in_time()).await);
    assert_eq!(how, Acquisition::TakenOver);

    let quota = |max| AcquireRequest {
        lock_delay: LockDelay::new(60_000).unwrap(),
        ..acquire_with_token("q", "t", Some(max))
    };
    let (before, _) = granted(store.acquire(&quota(5), in_time()).await);
    let (after, how) = granted(store.acquire(&quota(5), in_time()).await);
    assert_eq!(how, Acquisition::Reacquired);
    assert_eq!(
        history_of(store, "q").await,
        [(after, None, 0), (before, Some(RecordedEnd::Released), 0)]
    );
    app.db.age("q", 1_000).await;
    let other = AcquireRequest {
        owner: Owner::parse("other").unwrap(),
        ..acquire_with_token("q", "t2", Some(5))
    };
    held(store.acquire(&other, in_time()).await);
}

/// A grant is stamped with the store's clock after the row lock it waited for, not at the start of
/// its transaction (docs/design/0002-database-clock.md): B's acquisition starts, waits for the row
/// lock of A's expired lease (a live one of another owner is refused without a lock), which another
/// session holds, deletes and commits at `t1`; B's lease then starts no earlier than `t1`, so
/// commit order and store time agree and the two leases do not overlap. Both paths: the group
/// commit (`fencelock_apply`) and a quota acquisition, which is decided alone
/// (`fencelock_acquire`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_waited_for_a_row_lock_is_stamped_after_it() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    let requests = [
        acquire("plain", "b"),
        acquire_with_token("quota", "t", Some(5)),
    ];
    for request in requests {
        let resource = request.resource.as_str().to_owned();
        granted(app.store.acquire(&acquire(&resource, "a"), in_time()).await);
        let session = crate::helpers::pg_connect(&app.db.url()).await;
        session
            .execute(
                "UPDATE leases SET expires_at = now() - interval '1 second'
                 WHERE resource = $1 AND ended_at IS NULL",
                &[&resource],
            )
            .await
            .unwrap();
        session.batch_execute("BEGIN").await.unwrap();
        let locked = session
            .execute(
                "SELECT 1 FROM leases WHERE resource = $1 AND ended_at IS NULL FOR UPDATE",
                &[&resource],
            )
            .await
            .unwrap();
        assert_eq!(locked, 1);

        let store = app.store.clone();
        let b = tokio::spawn(async move { store.acquire(&request, in_time()).await });
        // B's transaction start (its `now()`), once it waits for the row: the latest, should
        // B's batch have given up waiting and B be retried alone. Read from a session of its
        // own: inside a transaction, pg_stat_activity stays as it was first read.
        let watcher = crate::helpers::pg_connect(&app.db.url()).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let b_started: chrono::DateTime<chrono::Utc> = loop {
            let started: Option<chrono::DateTime<chrono::Utc>> = watcher
                .query_one(
                    "SELECT max(xact_start) FROM pg_stat_activity
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if let Some(started) = started {
                break started;
            }
            assert!(Instant::now() < deadline, "B never waited for the row lock");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };

        session
            .execute("DELETE FROM leases WHERE resource = $1", &[&resource])
            .await
            .unwrap();
        // Read until the clock has passed B's start by a whole millisecond, so that a stamp
        // taken at B's start is told apart from one taken after this commit (it already has,
        // almost always: B was seen waiting above).
        let t1: chrono::DateTime<chrono::Utc> = loop {
            let t1 = session
                .query_one("SELECT date_trunc('milliseconds', clock_timestamp())", &[])
                .await
                .unwrap()
                .get(0);
            if t1 > b_started {
                break t1;
            }
        };
        session.batch_execute("COMMIT").await.unwrap();

        let lease = match b.await.unwrap() {
            Ok(AcquireOutcome::Acquired { lease, how }) => {
                assert_eq!(how, Acquisition::Fresh, "{resource}");
                lease
            }
            other => panic!("{resource}: not granted: {other:?}"),
        };
        assert!(
            lease.acquired_at >= t1,
            "{resource}: acquired at {}, before the lease it waited for ended at {t1}",
            lease.acquired_at
        );
        assert!(
            lease.expires_at - lease.observed_at <= chrono::Duration::seconds(TTL),
            "{resource}: expires {} after it was observed, more than the TTL",
            lease.expires_at - lease.observed_at
        );
    }
}

// Mutual exclusion and quotas through PgBouncer, in transaction and in session pooling.
through_pgbouncer!(
    concurrent_acquisitions_get_distinct_increasing_fences,
    contention_on_one_resource_never_gives_two_holders,
    quotas_hold_under_concurrency,
);
