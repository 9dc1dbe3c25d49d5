//! Every metric fencelock exposes, in one place: one table of the families (name, label names,
//! help text), the only label values there are (API.md, *Metrics*), and how domain outcomes
//! map onto them.
//!
//! Metrics live in a [`Registry`] per application, never in a process-wide one: a process
//! that runs several apps (the tests run a server per test) keeps each app's counts apart,
//! and each app's `GET /metrics` shows its own answers only.
//!
//! No label value ever comes from a request's content: no resource name, owner or fence
//! (unbounded, and owners are secret). The HTTP `route` label is the route *pattern*, and a
//! method HTTP does not define is counted as [`label::OTHER_METHOD`].

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};
pub use prometheus::{Registry, TEXT_FORMAT};

use crate::domain::{AcquireOutcome, Acquisition, ReleaseOutcome, RenewOutcome};
use label::Outcome;

/// Declares each `NAME: "metric name" [label names], "help text";` as a `pub const` [`Family`]
/// whose documentation is its help text.
macro_rules! families {
    ($($family:ident: $name:literal [$($label:literal),*], $help:literal;)*) => {$(
        #[doc = $help]
        pub const $family: Family = Family {
            name: $name,
            help: $help,
            labels: &[$($label),*],
        };
    )*};
}

/// One metric family: its name, its help text and its label names.
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub labels: &'static [&'static str],
}

impl Family {
    fn opts(&self) -> Opts {
        Opts::new(self.name, self.help)
    }

    fn histogram_opts(&self, buckets: &[f64]) -> HistogramOpts {
        HistogramOpts::new(self.name, self.help).buckets(buckets.to_vec())
    }
}

// Every family, one row each: `NAME: "metric name" [label names], "help text";`.
families! {
    ACQUIRE: "fencelock_acquire_total" ["outcome"],
        "Acquire requests answered, by outcome.";
    RENEW: "fencelock_renew_total" ["outcome"],
        "Renew requests answered, by outcome.";
    RELEASE: "fencelock_release_total" ["outcome"],
        "Release requests answered, by outcome.";
    LEASE_HELD: "fencelock_lease_held_seconds" [],
        "How long released leases were held, from acquisition to release (store clock).";
    EXPIRED_WHILE_HELD: "fencelock_leases_expired_while_held_total" [],
        "Leases taken over after expiry without a release: their holder crashed, or paused past its TTL.";
    LIVE_LEASES: "fencelock_live_leases" [],
        "Live leases in the store, as last sampled.";
    STORE_SECONDS: "fencelock_store_seconds" ["op"],
        "Time taken by store operations, by operation.";
    STORE_ERRORS: "fencelock_store_errors_total" ["kind"],
        "Store operations that got no answer, by kind.";
    STORE_BATCH_SIZE: "fencelock_store_batch_size" [],
        "Lock requests PostgreSQL decided together in one statement and one commit, per batch.";
    STORE_BATCHES_REFUSED: "fencelock_store_batches_refused_total" [],
        "PostgreSQL batches the database refused as a whole (nothing committed); their requests were decided one by one.";
    HTTP_REQUESTS: "fencelock_http_requests_total" ["route", "method", "status"],
        "HTTP requests answered, by route pattern, method and status.";
    HTTP_SECONDS: "fencelock_http_request_seconds" ["route", "method"],
        "Time from a request's arrival to its answer, by route pattern and method.";
    BUILD_INFO: "fencelock_build_info" ["version", "store"],
        "Always 1; the labels say which build runs on which store.";
    GUARD_WRITES: "fencelock_guard_writes_total" ["outcome"],
        "Writes the fence guard decided on, by outcome.";
    AUTH_FAILURES: "fencelock_auth_failures_total" ["reason"],
        "Lock requests refused by the bearer token check, by reason.";
}

/// The only values each label takes (a label's name is in the rows of its families).
///
/// `outcome`, the label of four families, is an enum: the mappings onto it say in their
/// type what they return, and a match on an answer cannot fall back on another label's value.
pub mod label {
    /// `reason` of `fencelock_auth_failures_total`. Never a token's name.
    pub mod reason {
        /// No `Authorization: Bearer` header (`401`).
        pub const MISSING: &str = "missing";
        /// A secret no token has (`401`).
        pub const UNKNOWN: &str = "unknown";
        /// Outside the token's prefixes, or a permission it lacks (`403`).
        pub const SCOPE: &str = "scope";
        /// At its `max_leases` (`429`).
        pub const QUOTA: &str = "quota";
        pub const ALL: [&str; 4] = [MISSING, UNKNOWN, SCOPE, QUOTA];
    }

