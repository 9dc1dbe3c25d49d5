//! Worker client (`fencelock::client`) against the real server: errors that tell contention,
//! outage and loss apart; bounded retries; a `Lease` that renews itself and reports its loss
//! in time. One store (SQLite) is enough: the client sees only HTTP.
//!
//! Timing assertions use TTLs of seconds and margins of hundreds of milliseconds or more, and
//! every wait is bounded, so a slow machine fails loudly instead of hanging.

use std::time::{Duration, Instant};

use fencelock::client::{Client, Error, Lease, LossReason, RetryPolicy};
use fencelock_server::Settings;
use fencelock_server::StoreConfig;
use fencelock_testkit::{Proxy, closed_port, eventually};

use crate::helpers::{StoreKind, TestApp, TestDb};

/// A TTL no lease outlives by itself during a test.
const LONG: Duration = Duration::from_secs(60);

/// The longest any test waits for a lease to be reported lost before failing.
const PATIENCE: Duration = Duration::from_secs(10);

fn client_at(address: &str) -> Client {
    Client::builder(address)
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client builds")
}

fn client(app: &TestApp) -> Client {
    client_at(&app.address)
}

/// A server on SQLite and a client for it. The server stops when the `TestApp` is dropped,
/// so a test that does not use it keeps it bound (`_server`) to the end.
async fn sqlite_app() -> (TestApp, Client) {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    let client = client(&app);
    (app, client)
}

/// [`sqlite_app`], with a lease on `job:1` for `ttl` taken by the client.
async fn sqlite_app_leased(ttl: Duration) -> (TestApp, Client, Lease) {
    let (app, client) = sqlite_app().await;
    let lease = client.lease("job:1", ttl).await.expect("leased");
    (app, client, lease)
}

/// Releases `lease` after `delay`, as a worker that finishes its work then would; the
/// release's result arrives on the returned task.
fn release_after(lease: Lease, delay: Duration) -> tokio::task::JoinHandle<Result<(), Error>> {
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        lease.release().await
    })
}

/// Retries quick enough for a test: from 20 ms, doubling up to 200 ms, until `deadline`.
fn quick_retries(deadline: Duration) -> RetryPolicy {
    RetryPolicy {
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        deadline,
    }
}

/// The reason of a `LeaseLost` error; anything else fails the test.
fn loss<T: std::fmt::Debug>(result: Result<T, Error>) -> LossReason {
    match result {
        Err(Error::LeaseLost { reason }) => reason,
        other => panic!("expected LeaseLost, got {other:?}"),
    }
}

/// Waits for `lease` to be reported lost, failing the test after [`PATIENCE`].
async fn lost_within_patience(lease: &Lease) -> LossReason {
    tokio::time::timeout(PATIENCE, lease.lost())
        .await
        .unwrap_or_else(|_| panic!("lease not reported lost within {PATIENCE:?}: {lease:?}"))
}

/// Contention, outage, loss and a caller bug are four different errors: `Held`,
/// `Unavailable`, `LeaseLost` and `Rejected`; only the first two are worth retrying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_outage_and_loss_are_told_apart() {
    let (app, client) = sqlite_app().await;
    let first = client.acquire("job:1", "a", LONG).await.expect("acquired");

    let held = client.acquire("job:1", "b", LONG).await.unwrap_err();
    assert!(
        matches!(&held, Error::Held { resource } if resource == "job:1"),
        "{held:?}"
    );
    assert!(held.is_retryable());

    let nobody = client_at(&format!("http://127.0.0.1:{}", closed_port()));
    let outage = nobody.acquire("job:1", "a", LONG).await.unwrap_err();
    assert!(matches!(outage, Error::Unavailable(_)), "{outage:?}");
    assert!(outage.is_retryable());

    app.db.age("job:1", 1).await;
    let second = client
        .acquire("job:1", "b", LONG)
        .await
        .expect("taken over");
    assert!(second.fence > first.fence);
    let lost = client
        .renew("job:1", "a", LONG, Some(first.fence))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &lost,
            Error::LeaseLost {
                reason: LossReason::OwnerMismatch
            }
        ),
        "{lost:?}"
    );
    assert!(!lost.is_retryable());

    let bug = client
        .acquire("job:2", "a", Duration::ZERO)
        .await
        .unwrap_err();
    match &bug {
        Error::Rejected { status, problem } => {
            assert_eq!(*status, 422);
            assert_eq!(problem["type"], "validation-failed", "{problem}");
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    assert!(!bug.is_retryable());
}

/// A server that runs but cannot reach its store answers `503`: the client reports
/// `Unavailable`, never `Held` ("unknown" is not "someone else has it").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_its_store_is_unavailable_not_held() {
    let url = format!("postgres://postgres@127.0.0.1:{}/fencelock", closed_port());
    let mut settings = Settings::for_store(StoreConfig::from_url(Some(&url)).expect("URL"));
    settings.bind = "127.0.0.1:0".parse().expect("address");
    // The app needs some TestDb to own; this one is never used.
    let app = TestApp::spawn_with(TestDb::new(StoreKind::Sqlite).await, settings).await;
    let client = client(&app);

    let error = client.acquire("job:1", "a", LONG).await.unwrap_err();
    assert!(matches!(error, Error::Unavailable(_)), "{error:?}");
    let error = client.renew("job:1", "a", LONG, None).await.unwrap_err();
    assert!(matches!(error, Error::Unavailable(_)), "{error:?}");
    let error = client.inspect("job:1").await.unwrap_err();
    assert!(matches!(error, Error::Unavailable(_)), "{error:?}");
}

