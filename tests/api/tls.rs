//! TLS on both sides: the server serving HTTPS with a certificate from a test CA (made here
//! with rcgen), the worker client trusting that CA, and PostgreSQL sessions as `sslmode`
//! and `sslrootcert` ask. The PostgreSQL tests need the test cluster to have `ssl = on`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use fencelock_server::StoreConfig;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::helpers::{StoreKind, TTL, TestApp, TestDb, admin, assert_succeeded, postgres_addr};
use crate::misconfig::misconfiguration_is_named;
use crate::process::{ServerProcess, command};

/// A test CA and a server certificate it issued for `localhost` and `127.0.0.1`, as PEM
/// files in a temporary directory.
pub(crate) struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
}

impl Pki {
    pub(crate) fn new() -> Self {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "fencelock test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();

        let server_key = KeyPair::generate().unwrap();
        let mut server =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        server
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let server = server.signed_by(&server_key, &ca).unwrap();

        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.path().join("cert.pem"), server.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), server_key.serialize_pem()).unwrap();
        Self {
            ca_pem: ca.pem(),
            dir,
        }
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    /// A reqwest client that trusts this CA (and, as reqwest does, the web roots).
    fn client(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).unwrap())
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    }
}

pub(crate) async fn spawn_https(pki: &Pki) -> TestApp {
    let tls =
        fencelock_server::tls_server_config(&pki.path("cert.pem"), &pki.path("key.pem")).unwrap();
    TestApp::spawn_on(TestDb::new(StoreKind::Sqlite).await, move |settings| {
        settings.tls = Some(Arc::new(tls));
    })
    .await
}

fn port(app: &TestApp) -> u16 {
    app.address.rsplit(':').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_is_served_to_a_client_that_trusts_the_ca() {
    let pki = Pki::new();
    let app = spawn_https(&pki).await;
    assert!(app.address.starts_with("https://"), "{}", app.address);
    let port = port(&app);
    for host in ["localhost", "127.0.0.1"] {
        let response = pki
            .client()
            .get(format!("https://{host}:{port}/healthz"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("HTTPS to {host}: {e:?}"));
        assert_eq!(response.status(), 200);
    }
    // A client that does not trust the test CA refuses the server.
    let untrusting = reqwest::Client::builder().no_proxy().build().unwrap();
    let refused = untrusting
        .get(format!("https://localhost:{port}/healthz"))
        .send()
        .await;
    assert!(refused.is_err(), "{refused:?}");
}

/// Plain HTTP to the HTTPS port fails at once (no hang), and the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_to_the_https_port_fails_cleanly() {
    let pki = Pki::new();
    let app = spawn_https(&pki).await;
    let port = port(&app);
    let plain = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    for _ in 0..3 {
        let answer = plain
            .get(format!("http://127.0.0.1:{port}/healthz"))
            .send()
            .await;
        match answer {
            Err(e) => assert!(!e.is_timeout(), "plain HTTP hung: {e:?}"),
            Ok(response) => assert_eq!(response.status(), 400),
        }
    }
    let response = pki
        .client()
        .get(format!("https://localhost:{port}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

/// A ClientHello for `version` without a `supported_versions` extension (so it offers
/// nothing newer), with one suite, curve and signature scheme rustls takes for TLS 1.2 and
/// the test certificate's ECDSA P-256 key; the first record of the server's answer.
async fn hello(port: u16, version: [u8; 2]) -> Vec<u8> {
    let mut body = version.to_vec();
    body.extend_from_slice(&[0x42; 32]); // random
    body.push(0); // no session id
    body.extend_from_slice(&[0x00, 0x02, 0xc0, 0x2b]); // ECDHE-ECDSA-AES128-GCM-SHA256
    body.extend_from_slice(&[0x01, 0x00]); // compression: null
    let extensions: &[u8] = &[
        0x00, 0x0a, 0x00, 0x06, 0x00, 0x04, 0x00, 0x1d, 0x00, 0x17, // groups: x25519, P-256
        0x00, 0x0b, 0x00, 0x02, 0x01, 0x00, // point formats: uncompressed
        0x00, 0x0d, 0x00, 0x04, 0x00, 0x02, 0x04, 0x03, // signatures: ecdsa_secp256r1_sha256
        0x00, 0x17, 0x00, 0x00, // extended master secret
    ];
    body.extend_from_slice(&u16::try_from(extensions.len()).unwrap().to_be_bytes());
    body.extend_from_slice(extensions);
    let mut handshake = vec![0x01, 0x00];
    handshake.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend_from_slice(&u16::try_from(handshake.len()).unwrap().to_be_bytes());
    record.extend_from_slice(&handshake);

    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream.write_all(&record).await.unwrap();
    let mut head = [0; 5];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut head))
        .await
        .expect("the server answers")
        .unwrap();
    let mut rest = vec![0; usize::from(u16::from_be_bytes([head[3], head[4]]))];
    stream.read_exact(&mut rest).await.unwrap();
    [head.to_vec(), rest].concat()
}

/// TLS 1.1 is answered with a fatal `protocol_version` alert, while the same hello for
/// TLS 1.2 gets a ServerHello (so it is the version that is refused, nothing else).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_1_1_is_refused() {
    let pki = Pki::new();
    let app = spawn_https(&pki).await;
    let port = port(&app);
    let tls12 = hello(port, [0x03, 0x03]).await;
    assert_eq!(tls12[0], 22, "no handshake record for TLS 1.2: {tls12:?}");
    assert_eq!(tls12[5], 2, "no ServerHello for TLS 1.2: {tls12:?}");
    for version in [[0x03, 0x02], [0x03, 0x01]] {
        let refused = hello(port, version).await;
        // An alert record: type 21, a version, length 2, level fatal (2), protocol_version (70).
        assert_eq!(refused[0], 21, "{version:?}: not an alert: {refused:?}");
        assert_eq!(&refused[5..], &[2, 70], "{version:?}: {refused:?}");
    }
}

/// The worker client, given the test CA, works against the HTTPS server; without it, the
/// certificate is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_client_takes_a_custom_ca() {
    use fencelock::client::{Client, Error};
    let pki = Pki::new();
    let app = spawn_https(&pki).await;
    let base = format!("https://localhost:{}", port(&app));
    let client = Client::builder(&base)
        .no_proxy()
        .add_root_certificate_pem(pki.ca_pem.clone())
        .build()
        .unwrap();
    let lock = client
        .acquire("job:tls", "worker-1", Duration::from_secs(30))
        .await;
    assert!(lock.is_ok(), "{lock:?}");

    let untrusting = Client::builder(&base).no_proxy().build().unwrap();
    let refused = untrusting
        .acquire("job:tls2", "worker-1", Duration::from_secs(30))
        .await;
    assert!(refused.is_err(), "{refused:?}");

    let bad = Client::builder(&base)
        .add_root_certificate_pem("not a certificate")
        .build();
    assert!(matches!(bad, Err(Error::Config(_))), "{bad:?}");
}

