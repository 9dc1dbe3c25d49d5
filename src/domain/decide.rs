//! The lease rules, as pure functions: from the resource's current row (if any), the request
//! and the store's clock, what happens.
//!
//! The embedded store decides with these functions inside its write transaction. PostgreSQL
//! must decide inside its own statements to stay atomic across instances, so it keeps the
//! same rules in SQL; the integration tests run one table of cases against these functions
//! and both stores, so the two spellings cannot drift apart.
//!
//! The order of the checks is the contract's: no row (`404`), then expiry (`409
//! lease-expired`, or `404` for release), then the owner, then the fence.

use chrono::{DateTime, Utc};

use super::{Acquisition, Fence, Owner};

/// The stored lease of a resource, live or expired, as a decision needs it.
#[derive(Debug, Clone, Copy)]
pub struct Current<'a> {
    pub owner: &'a str,
    pub fence: Fence,
    pub expires_at: DateTime<Utc>,
}

impl Current<'_> {
    /// A lease is expired from its expiry instant on: live only while `now < expires_at`.
    pub fn is_live(&self, now: DateTime<Utc>) -> bool {
        now < self.expires_at
    }

    fn is_held_by(&self, owner: &Owner) -> bool {
        self.owner == owner.as_str()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireVerdict {
    /// Take the lease with a new fence.
    Grant(Acquisition),
    /// A live lease of another owner: refuse, issue no fence.
    Held,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewVerdict {
    /// Extend the lease, keeping its fence.
    Renew,
    NotFound,
    Expired,
    OwnerMismatch,
    StaleFence {
        current: Fence,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseVerdict {
    /// Delete the lease.
    Release,
    /// No live lease: none, or an expired one.
    NotFound,
    NotOwner,
    StaleFence {
        current: Fence,
    },
}

pub fn acquire(current: Option<&Current<'_>>, owner: &Owner, now: DateTime<Utc>) -> AcquireVerdict {
    match current {
        None => AcquireVerdict::Grant(Acquisition::Fresh),
        Some(row) if !row.is_live(now) => AcquireVerdict::Grant(Acquisition::TakenOver),
        Some(row) if row.is_held_by(owner) => AcquireVerdict::Grant(Acquisition::Reacquired),
        Some(_) => AcquireVerdict::Held,
    }
}

pub fn renew(
    current: Option<&Current<'_>>,
    owner: &Owner,
    fence: Option<Fence>,
    now: DateTime<Utc>,
) -> RenewVerdict {
    match current {
        None => RenewVerdict::NotFound,
        Some(row) if !row.is_live(now) => RenewVerdict::Expired,
        Some(row) if !row.is_held_by(owner) => RenewVerdict::OwnerMismatch,
        Some(row) if fence.is_some_and(|f| f != row.fence) => {
            RenewVerdict::StaleFence { current: row.fence }
        }
        Some(_) => RenewVerdict::Renew,
    }
}

pub fn release(
    current: Option<&Current<'_>>,
    owner: &Owner,
    fence: Option<Fence>,
    now: DateTime<Utc>,
) -> ReleaseVerdict {
    match current {
        None => ReleaseVerdict::NotFound,
        Some(row) if !row.is_live(now) => ReleaseVerdict::NotFound,
        Some(row) if !row.is_held_by(owner) => ReleaseVerdict::NotOwner,
        Some(row) if fence.is_some_and(|f| f != row.fence) => {
            ReleaseVerdict::StaleFence { current: row.fence }
        }
        Some(_) => ReleaseVerdict::Release,
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(ms).unwrap()
    }

    fn owner(name: &str) -> Owner {
        Owner::parse(name).unwrap()
    }

    fn fence(n: i64) -> Fence {
        Fence::new(n).unwrap()
    }

    /// A lease of `a` with fence 7, expiring at t = 1000 ms.
    fn held_by_a() -> Current<'static> {
        Current {
            owner: "a",
            fence: fence(7),
            expires_at: at(1_000),
        }
    }

    #[test]
    fn a_lease_is_expired_from_its_expiry_instant() {
        let row = held_by_a();
        assert!(row.is_live(at(999)));
        assert!(!row.is_live(at(1_000)));
        assert!(!row.is_live(at(1_000) + TimeDelta::microseconds(1)));
    }

    #[test]
    fn acquire_at_the_boundary() {
        let row = held_by_a();
        assert_eq!(
            acquire(Some(&row), &owner("b"), at(999)),
            AcquireVerdict::Held
        );
        assert_eq!(
            acquire(Some(&row), &owner("b"), at(1_000)),
            AcquireVerdict::Grant(Acquisition::TakenOver)
        );
        assert_eq!(
            acquire(Some(&row), &owner("a"), at(999)),
            AcquireVerdict::Grant(Acquisition::Reacquired)
        );
        assert_eq!(
            acquire(Some(&row), &owner("a"), at(1_000)),
            AcquireVerdict::Grant(Acquisition::TakenOver)
        );
        assert_eq!(
            acquire(None, &owner("a"), at(0)),
            AcquireVerdict::Grant(Acquisition::Fresh)
        );
    }

    #[test]
    fn renew_checks_expiry_then_owner_then_fence() {
        let row = held_by_a();
        let live = at(999);
        let (a, b) = (owner("a"), owner("b"));
        assert_eq!(renew(None, &a, None, live), RenewVerdict::NotFound);
        assert_eq!(renew(Some(&row), &a, None, live), RenewVerdict::Renew);
        assert_eq!(
            renew(Some(&row), &a, Some(fence(7)), live),
            RenewVerdict::Renew
        );
        assert_eq!(
            renew(Some(&row), &a, Some(fence(8)), live),
            RenewVerdict::StaleFence { current: fence(7) }
        );
        assert_eq!(
            renew(Some(&row), &b, Some(fence(8)), live),
            RenewVerdict::OwnerMismatch
        );
        assert_eq!(
            renew(Some(&row), &a, Some(fence(7)), at(1_000)),
            RenewVerdict::Expired
        );
        assert_eq!(
            renew(Some(&row), &b, None, at(1_000)),
            RenewVerdict::Expired
        );
    }

    #[test]
    fn release_checks_expiry_then_owner_then_fence() {
        let row = held_by_a();
        let live = at(999);
        let (a, b) = (owner("a"), owner("b"));
        assert_eq!(release(None, &a, None, live), ReleaseVerdict::NotFound);
        assert_eq!(release(Some(&row), &a, None, live), ReleaseVerdict::Release);
        assert_eq!(
            release(Some(&row), &a, Some(fence(7)), live),
            ReleaseVerdict::Release
        );
        assert_eq!(
            release(Some(&row), &a, Some(fence(3)), live),
            ReleaseVerdict::StaleFence { current: fence(7) }
        );
        assert_eq!(
            release(Some(&row), &b, Some(fence(3)), live),
            ReleaseVerdict::NotOwner
        );
        assert_eq!(
            release(Some(&row), &a, None, at(1_000)),
            ReleaseVerdict::NotFound
        );
    }
}
