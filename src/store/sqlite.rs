//! The embedded SQLite store, the default when no `DATABASE_URL` is given.
//!
//! All work runs on one dedicated thread that owns the connection, never on the async
//! executor's threads. The thread takes every operation already queued, runs them in one
//! `BEGIN IMMEDIATE` transaction (each inside its own savepoint, so one failing operation
//! cannot disturb the others) and answers them only after `COMMIT` returned: a fence reaches a
//! client only once it is durable, and many concurrent requests share one disk sync.
//!
//! Several server processes may share one file: `BEGIN IMMEDIATE` takes SQLite's write lock,
//! so decisions on one file are serialised across processes, and the fence counter lives in
//! the file itself. A process that cannot get the lock within [`file::BUSY_TIMEOUT`] answers
//! `503`.
//!
//! Its parts: [`file`] opens the file, [`batch`] runs the store thread, [`leases`] and
//! [`history`] are the operations the thread runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use async_trait::async_trait;
use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::{Deadline, LeaseStore, Result, StoreError};
use crate::wake::Changes;
use fencelock::domain::{
    AcquireOutcome, AcquireRequest, HistoryRequest, Inspection, Lease, LeaseHistory, LeasePage,
    ListRequest, ReleaseOutcome, ReleaseRequest, RenewOutcome, RenewRequest, ResourceName, Ticket,
};

mod batch;
#[cfg(debug_assertions)]
mod broken;
mod counter;
mod file;
mod history;
mod leases;
mod poll;
mod row;
mod undo;

use batch::{Job, Pending, run_jobs};
pub(crate) use file::check;
pub use file::connect;
use file::{is_read_only, migrate, on_read_only_file_system, open_frozen};
use leases::{
    ACQUIRE, LockWrite, RELEASE, RENEW, beat, count_live, dequeue, enqueue, inspect, list,
    purge_batch,
};
use undo::Journal;

/// Queued operations beyond this wait in the request (back-pressure), not in memory.
const QUEUE_DEPTH: usize = 4096;

pub(crate) struct SqliteStore {
    jobs: mpsc::Sender<Box<dyn Job>>,
    path: PathBuf,
    /// Told of every grant, release and dequeue: this process's own right after the commit,
    /// other processes' by [`poll`].
    changes: Arc<Changes>,
    /// The newest history row the last trim of the history saw.
    trimmed_through: AtomicI64,
}

impl SqliteStore {
    /// Opens (or creates) the file, sets it up for durability and applies the migrations.
    /// Blocking: call it off the async executor (see [`super::open`]).
    ///
    /// A file that can be read but not written (its mode, an immutable flag) still opens:
    /// the server then answers reads, and `503` to writes and to `/readyz`, and picks the
    /// file up for writing as soon as that becomes possible.
    ///
    /// So does a file on a read-only file system, if its schema is this build's: SQLite cannot
    /// switch it to WAL or create the WAL index beside it, so it is opened as it is, frozen
    /// ([`open_frozen`]).
    pub(crate) fn open(path: &Path) -> anyhow::Result<Self> {
        let conn = match connect(path) {
            Ok(mut conn) => {
                migrate(&mut conn).with_context(|| format!("migrating {}", path.display()))?;
                counter::check(&conn).with_context(|| path.display().to_string())?;
                if is_read_only(&conn) {
                    tracing::error!(file = %path.display(), "the SQLite file is read-only: writes answer 503 until it can be written");
                }
                conn
            }
            Err(e) if on_read_only_file_system(path) => {
                let conn = open_frozen(path).with_context(|| {
                    format!(
                        "{e:#}; the file system is read-only and the file cannot be read as it is"
                    )
                })?;
                tracing::error!(file = %path.display(), "the SQLite file is on a read-only file system: reads are served, writes answer 503 until it can be written");
                conn
            }
            Err(e) => return Err(e),
        };

        let (jobs, queue) = mpsc::channel(QUEUE_DEPTH);
        let thread_path = path.to_owned();
        let changes = Changes::new();
        let thread_changes = changes.clone();
        std::thread::Builder::new()
            .name("fencelock-sqlite".to_owned())
            .spawn(move || run_jobs(conn, &thread_path, queue, &thread_changes))
            .context("starting the SQLite thread")?;
        poll::start(path, &changes)?;
        Ok(Self {
            jobs,
            path: path.to_owned(),
            changes,
            trimmed_through: AtomicI64::new(0),
        })
    }

    /// Runs `op` on the store thread inside the next batch and returns its result once the
    /// batch has committed. The operation is skipped, and never takes effect, if its
    /// requester has stopped waiting or `deadline` has passed by the time its turn comes.
    async fn call<T, F>(&self, deadline: Option<Deadline>, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        self.call_undoable(deadline, move |conn, _| op(conn)).await
    }

