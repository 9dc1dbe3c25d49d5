//! Trace validation: each resource's history of a chaos run, replayed step by step against
//! the model's transition rules (`fencelock_model::rules`, the same rules the bounded model
//! checks), asking of every step the real store took whether the rules allow it from the
//! state the history has reached.
//!
//! The steps are the store's own: every lease of the store's history of the resource
//! (`GET /locks/{resource}/history`: its fence, its start, and its end by release or expiry,
//! in store time), and every renewal answered `200` (its store time is its new expiry less
//! its TTL). They are replayed in store-time order (at one millisecond, in fence order; a
//! lease's grant before its renewals before its release), with what the requests carried:
//! each lease's owner, TTL and lock delay from the acquisition that received it. Each step
//! must come out of the rules as it came out of the store: a grant with that fence (above the
//! last one of the resource: gaps are fine), a renewal, a release. Every renewal or release
//! refused (`404`, `409`) must be refused by the rules at the end of its flight, when its
//! lease is the least likely to be live; and every acquisition refused, at some moment of
//! its flight ([`Replay::refused_acquisitions`]).
//!
//! What a real run has and the rules do not, and how it is handled:
//! - **Lost answers** (a kill, a cut, a `503`): the step may or may not have happened. A
//!   lease no answer received is still in the store's history: it is replayed with an owner
//!   of its own ([`Who::Unseen`]), whose TTL is read off its recorded expiry, with no lock
//!   delay and outside any queue (its requester may have been anyone). A renewal whose
//!   answer was lost may have extended its lease: a release the replayed expiry would refuse
//!   is then explained by it.
//! - **Concurrent requests**: the store's time stamps order the steps. Where the rules need
//!   the queue (a grant), it holds only the waiters that were certainly in it, live and
//!   ahead of the grantee ([`History::waiters_ahead_of`]: answered later, wait not over, no
//!   fault on their instance, and sent more than
//!   [`ENQUEUED_WITHIN`](super::history::ENQUEUED_WITHIN) before the grantee): any order is
//!   allowed among the rest; and the queue's order rests on that one timing assumption. A
//!   refused acquisition may rest on any waiter that may have been queued.
//! - **PostgreSQL's hand-over** ([`Rules::POSTGRES`]): a release followed, at the same
//!   millisecond, by a grant to a waiter is replayed as the release handing the lease to the
//!   head of that queue, and the waiter taking it.
//! - **The store's clock at the boundary**: answers cut store times to the millisecond. A
//!   grant is judged [`TOLERANCE_MS`] later than stamped, and a renewal or release that
//!   succeeded that much earlier, so that a step at the very boundary of an expiry or a lock
//!   delay is not misjudged by the rounding.
//!
//! A resource whose history the rules cannot explain is reported with the first step they
//! cannot explain, and its replay stops there.

use std::fmt;

use chrono::{DateTime, Utc};
use fencelock_model::rules::{
    Acquire, AcquireOutcome, Number, ReleaseOutcome, RenewOutcome, Rules, StepError, Store, Ticket,
};

use super::history::{
    Acknowledged, AcquireAnswer, History, Op, PLACEMENT_SLACK, PastLease, Record, ReleaseAnswer,
    RenewAnswer,
};

/// Milliseconds by which a grant is judged later, and a successful renewal or release
/// earlier, than stamped: the answers cut store times to the millisecond (PostgreSQL keeps
/// microseconds), so two stamps read from them are off by less than this.
pub const TOLERANCE_MS: u64 = 2;

/// A TTL long enough to outlast the run, for a lease no answer showed that the store's
/// history shows live or released (its expiry is then not known, nor needed).
const UNKNOWN_TTL_MS: u64 = 24 * 3600 * 1000;

/// The first step of a resource's history that the rules cannot explain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unexplained {
    pub resource: String,
    /// Its number among the resource's replayed steps, from 1.
    pub step: usize,
    /// Its store time.
    pub at: DateTime<Utc>,
    pub what: String,
}

impl fmt::Display for Unexplained {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: step {} at {} (store time): {}",
            self.resource, self.step, self.at, self.what
        )
    }
}

/// Who holds or waits, as the rules see it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Who<'h> {
    /// The owner a request named.
    Named(&'h str),
    /// The unknown requester of the lease with this fence, which no answer showed.
    Unseen(u64),
}

impl fmt::Display for Who<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Who::Named(owner) => write!(f, "owner {owner}"),
            Who::Unseen(fence) => write!(f, "the unseen requester of fence {fence}"),
        }
    }
}

