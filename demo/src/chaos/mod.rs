//! `fencelock-demo chaos`: several lease-server processes on one store, the demo store
//! behind them, workers that acquire, write with their fence, pause past their TTL and
//! release, and faults injected all along; then a check of everything that was seen.
//!
//! Faults, in turn: `kill -9` of an instance (started again on its port once gone; one
//! holding waiting requests when there is one), the connections to PostgreSQL cut and
//! restored (through the test kit's [`Proxy`]; there is no such connection with SQLite), and
//! workers that pause past their TTL at random. Some acquisitions wait (`wait_ms`), with a
//! longer TTL, so that a grant nobody receives would keep its resource long enough to be
//! seen; some of those waiters leave before their wait ends, closing their connection. Some
//! leases are renewed (some after a pause past their TTL, which must be refused), and some
//! acquisitions ask for a lock delay. The checks are in [`history`]; [`replay`] replays the
//! history against the model's transition rules.

pub mod history;
mod instances;
pub mod replay;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::net::{SocketAddr, ToSocketAddrs as _};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use fencelock::domain::FenceKeys;
use fencelock::guard::FENCING_TOKEN;
use fencelock_server::StoreOptions;
use fencelock_testkit::Proxy;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use reqwest::StatusCode;
use serde_json::{Value, json};

use self::history::{
    AcquireAnswer, Fault, History, InspectAnswer, Lease, LoggedWrite, Op, PastLease, Record,
    ReleaseAnswer, RenewAnswer, Violation, WriteAnswer,
};
use self::instances::Instance;
use crate::app::DemoServer;
use crate::docs::Guarding;
use crate::page::PageOptions;

pub struct ChaosOptions {
    pub instances: usize,
    pub workers: usize,
    pub seconds: u64,
    /// `postgres://...` (one host); `None`: a SQLite file in a scratch directory.
    pub database_url: Option<String>,
    pub seed: Option<u64>,
    pub fencelock_bin: Option<PathBuf>,
    /// Resources the workers contend for; few, so that leases are taken over often.
    pub resources: usize,
    /// `Off` runs the demo store without its guard: the checks must then find stale writes.
    pub guarding: Guarding,
    /// Where to write every record, one JSON object a line.
    pub history_out: Option<PathBuf>,
}

/// The workers' lease TTL. Short, so that a pause past it is short too.
const TTL_SECONDS: u32 = 1;
/// Chance that a worker pauses past its TTL after acquiring, before it writes.
const PAUSE_CHANCE: f64 = 0.08;
/// Chance that a worker's turn is an inspection instead of an acquisition.
const INSPECT_CHANCE: f64 = 0.1;
/// Chance that an acquisition waits for a held resource.
const WAIT_CHANCE: f64 = 0.3;
/// A waiting acquisition's `wait_ms`.
const WAIT_MS: std::ops::Range<u32> = 500..8000;
/// A waiting acquisition's TTL: well past [`history::UNDELIVERED_LIMIT`], so that a grant
/// stranded with a dead or departed waiter is told apart from one that was undone.
const WAITING_TTL_SECONDS: u32 = 10;
/// Chance that a waiting client leaves before its wait ends (its request times out).
const DEPART_CHANCE: f64 = 0.3;
/// Chance that a lease is renewed before its writes; after a pause past its TTL, the chance
/// is its `paused` one (and the renewal must be refused: the lease has expired). The
/// first pause of a run, and worker 0's first (its first lease), are always followed by one.
const RENEW_CHANCE: Chance = Chance {
    otherwise: 0.25,
    paused: 0.75,
};
/// Chance that a non-waiting acquisition asks for a lock delay; one that will pause past its
/// TTL (and so let its lease expire, which is when the delay counts) asks more often, but
/// not always, and never worker 0's first lease: a delay keeps the others out while the paused
/// holder's late writes land, and the run without the guard must still see some land after
/// a greater fence.
const LOCK_DELAY_CHANCE: Chance = Chance {
    otherwise: 0.15,
    paused: 0.3,
};
/// A lock delay's `lock_delay_ms`.
const LOCK_DELAY_MS: std::ops::Range<u32> = 100..800;
/// Chance that a kill picks an instance holding waiters, when one does.
const KILL_WAITERS_CHANCE: f64 = 0.75;
/// Longest a request may take; past it, its answer is unknown.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Violations printed one by one; the rest are counted.
const SHOWN_VIOLATIONS: usize = 20;

/// What a run came to.
pub struct Summary {
    pub operations: usize,
    pub kills: u64,
    /// Kills of an instance that held waiting requests.
    pub kills_with_waiters: u64,
    pub cuts: u64,
    pub pauses: u64,
    pub stale_writes_rejected: usize,
    pub violations: Vec<Violation>,
    /// Steps of the history the model's transition rules cannot explain ([`replay`]): the
    /// first of each resource's history that has one.
    pub unexplained: Vec<replay::Unexplained>,
}

