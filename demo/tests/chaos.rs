//! `fencelock-demo chaos`, run as a user runs it: short runs that must pass with every fault
//! kind injected, a run with the demo store's guard off that the checks must catch, and a run
//! of a lease server built to serve its queue in reverse that the replay against the model's
//! rules must catch.
//!
//! The lease servers are the `fencelock` binary beside the demo's (`cargo test --workspace`
//! builds both).

use std::path::PathBuf;
use std::process::{Command, Output};

use fencelock_testkit::{StoreKind, TestDb};

fn fencelock_binary() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_fencelock-demo")).with_file_name("fencelock");
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build -p fencelock-server --bin fencelock` (or the whole workspace's tests)",
        path.display()
    );
    path
}

fn chaos(args: &[&str]) -> Output {
    chaos_with(args, None)
}

/// A run whose lease servers break `rule` on purpose (`FENCELOCK_BROKEN_RULE`, known to debug
/// builds only), if one is given.
fn chaos_with(args: &[&str], rule: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fencelock-demo"));
    command
        .arg("chaos")
        .args(args)
        .arg("--fencelock-bin")
        .arg(fencelock_binary())
        .env_remove("RUST_LOG")
        .env_remove("DATABASE_URL")
        .env_remove("FENCELOCK_BROKEN_RULE");
    if let Some(rule) = rule {
        command.env("FENCELOCK_BROKEN_RULE", rule);
    }
    command.output().expect("the demo binary runs")
}

/// The numbers of the last line: operations, faults, stale writes rejected, violations,
/// steps the model cannot explain.
fn last_line(stdout: &str) -> [u64; 5] {
    let last = stdout.lines().last().unwrap_or_default();
    let numbers: Vec<u64> = last
        .strip_prefix("chaos: ")
        .unwrap_or_else(|| panic!("last line {last:?}"))
        .split(", ")
        .map(|part| part.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        last,
        format!(
            "chaos: {} operations, {} faults, {} stale writes rejected, {} violations, {} unexplained by the model",
            numbers[0], numbers[1], numbers[2], numbers[3], numbers[4]
        )
    );
    numbers.try_into().unwrap()
}

/// The number before `what` in the faults line.
fn faults_of(stdout: &str, what: &str) -> u64 {
    number_in(stdout, "chaos: faults:", what)
}

/// The number before `what` in the line that starts with `line`.
fn number_in(stdout: &str, line: &str, what: &str) -> u64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(line))
        .unwrap_or_else(|| panic!("no {line:?} line in {stdout}"));
    let before = &line[..line
        .find(what)
        .unwrap_or_else(|| panic!("{what:?} not in {line:?}"))];
    before
        .trim_end()
        .rsplit([' ', ':', ';', '('])
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The report of a run that passed: it succeeded, with 1,000 operations or more, a stale
/// write rejected, no violation, and every step explained by the model; and renewals and
/// lock delays were in the mix.
fn passed(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let [operations, _, stale_rejected, violations, unexplained] = last_line(&stdout);
    assert_eq!((violations, unexplained), (0, 0), "{stdout}");
    assert!(operations >= 1000, "{stdout}");
    // The run's first pause lasts until it is overtaken: its late write meets the guard.
    assert!(stale_rejected >= 1, "{stdout}");
    let mix = stdout.lines().rev().nth(1).unwrap_or_default();
    assert!(mix.starts_with("chaos: mix: "), "{stdout}");
    assert!(number_in(&stdout, "chaos: mix:", "renews") >= 1, "{stdout}");
    assert!(
        number_in(&stdout, "chaos: mix:", "lock delays") >= 1,
        "{stdout}"
    );
    stdout
}

/// A run waited, had waiters leave, and (where `kills`) killed instances holding waiters.
fn assert_waiting_exercised(stdout: &str, kills: bool) {
    let waited = number_in(stdout, "chaos: waiting:", "waited acquisitions");
    let acquired = number_in(stdout, "chaos: waiting:", "acquired,");
    let departed = number_in(stdout, "chaos: waiting:", "waiters departed");
    assert!(waited >= 50 && acquired >= 1 && departed >= 1, "{stdout}");
    if kills {
        let with_waiters = number_in(stdout, "chaos: faults:", "of an instance holding waiters");
        assert!(with_waiters >= 1, "{stdout}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_short_run_on_postgresql_passes_with_every_fault() {
    let db = TestDb::new(StoreKind::Postgres).await;
    let out = chaos(&[
        "--seconds",
        "15",
        "--seed",
        "7",
        "--database-url",
        &db.url(),
    ]);
    let stdout = passed(&out);
    let [_, faults, _, _, _] = last_line(&stdout);
    let (kills, cuts, pauses) = (
        faults_of(&stdout, "kill -9"),
        faults_of(&stdout, "connection cuts"),
        faults_of(&stdout, "pauses past the TTL"),
    );
    assert!(kills >= 1 && cuts >= 1 && pauses >= 1, "{stdout}");
    assert_eq!(faults, kills + cuts + pauses, "{stdout}");
    assert_waiting_exercised(&stdout, true);
}

/// Several instances on one SQLite file: kills (of instances holding waiters too), pauses,
/// waiting and departing waiters; no connection to cut.
#[test]
fn a_short_run_on_sqlite_passes_with_every_fault() {
    let stdout = passed(&chaos(&["--seconds", "15", "--seed", "7"]));
    assert!(faults_of(&stdout, "kill -9") >= 1, "{stdout}");
    assert_waiting_exercised(&stdout, true);
}

/// With the guard off, paused workers' late writes land after greater fences: the write
/// log shows it, and the run fails.
#[test]
fn a_store_without_its_guard_is_caught() {
    let out = chaos(&["--seconds", "8", "--seed", "2", "--no-guard"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let [_, _, stale_rejected, violations, _] = last_line(&stdout);
    assert!(violations >= 1, "{stdout}");
    assert_eq!(stale_rejected, 0, "{stdout}");
    assert!(stdout.contains("was applied after fence"), "{stdout}");
    assert!(
        stdout.contains("connection cuts skipped (SQLite)"),
        "{stdout}"
    );
}

/// Lease servers that serve each resource's queue last come, first served (a debug build's
/// `FENCELOCK_BROKEN_RULE=handover-reversed`, SQLite's queue): the replay of the history
/// against the model's rules cannot explain it, and the run fails.
#[test]
fn a_server_that_serves_its_queue_in_reverse_is_caught_by_the_replay() {
    // Two resources: many waiters on each, so that most grants show the order.
    let out = chaos_with(
        &["--seconds", "15", "--seed", "7", "--resources", "2"],
        Some("handover-reversed"),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let [_, _, _, _, unexplained] = last_line(&stdout);
    assert!(unexplained >= 1, "{stdout}");
    assert!(
        stdout.contains("the rules answer queued: a live waiter was ahead"),
        "{stdout}"
    );
}
