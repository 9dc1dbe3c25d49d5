//! The waiting workload (`--waiting`): 64 clients contend for 10 resources, each holding a
//! lease it won for a moment of work, then releasing it. Once with `wait_ms` (the server
//! queues the clients and hands each lease over on release), once by polling (acquire
//! without `wait_ms`; on `acquired: false`, pause and try again). Reports won acquisitions
//! per second and how long a client waited for each win (from its first attempt).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hyper::{Method, StatusCode};
use tokio::sync::Mutex;

use crate::fencelock::Binary;
use crate::load::http::HttpClient;
use crate::plan::Block;
use crate::storage::{Databases, stores_for};

pub const CLIENTS: u64 = 64;
pub const RESOURCES: u64 = 10;
/// How long a winner holds its lease (its "work") before releasing it.
const HOLD: Duration = Duration::from_millis(5);
/// The pause between two polls of a client that was refused.
const POLL_EVERY: Duration = Duration::from_millis(10);
/// A waiting client's `wait_ms`: long enough that waits do not run out under this load.
const WAIT_MS: u64 = 30_000;
const TTL_SECONDS: u32 = 30;

#[derive(Clone, Copy, Debug)]
enum Mode {
    Wait,
    Poll,
}

/// What one run measured.
struct Figures {
    won: u64,
    requests: u64,
    errors: u64,
    waits_us: Vec<u64>,
    /// Every lease won, as its client saw it.
    wins: Vec<Win>,
    elapsed: Duration,
}

/// One won lease, timed at its client.
#[derive(Clone, Copy)]
struct Win {
    resource: u64,
    /// The client's first attempt for it.
    first: Instant,
    /// Its answer arrived.
    won: Instant,
    /// Its release was answered.
    released: Instant,
}

/// The bound on a wait: the holds of the leases before it plus 100 ms per hand-over. Put as
/// the time the resource was held by nobody during the wait, per hand-over in it: the worst
/// of all waits, in ms. Each lease counts from its answer to its release's answer at its
/// client, so the figure includes a round trip per hand-over.
fn worst_idle_per_handover(wins: &[Win]) -> f64 {
    let mut worst = Duration::ZERO;
    for me in wins {
        let mut held = Duration::ZERO;
        let mut handovers = 0u32;
        for other in wins.iter().filter(|o| o.resource == me.resource) {
            if std::ptr::eq(other, me) {
                continue;
            }
            let start = other.won.max(me.first);
            let end = other.released.min(me.won);
            if end > start {
                held += end - start;
            }
            if other.released >= me.first && other.released <= me.won {
                handovers += 1;
            }
        }
        let idle = (me.won - me.first).saturating_sub(held);
        worst = worst.max(idle / handovers.max(1));
    }
    worst.as_secs_f64() * 1000.0
}

/// Runs both modes on each store for `seconds` each and returns the report.
pub async fn run(
    seconds: u64,
    databases: &Databases,
    binary: &Binary,
    only: Option<Block>,
) -> anyhow::Result<String> {
    let (temp, stores) = stores_for("waiting", databases, only).await?;
    let mut report = format!(
        "waiting workload: {CLIENTS} clients, {RESOURCES} resources, each win held {} ms then released; {seconds} s per run\n\
         wait: acquire with wait_ms={WAIT_MS}; poll: acquire without it, {} ms pause after a refusal\n\
         wait = from a client's first attempt to its win\n\n\
         idle/hand-over = the worst wait's time with the resource held by nobody, per hand-over in it (bound: 100 ms)\n\n\
         {:<11} {:<5} {:>10} {:>11} {:>9} {:>9} {:>9} {:>14} {:>7}\n",
        HOLD.as_millis(),
        POLL_EVERY.as_millis(),
        "store",
        "mode",
        "won/s",
        "requests/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "idle/hand-over",
        "errors",
    );
    for (name, store) in &stores {
        let log = temp.path().join(format!("{name}.log"));
        binary.migrate(store, &log).await?;
        for mode in [Mode::Wait, Mode::Poll] {
            store.reset().await?;
            let server = binary.serve(store, &log).await?;
            eprintln!("waiting workload: {name}, {mode:?}, {seconds} s");
            let figures = load(server.port, mode, Duration::from_secs(seconds)).await;
            server.stop().await?;
            let figures = figures?;
            report.push_str(&row(name, mode, &figures));
        }
    }
    Ok(report)
}

