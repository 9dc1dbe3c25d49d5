//! Misconfiguration is visible, never a silent `503` forever: a store that cannot be used as
//! configured (a login refused, a database that does not exist, a schema that is not
//! fencelock's) answers `503` like an outage, but the log says why at ERROR, with the
//! database's own words, once rather than per request, `/readyz` names the cause, and
//! `fencelock check` exits non-zero with it in one line.

use std::process::Output;

use serde_json::Value;

use crate::helpers::{
    StoreKind, TestDb, admin_url, assert_failed_in_one_line, assert_succeeded, client,
};
use crate::process::{ServerProcess, command};

/// `admin_url` with its login replaced by `user`.
fn as_user(user: &str) -> String {
    let url = admin_url();
    let (scheme, rest) = url.split_once("://").unwrap();
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{user}@{host}")
}

/// `admin_url` naming database `name`.
fn database(name: &str) -> String {
    let url = admin_url();
    let (base, query) = url.split_once('?').unwrap_or((&url, ""));
    let (server, _) = base.rsplit_once('/').unwrap();
    let query = if query.is_empty() {
        String::new()
    } else {
        format!("?{query}")
    };
    format!("{server}/{name}{query}")
}

fn check(url: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    command(Some(url), dir.path())
        .arg("check")
        .output()
        .unwrap()
}

/// The server started on `url` answers `503` to store work, names `cause` in `/readyz` and in
/// one ERROR line, and `fencelock check` fails with `cause` in one line.
pub(crate) async fn misconfiguration_is_named(url: &str, cause: &str) {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(Some(url), dir.path());
    let client = client();
    for i in 0..3 {
        let response = server.acquire(&client, &format!("job:{i}"), "a").await;
        assert_eq!(response.status(), 503);
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["type"], "store-unavailable");
    }
    let ready = client.get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let problem: Value = ready.json().await.unwrap();
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(cause),
        "/readyz names no {cause:?}: {detail}"
    );

    let errors: Vec<String> = server
        .settled_log()
        .await
        .lines()
        .filter(|line| line.contains(r#""level":"ERROR""#))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        errors.len(),
        1,
        "one ERROR line, not one per request: {errors:#?}"
    );
    assert!(errors[0].contains(cause), "{}", errors[0]);

    let line = assert_failed_in_one_line(&check(url), "check");
    assert!(line.contains(cause), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_that_does_not_exist_is_named() {
    misconfiguration_is_named(&as_user("fencelock_no_such_role"), "fencelock_no_such_role").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_does_not_exist_is_named() {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let name = format!("fencelock_missing_{stamp}");
    misconfiguration_is_named(&database(&name), "does not exist").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_another_application_is_named() {
    let db = TestDb::new(StoreKind::Postgres).await;
    db.execute("CREATE TABLE leases (id integer)").await;
    misconfiguration_is_named(&db.url(), "already exists").await;
}

/// On a store that is ready, `fencelock check` says so on stdout and exits `0`; on one that
/// was never migrated, or a SQLite file that does not exist, it fails with the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_passes_only_a_store_ready_to_serve() {
    for kind in [StoreKind::Postgres, StoreKind::Sqlite] {
        let db = TestDb::new(kind).await;
        let unmigrated = check(&db.url());
        assert!(
            !unmigrated.status.success(),
            "{kind:?}: an empty store passed"
        );
        let stderr = String::from_utf8_lossy(&unmigrated.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        if kind == StoreKind::Sqlite {
            // A file that exists but was never migrated, as a database that exists.
            let TestDb::Sqlite { path, .. } = &*db else {
                unreachable!()
            };
            std::fs::write(path, b"").unwrap();
        }
        let line = assert_failed_in_one_line(&check(&db.url()), &format!("{kind:?}"));
        assert!(
            line.contains("the database has no fencelock schema")
                && line.contains("fencelock migrate")
                && !line.contains("db error")
                && !line.contains("error getting"),
            "{kind:?}: {line}"
        );

        migrate(&db.url());
        let ready = check(&db.url());
        let stdout = assert_succeeded(&ready, &format!("{kind:?}"));
        assert!(stdout.starts_with("fencelock check: ok:"), "{stdout}");
        let latest = latest_migration(kind);
        assert!(
            stdout.contains(&format!("schema version {latest}")),
            "{stdout}"
        );
    }
}

/// A store whose applied migration differs from this build's of the same version (one made
/// by a build with another schema) is named as such by `check`, not as one to migrate; the
/// PostgreSQL server refuses it as a misconfiguration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_a_build_with_another_schema_is_named() {
    for kind in [StoreKind::Postgres, StoreKind::Sqlite] {
        let db = TestDb::new(kind).await;
        migrate(&db.url());
        db.execute(
            "UPDATE refinery_schema_history SET checksum = '1', name = 'leases' WHERE version = 1",
        )
        .await;
        let line = assert_failed_in_one_line(&check(&db.url()), &format!("{kind:?}"));
        assert!(
            line.contains("V1__leases where this build has V1__schema")
                && line.contains("another schema")
                && !line.contains("fencelock migrate"),
            "{kind:?}: {line}"
        );
        if kind == StoreKind::Postgres {
            misconfiguration_is_named(&db.url(), "V1__schema").await;
        }
    }
}

/// A fresh PostgreSQL database, migrated by `fencelock migrate`, then changed by `sql`.
async fn migrated_then(sql: &str) -> std::sync::Arc<TestDb> {
    let db = TestDb::new(StoreKind::Postgres).await;
    migrate(&db.url());
    db.execute(sql).await;
    db
}

/// A migration history damaged by hand (a row without its name or checksum) is a store of
/// another schema too: one line, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_migration_history_is_named() {
    let db = migrated_then(
        "UPDATE refinery_schema_history SET checksum = NULL, name = NULL, applied_on = NULL WHERE version = 1",
    )
    .await;
    let line = assert_failed_in_one_line(&check(&db.url()), "damaged");
    assert!(line.contains("another schema"), "{line}");
}

/// A database a newer build migrated: `fencelock migrate` says to run a newer fencelock, as
/// `check` does, and a server answers `503` saying so; neither calls this build's migrations
/// missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_newer_than_the_build_is_named() {
    let db = migrated_then(
        "INSERT INTO refinery_schema_history (version, name, applied_on, checksum) VALUES (99, 'future', '2026-12-01T00:00:00Z', '1')",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let migrated = command(Some(&db.url()), dir.path())
        .arg("migrate")
        .output()
        .unwrap();
    let line = assert_failed_in_one_line(&migrated, "migrate");
    assert!(line.contains("newer than this build knows"), "{line}");
    misconfiguration_is_named(&db.url(), "newer than this build knows").await;
}

/// `fencelock migrate` on `url`, which must succeed.
fn migrate(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let migrated = command(Some(url), dir.path())
        .arg("migrate")
        .output()
        .unwrap();
    assert!(migrated.status.success(), "{migrated:?}");
}

/// The version of the newest migration shipped for `kind`'s store.
fn latest_migration(kind: StoreKind) -> u32 {
    let dir = match kind {
        StoreKind::Postgres => "postgres",
        StoreKind::Sqlite => "sqlite",
    };
    let path = format!("{}/migrations/{dir}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_dir(&path)
        .unwrap()
        .filter_map(|entry| {
            let name = entry.unwrap().file_name().into_string().unwrap();
            name.strip_prefix('V')?.split("__").next()?.parse().ok()
        })
        .max()
        .unwrap_or_else(|| panic!("no migrations in {path}"))
}

/// A stand-in for PgBouncer without `ignore_startup_parameters = options`: every connection
/// is answered, after its startup message, with PgBouncer's own refusal (`08P01`). Returns
/// its address; it serves until the test process ends.
fn refusing_pooler() -> std::net::SocketAddr {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                // The startup message, after an SSLRequest (answered `N`: no TLS) if one
                // comes first.
                loop {
                    let mut head = [0u8; 8];
                    if stream.read_exact(&mut head).is_err() {
                        return;
                    }
                    let length = u32::from_be_bytes(head[..4].try_into().unwrap()) as usize;
                    let mut rest = vec![0u8; length.saturating_sub(8)];
                    if stream.read_exact(&mut rest).is_err() {
                        return;
                    }
                    const SSL_REQUEST: u32 = 80_877_103;
                    if u32::from_be_bytes(head[4..].try_into().unwrap()) == SSL_REQUEST {
                        let _ = stream.write_all(b"N");
                        continue;
                    }
                    break;
                }
                let mut fields = Vec::new();
                for (tag, value) in [
                    (b'S', "FATAL"),
                    (b'V', "FATAL"),
                    (b'C', "08P01"),
                    (b'M', "unsupported startup parameter: options"),
                ] {
                    fields.push(tag);
                    fields.extend_from_slice(value.as_bytes());
                    fields.push(0);
                }
                fields.push(0);
                let mut message = vec![b'E'];
                message.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
                message.extend_from_slice(&fields);
                let _ = stream.write_all(&message);
            });
        }
    });
    address
}