impl Summary {
    pub fn faults(&self) -> u64 {
        self.kills + self.cuts + self.pauses
    }

    /// The report's last line.
    pub fn last_line(&self) -> String {
        format!(
            "chaos: {} operations, {} faults, {} stale writes rejected, {} violations, {} unexplained by the model",
            self.operations,
            self.faults(),
            self.stale_writes_rejected,
            self.violations.len(),
            self.unexplained.len()
        )
    }

    /// No violation, and every step explained by the model.
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.unexplained.is_empty()
    }
}

macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// Runs the whole thing, printing as it goes, the last line included.
pub async fn run(options: ChaosOptions) -> anyhow::Result<Summary> {
    if options.instances == 0 || options.workers == 0 || options.resources == 0 {
        bail!("--instances, --workers and --resources must be at least 1");
    }
    let binary = instances::find_binary(options.fencelock_bin.as_deref())?;
    let scratch = tempfile::tempdir().context("creating a scratch directory")?;
    let seed = options.seed.unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    let run_id: u32 = rng.random();
    let http = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .context("building the HTTP client")?;

    // The store, and the network to it when there is one.
    let (store_url, proxy) = match &options.database_url {
        Some(url) => {
            let (upstream, via) = through_proxy(url)?;
            let proxy = Proxy::start(upstream);
            (via(proxy.addr()), Some(proxy))
        }
        None => (
            format!("sqlite://{}", scratch.path().join("leases.db").display()),
            None,
        ),
    };
    let mut servers = Vec::with_capacity(options.instances);
    for i in 0..options.instances {
        let log = scratch.path().join(format!("fencelock-{i}.log"));
        servers.push(Instance::new(&binary, &store_url, log)?);
    }
    // One after the other, so that the first applies the migrations alone.
    for server in &mut servers {
        server.start()?;
        server.wait_ready(&http).await?;
    }
    let lease_urls: Rc<Vec<String>> = Rc::new(servers.iter().map(Instance::url).collect());

    let demo = demo_store(&scratch.path().join("docs.db"), options.guarding).await?;
    let demo_url = format!("http://127.0.0.1:{}", demo.port());
    let demo_handle = demo.handle();
    actix_web::rt::spawn(demo.run_until_stopped());

    let resources: Rc<Vec<String>> = Rc::new(
        (0..options.resources)
            .map(|i| format!("chaos.{run_id:08x}:r{i}"))
            .collect(),
    );
    say!(
        "chaos: {} lease servers ({}) on {}, the demo store (guard {}), {} workers on {} resources, {} s, seed {seed}",
        options.instances,
        binary.display(),
        if proxy.is_some() {
            "PostgreSQL through a proxy the run cuts"
        } else {
            "one SQLite file"
        },
        match options.guarding {
            Guarding::On => "on",
            Guarding::Off => "OFF",
        },
        options.workers,
        options.resources,
        options.seconds
    );
    if proxy.is_none() {
        say!(
            "chaos: SQLite: no connection between the servers and their file to cut; that fault is skipped"
        );
    }

    let (start, started_at) = (Instant::now(), Utc::now());
    let deadline = start + Duration::from_secs(options.seconds);
    let pauses = Rc::new(Cell::new(0_u64));
    let waiting: Waiting = Rc::new(RefCell::new(HashMap::new()));
    // The workers, and the checker after the run: alike but for their number, their seed and
    // the pauses they count.
    let worker = |number: usize, seed: u64, pauses: Rc<Cell<u64>>| Worker {
        number,
        rng: StdRng::seed_from_u64(seed),
        http: http.clone(),
        lease_urls: lease_urls.clone(),
        demo_url: demo_url.clone(),
        resources: resources.clone(),
        start,
        pauses,
        waiting: waiting.clone(),
        records: Vec::new(),
    };
    let mut workers = Vec::with_capacity(options.workers);
    for w in 0..options.workers {
        let worker = worker(w, rng.random(), pauses.clone());
        workers.push(actix_web::rt::spawn(worker.run(deadline)));
    }

    let faults = inject_faults(
        &mut servers,
        proxy.as_ref(),
        &http,
        &waiting,
        StdRng::seed_from_u64(rng.random()),
        start,
        deadline,
    )
    .await?;

    let mut records = Vec::new();
    for worker in workers {
        records.extend(worker.await.context("a worker failed")?);
    }
    // After the faults, from every instance: what each resource looks like, and a fresh
    // acquisition, whose fence must exceed every fence acknowledged before.
    let checker = worker(usize::MAX, rng.random(), Rc::new(Cell::new(0)));
    let final_records = checker.final_look().await?;
    records.extend(final_records);

    let mut history = History {
        records,
        faults: faults.spans,
        started_at: Some(started_at),
        postgres: options.database_url.is_some(),
        ..History::default()
    };
    for resource in resources.iter() {
        let log = write_log(&http, &demo_url, resource).await?;
        history.write_logs.insert(resource.clone(), log);
        let past = lease_history(&http, &lease_urls[0], resource).await?;
        history.lease_histories.insert(resource.clone(), past);
    }
    history.read_histories_us = micros_since(start);
    demo_handle.stop(true).await;
    for server in &mut servers {
        server.kill9();
    }
    drop(proxy);

    if let Some(path) = &options.history_out {
        write_history(path, &history.records)?;
        say!("chaos: history written to {}", path.display());
    }
    let replayed = replay::replay(&history);
    let summary = Summary {
        operations: history.records.len(),
        kills: faults.kills,
        kills_with_waiters: faults.kills_with_waiters,
        cuts: faults.cuts,
        pauses: pauses.get(),
        stale_writes_rejected: history.stale_writes_rejected(),
        violations: history.check(),
        unexplained: replayed.unexplained.clone(),
    };
    say!("{}", operations_line(&history.records));
    say!("{}", waiting_line(&history.records));
    say!(
        "chaos: faults: {} kill -9 (each instance restarted; {} of an instance holding waiters), {}, {} pauses past the TTL",
        summary.kills,
        summary.kills_with_waiters,
        if options.database_url.is_some() {
            format!("{} connection cuts", summary.cuts)
        } else {
            "connection cuts skipped (SQLite)".to_owned()
        },
        summary.pauses
    );
    say_some("VIOLATION", "violations", &summary.violations);
    say_some(
        "UNEXPLAINED",
        "steps the model cannot explain",
        &summary.unexplained,
    );
    if !summary.passed() {
        // The instances' logs are kept for the post-mortem.
        let kept = scratch.keep();
        say!("chaos: lease server logs kept in {}", kept.display());
    }
    say!("{}", replayed.line());
    say!("{}", mix_line(&history.records));
    say!("{}", summary.last_line());
    Ok(summary)
}

