//! The HTTP floor (`--floor`): the same clients and server as the SQLite rows, but each
//! request of a cycle is `GET /healthz`, which touches no store. What the server and the
//! load generator spend on it is what any lock request spends before the store does
//! anything: it bounds what a faster store could bring. The SQLite store's cycles run
//! alternated with the floor's, round after round, at each connection count.

use std::fmt::Write as _;

use anyhow::ensure;
use hyper::{Method, StatusCode};

use crate::bench::{Settings, load_figures};
use crate::fencelock::Binary;
use crate::load::http::HttpClient;
use crate::load::{self, LoadResult, LockClient, Pattern, Timing};
use crate::plan::CONNECTIONS;
use crate::stats::median;
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

/// The share of the floor the SQLite store aims at, at 16 and 64 connections.
const FLOOR_TARGET: f64 = 0.5;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Store,
    Floor,
}

/// CPU in microseconds per request, from `cores` busy while `cycles_per_s` cycles of two
/// requests each were made (every cycle of both sides releases).
fn per_request_us(cores: f64, cycles_per_s: f64) -> f64 {
    cores * 1e6 / (2.0 * cycles_per_s)
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
                let f = load_figures(result?, Pattern::Cycles, None);
                rates[side as usize].push(f.rate);
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
                    f.rate,
                    f.cpu.server.map_or("-".into(), |cores| format!(
                        "{:.1}",
                        per_request_us(cores, f.rate)
                    )),
                    per_request_us(f.cpu.client, f.rate),
                    f.cpu.machine_busy,
                    f.errors,
                );
                if let Some(note) = &f.error_note {
                    let _ = writeln!(report, "       {note}");
                }
            }
        }
        if let (Some(store), Some(floor)) = (median(&rates[0]), median(&rates[1])) {
            // The performance work's target: half the floor once requests can share a sync.
            let target = if connections == 1 {
                String::new()
            } else {
                let met = if store / floor >= FLOOR_TARGET {
                    "met"
                } else {
                    "NOT met"
                };
                format!(" (target >= {FLOOR_TARGET}: {met})")
            };
            let _ = writeln!(
                summary,
                "{connections:>5} conn: SQLite store {store:.0} cycles/s, HTTP floor {floor:.0}: {:.2} of the floor{target}",
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
        let f = load_figures(result, Pattern::Cycles, None);
        assert!((f.rate - 500.0).abs() < 1e-9);
        // 1.5 cores for 2 s over 2,000 requests: 1.5 ms each.
        assert!((per_request_us(f.cpu.server.unwrap(), f.rate) - 1_500.0).abs() < 1e-9);
        assert!((per_request_us(f.cpu.client, f.rate) - 500.0).abs() < 1e-9);
        assert_eq!(f.latency.unwrap().p50_ms, 0.1);
    }
}
