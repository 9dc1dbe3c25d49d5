//! The store thread: it takes every operation already queued, runs each in a savepoint of
//! one `BEGIN IMMEDIATE` transaction, and answers them once the commit's fate is known.

use std::path::Path;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::classify;
use super::file::{REOPEN_EVERY, connect, is_read_only};
use super::undo::{self, Journal, Undo};
use crate::store::{Deadline, Result, StoreError};
use crate::wake::Changes;

/// Most operations committed together; bounds the latency one batch adds to the next.
const MAX_BATCH: usize = 256;

/// One queued operation. `run` executes it inside the batch's transaction and keeps the
/// result; `finish` hands it over once the commit's fate is known.
pub(super) trait Job: Send {
    /// Whether nobody needs this operation any more: its requester gave up (it has answered
    /// `503` or its client went away), or its deadline passed while it waited for its turn.
    /// Such an operation must not run: its effect would land after the caller was told
    /// "unknown". Asked again after the commit: a lock write that committed abandoned is
    /// taken back ([`undo`]).
    fn abandoned(&self) -> bool;
    fn run(&mut self, conn: &Connection) -> bool;
    /// How to take back what `run` wrote, newest last; empty for all but lock writes.
    fn undo(&mut self) -> Vec<Undo>;
    /// `taken_back`: the commit succeeded, but the write was taken back since.
    fn finish(self: Box<Self>, commit: Result<(), &StoreError>, taken_back: bool);
}

pub(super) struct Pending<T, F> {
    op: Option<F>,
    result: Option<Result<T>>,
    undo: Vec<Undo>,
    deadline: Option<Deadline>,
    reply: oneshot::Sender<Result<T>>,
}

impl<T, F> Pending<T, F> {
    /// `op`, to be run by `deadline` (if any), its result sent to `reply`.
    pub(super) fn new(
        op: F,
        deadline: Option<Deadline>,
        reply: oneshot::Sender<Result<T>>,
    ) -> Self {
        Self {
            op: Some(op),
            result: None,
            undo: Vec::new(),
            deadline,
            reply,
        }
    }
}

impl<T, F> Job for Pending<T, F>
where
    T: Send,
    F: FnOnce(&Connection, &mut Journal) -> Result<T> + Send,
{
    fn abandoned(&self) -> bool {
        self.reply.is_closed() || self.deadline.is_some_and(Deadline::has_passed)
    }

    fn run(&mut self, conn: &Connection) -> bool {
        if self.abandoned() {
            self.op = None;
            self.result = Some(Err(StoreError::too_late()));
            return false;
        }
        let result = self.op.take().map_or_else(
            || Err(StoreError::Internal(anyhow::anyhow!("operation ran twice"))),
            |op| op(conn, &mut self.undo),
        );
        let ok = result.is_ok();
        if !ok {
            // Its savepoint is rolled back: nothing of it is left to take back.
            self.undo.clear();
        }
        self.result = Some(result);
        ok
    }

    fn undo(&mut self) -> Vec<Undo> {
        std::mem::take(&mut self.undo)
    }

    fn finish(self: Box<Self>, commit: Result<(), &StoreError>, taken_back: bool) {
        let outcome = match (commit, self.result) {
            // A failed batch rolled back: nothing of it was written, whatever the cause.
            (Err(e @ StoreError::NotWritable(_)), _) => Err(e.same_kind()),
            (Err(e), _) => Err(StoreError::unavailable(e)),
            (Ok(()), _) if taken_back => Err(StoreError::too_late()),
            (Ok(()), Some(result)) => result,
            (Ok(()), None) => Err(StoreError::Internal(anyhow::anyhow!("operation never ran"))),
        };
        // The requester may have given up (timeout); nothing to do then.
        let _ = self.reply.send(outcome);
    }
}

