//! The test harness: a real fencelock server on port 0, in its own thread and actix system
//! (as separate from the test as another process would be), over a fresh PostgreSQL database
//! or SQLite file that is dropped when the test ends.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use fencelock::config::{Settings, StoreConfig};
use fencelock::startup::Application;
use fencelock::store::SharedStore;
use fencelock::store::postgres::PgConfig;
use reqwest::{Client, Method, Response, StatusCode};
use serde_json::{Value, json};

/// The TTL tests use when the TTL itself does not matter: long enough that no lease expires
/// by itself during a test, however slow the machine. Expiry is always made on purpose, by
/// ageing the row in the store (see [`TestDb::age`]).
pub const TTL: i64 = 60;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    Postgres,
    Sqlite,
}

/// Where tests find PostgreSQL; a database is created beside it for every test. An
/// unreachable server fails the test, never skips it.
pub fn admin_url() -> String {
    std::env::var("FENCELOCK_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

async fn pg_connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!("PostgreSQL for tests is not reachable at {url} ({e}); start it or set FENCELOCK_TEST_DATABASE_URL")
        });
    tokio::spawn(connection);
    client
}

/// A URL for database `name` on the admin server.
fn url_for(name: &str) -> String {
    let admin = admin_url();
    let (base, query) = match admin.split_once('?') {
        Some((b, q)) => (b.to_owned(), format!("?{q}")),
        None => (admin.clone(), String::new()),
    };
    let (server, _) = base.rsplit_once('/').expect("admin URL has a path");
    format!("{server}/{name}{query}")
}

/// One store's storage, shared by every server instance of a test.
pub enum TestDb {
    Postgres {
        name: String,
    },
    Sqlite {
        _dir: tempfile::TempDir,
        path: PathBuf,
    },
}

impl TestDb {
    pub async fn new(kind: StoreKind) -> Arc<Self> {
        Arc::new(match kind {
            StoreKind::Postgres => {
                let name = format!("fencelock_test_{:016x}", fastrand::u64(..));
                pg_connect(&admin_url())
                    .await
                    .batch_execute(&format!("CREATE DATABASE {name}"))
                    .await
                    .expect("creating the test database");
                Self::Postgres { name }
            }
            StoreKind::Sqlite => {
                let dir = tempfile::tempdir().expect("temporary directory");
                let path = dir.path().join("fencelock.db");
                Self::Sqlite { _dir: dir, path }
            }
        })
    }

    /// The `DATABASE_URL` that names this storage.
    pub fn url(&self) -> String {
        match self {
            Self::Postgres { name } => url_for(name),
            Self::Sqlite { path, .. } => format!("sqlite://{}", path.display()),
        }
    }

    pub fn store_config(&self) -> StoreConfig {
        match self {
            Self::Postgres { name } => {
                let mut pg = PgConfig::parse(&admin_url()).expect("admin URL parses");
                pg.config.dbname(name);
                StoreConfig::Postgres(Box::new(pg))
            }
            Self::Sqlite { path, .. } => StoreConfig::Sqlite(path.clone()),
        }
    }

    /// Makes the lease on `resource` expire `ago_ms` milliseconds ago by the store's own
    /// clock, the way time passing would, without waiting for it.
    pub async fn age(&self, resource: &str, ago_ms: i64) {
        let updated = match self {
            Self::Postgres { .. } => pg_connect(&self.url())
                .await
                .execute(
                    "UPDATE leases SET expires_at = now() - $2::bigint * interval '1 millisecond' WHERE resource = $1",
                    &[&resource, &ago_ms],
                )
                .await
                .expect("ageing a lease"),
            Self::Sqlite { path, .. } => {
                let conn = sqlite(path);
                let now = chrono::Utc::now().timestamp_millis();
                conn.execute(
                    "UPDATE leases SET expires_at = ?2 WHERE resource = ?1",
                    rusqlite::params![resource, now - ago_ms],
                )
                .expect("ageing a lease") as u64
            }
        };
        assert_eq!(updated, 1, "no lease row for {resource} to age");
    }

