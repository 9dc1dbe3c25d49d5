//! A rule broken on purpose, in debug builds only, so that the chaos run's trace validation
//! (`fencelock-demo chaos`, `demo/src/chaos/replay.rs`) can be shown to catch it.
//!
//! `FENCELOCK_BROKEN_RULE=handover-reversed` serves each resource's queue last come, first
//! served: a waiter is granted the lease when no live ticket is *behind* it, instead of
//! none ahead. Requests that do not wait are still refused while anyone waits. Release
//! builds compile none of this: the variable means nothing to them.

use std::sync::LazyLock;

/// The queue's order reversed (read once, at the first acquisition that asks).
pub(super) fn handover_reversed() -> bool {
    static REVERSED: LazyLock<bool> = LazyLock::new(|| {
        let on = std::env::var("FENCELOCK_BROKEN_RULE").is_ok_and(|v| v == "handover-reversed");
        if on {
            tracing::warn!(
                "FENCELOCK_BROKEN_RULE=handover-reversed: this debug build serves waiters last come, first served, breaking the contract on purpose"
            );
        }
        on
    });
    *REVERSED
}

/// [`super::WAITERS_AHEAD`] with the queue's order reversed: the live tickets behind `?3`.
pub(super) const WAITERS_BEHIND: &str = "
SELECT min(expires_at) FROM lease_waiters
WHERE resource = ?1 AND expires_at > ?2 AND (?3 IS NULL OR ticket > ?3)";
