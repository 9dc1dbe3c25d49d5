//! Group commit: acquisitions, renewals and releases that arrive together are decided by one
//! statement (`fencelock_apply`, docs/design/0001-group-commit.md), in one transaction, with one
//! commit and one round trip for all of them.
//!
//! Requests are queued, and one committer, the lead, takes them: the first request that comes
//! and whatever else is queued at that moment (up to the batch maximum), sent as one
//! statement; each request is answered once the commit is done. There is no waiting window: a
//! request that finds the lead idle goes at once, as a batch of one; under load, requests
//! queue while the lead's batch runs and the next batch grows by itself. One batch at a time
//! makes the batches as large as the load allows, and a batch's cost to the database is
//! mostly per statement, not per request. A standby committer takes the queued requests only
//! while the lead has been stuck on one batch for [`STANDBY_AFTER`] (a row held from outside,
//! a slow database), so that one slow batch does not hold up all the others.
//!
//! What holds:
//! - Each request is decided by the rules of its single statement, against the state left by
//!   the requests before it in the batch. A batch is sent sorted by resource; requests for
//!   one resource in one batch are decided in queue order. Batches running at the same time
//!   meet only on lease row locks, which each takes in resource order, so they never
//!   deadlock (see the migration). Which of two such batches decides a resource first is up
//!   to the row lock, as it is for two single statements: both requests were in flight
//!   together.
//! - A request is answered only once its batch has committed. A request whose deadline has
//!   passed before its batch is sent, or before its row is written, is answered "too late"
//!   (`503`) and nothing of it is written; the others in the batch go on.
//! - If the database reports an error for the batch (a statement timeout, a row lock held
//!   longer than the batch waits for one), nothing was committed: each request is then
//!   decided alone, by the single statements, so one bad request never fails the others. If
//!   the connection fails instead, the commit's fate is unknown: every request of the batch
//!   is answered with that error (a `503`) and none is run again, since a release that did
//!   commit would be answered "not found" the second time.
//! - An acquisition with a quota is never batched (see `PgStore::acquire`).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::FutureExt as _;
use prometheus::{Histogram, IntCounter};
use tokio::sync::{Mutex, Notify, mpsc, oneshot};
use tokio_postgres::Row;
use tokio_postgres::error::Severity;
use tokio_postgres::types::{FromSql, ToSql};
use tracing::Instrument as _;

use super::{DRIVERS, Db, acquisition, classify};
use crate::store::{Deadline, StoreError};
use fencelock::domain::{
    AcquireOutcome, AcquireRequest, Fence, Lease, Owner, ReleaseOutcome, ReleaseRequest,
    RenewOutcome, RenewRequest, ResourceName,
};
use fencelock::metrics::{self, Registry};

/// Committers per store: the lead and the standby (only the lead with a pool of one); each
/// holds one pooled connection while it works.
const COMMITTERS: usize = 2;

/// How long the lead may be on one batch before the standby takes the requests queued behind
/// it. Far above a batch's usual time (a statement and a commit: about a millisecond, a few
/// under load), so that the standby works only when the lead is held up, by a row lock or a
/// database that has slowed down.
const STANDBY_AFTER: Duration = Duration::from_millis(20);

/// Longest a batch waits for one row lock (less with a short store timeout, see
/// [`lock_wait`]). Lease rows are locked only by single statements, each its own short
/// transaction, so a longer wait means a transaction from outside holds a row: the batch then
/// gives up, and its requests are decided alone, each waiting only for its own row.
const LOCK_WAIT_MAX: Duration = Duration::from_secs(1);

/// How much longer than the statement timeout a committer waits for an answer before it
/// gives the connection up (a network partition delivers no error, only silence).
const NO_ANSWER_GRACE: Duration = Duration::from_secs(1);

