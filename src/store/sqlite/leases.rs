//! The lease operations, each run on the store thread inside a batch's transaction: the
//! decisions on acquisitions, renewals and releases, the waiters' tickets, inspection, the
//! list, and the purge of long-expired leases.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::classify;
use super::history;
use super::row::{Row, now_ms, stored_fence, timestamp};
use super::undo::{Journal, Undo};
use crate::store::{Result, StoreError, TICKET_LIFE};
use fencelock::domain::decide::{self, AcquireVerdict, HolderRefusal};
use fencelock::domain::{
    AcquireOutcome, AcquireRequest, Fence, Inspection, Lease, LeasePage, ListRequest, ListedLease,
    LockDelay, Owner, RecordedEnd, ReleaseOutcome, ReleaseRequest, RenewOutcome, RenewRequest,
    ResourceName, Ticket, TokenQuota,
};

fn lease(
    resource: &ResourceName,
    owner: &Owner,
    fence: Fence,
    acquired_ms: i64,
    expires_ms: i64,
    now: i64,
) -> Result<Lease> {
    Ok(Lease {
        resource: resource.clone(),
        owner: owner.clone(),
        fence,
        acquired_at: timestamp(acquired_ms)?,
        expires_at: timestamp(expires_ms)?,
        observed_at: timestamp(now)?,
    })
}

fn current(conn: &Connection, resource: &ResourceName) -> Result<Option<Row>> {
    let raw = conn
        .prepare_cached(
            "SELECT owner, fence, acquired_at, expires_at, lock_delay_ms, token
             FROM leases WHERE resource = ?1",
        )
        .and_then(|mut s| {
            s.query_row([resource.as_str()], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })
            .optional()
        })
        .map_err(classify)?;
    raw.map(
        |(owner, fence, acquired_at, expires_at, lock_delay_ms, token)| {
            Ok(Row {
                owner,
                token,
                fence: stored_fence(fence)?,
                acquired_at,
                expires_at: timestamp(expires_at)?,
                lock_delay: LockDelay::new(lock_delay_ms)
                    .map_err(|e| StoreError::corrupt("lock delay", e))?,
            })
        },
    )
    .transpose()
}

/// A lock write as the store thread runs it: decided and written in the batch's transaction,
/// noting in the journal how to take itself back (see [`super::undo`]).
pub(super) type LockWrite<R, T> = fn(&Connection, &R, &mut Journal) -> Result<T>;

/// The lock writes.
pub(super) const ACQUIRE: LockWrite<AcquireRequest, AcquireOutcome> = acquire;
pub(super) const RENEW: LockWrite<RenewRequest, (RenewOutcome, bool)> = renew;
pub(super) const RELEASE: LockWrite<ReleaseRequest, ReleaseOutcome> = release;

// The functions below run inside the batch transaction, which holds SQLite's write lock:
// reading the row, deciding (`domain::decide`) and writing it is one atomic step.