/// Prints the first [`SHOWN_VIOLATIONS`] of `items`, each after `label`, and how many more
/// `kind` there are.
fn say_some<T: std::fmt::Display>(label: &str, kind: &str, items: &[T]) {
    for item in items.iter().take(SHOWN_VIOLATIONS) {
        say!("chaos: {label}: {item}");
    }
    if items.len() > SHOWN_VIOLATIONS {
        say!(
            "chaos: ... and {} more {kind}",
            items.len() - SHOWN_VIOLATIONS
        );
    }
}

async fn demo_store(file: &std::path::Path, guarding: Guarding) -> anyhow::Result<DemoServer> {
    let url = format!("sqlite://{}", file.display());
    let page = PageOptions {
        guarding,
        ..PageOptions::default()
    };
    DemoServer::open(
        "127.0.0.1:0".parse()?,
        Some(&url),
        FenceKeys::new(Vec::new()),
        StoreOptions::default(),
        page,
    )
    .await
}

/// The address a single-host `postgres://` URL names, and how to write the URL for
/// another address in its place.
fn through_proxy(url: &str) -> anyhow::Result<(SocketAddr, impl Fn(SocketAddr) -> String)> {
    let Some((scheme, rest)) = url.split_once("://") else {
        bail!("chaos: --database-url must be a postgres:// URL");
    };
    if !matches!(scheme, "postgres" | "postgresql") {
        bail!("chaos: --database-url must be a postgres:// URL, not {scheme}://");
    }
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let (userinfo, host) = match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{user}@"), host),
        None => (String::new(), authority),
    };
    if host.is_empty() || host.contains(',') {
        bail!("chaos: --database-url must name one host (and port) over TCP");
    }
    let with_port = if host
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !host.ends_with(']')
    {
        host.to_owned()
    } else {
        format!("{host}:5432")
    };
    let upstream = with_port
        .to_socket_addrs()
        .with_context(|| format!("chaos: resolving {with_port}"))?
        .next()
        .with_context(|| format!("chaos: {with_port} has no address"))?;
    let (scheme, tail) = (scheme.to_owned(), tail.to_owned());
    Ok((upstream, move |addr: SocketAddr| {
        format!("{scheme}://{userinfo}{addr}{tail}")
    }))
}

/// The faults a run injected.
#[derive(Default)]
struct Faults {
    kills: u64,
    kills_with_waiters: u64,
    cuts: u64,
    /// When each was in force, in the run's local time.
    spans: Vec<Fault>,
}

/// How many requests wait on each lease-server instance right now, by its URL.
type Waiting = Rc<RefCell<HashMap<String, usize>>>;

