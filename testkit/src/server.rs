//! A real fencelock server on port 0, in its own thread and actix system (as separate from
//! the test as another process would be), over a [`TestDb`], with typed request helpers and
//! the assertions every HTTP test makes about problem answers.

use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use chrono::{DateTime, Utc};
use fencelock_server::Application;
use fencelock_server::Settings;
use fencelock_server::SharedStore;
use reqwest::{Client, Method, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::storage::{StoreKind, TestDb};

/// The TTL tests use when the TTL itself does not matter: long enough that no lease expires
/// by itself during a test, however slow the machine. Expiry is always made on purpose, by
/// ageing the row in the store (see [`TestDb::age`]).
pub const TTL: i64 = 60;

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

    /// A server that requires bearer tokens: the auth file holds `auth_toml`, and the
    /// returned directory holds the file (rewrite it and call [`fencelock_server::auth_file::Auth::reload`]
    /// on the settings' `auth` to test a reload in-process).
    pub async fn spawn_with_auth(kind: StoreKind, auth_toml: &str) -> (Self, tempfile::TempDir) {
        Self::spawn_with_auth_and(kind, auth_toml, |_| {}).await
    }

    /// [`Self::spawn_with_auth`] with more changed settings (a fence key, say).
    pub async fn spawn_with_auth_and(
        kind: StoreKind,
        auth_toml: &str,
        tweak: impl FnOnce(&mut Settings) + Send + 'static,
    ) -> (Self, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("auth.toml");
        std::fs::write(&path, auth_toml).expect("the auth file is written");
        let auth =
            Arc::new(fencelock_server::auth_file::Auth::load(&path).expect("the auth file loads"));
        let app = Self::spawn_on(TestDb::new(kind).await, move |settings| {
            settings.auth = Some(auth);
            tweak(settings);
        })
        .await;
        (app, dir)
    }

    /// Sends a request with `Authorization: Bearer <token>` (or none, for `None`).
    pub async fn send_as(
        &self,
        token: Option<&str>,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Response {
        let mut request = self.client.request(method, self.url(path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        request.send().await.expect("request reaches the server")
    }

    /// `POST /locks/{resource}` with `token`.
    pub async fn acquire_as(
        &self,
        token: Option<&str>,
        resource: &str,
        owner: &str,
        ttl: i64,
    ) -> Response {
        let body = json!({ "owner": owner, "ttl_seconds": ttl });
        self.send_as(
            token,
            Method::POST,
            &format!("/locks/{resource}"),
            Some(&body),
        )
        .await
    }

    /// `DELETE /locks/{resource}` by `owner`, without a fence, with `token`.
    pub async fn release_as(&self, token: Option<&str>, resource: &str, owner: &str) -> Response {
        let body = json!({ "owner": owner });
        let path = format!("/locks/{resource}");
        self.send_as(token, Method::DELETE, &path, Some(&body))
            .await
    }

    pub async fn spawn_with(db: Arc<TestDb>, settings: Settings) -> Self {
        init_logging();
        let scheme = if settings.tls.is_some() {
            "https"
        } else {
            "http"
        };
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
            // Over HTTPS, `client` trusts no test CA: TLS tests bring a client of their own.
            address: format!("{scheme}://127.0.0.1:{port}"),
            client: client(),
            db,
            store,
            server: Some((handle, thread)),
        }
    }

    /// The URL of `path` on this server; under [`under_v1`], a `/locks...` path is sent to
    /// `/v1/locks...`.
    pub fn url(&self, path: &str) -> String {
        let prefix = if path.starts_with("/locks") {
            LOCK_PREFIX.try_with(|prefix| *prefix).unwrap_or("")
        } else {
            ""
        };
        format!("{}{prefix}{path}", self.address)
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
        self.json_text(method, path, body.to_string()).await
    }

    /// Sends `body` as JSON, byte for byte: for bodies `json!` cannot write (numbers beyond
    /// `f64`, fields given twice, broken syntax).
    pub async fn json_text(
        &self,
        method: Method,
        path: &str,
        body: impl Into<reqwest::Body>,
    ) -> Response {
        self.send(method, path, Some("application/json"), body)
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

    /// Renews and asserts success; returns the `lock` object.
    pub async fn renew_ok(&self, resource: &str, body: Value) -> Value {
        let response = self.renew(resource, body).await;
        assert_eq!(response.status(), StatusCode::OK);
        let renewed: Value = response.json().await.expect("JSON body");
        renewed["lock"].clone()
    }

    pub async fn release(&self, resource: &str, body: Value) -> Response {
        self.json(Method::DELETE, &format!("/locks/{resource}"), &body)
            .await
    }

    /// Releases and asserts `204`.
    pub async fn release_ok(&self, resource: &str, body: Value) {
        let response = self.release(resource, body).await;
        assert_eq!(
            response.status(),
            StatusCode::NO_CONTENT,
            "release of {resource}"
        );
    }

    pub async fn release_by_post(&self, resource: &str, body: Value) -> Response {
        self.json(Method::POST, &format!("/locks/{resource}/release"), &body)
            .await
    }

    /// Starts a watch of `resource`'s lease `lock` (its fence) for up to `timeout_ms`, on a
    /// task of its own (see [`watch_in_background`]).
    pub fn watch_in_background(
        &self,
        resource: &str,
        lock: &Value,
        timeout_ms: u64,
    ) -> JoinHandle<(Value, DateTime<Utc>)> {
        let url = self.url(&format!(
            "/locks/{resource}/watch?fence={}&timeout_ms={timeout_ms}",
            fence(lock)
        ));
        watch_in_background(&self.client, url)
    }

    /// `GET /metrics`, checked to be the Prometheus text format, parsed.
    pub async fn metrics(&self) -> crate::Exposition {
        let response = self.get("/metrics").await;
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = header(&response, "content-type");
        assert_eq!(content_type, crate::TEXT_FORMAT);
        crate::Exposition::parse(&response.text().await.expect("metrics text"))
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

/// One `[[tokens]]` entry of an auth file (API.md, *Authentication and scopes*): the token
/// `name`, the SHA-256 of `secret`, its `prefixes` and `permissions`. Further keys of the
/// entry (`max_leases`) may follow it; entries are concatenated into a file.
pub fn token_entry(name: &str, secret: &str, prefixes: &[&str], permissions: &[&str]) -> String {
    format!(
        "[[tokens]]\nname = {name:?}\nsha256 = \"{}\"\nprefixes = {prefixes:?}\npermissions = {permissions:?}\n",
        fencelock_server::auth_file::hex(&fencelock_server::auth_file::sha256(secret.as_bytes()))
    )
}

/// An HTTP client for test servers: no system proxy, and a timeout so that a hung server
/// fails the test instead of stalling it.
pub fn client() -> Client {
    Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client")
}

/// Sends `request` and reads its answer's JSON body, whatever the status; fails the test,
/// naming the request, when either step fails.
pub async fn json_answer(request: RequestBuilder) -> Value {
    let (client, request) = request.build_split();
    let request = request.expect("a well-formed request");
    let sent = format!("{} {}", request.method(), request.url());
    client
        .execute(request)
        .await
        .unwrap_or_else(|e| panic!("{sent}: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("{sent}: no JSON answer: {e}"))
}

/// Starts the watch `url` (a `GET /locks/{resource}/watch?...` of any server) on a task of
/// its own, so that the test can change the lease meanwhile; the task yields the watch's
/// answer and the moment it arrived.
pub fn watch_in_background(client: &Client, url: String) -> JoinHandle<(Value, DateTime<Utc>)> {
    let request = client.get(url);
    tokio::spawn(async move {
        let answer = json_answer(request).await;
        (answer, Utc::now())
    })
}

fn init_logging() {
    static LOGS: std::sync::OnceLock<Option<fencelock_server::LogGuard>> =
        std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        std::env::var_os("TEST_LOG").is_some().then(|| {
            fencelock_server::init_logs(fencelock_server::LogFormat::Text)
                .expect("a valid RUST_LOG")
        })
    });
}

/// The integer `fence` of a `lock` object (or of a whole inspect body).
pub fn fence(lock: &Value) -> i64 {
    lock["fence"]
        .as_i64()
        .unwrap_or_else(|| panic!("no integer fence in {lock}"))
}

/// The keys of a JSON object, in byte order.
pub fn sorted_keys(object: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = object
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {object}"))
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

/// Asserts that `shown` is the lease `lock` (as its holder got it) the way anyone else sees
/// it, by inspect or in a list: exactly its resource, fence and times, no owner and no
/// `fence_token`, and some of its [`TTL`] left.
pub fn assert_public_lock(shown: &Value, lock: &Value) {
    assert_eq!(
        sorted_keys(shown),
        [
            "acquired_at",
            "expires_at",
            "expires_in_ms",
            "fence",
            "resource"
        ],
        "{shown}"
    );
    for field in ["resource", "acquired_at", "expires_at"] {
        assert_eq!(shown[field], lock[field], "{field} of {shown}");
    }
    assert_eq!(fence(shown), fence(lock));
    let left = shown["expires_in_ms"].as_i64().unwrap();
    assert!(left > 0 && left <= TTL * 1000, "expires_in_ms = {left}");
}

/// Asserts an RFC 9457 problem with the given status and type; returns its body.
pub async fn assert_problem(response: Response, status: u16, kind: &str) -> Value {
    assert_eq!(response.status().as_u16(), status, "status");
    let content_type = header(&response, "content-type");
    let path = response.url().path().to_owned();
    let request_id = header(&response, "x-request-id");
    let body: Value = response.json().await.expect("problem body is JSON");
    assert_eq!(content_type, "application/problem+json", "{body}");
    assert_eq!(body["type"], json!(kind), "{body}");
    assert_eq!(body["status"], json!(status), "{body}");
    assert!(body["title"].is_string(), "{body}");
    assert!(body["detail"].is_string(), "{body}");
    assert_eq!(body["instance"], json!(path), "{body}");
    assert!(!request_id.is_empty(), "no X-Request-Id on {body}");
    assert_eq!(body["request_id"], json!(request_id), "{body}");
    body
}

/// Asserts a `422 validation-failed` that names exactly `fields`, in any order; `case` says
/// which request of a table failed. Returns the problem body.
pub async fn assert_invalid(response: Response, fields: &[&str], case: &str) -> Value {
    let problem = assert_problem(response, 422, "validation-failed").await;
    let mut named = invalid_fields(&problem);
    named.sort();
    let mut expected = fields.to_vec();
    expected.sort_unstable();
    assert_eq!(named, expected, "{case}: {problem}");
    problem
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

impl TestApp {
    pub fn socket_address(&self) -> std::net::SocketAddr {
        self.address
            .trim_start_matches("http://")
            .parse()
            .expect("the test address is a socket address")
    }

    /// Sends `request` byte for byte over a fresh connection, as no HTTP client would
    /// (clients normalise paths and refuse bad bytes), and reads the answer.
    pub async fn raw(&self, request: &[u8]) -> crate::raw::RawResponse {
        crate::raw::raw_exchange(self.socket_address(), request).await
    }
}

tokio::task_local! {
    /// The prefix `/locks...` paths get in the current test (see [`under_v1`]).
    static LOCK_PREFIX: &'static str;
}

/// Runs `test` with every `/locks...` request of [`TestApp`] sent to `/v1/locks...`. Tasks
/// the test spawns itself keep the unprefixed paths.
pub async fn under_v1<F: Future>(test: F) -> F::Output {
    LOCK_PREFIX.scope("/v1", test).await
}

/// A response header's value as text; empty when absent or not text.
fn header(response: &Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}