const APPLY: &str = "
SELECT ord, outcome, fence, acquired_at, expires_at, observed_at
FROM fencelock_apply($1, $2, $3, $4, $5, $6, $7, $8, $9)";

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
        let committers = Arc::new(Committers {
            db,
            jobs: Mutex::new(jobs),
            batch_max,
            metrics,
            lead: std::sync::Mutex::new(Lead::default()),
            lead_took: Notify::new(),
        });
        DRIVERS.spawn(committers.clone().lead());
        if pool_size.clamp(1, COMMITTERS) > 1 {
            DRIVERS.spawn(committers.standby());
        }
        Self { queue }
    }

    /// Queues `req` for the next batch and answers once that batch has committed.
    pub(super) async fn decide<R: Batched>(
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

/// A queued request, of one of the kinds [`Batched`] is for.
pub(super) enum Op {
    Acquire(AcquireRequest, Reply<AcquireOutcome>),
    Renew(RenewRequest, Reply<RenewOutcome>),
    Release(ReleaseRequest, Reply<ReleaseOutcome>),
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
        let _ = each_kind!(self.op, req, reply => reply.send(req.outcome(row)).is_ok());
    }

    /// Decides the request by its single statement.
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
    jobs: Mutex<mpsc::UnboundedReceiver<Job>>,
    batch_max: usize,
    metrics: BatchMetrics,
    /// What the lead is doing, for the standby.
    lead: std::sync::Mutex<Lead>,
    /// Woken when the lead takes a batch or stops.
    lead_took: Notify,
}

/// The lead committer's state, as the standby sees it.
#[derive(Clone, Copy, Default)]
struct Lead {
    /// When it took the batch it is on (which also tells one batch from the next); `None`
    /// while it waits for requests.
    since: Option<Instant>,
    /// The queue is closed and empty: the lead is done.
    stopped: bool,
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
    /// The lead: takes batches off the queue until the store is gone and the queue is empty.
    async fn lead(self: Arc<Self>) {
        while let Some(batch) = self.next_batch().await {
            self.update_lead(|lead| lead.since = Some(Instant::now()));
            self.lead_took.notify_one();
            self.commit_guarded(batch).await;
            self.update_lead(|lead| lead.since = None);
        }
        self.update_lead(|lead| lead.stopped = true);
        self.lead_took.notify_one();
    }

    /// The standby: takes batches off the queue only while the lead has been on one batch for
    /// [`STANDBY_AFTER`] or longer.
    async fn standby(self: Arc<Self>) {
        loop {
            let seen = self.lead_now();
            if seen.stopped {
                return;
            }
            let Some(since) = seen.since else {
                // A wake-up stored while nobody waited is kept, so a batch taken between the
                // look and the wait is not missed.
                self.lead_took.notified().await;
                continue;
            };
            tokio::time::sleep_until((since + STANDBY_AFTER).into()).await;
            if self.lead_now().since != Some(since) {
                // The lead is done with that batch.
                continue;
            }
            match self.next_batch().await {
                Some(batch) => self.commit_guarded(batch).await,
                None => return,
            }
        }
    }