/// Every refusal of renew and release is `LeaseLost`, with the reason the server gave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_say_why_the_lease_is_lost() {
    let (app, client) = sqlite_app().await;
    let never = client.renew("never", "a", LONG, None).await;
    assert_eq!(loss(never), LossReason::NotFound);

    let old = client.acquire("job:1", "a", LONG).await.expect("acquired");
    let new = client
        .acquire("job:1", "a", LONG)
        .await
        .expect("re-acquired");
    let stale = client.renew("job:1", "a", LONG, Some(old.fence)).await;
    let current_fence = Some(new.fence);
    assert_eq!(loss(stale), LossReason::StaleFence { current_fence });
    let other = client.release("job:1", "b", None).await;
    assert_eq!(loss(other), LossReason::OwnerMismatch);

    app.db.age("job:1", 1).await;
    let expired = client.renew("job:1", "a", LONG, Some(new.fence)).await;
    assert_eq!(loss(expired), LossReason::Expired);
    let gone = client.release("job:1", "a", Some(new.fence)).await;
    assert_eq!(loss(gone), LossReason::NotFound);
}

/// Inspect shows the live lease (without owner) or `None`; a name with characters outside
/// the contract's set reaches the server as one name (and is refused with `422`), never as
/// another path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_names_that_need_encoding() {
    let (_server, client) = sqlite_app().await;
    assert_eq!(client.inspect("job:1").await.expect("inspect"), None);
    let lock = client.acquire("job:1", "a", LONG).await.expect("acquired");
    let view = client
        .inspect("job:1")
        .await
        .expect("inspect")
        .expect("live");
    assert_eq!((view.resource.as_str(), view.fence), ("job:1", lock.fence));

    for bad in ["job/1", "job 1", "jöb", "job%2F1", ""] {
        let error = client.acquire(bad, "a", LONG).await.unwrap_err();
        assert!(
            matches!(error, Error::Rejected { status: 422, .. }),
            "{bad:?}: {error:?}"
        );
    }
    let error = client.renew("..", "a", LONG, None).await.unwrap_err();
    assert!(matches!(error, Error::InvalidInput(_)), "{error:?}");
}

/// The retry helper waits out contention: the holder releases during the retries, and the
/// waiting caller gets the lock with a greater fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_waits_for_the_holder_to_release() {
    let (_server, client) = sqlite_app().await;
    let held = client
        .acquire("job:1", "holder", LONG)
        .await
        .expect("acquired");
    let holder = client.clone();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        holder.release("job:1", "holder", Some(held.fence)).await
    });

    let policy = quick_retries(Duration::from_secs(10));
    let started = Instant::now();
    let lock = client
        .acquire_with_retry("job:1", "waiter", LONG, &policy)
        .await
        .expect("acquired after the release");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(lock.owner, "waiter");
    assert!(lock.fence > held.fence);
    release.await.expect("task").expect("holder released");
}

/// Retries are bounded: against a lock held for a minute, the helper returns `Held` at its
/// deadline, not later; a caller bug is not retried at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_gives_up_at_its_deadline() {
    let (_server, client) = sqlite_app().await;
    client
        .acquire("job:1", "holder", LONG)
        .await
        .expect("acquired");

    let policy = quick_retries(Duration::from_secs(1));
    let started = Instant::now();
    let error = client
        .acquire_with_retry("job:1", "waiter", LONG, &policy)
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert!(matches!(error, Error::Held { .. }), "{error:?}");
    assert!(elapsed >= policy.deadline, "{elapsed:?}");
    assert!(
        elapsed < policy.deadline + Duration::from_secs(2),
        "{elapsed:?}"
    );

    let started = Instant::now();
    let slow = RetryPolicy {
        deadline: LONG,
        ..policy
    };
    let error = client
        .acquire_with_retry("job:2", "waiter", Duration::ZERO, &slow)
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::Rejected { status: 422, .. }),
        "{error:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2), "retried a 422");
}