pub(super) fn run_jobs(
    mut conn: Connection,
    path: &Path,
    mut queue: mpsc::Receiver<Box<dyn Job>>,
    changes: &Changes,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut last_reopen = std::time::Instant::now();
    while let Some(first) = queue.blocking_recv() {
        if is_read_only(&conn) && last_reopen.elapsed() >= REOPEN_EVERY {
            last_reopen = std::time::Instant::now();
            match connect(path) {
                Ok(writable) if !is_read_only(&writable) => {
                    tracing::info!(file = %path.display(), "the SQLite file can be written again");
                    conn = writable;
                }
                _ => {}
            }
        }
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        run_batch(&mut conn, &mut batch, changes);
    }
    tracing::debug!("SQLite thread stopping: every store handle is gone");
}

fn run_batch(conn: &mut Connection, batch: &mut Vec<Box<dyn Job>>, changes: &Changes) {
    // Each job checks whether it was abandoned when its turn comes, inside the transaction:
    // taking the write lock may itself have waited for another process.
    let committed = (|| {
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(classify)?;
        for job in batch.iter_mut() {
            run_in_savepoint(&tx, job.as_mut())?;
        }
        tx.commit().map_err(classify)
    })();
    if let Err(e) = &committed {
        tracing::warn!(error = %e, jobs = batch.len(), "SQLite batch failed");
    }
    let taken_back = match committed {
        Ok(()) => take_back_the_late(conn, batch, changes),
        Err(_) => vec![false; batch.len()],
    };
    for (job, taken_back) in batch.drain(..).zip(taken_back) {
        job.finish(committed.as_ref().map(|_| ()), taken_back);
    }
}

/// After a commit, takes back ([`undo`]) each lock write that was abandoned meanwhile (its
/// requester was answered `503`, or went away), and every later write of the batch on the
/// same resource, which may rest on it (a renewal of the lease it granted); an earlier one
/// stays, and is what the undo restores. Says which jobs were taken back.
fn take_back_the_late(
    conn: &mut Connection,
    batch: &mut [Box<dyn Job>],
    changes: &Changes,
) -> Vec<bool> {
    let mut tainted: Vec<String> = Vec::new();
    let mut writes = Vec::new();
    let taken_back = batch
        .iter_mut()
        .map(|job| {
            let undo = job.undo();
            let late = !undo.is_empty()
                && (job.abandoned()
                    || undo
                        .iter()
                        .any(|w| tainted.iter().any(|r| r == w.resource())));
            if late {
                tainted.extend(undo.iter().map(|w| w.resource().to_owned()));
                writes.extend(undo);
            }
            late
        })
        .collect();
    if writes.is_empty() {
        return taken_back;
    }
    writes.reverse();
    match undo::take_back(conn, &writes) {
        Ok(taken) => {
            tracing::warn!(
                writes = writes.len(),
                taken,
                "lock writes committed after their requesters were answered 503 (or went away) were taken back"
            );
            for write in &writes {
                changes.changed(write.resource());
            }
            taken_back
        }
        Err(e) => {
            // They stand: a requester still waiting is told what happened.
            tracing::error!(error = %e, writes = writes.len(), "lock writes committed after their requesters were answered 503 could not be taken back: they stand until their leases expire");
            vec![false; batch.len()]
        }
    }
}

/// Runs `job` inside a savepoint of its own, which a failing job rolls back: its writes are
/// undone, the rest of the batch's are kept.
///
/// The savepoint statements are cached like the operations' own, rather than taken from
/// rusqlite's `Savepoint`, which parses its SQL anew each time: that is two statements
/// parsed per operation, on the one thread every write waits for.
fn run_in_savepoint(conn: &Connection, job: &mut dyn Job) -> Result<()> {
    let exec = |sql| {
        conn.prepare_cached(sql)
            .and_then(|mut s| s.execute([]))
            .map_err(classify)
    };
    exec("SAVEPOINT job")?;
    if !job.run(conn) {
        exec("ROLLBACK TO job")?;
    }
    // Ends the savepoint; after a rollback to it, that writes nothing.
    exec("RELEASE job")?;
    Ok(())
}
