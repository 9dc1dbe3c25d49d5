//! Group commit: acquisitions, renewals and releases that arrive together are decided by one
//! call of `fencelock_apply` (docs/design/0001-group-commit.md), in one transaction, with one
//! commit and one round trip for all of them.
//!
//! Requests are queued, and a committer, the lead, takes them: the first request that comes
//! and whatever else is queued at that moment (up to the batch maximum), sent as one
//! statement; each request is answered once the commit is done. There is no waiting window: a
//! request that finds the lead free goes at once, as a batch of one; under load, requests
//! queue while the lead's batch runs, and the next batch grows by itself, so that the
//! database decides many requests per statement and per commit. Behind the lead stand a few
//! more committers, each the standby of the one before it: a standby takes batches only
//! while the committer before it has been on one batch for [`STANDBY_AFTER`] (a row held
//! from outside, a slow disk), so that one batch held up holds up the others for that long
//! at most.
//!
//! What holds:
//! - A batch holds at most one request per resource (and one acquisition under each token's
//!   quota): a second one waits for the next batch, in queue order. The requests of a batch
//!   are therefore independent, and `fencelock_apply` decides them together, each by the
//!   rules of its single form. Batches meet only on the advisory locks of their resources and
//!   tokens, which each takes in one global order, so they never deadlock (see the
//!   migration); which of two batches decides a resource first is up to that lock, as it is
//!   for two single statements: both requests were in flight together.
//! - A request is answered only once its batch has committed. A request whose deadline has
//!   passed before its batch is sent, or before its row is written, is answered "too late"
//!   (`503`) and nothing of it is written; the others in the batch go on.
//! - If the database reports an error for the batch (a statement timeout, a lock held
//!   longer than the batch waits for one), nothing was committed: each request is then
//!   decided alone, so one bad request never fails the others. If the connection fails
//!   instead, the commit's fate is unknown: every request of the batch is answered with that
//!   error (a `503`) and none is run again, since a release that did commit would be
//!   answered "not found" the second time.

use std::collections::{HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::FutureExt as _;
use prometheus::{Histogram, IntCounter};
use tokio::sync::{Mutex, Notify, mpsc, oneshot};
use tokio_postgres::Row;
use tokio_postgres::error::Severity;
use tracing::Instrument as _;

use super::apply::{APPLY, Arrays, LockWrite, column};
use super::{DRIVERS, Db, classify};
use crate::store::{Deadline, StoreError};
use fencelock::domain::{
    AcquireOutcome, AcquireRequest, ReleaseOutcome, ReleaseRequest, RenewOutcome, RenewRequest,
};
use fencelock::metrics::{self, Registry};

/// Most batches one store has in flight at once (fewer with a smaller pool): the lead and its
/// standbys. Each committer holds one pooled connection while it works.
pub const COMMITTERS: usize = 4;

/// How long a committer may be on one batch before its standby takes the requests queued
/// behind it: many times what a batch takes (a few milliseconds under load), so that the
/// standby works only when a batch is held up. Several batches side by side all the time would
/// each be smaller, and cost the database more per request (docs/design/0001).
const STANDBY_AFTER: Duration = Duration::from_millis(20);

/// Longest a batch waits for one lock (less with a short store timeout, see [`lock_wait`]).
/// Leases are changed only by decisions, each a short transaction, so a longer wait means a
/// transaction from outside holds a row: the batch then gives up, and its requests are decided
/// alone, each waiting only for its own resource.
const LOCK_WAIT_MAX: Duration = Duration::from_secs(1);

/// How much longer than the statement timeout a committer waits for an answer before it
/// gives the connection up (a network partition delivers no error, only silence).
const NO_ANSWER_GRACE: Duration = Duration::from_secs(1);

/// What the committers count, for every app that shows the store's metrics.
#[derive(Clone)]
pub(super) struct BatchMetrics {
    /// `fencelock_store_batch_size`: requests per statement sent.
    sizes: Histogram,
    /// `fencelock_store_batches_refused_total`: batches decided again request by request.
    refused: IntCounter,
}

impl BatchMetrics {
    pub(super) fn new() -> Self {
        Self {
            sizes: metrics::detached_histogram(
                &metrics::STORE_BATCH_SIZE,
                metrics::BATCH_SIZE_BUCKETS,
            ),
            refused: metrics::detached_counter(&metrics::STORE_BATCHES_REFUSED),
        }
    }

    /// Adds both families to an app's registry.
    pub(super) fn register(&self, registry: &Registry) {
        metrics::add(registry, &metrics::STORE_BATCH_SIZE, &self.sizes);
        metrics::add(registry, &metrics::STORE_BATCHES_REFUSED, &self.refused);
    }
}

/// The queue of the store's lock requests; dropping it lets the committers finish the
/// requests already queued, then stop.
pub(super) struct Batcher {
    queue: mpsc::UnboundedSender<Job>,
}

impl Batcher {
    /// Starts the committers (on the runtime the pool's connections live on) for batches of at
    /// most `batch_max` requests, counted in `metrics`.
    pub(super) fn start(
        db: Arc<Db>,
        pool_size: usize,
        batch_max: usize,
        metrics: BatchMetrics,
    ) -> Self {
        let (queue, jobs) = mpsc::unbounded_channel();
        let count = pool_size.clamp(1, COMMITTERS);
        let committers = Arc::new(Committers {
            db,
            intake: Mutex::new(Intake {
                jobs,
                deferred: VecDeque::new(),
            }),
            batch_max,
            metrics,
            states: (0..count).map(|_| Watched::default()).collect(),
        });
        for rank in 0..count {
            DRIVERS.spawn(committers.clone().run(rank));
        }
        Self { queue }
    }

    /// Queues `req` for the next batch and answers once that batch has committed.
    pub(super) async fn decide<R: Queued>(
        &self,
        req: &R,
        deadline: Deadline,
    ) -> Result<R::Outcome, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Job {
                op: req.clone().queued(reply),
                deadline,
            })
            .map_err(|_| unanswered())?;
        answer.await.unwrap_or_else(|_| Err(unanswered()))
    }
}

