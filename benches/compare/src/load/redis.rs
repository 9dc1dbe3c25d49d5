//! Redis's side of the load: `SET res:<n> owner NX PX ttl` to acquire, the reference's
//! compare-and-delete script (`EVALSHA`) to release; one connection per client.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;

use super::LockClient;

/// The same lease time as fencelock's load.
const TTL_MS: u64 = 30_000;

/// The compare-and-delete release, as the reference defines it.
pub const RELEASE_SCRIPT: &str = include_str!("../../../reference/redis_release.lua");

pub struct RedisClient {
    connection: MultiplexedConnection,
    release_sha: Arc<str>,
}

/// The connection settings: no response timeout (a busy machine must slow the run down, not
/// fail it).
fn config() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(Duration::from_secs(10)))
}

/// A connection of its own (each call opens a new TCP connection).
pub async fn connect(port: u16) -> anyhow::Result<MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    Ok(client
        .get_multiplexed_async_connection_with_config(&config())
        .await?)
}

/// Loads the release script into the server; its SHA1 is what `EVALSHA` names.
pub async fn load_release_script(port: u16) -> anyhow::Result<Arc<str>> {
    let mut connection = connect(port).await?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(RELEASE_SCRIPT)
        .query_async(&mut connection)
        .await
        .context("SCRIPT LOAD")?;
    Ok(sha.into())
}

impl RedisClient {
    pub async fn connect(port: u16, release_sha: Arc<str>) -> anyhow::Result<Self> {
        Ok(Self {
            connection: connect(port).await?,
            release_sha,
        })
    }
}

impl LockClient for RedisClient {
    async fn acquire(&mut self, resource: u32, owner: u64) -> anyhow::Result<bool> {
        let set: Option<String> = redis::cmd("SET")
            .arg(format!("res:{resource}"))
            .arg(format!("o{owner:016x}"))
            .arg("NX")
            .arg("PX")
            .arg(TTL_MS)
            .query_async(&mut self.connection)
            .await?;
        Ok(set.is_some())
    }

    async fn release(&mut self, resource: u32, owner: u64, held: bool) -> anyhow::Result<()> {
        let deleted: i64 = redis::cmd("EVALSHA")
            .arg(&*self.release_sha)
            .arg(1)
            .arg(format!("res:{resource}"))
            .arg(format!("o{owner:016x}"))
            .query_async(&mut self.connection)
            .await?;
        anyhow::ensure!(
            deleted == i64::from(held),
            "release: the script deleted {deleted} keys, expected {}",
            i64::from(held)
        );
        Ok(())
    }
}
