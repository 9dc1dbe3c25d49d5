//! A private Redis for one run: a free port on 127.0.0.1, its files in the run's own
//! directory, every write appended to the append-only file and synced before the answer
//! (`appendfsync always`), no snapshots. The machine's own Redis (if any) is never used.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::load::redis::connect;
use crate::process::{Proc, free_port};

pub struct RedisProgram {
    pub path: PathBuf,
    pub version: String,
}

impl RedisProgram {
    /// `redis-server` on `PATH`, if installed.
    pub fn find() -> Option<Self> {
        let path = super::on_path("redis-server")?;
        let version = super::version_of(&path);
        Some(Self { path, version })
    }

    /// Starts a fresh server with its data in `dir` and waits until it answers `PING`.
    pub async fn start(&self, dir: &Path, log: &Path) -> anyhow::Result<RedisServer> {
        std::fs::create_dir_all(dir)?;
        let port = free_port()?;
        let mut command = Command::new(&self.path);
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(dir)
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .args(["--save", ""])
            .args(["--daemonize", "no", "--logfile", ""]);
        let ready = || async move {
            let Ok(mut connection) = connect(port).await else {
                return false;
            };
            let pong: redis::RedisResult<String> =
                redis::cmd("PING").query_async(&mut connection).await;
            pong.is_ok()
        };
        let process =
            Proc::start(command, "redis-server", log, Duration::from_secs(30), ready).await?;
        Ok(RedisServer { process, port })
    }
}

pub struct RedisServer {
    process: Proc,
    pub port: u16,
}

impl RedisServer {
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        self.process.stop(Duration::from_secs(30)).await?;
        Ok(())
    }
}
