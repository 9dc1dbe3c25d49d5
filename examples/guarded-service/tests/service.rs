//! The service against a fresh PostgreSQL database: what the guard admits, what it refuses,
//! and that a refused write leaves nothing behind.
//!
//! PostgreSQL is found at `FENCELOCK_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); a database that cannot be reached fails
//! the test.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use actix_web::body::MessageBody;
use actix_web::dev::ServiceResponse;
use actix_web::http::StatusCode;
use actix_web::{App, test};
use fencelock::domain::{Fence, FenceKey, FenceKeys};
use guarded_service::Service;
use serde_json::Value;
use tokio_postgres::NoTls;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

fn admin_url() -> String {
    std::env::var("FENCELOCK_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

async fn connect(config: &tokio_postgres::Config) -> tokio_postgres::Client {
    let (client, connection) = config.connect(NoTls).await.unwrap_or_else(|e| {
        panic!(
            "PostgreSQL at {} cannot be reached ({e:?}); start it or set FENCELOCK_TEST_DATABASE_URL",
            admin_url()
        )
    });
    actix_web::rt::spawn(connection);
    client
}

/// A database of its own for one test, dropped when this is dropped, even after a failure.
struct TestDatabase {
    admin: tokio_postgres::Config,
    name: String,
}

impl TestDatabase {
    async fn create() -> Self {
        static COUNT: AtomicU32 = AtomicU32::new(0);
        let admin: tokio_postgres::Config = admin_url()
            .parse()
            .expect("FENCELOCK_TEST_DATABASE_URL is a PostgreSQL URL");
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let name = format!(
            "guarded_service_{}_{nanos}_{}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        );
        connect(&admin)
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("creating the test database");
        Self { admin, name }
    }

    fn config(&self) -> tokio_postgres::Config {
        let mut config = self.admin.clone();
        config.dbname(&self.name);
        config
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Dropped inside the test's runtime, which cannot be blocked on: a thread of its own.
        let (admin, name) = (self.admin.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let (client, connection) = admin.connect(NoTls).await?;
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
            })
        })
        .join()
        .expect("the dropping thread ran");
        if let Err(e) = dropped {
            eprintln!("could not drop test database {}: {e}", self.name);
        }
    }
}

/// The service on `db`, its tables created, with the guard's `keys`; and a connection of
/// the test's own, to look at what was written.
async fn service(db: &TestDatabase, keys: FenceKeys) -> (Service, tokio_postgres::Client) {
    let pool = guarded_service::pool(db.config()).unwrap();
    guarded_service::migrate(&pool)
        .await
        .expect("creating the tables");
    (Service::new(pool, keys), connect(&db.config()).await)
}

fn put(key: &str, token: Option<&str>, body: &'static str) -> test::TestRequest {
    let request = test::TestRequest::put()
        .uri(&format!("/docs/{key}"))
        .set_payload(body);
    match token {
        Some(token) => request.insert_header(("Fencing-Token", token)),
        None => request,
    }
}

/// A refusal's status and problem document, which must be `application/problem+json`.
async fn problem<B: MessageBody>(response: ServiceResponse<B>) -> (StatusCode, Value) {
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = test::read_body(response).await;
    assert_eq!(
        content_type.as_deref(),
        Some("application/problem+json"),
        "{status}: {}",
        String::from_utf8_lossy(&body)
    );
    (
        status,
        serde_json::from_slice(&body).expect("a JSON problem document"),
    )
}

/// Sends `request` to `app` and checks that the write is admitted: `204`, no body.
async fn assert_admitted<S, R, B>(app: &S, request: R)
where
    S: actix_web::dev::Service<R, Response = ServiceResponse<B>, Error = actix_web::Error>,
{
    let response = test::call_service(app, request).await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
}

/// Sends `request` to `app` and checks that it is refused with `status` and the problem type
/// `kind`.
async fn assert_refused<S, R, B>(app: &S, request: R, status: StatusCode, kind: &str)
where
    S: actix_web::dev::Service<R, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody,
{
    let (got, body) = problem(test::call_service(app, request).await).await;
    assert_eq!((got, body["type"].as_str()), (status, Some(kind)), "{body}");
}

/// The writes the guard counted, from the text of `GET /metrics`: admitted, stale, and
/// refused for an invalid token.
fn guard_writes(metrics: &[u8]) -> [u64; 3] {
    let metrics = std::str::from_utf8(metrics).unwrap();
    ["admitted", "stale", "invalid_token"].map(|outcome| {
        let sample = format!("fencelock_guard_writes_total{{outcome=\"{outcome}\"}} ");
        let count = metrics.lines().find_map(|line| line.strip_prefix(&sample));
        let count = count.unwrap_or_else(|| panic!("no {sample:?} in:\n{metrics}"));
        count.parse().unwrap()
    })
}

