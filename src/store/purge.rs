//! The store's own chore: deleting long-expired leases, periodically, until told to stop.

use std::time::Duration;

use tokio::time::Instant;

use super::SharedStore;
use super::chore::Chore;

/// The periodic purge of one store.
pub struct Purge;

impl Purge {
    /// Deletes leases that expired more than `grace` ago, every `interval`. A failed round is
    /// logged and tried again at the next interval.
    ///
    /// The first round comes one interval after start, not at once: a server that restarts
    /// often has no backlog worth purging before it serves, and nothing races a fresh start.
    pub fn start(store: SharedStore, grace: Duration, interval: Duration) -> Chore {
        Chore::start(Instant::now() + interval, interval, move || {
            let store = store.clone();
            async move {
                match store.purge_expired(grace).await {
                    Ok(0) => {}
                    Ok(purged) => tracing::info!(purged, "purged expired leases"),
                    Err(e) => {
                        tracing::warn!(error = %e, "purging expired leases failed; will retry")
                    }
                }
            }
        })
    }
}
