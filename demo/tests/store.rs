//! The demo store over real HTTP, on PostgreSQL and SQLite: the write guard's rules.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::demo_server;
use fencelock::domain::Fence;
use fencelock::domain::{FenceKey, FenceKeys};
use fencelock_demo::docs::Guarding;
use fencelock_server::StoreOptions;
use fencelock_testkit::{
    Exposition, Proxy, RawResponse, StoreKind, TestApp, TestDb, assert_raw_problem,
    contract_stores, postgres_addr, raw_exchange,
};
use serde_json::{Value, json};

/// A demo store on fresh storage, stopped and dropped with this value.
struct TestStore {
    address: String,
    http: reqwest::Client,
    handle: Option<(actix_web::dev::ServerHandle, std::thread::JoinHandle<()>)>,
    db: Arc<TestDb>,
}

impl TestStore {
    async fn spawn(kind: StoreKind, guarding: Guarding) -> Self {
        Self::spawn_with(kind, guarding, StoreOptions::default(), None, Vec::new()).await
    }

    /// A guarded store whose guard takes only tokens signed by `keys`.
    async fn signed(kind: StoreKind, keys: Vec<FenceKey>) -> Self {
        Self::spawn_with(kind, Guarding::On, StoreOptions::default(), None, keys).await
    }

    /// With `via`, the store reaches PostgreSQL through that address (a [`Proxy`]).
    async fn spawn_with(
        kind: StoreKind,
        guarding: Guarding,
        settings: StoreOptions,
        via: Option<SocketAddr>,
        keys: Vec<FenceKey>,
    ) -> Self {
        let db = TestDb::new(kind).await;
        let url = match via {
            Some(addr) => db.url_via(addr),
            None => db.url(),
        };
        let (ready, built) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let server = demo_server(&url, guarding, settings, FenceKeys::new(keys)).await;
                let _ = ready.send((server.port(), server.handle()));
                let _ = server.run_until_stopped().await;
            });
        });
        let (port, handle) = built.await.expect("demo store starts");
        Self {
            address: format!("http://127.0.0.1:{port}"),
            http: fencelock_testkit::client(),
            handle: Some((handle, thread)),
            db,
        }
    }

    /// A guarded store on a fresh PostgreSQL database that it reaches through `proxy`, with
    /// [`short_timeouts`].
    async fn behind(proxy: &Proxy) -> Self {
        let via = Some(proxy.addr());
        Self::spawn_with(
            StoreKind::Postgres,
            Guarding::On,
            short_timeouts(),
            via,
            Vec::new(),
        )
        .await
    }

    /// Runs `sql` on the store's own database, beside the store.
    async fn sabotage(&self, sql: &str) {
        self.db.execute(sql).await;
    }

    /// Writes with `fence` and asserts that the write was applied.
    async fn put_applied(&self, key: &str, fence: &str, body: &Value) {
        let response = self.put(key, Some(fence), body).await;
        assert_eq!(response.status(), 200, "{key} with fence {fence}");
    }

    async fn put(&self, key: &str, fence: Option<&str>, body: &Value) -> reqwest::Response {
        self.put_text(key, fence, Some("application/json"), body.to_string())
            .await
    }

    /// A write with any content type (or none) and any body.
    async fn put_text(
        &self,
        key: &str,
        fence: Option<&str>,
        content_type: Option<&str>,
        body: impl Into<reqwest::Body>,
    ) -> reqwest::Response {
        let mut request = self
            .http
            .put(format!("{}/docs/{key}", self.address))
            .body(body);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        if let Some(fence) = fence {
            request = request.header("Fencing-Token", fence);
        }
        request.send().await.unwrap()
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{path}", self.address))
            .send()
            .await
            .unwrap()
    }

    /// Sends `request` byte for byte over a fresh connection.
    async fn raw(&self, request: &[u8]) -> RawResponse {
        let address = self.address.trim_start_matches("http://").parse().unwrap();
        raw_exchange(address, request).await
    }

    /// A `PUT /docs/{key}` with the given header lines, closing the connection after it.
    async fn raw_put(&self, key: &str, headers: &str, body: &str) -> RawResponse {
        let request = format!(
            "PUT /docs/{key} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.raw(request.as_bytes()).await
    }

    async fn doc(&self, key: &str) -> Value {
        let response = self.get(&format!("/docs/{key}")).await;
        assert_eq!(response.status(), 200);
        response.json().await.unwrap()
    }

    async fn writes(&self, key: &str) -> Vec<Value> {
        let body: Value = self
            .get(&format!("/docs/{key}/writes"))
            .await
            .json()
            .await
            .unwrap();
        body["writes"].as_array().unwrap().clone()
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        if let Some((handle, thread)) = self.handle.take() {
            let _ = std::thread::spawn(move || {
                actix_web::rt::System::new().block_on(handle.stop(false));
            })
            .join();
            let _ = thread.join();
        }
        // The storage goes with the last reference to `db`, after the server has stopped.
    }
}

