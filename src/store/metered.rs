//! A store that times every operation and counts the ones that got no answer
//! (`fencelock_store_seconds`, `fencelock_store_errors_total`), around either store.

use std::time::Duration;

use async_trait::async_trait;
use prometheus::{HistogramVec, IntCounterVec};

use super::{Deadline, LeaseStore, SharedStore, StoreError};
use crate::wake::{Changes, Watching};
use fencelock::domain::{
    AcquireOutcome, AcquireRequest, HistoryRequest, Inspection, Lease, LeaseHistory, LeasePage,
    ListRequest, ReleaseOutcome, ReleaseRequest, RenewOutcome, RenewRequest, ResourceName, Ticket,
};
use fencelock::metrics::{self, Registry, label};

/// The store families of one app.
#[derive(Clone)]
pub(crate) struct StoreMetrics {
    seconds: HistogramVec,
    errors: IntCounterVec,
}

impl StoreMetrics {
    pub(crate) fn register(registry: &Registry) -> Self {
        let metrics = Self {
            seconds: metrics::histogram(
                registry,
                &metrics::STORE_SECONDS,
                metrics::LATENCY_BUCKETS,
            ),
            errors: metrics::counter(registry, &metrics::STORE_ERRORS),
        };
        // Every kind is shown from the start, at 0, so that a rate over it is defined before
        // the first failure.
        for kind in [
            label::kind::UNAVAILABLE,
            label::kind::TIMEOUT,
            label::kind::INTERNAL,
        ] {
            metrics.errors.with_label_values(&[kind]);
        }
        metrics
    }

    /// The HTTP side stopped waiting for the store (see `routes::bounded`).
    pub(crate) fn timed_out(&self) {
        self.errors.with_label_values(&[label::kind::TIMEOUT]).inc();
    }

    fn failed(&self, error: &StoreError) {
        let kind = match error {
            StoreError::Unavailable(_)
            | StoreError::NotWritable(_)
            | StoreError::Misconfigured(_) => label::kind::UNAVAILABLE,
            StoreError::Internal(_) => label::kind::INTERNAL,
        };
        self.errors.with_label_values(&[kind]).inc();
    }
}

/// `inner` with every operation timed and every failure counted.
pub(crate) struct Metered {
    inner: SharedStore,
    metrics: StoreMetrics,
}

impl Metered {
    pub(crate) fn wrap(inner: SharedStore, metrics: StoreMetrics) -> SharedStore {
        std::sync::Arc::new(Self { inner, metrics })
    }

    /// Counts a failure of an operation that is not timed: a history read has no `op` label
    /// of its own, and `fencelock_store_seconds` keeps the label values dashboards know.
    async fn counted<T>(
        &self,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = operation.await;
        if let Err(e) = &result {
            self.metrics.failed(e);
        }
        result
    }

    async fn timed<T>(
        &self,
        op: &'static str,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        // The timer observes when dropped: an operation the HTTP side gave up on is timed
        // up to that moment too.
        let _timer = self.metrics.seconds.with_label_values(&[op]).start_timer();
        let result = operation.await;
        if let Err(e) = &result {
            self.metrics.failed(e);
        }
        result
    }
}

/// The `LeaseStore` impl of `Metered`: each listed operation is passed to `inner` and
/// timed under its `label::op`; the items after the list are written out as they are.
macro_rules! timed_operations {
    (
        $( $name:ident($($arg:ident: $ty:ty),*) -> $out:ty = $op:ident; )*
        @rest $($rest:tt)*
    ) => {
        #[async_trait]
        impl LeaseStore for Metered {
            $(
                async fn $name(&self, $($arg: $ty),*) -> Result<$out, StoreError> {
                    self.timed(label::op::$op, self.inner.$name($($arg),*)).await
                }
            )*
            $($rest)*
        }
    };
}

timed_operations! {
    acquire(req: &AcquireRequest, deadline: Deadline) -> AcquireOutcome = ACQUIRE;
    inspect(resource: &ResourceName) -> Inspection = INSPECT;
    renew(req: &RenewRequest, deadline: Deadline) -> RenewOutcome = RENEW;
    release(req: &ReleaseRequest, deadline: Deadline) -> ReleaseOutcome = RELEASE;
    // Timed per batch: `purge_expired` (the trait's own) calls this once per batch.
    purge_batch(grace: Duration, limit: u64) -> u64 = PURGE;
    // The history's purge is a purge too.
    purge_history_batch(retention: Duration, limit: u64) -> u64 = PURGE;
    count_live() -> u64 = COUNT;
    list(req: &ListRequest) -> LeasePage = LIST;
    ping() -> () = PING;
    enqueue(req: &AcquireRequest, wait: Duration) -> Ticket = ENQUEUE;
    dequeue(req: &AcquireRequest, ticket: Ticket) -> Option<Lease> = DEQUEUE;
    @rest
    async fn watch(
        &self,
        resource: &ResourceName,
        timeout: Duration,
    ) -> Result<Watching, StoreError> {
        self.timed(label::op::INSPECT, self.inner.watch(resource, timeout))
            .await
    }

    async fn history(&self, req: &HistoryRequest) -> Result<LeaseHistory, StoreError> {
        self.counted(self.inner.history(req)).await
    }

    async fn beat(&self, tickets: &[Ticket]) -> Result<(), StoreError> {
        self.counted(self.inner.beat(tickets)).await
    }

    // Trimming the history is a purge too.
    async fn trim_history(&self, keep: u64, recent: Duration) -> Result<u64, StoreError> {
        self.timed(label::op::PURGE, self.inner.trim_history(keep, recent))
            .await
    }

    fn changes(&self) -> std::sync::Arc<Changes> {
        self.inner.changes()
    }

    fn register_metrics(&self, registry: &Registry) {
        self.inner.register_metrics(registry);
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}
