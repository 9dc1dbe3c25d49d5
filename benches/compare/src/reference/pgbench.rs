//! pgbench running the reference scripts (`benches/reference/`) against a database of its
//! own, made from the reference schema.
//!
//! Cycles: script A commits one acquire and one release per transaction, so cycles/s is
//! pgbench's transactions/s. Hot: script B's transactions mostly lose the acquisition, so
//! its won acquisitions are counted instead, as the deletes on `leases`
//! (`pg_stat_user_tables.n_tup_del`): a won acquisition leaves a row that the same
//! transaction's `DELETE ... AND owner = <its owner>` removes, and a lost one leaves no row
//! of that owner to delete (owners are drawn at random from 10^9 per transaction; a lease
//! lives 30 s, so nobody else can take it over in between). The same count on script A,
//! against its transactions, shows the reasoning holds (nearly every cycle wins there).
//! Latency is pgbench's per-transaction log (`--log`): one cycle.
//!
//! The bounds (`benches/reference/bounds/`) run on a database of fencelock's own schema, set
//! up by the benchmarked build's `fencelock migrate`: what the database alone does with
//! fencelock's writes, with no server in front of it. A bound's release ends its lease row
//! rather than deleting it, so its won acquisitions are the rows it ended as released.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::load::Pattern;
use crate::plan::Bound;
use crate::process::{CpuMeter, CpuUse, children_cpu};
use crate::storage::{Databases, connect};

const SCHEMA: &str = include_str!("../../../reference/schema.sql");
const SCRIPT_A: &str = include_str!("../../../reference/script_a_upsert_10k.sql");
const SCRIPT_B: &str = include_str!("../../../reference/script_b_upsert_hot10.sql");

/// What one pgbench run executes, and on which database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Script {
    /// The reference script of a pattern (A for cycles, B for hot), on the reference schema.
    Reference(Pattern),
    /// A bound, on fencelock's own schema.
    Bound(Bound),
}

/// The text of `bound`'s script.
fn bound_text(bound: Bound) -> &'static str {
    match bound {
        Bound::Rows => include_str!("../../../reference/bounds/rows_1.sql"),
        Bound::Apply => include_str!("../../../reference/bounds/apply_1.sql"),
    }
}

pub struct Pgbench {
    program: PathBuf,
    pub version: String,
    /// The reference database, made from the schema.
    url: String,
    /// The database of fencelock's schema the bounds run on, once [`Pgbench::bounds_on`] set
    /// it.
    bounds_url: Option<String>,
    /// Where the scripts and each run's transaction logs are written.
    dir: PathBuf,
}

/// What one pgbench run measured.
#[derive(Debug)]
pub struct PgbenchResult {
    pub transactions: u64,
    pub failed: u64,
    /// Transactions per second, as pgbench reports it (without the connection time).
    pub tps: f64,
    /// Acquisitions won (the deletes the run made).
    pub won: u64,
    /// Latency of each transaction, in microseconds.
    pub transaction_us: Vec<u32>,
    pub cpu: CpuUse,
}

impl PgbenchResult {
    /// Won acquisitions per second, at pgbench's transaction rate.
    pub fn won_per_second(&self) -> f64 {
        if self.transactions == 0 {
            return 0.0;
        }
        self.tps * self.won as f64 / self.transactions as f64
    }
}

