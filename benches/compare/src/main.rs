//! The comparative benchmark: fencelock on each store against the references installed on
//! this machine (pgbench running the same SQL, Redis with `appendfsync always`), at 1, 16
//! and 64 connections, alternating the sides, and a table of ratios on stdout.
//!
//! ```sh
//! cargo run --release -p fencelock-bench              # the full run (about 8 minutes)
//! cargo run --release -p fencelock-bench -- --quick   # a smoke test (about 2 minutes)
//! ```
//!
//! The lease server is the release binary, run as its own process with its normal logging;
//! every database the benchmark creates is dropped when it ends, fails, panics or is
//! interrupted (Ctrl-C).
//!
//! Layout: `plan` (what runs, in which order), `bench` (running the plan), `fencelock` (the
//! server process), `process` (child processes, CPU and memory accounting), `load` (the load
//! generator), `reference` (pgbench, Redis), `storage` (databases), `machine` (facts and
//! the fdatasync rate), `stats`, `report`; `waiting` and `floor` are workloads of their own
//! (`--waiting`, `--floor`).

mod bench;
mod crowds;
mod fencelock;
mod floor;
mod load;
mod machine;
mod plan;
mod process;
mod reference;
mod report;
mod stats;
mod storage;
mod waiting;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};

use crate::bench::Settings;
use crate::fencelock::Binary;
use crate::plan::Block;
use crate::storage::Databases;

#[derive(Debug, Parser)]
#[command(
    name = "fencelock-bench",
    about = "Compares fencelock with pgbench and Redis on this machine, and prints the ratios"
)]
struct Options {
    /// Seconds each run is measured (pgbench's -T).
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u64).range(1..))]
    seconds: u64,

    /// Rounds: each row's sides run this many times, alternated.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,

    /// Warm-up before fencelock and Redis runs are measured, in milliseconds (a fresh
    /// server opens its database connections on the first requests).
    #[arg(long, default_value_t = 1000)]
    warmup_ms: u64,

    /// A smoke test: 3 s runs, one round, 500 ms warm-up (overrides the three above).
    #[arg(long)]
    quick: bool,

    /// Live leases loaded for the "many leases" comparison.
    #[arg(long, default_value_t = 1_000_000)]
    live_leases: u64,

    /// Idle keep-alive connections held open for the memory measurement.
    #[arg(long, default_value_t = 1000)]
    idle_connections: usize,

    /// Only the rows of one store (and its reference).
    #[arg(long, value_enum)]
    only: Option<Block>,

    /// PostgreSQL to use: an existing database on the server to connect to for creating
    /// the benchmark's own databases (which are always dropped).
    #[arg(
        long,
        env = "FENCELOCK_BENCH_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres",
        hide_env_values = true
    )]
    database_url: String,

    /// The fencelock binary to run; by default the benchmark builds the release binary
    /// (`cargo build --release --bin fencelock`) and uses it.
    #[arg(long)]
    fencelock_bin: Option<PathBuf>,

    /// Another fencelock binary (the build before a change, say) to run beside the first on
    /// every row with an empty store, on stores of its own, alternated with the other sides:
    /// the summary then also gives each row's ratio of the two builds, measured in one run.
    #[arg(long, conflicts_with_all = ["waiting", "floor"])]
    baseline_bin: Option<PathBuf>,

    /// Worker threads of the load generator.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    client_threads: u16,

    /// Keep the temporary directory (server logs, SQLite files) and say where it is.
    #[arg(long)]
    keep_temp: bool,

    /// Run only the waiting workload: 64 clients contending for 10 resources with
    /// `wait_ms`, against the same clients polling without it (`--seconds` per run, 3 with
    /// `--quick`; `--only` picks one store).
    #[arg(long, conflicts_with = "floor")]
    waiting: bool,

    /// Run only the crowds: 4000 watches of one resource answered after its release, and a
    /// burst of 18,000 connections and the server's memory after it (`--only` picks one
    /// store).
    #[arg(long, conflicts_with_all = ["waiting", "floor"])]
    crowds: bool,

    /// Run only the HTTP floor: the SQLite store's cycles against cycles of two `GET
    /// /healthz` (no store) on the same server and clients, at 1, 16 and 64 connections
    /// (`--seconds`, `--rounds` and `--quick` apply).
    #[arg(long)]
    floor: bool,
}

