//! What a chaos run saw, and the checks over it.
//!
//! Every request is recorded with the local monotonic times it was sent and its answer
//! received. The checks only draw conclusions that hold whatever happened in between:
//!
//! - **Stale writes**: in the demo store's write log of a key (its apply order), no applied
//!   write carries a fence below an earlier applied one; the log agrees with the answers;
//!   and no write answered `200` carries a fence below one already answered `200` on that key
//!   before it was sent.
//! - **Fences**: no fence was acknowledged twice; and an acquisition sent after another was
//!   answered got the greater fence (fences increase in real time, across restarts).
//! - **No overlap** in the store's time, on one resource, taken in fence order: every lease
//!   starts no earlier than any lease with a smaller fence, and no earlier than the
//!   `expires_at` of any such lease whose owner had not yet sent a release (or sent one
//!   that was refused) when the later lease was acknowledged. A lease released before that
//!   ended somewhere between its `acquired_at` and `expires_at`, a store time the answers do
//!   not give, so only its start is compared. In real time: a release answered `204` (which
//!   proves its lease was live when the store decided it) must not have been sent after a
//!   greater fence on the same resource was acknowledged.
//! - **Acknowledged leases survive**: an inspection sent after an acquisition was
//!   acknowledged never shows an older fence on that resource, and never shows none while
//!   the lease's TTL cannot have run out and its owner has sent no release.
//! - **Every grant is delivered**: each lease in the store's own history of a resource
//!   (`GET /locks/{resource}/history`) that no request received held the resource for at
//!   most [`UNDELIVERED_LIMIT`] (until it ended, or until the next lease began), unless a
//!   request whose answer was lost to a fault (a kill, a cut: [`AcquireAnswer::Unknown`])
//!   was in flight when it began: such a grant is its requester's, who could not learn of
//!   it, and lasts its TTL. A waiter that left ([`AcquireAnswer::Departed`]) excuses one
//!   only when a fault struck while it waited or within the limit after. And every
//!   acknowledged fence the history still covers is in it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// Local monotonic time since the run began, in microseconds.
pub type Micros = u64;

