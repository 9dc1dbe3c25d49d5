//! The real `fencelock` binary: configuration errors, store selection and its log line,
//! graceful shutdown.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::{
    RowLock, StoreKind, TTL, TestDb, assert_failed_in_one_line, client, eventually, json_answer,
};

/// Every setting: its flag and its environment variable, as `--help` must name them. Both
/// are cleared for the tests' processes, so that a developer's shell cannot leak into them.
const SETTINGS: [(&str, &str); 23] = [
    ("--bind", "FENCELOCK_BIND"),
    ("--database-url", "DATABASE_URL"),
    ("--pg-pooling", "FENCELOCK_PG_POOLING"),
    ("--listen-database-url", "FENCELOCK_LISTEN_DATABASE_URL"),
    ("--max-ttl-seconds", "FENCELOCK_MAX_TTL_SECONDS"),
    ("--max-wait-ms", "FENCELOCK_MAX_WAIT_MS"),
    ("--pool-size", "FENCELOCK_POOL_SIZE"),
    ("--pg-batch-max", "FENCELOCK_PG_BATCH_MAX"),
    ("--log-format", "FENCELOCK_LOG_FORMAT"),
    ("--purge-grace-seconds", "FENCELOCK_PURGE_GRACE_SECONDS"),
    (
        "--purge-interval-seconds",
        "FENCELOCK_PURGE_INTERVAL_SECONDS",
    ),
    (
        "--history-retention-seconds",
        "FENCELOCK_HISTORY_RETENTION_SECONDS",
    ),
    ("--store-timeout-ms", "FENCELOCK_STORE_TIMEOUT_MS"),
    ("--request-timeout-ms", "FENCELOCK_REQUEST_TIMEOUT_MS"),
    ("--max-connections", "FENCELOCK_MAX_CONNECTIONS"),
    (
        "--max-connections-per-peer",
        "FENCELOCK_MAX_CONNECTIONS_PER_PEER",
    ),
    (
        "--migration-lock-timeout-seconds",
        "FENCELOCK_MIGRATION_LOCK_TIMEOUT_SECONDS",
    ),
    (
        "--live-leases-interval-seconds",
        "FENCELOCK_LIVE_LEASES_INTERVAL_SECONDS",
    ),
    ("--auth-file", "FENCELOCK_AUTH_FILE"),
    ("--allow-unauthenticated", "FENCELOCK_ALLOW_UNAUTHENTICATED"),
    ("--tls-cert", "FENCELOCK_TLS_CERT"),
    ("--tls-key", "FENCELOCK_TLS_KEY"),
    ("--fence-key", "FENCELOCK_FENCE_KEY"),
];

/// The options of `fencelock lock`, with their variables where they have one, as its
/// `--help` must name them (the server's settings are hidden there). The variables are
/// cleared for the tests' processes, like [`SETTINGS`]'.
const LOCK_SETTINGS: [(&str, Option<&str>); 6] = [
    ("--url", Some("FENCELOCK_URL")),
    ("--token", Some("FENCELOCK_TOKEN")),
    ("--cacert", Some("FENCELOCK_CACERT")),
    ("--ttl-seconds", None),
    ("--wait-seconds", None),
    ("--grace-seconds", None),
];

pub fn command(database_url: Option<&str>, cwd: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    for (_, var) in SETTINGS {
        command.env_remove(var);
    }
    for var in LOCK_SETTINGS.iter().filter_map(|(_, var)| *var) {
        command.env_remove(var);
    }
    // What `fencelock lock` gives its command; one from outside must not show through.
    for var in [
        "FENCELOCK_RESOURCE",
        "FENCELOCK_FENCE",
        "FENCELOCK_FENCE_TOKEN",
    ] {
        command.env_remove(var);
    }
    // Not a setting, but it changes what the server logs.
    command.env_remove("RUST_LOG");
    if let Some(url) = database_url {
        command.env("DATABASE_URL", url);
    }
    command.current_dir(cwd).stdin(Stdio::null());
    command
}

