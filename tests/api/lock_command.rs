//! `fencelock lock RESOURCE -- CMD`, the real binary against a real server: the fence in
//! CMD's environment, the lease released when CMD ends, the exit statuses, signals passed
//! on, and CMD stopped when the lease is lost.
//!
//! CMD is a small `sh` script. Scripts that wait do so in bounded loops of short sleeps (at
//! most 30 s), so a failed test leaves no process behind for long, and they are told when to
//! end by a file, not by the clock. Timing bounds are generous (seconds where the property
//! needs hundreds of milliseconds), for a machine busy with other builds.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use fencelock::client::Client;
use fencelock_testkit::{Proxy, assert_failed_in_one_line, closed_port};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

use crate::helpers::{StoreKind, TTL, TestApp};

/// The longest a test waits for `fencelock lock` to reach a point or to end.
const PATIENCE: Duration = Duration::from_secs(20);

/// A loop of at most 30 s that ends when the file `go` exists in the working directory.
const UNTIL_GO: &str = "i=0; while [ ! -e go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done";

contract_stores!(
    runs_the_command_with_the_fence_and_releases_after,
    a_lease_taken_over_stops_the_command,
    waits_for_the_holder_to_release,
);

/// `fencelock lock RESOURCE --url URL [args] -- sh -c SCRIPT`, in `dir`, with the
/// environment of the tests' server processes (no setting leaks in from the developer's
/// shell) and stdout and stderr captured.
fn lock(dir: &Path, url: &str, resource: &str, args: &[&str], script: &str) -> Command {
    let mut command = crate::process::command(None, dir);
    command
        .args(["lock", resource, "--url", url])
        .args(args)
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut command = Command::from(command);
    // A test that fails half-way must not leave `fencelock lock` behind.
    command.kill_on_drop(true);
    command
}

/// The next line CMD writes on stdout, within [`PATIENCE`].
async fn line(child: &mut Child) -> String {
    let stdout = child.stdout.as_mut().expect("stdout is piped");
    let mut line = String::new();
    let mut reader = BufReader::new(stdout);
    tokio::time::timeout(PATIENCE, reader.read_line(&mut line))
        .await
        .expect("CMD wrote no line in time")
        .expect("reading CMD's output");
    line.trim_end().to_owned()
}

/// Waits for `fencelock lock` to end, within [`PATIENCE`].
async fn finished(child: Child) -> Output {
    tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .expect("fencelock lock did not end in time")
        .expect("waiting for fencelock lock")
}

/// Sends `signal` (as `kill` spells it) to the process `pid`.
fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// Runs `fencelock lock` to its end and asserts that it was refused before running CMD:
/// exit status `status`, nothing on stdout, and one line on stderr, which it returns.
async fn assert_refused(mut command: Command, status: i32, context: &str) -> String {
    let output = command.output().await.expect("running fencelock lock");
    assert_eq!(output.status.code(), Some(status), "{context}: {output:?}");
    assert!(output.stdout.is_empty(), "{context}: CMD ran: {output:?}");
    assert_failed_in_one_line(&output, context)
}

async fn assert_released(app: &TestApp, resource: &str) {
    let response = app.inspect(resource).await;
    assert_eq!(
        response.status(),
        404,
        "the lease on {resource} is still live"
    );
}

/// CMD sees the fence of a live lease; a second `fencelock lock` meanwhile is refused with
/// 75 and one line, and never runs its CMD; once CMD ends (status 0), the lease is gone.
async fn runs_the_command_with_the_fence_and_releases_after(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let dir = tempfile::tempdir().unwrap();
    let script = format!("echo $FENCELOCK_FENCE $FENCELOCK_RESOURCE $FENCELOCK_URL; {UNTIL_GO}");
    let mut first = lock(dir.path(), &app.address, "job:1", &[], &script)
        .spawn()
        .unwrap();
    let shown = line(&mut first).await;
    let fields: Vec<&str> = shown.split(' ').collect();
    let fence: i64 = fields[0].parse().unwrap_or_else(|_| panic!("{shown:?}"));
    assert_eq!(&fields[1..], ["job:1", app.address.as_str()], "{shown}");
    assert_eq!(app.fence_of("job:1").await, fence);

    let no_wait = ["--wait-seconds", "0"];
    let second = lock(dir.path(), &app.address, "job:1", &no_wait, "echo ran");
    let said = assert_refused(second, 75, "second fencelock lock").await;
    assert!(said.contains("held by another owner"), "{said}");

    std::fs::write(dir.path().join("go"), "").unwrap();
    let output = finished(first).await;
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(output.stderr.is_empty(), "{output:?}");
    assert_released(&app, "job:1").await;
}

/// CMD's status is `fencelock lock`'s: its exit code, or 128+N when signal N ended it; a
/// CMD that cannot be found is 127. The lease is released every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_status_is_passed_through() {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    for (script, status) in [("exit 7", 7), ("true", 0), ("kill -KILL $$", 137)] {
        let output = lock(dir.path(), &app.address, "job:1", &[], script)
            .output()
            .await
            .unwrap();
        assert_eq!(output.status.code(), Some(status), "{script}: {output:?}");
        assert_released(&app, "job:1").await;
    }

    let mut missing = crate::process::command(None, dir.path());
    missing.args([
        "lock",
        "job:1",
        "--url",
        &app.address,
        "--",
        "/nonexistent/cmd",
    ]);
    let output = missing.output().unwrap();
    assert_eq!(output.status.code(), Some(127), "{output:?}");
    let said = assert_failed_in_one_line(&output, "missing CMD");
    assert!(said.contains("/nonexistent/cmd"), "{said}");
    assert_released(&app, "job:1").await;
}