fn acquire(conn: &Connection, req: &AcquireRequest, undo: &mut Journal) -> Result<AcquireOutcome> {
    let now = now_ms();
    if let Some(TokenQuota {
        name,
        max_leases: Some(max_leases),
    }) = &req.token
    {
        // A lease counts until its lock delay has passed (at most a minute: the first bound
        // keeps the count a range of the token's expiry index).
        let others: i64 = conn
            .prepare_cached(
                "SELECT count(*) FROM leases
                 WHERE token = ?1 AND expires_at > ?2 - 60000 AND expires_at + lock_delay_ms > ?2
                   AND resource <> ?3",
            )
            .and_then(|mut s| s.query_row(params![name, now, req.resource.as_str()], |r| r.get(0)))
            .map_err(classify)?;
        if !decide::within_quota(u64::try_from(others).unwrap_or(0), Some(*max_leases)) {
            return Ok(AcquireOutcome::QuotaExceeded {
                max_leases: *max_leases,
            });
        }
    }
    let row = current(conn, &req.resource)?;
    let how = match decide::acquire(
        row.as_ref().map(Row::current).as_ref(),
        &req.owner,
        timestamp(now)?,
    ) {
        AcquireVerdict::Grant(how) => how,
        AcquireVerdict::Held => {
            // Another owner's live lease, or its lock delay after expiry: free at the end
            // of the delay.
            let Some(row) = row else {
                return Ok(held(now, now));
            };
            let free_at = row.lock_delay.free_at(row.expires_at);
            let mut refusal = held(free_at.timestamp_millis(), now);
            if !row.current().is_live(timestamp(now)?)
                && let AcquireOutcome::Held { delayed_until, .. } = &mut refusal
            {
                *delayed_until = Some(free_at);
            }
            return Ok(refusal);
        }
    };
    // The queue comes first, unless this is the holder re-acquiring a resource nobody else
    // may take yet (its lease live, or inside its lock delay).
    let current = row.as_ref().map(Row::current);
    if !decide::passes_queue(current.as_ref(), &req.owner, timestamp(now)?)
        && let Some(until) = waiters_ahead(conn, &req.resource, req.ticket, now)?
    {
        return Ok(held(until, now));
    }
    let fence: i64 = conn
        .prepare_cached(
            "UPDATE fence_counter SET last_fence = last_fence + 1 WHERE id = 1 RETURNING last_fence",
        )
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(classify)?;
    let expires = now + req.ttl.millis();
    conn.prepare_cached(
        "INSERT INTO leases (resource, owner, fence, acquired_at, expires_at, token, lock_delay_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (resource) DO UPDATE SET
             owner = excluded.owner, fence = excluded.fence,
             acquired_at = excluded.acquired_at, expires_at = excluded.expires_at,
             token = excluded.token, lock_delay_ms = excluded.lock_delay_ms",
    )
    .and_then(|mut s| {
        s.execute(params![
            req.resource.as_str(),
            req.owner.as_str(),
            fence,
            now,
            expires,
            req.token.as_ref().map(|t| t.name.as_str()),
            req.lock_delay.millis()
        ])
    })
    .map_err(classify)?;
    history::granted(conn, req, row.as_ref(), fence, now, expires)?;
    if let Some(ticket) = req.ticket {
        dequeue(conn, ticket)?;
    }
    undo.push(Undo::Grant {
        resource: req.resource.as_str().to_owned(),
        fence,
        previous: row,
    });
    let lease = lease(
        &req.resource,
        &req.owner,
        stored_fence(fence)?,
        now,
        expires,
        now,
    )?;
    Ok(AcquireOutcome::Acquired { lease, how })
}

fn held(free_at_ms: i64, now: i64) -> AcquireOutcome {
    let free_in = u64::try_from(free_at_ms.saturating_sub(now)).unwrap_or(0);
    AcquireOutcome::Held {
        free_in: Duration::from_millis(free_in),
        delayed_until: None,
    }
}

/// The earliest expiry among the live tickets of resource `?1` at `?2` ahead of ticket `?3`
/// (all of them when `?3` is NULL).
const WAITERS_AHEAD: &str = "
SELECT min(expires_at) FROM lease_waiters
WHERE resource = ?1 AND expires_at > ?2 AND (?3 IS NULL OR ticket < ?3)";

/// `None` when no live ticket of the resource is ahead of `ticket` (without a ticket: when
/// none is queued at all); otherwise the earliest expiry among those ahead, the first moment
/// the queue may change without anyone saying so. A grant is allowed only on `None`.
fn waiters_ahead(
    conn: &Connection,
    resource: &ResourceName,
    ticket: Option<Ticket>,
    now: i64,
) -> Result<Option<i64>> {
    conn.prepare_cached(waiters_ahead_statement())
        .and_then(|mut s| {
            s.query_row(
                params![resource.as_str(), now, ticket.map(Ticket::get)],
                |r| r.get(0),
            )
        })
        .map_err(classify)
}

/// [`WAITERS_AHEAD`], or in a debug build told to break the queue's order on purpose
/// ([`broken`]), its reverse.
fn waiters_ahead_statement() -> &'static str {
    #[cfg(debug_assertions)]
    if super::broken::handover_reversed() {
        return super::broken::WAITERS_BEHIND;
    }
    WAITERS_AHEAD
}

/// A ticket at the end of the queue: it lives by its heartbeat (`lease_waiters.expires_at`),
/// [`TICKET_LIFE`] at first, never past the wait's end, extended by [`beat`] while its waiter is
/// alive.
pub(super) fn enqueue(
    conn: &Connection,
    resource: &ResourceName,
    wait: Duration,
) -> Result<Ticket> {
    let now = now_ms();
    let until = now.saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX));
    let alive = until.min(now.saturating_add(life_ms()));
    conn.prepare_cached(
        "INSERT INTO lease_waiters (resource, wait_until, expires_at) VALUES (?1, ?2, ?3)
         RETURNING ticket",
    )
    .and_then(|mut s| s.query_row(params![resource.as_str(), until, alive], |r| r.get(0)))
    .map(Ticket::new)
    .map_err(classify)
}

fn life_ms() -> i64 {
    i64::try_from(TICKET_LIFE.as_millis()).unwrap_or(i64::MAX)
}

