//! Bearer tokens (API.md, *Authentication and scopes*): `401` before anything else, then the
//! input rules, then the token's scope (`403 forbidden-scope`), then its quota (`429`, kept by
//! the store across instances); reload on SIGHUP; safe by default without an auth file.

use std::sync::Arc;
use std::time::Duration;

use fencelock_server::auth_file::Auth;
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{
    StoreKind, TTL, TestApp, assert_failed_in_one_line, assert_problem, client, eventually,
    token_entry,
};
use crate::process::{ServerProcess, run};

const BILLING: &str = "billing-secret-0123456789";
const READER: &str = "reader-secret-0123456789";

/// The acceptance scenario's file: a billing token (lock and read on `billing:`, at most two
/// live leases) and a read-only token for everything.
fn auth_file() -> String {
    [
        token_entry("billing-workers", BILLING, &["billing:"], &["lock", "read"]),
        "max_leases = 2\n".to_owned(),
        token_entry("dashboards", READER, &[""], &["read"]),
    ]
    .concat()
}

async fn spawn(kind: StoreKind) -> (TestApp, tempfile::TempDir) {
    TestApp::spawn_with_auth(kind, &auth_file()).await
}

fn owner_body() -> Value {
    json!({ "owner": "o", "ttl_seconds": TTL })
}

/// Every lock operation, with a valid body.
fn lock_operations() -> Vec<(Method, &'static str, Option<Value>)> {
    vec![
        (Method::POST, "/locks/billing:x", Some(owner_body())),
        (Method::GET, "/locks/billing:x", None),
        (
            Method::DELETE,
            "/locks/billing:x",
            Some(json!({ "owner": "o" })),
        ),
        (
            Method::POST,
            "/locks/billing:x/release",
            Some(json!({ "owner": "o" })),
        ),
        (Method::POST, "/locks/billing:x/renew", Some(owner_body())),
        (Method::GET, "/locks/billing:x/watch", None),
    ]
}

async fn assert_unauthorized(response: reqwest::Response, case: &str) {
    assert_eq!(
        response
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_owned()),
        Some("Bearer".to_owned()),
        "{case}"
    );
    let problem = assert_problem(response, 401, "unauthorized").await;
    let text = problem.to_string();
    assert!(
        !text.contains(BILLING) && !text.contains("wrong-secret"),
        "{text}"
    );
}

/// No token, or an unknown one: `401` on every lock operation; health, readiness, metrics
/// and the document need none.
async fn no_or_unknown_token_is_401_on_every_lock_operation(kind: StoreKind) {
    let (app, _dir) = spawn(kind).await;
    for (method, path, body) in lock_operations() {
        let response = app.send_as(None, method.clone(), path, body.as_ref()).await;
        assert_unauthorized(response, &format!("{method} {path} without a token")).await;
        let response = app
            .send_as(Some("wrong-secret"), method.clone(), path, body.as_ref())
            .await;
        assert_unauthorized(response, &format!("{method} {path} with an unknown token")).await;
    }
    // Not a bearer scheme at all.
    let response = app
        .client
        .get(app.url("/locks/billing:x"))
        .basic_auth("billing", Some(BILLING))
        .send()
        .await
        .unwrap();
    assert_unauthorized(response, "basic auth").await;
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        assert_eq!(app.get(path).await.status(), 200, "{path}");
    }
    let metrics = app.metrics().await;
    assert!(metrics.value("fencelock_auth_failures_total", &[("reason", "missing")]) >= 5.0);
    assert!(metrics.value("fencelock_auth_failures_total", &[("reason", "unknown")]) >= 5.0);
    assert!(
        metrics
            .label_values()
            .all(|v| !v.contains("billing") && !v.contains("dashboards")),
        "no token names as labels"
    );
}