/// The real binary, reached by curl trusting the test CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_reaches_the_binary_over_https() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_with(
        None,
        dir.path(),
        &[
            "--tls-cert",
            &pki.arg("cert.pem"),
            "--tls-key",
            &pki.arg("key.pem"),
        ],
    );
    let port = server.address.rsplit(':').next().unwrap().to_owned();
    let Ok(output) = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert", &pki.arg("ca.pem")])
        .arg(format!("https://localhost:{port}/healthz"))
        .output()
    else {
        eprintln!("curl is not installed: the curl check is skipped");
        return;
    };
    assert_succeeded(&output, "curl");
    let body: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(body["status"], "ok", "{body}");
    server.assert_logged(r#""tls":true"#).await;
}

/// Half a TLS setting, or files that are not PEM, stop start-up with one line.
#[test]
fn tls_settings_are_checked_at_start() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not PEM").unwrap();
    let junk = junk.display().to_string();
    let cert = pki.arg("cert.pem");
    let key = pki.arg("key.pem");
    let cases: [(&[&str], &str); 5] = [
        (&["--tls-cert", &cert], "go together"),
        (&["--tls-key", &key], "go together"),
        (&["--tls-cert", &junk, "--tls-key", &key], "--tls-cert"),
        (&["--tls-cert", &cert, "--tls-key", &junk], "--tls-key"),
        (
            &["--tls-cert", &cert, "--tls-key", "/no/such/key.pem"],
            "/no/such/key.pem",
        ),
    ];
    for (args, named) in cases {
        let mut server = command(None, dir.path());
        server.args(["--bind", "127.0.0.1:0"]).args(args);
        assert_refused_in_one_line(&mut server, named, &format!("{args:?}"));
    }
    // A key that is not the certificate's.
    let other = Pki::new();
    let output = command(None, dir.path())
        .args(["--bind", "127.0.0.1:0", "--tls-cert", &cert, "--tls-key"])
        .arg(other.path("key.pem"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("does not fit"), "{stderr}");
}

/// Runs `command`: it exits with 2 and one line on stderr, which names `named`.
fn assert_refused_in_one_line(command: &mut Command, named: &str, case: &str) {
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{case}: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{case}: {stderr}");
    assert!(stderr.contains(named), "{case}: {stderr}");
}

