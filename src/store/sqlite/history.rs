//! The `lease_history` table: written in the batch transaction with the lease
//! change it records, read by `GET /locks/{resource}/history`.

use std::time::Duration;

use rusqlite::{Connection, params};

use super::classify;
use super::row::{Row, now_ms, stored_fence, timestamp};
use crate::store::{Result, StoreError};
use fencelock::domain::{
    AcquireRequest, Fence, HistoryRequest, LeaseHistory, PastLease, RecordedEnd,
};

/// A grant (`fence`, from `now` to `expires`), and the end of the lease it replaced:
/// released at `now` if it was live (only its owner replaces a live lease), taken over if
/// it had expired and another owner took it. An expired lease its own owner acquires
/// again keeps no recorded end: it reads as expired.
pub(super) fn granted(
    conn: &Connection,
    req: &AcquireRequest,
    replaced: Option<&Row>,
    fence: i64,
    now: i64,
    expires: i64,
) -> Result<()> {
    if let Some(old) = replaced {
        if old.current().is_live(timestamp(now)?) {
            ended(conn, old.fence, RecordedEnd::Released, now)?;
        } else if old.owner != req.owner.as_str() {
            let expired_at = old.expires_at.timestamp_millis();
            ended(conn, old.fence, RecordedEnd::TakenOver, expired_at)?;
        }
    }
    conn.prepare_cached(
        "INSERT INTO lease_history (fence, resource, acquired_at, expires_at)
         VALUES (?1, ?2, ?3, ?4)",
    )
    .and_then(|mut s| s.execute(params![fence, req.resource.as_str(), now, expires]))
    .map(|_| ())
    .map_err(classify)
}

pub(super) fn renewed(conn: &Connection, fence: Fence, expires: i64) -> Result<()> {
    conn.prepare_cached(
        "UPDATE lease_history SET expires_at = ?2, renewals = renewals + 1 WHERE fence = ?1",
    )
    .and_then(|mut s| s.execute(params![fence.get(), expires]))
    .map(|_| ())
    .map_err(classify)
}

pub(super) fn ended(conn: &Connection, fence: Fence, end: RecordedEnd, at: i64) -> Result<()> {
    conn.prepare_cached(
        "UPDATE lease_history SET end_kind = ?2, ended_at = ?3
         WHERE fence = ?1 AND end_kind IS NULL",
    )
    .and_then(|mut s| s.execute(params![fence.get(), end.as_str(), at]))
    .map(|_| ())
    .map_err(classify)
}

/// Newest first: a range scan of `lease_history_resource_fence_idx`.
pub(super) fn read(conn: &Connection, req: &HistoryRequest) -> Result<LeaseHistory> {
    let now = now_ms();
    let limit = i64::try_from(req.limit.get()).unwrap_or(i64::MAX);
    let mut statement = conn
        .prepare_cached(
            "SELECT fence, acquired_at, expires_at, ended_at, end_kind, renewals
             FROM lease_history WHERE resource = ?1 ORDER BY fence DESC LIMIT ?2",
        )
        .map_err(classify)?;
    let rows = statement
        .query_map(params![req.resource.as_str(), limit], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, Option<i64>>(3)?,
                r.get::<_, Option<String>>(4)?,
                r.get::<_, i64>(5)?,
            ))
        })
        .map_err(classify)?;
    let mut leases = Vec::new();
    for row in rows {
        let (fence, acquired_at, expires_at, ended_at, end_kind, renewals) =
            row.map_err(classify)?;
        let recorded = end_kind
            .map(|kind| {
                RecordedEnd::from_stored(&kind).ok_or_else(|| {
                    StoreError::Internal(anyhow::anyhow!("stored lease end {kind:?}"))
                })
            })
            .transpose()?;
        leases.push(PastLease {
            fence: stored_fence(fence)?,
            acquired_at: timestamp(acquired_at)?,
            expires_at: timestamp(expires_at)?,
            released_at: ended_at.map(timestamp).transpose()?,
            recorded,
            renewals: u32::try_from(renewals).unwrap_or(u32::MAX),
        });
    }
    Ok(LeaseHistory {
        leases,
        observed_at: timestamp(now)?,
    })
}

/// Each resource acquired since fence `since` keeps its newest `keep` rows: the new rows
/// are a range of the table's key (the fence), each resource's newest a range of its
/// index. Returns how many rows it deleted, and the newest fence it saw.
pub(super) fn trim(conn: &Connection, keep: u64, since: i64) -> Result<(u64, i64)> {
    let newest: i64 = conn
        .prepare_cached("SELECT coalesce(max(fence), 0) FROM lease_history")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(classify)?;
    let trimmed = conn
        .prepare_cached(
            "DELETE FROM lease_history WHERE fence IN (
                 SELECT h.fence FROM
                     (SELECT DISTINCT resource FROM lease_history WHERE fence > ?1) r
                     JOIN lease_history h ON h.resource = r.resource
                 WHERE h.fence <= (SELECT x.fence FROM lease_history x
                                   WHERE x.resource = r.resource
                                   ORDER BY x.fence DESC LIMIT 1 OFFSET ?2))",
        )
        .and_then(|mut s| s.execute(params![since, i64::try_from(keep).unwrap_or(i64::MAX)]))
        .map_err(classify)?;
    Ok((trimmed as u64, newest))
}

/// At most `limit` rows of leases that ended (by release or expiry) more than `retention`
/// ago; a live lease's row never qualifies.
pub(super) fn purge(conn: &Connection, retention: Duration, limit: u64) -> Result<u64> {
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let cutoff = now_ms().saturating_sub(retention_ms);
    conn.prepare_cached(
        "DELETE FROM lease_history WHERE fence IN
            (SELECT fence FROM lease_history
             WHERE coalesce(ended_at, expires_at) < ?1 LIMIT ?2)",
    )
    .and_then(|mut s| s.execute(params![cutoff, i64::try_from(limit).unwrap_or(i64::MAX)]))
    .map(|n| n as u64)
    .map_err(classify)
}
