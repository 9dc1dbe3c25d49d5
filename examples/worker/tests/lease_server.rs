//! The worker against the real lease server: the `fencelock` binary that `FENCELOCK_BIN`
//! names (`cargo build -p fencelock-server --bin fencelock` in the repository, then
//! `FENCELOCK_BIN=$PWD/target/debug/fencelock`), on a SQLite file of its own.

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fencelock::client::{Client, Error};
use worker::Worker;

/// How long the server may take to start (it applies its migrations first).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A lease server started for one test, on a free port and a SQLite file in a temporary
/// directory. Dropping it kills that process (and only it) and removes the directory.
struct LeaseServer {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl LeaseServer {
    fn start() -> Self {
        let binary = match std::env::var_os("FENCELOCK_BIN") {
            Some(path) => PathBuf::from(path),
            None => panic!(
                "set FENCELOCK_BIN to the lease server binary: `cargo build -p fencelock-server --bin fencelock` in the repository, then FENCELOCK_BIN=$PWD/target/debug/fencelock"
            ),
        };
        assert!(
            binary.is_file(),
            "FENCELOCK_BIN names {}, which is not a file: build it with `cargo build -p fencelock-server --bin fencelock` (and give an absolute path; the tests run in examples/worker)",
            binary.display()
        );
        let dir = tempfile::tempdir().expect("a temporary directory");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let mut command = Command::new(&binary);
        // Only the flags below configure it, whatever this process's environment holds.
        for (name, _) in std::env::vars_os() {
            if name.to_str().is_some_and(|n| {
                n.starts_with("FENCELOCK_") || n == "DATABASE_URL" || n == "RUST_LOG"
            }) {
                command.env_remove(name);
            }
        }
        let mut child = command
            .arg("--bind")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--database-url")
            .arg(format!(
                "sqlite://{}",
                dir.path().join("leases.db").display()
            ))
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        // Read the log on a thread of its own, to the end, so the pipe never fills; the
        // lines go to the test until the server says it is serving.
        let (lines, log) = mpsc::channel();
        let stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        // From here on, dropping the server kills the process, even if the wait fails.
        let mut server = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        server.wait_until_serving(&log);
        server
    }

    /// Blocks until the server logs that it serves; panics with its log if it does not.
    fn wait_until_serving(&mut self, log: &mpsc::Receiver<String>) {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut seen = Vec::new();
        loop {
            match log.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) if line.contains("fencelock serving") => return,
                Ok(line) => seen.push(line),
                Err(e) => {
                    let why = match e {
                        mpsc::RecvTimeoutError::Timeout => "not serving after a minute",
                        mpsc::RecvTimeoutError::Disconnected => "it closed its log",
                    };
                    // A process that has exited keeps its exit status through the kill.
                    let _ = self.child.kill();
                    let status = self
                        .child
                        .wait()
                        .map_or_else(|e| e.to_string(), |status| status.to_string());
                    panic!(
                        "the lease server did not start ({why}; {status}); its log:\n{}",
                        seen.join("\n")
                    );
                }
            }
        }
    }
}

impl Drop for LeaseServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the server and waits for its `GET /healthz` to answer `200`.
async fn lease_server() -> LeaseServer {
    let server = tokio::task::block_in_place(LeaseServer::start);
    let health = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("{}/healthz", server.url))
        .send()
        .await
        .expect("GET /healthz");
    assert_eq!(health.status(), 200, "GET /healthz");
    server
}

fn worker(server: &LeaseServer, owner: &str) -> Worker {
    let client = Client::builder(&server.url).no_proxy().build().unwrap();
    Worker::new(client, owner, Duration::from_secs(30))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_taken_refused_to_another_renewed_released_and_taken_again() {
    let server = lease_server().await;
    let (first, second) = (worker(&server, "worker-1"), worker(&server, "worker-2"));

    let lease = first.take("job:nightly").await.expect("a free resource");
    assert_eq!(
        (lease.resource.as_str(), lease.owner.as_str()),
        ("job:nightly", "worker-1")
    );
    assert!(lease.fence > 0, "{lease:?}");

    match second.take("job:nightly").await {
        Err(Error::Held { resource }) => assert_eq!(resource, "job:nightly"),
        other => panic!("a held resource was not refused to another owner: {other:?}"),
    }

    let renewed = first.renew(&lease).await.expect("the holder renews");
    assert_eq!(renewed.fence, lease.fence, "a renewal keeps the fence");
    assert!(renewed.expires_at >= lease.expires_at, "{renewed:?}");

    first.release(renewed).await.expect("the holder releases");
    // Released: the lease is gone; renewing it now is refused as lost.
    let gone = first.renew(&lease).await.expect_err("a released lease");
    assert!(gone.is_lease_lost(), "{gone:?}");

    let next = second
        .take("job:nightly")
        .await
        .expect("a released resource");
    assert!(
        next.fence > lease.fence,
        "the next lease has a greater fence: {} after {}",
        next.fence,
        lease.fence
    );
    second.release(next).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_every_step_under_one_fence_and_releases() {
    let server = lease_server().await;
    let worker = worker(&server, "worker-1");
    let other = self::worker(&server, "worker-2");

    let mut done = Vec::new();
    let fence = worker
        .run("job:report", ["a", "b", "c"], async |fence, item| {
            // While the job runs, nobody else can take the lease.
            let refused = other.take("job:report").await;
            assert!(matches!(refused, Err(Error::Held { .. })), "{refused:?}");
            done.push((item, fence));
        })
        .await
        .expect("the job runs");
    assert_eq!(done, [("a", fence), ("b", fence), ("c", fence)]);

    // Released at the end: another owner takes it at once, with a greater fence.
    let next = other.take("job:report").await.expect("released by the job");
    assert!(next.fence > fence, "{} after {fence}", next.fence);
}
