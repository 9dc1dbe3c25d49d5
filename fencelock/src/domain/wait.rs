//! Waiting for a lease (`wait_ms` on acquire) and watching one (`GET /locks/{r}/watch`): how
//! long, and the queue ticket that keeps waiters in arrival order.

use std::time::Duration;

/// The default of `--max-wait-ms`: a minute.
pub const DEFAULT_MAX_WAIT_MS: u32 = 60_000;
/// The largest `--max-wait-ms` an operator may configure: an hour. A waiting request holds a
/// connection for its whole wait.
pub const WAIT_CEILING_MS: u32 = 3_600_000;

/// How long an acquisition may wait for a held resource: `0..=max` milliseconds, `0` for
/// not at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WaitFor(u32);

impl WaitFor {
    /// Checks a requested wait against `0..=max` milliseconds.
    pub fn new(ms: i64, max: u32) -> Result<Self, String> {
        u32::try_from(ms)
            .ok()
            .filter(|ms| *ms <= max)
            .map(Self)
            .ok_or_else(|| format!("must be an integer from 0 to {max} (milliseconds)"))
    }

    pub fn duration(self) -> Duration {
        Duration::from_millis(u64::from(self.0))
    }

    /// No waiting: the acquisition answers at once, as without `wait_ms`.
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }
}

/// A waiter's place in the queue of one resource, issued by the store: a smaller ticket
/// arrived earlier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(i64);

impl Ticket {
    pub fn new(value: i64) -> Self {
        Self(value)
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

/// The longest and the default `timeout_ms` of a watch.
pub const WATCH_TIMEOUT_MAX_MS: u32 = 300_000;
pub const WATCH_TIMEOUT_DEFAULT_MS: u32 = 30_000;

/// How long a watch waits for its lease to end: `1..=300000` ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchTimeout(u32);

impl WatchTimeout {
    pub fn new(ms: u64) -> Option<Self> {
        u32::try_from(ms)
            .ok()
            .filter(|ms| (1..=WATCH_TIMEOUT_MAX_MS).contains(ms))
            .map(Self)
    }

    pub fn duration(self) -> Duration {
        Duration::from_millis(u64::from(self.0))
    }
}

impl Default for WatchTimeout {
    fn default() -> Self {
        Self(WATCH_TIMEOUT_DEFAULT_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_is_zero_to_the_maximum() {
        assert!(WaitFor::new(0, 100).unwrap().is_zero());
        assert_eq!(
            WaitFor::new(100, 100).unwrap().duration(),
            Duration::from_millis(100)
        );
        for bad in [-1, 101, i64::MAX, i64::MIN] {
            assert!(WaitFor::new(bad, 100).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_watch_timeout_is_one_to_300000_ms() {
        assert!(WatchTimeout::new(0).is_none());
        assert!(WatchTimeout::new(300_001).is_none());
        assert!(WatchTimeout::new(u64::MAX).is_none());
        assert_eq!(
            WatchTimeout::new(1).unwrap().duration(),
            Duration::from_millis(1)
        );
        assert_eq!(WatchTimeout::default().duration(), Duration::from_secs(30));
    }
}
