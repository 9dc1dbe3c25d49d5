//! Crowds (`--crowds`): what many clients at once cost the server, on each store.
//!
//! - **Watches:** `WATCHES` watches of one resource, on connections of their own; the holder
//!   releases, and each watch's answer is timed from the release request. Bound: API.md
//!   *Watch*, "within 100 ms of the change", for the p99. Also the server's CPU from the
//!   release to the last answer, per answer: what one woken watch costs. Twice: with the
//!   watchers keeping their connections (as clients that watch again or acquire next do),
//!   and closing them as soon as answered (as one-shot commands do), whose closes share the
//!   cores with the answers still to come.
//! - **A connection burst:** `BURST` connections from 8 loopback addresses (a client each to
//!   the per-peer cap), each answered once, then all closed. The server's RSS before, at the
//!   peak, and `SETTLE` after the close. Bound: 50 MB after the close, the bound of the
//!   idle-connection rows: memory a burst took must come back.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use hyper::{Method, StatusCode};

use crate::fencelock::{Binary, Server};
use crate::load::http::HttpClient;
use crate::plan::Block;
use crate::stats::Percentiles;
use crate::storage::{Databases, stores_for};

/// Watches of the one resource (the count the adversarial run used).
const WATCHES: usize = 4000;
/// Connections of the burst (the count the adversarial run used).
const BURST: usize = 18_000;
/// Loopback addresses the burst comes from.
const SOURCES: u8 = 8;
/// How long after the burst closes its RSS is read: twice jemalloc's decay time.
const SETTLE: Duration = Duration::from_secs(20);

/// What a watcher does with its connection once answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Afterwards {
    /// Keeps it, as a watcher that watches again or goes on to acquire does (a client's
    /// pool): the connections close after the last answer.
    Keeps,
    /// Closes it at once, as a one-shot command does: the closes of the first answered
    /// compete with the answers still to come, on the same cores.
    Closes,
}

impl Afterwards {
    fn name(self) -> &'static str {
        match self {
            Self::Keeps => "kept",
            Self::Closes => "closed at once",
        }
    }
}

/// Runs both measurements on each store and returns the report.
pub async fn run(databases: &Databases, binary: &Binary, only: Option<Block>) -> Result<String> {
    let (temp, stores) = stores_for("crowds", databases, only).await?;
    let mut watch_rows = String::new();
    let mut burst_rows = String::new();
    for (name, store) in &stores {
        let log = temp.path().join(format!("{name}.log"));
        binary.migrate(store, &log).await?;
        store.reset().await?;
        let server = binary.serve(store, &log).await?;
        for afterwards in [Afterwards::Keeps, Afterwards::Closes] {
            eprintln!(
                "crowds: {name}, {WATCHES} watches, connections {}",
                afterwards.name()
            );
            let watches = watches(server.port, server.pid(), afterwards).await;
            let watches = match watches {
                Ok(watches) => watches,
                Err(e) => {
                    let _ = server.stop().await;
                    return Err(e);
                }
            };
            let _ = writeln!(
                watch_rows,
                "{name:<11} {:<15} {:>13.1} {:>13.1} {:>13.1} {:>9} {:>10.1} {:>6} {:>8.2}",
                afterwards.name(),
                watches.latency.p50_ms,
                watches.latency.p99_ms,
                watches.max_ms,
                if watches.latency.p99_ms <= 100.0 {
                    "yes"
                } else {
                    "NO"
                },
                watches.server_us,
                watches.reads,
                watches.load,
            );
        }
        server.stop().await?;
        // On a server of its own: what comes back after the burst is the burst's alone.
        let server = binary.serve(store, &log).await?;
        eprintln!("crowds: {name}, a burst of {BURST} connections");
        let burst = burst(&server).await;
        server.stop().await?;
        let burst = burst?;
        let mb = |kib: u64| format!("{:.1} MB", kib as f64 / 1024.0);
        let _ = writeln!(
            burst_rows,
            "{name:<11} {:>11} {:>11} {:>11} ({})",
            mb(burst.before_kib),
            mb(burst.peak_kib),
            mb(burst.after_kib),
            if burst.after_kib <= 50 * 1024 {
                "yes"
            } else {
                "NO"
            },
        );
    }
    Ok(format!(
        "crowds: {WATCHES} watches of one resource, answered after its release (from the release request;\n\
         bound: p99 <= 100 ms, API.md Watch), the watchers' connections kept until the last answer, then\n\
         closed at once by each watcher answered; server us: the server's CPU from the release to the last\n\
         answer, per answer; reads: the store reads (inspections) from the release to the last answer; load:\n\
         the machine's load average (1 min) at the release\n\n\
         store       connections     watch p50 ms  watch p99 ms  watch max ms    p99 ok  server us  reads     load\n\
         {watch_rows}\n\
         a burst of {BURST} connections from {SOURCES} loopback addresses, each answered once, then closed\n\
         (bound: RSS <= 50 MB {} s after the close)\n\n\
         store        RSS before    RSS peak   RSS after (ok)\n\
         {burst_rows}",
        SETTLE.as_secs(),
    ))
}

