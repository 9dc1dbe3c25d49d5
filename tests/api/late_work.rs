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

use crate::helpers::{
    StoreKind, TTL, TestApp, TestDb, assert_problem, client, fence, json_answer, postgres_addr,
};

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

/// An ext4 file system on a loop device (`fsfreeze` needs a block device), unmounted when
/// dropped.
struct LoopDisk {
    image: tempfile::TempDir,
    mount: tempfile::TempDir,
}

impl LoopDisk {
    fn mount() -> Self {
        let image = tempfile::tempdir().unwrap();
        let file = image.path().join("disk.img");
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(64 << 20))
            .unwrap();
        run("mkfs.ext4", &["-q", "-F", file.to_str().unwrap()]);
        let mount = tempfile::tempdir().unwrap();
        let at = mount.path().to_str().unwrap();
        run("mount", &["-o", "loop", file.to_str().unwrap(), at]);
        Self { image, mount }
    }

    fn path(&self) -> &std::path::Path {
        self.mount.path()
    }

    /// Freezes the file system: every write to it blocks in the kernel until the thaw, which
    /// dropping the guard does (also when the test fails half-way).
    fn freeze(&self) -> Frozen<'_> {
        run("fsfreeze", &["--freeze", self.path().to_str().unwrap()]);
        Frozen(self)
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        // Lazy: the server's SQLite thread may still hold the file for a moment.
        let _ = std::process::Command::new("umount")
            .args(["-l", self.path().to_str().unwrap()])
            .status();
        let _ = &self.image;
    }
}

struct Frozen<'a>(&'a LoopDisk);

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        run("fsfreeze", &["--unfreeze", self.0.path().to_str().unwrap()]);
    }
}

fn run(program: &str, args: &[&str]) {
    let status = std::process::Command::new(program)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(status.success(), "{program} {args:?} failed");
}

/// A SQLite lock write whose commit a frozen file system (`fsfreeze`) holds up past its
/// deadline is answered `503`; when the commit lands after the thaw, the write is taken back:
/// a grant, a renewal and a release alike. The acquisitions race as in the reproduction (32
/// at once); the one whose commit was under way, and none of the others, ends up durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_writes_answered_503_on_a_frozen_disk_do_not_take_effect() {
    let disk = LoopDisk::mount();
    let mut settings = Settings::for_store(StoreConfig::Sqlite(disk.path().join("leases.db")));
    settings.bind = "127.0.0.1:0".parse().unwrap();
    settings.store_timeout = STORE_TIMEOUT;
    let app = TestApp::spawn_with(TestDb::new(StoreKind::Sqlite).await, settings).await;
    let renewed = app.acquire_ok("renewed", "a", 600).await;
    let released = app.acquire_ok("released", "a", 600).await;
    let shown = |resource: &'static str| {
        let app = &app;
        async move { app.inspect(resource).await.json::<Value>().await.unwrap() }
    };
    let (renewed_before, released_before) = (shown("renewed").await, shown("released").await);

    let frozen = disk.freeze();
    let resources: Vec<String> = (0..32).map(|i| format!("job:{i}")).collect();
    let answers = futures_util::future::join_all(
        resources
            .iter()
            .map(|resource| tokio::time::timeout(PATIENCE, app.acquire(resource, "a", TTL))),
    )
    .await;
    for answer in answers {
        let answer = answer.expect("answered while the disk is frozen");
        assert_problem(answer, 503, "store-unavailable").await;
    }
    drop(frozen);
    // Requests are served in queue order, and what a late commit wrote is taken back before
    // the next batch: once this one is answered, the late one is dealt with.
    app.acquire_ok("after:0", "b", TTL).await;
    for resource in &resources {
        assert_problem(app.inspect(resource).await, 404, "not-found").await;
        let history = json_answer(client().get(app.url(&format!("/locks/{resource}/history"))));
        let history = history.await;
        assert_eq!(history["leases"], json!([]), "{resource}: {history}");
    }

    let frozen = disk.freeze();
    let renewal = json!({ "owner": "a", "ttl_seconds": 3000, "fence": fence(&renewed) });
    let answer = tokio::time::timeout(PATIENCE, app.renew("renewed", renewal)).await;
    assert_problem(answer.expect("answered"), 503, "store-unavailable").await;
    drop(frozen);
    app.acquire_ok("after:1", "b", TTL).await;
    assert_same_lease(&renewed_before, &shown("renewed").await);

    let frozen = disk.freeze();
    let release = json!({ "owner": "a", "fence": fence(&released) });
    let answer = tokio::time::timeout(PATIENCE, app.release("released", release)).await;
    assert_problem(answer.expect("answered"), 503, "store-unavailable").await;
    drop(frozen);
    app.acquire_ok("after:2", "b", TTL).await;
    assert_same_lease(&released_before, &shown("released").await);
}

/// How long a request may take while the disk is frozen: the store timeout and more.
const PATIENCE: Duration = Duration::from_secs(15);

/// The lease inspected `before` is the one inspected `now`, unchanged: same owner, fence,
/// start and expiry.
fn assert_same_lease(before: &Value, now: &Value) {
    for field in ["owner", "fence", "acquired_at", "expires_at"] {
        assert_eq!(before[field], now[field], "{field}: {before} then {now}");
    }
}
