//! The demo store at the HTTP edge, on PostgreSQL and SQLite: requests its HTTP parser
//! refuses, keys that are dot segments, encoded bodies and numbers beyond float range. It
//! shares the lease server's body reader and problem rendering, so the same rules hold.

use std::net::SocketAddr;
use std::time::Duration;

use fencelock_demo::app::DemoServer;
use fencelock_demo::docs::{self, Guarding};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// A demo store on fresh storage; stopped, and its database dropped, with this value.
struct Store {
    address: SocketAddr,
    handle: Option<(actix_web::dev::ServerHandle, std::thread::JoinHandle<()>)>,
    database: Option<String>,
    _dir: tempfile::TempDir,
}

fn admin_url() -> String {
    std::env::var("FENCELOCK_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

async fn admin(sql: String) {
    let (client, connection) = tokio_postgres::connect(&admin_url(), tokio_postgres::NoTls)
        .await
        .expect("PostgreSQL for tests is reachable");
    tokio::spawn(connection);
    client.batch_execute(&sql).await.expect(&sql);
}

impl Store {
    async fn spawn(postgres: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (url, database) = if postgres {
            let name = format!("fencelock_demo_edge_{:016x}", fastrand::u64(..));
            admin(format!("CREATE DATABASE {name}")).await;
            let base = admin_url();
            let (server, _) = base.rsplit_once('/').unwrap();
            (format!("{server}/{name}"), Some(name))
        } else {
            let url = format!("sqlite://{}", dir.path().join("docs.db").display());
            (url, None)
        };
        let (ready, built) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let docs = docs::open(Some(&url), Guarding::On)
                    .await
                    .expect("store opens");
                let server = DemoServer::build("127.0.0.1:0".parse().unwrap(), docs).unwrap();
                let _ = ready.send((server.port(), server.handle()));
                let _ = server.run_until_stopped().await;
            });
        });
        let (port, handle) = built.await.expect("demo store starts");
        Self {
            address: SocketAddr::from(([127, 0, 0, 1], port)),
            handle: Some((handle, thread)),
            database,
            _dir: dir,
        }
    }

    /// Sends `request` as it is over a fresh connection; the status, the headers (lower
    /// case) and the body of the answer.
    async fn raw(&self, request: &[u8]) -> (u16, String, Vec<u8>) {
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(self.address).await.unwrap();
            let _ = stream.write_all(request).await;
            let mut received = Vec::new();
            let _ = stream.read_to_end(&mut received).await;
            received
        };
        let received = tokio::time::timeout(Duration::from_secs(15), exchange)
            .await
            .expect("the demo store answers within 15 s");
        let end = received
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no answer: {:?}", String::from_utf8_lossy(&received)));
        let head = String::from_utf8_lossy(&received[..end]).to_ascii_lowercase();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head, received[end + 4..].to_vec())
    }

    /// A `PUT /docs/{key}` that closes the connection after its answer.
    async fn put(&self, key: &str, headers: &str, body: &str) -> (u16, String, Vec<u8>) {
        let request = format!(
            "PUT /docs/{key} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.raw(request.as_bytes()).await
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Some((handle, thread)) = self.handle.take() {
            let _ = std::thread::spawn(move || {
                actix_web::rt::System::new().block_on(handle.stop(false));
            })
            .join();
            let _ = thread.join();
        }
        if let Some(name) = self.database.take() {
            let _ = std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(admin(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
            })
            .join();
        }
    }
}

/// Asserts a problem answer with the given status and type; returns the document.
fn problem((status, head, body): (u16, String, Vec<u8>), expected: u16, kind: &str) -> Value {
    let document: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| panic!("no JSON body: {head} {:?}", String::from_utf8_lossy(&body)));
    assert_eq!(status, expected, "{document}");
    assert!(
        head.contains("content-type: application/problem+json"),
        "{head}"
    );
    assert_eq!(document["type"], json!(kind), "{document}");
    for member in ["title", "detail", "instance"] {
        assert!(document[member].is_string(), "{member} in {document}");
    }
    document
}

const JSON: &str = "Content-Type: application/json\r\n";

/// A control byte in `Fencing-Token` is refused by the HTTP parser itself: still a problem.
async fn control_byte_in_fencing_token_is_a_problem(postgres: bool) {
    let store = Store::spawn(postgres).await;
    let headers = format!("{JSON}Fencing-Token: 1\x01\r\n");
    let document = problem(
        store.put("doc:1", &headers, "1").await,
        400,
        "malformed-request",
    );
    assert_eq!(document["instance"], "/docs/doc:1");
    let (status, _, _) = store
        .raw(b"GET /docs/doc:1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!(status, 404, "nothing was written");
}

/// `.` and `..` are no keys (clients rewrite them), `422`; names with dots are fine.
async fn dot_segment_keys_are_422(postgres: bool) {
    let store = Store::spawn(postgres).await;
    let headers = format!("{JSON}Fencing-Token: 1\r\n");
    for key in [".", "..", "%2E", "%2E%2E"] {
        problem(
            store.put(key, &headers, "1").await,
            422,
            "validation-failed",
        );
    }
    assert_eq!(store.put("a..b", &headers, "1").await.0, 200);
}

/// A compressed body is `415`, before its size or syntax is looked at.
async fn encoded_bodies_are_415(postgres: bool) {
    let store = Store::spawn(postgres).await;
    let big = "1".repeat(20 * 1024);
    for body in ["1", "{", big.as_str()] {
        let headers = format!("{JSON}Fencing-Token: 1\r\nContent-Encoding: gzip\r\n");
        problem(
            store.put("doc:1", &headers, body).await,
            415,
            "unsupported-media-type",
        );
    }
}

/// A number beyond float range is valid JSON that cannot be held as a value: `422` on
/// `value`, not the `400` of a body that is not JSON.
async fn numbers_beyond_float_range_are_422(postgres: bool) {
    let store = Store::spawn(postgres).await;
    let headers = format!("{JSON}Fencing-Token: 1\r\n");
    let digits = "9".repeat(400);
    for body in ["1e400", r#"{"a": -1e400}"#, &format!("[{digits}]")] {
        let document = problem(
            store.put("doc:1", &headers, body).await,
            422,
            "validation-failed",
        );
        assert_eq!(document["errors"][0]["field"], "value", "{document}");
    }
    problem(
        store.put("doc:1", &headers, "1e").await,
        400,
        "malformed-request",
    );
}

macro_rules! both_stores {
    ($($rule:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() { super::$rule(true).await }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() { super::$rule(false).await }
            )*
        }
    };
}

both_stores!(
    control_byte_in_fencing_token_is_a_problem,
    dot_segment_keys_are_422,
    encoded_bodies_are_415,
    numbers_beyond_float_range_are_422,
);