/// A request dropped without an answer: its committer stopped (the store is going away) or
/// failed.
fn unanswered() -> StoreError {
    StoreError::unavailable("the PostgreSQL store stopped before it decided the request")
}

pub(super) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// One queued request and where its answer goes.
struct Job {
    op: Op,
    deadline: Deadline,
}

/// Declares [`Op`], a queued request of one of the kinds [`LockWrite`] is for, and how each
/// kind is queued as its variant ([`Queued`]).
macro_rules! kinds {
    ($($kind:ident($request:ty) -> $outcome:ty),* $(,)?) => {
        /// A queued request, of one of the kinds [`LockWrite`] is for.
        pub(super) enum Op {
            $($kind($request, Reply<$outcome>),)*
        }

        $(
            impl Queued for $request {
                fn queued(self, reply: Reply<$outcome>) -> Op {
                    Op::$kind(self, reply)
                }
            }
        )*
    };
}

kinds! {
    Acquire(AcquireRequest) -> AcquireOutcome,
    Renew(RenewRequest) -> RenewOutcome,
    Release(ReleaseRequest) -> ReleaseOutcome,
}

/// `$body` with `$req` and `$reply` bound to the request and the reply `$op` holds, whatever
/// its kind: the kinds differ in their types, not in what is done with them.
macro_rules! each_kind {
    ($op:expr, $req:pat, $reply:pat => $body:expr) => {
        match $op {
            Op::Acquire($req, $reply) => $body,
            Op::Renew($req, $reply) => $body,
            Op::Release($req, $reply) => $body,
        }
    };
}

impl Job {
    fn resource(&self) -> &str {
        each_kind!(&self.op, req, _ => req.resource.as_str())
    }

    /// The token whose quota this request must keep: an acquisition's, with a quota.
    fn quota_token(&self) -> Option<&str> {
        match &self.op {
            Op::Acquire(req, _) => req
                .token
                .as_ref()
                .filter(|t| t.max_leases.is_some())
                .map(|t| t.name.as_str()),
            Op::Renew(..) | Op::Release(..) => None,
        }
    }

    /// Nobody waits for the answer any more: the request was answered `503` on its timeout,
    /// or its client went away. Not doing the work is then the same as never being asked.
    fn abandoned(&self) -> bool {
        each_kind!(&self.op, _, reply => reply.is_closed())
    }

    fn fail(self, error: StoreError) {
        // A requester that is gone needs no answer.
        let _ = each_kind!(self.op, _, reply => reply.send(Err(error)).is_ok());
    }