    /// `outcome` of acquire, renew, release and the guard's writes.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Outcome {
        Acquired,
        Reacquired,
        TakenOver,
        Held,
        Renewed,
        NotFound,
        Expired,
        OwnerMismatch,
        StaleFence,
        Released,
        NotOwner,
        /// The store gave no answer (unavailable, timed out, or a bug): the client was told
        /// `503` or `500`.
        Error,
        Admitted,
        Stale,
        /// The guard refused the write's `Fencing-Token`: not signed by its keys for the key
        /// written (`403 invalid-fence-token`).
        InvalidToken,
    }

    impl Outcome {
        /// The label value.
        pub const fn as_str(self) -> &'static str {
            match self {
                Self::Acquired => "acquired",
                Self::Reacquired => "reacquired",
                Self::TakenOver => "taken_over",
                Self::Held => "held",
                Self::Renewed => "renewed",
                Self::NotFound => "not_found",
                Self::Expired => "expired",
                Self::OwnerMismatch => "owner_mismatch",
                Self::StaleFence => "stale_fence",
                Self::Released => "released",
                Self::NotOwner => "not_owner",
                Self::Error => "error",
                Self::Admitted => "admitted",
                Self::Stale => "stale",
                Self::InvalidToken => "invalid_token",
            }
        }
    }

    /// `op` of `fencelock_store_seconds`: one per store operation.
    pub mod op {
        pub const ACQUIRE: &str = "acquire";
        pub const RENEW: &str = "renew";
        pub const RELEASE: &str = "release";
        pub const INSPECT: &str = "inspect";
        pub const PING: &str = "ping";
        pub const PURGE: &str = "purge";
        pub const COUNT: &str = "count";
        /// One page of `GET /locks`.
        pub const LIST: &str = "list";
        /// A waiter taking its place in a resource's queue, and leaving it.
        pub const ENQUEUE: &str = "enqueue";
        pub const DEQUEUE: &str = "dequeue";
    }

    /// `kind` of `fencelock_store_errors_total`.
    pub mod kind {
        /// Unreachable, busy, refusing writes, or the store's own deadline refusal.
        pub const UNAVAILABLE: &str = "unavailable";
        /// The HTTP side stopped waiting for the store.
        pub const TIMEOUT: &str = "timeout";
        /// A bug or a broken schema.
        pub const INTERNAL: &str = "internal";
    }

    /// `store` of `fencelock_build_info`.
    pub mod store {
        pub const POSTGRES: &str = "postgres";
        pub const SQLITE: &str = "sqlite";
    }

    /// `route` of a request no route matched.
    pub const UNMATCHED_ROUTE: &str = "unmatched";
    /// `method` of a request whose method HTTP does not define.
    pub const OTHER_METHOD: &str = "other";
}

/// Buckets of the request and store latency histograms, in seconds: 1 ms to 10 s.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Buckets of [`LEASE_HELD`], in seconds: 100 ms to a day (the default maximum TTL).
pub const HELD_BUCKETS: &[f64] = &[
    0.1, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0,
];

/// Buckets of [`STORE_BATCH_SIZE`], in requests: powers of two up to the largest batch
/// `--pg-batch-max` allows.
pub const BATCH_SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// Registers `family` as a counter in `registry`.
///
/// # Panics
/// When `family` is registered in `registry` already: a bug in how an app builds its
/// metrics, found by any test that builds the app.
pub fn counter(registry: &Registry, family: &Family) -> IntCounterVec {
    register(
        registry,
        family,
        IntCounterVec::new(family.opts(), family.labels),
    )
}

/// Registers `family` as a counter without labels.
pub fn plain_counter(registry: &Registry, family: &Family) -> IntCounter {
    register(registry, family, IntCounter::with_opts(family.opts()))
}

/// Registers `family` as a gauge without labels.
pub fn gauge(registry: &Registry, family: &Family) -> IntGauge {
    register(registry, family, IntGauge::with_opts(family.opts()))
}

/// Registers `family` as an info gauge: one series, at 1, with `values` for its labels.
pub fn info(registry: &Registry, family: &Family, values: &[&str]) {
    let gauge = IntGaugeVec::new(family.opts(), family.labels);
    register(registry, family, gauge)
        .with_label_values(values)
        .set(1);
}

