//! Bounded retries for contention and outages: exponential backoff with full jitter, under a
//! deadline. Never unbounded: a worker that waits for a lock must be able to say how long.

use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use super::error::Error;

/// How [`Client::acquire_with_retry`](super::Client::acquire_with_retry) and
/// [`Client::lease_with_retry`](super::Client::lease_with_retry) retry.
///
/// The `n`-th pause (from 0) is a random duration between zero and
/// `min(max_backoff, initial_backoff * 2^n)` ("full jitter"), so that many workers waiting
/// for one lock spread out instead of asking in lockstep. No attempt starts and no pause
/// ends after `deadline` (counted from the first attempt, on the monotonic clock); an attempt
/// that started before it may still take up to the client's request timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The ceiling of the first pause. Treated as at least 1 ms, so a zero never turns the
    /// retry loop into a busy loop against the server.
    pub initial_backoff: Duration,
    /// The largest pause ceiling; the doubling stops here.
    pub max_backoff: Duration,
    /// How long to keep trying, counted from the first attempt.
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    /// 100 ms first pause ceiling, doubling to at most 5 s, for at most 30 s.
    fn default() -> Self {
        Self {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            deadline: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The ceiling of pause number `attempt` (from 0): `initial * 2^attempt`, capped.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let initial = self.initial_backoff.max(Duration::from_millis(1));
        let max = self.max_backoff.max(initial);
        let factor = 2u32.saturating_pow(attempt.min(31));
        initial.saturating_mul(factor).min(max)
    }

    /// A random pause for `attempt`, uniformly between zero and its ceiling.
    pub fn pause(&self, attempt: u32) -> Duration {
        jitter(Duration::ZERO, self.ceiling(attempt))
    }

    /// Runs `attempt` until it succeeds, fails with an error that is not
    /// [retryable](Error::is_retryable), or the deadline passes; then returns the last result.
    /// The first attempt is always made.
    pub(super) async fn run<T, F, Fut>(&self, mut attempt: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let deadline = Instant::now() + self.deadline;
        let mut retries = 0;
        loop {
            let error = match attempt().await {
                Err(error) if error.is_retryable() => error,
                done => return done,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(error);
            }
            let wake = (now + self.pause(retries)).min(deadline);
            tracing::debug!(%error, retry_in_ms = (wake - now).as_millis(), "retrying");
            tokio::time::sleep_until(wake).await;
            retries = retries.saturating_add(1);
        }
    }
}

/// A uniformly random duration in `low..=high` (or `low` if `high < low`).
pub(super) fn jitter(low: Duration, high: Duration) -> Duration {
    let span = u64::try_from(high.saturating_sub(low).as_micros()).unwrap_or(u64::MAX);
    low + Duration::from_micros(rand::rng().random_range(0..=span))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_up_to_the_maximum() {
        let policy = RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(1000),
            deadline: Duration::from_secs(10),
        };
        let ceilings: Vec<u128> = (0..6).map(|n| policy.ceiling(n).as_millis()).collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(policy.ceiling(u32::MAX), Duration::from_millis(1000));
        for n in 0..50 {
            assert!(policy.pause(n) <= policy.ceiling(n));
        }
    }

    #[test]
    fn zero_backoff_is_not_a_busy_loop() {
        let policy = RetryPolicy {
            initial_backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
            deadline: Duration::from_secs(1),
        };
        assert_eq!(policy.ceiling(0), Duration::from_millis(1));
    }

    /// The loop gives up at its deadline, never sleeping past it (the attempts here take no
    /// time, so only the scheduler's delay is added).
    #[tokio::test]
    async fn gives_up_at_the_deadline_with_the_last_error() {
        let policy = RetryPolicy {
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_secs(60),
            deadline: Duration::from_millis(300),
        };
        let start = Instant::now();
        let mut attempts = 0;
        let result: Result<(), Error> = policy
            .run(|| {
                attempts += 1;
                async {
                    Err(Error::Held {
                        resource: "r".to_owned(),
                    })
                }
            })
            .await;
        assert!(matches!(result, Err(Error::Held { .. })));
        let elapsed = start.elapsed();
        assert!(elapsed >= policy.deadline, "{elapsed:?}");
        assert!(
            elapsed < policy.deadline + Duration::from_secs(1),
            "{elapsed:?}"
        );
        assert!(attempts > 1);
    }

    #[tokio::test]
    async fn final_errors_are_not_retried() {
        let mut attempts = 0;
        let result: Result<(), Error> = RetryPolicy::default()
            .run(|| {
                attempts += 1;
                async { Err(Error::Protocol("no".to_owned())) }
            })
            .await;
        assert!(matches!(result, Err(Error::Protocol(_))));
        assert_eq!(attempts, 1);
    }
}