/// One step of a resource's history, in store time.
enum Step<'h> {
    /// A lease of the store's history began.
    Grant(&'h PastLease),
    /// A renewal was answered `200` with this expiry.
    Renewed {
        owner: &'h str,
        fence: u64,
        ttl_ms: u64,
        expires: u64,
    },
    /// A lease of the store's history ended by a release.
    Released(&'h PastLease),
    /// A renewal or a release was refused; judged at the end of its flight.
    Refused(&'h Record),
}

impl Step<'_> {
    /// Steps at one millisecond: in fence order, a grant before renewals before a release.
    fn rank(&self) -> u8 {
        match self {
            Step::Grant(_) => 0,
            Step::Renewed { .. } => 1,
            Step::Refused(_) => 2,
            Step::Released(_) => 3,
        }
    }
}

/// What the replay of a run came to.
#[derive(Debug, Default)]
pub struct Report {
    /// Resources replayed, and steps in all (up to the first unexplained one of each).
    pub resources: usize,
    pub steps: usize,
    /// Grants to a request that received them while other waiters were certainly queued
    /// and live: where the queue's order was put to the test.
    pub grants_while_queued: usize,
    /// Releases replayed as PostgreSQL's hand-over to the first waiter.
    pub handovers: usize,
    /// Refused renewals and releases judged.
    pub refusals: usize,
    pub unexplained: Vec<Unexplained>,
}

impl Report {
    /// The report's line about the replay.
    pub fn line(&self) -> String {
        format!(
            "chaos: replay: {} steps on {} resources against the model's rules ({} grants while others waited, {} hand-overs on release, {} refusals judged), {} unexplained",
            self.steps,
            self.resources,
            self.grants_while_queued,
            self.handovers,
            self.refusals,
            self.unexplained.len()
        )
    }
}

/// Replays every resource's history; reports the first step of each that the rules cannot
/// explain.
pub fn replay(history: &History) -> Report {
    let rules = if history.postgres {
        Rules::POSTGRES
    } else {
        Rules::SQLITE
    };
    let acks = history.acknowledged();
    let mut report = Report::default();
    for (resource, past) in &history.lease_histories {
        let replay = Replay {
            history,
            rules,
            resource,
            acks: acks.iter().filter(|a| a.resource == resource).collect(),
            state: Store::default(),
            pending: None,
            busy: Vec::new(),
            open: None,
            past,
            report: &mut report,
        };
        replay.run(past);
    }
    report
}

struct Replay<'h> {
    history: &'h History,
    rules: Rules,
    resource: &'h str,
    acks: Vec<&'h Acknowledged<'h>>,
    state: Store<&'h str, Who<'h>>,
    /// A hand-over a release made (PostgreSQL): the fence, and the ticket that takes it.
    pending: Option<(u64, Ticket)>,
    /// When the replay's leases kept other owners out, `[start, end]` in store time: from
    /// each grant to its release, or to its expiry plus its lock delay.
    busy: Vec<(u64, u64)>,
    /// The start of the current lease's window, not yet closed.
    open: Option<u64>,
    /// The store's history of the resource.
    past: &'h [PastLease],
    report: &'h mut Report,
}

/// A store time of the replay (Unix milliseconds) as a time.
fn time(ms: u64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(i64::try_from(ms).unwrap_or(i64::MAX)).unwrap_or_default()
}

/// A store time of the replay as the report shows it: the time of day, to the millisecond.
fn clock(ms: u64) -> String {
    if ms >= u64::MAX / 2 {
        return "(unknown)".to_owned();
    }
    time(ms).format("%H:%M:%S%.3f").to_string()
}

fn ms(at: DateTime<Utc>) -> u64 {
    u64::try_from(at.timestamp_millis()).unwrap_or(0)
}

fn fence_of(fence: i64) -> u64 {
    u64::try_from(fence).unwrap_or(0)
}

impl<'h> Replay<'h> {
    fn run(mut self, past: &'h [PastLease]) {
        let steps = self.steps(past);
        self.report.resources += 1;
        for (i, (at, step)) in steps.iter().enumerate() {
            self.report.steps += 1;
            let next = steps.get(i + 1);
            if let Err(what) = self.apply(*at, step, next) {
                self.report.unexplained.push(Unexplained {
                    resource: self.resource.to_owned(),
                    step: i + 1,
                    at: time(*at),
                    what,
                });
                return;
            }
        }
        // The lease still open at the end keeps others out until it is free.
        if let Some(start) = self.open.take() {
            let end = self.current_free_at().unwrap_or(u64::MAX);
            self.busy.push((start, end));
        }
        let oldest = past
            .iter()
            .map(|p| ms(p.acquired_at))
            .min()
            .unwrap_or(u64::MAX);
        if let Err((at, what)) = self.refused_acquisitions(oldest) {
            self.report.unexplained.push(Unexplained {
                resource: self.resource.to_owned(),
                step: steps.iter().filter(|(t, _)| *t <= at).count() + 1,
                at: time(at),
                what,
            });
        }
    }

