//! [`Lease`]: a held lock that renews itself in the background and reports its loss.
//!
//! The renewal task keeps one rule: every failure is either retried or reported. A refused
//! renewal (`404`/`409`) is reported at once; any other failure is retried with a short
//! backoff until the lease's *safe deadline* — the last confirmed expiry less a safety
//! margin — and then reported. So the worker hears of the loss before the server lets
//! anyone else acquire, unless the worker itself is paused (which is what fences are for).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

use super::error::{Error, LossReason};
use super::retry::jitter;
use super::{Client, Grant, LockInfo, RetryPolicy};

/// The largest safety margin: the loss is reported at most this long before the lease's
/// expiry (for short TTLs, a tenth of the TTL).
const MAX_SAFETY_MARGIN: Duration = Duration::from_secs(1);

/// The first pause after a failed renewal; it doubles, up to half the renewal interval.
const FIRST_RETRY: Duration = Duration::from_millis(100);

/// The owner token of a lease: 128 random bits, known only to this process. Never printed.
#[derive(Clone)]
pub(super) struct OwnerSecret(String);

impl OwnerSecret {
    /// A new secret from the thread-local CSPRNG, as 32 hex digits.
    pub(super) fn random() -> Self {
        Self(format!("{:032x}", rand::random::<u128>()))
    }

    pub(super) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for OwnerSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OwnerSecret(<redacted>)")
    }
}

/// What the renewal task tells the lease's watchers.
#[derive(Debug, Clone)]
enum State {
    /// Held, as far as the client can tell, until `safe_until` (monotonic).
    Held { safe_until: Instant },
    /// No longer held; final.
    Lost(LossReason),
}

impl State {
    /// Held right now: not reported lost, and the safe deadline has not passed (checked
    /// against the clock, so it is right even if the renewal task has not run yet).
    fn is_held(&self) -> bool {
        self.remaining() > Duration::ZERO
    }

    fn remaining(&self) -> Duration {
        match self {
            Self::Held { safe_until } => safe_until.saturating_duration_since(Instant::now()),
            Self::Lost(_) => Duration::ZERO,
        }
    }

    /// The safe deadline while held; for a lost lease, now (nothing is left of it).
    fn safe_until(&self) -> Instant {
        match self {
            Self::Held { safe_until } => *safe_until,
            Self::Lost(_) => Instant::now(),
        }
    }

    fn loss(&self) -> Option<LossReason> {
        match self {
            Self::Held { .. } => None,
            Self::Lost(reason) => Some(reason.clone()),
        }
    }
}

/// Waits until `state` reports a loss. A closed channel (the lease and its task are gone)
/// counts as [`LossReason::Dropped`].
async fn wait_lost(mut state: watch::Receiver<State>) -> LossReason {
    match state.wait_for(|s| s.loss().is_some()).await {
        Ok(s) => s.loss().unwrap_or(LossReason::Dropped),
        Err(_) => LossReason::Dropped,
    }
}

/// The timing of one confirmed grant (acquisition or renewal).
#[derive(Debug, Clone, Copy)]
struct Term {
    /// The request's send instant + `expires_in_ms` − safety margin. The server cannot have
    /// started the lease before the request was sent, so this is never late.
    safe_until: Instant,
    /// When to renew: a third of the granted time after sending, leaving two more chances
    /// before expiry.
    renew_at: Instant,
    /// A third of the granted time; also the longest a renewal request may take.
    interval: Duration,
}

impl Term {
    fn new(sent: Instant, expires_in_ms: i64) -> Self {
        let granted = Duration::from_millis(u64::try_from(expires_in_ms).unwrap_or(0));
        let margin = (granted / 10).min(MAX_SAFETY_MARGIN);
        let interval = granted / 3;
        Self {
            safe_until: sent + granted.saturating_sub(margin),
            renew_at: sent + interval,
            interval,
        }
    }

    /// When to try again after `failures` failed renewals in a row (at least 1): a pause from
    /// [`FIRST_RETRY`], doubling up to half the interval, with jitter so that the workers of
    /// a restarted server do not all come back at once.
    fn retry_at(&self, failures: u32) -> Instant {
        let cap = (self.interval / 2).max(FIRST_RETRY);
        let ceiling = FIRST_RETRY
            .saturating_mul(2u32.saturating_pow(failures.saturating_sub(1).min(31)))
            .min(cap);
        Instant::now() + jitter(ceiling / 2, ceiling)
    }
}

