//! The lease families: what this instance answered to acquire, renew and release, and what
//! those answers tell about leases (how long they were held, whether their holder lost
//! them to expiry). Counted once the answer is known, store errors included.

use prometheus::{Histogram, IntCounter, IntCounterVec};

use crate::store::metered::StoreMetrics;
use fencelock::domain::{AcquireOutcome, Acquisition, ReleaseOutcome, RenewOutcome};
use fencelock::http::ApiError;
use fencelock::metrics::label::{self, Outcome};
use fencelock::metrics::{self, Registry};

pub(crate) struct LeaseMetrics {
    acquire: IntCounterVec,
    renew: IntCounterVec,
    release: IntCounterVec,
    held: Histogram,
    expired_while_held: IntCounter,
    /// For the timeouts only the HTTP side sees.
    pub store: StoreMetrics,
}

impl LeaseMetrics {
    pub(crate) fn register(registry: &Registry, store: StoreMetrics) -> Self {
        use label::Outcome::*;
        let counters = [
            (
                &metrics::ACQUIRE,
                &[Acquired, Reacquired, TakenOver, Held, Error][..],
            ),
            (
                &metrics::RENEW,
                &[Renewed, NotFound, Expired, OwnerMismatch, StaleFence, Error][..],
            ),
            (
                &metrics::RELEASE,
                &[Released, NotFound, NotOwner, StaleFence, Error][..],
            ),
        ]
        .map(|(family, outcomes)| {
            let counter = metrics::counter(registry, family);
            // Every outcome is shown from the start, at 0.
            for outcome in outcomes {
                counter.with_label_values(&[outcome.as_str()]);
            }
            counter
        });
        let [acquire, renew, release] = counters;
        Self {
            acquire,
            renew,
            release,
            held: metrics::plain_histogram(registry, &metrics::LEASE_HELD, metrics::HELD_BUCKETS),
            expired_while_held: metrics::plain_counter(registry, &metrics::EXPIRED_WHILE_HELD),
            store,
        }
    }
}

/// The answer to a lock write, counted `into` its family once it is known.
pub(crate) trait Counted {
    fn count(into: &LeaseMetrics, answer: Result<&Self, &ApiError>);
}

impl Counted for AcquireOutcome {
    fn count(into: &LeaseMetrics, answer: Result<&Self, &ApiError>) {
        let outcome = match answer {
            Ok(outcome) => metrics::acquire_outcome(outcome),
            Err(_) => Some(Outcome::Error),
        };
        if let Some(outcome) = outcome {
            into.acquire.with_label_values(&[outcome.as_str()]).inc();
        }
        if let Ok(AcquireOutcome::Acquired {
            how: Acquisition::TakenOver,
            ..
        }) = answer
        {
            into.expired_while_held.inc();
        }
    }
}

impl Counted for RenewOutcome {
    fn count(into: &LeaseMetrics, answer: Result<&Self, &ApiError>) {
        let outcome = answer.map_or(Outcome::Error, metrics::renew_outcome);
        into.renew.with_label_values(&[outcome.as_str()]).inc();
    }
}

impl Counted for ReleaseOutcome {
    fn count(into: &LeaseMetrics, answer: Result<&Self, &ApiError>) {
        let outcome = answer.map_or(Outcome::Error, metrics::release_outcome);
        into.release.with_label_values(&[outcome.as_str()]).inc();
        if let Ok(ReleaseOutcome::Released {
            acquired_at,
            released_at,
            ..
        }) = answer
        {
            // Never negative: both times come from the store's clock in one step.
            let held = (*released_at - *acquired_at).to_std().unwrap_or_default();
            into.held.observe(held.as_secs_f64());
        }
    }
}
