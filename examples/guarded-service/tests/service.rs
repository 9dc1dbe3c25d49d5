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

/// What the database holds for `key`: the document, and the guard's highest fence.
async fn stored(db: &tokio_postgres::Client, key: &str) -> (Option<String>, Option<i64>) {
    let body = db
        .query_opt("SELECT body FROM docs WHERE key = $1", &[&key])
        .await
        .unwrap()
        .map(|row| row.get(0));
    let fence = db
        .query_opt("SELECT fence FROM fence_guard WHERE key = $1", &[&key])
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

    let admitted =
        test::call_service(&app, put("report", Some("5"), "by fence 5").to_request()).await;
    assert_eq!(admitted.status(), StatusCode::NO_CONTENT);
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

    let (status, body) =
        problem(test::call_service(&app, put("report", None, "no fence").to_request()).await).await;
    assert_eq!(
        (status, &body["type"]),
        (
            StatusCode::PRECONDITION_REQUIRED,
            &"fencing-token-required".into()
        ),
        "{body}"
    );
    let (status, body) = problem(
        test::call_service(
            &app,
            put("report", Some("five"), "not a fence").to_request(),
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, &body["type"]),
        (StatusCode::BAD_REQUEST, &"malformed-request".into()),
        "{body}"
    );
    assert_eq!(
        stored(&conn, "report").await,
        (Some("by fence 5".to_owned()), Some(5))
    );

    // An equal or greater fence still writes: the lease that wrote 5, or a newer one.
    let again = test::call_service(
        &app,
        put("report", Some("5"), "by fence 5, again").to_request(),
    )
    .await;
    assert_eq!(again.status(), StatusCode::NO_CONTENT);
    let newer = test::call_service(&app, put("report", Some("8"), "by fence 8").to_request()).await;
    assert_eq!(newer.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        stored(&conn, "report").await,
        (Some("by fence 8".to_owned()), Some(8))
    );

    // The guard counted what it decided: three writes admitted, one stale.
    let metrics =
        test::call_service(&app, test::TestRequest::get().uri("/metrics").to_request()).await;
    let metrics = String::from_utf8(test::read_body(metrics).await.to_vec()).unwrap();
    for line in [
        r#"fencelock_guard_writes_total{outcome="admitted"} 3"#,
        r#"fencelock_guard_writes_total{outcome="stale"} 1"#,
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in:\n{metrics}"
        );
    }
}

#[actix_web::test]
async fn a_guard_with_fence_keys_refuses_a_bare_fence() {
    let db = TestDatabase::create().await;
    let key =
        FenceKey::from_bytes(b"a fence key of at least 32 bytes, for tests".to_vec()).unwrap();
    let (service, conn) = service(&db, FenceKeys::new(vec![key.clone()])).await;
    let app = test::init_service(App::new().configure(|cfg| service.configure(cfg))).await;

    let bare = test::call_service(
        &app,
        put("ledger", Some("7"), "by a bare fence").to_request(),
    )
    .await;
    let (status, body) = problem(bare).await;
    assert_eq!(
        (status, &body["type"]),
        (StatusCode::FORBIDDEN, &"invalid-fence-token".into()),
        "{body}"
    );
    let other = key.sign("another-key", Fence::new(7).unwrap());
    let (status, body) = problem(
        test::call_service(
            &app,
            put("ledger", Some(&other), "signed for another key").to_request(),
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, &body["type"]),
        (StatusCode::FORBIDDEN, &"invalid-fence-token".into()),
        "{body}"
    );
    assert_eq!(stored(&conn, "ledger").await, (None, None));

    // The token the lease server signed for this key is admitted.
    let signed = key.sign("ledger", Fence::new(7).unwrap());
    let admitted = test::call_service(
        &app,
        put("ledger", Some(&signed), "by a signed fence").to_request(),
    )
    .await;
    assert_eq!(admitted.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        stored(&conn, "ledger").await,
        (Some("by a signed fence".to_owned()), Some(7))
    );
}