/// The heartbeat of this process's waiters: each ticket lives [`TICKET_LIFE`] more, never past
/// its wait's end; one that had lapsed lives again (its waiter is alive, and keeps its place).
pub(super) fn beat(conn: &Connection, tickets: &[Ticket]) -> Result<()> {
    let alive = now_ms().saturating_add(life_ms());
    let mut statement = conn
        .prepare_cached(
            "UPDATE lease_waiters SET expires_at = min(wait_until, ?2)
             WHERE ticket = ?1 AND wait_until IS NOT NULL",
        )
        .map_err(classify)?;
    for ticket in tickets {
        statement
            .execute(params![ticket.get(), alive])
            .map_err(classify)?;
    }
    Ok(())
}

pub(super) fn dequeue(conn: &Connection, ticket: Ticket) -> Result<()> {
    conn.prepare_cached("DELETE FROM lease_waiters WHERE ticket = ?1")
        .and_then(|mut s| s.execute([ticket.get()]))
        .map(|_| ())
        .map_err(classify)
}

pub(super) fn inspect(conn: &Connection, resource: &ResourceName) -> Result<Inspection> {
    let now = now_ms();
    let at = timestamp(now)?;
    match current(conn, resource)? {
        Some(row) if row.current().is_live(at) => {
            let owner = Owner::parse(&row.owner).map_err(|e| StoreError::corrupt("owner", e))?;
            let expires = row.expires_at.timestamp_millis();
            lease(resource, &owner, row.fence, row.acquired_at, expires, now).map(Inspection::Live)
        }
        Some(row) if !row.current().is_free_for_others(at) => Ok(Inspection::Delayed {
            until: row.lock_delay.free_at(row.expires_at),
        }),
        _ => Ok(Inspection::Absent),
    }
}

/// The resource's row if [`decide::holder`] lets `owner` (with `fence`, when given) change
/// its lease at `now`; else the refusal to answer.
fn changeable<R: HolderRefusal>(
    conn: &Connection,
    resource: &ResourceName,
    owner: &Owner,
    fence: Option<Fence>,
    now: i64,
) -> Result<std::result::Result<Row, R>> {
    let row = current(conn, resource)?;
    let current = row.as_ref().map(Row::current);
    let verdict = decide::holder(current.as_ref(), owner, fence, timestamp(now)?);
    Ok(verdict.map(|()| row.expect("decide::holder refuses a missing row")))
}

/// The outcome, and whether the renewal brought the lease's expiry closer.
fn renew(
    conn: &Connection,
    req: &RenewRequest,
    undo: &mut Journal,
) -> Result<(RenewOutcome, bool)> {
    let now = now_ms();
    let row = match changeable(conn, &req.resource, &req.owner, req.fence, now)? {
        Ok(row) => row,
        Err(refusal) => return Ok((refusal, false)),
    };
    let expires = now + req.ttl.millis();
    conn.prepare_cached("UPDATE leases SET expires_at = ?2 WHERE resource = ?1")
        .and_then(|mut s| s.execute(params![req.resource.as_str(), expires]))
        .map_err(classify)?;
    history::renewed(conn, row.fence, expires)?;
    undo.push(Undo::Renewal {
        resource: req.resource.as_str().to_owned(),
        fence: row.fence.get(),
        before: row.expires_at.timestamp_millis(),
        after: expires,
    });
    let shortened = expires < row.expires_at.timestamp_millis();
    let lease = lease(
        &req.resource,
        &req.owner,
        row.fence,
        row.acquired_at,
        expires,
        now,
    )?;
    Ok((RenewOutcome::Renewed(lease), shortened))
}

fn release(conn: &Connection, req: &ReleaseRequest, undo: &mut Journal) -> Result<ReleaseOutcome> {
    let now = now_ms();
    let row = match changeable(conn, &req.resource, &req.owner, req.fence, now)? {
        Ok(row) => row,
        Err(refusal) => return Ok(refusal),
    };
    conn.prepare_cached("DELETE FROM leases WHERE resource = ?1")
        .and_then(|mut s| s.execute([req.resource.as_str()]))
        .map_err(classify)?;
    history::ended(conn, row.fence, RecordedEnd::Released, now)?;
    let released = ReleaseOutcome::Released {
        fence: row.fence,
        acquired_at: timestamp(row.acquired_at)?,
        released_at: timestamp(now)?,
    };
    undo.push(Undo::Release {
        resource: req.resource.as_str().to_owned(),
        previous: row,
    });
    Ok(released)
}