    /// Answers from the batch's row for this request.
    fn answer(self, row: Option<&Row>) {
        let Some(row) = row else {
            return self.fail(StoreError::Internal(anyhow::anyhow!(
                "fencelock_apply gave no answer for a request"
            )));
        };
        let _ = each_kind!(self.op, req, reply => reply.send(req.answer(row)).is_ok());
    }

    /// Decides the request alone.
    async fn decide_alone(self, db: &Db) {
        if self.abandoned() {
            return;
        }
        if self.deadline.has_passed() {
            return self.fail(StoreError::too_late());
        }
        let deadline = self.deadline;
        let bound = db.statement_timeout + NO_ANSWER_GRACE;
        let _ = each_kind!(self.op, req, reply => reply
            .send(bounded(bound, req.alone(db, deadline)).await)
            .is_ok());
    }
}

/// `operation`'s answer, or `503` if there is none within `bound`.
async fn bounded<T>(
    bound: Duration,
    operation: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(bound, operation)
        .await
        .unwrap_or_else(|_| Err(no_answer(bound)))
}

fn no_answer(bound: Duration) -> StoreError {
    StoreError::unavailable(format!("PostgreSQL did not answer within {bound:?}"))
}

/// What the committers of one store share.
struct Committers {
    db: Arc<Db>,
    intake: Mutex<Intake>,
    batch_max: usize,
    metrics: BatchMetrics,
    /// What each committer is doing, by rank (0: the lead), for its standby.
    states: Vec<Watched>,
}

/// A committer's state, and a wake-up for its standby whenever it changes.
#[derive(Default)]
struct Watched {
    state: std::sync::Mutex<CommitterState>,
    changed: Notify,
}

/// What a committer is doing, as its standby sees it.
#[derive(Clone, Copy, Default)]
struct CommitterState {
    /// When it took the batch it is on (which also tells one batch from the next); `None`
    /// while it waits for requests, or for the committer before it.
    since: Option<Instant>,
    /// The queue is closed and empty: the committer is done.
    stopped: bool,
}

