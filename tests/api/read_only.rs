//! Stores that can be read but not written: a read-only SQLite file, a full disk, a
//! PostgreSQL database that accepts only reads (as a hot standby does). Writes answer `503`
//! (never `500`), `/readyz` answers `503` naming the cause, and the server heals once the
//! store is writable again.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use reqwest::Response;
use serde_json::{Value, json};

use crate::helpers::{StoreKind, TTL, TestApp, TestDb, admin, assert_problem, eventually};
use crate::process::ServerProcess;

async fn assert_refused_write(response: Response) -> Value {
    if response.status() != 503 {
        let status = response.status();
        panic!("{status}: {}", response.text().await.unwrap_or_default());
    }
    assert!(
        response.headers().contains_key("retry-after"),
        "503 without Retry-After"
    );
    assert_problem(response, 503, "store-unavailable").await
}

/// `/readyz` is `503` and its detail contains `cause`.
async fn assert_not_ready(app: &TestApp, cause: &str) {
    let problem = assert_refused_write(app.get("/readyz").await).await;
    let detail = problem["detail"]
        .as_str()
        .unwrap_or_default()
        .to_lowercase();
    assert!(
        detail.contains(cause),
        "readiness detail {detail:?} names no {cause:?}"
    );
}

/// Polls `/readyz` until it answers `200`, for at most 10 s.
async fn await_ready(app: &TestApp) {
    let what = "the server never became ready again";
    eventually(what, Duration::from_secs(10), async || {
        app.get("/readyz").await.status() == 200
    })
    .await;
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).status().unwrap();
    assert!(status.success(), "{program} {args:?} failed");
}

/// Files that the kernel refuses to write, even for root, until dropped.
struct Immutable(Vec<PathBuf>);

impl Immutable {
    fn set(files: &[PathBuf]) -> Self {
        for file in files {
            run("chattr", &["+i", file.to_str().unwrap()]);
        }
        Self(files.to_vec())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        for file in &self.0 {
            let _ = Command::new("chattr")
                .args(["-i", file.to_str().unwrap()])
                .status();
        }
    }
}

/// A SQLite file that cannot be written: a server that opens it answers reads, refuses
/// writes and readiness with `503`, and writes again once the file can be written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_read_only_file_answers_503() {
    let db = TestDb::new(StoreKind::Sqlite).await;
    let writer = TestApp::spawn_on(db.clone(), |_| {}).await;
    writer.acquire_ok("job:1", "a", TTL).await;
    let TestDb::Sqlite { path, .. } = db.as_ref() else {
        unreachable!()
    };
    // The shared-memory index stays writable: SQLite maps it, and a mapped file that turned
    // read-only under a running process would be a crash, not a read-only store.
    let mut wal = path.clone().into_os_string();
    wal.push("-wal");
    let frozen = Immutable::set(&[path.clone(), PathBuf::from(wal)]);

    let reader = TestApp::spawn_on(db.clone(), |_| {}).await;
    assert_eq!(reader.inspect("job:1").await.status(), 200);
    // Writes of the holder `a` and of a fresh resource, and those that would have changed
    // nothing: another owner's acquisition of a held resource, renewal and release.
    for (resource, owner) in [("job:2", "b"), ("job:1", "a"), ("job:1", "b")] {
        assert_refused_write(reader.acquire(resource, owner, TTL).await).await;
        if resource == "job:1" {
            let renewal = json!({ "owner": owner, "ttl_seconds": TTL });
            assert_refused_write(reader.renew(resource, renewal).await).await;
            let release = json!({ "owner": owner });
            assert_refused_write(reader.release(resource, release).await).await;
        }
    }
    assert_not_ready(&reader, "read-only").await;
    // The server that opened the file while it was writable is refused as well.
    assert_refused_write(writer.acquire("job:3", "c", TTL).await).await;
    assert_eq!(writer.get("/readyz").await.status(), 503);

    drop(frozen);
    await_ready(&reader).await;
    reader.acquire_ok("job:2", "b", TTL).await;
    await_ready(&writer).await;
    writer.acquire_ok("job:3", "c", TTL).await;
}

/// A small file system of its own, unmounted when dropped.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                dir.path().to_str().unwrap(),
            ],
        );
        Self(dir)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    /// Writes a file until the file system has no space left.
    fn fill(&self) -> PathBuf {
        use std::io::Write as _;
        let filler = self.path().join("filler");
        let mut file = std::fs::File::create(&filler).unwrap();
        let block = vec![0xA5u8; 64 * 1024];
        while file.write_all(&block).is_ok() {}
        while file.write_all(&block[..512]).is_ok() {}
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: the server's SQLite thread may still hold the file for a moment.
        let _ = Command::new("umount")
            .args(["-l", self.path().to_str().unwrap()])
            .status();
    }
}

