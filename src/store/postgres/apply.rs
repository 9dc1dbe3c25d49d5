//! `fencelock_apply` as the server calls it, for a batch or a single request alike: each
//! request's element of the statement's parameter arrays, and what its row of the answer
//! says. How batches are formed and committed is [`super::batch`]'s business.

use chrono::{DateTime, Utc};
use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, ToSql, Type};

use super::{Db, Sql, acquisition};
use crate::store::{Deadline, StoreError};
use fencelock::domain::{
    AcquireOutcome, AcquireRequest, Fence, Lease, Owner, ReleaseOutcome, ReleaseRequest,
    RenewOutcome, RenewRequest, ResourceName, Ticket,
};

/// The decisions' one statement (see the migration).
pub(super) const APPLY: Sql = Sql {
    text: "
SELECT ord, outcome, fence, acquired_at, expires_at, observed_at
FROM fencelock_apply($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    types: &[
        Type::TEXT_ARRAY,
        Type::TEXT_ARRAY,
        Type::TEXT_ARRAY,
        Type::INT4_ARRAY,
        Type::INT8_ARRAY,
        Type::TEXT_ARRAY,
        Type::INT4_ARRAY,
        Type::INT8_ARRAY,
        Type::INT4_ARRAY,
        Type::TIMESTAMPTZ_ARRAY,
        Type::INT4,
    ],
};

/// A lock write (an acquisition, a renewal, a release) as `fencelock_apply` sees it, in a
/// batch or alone: its element of each of the statement's parameter arrays, and what its row
/// of the answer says.
pub(super) trait LockWrite: Clone + Send + Sync + 'static {
    type Outcome: Send + 'static;

    fn params(&self) -> Params<'_>;

    /// What the request's row of `fencelock_apply`'s answer says: its kind's outcome, or,
    /// whatever its kind, an error when its deadline passed before it was decided.
    fn answer(&self, row: &Row) -> Result<Self::Outcome, StoreError> {
        match column::<&str>(row, 1)? {
            "too_late" => Err(StoreError::too_late()),
            decision => self.outcome(decision, row),
        }
    }

    /// The outcome that `decision` (the first column of the request's row) and the rest of
    /// the row say.
    fn outcome(&self, decision: &str, row: &Row) -> Result<Self::Outcome, StoreError>;

    /// The request decided alone, by `fencelock_apply` with this request only: the rules (and
    /// the history they write) exist once, in SQL, for batches and single requests alike.
    /// It waits for its locks without a bound of its own (the statement timeout still holds),
    /// as every single statement does.
    async fn alone(&self, db: &Db, deadline: Deadline) -> Result<Self::Outcome, StoreError> {
        let until = db.database_deadline(deadline).await?;
        let row = db.apply_alone(self.params(), until).await?;
        self.answer(&row)
    }
}

/// One request as `fencelock_apply` takes it: its element of each parameter array.
pub(super) struct Params<'a> {
    kind: &'static str,
    resource: &'a str,
    owner: &'a str,
    ttl: Option<i32>,
    fence: Option<Fence>,
    token: Option<&'a str>,
    /// The token's quota, for an acquisition that must keep it.
    max_leases: Option<i32>,
    /// A waiter's ticket.
    ticket: Option<Ticket>,
    /// An acquisition's lock delay in milliseconds; `None` for renew and release.
    lock_delay: Option<i32>,
}

impl<'a> Params<'a> {
    /// A request of `kind` on `resource` by `owner`, with every optional element `None`.
    fn of(kind: &'static str, resource: &'a ResourceName, owner: &'a Owner) -> Self {
        Self {
            kind,
            resource: resource.as_str(),
            owner: owner.as_str(),
            ttl: None,
            fence: None,
            token: None,
            max_leases: None,
            ticket: None,
            lock_delay: None,
        }
    }

    /// A waiter leaving the queue of `resource`, with the grant its ticket holds if the
    /// grant stands.
    pub(super) fn leave(resource: &'a ResourceName, owner: &'a Owner, ticket: Ticket) -> Self {
        Self {
            ticket: Some(ticket),
            ..Self::of("leave", resource, owner)
        }
    }
}

impl LockWrite for AcquireRequest {
    type Outcome = AcquireOutcome;

    fn params(&self) -> Params<'_> {
        Params {
            ttl: Some(super::ttl_param(self.ttl.seconds())),
            token: self.token.as_ref().map(|t| t.name.as_str()),
            max_leases: self
                .token
                .as_ref()
                .and_then(|t| t.max_leases)
                .map(|max| i32::try_from(max).unwrap_or(i32::MAX)),
            ticket: self.ticket,
            lock_delay: Some(super::lock_delay_param(self)),
            ..Params::of("acquire", &self.resource, &self.owner)
        }
    }

    fn outcome(&self, decision: &str, row: &Row) -> Result<AcquireOutcome, StoreError> {
        Ok(match decision {
            "held" => super::held(column(row, 4)?, column(row, 5)?, column(row, 3)?),
            "quota_exceeded" => AcquireOutcome::QuotaExceeded {
                max_leases: self.token.as_ref().and_then(|t| t.max_leases).unwrap_or(0),
            },
            how => AcquireOutcome::Acquired {
                how: acquisition(how)?,
                lease: lease(&self.resource, &self.owner, row)?,
            },
        })
    }
}

