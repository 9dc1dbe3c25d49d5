//! The documentation's commands for the demo store: the `curl ... localhost:8081` commands of
//! `README.md` and `docs/demo.md`, each page's in order against a fresh guarded demo store,
//! as a reader would paste them (`tests/api/readme.rs` plays the lease server's).

mod common;

#[path = "../../tests/api/curl.rs"]
mod curl;

use std::path::Path;

use common::demo_server;
use fencelock::domain::FenceKeys;
use fencelock_demo::docs::Guarding;
use fencelock_server::StoreOptions;
use fencelock_testkit::{StoreKind, TestDb};

/// The demo store's port in the documentation's commands.
const STORE_PORT: u16 = 8081;

/// Plays the demo store's commands of `page` in order against a fresh demo store on SQLite,
/// with the guard on and no fence keys, as `fencelock-demo store` starts by default.
async fn play(page: &str, at_least: usize) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(page);
    let markdown = std::fs::read_to_string(&path).expect(page);
    let commands = curl::commands(&markdown, STORE_PORT);
    assert!(commands.len() >= at_least, "{page}: {commands:#?}");

    let db = TestDb::new(StoreKind::Sqlite).await;
    let url = db.url();
    let (ready, built) = tokio::sync::oneshot::channel();
    let thread = std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let server = demo_server(
                &url,
                Guarding::On,
                StoreOptions::default(),
                FenceKeys::new(Vec::new()),
            )
            .await;
            let _ = ready.send((server.port(), server.handle()));
            let _ = server.run_until_stopped().await;
        });
    });
    let (port, handle) = built.await.expect("demo store starts");

    let http = fencelock_testkit::client();
    for command in commands {
        let method: reqwest::Method = command.method.parse().expect("an HTTP method");
        let mut request = http.request(method, format!("http://127.0.0.1:{port}{}", command.path));
        for (name, value) in &command.headers {
            request = request.header(name, value);
        }
        if let Some(body) = &command.body {
            request = request.body(body.clone());
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        match command.expected {
            Some(expected) => assert_eq!(
                status.as_u16(),
                expected,
                "{page}: `{}` answered {text}",
                command.line
            ),
            None => assert!(
                status.is_success(),
                "{page}: `{}` answered {status}: {text}",
                command.line
            ),
        }
    }

    std::thread::spawn(move || actix_web::rt::System::new().block_on(handle.stop(false)))
        .join()
        .unwrap();
    thread.join().unwrap();
    drop(db);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_demo_store_commands_work_on_a_fresh_store() {
    play("README.md", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_page_commands_work_on_a_fresh_store() {
    play("docs/demo.md", 5).await;
}
