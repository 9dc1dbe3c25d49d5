//! The `fencelock_live_leases` gauge: the store's live leases, counted periodically until
//! told to stop.

use std::time::Duration;

use prometheus::IntGauge;
use tokio::time::Instant;

use super::SharedStore;
use super::chore::Chore;

/// The periodic count of one store's live leases.
pub(crate) struct LiveLeases;

impl LiveLeases {
    /// Sets `gauge` to the store's live leases at once and then every `interval`. A failed
    /// count leaves the last value and is tried again at the next interval.
    pub(crate) fn start(store: SharedStore, gauge: IntGauge, interval: Duration) -> Chore {
        Chore::start(Instant::now(), interval, move || {
            let (store, gauge) = (store.clone(), gauge.clone());
            async move {
                match store.count_live().await {
                    Ok(live) => gauge.set(i64::try_from(live).unwrap_or(i64::MAX)),
                    Err(e) => tracing::warn!(error = %e, "counting live leases failed; will retry"),
                }
            }
        })
    }
}