impl Watched {
    fn now(&self) -> CommitterState {
        *self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn update(&self, change: impl FnOnce(&mut CommitterState)) {
        change(
            &mut self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        // Kept when nobody waits (`notify_one`), so that a change between a standby's look and
        // its wait is not missed.
        self.changed.notify_one();
    }

    /// Waits until the committer has been on one batch for [`STANDBY_AFTER`]; `false` once it
    /// has stopped.
    async fn held_up(&self) -> bool {
        loop {
            let seen = self.now();
            if seen.stopped {
                return false;
            }
            let Some(since) = seen.since else {
                self.changed.notified().await;
                continue;
            };
            tokio::time::sleep_until((since + STANDBY_AFTER).into()).await;
            if self.now().since == Some(since) {
                return true;
            }
        }
    }
}

/// Where batches come from: the queue, and the requests an earlier batch could not take
/// (a second request for one of its resources), which go first, in their order.
struct Intake {
    jobs: mpsc::UnboundedReceiver<Job>,
    deferred: VecDeque<Job>,
}

impl Intake {
    /// The next request (waiting for one) and every request queued behind it that the batch
    /// can take, up to `max`; `None` once the store is gone and nothing is queued.
    async fn next_batch(&mut self, max: usize) -> Option<Vec<Job>> {
        let first = match self.deferred.pop_front() {
            Some(job) => job,
            None => self.jobs.recv().await?,
        };
        let mut batch = Batch::new(first);
        let mut skipped = VecDeque::new();
        while batch.jobs.len() < max {
            let Some(job) = self.deferred.pop_front() else {
                break;
            };
            batch.take(job, &mut skipped);
        }
        while batch.jobs.len() < max {
            let Ok(job) = self.jobs.try_recv() else {
                break;
            };
            batch.take(job, &mut skipped);
        }
        // Left over: the skipped requests, then what the batch had no room for, in order.
        skipped.append(&mut self.deferred);
        self.deferred = skipped;
        Some(batch.jobs)
    }
}

/// A batch being gathered: its requests, and the resources and quota tokens they claim.
struct Batch {
    jobs: Vec<Job>,
    resources: HashSet<String>,
    tokens: HashSet<String>,
}

impl Batch {
    fn new(first: Job) -> Self {
        let mut batch = Self {
            jobs: Vec::new(),
            resources: HashSet::new(),
            tokens: HashSet::new(),
        };
        let mut none = VecDeque::new();
        batch.take(first, &mut none);
        batch
    }

    /// Adds `job`, or puts it in `skipped` if the batch already has a request for its
    /// resource, or an acquisition under its token's quota.
    fn take(&mut self, job: Job, skipped: &mut VecDeque<Job>) {
        let taken = self.resources.contains(job.resource())
            || job.quota_token().is_some_and(|t| self.tokens.contains(t));
        if taken {
            skipped.push_back(job);
            return;
        }
        self.resources.insert(job.resource().to_owned());
        if let Some(token) = job.quota_token() {
            self.tokens.insert(token.to_owned());
        }
        self.jobs.push(job);
    }
}

/// Why a batch got no answers.
enum Failure {
    /// The database refused the statement: nothing was committed, and each request may be
    /// decided again, alone.
    Undone(tokio_postgres::Error),
    /// No statement was sent (no connection), or the commit's fate is unknown: every request
    /// gets this error.
    Unanswered(StoreError),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        // An ERROR ends the statement's transaction before its commit. FATAL and PANIC end
        // the session or the server, and an error without a database report is the
        // connection's: for those the commit may or may not have happened.
        let undone = e
            .as_db_error()
            .is_some_and(|db| db.parsed_severity() == Some(Severity::Error));
        if undone {
            Self::Undone(e)
        } else {
            Self::Unanswered(classify(e))
        }
    }
}

impl Committers {
    /// The committer of `rank`: takes batches off the queue (when it is a standby, only while
    /// the committer before it is held up) until the store is gone and nothing is left.
    async fn run(self: Arc<Self>, rank: usize) {
        let own = &self.states[rank];
        loop {
            if let Some(before) = rank.checked_sub(1)
                && !self.states[before].held_up().await
            {
                break;
            }
            let batch = self.intake.lock().await.next_batch(self.batch_max).await;
            let Some(batch) = batch else {
                break;
            };
            own.update(|state| state.since = Some(Instant::now()));
            // A panic is a bug; it drops the batch's answers (its requests get `503`), not
            // the committer.
            if AssertUnwindSafe(self.commit(batch))
                .catch_unwind()
                .await
                .is_err()
            {
                tracing::error!("a PostgreSQL batch panicked; its requests were answered 503");
            }
            own.update(|state| state.since = None);
        }
        own.update(|state| state.stopped = true);
    }

    async fn commit(&self, batch: Vec<Job>) {
        let batch: Vec<Job> = batch
            .into_iter()
            .filter(|job| !job.abandoned())
            .filter_map(|job| {
                if job.deadline.has_passed() {
                    job.fail(StoreError::too_late());
                    None
                } else {
                    Some(job)
                }
            })
            .collect();
        if batch.is_empty() {
            return;
        }
        self.metrics.sizes.observe(batch.len() as f64);
        let span = tracing::debug_span!("pg_batch", size = batch.len());
        match self.apply(&batch).instrument(span).await {
            Ok(rows) => {
                for (job, row) in batch.into_iter().zip(rows) {
                    job.answer(row.as_ref());
                }
            }
            Err(Failure::Undone(e)) => {
                self.metrics.refused.inc();
                tracing::warn!(
                    error = %format!("{:#}", anyhow::Error::new(e)),
                    size = batch.len(),
                    "PostgreSQL refused a batch of lock requests; deciding each alone"
                );
                // Beside the committer, which goes on with the next batch: a request that
                // waits for a row held from outside holds up nothing else.
                let db = self.db.clone();
                tokio::spawn(async move { decide_each_alone(&db, batch).await });
            }
            Err(Failure::Unanswered(e)) => {
                for job in batch {
                    job.fail(e.same_kind());
                }
            }
        }
    }

    /// Runs the batch's statement; returns each request's row, in the batch's order.
    async fn apply(&self, batch: &[Job]) -> Result<Vec<Option<Row>>, Failure> {
        let db = &self.db;
        let client = db.client().await.map_err(Failure::Unanswered)?;
        let bound = db.statement_timeout + NO_ANSWER_GRACE;
        match tokio::time::timeout(bound, self.send(&client, batch)).await {
            Ok(rows) => rows,
            Err(_) => {
                // A silent connection may still deliver the answer later, to nobody: it
                // leaves the pool rather than hold up the next batch.
                drop(deadpool_postgres::Object::take(client));
                Err(Failure::Unanswered(no_answer(bound)))
            }
        }
    }

