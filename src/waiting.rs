//! Waiting acquisitions (`wait_ms`): the loop above the store that queues a request behind a
//! held resource and tries again whenever the store announces a change, or when the lease
//! (or the queue ahead) may have run out by the store's clock.
//!
//! The store offers small primitives, each one atomic step: `acquire` (which grants only to
//! the head of a non-empty queue), `enqueue`, `dequeue`, and its wake registry
//! ([`crate::wake::Changes`]). The loop costs no store round trip while nothing changes,
//! beyond one attempt per deadline the store named (`free_in`).
//!
//! Of this process's waiters of one resource only the one with the smallest ticket listens
//! and attempts; the others sleep until it has left (the store's waiting lines,
//! [`crate::wake::Lines`]): only the store's head can win, and waking every waiter on every
//! change cost a store transaction each. One that leaves with the lease tells the next what
//! it saw ([`Handoff`]): the lease is its own until its expiry, as of the changes announced
//! so far, so the next waits for a later change (or that expiry) instead of looking at once
//! and finding it held. But the waiters of its own owner, first or not, attempt at once: they
//! re-acquire the lease (no change is announced for them to wake on when a release handed it
//! over in its own transaction, as on PostgreSQL).
//!
//! A store may also serve the queue itself: PostgreSQL grants a released lease to the first ticket
//! in the release's own transaction (docs/design/0003-handover-on-release.md), and the waiter's
//! next attempt, woken by the release's announcement, answers with that grant. A waiter that stops
//! waiting learns from `dequeue` of a grant it got meanwhile.
//!
//! The loop runs in a task of its own, not in the request's future: when a client goes away,
//! actix drops the request's future, which may be in the middle of an attempt. The task sees
//! the requester gone, leaves the queue, and releases a lease an attempt in flight was
//! granted for nobody, so a gone waiter never keeps a lease. A grant counts as delivered only
//! once the request has taken it ([`Answer`]): one whose request was dropped in between is
//! released as well. The last step is actix's: with half-closures off (`startup`), a request
//! whose client closed its side is dropped, not answered, even when its answer is ready in
//! the same poll (`vendor/README.md`, change 4).

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use tokio::sync::oneshot;

use crate::store::{Deadline, SharedStore, StoreError};
use crate::wake::{Handoff, Subscription};
use fencelock::domain::{AcquireOutcome, AcquireRequest, Acquisition, ReleaseRequest, Ticket};

/// How much longer than the store timeout one attempt may take before it counts as failed
/// (as `routes::ANSWER_GRACE`: the store refuses work past its deadline by itself).
const ATTEMPT_GRACE: Duration = Duration::from_secs(1);
/// Added to the store's `free_in` before looking again: timers are not early, but the
/// store's clock reading and ours are a round trip apart.
const TIMER_SLACK: Duration = Duration::from_millis(1);
/// The shortest pause between two attempts, so that a store answering "held, free in 0"
/// (a clock at the boundary) is not asked in a tight loop.
const MIN_PAUSE: Duration = Duration::from_millis(2);
/// How often a lease granted to a requester that has gone is tried to be released.
const RELEASE_TRIES: u32 = 3;

/// What a waiting acquisition ends with.
#[derive(Debug)]
pub(crate) struct Waited {
    pub outcome: AcquireOutcome,
    /// From the request's start to its answer.
    pub waited: Duration,
}

/// Acquires `req.resource`, waiting up to `req.wait` while another owner holds it (or others
/// wait ahead), in arrival order with every other waiter of the store. Each attempt is a
/// write with its own deadline, `store_timeout` away.
pub(crate) async fn acquire(
    store: SharedStore,
    req: AcquireRequest,
    store_timeout: Duration,
) -> Result<Waited, StoreError> {
    let (reply, answer) = oneshot::channel();
    tokio::spawn(
        Waiter {
            store,
            req,
            store_timeout,
            started: Instant::now(),
        }
        .run(reply),
    );
    match answer.await {
        Ok(Answer { answer, received }) => {
            // Nothing awaits between here and the response: from now on the answer is the
            // request's (or the connection's, see `startup`'s half-closures).
            let _ = received.send(());
            answer
        }
        Err(_) => Err(StoreError::unavailable(
            "the waiting task ended unexpectedly",
        )),
    }
}

