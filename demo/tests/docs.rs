//! The documentation's commands for the demo store: the `curl ... localhost:8081` commands of
//! `README.md` and `docs/demo.md`, each page's in order against a fresh guarded demo store,
//! as a reader would paste them (`tests/api/readme.rs` plays the lease server's).

mod common;

use std::path::Path;

use common::demo_server;
use fencelock::domain::FenceKeys;
use fencelock_demo::docs::Guarding;
use fencelock_server::StoreOptions;
use fencelock_testkit::{StoreKind, TestDb, curl};

/// The demo store's port in the documentation's commands.
const STORE_PORT: u16 = 8081;

/// Plays the demo store's commands of `page` in order against a fresh demo store on SQLite,
/// with the guard on and no fence keys, as `fencelock-demo store` starts by default.
async fn play(page: &str, at_least: usize) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(page);
    let markdown = std::fs::read_to_string(&path).expect(page);
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

    let base = format!("http://127.0.0.1:{port}");
    curl::play(page, &markdown, STORE_PORT, &base, at_least).await;

    std::thread::spawn(move || actix_web::rt::System::new().block_on(handle.stop(false)))
        .join()
        .unwrap();
    thread.join().unwrap();
    drop(db);
}

/// The front page's demo store commands and the demo page's, each page's on a store of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_and_demo_page_commands_work_on_a_fresh_store() {
    for (page, at_least) in [("README.md", 3), ("docs/demo.md", 5)] {
        play(page, at_least).await;
    }
}
