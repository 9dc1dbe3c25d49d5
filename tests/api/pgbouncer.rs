//! PgBouncer in front of PostgreSQL: a start whose `--pg-pooling` does not match what the
//! database URL leads to is refused with one line naming the cause and the fix. (The rules
//! that hold through PgBouncer, in both pooling modes, run with `through_pgbouncer!` beside
//! the rules themselves: races, mutual exclusion, waiting and watch across instances.)

use std::time::Duration;

use fencelock_testkit::{PgBouncer, Pooling};
use serde_json::Value;

use crate::helpers::{StoreKind, TestDb, admin_url, client, first_column, pg_connect};
use crate::process::{ServerProcess, command};

/// Longest a refused start may take: the refusal comes after one migration at most.
const WITHIN: Duration = Duration::from_secs(30);

/// Runs `fencelock ARGS` (a server start) on `url` and returns the last line it wrote, which
/// must end a failed run.
async fn refused_start(url: &str, args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut fencelock = command(Some(url), dir.path());
    fencelock.args(["--bind", "127.0.0.1:0"]).args(args);
    let output = tokio::time::timeout(WITHIN, tokio::process::Command::from(fencelock).output())
        .await
        .unwrap_or_else(|_| panic!("{args:?}: still running after {WITHIN:?}"))
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{args:?}: {stderr}");
    let last = stderr.lines().last().unwrap_or_default().to_owned();
    assert!(last.starts_with("fencelock: "), "{args:?}: {stderr}");
    last
}

/// PgBouncer told to drop the startup options (`ignore_startup_parameters = options`, the
/// usual setting) silently loses the settings a direct start sends there: the start is
/// refused, naming `--pg-pooling`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_start_through_pgbouncer_that_drops_options_is_refused() {
    let db = TestDb::new(StoreKind::Postgres).await;
    for pooling in [Pooling::Transaction, Pooling::Session] {
        let bouncer = PgBouncer::start_with(
            &admin_url(),
            pooling,
            "ignore_startup_parameters = extra_float_digits,options",
        );
        let last = refused_start(&db.url_via(bouncer.address()), &[]).await;
        assert!(
            last.contains("lost the settings")
                && last.contains("--pg-pooling session or --pg-pooling transaction"),
            "{pooling:?}: {last}"
        );
    }
}

/// Starts that do not fit a PgBouncer in transaction pooling are refused, each naming what
/// to start with instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_unfit_for_transaction_pooling_are_refused() {
    let db = TestDb::new(StoreKind::Postgres).await;
    let bouncer = PgBouncer::start(&admin_url(), Pooling::Transaction);
    let listen = db.url();
    let cases: [(&[&str], [&str; 2]); 2] = [
        // `--pg-pooling session` would lose its `SET`s and its prepared statements: two
        // connections sharing one PostgreSQL session give it away.
        (
            &["--pg-pooling", "session", "--listen-database-url", &listen],
            ["share one PostgreSQL session", "--pg-pooling transaction"],
        ),
        // Without a LISTEN session around the pooler, waiting and watch would never hear a
        // release: refused before anything is done.
        (
            &["--pg-pooling", "transaction"],
            ["--listen-database-url", "FENCELOCK_LISTEN_DATABASE_URL"],
        ),
    ];
    for (args, named) in cases {
        let last = refused_start(&db.url_via(bouncer.address()), args).await;
        for name in named {
            assert!(last.contains(name), "{args:?}: no {name:?} in: {last}");
        }
    }
}

/// A session that is not a connection's own shows when a prepared statement it made is gone,
/// or one it never made is there (what PgBouncer in transaction pooling does to a start the
/// start-up check let through): sorted as the pooler mismatch, a `503` that names the fix,
/// never the `500` of an unknown failure. Both failures are the real server's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_shared_under_a_connection_is_the_pooler_mismatch() {
    use fencelock_server::StoreError;
    use fencelock_server::postgres::classify;
    let db = TestDb::new(StoreKind::Postgres).await;
    let session = pg_connect(&db.url()).await;
    session
        .batch_execute("PREPARE s0 AS SELECT 1")
        .await
        .unwrap();
    let twice = session.batch_execute("PREPARE s0 AS SELECT 1").await;
    let missing = session.batch_execute("EXECUTE s1").await;
    for failed in [twice, missing] {
        match classify(failed.unwrap_err()) {
            StoreError::Misconfigured(cause) => {
                let cause = format!("{cause:#}");
                assert!(cause.contains("--pg-pooling transaction"), "{cause}");
            }
            other => panic!("not a misconfiguration: {other:?}"),
        }
    }
}

/// With PgBouncer's defaults (startup options refused), a direct start answers `503` and
/// says what to change; with `--pg-pooling` to match, the same PgBouncer serves, and
/// `fencelock check` passes through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_defaults_serve_with_the_pooling_said() {
    let db = TestDb::new(StoreKind::Postgres).await;
    let bouncer = PgBouncer::start(&admin_url(), Pooling::Transaction);
    let url = db.url_via(bouncer.address());
    crate::misconfig::misconfiguration_is_named(
        &url,
        "--pg-pooling session or --pg-pooling transaction",
    )
    .await;

    let dir = tempfile::tempdir().unwrap();
    let listen = db.url();
    let args = [
        "--pg-pooling",
        "transaction",
        "--listen-database-url",
        &listen,
    ];
    let server = ServerProcess::start_with(Some(&url), dir.path(), &args);
    let client = client();
    let ready = client.get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let acquired: Value = server
        .acquire(&client, "through-pgbouncer", "a")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(acquired["acquired"], true, "{acquired}");
    // The migration's lock, and the decision's, ended with their transactions: nothing is
    // left on a server connection that PgBouncer keeps for the next client.
    let held: Vec<i64> = first_column(
        &pg_connect(&db.url()).await,
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
         WHERE l.locktype = 'advisory' AND d.datname = current_database()",
        &[],
    )
    .await;
    assert_eq!(held, [0], "advisory locks left behind");
    let checked = command(Some(&url), dir.path())
        .args(["check", "--pg-pooling", "transaction"])
        .output()
        .unwrap();
    assert!(checked.status.success(), "{checked:?}");
}
