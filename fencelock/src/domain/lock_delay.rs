use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

/// How long after a lease ends by expiry no other owner may take the resource: 0 to
/// [`LockDelay::MAX_MS`] milliseconds. A release imposes none (the holder said it is done);
/// an expiry may mean a paused holder that still acts, and this gives it time to notice.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Default)]
pub struct LockDelay(u32);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockDelayError {
    #[error("must be from 0 to {max} milliseconds, got {0}", max = LockDelay::MAX_MS)]
    OutOfRange(i64),
}

impl LockDelay {
    /// One minute: far below every timestamp limit, so `expires_at + delay` never overflows.
    pub const MAX_MS: u32 = 60_000;

    pub const NONE: Self = Self(0);

    pub fn new(ms: i64) -> Result<Self, LockDelayError> {
        u32::try_from(ms)
            .ok()
            .filter(|ms| *ms <= Self::MAX_MS)
            .map(Self)
            .ok_or(LockDelayError::OutOfRange(ms))
    }

    pub fn millis(self) -> u32 {
        self.0
    }

    pub fn as_duration(self) -> Duration {
        Duration::from_millis(u64::from(self.0))
    }

    /// When a lease that expires at `expires_at` with this delay lets another owner take the
    /// resource. The one place the embedded store computes the end of a lock delay
    /// (PostgreSQL: `fencelock_free_at`).
    pub fn free_at(self, expires_at: DateTime<Utc>) -> DateTime<Utc> {
        expires_at + TimeDelta::milliseconds(i64::from(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_inclusive() {
        assert_eq!(LockDelay::new(0), Ok(LockDelay::NONE));
        assert_eq!(LockDelay::new(60_000).unwrap().millis(), 60_000);
        for bad in [-1, 60_001, i64::MAX, i64::MIN] {
            assert_eq!(LockDelay::new(bad), Err(LockDelayError::OutOfRange(bad)));
        }
    }

    #[test]
    fn the_delay_counts_from_the_expiry() {
        let at = |ms| DateTime::from_timestamp_millis(ms).unwrap();
        assert_eq!(LockDelay::new(1_500).unwrap().free_at(at(1_000)), at(2_500));
        assert_eq!(LockDelay::NONE.free_at(at(1_000)), at(1_000));
    }
}