/// A held lock on one resource, renewed in the background every third of its TTL until it is
/// released, dropped, or lost.
///
/// - [`fence`](Self::fence) is the token to send with every protected write.
/// - [`is_held`](Self::is_held) and [`lost`](Self::lost) say whether the work may go on. A
///   lease is lost when a renewal is refused (reported at once) or when no renewal could be
///   confirmed before its expiry less a safety margin (a tenth of the TTL, at most 1 s), so
///   that the worker hears of it before anyone else can acquire the resource.
/// - [`release`](Self::release) gives it back. Dropping the handle stops the renewals and
///   releases the lease in the background (best effort: if that fails, it expires by itself).
///
/// Time is measured on the monotonic clock, from the instant each request was sent.
pub struct Lease {
    client: Client,
    resource: String,
    owner: OwnerSecret,
    /// Shared with the renewal task, which publishes every change. Held here too so that
    /// watchers keep a final state after the task ends.
    state: Arc<watch::Sender<State>>,
    /// The fence and a receiver of `state`: what [`Lease::watch`] hands out, and what the
    /// lease's own `fence`, `is_held`, `remaining` and `lost` read.
    view: LeaseWatch,
    /// Sending stops the task quietly (for `release`); dropping it makes the task release
    /// the lease itself (for `Drop`).
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Lease {
    /// Starts renewing a lease just acquired under `owner`.
    pub(super) fn start(
        client: Client,
        resource: &str,
        owner: OwnerSecret,
        ttl: Duration,
        grant: Grant,
    ) -> Self {
        let Grant { lock, sent } = grant;
        let term = Term::new(sent, lock.expires_in_ms);
        let state = Arc::new(watch::Sender::new(State::Held {
            safe_until: term.safe_until,
        }));
        let (stop, stopped) = oneshot::channel();
        let renewer = Renewer {
            client: client.clone(),
            resource: resource.to_owned(),
            owner: owner.clone(),
            ttl,
            fence: lock.fence,
            state: Arc::clone(&state),
        };
        tracing::debug!(resource, fence = lock.fence, "lease acquired");
        Self {
            client,
            resource: resource.to_owned(),
            owner,
            view: LeaseWatch {
                fence: lock.fence,
                fence_token: lock.fence_token.clone(),
                state: state.subscribe(),
            },
            state,
            stop,
            task: tokio::spawn(renewer.run(stopped, term)),
        }
    }

    /// The locked resource.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The fencing token of this lease; it never changes (renewals keep it). Send it with
    /// every write the lease protects.
    pub fn fence(&self) -> i64 {
        self.view.fence()
    }

    /// The fence signed for this resource, when the lease server has a fence key: send it
    /// as `Fencing-Token` in place of [`fence`](Self::fence) (renewals keep it too).
    pub fn fence_token(&self) -> Option<&str> {
        self.view.fence_token()
    }

    /// True while the lease is held: not reported lost, and its safe deadline has not
    /// passed on the monotonic clock. Check it before each protected step.
    pub fn is_held(&self) -> bool {
        self.view.is_held()
    }

    /// How long the lease is known to stay held without another renewal (zero once lost).
    pub fn remaining(&self) -> Duration {
        self.view.remaining()
    }

    /// Completes when the lease is lost, with the reason. Meant for `tokio::select!` against
    /// the protected work. Cancel-safe.
    pub async fn lost(&self) -> LossReason {
        self.view.lost().await
    }

    /// A cheap, cloneable view of this lease's state, for tasks doing the protected work.
    pub fn watch(&self) -> LeaseWatch {
        self.view.clone()
    }

    /// Runs `work` while the lease is held, then releases the lease.
    ///
    /// - `work` ends first: its output, `Ok`. The lease is released; if that fails, the
    ///   failure is logged (at WARN) and the lease lapses at the end of its TTL.
    /// - The lease is lost first (see [`lost`](Self::lost)): `work` is dropped where it
    ///   last awaited — cancelled, as `tokio::select!` cancels — and the result is
    ///   [`Error::LeaseLost`] with the reason. Whatever `work` wrote before carries the fence,
    ///   so a guard refuses its writes once a newer lease exists.
    ///
    /// ```no_run
    /// # async fn compact(fence: i64) -> u64 { 0 }
    /// # async fn example() -> Result<(), fencelock::client::Error> {
    /// use std::time::Duration;
    /// use fencelock::client::Client;
    ///
    /// let client = Client::new("http://127.0.0.1:8080")?;
    /// let lease = client.lock("job:42", Duration::from_secs(30), Duration::ZERO).await?;
    /// let fence = lease.fence();
    /// let freed = lease.run(compact(fence)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run<F: Future>(self, work: F) -> Result<F::Output, Error> {
        let view = self.watch();
        // The work first: when it has finished, its effects are done, and its output is the
        // truth even if the loss is noticed in the same poll.
        let outcome = tokio::select! {
            biased;
            output = work => Ok(output),
            reason = view.lost() => Err(reason),
        };
        match outcome {
            Ok(output) => {
                let resource = self.resource.clone();
                if let Err(error) = self.release().await {
                    tracing::warn!(%resource, %error, "lease not released after the work; it lapses by itself");
                }
                Ok(output)
            }
            Err(reason) => Err(Error::LeaseLost { reason }),
        }
    }