/// SIGTERM, SIGINT and SIGHUP sent to `fencelock lock` reach CMD, whose status is then
/// `fencelock lock`'s; the lease is released after CMD has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_reach_the_command() {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    for name in ["TERM", "INT", "HUP"] {
        let marker = dir.path().join(name);
        let script = format!("trap 'echo {name} > {name}; exit 3' {name}; echo ready; {UNTIL_GO}");
        let mut child = lock(dir.path(), &app.address, "job:1", &[], &script)
            .spawn()
            .unwrap();
        assert_eq!(line(&mut child).await, "ready");
        signal(child.id().unwrap(), &format!("-{name}"));
        let output = finished(child).await;
        assert_eq!(output.status.code(), Some(3), "{name}: {output:?}");
        let written = std::fs::read_to_string(&marker).unwrap_or_default();
        assert_eq!(written.trim(), name, "CMD did not get SIG{name}");
        assert_released(&app, "job:1").await;
    }
}

/// With its renewals blocked (the connection to the server frozen) a 2 s lease is lost:
/// CMD gets SIGTERM (its trap writes a marker and exits 0), and `fencelock lock` still
/// exits 124, with one line saying the lease was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_renewals_stop_the_command() {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    let proxy = Proxy::start(app.socket_address());
    let url = format!("http://{}", proxy.addr());
    let dir = tempfile::tempdir().unwrap();
    let script = format!("trap 'touch stopped; exit 0' TERM; echo ready; {UNTIL_GO}");
    let mut child = lock(dir.path(), &url, "job:1", &["--ttl-seconds", "2"], &script)
        .spawn()
        .unwrap();
    assert_eq!(line(&mut child).await, "ready");
    proxy.freeze();
    let frozen = Instant::now();
    let output = finished(child).await;
    assert_eq!(output.status.code(), Some(124), "{output:?}");
    let said = assert_failed_in_one_line(&output, "lost lease");
    assert!(said.contains("lost the lease on `job:1`"), "{said}");
    assert!(
        dir.path().join("stopped").exists(),
        "CMD did not get SIGTERM"
    );
    // The lease is lost once no renewal is confirmed within its 2 s: CMD is stopped within
    // that, not at the end of its own 30 s loop (nor of the 10 s grace).
    assert!(
        frozen.elapsed() < Duration::from_secs(8),
        "{:?}",
        frozen.elapsed()
    );
}

/// A renewal refused because another owner took the lease over stops CMD: SIGTERM (which
/// this CMD notes and ignores), then SIGKILL after the grace period; exit status 124.
async fn a_lease_taken_over_stops_the_command(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let dir = tempfile::tempdir().unwrap();
    let script = format!("trap 'echo TERM >> signals' TERM; echo ready; {UNTIL_GO}");
    let args = ["--ttl-seconds", "3", "--grace-seconds", "1"];
    let mut child = lock(dir.path(), &app.address, "job:1", &args, &script)
        .spawn()
        .unwrap();
    assert_eq!(line(&mut child).await, "ready");
    app.db.age("job:1", 1).await;
    app.acquire_ok("job:1", "thief", TTL).await;
    let taken = Instant::now();

    let output = finished(child).await;
    assert_eq!(output.status.code(), Some(124), "{output:?}");
    let said = assert_failed_in_one_line(&output, "taken over");
    assert!(said.contains("lost the lease on `job:1`"), "{said}");
    let signals = std::fs::read_to_string(dir.path().join("signals")).unwrap_or_default();
    assert_eq!(signals.trim(), "TERM", "CMD did not get SIGTERM");
    // A renewal comes every second (a third of 3 s) and the grace is 1 s; without SIGKILL
    // CMD would loop for 30 s.
    assert!(
        taken.elapsed() < Duration::from_secs(10),
        "{:?}",
        taken.elapsed()
    );
    // The thief's lease is untouched.
    assert_eq!(app.inspect("job:1").await.status(), 200);
}

/// With `--wait-seconds 5`, a resource whose holder releases it after about a second is
/// acquired (by the server's waiting, API.md *Waiting*), and CMD runs with a greater fence.
async fn waits_for_the_holder_to_release(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let client = Client::builder(&app.address).no_proxy().build().unwrap();
    let holder = client
        .lease("job:1", Duration::from_secs(60))
        .await
        .unwrap();
    let held_fence = holder.fence();
    let dir = tempfile::tempdir().unwrap();
    let waiter = lock(
        dir.path(),
        &app.address,
        "job:1",
        &["--wait-seconds", "5"],
        "echo $FENCELOCK_FENCE",
    )
    .spawn()
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    holder.release().await.unwrap();

    let output = finished(waiter).await;
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let fence: i64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(fence > held_fence, "{fence} after {held_fence}");
    assert_released(&app, "job:1").await;
}

/// A server that cannot be reached: 69, one line, CMD never run.
#[tokio::test]
async fn an_unreachable_server_is_69() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{}", closed_port());
    let command = lock(dir.path(), &url, "job:1", &[], "echo ran");
    let said = assert_refused(command, 69, "unreachable").await;
    assert!(said.starts_with("fencelock lock: "), "{said}");
}
