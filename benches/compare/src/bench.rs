//! One benchmark run: sets up the stores and references, makes every run of the plan, and
//! gathers the figures for the report. Everything it creates lives in a temporary directory
//! or in PostgreSQL databases registered with [`Databases`], so that nothing outlives it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::fencelock::Binary;
use crate::load::http::{HttpClient, idle_connections};
use crate::load::redis::{RedisClient, load_release_script};
use crate::load::{self, LoadResult, Pattern, Timing};
use crate::machine::{Machine, SyncRate, fdatasync_rate};
use crate::plan::{Block, Row, Side, StoreKey, rows};
use crate::process::CpuUse;
use crate::reference::pgbench::{Pgbench, PgbenchResult, Script};
use crate::reference::redis::RedisProgram;
use crate::stats::Percentiles;
use crate::storage::{Databases, Store, connect};

/// How the benchmark runs; the defaults are the documented full run.
#[derive(Clone, Debug)]
pub struct Settings {
    pub seconds: u64,
    pub rounds: u32,
    pub warmup: Duration,
    pub live_leases: u64,
    pub idle_connections: usize,
    pub only: Option<Block>,
    pub keep_temp: bool,
}

/// Which latency a figure is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LatencyOf {
    /// Each HTTP request or Redis command.
    Request,
    /// Each acquire + release (a pgbench transaction).
    Cycle,
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct Figures {
    /// Cycles per second, or won acquisitions per second for the hot pattern.
    pub rate: f64,
    /// Won acquisitions among attempts.
    pub won_fraction: f64,
    pub latency: Option<Percentiles>,
    pub latency_of: LatencyOf,
    /// p99 of whole cycles, where requests are what `latency` is.
    pub cycle_p99_ms: Option<f64>,
    /// Failed requests or transactions, and why (the first one).
    pub errors: u64,
    pub error_note: Option<String>,
    pub cpu: CpuUse,
    /// The server's peak RSS at the end of the run (fencelock only).
    pub peak_rss_kib: Option<u64>,
}

/// One run of one side.
#[derive(Debug)]
pub struct Run {
    pub row: usize,
    pub round: u32,
    pub side: Side,
    pub outcome: Result<Figures, String>,
}

/// Peak RSS of a server holding many idle connections.
#[derive(Debug)]
pub struct IdleFigure {
    pub store: StoreKey,
    pub outcome: Result<u64, String>,
}

/// Everything the report prints.
pub struct Outcome {
    pub settings: Settings,
    pub machine: Machine,
    /// The disk's fdatasync rate, which bounds what the syncing stores can do.
    pub sync: Option<Result<SyncRate, String>>,
    pub binary: Binary,
    /// The build compared with `binary`, if one was given.
    pub baseline: Option<Binary>,
    /// What PostgreSQL and the references are; `None` where not installed or not used.
    pub postgres: Option<String>,
    pub pgbench: Option<String>,
    pub redis: Option<String>,
    /// Setup steps worth telling (loading time, sides skipped).
    pub notes: Vec<String>,
    pub rows: Vec<Row>,
    pub runs: Vec<Run>,
    pub idle: Vec<IdleFigure>,
    pub started: Instant,
}