    /// Stops renewing and releases the lease with its fence (so it can never free a newer
    /// lease). The renewal task is stopped and awaited first, so no renewal is in flight
    /// behind the release. An outage is retried, with backoff, for a few seconds while the
    /// lease is still held (so that the next holder need not wait out the TTL for one lost
    /// connection or one `503`). Watchers then see [`LossReason::Released`] (unless the lease was lost
    /// before).
    ///
    /// [`Error::LeaseLost`] if the lease was already gone; [`Error::Unavailable`] if the
    /// server could not be asked before the lease's safe deadline (the lease then expires
    /// by itself at the end of its TTL).
    pub async fn release(self) -> Result<(), Error> {
        let Self {
            client,
            resource,
            owner,
            state,
            stop,
            task,
            view,
        } = self;
        let fence = view.fence;
        // An error only means the task has already ended (after a loss).
        let _ = stop.send(());
        if let Err(e) = task.await {
            tracing::warn!(resource, fence, error = %e, "lease renewal task failed");
        }
        let until = state.borrow().safe_until();
        let released = give_back(&client, &resource, &owner, fence, until).await;
        state.send_if_modified(|s| match s {
            State::Held { .. } => {
                *s = State::Lost(LossReason::Released);
                true
            }
            State::Lost(_) => false,
        });
        released
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("resource", &self.resource)
            .field("fence", &self.view.fence)
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

/// A view of a [`Lease`]'s state that can be cloned into other tasks. It cannot renew or
/// release; once the lease is released or dropped it reports [`LossReason::Released`] or
/// [`LossReason::Dropped`].
#[derive(Debug, Clone)]
pub struct LeaseWatch {
    fence: i64,
    fence_token: Option<String>,
    state: watch::Receiver<State>,
}

impl LeaseWatch {
    /// The lease's fencing token.
    pub fn fence(&self) -> i64 {
        self.fence
    }

    /// See [`Lease::fence_token`].
    pub fn fence_token(&self) -> Option<&str> {
        self.fence_token.as_deref()
    }

    /// See [`Lease::is_held`].
    pub fn is_held(&self) -> bool {
        self.state.borrow().is_held()
    }

    /// See [`Lease::remaining`].
    pub fn remaining(&self) -> Duration {
        self.state.borrow().remaining()
    }

    /// See [`Lease::lost`].
    pub async fn lost(&self) -> LossReason {
        wait_lost(self.state.clone()).await
    }
}

/// How the renewal loop ended.
enum End {
    /// The lease is lost; tell the watchers.
    Lost(LossReason),
    /// `Lease::release` stopped it; the lease does the rest.
    Stopped,
    /// The `Lease` was dropped; release in the background.
    Dropped,
}

impl From<Result<(), oneshot::error::RecvError>> for End {
    fn from(signal: Result<(), oneshot::error::RecvError>) -> Self {
        match signal {
            Ok(()) => Self::Stopped,
            Err(_) => Self::Dropped,
        }
    }
}

/// The background task's half of a lease.
struct Renewer {
    client: Client,
    resource: String,
    owner: OwnerSecret,
    ttl: Duration,
    fence: i64,
    state: Arc<watch::Sender<State>>,
}

impl Renewer {
    async fn run(self, mut stop: oneshot::Receiver<()>, term: Term) {
        match self.keep_alive(&mut stop, term).await {
            End::Lost(reason) => {
                tracing::warn!(resource = %self.resource, fence = self.fence, %reason, "lease lost");
                self.state.send_replace(State::Lost(reason));
            }
            End::Stopped => {}
            End::Dropped => {
                let until = self.state.send_replace(State::Lost(LossReason::Dropped));
                self.release_dropped(until.safe_until()).await;
            }
        }
    }

    /// Renews until the lease is lost or the handle stops it. Returns only with a reason.
    async fn keep_alive(&self, stop: &mut oneshot::Receiver<()>, mut term: Term) -> End {
        let mut next = term.renew_at;
        let mut failures = 0u32;
        let mut last_error = "no renewal was attempted in time".to_owned();
        loop {
            tokio::select! {
                biased;
                signal = &mut *stop => return End::from(signal),
                () = sleep_until(next.min(term.safe_until)) => {}
            }
            if Instant::now() >= term.safe_until {
                return End::Lost(LossReason::Unconfirmed { last_error });
            }
            let sent = Instant::now();
            // A renewal that takes longer than an interval is abandoned and tried again.
            let cutoff = (sent + term.interval.max(FIRST_RETRY)).min(term.safe_until);
            let answer = tokio::select! {
                biased;
                signal = &mut *stop => return End::from(signal),
                answer = timeout_at(cutoff, self.renew()) => answer,
            };
            let error = match answer {
                Ok(Ok(lock)) => {
                    term = self.renewed(sent, &lock);
                    failures = 0;
                    next = term.renew_at;
                    continue;
                }
                Ok(Err(Error::LeaseLost { reason })) => return End::Lost(reason),
                Ok(Err(error)) => error.to_string(),
                Err(_) => format!("no answer within {} ms", (cutoff - sent).as_millis()),
            };
            failures = failures.saturating_add(1);
            next = term.retry_at(failures);
            tracing::warn!(resource = %self.resource, fence = self.fence, failures, %error,
                left_ms = term.safe_until.saturating_duration_since(Instant::now()).as_millis(),
                "lease renewal failed; retrying");
            last_error = error;
        }
    }

    async fn renew(&self) -> Result<LockInfo, Error> {
        self.client
            .renew(
                &self.resource,
                self.owner.expose(),
                self.ttl,
                Some(self.fence),
            )
            .await
    }

    /// Records a confirmed renewal and publishes the new safe deadline.
    fn renewed(&self, sent: Instant, lock: &LockInfo) -> Term {
        let term = Term::new(sent, lock.expires_in_ms);
        self.state.send_replace(State::Held {
            safe_until: term.safe_until,
        });
        tracing::debug!(resource = %self.resource, fence = self.fence, expires_in_ms = lock.expires_in_ms, "lease renewed");
        term
    }

    /// Releases the lease of a dropped handle (retrying outages until `until`, its safe
    /// deadline). Failing is harmless: it expires.
    async fn release_dropped(&self, until: Instant) {
        let released =
            give_back(&self.client, &self.resource, &self.owner, self.fence, until).await;
        match released {
            Ok(()) => {
                tracing::debug!(resource = %self.resource, fence = self.fence, "dropped lease released")
            }
            Err(error) => tracing::debug!(resource = %self.resource, fence = self.fence, %error,
                "dropped lease not released; it expires by itself"),
        }
    }
}

/// The longest pause between two attempts of a release.
const MAX_RELEASE_PAUSE: Duration = Duration::from_secs(1);

/// How long after its first attempt a release may start another: a worker that has finished
/// must not hang on an unreachable server for the rest of a long TTL.
const RELEASE_RETRIES_FOR: Duration = Duration::from_secs(5);

/// Releases the lease `fence` of `owner` on `resource`, retrying an outage
/// ([`Error::Unavailable`]) under a [`RetryPolicy`] whose deadline is
/// [`RELEASE_RETRIES_FOR`] or `until`, the lease's safe deadline, whichever comes first
/// (after it, the lease may be expiring anyway).
///
/// Retrying is safe because the release names its fence: it can only ever free this lease.
/// An attempt that failed with an outage may still have released it (its answer was lost on
/// the way back); a later `404` then means the lease is gone, which is what the release was
/// for, and counts as released.
async fn give_back(
    client: &Client,
    resource: &str,
    owner: &OwnerSecret,
    fence: i64,
    until: Instant,
) -> Result<(), Error> {
    let policy = RetryPolicy {
        initial_backoff: FIRST_RETRY,
        max_backoff: MAX_RELEASE_PAUSE,
        deadline: until
            .saturating_duration_since(Instant::now())
            .min(RELEASE_RETRIES_FOR),
    };
    let mut attempts = 0u32;
    policy
        .run(|| {
            let retried = attempts > 0;
            attempts += 1;
            async move {
                match client.release(resource, owner.expose(), Some(fence)).await {
                    Err(Error::LeaseLost {
                        reason: LossReason::NotFound,
                    }) if retried => Ok(()),
                    done => done,
                }
            }
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn term_renews_at_a_third_and_keeps_a_margin() {
        let sent = Instant::now();
        let term = Term::new(sent, 3000);
        assert_eq!(term.renew_at - sent, Duration::from_millis(1000));
        assert_eq!(term.safe_until - sent, Duration::from_millis(2700));
        let long = Term::new(sent, 60_000);
        assert_eq!(long.safe_until - sent, Duration::from_secs(59));
        let negative = Term::new(sent, -5);
        assert_eq!(negative.safe_until, sent);
    }

    #[test]
    fn retries_back_off_within_half_the_interval() {
        let term = Term::new(Instant::now(), 3000);
        for failures in 1..40 {
            let wait = term.retry_at(failures) - Instant::now();
            assert!(wait <= Duration::from_millis(500), "{failures}: {wait:?}");
        }
    }

    #[test]
    fn owner_secrets_are_random_and_never_printed() {
        let a = OwnerSecret::random();
        assert_eq!(a.expose().len(), 32);
        assert_ne!(a.expose(), OwnerSecret::random().expose());
        assert!(!format!("{a:?}").contains(a.expose()));
    }
}