/// A `Lease` with a 2 s TTL is kept for 3.5 TTLs by its background renewals: held the whole
/// time, same fence, and the server shows it live with that fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_renews_through_several_ttls() {
    let ttl = Duration::from_secs(2);
    let (_server, client, lease) = sqlite_app_leased(ttl).await;
    let fence = lease.fence();
    assert_eq!(lease.resource(), "job:1");

    let until = Instant::now() + ttl * 7 / 2;
    while Instant::now() < until {
        assert!(lease.is_held(), "lease lapsed: {lease:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(lease.fence(), fence);
    let view = client
        .inspect("job:1")
        .await
        .expect("inspect")
        .expect("live");
    assert_eq!(view.fence, fence);
    assert!(view.expires_in_ms > 0);
    // Without renewals the lease would have expired 1.5 TTLs ago: it is live only because
    // they worked. Someone else still cannot have it.
    let error = client.acquire("job:1", "other", LONG).await.unwrap_err();
    assert!(matches!(error, Error::Held { .. }), "{error:?}");
    lease.release().await.expect("released");
}

/// A renewal refused by the server (the lease expired and another owner took it) is
/// reported at the next renewal, within one renewal interval (a third of the TTL) — not at
/// the lease's own expiry — to the lease and to its watchers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_renewal_is_reported_promptly() {
    let ttl = Duration::from_secs(3);
    let (app, client, lease) = sqlite_app_leased(ttl).await;
    let watch = lease.watch();
    let watcher = tokio::spawn(async move { watch.lost().await });

    app.db.age("job:1", 1).await;
    let other = client
        .acquire("job:1", "other", LONG)
        .await
        .expect("taken over");
    let taken = Instant::now();
    let reason = lost_within_patience(&lease).await;
    let elapsed = taken.elapsed();

    assert!(other.fence > lease.fence());
    assert!(
        matches!(reason, LossReason::OwnerMismatch | LossReason::Expired),
        "{reason:?}"
    );
    assert!(
        elapsed < ttl / 3 + Duration::from_millis(700),
        "{elapsed:?}"
    );
    assert!(!lease.is_held());
    assert_eq!(watcher.await.expect("watcher"), reason);
}

/// With its renewals blocked (the server is gone), a 3 s lease is reported lost before
/// those 3 s have passed — before the server would let anyone else acquire — but not
/// absurdly early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_renewals_are_reported_lost_before_expiry() {
    let (app, client) = sqlite_app().await;
    let ttl = Duration::from_secs(3);
    let t0 = Instant::now();
    let lease = client.lease("job:1", ttl).await.expect("leased");
    drop(app); // stops the server: every renewal fails to connect

    let reason = lost_within_patience(&lease).await;
    let at = Instant::now();
    assert!(at < t0 + ttl, "reported {:?} after t0", at - t0);
    assert!(
        at > t0 + Duration::from_secs(1),
        "reported {:?} after t0",
        at - t0
    );
    assert!(
        matches!(&reason, LossReason::Unconfirmed { last_error } if last_error.contains("unavailable")),
        "{reason:?}"
    );
    assert!(!lease.is_held());
    assert_eq!(lease.remaining(), Duration::ZERO);
}

/// `release()` frees the resource at once; dropping a `Lease` releases it in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_and_drop_free_the_resource() {
    let (_server, client, lease) = sqlite_app_leased(LONG).await;
    let watch = lease.watch();
    lease.release().await.expect("released");
    assert_eq!(client.inspect("job:1").await.expect("inspect"), None);
    assert_eq!(watch.lost().await, LossReason::Released);
    assert!(!watch.is_held());

    let lease = client.lease("job:2", LONG).await.expect("leased");
    let held = client.lease("job:2", LONG).await.unwrap_err();
    assert!(matches!(held, Error::Held { .. }), "{held:?}");
    drop(lease);
    eventually("dropped lease still held", PATIENCE, async || {
        client.inspect("job:2").await.expect("inspect").is_none()
    })
    .await;
}