/// Kills and restarts instances (preferring one that holds waiters), and cuts and restores
/// the store's connections, in turn, until `deadline`; then leaves every instance running and
/// the network whole.
async fn inject_faults(
    servers: &mut [Instance],
    proxy: Option<&Proxy>,
    http: &reqwest::Client,
    waiting: &Waiting,
    mut rng: StdRng,
    start: Instant,
    deadline: Instant,
) -> anyhow::Result<Faults> {
    let mut faults = Faults::default();
    let mut turn = 0_u64;
    // A quiet start, so that the workers are in full swing before the first fault.
    tokio::time::sleep(Duration::from_millis(500)).await;
    while Instant::now() + Duration::from_millis(1500) < deadline {
        let cut_turn = proxy.is_some() && turn % 2 == 1;
        turn += 1;
        let from_us = micros_since(start);
        let instance = if let (true, Some(proxy)) = (cut_turn, proxy) {
            let down = Duration::from_millis(rng.random_range(200..1500));
            proxy.cut();
            tokio::time::sleep(down).await;
            proxy.thaw();
            faults.cuts += 1;
            say!(
                "chaos: {:>6.2} s: store connections cut for {} ms",
                secs(start),
                down.as_millis()
            );
            None
        } else {
            let holding: Vec<usize> = {
                let waiting = waiting.borrow();
                (0..servers.len())
                    .filter(|i| waiting.get(&servers[*i].url()).is_some_and(|n| *n > 0))
                    .collect()
            };
            let i = if !holding.is_empty() && rng.random_bool(KILL_WAITERS_CHANCE) {
                holding[rng.random_range(0..holding.len())]
            } else {
                rng.random_range(0..servers.len())
            };
            let server = &mut servers[i];
            server.kill9();
            if holding.contains(&i) {
                faults.kills_with_waiters += 1;
            }
            let down = Duration::from_millis(rng.random_range(100..1000));
            tokio::time::sleep(down).await;
            let restarted = Instant::now();
            server.start()?;
            server.wait_ready(http).await?;
            faults.kills += 1;
            say!(
                "chaos: {:>6.2} s: instance {i} (port {}) killed with SIGKILL, down {} ms, ready again after {} ms",
                secs(start),
                server.port,
                down.as_millis(),
                restarted.elapsed().as_millis()
            );
            Some(i)
        };
        // Until the instance was ready again, or the connections were restored.
        faults.spans.push(Fault {
            from_us,
            until_us: micros_since(start),
            instance,
        });
        let rest = Duration::from_millis(rng.random_range(300..1200));
        tokio::time::sleep(rest.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
    for server in servers.iter_mut().filter(|s| !s.is_running()) {
        server.start()?;
        server.wait_ready(http).await?;
    }
    Ok(faults)
}

/// Local time since `start`, in microseconds, as the records count it.
fn micros_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX)
}

fn secs(start: Instant) -> f64 {
    start.elapsed().as_secs_f64()
}

struct Worker {
    number: usize,
    rng: StdRng,
    http: reqwest::Client,
    lease_urls: Rc<Vec<String>>,
    demo_url: String,
    resources: Rc<Vec<String>>,
    start: Instant,
    pauses: Rc<Cell<u64>>,
    waiting: Waiting,
    records: Vec<Record>,
}

/// How an acquisition waits: its `wait_ms`, and when its client leaves, if before then.
#[derive(Clone, Copy)]
struct Wait {
    wait_ms: u32,
    depart_after: Option<Duration>,
}

/// How an acquisition is asked for: waiting or not, with a lock delay or none.
/// A chance that is another when the worker pauses past its TTL.
struct Chance {
    otherwise: f64,
    paused: f64,
}

impl Chance {
    fn given(&self, pause: bool) -> f64 {
        if pause { self.paused } else { self.otherwise }
    }
}

#[derive(Clone, Copy)]
struct How {
    wait: Option<Wait>,
    lock_delay_ms: u32,
}

impl How {
    fn ttl_seconds(self) -> u32 {
        if self.wait.is_some() {
            WAITING_TTL_SECONDS
        } else {
            TTL_SECONDS
        }
    }
}

