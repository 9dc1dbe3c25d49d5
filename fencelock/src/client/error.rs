//! What can go wrong when talking to the lease server, sorted by what the caller should do.

use std::fmt;

/// The error of every client operation.
///
/// The variants are sorted by the *remedy*, not by the HTTP status, because that is what a
/// worker has to decide on:
///
/// - [`Error::Held`]: someone else holds the lock. Try again later ([`is_retryable`]).
/// - [`Error::Unavailable`]: the server could not be reached or could not answer. The outcome
///   of the request is unknown; try again later ([`is_retryable`]).
/// - [`Error::LeaseLost`]: the server says this caller no longer holds the lease. Stop the
///   protected work at once; retrying the same request cannot help.
/// - [`Error::Rejected`], [`Error::InvalidInput`], [`Error::Config`], [`Error::Protocol`]:
///   a bug (in the caller, its configuration, or the server). Never retried.
///
/// It is `Clone` so that one failure can be handed to several watchers of a lease.
///
/// [`is_retryable`]: Error::is_retryable
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Contention: a live lease of another owner exists (`acquired: false`). Not a failure of
    /// the server: acquire never blocks, so the caller retries later, with backoff.
    #[error("`{resource}` is held by another owner")]
    Held {
        /// The resource that is held.
        resource: String,
    },
    /// The server is unreachable or cannot answer now: connection refused, timeout, a `5xx`
    /// (such as `503 store-unavailable`), `408`, `429`, or a body that could not be read.
    ///
    /// The request may or may not have taken effect. In particular an acquire that ends like
    /// this may have succeeded: retry it *with the same owner*, which re-acquires.
    #[error("the lease server is unavailable: {0}")]
    Unavailable(String),
    /// The caller does not hold the lease (any more): renew or release was refused with
    /// `404` or `409` (or `403` for release), or a [`Lease`](super::Lease) could not confirm
    /// a renewal before its expiry. Whatever the lease protected must stop now.
    #[error("the lease is lost: {reason}")]
    LeaseLost {
        /// Why the lease is known (or must be assumed) to be lost.
        reason: LossReason,
    },
    /// The server refused the request as invalid (a `4xx` other than the ones above, e.g.
    /// `422 validation-failed` for `ttl_seconds: 0`). A caller bug; `problem` is the server's
    /// RFC 9457 document (or the raw body as a JSON string if it was not JSON).
    #[error("the server rejected the request with {status}: {problem}")]
    Rejected {
        /// The HTTP status code.
        status: u16,
        /// The problem document the server sent.
        problem: serde_json::Value,
    },
    /// The request cannot be expressed over HTTP, so it was not sent. The only case is a
    /// resource named `.` or `..`, which every URL parser folds away as a path step.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The client could not be built (bad base URL, TLS set-up failure).
    #[error("client configuration: {0}")]
    Config(String),
    /// An answer that does not follow the HTTP contract (an unexpected status or body). The
    /// server, or something between it and the client, is not a fencelock server.
    #[error("the server's answer breaks the protocol: {0}")]
    Protocol(String),
}

impl Error {
    /// True for the errors that a later attempt of the same request may cure: contention
    /// ([`Error::Held`]) and outages ([`Error::Unavailable`]). Everything else is final.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Held { .. } | Self::Unavailable(_))
    }

    /// True if the caller has lost (or never had) the lease: stop the protected work.
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Self::LeaseLost { .. })
    }
}

/// Why a lease is lost. Every variant except [`Released`](LossReason::Released) and
/// [`Dropped`](LossReason::Dropped) means: stop the protected work now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// `404 not-found`: the server has no lease for the resource (released, expired and not
    /// renewable, or purged).
    NotFound,
    /// `409 lease-expired`: the lease passed its expiry; it is never renewed, even if nobody
    /// took it over. Acquire again for a new fence.
    Expired,
    /// `409 owner-mismatch` (renew) or `403 forbidden` (release): another owner holds a live
    /// lease on the resource now.
    OwnerMismatch,
    /// `409 stale-fence`: the same owner holds a newer lease (with `current_fence`) than the
    /// one named.
    StaleFence {
        /// The fence of the live lease, when the server reported it.
        current_fence: Option<i64>,
    },
    /// Another `409` the client does not know by name. The contract says any `409` from
    /// renew means the lease is lost.
    Conflict {
        /// The problem `type` slug the server sent.
        problem_type: String,
    },
    /// No renewal was confirmed before the lease's expiry (less a safety margin) came near:
    /// the server may already consider it expired, so the holder must assume so.
    Unconfirmed {
        /// Why the last renewal attempt failed.
        last_error: String,
    },
    /// The holder released the lease with [`Lease::release`](super::Lease::release).
    Released,
    /// The [`Lease`](super::Lease) handle was dropped; it no longer renews.
    Dropped,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotFound => f.write_str("the server has no lease for the resource"),
            Self::Expired => f.write_str("the lease expired"),
            Self::OwnerMismatch => f.write_str("another owner holds the lease"),
            Self::StaleFence {
                current_fence: Some(fence),
            } => write!(f, "a newer lease (fence {fence}) of the same owner exists"),
            Self::StaleFence {
                current_fence: None,
            } => f.write_str("a newer lease of the same owner exists"),
            Self::Conflict { problem_type } => write!(f, "the server answered 409 {problem_type}"),
            Self::Unconfirmed { last_error } => write!(
                f,
                "no renewal was confirmed before the lease's expiry ({last_error})"
            ),
            Self::Released => f.write_str("the holder released the lease"),
            Self::Dropped => f.write_str("the lease handle was dropped"),
        }
    }
}