/// Runs the whole plan; with a `baseline` build, that build too, on stores of its own.
pub async fn run(
    settings: &Settings,
    databases: &Databases,
    binary: &Binary,
    baseline: Option<&Binary>,
) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let temp = tempfile::Builder::new()
        .prefix("fencelock-bench-")
        .tempdir()
        .context("creating the temporary directory")?;
    if settings.keep_temp {
        eprintln!("temporary files (kept): {}", temp.path().display());
    }
    let dir = temp.path();
    let rows = rows(settings.only, baseline.is_some());
    let mut notes = Vec::new();
    let pid = std::process::id();
    let uses = |block| settings.only.is_none_or(|b| b == block);

    let mut postgres = None;
    let mut data_directory = None;
    if uses(Block::Postgres) {
        let admin = connect(databases.admin_url()).await?;
        let version: String = admin.query_one("SHOW server_version", &[]).await?.get(0);
        // Needs a superuser or pg_read_all_settings; without it the file system is unknown.
        data_directory = admin
            .query_one("SHOW data_directory", &[])
            .await
            .ok()
            .map(|r| PathBuf::from(r.get::<_, String>(0)));
        postgres = Some(match &data_directory {
            Some(d) => format!("PostgreSQL {version}, data directory {}", d.display()),
            None => format!("PostgreSQL {version}"),
        });
    }

    eprintln!("measuring the fdatasync rate in {} (2 s)", dir.display());
    let sync = Some(
        tokio::task::block_in_place(|| {
            fdatasync_rate(dir, Duration::from_secs(2), data_directory.as_deref())
        })
        .map_err(|e| e.to_string()),
    );

    let mut stores: Vec<(StoreKey, Store)> = Vec::new();
    let mut baseline_stores: Vec<(StoreKey, Store)> = Vec::new();
    let mut pgbench = None;
    let mut redis = None;
    if uses(Block::Postgres) {
        let url = databases.create(&format!("fencelock_bench_{pid}")).await?;
        stores.push((StoreKey::Postgres, Store::Postgres { url }));
        let url = databases
            .create(&format!("fencelock_bench_{pid}_loaded"))
            .await?;
        stores.push((StoreKey::PostgresLoaded, Store::Postgres { url }));
        if baseline.is_some() {
            let url = databases
                .create(&format!("fencelock_bench_{pid}_baseline"))
                .await?;
            baseline_stores.push((StoreKey::Postgres, Store::Postgres { url }));
        }
        pgbench = Pgbench::prepare(
            databases,
            &format!("fencelock_bench_{pid}_pgbench"),
            &dir.join("pgbench"),
        )
        .await?;
        if pgbench.is_none() {
            notes.push("pgbench is not installed (not on PATH): the PostgreSQL store is measured without its reference".to_owned());
        }
    }
    if uses(Block::Sqlite) {
        stores.push((StoreKey::Sqlite, Store::sqlite(&dir.join("sqlite"))?));
        stores.push((
            StoreKey::SqliteLoaded,
            Store::sqlite(&dir.join("sqlite-loaded"))?,
        ));
        if baseline.is_some() {
            baseline_stores.push((
                StoreKey::Sqlite,
                Store::sqlite(&dir.join("sqlite-baseline"))?,
            ));
        }
        redis = RedisProgram::find();
        if redis.is_none() {
            notes.push("redis-server is not installed (not on PATH): the SQLite store is measured without its reference".to_owned());
        }
    }
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    if let Some(pgbench) = &mut pgbench {
        let name = format!("fencelock_bench_{pid}_bounds");
        let url = databases.create(&name).await?;
        binary
            .migrate(
                &Store::Postgres { url: url.clone() },
                &logs.join("migrate-bounds.log"),
            )
            .await
            .context("migrating the bounds' database")?;
        // The store's decisions announce a change themselves, only when someone waits or
        // watches, and skip the trigger that announces other writers' changes: so do the
        // bounds' plain statements, or `rows_1.sql` would pay a look at the waiters and
        // watchers per row that no request of the store pays.
        crate::storage::connect(&url)
            .await?
            .batch_execute(&format!(
                "ALTER DATABASE {name} SET fencelock.announcing = 'inline'"
            ))
            .await
            .context("setting the bounds' database up")?;
        pgbench.bounds_on(url);
    }
    for (key, store) in &stores {
        binary
            .migrate(store, &logs.join(format!("migrate-{key:?}.log")))
            .await
            .with_context(|| format!("migrating the {key:?} store"))?;
        if matches!(key, StoreKey::PostgresLoaded | StoreKey::SqliteLoaded) {
            eprintln!(
                "loading {} live leases into the {key:?} store",
                settings.live_leases
            );
            let loading = Instant::now();
            store.load_live_leases(settings.live_leases).await?;
            notes.push(format!(
                "{} live leases (one day left) loaded into a {} store's database in {:.1} s, before its server started",
                crate::plan::count(settings.live_leases),
                key.store_name(),
                loading.elapsed().as_secs_f64()
            ));
        }
    }
    if let Some(baseline) = baseline {
        for (key, store) in &baseline_stores {
            baseline
                .migrate(store, &logs.join(format!("migrate-baseline-{key:?}.log")))
                .await
                .with_context(|| format!("migrating the baseline build's {key:?} store"))?;
        }
    }

    let mut bench = Bench {
        settings,
        binary,
        stores,
        baseline: baseline.map(|binary| (binary, baseline_stores)),
        pgbench: pgbench.as_ref(),
        redis: redis.as_ref(),
        logs,
        dir: dir.to_owned(),
        seq: 0,
    };
    let total = rows
        .iter()
        .map(|r| r.sides.iter().filter(|s| bench.available(**s)).count())
        .sum::<usize>()
        * settings.rounds as usize;
    let mut runs = Vec::new();
    for (index, row) in rows.iter().enumerate() {
        for round in 1..=settings.rounds {
            for &side in &row.sides {
                if !bench.available(side) {
                    continue;
                }
                bench.seq += 1;
                let what = format!(
                    "[{}/{total}] {}, round {round}: {}",
                    bench.seq,
                    row.describe(),
                    side.describe(row.pattern, settings.live_leases)
                );
                eprint!("{what}: ");
                let outcome = bench
                    .run_side(side, row.pattern, row.connections)
                    .await
                    .map_err(|e| format!("{e:#}"));
                match &outcome {
                    Ok(f) => eprintln!(
                        "{:.0}/s, p99 {:.2} ms, CPU: client {:.2}, server {}, PostgreSQL {}, machine {:.2}",
                        f.rate,
                        f.latency.map_or(f64::NAN, |l| l.p99_ms),
                        f.cpu.client,
                        f.cpu
                            .server
                            .map_or_else(|| "-".to_owned(), |s| format!("{s:.2}")),
                        f.cpu
                            .database
                            .map_or_else(|| "-".to_owned(), |s| format!("{s:.2}")),
                        f.cpu.machine_busy,
                    ),
                    Err(e) => eprintln!("FAILED: {e}"),
                }
                runs.push(Run {
                    row: index,
                    round,
                    side,
                    outcome,
                });
            }
        }
    }

    let mut idle = Vec::new();
    for store in [StoreKey::Postgres, StoreKey::Sqlite] {
        if bench.store(store).is_none() {
            continue;
        }
        eprint!(
            "{} idle connections on the {} store: ",
            settings.idle_connections,
            store.store_name()
        );
        let outcome = bench.idle(store).await.map_err(|e| format!("{e:#}"));
        match &outcome {
            Ok(kib) => eprintln!("peak RSS {:.1} MB", *kib as f64 / 1024.0),
            Err(e) => eprintln!("FAILED: {e}"),
        }
        idle.push(IdleFigure { store, outcome });
    }

    if settings.keep_temp {
        let _ = temp.keep();
    }
    Ok(Outcome {
        settings: settings.clone(),
        machine: Machine::read(),
        sync,
        binary: binary.clone(),
        baseline: baseline.cloned(),
        postgres,
        pgbench: pgbench.map(|p| p.version.clone()),
        redis: redis.map(|r| r.version),
        notes,
        rows,
        runs,
        idle,
        started,
    })
}