    fn lead_now(&self) -> Lead {
        *self
            .lead
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn update_lead(&self, change: impl FnOnce(&mut Lead)) {
        change(
            &mut self
                .lead
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
    }

    async fn commit_guarded(&self, batch: Vec<Job>) {
        // A panic is a bug; it drops the batch's answers (its requests get `503`), not the
        // committer.
        if AssertUnwindSafe(self.commit(batch))
            .catch_unwind()
            .await
            .is_err()
        {
            tracing::error!("a PostgreSQL batch panicked; its requests were answered 503");
        }
    }

    /// The next request (waiting for one) and every request queued behind it, up to the
    /// batch maximum; `None` once the store is gone and nothing is queued.
    async fn next_batch(&self) -> Option<Vec<Job>> {
        let mut jobs = self.jobs.lock().await;
        let first = jobs.recv().await?;
        let mut batch = vec![first];
        while batch.len() < self.batch_max {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        Some(batch)
    }

    async fn commit(&self, batch: Vec<Job>) {
        let mut batch: Vec<Job> = batch
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
        // The order `fencelock_apply` takes its rows in, the same in every batch (byte order;
        // resource names are ASCII, so the database's "C" order agrees). Stable: requests
        // for one resource stay in queue order.
        batch.sort_by(|a, b| a.resource().cmp(b.resource()));
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
        let statement = client.prepare_cached(APPLY).await?;
        let sent = Instant::now();
        let rows = client
            .query(&statement, &arrays.with(&until, &lock_wait_ms))
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

/// Decides each request of a batch (in resource order) that the database refused by its
/// single statement: requests for one resource one after the other, in queue order;
/// different resources at the same time, so that one request waiting for its row holds up
/// no other.
async fn decide_each_alone(db: &Db, batch: Vec<Job>) {
    let mut groups: Vec<Vec<Job>> = Vec::new();
    for job in batch {
        match groups.last_mut() {
            Some(group) if group[0].resource() == job.resource() => group.push(job),
            _ => groups.push(vec![job]),
        }
    }
    futures_util::future::join_all(groups.into_iter().map(|group| async move {
        for job in group {
            job.decide_alone(db).await;
        }
    }))
    .await;
}

/// The longest a batch waits for one row lock: [`LOCK_WAIT_MAX`], or a quarter of a shorter
/// statement timeout, so that the requests have time left to be decided alone.
fn lock_wait(statement_timeout: Duration) -> i32 {
    let wait = (statement_timeout / 4)
        .min(LOCK_WAIT_MAX)
        .max(Duration::from_millis(1));
    i32::try_from(wait.as_millis()).unwrap_or(i32::MAX)
}

/// A lock write the committers decide, as `fencelock_apply` sees it: its element of each
/// of the statement's parameter arrays, and what its row of the answer says.
pub(super) trait Batched: Clone + Send + Sync + 'static {
    type Outcome: Send + 'static;

    /// The request queued, with where its answer goes.
    fn queued(self, reply: Reply<Self::Outcome>) -> Op;

    fn params(&self) -> Params<'_>;

    /// What the request's row of `fencelock_apply`'s answer says.
    fn outcome(&self, row: &Row) -> Result<Self::Outcome, StoreError>;

    /// The request decided alone, by `fencelock_apply` with this request only: the rules (and
    /// the history they write) exist once, in SQL, for batches and single statements alike.
    /// Its statement waits for its row lock without a bound of its own (the statement
    /// timeout still holds), as every single statement does; its `now()` is taken as a clock
    /// sample. (An acquisition alone has a statement of its own, see `Db::acquire_alone`.)
    async fn alone(&self, db: &Db, deadline: Deadline) -> Result<Self::Outcome, StoreError> {
        let until = vec![db.database_deadline(deadline).await?];
        let client = db.client().await?;
        let statement = client.prepare_cached(APPLY).await.map_err(classify)?;
        let arrays = Arrays::of([self.params()]);
        let no_lock_wait_bound = 0_i32;
        let sent = Instant::now();
        let row = client
            .query_one(&statement, &arrays.with(&until, &no_lock_wait_bound))
            .await
            .map_err(classify)?;
        db.clock.sample(column(&row, 5)?, sent);
        self.outcome(&row)
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
            lock_delay: None,
        }
    }
}

impl Batched for AcquireRequest {
    type Outcome = AcquireOutcome;

    fn queued(self, reply: Reply<AcquireOutcome>) -> Op {
        Op::Acquire(self, reply)
    }

    fn params(&self) -> Params<'_> {
        Params {
            ttl: Some(super::ttl_param(self.ttl.seconds())),
            token: self.token.as_ref().map(|t| t.name.as_str()),
            lock_delay: Some(super::lock_delay_param(self)),
            ..Params::of("acquire", &self.resource, &self.owner)
        }
    }

    fn outcome(&self, row: &Row) -> Result<AcquireOutcome, StoreError> {
        Ok(match column::<&str>(row, 1)? {
            "held" => super::held(column(row, 4)?, column(row, 5)?, column(row, 3)?),
            "too_late" => return Err(StoreError::too_late()),
            how => AcquireOutcome::Acquired {
                how: acquisition(how)?,
                lease: lease(&self.resource, &self.owner, row)?,
            },
        })
    }

    async fn alone(&self, db: &Db, deadline: Deadline) -> Result<AcquireOutcome, StoreError> {
        db.acquire_alone(self, deadline).await
    }
}

impl Batched for RenewRequest {
    type Outcome = RenewOutcome;

    fn queued(self, reply: Reply<RenewOutcome>) -> Op {
        Op::Renew(self, reply)
    }

    fn params(&self) -> Params<'_> {
        Params {
            ttl: Some(super::ttl_param(self.ttl.seconds())),
            fence: self.fence,
            ..Params::of("renew", &self.resource, &self.owner)
        }
    }

    fn outcome(&self, row: &Row) -> Result<RenewOutcome, StoreError> {
        Ok(match column::<&str>(row, 1)? {
            "renewed" => RenewOutcome::Renewed(lease(&self.resource, &self.owner, row)?),
            "not_found" => RenewOutcome::NotFound,
            "expired" => RenewOutcome::Expired,
            "owner_mismatch" => RenewOutcome::OwnerMismatch,
            "stale_fence" => RenewOutcome::StaleFence {
                current: fence_at(row, 2)?,
            },
            "too_late" => return Err(StoreError::too_late()),
            other => return Err(unknown(other)),
        })
    }
}

impl Batched for ReleaseRequest {
    type Outcome = ReleaseOutcome;

