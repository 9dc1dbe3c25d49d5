//! The store's clock and a lease row as the operations read it: shared by the lease
//! operations, the history and the undo journal, and importing none of them.

use std::time::{SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};

use crate::store::{Result, StoreError};
use fencelock::domain::decide;
use fencelock::domain::{Fence, LockDelay};

/// The store's clock: this process's wall clock, in Unix milliseconds. Every server sharing a
/// file runs on the same machine, so they share this clock.
pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

pub(super) fn timestamp(ms: i64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Internal(anyhow::anyhow!("stored time {ms} is out of range")))
}

pub(super) fn stored_fence(value: i64) -> Result<Fence> {
    Fence::new(value).map_err(|e| StoreError::Internal(anyhow::anyhow!("fence: {e}")))
}

/// The row of a resource as the lease operations read it.
pub(super) struct Row {
    pub(super) owner: String,
    /// The name of the token the lease was taken with, if the server checks tokens.
    pub(super) token: Option<String>,
    pub(super) fence: Fence,
    pub(super) acquired_at: i64,
    pub(super) expires_at: DateTime<Utc>,
    pub(super) lock_delay: LockDelay,
}

impl Row {
    pub(super) fn current(&self) -> decide::Current<'_> {
        decide::Current {
            owner: &self.owner,
            fence: self.fence,
            expires_at: self.expires_at,
            lock_delay: self.lock_delay,
        }
    }
}