impl Pgbench {
    /// pgbench on `PATH`, with the reference database `name` created (and registered to be
    /// dropped) from the schema; `None` when pgbench is not installed.
    pub async fn prepare(
        databases: &Databases,
        name: &str,
        dir: &Path,
    ) -> anyhow::Result<Option<Self>> {
        let Some(program) = super::on_path("pgbench") else {
            return Ok(None);
        };
        let version = super::version_of(&program);
        let url = databases.create(name).await?;
        connect(&url)
            .await?
            .batch_execute(SCHEMA)
            .await
            .context("creating the reference schema")?;
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("script_a_upsert_10k.sql"), SCRIPT_A)?;
        std::fs::write(dir.join("script_b_upsert_hot10.sql"), SCRIPT_B)?;
        for bound in [Bound::Rows, Bound::Apply] {
            std::fs::write(dir.join(bound.file()), bound_text(bound))?;
        }
        Ok(Some(Self {
            program,
            version,
            url,
            bounds_url: None,
            dir: dir.to_owned(),
        }))
    }

    /// Runs the bounds on `url`, a database the benchmarked build has migrated.
    pub fn bounds_on(&mut self, url: String) {
        self.bounds_url = Some(url);
    }

    pub fn runs_bounds(&self) -> bool {
        self.bounds_url.is_some()
    }

    /// Runs `script` with `clients` clients for `seconds` (pgbench's `-T`, whole seconds);
    /// `run` names this run's log directory.
    pub async fn run(
        &self,
        script: Script,
        clients: usize,
        seconds: u64,
        run: &str,
    ) -> anyhow::Result<PgbenchResult> {
        let (url, file) = match script {
            Script::Reference(Pattern::Cycles) => (&self.url, "script_a_upsert_10k.sql"),
            Script::Reference(Pattern::Hot) => (&self.url, "script_b_upsert_hot10.sql"),
            Script::Bound(bound) => (
                self.bounds_url
                    .as_ref()
                    .context("no database is set up for the bounds")?,
                bound.file(),
            ),
        };
        reset(url).await?;
        let won_before = won(url, script).await?;
        let logs = self.dir.join(run);
        std::fs::create_dir_all(&logs)?;
        let mut command = tokio::process::Command::new(&self.program);
        command
            .args(["-n", "-M", "prepared"])
            .args(["-c", &clients.to_string()])
            .args(["-j", &clients.min(2).to_string()])
            .args(["-T", &seconds.to_string()])
            .arg("-f")
            .arg(self.dir.join(file))
            .arg("--log")
            .arg(format!(
                "--log-prefix={}",
                logs.join("pgbench_log").display()
            ))
            .arg(url)
            .stdin(std::process::Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        let client_cpu_before = children_cpu();
        let meter = CpuMeter::start(None, true);
        let output = command.output().await.context("running pgbench")?;
        let (cpu, _) = meter.finish_with_client(children_cpu() - client_cpu_before);
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            bail!(
                "pgbench failed ({}):\n{}{}",
                output.status,
                stdout,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let summary = parse_summary(&stdout)?;
        let transaction_us = read_latency_logs(&logs)?;
        let won = u64::try_from(won(url, script).await? - won_before)?;
        std::fs::remove_dir_all(&logs)?;
        Ok(PgbenchResult {
            transactions: summary.transactions,
            failed: summary.failed,
            tps: summary.tps,
            won,
            transaction_us,
            cpu,
        })
    }
}

/// Every run starts from an empty, vacuumed table.
async fn reset(url: &str) -> anyhow::Result<()> {
    let session = connect(url).await?;
    session.batch_execute("DELETE FROM leases").await?;
    session.batch_execute("VACUUM (ANALYZE) leases").await?;
    Ok(())
}

/// The won acquisitions counted so far on the database of `script`: the deletes on the
/// reference table, the lease rows ended as released on fencelock's.
async fn won(url: &str, script: Script) -> anyhow::Result<i64> {
    match script {
        Script::Reference(_) => settled_deletes(url).await,
        Script::Bound(_) => Ok(connect(url)
            .await?
            .query_one(
                "SELECT count(*) FROM leases WHERE end_kind = 'released'",
                &[],
            )
            .await?
            .get(0)),
    }
}

/// The deletes counted on `leases` once every other session of the database has ended and
/// the count has stopped moving: a backend reports its counts when it ends, or about once a
/// second while it runs.
async fn settled_deletes(url: &str) -> anyhow::Result<i64> {
    let session = connect(url).await?;
    let until = Instant::now() + Duration::from_secs(60);
    let deletes = async || -> anyhow::Result<i64> {
        Ok(session
            .query_one(
                "SELECT coalesce(max(n_tup_del), 0) FROM pg_stat_user_tables WHERE relname = 'leases'",
                &[],
            )
            .await?
            .get(0))
    };
    let mut last = None;
    while Instant::now() < until {
        let others: i64 = session
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()
                   AND backend_type = 'client backend'",
                &[],
            )
            .await?
            .get(0);
        if others == 0 {
            let now = deletes().await?;
            if last == Some(now) {
                return Ok(now);
            }
            last = Some(now);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    bail!("the delete count on the reference table did not settle within 60 s")
}

#[derive(Debug, PartialEq)]
struct Summary {
    transactions: u64,
    failed: u64,
    tps: f64,
}

/// The figures of pgbench's closing report.
fn parse_summary(stdout: &str) -> anyhow::Result<Summary> {
    let after = |prefix: &str| {
        stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .map(str::trim)
    };
    let first_number = |s: &str| -> Option<String> {
        s.split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .find(|t| !t.is_empty())
            .map(str::to_owned)
    };
    let transactions = after("number of transactions actually processed:")
        .and_then(first_number)
        .context("no transaction count in pgbench's output")?
        .parse()?;
    let failed = after("number of failed transactions:")
        .and_then(first_number)
        .map_or(Ok(0), |n| n.parse())?;
    let tps = after("tps =")
        .and_then(first_number)
        .context("no tps in pgbench's output")?
        .parse()?;
    Ok(Summary {
        transactions,
        failed,
        tps,
    })
}

/// The latency (third field, microseconds) of every transaction in pgbench's per-thread
/// logs in `dir`; failed or skipped transactions have none and are left out.
fn read_latency_logs(dir: &Path) -> anyhow::Result<Vec<u32>> {
    let mut latencies = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let text = std::fs::read_to_string(entry?.path())?;
        latencies.extend(parse_latency_log(&text));
    }
    Ok(latencies)
}

fn parse_latency_log(text: &str) -> impl Iterator<Item = u32> + '_ {
    text.lines()
        .filter_map(|line| line.split_whitespace().nth(2)?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_is_read_from_pgbench_15_output() {
        let out = "pgbench (15.20 (Debian 15.20-0+deb12u1))
transaction type: script_a_upsert_10k.sql
scaling factor: 1
query mode: prepared
number of clients: 16
number of threads: 2
maximum number of tries: 1
duration: 12 s
number of transactions actually processed: 91234
number of failed transactions: 3 (0.003%)
latency average = 2.104 ms
initial connection time = 46.302 ms
tps = 7603.123124 (without initial connection time)
";
        assert_eq!(
            parse_summary(out).unwrap(),
            Summary {
                transactions: 91234,
                failed: 3,
                tps: 7603.123124
            }
        );
        assert!(parse_summary("pgbench: error: connection failed").is_err());
    }

    #[test]
    fn latencies_skip_failed_transactions() {
        let log = "0 1 28248 0 1796035925 31336\n0 2 failed 0 1796035925 55105\n1 1 512 0 1796035925 75211\n";
        assert_eq!(parse_latency_log(log).collect::<Vec<_>>(), vec![28248, 512]);
    }

    #[test]
    fn won_per_second_scales_the_transaction_rate() {
        let result = PgbenchResult {
            transactions: 1000,
            failed: 0,
            tps: 500.0,
            won: 250,
            transaction_us: Vec::new(),
            cpu: CpuUse::default(),
        };
        assert_eq!(result.won_per_second(), 125.0);
    }
}