/// The `401` comes before the input rules: a bad body, a wrong media type, broken JSON and a
/// bad resource name all get `401` without a token.
async fn unauthorized_comes_before_the_input_rules(kind: StoreKind) {
    let (app, _dir) = spawn(kind).await;
    let bad = json!({ "owner": "", "ttl_seconds": 0 });
    let response = app
        .send_as(None, Method::POST, "/locks/billing:x", Some(&bad))
        .await;
    assert_unauthorized(response, "422 body").await;
    let response = app
        .send(Method::POST, "/locks/billing:x", Some("text/plain"), "x")
        .await;
    assert_unauthorized(response, "415").await;
    let response = app.json_text(Method::POST, "/locks/billing:x", "{").await;
    assert_unauthorized(response, "400").await;
    let response = app
        .send(
            Method::POST,
            "/locks/billing:x",
            Some("application/json"),
            vec![b' '; 64 * 1024],
        )
        .await;
    assert_unauthorized(response, "413").await;
    let response = app.get("/locks/bad%20name").await;
    assert_unauthorized(response, "422 name").await;
    // With a token, the input rules come before its scope: 422 for report:x, not 403.
    let response = app
        .send_as(Some(BILLING), Method::POST, "/locks/report:x", Some(&bad))
        .await;
    assert_problem(response, 422, "validation-failed").await;
}

/// The billing token locks and reads inside `billing:` only; the read-only token reads
/// anything and locks nothing.
async fn tokens_keep_to_their_prefixes_and_permissions(kind: StoreKind) {
    let (app, _dir) = spawn(kind).await;
    let response = app.acquire_as(Some(BILLING), "billing:x", "o", TTL).await;
    assert_eq!(response.status(), 200);
    let lock: Value = response.json().await.unwrap();
    assert_eq!(lock["acquired"], json!(true));

    let response = app.acquire_as(Some(BILLING), "report:x", "o", TTL).await;
    let problem = assert_problem(response, 403, "forbidden-scope").await;
    assert!(!problem.to_string().contains(BILLING));
    let response = app
        .send_as(Some(BILLING), Method::GET, "/locks/report:x", None)
        .await;
    assert_problem(response, 403, "forbidden-scope").await;

    // The reader sees the lease, without its owner, but cannot lock.
    let response = app
        .send_as(Some(READER), Method::GET, "/locks/billing:x", None)
        .await;
    assert_eq!(response.status(), 200);
    let seen: Value = response.json().await.unwrap();
    assert_eq!(seen["fence"], lock["lock"]["fence"]);
    assert!(seen.get("owner").is_none());
    // Watching is reading.
    let response = app
        .send_as(Some(READER), Method::GET, "/locks/billing:x/watch", None)
        .await;
    assert_eq!(response.status(), 200);
    let response = app
        .send_as(Some(BILLING), Method::GET, "/locks/report:x/watch", None)
        .await;
    assert_problem(response, 403, "forbidden-scope").await;
    let response = app.acquire_as(Some(READER), "billing:y", "o", TTL).await;
    assert_problem(response, 403, "forbidden-scope").await;
    for (method, path, body) in lock_operations()
        .into_iter()
        .filter(|(m, _, _)| *m != Method::GET)
    {
        let response = app.send_as(Some(READER), method, path, body.as_ref()).await;
        assert_problem(response, 403, "forbidden-scope").await;
    }
    // The billing token renews and releases its own lease.
    let response = app
        .send_as(
            Some(BILLING),
            Method::POST,
            "/locks/billing:x/renew",
            Some(&owner_body()),
        )
        .await;
    assert_eq!(response.status(), 200);
    let response = app.release_as(Some(BILLING), "billing:x", "o").await;
    assert_eq!(response.status(), 204);
}