/// Runs `fencelock ARGS` in `cwd`, with no `DATABASE_URL`, to its end.
pub fn run(cwd: &Path, args: &[&str]) -> Output {
    command(None, cwd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running fencelock {args:?}: {e}"))
}

/// A `fencelock` process serving on a free port, with its log lines collected.
pub struct ServerProcess {
    child: Child,
    pub address: String,
    pub log: Arc<Mutex<Vec<String>>>,
    /// Set to stop reading the server's stderr, which closes the pipe.
    close_log: Arc<std::sync::atomic::AtomicBool>,
    /// Set once the server's stderr has ended: every line it wrote has been read.
    log_ended: Arc<std::sync::atomic::AtomicBool>,
}

impl ServerProcess {
    pub fn start(database_url: Option<&str>, cwd: &Path) -> Self {
        Self::start_with(database_url, cwd, &[])
    }

    /// [`Self::start`] with more arguments; a `--bind` among them replaces the loopback one,
    /// and with `--tls-cert` the address is an `https` one.
    pub fn start_with(database_url: Option<&str>, cwd: &Path, args: &[&str]) -> Self {
        Self::start_until(database_url, cwd, args, "fencelock serving")
    }

    /// [`Self::start_with`], returning once the server listens: its store may not be ready
    /// yet (its migrations may wait for the database, or for the migration lock).
    pub fn start_listening(database_url: Option<&str>, cwd: &Path, args: &[&str]) -> Self {
        Self::start_until(database_url, cwd, args, "fencelock listening")
    }

    /// Starts the server and returns once it has logged `message` with its `address`.
    fn start_until(database_url: Option<&str>, cwd: &Path, args: &[&str], message: &str) -> Self {
        let message = message.to_owned();
        let bind: &[&str] = if args.contains(&"--bind") {
            &[]
        } else {
            &["--bind", "127.0.0.1:0"]
        };
        let scheme = if args.contains(&"--tls-cert") {
            "https"
        } else {
            "http"
        };
        let mut child = command(database_url, cwd)
            .args(bind)
            .args(["--log-format", "json"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the fencelock binary");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (found, address) = mpsc::channel();
        let lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let sink = log.clone();
        let close_log = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let closing = close_log.clone();
        let log_ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ended = log_ended.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if closing.load(std::sync::atomic::Ordering::Relaxed) {
                    // Dropping the reader closes our end of the pipe.
                    return;
                }
                if let Ok(event) = serde_json::from_str::<Value>(&line)
                    && event["message"] == json!(message)
                {
                    let _ = found.send(event["address"].as_str().unwrap_or_default().to_owned());
                }
                sink.lock().unwrap().push(line);
            }
            ended.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let address = address
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("the server did not start; log: {:?}", log.lock().unwrap()));
        Self {
            child,
            address: format!("{scheme}://{address}"),
            log,
            close_log,
            log_ended,
        }
    }

    /// Stops reading the server's log: the pipe closes at the next line it writes.
    pub fn close_log(&self) {
        self.close_log
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// `POST /locks/{resource}` by `owner` for [`TTL`] seconds.
    pub async fn acquire(
        &self,
        client: &reqwest::Client,
        resource: &str,
        owner: &str,
    ) -> reqwest::Response {
        client
            .post(self.url(&format!("/locks/{resource}")))
            .json(&json!({ "owner": owner, "ttl_seconds": TTL }))
            .send()
            .await
            .unwrap()
    }

    /// The lines read so far. The server writes its log from a thread of its own, so a line
    /// may arrive after the response of the request that logged it: see [`Self::settled_log`].
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The log with every line the server logged before this call: a marker request is sent
    /// and its access line, queued after all of those, is waited for. Once the server has
    /// exited, the whole log.
    pub async fn settled_log(&self) -> String {
        static MARKERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let marker = format!(
            "log-marker-{}",
            MARKERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let ended = || self.log_ended.load(std::sync::atomic::Ordering::Relaxed);
        if !ended() {
            let client = reqwest::Client::builder()
                .no_proxy()
                .danger_accept_invalid_certs(true)
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap();
            let sent = client
                .get(self.url("/healthz"))
                .header("x-request-id", &marker)
                .send()
                .await;
            // A server that cannot answer any more is ending: its log ends with it.
            let done = |log: &str| ended() || (sent.is_ok() && log.contains(&marker));
            let deadline = Instant::now() + Duration::from_secs(20);
            while !done(&self.log_text()) {
                assert!(
                    Instant::now() < deadline,
                    "the log did not settle: {}",
                    self.log_text()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        self.log_text()
    }

    /// Asserts that the log contains `text`, quoting the whole log if not.
    pub async fn assert_logged(&self, text: &str) {
        let log = self.settled_log().await;
        assert!(log.contains(text), "no {text:?} in the log: {log}");
    }

    /// SIGKILL: no chance to flush or clean up.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn terminate(&mut self) {
        self.signal("-TERM");
    }

    /// Sends `signal` (as `kill` spells it, e.g. `-INT`) to the server process.
    pub fn signal(&mut self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    pub fn wait(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not exit in {within:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.kill9();
        }
    }
}

async fn acquire(server: &ServerProcess, resource: &str, owner: &str) -> reqwest::Response {
    client()
        .post(server.url(&format!("/locks/{resource}")))
        .json(&json!({ "owner": owner, "ttl_seconds": TTL }))
        .send()
        .await
        .expect("request reaches the server")
}

/// With no DATABASE_URL the server runs on `fencelock.db` in its working directory and
/// says so at start.
#[tokio::test]
async fn default_store_is_a_sqlite_file_in_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(None, dir.path());
    let response = acquire(&server, "job:1", "a").await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert!(body["lock"]["fence"].as_i64().unwrap() >= 1);
    assert!(dir.path().join("fencelock.db").exists());
    server.assert_logged("SQLite file fencelock.db").await;
}

/// The start-up log names the PostgreSQL store without its password, in either form of
/// `DATABASE_URL`.
#[tokio::test]
async fn database_password_is_never_logged() {
    let port = fencelock_testkit::closed_port();
    for (url, named) in [
        (
            format!("postgres://fencelock:hunter2-secret@127.0.0.1:{port}/locks"),
            "postgres://fencelock:***@127.0.0.1",
        ),
        (
            format!(
                "host=127.0.0.1 port={port} user=fencelock password='hunter2 secret' dbname=locks"
            ),
            "user=fencelock password=*** dbname=locks",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let server = ServerProcess::start(Some(&url), dir.path());
        let ready = client().get(server.url("/readyz")).send().await.unwrap();
        assert_eq!(ready.status(), 503, "{url}");
        server.assert_logged(named).await;
        let log = server.settled_log().await;
        assert!(!log.contains("hunter2"), "password in the log: {log}");
    }
}

/// The key-value form of `DATABASE_URL`, with two hosts of which the first is down: the
/// server finds the one that accepts writes and serves.
#[tokio::test]
async fn a_key_value_database_url_with_several_hosts_is_served() {
    let db = TestDb::new(StoreKind::Postgres).await;
    let TestDb::Postgres { name, .. } = &*db else {
        unreachable!("a PostgreSQL database")
    };
    let admin: tokio_postgres::Config = crate::helpers::admin_url().parse().unwrap();
    let tokio_postgres::config::Host::Tcp(host) = &admin.get_hosts()[0] else {
        panic!("the tests reach PostgreSQL over TCP")
    };
    let password = admin
        .get_password()
        .map(|p| format!(" password='{}'", String::from_utf8_lossy(p)))
        .unwrap_or_default();
    let url = format!(
        "host=127.0.0.1,{host} port={},{} user={}{password} dbname={name} \
         target_session_attrs=read-write connect_timeout=5",
        fencelock_testkit::closed_port(),
        admin.get_ports()[0],
        admin.get_user().unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(Some(&url), dir.path());
    let response = acquire(&server, "job:1", "a").await;
    assert_eq!(response.status(), 200);
    let ready = client().get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    server
        .assert_logged("target_session_attrs=read-write")
        .await;
}

/// A variable and its value.
type EnvVar<'a> = (&'a str, &'a str);

/// A bad setting stops start-up with one line naming it, and no panic.
#[test]
fn bad_settings_stop_startup_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], Option<EnvVar<'_>>); 14] = [
        (&["--bind", "nope"], None),
        (&["--max-ttl-seconds", "0"], None),
        (&["--max-ttl-seconds", "-5"], None),
        (&["--pool-size", "0"], None),
        (&["--log-format", "xml"], None),
        (&["--purge-interval-seconds", "0"], None),
        (&[], Some(("DATABASE_URL", "mysql://localhost/x"))),
        (&[], Some(("DATABASE_URL", "postgres://host:notaport/x"))),
        (&[], Some(("FENCELOCK_MAX_TTL_SECONDS", "lots"))),
        (&["--request-timeout-ms", "0"], None),
        (&["--max-connections", "0"], None),
        // Far above any open-file limit: refused at start, not by failing accepts later.
        (&["--max-connections", "1000000000000"], None),
        (&[], Some(("FENCELOCK_MAX_CONNECTIONS", "1000000000000"))),
        (&[], Some(("RUST_LOG", "fencelock=loud"))),
    ];
    for (args, env) in cases {
        let mut command = command(None, dir.path());
        command.args(args);
        if let Some((key, value)) = env {
            command.env(key, value);
        }
        let line =
            assert_failed_in_one_line(&command.output().unwrap(), &format!("{args:?} {env:?}"));
        assert!(line.starts_with("fencelock: "), "{line}");
        assert!(!line.contains("panicked"), "{line}");
    }
}

/// `--help` explains every setting and its variable: each option it lists is in
/// [`SETTINGS`] with the variable it names, and each setting there is listed.
#[test]
fn help_names_every_setting() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(dir.path(), &["--help"]);
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    let mut listed = help_options(&help);
    listed.retain(|(flag, _)| !["--help", "--version"].contains(&flag.as_str()));
    let mut expected: Vec<(String, Option<String>)> = SETTINGS
        .iter()
        .map(|(flag, var)| ((*flag).to_owned(), Some((*var).to_owned())))
        .collect();
    expected.sort();
    listed.sort();
    assert_eq!(listed, expected, "--help and SETTINGS disagree:\n{help}");
}

/// `fencelock lock --help` lists exactly its own options (with their variables), not the
/// server's, and its exit statuses.
#[test]
fn lock_help_names_its_settings_and_exit_statuses() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(dir.path(), &["lock", "--help"]);
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    let mut listed = help_options(&help);
    listed.retain(|(flag, _)| flag != "--help");
    let mut expected: Vec<(String, Option<String>)> = LOCK_SETTINGS
        .iter()
        .map(|(flag, var)| ((*flag).to_owned(), var.map(str::to_owned)))
        .collect();
    expected.sort();
    listed.sort();
    assert_eq!(
        listed, expected,
        "--help and LOCK_SETTINGS disagree:\n{help}"
    );
    for status in ["75", "69", "124", "126, 127"] {
        assert!(
            help.contains(&format!("\n  {status} ")),
            "exit status {status}:\n{help}"
        );
    }
}

/// The options of a `--help` text: each long flag, with the variable of its `[env: ...]`.
fn help_options(help: &str) -> Vec<(String, Option<String>)> {
    let mut options: Vec<(String, Option<String>)> = Vec::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        let flag = trimmed
            .split(", ")
            .find(|word| word.starts_with("--"))
            .filter(|_| trimmed.starts_with('-'));
        if let Some(flag) = flag {
            let name = flag.split_whitespace().next().unwrap_or_default();
            options.push((name.to_owned(), None));
        }
        if let (Some(at), Some(option)) = (line.find("[env: "), options.last_mut()) {
            let var: String = line[at + "[env: ".len()..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            assert!(option.1.is_none(), "two variables for {}", option.0);
            option.1 = Some(var);
        }
    }
    options
}

/// Losing the log pipe (a collector that restarts) must not take the server down.
#[tokio::test]
async fn server_survives_a_closed_log_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(None, dir.path());
    server.close_log();
    for i in 0..20 {
        let response = acquire(&server, &format!("job:{i}"), "a").await;
        assert_eq!(response.status(), 200);
    }
    assert!(server.is_running());
}

/// SIGTERM: the server stops on its own, with status 0, and says why.
#[tokio::test]
async fn sigterm_stops_the_server_cleanly() {
    stops_cleanly_on("-TERM", "SIGTERM").await;
}

/// SIGINT (Ctrl-C) stops the server as gracefully as SIGTERM.
#[tokio::test]
async fn sigint_stops_the_server_cleanly() {
    stops_cleanly_on("-INT", "SIGINT").await;
}

/// Sends `signal` (as `kill` spells it) to a server that has served a request: it exits with
/// status 0 and logs that it is shutting down, and on which signal (`name`).
async fn stops_cleanly_on(signal: &str, name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(None, dir.path());
    assert_eq!(acquire(&server, "job:1", "a").await.status(), 200);
    server.signal(signal);
    let status = server.wait(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    server.assert_logged("shutting down").await;
    server.assert_logged(name).await;
}

/// Every lease event is logged with resource and fence, and the owner token never is.
#[tokio::test]
async fn lease_events_are_logged_without_the_owner() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(None, dir.path());
    let owner = "owner-token-that-must-stay-secret";
    let http = client();
    let body = |ttl: i64| json!({ "owner": owner, "ttl_seconds": ttl });
    let url = server.url("/locks/job:7");
    assert_eq!(
        http.post(&url)
            .json(&body(60))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        acquire(&server, "job:7", "someone-else").await.status(),
        200
    );
    let renew = http
        .post(format!("{url}/renew"))
        .json(&body(60))
        .send()
        .await
        .unwrap();
    assert_eq!(renew.status(), 200);
    let release = http
        .delete(&url)
        .json(&json!({ "owner": owner }))
        .send()
        .await
        .unwrap();
    assert_eq!(release.status(), 204);
    server.terminate();
    server.wait(Duration::from_secs(20));

    let log = server.settled_log().await;
    assert!(!log.contains(owner), "the owner token was logged: {log}");
    let events: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["lease.resource"] == json!("job:7"))
        .collect();
    for message in [
        "lease acquired",
        "lease refused: held by another owner",
        "lease renewed",
        "lease released",
    ] {
        let event = events
            .iter()
            .find(|e| e["message"] == json!(message))
            .unwrap_or_else(|| panic!("no {message:?} event in {log}"));
        if message != "lease refused: held by another owner" {
            assert!(event["lease.fence"].is_i64(), "{event}");
        }
    }
    let requests = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["message"] == json!("request"))
        .count();
    assert_eq!(requests, 4, "one line per request");
}