impl Worker {
    async fn run(mut self, deadline: Instant) -> Vec<Record> {
        let mut attempt = 0_u64;
        while Instant::now() < deadline {
            let resource = self.pick(&self.resources.clone());
            if self.rng.random_bool(INSPECT_CHANCE) {
                let server = self.pick_server();
                self.inspect(server, &resource).await;
                continue;
            }
            let owner = format!("w{}-{attempt}", self.number);
            // Worker 0 pauses on its first lease, so that every run has a pause; until then
            // it does not wait, so that the lease has the short TTL.
            let pauses_now = self.number == 0 && self.pauses.get() == 0;
            attempt += 1;
            let server = self.pick_server();
            let wait = (!pauses_now && self.rng.random_bool(WAIT_CHANCE)).then(|| {
                let wait_ms = self.rng.random_range(WAIT_MS);
                let depart_after = self
                    .rng
                    .random_bool(DEPART_CHANCE)
                    .then(|| Duration::from_millis(self.rng.random_range(50..u64::from(wait_ms))));
                Wait {
                    wait_ms,
                    depart_after,
                }
            });
            // A waiter's lease is not paused on: its TTL is long, and so would the pause be.
            let pause = pauses_now || (wait.is_none() && self.rng.random_bool(PAUSE_CHANCE));
            let delay_chance = LOCK_DELAY_CHANCE.given(pause);
            let lock_delay_ms =
                if wait.is_none() && !pauses_now && self.rng.random_bool(delay_chance) {
                    self.rng.random_range(LOCK_DELAY_MS)
                } else {
                    0
                };
            let how = How {
                wait,
                lock_delay_ms,
            };
            let lease = match self.acquire(server, &resource, &owner, how).await {
                AcquireAnswer::Acquired(lease) => lease,
                AcquireAnswer::Held | AcquireAnswer::Departed => {
                    self.nap(5..30).await;
                    continue;
                }
                AcquireAnswer::Unknown { .. } => {
                    self.nap(20..60).await;
                    continue;
                }
            };
            // Not always worker 0's: another's pause may come before its first lease.
            let first_pause = pause && self.pauses.get() == 0;
            if pause {
                self.pauses.set(self.pauses.get() + 1);
                let past = self.rng.random_range(100..500);
                tokio::time::sleep(
                    Duration::from_secs(u64::from(TTL_SECONDS)) + Duration::from_millis(past),
                )
                .await;
                if first_pause {
                    self.until_overtaken(&resource, lease.fence, deadline).await;
                }
            }
            if first_pause || pauses_now || self.rng.random_bool(RENEW_CHANCE.given(pause)) {
                let server = self.pick_server();
                let ttl_seconds = how.ttl_seconds();
                self.renew(server, &resource, &owner, lease.fence, ttl_seconds)
                    .await;
            }
            for _ in 0..self.rng.random_range(1..=2) {
                self.write(&resource, &owner, lease.fence).await;
            }
            self.nap(0..10).await;
            let server = self.pick_server();
            self.release(server, &resource, &owner, lease.fence).await;
        }
        self.records
    }

    /// After the run: every resource inspected, and a fresh acquisition, on every instance.
    async fn final_look(mut self) -> anyhow::Result<Vec<Record>> {
        let probe = format!(
            "{}probe",
            self.resources[0].trim_end_matches(|c: char| c != ':')
        );
        for server in 0..self.lease_urls.len() {
            for resource in self.resources.clone().iter() {
                self.inspect(server, resource).await;
            }
            let mut tries = 0;
            loop {
                tries += 1;
                let owner = format!("final-{}-{tries}", self.records.len());
                let how = How {
                    wait: None,
                    lock_delay_ms: 0,
                };
                match self.acquire(server, &probe, &owner, how).await {
                    AcquireAnswer::Acquired(lease) => {
                        self.release(server, &probe, &owner, lease.fence).await;
                        break;
                    }
                    _ if tries < 50 => self.nap(100..200).await,
                    other => bail!(
                        "no acquisition on {} after the run: {other:?}",
                        self.lease_urls[server]
                    ),
                }
            }
        }
        Ok(self.records)
    }

    /// The run's first pause lasts until a greater fence than `fence` has written `resource`
    /// (or the run ends), as a pause that a takeover overlaps does: its late writes then
    /// follow a greater fence's in every run, to be refused by the guard or, without it,
    /// found by the checks. Left to chance, a run's few short pauses could all end before
    /// anyone took over.
    async fn until_overtaken(&mut self, resource: &str, fence: i64, deadline: Instant) {
        let url = format!("{}/docs/{resource}", self.demo_url);
        while Instant::now() < deadline {
            let written = match self.http.get(&url).send().await {
                Ok(response) if response.status() == StatusCode::OK => response
                    .json::<Value>()
                    .await
                    .ok()
                    .and_then(|doc| doc["fence"].as_i64()),
                _ => None,
            };
            if written.is_some_and(|written| written > fence) {
                return;
            }
            self.nap(10..30).await;
        }
    }

    fn pick(&mut self, from: &[String]) -> String {
        from[self.rng.random_range(0..from.len())].clone()
    }

    /// A lease-server instance, by its index.
    fn pick_server(&mut self) -> usize {
        self.rng.random_range(0..self.lease_urls.len())
    }

