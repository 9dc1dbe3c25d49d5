//! Acquire/release throughput and latency over real HTTP, against an in-process server.
//!
//! ```sh
//! cargo bench --bench acquire                         # SQLite (temporary file)
//! BENCH_STORE=postgres cargo bench --bench acquire    # a fresh PostgreSQL database
//! ```
//!
//! Knobs: `BENCH_CLIENTS` (concurrent clients, default 64), `BENCH_SECONDS` (default 10),
//! `FENCELOCK_TEST_DATABASE_URL` (PostgreSQL admin URL, as for the tests). Prints figures;
//! it asserts nothing. The storage is the tests' [`TestDb`]: it is dropped when the bench
//! ends, also when it panics.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fencelock::config::Settings;
use fencelock::startup::Application;
use fencelock_testkit::{StoreKind, TestDb};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let store = std::env::var("BENCH_STORE").unwrap_or_else(|_| "sqlite".to_owned());
    let clients: usize = env_or("BENCH_CLIENTS", 64);
    let seconds: u64 = env_or("BENCH_SECONDS", 10);
    let kind = match store.as_str() {
        "postgres" => StoreKind::Postgres,
        _ => StoreKind::Sqlite,
    };

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    // Dropped last, after the server has stopped, or while unwinding from a panic.
    let db = runtime.block_on(TestDb::new(kind));
    let config = db.store_config();

    let (ready, built) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let mut settings = Settings::for_store(config);
            settings.bind = "127.0.0.1:0".parse().unwrap();
            let app = Application::build(settings).await.expect("server builds");
            ready.send((app.port(), app.handle())).unwrap();
            app.run_until_stopped().await.expect("server runs");
        });
    });
    let (port, handle) = built.recv().expect("server starts");

    let (acquires, latencies, elapsed) = runtime.block_on(load(port, clients, seconds));
    let mut latencies = latencies;
    latencies.sort_unstable();
    let pick = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    println!(
        "store={store} clients={clients} seconds={:.1} acquire+release pairs={acquires}",
        elapsed.as_secs_f64()
    );
    println!(
        "throughput: {:.0} acquires/s ({:.0} HTTP requests/s)",
        acquires as f64 / elapsed.as_secs_f64(),
        2.0 * acquires as f64 / elapsed.as_secs_f64()
    );
    println!(
        "acquire latency: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        pick(0.50).as_secs_f64() * 1e3,
        pick(0.99).as_secs_f64() * 1e3,
        latencies[latencies.len() - 1].as_secs_f64() * 1e3
    );
    if let Ok(status) = std::fs::read_to_string("/proc/self/status")
        && let Some(line) = status.lines().find(|l| l.starts_with("VmHWM"))
    {
        println!(
            "peak resident memory (server and load generator together): {}",
            line.trim_start_matches("VmHWM:").trim()
        );
    }

    runtime.block_on(handle.stop(true));
    server.join().expect("server thread");
}

/// `clients` tasks acquire a fresh resource and release it, as fast as they can.
async fn load(port: u16, clients: usize, seconds: u64) -> (u64, Vec<Duration>, Duration) {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..clients {
        let (http, stop) = (http.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let url = format!("http://127.0.0.1:{port}/locks/bench-{client}-{i}");
                let owner = serde_json::json!({ "owner": format!("c{client}"), "ttl_seconds": 30 });
                let t = Instant::now();
                let acquired = http.post(&url).json(&owner).send().await.expect("acquire");
                assert_eq!(acquired.status(), 200);
                latencies.push(t.elapsed());
                let _ = acquired.bytes().await;
                let released = http
                    .delete(&url)
                    .json(&serde_json::json!({ "owner": format!("c{client}") }))
                    .send()
                    .await
                    .expect("release");
                assert_eq!(released.status(), 204);
                i += 1;
            }
            latencies
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("load task"));
    }
    let elapsed = started.elapsed();
    (all.len() as u64, all, elapsed)
}
