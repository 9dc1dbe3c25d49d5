//! The lease server under test: the release binary, built by the benchmark unless one is
//! given, run as a process of its own with its normal logging (the default `RUST_LOG`,
//! stderr to a log file), on a free port of 127.0.0.1.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::load::http::get_status;
use crate::process::{Proc, free_port};
use crate::storage::Store;

/// The `fencelock` executable the runs use.
#[derive(Clone)]
pub struct Binary {
    pub path: PathBuf,
    /// How it came to be: built here as a release build, or given.
    pub provenance: String,
    /// `fencelock --version`.
    pub version: String,
}

impl Binary {
    /// `given`, or the workspace's `target/release/fencelock` after `cargo build --release
    /// --bin fencelock` (quick when it is up to date).
    pub fn prepare(given: Option<&Path>) -> anyhow::Result<Self> {
        let (path, provenance) = match given {
            Some(path) => (
                path.to_owned(),
                "given with --fencelock-bin; its build profile is not checked".to_owned(),
            ),
            None => {
                let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
                let root = root.canonicalize().unwrap_or(root);
                let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
                eprintln!("building the server: cargo build --release --bin fencelock");
                let status = Command::new(&cargo)
                    .args(["build", "--release", "--bin", "fencelock"])
                    .current_dir(&root)
                    .status()
                    .context("running cargo build --release --bin fencelock")?;
                if !status.success() {
                    bail!("cargo build --release --bin fencelock failed ({status})");
                }
                let target = std::env::var_os("CARGO_TARGET_DIR")
                    .map_or_else(|| root.join("target"), PathBuf::from);
                (
                    target.join("release").join("fencelock"),
                    "release build (cargo build --release --bin fencelock, run by this benchmark)"
                        .to_owned(),
                )
            }
        };
        Self::with_version(path, provenance)
    }

    /// The build given with `--baseline-bin`.
    pub fn given_as_baseline(path: &Path) -> anyhow::Result<Self> {
        Self::with_version(
            path.to_owned(),
            "given with --baseline-bin; its build profile is not checked".to_owned(),
        )
    }

    fn with_version(path: PathBuf, provenance: String) -> anyhow::Result<Self> {
        let output = Command::new(&path)
            .arg("--version")
            .output()
            .with_context(|| format!("running {} --version", path.display()))?;
        let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        Ok(Self {
            path,
            provenance,
            version,
        })
    }

    /// A command for the binary with the store's `DATABASE_URL` and otherwise the
    /// defaults: no `FENCELOCK_*` or `RUST_LOG` from the caller's environment.
    fn command(&self, store: &Store) -> Command {
        let mut command = Command::new(&self.path);
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key.starts_with("FENCELOCK_") || key == "RUST_LOG" {
                command.env_remove(&*key);
            }
        }
        command.env("DATABASE_URL", store.database_url());
        command
    }

    /// Applies the store's migrations (`fencelock migrate`), so that the benchmark can load
    /// the server's own schema before a server runs on it.
    pub async fn migrate(&self, store: &Store, log: &Path) -> anyhow::Result<()> {
        let mut command = self.command(store);
        command.arg("migrate");
        let mut process = Proc::spawn(command, "fencelock migrate", log)?;
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = process.exited() {
                if status.success() {
                    return Ok(());
                }
                bail!(
                    "fencelock migrate failed ({status}):\n{}",
                    process.log_tail(20)
                );
            }
            if Instant::now() > until {
                bail!("fencelock migrate did not finish in 120 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts `fencelock serve` on `store` and waits until `GET /readyz` answers 200.
    pub async fn serve(&self, store: &Store, log: &Path) -> anyhow::Result<Server> {
        // The port is free when chosen, but a connection of an earlier run that is still
        // closing may take it before the server binds it: then another port is tried.
        let mut attempts = 1;
        loop {
            match self.serve_on(free_port()?, store, log).await {
                Err(e) if attempts < 5 && format!("{e:#}").contains("Address already in use") => {
                    attempts += 1;
                }
                served => return served,
            }
        }
    }

    async fn serve_on(&self, port: u16, store: &Store, log: &Path) -> anyhow::Result<Server> {
        let mut command = self.command(store);
        command
            .arg("serve")
            .arg("--bind")
            .arg(format!("127.0.0.1:{port}"));
        let ready = || async move {
            get_status(port, "/readyz")
                .await
                .is_ok_and(|status| status.is_success())
        };
        let process = Proc::start(
            command,
            "fencelock serve",
            log,
            Duration::from_secs(60),
            ready,
        )
        .await?;
        Ok(Server { process, port })
    }
}

/// A running lease server.
pub struct Server {
    process: Proc,
    pub port: u16,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn peak_rss_kib(&self) -> anyhow::Result<u64> {
        self.process.peak_rss_kib()
    }

    pub fn rss_kib(&self) -> anyhow::Result<u64> {
        self.process.rss_kib()
    }

    /// Fails if the server has died.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.process.exited() {
            bail!(
                "the server exited ({status}):\n{}",
                self.process.log_tail(20)
            );
        }
        Ok(())
    }

    /// Stops the server as an operator would (SIGTERM, in-flight requests finish) and
    /// checks that it exited cleanly.
    pub async fn stop(self) -> anyhow::Result<()> {
        let log = self.process.log().to_owned();
        let status = self.process.stop(Duration::from_secs(30)).await?;
        if !status.success() {
            bail!(
                "the server exited with {status} on SIGTERM:\n{}",
                crate::process::log_tail(&log, 20)
            );
        }
        Ok(())
    }
}
