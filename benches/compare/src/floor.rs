//! The HTTP floor (`--floor`): the same clients and server as the SQLite rows, but each
//! request of a cycle is `GET /healthz`, which touches no store. What the server and the
//! load generator spend on it is what any lock request spends before the store does
//! anything: it bounds what a faster store could bring. The SQLite store's cycles run
//! alternated with the floor's, round after round, at each connection count.

use std::fmt::Write as _;

use anyhow::ensure;
use hyper::{Method, StatusCode};

use crate::bench::Settings;
use crate::fencelock::Binary;
use crate::load::http::HttpClient;
use crate::load::{self, LoadResult, LockClient, Pattern, Timing};
use crate::plan::CONNECTIONS;
use crate::stats::{Percentiles, median};
use crate::storage::Store;

/// A client whose "acquire" and "release" are each one `GET /healthz`.
struct FloorClient(HttpClient);

impl FloorClient {
    async fn health(&mut self) -> anyhow::Result<()> {
        let (status, _) = self.0.send(Method::GET, "/healthz", None).await?;
        ensure!(status == StatusCode::OK, "GET /healthz answered {status}");
        Ok(())
    }
}

impl LockClient for FloorClient {
    async fn acquire(&mut self, _resource: u32, _owner: u64) -> anyhow::Result<bool> {
        self.health().await?;
        Ok(true)
    }

    async fn release(&mut self, _resource: u32, _owner: u64, _held: bool) -> anyhow::Result<()> {
        self.health().await
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Store,
    Floor,
}

/// One run's figures.
struct Figures {
    cycles_per_s: f64,
    latency: Option<Percentiles>,
    /// CPU of the server and of the load generator per request, in microseconds.
    server_us: Option<f64>,
    client_us: f64,
    machine: f64,
    errors: u64,
}

impl Figures {
    fn of(mut result: LoadResult) -> Self {
        let seconds = result.elapsed.as_secs_f64();
        let requests = result.request_us.len().max(1) as f64;
        let per_request = |cores: f64| cores * seconds * 1e6 / requests;
        Self {
            cycles_per_s: result.cycles as f64 / seconds,
            latency: Percentiles::of(&mut result.request_us),
            server_us: result.cpu.server.map(per_request),
            client_us: per_request(result.cpu.client),
            machine: result.cpu.machine_busy,
            errors: result.errors,
        }
    }
}

/// Runs the SQLite store and the floor, alternated, at each connection count, and returns
/// the report.
pub async fn run(settings: &Settings, binary: &Binary) -> anyhow::Result<String> {
    let temp = tempfile::Builder::new()
        .prefix("fencelock-bench-floor-")
        .tempdir()?;
    let store = Store::sqlite(&temp.path().join("sqlite"))?;
    let log = temp.path().join("server.log");
    binary.migrate(&store, &log).await?;
    let timing = Timing {
        warmup: settings.warmup,
        measure: std::time::Duration::from_secs(settings.seconds),
    };
    let mut report = format!(
        "HTTP floor: the SQLite store's cycles (acquire + release) against cycles of two GET /healthz,\n\
         which touch no store, on the same server and clients; {} s per run, {} round(s), alternated\n\
         CPU per request in microseconds (server: /proc/PID/stat; client: the load generator); machine in cores\n\n\
         {:>5}  {:<13} {:>10} {:>9} {:>9} {:>11} {:>11} {:>8} {:>7}\n",
        settings.seconds,
        settings.rounds,
        "conn",
        "side",
        "cycles/s",
        "p50 ms",
        "p99 ms",
        "server us",
        "client us",
        "machine",
        "errors",
    );
    let mut summary = String::new();
    for connections in CONNECTIONS {
        let mut rates = [Vec::new(), Vec::new()];
        for _ in 0..settings.rounds {
            for side in [Side::Store, Side::Floor] {
                store.reset().await?;
                let server = binary.serve(&store, &log).await?;
                eprintln!("floor: {connections} conn, {side:?}");
                let result = side_load(side, server.port, server.pid(), connections, timing).await;
                server.stop().await?;
                let f = Figures::of(result?);
                rates[side as usize].push(f.cycles_per_s);
                let (p50, p99) = f.latency.map_or(("-".into(), "-".into()), |l| {
                    (format!("{:.2}", l.p50_ms), format!("{:.2}", l.p99_ms))
                });
                let _ = writeln!(
                    report,
                    "{connections:>5}  {:<13} {:>10.0} {p50:>9} {p99:>9} {:>11} {:>11.1} {:>8.2} {:>7}",
                    match side {
                        Side::Store => "SQLite store",
                        Side::Floor => "HTTP floor",
                    },
                    f.cycles_per_s,
                    f.server_us.map_or("-".into(), |us| format!("{us:.1}")),
                    f.client_us,
                    f.machine,
                    f.errors,
                );
            }
        }
        if let (Some(store), Some(floor)) = (median(&rates[0]), median(&rates[1])) {
            let _ = writeln!(
                summary,
                "{connections:>5} conn: SQLite store {store:.0} cycles/s, HTTP floor {floor:.0}: {:.2} of the floor",
                store / floor
            );
        }
    }
    report.push_str("\nMedians of the rounds\n");
    report.push_str(&summary);
    Ok(report)
}

async fn side_load(
    side: Side,
    port: u16,
    pid: u32,
    connections: usize,
    timing: Timing,
) -> anyhow::Result<LoadResult> {
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections {
        clients.push(HttpClient::connect(port).await?);
    }
    match side {
        Side::Store => load::run(clients, Pattern::Cycles, timing, Some(pid), false).await,
        Side::Floor => {
            let clients = clients.into_iter().map(FloorClient).collect();
            load::run(clients, Pattern::Cycles, timing, Some(pid), false).await
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::process::CpuUse;

    #[test]
    fn cpu_is_put_per_request_answered_in_the_window() {
        let result = LoadResult {
            cycles: 1_000,
            // Two requests per cycle, in a 2 s window.
            request_us: vec![100; 2_000],
            elapsed: Duration::from_secs(2),
            cpu: CpuUse {
                client: 0.5,
                server: Some(1.5),
                database: None,
                machine_busy: 1.9,
                machine_iowait: 0.0,
            },
            ..LoadResult::default()
        };
        let f = Figures::of(result);
        assert!((f.cycles_per_s - 500.0).abs() < 1e-9);
        // 1.5 cores for 2 s over 2,000 requests: 1.5 ms each.
        assert!((f.server_us.unwrap() - 1_500.0).abs() < 1e-9);
        assert!((f.client_us - 500.0).abs() < 1e-9);
        assert_eq!(f.latency.unwrap().p50_ms, 0.1);
    }
}