impl LockWrite for RenewRequest {
    type Outcome = RenewOutcome;

    fn params(&self) -> Params<'_> {
        Params {
            ttl: Some(super::ttl_param(self.ttl.seconds())),
            fence: self.fence,
            ..Params::of("renew", &self.resource, &self.owner)
        }
    }

    fn outcome(&self, decision: &str, row: &Row) -> Result<RenewOutcome, StoreError> {
        Ok(match decision {
            "renewed" => RenewOutcome::Renewed(lease(&self.resource, &self.owner, row)?),
            "not_found" => RenewOutcome::NotFound,
            "expired" => RenewOutcome::Expired,
            "owner_mismatch" => RenewOutcome::OwnerMismatch,
            "stale_fence" => RenewOutcome::StaleFence {
                current: fence_at(row, 2)?,
            },
            other => return Err(unknown(other)),
        })
    }
}

impl LockWrite for ReleaseRequest {
    type Outcome = ReleaseOutcome;

    fn params(&self) -> Params<'_> {
        Params {
            fence: self.fence,
            ..Params::of("release", &self.resource, &self.owner)
        }
    }

    fn outcome(&self, decision: &str, row: &Row) -> Result<ReleaseOutcome, StoreError> {
        Ok(match decision {
            "released" => ReleaseOutcome::Released {
                fence: fence_at(row, 2)?,
                acquired_at: column(row, 3)?,
                released_at: column(row, 5)?,
            },
            "not_found" => ReleaseOutcome::NotFound,
            "not_owner" => ReleaseOutcome::NotOwner,
            "stale_fence" => ReleaseOutcome::StaleFence {
                current: fence_at(row, 2)?,
            },
            other => return Err(unknown(other)),
        })
    }
}

/// Requests as `fencelock_apply`'s parameter arrays: element `i` of each is request `i`.
pub(super) struct Arrays<'a> {
    kinds: Vec<&'static str>,
    resources: Vec<&'a str>,
    owners: Vec<&'a str>,
    ttls: Vec<Option<i32>>,
    fences: Vec<Option<i64>>,
    tokens: Vec<Option<&'a str>>,
    max_leases: Vec<Option<i32>>,
    tickets: Vec<Option<i64>>,
    lock_delays: Vec<Option<i32>>,
}

impl<'a> Arrays<'a> {
    pub(super) fn of(requests: impl IntoIterator<Item = Params<'a>>) -> Self {
        let requests = requests.into_iter();
        let n = requests.size_hint().0;
        let mut arrays = Self {
            kinds: Vec::with_capacity(n),
            resources: Vec::with_capacity(n),
            owners: Vec::with_capacity(n),
            ttls: Vec::with_capacity(n),
            fences: Vec::with_capacity(n),
            tokens: Vec::with_capacity(n),
            max_leases: Vec::with_capacity(n),
            tickets: Vec::with_capacity(n),
            lock_delays: Vec::with_capacity(n),
        };
        for request in requests {
            arrays.kinds.push(request.kind);
            arrays.resources.push(request.resource);
            arrays.owners.push(request.owner);
            arrays.ttls.push(request.ttl);
            arrays.fences.push(request.fence.map(Fence::get));
            arrays.tokens.push(request.token);
            arrays.max_leases.push(request.max_leases);
            arrays.tickets.push(request.ticket.map(Ticket::get));
            arrays.lock_delays.push(request.lock_delay);
        }
        arrays
    }

    /// The statement's parameters: these arrays, each request's deadline on the database's
    /// clock (`until`), and the longest wait for one lock (`lock_wait_ms`, 0: unbounded).
    pub(super) fn with<'p>(
        &'p self,
        until: &'p Vec<DateTime<Utc>>,
        lock_wait_ms: &'p i32,
    ) -> [&'p (dyn ToSql + Sync); 11] {
        [
            &self.kinds,
            &self.resources,
            &self.owners,
            &self.ttls,
            &self.fences,
            &self.tokens,
            &self.max_leases,
            &self.tickets,
            &self.lock_delays,
            until,
            lock_wait_ms,
        ]
    }
}

pub(super) fn column<'a, T: FromSql<'a>>(row: &'a Row, index: usize) -> Result<T, StoreError> {
    row.try_get(index).map_err(|e| {
        StoreError::Internal(anyhow::anyhow!(
            "fencelock_apply answered column {index} unexpectedly: {e}"
        ))
    })
}

fn fence_at(row: &Row, index: usize) -> Result<Fence, StoreError> {
    Fence::new(column(row, index)?).map_err(|e| StoreError::corrupt("fence", e))
}

fn lease(resource: &ResourceName, owner: &Owner, row: &Row) -> Result<Lease, StoreError> {
    Ok(Lease {
        resource: resource.clone(),
        owner: owner.clone(),
        fence: fence_at(row, 2)?,
        acquired_at: column(row, 3)?,
        expires_at: column(row, 4)?,
        observed_at: column(row, 5)?,
    })
}

fn unknown(outcome: &str) -> StoreError {
    StoreError::Internal(anyhow::anyhow!(
        "fencelock_apply answered an unknown outcome {outcome:?}"
    ))
}
