//! What the stores are asked and what they answer. Outcomes are enums, not errors: "held by
//! someone else" or "expired" are ordinary answers. Store errors mean only "could not find out".

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Fence, LockDelay, Owner, ResourceName, Ticket, Ttl, WaitFor};

/// A lease as the store holds it, with the store's clock reading at the moment it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub resource: ResourceName,
    pub owner: Owner,
    pub fence: Fence,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// The store's clock when it made this answer; `expires_in_ms` is measured from here so
    /// that no client ever compares its own wall clock with the store's.
    pub observed_at: DateTime<Utc>,
}

/// Time left on the store's clock: the milliseconds from `observed_at` (when the store read
/// the lease) to `expires_at`; `0` once past it. Every lock object's `expires_in_ms`, whoever
/// is shown it (a [`Lease`] to its holder, a [`ListedLease`](super::ListedLease) in a list).
pub fn time_left_ms(expires_at: DateTime<Utc>, observed_at: DateTime<Utc>) -> i64 {
    (expires_at - observed_at).num_milliseconds().max(0)
}

#[derive(Debug, Clone)]
pub struct AcquireRequest {
    pub resource: ResourceName,
    pub owner: Owner,
    pub ttl: Ttl,
    /// Kept with the lease: when it ends by expiry, no other owner takes the resource until
    /// this long after. A renewal keeps it; a re-acquisition takes the new request's.
    pub lock_delay: LockDelay,
    /// The bearer token the request came with, if the server checks tokens: the lease
    /// records it, and its quota is kept in the same atomic step as the grant.
    pub token: Option<TokenQuota>,
    /// How long the request may wait while another owner holds the resource (`wait_ms`).
    /// Stores ignore it: waiting happens above them (the lease server's `waiting` module).
    pub wait: WaitFor,
    /// The caller's place in the resource's queue, while it waits: the store grants only to
    /// the head of a non-empty queue, and to a request without a ticket only when nobody
    /// waits.
    pub ticket: Option<Ticket>,
}

/// Who took a lease, as the store records it, and how many live leases that token may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenQuota {
    /// The token's name (never its secret).
    pub name: String,
    /// `None`: no limit.
    pub max_leases: Option<u32>,
}

#[derive(Debug, Clone)]
pub struct RenewRequest {
    pub resource: ResourceName,
    pub owner: Owner,
    pub ttl: Ttl,
    pub fence: Option<Fence>,
}

#[derive(Debug, Clone)]
pub struct ReleaseRequest {
    pub resource: ResourceName,
    pub owner: Owner,
    pub fence: Option<Fence>,
}

/// How a successful acquisition came about. Only names the lease event (logs, metrics);
/// the decision itself never depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquisition {
    /// No row for the resource (never taken, released or purged).
    Fresh,
    /// The same owner held a live lease and acquired again.
    Reacquired,
    /// An expired lease was replaced.
    TakenOver,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    Acquired {
        lease: Lease,
        how: Acquisition,
    },
    /// A live lease of another owner exists, another owner's lease expired less than its
    /// lock delay ago, or others wait for the resource ahead of the caller.
    Held {
        /// Time, by the store's clock, until the caller might get the resource without
        /// anyone announcing a change: the end of the live lease's lock delay (its expiry,
        /// without one), or when the queue ahead of it may change. Zero when unknown or past.
        /// Waiters arm a timer on it.
        free_in: Duration,
        /// Set when the refusal is a lock delay (another owner's lease expired less than its
        /// `lock_delay_ms` ago): when the delay ends, by the store's clock.
        delayed_until: Option<DateTime<Utc>>,
    },
    /// The request's token already holds its `max_leases` live leases of other resources;
    /// nothing was written and no fence issued.
    QuotaExceeded {
        max_leases: u32,
    },
}

/// What a look at a resource finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inspection {
    Live(Lease),
    /// No live lease, but another owner's lease expired less than its lock delay ago: no one
    /// else can take the resource before `until` (the store's clock).
    Delayed {
        until: DateTime<Utc>,
    },
    /// No lease, or one that expired and is past its lock delay.
    Absent,
}

impl Inspection {
    /// The live lease, if there is one.
    pub fn live(self) -> Option<Lease> {
        match self {
            Self::Live(lease) => Some(lease),
            Self::Delayed { .. } | Self::Absent => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewOutcome {
    Renewed(Lease),
    /// No row at all for the resource.
    NotFound,
    /// The row exists but has expired; it is never renewed.
    Expired,
    /// A live lease of another owner.
    OwnerMismatch,
    /// The owner matches but the given fence is not the lease's.
    StaleFence {
        current: Fence,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lease is gone. Both times are on the store's clock, read in the same step that
    /// deleted it.
    Released {
        fence: Fence,
        acquired_at: DateTime<Utc>,
        released_at: DateTime<Utc>,
    },
    /// No live lease (no row, or an expired one).
    NotFound,
    /// A live lease of another owner.
    NotOwner,
    /// The owner matches but the given fence is not the lease's.
    StaleFence { current: Fence },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_is_measured_on_the_store_clock_and_never_negative() {
        let at = |ms| DateTime::from_timestamp_millis(ms).unwrap();
        assert_eq!(time_left_ms(at(5_000), at(1_000)), 4_000);
        assert_eq!(time_left_ms(at(5_000), at(5_000)), 0);
        assert_eq!(time_left_ms(at(5_000), at(9_000)), 0);
    }
}
