//! The paused-worker story, run as a user runs it: the real binary, its exit code, its output.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::demo_server;
use fencelock::domain::FenceKeys;
use fencelock_demo::docs::Guarding;
use fencelock_server::Application;
use fencelock_server::Settings;
use fencelock_server::StoreOptions;
use fencelock_testkit::{TestDb, assert_succeeded, find_line, json_answer, logged_field};

fn story(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fencelock-demo"))
        .arg("paused-worker")
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("FENCELOCK_DEMO_TOKEN")
        .output()
        .expect("the demo binary runs")
}

/// Asserts that a story told with signed fences rejected A's late write as stale (its token
/// was the lease server's, so never as forged) and kept B's.
fn assert_signed_story_rejects_as_stale(stdout: &str) {
    assert!(stdout.contains("fences:       signed"), "{stdout}");
    assert!(stdout.contains("A's late write with fence"), "{stdout}");
    assert!(stdout.contains("REJECTED (409 stale-fence"), "{stdout}");
    assert!(!stdout.contains("invalid-fence-token"), "{stdout}");
    assert!(
        stdout.contains("OK: the late write from paused worker A"),
        "{stdout}"
    );
}

/// A fresh fence key file of 32 random bytes in `dir`.
fn fence_key_file(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("fence.key");
    let key: Vec<u8> = (0..32).map(|_| rand::random::<u8>()).collect();
    std::fs::write(&path, key).unwrap();
    path
}

/// With the guard, the late write is rejected, B's report stands, and the exit code is 0.
#[test]
fn guarded_story_rejects_the_late_write() {
    let output = story(&["--ttl-seconds", "1"]);
    let stdout = assert_succeeded(&output, "guarded story");
    assert!(stdout.contains("A's late write with fence"), "{stdout}");
    assert!(stdout.contains("REJECTED (409 stale-fence"), "{stdout}");
    assert!(
        stdout.contains("OK: the late write from paused worker A"),
        "{stdout}"
    );
    assert!(stdout.contains("B's complete report"), "{stdout}");
}

