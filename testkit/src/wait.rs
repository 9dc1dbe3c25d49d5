//! Waiting for what happens on its own time: a signal handled, a background purge, a task
//! of the server reaching a point. Each wait is bounded, so a test that would hang fails.

use std::time::{Duration, Instant};

/// How often [`eventually`] looks again.
const POLL: Duration = Duration::from_millis(10);

/// Waits until `check` holds, looking again every few milliseconds; fails the test with
/// `what` once `within` has passed without it.
pub async fn eventually(what: &str, within: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "{what} (waited {within:?})");
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn eventually_returns_once_the_check_holds() {
        let mut looks = 0;
        eventually("the third look", Duration::from_secs(10), async || {
            looks += 1;
            looks == 3
        })
        .await;
        assert_eq!(looks, 3);
    }

    #[tokio::test]
    #[should_panic(expected = "never (waited 50ms)")]
    async fn eventually_fails_the_test_after_its_bound() {
        eventually("never", Duration::from_millis(50), async || false).await;
    }
}
