//! The LISTEN session: one dedicated connection per instance that receives the changes every
//! instance announces on `fencelock_changes` (docs/design/0004-announcements.md: grants, releases,
//! dequeues; the payload is the resource) and passes them to this instance's wake registry.
//!
//! A notification sent while the session was down is lost, so after every (re)connect, once
//! LISTEN is in force, everyone is woken to look again. The session reconnects with backoff
//! for as long as the store lives, and sends a cheap query every [`PROBE_EVERY`] so that a
//! connection that died silently (a partition delivers no error) is noticed and replaced.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio::sync::oneshot;
use tokio_postgres::AsyncMessage;

use super::{DRIVERS, PgConfig};
use crate::wake::Changes;

/// The channel the migration's trigger announces on.
const CHANNEL: &str = "fencelock_changes";
/// Longest pause between reconnection attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(5);
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// How often the session proves it is alive, and how long it waits for the proof.
const PROBE_EVERY: Duration = Duration::from_secs(15);
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The running session; dropping it ends the session.
pub(super) struct Listener {
    _stop: oneshot::Sender<()>,
}

impl Listener {
    pub(super) fn start(config: PgConfig, changes: Arc<Changes>) -> Self {
        let (stop, stopped) = oneshot::channel();
        DRIVERS.spawn(run(config, changes, stopped));
        Self { _stop: stop }
    }
}

async fn run(config: PgConfig, changes: Arc<Changes>, mut stopped: oneshot::Receiver<()>) {
    let mut backoff = BACKOFF_FIRST;
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            ended = session(&config, &changes, &mut backoff) => {
                tracing::debug!(error = %format!("{ended:#}"), "the PostgreSQL LISTEN session ended; reconnecting");
            }
        }
        // Whatever was announced while the session was down is lost.
        changes.all_changed();
        tokio::select! {
            _ = &mut stopped => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// One session, until it fails; returns why.
async fn session(
    config: &PgConfig,
    changes: &Arc<Changes>,
    backoff: &mut Duration,
) -> anyhow::Error {
    let (client, mut connection) = match config
        .session_config()
        .connect(config.tls.connector.clone())
        .await
    {
        Ok(pair) => pair,
        Err(e) => return e.into(),
    };
    let sink = changes.clone();
    let mut driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => sink.changed(n.payload()),
                Ok(_) => {}
                Err(e) => return anyhow::Error::new(e),
            }
        }
        anyhow::anyhow!("the connection closed")
    });
    if let Err(e) = client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
        driver.abort();
        return e.into();
    }
    *backoff = BACKOFF_FIRST;
    // Listening from here on; what happened before is unknown.
    changes.all_changed();
    let mut probe = tokio::time::interval(PROBE_EVERY);
    probe.tick().await;
    loop {
        tokio::select! {
            ended = &mut driver => {
                return ended.unwrap_or_else(|e| anyhow::anyhow!("the LISTEN driver failed: {e}"));
            }
            _ = probe.tick() => {
                match tokio::time::timeout(PROBE_TIMEOUT, client.simple_query("SELECT 1")).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        driver.abort();
                        return e.into();
                    }
                    Err(_) => {
                        driver.abort();
                        return anyhow::anyhow!("no answer to the liveness probe within {PROBE_TIMEOUT:?}");
                    }
                }
            }
        }
    }
}
