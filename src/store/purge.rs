//! The store's own chore: deleting long-expired leases, periodically, until told to stop.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::SharedStore;

/// The periodic purge of one store. Stop it with [`Purge::stop`].
pub struct Purge {
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl Purge {
    /// Deletes leases that expired more than `grace` ago, every `interval`, on the current
    /// runtime. A failed round is logged and tried again at the next interval.
    pub fn start(store: SharedStore, grace: Duration, interval: Duration) -> Self {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(store, grace, interval, stopped));
        Self { task, stop }
    }

    /// Stops the purge and waits for a round in progress to end.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn run(
    store: SharedStore,
    grace: Duration,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    // The first round comes one interval after start, not at once: a server that restarts
    // often has no backlog worth purging before it serves, and nothing races a fresh start.
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = ticks.tick() => {}
        }
        match store.purge_expired(grace).await {
            Ok(0) => {}
            Ok(purged) => tracing::info!(purged, "purged expired leases"),
            Err(e) => tracing::warn!(error = %e, "purging expired leases failed; will retry"),
        }
    }
}