    async fn nap(&mut self, ms: std::ops::Range<u64>) {
        let ms = self.rng.random_range(ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    fn now(&self) -> u64 {
        micros_since(self.start)
    }

    /// Sends `request`: when it was sent (for its record), and what came back.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> (u64, reqwest::Result<reqwest::Response>) {
        let sent = self.now();
        (sent, request.send().await)
    }

    fn record(&mut self, resource: &str, instance: Option<usize>, sent_us: u64, op: Op) {
        self.records.push(Record {
            worker: (self.number != usize::MAX).then_some(self.number),
            instance,
            resource: resource.to_owned(),
            sent_us,
            received_us: self.now(),
            op,
        });
    }

    async fn acquire(
        &mut self,
        instance: usize,
        resource: &str,
        owner: &str,
        how: How,
    ) -> AcquireAnswer {
        let server = self.lease_urls[instance].clone();
        let server = server.as_str();
        let mut request = self.http.post(format!("{server}/locks/{resource}"));
        let How {
            wait,
            lock_delay_ms,
        } = how;
        let (ttl_seconds, wait_ms) = (how.ttl_seconds(), wait.map_or(0, |w| w.wait_ms));
        let departs = wait.and_then(|w| w.depart_after);
        if let Some(after) = departs {
            request = request.timeout(after);
        }
        let body = json!({
            "owner": owner,
            "ttl_seconds": ttl_seconds,
            "wait_ms": wait_ms,
            "lock_delay_ms": lock_delay_ms,
        });
        if wait.is_some() {
            *self
                .waiting
                .borrow_mut()
                .entry(server.to_owned())
                .or_default() += 1;
        }
        let (sent, answer) = self.send(request.json(&body)).await;
        if wait.is_some()
            && let Some(n) = self.waiting.borrow_mut().get_mut(server)
        {
            *n = n.saturating_sub(1);
        }
        let answer = match answer {
            Err(e) if departs.is_some() && e.is_timeout() => AcquireAnswer::Departed,
            Ok(response) if response.status() == StatusCode::OK => {
                match response.json::<Value>().await {
                    Ok(body) if body["acquired"] == json!(true) => match lease_of(&body["lock"]) {
                        Some(lease) => AcquireAnswer::Acquired(lease),
                        None => unknown(format!("unreadable lock {body}")),
                    },
                    Ok(body) if body["acquired"] == json!(false) => AcquireAnswer::Held,
                    Ok(body) => unknown(format!("unexpected body {body}")),
                    Err(e) => unknown(e),
                }
            }
            Ok(response) => {
                // The problem's detail says which failure it was, for the history file.
                let status = response.status();
                let detail = response.json::<Value>().await.ok();
                let detail = detail.as_ref().and_then(|b| b["detail"].as_str());
                unknown(format!(
                    "{status}: {}",
                    detail.unwrap_or("no problem detail")
                ))
            }
            Err(e) => unknown(e),
        };
        self.record(
            resource,
            Some(instance),
            sent,
            Op::Acquire {
                owner: owner.to_owned(),
                ttl_seconds,
                wait_ms,
                lock_delay_ms,
                answer: answer.clone(),
            },
        );
        answer
    }

    async fn renew(
        &mut self,
        instance: usize,
        resource: &str,
        owner: &str,
        fence: i64,
        ttl_seconds: u32,
    ) {
        let server = &self.lease_urls[instance];
        let request = self.http.post(format!("{server}/locks/{resource}/renew"));
        let body = json!({"owner": owner, "fence": fence, "ttl_seconds": ttl_seconds});
        let (sent, answer) = self.send(request.json(&body)).await;
        let answer = match answer {
            Ok(response) if response.status() == StatusCode::OK => {
                match response.json::<Value>().await {
                    Ok(body) => match lease_of(&body["lock"]) {
                        Some(lease) => RenewAnswer::Renewed(lease),
                        None => RenewAnswer::Unknown {
                            why: format!("unreadable lock {body}"),
                        },
                    },
                    Err(e) => RenewAnswer::Unknown { why: e.to_string() },
                }
            }
            Ok(response)
                if matches!(
                    response.status(),
                    StatusCode::NOT_FOUND | StatusCode::CONFLICT
                ) =>
            {
                let status = response.status().as_u16();
                let body = response.json::<Value>().await.unwrap_or_default();
                RenewAnswer::Refused {
                    status,
                    problem: body["type"].as_str().unwrap_or("?").to_owned(),
                }
            }
            Ok(response) => RenewAnswer::Unknown {
                why: response.status().to_string(),
            },
            Err(e) => RenewAnswer::Unknown { why: e.to_string() },
        };
        self.record(
            resource,
            Some(instance),
            sent,
            Op::Renew {
                owner: owner.to_owned(),
                fence,
                ttl_seconds,
                answer,
            },
        );
    }

    async fn write(&mut self, resource: &str, owner: &str, fence: i64) {
        let request = self.http.put(format!("{}/docs/{resource}", self.demo_url));
        let body = json!({"worker": self.number, "owner": owner});
        let (sent, answer) = self
            .send(request.header(FENCING_TOKEN, fence.to_string()).json(&body))
            .await;
        let answer = match answer {
            Ok(response) if response.status() == StatusCode::OK => WriteAnswer::Applied,
            Ok(response) if response.status() == StatusCode::CONFLICT => {
                let current = response
                    .json::<Value>()
                    .await
                    .ok()
                    .and_then(|b| b["current_fence"].as_i64())
                    .unwrap_or_default();
                WriteAnswer::Stale { current }
            }
            Ok(response) => WriteAnswer::Unknown {
                why: response.status().to_string(),
            },
            Err(e) => WriteAnswer::Unknown { why: e.to_string() },
        };
        self.record(
            resource,
            None,
            sent,
            Op::Write {
                owner: owner.to_owned(),
                fence,
                answer,
            },
        );
    }

    async fn release(&mut self, instance: usize, resource: &str, owner: &str, fence: i64) {
        let server = &self.lease_urls[instance];
        let request = self.http.delete(format!("{server}/locks/{resource}"));
        let body = json!({"owner": owner, "fence": fence});
        let (sent, answer) = self.send(request.json(&body)).await;
        let answer = match answer.map(|r| r.status()) {
            Ok(StatusCode::NO_CONTENT) => ReleaseAnswer::Released,
            Ok(s @ (StatusCode::NOT_FOUND | StatusCode::FORBIDDEN | StatusCode::CONFLICT)) => {
                ReleaseAnswer::Refused { status: s.as_u16() }
            }
            Ok(s) => ReleaseAnswer::Unknown { why: s.to_string() },
            Err(e) => ReleaseAnswer::Unknown { why: e.to_string() },
        };
        self.record(
            resource,
            Some(instance),
            sent,
            Op::Release {
                owner: owner.to_owned(),
                fence,
                answer,
            },
        );
    }

    async fn inspect(&mut self, instance: usize, resource: &str) {
        let server = &self.lease_urls[instance];
        let request = self.http.get(format!("{server}/locks/{resource}"));
        let (sent, answer) = self.send(request).await;
        let answer = match answer {
            Ok(response) if response.status() == StatusCode::OK => {
                match response
                    .json::<Value>()
                    .await
                    .ok()
                    .and_then(|b| lease_of(&b))
                {
                    Some(lease) => InspectAnswer::Live(lease),
                    None => InspectAnswer::Unknown {
                        why: "unreadable lock".into(),
                    },
                }
            }
            Ok(response) if response.status() == StatusCode::NOT_FOUND => InspectAnswer::None,
            Ok(response) => InspectAnswer::Unknown {
                why: response.status().to_string(),
            },
            Err(e) => InspectAnswer::Unknown { why: e.to_string() },
        };
        self.record(resource, Some(instance), sent, Op::Inspect { answer });
    }
}

fn unknown(why: impl std::fmt::Display) -> AcquireAnswer {
    AcquireAnswer::Unknown {
        why: why.to_string(),
    }
}

fn lease_of(lock: &Value) -> Option<Lease> {
    let time = |field: &str| {
        lock[field]
            .as_str()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc))
    };
    Some(Lease {
        fence: lock["fence"].as_i64()?,
        acquired_at: time("acquired_at")?,
        expires_at: time("expires_at")?,
    })
}