/// What the waiting task passes to the request: its answer, and the way back that tells the
/// task the request took it. A request dropped after the answer was sent but before it was
/// taken (its client left meanwhile) drops `received` with it, and the task gives the lease
/// back: a send into the channel is not a delivery.
struct Answer {
    answer: Result<Waited, StoreError>,
    received: oneshot::Sender<()>,
}

struct Waiter {
    store: SharedStore,
    req: AcquireRequest,
    store_timeout: Duration,
    started: Instant,
}

/// Why the loop stopped without a decision to pass on.
enum Stop {
    Answer(Result<AcquireOutcome, StoreError>),
    /// The requester is gone: nobody gets an answer.
    Gone,
}

impl Waiter {
    async fn run(self, mut reply: oneshot::Sender<Answer>) {
        let until = self.started + self.req.wait.duration();
        let mut changes = self.store.changes().subscribe(&self.req.resource);
        changes.mark_seen();
        let first = self.attempt(&self.req).await;
        let stop = match first {
            Ok(AcquireOutcome::Held {
                free_in,
                delayed_until,
            }) if Instant::now() < until => {
                self.queue(until, free_in, delayed_until, &mut changes, &mut reply)
                    .await
            }
            other => Stop::Answer(other),
        };
        drop(changes);
        let Stop::Answer(answer) = stop else {
            return;
        };
        let waited = self.started.elapsed();
        let answer = answer.map(|outcome| Waited { outcome, waited });
        let granted = match &answer {
            Ok(Waited {
                outcome: AcquireOutcome::Acquired { lease, .. },
                ..
            }) => Some(lease.fence),
            _ => None,
        };
        let (received, taken) = oneshot::channel();
        let sent = reply.send(Answer { answer, received }).is_ok();
        if let Some(fence) = granted
            && (!sent || taken.await.is_err())
        {
            self.release_for_nobody(fence).await;
        }
    }