    /// Rows in the lease table for `resource`, live or expired.
    pub async fn rows(&self, resource: &str) -> i64 {
        match self {
            Self::Postgres { .. } => pg_connect(&self.url())
                .await
                .query_one(
                    "SELECT count(*) FROM leases WHERE resource = $1",
                    &[&resource],
                )
                .await
                .expect("counting rows")
                .get(0),
            Self::Sqlite { path, .. } => sqlite(path)
                .query_row(
                    "SELECT count(*) FROM leases WHERE resource = ?1",
                    [resource],
                    |r| r.get(0),
                )
                .expect("counting rows"),
        }
    }

    /// Adds `count` leases on one-off resources that expired `ago_ms` milliseconds ago.
    pub async fn insert_expired(&self, count: i64, ago_ms: i64) {
        match self {
            Self::Postgres { .. } => {
                pg_connect(&self.url())
                    .await
                    .execute(
                        "INSERT INTO leases (resource, owner, fence, acquired_at, expires_at)
                         SELECT 'bulk-' || g, 'o', g,
                                now() - $2::bigint * interval '1 millisecond' - interval '1 minute',
                                now() - $2::bigint * interval '1 millisecond'
                         FROM generate_series(1, $1::bigint) AS g",
                        &[&count, &ago_ms],
                    )
                    .await
                    .expect("inserting expired leases");
            }
            Self::Sqlite { path, .. } => {
                let expired = chrono::Utc::now().timestamp_millis() - ago_ms;
                sqlite(path)
                    .execute(
                        "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?1)
                         INSERT INTO leases (resource, owner, fence, acquired_at, expires_at)
                         SELECT 'bulk-' || n, 'o', n, ?2 - 60000, ?2 FROM g",
                        rusqlite::params![count, expired],
                    )
                    .expect("inserting expired leases");
            }
        }
    }

    /// Every row in the lease table.
    pub async fn total_rows(&self) -> i64 {
        match self {
            Self::Postgres { .. } => pg_connect(&self.url())
                .await
                .query_one("SELECT count(*) FROM leases", &[])
                .await
                .expect("counting rows")
                .get(0),
            Self::Sqlite { path, .. } => sqlite(path)
                .query_row("SELECT count(*) FROM leases", [], |r| r.get(0))
                .expect("counting rows"),
        }
    }
}

/// A row lock on a lease, held by another session until released: requests that need the row
/// wait inside PostgreSQL, as they would behind a slow transaction.
pub struct RowLock {
    session: tokio_postgres::Client,
}

impl RowLock {
    /// Locks the lease row of `resource` in the test's PostgreSQL database.
    pub async fn take(db: &TestDb, resource: &str) -> Self {
        assert!(
            matches!(db, TestDb::Postgres { .. }),
            "row locks are a PostgreSQL test tool"
        );
        let session = pg_connect(&db.url()).await;
        session.batch_execute("BEGIN").await.expect("BEGIN");
        let locked = session
            .execute(
                "SELECT 1 FROM leases WHERE resource = $1 FOR UPDATE",
                &[&resource],
            )
            .await
            .expect("locking the row");
        assert_eq!(locked, 1, "no lease row for {resource} to lock");
        Self { session }
    }

    /// Sessions of this database waiting for a lock right now.
    pub async fn waiters(&self) -> i64 {
        self.session
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .expect("reading pg_stat_activity")
            .get(0)
    }

    pub async fn release(self) {
        self.session
            .batch_execute("ROLLBACK")
            .await
            .expect("ROLLBACK");
    }
}

fn sqlite(path: &std::path::Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("opening the test SQLite file");
    conn.busy_timeout(Duration::from_secs(10))
        .expect("busy timeout");
    conn
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Self::Postgres { name } = self {
            let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            // Drop runs inside the test's runtime, which cannot be blocked on: use a thread
            // with a runtime of its own.
            let dropped = std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime")
                    .block_on(
                        async move { pg_connect(&admin_url()).await.batch_execute(&sql).await },
                    )
            })
            .join();
            if let Ok(Err(e)) = dropped {
                eprintln!("could not drop test database {name}: {e}");
            }
        }
    }
}