/// At two live leases the billing token gets `429` for a third resource; re-acquiring one it
/// holds does not count twice; a released or expired lease frees its place.
async fn a_token_holds_at_most_its_quota_of_live_leases(kind: StoreKind) {
    let (app, _dir) = spawn(kind).await;
    for resource in ["billing:a", "billing:b"] {
        let response = app.acquire_as(Some(BILLING), resource, "o", TTL).await;
        assert_eq!(response.status(), 200, "{resource}");
    }
    let response = app.acquire_as(Some(BILLING), "billing:c", "o", TTL).await;
    let problem = assert_problem(response, 429, "quota-exceeded").await;
    assert!(!problem.to_string().contains(BILLING));

    // Re-acquisition by the same owner: granted, a new fence, still two leases.
    let response = app.acquire_as(Some(BILLING), "billing:a", "o", TTL).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["acquired"], json!(true));
    let response = app.acquire_as(Some(BILLING), "billing:c", "o", TTL).await;
    assert_problem(response, 429, "quota-exceeded").await;

    // A release frees a place.
    let response = app.release_as(Some(BILLING), "billing:b", "o").await;
    assert_eq!(response.status(), 204);
    let response = app.acquire_as(Some(BILLING), "billing:c", "o", TTL).await;
    assert_eq!(response.status(), 200);

    // So does an expiry.
    app.db.age("billing:a", 1_000).await;
    let response = app.acquire_as(Some(BILLING), "billing:d", "o", TTL).await;
    assert_eq!(response.status(), 200);
    let response = app.acquire_as(Some(BILLING), "billing:e", "o", TTL).await;
    assert_problem(response, 429, "quota-exceeded").await;

    let metrics = app.metrics().await;
    assert_eq!(
        metrics.value("fencelock_auth_failures_total", &[("reason", "quota")]),
        3.0
    );
}

/// The quota is the store's: two instances over one store count the same leases.
async fn the_quota_holds_across_instances(kind: StoreKind) {
    let (first, dir) = spawn(kind).await;
    let auth = Arc::new(Auth::load(&dir.path().join("auth.toml")).unwrap());
    let second = TestApp::spawn_on(first.db.clone(), move |settings| {
        settings.auth = Some(auth);
    })
    .await;
    let response = first.acquire_as(Some(BILLING), "billing:a", "o", TTL).await;
    assert_eq!(response.status(), 200);
    let response = second
        .acquire_as(Some(BILLING), "billing:b", "o", TTL)
        .await;
    assert_eq!(response.status(), 200);
    let response = first.acquire_as(Some(BILLING), "billing:c", "o", TTL).await;
    assert_problem(response, 429, "quota-exceeded").await;
    let response = second
        .acquire_as(Some(BILLING), "billing:c", "o", TTL)
        .await;
    assert_problem(response, 429, "quota-exceeded").await;
}

