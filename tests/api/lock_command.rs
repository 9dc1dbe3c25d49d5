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
    a_deleted_lease_stops_the_whole_group,
);

/// `fencelock lock RESOURCE --url URL [args] -- sh -c SCRIPT`, in `dir`, with the
/// environment of the tests' server processes (no setting leaks in from the developer's
/// shell) and stdout and stderr captured. The script's own stderr goes to the file
/// `cmd.err`, so that stderr holds only what `fencelock lock` says (a shell reports there
/// each of its children that a signal to the group ended: "Terminated").
fn lock(dir: &Path, url: &str, resource: &str, args: &[&str], script: &str) -> Command {
    let mut command = crate::process::command(None, dir);
    command
        .args(["lock", resource, "--url", url])
        .args(args)
        .args(["--", "sh", "-c", &format!("exec 2>cmd.err; {script}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut command = Command::from(command);
    // A test that fails half-way must not leave `fencelock lock` behind.
    command.kill_on_drop(true);
    command
}

/// [`lock`] on `job:1`, waiting up to 5 s for the lease (`--wait-seconds 5`).
fn lock_waiting(dir: &Path, url: &str, script: &str) -> Command {
    lock(dir, url, "job:1", &["--wait-seconds", "5"], script)
}

/// A lease server on SQLite, and a working directory for `fencelock lock`.
async fn on_sqlite() -> (TestApp, tempfile::TempDir) {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    (app, tempfile::tempdir().unwrap())
}

/// [`lock`] on `job:1`, spawned, once CMD has written `ready`.
async fn started(dir: &Path, url: &str, args: &[&str], script: &str) -> Child {
    let mut child = lock(dir, url, "job:1", args, script).spawn().unwrap();
    assert_eq!(line(&mut child).await, "ready");
    child
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

/// `fencelock lock` on `job:1` with a TTL of `ttl_seconds`, talking to the server through a
/// proxy the test can freeze, once its CMD (`script`, which prints `ready`) has started.
struct Proxied {
    app: TestApp,
    proxy: Proxy,
    dir: tempfile::TempDir,
    child: Child,
}

async fn behind_a_proxy(ttl_seconds: u32, script: &str) -> Proxied {
    let (app, dir) = on_sqlite().await;
    let proxy = Proxy::start(app.socket_address());
    let url = format!("http://{}", proxy.addr());
    let ttl = ttl_seconds.to_string();
    let child = started(dir.path(), &url, &["--ttl-seconds", &ttl], script).await;
    Proxied {
        app,
        proxy,
        dir,
        child,
    }
}

/// Waits for `fencelock lock` to end, within [`PATIENCE`].
async fn finished(child: Child) -> Output {
    tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .expect("fencelock lock did not end in time")
        .expect("waiting for fencelock lock")
}

/// Sends `signal` (as `kill` spells it) to the process `pid`, or to the process group it
/// leads when `group`.
fn signal(pid: u32, signal: &str, group: bool) {
    let target = if group {
        format!("-{pid}")
    } else {
        pid.to_string()
    };
    let status = std::process::Command::new("kill")
        .args([signal, "--", &target])
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
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    assert_eq!(status, 404, "the lease on {resource} is still live: {body}");
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
    let (app, dir) = on_sqlite().await;
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
    assert_ended_saying(&output, 127, "missing CMD", "/nonexistent/cmd");
    assert_released(&app, "job:1").await;
}

/// Asserts that `fencelock lock` exited with `status`, saying one line (about `what`) that
/// contains `words`; returns that line.
fn assert_ended_saying(
    output: &std::process::Output,
    status: i32,
    what: &str,
    words: &str,
) -> String {
    assert_eq!(output.status.code(), Some(status), "{output:?}");
    let said = assert_failed_in_one_line(output, what);
    assert!(said.contains(words), "{said}");
    said
}

/// SIGTERM, SIGINT, SIGHUP and SIGQUIT sent to `fencelock lock` reach CMD, whose status is then
/// `fencelock lock`'s; the lease is released after CMD has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_reach_the_command() {
    let (app, dir) = on_sqlite().await;
    for name in ["TERM", "INT", "HUP", "QUIT"] {
        let marker = dir.path().join(name);
        let script = format!("trap 'echo {name} > {name}; exit 3' {name}; echo ready; {UNTIL_GO}");
        let child = started(dir.path(), &app.address, &[], &script).await;
        signal(child.id().unwrap(), &format!("-{name}"), false);
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
    let script = format!("trap 'touch stopped; exit 0' TERM; echo ready; {UNTIL_GO}");
    // The server lives to the end of the test.
    let Proxied {
        app: _app,
        proxy,
        dir,
        child,
    } = behind_a_proxy(2, &script).await;
    proxy.freeze();
    let frozen = Instant::now();
    let output = finished(child).await;
    assert_ended_saying(&output, 124, "lost lease", "lost the lease on `job:1`");
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
    let child = started(dir.path(), &app.address, &args, &script).await;
    app.db.age("job:1", 1).await;
    app.acquire_ok("job:1", "thief", TTL).await;
    let taken = Instant::now();

    let output = finished(child).await;
    assert_ended_saying(&output, 124, "taken over", "lost the lease on `job:1`");
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
    let waiter = lock_waiting(dir.path(), &app.address, "echo $FENCELOCK_FENCE")
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

/// Whether process `pid` runs: it exists and has not ended. A zombie (ended, not yet waited
/// for) does not run; this container's init does not reap, so zombies stay.
fn running(pid: i32) -> bool {
    stat(pid).is_some_and(|fields| !matches!(fields[0].as_str(), "Z" | "X"))
}

/// The process group of `pid`, while it exists.
fn process_group(pid: i32) -> Option<i32> {
    stat(pid).and_then(|fields| fields.get(2)?.parse().ok())
}

/// The fields of `/proc/PID/stat` after the command name: state, parent, process group, ...
fn stat(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// The process ids CMD wrote, one a line, to the file `pids` of `dir`.
fn recorded_pids(dir: &Path, count: usize) -> Vec<i32> {
    let text = std::fs::read_to_string(dir.join("pids")).expect("CMD wrote its pids");
    let pids: Vec<i32> = text.lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(pids.len(), count, "{text}");
    pids
}

/// Asserts that none of `pids` runs; kills those that do first, so that a failure leaves
/// nothing behind.
fn assert_none_runs(pids: &[i32], context: &str) {
    let left: Vec<i32> = pids.iter().copied().filter(|pid| running(*pid)).collect();
    for pid in &left {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    assert!(left.is_empty(), "{context}: still running: {left:?}");
}

/// Waits, within [`PATIENCE`], until none of `pids` runs; then asserts it.
async fn assert_all_end(pids: &[i32], context: &str) {
    let start = Instant::now();
    while pids.iter().any(|pid| running(*pid)) && start.elapsed() < PATIENCE {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_none_runs(pids, context);
}

/// True once no process is left in process group `pgid`.
fn group_is_empty(pgid: i32) -> bool {
    use nix::sys::signal::killpg;
    killpg(nix::unistd::Pid::from_raw(pgid), None) == Err(nix::errno::Errno::ESRCH)
}

/// A CMD that starts a background `sleep` and one that ignores SIGTERM, and writes the pids
/// of both and its own to `pids`, then says `ready`.
const WITH_CHILDREN: &str = "sleep 301 & echo $! > pids; (trap '' TERM; exec sleep 302) & \
    echo $! >> pids; echo $$ >> pids; echo ready";

/// CMD runs in a process group of its own. When its lease goes (the row deleted, as an
/// operator would), the whole group is stopped, not CMD alone: a `sleep` CMD started, and
/// one that ignores SIGTERM. `fencelock lock` exits 124 only once the group is empty.
async fn a_deleted_lease_stops_the_whole_group(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let dir = tempfile::tempdir().unwrap();
    let script = format!("trap 'echo TERM >> signals' TERM; {WITH_CHILDREN}; {UNTIL_GO}");
    let child = started(dir.path(), &app.address, &["--ttl-seconds", "3"], &script).await;
    let pids = recorded_pids(dir.path(), 3);
    let own = i32::try_from(child.id().unwrap()).unwrap();
    let group = process_group(pids[2]).expect("CMD runs");
    assert_ne!(
        Some(group),
        process_group(own),
        "CMD is in fencelock lock's group"
    );
    assert!(pids.iter().all(|pid| process_group(*pid) == Some(group)));

    app.db
        .execute("DELETE FROM leases WHERE resource = 'job:1'")
        .await;
    let output = finished(child).await;
    // Nothing of the group is left the moment `fencelock lock` has ended.
    let empty = group_is_empty(group);
    assert_none_runs(&pids, "after the lease was deleted");
    assert!(empty, "processes (or zombies) are left in CMD's group");
    assert_ended_saying(&output, 124, "deleted lease", "lost the lease on `job:1`");
}

/// By default, a CMD that traps SIGTERM and goes on is killed before its lease's expiry, by
/// the server's reckoning: renewals blocked (the connection frozen), `fencelock lock` has
/// ended, and its whole group with it, while the server still counts the lease as live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_ignoring_sigterm_is_killed_before_the_lease_expires() {
    let script = format!("trap 'echo TERM >> signals' TERM; {WITH_CHILDREN}; {UNTIL_GO}");
    // 10 s: the client's safety margin is then 1 s, room enough for a busy machine.
    let Proxied {
        app,
        proxy,
        dir,
        child,
    } = behind_a_proxy(10, &script).await;
    let pids = recorded_pids(dir.path(), 3);
    proxy.freeze();
    // Nothing renews the lease from here on: it expires `expires_in_ms` after the server
    // answered, which is after the question was asked.
    let asked = Instant::now();
    let response = app.inspect("job:1").await;
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    let expiry = asked + Duration::from_millis(body["expires_in_ms"].as_u64().unwrap());

    let output = finished(child).await;
    let ended = Instant::now();
    assert_none_runs(&pids, "after the lease was lost");
    assert!(
        ended < expiry,
        "CMD's group outlived the lease by {:?}",
        ended - expiry
    );
    assert_ended_saying(&output, 124, "ignored SIGTERM", "lost the lease on `job:1`");
    let signals = std::fs::read_to_string(dir.path().join("signals")).unwrap_or_default();
    assert_eq!(signals.trim(), "TERM", "CMD did not get SIGTERM first");
}

/// `fencelock lock` killed with SIGKILL cannot stop CMD itself; CMD and everything it
/// started must not run on without the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_fencelock_lock_kills_its_command() {
    let (app, dir) = on_sqlite().await;
    let script = format!("{WITH_CHILDREN}; {UNTIL_GO}");
    let mut child = started(dir.path(), &app.address, &[], &script).await;
    let pids = recorded_pids(dir.path(), 3);
    signal(child.id().unwrap(), "-KILL", false);
    let _ = child.wait().await;
    assert_all_end(&pids, "after fencelock lock was killed").await;
}

/// Processes CMD leaves behind when it ends are stopped before the lease is released (they
/// would run on unprotected); CMD's status stays `fencelock lock`'s, and one line says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_left_behind_are_stopped_before_the_release() {
    let (app, dir) = on_sqlite().await;
    let script = format!("{WITH_CHILDREN}; exit 3");
    // The `sleep` that ignores SIGTERM gets SIGKILL 1 s later.
    let args = ["--grace-seconds", "1"];
    let output = lock(dir.path(), &app.address, "job:1", &args, &script)
        .output()
        .await
        .unwrap();
    let pids = recorded_pids(dir.path(), 3);
    assert_none_runs(&pids, "after CMD ended");
    assert_ended_saying(&output, 3, "left behind", "leaving processes in its group");
    assert_released(&app, "job:1").await;
}

/// A signal passed on reaches the whole group: SIGTERM ends CMD (a shell) and the `sleep` it
/// started, and `fencelock lock` ends with CMD's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_reach_the_whole_group() {
    let (app, dir) = on_sqlite().await;
    let script = format!("sleep 301 & echo $! > pids; echo $$ >> pids; echo ready; {UNTIL_GO}");
    let child = started(dir.path(), &app.address, &[], &script).await;
    let pids = recorded_pids(dir.path(), 2);
    signal(child.id().unwrap(), "-TERM", false);
    let output = finished(child).await;
    assert_none_runs(&pids, "after SIGTERM");
    assert_eq!(output.status.code(), Some(143), "{output:?}");
    assert_released(&app, "job:1").await;
}

/// `--wait-seconds` longer than the server's `--max-wait-ms` (1 s here) waits in rounds:
/// the holder releases after about 2.5 s, past the first round, and CMD runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_longer_than_the_servers_maximum_goes_in_rounds() {
    let db = crate::helpers::TestDb::new(StoreKind::Sqlite).await;
    let app = TestApp::spawn_on(db, |s| s.max_wait_ms = 1_000).await;
    let client = Client::builder(&app.address).no_proxy().build().unwrap();
    let holder = client
        .lease("job:1", Duration::from_secs(60))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let waiter = lock_waiting(dir.path(), &app.address, "echo $FENCELOCK_FENCE")
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let held_fence = holder.fence();
    holder.release().await.unwrap();

    let output = finished(waiter).await;
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(output.stderr.is_empty(), "{output:?}");
    let fence: i64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(fence > held_fence, "{fence} after {held_fence}");
}

/// A refusal by the server is one readable line, the server's own words, not its JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_one_readable_line() {
    let db = crate::helpers::TestDb::new(StoreKind::Sqlite).await;
    // A server that does not wait at all.
    let app = TestApp::spawn_on(db, |s| s.max_wait_ms = 0).await;
    let dir = tempfile::tempdir().unwrap();
    let command = lock_waiting(dir.path(), &app.address, "echo ran");
    let said = assert_refused(command, 69, "no waiting").await;
    assert!(said.starts_with("fencelock lock: "), "{said}");
    assert!(
        said.contains("wait_ms must be an integer from 0 to 0"),
        "{said}"
    );
    assert!(!said.contains('{'), "{said}");
}

/// `--cacert FILE` (or `FENCELOCK_CACERT`) trusts a private CA for an `https` server;
/// without it (or with another CA) the certificate is refused, and the line says what to
/// do; a file that is not PEM, or is missing, is a usage error naming `--cacert`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cacert_trusts_a_private_ca() {
    let pki = crate::tls::Pki::new();
    let app = crate::tls::spawn_https(&pki).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = pki.path("ca.pem").display().to_string();
    let with_ca = |file: &str, command: &str| {
        lock(
            dir.path(),
            &app.address,
            "job:1",
            &["--cacert", file],
            command,
        )
    };
    let output = with_ca(&ca, "echo $FENCELOCK_FENCE")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse::<i64>()
            .is_ok()
    );
    let mut by_env = lock(dir.path(), &app.address, "job:1", &[], "echo ran");
    by_env.env("FENCELOCK_CACERT", &ca);
    let output = by_env.output().await.unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let trusting = Client::builder(&app.address)
        .no_proxy()
        .add_root_certificate_pem(std::fs::read(&ca).unwrap())
        .build()
        .unwrap();
    assert_eq!(
        trusting.inspect("job:1").await.unwrap(),
        None,
        "not released"
    );

    let untrusting = lock(dir.path(), &app.address, "job:1", &[], "echo ran");
    let said = assert_refused(untrusting, 69, "no --cacert").await;
    assert!(said.contains("--cacert"), "{said}");
    // Another CA than the one that issued the server's certificate: the line names the file.
    let other = crate::tls::Pki::new();
    let other_ca = other.path("ca.pem").display().to_string();
    let said = assert_refused(with_ca(&other_ca, "echo ran"), 69, "another CA").await;
    assert!(said.contains(&other_ca), "{said}");

    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not PEM").unwrap();
    let junk = junk.display().to_string();
    for file in [junk.as_str(), "/no/such/ca.pem"] {
        let said = assert_refused(with_ca(file, "echo ran"), 2, file).await;
        assert!(said.contains("--cacert") && said.contains(file), "{said}");
    }
}