/// A SQLite file on a file system mounted read-only, after a clean shutdown (no WAL beside
/// it): the server starts, answers reads, refuses writes and readiness with `503`, and writes
/// again once the file system is writable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_on_a_read_only_file_system_serves_reads() {
    let disk = Tmpfs::mount("16m");
    let file = disk.path().join("fencelock.db");
    let settings = || {
        let mut settings = fencelock_server::Settings::for_store(
            fencelock_server::StoreConfig::Sqlite(file.clone()),
        );
        settings.bind = "127.0.0.1:0".parse().unwrap();
        settings
    };
    let writer = TestApp::spawn_with(TestDb::new(StoreKind::Sqlite).await, settings()).await;
    let fence = writer.acquire_ok("job:1", "a", 600).await["fence"].clone();
    drop(writer);
    let mut wal = file.clone().into_os_string();
    wal.push("-wal");
    let wal = PathBuf::from(wal);
    eventually(
        "the stopped server's WAL is gone",
        Duration::from_secs(10),
        async || !wal.exists(),
    )
    .await;
    let mount_point = disk.path().to_str().unwrap();
    run("mount", &["-o", "remount,ro", mount_point]);

    let reader = TestApp::spawn_with(TestDb::new(StoreKind::Sqlite).await, settings()).await;
    let lease = reader.inspect("job:1").await;
    assert_eq!(lease.status(), 200);
    assert_eq!(lease.json::<Value>().await.unwrap()["fence"], fence);
    assert_refused_write(reader.acquire("job:2", "b", TTL).await).await;
    assert_not_ready(&reader, "read-only").await;

    run("mount", &["-o", "remount,rw", mount_point]);
    await_ready(&reader).await;
    reader.acquire_ok("job:2", "b", TTL).await;
    assert_eq!(reader.inspect("job:1").await.status(), 200);
}

/// A full disk: writes and readiness answer `503` naming it, and both recover when space
/// is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_full_disk_answers_503() {
    let disk = Tmpfs::mount("2m");
    let file = disk.path().join("fencelock.db");
    let mut settings =
        fencelock_server::Settings::for_store(fencelock_server::StoreConfig::Sqlite(file.clone()));
    settings.bind = "127.0.0.1:0".parse().unwrap();
    let app = TestApp::spawn_with(TestDb::new(StoreKind::Sqlite).await, settings).await;
    app.acquire_ok("job:0", "a", TTL).await;

    let filler = disk.fill();
    let mut refused = None;
    for i in 1..=200 {
        let response = app.acquire(&format!("job:{i}"), "a", TTL).await;
        match response.status().as_u16() {
            200 => continue,
            _ => {
                refused = Some(response);
                break;
            }
        }
    }
    let refused = refused.expect("200 acquisitions fitted on a full disk");
    assert_refused_write(refused).await;
    assert_not_ready(&app, "full").await;

    std::fs::remove_file(filler).unwrap();
    await_ready(&app).await;
    app.acquire_ok("job:after", "a", TTL).await;
}

/// A PostgreSQL database that accepts only reads (`default_transaction_read_only`, which is
/// what a hot standby looks like to a client): every write and `/readyz` answer `503` with
/// the cause, the log says so in one ERROR line, and the server heals once writes are
/// accepted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_read_only_database_answers_503() {
    let db = TestDb::new(StoreKind::Postgres).await;
    let TestDb::Postgres { name, .. } = db.as_ref() else {
        unreachable!()
    };
    {
        let migrated = TestApp::spawn_on(db.clone(), |_| {}).await;
        migrated.acquire_ok("job:1", "a", TTL).await;
    }
    let admin = admin().await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} SET default_transaction_read_only = on"
        ))
        .await
        .unwrap();

    let app = TestApp::spawn_on(db.clone(), |_| {}).await;
    assert_refused_write(app.acquire("job:2", "b", TTL).await).await;
    assert_refused_write(
        app.renew("job:1", json!({ "owner": "a", "ttl_seconds": TTL }))
            .await,
    )
    .await;
    assert_refused_write(app.release("job:1", json!({ "owner": "a" })).await).await;
    assert_not_ready(&app, "read").await;

    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(Some(&db.url()), dir.path());
    let client = crate::helpers::client();
    for i in 0..5 {
        let response = server.acquire(&client, &format!("job:{i}"), "b").await;
        assert_eq!(response.status(), 503);
    }
    assert_eq!(
        client
            .get(server.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        503
    );
    let errors = server
        .settled_log()
        .await
        .lines()
        .filter(|line| line.contains(r#""level":"ERROR""#))
        .count();
    assert_eq!(errors, 1, "{}", server.log_text());

    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} RESET default_transaction_read_only;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = '{name}' AND pid <> pg_backend_pid();"
        ))
        .await
        .unwrap();
    await_ready(&app).await;
    app.acquire_ok("job:2", "b", TTL).await;
}
