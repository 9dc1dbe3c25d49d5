//! The store's own chore: deleting long-expired leases, and the history of leases that ended
//! longer ago than the retention, periodically, until told to stop.

use std::time::Duration;

use tokio::time::Instant;

use super::chore::Chore;
use super::{HISTORY_PER_RESOURCE, SharedStore};

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
    /// Deletes, every `interval`, leases that expired more than `keep.grace` ago, the history
    /// of each resource beyond its newest [`HISTORY_PER_RESOURCE`] leases, and history rows
    /// of leases that ended more than `keep.history` ago, each in bounded batches. A
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
                // Every resource acquired since the last round or so (twice the interval, at
                // least a minute: a round may have been late or failed).
                let recent = (interval * 2).max(std::time::Duration::from_secs(60));
                match store.trim_history(HISTORY_PER_RESOURCE, recent).await {
                    Ok(0) => {}
                    Ok(trimmed) => tracing::info!(
                        trimmed,
                        "trimmed lease history to its newest leases per resource"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "trimming lease history failed; will retry")
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
