//! The `fencelock_live_leases` gauge: the store's live leases, counted periodically until
//! told to stop, the way [`super::purge::Purge`] purges.

use std::time::Duration;

use prometheus::IntGauge;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::SharedStore;

/// The periodic count of one store's live leases. Stop it with [`LiveLeases::stop`].
pub struct LiveLeases {
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl LiveLeases {
    /// Sets `gauge` to the store's live leases at once and then every `interval`, on the
    /// current runtime. A failed count leaves the last value and is tried again at the next
    /// interval.
    pub fn start(store: SharedStore, gauge: IntGauge, interval: Duration) -> Self {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(store, gauge, interval, stopped));
        Self { task, stop }
    }

    /// Stops the count and waits for one in progress to end.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn run(
    store: SharedStore,
    gauge: IntGauge,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = ticks.tick() => {}
        }
        match store.count_live().await {
            Ok(live) => gauge.set(i64::try_from(live).unwrap_or(i64::MAX)),
            Err(e) => tracing::warn!(error = %e, "counting live leases failed; will retry"),
        }
    }
}