/// Concurrent acquisitions of different resources by one token never pass its quota.
async fn concurrent_acquisitions_keep_the_quota(kind: StoreKind) {
    let (app, _dir) = spawn(kind).await;
    let app = Arc::new(app);
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move {
                app.acquire_as(Some(BILLING), &format!("billing:r{i}"), "o", TTL)
                    .await
                    .status()
                    .as_u16()
            })
        })
        .collect();
    let mut granted = 0;
    for task in tasks {
        match task.await.unwrap() {
            200 => granted += 1,
            429 => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(granted, 2);
}

contract!(
    no_or_unknown_token_is_401_on_every_lock_operation,
    unauthorized_comes_before_the_input_rules,
    tokens_keep_to_their_prefixes_and_permissions,
    a_token_holds_at_most_its_quota_of_live_leases,
    the_quota_holds_across_instances,
    concurrent_acquisitions_keep_the_quota,
);

async fn acquire_on(server: &ServerProcess, token: &str, resource: &str) -> reqwest::Response {
    client()
        .post(server.url(&format!("/locks/{resource}")))
        .bearer_auth(token)
        .json(&owner_body())
        .send()
        .await
        .unwrap()
}

/// How long the server may take to handle a signal, which it does asynchronously.
const SIGNAL_HANDLED: Duration = Duration::from_secs(10);

/// Writes `contents` to the auth file, sends SIGHUP, and waits until `check` holds.
async fn reload_until(
    server: &mut ServerProcess,
    path: &std::path::Path,
    contents: &str,
    what: &str,
    mut check: impl AsyncFnMut(&ServerProcess) -> bool,
) {
    std::fs::write(path, contents).unwrap();
    server.signal("-HUP");
    let server = &*server;
    eventually(what, SIGNAL_HANDLED, async || check(server).await).await;
}

/// SIGHUP reads the file again: a new token works without a restart; a bad file is logged
/// at ERROR and the tokens in force stay.
#[tokio::test]
async fn sighup_reloads_the_auth_file_and_a_bad_file_keeps_the_old_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    std::fs::write(&path, auth_file()).unwrap();
    let mut server =
        ServerProcess::start_with(None, dir.path(), &["--auth-file", path.to_str().unwrap()]);
    assert_eq!(
        acquire_on(&server, BILLING, "billing:a").await.status(),
        200
    );
    const NEWCOMER: &str = "newcomer-secret-0123456789";
    assert_eq!(acquire_on(&server, NEWCOMER, "jobs:a").await.status(), 401);

    let grown = auth_file() + &token_entry("jobs", NEWCOMER, &["jobs:"], &["lock"]);
    reload_until(
        &mut server,
        &path,
        &grown,
        "the new token is let in after SIGHUP",
        async |server| acquire_on(server, NEWCOMER, "jobs:a").await.status() == 200,
    )
    .await;
    server.assert_logged("auth file reloaded").await;

    std::fs::write(&path, "[[tokens]]\nname = \"broken\"\n").unwrap();
    server.signal("-HUP");
    eventually("the bad file is reported", SIGNAL_HANDLED, async || {
        server.log_text().contains("auth file not reloaded")
    })
    .await;
    let log = server.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("auth file not reloaded"))
        .unwrap();
    assert!(line.contains("ERROR"), "{line}");
    assert!(server.is_running());
    assert_eq!(acquire_on(&server, NEWCOMER, "jobs:b").await.status(), 200);
    assert_eq!(
        acquire_on(&server, BILLING, "billing:b").await.status(),
        200
    );
    // Secrets never reach the log; the token's name goes with each lease event.
    assert!(!log.contains(BILLING) && !log.contains(NEWCOMER), "{log}");
    server.assert_logged("billing-workers").await;
}

/// An auth file without tokens starts the server (it is how every token is revoked at once),
/// with a WARN line saying that every lock request will be refused; so does a reload to one.
#[tokio::test]
async fn an_auth_file_without_tokens_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    std::fs::write(&path, "# every token revoked\n").unwrap();
    let mut server =
        ServerProcess::start_with(None, dir.path(), &["--auth-file", path.to_str().unwrap()]);
    let warned = |log: &str| {
        log.lines()
            .filter(|l| l.contains("the auth file lists no tokens"))
            .inspect(|l| assert!(l.contains("WARN"), "{l}"))
            .count()
    };
    assert_eq!(warned(&server.settled_log().await), 1);
    assert_eq!(
        acquire_on(&server, BILLING, "billing:a").await.status(),
        401
    );

    reload_until(
        &mut server,
        &path,
        &auth_file(),
        "the tokens are let in after SIGHUP",
        async |server| acquire_on(server, BILLING, "billing:a").await.status() == 200,
    )
    .await;
    reload_until(
        &mut server,
        &path,
        "",
        "the empty file is warned about",
        async |server| warned(&server.log_text()) == 2,
    )
    .await;
    assert_eq!(
        acquire_on(&server, BILLING, "billing:b").await.status(),
        401
    );
}