    /// In the queue from now on: try again on every change and every deadline, until the
    /// lease is ours, the wait is over, or the requester has gone.
    async fn queue(
        &self,
        until: Instant,
        mut free_in: Duration,
        mut delayed_until: Option<DateTime<Utc>>,
        changes: &mut Subscription,
        reply: &mut oneshot::Sender<Answer>,
    ) -> Stop {
        let left = until.saturating_duration_since(Instant::now());
        let ticket = match self.bounded(self.store.enqueue(&self.req, left)).await {
            Ok(ticket) => ticket,
            Err(e) => return Stop::Answer(Err(e)),
        };
        // Dropped on every way out of here, after the store's queue was left: the next
        // waiter of this process then takes over the listening.
        let place = self
            .store
            .changes()
            .lines()
            .join(&self.req.resource, ticket, &self.req.owner);
        let mut req = self.req.clone();
        req.ticket = Some(ticket);
        // Whether the last attempt was made as the first in line: one that comes first after
        // a sleep may have missed changes meanwhile, so it attempts at once.
        let mut attempted_first = true;
        loop {
            let now = Instant::now();
            if now >= until {
                let granted = self.leave(ticket).await;
                if granted.is_some() {
                    place.leave_granted(None);
                }
                return Stop::Answer(Ok(granted.unwrap_or(AcquireOutcome::Held {
                    free_in,
                    delayed_until,
                })));
            }
            // A waiter of the same owner here left with the lease: this one re-acquires it
            // at once, wherever it stands in line (waiting applies only while another owner
            // holds the resource).
            let owner_holds = place.take_owner_holds();
            let first = place.is_first();
            if !first && !owner_holds {
                // Someone of this process is ahead: it cannot be granted before that one is
                // gone (nor re-acquire before one of its owner is granted), so neither changes
                // nor the expiry timer concern this waiter.
                attempted_first = false;
                tokio::select! {
                    () = place.turn() => {}
                    () = tokio::time::sleep(until - now) => {}
                    () = reply.closed() => return self.gone(ticket).await,
                }
                continue;
            }
            if owner_holds {
                // What the one before passed on tells of the lease this waiter re-acquires.
                let _ = place.take_handoff();
            } else if !attempted_first && let Some(handoff) = place.take_handoff() {
                // The one before got the lease: a look now would find it held.
                changes.mark_seen_through(handoff.seen);
                free_in = handoff.held_until.saturating_duration_since(now);
                attempted_first = true;
            }
            if attempted_first && !owner_holds {
                let pause = (free_in + TIMER_SLACK).max(MIN_PAUSE).min(until - now);
                tokio::select! {
                    () = changes.changed() => {}
                    () = tokio::time::sleep(pause) => {}
                    () = reply.closed() => return self.gone(ticket).await,
                }
            }
            attempted_first = first;
            let seen = changes.mark_seen();
            match self.attempt(&req).await {
                Ok(AcquireOutcome::Held {
                    free_in: next,
                    delayed_until: delay,
                }) => (free_in, delayed_until) = (next, delay),
                // A grant takes the ticket out of the queue in the same step.
                Ok(AcquireOutcome::Acquired { lease, how }) => {
                    place.leave_granted(Some(Handoff::holding(seen, &lease)));
                    return Stop::Answer(Ok(AcquireOutcome::Acquired { lease, how }));
                }
                other => {
                    let granted = self.leave(ticket).await;
                    if granted.is_some() {
                        place.leave_granted(None);
                    }
                    return Stop::Answer(granted.map_or(other, Ok));
                }
            }
        }
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<AcquireOutcome, StoreError> {
        let deadline = Deadline::after(self.store_timeout);
        self.bounded(self.store.acquire(req, deadline)).await
    }

    async fn bounded<T>(
        &self,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let limit = self.store_timeout + ATTEMPT_GRACE;
        tokio::time::timeout(limit, operation)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::unavailable(format!(
                    "the store did not answer within {limit:?}"
                )))
            })
    }

    /// Out of the queue; with the lease if a release granted it to this ticket meanwhile
    /// (the wait, or the attempt that failed, ended after the grant). If leaving fails, the
    /// ticket is skipped from its expiry on (the end of this wait) and the next waiter is
    /// held up until then at most.
    async fn leave(&self, ticket: Ticket) -> Option<AcquireOutcome> {
        match self.bounded(self.store.dequeue(&self.req, ticket)).await {
            Ok(granted) => granted.map(|lease| AcquireOutcome::Acquired {
                lease,
                how: Acquisition::Fresh,
            }),
            Err(e) => {
                tracing::warn!(
                    lease.resource = %self.req.resource,
                    error = %e,
                    "a waiter could not leave the queue; its ticket holds the queue until its wait ends"
                );
                None
            }
        }
    }

    /// The requester went away while queued: out of the queue, and a lease a release granted
    /// to this ticket meanwhile is given back.
    async fn gone(&self, ticket: Ticket) -> Stop {
        if let Some(AcquireOutcome::Acquired { lease, .. }) = self.leave(ticket).await {
            self.release_for_nobody(lease.fence).await;
        }
        Stop::Gone
    }

    /// The requester went away while an attempt was granted: the lease is nobody's, so it is
    /// released at once (its fence given, so that only this very lease is).
    async fn release_for_nobody(&self, fence: fencelock::domain::Fence) {
        let release = ReleaseRequest {
            resource: self.req.resource.clone(),
            owner: self.req.owner.clone(),
            fence: Some(fence),
        };
        for _ in 0..RELEASE_TRIES {
            let deadline = Deadline::after(self.store_timeout);
            match self.bounded(self.store.release(&release, deadline)).await {
                Ok(_) => {
                    tracing::info!(
                        lease.resource = %self.req.resource,
                        lease.fence = fence.get(),
                        "lease released: granted to a waiter whose client had gone"
                    );
                    return;
                }
                Err(e) => tracing::warn!(
                    lease.resource = %self.req.resource,
                    error = %e,
                    "could not release a lease granted to a waiter whose client had gone"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use fencelock::domain::{Inspection, LockDelay, Owner, ResourceName, Ttl, WaitFor};

    const STORE_TIMEOUT: Duration = Duration::from_secs(5);

    fn store(dir: &tempfile::TempDir) -> SharedStore {
        let store = crate::store::sqlite::SqliteStore::open(&dir.path().join("leases.db"))
            .expect("a fresh SQLite store");
        Arc::new(store)
    }

    fn request(resource: &ResourceName) -> AcquireRequest {
        AcquireRequest {
            resource: resource.clone(),
            owner: Owner::parse("waiter").unwrap(),
            ttl: Ttl::new(60, Ttl::max(3600).unwrap()).unwrap(),
            lock_delay: LockDelay::NONE,
            token: None,
            wait: WaitFor::new(10_000, 60_000).unwrap(),
            ticket: None,
        }
    }

    /// A fresh store and the resource a test's waiter was granted.
    struct Granted {
        /// Holds the store's file for the test's length.
        _dir: tempfile::TempDir,
        store: SharedStore,
        resource: ResourceName,
    }

    impl Granted {
        async fn inspect(&self) -> Inspection {
            self.store.inspect(&self.resource).await.expect("inspect")
        }
    }

    /// Runs a waiter for `resource` on a fresh store (free: its first attempt is granted) and
    /// hands back the request's end of the channel once the answer is in it, with the
    /// waiter's task.
    async fn granted(
        resource: &str,
    ) -> (
        Granted,
        oneshot::Receiver<Answer>,
        tokio::task::JoinHandle<()>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let resource = ResourceName::parse(resource).unwrap();
        let (reply, answer) = oneshot::channel();
        let task = tokio::spawn(
            Waiter {
                store: store.clone(),
                req: request(&resource),
                store_timeout: STORE_TIMEOUT,
                started: Instant::now(),
            }
            .run(reply),
        );
        let sent = tokio::time::timeout(STORE_TIMEOUT, async {
            while answer.is_empty() && !answer.is_terminated() {
                tokio::task::yield_now().await;
            }
        });
        sent.await.expect("the waiter answered");
        let granted = Granted {
            _dir: dir,
            store,
            resource,
        };
        (granted, answer, task)
    }

    /// The request was dropped (its client left) after the grant was sent to it but before it
    /// took it: nobody received the lease, so it is released.
    #[tokio::test]
    async fn a_grant_sent_to_a_request_that_never_took_it_is_released() {
        let (granted, answer, task) = granted("sent-not-taken").await;
        assert!(matches!(granted.inspect().await, Inspection::Live(_)));
        drop(answer);
        task.await.expect("the waiter's task");
        let left = granted.inspect().await;
        assert!(
            matches!(left, Inspection::Absent),
            "a grant nobody received was kept: {left:?}"
        );
    }

    /// A grant the request took stays the requester's.
    #[tokio::test]
    async fn a_grant_the_request_took_is_kept() {
        let (granted, answer, task) = granted("sent-and-taken").await;
        let Answer { answer, received } = answer.await.expect("an answer");
        received.send(()).expect("the waiter waits for the receipt");
        let Ok(Waited {
            outcome: AcquireOutcome::Acquired { lease, .. },
            ..
        }) = answer
        else {
            panic!("not granted: {answer:?}");
        };
        task.await.expect("the waiter's task");
        match granted.inspect().await {
            Inspection::Live(live) => assert_eq!(live.fence, lease.fence),
            other => panic!("a grant the request took was released: {other:?}"),
        }
    }
}
