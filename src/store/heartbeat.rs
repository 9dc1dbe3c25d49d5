//! The heartbeat of this process's waiters: while any waits, their tickets are extended every
//! [`BEAT_EVERY`], in one store statement for all of them, so the store can tell a live waiter
//! from one whose process died (see [`LeaseStore::beat`](super::LeaseStore::beat)). Without
//! waiters a beat is a look at an empty map: no store call.

use tokio::time::Instant;

use super::chore::Chore;
use super::{BEAT_EVERY, SharedStore};

/// The periodic heartbeat of one store's waiters in this process.
pub(crate) struct Heartbeat;

impl Heartbeat {
    pub(crate) fn start(store: SharedStore) -> Chore {
        Chore::start(Instant::now() + BEAT_EVERY, BEAT_EVERY, move || {
            let store = store.clone();
            async move {
                let tickets = store.changes().lines().tickets();
                if tickets.is_empty() {
                    return;
                }
                // A beat that fails is tried again at the next: tickets live four beats.
                if let Err(e) = store.beat(&tickets).await {
                    tracing::warn!(error = %e, waiters = tickets.len(), "the waiters' heartbeat failed; will retry");
                }
            }
        })
    }
}
