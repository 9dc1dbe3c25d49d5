//! Taking back the lock writes of a batch whose commit ended after its requesters were
//! answered.
//!
//! A commit can outlast every deadline: on a frozen file system (`fsfreeze`, a volume
//! snapshot) the write of the WAL blocks in the kernel until the thaw, and nothing interrupts
//! it. The requesters have been answered `503` by then, which promises that their writes do
//! not take effect (API.md, *Hardening rules*). So every lock write notes how to take itself
//! back ([`Undo`]); when a batch commits past the deadline of one of its lock writes, the
//! store thread takes back all of the batch's lock writes, newest first, in one transaction,
//! before any other work, and answers each `503`. All of them, not only the late ones: a
//! later write of the batch may rest on an earlier one (a renewal of the lease it granted).
//!
//! Fences are never taken back: a fence once issued is spent, and the next grant's is
//! greater. Each step applies only while the row is still as the write left it; another
//! process on the file may have changed it since the commit, and its change stands.

use rusqlite::{Connection, params};

use super::classify;
use super::row::Row;
use crate::store::Result;

/// What a job's lock writes note to take themselves back, newest last.
pub(super) type Journal = Vec<Undo>;

/// How to take back one lock write.
pub(super) enum Undo {
    /// `fence` was granted on `resource`, over `previous` (the row it replaced, if any).
    Grant {
        resource: String,
        fence: i64,
        previous: Option<Row>,
    },
    /// The lease `fence` on `resource` was renewed from `before` to `after` (Unix ms).
    Renewal {
        resource: String,
        fence: i64,
        before: i64,
        after: i64,
    },
    /// The lease `previous` on `resource` was released.
    Release { resource: String, previous: Row },
}

impl Undo {
    pub(super) fn resource(&self) -> &str {
        match self {
            Self::Grant { resource, .. }
            | Self::Renewal { resource, .. }
            | Self::Release { resource, .. } => resource,
        }
    }
}

/// Takes back `writes`, in the order given (newest first), in one transaction. Returns how
/// many were still as their write left them, and so were taken back.
pub(super) fn take_back(conn: &mut Connection, writes: &[Undo]) -> Result<usize> {
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(classify)?;
    let mut taken = 0;
    for write in writes {
        if undo(&tx, write).map_err(classify)? {
            taken += 1;
        }
    }
    tx.commit().map_err(classify)?;
    Ok(taken)
}

fn undo(conn: &Connection, write: &Undo) -> rusqlite::Result<bool> {
    match write {
        Undo::Grant {
            resource,
            fence,
            previous,
        } => {
            let removed = conn
                .prepare_cached("DELETE FROM leases WHERE resource = ?1 AND fence = ?2")?
                .execute(params![resource, fence])?;
            if removed == 0 {
                return Ok(false);
            }
            conn.prepare_cached("DELETE FROM lease_history WHERE fence = ?1")?
                .execute([fence])?;
            if let Some(previous) = previous {
                restore(conn, resource, previous)?;
            }
            Ok(true)
        }
        Undo::Renewal {
            resource,
            fence,
            before,
            after,
        } => {
            let restored = conn
                .prepare_cached(
                    "UPDATE leases SET expires_at = ?3
                     WHERE resource = ?1 AND fence = ?2 AND expires_at = ?4",
                )?
                .execute(params![resource, fence, before, after])?;
            if restored == 0 {
                return Ok(false);
            }
            conn.prepare_cached(
                "UPDATE lease_history SET expires_at = ?2, renewals = max(renewals - 1, 0)
                 WHERE fence = ?1",
            )?
            .execute(params![fence, before])?;
            Ok(true)
        }
        Undo::Release { resource, previous } => restore(conn, resource, previous),
    }
}

/// Puts `row` back as the resource's lease, unless another lease has taken its place since,
/// and its history back to no recorded end (the taken-back write recorded it, or the lease
/// had none). Says whether it did.
fn restore(conn: &Connection, resource: &str, row: &Row) -> rusqlite::Result<bool> {
    let restored = conn
        .prepare_cached(
            "INSERT INTO leases (resource, owner, fence, acquired_at, expires_at, token, lock_delay_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (resource) DO NOTHING",
        )?
        .execute(params![
            resource,
            row.owner,
            row.fence.get(),
            row.acquired_at,
            row.expires_at.timestamp_millis(),
            row.token,
            row.lock_delay.millis(),
        ])?;
    if restored == 0 {
        return Ok(false);
    }
    conn.prepare_cached(
        "UPDATE lease_history SET end_kind = NULL, ended_at = NULL WHERE fence = ?1",
    )?
    .execute([row.fence.get()])?;
    Ok(true)
}
