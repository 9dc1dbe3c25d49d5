//! The load generator: N clients, each on one connection of its own, doing acquire then
//! release in a loop as fast as the server answers. Each cycle picks a random resource
//! `res:<n>` and a fresh random owner. The same loop drives fencelock (over HTTP/1.1
//! keep-alive, [`http`]) and Redis ([`redis`]).
//!
//! A run warms up, then measures for a fixed time; only cycles and requests that end inside
//! the measured window count. When the window closes every client finishes the cycle it is
//! in (releasing what it won) and stops, so no run leaves leases behind for the next.

pub mod http;
pub mod redis;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use crate::process::{CpuMeter, CpuUse};

/// What the clients do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Acquire then release over 10,000 resources: collisions are rare; every cycle
    /// releases (a lost acquisition's release is refused), as the pgbench script does.
    Cycles,
    /// 10 hot resources, many clients: most acquisitions lose. A client releases only what
    /// it won, as a real client would; what counts is won acquisitions per second.
    Hot,
}

impl Pattern {
    pub fn resources(self) -> u32 {
        match self {
            Self::Cycles => 10_000,
            Self::Hot => 10,
        }
    }

    fn releases_lost(self) -> bool {
        matches!(self, Self::Cycles)
    }
}

/// One client's connection to a lock service.
pub trait LockClient: Send + 'static {
    /// Tries to acquire `res:<resource>` for `owner`; `true` when granted.
    fn acquire(
        &mut self,
        resource: u32,
        owner: u64,
    ) -> impl Future<Output = anyhow::Result<bool>> + Send;

    /// Releases `res:<resource>` for `owner`; `held` says whether the acquisition was won,
    /// i.e. which answer is the expected one.
    fn release(
        &mut self,
        resource: u32,
        owner: u64,
        held: bool,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// How long a run warms up and how long it is measured.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub warmup: Duration,
    pub measure: Duration,
}

/// What one run measured.
#[derive(Debug, Default)]
pub struct LoadResult {
    /// Cycles completed in the window (acquire, and release when it applies).
    pub cycles: u64,
    /// Acquisitions won in the window.
    pub won: u64,
    /// Requests answered with something unexpected, or failed; not counted as cycles.
    pub errors: u64,
    pub first_error: Option<String>,
    /// Clients that gave up (their connection failed) before the window closed.
    pub clients_lost: u64,
    /// Latency of every request that ended in the window, in microseconds.
    pub request_us: Vec<u32>,
    /// Latency of every cycle that ended in the window, in microseconds.
    pub cycle_us: Vec<u32>,
    /// The measured window.
    pub elapsed: Duration,
    pub cpu: CpuUse,
}

const WARMING: u8 = 0;
const MEASURING: u8 = 1;
const STOPPING: u8 = 2;

/// A client gives up after this many failed requests in a row (its connection is gone).
const MAX_ERRORS_IN_A_ROW: u32 = 100;

/// Runs `clients`, already connected, for `timing`; `server` is the process whose CPU is
/// reported beside the generator's own, and PostgreSQL's too if `database`.
pub async fn run<C: LockClient>(
    clients: Vec<C>,
    pattern: Pattern,
    timing: Timing,
    server: Option<u32>,
    database: bool,
) -> anyhow::Result<LoadResult> {
    let phase = Arc::new(AtomicU8::new(WARMING));
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|client| tokio::spawn(client_loop(client, pattern, phase.clone())))
        .collect();
    tokio::time::sleep(timing.warmup).await;
    let meter = CpuMeter::start(server, database);
    phase.store(MEASURING, Ordering::Release);
    tokio::time::sleep(timing.measure).await;
    phase.store(STOPPING, Ordering::Release);
    let (cpu, elapsed) = meter.finish();

    let mut total = LoadResult {
        elapsed,
        cpu,
        ..LoadResult::default()
    };
    for task in tasks {
        let part = task.await?;
        total.cycles += part.cycles;
        total.won += part.won;
        total.errors += part.errors;
        total.clients_lost += part.clients_lost;
        if total.first_error.is_none() {
            total.first_error = part.first_error;
        }
        total.request_us.extend(part.request_us);
        total.cycle_us.extend(part.cycle_us);
    }
    Ok(total)
}

async fn client_loop<C: LockClient>(
    mut client: C,
    pattern: Pattern,
    phase: Arc<AtomicU8>,
) -> LoadResult {
    let mut rng = fastrand::Rng::new();
    let mut out = LoadResult::default();
    let mut errors_in_a_row = 0;
    let micros = |d: Duration| u32::try_from(d.as_micros()).unwrap_or(u32::MAX);
    while phase.load(Ordering::Acquire) != STOPPING && errors_in_a_row < MAX_ERRORS_IN_A_ROW {
        let resource = rng.u32(1..=pattern.resources());
        let owner = rng.u64(..);
        let started = Instant::now();
        let outcome = async {
            let won = client.acquire(resource, owner).await?;
            let acquired = Instant::now();
            if won || pattern.releases_lost() {
                client.release(resource, owner, won).await?;
                anyhow::Ok((won, acquired, Some(Instant::now())))
            } else {
                anyhow::Ok((won, acquired, None))
            }
        }
        .await;
        let counted = phase.load(Ordering::Acquire) == MEASURING;
        match outcome {
            Ok((won, acquired, released)) => {
                errors_in_a_row = 0;
                if counted {
                    out.cycles += 1;
                    out.won += u64::from(won);
                    out.request_us.push(micros(acquired - started));
                    if let Some(released) = released {
                        out.request_us.push(micros(released - acquired));
                    }
                    out.cycle_us
                        .push(micros(released.unwrap_or(acquired) - started));
                }
            }
            Err(e) => {
                errors_in_a_row += 1;
                if counted {
                    out.errors += 1;
                }
                if out.first_error.is_none() {
                    out.first_error = Some(format!("{e:#}"));
                }
            }
        }
    }
    if errors_in_a_row >= MAX_ERRORS_IN_A_ROW {
        out.clients_lost = 1;
    }
    out
}
