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
//! the file itself. A process that cannot get the lock within [`BUSY_TIMEOUT`] answers `503`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::{mpsc, oneshot};

use super::{Deadline, LeaseStore, Result, StoreError, TICKET_LIFE};
use crate::wake::Changes;
use fencelock::domain::decide::{self, AcquireVerdict, HolderRefusal};
use fencelock::domain::{
    AcquireOutcome, AcquireRequest, Fence, HistoryRequest, Inspection, Lease, LeaseHistory,
    LockDelay, Owner, PastLease, RecordedEnd, ReleaseOutcome, ReleaseRequest, RenewOutcome,
    RenewRequest, ResourceName, Ticket, TokenQuota,
};
use fencelock::domain::{LeasePage, ListRequest, ListedLease};

mod embedded {
    refinery::embed_migrations!("migrations/sqlite");
}

#[cfg(debug_assertions)]
mod broken;
mod counter;
mod poll;
mod undo;

use undo::{Journal, Undo};

/// How long a transaction waits for another process's write lock before answering `503`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Most operations committed together; bounds the latency one batch adds to the next.
const MAX_BATCH: usize = 256;
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
        let job = Box::new(Pending {
            op: Some(op),
            result: None,
            undo: Vec::new(),
            deadline,
            reply,
        });
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
        op: fn(&Connection, &R, &mut Journal) -> Result<T>,
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

/// Opens the file, without creating it, and verifies without changing anything that it can
/// serve leases: it can be written, and its schema is exactly this build's. Returns what was
/// found, or the cause of the first problem in one line.
pub(crate) fn check(path: &Path) -> anyhow::Result<String> {
    let flags =
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = Connection::open_with_flags(path, flags)
        .with_context(|| format!("opening SQLite database {} (it must exist)", path.display()))?;
    if is_read_only(&conn) {
        anyhow::bail!("the SQLite file {} is read-only", path.display());
    }
    let version = schema_version(&mut conn, path)?;
    for probe in SCHEMA_PROBES {
        conn.execute_batch(probe)
            .with_context(|| format!("the schema is not fencelock's ({probe})"))?;
    }
    counter::check(&conn).with_context(|| path.display().to_string())?;
    Ok(format!(
        "SQLite file {} has schema version {version}",
        path.display()
    ))
}

/// The schema version of the file, if it is exactly this build's; otherwise why not.
fn schema_version(conn: &mut Connection, path: &Path) -> anyhow::Result<i32> {
    let runner = embedded::migrations::runner();
    // Without the history table refinery's own read fails with "no such table": a file never
    // migrated is said to be one.
    let history: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'refinery_schema_history')",
            [],
            |row| row.get(0),
        )
        .with_context(|| format!("reading the SQLite file {}", path.display()))?;
    let applied = if history {
        runner
            .get_applied_migrations(conn)
            .map_err(|e| anyhow::anyhow!("reading the applied migrations: {e}"))?
    } else {
        Vec::new()
    };
    super::postgres::schema_version(runner.get_migrations(), &applied)
}

/// What `check` reads to make sure the tables the statements use are there, with the columns
/// they use. Reads only.
const SCHEMA_PROBES: [&str; 5] = [
    "SELECT resource, owner, fence, acquired_at, expires_at, token, lock_delay_ms FROM leases LIMIT 0",
    "SELECT fence, resource, acquired_at, expires_at, ended_at, end_kind, renewals FROM lease_history LIMIT 0",
    "SELECT ticket, resource, expires_at FROM lease_waiters LIMIT 0",
    "SELECT last_fence FROM fence_counter WHERE id = 1",
    "SELECT writes FROM store_probe WHERE id = 1",
];

/// Opens the file for the store: WAL, durable commits, a bounded wait for other processes.
///
/// Services beside the lease store (the demo's document store) open their SQLite files with
/// it too, so their writes get the same durability settings; it fails if WAL mode does not
/// take.
pub fn connect(path: &Path) -> anyhow::Result<Connection> {
    let conn = Connection::open(path)
        .with_context(|| format!("opening SQLite database {}", path.display()))?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // WAL lets readers of other processes go on while we write. synchronous=FULL makes
    // every commit durable before it returns, also on power loss: with NORMAL, WAL mode
    // may lose the last commits, and a lost fence-counter update would let the next
    // acquisition re-issue a fence a client already holds.
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        anyhow::bail!("{}: could not switch to WAL journal mode", path.display());
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    // The upper levels of the lease table and its indexes stay in memory however large the
    // table grows, and the WAL is copied back into the file in fewer, larger checkpoints (a
    // page written by many commits in between is copied once). Durability is unchanged:
    // every commit is still synced to the WAL before it returns.
    conn.pragma_update(None, "cache_size", CACHE_KIB)?;
    conn.pragma_update(None, "wal_autocheckpoint", CHECKPOINT_PAGES)?;
    prepare_once(&conn)?;
    Ok(conn)
}