/// A running server and a client for it. Dropping it stops the server.
pub struct TestApp {
    pub address: String,
    pub client: Client,
    pub db: Arc<TestDb>,
    /// The server's own store handle, for operations with no HTTP route (purge).
    pub store: SharedStore,
    server: Option<(ServerHandle, std::thread::JoinHandle<()>)>,
}

impl TestApp {
    pub async fn spawn(kind: StoreKind) -> Self {
        Self::spawn_on(TestDb::new(kind).await, |_| {}).await
    }

    /// Another instance on the same storage, or one with changed settings.
    pub async fn spawn_on(
        db: Arc<TestDb>,
        tweak: impl FnOnce(&mut Settings) + Send + 'static,
    ) -> Self {
        let mut settings = Settings::for_store(db.store_config());
        settings.bind = "127.0.0.1:0".parse().expect("address");
        tweak(&mut settings);
        Self::spawn_with(db, settings).await
    }

    pub async fn spawn_with(db: Arc<TestDb>, settings: Settings) -> Self {
        init_logging();
        let (ready, built) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                match Application::build(settings).await {
                    Ok(app) => {
                        let _ = ready.send(Ok((app.port(), app.handle(), app.store())));
                        if let Err(e) = app.run_until_stopped().await {
                            eprintln!("test server failed: {e:#}");
                        }
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                    }
                }
            });
        });
        let (port, handle, store) = built
            .await
            .expect("the server thread answers")
            .unwrap_or_else(|e| panic!("the server builds: {e:#}"));
        Self {
            address: format!("http://127.0.0.1:{port}"),
            client: client(),
            db,
            store,
            server: Some((handle, thread)),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<reqwest::Body>,
    ) -> Response {
        let mut request = self.client.request(method, self.url(path)).body(body);
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        request.send().await.expect("request reaches the server")
    }

    pub async fn json(&self, method: Method, path: &str, body: &Value) -> Response {
        self.send(method, path, Some("application/json"), body.to_string())
            .await
    }

    pub async fn get(&self, path: &str) -> Response {
        self.client
            .get(self.url(path))
            .send()
            .await
            .expect("request reaches the server")
    }

    pub async fn acquire(&self, resource: &str, owner: &str, ttl: i64) -> Response {
        self.json(
            Method::POST,
            &format!("/locks/{resource}"),
            &json!({ "owner": owner, "ttl_seconds": ttl }),
        )
        .await
    }

    /// Acquires and asserts success; returns the `lock` object.
    pub async fn acquire_ok(&self, resource: &str, owner: &str, ttl: i64) -> Value {
        let response = self.acquire(resource, owner, ttl).await;
        assert_eq!(response.status(), StatusCode::OK);
        let body: Value = response.json().await.expect("JSON body");
        assert_eq!(body["acquired"], json!(true), "not acquired: {body}");
        body["lock"].clone()
    }

    pub async fn inspect(&self, resource: &str) -> Response {
        self.get(&format!("/locks/{resource}")).await
    }

    pub async fn renew(&self, resource: &str, body: Value) -> Response {
        self.json(Method::POST, &format!("/locks/{resource}/renew"), &body)
            .await
    }

    pub async fn release(&self, resource: &str, body: Value) -> Response {
        self.json(Method::DELETE, &format!("/locks/{resource}"), &body)
            .await
    }

    pub async fn release_by_post(&self, resource: &str, body: Value) -> Response {
        self.json(Method::POST, &format!("/locks/{resource}/release"), &body)
            .await
    }

    /// The live lease's fence as GET reports it.
    pub async fn fence_of(&self, resource: &str) -> i64 {
        let response = self.inspect(resource).await;
        assert_eq!(response.status(), StatusCode::OK);
        fence(&response.json::<Value>().await.expect("JSON body"))
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some((handle, thread)) = self.server.take() {
            let _ = std::thread::spawn(move || block_on(handle.stop(false))).join();
            let _ = thread.join();
        }
    }
}

fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(future)
}