/// A request in flight when SIGTERM arrives still gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_requests_finish() {
    let db = TestDb::new(StoreKind::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(Some(&db.url()), dir.path());
    assert_eq!(acquire(&server, "job:1", "a").await.status(), 200);

    // Hold the lease row so that the next acquire waits inside the store.
    let lock = RowLock::take(&db, "job:1").await;
    let in_flight = {
        let url = server.url("/locks/job:1");
        tokio::spawn(async move {
            client()
                .post(url)
                .json(&json!({ "owner": "a", "ttl_seconds": TTL }))
                .send()
                .await
        })
    };
    // Wait until the acquire is blocked on the row lock, as PostgreSQL reports it.
    let what = "the acquire never reached the store";
    eventually(what, Duration::from_secs(10), async || {
        lock.waiters().await > 0
    })
    .await;
    server.terminate();
    lock.release().await;
    let response = in_flight
        .await
        .unwrap()
        .expect("the in-flight request is answered");
    assert_eq!(response.status(), 200, "{}", server.log_text());
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["acquired"], json!(true));
    assert!(server.wait(Duration::from_secs(20)).success());
}

/// Two server processes on one SQLite file work together: one winner per race and one
/// fence sequence, decided by SQLite's write lock across processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_one_sqlite_file() {
    let db = TestDb::new(StoreKind::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let servers = [
        ServerProcess::start(Some(&db.url()), dir.path()),
        ServerProcess::start(Some(&db.url()), dir.path()),
    ];

    let mut last = 0;
    for i in 0..20 {
        let response = acquire(&servers[i % 2], &format!("alt-{i}"), "x").await;
        let body: Value = response.json().await.unwrap();
        let fence = body["lock"]["fence"].as_i64().unwrap();
        assert!(fence > last, "fence {fence} after {last}");
        last = fence;
    }

    for round in 0..5 {
        let resource = format!("race-{round}");
        let mut tasks = Vec::new();
        for i in 0..32 {
            let url = servers[i % 2].url(&format!("/locks/{resource}"));
            let body = json!({ "owner": format!("o{i}"), "ttl_seconds": TTL });
            tasks.push(tokio::spawn(json_answer(client().post(url).json(&body))));
        }
        let mut winners = 0;
        for task in tasks {
            if task.await.unwrap()["acquired"] == json!(true) {
                winners += 1;
            }
        }
        assert_eq!(winners, 1, "{resource}");
    }
}