struct Bench<'a> {
    settings: &'a Settings,
    binary: &'a Binary,
    stores: Vec<(StoreKey, Store)>,
    /// The baseline build and its stores.
    baseline: Option<(&'a Binary, Vec<(StoreKey, Store)>)>,
    pgbench: Option<&'a Pgbench>,
    redis: Option<&'a RedisProgram>,
    logs: PathBuf,
    dir: PathBuf,
    /// The number of the run being made, for file names and progress.
    seq: usize,
}

impl Bench<'_> {
    fn available(&self, side: Side) -> bool {
        match side {
            Side::Fencelock(store) => self.store(store).is_some(),
            Side::Baseline(store) => self.baseline(store).is_some(),
            Side::Pgbench => self.pgbench.is_some(),
            Side::Redis => self.redis.is_some(),
            Side::Bound(_) => self.pgbench.is_some_and(Pgbench::runs_bounds),
        }
    }

    fn store(&self, key: StoreKey) -> Option<&Store> {
        store_in(&self.stores, key)
    }

    /// The baseline build and its store `key`.
    fn baseline(&self, key: StoreKey) -> Option<(&Binary, &Store)> {
        let (binary, stores) = self.baseline.as_ref()?;
        Some((*binary, store_in(stores, key)?))
    }

    fn timing(&self) -> Timing {
        Timing {
            warmup: self.settings.warmup,
            measure: Duration::from_secs(self.settings.seconds),
        }
    }

    fn log(&self, what: &str) -> PathBuf {
        self.logs.join(format!("{:03}-{what}.log", self.seq))
    }

    /// Removes a run's files, unless they are to be kept (server logs of a busy run are
    /// large).
    fn discard(&self, path: &Path) {
        if !self.settings.keep_temp {
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(path)
            } else {
                std::fs::remove_file(path)
            };
        }
    }

    async fn run_side(
        &self,
        side: Side,
        pattern: Pattern,
        connections: usize,
    ) -> anyhow::Result<Figures> {
        match side {
            Side::Fencelock(key) => {
                let store = self.store(key).context("store not set up")?;
                let log = self.log(&format!("fencelock-{key:?}"));
                self.fencelock(self.binary, store, &log, pattern, connections)
                    .await
            }
            Side::Baseline(key) => {
                let (binary, store) = self.baseline(key).context("store not set up")?;
                let log = self.log(&format!("baseline-{key:?}"));
                self.fencelock(binary, store, &log, pattern, connections)
                    .await
            }
            Side::Pgbench => self.pgbench(Script::Reference(pattern), connections).await,
            Side::Bound(bound) => self.pgbench(Script::Bound(bound), connections).await,
            Side::Redis => self.redis(connections).await,
        }
    }

    async fn pgbench(&self, script: Script, connections: usize) -> anyhow::Result<Figures> {
        let pgbench = self.pgbench.context("pgbench is not installed")?;
        let result = pgbench
            .run(
                script,
                connections,
                self.settings.seconds,
                &format!("run-{:03}", self.seq),
            )
            .await?;
        Ok(pgbench_figures(result, script))
    }

    /// One run of `binary` serving `store`, its log in `log`.
    async fn fencelock(
        &self,
        binary: &Binary,
        store: &Store,
        log: &Path,
        pattern: Pattern,
        connections: usize,
    ) -> anyhow::Result<Figures> {
        store.reset().await?;
        let mut server = binary.serve(store, log).await?;
        let mut clients = Vec::with_capacity(connections);
        for _ in 0..connections {
            clients.push(HttpClient::connect(server.port).await?);
        }
        let on_postgres = matches!(store, Store::Postgres { .. });
        let result = load::run(
            clients,
            pattern,
            self.timing(),
            Some(server.pid()),
            on_postgres,
        )
        .await?;
        server.check_alive()?;
        let rss = server.peak_rss_kib().ok();
        server.stop().await?;
        self.discard(log);
        Ok(load_figures(result, pattern, rss))
    }

    async fn redis(&self, connections: usize) -> anyhow::Result<Figures> {
        let program = self.redis.context("redis-server is not installed")?;
        let data = self.dir.join(format!("redis-{:03}", self.seq));
        let log = self.log("redis");
        let server = program.start(&data, &log).await?;
        let sha = load_release_script(server.port).await?;
        let mut clients = Vec::with_capacity(connections);
        for _ in 0..connections {
            clients.push(RedisClient::connect(server.port, sha.clone()).await?);
        }
        let result = load::run(
            clients,
            Pattern::Cycles,
            self.timing(),
            Some(server.pid()),
            false,
        )
        .await?;
        server.stop().await?;
        self.discard(&data);
        self.discard(&log);
        Ok(load_figures(result, Pattern::Cycles, None))
    }

    /// The server's peak RSS with `idle_connections` keep-alive connections open, each
    /// answered once.
    async fn idle(&mut self, key: StoreKey) -> anyhow::Result<u64> {
        self.seq += 1;
        let store = self.store(key).context("store not set up")?;
        store.reset().await?;
        let log = self.log(&format!("fencelock-idle-{key:?}"));
        let mut server = self.binary.serve(store, &log).await?;
        let open = idle_connections(server.port, self.settings.idle_connections).await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.check_alive()?;
        let rss = server.peak_rss_kib()?;
        drop(open);
        server.stop().await?;
        self.discard(&log);
        Ok(rss)
    }
}