pub fn client() -> Client {
    Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client")
}

fn init_logging() {
    if std::env::var_os("TEST_LOG").is_some() {
        fencelock::telemetry::init(fencelock::config::LogFormat::Text);
    }
}

pub fn fence(lock: &Value) -> i64 {
    lock["fence"]
        .as_i64()
        .unwrap_or_else(|| panic!("no integer fence in {lock}"))
}

/// Asserts an RFC 9457 problem with the given status and type; returns its body.
pub async fn assert_problem(response: Response, status: u16, kind: &str) -> Value {
    assert_eq!(response.status().as_u16(), status, "status");
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let path = response.url().path().to_owned();
    let body: Value = response.json().await.expect("problem body is JSON");
    assert_eq!(content_type, "application/problem+json", "{body}");
    assert_eq!(body["type"], json!(kind), "{body}");
    assert_eq!(body["status"], json!(status), "{body}");
    assert!(body["title"].is_string(), "{body}");
    assert!(body["detail"].is_string(), "{body}");
    assert_eq!(body["instance"], json!(path), "{body}");
    body
}

/// The fields a 422 names.
pub fn invalid_fields(problem: &Value) -> Vec<String> {
    problem["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("no errors list in {problem}"))
        .iter()
        .map(|e| e["field"].as_str().expect("field name").to_owned())
        .collect()
}

/// An answer read off a raw TCP connection.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// Header names in lower case, in the order sent.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl TestApp {
    pub fn socket_address(&self) -> std::net::SocketAddr {
        self.address
            .trim_start_matches("http://")
            .parse()
            .expect("the test address is a socket address")
    }

    /// Sends `request` byte for byte over a fresh connection, as no HTTP client would
    /// (clients normalise paths and refuse bad bytes), and reads the answer.
    pub async fn raw(&self, request: &[u8]) -> RawResponse {
        raw_exchange(self.socket_address(), request).await
    }
}

/// One request over a fresh TCP connection; the answer is read until its body is complete
/// or the server closes. Bounded in time: a server that does not answer fails the test.
pub async fn raw_exchange(address: std::net::SocketAddr, request: &[u8]) -> RawResponse {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("connecting to the server");
        // The server may answer and close before it has read everything; that is fine.
        let _ = stream.write_all(request).await;
        let mut received = Vec::new();
        let mut buffer = [0u8; 8192];
        loop {
            if let Some(response) = parse_raw(&received) {
                return response;
            }
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
        parse_raw(&received).unwrap_or_else(|| {
            panic!(
                "no complete HTTP response; received {:?}",
                String::from_utf8_lossy(&received)
            )
        })
    };
    tokio::time::timeout(Duration::from_secs(15), exchange)
        .await
        .expect("the server answers a raw request within 15 s")
}

/// A complete response at the start of `bytes`, if there is one yet.
pub fn parse_raw(bytes: &[u8]) -> Option<RawResponse> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&bytes[..end]).expect("response head is text");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()?
        .split(' ')
        .nth(1)?
        .parse()
        .expect("status code");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map_or(0, |(_, v)| v.parse().expect("content-length"));
    let body = bytes.get(end + 4..end + 4 + length)?.to_vec();
    Some(RawResponse {
        status,
        headers,
        body,
    })
}

/// Asserts a raw answer is an RFC 9457 problem with the given status and type; returns it.
pub fn assert_raw_problem(response: &RawResponse, status: u16, kind: &str) -> Value {
    let body: Value = serde_json::from_slice(&response.body).unwrap_or_else(|_| {
        panic!(
            "problem body is JSON: {response:?} ({})",
            String::from_utf8_lossy(&response.body)
        )
    });
    assert_eq!(response.status, status, "{body}");
    assert_eq!(
        response.header("content-type"),
        Some("application/problem+json"),
        "{body}"
    );
    assert_eq!(body["type"], json!(kind), "{body}");
    assert_eq!(body["status"], json!(status), "{body}");
    for member in ["title", "detail", "instance"] {
        assert!(body[member].is_string(), "{member} in {body}");
    }
    body
}