/// What the database holds for `key`: the document, and the guard's highest fence.
async fn stored(db: &tokio_postgres::Client, key: &str) -> (Option<String>, Option<i64>) {
    let body = db
        .query_opt("SELECT body FROM docs WHERE key = $1", &[&key])
        .await
        .unwrap()
        .map(|row| row.get(0));
    let fence = db
        .query_opt(
            "SELECT fence FROM fencelock_guard.fences WHERE key = $1",
            &[&key],
        )
        .await
        .unwrap()
        .map(|row| row.get(0));
    (body, fence)
}

#[actix_web::test]
async fn a_write_with_a_lower_fence_is_refused_and_writes_nothing() {
    let db = TestDatabase::create().await;
    let (service, conn) = service(&db, FenceKeys::default()).await;
    let app = test::init_service(App::new().configure(|cfg| service.configure(cfg))).await;

    assert_admitted(&app, put("report", Some("5"), "by fence 5").to_request()).await;
    assert_eq!(
        stored(&conn, "report").await,
        (Some("by fence 5".to_owned()), Some(5))
    );

    let late = test::call_service(&app, put("report", Some("3"), "by fence 3").to_request()).await;
    let (status, body) = problem(late).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["type"], "stale-fence", "{body}");
    assert_eq!(body["status"], 409, "{body}");
    assert_eq!(body["current_fence"], 5, "{body}");
    assert_eq!(body["instance"], "/docs/report", "{body}");
    // Nothing of the late write: neither its body nor its fence.
    assert_eq!(
        stored(&conn, "report").await,
        (Some("by fence 5".to_owned()), Some(5))
    );
    let read = test::call_service(
        &app,
        test::TestRequest::get().uri("/docs/report").to_request(),
    )
    .await;
    assert_eq!(read.status(), StatusCode::OK);
    assert_eq!(test::read_body(read).await, "by fence 5");

    let no_fence = put("report", None, "no fence").to_request();
    assert_refused(
        &app,
        no_fence,
        StatusCode::PRECONDITION_REQUIRED,
        "fencing-token-required",
    )
    .await;
    let not_a_fence = put("report", Some("five"), "not a fence").to_request();
    assert_refused(
        &app,
        not_a_fence,
        StatusCode::BAD_REQUEST,
        "malformed-request",
    )
    .await;
    assert_eq!(
        stored(&conn, "report").await,
        (Some("by fence 5".to_owned()), Some(5))
    );

    // An equal or greater fence still writes: the lease that wrote 5, or a newer one.
    let again = put("report", Some("5"), "by fence 5, again").to_request();
    assert_admitted(&app, again).await;
    assert_admitted(&app, put("report", Some("8"), "by fence 8").to_request()).await;
    assert_eq!(
        stored(&conn, "report").await,
        (Some("by fence 8".to_owned()), Some(8))
    );

    // The guard counted what it decided: three writes admitted, one stale.
    let metrics = test::TestRequest::get().uri("/metrics").to_request();
    let metrics = test::call_and_read_body(&app, metrics).await;
    assert_eq!(guard_writes(&metrics), [3, 1, 0]);
}

#[actix_web::test]
async fn a_guard_with_fence_keys_refuses_a_bare_fence() {
    let db = TestDatabase::create().await;
    let key =
        FenceKey::from_bytes(b"a fence key of at least 32 bytes, for tests".to_vec()).unwrap();
    let (service, conn) = service(&db, FenceKeys::new(vec![key.clone()])).await;
    let app = test::init_service(App::new().configure(|cfg| service.configure(cfg))).await;

    let bare = put("ledger", Some("7"), "by a bare fence").to_request();
    assert_refused(&app, bare, StatusCode::FORBIDDEN, "invalid-fence-token").await;
    let other = key.sign("another-key", Fence::new(7).unwrap());
    let forged = put("ledger", Some(&other), "signed for another key").to_request();
    assert_refused(&app, forged, StatusCode::FORBIDDEN, "invalid-fence-token").await;
    assert_eq!(stored(&conn, "ledger").await, (None, None));
    // The guard counted both as invalid tokens.
    let metrics = test::TestRequest::get().uri("/metrics").to_request();
    let metrics = test::call_and_read_body(&app, metrics).await;
    assert_eq!(guard_writes(&metrics), [0, 0, 2]);

    // The token the lease server signed for this key is admitted.
    let signed = key.sign("ledger", Fence::new(7).unwrap());
    let admitted = put("ledger", Some(&signed), "by a signed fence").to_request();
    assert_admitted(&app, admitted).await;
    assert_eq!(
        stored(&conn, "ledger").await,
        (Some("by a signed fence".to_owned()), Some(7))
    );
}