/// One request and its answer.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// Who sent it: a worker's number, or `None` for the run's own checks.
    pub worker: Option<usize>,
    /// The lease-server instance it went to (its index); `None` for the demo store.
    pub instance: Option<usize>,
    pub resource: String,
    pub sent_us: Micros,
    pub received_us: Micros,
    #[serde(flatten)]
    pub op: Op,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    Acquire {
        owner: String,
        ttl_seconds: u32,
        /// The request's `wait_ms`; `0` when it did not wait.
        wait_ms: u32,
        /// The request's `lock_delay_ms`; `0` when it asked for none.
        lock_delay_ms: u32,
        answer: AcquireAnswer,
    },
    Renew {
        owner: String,
        fence: i64,
        ttl_seconds: u32,
        answer: RenewAnswer,
    },
    Write {
        owner: String,
        fence: i64,
        answer: WriteAnswer,
    },
    Release {
        owner: String,
        fence: i64,
        answer: ReleaseAnswer,
    },
    Inspect {
        answer: InspectAnswer,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum AcquireAnswer {
    Acquired(Lease),
    Held,
    /// No answer, or one that does not settle it (`503`, a cut connection): it may or may
    /// not have taken effect.
    Unknown {
        why: String,
    },
    /// The client gave up while the request waited, and closed its connection: the server
    /// must not keep a lease for it.
    Departed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Lease {
    pub fence: i64,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum WriteAnswer {
    Applied,
    Stale { current: i64 },
    Unknown { why: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum ReleaseAnswer {
    Released,
    /// `404`, `403` or `409`: the lease was not live, or not this owner's, and stays as it was.
    Refused {
        status: u16,
    },
    Unknown {
        why: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum RenewAnswer {
    Renewed(Lease),
    /// `404` or `409` (`lease-expired`, `owner-mismatch`, `stale-fence`): nothing changed.
    Refused {
        status: u16,
        /// The problem's `type`, last path segment (`lease-expired`, ...).
        problem: String,
    },
    Unknown {
        why: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum InspectAnswer {
    Live(Lease),
    None,
    Unknown { why: String },
}

/// One entry of the demo store's write log of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoggedWrite {
    pub fence: i64,
    pub applied: bool,
}

/// One lease of the store's own history of a resource, as `GET /locks/{resource}/history`
/// shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PastLease {
    pub fence: i64,
    pub acquired_at: DateTime<Utc>,
    /// `None` while it is live.
    pub ended_at: Option<DateTime<Utc>>,
    /// It ended by a release (`ended_at` is the release's time), not by expiry.
    pub released: bool,
}

/// A span of local time in which a fault was in force: an instance down (from its kill until
/// it was ready again), or the store's connections cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub from_us: Micros,
    pub until_us: Micros,
    /// The instance killed; `None` for a cut of every instance's connections to the store.
    pub instance: Option<usize>,
}

/// What a run observed: its records, the write log of every key and the store's history of
/// every resource at the end, and when faults struck.
#[derive(Debug, Default)]
pub struct History {
    pub records: Vec<Record>,
    pub write_logs: BTreeMap<String, Vec<LoggedWrite>>,
    /// Newest first, as the store answers; at most the store's page of history.
    pub lease_histories: BTreeMap<String, Vec<PastLease>>,
    pub faults: Vec<Fault>,
    /// The wall clock when the run's local time began, to place the store's times (the
    /// store is on this machine: its clock is this one) among the records.
    pub started_at: Option<DateTime<Utc>>,
    /// When the store's histories were read, in local time: a live lease has lasted until
    /// then.
    pub read_histories_us: Micros,
    /// The store was PostgreSQL (which hands a released lease to the first waiter in the
    /// release's own step), not SQLite.
    pub postgres: bool,
}

/// The longest a lease nobody received may keep its resource (the contract's 3 s hand-over
/// rule for waiters that left or died), plus a margin for the hand-over's own round trips.
pub const UNDELIVERED_LIMIT: Duration = Duration::from_millis(3500);
/// How far apart the store's time stamps and this process's clock readings may be placed:
/// one machine, one clock, but a request's time stamp is taken somewhere inside its flight.
pub(crate) const PLACEMENT_SLACK: Duration = Duration::from_millis(250);

/// A broken promise, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How much faster the store's clock may run than this process's over one TTL before the
/// "lease vanished" check could misjudge; clocks on one machine differ by far less.
const CLOCK_RATE_MARGIN: Duration = Duration::from_millis(50);

/// How far apart two store times read from answers may be and still be the same: each is
/// cut to the millisecond (PostgreSQL keeps microseconds), so two of them are off by less
/// than 2 ms.
const STAMP_TOLERANCE: chrono::TimeDelta = chrono::TimeDelta::milliseconds(2);

/// How soon after its request was sent a waiting acquisition holds its place in the queue,
/// at the latest, unless a fault struck its instance (or every instance) meanwhile: the
/// server's first attempt and the enqueue are two store steps. This is the one timing
/// assumption of the FIFO check: a server stalled longer than this could rightly queue a
/// waiter behind one sent after it.
pub const ENQUEUED_WITHIN: Duration = Duration::from_millis(1500);

/// How long a waiter's ticket counts without a heartbeat (the server's `TICKET_LIFE`, 2 s), in
/// microseconds, with 500 ms for the heartbeat's own round trip: the tickets of an instance
/// killed hold its queue that long after.
pub(crate) const TICKET_LIFE_US: Micros = 2_500_000;

/// An acknowledged acquisition, with what its owner did about renewing and releasing it.
pub(crate) struct Acknowledged<'a> {
    pub(crate) resource: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) lease: Lease,
    pub(crate) sent_us: Micros,
    pub(crate) received_us: Micros,
    pub(crate) ttl_seconds: u32,
    pub(crate) lock_delay_ms: u32,
    /// Its expiry after the last renewal acknowledged (the acquisition's own if none was):
    /// renewals use the same TTL, so the lease lasts at least this long unless released.
    pub(crate) expires_at: DateTime<Utc>,
    /// When the owner first sent a release of it that was not refused.
    pub(crate) release_sent_us: Option<Micros>,
}

impl History {
    /// Every violation the history shows, in check order.
    pub fn check(&self) -> Vec<Violation> {
        let acks = self.acknowledged();
        let mut found = Vec::new();
        self.check_write_logs(&mut found);
        self.check_write_answers(&mut found);
        check_unique_fences(&acks, &mut found);
        check_fences_increase(&acks, &mut found);
        check_no_overlap(&acks, &mut found);
        self.check_releases_in_real_time(&acks, &mut found);
        self.check_inspections(&acks, &mut found);
        self.check_grants_delivered(&acks, &mut found);
        self.check_renewals(&acks, &mut found);
        self.check_fifo(&acks, &mut found);
        found
    }

    /// A renewal answered `200` was decided while the lease was live: its store time (its new
    /// `expires_at` less its TTL: the store sets one from the other) is before the lease's
    /// expiry as the acquisition and the renewals before it left it. It keeps the lease's
    /// fence and start. Once a renewal's answer is lost, the expiry is unknown and the
    /// lease's later renewals are not judged.
    fn check_renewals(&self, acks: &[Acknowledged<'_>], found: &mut Vec<Violation>) {
        for a in acks {
            let mut expires = a.lease.expires_at;
            for (r, ttl_seconds, answer) in self.renewals_of(a) {
                match answer {
                    RenewAnswer::Renewed(renewed) => {
                        let at =
                            renewed.expires_at - chrono::TimeDelta::seconds(i64::from(ttl_seconds));
                        if at >= expires + STAMP_TOLERANCE {
                            found.push(Violation(format!(
                                "{}: fence {} was renewed at {at} (store time, by a request sent at {}), after it had expired at {expires}",
                                a.resource,
                                a.lease.fence,
                                ms(r.sent_us)
                            )));
                        }
                        if renewed.fence != a.lease.fence
                            || renewed.acquired_at != a.lease.acquired_at
                        {
                            found.push(Violation(format!(
                                "{}: fence {} was acknowledged as {:?} but renewed as {renewed:?}",
                                a.resource, a.lease.fence, a.lease
                            )));
                        }
                        expires = renewed.expires_at;
                    }
                    RenewAnswer::Refused { .. } => {}
                    RenewAnswer::Unknown { .. } => break,
                }
            }
        }
    }

    /// The renewals of an acknowledged lease by its owner, in the order they were sent, with
    /// their TTL.
    fn renewals_of<'h>(
        &'h self,
        a: &Acknowledged<'_>,
    ) -> impl Iterator<Item = (&'h Record, u32, &'h RenewAnswer)> {
        let mut renewals: Vec<_> = self
            .records
            .iter()
            .filter_map(|r| match &r.op {
                Op::Renew {
                    owner,
                    fence,
                    ttl_seconds,
                    answer,
                } if r.resource == a.resource && owner == a.owner && *fence == a.lease.fence => {
                    Some((r, *ttl_seconds, answer))
                }
                _ => None,
            })
            .collect();
        renewals.sort_by_key(|(r, _, _)| r.sent_us);
        renewals.into_iter()
    }

    /// Whether the owner of `a` had sent a renewal of it by `by`.
    fn renewing(&self, a: &Acknowledged<'_>, by: Micros) -> bool {
        self.renewals_of(a).any(|(r, _, _)| r.sent_us <= by)
    }

    /// Waiters are served in the order they queued: no lease goes to a request sent more
    /// than [`ENQUEUED_WITHIN`] after a waiter (on the same resource) that was still waiting,
    /// alive, when the lease began. "Still waiting" means its answer came later, its wait had
    /// not run out, and it did not get that lease or an earlier one; "alive" that it was
    /// answered (a lost answer may hide a dead instance, whose tickets lapse) and no fault
    /// struck its instance (or cut every instance's store connections) from its sending to
    /// the grant.
    fn check_fifo(&self, acks: &[Acknowledged<'_>], found: &mut Vec<Violation>) {
        for b in acks {
            let Some(granted) = self.local(b.lease.acquired_at) else {
                continue;
            };
            let ahead = self.waiters_ahead_of(b.resource, b.sent_us, b.lease.acquired_at, granted);
            if let Some(a) = ahead.into_iter().next() {
                found.push(Violation(format!(
                    "{}: fence {} went at {} to a request sent at {}, while a waiter sent at {} \
                     (answered at {}) was queued ahead of it: not in arrival order",
                    b.resource,
                    b.lease.fence,
                    ms(granted),
                    ms(b.sent_us),
                    ms(a.sent_us),
                    ms(a.received_us)
                )));
            }
        }
    }

    /// The waiting requests on `resource` that certainly held a live place in its queue,
    /// ahead of any request sent at `sent_us`, when a lease began at `granted_at` (store
    /// time; `granted` in local time): see [`History::check_fifo`].
    pub(crate) fn waiters_ahead_of(
        &self,
        resource: &str,
        sent_us: Micros,
        granted_at: DateTime<Utc>,
        granted: Micros,
    ) -> Vec<&Record> {
        let slack = micros(PLACEMENT_SLACK);
        self.records
            .iter()
            .filter(|a| a.resource == resource)
            .filter(|a| {
                let Op::Acquire {
                    wait_ms, answer, ..
                } = &a.op
                else {
                    return false;
                };
                let waiting = match answer {
                    AcquireAnswer::Held | AcquireAnswer::Departed => true,
                    AcquireAnswer::Acquired(own) => own.acquired_at > granted_at,
                    AcquireAnswer::Unknown { .. } => false,
                };
                let wait_ends = a.sent_us + u64::from(*wait_ms) * 1000;
                waiting
                    && *wait_ms > 0
                    && a.sent_us + micros(ENQUEUED_WITHIN) < sent_us
                    && granted + slack < a.received_us
                    && granted + slack < wait_ends
                    && !self.faulted(a.instance, a.sent_us, granted + slack)
            })
            .collect()
    }

    /// Whether a fault struck `instance` (a kill of it, or a cut of every instance) between
    /// `from` and `until`.
    fn faulted(&self, instance: Option<usize>, from: Micros, until: Micros) -> bool {
        self.faults.iter().any(|f| {
            (f.instance.is_none() || f.instance == instance)
                && f.from_us <= until
                && from <= f.until_us
        })
    }

    /// A store time as local micros of the run; `None` before the run began.
    pub(crate) fn local(&self, at: DateTime<Utc>) -> Option<Micros> {
        let since = (at - self.started_at?).to_std().ok()?;
        Some(micros(since))
    }

    /// A local time of the run as a store time, moved by `shift` (the placement slack, one
    /// way or the other).
    pub(crate) fn store_time(&self, us: Micros, shift: chrono::TimeDelta) -> Option<DateTime<Utc>> {
        let since = chrono::TimeDelta::microseconds(i64::try_from(us).ok()?);
        Some(self.started_at? + since + shift)
    }

    /// Every lease of the store's histories was received by a request, or kept its resource
    /// no longer than [`UNDELIVERED_LIMIT`], or is excused by a request whose answer a fault
    /// took (each such request excuses one lease).
    fn check_grants_delivered(&self, acks: &[Acknowledged<'_>], found: &mut Vec<Violation>) {
        let slack = micros(PLACEMENT_SLACK);
        let limit = micros(UNDELIVERED_LIMIT);
        let faulted = |from: Micros, until: Micros| {
            self.faults
                .iter()
                .any(|f| f.from_us <= until && from <= f.until_us)
        };
        for (resource, past) in &self.lease_histories {
            let received: BTreeSet<i64> = acks
                .iter()
                .filter(|a| a.resource == resource)
                .map(|a| a.lease.fence)
                .collect();
            if let Some(oldest) = past.iter().map(|p| p.fence).min() {
                let known: BTreeSet<i64> = past.iter().map(|p| p.fence).collect();
                for fence in received.iter().filter(|f| **f >= oldest) {
                    if !known.contains(fence) {
                        found.push(Violation(format!(
                            "{resource}: fence {fence} was acknowledged but is not in the store's history"
                        )));
                    }
                }
            }
            // Requests whose answer may hide a grant, with whether each is still unused.
            let mut excuses: Vec<(Micros, Micros, bool)> = self
                .records
                .iter()
                .filter(|r| &r.resource == resource)
                .filter_map(|r| match &r.op {
                    Op::Acquire {
                        answer: AcquireAnswer::Unknown { .. },
                        ..
                    } => Some((r.sent_us, r.received_us, true)),
                    Op::Acquire {
                        answer: AcquireAnswer::Departed,
                        ..
                    } if faulted(r.sent_us, r.received_us + limit) => {
                        Some((r.sent_us, r.received_us, true))
                    }
                    _ => None,
                })
                .collect();
            // Newest first, as the store answers: the lease after each is the one seen before it.
            let mut next_began: Option<DateTime<Utc>> = None;
            for lease in past.iter() {
                let began = lease.acquired_at;
                let ended = [lease.ended_at, next_began].into_iter().flatten().min();
                next_began = Some(began);
                if received.contains(&lease.fence) {
                    continue;
                }
                let (Some(from), until) = (self.local(began), ended.and_then(|e| self.local(e)))
                else {
                    continue;
                };
                let until = until.unwrap_or(self.read_histories_us);
                if until.saturating_sub(from) <= limit {
                    continue;
                }
                let excuse = excuses.iter_mut().find(|(sent, received, unused)| {
                    *unused && sent.saturating_sub(slack) <= from && from <= received + slack
                });
                match excuse {
                    Some(excuse) => excuse.2 = false,
                    None => found.push(Violation(format!(
                        "{resource}: fence {} was granted at {} and kept the resource {} with no \
                         request receiving it",
                        lease.fence,
                        ms(from),
                        ms(until - from)
                    ))),
                }
            }
        }
    }

    /// Write attempts answered `409 stale-fence`.
    pub fn stale_writes_rejected(&self) -> usize {
        self.records
            .iter()
            .filter(|r| {
                matches!(
                    r.op,
                    Op::Write {
                        answer: WriteAnswer::Stale { .. },
                        ..
                    }
                )
            })
            .count()
    }

    pub(crate) fn acknowledged(&self) -> Vec<Acknowledged<'_>> {
        // Releases that may have ended their lease; a refused one did not.
        let mut releases: HashMap<(&str, &str, i64), Micros> = HashMap::new();
        for r in &self.records {
            if let Op::Release {
                owner,
                fence,
                answer: ReleaseAnswer::Released | ReleaseAnswer::Unknown { .. },
            } = &r.op
            {
                let first = releases
                    .entry((r.resource.as_str(), owner.as_str(), *fence))
                    .or_insert(r.sent_us);
                *first = (*first).min(r.sent_us);
            }
        }
        // The latest expiry each lease's acknowledged renewals gave it.
        let mut renewed: HashMap<(&str, &str, i64), DateTime<Utc>> = HashMap::new();
        for r in &self.records {
            if let Op::Renew {
                owner,
                fence,
                answer: RenewAnswer::Renewed(lease),
                ..
            } = &r.op
            {
                let latest = renewed
                    .entry((r.resource.as_str(), owner.as_str(), *fence))
                    .or_insert(lease.expires_at);
                *latest = (*latest).max(lease.expires_at);
            }
        }
        self.records
            .iter()
            .filter_map(|r| match &r.op {
                Op::Acquire {
                    owner,
                    ttl_seconds,
                    lock_delay_ms,
                    answer: AcquireAnswer::Acquired(lease),
                    ..
                } => {
                    let key = (r.resource.as_str(), owner.as_str(), lease.fence);
                    Some(Acknowledged {
                        resource: &r.resource,
                        owner,
                        lease: *lease,
                        sent_us: r.sent_us,
                        received_us: r.received_us,
                        ttl_seconds: *ttl_seconds,
                        lock_delay_ms: *lock_delay_ms,
                        expires_at: renewed
                            .get(&key)
                            .map_or(lease.expires_at, |e| (*e).max(lease.expires_at)),
                        release_sent_us: releases.get(&key).copied(),
                    })
                }
                _ => None,
            })
            .collect()
    }

    fn check_write_logs(&self, found: &mut Vec<Violation>) {
        for (key, log) in &self.write_logs {
            let mut highest: Option<i64> = None;
            for (i, w) in log.iter().enumerate().filter(|(_, w)| w.applied) {
                if let Some(h) = highest
                    && w.fence < h
                {
                    found.push(Violation(format!(
                        "{key}: write #{} with fence {} was applied after fence {h}",
                        i + 1,
                        w.fence
                    )));
                }
                highest = highest.max(Some(w.fence));
            }
        }
    }

    /// The log and the answers tell the same story: per key and fence, as many writes
    /// applied and rejected in the log as answered so (writes with no answer may be
    /// either).
    fn check_write_answers(&self, found: &mut Vec<Violation>) {
        // (key, fence) -> [applied, rejected, unknown] as answered.
        let mut answered: BTreeMap<(&str, i64), [usize; 3]> = BTreeMap::new();
        for r in &self.records {
            if let Op::Write { fence, answer, .. } = &r.op {
                let slot = match answer {
                    WriteAnswer::Applied => 0,
                    WriteAnswer::Stale { .. } => 1,
                    WriteAnswer::Unknown { .. } => 2,
                };
                answered.entry((r.resource.as_str(), *fence)).or_default()[slot] += 1;
            }
        }
        let mut logged: BTreeMap<(&str, i64), [usize; 2]> = BTreeMap::new();
        for (key, log) in &self.write_logs {
            for w in log {
                logged.entry((key.as_str(), w.fence)).or_default()[usize::from(!w.applied)] += 1;
            }
        }
        for (&(key, fence), &[applied, rejected, unknown]) in &answered {
            let [log_applied, log_rejected] = logged.remove(&(key, fence)).unwrap_or_default();
            let fits = log_applied >= applied
                && log_rejected >= rejected
                && log_applied + log_rejected <= applied + rejected + unknown;
            if !fits {
                found.push(Violation(format!(
                    "{key}: writes with fence {fence} answered {applied} applied, {rejected} rejected \
                     ({unknown} unanswered), but the log holds {log_applied} applied, {log_rejected} rejected"
                )));
            }
        }
        for ((key, fence), [a, r]) in logged {
            found.push(Violation(format!(
                "{key}: the log holds {a} applied and {r} rejected writes with fence {fence} nobody sent"
            )));
        }
        // In real time: an applied write must not carry a fence below one already answered
        // applied on the same key before it was sent.
        let mut applied: BTreeMap<&str, Vec<(Micros, Micros, i64)>> = BTreeMap::new();
        for r in &self.records {
            if let Op::Write {
                fence,
                answer: WriteAnswer::Applied,
                ..
            } = &r.op
            {
                applied
                    .entry(&r.resource)
                    .or_default()
                    .push((r.sent_us, r.received_us, *fence));
            }
        }
        for (key, writes) in applied {
            for (sent, (earlier, fence)) in before_each(&writes, |w| w.0, |w| w.1, |w| w.2, |w| w.2)
            {
                if let Some(earlier) = earlier
                    && fence < earlier
                {
                    found.push(Violation(format!(
                        "{key}: a write with fence {fence}, sent at {}, was applied after fence {earlier} had been applied",
                        ms(sent)
                    )));
                }
            }
        }
    }

    fn check_releases_in_real_time(&self, acks: &[Acknowledged<'_>], found: &mut Vec<Violation>) {
        let mut by_resource: HashMap<&str, Vec<&Acknowledged<'_>>> = HashMap::new();
        for a in acks {
            by_resource.entry(a.resource).or_default().push(a);
        }
        for r in &self.records {
            let Op::Release {
                fence,
                answer: ReleaseAnswer::Released,
                ..
            } = &r.op
            else {
                continue;
            };
            let later = by_resource.get(r.resource.as_str()).and_then(|acks| {
                acks.iter()
                    .filter(|a| a.lease.fence > *fence && a.received_us < r.sent_us)
                    .min_by_key(|a| a.lease.fence)
            });
            if let Some(later) = later {
                found.push(Violation(format!(
                    "{}: the lease with fence {fence} was released (204) by a request sent at {}, after fence {} had been acquired at {}: two live leases",
                    r.resource,
                    ms(r.sent_us),
                    later.lease.fence,
                    ms(later.received_us)
                )));
            }
        }
    }

    fn check_inspections(&self, acks: &[Acknowledged<'_>], found: &mut Vec<Violation>) {
        let mut by_resource: HashMap<&str, Vec<&Acknowledged<'_>>> = HashMap::new();
        for a in acks {
            by_resource.entry(a.resource).or_default().push(a);
        }
        for r in &self.records {
            let Op::Inspect { answer } = &r.op else {
                continue;
            };
            let known = by_resource
                .get(r.resource.as_str())
                .map(Vec::as_slice)
                .unwrap_or_default();
            let before = known.iter().filter(|a| a.received_us < r.sent_us);
            match answer {
                InspectAnswer::Live(shown) => {
                    if let Some(newer) = before
                        .filter(|a| a.lease.fence > shown.fence)
                        .max_by_key(|a| a.lease.fence)
                    {
                        found.push(Violation(format!(
                            "{}: inspected at {} it showed fence {}, but fence {} had been acquired at {}: an acknowledged lease is gone",
                            r.resource,
                            ms(r.sent_us),
                            shown.fence,
                            newer.lease.fence,
                            ms(newer.received_us)
                        )));
                    }
                    if let Some(same) = known.iter().find(|a| a.lease.fence == shown.fence)
                        && !agrees(same, r, shown, self.renewing(same, r.received_us))
                    {
                        found.push(Violation(format!(
                            "{}: fence {} was acknowledged as {:?} but inspected as {:?}",
                            r.resource, shown.fence, same.lease, shown
                        )));
                    }
                }
                InspectAnswer::None => {
                    // The lease ends no sooner than its TTL after its request was sent.
                    let vanished = before.filter(|a| {
                        let ttl = Duration::from_secs(u64::from(a.ttl_seconds))
                            .saturating_sub(CLOCK_RATE_MARGIN);
                        let lives_until = a.sent_us + micros(ttl);
                        r.received_us < lives_until
                            && a.release_sent_us.is_none_or(|s| s > r.received_us)
                    });
                    if let Some(lost) = vanished.max_by_key(|a| a.lease.fence) {
                        found.push(Violation(format!(
                            "{}: inspected at {} it had no live lease, but fence {} (acquired at {}, {} s TTL, never released) cannot have expired yet",
                            r.resource,
                            ms(r.sent_us),
                            lost.lease.fence,
                            ms(lost.received_us),
                            lost.ttl_seconds
                        )));
                    }
                }
                InspectAnswer::Unknown { .. } => {}
            }
        }
    }
}

impl Acknowledged<'_> {
    /// The end of its lock delay, had it ended by expiry.
    pub(crate) fn delayed_until(&self) -> DateTime<Utc> {
        self.expires_at + chrono::TimeDelta::milliseconds(i64::from(self.lock_delay_ms))
    }
}

/// Whether an inspection (`r`, showing `shown`) agrees with the acknowledged lease of the
/// same fence. Once the acknowledgment was received, the store shows the lease as it was
/// acknowledged. While the acquisition is in flight, a lease a release handed over to a
/// waiter may still show its provisional expiry (the store gives it the waiter's TTL when
/// the waiter takes it, before answering): the same start, an earlier end.
///
/// Once its owner has sent a renewal (before the inspection was answered), the lease may
/// show a later expiry too.
fn agrees(acked: &Acknowledged<'_>, r: &Record, shown: &Lease, renewing: bool) -> bool {
    let same_lease =
        shown.fence == acked.lease.fence && shown.acquired_at == acked.lease.acquired_at;
    let in_flight = r.sent_us < acked.received_us;
    let expiry_fits = match shown.expires_at.cmp(&acked.lease.expires_at) {
        std::cmp::Ordering::Less => in_flight,
        std::cmp::Ordering::Equal => true,
        std::cmp::Ordering::Greater => renewing,
    };
    same_lease && expiry_fits
}

fn check_unique_fences(acks: &[Acknowledged<'_>], found: &mut Vec<Violation>) {
    let mut seen: HashMap<i64, &Acknowledged<'_>> = HashMap::new();
    for a in acks {
        if let Some(first) = seen.insert(a.lease.fence, a) {
            found.push(Violation(format!(
                "fence {} was issued twice: for {} at {} and for {} at {}",
                a.lease.fence,
                first.resource,
                ms(first.received_us),
                a.resource,
                ms(a.received_us)
            )));
        }
    }
}

/// An acquisition sent after another was answered must get the greater fence.
fn check_fences_increase(acks: &[Acknowledged<'_>], found: &mut Vec<Violation>) {
    for (sent, (earlier, fence)) in before_each(
        acks,
        |a| a.sent_us,
        |a| a.received_us,
        |a| a.lease.fence,
        |a| a.lease.fence,
    ) {
        if let Some(earlier) = earlier
            && fence <= earlier
        {
            found.push(Violation(format!(
                "an acquisition sent at {} got fence {fence}, not above fence {earlier} acknowledged before it was sent",
                ms(sent)
            )));
        }
    }
}

fn check_no_overlap(acks: &[Acknowledged<'_>], found: &mut Vec<Violation>) {
    let mut by_resource: BTreeMap<&str, Vec<&Acknowledged<'_>>> = BTreeMap::new();
    for a in acks {
        by_resource.entry(a.resource).or_default().push(a);
    }
    for (resource, mut leases) in by_resource {
        leases.sort_by_key(|a| a.lease.fence);
        for (i, a) in leases.iter().enumerate() {
            let earlier = &leases[..i];
            if let Some(p) = earlier
                .iter()
                .filter(|p| a.lease.acquired_at < p.lease.acquired_at)
                .max_by_key(|p| p.lease.acquired_at)
            {
                found.push(Violation(format!(
                    "{resource}: fence {} starts at {}, before fence {} started at {}",
                    a.lease.fence, a.lease.acquired_at, p.lease.fence, p.lease.acquired_at
                )));
            }
            // An earlier lease lasts until its expiry (as its renewals left it) if its owner
            // had not sent a release by the time this one was acknowledged; and having
            // ended by expiry, it keeps other owners out for its lock delay after.
            let unreleased = || {
                earlier
                    .iter()
                    .filter(|p| p.release_sent_us.is_none_or(|s| s > a.received_us))
            };
            let lasting = unreleased().filter(|p| a.lease.acquired_at < p.expires_at);
            if let Some(p) = lasting.max_by_key(|p| p.expires_at) {
                found.push(Violation(format!(
                    "{resource}: fence {} starts at {}, while fence {} (not released by then) lasts until {}",
                    a.lease.fence, a.lease.acquired_at, p.lease.fence, p.expires_at
                )));
            } else if let Some(p) = unreleased()
                .filter(|p| a.lease.acquired_at + STAMP_TOLERANCE < p.delayed_until())
                .max_by_key(|p| p.delayed_until())
            {
                found.push(Violation(format!(
                    "{resource}: fence {} starts at {}, inside the lock delay of fence {} (expired at {}, delayed until {})",
                    a.lease.fence,
                    a.lease.acquired_at,
                    p.lease.fence,
                    p.expires_at,
                    p.delayed_until()
                )));
            }
        }
    }
}

/// For each item in order of sending: its send time, the greatest `key` among the items
/// answered before it was sent (`None` if none was), and its own `value`.
fn before_each<T>(
    items: &[T],
    sent: impl Fn(&T) -> Micros,
    received: impl Fn(&T) -> Micros,
    key: impl Fn(&T) -> i64,
    value: impl Fn(&T) -> i64,
) -> Vec<(Micros, (Option<i64>, i64))> {
    let mut by_sent: Vec<&T> = items.iter().collect();
    by_sent.sort_by_key(|t| sent(t));
    let mut by_received: Vec<&T> = items.iter().collect();
    by_received.sort_by_key(|t| received(t));
    let mut answered = by_received.into_iter().peekable();
    let mut greatest = None;
    by_sent
        .into_iter()
        .map(|t| {
            while let Some(done) = answered.next_if(|d| received(d) < sent(t)) {
                greatest = greatest.max(Some(key(done)));
            }
            (sent(t), (greatest, value(t)))
        })
        .collect()
}

fn micros(d: Duration) -> Micros {
    Micros::try_from(d.as_micros()).unwrap_or(Micros::MAX)
}

/// A local time as the report shows it: milliseconds into the run.
fn ms(us: Micros) -> String {
    format!("{:.1} ms", us as f64 / 1000.0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    pub(crate) fn lease(fence: i64, from_ms: i64, ttl_ms: i64) -> Lease {
        Lease {
            fence,
            acquired_at: at(from_ms),
            expires_at: at(from_ms + ttl_ms),
        }
    }

    pub(crate) fn record(resource: &str, sent_ms: u64, received_ms: u64, op: Op) -> Record {
        Record {
            worker: Some(0),
            instance: Some(0),
            resource: resource.to_owned(),
            sent_us: sent_ms * 1000,
            received_us: received_ms * 1000,
            op,
        }
    }

    pub(crate) fn acquired(owner: &str, lease: Lease) -> Op {
        waited(owner, AcquireAnswer::Acquired(lease))
    }

    fn waited(owner: &str, answer: AcquireAnswer) -> Op {
        asked(owner, 1, 0, 0, answer)
    }

    pub(crate) fn past(fence: i64, from_ms: i64, ended_ms: Option<i64>) -> PastLease {
        PastLease {
            fence,
            acquired_at: at(from_ms),
            ended_at: ended_ms.map(at),
            released: true,
        }
    }

    /// An acquisition of `owner` with these `ttl_seconds`, `wait_ms` and `lock_delay_ms`.
    pub(crate) fn asked(
        owner: &str,
        ttl_seconds: u32,
        wait_ms: u32,
        lock_delay_ms: u32,
        answer: AcquireAnswer,
    ) -> Op {
        Op::Acquire {
            owner: owner.to_owned(),
            ttl_seconds,
            wait_ms,
            lock_delay_ms,
            answer,
        }
    }

    /// A renewal of `owner`'s lease `fence` with a TTL of 1 s.
    pub(crate) fn renewal(owner: &str, fence: i64, answer: RenewAnswer) -> Op {
        Op::Renew {
            owner: owner.to_owned(),
            fence,
            ttl_seconds: 1,
            answer,
        }
    }

    /// A lease of the store's history that has not ended.
    pub(crate) fn live(fence: i64, from_ms: i64) -> PastLease {
        PastLease {
            released: false,
            ..past(fence, from_ms, None)
        }
    }

    /// A lease of the store's history that ended by expiry at `expired_ms`.
    pub(crate) fn expired(fence: i64, from_ms: i64, expired_ms: i64) -> PastLease {
        PastLease {
            fence,
            acquired_at: at(from_ms),
            ended_at: Some(at(expired_ms)),
            released: false,
        }
    }

    /// A history with the store's history of `k` (newest first) beside the records.
    pub(crate) fn with_leases(records: Vec<Record>, leases: Vec<PastLease>) -> History {
        History {
            records,
            lease_histories: BTreeMap::from([("k".to_owned(), leases)]),
            started_at: Some(at(0)),
            read_histories_us: 20_000_000,
            ..History::default()
        }
    }

    /// A holds `k` (TTL 10 s) and releases it at 4 s; two waiters (TTL 10 s, `wait_ms`
    /// 8000) queue behind it, the first sent at 0.1 s, the second at 2 s. The first gets the
    /// lease at 4 s and releases it at 6 s, when the second gets it; `reversed`, the second
    /// gets it first. The store's history agrees.
    pub(crate) fn queue(reversed: bool) -> History {
        let (w1, w2) = if reversed { (3, 2) } else { (2, 3) };
        let start = |fence: i64| if fence == 2 { 4000 } else { 6000 };
        let waiter = |owner: &str, fence: i64| {
            asked(
                owner,
                10,
                8000,
                0,
                AcquireAnswer::Acquired(lease(fence, start(fence), 10_000)),
            )
        };
        let holder_of_2 = if reversed { "w2" } else { "w1" };
        with_leases(
            vec![
                record(
                    "k",
                    0,
                    10,
                    asked("a", 10, 0, 0, AcquireAnswer::Acquired(lease(1, 0, 10_000))),
                ),
                record("k", 100, start(w1) as u64 + 10, waiter("w1", w1)),
                record("k", 2000, start(w2) as u64 + 10, waiter("w2", w2)),
                record("k", 3990, 4000, release("a", 1, ReleaseAnswer::Released)),
                record(
                    "k",
                    5990,
                    6000,
                    release(holder_of_2, 2, ReleaseAnswer::Released),
                ),
            ],
            vec![
                live(3, 6000),
                past(2, 4000, Some(6000)),
                past(1, 0, Some(4000)),
            ],
        )
    }

    /// A holds `k` for 1 s with a lock delay of 500 ms and lets it expire (its release at
    /// 1.3 s is refused); B's lease begins at `b_ms`.
    pub(crate) fn lock_delay(b_ms: i64) -> History {
        let b_sent = u64::try_from(b_ms - 5).unwrap();
        with_leases(
            vec![
                record(
                    "k",
                    0,
                    10,
                    asked("a", 1, 0, 500, AcquireAnswer::Acquired(lease(1, 0, 1000))),
                ),
                record(
                    "k",
                    1300,
                    1310,
                    release("a", 1, ReleaseAnswer::Refused { status: 404 }),
                ),
                record(
                    "k",
                    b_sent,
                    b_sent + 10,
                    acquired("b", lease(2, b_ms, 1000)),
                ),
            ],
            vec![live(2, b_ms), expired(1, 0, 1000)],
        )
    }

    /// A holds `k` for 1 s, renews it at `renewed_ms` (store time; answered `200`) and
    /// releases it 100 ms later.
    pub(crate) fn renewed_at(renewed_ms: i64) -> History {
        let sent = u64::try_from(renewed_ms - 5).unwrap();
        let renewed = RenewAnswer::Renewed(lease(1, 0, renewed_ms + 1000));
        with_leases(
            vec![
                a_acquires(),
                record("k", sent, sent + 10, renewal("a", 1, renewed)),
                record(
                    "k",
                    sent + 100,
                    sent + 110,
                    release("a", 1, ReleaseAnswer::Released),
                ),
            ],
            vec![past(1, 0, Some(renewed_ms + 100))],
        )
    }

    /// A's renewal of fence 1, sent at 0.8 s, whose answer a cut took.
    /// A acquires `k` at 0 for 1 s with fence 1 (answered at 10 ms).
    pub(crate) fn a_acquires() -> Record {
        record("k", 0, 10, acquired("a", lease(1, 0, 1000)))
    }

    pub(crate) fn lost_renewal() -> Record {
        let why = "cut".to_owned();
        record(
            "k",
            800,
            1200,
            renewal("a", 1, RenewAnswer::Unknown { why }),
        )
    }

    /// A fault from 1 s to 1.5 s: a kill of `instance`, or (`None`) a cut of every one.
    pub(crate) fn fault_on(instance: Option<usize>) -> Fault {
        Fault {
            from_us: 1_000_000,
            until_us: 1_500_000,
            instance,
        }
    }

    #[test]
    fn a_renewal_after_expiry_is_caught() {
        assert_eq!(violations(&renewed_at(900)), Vec::<String>::new());
        // Within the stamps' rounding of the expiry: not judged.
        assert_eq!(violations(&renewed_at(1001)), Vec::<String>::new());
        let found = violations(&renewed_at(1500));
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(found[0].contains("fence 1 was renewed at"), "{found:#?}");
        assert!(found[0].contains("after it had expired"), "{found:#?}");
        // A renewal before it whose answer was lost may have extended the lease.
        let mut lost = renewed_at(1500);
        lost.records.insert(1, lost_renewal());
        assert_eq!(violations(&lost), Vec::<String>::new());
    }

    #[test]
    fn a_lease_inside_the_lock_delay_of_an_expired_one_is_caught() {
        assert_eq!(violations(&lock_delay(1600)), Vec::<String>::new());
        let found = violations(&lock_delay(1200));
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].contains("fence 2 starts at")
                && found[0].contains("inside the lock delay of fence 1"),
            "{found:#?}"
        );
        // Released, its lease starts no delay.
        let mut released = lock_delay(1200);
        released.records[1] = record("k", 900, 910, release("a", 1, ReleaseAnswer::Released));
        assert_eq!(violations(&released), Vec::<String>::new());
    }

    #[test]
    fn a_waiter_served_before_one_queued_ahead_is_caught() {
        assert_eq!(violations(&queue(false)), Vec::<String>::new());
        let found = violations(&queue(true));
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].contains("fence 2 went at 4000.0 ms to a request sent at 2000.0 ms, while a waiter sent at 100.0 ms"),
            "{found:#?}"
        );
        // A kill of the first waiter's instance (its ticket may have lapsed), or a cut of
        // every instance's connections: no conclusion.
        for instance in [Some(0), None] {
            let mut killed = queue(true);
            killed.faults.push(fault_on(instance));
            assert_eq!(violations(&killed), Vec::<String>::new());
        }
        // A kill of another instance proves nothing either way: still caught.
        let mut other = queue(true);
        other.faults.push(fault_on(Some(2)));
        assert_eq!(violations(&other).len(), 1);
        // Sent within ENQUEUED_WITHIN of each other, either may have queued first.
        let mut close = queue(true);
        close.records[2].sent_us = 1_500_000;
        assert_eq!(violations(&close), Vec::<String>::new());
    }

    /// The fair history with the store's history of `k`: fences 1 and 2 released, and
    /// `extra` (newest first) before them.
    fn with_store_history(extra: Vec<PastLease>) -> History {
        let mut history = fair();
        history.started_at = Some(at(0));
        history.read_histories_us = 30_000_000;
        let mut leases = extra;
        leases.extend([
            past(3, 1160, Some(1500)),
            past(2, 1100, Some(1140)),
            past(1, 0, Some(1100)),
        ]);
        history.lease_histories.insert("k".to_owned(), leases);
        history
    }

    pub(crate) fn release(owner: &str, fence: i64, answer: ReleaseAnswer) -> Op {
        Op::Release {
            owner: owner.to_owned(),
            fence,
            answer,
        }
    }

    fn inspected(answer: InspectAnswer) -> Op {
        Op::Inspect { answer }
    }

    fn write(fence: i64, answer: WriteAnswer) -> Op {
        Op::Write {
            owner: String::new(),
            fence,
            answer,
        }
    }

    /// Asserts that one of `found` says `text`.
    fn assert_found(found: &[String], text: &str) {
        assert!(found.iter().any(|v| v.contains(text)), "{found:#?}");
    }

    fn violations(history: &History) -> Vec<String> {
        history.check().into_iter().map(|v| v.0).collect()
    }

    /// A fair history: A acquires, writes, releases; B takes over; A's late write is
    /// rejected; an inspection shows B.
    fn fair() -> History {
        History {
            records: vec![
                a_acquires(),
                record("k", 10, 20, write(1, WriteAnswer::Applied)),
                record("k", 1100, 1110, acquired("b", lease(2, 1100, 1000))),
                record("k", 1110, 1120, write(2, WriteAnswer::Applied)),
                record("k", 1120, 1130, write(1, WriteAnswer::Stale { current: 2 })),
                record(
                    "k",
                    1130,
                    1140,
                    inspected(InspectAnswer::Live(lease(2, 1100, 1000))),
                ),
                record("k", 1140, 1150, release("b", 2, ReleaseAnswer::Released)),
                record(
                    "k",
                    1150,
                    1160,
                    release("a", 1, ReleaseAnswer::Refused { status: 404 }),
                ),
                record("k", 1160, 1170, acquired("c", lease(3, 1160, 1000))),
            ],
            write_logs: BTreeMap::from([(
                "k".to_owned(),
                vec![
                    LoggedWrite {
                        fence: 1,
                        applied: true,
                    },
                    LoggedWrite {
                        fence: 2,
                        applied: true,
                    },
                    LoggedWrite {
                        fence: 1,
                        applied: false,
                    },
                ],
            )]),
            ..History::default()
        }
    }

    #[test]
    fn a_fair_history_passes() {
        let history = fair();
        assert_eq!(violations(&history), Vec::<String>::new());
        assert_eq!(history.stale_writes_rejected(), 1);
    }

    #[test]
    fn a_late_write_applied_is_caught_in_the_log_and_in_real_time() {
        let mut history = fair();
        history.records[4] = record("k", 1125, 1130, write(1, WriteAnswer::Applied));
        history.write_logs.get_mut("k").unwrap()[2].applied = true;
        let found = violations(&history);
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(found[0].contains("fence 1 was applied after fence 2"));
        assert!(found[1].contains("applied after fence 2 had been applied"));
    }

    #[test]
    fn a_log_that_disagrees_with_the_answers_is_caught() {
        let mut history = fair();
        history.write_logs.get_mut("k").unwrap().pop();
        assert!(violations(&history)[0].contains("but the log holds 1 applied, 0 rejected"));
    }

    #[test]
    fn a_fence_issued_twice_or_lower_after_a_restart_is_caught() {
        let mut history = fair();
        history
            .records
            .push(record("j", 2000, 2010, acquired("d", lease(3, 2000, 1000))));
        let found = violations(&history);
        assert_found(&found, "fence 3 was issued twice");
        assert_found(&found, "not above fence 3");
    }

    #[test]
    fn overlapping_leases_are_caught_only_where_the_answers_prove_it() {
        // B starts while A, never released, still lasts.
        let mut history = fair();
        history.records[2] = record("k", 900, 910, acquired("b", lease(2, 900, 1000)));
        history.records.remove(5); // the inspection of B as it was
        let found = violations(&history);
        assert_found(&found, "while fence 1 (not released by then)");

        // Had A sent a release, its end is unknown: B may start before A's expiry.
        let mut history = fair();
        history.records[2] = record("k", 900, 910, acquired("b", lease(2, 900, 1000)));
        history.records.remove(5); // the inspection of B as it was
        history.records.insert(
            2,
            record("k", 850, 860, release("a", 1, ReleaseAnswer::Released)),
        );
        history.records.remove(7); // A's late release
        assert_eq!(violations(&history), Vec::<String>::new());

        // But never before A started.
        history.records[3] = record("k", 900, 910, acquired("b", lease(2, -5, 1000)));
        let found = violations(&history);
        assert_found(&found, "before fence 1 started");
    }

    #[test]
    fn a_release_of_an_older_lease_after_a_newer_was_acknowledged_is_caught() {
        let mut history = fair();
        history.records[7] = record("k", 1150, 1160, release("a", 1, ReleaseAnswer::Released));
        assert!(violations(&history)[0].contains("two live leases"));
    }

    #[test]
    fn an_acknowledged_lease_that_vanishes_is_caught() {
        let mut history = fair();
        history.records[5] = record(
            "k",
            1130,
            1140,
            inspected(InspectAnswer::Live(lease(1, 0, 1000))),
        );
        assert!(violations(&history)[0].contains("an acknowledged lease is gone"));

        history.records[5] = record("k", 1130, 1135, inspected(InspectAnswer::None));
        assert!(violations(&history)[0].contains("cannot have expired yet"));

        // Once its TTL may have run out, no lease is a fair answer.
        history.records[5] = record("k", 2200, 2210, inspected(InspectAnswer::None));
        history.records.truncate(6);
        history.write_logs.clear();
        history
            .records
            .retain(|r| !matches!(r.op, Op::Write { .. }));
        assert_eq!(violations(&history), Vec::<String>::new());
    }

    #[test]
    fn a_grant_nobody_received_that_keeps_its_resource_is_caught() {
        // The history agrees with the answers: nothing to say.
        assert_eq!(
            violations(&with_store_history(vec![])),
            Vec::<String>::new()
        );

        // Fence 4, received by nobody, kept `k` for 10 s.
        let stranded = with_store_history(vec![past(4, 2000, Some(12_000))]);
        let found = violations(&stranded);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].contains("fence 4 was granted at 2000.0 ms and kept the resource 10000.0 ms"),
            "{found:#?}"
        );

        // Still live when the histories were read: it has lasted until then.
        let live = with_store_history(vec![past(4, 2000, None)]);
        assert!(violations(&live)[0].contains("kept the resource 28000.0 ms"));

        // Undone within the limit, or followed by the next lease within it: no violation.
        let undone = with_store_history(vec![past(4, 2000, Some(4000))]);
        assert_eq!(violations(&undone), Vec::<String>::new());
        let handed_on =
            with_store_history(vec![past(5, 4500, Some(4600)), past(4, 2000, Some(12_000))]);
        assert_eq!(violations(&handed_on), Vec::<String>::new());
    }

    #[test]
    fn only_a_lost_answer_excuses_a_stranded_grant_and_each_only_once() {
        let mut history = with_store_history(vec![
            past(5, 20_000, Some(30_000)),
            past(4, 2000, Some(12_000)),
        ]);
        // A request in flight at 2 s whose answer a fault took: it excuses fence 4 only.
        let lost = AcquireAnswer::Unknown {
            why: "connection reset".into(),
        };
        history
            .records
            .push(record("k", 1900, 2100, waited("d", lost)));
        let found = violations(&history);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(found[0].contains("fence 5"), "{found:#?}");

        // A waiter that left does not excuse one, unless a fault struck while it waited.
        let mut history = with_store_history(vec![past(4, 2000, Some(12_000))]);
        history.records.push(record(
            "k",
            1900,
            2100,
            waited("d", AcquireAnswer::Departed),
        ));
        assert_eq!(violations(&history).len(), 1);
        history.faults.push(Fault {
            from_us: 2_000_000,
            until_us: 2_500_000,
            instance: Some(1),
        });
        assert_eq!(violations(&history), Vec::<String>::new());
    }

    #[test]
    fn a_provisional_expiry_is_fair_only_while_the_acquisition_is_in_flight() {
        // B's acquisition (fence 2) is in flight from 1100 to 1110 ms; its lease ends at 2100.
        let shown_at = |sent_ms, ttl_ms| {
            let mut history = fair();
            history.records[5] = record(
                "k",
                sent_ms,
                sent_ms + 2,
                inspected(InspectAnswer::Live(lease(2, 1100, ttl_ms))),
            );
            violations(&history)
        };
        assert_eq!(shown_at(1105, 500), Vec::<String>::new());
        assert_found(&shown_at(1105, 1500), "fence 2 was acknowledged as");
        assert_found(&shown_at(1130, 500), "fence 2 was acknowledged as");
    }

    #[test]
    fn a_renewed_expiry_is_fair_once_its_owner_has_sent_the_renewal() {
        // B's lease (fence 2, from 1100 ms, TTL 1 s) inspected at 1130-1140 ms with an
        // expiry 5 ms later than acknowledged.
        let shown_with = |renewal_sent_ms: Option<u64>, inspect_sent_ms: u64| {
            let mut history = fair();
            history.records[5] = record(
                "k",
                inspect_sent_ms,
                1140,
                inspected(InspectAnswer::Live(lease(2, 1100, 1005))),
            );
            if let Some(sent) = renewal_sent_ms {
                let renewed = RenewAnswer::Renewed(lease(2, 1100, 1005));
                history
                    .records
                    .push(record("k", sent, sent + 2, renewal("b", 2, renewed)));
            }
            violations(&history)
        };
        assert_found(&shown_with(None, 1130), "fence 2 was acknowledged as");
        assert_found(&shown_with(Some(1141), 1130), "fence 2 was acknowledged as");
        assert_eq!(shown_with(Some(1104), 1130), Vec::<String>::new());
        // Also by an inspection sent while the acquisition was in flight.
        assert_eq!(shown_with(Some(1112), 1105), Vec::<String>::new());
        assert_found(&shown_with(None, 1105), "fence 2 was acknowledged as");
    }

    #[test]
    fn an_acknowledged_fence_missing_from_the_store_history_is_caught() {
        let mut history = with_store_history(vec![]);
        history.lease_histories.get_mut("k").unwrap().remove(1); // fence 2
        let found = violations(&history);
        assert_found(
            &found,
            "fence 2 was acknowledged but is not in the store's history",
        );
    }
}