async fn problem(response: reqwest::Response, status: u16, kind: &str) -> Value {
    assert_eq!(response.status().as_u16(), status);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/problem+json"
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], json!(kind), "{body}");
    body
}

/// Equal and greater fences are applied; a lower one is rejected with `current_fence`,
/// writes nothing, and stays visible in the write log.
async fn guard_orders_writes_by_fence(kind: StoreKind) {
    let store = TestStore::spawn(kind, Guarding::On).await;
    let applied = store.put("doc:1", Some("5"), &json!({ "by": "a" })).await;
    assert_eq!(applied.status(), 200);
    assert_eq!(
        applied.json::<Value>().await.unwrap(),
        json!({ "key": "doc:1", "value": { "by": "a" }, "fence": 5 })
    );
    store.put_applied("doc:1", "5", &json!("again")).await;
    store.put_applied("doc:1", "9", &json!("b")).await;

    let stale = problem(
        store.put("doc:1", Some("7"), &json!("late")).await,
        409,
        "stale-fence",
    )
    .await;
    assert_eq!(stale["current_fence"], json!(9));

    let doc = store.doc("doc:1").await;
    assert_eq!(doc["value"], json!("b"));
    assert_eq!(doc["fence"], json!(9));
    assert!(doc["updated_at"].as_str().unwrap().ends_with('Z'));

    let writes = store.writes("doc:1").await;
    let summary: Vec<(i64, &str)> = writes
        .iter()
        .map(|w| (w["fence"].as_i64().unwrap(), w["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(
        summary,
        [
            (5, "applied"),
            (5, "applied"),
            (9, "applied"),
            (7, "rejected")
        ]
    );
    assert!(writes.iter().all(|w| w["at"].is_string()));
}

/// The guard counts its decisions, and the store serves them at `GET /metrics`; a write the
/// guard never saw (no `Fencing-Token`) is not counted.
async fn guard_decisions_are_counted_in_metrics(kind: StoreKind) {
    let store = TestStore::spawn(kind, Guarding::On).await;
    store.put_applied("doc:1", "5", &json!("fresh")).await;
    let stale = store.put("doc:1", Some("3"), &json!("late")).await;
    problem(stale, 409, "stale-fence").await;
    let unfenced = store.put("doc:1", None, &json!("no token")).await;
    assert_eq!(unfenced.status(), 428);

    let response = store.get("/metrics").await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        fencelock_testkit::TEXT_FORMAT
    );
    let text = response.text().await.unwrap();
    let metrics = Exposition::parse(&text);
    let writes = |outcome| metrics.value("fencelock_guard_writes_total", &[("outcome", outcome)]);
    assert_eq!(writes("admitted"), 1.0, "{text}");
    assert_eq!(writes("stale"), 1.0, "{text}");
    assert_eq!(writes("invalid_token"), 0.0, "{text}");
    assert_eq!(metrics.family("fencelock_guard_writes_total").len(), 3);
    assert_eq!(
        metrics.value(
            "fencelock_http_requests_total",
            &[
                ("route", "/docs/{key}"),
                ("method", "PUT"),
                ("status", "409")
            ]
        ),
        1.0
    );
    assert!(!text.contains("doc:1"), "{text}");
}

/// Keys are independent: a high fence on one key does not block another.
async fn keys_are_guarded_separately(kind: StoreKind) {
    let store = TestStore::spawn(kind, Guarding::On).await;
    store.put_applied("a", "100", &json!(1)).await;
    store.put_applied("b", "1", &json!(2)).await;
}

/// Missing header: `428`; anything but a positive integer in canonical decimal (no sign, no
/// leading zero): `400`.
async fn fencing_token_is_required_and_checked(kind: StoreKind) {
    let store = TestStore::spawn(kind, Guarding::On).await;
    problem(
        store.put("doc:1", None, &json!(1)).await,
        428,
        "fencing-token-required",
    )
    .await;
    for bad in [
        "abc",
        "0",
        "-5",
        "1.5",
        "",
        "9007199254740992",
        "01",
        "+1",
        "0100",
    ] {
        problem(
            store.put("doc:1", Some(bad), &json!(1)).await,
            400,
            "malformed-request",
        )
        .await;
    }
    problem(store.get("/docs/doc:1").await, 404, "not-found").await;
    assert!(store.writes("doc:1").await.is_empty());
}

/// Any JSON value is a document; bodies follow the same rules as the lease server.
async fn any_json_value_is_stored(kind: StoreKind) {
    let store = TestStore::spawn(kind, Guarding::On).await;
    let values = [
        json!(null),
        json!(3.5),
        json!("text"),
        json!([1, { "a": true }]),
        json!({}),
    ];
    for (i, value) in values.iter().enumerate() {
        let fence = (i + 1).to_string();
        store.put_applied("doc:v", &fence, value).await;
        assert_eq!(&store.doc("doc:v").await["value"], value);
    }
    let no_type = store.put_text("doc:v", Some("10"), None, "1").await;
    problem(no_type, 415, "unsupported-media-type").await;
    let json = Some("application/json");
    let broken = store.put_text("doc:v", Some("10"), json, "{").await;
    problem(broken, 400, "malformed-request").await;
    problem(
        store.put("bad%20key", Some("1"), &json!(1)).await,
        422,
        "validation-failed",
    )
    .await;
}

/// Many writers with mixed fences, many rounds: the document always ends with the value of
/// the highest fence, and applied fences never go down in the log.
async fn concurrent_writers_leave_the_highest_fence(kind: StoreKind) {
    let store = Arc::new(TestStore::spawn(kind, Guarding::On).await);
    for round in 0..8 {
        let key = format!("race-{round}");
        let fences: Vec<i64> = (0..24).map(|_| fastrand::i64(1..=1000)).collect();
        let tasks: Vec<_> = fences
            .iter()
            .map(|&fence| {
                let (store, key) = (store.clone(), key.clone());
                tokio::spawn(async move {
                    let response = store
                        .put(&key, Some(&fence.to_string()), &json!(fence))
                        .await;
                    assert!(
                        [200, 409].contains(&response.status().as_u16()),
                        "{}",
                        response.status()
                    );
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let highest = *fences.iter().max().unwrap();
        let doc = store.doc(&key).await;
        assert_eq!(doc["fence"], json!(highest), "{key}");
        assert_eq!(doc["value"], json!(highest), "{key}");

        let writes = store.writes(&key).await;
        assert_eq!(writes.len(), fences.len());
        let applied: Vec<i64> = writes
            .iter()
            .filter(|w| w["outcome"] == json!("applied"))
            .map(|w| w["fence"].as_i64().unwrap())
            .collect();
        assert!(applied.windows(2).all(|w| w[0] <= w[1]), "{applied:?}");
        let mut highest_so_far = 0;
        for write in &writes {
            let fence = write["fence"].as_i64().unwrap();
            match write["outcome"].as_str().unwrap() {
                "applied" => {
                    assert!(fence >= highest_so_far);
                    highest_so_far = fence;
                }
                _ => assert!(
                    fence < highest_so_far,
                    "rejected {fence} at {highest_so_far}"
                ),
            }
        }
    }
}

/// With the guard off a late, lower fence overwrites: the damage fencing prevents.
async fn without_the_guard_late_writes_win(kind: StoreKind) {
    let store = TestStore::spawn(kind, Guarding::Off).await;
    store.put_applied("doc:1", "9", &json!("b")).await;
    store.put_applied("doc:1", "7", &json!("late")).await;
    assert_eq!(store.doc("doc:1").await["value"], json!("late"));
}

/// A bug (here: a schema the store's statements no longer fit) is a `500 internal`, not a
/// `503`: retrying would not help, and the caller must not be told to.
async fn a_broken_schema_is_a_500_not_a_503(kind: StoreKind) {
    let store = TestStore::spawn(kind, Guarding::On).await;
    store.put_applied("doc:1", "1", &json!(1)).await;
    store
        .sabotage("ALTER TABLE doc_writes RENAME COLUMN outcome TO gone")
        .await;
    let put = store.put("doc:1", Some("2"), &json!(2)).await;
    assert!(!put.headers().contains_key("retry-after"));
    problem(put, 500, "internal").await;
    problem(store.get("/docs/doc:1/writes").await, 500, "internal").await;
    // The write that failed took no effect.
    assert_eq!(store.doc("doc:1").await["value"], json!(1));
}

/// Reads `/docs/{key}/writes` with `query`, expecting `200`.
async fn writes_page(store: &TestStore, key: &str, query: &str) -> Value {
    let response = store.get(&format!("/docs/{key}/writes{query}")).await;
    assert_eq!(response.status(), 200, "{query}");
    response.json().await.unwrap()
}

/// The whole log of `key`, page by page of `limit`, checking each page's size and `next`.
async fn all_pages(store: &TestStore, key: &str, limit: usize) -> (Vec<Value>, usize) {
    let (mut writes, mut pages, mut after) = (Vec::new(), 0, None::<i64>);
    loop {
        let query = match after {
            Some(after) => format!("?limit={limit}&after={after}"),
            None => format!("?limit={limit}"),
        };
        let page = writes_page(store, key, &query).await;
        pages += 1;
        let entries = page["writes"].as_array().unwrap().clone();
        assert!(entries.len() <= limit, "{query}: {} entries", entries.len());
        match page["next"].as_i64() {
            Some(next) => {
                assert_eq!(entries.len(), limit, "only a full page has a next");
                assert_eq!(json!(next), entries.last().unwrap()["id"]);
                after = Some(next);
            }
            None => {
                assert_eq!(page["next"], Value::Null);
                writes.extend(entries);
                return (writes, pages);
            }
        }
        writes.extend(entries);
        assert!(pages < 1000, "paging does not end");
    }
}

/// `GET /docs/{key}/writes` pages through the log: every write exactly once, oldest first,
/// whatever the page size; `next` is `null` on the last page, which is never an empty page
/// after a full one; other keys' writes never appear.
async fn the_write_log_is_paged(kind: StoreKind) {
    let store = TestStore::spawn(kind, Guarding::On).await;
    for fence in 1..=250 {
        // Every tenth write is late, so rejected entries are paged too.
        let sent = if fence % 10 == 0 { fence - 5 } else { fence };
        let status = store
            .put("doc:log", Some(&sent.to_string()), &json!(fence))
            .await
            .status();
        assert!([200, 409].contains(&status.as_u16()), "{status}");
        if fence % 50 == 0 {
            store.put_applied("doc:other", "1", &json!(0)).await;
        }
    }
    let expected: Vec<i64> = (1..=250)
        .map(|f| if f % 10 == 0 { f - 5 } else { f })
        .collect();

    for (limit, pages) in [(100, 3), (125, 2), (7, 36), (1000, 1)] {
        let (writes, seen) = all_pages(&store, "doc:log", limit).await;
        let fences: Vec<i64> = writes
            .iter()
            .map(|w| w["fence"].as_i64().unwrap())
            .collect();
        assert_eq!(fences, expected, "limit={limit}");
        let ids: Vec<i64> = writes.iter().map(|w| w["id"].as_i64().unwrap()).collect();
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "limit={limit}: {ids:?}"
        );
        assert_eq!(seen, pages, "limit={limit}");
        let rejected = writes.iter().filter(|w| w["outcome"] == "rejected").count();
        assert_eq!(rejected, 25, "limit={limit}");
        assert!(writes.iter().all(|w| w["at"].is_string()));
    }

    // No parameters: the first 100, and where to go on.
    let first = writes_page(&store, "doc:log", "").await;
    assert_eq!(first["writes"].as_array().unwrap().len(), 100);
    assert_eq!(first["next"], first["writes"][99]["id"]);
    // After the last entry: an empty last page. An unknown key: the same.
    let last_id = all_pages(&store, "doc:log", 1000).await.0[249]["id"].clone();
    let beyond = writes_page(&store, "doc:log", &format!("?after={last_id}")).await;
    assert_eq!(beyond, json!({ "writes": [], "next": null }));
    let none = writes_page(&store, "doc:none", "").await;
    assert_eq!(none, json!({ "writes": [], "next": null }));
    assert_eq!(store.writes("doc:other").await.len(), 5);
}

/// A bad `limit` or `after`, a repeated or unknown parameter: `422 validation-failed`
/// naming the parameter, before the store is asked.
async fn bad_page_parameters_are_422(kind: StoreKind) {
    let store = TestStore::spawn(kind, Guarding::On).await;
    store.put_applied("doc:1", "1", &json!(1)).await;
    let cases = [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=-1", "limit"),
        ("limit=1.5", "limit"),
        ("limit=abc", "limit"),
        ("limit=", "limit"),
        ("limit=1e2", "limit"),
        ("limit=99999999999999999999999999", "limit"),
        ("limit=5&limit=6", "limit"),
        ("after=-1", "after"),
        ("after=abc", "after"),
        ("after=1.5", "after"),
        ("after=", "after"),
        ("after=99999999999999999999999999", "after"),
        ("limt=5", "limt"),
    ];
    for (query, field) in cases {
        let body = problem(
            store.get(&format!("/docs/doc:1/writes?{query}")).await,
            422,
            "validation-failed",
        )
        .await;
        assert_eq!(body["errors"][0]["field"], json!(field), "{query}: {body}");
        assert!(body["errors"][0]["message"].is_string());
    }
    let both = problem(
        store.get("/docs/bad%20key/writes?limit=0").await,
        422,
        "validation-failed",
    )
    .await;
    let named: Vec<&str> = both["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(named, ["key", "limit"]);
}

/// What each operation of the demo store can answer, beyond the HTTP layer's own refusals
/// (`400`, `408`, `414`, `431`), which every operation documents.
const OPERATIONS: [(&str, &[u16]); 7] = [
    (
        "PUT /docs/{key}",
        &[200, 403, 409, 413, 415, 422, 428, 500, 503],
    ),
    ("GET /docs/{key}", &[200, 404, 422, 500, 503]),
    ("GET /docs/{key}/writes", &[200, 422, 500, 503]),
    ("GET /metrics", &[200]),
    ("GET /openapi.json", &[200]),
    ("GET /page/state", &[200, 422, 500, 503]),
    ("POST /page/runs", &[202, 413, 415, 422, 429, 500]),
];

async fn the_document_matches_the_store(kind: StoreKind) {
    use fencelock_testkit::openapi::{
        assert_serves_exactly, assert_slugs, fetch_document, statuses,
    };
    let store = TestStore::spawn(kind, Guarding::On).await;
    let document = fetch_document(&store.address).await;
    let expected: std::collections::BTreeMap<String, std::collections::BTreeSet<u16>> = OPERATIONS
        .into_iter()
        .map(|(operation, statuses)| {
            let all = statuses
                .iter()
                .chain(&[400, 408, 414, 431])
                .copied()
                .collect();
            (operation.to_owned(), all)
        })
        .collect();
    assert_eq!(statuses(&document), expected);
    assert_slugs(
        &document,
        &[
            ("/docs/{key}", "PUT", 409, &["stale-fence"]),
            ("/docs/{key}", "PUT", 428, &["fencing-token-required"]),
            ("/docs/{key}", "PUT", 403, &["invalid-fence-token"]),
            ("/page/runs", "POST", 429, &["quota-exceeded"]),
        ],
    );
    // `/` and the page's files are served, but are not JSON: the document leaves them out.
    let not_served = ["/docs", "/docs/a/b", "/healthz", "/page", "/page/runs/1"];
    assert_serves_exactly(
        &store.address,
        &document,
        &[("key", "doc:openapi")],
        &not_served,
    )
    .await;
}

fn random_key() -> FenceKey {
    FenceKey::from_bytes((0..32).map(|_| rand::random::<u8>()).collect()).unwrap()
}

/// A store with the lease server's key takes the holder's `fence_token`, and refuses with
/// `403 invalid-fence-token` a bare fence (even the largest), a forged token and a token of
/// another resource, and with `400 malformed-request` what is no token at all (the holder's
/// token with its fence respelled, `01.` for `1.`, or its signature lengthened), writing
/// nothing and logging nothing; only the `403`s count as invalid tokens.
async fn with_keys_only_the_holders_signed_token_writes(kind: StoreKind) {
    let key = random_key();
    let signing = key.clone();
    let leases = TestApp::spawn_on(TestDb::new(kind).await, move |settings| {
        settings.fence_key = Some(signing);
    })
    .await;
    let store = TestStore::signed(kind, vec![key.clone()]).await;

    let lock = leases.acquire_ok("doc:1", "holder", 30).await;
    let token = lock["fence_token"]
        .as_str()
        .expect("a fence_token")
        .to_owned();
    let fence = Fence::new(lock["fence"].as_i64().unwrap()).unwrap();
    store
        .put_applied("doc:1", &token, &json!("the holder's"))
        .await;

    let other = leases.acquire_ok("doc:2", "holder", 30).await;
    let forger = random_key();
    for refused in [
        fence.to_string(),
        "9007199254740991".to_owned(),
        forger.sign("doc:1", Fence::new(fence.get() + 1).unwrap()),
        other["fence_token"].as_str().unwrap().to_owned(),
        key.sign("doc:2", fence),
        format!("{}.{}", fence.get() + 1, token.split_once('.').unwrap().1),
    ] {
        let response = store.put("doc:1", Some(&refused), &json!("forged")).await;
        let body = problem(response, 403, "invalid-fence-token").await;
        assert!(body.get("current_fence").is_none(), "{body}");
    }
    for malformed in [
        // The holder's own token with its fence respelled: the fence of a token is read only
        // in the canonical spelling the server signs, so this is no token at all.
        format!("0{token}"),
        format!("{token}A"),
        "garbage".to_owned(),
    ] {
        let response = store.put("doc:1", Some(&malformed), &json!("forged")).await;
        let body = problem(response, 400, "malformed-request").await;
        assert!(body.get("current_fence").is_none(), "{body}");
    }

    assert_eq!(store.doc("doc:1").await["value"], json!("the holder's"));
    assert_eq!(
        store.writes("doc:1").await.len(),
        1,
        "refused writes are not logged"
    );
    // The holder is not blocked by anything refused: it writes again.
    store.put_applied("doc:1", &token, &json!("again")).await;

    let text = store.get("/metrics").await.text().await.unwrap();
    let metrics = Exposition::parse(&text);
    let writes = |outcome| metrics.value("fencelock_guard_writes_total", &[("outcome", outcome)]);
    assert_eq!(writes("invalid_token"), 6.0, "{text}");
    assert_eq!(writes("admitted"), 2.0, "{text}");
    assert_eq!(writes("stale"), 0.0, "{text}");
}

/// A guard given [new, old] admits tokens signed with either; the fences are then compared as
/// ever.
async fn rotated_keys_admit_tokens_of_either(kind: StoreKind) {
    let (new, old) = (random_key(), random_key());
    let store = TestStore::signed(kind, vec![new.clone(), old.clone()]).await;
    let fence = |n| Fence::new(n).unwrap();
    store
        .put_applied("doc:1", &old.sign("doc:1", fence(1)), &json!("old"))
        .await;
    store
        .put_applied("doc:1", &new.sign("doc:1", fence(2)), &json!("new"))
        .await;
    let late = store
        .put("doc:1", Some(&old.sign("doc:1", fence(1))), &json!("late"))
        .await;
    problem(late, 409, "stale-fence").await;
    let unknown = store
        .put(
            "doc:1",
            Some(&random_key().sign("doc:1", fence(3))),
            &json!("x"),
        )
        .await;
    problem(unknown, 403, "invalid-fence-token").await;
    assert_eq!(store.doc("doc:1").await["value"], json!("new"));
}

contract_stores!(
    with_keys_only_the_holders_signed_token_writes,
    rotated_keys_admit_tokens_of_either,
    the_document_matches_the_store,
    the_write_log_is_paged,
    bad_page_parameters_are_422,
    guard_orders_writes_by_fence,
    keys_are_guarded_separately,
    guard_decisions_are_counted_in_metrics,
    fencing_token_is_required_and_checked,
    any_json_value_is_stored,
    concurrent_writers_leave_the_highest_fence,
    without_the_guard_late_writes_win,
    a_broken_schema_is_a_500_not_a_503,
    control_byte_in_fencing_token_is_a_problem,
    dot_segment_keys_are_422,
    encoded_bodies_are_415,
    numbers_beyond_float_range_are_422,
);

/// Short, so a test of a partition takes seconds.
const SHORT_STORE_TIMEOUT: Duration = Duration::from_secs(1);
/// Generous slack over the store timeout for a loaded test machine; a hang is far longer.
const MARGIN: Duration = Duration::from_secs(4);

fn short_timeouts() -> StoreOptions {
    StoreOptions {
        timeout: SHORT_STORE_TIMEOUT,
        ..StoreOptions::default()
    }
}

async fn assert_unavailable(response: reqwest::Response) {
    assert!(
        response.headers().contains_key("retry-after"),
        "503 without Retry-After"
    );
    problem(response, 503, "store-unavailable").await;
}

/// Sends a request through `send`, failing the test if no answer comes within the store
/// timeout plus [`MARGIN`].
async fn answered_in_time(
    send: impl Future<Output = reqwest::Response>,
    what: &str,
) -> reqwest::Response {
    let started = Instant::now();
    let response = tokio::time::timeout(SHORT_STORE_TIMEOUT + MARGIN, send)
        .await
        .unwrap_or_else(|_| panic!("{what} hung for {:?}", started.elapsed()));
    assert!(started.elapsed() < SHORT_STORE_TIMEOUT + MARGIN);
    response
}

/// Retries `send` until it answers `200`, failing the test after a few seconds.
async fn heals(mut send: impl AsyncFnMut() -> reqwest::Response, what: &str) -> reqwest::Response {
    let deadline = Instant::now() + SHORT_STORE_TIMEOUT + MARGIN * 2;
    loop {
        let response = answered_in_time(send(), what).await;
        if response.status() == 200 {
            return response;
        }
        assert!(
            Instant::now() < deadline,
            "{what} still answers {} after the network healed",
            response.status()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A network partition between the demo store and PostgreSQL (nothing arrives, nothing is
/// reset): a write answers `503 store-unavailable` with `Retry-After` within its store timeout
/// instead of hanging, reads too, and once the network heals the store serves again. The
/// write answered `503` never took effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_answers_503_within_the_store_timeout_then_heals() {
    let proxy = Proxy::start(postgres_addr());
    let store = TestStore::behind(&proxy).await;
    store.put_applied("doc:1", "1", &json!("before")).await;

    proxy.freeze();
    let during = answered_in_time(
        store.put("doc:1", Some("2"), &json!("during")),
        "a write during the partition",
    )
    .await;
    assert_unavailable(during).await;
    assert_unavailable(answered_in_time(store.get("/docs/doc:1"), "a read").await).await;
    assert_unavailable(answered_in_time(store.get("/docs/doc:1/writes"), "the log").await).await;

    proxy.thaw();
    heals(
        async || store.put("doc:1", Some("3"), &json!("after")).await,
        "a write after the partition",
    )
    .await;
    let doc = store.doc("doc:1").await;
    assert_eq!((&doc["value"], &doc["fence"]), (&json!("after"), &json!(3)));
    let fences: Vec<i64> = store
        .writes("doc:1")
        .await
        .iter()
        .map(|w| w["fence"].as_i64().unwrap())
        .collect();
    assert!(
        !fences.contains(&2),
        "the write answered 503 took effect: {fences:?}"
    );
}

/// Started while PostgreSQL is unreachable, the demo store serves anyway: `503` at once
/// where the store is needed, then, once the database answers, it creates its tables and
/// serves without a restart (as the lease server does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_starts_without_postgres_and_serves_once_it_answers() {
    let proxy = Proxy::start(postgres_addr());
    proxy.cut();
    let store = TestStore::behind(&proxy).await;
    assert_unavailable(answered_in_time(store.put("doc:1", Some("1"), &json!(1)), "a write").await)
        .await;
    assert_unavailable(answered_in_time(store.get("/docs/doc:1"), "a read").await).await;

    proxy.thaw();
    heals(
        async || store.put("doc:1", Some("1"), &json!(1)).await,
        "a write once PostgreSQL answers",
    )
    .await;
    assert_eq!(store.doc("doc:1").await["fence"], json!(1));
}

// The HTTP edge: requests the parser refuses, dot-segment keys, encoded bodies and numbers
// beyond float range, sent byte for byte. The demo store shares the lease server's body
// reader and problem rendering, so the same rules hold.

const JSON: &str = "Content-Type: application/json\r\n";

/// A control byte in `Fencing-Token` is refused by the HTTP parser itself: still a problem,
/// and counted.
async fn control_byte_in_fencing_token_is_a_problem(kind: StoreKind) {
    let store = TestStore::spawn(kind, Guarding::On).await;
    let headers = format!("{JSON}Fencing-Token: 1\x01\r\n");
    let document = assert_raw_problem(
        &store.raw_put("doc:1", &headers, "1").await,
        400,
        "malformed-request",
    );
    assert_eq!(document["instance"], "/docs/doc:1");
    let read = store
        .raw(b"GET /docs/doc:1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!(read.status, 404, "nothing was written");
    // Counted among the store's answers, as the lease server counts its own.
    let text = store.get("/metrics").await.text().await.unwrap();
    let labels = [("route", "unmatched"), ("method", "PUT"), ("status", "400")];
    assert_eq!(
        Exposition::parse(&text).value("fencelock_http_requests_total", &labels),
        1.0,
        "{text}"
    );
}

/// `.` and `..` are no keys (clients rewrite them), `422`; names with dots are fine.
async fn dot_segment_keys_are_422(kind: StoreKind) {
    let store = TestStore::spawn(kind, Guarding::On).await;
    let headers = format!("{JSON}Fencing-Token: 1\r\n");
    for key in [".", "..", "%2E", "%2E%2E"] {
        assert_raw_problem(
            &store.raw_put(key, &headers, "1").await,
            422,
            "validation-failed",
        );
    }
    assert_eq!(store.raw_put("a..b", &headers, "1").await.status, 200);
}

/// A compressed body is `415`, before its size or syntax is looked at.
async fn encoded_bodies_are_415(kind: StoreKind) {
    let store = TestStore::spawn(kind, Guarding::On).await;
    let big = "1".repeat(20 * 1024);
    for body in ["1", "{", big.as_str()] {
        let headers = format!("{JSON}Fencing-Token: 1\r\nContent-Encoding: gzip\r\n");
        assert_raw_problem(
            &store.raw_put("doc:1", &headers, body).await,
            415,
            "unsupported-media-type",
        );
    }
}

/// A number beyond float range is valid JSON that cannot be held as a value: `422` on
/// `value`, not the `400` of a body that is not JSON.
async fn numbers_beyond_float_range_are_422(kind: StoreKind) {
    let store = TestStore::spawn(kind, Guarding::On).await;
    let headers = format!("{JSON}Fencing-Token: 1\r\n");
    let digits = "9".repeat(400);
    for body in ["1e400", r#"{"a": -1e400}"#, &format!("[{digits}]")] {
        let document = assert_raw_problem(
            &store.raw_put("doc:1", &headers, body).await,
            422,
            "validation-failed",
        );
        assert_eq!(document["errors"][0]["field"], "value", "{document}");
    }
    assert_raw_problem(
        &store.raw_put("doc:1", &headers, "1e").await,
        400,
        "malformed-request",
    );
}
