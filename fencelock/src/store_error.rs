//! How a database failure is sorted: the store (the lease server's, or the table the guard
//! keeps in a protected service's database) could not answer, and whether a retry may help.
//!
//! Never used for an answer such as "held by another owner" or "stale fence": those are
//! outcomes, not failures. The HTTP toolkit maps each kind onto its problem response
//! (`503 store-unavailable` with `Retry-After`, or `500 internal`).

/// The store could not answer. Never used for an answer such as "held by another owner".
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Unreachable, timed out, or busy: the outcome is unknown and a retry may succeed.
    #[error("store unavailable: {0:#}")]
    Unavailable(anyhow::Error),
    /// The store answers but refuses writes: a read-only file, file system or database (a
    /// PostgreSQL hot standby), or a full disk. Nothing was written. It heals only when an
    /// operator acts, so it is reported loudly, but it is still a `503`: the same request may
    /// succeed once the store is writable again.
    #[error("store refuses writes: {0:#}")]
    NotWritable(anyhow::Error),
    /// The store cannot be used as configured, and waiting will not change that: the login is
    /// refused, the database does not exist, the server wants TLS, or the schema there is not
    /// fencelock's. Answered `503` (and tried again on every request, so fixing it heals the
    /// server), and reported loudly with the store's own words.
    #[error("store misconfigured: {0:#}")]
    Misconfigured(anyhow::Error),
    /// A bug: retrying will not help.
    #[error("store error: {0:#}")]
    Internal(anyhow::Error),
}

impl StoreError {
    pub fn unavailable(message: impl std::fmt::Display) -> Self {
        Self::Unavailable(anyhow::anyhow!("{message}"))
    }

    /// The same kind of error with the same message, for each of several requests that one
    /// failure (a failed batch commit) answers.
    pub fn same_kind(&self) -> Self {
        let cause = |e: &anyhow::Error| anyhow::anyhow!("{e:#}");
        match self {
            Self::Unavailable(e) => Self::Unavailable(cause(e)),
            Self::NotWritable(e) => Self::NotWritable(cause(e)),
            Self::Misconfigured(e) => Self::Misconfigured(cause(e)),
            Self::Internal(e) => Self::Internal(cause(e)),
        }
    }

    /// A stored value this build cannot read back (`what`: "owner", "fence"...): a row
    /// written by something else, or changed by hand.
    pub fn corrupt(what: &str, cause: impl std::fmt::Display) -> Self {
        Self::Internal(anyhow::anyhow!("stored {what}: {cause}"))
    }

    /// The answer for work that was not done because its request's deadline had passed.
    pub fn too_late() -> Self {
        Self::unavailable("the request's deadline passed before the store acted on it")
    }
}