/// Registers `family` as a histogram with `buckets` (seconds).
pub fn histogram(registry: &Registry, family: &Family, buckets: &[f64]) -> HistogramVec {
    let histogram = HistogramVec::new(family.histogram_opts(buckets), family.labels);
    register(registry, family, histogram)
}

/// Registers `family` as a histogram without labels, with `buckets` (seconds).
pub fn plain_histogram(registry: &Registry, family: &Family, buckets: &[f64]) -> Histogram {
    register(
        registry,
        family,
        Histogram::with_opts(family.histogram_opts(buckets)),
    )
}

/// Builds `family` as a histogram without labels that is in no registry yet: for a collector
/// that outlives one app (a store that several apps may share), added to each app's
/// registry with [`add`].
pub fn detached_histogram(family: &Family, buckets: &[f64]) -> Histogram {
    Histogram::with_opts(family.histogram_opts(buckets))
        .unwrap_or_else(|e| panic!("building {}: {e}", family.name))
}

/// Builds `family` as a counter without labels that is in no registry yet (see
/// [`detached_histogram`]).
pub fn detached_counter(family: &Family) -> IntCounter {
    IntCounter::with_opts(family.opts()).unwrap_or_else(|e| panic!("building {}: {e}", family.name))
}

/// Adds `collector`, built for `family`, to `registry`.
///
/// # Panics
/// As [`counter`], when `family` is registered in `registry` already.
pub fn add<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    family: &Family,
    collector: &C,
) {
    register(registry, family, Ok(collector.clone()));
}

/// Registers the collector built for `family`; a family that cannot be built (a bad name
/// or label) is the same kind of bug as one registered twice.
fn register<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    family: &Family,
    collector: prometheus::Result<C>,
) -> C {
    let collector = collector.unwrap_or_else(|e| panic!("building {}: {e}", family.name));
    registry
        .register(Box::new(collector.clone()))
        .unwrap_or_else(|e| panic!("registering {}: {e}", family.name));
    collector
}

/// The text exposition of everything in `registry` (content type [`TEXT_FORMAT`]).
pub fn render(registry: &Registry) -> String {
    use prometheus::Encoder as _;
    let mut text = Vec::new();
    // Encoding into memory fails only for metrics that could not have been registered.
    if let Err(e) = prometheus::TextEncoder::new().encode(&registry.gather(), &mut text) {
        tracing::error!(error = %e, "encoding metrics failed");
    }
    String::from_utf8(text).unwrap_or_default()
}

/// The `outcome` of an acquire answer; `None` for a refusal by quota, which is an auth
/// failure ([`AUTH_FAILURES`]), not one of the contract's acquire outcomes.
pub fn acquire_outcome(outcome: &AcquireOutcome) -> Option<Outcome> {
    Some(match outcome {
        AcquireOutcome::Acquired { how, .. } => match how {
            Acquisition::Fresh => Outcome::Acquired,
            Acquisition::Reacquired => Outcome::Reacquired,
            Acquisition::TakenOver => Outcome::TakenOver,
        },
        AcquireOutcome::Held { .. } => Outcome::Held,
        AcquireOutcome::QuotaExceeded { .. } => return None,
    })
}

/// The `outcome` of a renew answer.
pub fn renew_outcome(outcome: &RenewOutcome) -> Outcome {
    match outcome {
        RenewOutcome::Renewed(_) => Outcome::Renewed,
        RenewOutcome::NotFound => Outcome::NotFound,
        RenewOutcome::Expired => Outcome::Expired,
        RenewOutcome::OwnerMismatch => Outcome::OwnerMismatch,
        RenewOutcome::StaleFence { .. } => Outcome::StaleFence,
    }
}

/// The `outcome` of a release answer.
pub fn release_outcome(outcome: &ReleaseOutcome) -> Outcome {
    match outcome {
        ReleaseOutcome::Released { .. } => Outcome::Released,
        ReleaseOutcome::NotFound => Outcome::NotFound,
        ReleaseOutcome::NotOwner => Outcome::NotOwner,
        ReleaseOutcome::StaleFence { .. } => Outcome::StaleFence,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_app_registry_shows_only_its_own_counts() {
        let (one, two) = (Registry::new(), Registry::new());
        let a = counter(&one, &ACQUIRE);
        let _b = counter(&two, &ACQUIRE);
        a.with_label_values(&[Outcome::Held.as_str()]).inc();
        assert!(render(&one).contains(r#"fencelock_acquire_total{outcome="held"} 1"#));
        assert!(!render(&two).contains("held"));
    }
}