struct Watches {
    latency: Percentiles,
    max_ms: f64,
    /// Server CPU from the release request to the last answer, per answer.
    server_us: f64,
    /// Store reads from the release to the last answer: the woken watches share their look.
    reads: u64,
    /// The 1-minute load average at the release: the cores are shared with whatever else
    /// runs.
    load: f64,
}

/// `WATCHES` watches of `crowd`, its release, and how long after the release request each
/// watch answered.
async fn watches(port: u16, pid: u32, afterwards: Afterwards) -> Result<Watches> {
    let mut control = HttpClient::connect(port).await?;
    let (status, body) = control
        .send(
            Method::POST,
            "/locks/crowd",
            Some(r#"{"owner":"holder","ttl_seconds":600}"#.to_owned()),
        )
        .await?;
    ensure!(status == StatusCode::OK, "acquire answered {status}");
    let answer: serde_json::Value = serde_json::from_slice(&body)?;
    let fence = answer["lock"]["fence"].as_i64().context("no fence")?;
    let inspections_before = inspections(&mut control).await?;

    // Each watch is sent as soon as its connection is open: the server closes a connection
    // left idle for its request timeout (10 s by default), and opening 4000 one after the
    // other can take longer than that. One at a time: a thousand simultaneous connects would
    // overflow the listen backlog.
    let path = format!("/locks/crowd/watch?fence={fence}&timeout_ms=120000");
    let mut set = tokio::task::JoinSet::new();
    let opening = Instant::now();
    for _ in 0..WATCHES {
        let mut client = HttpClient::connect(port).await?;
        let path = path.clone();
        set.spawn(async move {
            let (status, body) = client.send(Method::GET, &path, None).await?;
            let answered = Instant::now();
            ensure!(status == StatusCode::OK, "watch answered {status}");
            let answer: serde_json::Value = serde_json::from_slice(&body)?;
            ensure!(answer["changed"] == true, "watch answered {answer}");
            let kept = (afterwards == Afterwards::Keeps).then_some(client);
            anyhow::Ok((answered, kept))
        });
    }
    eprintln!(
        "crowds: {WATCHES} connections opened in {:.1} s",
        opening.elapsed().as_secs_f64()
    );
    // The control connection sat idle while the watches were opened, and may have been
    // closed for it.
    control = HttpClient::connect(port).await?;
    // Each watch's first look registers it, and counts as an inspection.
    let registered = Instant::now() + Duration::from_secs(60);
    while inspections(&mut control).await? < inspections_before + WATCHES as f64 {
        ensure!(
            Instant::now() < registered,
            "the watches did not all start in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let load = load_average()?;
    let cpu_before = threads_cpu(pid)?;
    let released = Instant::now();
    let (status, _) = control
        .send(
            Method::DELETE,
            "/locks/crowd",
            Some(format!(r#"{{"owner":"holder","fence":{fence}}}"#)),
        )
        .await?;
    ensure!(
        status == StatusCode::NO_CONTENT,
        "release answered {status}"
    );
    let mut after_us = Vec::with_capacity(WATCHES);
    let mut kept = Vec::with_capacity(WATCHES);
    while let Some(answered) = set.join_next().await {
        let (answered, client) = answered??;
        kept.extend(client);
        let since = answered.saturating_duration_since(released);
        after_us.push(u32::try_from(since.as_micros()).unwrap_or(u32::MAX));
    }
    let server = threads_cpu(pid)?.saturating_sub(cpu_before);
    let reads = inspections(&mut control).await? - (inspections_before + WATCHES as f64);
    drop(kept);
    let max_ms = after_us.iter().copied().max().unwrap_or(0) as f64 / 1000.0;
    Ok(Watches {
        latency: Percentiles::of(&mut after_us).context("no watch answered")?,
        max_ms,
        server_us: server.as_secs_f64() * 1e6 / WATCHES as f64,
        reads: reads.max(0.0) as u64,
        load,
    })
}

/// The CPU time of process `pid`'s threads so far: the sum of the time each has run
/// (`/proc/PID/task/*/schedstat`, in nanoseconds). `/proc/PID/stat` counts clock ticks,
/// which round a window's CPU to 2.5 us per answer at `WATCHES` answers. A thread that ends
/// between two readings is missed: the server's threads outlive a measurement.
fn threads_cpu(pid: u32) -> Result<Duration> {
    let mut nanos = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(schedstat) = std::fs::read_to_string(task?.path().join("schedstat")) else {
            // Ended since the listing.
            continue;
        };
        let ran = schedstat
            .split_whitespace()
            .next()
            .context("empty schedstat")?;
        nanos += ran.parse::<u64>().context("malformed schedstat")?;
    }
    Ok(Duration::from_nanos(nanos))
}

/// The 1-minute load average (`/proc/loadavg`).
fn load_average() -> Result<f64> {
    let loadavg = std::fs::read_to_string("/proc/loadavg")?;
    Ok(loadavg
        .split_whitespace()
        .next()
        .context("empty /proc/loadavg")?
        .parse()?)
}

/// `fencelock_store_seconds_count{op="inspect"}`.
async fn inspections(client: &mut HttpClient) -> Result<f64> {
    let (status, body) = client.send(Method::GET, "/metrics", None).await?;
    ensure!(status == StatusCode::OK, "GET /metrics answered {status}");
    let text = String::from_utf8_lossy(&body);
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(r#"fencelock_store_seconds_count{op="inspect"} "#))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0))
}

struct Burst {
    before_kib: u64,
    peak_kib: u64,
    after_kib: u64,
}

async fn burst(server: &Server) -> Result<Burst> {
    let before_kib = server.rss_kib()?;
    let mut open = Vec::with_capacity(BURST);
    // In batches: a thousand simultaneous connects would overflow the listen backlog.
    for batch in (0..BURST).collect::<Vec<_>>().chunks(100) {
        let mut set = tokio::task::JoinSet::new();
        for &i in batch {
            let port = server.port;
            let source = Ipv4Addr::new(127, 0, 0, 2 + (i % usize::from(SOURCES)) as u8);
            set.spawn(async move {
                let mut client = HttpClient::connect_from(port, source).await?;
                let (status, _) = client.send(Method::GET, "/healthz", None).await?;
                ensure!(status == StatusCode::OK, "GET /healthz answered {status}");
                anyhow::Ok(client)
            });
        }
        while let Some(client) = set.join_next().await {
            open.push(client??);
        }
    }
    let peak_kib = server.peak_rss_kib()?;
    drop(open);
    tokio::time::sleep(SETTLE).await;
    Ok(Burst {
        before_kib,
        peak_kib,
        after_kib: server.rss_kib()?,
    })
}
