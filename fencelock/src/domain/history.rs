//! The history of a resource's leases: what `GET /locks/{resource}/history` asks the store,
//! and how a recorded lease is read back.
//!
//! Stores write a history row in the same atomic step as the lease change it records, and
//! write only the ends that are final when they happen: a release, a re-acquisition (which
//! releases the lease it replaces), a takeover by another owner. Whether a lease is still
//! live or has expired is read off its `expires_at` against the store's clock when the
//! history is read ([`PastLease::end`]), so expiry itself needs no write.

use chrono::{DateTime, Utc};

use super::{Fence, ResourceName};

/// Most leases one history answer lists: 1 to 1000, default 50.
pub type HistoryLimit = super::listing::Limit<50>;

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct HistoryRequest {
    pub resource: ResourceName,
    pub limit: HistoryLimit,
}

/// An end a store writes down when it happens.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RecordedEnd {
    /// Released by its holder, or replaced by its holder's re-acquisition while live.
    Released,
    /// Expired, then acquired by another owner.
    TakenOver,
    /// Ended by its expiry: acquired again by its own owner afterwards, or purged long after.
    /// (A store may also leave such a lease without a recorded end: it reads the same.)
    Expired,
}

impl RecordedEnd {
    /// The stores' spelling (`end_kind` of the lease history).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::TakenOver => "taken_over",
            Self::Expired => "expired",
        }
    }

    pub fn from_stored(text: &str) -> Option<Self> {
        match text {
            "released" => Some(Self::Released),
            "taken_over" => Some(Self::TakenOver),
            "expired" => Some(Self::Expired),
            _ => None,
        }
    }
}

/// How a lease in a history stands or ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LeaseEnd {
    Live,
    Released,
    /// Ended by expiry; nobody else has taken the resource since (its own owner may have
    /// acquired it again after the expiry, with a new lease).
    Expired,
    TakenOver,
}

impl LeaseEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Released => "released",
            Self::Expired => "expired",
            Self::TakenOver => "taken_over",
        }
    }
}

/// One lease as the history records it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PastLease {
    pub fence: Fence,
    pub acquired_at: DateTime<Utc>,
    /// The lease's expiry, moved by every renewal.
    pub expires_at: DateTime<Utc>,
    /// When a release ended it; `None` otherwise.
    pub released_at: Option<DateTime<Utc>>,
    pub recorded: Option<RecordedEnd>,
    pub renewals: u32,
}

impl PastLease {
    /// How the lease stands at `now` (the store's clock), and when it ended (`None` while
    /// live): the release time, or else its expiry.
    pub fn end(&self, now: DateTime<Utc>) -> (LeaseEnd, Option<DateTime<Utc>>) {
        match self.recorded {
            Some(RecordedEnd::Released) => (
                LeaseEnd::Released,
                Some(self.released_at.unwrap_or(self.expires_at)),
            ),
            Some(RecordedEnd::TakenOver) => (LeaseEnd::TakenOver, Some(self.expires_at)),
            Some(RecordedEnd::Expired) => (LeaseEnd::Expired, Some(self.expires_at)),
            // Live while now < expires_at, as every lease (`decide::Current::is_live`).
            None if now < self.expires_at => (LeaseEnd::Live, None),
            None => (LeaseEnd::Expired, Some(self.expires_at)),
        }
    }
}

/// A resource's most recent leases, newest (greatest fence) first, with the store's clock
/// when it read them.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LeaseHistory {
    pub leases: Vec<PastLease>,
    pub observed_at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(ms).unwrap()
    }

    fn lease(recorded: Option<RecordedEnd>, released_at: Option<i64>) -> PastLease {
        PastLease {
            fence: Fence::new(3).unwrap(),
            acquired_at: at(0),
            expires_at: at(1_000),
            released_at: released_at.map(at),
            recorded,
            renewals: 0,
        }
    }

    #[test]
    fn an_unrecorded_lease_is_live_until_its_expiry_instant() {
        let open = lease(None, None);
        assert_eq!(open.end(at(999)), (LeaseEnd::Live, None));
        assert_eq!(open.end(at(1_000)), (LeaseEnd::Expired, Some(at(1_000))));
    }

    #[test]
    fn recorded_ends_hold_whatever_the_clock() {
        let released = lease(Some(RecordedEnd::Released), Some(400));
        assert_eq!(released.end(at(0)), (LeaseEnd::Released, Some(at(400))));
        let taken = lease(Some(RecordedEnd::TakenOver), None);
        assert_eq!(taken.end(at(5_000)), (LeaseEnd::TakenOver, Some(at(1_000))));
    }

    #[test]
    fn limits_are_bounded() {
        assert_eq!(HistoryLimit::default().get(), 50);
        assert_eq!(HistoryLimit::new(1).unwrap().get(), 1);
        assert_eq!(HistoryLimit::new(1000).unwrap().get(), 1000);
        for bad in [0, 1001, u64::MAX] {
            assert_eq!(HistoryLimit::new(bad), None);
        }
        for end in ["released", "taken_over", "expired"] {
            assert_eq!(RecordedEnd::from_stored(end).unwrap().as_str(), end);
        }
        assert_eq!(RecordedEnd::from_stored("live"), None);
    }
}