    async fn send(
        &self,
        client: &deadpool_postgres::Object,
        batch: &[Job],
    ) -> Result<Vec<Option<Row>>, Failure> {
        let db = &self.db;
        if db.clock.database_time(batch[0].deadline).is_none() {
            db.read_clock(client).await.map_err(Failure::Unanswered)?;
        }
        let until = batch
            .iter()
            .map(|job| db.clock.database_time(job.deadline))
            .collect::<Option<Vec<DateTime<Utc>>>>()
            .ok_or_else(|| {
                Failure::Unanswered(StoreError::Internal(anyhow::anyhow!(
                    "the database clock is unset"
                )))
            })?;
        let arrays = Arrays::of(
            batch
                .iter()
                .map(|job| each_kind!(&job.op, req, _ => req.params())),
        );
        let lock_wait_ms = lock_wait(db.statement_timeout);
        let sent = Instant::now();
        let rows = db
            .statements
            .query(client, &APPLY, &arrays.with(&until, &lock_wait_ms))
            .await?;
        if let Some(now) = rows.first().and_then(|row| column(row, 5).ok()) {
            db.clock.sample(now, sent);
        }
        let mut answers: Vec<Option<Row>> = batch.iter().map(|_| None).collect();
        for row in rows {
            // Committed by now: a bad answer is a bug, reported to every request.
            let ord: i32 = column(&row, 0).map_err(Failure::Unanswered)?;
            let slot = usize::try_from(ord)
                .ok()
                .and_then(|ord| ord.checked_sub(1))
                .and_then(|index| answers.get_mut(index));
            if let Some(slot) = slot {
                *slot = Some(row);
            }
        }
        Ok(answers)
    }
}

/// Decides each request of a batch the database refused on its own: requests for one
/// resource one after the other, in queue order; different resources at the same time, so
/// that one request waiting for its row holds up no other.
async fn decide_each_alone(db: &Db, batch: Vec<Job>) {
    let mut groups: Vec<Vec<Job>> = Vec::new();
    for job in batch {
        match groups
            .iter_mut()
            .find(|group| group[0].resource() == job.resource())
        {
            Some(group) => group.push(job),
            None => groups.push(vec![job]),
        }
    }
    futures_util::future::join_all(groups.into_iter().map(|group| async move {
        for job in group {
            job.decide_alone(db).await;
        }
    }))
    .await;
}

/// The longest a batch waits for one lock: [`LOCK_WAIT_MAX`], or a quarter of a shorter
/// statement timeout, so that the requests have time left to be decided alone.
fn lock_wait(statement_timeout: Duration) -> i32 {
    let wait = (statement_timeout / 4)
        .min(LOCK_WAIT_MAX)
        .max(Duration::from_millis(1));
    i32::try_from(wait.as_millis()).unwrap_or(i32::MAX)
}

/// A request as a batch queues it: as its variant of [`Op`] (see `kinds!`), with where its
/// answer goes.
pub(super) trait Queued: LockWrite {
    fn queued(self, reply: Reply<Self::Outcome>) -> Op;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_waits_for_a_row_lock_at_most_a_quarter_of_the_statement_timeout() {
        assert_eq!(lock_wait(Duration::from_secs(5)), 1000);
        assert_eq!(lock_wait(Duration::from_millis(500)), 125);
        assert_eq!(lock_wait(Duration::from_millis(2)), 1);
    }

    /// A standby stands in only for a committer that has been on one batch for
    /// `STANDBY_AFTER`: never for an idle one, never before that time, and it stops with it.
    #[tokio::test]
    async fn a_standby_stands_in_only_for_a_committer_held_up() {
        let before = Watched::default();
        let idle = tokio::time::timeout(STANDBY_AFTER * 5, before.held_up()).await;
        assert!(idle.is_err(), "a standby stood in for an idle committer");

        let since = Instant::now();
        before.update(|state| state.since = Some(since));
        assert!(before.held_up().await);
        assert!(since.elapsed() >= STANDBY_AFTER, "stood in too soon");

        before.update(|state| state.stopped = true);
        assert!(
            !before.held_up().await,
            "a standby outlived the committer before it"
        );
    }
}