fn row(store: &str, mode: Mode, f: &Figures) -> String {
    let secs = f.elapsed.as_secs_f64();
    let mut waits = f.waits_us.clone();
    waits.sort_unstable();
    let at = |q: f64| {
        waits
            .get(((waits.len() as f64 * q) as usize).min(waits.len().saturating_sub(1)))
            .map_or(0.0, |us| *us as f64 / 1000.0)
    };
    format!(
        "{:<11} {:<5} {:>10.0} {:>11.0} {:>9.1} {:>9.1} {:>9.1} {:>11.1} ms {:>7}\n",
        store,
        format!("{mode:?}").to_lowercase(),
        f.won as f64 / secs,
        f.requests as f64 / secs,
        at(0.5),
        at(0.99),
        waits.last().map_or(0.0, |us| *us as f64 / 1000.0),
        worst_idle_per_handover(&f.wins),
        f.errors,
    )
}

async fn load(port: u16, mode: Mode, measure: Duration) -> anyhow::Result<Figures> {
    let stop = Arc::new(AtomicBool::new(false));
    let totals = Arc::new(Mutex::new(Figures {
        won: 0,
        requests: 0,
        errors: 0,
        waits_us: Vec::new(),
        wins: Vec::new(),
        elapsed: measure,
    }));
    let mut clients = Vec::new();
    for id in 0..CLIENTS {
        let client = HttpClient::connect(port)
            .await
            .context("connecting a client")?;
        clients.push(tokio::spawn(one_client(
            client,
            id,
            mode,
            stop.clone(),
            totals.clone(),
        )));
    }
    let started = Instant::now();
    tokio::time::sleep(measure).await;
    stop.store(true, Ordering::SeqCst);
    let elapsed = started.elapsed();
    // A waiting client may be in the middle of a wait: it ends with the next hand-over.
    for client in clients {
        let _ = tokio::time::timeout(Duration::from_secs(WAIT_MS / 1000 + 5), client).await;
    }
    let mut totals = Arc::try_unwrap(totals)
        .map_err(|_| anyhow::anyhow!("a client is still running"))?
        .into_inner();
    totals.elapsed = elapsed;
    Ok(totals)
}

async fn one_client(
    mut client: HttpClient,
    id: u64,
    mode: Mode,
    stop: Arc<AtomicBool>,
    totals: Arc<Mutex<Figures>>,
) {
    let (mut won, mut requests, mut errors, mut waits) = (0, 0, 0, Vec::new());
    let mut wins = Vec::new();
    let mut attempt = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let resource = fastrand::u64(..RESOURCES);
        attempt += 1;
        let owner = format!("c{id}-{attempt}");
        let body = match mode {
            Mode::Wait => {
                format!(r#"{{"owner":"{owner}","ttl_seconds":{TTL_SECONDS},"wait_ms":{WAIT_MS}}}"#)
            }
            Mode::Poll => format!(r#"{{"owner":"{owner}","ttl_seconds":{TTL_SECONDS}}}"#),
        };
        let path = format!("/locks/wait:{resource}");
        let first = Instant::now();
        let acquired = loop {
            requests += 1;
            match client.send(Method::POST, &path, Some(body.clone())).await {
                Ok((StatusCode::OK, answer)) if contains(&answer, br#""acquired":true"#) => {
                    break true;
                }
                Ok((StatusCode::OK, _)) => {
                    if stop.load(Ordering::SeqCst) {
                        break false;
                    }
                    if let Mode::Poll = mode {
                        tokio::time::sleep(POLL_EVERY).await;
                    }
                }
                _ => {
                    errors += 1;
                    if errors > 100 {
                        break false;
                    }
                }
            }
        };
        if !acquired {
            continue;
        }
        let won_at = Instant::now();
        let counted = !stop.load(Ordering::SeqCst);
        if counted {
            won += 1;
            waits.push(u64::try_from((won_at - first).as_micros()).unwrap_or(u64::MAX));
        }
        tokio::time::sleep(HOLD).await;
        requests += 1;
        let release = format!(r#"{{"owner":"{owner}"}}"#);
        match client.send(Method::DELETE, &path, Some(release)).await {
            Ok((StatusCode::NO_CONTENT, _)) => {}
            _ => errors += 1,
        }
        // Every lease counts as a hold before the waits it overlaps, also one won after
        // the end of the measurement (whose own wait is not measured).
        wins.push(Win {
            resource,
            first: if counted { first } else { won_at },
            won: won_at,
            released: Instant::now(),
        });
    }
    let mut totals = totals.lock().await;
    totals.won += won;
    totals.requests += requests;
    totals.errors += errors;
    totals.waits_us.extend(waits);
    totals.wins.extend(wins);
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
