//! A PgBouncer of the test's own (Debian's `pgbouncer`) in front of the test PostgreSQL
//! server, in session or transaction pooling, on a free local port, with its configuration
//! in a temporary directory. Its process is killed when the value is dropped.
//!
//! [`through_pgbouncer`] runs a test with every PostgreSQL [`TestDb`](crate::TestDb) it makes
//! reached through one: the contract's rules then run unchanged, their servers connecting
//! through the pooler with `--pg-pooling` set to match.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use fencelock_server::postgres::Pooling;

use crate::cluster::RunAs;

/// How long PgBouncer has to accept connections once started.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A running PgBouncer. Dropping it kills the process it started (and only that one).
pub struct PgBouncer {
    child: Child,
    address: SocketAddr,
    pooling: Pooling,
    dir: tempfile::TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer in `pooling` (session or transaction) in front of the server
    /// `upstream` names (the tests' [`admin_url`](crate::admin_url)), for every database on
    /// it, logging in as `upstream`'s user (PgBouncer's `auth_type = any`: clients are not
    /// asked for a password).
    pub fn start(upstream: &str, pooling: Pooling) -> Self {
        Self::start_with(upstream, pooling, "")
    }

    /// [`PgBouncer::start`] with more lines in its `[pgbouncer]` section
    /// (`ignore_startup_parameters = options`, say).
    pub fn start_with(upstream: &str, pooling: Pooling, settings: &str) -> Self {
        let pool_mode = match pooling {
            Pooling::Session => "session",
            Pooling::Transaction => "transaction",
            Pooling::Direct => panic!("a PgBouncer pools in session or transaction mode"),
        };
        let admin: tokio_postgres::Config = upstream.parse().expect("upstream URL parses");
        let host = match &admin.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(host) => host.clone(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        };
        let port = admin.get_ports().first().copied().unwrap_or(5432);
        let user = admin.get_user().unwrap_or("postgres");
        let password = admin
            .get_password()
            .map(|p| format!(" password={}", String::from_utf8_lossy(p)))
            .unwrap_or_default();

        let run_as = RunAs::detect();
        let dir = tempfile::tempdir().expect("a temporary directory");
        run_as.own(dir.path());
        let listen_port = free_port();
        let config = dir.path().join("pgbouncer.ini");
        // Pools large enough for two instances' pools in session pooling, where every client
        // connection holds a server connection.
        std::fs::write(
            &config,
            format!(
                "[databases]
* = host={host} port={port} user={user}{password}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen_port}
unix_socket_dir =
auth_type = any
pool_mode = {pool_mode}
max_client_conn = 1000
default_pool_size = 50
logfile = {log}
{settings}
",
                log = dir.path().join("pgbouncer.log").display(),
            ),
        )
        .expect("writing pgbouncer.ini");
        run_as.own(&config);

        let program = binary();
        let child = run_as
            .command(&program, dir.path())
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        let mut bouncer = Self {
            child,
            address: SocketAddr::from(([127, 0, 0, 1], listen_port)),
            pooling,
            dir,
        };
        bouncer.wait_until_up();
        bouncer
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// What PgBouncer logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }

    fn wait_until_up(&mut self) {
        let started = Instant::now();
        while started.elapsed() < START_TIMEOUT {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("PgBouncer exited at start ({status}): {}", self.log());
            }
            if TcpStream::connect(self.address).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "PgBouncer did not accept connections within {START_TIMEOUT:?}: {}",
            self.log()
        );
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Debian's PgBouncer: on the `PATH`, or where the package puts it.
fn binary() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("pgbouncer"))
            .find(|candidate| candidate.is_file())
    });
    on_path
        .or_else(|| {
            let debian = Path::new("/usr/sbin/pgbouncer");
            debian.is_file().then(|| debian.to_owned())
        })
        .expect("no pgbouncer on the PATH or at /usr/sbin/pgbouncer: install Debian's `pgbouncer` (.ci/run does)")
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("local address").port()
}

tokio::task_local! {
    /// The pooling of the PgBouncer every PostgreSQL `TestDb` of the current test is reached
    /// through (see [`through_pgbouncer`]).
    pub(crate) static POOLING: Pooling;
}

/// Runs `test` with every PostgreSQL [`TestDb`](crate::TestDb) it makes behind a PgBouncer
/// of its own in `pooling`, and every server on it started with `--pg-pooling` to match (in
/// transaction pooling with `--listen-database-url` going around it). Tasks the test spawns
/// itself see no PgBouncer when they make a `TestDb`.
pub async fn through_pgbouncer<F: Future>(pooling: Pooling, test: F) -> F::Output {
    POOLING.scope(pooling, test).await
}

/// The pooling [`through_pgbouncer`] asks for in the current test, if any.
pub(crate) fn requested() -> Option<Pooling> {
    POOLING.try_with(|pooling| *pooling).ok()
}
