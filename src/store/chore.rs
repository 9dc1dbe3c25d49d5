//! Work a store does beside the requests, periodically, until told to stop: the purge of
//! long-expired leases ([`super::purge`]) and the count of live leases ([`super::live`]).

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A chore running on the current runtime. Stop it with [`Chore::stop`].
pub(crate) struct Chore {
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl Chore {
    /// Runs `round` at `first` and then every `interval`. A round that overruns delays the
    /// next one rather than bunching them up.
    pub(crate) fn start<F, R>(first: Instant, interval: Duration, mut round: F) -> Self
    where
        F: FnMut() -> R + Send + 'static,
        R: Future<Output = ()> + Send,
    {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(first, interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stopped.changed() => return,
                    _ = ticks.tick() => round().await,
                }
            }
        });
        Self { task, stop }
    }

    /// Stops the chore and waits for a round in progress to end.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
