//! A private PostgreSQL cluster for one test, for what the shared test server cannot be
//! made to do: refuse every connection without TLS, or offer no TLS at all.
//!
//! The cluster is made from the installed server binaries (`/usr/lib/postgresql/*/bin`,
//! Debian's layout; the newest version there) in a temporary directory: `initdb`, a
//! self-signed certificate for `localhost` and `127.0.0.1` made here with rcgen, its own
//! `pg_hba.conf`, and `pg_ctl start` on a free port of 127.0.0.1. Missing binaries fail the
//! test with a message that says what to install; they never skip it. `initdb` refuses to
//! run as root, so when the tests run as root every server command runs as the `postgres`
//! OS user, which then owns the directory. Durability is switched off (`--no-sync`,
//! `fsync = off`): the cluster lives for one test, and starts in about a second.
//!
//! Dropping the value stops the server (`pg_ctl stop -m immediate`) and deletes the
//! directory, also when the test panicked. A test process killed outright leaves the server
//! running: its directory is named `fencelock-cluster-*` under the temporary directory.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where Debian installs each PostgreSQL version's server binaries, as `VERSION/bin`.
const DEBIAN_BINARIES: &str = "/usr/lib/postgresql";

/// How the cluster treats TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterTls {
    /// `ssl = off`: the server answers every TLS request "no", and takes plain sessions.
    Off,
    /// `ssl = on` and `pg_hba.conf` admits TCP sessions only with `hostssl`: a plain session
    /// is refused with "no pg_hba.conf entry ... no encryption".
    Required,
}

#[derive(Clone, Copy, Debug)]
pub struct ClusterOptions {
    pub tls: ClusterTls,
}

/// A running cluster of its own; the superuser is `postgres`, without a password.
pub struct PrivateCluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    run_as: RunAs,
}

impl PrivateCluster {
    /// Makes and starts a cluster; panics, naming what went wrong and the server's log, if it
    /// cannot.
    pub fn start(options: ClusterOptions) -> Self {
        let bin = server_binaries();
        let run_as = RunAs::detect();
        let dir = tempfile::Builder::new()
            .prefix("fencelock-cluster-")
            .tempdir()
            .expect("a temporary directory for the cluster");
        run_as.own(dir.path());
        let data = dir.path().join("data");

        let mut initdb = run_as.command(&bin.join("initdb"), dir.path());
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8"])
            .args(["--no-locale", "--no-sync", "--no-instructions"]);
        run(&mut initdb, "initdb");

        write_certificate(&data, &run_as);
        let hba = match options.tls {
            ClusterTls::Off => "host all all 127.0.0.1/32 trust\n",
            ClusterTls::Required => "hostssl all all 127.0.0.1/32 trust\n",
        };
        // The Unix socket, in the cluster's own directory, is for the test's admin session
        // ([`Self::admin`]); TCP is the line above alone.
        let hba = format!("local all all trust\n{hba}");
        std::fs::write(data.join("pg_hba.conf"), hba).expect("writing pg_hba.conf");
        let ssl = match options.tls {
            ClusterTls::Off => "off",
            ClusterTls::Required => "on",
        };
        let settings = format!(
            "\n# fencelock test cluster\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{socket}'\n\
             ssl = {ssl}\n\
             ssl_cert_file = 'server.crt'\n\
             ssl_key_file = 'server.key'\n\
             fsync = off\n\
             full_page_writes = off\n\
             shared_buffers = 16MB\n\
             max_connections = 50\n",
            socket = dir.path().display()
        );
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).expect("reading postgresql.conf");
        text.push_str(&settings);
        std::fs::write(&conf, text).expect("writing postgresql.conf");