impl Options {
    fn settings(&self) -> Settings {
        let (seconds, rounds, warmup_ms) = if self.quick {
            (3, 1, 500)
        } else {
            (self.seconds, self.rounds, self.warmup_ms)
        };
        Settings {
            seconds,
            rounds,
            warmup: Duration::from_millis(warmup_ms),
            live_leases: self.live_leases,
            idle_connections: self.idle_connections,
            only: self.only,
            keep_temp: self.keep_temp,
        }
    }
}

fn main() -> ExitCode {
    let options = Options::parse();
    let settings = options.settings();
    // Declared before the runtime, so dropped after it: if a panic unwinds through here,
    // the runtime (and with it every child process) goes first, then the databases.
    let databases = Databases::new(&options.database_url);
    if let Err(e) = process::raise_open_file_limit() {
        eprintln!("fencelock-bench: could not raise the open-file limit: {e}");
    }
    let binary = match Binary::prepare(options.fencelock_bin.as_deref()) {
        Ok(binary) => binary,
        Err(e) => {
            eprintln!("fencelock-bench: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let baseline = match options
        .baseline_bin
        .as_deref()
        .map(Binary::given_as_baseline)
        .transpose()
    {
        Ok(baseline) => baseline,
        Err(e) => {
            eprintln!("fencelock-bench: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(options.client_threads))
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("fencelock-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    if options.waiting {
        let seconds = if options.quick { 3 } else { options.seconds };
        let report = waiting::run(seconds, &databases, &binary, options.only);
        return finish(run_to_end(runtime, &databases, report), print_report);
    }
    if options.crowds {
        let report = crowds::run(&databases, &binary, options.only);
        return finish(run_to_end(runtime, &databases, report), print_report);
    }
    if options.floor {
        let report = floor::run(&settings, &binary);
        return finish(run_to_end(runtime, &databases, report), print_report);
    }
    // On a signal the benchmark's future is dropped: its servers are killed and its temporary
    // directory removed.
    let outcome = run_to_end(
        runtime,
        &databases,
        bench::run(&settings, &databases, &binary, baseline.as_ref()),
    );
    finish(outcome, |outcome| {
        print!("{}", report::render(&outcome));
        let failed = outcome.runs.iter().any(|r| r.outcome.is_err())
            || outcome.idle.iter().any(|i| i.outcome.is_err());
        if failed {
            eprintln!("fencelock-bench: some runs failed (see the table)");
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    })
}

/// Runs `work` until it ends or a signal comes (`None`), then drops the benchmark's
/// databases and the runtime, with every child process still running on it.
fn run_to_end<T>(
    runtime: tokio::runtime::Runtime,
    databases: &Databases,
    work: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<Option<T>> {
    let result = runtime.block_on(async {
        tokio::select! {
            done = work => done.map(Some),
            name = interrupted() => {
                eprintln!("\n{name}: stopping and cleaning up");
                Ok(None)
            }
        }
    });
    runtime.block_on(databases.drop_all());
    drop(runtime);
    result
}

/// The exit status: `done`'s when the work ended, 130 when a signal stopped it, failure
/// (with the error) when it failed.
fn finish<T>(result: anyhow::Result<Option<T>>, done: impl FnOnce(T) -> ExitCode) -> ExitCode {
    match result {
        Ok(Some(outcome)) => done(outcome),
        Ok(None) => ExitCode::from(130),
        Err(e) => {
            eprintln!("fencelock-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A single-workload mode's report, printed as it is.
fn print_report(report: String) -> ExitCode {
    print!("{report}");
    ExitCode::SUCCESS
}

/// Resolves on SIGINT, SIGTERM or SIGHUP, with the signal's name.
async fn interrupted() -> &'static str {
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
        _ = hup.recv() => "SIGHUP",
    }
}