    /// [`SqliteStore::call`] for a lock write, which notes how to take itself back (see
    /// [`undo`]).
    async fn call_undoable<T, F>(&self, deadline: Option<Deadline>, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &mut Journal) -> Result<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Pending::new(op, deadline, reply));
        self.jobs
            .send(job)
            .await
            .map_err(|_| StoreError::unavailable("the SQLite thread has stopped"))?;
        answer
            .await
            .map_err(|_| StoreError::unavailable("the SQLite thread has stopped"))?
    }

    /// Runs the lock write `op` on `req` by `deadline` (see [`SqliteStore::call_undoable`]),
    /// and announces a change of `resource` to this process's waiters and watchers when
    /// `changed` says the outcome changed its lease (other processes see it in their poll of
    /// the file).
    async fn write_announced<R, T>(
        &self,
        resource: &ResourceName,
        deadline: Deadline,
        req: &R,
        op: LockWrite<R, T>,
        changed: fn(&T) -> bool,
    ) -> Result<T>
    where
        R: Clone + Send + 'static,
        T: Send + 'static,
    {
        let req = req.clone();
        let write = move |conn: &Connection, undo: &mut Journal| {
            // Every lock write answers 503 while the file cannot be written, also one that
            // would have changed nothing (a refused acquisition, another owner's renewal), as
            // on PostgreSQL: its answer would say what nobody could act on.
            if is_read_only(conn) {
                return Err(StoreError::NotWritable(anyhow::anyhow!(
                    "the SQLite file or its file system is read-only"
                )));
            }
            op(conn, &req, undo)
        };
        let outcome = self.call_undoable(Some(deadline), write).await?;
        if changed(&outcome) {
            self.changes.changed(resource.as_str());
        }
        Ok(outcome)
    }
}

pub use fencelock::guard::sqlite::classify;

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn acquire(&self, req: &AcquireRequest, deadline: Deadline) -> Result<AcquireOutcome> {
        let granted = |outcome: &_| matches!(outcome, AcquireOutcome::Acquired { .. });
        self.write_announced(&req.resource, deadline, req, ACQUIRE, granted)
            .await
    }

    async fn enqueue(&self, req: &AcquireRequest, wait: Duration) -> Result<Ticket> {
        let resource = req.resource.clone();
        self.call(None, move |conn| enqueue(conn, &resource, wait))
            .await
    }

    /// Releases do not serve waiters here (the head's own attempt follows at once, in the
    /// same process or within a poll), so a ticket never holds a grant.
    async fn dequeue(&self, req: &AcquireRequest, ticket: Ticket) -> Result<Option<Lease>> {
        self.call(None, move |conn| dequeue(conn, ticket)).await?;
        self.changes.changed(req.resource.as_str());
        Ok(None)
    }

    fn changes(&self) -> Arc<Changes> {
        self.changes.clone()
    }

    async fn beat(&self, tickets: &[Ticket]) -> Result<()> {
        let tickets = tickets.to_vec();
        self.call(None, move |conn| beat(conn, &tickets)).await
    }

    /// Looks at the resources acquired since this process's last trim (all of them, the
    /// first time), not at `recent`: the file has no index by time, but its history's key,
    /// the fence, grows with it.
    async fn trim_history(&self, keep: u64, _recent: Duration) -> Result<u64> {
        let since = self.trimmed_through.load(Ordering::Relaxed);
        let (trimmed, newest) = self
            .call(None, move |conn| history::trim(conn, keep, since))
            .await?;
        self.trimmed_through.fetch_max(newest, Ordering::Relaxed);
        Ok(trimmed)
    }

    async fn inspect(&self, resource: &ResourceName) -> Result<Inspection> {
        let resource = resource.clone();
        self.call(None, move |conn| inspect(conn, &resource)).await
    }

    async fn renew(&self, req: &RenewRequest, deadline: Deadline) -> Result<RenewOutcome> {
        // A renewal that brings the expiry closer is announced: waiters and watchers time
        // their next look by the expiry they last read.
        let shortened = |outcome: &(_, bool)| outcome.1;
        let (outcome, _) = self
            .write_announced(&req.resource, deadline, req, RENEW, shortened)
            .await?;
        Ok(outcome)
    }

    async fn release(&self, req: &ReleaseRequest, deadline: Deadline) -> Result<ReleaseOutcome> {
        let released = |outcome: &_| matches!(outcome, ReleaseOutcome::Released { .. });
        self.write_announced(&req.resource, deadline, req, RELEASE, released)
            .await
    }

    async fn purge_batch(&self, grace: Duration, limit: u64) -> Result<u64> {
        self.call(None, move |conn| purge_batch(conn, grace, limit))
            .await
    }

    async fn history(&self, req: &HistoryRequest) -> Result<LeaseHistory> {
        let req = req.clone();
        self.call(None, move |conn| history::read(conn, &req)).await
    }

    async fn purge_history_batch(&self, retention: Duration, limit: u64) -> Result<u64> {
        self.call(None, move |conn| history::purge(conn, retention, limit))
            .await
    }

    async fn count_live(&self) -> Result<u64> {
        self.call(None, count_live).await
    }

    /// A real write, committed like any lease change: a read-only file or file system, or a
    /// full disk, fails it the way it would fail an acquisition.
    async fn ping(&self) -> Result<()> {
        self.call(None, |conn| {
            conn.prepare_cached("UPDATE store_probe SET writes = writes + 1 WHERE id = 1")
                .and_then(|mut s| s.execute([]))
                .map(|_| ())
                .map_err(classify)
        })
        .await
    }

    async fn list(&self, req: &ListRequest) -> Result<LeasePage> {
        let req = req.clone();
        self.call(None, move |conn| list(conn, &req)).await
    }

    fn describe(&self) -> String {
        format!("SQLite file {}", self.path.display())
    }
}