/// `url` with `params` added to its query.
fn with_params(url: &str, params: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{params}")
}

/// The PostgreSQL sessions the server at `db` holds, and whether each is encrypted, seen
/// from an admin session.
async fn sessions(db: &TestDb) -> Vec<bool> {
    let TestDb::Postgres { name, .. } = db else {
        unreachable!()
    };
    admin()
        .await
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = 'fencelock' AND a.datname = $1",
            &[name],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// A server on `db` with `params` in its `DATABASE_URL`; takes a lease to prove the store
/// works.
async fn serve_with(db: &Arc<TestDb>, params: &str) -> TestApp {
    serve_with_url(db, &with_params(&db.url(), params), "job:1").await
}

/// A server on a fresh database with `params` in its `DATABASE_URL`: all its sessions are
/// `encrypted`, or all are plain.
async fn assert_store_sessions(params: &str, encrypted: bool) {
    let db = TestDb::new(StoreKind::Postgres).await;
    let _app = serve_with(&db, params).await;
    let sessions = sessions(&db).await;
    assert!(!sessions.is_empty(), "no session of the server found");
    assert!(
        sessions.iter().all(|ssl| *ssl == encrypted),
        "{params}: {sessions:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_encrypts_the_store_sessions() {
    assert_store_sessions("sslmode=require", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_disable_keeps_the_store_sessions_plain() {
    assert_store_sessions("sslmode=disable", false).await;
}

/// The cluster's own certificate (Debian's self-signed snakeoil one, for `localhost`) as
/// the trusted root: `verify-full` passes for `localhost`, and `verify-ca` also for an
/// address the certificate does not name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_modes_accept_the_clusters_own_certificate() {
    let row = admin()
        .await
        .query_one("SHOW ssl_cert_file", &[])
        .await
        .unwrap();
    let cert: String = row.get(0);
    let cert = Path::new(&cert);
    assert!(
        std::fs::read(cert).is_ok(),
        "the cluster's certificate {} is not readable here",
        cert.display()
    );
    let root = url_encode(&cert.display().to_string());
    let db = TestDb::new(StoreKind::Postgres).await;
    let name = match &*db {
        TestDb::Postgres { name, .. } => name.clone(),
        TestDb::Sqlite { .. } => unreachable!(),
    };
    let full = format!("postgres://postgres@localhost:{}/{name}", pg_port());
    let _full = serve_with_url(
        &db,
        &with_params(&full, &format!("sslmode=verify-full&sslrootcert={root}")),
        "job:full",
    )
    .await;
    let _ca = serve_with(&db, &format!("sslmode=verify-ca&sslrootcert={root}")).await;
    let sessions = sessions(&db).await;
    assert!(sessions.len() >= 2, "{sessions:?}");
    assert!(sessions.iter().all(|ssl| *ssl), "{sessions:?}");
}

fn pg_port() -> u16 {
    postgres_addr().port()
}

pub(crate) fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A server on `db` at `url`; takes a lease on `resource` to prove the store works.
async fn serve_with_url(db: &Arc<TestDb>, url: &str, resource: &str) -> TestApp {
    let store = StoreConfig::parse(url).unwrap();
    let app = TestApp::spawn_on(db.clone(), move |settings| settings.store = store).await;
    let response = app.acquire(resource, "a", TTL).await;
    assert_eq!(response.status(), 200, "{url}");
    app
}

/// `verify-full` with a CA that did not issue the cluster's certificate: requests answer
/// `503`, `/readyz` and one ERROR line name the certificate problem, and `fencelock check`
/// fails with it in one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_a_wrong_ca_is_named() {
    let pki = Pki::new();
    let db = TestDb::new(StoreKind::Postgres).await;
    let url = with_params(
        &db.url(),
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            url_encode(&pki.arg("ca.pem"))
        ),
    );
    misconfiguration_is_named(&url, "certificate").await;
}

/// `verify-ca` without `sslrootcert`, or with a file that is not there, stops start-up
/// with one line.
#[test]
fn verify_modes_need_a_root_certificate() {
    let dir = tempfile::tempdir().unwrap();
    for (params, named) in [
        ("sslmode=verify-ca", "needs sslrootcert"),
        (
            "sslmode=verify-full&sslrootcert=/no/such/ca.pem",
            "/no/such/ca.pem",
        ),
        ("sslmode=allow", "allow"),
    ] {
        let url = format!(
            "postgres://postgres@127.0.0.1:{}/postgres?{params}",
            pg_port()
        );
        let mut check = command(Some(&url), dir.path());
        check.arg("check");
        assert_refused_in_one_line(&mut check, named, params);
    }
}