        let mut cluster = Self {
            bin,
            dir,
            port: 0,
            run_as,
        };
        cluster.listen();
        cluster
    }

    /// Starts the server on a free port. The port is free when chosen but could be taken
    /// before the server binds it (tests run in parallel), so a taken port is tried again.
    fn listen(&mut self) {
        for _ in 0..5 {
            self.port = crate::closed_port();
            let mut start = self.pg_ctl();
            start
                .arg("-l")
                .arg(self.log_path())
                .args(["-w", "-t", "60", "-o"])
                .arg(format!("-p {}", self.port))
                .arg("start");
            let output = start.output().expect("running pg_ctl start");
            if output.status.success() {
                return;
            }
            if !self.log().contains("Address already in use") {
                break;
            }
        }
        panic!(
            "the private PostgreSQL cluster in {} did not start; its log:\n{}",
            self.dir.path().display(),
            self.log()
        );
    }

    fn pg_ctl(&self) -> Command {
        let mut command = self
            .run_as
            .command(&self.bin.join("pg_ctl"), self.dir.path());
        command.arg("-D").arg(self.dir.path().join("data"));
        command
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// The server's log so far, for a failure message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's certificate (PEM), self-signed: its own root.
    pub fn certificate(&self) -> PathBuf {
        self.dir.path().join("data").join("server.crt")
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`, then `params` (such as
    /// `sslmode=require`) as its query, if not empty.
    pub fn url(&self, params: &str) -> String {
        self.database_url("postgres", params)
    }

    /// [`Self::url`] for database `name`.
    pub fn database_url(&self, name: &str, params: &str) -> String {
        let url = format!("postgres://postgres@127.0.0.1:{}/{name}", self.port);
        if params.is_empty() {
            url
        } else {
            format!("{url}?{params}")
        }
    }

    /// A superuser session over the cluster's Unix socket, which `pg_hba.conf` admits
    /// whatever the cluster's TLS rules for TCP are.
    pub async fn admin(&self) -> tokio_postgres::Client {
        let mut config = tokio_postgres::Config::new();
        config
            .host_path(self.dir.path())
            .port(self.port)
            .user("postgres")
            .dbname("postgres");
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("an admin session on the private cluster: {e}"));
        tokio::spawn(connection);
        client
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        if self.port == 0 {
            return;
        }
        let stopped = self
            .pg_ctl()
            .args(["-w", "-m", "immediate", "stop"])
            .output();
        if !stopped.is_ok_and(|output| output.status.success()) {
            eprintln!(
                "the private PostgreSQL cluster in {} did not stop",
                self.dir.path().display()
            );
        }
    }
}

/// The newest installed version's server binaries. None is a failure that says what to
/// install, never a skipped test.
fn server_binaries() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(DEBIAN_BINARIES)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let major = name.to_str()?.split('.').next()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((major, bin))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, bin)) => bin,
        None => panic!(
            "this test starts a private PostgreSQL cluster, but no server binaries were found \
             ({DEBIAN_BINARIES}/*/bin/initdb is missing): install Debian's `postgresql` package \
             (`.ci/run` does)"
        ),
    }
}

/// Who runs the server commands: this process's user, or `postgres` when that is root.
pub(crate) enum RunAs {
    Me,
    User { uid: u32, gid: u32 },
}

impl RunAs {
    pub(crate) fn detect() -> Self {
        if !nix::unistd::geteuid().is_root() {
            return Self::Me;
        }
        match nix::unistd::User::from_name("postgres") {
            Ok(Some(user)) => Self::User {
                uid: user.uid.as_raw(),
                gid: user.gid.as_raw(),
            },
            _ => panic!(
                "the tests run as root, and initdb and PgBouncer refuse root; they are run as \
                 the `postgres` OS user, but there is none (Debian's `postgresql` package \
                 creates it)"
            ),
        }
    }

    /// `program`, run as this user in `cwd` (the test's own directory may be closed to it).
    pub(crate) fn command(&self, program: &Path, cwd: &Path) -> Command {
        let mut command = Command::new(program);
        command.current_dir(cwd).env_remove("PGDATA");
        if let Self::User { uid, gid } = *self {
            command.uid(uid).gid(gid);
        }
        command
    }

    /// Gives `path` to this user.
    pub(crate) fn own(&self, path: &Path) {
        if let Self::User { uid, gid } = *self {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("giving {} to postgres: {e}", path.display()));
        }
    }
}

/// A self-signed certificate for `localhost` and `127.0.0.1` as the server's, with its key
/// readable by the server alone (PostgreSQL refuses a key others can read).
fn write_certificate(data: &Path, run_as: &RunAs) {
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    let certified = rcgen::generate_simple_self_signed(names).expect("a self-signed certificate");
    for (name, pem) in [
        ("server.crt", certified.cert.pem()),
        ("server.key", certified.signing_key.serialize_pem()),
    ] {
        let path = data.join(name);
        std::fs::write(&path, pem).unwrap_or_else(|e| panic!("writing {name}: {e}"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        run_as.own(&path);
    }
}

/// Runs `command` to its end; a failure panics with what it printed.
fn run(command: &mut Command, what: &str) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cluster refuses a plain TCP session when TLS is required, and takes one when TLS
    /// is off; the admin session over the socket works either way.
    #[tokio::test]
    async fn tcp_sessions_follow_the_clusters_tls_rule() {
        for tls in [ClusterTls::Required, ClusterTls::Off] {
            let cluster = PrivateCluster::start(ClusterOptions { tls });
            let ssl: String = cluster
                .admin()
                .await
                .query_one("SHOW ssl", &[])
                .await
                .unwrap()
                .get(0);
            let plain = tokio_postgres::connect(&cluster.url(""), tokio_postgres::NoTls).await;
            match tls {
                ClusterTls::Required => {
                    assert_eq!(ssl, "on");
                    let refused = plain.err().expect("a plain session is refused");
                    let refusal = refused.as_db_error().expect("the server's own refusal");
                    assert!(refusal.message().contains("no encryption"), "{refusal}");
                }
                ClusterTls::Off => {
                    assert_eq!(ssl, "off");
                    assert!(plain.is_ok(), "{:?}", plain.err());
                }
            }
        }
    }
}