/// With a fence key on both the lease server and the store, the workers write with signed
/// tokens, and the late write is still rejected as stale, not as forged.
#[test]
fn signed_story_rejects_the_late_write_as_stale() {
    let dir = tempfile::tempdir().unwrap();
    let key = fence_key_file(&dir);
    let output = story(&["--ttl-seconds", "1", "--fence-key", key.to_str().unwrap()]);
    assert_signed_story_rejects_as_stale(&assert_succeeded(&output, "signed story"));

    // A key file too short stops the story before it starts, in one line.
    std::fs::write(&key, [1; 8]).unwrap();
    let output = story(&["--fence-key", key.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.trim().starts_with("fencelock-demo: --fence-key"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

/// A lease server that requires bearer tokens (`--auth-file`) and signs fences
/// (`--fence-key`): the story passes its `--token` through, its workers write with the
/// signed tokens (the store, started by the story with the same key, takes nothing else), and
/// A's late write is rejected as stale. Without the token the story stops at the first
/// acquire, in one line that names the server's `401`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn story_passes_its_token_to_a_lease_server_with_an_auth_file() {
    use fencelock::domain::FenceKey;
    use fencelock_testkit::{StoreKind, TestApp, token_entry};

    const SECRET: &str = "story-secret-0123456789abcdef";
    let auth = token_entry("story", SECRET, &["report:"], &["lock", "read"]);
    let dir = tempfile::tempdir().unwrap();
    let key_file = fence_key_file(&dir);
    let key = FenceKey::read(&key_file).unwrap();
    let (leases, _auth_dir) =
        TestApp::spawn_with_auth_and(StoreKind::Sqlite, &auth, move |settings| {
            settings.fence_key = Some(key);
        })
        .await;
    let key_file = key_file.display().to_string();
    let lease_url = leases.address.clone();
    let run = move |token: Option<&'static str>| {
        let (key_file, lease_url) = (key_file.clone(), lease_url.clone());
        tokio::task::spawn_blocking(move || {
            let mut args = vec![
                "--ttl-seconds",
                "1",
                "--lease-url",
                &lease_url,
                "--fence-key",
                &key_file,
            ];
            args.extend(token.iter().flat_map(|token| ["--token", *token]));
            story(&args)
        })
    };

    let output = run(Some(SECRET)).await.unwrap();
    assert_signed_story_rejects_as_stale(&assert_succeeded(&output, "story with a token"));

    let refused = run(None).await.unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("401"), "{stderr}");
    assert!(stderr.contains("unauthorized"), "{stderr}");
}

/// Without the guard, the story still runs (exit 0) and says plainly that the data is wrong.
#[test]
fn unguarded_story_shows_the_overwrite() {
    let output = story(&["--ttl-seconds", "1", "--no-guard"]);
    let stdout = assert_succeeded(&output, "unguarded story");
    assert!(stdout.contains("THE DATA IS NOW WRONG"), "{stdout}");
    assert!(stdout.contains("A's report, part 2 (late)"), "{stdout}");
    assert!(!stdout.contains("REJECTED"), "{stdout}");
}

/// A reader that goes away after three lines (`| head -3`) ends the story quietly: no panic,
/// no error.
#[test]
fn story_ends_quietly_when_its_reader_goes_away() {
    use std::io::{BufRead as _, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_fencelock-demo"))
        .args(["paused-worker", "--ttl-seconds", "1"])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the demo binary runs");
    let stdout = child.stdout.take().unwrap();
    let first: Vec<String> = BufReader::new(stdout)
        .lines()
        .take(3)
        .map(Result::unwrap)
        .collect();
    assert_eq!(first[0], "The paused-worker story");
    // The reader is dropped here: the next line the story writes meets a closed pipe.
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
}

/// `--lease-url`/`--store-url` point the story at running services.
#[test]
fn story_runs_against_running_services() {
    let (leases, docs_db) = (TestDb::sqlite(), TestDb::sqlite());
    let (lease_config, docs_url) = (leases.store_config(), docs_db.url());
    let (ready, urls) = std::sync::mpsc::channel();
    let services = std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let mut settings = Settings::for_store(lease_config);
            settings.bind = "127.0.0.1:0".parse().unwrap();
            let lease_server = Application::build(settings).await.unwrap();
            let store = demo_server(
                &docs_url,
                Guarding::On,
                StoreOptions::default(),
                FenceKeys::default(),
            )
            .await;
            ready
                .send((
                    format!("http://127.0.0.1:{}", lease_server.port()),
                    format!("http://127.0.0.1:{}", store.port()),
                    lease_server.handle(),
                    store.handle(),
                ))
                .unwrap();
            let _ = tokio::join!(lease_server.run_until_stopped(), store.run_until_stopped());
        });
    });
    let (lease_url, store_url, lease_handle, store_handle) = urls.recv().unwrap();

    let output = story(&[
        "--ttl-seconds",
        "1",
        "--lease-url",
        &lease_url,
        "--store-url",
        &store_url,
    ]);
    let stdout = assert_succeeded(&output, "story against running services");
    assert!(
        stdout.contains(&format!("lease server: {lease_url}")),
        "{stdout}"
    );
    assert!(stdout.contains("REJECTED (409 stale-fence"), "{stdout}");

    // `--no-guard` cannot switch off a running store's own guard: the story says so in
    // words, and a store that protected its data is no failure.
    let unguarded = story(&[
        "--ttl-seconds",
        "1",
        "--no-guard",
        "--lease-url",
        &lease_url,
        "--store-url",
        &store_url,
    ]);
    let stdout = assert_succeeded(&unguarded, "unguarded story");
    let stderr = String::from_utf8_lossy(&unguarded.stderr);
    assert!(stdout.contains("No damage this time"), "{stdout}");
    assert!(
        stdout.contains("fencelock-demo store --no-guard"),
        "{stdout}"
    );
    assert!(!stderr.contains("NoDamage"), "{stderr}");

    actix_web::rt::System::new().block_on(async {
        lease_handle.stop(false).await;
        store_handle.stop(false).await;
    });
    services.join().unwrap();
}

/// `fencelock-demo store` serves the guarded store on its own (here on port 0, SQLite).
#[tokio::test]
async fn store_command_serves_the_guarded_store() {
    use std::process::Stdio;

    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fencelock-demo"))
        .args(["store", "--bind", "127.0.0.1:0"])
        .current_dir(dir.path())
        .env_remove("FENCELOCK_DEMO_DATABASE_URL")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The log is read on after the port, as a terminal would.
    let port: u16 = find_line(child.stderr.take().unwrap(), "the store's port", |line| {
        logged_field(line, "port")?.parse().ok()
    });

    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let put = |fence: &'static str, text: &'static str| {
        http.put(format!("http://127.0.0.1:{port}/docs/report:1"))
            .header("Fencing-Token", fence)
            .json(&serde_json::json!({ "text": text }))
            .send()
    };
    assert_eq!(put("3", "new").await.unwrap().status(), 200);
    assert_eq!(put("2", "late").await.unwrap().status(), 409);
    let doc = json_answer(http.get(format!("http://127.0.0.1:{port}/docs/report:1"))).await;
    assert_eq!(doc["value"]["text"], "new");
    assert!(dir.path().join("fencelock-demo.db").exists());

    let _ = child.kill();
    let _ = child.wait();
}