/// Makes every cached statement stay prepared: each is parsed and planned once, not on each
/// use.
///
/// SQLite plans some statements for the values bound to them, and prepares such a statement
/// again whenever a new value is bound, as if the schema had changed: a `min()` over a
/// resource's queue is one (`WAITERS_AHEAD`), prepared anew on every acquisition, a fifth of
/// the store thread's time under load. The store's statements are all searches of a key or
/// an index, whatever the values, so plans that ignore them (SQLite's query planner
/// stability guarantee) lose nothing. And rusqlite keeps 16 statements by default, fewer
/// than the store has: one pushed out of the cache is prepared again on its next use.
fn prepare_once(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(())
}

/// The page cache of the store's connection, in KiB (negative: SQLite's unit for "KiB, not
/// pages"); SQLite's default is 2 MiB.
const CACHE_KIB: i64 = -16 * 1024;
/// WAL pages after which a commit copies the WAL back into the file; SQLite's default is 1000.
const CHECKPOINT_PAGES: i64 = 4000;
/// Prepared statements kept per connection: the store has about two dozen.
const STATEMENT_CACHE: usize = 64;

/// Whether `path` is an existing file on a file system mounted read-only.
fn on_read_only_file_system(path: &Path) -> bool {
    path.is_file()
        && matches!(
            std::fs::OpenOptions::new().append(true).open(path),
            Err(e) if e.kind() == std::io::ErrorKind::ReadOnlyFilesystem
        )
}

/// Opens a file on a read-only file system for reading, once its schema is found current.
///
/// After a clean shutdown there is no WAL beside the file, and none can be created: the file
/// is opened `immutable` (nothing can change it while the file system stays read-only, so
/// SQLite needs no locks and no WAL index). A WAL left by a crash holds commits the file does
/// not: then the file is opened read-only as usual, which reads the WAL, or fails with a
/// clear cause, never serving the file without its last commits.
fn open_frozen(path: &Path) -> anyhow::Result<Connection> {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let wal_has_commits = std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0);
    let flags =
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = if wal_has_commits {
        Connection::open_with_flags(path, flags)?
    } else {
        let uri = format!("file:{}?immutable=1", uri_path(path));
        Connection::open_with_flags(uri, flags | rusqlite::OpenFlags::SQLITE_OPEN_URI)?
    };
    schema_version(&mut conn, path)?;
    prepare_once(&conn)?;
    Ok(conn)
}

/// `path` as the path of a `file:` URI: the characters a URI gives a meaning to escaped.
fn uri_path(path: &Path) -> String {
    let mut out = String::new();
    for byte in path.as_os_str().as_encoded_bytes() {
        match byte {
            b'%' | b'?' | b'#' => out.push_str(&format!("%{byte:02X}")),
            b if b.is_ascii() => out.push(char::from(*b)),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// SQLite opens a file it may not write read-only, without an error; writes then fail.
fn is_read_only(conn: &Connection) -> bool {
    conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false)
}

/// How often a connection that was opened read-only tries to reopen the file for writing.
const REOPEN_EVERY: Duration = Duration::from_secs(1);

/// Concurrent starts on one new file race to migrate; the loser's attempt fails on the
/// winner's tables, and a second look finds everything applied.
fn migrate(conn: &mut Connection) -> anyhow::Result<()> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        match embedded::migrations::runner().run(conn) {
            Ok(report) => {
                for migration in report.applied_migrations() {
                    tracing::info!(migration = %migration, "applied SQLite migration");
                }
                return Ok(());
            }
            Err(e) if attempts < 3 => {
                tracing::debug!(error = %e, "migration attempt failed; trying again");
            }
            Err(e) => return Err(anyhow::anyhow!("{e}")),
        }
    }
}