/// A missing argument is named in the one line of the usage error, for `fencelock lock` as
/// for every command.
#[test]
fn a_missing_argument_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &[&str]); 3] = [
        (&["lock"], &["<RESOURCE>", "<CMD>"]),
        (&["lock", "job:1"], &["<CMD>"]),
        (&["token", "new"], &["<NAME>"]),
    ];
    for (args, named) in cases {
        let output = crate::process::run(dir.path(), args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        let said = assert_failed_in_one_line(&output, &format!("{args:?}"));
        assert!(said.contains("not provided"), "{args:?}: {said}");
        for name in named {
            assert!(said.contains(name), "{args:?}: {name} not in {said}");
        }
    }
}

/// Waits, within [`PATIENCE`], until `pid`'s state is `T` (stopped) or is not, as `stopped`
/// says.
async fn assert_becomes_stopped(pid: i32, stopped: bool, context: &str) {
    let start = Instant::now();
    let is = || stat(pid).is_some_and(|fields| fields[0] == "T");
    while is() != stopped && start.elapsed() < PATIENCE {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        is(),
        stopped,
        "{context}: process {pid}, state {:?}",
        stat(pid).map(|fields| fields[0].clone())
    );
}

/// A Ctrl-Z (SIGTSTP) stops CMD's group and `fencelock lock` together, as a shell stops a
/// job (CMD must not run on while nothing renews its lease); SIGCONT, as `fg` sends it,
/// continues both. `fencelock lock` runs as a shell runs a job: in a process group of its
/// own, which the terminal's Ctrl-Z and the shell's `fg` signal as a whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_z_stops_the_command_with_fencelock_lock() {
    let (app, dir) = on_sqlite().await;
    let script = format!("echo $$ > pids; echo ready; {UNTIL_GO}");
    let mut command = lock(dir.path(), &app.address, "job:1", &[], &script);
    command.process_group(0);
    let mut child = command.spawn().unwrap();
    assert_eq!(line(&mut child).await, "ready");
    let cmd = recorded_pids(dir.path(), 1)[0];
    let job = child.id().unwrap();
    signal(job, "-TSTP", true);
    let own = i32::try_from(job).unwrap();
    assert_becomes_stopped(cmd, true, "CMD after SIGTSTP").await;
    assert_becomes_stopped(own, true, "fencelock lock after SIGTSTP").await;
    signal(job, "-CONT", true);
    assert_becomes_stopped(own, false, "fencelock lock after SIGCONT").await;
    assert_becomes_stopped(cmd, false, "CMD after SIGCONT").await;
    std::fs::write(dir.path().join("go"), "").unwrap();
    let output = finished(child).await;
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    // Nothing to say: a lease that was not released, say, would be said here.
    assert!(output.stderr.is_empty(), "{output:?}");
    assert_released(&app, "job:1").await;
}
