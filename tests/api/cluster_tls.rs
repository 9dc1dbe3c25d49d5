//! PostgreSQL servers whose TLS rule differs from the shared test server's, each a private
//! cluster the test starts itself ([`PrivateCluster`]): one that takes only TLS sessions,
//! and one that offers no TLS. A setting that cannot work with the server's rule is a
//! misconfiguration, named at ERROR and in `/readyz` (never an outage to wait out); the
//! settings that can work give sessions encrypted as `sslmode` says.

use fencelock_server::StoreError;
use fencelock_server::postgres::{PgConfig, classify};

use crate::helpers::{ClusterOptions, ClusterTls, PrivateCluster, client, first_column};
use crate::misconfig::misconfiguration_is_named;
use crate::process::ServerProcess;
use crate::tls::url_encode;

fn cluster(tls: ClusterTls) -> PrivateCluster {
    PrivateCluster::start(ClusterOptions { tls })
}

/// Starts the real server on `url`, takes a lease to prove the store works, and returns
/// whether each of its PostgreSQL sessions on database `name` is encrypted, as the server
/// sees them (`pg_stat_ssl`).
async fn serve_and_see_sessions(cluster: &PrivateCluster, name: &str, url: &str) -> Vec<bool> {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(Some(url), dir.path());
    let response = server.acquire(&client(), "job:1", "a").await;
    assert_eq!(
        response.status(),
        200,
        "{url}: {}\n{}",
        response.text().await.unwrap_or_default(),
        server.log_text()
    );
    let sessions: Vec<bool> = first_column(
        &cluster.admin().await,
        "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name = 'fencelock' AND a.datname = $1",
        &[&name],
    )
    .await;
    assert!(
        !sessions.is_empty(),
        "{url}: no session of the server found"
    );
    sessions
}

/// A server that takes only TLS sessions, and `sslmode=disable`: the server's refusal ("no
/// pg_hba.conf entry ... no encryption") is named at ERROR once, in `/readyz` and by
/// `fencelock check`, and lock requests answer `503 store-unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_disable_against_a_server_that_requires_tls_is_named() {
    let cluster = cluster(ClusterTls::Required);
    misconfiguration_is_named(&cluster.url("sslmode=disable"), "no encryption").await;
}

/// The same server with `sslmode=require` and with `sslmode=prefer`: the store works, and
/// every session is encrypted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_and_prefer_work_against_a_server_that_requires_tls() {
    let cluster = cluster(ClusterTls::Required);
    let admin = cluster.admin().await;
    for mode in ["require", "prefer"] {
        let name = format!("leases_{mode}");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let url = cluster.database_url(&name, &format!("sslmode={mode}"));
        let sessions = serve_and_see_sessions(&cluster, &name, &url).await;
        assert!(sessions.iter().all(|ssl| *ssl), "{mode}: {sessions:?}");
    }
}

/// A server without TLS, and an `sslmode` that requires it (`require`, and `verify-ca` with
/// the certificate the server would have): a misconfiguration that says the server does not
/// support TLS, not an outage. Sorted so by `classify` itself, and named at ERROR, in
/// `/readyz` and by `fencelock check`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_against_a_server_without_tls_is_named() {
    let cluster = cluster(ClusterTls::Off);
    let root = url_encode(&cluster.certificate().display().to_string());
    for params in [
        "sslmode=require".to_owned(),
        format!("sslmode=verify-ca&sslrootcert={root}"),
    ] {
        let url = cluster.url(&params);
        let pg = PgConfig::parse(&url).unwrap();
        let refused = pg
            .config
            .connect(pg.tls.connector.clone())
            .await
            .err()
            .unwrap_or_else(|| panic!("{params}: a session without TLS was opened"));
        match classify(refused) {
            StoreError::Misconfigured(cause) => {
                let cause = format!("{cause:#}");
                assert!(cause.contains("does not support TLS"), "{cause}");
                assert!(cause.contains("sslmode=require"), "{cause}");
            }
            other => panic!("{params}: not a misconfiguration: {other:?}"),
        }
        misconfiguration_is_named(&url, "does not support TLS").await;
    }
}

/// The same server with `sslmode=prefer` (the default): plain sessions, and the store works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_prefer_against_a_server_without_tls_is_plain() {
    let cluster = cluster(ClusterTls::Off);
    let sessions =
        serve_and_see_sessions(&cluster, "postgres", &cluster.url("sslmode=prefer")).await;
    assert!(sessions.iter().all(|ssl| !*ssl), "{sessions:?}");
}