/// One queued operation. `run` executes it inside the batch's transaction and keeps the
/// result; `finish` hands it over once the commit's fate is known.
trait Job: Send {
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

struct Pending<T, F> {
    op: Option<F>,
    result: Option<Result<T>>,
    undo: Vec<Undo>,
    deadline: Option<Deadline>,
    reply: oneshot::Sender<Result<T>>,
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

fn run_jobs(
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

pub use fencelock::guard::sqlite::classify;

/// The store's clock: this process's wall clock, in Unix milliseconds. Every server sharing a
/// file runs on the same machine, so they share this clock.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn timestamp(ms: i64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Internal(anyhow::anyhow!("stored time {ms} is out of range")))
}

fn stored_fence(value: i64) -> Result<Fence> {
    Fence::new(value).map_err(|e| StoreError::Internal(anyhow::anyhow!("fence: {e}")))
}

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

/// The row of a resource as the operations below need it.
struct Row {
    owner: String,
    /// The name of the token the lease was taken with, if the server checks tokens.
    token: Option<String>,
    fence: Fence,
    acquired_at: i64,
    expires_at: DateTime<Utc>,
    lock_delay: LockDelay,
}

impl Row {
    fn current(&self) -> decide::Current<'_> {
        decide::Current {
            owner: &self.owner,
            fence: self.fence,
            expires_at: self.expires_at,
            lock_delay: self.lock_delay,
        }
    }
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
    if broken::handover_reversed() {
        return broken::WAITERS_BEHIND;
    }
    WAITERS_AHEAD
}

/// A ticket at the end of the queue: it lives by its heartbeat (`lease_waiters.expires_at`),
/// [`TICKET_LIFE`] at first, never past the wait's end, extended by [`beat`] while its waiter is
/// alive.
fn enqueue(conn: &Connection, resource: &ResourceName, wait: Duration) -> Result<Ticket> {
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
fn beat(conn: &Connection, tickets: &[Ticket]) -> Result<()> {
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

fn dequeue(conn: &Connection, ticket: Ticket) -> Result<()> {
    conn.prepare_cached("DELETE FROM lease_waiters WHERE ticket = ?1")
        .and_then(|mut s| s.execute([ticket.get()]))
        .map(|_| ())
        .map_err(classify)
}

fn inspect(conn: &Connection, resource: &ResourceName) -> Result<Inspection> {
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
fn purge_batch(conn: &Connection, grace: Duration, limit: u64) -> Result<u64> {
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
fn count_live(conn: &Connection) -> Result<u64> {
    conn.prepare_cached("SELECT count(*) FROM leases WHERE expires_at > ?1")
        .and_then(|mut s| s.query_row([now_ms()], |r| r.get::<_, i64>(0)))
        .map(|n| u64::try_from(n).unwrap_or(0))
        .map_err(classify)
}

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn acquire(&self, req: &AcquireRequest, deadline: Deadline) -> Result<AcquireOutcome> {
        let granted = |outcome: &_| matches!(outcome, AcquireOutcome::Acquired { .. });
        self.write_announced(&req.resource, deadline, req, acquire, granted)
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
            .write_announced(&req.resource, deadline, req, renew, shortened)
            .await?;
        Ok(outcome)
    }

    async fn release(&self, req: &ReleaseRequest, deadline: Deadline) -> Result<ReleaseOutcome> {
        let released = |outcome: &_| matches!(outcome, ReleaseOutcome::Released { .. });
        self.write_announced(&req.resource, deadline, req, release, released)
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

/// One range of a list page, `[?1, ?2)`: the leases live at `?3`, at most `?4` of them.
const LIST: &str = "
SELECT resource, fence, acquired_at, expires_at FROM leases
WHERE resource >= ?1 AND resource < ?2 AND expires_at > ?3
ORDER BY resource LIMIT ?4";

/// One page of live leases: the scope's ranges in name order, each read up to what the page
/// still needs, plus one lease that tells whether a next page exists. `resource` is the
/// primary key, compared with BINARY collation (byte order, as PostgreSQL's "C"), so each
/// range is a search of its index. All ranges are read in the batch's one transaction.
fn list(conn: &Connection, req: &ListRequest) -> Result<LeasePage> {
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

/// The `lease_history` table: written in the batch transaction with the lease
/// change it records, read by `GET /locks/{resource}/history`.
mod history {
    use super::*;

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
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock::domain::{LockDelay, Ttl, WaitFor};

    /// The statements of acquisitions stay prepared from one acquisition to the next, whatever
    /// values are bound (see `prepare_once`).
    #[test]
    fn statements_are_prepared_once() {
        let mut conn = Connection::open_in_memory().unwrap();
        embedded::migrations::runner().run(&mut conn).unwrap();
        prepare_once(&conn).unwrap();
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
        let mut conn = Connection::open_in_memory().unwrap();
        embedded::migrations::runner().run(&mut conn).unwrap();
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
