//! Lease-server instances: real `fencelock` processes on fixed local ports, which the run
//! kills with SIGKILL and starts again on the same port.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// How long an instance may take to answer `/readyz` after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Instance {
    pub port: u16,
    binary: PathBuf,
    database_url: String,
    log: PathBuf,
    child: Option<Child>,
}

impl Instance {
    /// An instance that is not started yet, logging to `log`.
    pub fn new(binary: &Path, database_url: &str, log: PathBuf) -> anyhow::Result<Self> {
        Ok(Self {
            port: free_port()?,
            binary: binary.to_owned(),
            database_url: database_url.to_owned(),
            log,
            child: None,
        })
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts the process; [`Self::wait_ready`] waits until it serves.
    pub fn start(&mut self) -> anyhow::Result<()> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let child = Command::new(&self.binary)
            .args(["--bind", &format!("127.0.0.1:{}", self.port)])
            .args(["--database-url", &self.database_url])
            // The chaos run's requests come at full speed from one address.
            .env_remove("FENCELOCK_AUTH_FILE")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        self.child = Some(child);
        Ok(())
    }

    pub async fn wait_ready(&mut self, http: &reqwest::Client) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let url = format!("{}/readyz", self.url());
        while Instant::now() < deadline {
            if let Some(child) = &mut self.child
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                bail!(
                    "the lease server on port {} exited ({status}); the end of its log ({}):\n{}",
                    self.port,
                    self.log.display(),
                    log_tail(&self.log)
                );
            }
            if let Ok(response) = http.get(&url).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "the lease server on port {} was not ready within {START_TIMEOUT:?}; its log is {}",
            self.port,
            self.log.display()
        )
    }

    /// SIGKILL: no graceful shutdown, requests in flight lose their answers.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A port nobody listens on now. The instance binds it a moment later; on a shared machine
/// another process could take it first, and the instance then fails to start, loudly.
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// The `fencelock` binary: `explicit` if given, else the one beside this program.
pub fn find_binary(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match explicit {
        Some(path) => path.to_owned(),
        None => std::env::current_exe()
            .context("locating this program")?
            .with_file_name("fencelock"),
    };
    if !path.is_file() {
        bail!(
            "no fencelock binary at {}; build it (`cargo build -p fencelock-server --bin fencelock`) or name it with --fencelock-bin / FENCELOCK_BIN",
            path.display()
        );
    }
    Ok(path)
}

/// The last lines of a lease server's log, for an error that outlives the scratch directory
/// the log is in (it is removed when a run fails).
fn log_tail(log: &Path) -> String {
    const LINES: usize = 20;
    match std::fs::read_to_string(log) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(LINES)..].join("\n")
        }
        Err(e) => format!("(unreadable: {e})"),
    }
}