/// PgBouncer's refusal of the `options` startup parameter is a setting to change, not an
/// outage: one ERROR line and `fencelock check` say what to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_that_refuses_startup_options_is_named() {
    let address = refusing_pooler();
    let url = format!("postgres://fencelock@{address}/locks?sslmode=disable");
    misconfiguration_is_named(&url, "--pg-pooling session or --pg-pooling transaction").await;
}

/// A server that accepts connections and then says nothing (a hung PostgreSQL, a black-holed
/// proxy): `fencelock migrate` gives up with one line, and a server starts serving `503`
/// instead of waiting for ever without a word. Returns its address; it holds every
/// connection until the test process ends.
fn silent_server() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.extend(stream.ok());
        }
    });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_never_answers_is_given_up_on() {
    let address = silent_server();
    let url = format!("postgres://fencelock@{address}/locks?sslmode=disable");
    let dir = tempfile::tempdir().unwrap();
    let migrating = tokio::process::Command::from(command(Some(&url), dir.path()))
        .arg("migrate")
        .output();
    let migrated = tokio::time::timeout(std::time::Duration::from_secs(30), migrating)
        .await
        .expect("fencelock migrate still waiting after 30 s")
        .unwrap();
    assert!(!migrated.status.success(), "{migrated:?}");
    let stderr = String::from_utf8_lossy(&migrated.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("fencelock: ") && last.contains("did not complete a connection"),
        "{stderr}"
    );

    // Starts (the start waits for the log line that says it serves), and answers 503.
    let server = crate::process::ServerProcess::start(Some(&url), dir.path());
    let client = crate::helpers::client();
    let ready = client.get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    assert_eq!(server.acquire(&client, "job", "a").await.status(), 503);
}