/// Requests refused by the HTTP parser, and a client too slow to send its head, are logged
/// at WARN at most: any client can send them, and must not be able to fill the log with
/// ERROR lines.
#[tokio::test]
async fn parser_refusals_are_never_logged_as_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(None, dir.path());
    let address: std::net::SocketAddr = server
        .address
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let refused = crate::protocol::refused_requests();
    for case in &refused {
        let response = crate::helpers::raw_exchange(address, &case.request).await;
        assert_eq!(response.status, case.status, "{}", case.name);
    }
    server.terminate();
    server.wait(Duration::from_secs(20));

    let log = server.settled_log().await;
    let events: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let errors: Vec<&Value> = events.iter().filter(|e| e["level"] == "ERROR").collect();
    assert!(errors.is_empty(), "ERROR lines: {errors:?}");
    let warned = events
        .iter()
        .filter(|e| e["level"] == "WARN" && e["message"] == "request refused by the HTTP parser")
        .count();
    assert_eq!(warned, refused.len(), "{log}");
}

/// A request's id is kept when the client sends a good one, echoed on the response, and
/// carried by every JSON log line written while serving it (the request line and the lease
/// event alike); durations are whole microseconds; no line names a source file.
#[tokio::test]
async fn request_ids_reach_every_log_line_of_their_request() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(None, dir.path());
    let response = client()
        .post(server.url("/locks/job:1"))
        .header("x-request-id", "trace-me-42")
        .json(&json!({ "owner": "a", "ttl_seconds": TTL }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-request-id"], "trace-me-42");

    let lines: Vec<Value> = server
        .settled_log()
        .await
        .lines()
        .map(|line| serde_json::from_str(line).expect("every log line is JSON"))
        .collect();
    let of_request: Vec<&Value> = lines
        .iter()
        .filter(|line| line["request_id"] == "trace-me-42")
        .collect();
    let messages: Vec<&str> = of_request
        .iter()
        .filter_map(|line| line["message"].as_str())
        .collect();
    assert!(messages.contains(&"lease acquired"), "{messages:?}");
    assert!(messages.contains(&"request"), "{messages:?}");
    let request_line = of_request
        .iter()
        .find(|line| line["message"] == "request")
        .unwrap();
    assert!(request_line["duration_us"].is_u64(), "{request_line}");
    for line in &lines {
        let text = line.to_string();
        assert!(
            !text.contains("log.file") && !text.contains(".rs\""),
            "{text}"
        );
    }
}