/// The store's history of `resource` (its newest leases, as many as one page holds).
async fn lease_history(
    http: &reqwest::Client,
    lease_url: &str,
    resource: &str,
) -> anyhow::Result<Vec<PastLease>> {
    let page: Value = http
        .get(format!("{lease_url}/locks/{resource}/history?limit=1000"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let time = |lease: &Value, field: &str| {
        lease[field]
            .as_str()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc))
    };
    page["leases"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|lease| {
            Ok(PastLease {
                fence: lease["fence"]
                    .as_i64()
                    .context("a past lease without a fence")?,
                acquired_at: time(lease, "acquired_at")
                    .context("a past lease without acquired_at")?,
                ended_at: time(lease, "ended_at"),
                released: lease["end"] == json!("released"),
            })
        })
        .collect()
}

/// The demo store's whole write log of `key`, page by page.
async fn write_log(
    http: &reqwest::Client,
    demo_url: &str,
    key: &str,
) -> anyhow::Result<Vec<LoggedWrite>> {
    let mut log = Vec::new();
    let mut after = 0_i64;
    loop {
        let page: Value = http
            .get(format!(
                "{demo_url}/docs/{key}/writes?limit=1000&after={after}"
            ))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        for w in page["writes"].as_array().into_iter().flatten() {
            log.push(LoggedWrite {
                fence: w["fence"].as_i64().context("a write without a fence")?,
                applied: w["outcome"] == json!("applied"),
            });
        }
        match page["next"].as_i64() {
            Some(next) => after = next,
            None => return Ok(log),
        }
    }
}