    fn queued(self, reply: Reply<ReleaseOutcome>) -> Op {
        Op::Release(self, reply)
    }

    fn params(&self) -> Params<'_> {
        Params {
            fence: self.fence,
            ..Params::of("release", &self.resource, &self.owner)
        }
    }

    fn outcome(&self, row: &Row) -> Result<ReleaseOutcome, StoreError> {
        Ok(match column::<&str>(row, 1)? {
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
            "too_late" => return Err(StoreError::too_late()),
            other => return Err(unknown(other)),
        })
    }
}

/// Requests as `fencelock_apply`'s parameter arrays: element `i` of each is request `i`.
struct Arrays<'a> {
    kinds: Vec<&'static str>,
    resources: Vec<&'a str>,
    owners: Vec<&'a str>,
    ttls: Vec<Option<i32>>,
    fences: Vec<Option<i64>>,
    tokens: Vec<Option<&'a str>>,
    lock_delays: Vec<Option<i32>>,
}

impl<'a> Arrays<'a> {
    fn of(requests: impl IntoIterator<Item = Params<'a>>) -> Self {
        let requests = requests.into_iter();
        let n = requests.size_hint().0;
        let mut arrays = Self {
            kinds: Vec::with_capacity(n),
            resources: Vec::with_capacity(n),
            owners: Vec::with_capacity(n),
            ttls: Vec::with_capacity(n),
            fences: Vec::with_capacity(n),
            tokens: Vec::with_capacity(n),
            lock_delays: Vec::with_capacity(n),
        };
        for request in requests {
            arrays.kinds.push(request.kind);
            arrays.resources.push(request.resource);
            arrays.owners.push(request.owner);
            arrays.ttls.push(request.ttl);
            arrays.fences.push(request.fence.map(Fence::get));
            arrays.tokens.push(request.token);
            arrays.lock_delays.push(request.lock_delay);
        }
        arrays
    }

    /// The statement's parameters: these arrays, each request's deadline on the database's
    /// clock (`until`), and the longest wait for one row lock (`lock_wait_ms`, 0: unbounded).
    fn with<'p>(
        &'p self,
        until: &'p Vec<DateTime<Utc>>,
        lock_wait_ms: &'p i32,
    ) -> [&'p (dyn ToSql + Sync); 9] {
        [
            &self.kinds,
            &self.resources,
            &self.owners,
            &self.ttls,
            &self.fences,
            &self.tokens,
            until,
            lock_wait_ms,
            &self.lock_delays,
        ]
    }
}

fn column<'a, T: FromSql<'a>>(row: &'a Row, index: usize) -> Result<T, StoreError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_waits_for_a_row_lock_at_most_a_quarter_of_the_statement_timeout() {
        assert_eq!(lock_wait(Duration::from_secs(5)), 1000);
        assert_eq!(lock_wait(Duration::from_millis(500)), 125);
        assert_eq!(lock_wait(Duration::from_millis(2)), 1);
    }
}