/// How long a release that meets an outage is watched to go on trying: without retries it
/// would have failed at once (a refused connection takes microseconds).
const STILL_TRYING: Duration = Duration::from_millis(500);

/// A lease on `job:1` of a SQLite server, taken through a [`Proxy`] that then cuts every
/// connection; its release, begun then, is still trying after [`STILL_TRYING`]. `thaw`
/// lets it through, and gives its result.
struct ReleaseInAnOutage {
    app: TestApp,
    proxy: Proxy,
    release: tokio::task::JoinHandle<Result<(), Error>>,
}

impl ReleaseInAnOutage {
    async fn begin() -> Self {
        let app = TestApp::spawn(StoreKind::Sqlite).await;
        let proxy = Proxy::start(app.socket_address());
        let through = client_at(&format!("http://{}", proxy.addr()));
        let lease = through.lease("job:1", LONG).await.expect("leased");
        proxy.cut();
        let mut release = tokio::spawn(lease.release());
        let early = tokio::time::timeout(STILL_TRYING, &mut release).await;
        assert!(early.is_err(), "the release gave up at once: {early:?}");
        Self {
            app,
            proxy,
            release,
        }
    }

    async fn thaw(self) -> (TestApp, Result<(), Error>) {
        self.proxy.thaw();
        let released = tokio::time::timeout(PATIENCE, self.release)
            .await
            .expect("answered once the server is back")
            .expect("the release task");
        (self.app, released)
    }
}

/// A release that cannot reach the server is retried while the lease lasts: the next holder
/// need not wait out the TTL for one lost connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_retried_through_an_outage() {
    let (app, released) = ReleaseInAnOutage::begin().await.thaw().await;
    released.expect("released");
    assert_eq!(client(&app).inspect("job:1").await.expect("inspect"), None);
}

/// A retried release that finds the lease gone (`404`) has done its job: an earlier attempt
/// whose answer was lost may have released it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_release_that_finds_the_lease_gone_succeeds() {
    let outage = ReleaseInAnOutage::begin().await;
    outage
        .app
        .db
        .execute("DELETE FROM leases WHERE resource = 'job:1'")
        .await;
    let (_app, released) = outage.thaw().await;
    released.expect("a lease found gone counts as released");
}

/// A release is tried once when its first attempt is refused: `404` then means the lease
/// was lost, which the caller must hear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refused_at_once_is_reported() {
    let (app, _client, lease) = sqlite_app_leased(LONG).await;
    app.db
        .execute("DELETE FROM leases WHERE resource = 'job:1'")
        .await;
    assert_eq!(loss(lease.release().await), LossReason::NotFound);
}

/// `lease_with_retry` waits for a `Lease` of another worker to be released, and gets a
/// greater fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_with_retry_waits_for_another_lease() {
    let (_server, client, first) = sqlite_app_leased(LONG).await;
    let first_fence = first.fence();
    let releaser = release_after(first, Duration::from_millis(300));
    let policy = quick_retries(Duration::from_secs(10));
    let second = client
        .lease_with_retry("job:1", LONG, &policy)
        .await
        .expect("leased after the release");
    assert!(second.fence() > first_fence);
    assert!(second.is_held());
    releaser.await.expect("task").expect("first released");
    second.release().await.expect("released");
}

/// `lock` without a wait is one attempt: a held resource is `Held` at once (no retries, no
/// `wait_ms` sent, so a server without waiting serves it); a free one is a `Lease`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_without_waiting_is_one_attempt() {
    let (_server, client) = sqlite_app().await;
    let holder = client
        .lock("job:1", LONG, Duration::ZERO)
        .await
        .expect("locked");
    assert!(holder.is_held());
    let started = Instant::now();
    let held = client
        .lock("job:1", LONG, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(held, Error::Held { .. }), "{held:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    holder.release().await.expect("released");
}

/// `lock` with a wait lets the server wait (API.md, *Waiting*): the holder releases after
/// about a second, and the waiter gets the lease with a greater fence from one request,
/// held for its whole TTL from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_waits_on_the_server_for_a_release() {
    let (_server, client, holder) = sqlite_app_leased(LONG).await;
    let held_fence = holder.fence();
    let releaser = release_after(holder, Duration::from_secs(1));
    let started = Instant::now();
    let lease = client
        .lock("job:1", LONG, Duration::from_secs(5))
        .await
        .expect("locked after the release");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert!(lease.fence() > held_fence);
    // The waited time does not eat into the lease: nearly all of its 60 s are left.
    assert!(
        lease.remaining() > LONG - Duration::from_secs(10),
        "{lease:?}"
    );
    releaser.await.expect("task").expect("holder released");
    lease.release().await.expect("released");
}

