//! The store's own chore: deleting long-expired leases, and the history of leases that ended
//! longer ago than the retention, periodically, until told to stop.

use std::time::Duration;

use tokio::time::Instant;

use super::SharedStore;
use super::chore::Chore;

/// The periodic purge of one store.
pub(crate) struct Purge;

/// How long the purge keeps what.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keep {
    /// Expired leases: deleted this long after their expiry (and never inside their lock
    /// delay).
    pub grace: Duration,
    /// The history of leases that ended (released, or expired) longer ago than this.
    pub history: Duration,
}

impl Purge {
    /// Deletes, every `interval`, leases that expired more than `keep.grace` ago and history
    /// rows of leases that ended more than `keep.history` ago, each in bounded batches. A
    /// failed round is logged and tried again at the next interval.
    ///
    /// The first round comes one interval after start, not at once: a server that restarts
    /// often has no backlog worth purging before it serves, and nothing races a fresh start.
    pub(crate) fn start(store: SharedStore, keep: Keep, interval: Duration) -> Chore {
        Chore::start(Instant::now() + interval, interval, move || {
            let store = store.clone();
            async move {
                match store.purge_expired(keep.grace).await {
                    Ok(0) => {}
                    Ok(purged) => tracing::info!(purged, "purged expired leases"),
                    Err(e) => {
                        tracing::warn!(error = %e, "purging expired leases failed; will retry")
                    }
                }
                match store.purge_history(keep.history).await {
                    Ok(0) => {}
                    Ok(purged) => tracing::info!(purged, "purged lease history past its retention"),
                    Err(e) => {
                        tracing::warn!(error = %e, "purging lease history failed; will retry")
                    }
                }
            }
        })
    }
}