/// A lease inside its lock delay is kept whatever the grace: it still keeps other owners
/// out. (The first condition alone lets the expiry index find the candidates.)
pub(super) fn purge_batch(conn: &Connection, grace: Duration, limit: u64) -> Result<u64> {
    let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
    let cutoff = now_ms().saturating_sub(grace_ms);
    // Tickets of waiters that are gone without leaving the queue (their process died):
    // skipped since their expiry, deleted once a minute has passed.
    conn.prepare_cached("DELETE FROM lease_waiters WHERE expires_at < ?1")
        .and_then(|mut s| s.execute([now_ms().saturating_sub(60_000)]))
        .map_err(classify)?;
    conn.prepare_cached(
        "DELETE FROM leases WHERE resource IN
            (SELECT resource FROM leases
             WHERE expires_at < ?1 AND expires_at + lock_delay_ms < ?1 LIMIT ?2)",
    )
    .and_then(|mut s| s.execute(params![cutoff, i64::try_from(limit).unwrap_or(i64::MAX)]))
    .map(|n| n as u64)
    .map_err(classify)
}

/// Served by the expiry index (`leases_expires_at_idx`), which covers the query.
pub(super) fn count_live(conn: &Connection) -> Result<u64> {
    conn.prepare_cached("SELECT count(*) FROM leases WHERE expires_at > ?1")
        .and_then(|mut s| s.query_row([now_ms()], |r| r.get::<_, i64>(0)))
        .map(|n| u64::try_from(n).unwrap_or(0))
        .map_err(classify)
}

/// One range of a list page, `[?1, ?2)`: the leases live at `?3`, at most `?4` of them.
const LIST: &str = "
SELECT resource, fence, acquired_at, expires_at FROM leases
WHERE resource >= ?1 AND resource < ?2 AND expires_at > ?3
ORDER BY resource LIMIT ?4";

/// One page of live leases: the scope's ranges in name order, each read up to what the page
/// still needs, plus one lease that tells whether a next page exists. `resource` is the
/// primary key, compared with BINARY collation (byte order, as PostgreSQL's "C"), so each
/// range is a search of its index. All ranges are read in the batch's one transaction.
pub(super) fn list(conn: &Connection, req: &ListRequest) -> Result<LeasePage> {
    let now = now_ms();
    let wanted = req.limit.get() + 1;
    let mut leases = Vec::with_capacity(wanted);
    let mut statement = conn.prepare_cached(LIST).map_err(classify)?;
    for range in req.ranges() {
        let left = i64::try_from(wanted - leases.len()).unwrap_or(i64::MAX);
        let rows = statement
            .query_map(params![range.start, range.end, now, left], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            })
            .map_err(classify)?;
        for row in rows {
            let (resource, fence, acquired_at, expires_at) = row.map_err(classify)?;
            leases.push(ListedLease {
                resource: ResourceName::parse(&resource)
                    .map_err(|e| StoreError::corrupt("resource", e))?,
                fence: stored_fence(fence)?,
                acquired_at: timestamp(acquired_at)?,
                expires_at: timestamp(expires_at)?,
                observed_at: timestamp(now)?,
            });
        }
        if leases.len() >= wanted {
            break;
        }
    }
    Ok(LeasePage::from_rows(leases, req.limit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::file::in_memory;
    use fencelock::domain::{Ttl, WaitFor};

    /// The statements of acquisitions stay prepared from one acquisition to the next, whatever
    /// values are bound (see `prepare_once`).
    #[test]
    fn statements_are_prepared_once() {
        let conn = in_memory();
        for (i, ticket) in [None, Some(Ticket::new(7)), None].into_iter().enumerate() {
            let req = AcquireRequest {
                resource: ResourceName::parse(&format!("res:{i}")).unwrap(),
                owner: Owner::parse(&format!("owner-{i}")).unwrap(),
                ttl: Ttl::new(30, Ttl::max(60).unwrap()).unwrap(),
                lock_delay: LockDelay::new(0).unwrap(),
                token: None,
                wait: WaitFor::new(0, 1000).unwrap(),
                ticket,
            };
            acquire(&conn, &req, &mut Vec::new()).unwrap();
        }
        let statement = conn.prepare_cached(WAITERS_AHEAD).unwrap();
        assert_eq!(
            statement.get_status(rusqlite::StatementStatus::RePrepare),
            0
        );
    }

    /// A list range is a search of the primary key (the table is clustered on it), which also
    /// gives the order: no scan of the table, no sort.
    #[test]
    fn a_list_range_searches_the_primary_key() {
        let conn = in_memory();
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {LIST}"))
            .unwrap()
            .query_map(params!["job:", "job:\u{7f}", 0, 101], |r| r.get(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            plan,
            ["SEARCH leases USING PRIMARY KEY (resource>? AND resource<?)"]
        );
    }
}