/// Sets its flag when dropped: tells that a future was cancelled.
struct DropFlag(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// `Lease::run`: when the lease is lost (taken over, so the next renewal is refused), the
/// work is cancelled (dropped) within about a renewal interval and the result is
/// `LeaseLost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_cancels_the_work_when_the_lease_is_lost() {
    let (app, client) = sqlite_app().await;
    let ttl = Duration::from_secs(3);
    let lease = client
        .lock("job:1", ttl, Duration::ZERO)
        .await
        .expect("locked");
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = DropFlag(dropped.clone());
    let work = async move {
        let _flag = flag;
        std::future::pending::<()>().await
    };
    app.db.age("job:1", 1).await;
    client
        .acquire("job:1", "thief", LONG)
        .await
        .expect("taken over");
    let taken = Instant::now();

    let result = tokio::time::timeout(PATIENCE, lease.run(work))
        .await
        .expect("the work was not cancelled in time");
    let reason = loss(result);
    assert!(
        matches!(reason, LossReason::OwnerMismatch | LossReason::Expired),
        "{reason:?}"
    );
    assert!(
        dropped.load(std::sync::atomic::Ordering::SeqCst),
        "the work was not dropped"
    );
    // Reported at the next renewal (a third of the TTL), well before PATIENCE.
    assert!(
        taken.elapsed() < ttl / 3 + Duration::from_secs(2),
        "{:?}",
        taken.elapsed()
    );
}

/// `with_lock` hands the work the lease (held, with its fence), returns the work's output,
/// and releases the lease afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_returns_the_output_and_releases() {
    let (_server, client) = sqlite_app().await;
    let inner = client.clone();
    let (fence, live_fence) = client
        .with_lock("job:1", LONG, Duration::ZERO, |lease| async move {
            assert!(lease.is_held());
            let live = inner
                .inspect("job:1")
                .await
                .expect("inspect")
                .expect("live");
            (lease.fence(), live.fence)
        })
        .await
        .expect("the work ran");
    assert_eq!(fence, live_fence);
    assert_eq!(client.inspect("job:1").await.expect("inspect"), None);
}

/// A stand-in for a server that waits: it takes one request, answers it after `delay` with
/// a lease granted after `waited_ms`, and hands back the request's text.
async fn one_waited_answer(
    delay: Duration,
    waited_ms: u64,
) -> (String, tokio::task::JoinHandle<String>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut buffer = [0u8; 4096];
        // The head, then as many body bytes as it announces.
        loop {
            let read = socket.read(&mut buffer).await.unwrap();
            assert!(read > 0, "the request ended early");
            request.extend_from_slice(&buffer[..read]);
            let text = String::from_utf8_lossy(&request).to_lowercase();
            if let Some(end) = text.find("\r\n\r\n") {
                let length: usize = text
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if request.len() >= end + 4 + length {
                    break;
                }
            }
        }
        tokio::time::sleep(delay).await;
        let body = format!(
            r#"{{"acquired":true,"waited_ms":{waited_ms},"lock":{{"resource":"job:1","owner":"o","fence":9,"acquired_at":"2026-11-30T01:02:03.456Z","expires_at":"2026-11-30T01:03:03.456Z","expires_in_ms":60000}}}}"#
        );
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(answer.as_bytes()).await.unwrap();
        String::from_utf8_lossy(&request).into_owned()
    });
    (address, task)
}

/// A waiting `lock` sends `wait_ms`, allows the request its wait beyond the client's own
/// timeout (here 1 s, with an answer after 1.5 s), and counts the lease's time from the end
/// of the server's wait: with `waited_ms` 1500 and 60 s granted, about 59 s are left, where
/// counting from the request's start would leave 57.5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_lock_outlasts_the_client_timeout() {
    let (address, server) = one_waited_answer(Duration::from_millis(1500), 1500).await;
    let client = Client::builder(&address)
        .no_proxy()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let lease = client
        .lock("job:1", LONG, Duration::from_secs(3))
        .await
        .expect("the answer after 1.5 s is read");
    let request = server.await.unwrap();
    assert!(request.contains(r#""wait_ms":3000"#), "{request}");
    assert_eq!(lease.fence(), 9);
    // 0.5 s of margin on either side for a busy machine.
    assert!(lease.remaining() > Duration::from_secs(58), "{lease:?}");
}