/// A bad auth file at start stops start-up with one line naming the problem.
#[test]
fn a_bad_auth_file_stops_startup_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    let cases = [
        (
            auth_file().replace("\"lock\", \"read\"", "\"lock\", \"write\""),
            "write",
        ),
        (
            auth_file().replace("max_leases = 2", "max_leases = 0"),
            "max_leases",
        ),
        (auth_file().replace("[\"billing:\"]", "[]"), "prefixes"),
        ("[[tokens]\n".to_owned(), "auth file"),
    ];
    for (text, word) in cases {
        std::fs::write(&path, &text).unwrap();
        let auth_file = path.to_str().unwrap();
        let output = run(
            dir.path(),
            &["--bind", "127.0.0.1:0", "--auth-file", auth_file],
        );
        let line = assert_failed_in_one_line(&output, &text);
        assert!(
            line.starts_with("fencelock: ") && line.contains(word),
            "{line}"
        );
    }
    let output = run(dir.path(), &["--auth-file", "/nonexistent/auth.toml"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("/nonexistent/auth.toml"), "{stderr}");
}

/// Without an auth file, a non-loopback address is refused unless asked for; asked for, the
/// server starts and warns.
#[test]
fn no_auth_on_a_public_address_needs_allow_unauthenticated() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(dir.path(), &["--bind", "0.0.0.0:0"]);
    let line = assert_failed_in_one_line(&output, "--bind 0.0.0.0:0");
    assert!(line.contains("--allow-unauthenticated"), "{line}");
    assert!(!dir.path().join("fencelock.db").exists(), "nothing opened");

    let server = ServerProcess::start_with(
        None,
        dir.path(),
        &["--bind", "0.0.0.0:0", "--allow-unauthenticated"],
    );
    // The warning follows the line `start_with` waits for.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let warning = loop {
        let log = server.log_text();
        if let Some(line) = log.lines().find(|l| l.contains("without authentication")) {
            break line.to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "no warning: {log}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(warning.contains("WARN"), "{warning}");
}

/// `fencelock token new NAME`: the first line is the secret, the rest the block to paste,
/// and a server with that block lets the secret in.
#[tokio::test]
async fn token_new_prints_a_secret_and_a_block_that_lets_it_in() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(dir.path(), &["token", "new", "ci-runner"]);
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let (secret, block) = stdout.split_once('\n').unwrap();
    assert!(secret.len() >= 22, "{secret}");
    let tokens = fencelock_server::auth_file::Tokens::parse(block).unwrap();
    assert_eq!(tokens.lookup(secret).unwrap().name(), "ci-runner");
    let again = run(dir.path(), &["token", "new", "ci-runner"]);
    assert_ne!(
        String::from_utf8(again.stdout).unwrap().lines().next(),
        Some(secret)
    );

    let path = dir.path().join("auth.toml");
    std::fs::write(&path, block).unwrap();
    let server =
        ServerProcess::start_with(None, dir.path(), &["--auth-file", path.to_str().unwrap()]);
    assert_eq!(acquire_on(&server, secret, "anything").await.status(), 200);
    assert_eq!(acquire_on(&server, "guess", "anything").await.status(), 401);
    assert!(!server.settled_log().await.contains(secret));
}

/// The worker client sends its bearer token; without it the server answers `401`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_sends_its_bearer_token() {
    use fencelock::client::{Client, Error};
    let (app, _dir) = spawn(StoreKind::Sqlite).await;
    let client = Client::builder(app.address.clone())
        .no_proxy()
        .bearer_token(BILLING)
        .build()
        .unwrap();
    assert!(!format!("{client:?}").contains(BILLING));
    let ttl = Duration::from_secs(60);
    client.acquire("billing:c", "o", ttl).await.unwrap();
    assert!(client.inspect("billing:c").await.unwrap().is_some());
    let refused = client.acquire("report:c", "o", ttl).await.unwrap_err();
    assert!(
        matches!(refused, Error::Rejected { status: 403, .. }),
        "{refused:?}"
    );
    let anonymous = Client::builder(app.address.clone())
        .no_proxy()
        .build()
        .unwrap();
    let refused = anonymous.acquire("billing:d", "o", ttl).await.unwrap_err();
    assert!(
        matches!(refused, Error::Rejected { status: 401, .. }),
        "{refused:?}"
    );
}

// The quota across instances through PgBouncer, in transaction and in session pooling.
through_pgbouncer!(the_quota_holds_across_instances);