fn write_history(path: &std::path::Path, records: &[Record]) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    for r in records {
        serde_json::to_writer(&mut out, r)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// The mix of requests: acquisitions (waiting ones among them, and those that asked for a
/// lock delay), renewals and releases.
fn mix_line(records: &[Record]) -> String {
    let (mut acquires, mut waited, mut delays, mut renews, mut releases) = (0, 0, 0, 0, 0);
    for r in records {
        match &r.op {
            Op::Acquire {
                wait_ms,
                lock_delay_ms,
                ..
            } => {
                acquires += 1;
                waited += usize::from(*wait_ms > 0);
                delays += usize::from(*lock_delay_ms > 0);
            }
            Op::Renew { .. } => renews += 1,
            Op::Release { .. } => releases += 1,
            Op::Write { .. } | Op::Inspect { .. } => {}
        }
    }
    format!(
        "chaos: mix: {acquires} acquires ({waited} waited), {renews} renews, {delays} lock delays, {releases} releases"
    )
}

/// What the waiting acquisitions came to.
fn waiting_line(records: &[Record]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for r in records {
        if let Op::Acquire {
            wait_ms: 1..,
            answer,
            ..
        } = &r.op
        {
            let name = match answer {
                AcquireAnswer::Acquired(_) => "acquired",
                AcquireAnswer::Held => "held",
                AcquireAnswer::Unknown { .. } => "unknown",
                AcquireAnswer::Departed => "departed",
            };
            *counts.entry(name).or_default() += 1;
        }
    }
    let count = |name| counts.get(name).copied().unwrap_or(0);
    format!(
        "chaos: waiting: {} waited acquisitions ({} acquired, {} held, {} unknown), {} waiters departed",
        counts.values().sum::<usize>(),
        count("acquired"),
        count("held"),
        count("unknown"),
        count("departed")
    )
}

/// How many requests of each kind, by answer: named as the history file (`--history-out`)
/// names them, by their `op` and their answer's `answer`.
fn operations_line(records: &[Record]) -> String {
    let mut counts: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for r in records {
        let op = serde_json::to_value(&r.op).unwrap_or_default();
        let name = |tag: &Value| tag.as_str().unwrap_or("?").to_owned();
        *counts
            .entry(name(&op["op"]))
            .or_default()
            .entry(name(&op["answer"]["answer"]))
            .or_default() += 1;
    }
    let kinds: Vec<String> = counts
        .iter()
        .map(|(op, answers)| {
            let total: usize = answers.values().sum();
            let detail: Vec<String> = answers.iter().map(|(a, n)| format!("{a} {n}")).collect();
            format!("{total} {op} ({})", detail.join(", "))
        })
        .collect();
    format!("chaos: operations: {}", kinds.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operations_line_counts_each_kind_of_request_by_answer() {
        let at = DateTime::from_timestamp_millis(1_800_000_000_000).unwrap();
        let lease = Lease {
            fence: 1,
            acquired_at: at,
            expires_at: at,
        };
        let why = || "cut".to_owned();
        let acquire = |answer| Op::Acquire {
            owner: "a".to_owned(),
            ttl_seconds: 1,
            wait_ms: 0,
            lock_delay_ms: 0,
            answer,
        };
        let write = |answer| Op::Write {
            owner: "a".to_owned(),
            fence: 1,
            answer,
        };
        let release = |answer| Op::Release {
            owner: "a".to_owned(),
            fence: 1,
            answer,
        };
        let ops = vec![
            acquire(AcquireAnswer::Acquired(lease)),
            acquire(AcquireAnswer::Held),
            acquire(AcquireAnswer::Unknown { why: why() }),
            write(WriteAnswer::Applied),
            write(WriteAnswer::Stale { current: 2 }),
            write(WriteAnswer::Unknown { why: why() }),
            release(ReleaseAnswer::Released),
            release(ReleaseAnswer::Refused { status: 404 }),
            release(ReleaseAnswer::Unknown { why: why() }),
            Op::Inspect {
                answer: InspectAnswer::Live(lease),
            },
            Op::Inspect {
                answer: InspectAnswer::Live(lease),
            },
            Op::Inspect {
                answer: InspectAnswer::None,
            },
            Op::Inspect {
                answer: InspectAnswer::Unknown { why: why() },
            },
        ];
        let records: Vec<Record> = ops
            .into_iter()
            .map(|op| Record {
                worker: None,
                instance: None,
                resource: "k".to_owned(),
                sent_us: 0,
                received_us: 0,
                op,
            })
            .collect();
        assert_eq!(
            operations_line(&records),
            "chaos: operations: 3 acquire (acquired 1, held 1, unknown 1); \
             4 inspect (live 2, none 1, unknown 1); \
             3 release (refused 1, released 1, unknown 1); \
             3 write (applied 1, stale 1, unknown 1)"
        );
    }
}
