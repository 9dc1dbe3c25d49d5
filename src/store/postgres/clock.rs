//! This process's clock mapped onto the database's, for handing deadlines to PostgreSQL.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::store::Deadline;

/// This process's monotonic clock mapped onto the database's clock, so that a request's
/// deadline can be handed to the database as a database time.
///
/// Each answer that carries a reading of the database's clock (`now()`, or a decision's
/// `observed_at`, read after its locks) is a sample: it was read somewhere between
/// sending and receiving, so taking it as the time of receipt makes the mapped
/// deadline early by at most one round trip, never late. Slow answers are poor samples and
/// are ignored once a first sample exists.
pub(super) struct DbClock {
    anchor: Instant,
    /// Database time in µs since the Unix epoch, minus µs since `anchor`, at the last good
    /// sample; `i64::MIN` before the first.
    offset_us: AtomicI64,
}

/// Round trips longer than this make no sample (unless there is none yet).
const CLOCK_SAMPLE_MAX_RTT: Duration = Duration::from_millis(50);

impl DbClock {
    pub(super) fn new() -> Self {
        Self {
            anchor: Instant::now(),
            offset_us: AtomicI64::new(i64::MIN),
        }
    }

    fn since_anchor_us(&self, at: Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.anchor).as_micros()).unwrap_or(i64::MAX)
    }

    /// Records that the database read `db_now` during a round trip started at `sent`.
    pub(super) fn sample(&self, db_now: DateTime<Utc>, sent: Instant) {
        let received = Instant::now();
        let known = self.offset_us.load(Ordering::Relaxed) != i64::MIN;
        if known && received.duration_since(sent) > CLOCK_SAMPLE_MAX_RTT {
            return;
        }
        let offset = db_now.timestamp_micros() - self.since_anchor_us(received);
        self.offset_us.store(offset, Ordering::Relaxed);
    }

    /// `deadline` on the database's clock; `None` before the first sample.
    pub(super) fn database_time(&self, deadline: Deadline) -> Option<DateTime<Utc>> {
        let offset = self.offset_us.load(Ordering::Relaxed);
        if offset == i64::MIN {
            return None;
        }
        DateTime::from_timestamp_micros(
            offset.saturating_add(self.since_anchor_us(deadline.instant())),
        )
    }
}