    /// When the resource's current lease in the replay lets other owners in: at its expiry
    /// plus its lock delay; for a lease nobody received, whose lock delay no answer showed,
    /// plus the longest lock delay any acquisition of the resource asked for.
    ///
    /// Where the store's history shows the lease expired later than the replay's expiry (a
    /// renewal whose answer was lost), its recorded expiry counts.
    fn current_free_at(&self) -> Option<u64> {
        let lease = self.state.slot(&self.resource)?.lease.as_ref()?;
        let recorded = self
            .past
            .iter()
            .find(|p| fence_of(p.fence) == lease.fence && !p.released)
            .and_then(|p| p.ended_at)
            .map_or(0, ms);
        let expired = lease.expires_at.max(recorded);
        Some(match lease.owner {
            Who::Named(_) => expired.saturating_add(lease.lock_delay),
            Who::Unseen(_) => expired.saturating_add(self.longest_lock_delay()),
        })
    }

    fn longest_lock_delay(&self) -> u64 {
        self.history
            .records
            .iter()
            .filter(|r| r.resource == self.resource)
            .filter_map(|r| match &r.op {
                Op::Acquire { lock_delay_ms, .. } => Some(u64::from(*lock_delay_ms)),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// Every acquisition answered `acquired: false` (after the oldest lease the store's
    /// history holds) must be one the rules refuse at some moment of its flight: when the
    /// replay's lease of another owner was live or inside its lock delay ([`Replay::busy`]),
    /// or when another waiter may have been in the queue. Which waiters were, the history
    /// does not tell exactly; so every other waiting request counts, from its sending until
    /// its answer, or, where it left or its answer was lost, until its wait ended plus a
    /// ticket's life (a dead instance's tickets lapse only then); and every acquisition whose
    /// answer was lost counts for its flight (a grant taken back held the resource
    /// meanwhile). Returns the first one that is not so explained, by its sending.
    fn refused_acquisitions(&mut self, oldest: u64) -> Result<(), (u64, String)> {
        let slack = i64::try_from(PLACEMENT_SLACK.as_millis()).unwrap_or(0);
        let shift = |ms: i64| chrono::TimeDelta::milliseconds(ms);
        let span = |from_us: u64, until_us: u64| {
            let from = self.history.store_time(from_us, shift(-slack))?;
            let until = self.history.store_time(until_us, shift(slack))?;
            Some((ms(from), ms(until)))
        };
        let ticket_life = super::history::TICKET_LIFE_US;
        let mut queued: Vec<(&Record, (u64, u64))> = Vec::new();
        for r in self
            .history
            .records
            .iter()
            .filter(|r| r.resource == self.resource)
        {
            let Op::Acquire {
                wait_ms, answer, ..
            } = &r.op
            else {
                continue;
            };
            let wait_end = r.sent_us + u64::from(*wait_ms) * 1000;
            let until = match (answer, *wait_ms > 0) {
                (AcquireAnswer::Unknown { .. } | AcquireAnswer::Departed, true) => {
                    wait_end.max(r.received_us) + ticket_life
                }
                (_, true) | (AcquireAnswer::Unknown { .. }, false) => r.received_us,
                _ => continue,
            };
            if let Some(window) = span(r.sent_us, until) {
                queued.push((r, window));
            }
        }
        let mut refused: Vec<&Record> = self
            .history
            .records
            .iter()
            .filter(|r| r.resource == self.resource)
            .filter(|r| {
                matches!(
                    &r.op,
                    Op::Acquire {
                        answer: AcquireAnswer::Held,
                        ..
                    }
                )
            })
            .collect();
        refused.sort_by_key(|r| r.sent_us);
        for r in refused {
            let Some((from, until)) = span(r.sent_us, r.received_us) else {
                continue;
            };
            if from < oldest {
                continue;
            }
            self.report.refusals += 1;
            let meets = |(start, end): (u64, u64)| start <= until && from <= end;
            let held = self.busy.iter().any(|w| meets(*w));
            let behind = queued
                .iter()
                .any(|(other, w)| !std::ptr::eq(*other, r) && meets(*w));
            if !held && !behind {
                return Err((
                    from,
                    format!(
                        "an acquisition sent at {} ms and answered at {} ms was refused; the rules grant it throughout its flight (no lease of another owner, no lock delay, no waiter that may have been queued)",
                        r.sent_us / 1000,
                        r.received_us / 1000
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The resource's steps from its oldest lease the store's history still holds, in order.
    fn steps(&self, past: &'h [PastLease]) -> Vec<(u64, Step<'h>)> {
        let Some(oldest) = past.iter().map(|p| p.fence).min() else {
            return Vec::new();
        };
        let mut steps = Vec::new();
        for p in past {
            steps.push((ms(p.acquired_at), p.fence, Step::Grant(p)));
            if let (true, Some(ended)) = (p.released, p.ended_at) {
                steps.push((ms(ended), p.fence, Step::Released(p)));
            }
        }
        let after_slack = chrono::TimeDelta::from_std(PLACEMENT_SLACK).unwrap_or_default();
        for r in self
            .history
            .records
            .iter()
            .filter(|r| r.resource == self.resource)
        {
            match &r.op {
                Op::Renew {
                    owner,
                    fence,
                    ttl_seconds,
                    answer: RenewAnswer::Renewed(lease),
                } if *fence >= oldest => {
                    let ttl_ms = u64::from(*ttl_seconds) * 1000;
                    let expires = ms(lease.expires_at);
                    let step = Step::Renewed {
                        owner,
                        fence: fence_of(*fence),
                        ttl_ms,
                        expires,
                    };
                    steps.push((expires.saturating_sub(ttl_ms), *fence, step));
                }
                Op::Renew {
                    fence,
                    answer: RenewAnswer::Refused { .. },
                    ..
                }
                | Op::Release {
                    fence,
                    answer: ReleaseAnswer::Refused { .. },
                    ..
                } if *fence >= oldest => {
                    if let Some(end) = self.history.store_time(r.received_us, after_slack) {
                        steps.push((ms(end), *fence, Step::Refused(r)));
                    }
                }
                _ => {}
            }
        }
        steps.sort_by_key(|(at, fence, step)| (*at, *fence, step.rank()));
        steps.into_iter().map(|(at, _, step)| (at, step)).collect()
    }

    fn ack(&self, fence: i64) -> Option<&'h Acknowledged<'h>> {
        self.acks.iter().find(|a| a.lease.fence == fence).copied()
    }

    fn apply(
        &mut self,
        at: u64,
        step: &Step<'h>,
        next: Option<&(u64, Step<'h>)>,
    ) -> Result<(), String> {
        match step {
            Step::Grant(p) => self.grant(at, p),
            Step::Renewed {
                owner,
                fence,
                ttl_ms,
                expires,
            } => self.renewed(at, owner, *fence, *ttl_ms, *expires),
            Step::Released(p) => self.released(at, p, next),
            Step::Refused(r) => self.refused(at, r),
        }
    }

    /// The acquisition behind the lease `p`: its owner, TTL and lock delay as its request
    /// carried them, or as the store's history shows a lease nobody received.
    fn acquisition(&self, p: &PastLease) -> Acquire<Who<'h>> {
        let start = ms(p.acquired_at);
        match self.ack(p.fence) {
            Some(a) => Acquire {
                owner: Who::Named(a.owner),
                ttl: ms(a.lease.expires_at).saturating_sub(start),
                lock_delay: u64::from(a.lock_delay_ms),
                ticket: None,
            },
            None => Acquire {
                owner: Who::Unseen(fence_of(p.fence)),
                ttl: match (p.released, p.ended_at) {
                    (false, Some(expired)) => ms(expired).saturating_sub(start),
                    _ => UNKNOWN_TTL_MS,
                },
                lock_delay: 0,
                ticket: None,
            },
        }
    }

    /// Puts into the queue the waiters certainly in it, live and ahead of the acknowledged
    /// acquisition `a` when its lease began, then `a` itself if it waited; returns its
    /// ticket then.
    fn queue_for(&mut self, a: &Acknowledged<'h>, wait_ms: u32) -> Option<Ticket> {
        let slot = self.state.slots.entry(self.resource).or_default();
        slot.queue.clear();
        let granted = self.history.local(a.lease.acquired_at)?;
        let mut ahead =
            self.history
                .waiters_ahead_of(self.resource, a.sent_us, a.lease.acquired_at, granted);
        ahead.sort_by_key(|r| r.sent_us);
        // Waiters certainly queued before the grant, whoever was ahead.
        let waiting =
            self.history
                .waiters_ahead_of(self.resource, granted, a.lease.acquired_at, granted);
        if !waiting.is_empty() {
            self.report.grants_while_queued += 1;
        }
        for r in ahead {
            if let Op::Acquire { owner, .. } = &r.op {
                let req = Acquire {
                    owner: Who::Named(owner),
                    ttl: 0,
                    lock_delay: 0,
                    ticket: None,
                };
                // Certainly live when the lease began: its deadline is not in question.
                let _ = self
                    .state
                    .enqueue(&self.resource, &req, u64::MAX, Number::Next);
            }
        }
        if wait_ms == 0 {
            return None;
        }
        let req = self.acquisition_of(a);
        self.state
            .enqueue(&self.resource, &req, u64::MAX, Number::Next)
            .ok()
    }

    fn acquisition_of(&self, a: &Acknowledged<'h>) -> Acquire<Who<'h>> {
        Acquire {
            owner: Who::Named(a.owner),
            ttl: ms(a.lease.expires_at).saturating_sub(ms(a.lease.acquired_at)),
            lock_delay: u64::from(a.lock_delay_ms),
            ticket: None,
        }
    }

    fn clear_queue(&mut self) {
        if let Some(slot) = self.state.slots.get_mut(&self.resource) {
            slot.queue.clear();
        }
        self.state
            .slots
            .retain(|_, s| s.lease.is_some() || !s.queue.is_empty());
    }

    fn grant(&mut self, at: u64, p: &PastLease) -> Result<(), String> {
        let fence = fence_of(p.fence);
        let mut req = self.acquisition(p);
        let ack = self.ack(p.fence);
        let claimed = self.pending.take().filter(|(f, _)| *f == fence);
        req.ticket = match (claimed, ack) {
            (Some((_, ticket)), _) => Some(ticket),
            (None, Some(a)) => self.queue_for(a, self.wait_ms(a)),
            (None, None) => {
                self.clear_queue();
                None
            }
        };
        let replaced_free_at = self.current_free_at();
        let outcome = self.state.acquire(
            &self.rules,
            &self.resource,
            &req,
            at + TOLERANCE_MS,
            Number::Given(fence),
        );
        self.clear_queue();
        match outcome {
            Ok(AcquireOutcome::Granted { fence: given, .. }) if given == fence => {
                if let Some(start) = self.open.replace(at) {
                    let end = replaced_free_at.unwrap_or(at).max(start);
                    self.busy.push((start, end));
                }
                // The lease as stamped, not as judged.
                if let Some(lease) = self.lease_mut() {
                    lease.acquired_at = at;
                    lease.expires_at = at.saturating_add(req.ttl);
                }
                Ok(())
            }
            other => Err(format!(
                "the store granted fence {fence} to {}{}; the rules answer {}",
                req.owner,
                if req.ticket.is_some() {
                    " (waiting)"
                } else {
                    ""
                },
                self.describe(other)
            )),
        }
    }

    fn wait_ms(&self, a: &Acknowledged<'h>) -> u32 {
        self.history
            .records
            .iter()
            .find_map(|r| match &r.op {
                Op::Acquire {
                    owner,
                    wait_ms,
                    answer: AcquireAnswer::Acquired(l),
                    ..
                } if r.resource == self.resource
                    && *owner == a.owner
                    && l.fence == a.lease.fence =>
                {
                    Some(*wait_ms)
                }
                _ => None,
            })
            .unwrap_or(0)
    }

    fn renewed(
        &mut self,
        at: u64,
        owner: &'h str,
        fence: u64,
        ttl_ms: u64,
        expires: u64,
    ) -> Result<(), String> {
        let before = self.lease_view();
        self.extend_by_lost_renewal(owner, fence, at);
        let outcome = self.state.renew(
            &self.rules,
            &self.resource,
            &Who::Named(owner),
            Some(fence),
            ttl_ms,
            at.saturating_sub(TOLERANCE_MS),
        );
        match outcome {
            RenewOutcome::Renewed { fence: f, .. } if f == fence => {
                if let Some(lease) = self.lease_mut() {
                    lease.expires_at = expires;
                }
                Ok(())
            }
            other => Err(format!(
                "the store renewed fence {fence} of owner {owner}; the rules answer {other:?} ({before})"
            )),
        }
    }

    fn released(
        &mut self,
        at: u64,
        p: &PastLease,
        next: Option<&(u64, Step<'h>)>,
    ) -> Result<(), String> {
        let fence = fence_of(p.fence);
        let before = self.lease_view();
        let owner = match self
            .state
            .slot(&self.resource)
            .and_then(|s| s.lease.as_ref())
        {
            Some(lease) if lease.fence == fence => lease.owner.clone(),
            _ => self.acquisition(p).owner,
        };
        if let Who::Named(name) = owner {
            self.extend_by_lost_renewal(name, fence, at);
        }
        // PostgreSQL hands the lease to the head of the queue in the release's own step: the
        // grant at the same millisecond to a waiter that received it.
        let mut handover_to = None;
        let mut handover_fence = Number::Next;
        if self.rules.handover_on_release
            && let Some((next_at, Step::Grant(q))) = next
            && *next_at == at
            && let Some(a) = self.ack(q.fence)
            && self.wait_ms(a) > 0
        {
            handover_to = self
                .queue_for(a, self.wait_ms(a))
                .map(|t| (fence_of(q.fence), t));
            handover_fence = Number::Given(fence_of(q.fence));
        } else {
            self.clear_queue();
        }
        let outcome = self.state.release(
            &self.rules,
            &self.resource,
            &owner,
            Some(fence),
            at.saturating_sub(TOLERANCE_MS),
            handover_fence,
        );
        match outcome {
            Ok(ReleaseOutcome::Released {
                fence: f,
                handed_over,
            }) if f == fence => {
                if let Some(start) = self.open.take() {
                    self.busy.push((start, at));
                }
                match (handed_over, handover_to) {
                    (None, _) => {}
                    (Some(h), Some((next_fence, ticket)))
                        if h.ticket == ticket && h.fence == next_fence =>
                    {
                        // The grant waits in the ticket for the waiter to take it.
                        self.pending = Some((next_fence, ticket));
                        self.report.handovers += 1;
                        return Ok(());
                    }
                    (Some(h), _) => {
                        return Err(format!(
                            "the store released fence {fence}; the rules hand the lease to {} with fence {}, not to the waiter the store granted it to",
                            h.owner, h.fence
                        ));
                    }
                }
                self.clear_queue();
                Ok(())
            }
            other => {
                self.clear_queue();
                Err(format!(
                    "the store released fence {fence} of {owner}; the rules answer {} ({before})",
                    match other {
                        Ok(o) => format!("{o:?}"),
                        Err(e) => format!("{e:?}"),
                    }
                ))
            }
        }
    }

    /// A renewal of `owner`'s lease `fence` whose answer was lost may have extended it past
    /// the expiry the replay knows of: it explains a renewal or a release at `at` after that.
    fn extend_by_lost_renewal(&mut self, owner: &str, fence: u64, at: u64) {
        if self.renewal_lost(owner, i64::try_from(fence).unwrap_or(i64::MAX))
            && let Some(lease) = self.lease_mut().filter(|l| l.fence == fence)
        {
            lease.expires_at = lease.expires_at.max(at + TOLERANCE_MS + 1);
        }
    }

    fn renewal_lost(&self, owner: &str, fence: i64) -> bool {
        self.history.records.iter().any(|r| {
            r.resource == self.resource
                && matches!(&r.op, Op::Renew { owner: o, fence: f, answer: RenewAnswer::Unknown { .. }, .. }
                    if o == owner && *f == fence)
        })
    }

    fn refused(&mut self, at: u64, r: &'h Record) -> Result<(), String> {
        self.report.refusals += 1;
        let (what, owner, fence, answer) = match &r.op {
            Op::Renew {
                owner,
                fence,
                answer,
                ..
            } => ("renewal", owner, fence, format!("{answer:?}")),
            Op::Release {
                owner,
                fence,
                answer,
            } => ("release", owner, fence, format!("{answer:?}")),
            _ => return Ok(()),
        };
        // Judged on a copy: a step the rules allow is unexplained, and changes nothing of
        // what the store did.
        let mut state = self.state.clone();
        let (who, held) = (Who::Named(owner), Some(fence_of(*fence)));
        let allowed = match &r.op {
            Op::Renew { ttl_seconds, .. } => {
                let ttl = u64::from(*ttl_seconds) * 1000;
                let outcome = state.renew(&self.rules, &self.resource, &who, held, ttl, at);
                matches!(outcome, RenewOutcome::Renewed { .. })
            }
            _ => {
                let outcome =
                    state.release(&self.rules, &self.resource, &who, held, at, Number::Next);
                matches!(outcome, Ok(ReleaseOutcome::Released { .. }))
            }
        };
        if !allowed {
            return Ok(());
        }
        Err(format!(
            "a {what} of fence {fence} by owner {owner}, sent at {} ms, was answered {answer}; the rules allow it until the end of its flight ({})",
            r.sent_us / 1000,
            self.lease_view()
        ))
    }

    fn lease_mut(&mut self) -> Option<&mut fencelock_model::rules::Lease<Who<'h>>> {
        self.state
            .slots
            .get_mut(&self.resource)
            .and_then(|s| s.lease.as_mut())
    }

    /// The replayed lease of the resource, in words.
    fn lease_view(&self) -> String {
        match self
            .state
            .slot(&self.resource)
            .and_then(|s| s.lease.as_ref())
        {
            Some(l) => format!(
                "the replay's lease: fence {} of {}, from {} to {}, lock delay {} ms",
                l.fence,
                l.owner,
                clock(l.acquired_at),
                clock(l.expires_at),
                l.lock_delay
            ),
            None => "the replay has no lease".to_owned(),
        }
    }

    fn describe(&self, outcome: Result<AcquireOutcome, StepError>) -> String {
        let queue = self.state.slot(&self.resource).map_or(0, |s| s.queue.len());
        let lease = self.lease_view();
        match outcome {
            Ok(AcquireOutcome::Queued) => {
                format!("queued: a live waiter was ahead ({lease})")
            }
            Ok(AcquireOutcome::Held { delayed_until }) => match delayed_until {
                Some(until) => format!(
                    "held: inside the lock delay, until {} ({lease})",
                    clock(until)
                ),
                None => format!("held ({lease})"),
            },
            Ok(granted) => format!("{granted:?} ({lease}, {queue} queued)"),
            Err(e) => format!("impossible: {e:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::history::tests::{
        a_acquires, acquired, asked, expired, fault_on, lease, live, lock_delay, lost_renewal,
        past, queue, record, release, renewal, renewed_at, with_leases,
    };
    use super::super::history::{ReleaseAnswer, RenewAnswer};
    use super::*;

    fn unexplained(history: &History) -> Vec<String> {
        replay(history)
            .unexplained
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// Asserts that the replay explains all but one step, and that one says `text`.
    fn assert_explained(history: &History) {
        assert_eq!(unexplained(history), Vec::<String>::new());
    }

    fn assert_unexplained(history: &History, text: &str) {
        let found = unexplained(history);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(found[0].contains(text), "{found:#?}");
    }

    #[test]
    fn waiters_served_in_arrival_order_are_explained_on_both_stores() {
        let sqlite = replay(&queue(false));
        assert_eq!(sqlite.unexplained, Vec::new());
        assert_eq!(
            (sqlite.resources, sqlite.steps, sqlite.handovers),
            (1, 5, 0)
        );
        // W1 got the lease at 4 s while W2 waited behind it.
        assert_eq!(sqlite.grants_while_queued, 1);
        let mut postgres = queue(false);
        postgres.postgres = true;
        let postgres = replay(&postgres);
        assert_eq!(postgres.unexplained, Vec::new());
        assert_eq!(postgres.handovers, 2);
    }

    #[test]
    fn a_queue_served_in_reverse_is_unexplained_on_both_stores() {
        let history = queue(true);
        let report = replay(&history);
        assert_eq!(report.grants_while_queued, 1);
        assert_unexplained(
            &history,
            "k: step 3 at 2027-01-15 08:00:04 UTC (store time): the store granted fence 2 to owner w2 (waiting); the rules answer queued: a live waiter was ahead",
        );
        // PostgreSQL's release hands the lease over in its own step: to the first waiter.
        let mut postgres = queue(true);
        postgres.postgres = true;
        assert_unexplained(
            &postgres,
            "the store released fence 1; the rules hand the lease to owner w1 with fence 2",
        );
        // Unless the first waiter's instance was killed meanwhile (its ticket may lapse).
        let mut killed = queue(true);
        killed.faults.push(fault_on(Some(0)));
        assert_explained(&killed);
    }

    #[test]
    fn a_grant_inside_a_lock_delay_is_unexplained() {
        assert_explained(&lock_delay(1600));
        assert_unexplained(
            &lock_delay(1200),
            "the store granted fence 2 to owner b; the rules answer held: inside the lock delay, until 08:00:01.500",
        );
    }

    #[test]
    fn a_renewal_after_expiry_is_unexplained_and_one_at_the_boundary_is_not() {
        assert_explained(&renewed_at(900));
        assert_explained(&renewed_at(1001));
        assert_unexplained(
            &renewed_at(1500),
            "the store renewed fence 1 of owner a; the rules answer Expired",
        );
    }

    #[test]
    fn a_refusal_while_the_lease_was_live_throughout_is_unexplained() {
        let refused = |sent_ms: u64| {
            let answer = RenewAnswer::Refused {
                status: 409,
                problem: "lease-expired".to_owned(),
            };
            with_leases(
                vec![
                    a_acquires(),
                    record("k", sent_ms, sent_ms + 10, renewal("a", 1, answer)),
                ],
                vec![expired(1, 0, 1000)],
            )
        };
        // Its flight (with the placement slack) reaches past the expiry: explained.
        assert_explained(&refused(900));
        assert_unexplained(
            &refused(100),
            "a renewal of fence 1 by owner a, sent at 100 ms, was answered Refused",
        );
    }

    #[test]
    fn a_release_after_expiry_is_unexplained_unless_a_lost_renewal_explains_it() {
        let history = || {
            with_leases(
                vec![
                    a_acquires(),
                    record("k", 1490, 1500, release("a", 1, ReleaseAnswer::Released)),
                ],
                vec![past(1, 0, Some(1495))],
            )
        };
        assert_unexplained(
            &history(),
            "the store released fence 1 of owner a; the rules answer NotFound",
        );
        let mut lost = history();
        lost.records.insert(1, lost_renewal());
        assert_explained(&lost);
    }

    #[test]
    fn a_refused_acquisition_needs_a_lease_a_lock_delay_or_a_waiter_in_its_flight() {
        // A's lease on `k`: from 0 to 1 s, lock delay 500 ms, expired; B's from 1.6 s.
        let refused_at = |sent_ms: u64, wait_ms: u32| {
            let mut history = lock_delay(1600);
            let op = asked("c", 1, wait_ms, 0, AcquireAnswer::Held);
            history
                .records
                .push(record("k", sent_ms, sent_ms + 10 + u64::from(wait_ms), op));
            history
        };
        // During A's lease, its lock delay, or B's: explained.
        for sent_ms in [500, 1300, 2000] {
            assert_explained(&refused_at(sent_ms, 0));
        }
        // B's lease (1 s, never released) ended at 2.6 s: a refusal at 3 s is not.
        assert_unexplained(
            &refused_at(3000, 0),
            "an acquisition sent at 3000 ms and answered at 3010 ms was refused; the rules grant it throughout its flight",
        );
        // A waiter in flight then (it left later) may have been queued ahead.
        let mut queued = refused_at(3000, 0);
        let waiter = asked("d", 10, 8000, 0, AcquireAnswer::Departed);
        queued.records.push(record("k", 2900, 4000, waiter));
        assert_explained(&queued);
        // Its own wait does not explain itself.
        assert_unexplained(&refused_at(3000, 500), "an acquisition sent at 3000 ms");
    }

    #[test]
    fn a_lease_lasts_as_long_as_the_store_recorded_it() {
        // A's lease (1 s) expired at 2 s by the store's history: a renewal whose answer was
        // lost extended it. C was refused at 1.5 s.
        let refused = |recorded_expiry_ms: i64| {
            with_leases(
                vec![
                    a_acquires(),
                    lost_renewal(),
                    record("k", 1500, 1510, asked("c", 1, 0, 0, AcquireAnswer::Held)),
                ],
                vec![expired(1, 0, recorded_expiry_ms)],
            )
        };
        assert_explained(&refused(2000));
        assert_unexplained(&refused(1000), "an acquisition sent at 1500 ms");
    }

    #[test]
    fn a_lease_nobody_received_is_replayed_with_an_owner_of_its_own() {
        // Fence 2 went to a requester whose answer was lost; it expired at 2 s; then B.
        let history = |b_ms: i64| {
            with_leases(
                vec![
                    a_acquires(),
                    record("k", 990, 1000, release("a", 1, ReleaseAnswer::Released)),
                    record(
                        "k",
                        u64::try_from(b_ms).unwrap(),
                        u64::try_from(b_ms).unwrap() + 10,
                        acquired("b", lease(3, b_ms, 1000)),
                    ),
                ],
                vec![live(3, b_ms), expired(2, 1000, 2000), past(1, 0, Some(995))],
            )
        };
        assert_explained(&history(2000));
        assert_unexplained(
            &history(1500),
            "the store granted fence 3 to owner b; the rules answer held (the replay's lease: fence 2 of the unseen requester of fence 2",
        );
    }
}
