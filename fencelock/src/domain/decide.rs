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

use super::{Acquisition, Fence, LockDelay, Owner, ReleaseOutcome, RenewOutcome};

/// The stored lease of a resource, live or expired, as a decision needs it.
#[derive(Debug, Clone, Copy)]
pub struct Current<'a> {
    pub owner: &'a str,
    pub fence: Fence,
    pub expires_at: DateTime<Utc>,
    /// The lock delay the lease was acquired with.
    pub lock_delay: LockDelay,
}

impl Current<'_> {
    /// A lease is expired from its expiry instant on: live only while `now < expires_at`.
    pub fn is_live(&self, now: DateTime<Utc>) -> bool {
        now < self.expires_at
    }

    /// Whether another owner may take the resource at `now`: once the lease has expired and
    /// its lock delay has passed too (`now >= expires_at + lock_delay`).
    pub fn is_free_for_others(&self, now: DateTime<Utc>) -> bool {
        now >= self.lock_delay.free_at(self.expires_at)
    }

    fn is_held_by(&self, owner: &Owner) -> bool {
        self.owner == owner.as_str()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireVerdict {
    /// Take the lease with a new fence.
    Grant(Acquisition),
    /// A live lease of another owner, or one inside its lock delay: refuse, issue no fence.
    Held,
}

/// Renew and release answer `Ok(())` when the store is to go ahead, and otherwise the
/// store's answer for the refusal.
pub type Decision<Refusal> = Result<(), Refusal>;

/// The lease's own owner may always acquire again (re-acquisition while live, a new lease
/// after expiry, lock delay or not); another owner only once the lease has expired and its
/// lock delay has passed.
pub fn acquire(current: Option<&Current<'_>>, owner: &Owner, now: DateTime<Utc>) -> AcquireVerdict {
    match current {
        None => AcquireVerdict::Grant(Acquisition::Fresh),
        Some(row) if row.is_held_by(owner) && row.is_live(now) => {
            AcquireVerdict::Grant(Acquisition::Reacquired)
        }
        Some(row) if row.is_held_by(owner) || row.is_free_for_others(now) => {
            AcquireVerdict::Grant(Acquisition::TakenOver)
        }
        Some(_) => AcquireVerdict::Held,
    }
}

/// Whether `owner`'s acquisition goes ahead of the resource's queue of waiters: while the
/// lease is live or inside its lock delay, nobody else may take the resource, the waiters
/// included, and its own owner may acquire it again (API.md, *Lock delay*). Once it is free
/// for others, it goes to the head of the queue.
pub fn passes_queue(current: Option<&Current<'_>>, owner: &Owner, now: DateTime<Utc>) -> bool {
    current.is_some_and(|row| row.is_held_by(owner) && !row.is_free_for_others(now))
}

/// Whether a token that holds `others` live leases of resources other than the one it asks
/// for may take one more. A re-acquisition of a lease it holds is not among `others`, so it
/// never counts twice. Checked before [`acquire`]: a token at its quota is refused whoever
/// holds the resource.
pub fn within_quota(others: u64, max_leases: Option<u32>) -> bool {
    max_leases.is_none_or(|max| others < u64::from(max))
}

/// Renew and release make the same checks, [`holder`]'s; each answers a refusal with its
/// own outcome ([`HolderRefusal`]). Whether to extend the lease (keeping its fence), or why
/// not: `renew(...)` deciding a [`RenewOutcome`].
pub use holder as renew;
/// Whether to delete the lease, or why not (an expired lease counts as none):
/// `release(...)` deciding a [`ReleaseOutcome`].
pub use holder as release;

/// How an operation on the holder's lease answers each refusal of [`holder`].
pub trait HolderRefusal: Sized {
    /// No row for the resource.
    const NONE: Self;
    /// A row whose lease has expired: unless the operation says otherwise, no lease at all.
    const EXPIRED: Self = Self::NONE;
    /// A live lease of another owner.
    const OTHER_OWNER: Self;
    /// The owner's lease, but the fence given is not the lease's (the argument).
    const STALE: fn(Fence) -> Self;
}

impl HolderRefusal for RenewOutcome {
    const NONE: Self = Self::NotFound;
    const EXPIRED: Self = Self::Expired;
    const OTHER_OWNER: Self = Self::OwnerMismatch;
    const STALE: fn(Fence) -> Self = |current| Self::StaleFence { current };
}

impl HolderRefusal for ReleaseOutcome {
    const NONE: Self = Self::NotFound;
    const OTHER_OWNER: Self = Self::NotOwner;
    const STALE: fn(Fence) -> Self = |current| Self::StaleFence { current };
}

/// The checks renew and release share, in the contract's order: a lease, live, of this
/// owner, and (when given) of this fence.
pub fn holder<R: HolderRefusal>(
    current: Option<&Current<'_>>,
    owner: &Owner,
    fence: Option<Fence>,
    now: DateTime<Utc>,
) -> Decision<R> {
    match current {
        None => Err(R::NONE),
        Some(row) if !row.is_live(now) => Err(R::EXPIRED),
        Some(row) if !row.is_held_by(owner) => Err(R::OTHER_OWNER),
        Some(row) if fence.is_some_and(|f| f != row.fence) => Err(R::STALE(row.fence)),
        Some(_) => Ok(()),
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
            lock_delay: LockDelay::NONE,
        }
    }

    #[test]
    fn a_token_at_its_quota_takes_no_other_lease() {
        assert!(within_quota(0, Some(1)));
        assert!(within_quota(1, Some(2)));
        assert!(!within_quota(2, Some(2)));
        assert!(!within_quota(5, Some(2)));
        assert!(within_quota(u64::MAX, None));
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
    fn a_lock_delay_keeps_others_out_after_expiry_but_not_the_owner() {
        let row = Current {
            lock_delay: LockDelay::new(500).unwrap(),
            ..held_by_a()
        };
        let (b, a) = (owner("b"), owner("a"));
        assert_eq!(acquire(Some(&row), &b, at(1_000)), AcquireVerdict::Held);
        assert_eq!(acquire(Some(&row), &b, at(1_499)), AcquireVerdict::Held);
        let taken = AcquireVerdict::Grant(Acquisition::TakenOver);
        assert_eq!(acquire(Some(&row), &b, at(1_500)), taken);
        assert_eq!(acquire(Some(&row), &a, at(1_000)), taken);
        assert_eq!(
            acquire(Some(&row), &a, at(999)),
            AcquireVerdict::Grant(Acquisition::Reacquired)
        );
        // Renew and release know nothing of the delay: the lease has expired.
        let renewed: Decision<RenewOutcome> = renew(Some(&row), &a, None, at(1_200));
        assert_eq!(renewed, Err(RenewOutcome::Expired));
    }

    #[test]
    fn renew_and_release_check_expiry_then_owner_then_fence() {
        use ReleaseOutcome as Rel;
        use RenewOutcome as Ren;
        let row = Some(held_by_a());
        let (live, expired) = (at(999), at(1_000));
        let stale = Err(Ren::StaleFence { current: fence(7) });
        let stale_release = Err(Rel::StaleFence { current: fence(7) });
        let (owner_mismatch, not_owner) = (Err(Ren::OwnerMismatch), Err(Rel::NotOwner));
        let (expired_renew, expired_release) = (Err(Ren::Expired), Err(Rel::NotFound));
        // (row, owner, fence given, now, renew's decision, release's decision)
        let cases = [
            (
                None,
                "a",
                None,
                live,
                Err(Ren::NotFound),
                Err(Rel::NotFound),
            ),
            (row, "a", None, live, Ok(()), Ok(())),
            (row, "a", Some(7), live, Ok(()), Ok(())),
            (row, "a", Some(8), live, stale, stale_release),
            (row, "b", Some(8), live, owner_mismatch, not_owner),
            (
                row,
                "a",
                Some(7),
                expired,
                expired_renew.clone(),
                expired_release.clone(),
            ),
            (row, "b", None, expired, expired_renew, expired_release),
        ];
        for (current, who, given, now, renews, releases) in cases {
            let current = current.as_ref();
            let (who, given) = (owner(who), given.map(fence));
            let case = format!("{current:?} {who:?} {given:?} at {now}");
            assert_eq!(renew(current, &who, given, now), renews, "renew: {case}");
            assert_eq!(
                release(current, &who, given, now),
                releases,
                "release: {case}"
            );
        }
    }
}