fn store_in(stores: &[(StoreKey, Store)], key: StoreKey) -> Option<&Store> {
    stores.iter().find(|(k, _)| *k == key).map(|(_, s)| s)
}

pub fn load_figures(mut result: LoadResult, pattern: Pattern, rss: Option<u64>) -> Figures {
    let seconds = result.elapsed.as_secs_f64();
    let rate = match pattern {
        Pattern::Cycles => result.cycles as f64 / seconds,
        Pattern::Hot => result.won as f64 / seconds,
    };
    let mut error_note = result.first_error.take();
    if result.clients_lost > 0 {
        error_note = Some(format!(
            "{} clients lost their connection; first error: {}",
            result.clients_lost,
            error_note.unwrap_or_default()
        ));
    }
    Figures {
        rate,
        won_fraction: if result.cycles == 0 {
            0.0
        } else {
            result.won as f64 / result.cycles as f64
        },
        latency: Percentiles::of(&mut result.request_us),
        latency_of: LatencyOf::Request,
        cycle_p99_ms: Percentiles::of(&mut result.cycle_us).map(|p| p.p99_ms),
        errors: result.errors,
        error_note: if result.errors > 0 || result.clients_lost > 0 {
            error_note
        } else {
            None
        },
        cpu: result.cpu,
        peak_rss_kib: rss,
    }
}

fn pgbench_figures(mut result: PgbenchResult, script: Script) -> Figures {
    let latency = Percentiles::of(&mut result.transaction_us);
    Figures {
        rate: match script {
            Script::Reference(Pattern::Hot) => result.won_per_second(),
            Script::Reference(Pattern::Cycles) | Script::Bound(_) => result.tps,
        },
        won_fraction: if result.transactions == 0 {
            0.0
        } else {
            result.won as f64 / result.transactions as f64
        },
        latency,
        latency_of: LatencyOf::Cycle,
        cycle_p99_ms: latency.map(|l| l.p99_ms),
        errors: result.failed,
        error_note: (result.failed > 0).then(|| format!("{} failed transactions", result.failed)),
        cpu: result.cpu,
        peak_rss_kib: None,
    }
}
