//! The store's atomic steps, as pure functions over the state of many resources: the one
//! transition relation that both the bounded model (`queue.rs`) and the replay of real
//! histories run, so that what the checker proves and what a real run is held to are the
//! same rules.
//!
//! Deterministic and free of dependencies. Generic over the resource (`R`) and the owner
//! (`O`): the model uses small integers, a replay the names a real run used. Times are the
//! store's clock in any unit (ticks in the model, milliseconds in a replay); every step takes
//! the moment the store stamped it (`now`), and leases are half-open, `[acquired_at,
//! expires_at)`.
//!
//! # The steps (each one atomic step of a store)
//! - [`Store::acquire`]: a grant written into the caller's ticket, taken (PostgreSQL's
//!   `claimed`); else refused while another owner's lease is live or inside its lock delay;
//!   else refused while a live waiter is ahead (unless the live holder re-acquires); else a
//!   new lease with a new fence, and the caller's ticket leaves the queue.
//! - [`Store::enqueue`]: a ticket at the end of the resource's queue (tickets increase
//!   store-wide, in arrival order).
//! - [`Store::renew`]: the live lease of this owner (and fence, when given) gets a new expiry;
//!   an expired lease is never renewed.
//! - [`Store::release`]: the live lease of this owner (and fence) ends; with
//!   [`Rules::handover_on_release`] (PostgreSQL), the first live waiter is granted a new lease
//!   in the same step, written into its ticket for it to take. A release starts no lock delay.
//! - [`Store::leave`]: a waiter leaves its queue; if a grant written into its ticket still
//!   stands, it takes it (PostgreSQL's `claimed`: the server then releases it for nobody).
//! - [`Store::purge`]: an expired lease whose lock delay has passed ends (renew then answers
//!   not found instead of expired).
//!
//! Expiry is not a step: a lease is live while `now < expires_at`, and another owner may take
//! it once `now >= expires_at + lock_delay`. The hand-over on expiry is the head waiter's own
//! next attempt ([`Store::acquire`] with its ticket), which wins because every later request
//! is refused while it is live and ahead: that is what both stores do.
//!
//! # Numbers chosen by the caller
//! A real store's fences have gaps (a rolled back `nextval`), and its tickets too, so a step
//! that issues one takes a [`Number`]: [`Number::Next`] (the model: one more than the last)
//! or [`Number::Given`] (a replay: the number the real store answered), which must be above
//! the last one issued, or the step is impossible ([`StepError`]) and changes nothing. Every
//! step returns its answer as a value that compares with `==`: a replay applies the step with
//! what the real request carried and asks whether the answer is the one the real store gave.
//!
//! # The state
//! [`Store`] `{ last_fence, last_ticket, slots: BTreeMap<R, Slot<O>> }`; a [`Slot`] is a
//! resource's current [`Lease`] (`owner, fence, acquired_at, expires_at, lock_delay`: live or
//! expired, gone once released or purged) and its queue of [`Waiter`]s in ticket order
//! (`ticket, owner, ttl, lock_delay, deadline, left, granted`). A lock delay is not a field of
//! its own: as in both stores, it is the expired lease's `expires_at + lock_delay`, so a
//! release (which ends the lease) starts none. A resource with no lease and no queue has no
//! slot, so equal states compare equal.
//!
//! # Answers over HTTP
//! [`AcquireOutcome::Granted`] is `acquired: true` (its `how` is not shown over HTTP);
//! [`AcquireOutcome::Held`] and [`AcquireOutcome::Queued`] are both `acquired: false`
//! (`delayed_until` when a lock delay refused it). A waited acquire that ends with a lease
//! answers the [`How::Claimed`] grant of a hand-over (PostgreSQL), or its own attempt's;
//! one that ends without is a [`Store::leave`] after its deadline.
//!
//! # Broken rules
//! [`Rules::broken`] switches one rule to a wrong one ([`Broken`]), so that the checker can
//! show it catches each: the same code, broken in one place.

use std::collections::BTreeMap;

/// A moment on the store's clock, or a span of it.
pub type Time = u64;
/// A fence: store-wide, strictly increasing in the order issued (with gaps).
pub type Fence = u64;
/// A waiter's place: store-wide, increasing in arrival order.
pub type Ticket = u64;

/// A wrong rule, for the checker to catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Broken {
    /// A release hands the lease to the last live waiter, and a waiter's attempt takes the
    /// resource even with live waiters ahead of it.
    HandoverSkipsQueue,
    /// A release hands the lease to the first waiter in the queue, even one that left or
    /// whose deadline passed.
    HandoverToDeparted,
    /// A renewal by the lease's owner extends it even after it expired.
    RenewRevivesExpired,
    /// Another owner may take an expired lease before its lock delay has passed.
    LockDelayIgnored,
}

impl Broken {
    pub const ALL: [Broken; 4] = [
        Broken::HandoverSkipsQueue,
        Broken::HandoverToDeparted,
        Broken::RenewRevivesExpired,
        Broken::LockDelayIgnored,
    ];

    /// The name the command line uses (`fencelock-model --variant NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Broken::HandoverSkipsQueue => "handover-skips-queue",
            Broken::HandoverToDeparted => "handover-to-departed",
            Broken::RenewRevivesExpired => "renew-revives-expired",
            Broken::LockDelayIgnored => "lock-delay-ignored",
        }
    }

    pub fn from_name(name: &str) -> Option<Broken> {
        Broken::ALL.into_iter().find(|b| b.name() == name)
    }
}

/// How a store applies the steps: the two stores differ in when a released lease reaches the
/// first waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rules {
    /// PostgreSQL: a release grants the lease to the first live waiter in its own step.
    /// SQLite (false): a release frees the resource, and the first waiter takes it with its
    /// next attempt (everyone else is refused while it is live and ahead).
    pub handover_on_release: bool,
    /// PostgreSQL: a lease handed over is held provisionally, at most this long and without
    /// its lock delay, until its waiter takes it (then it runs for the waiter's TTL from the
    /// release, with its lock delay), so that a grant to a waiter that is gone frees the
    /// resource soon. `None`: the full lease at once.
    pub provisional_hold: Option<Time>,
    pub broken: Option<Broken>,
}

impl Rules {
    /// PostgreSQL's rules, the provisional hold abstracted away (the model's choice).
    pub const POSTGRES: Rules = Rules {
        handover_on_release: true,
        provisional_hold: None,
        broken: None,
    };
    /// SQLite's rules.
    pub const SQLITE: Rules = Rules {
        handover_on_release: false,
        provisional_hold: None,
        broken: None,
    };

    pub fn with_broken(self, broken: Broken) -> Rules {
        Rules {
            broken: Some(broken),
            ..self
        }
    }

    fn is(&self, broken: Broken) -> bool {
        self.broken == Some(broken)
    }
}

/// A number a step issues: the next one, or one the caller names (a replay's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Number {
    Next,
    Given(u64),
}

/// Why a step cannot have happened from this state. The state is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepError {
    /// A fence at or below the last one issued.
    FenceNotAbove { given: Fence, last: Fence },
    /// A ticket at or below the last one issued.
    TicketNotAbove { given: Ticket, last: Ticket },
}

/// The current lease of a resource: live until `expires_at`, then expired until another
/// acquisition or the purge ends it (a release ends it at once).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lease<O> {
    pub owner: O,
    pub fence: Fence,
    pub acquired_at: Time,
    pub expires_at: Time,
    /// After an expiry (not a release), other owners stay out this long.
    pub lock_delay: Time,
}

impl<O> Lease<O> {
    pub fn is_live(&self, now: Time) -> bool {
        now < self.expires_at
    }

    /// When another owner may take the resource (the lock delay's end).
    pub fn free_at(&self) -> Time {
        self.expires_at.saturating_add(self.lock_delay)
    }
}

/// A grant a release wrote into a waiter's ticket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Grant {
    pub fence: Fence,
    /// The lease's expiry once the waiter takes it (the release's stamp + the waiter's TTL).
    pub until: Time,
    pub lock_delay: Time,
}

/// A waiting acquisition's ticket, with the acquisition it leaves for a release to grant.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Waiter<O> {
    pub ticket: Ticket,
    pub owner: O,
    pub ttl: Time,
    pub lock_delay: Time,
    /// The end of the wait: from then on the ticket is not live.
    pub deadline: Time,
    /// The waiter is gone: it left the queue, or its heartbeat lapsed (its instance died).
    /// Kept, never live again, so that a broken rule can be shown granting to it.
    pub left: bool,
    /// A grant a release wrote into the ticket: no longer in the queue.
    pub granted: Option<Grant>,
}

impl<O> Waiter<O> {
    /// Still waiting: not gone, before its deadline, not granted.
    pub fn is_live(&self, now: Time) -> bool {
        !self.left && now < self.deadline && self.granted.is_none()
    }
}

/// One resource: its current lease and its queue, in ticket order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot<O> {
    pub lease: Option<Lease<O>>,
    pub queue: Vec<Waiter<O>>,
}

impl<O> Default for Slot<O> {
    fn default() -> Self {
        Slot {
            lease: None,
            queue: Vec::new(),
        }
    }
}

impl<O> Slot<O> {
    /// Whether a live waiter is ahead of `ticket` (of anyone, for a request without one).
    pub fn waiters_ahead(&self, ticket: Option<Ticket>, now: Time) -> bool {
        self.queue
            .iter()
            .any(|w| w.is_live(now) && ticket.is_none_or(|t| w.ticket < t))
    }

    pub fn waiter(&self, ticket: Ticket) -> Option<&Waiter<O>> {
        self.queue.iter().find(|w| w.ticket == ticket)
    }

    fn waiter_mut(&mut self, ticket: Ticket) -> Option<&mut Waiter<O>> {
        self.queue.iter_mut().find(|w| w.ticket == ticket)
    }

    fn remove(&mut self, ticket: Ticket) {
        self.queue.retain(|w| w.ticket != ticket);
    }
}

/// The whole store: one fence counter and one ticket counter for every resource.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Store<R: Ord, O> {
    /// The last fence issued (0: none yet).
    pub last_fence: Fence,
    /// The last ticket issued (0: none yet).
    pub last_ticket: Ticket,
    pub slots: BTreeMap<R, Slot<O>>,
}

impl<R: Ord, O> Default for Store<R, O> {
    fn default() -> Self {
        Store {
            last_fence: 0,
            last_ticket: 0,
            slots: BTreeMap::new(),
        }
    }
}

/// An acquisition as the store receives it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Acquire<O> {
    pub owner: O,
    pub ttl: Time,
    pub lock_delay: Time,
    /// The caller's ticket, when it waits in the queue.
    pub ticket: Option<Ticket>,
}

/// How a lease was granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum How {
    /// No current lease.
    Fresh,
    /// The caller's own live lease, replaced by a new one.
    Reacquired,
    /// An expired lease (another owner's after its lock delay, or the caller's own).
    TakenOver,
    /// The grant a release wrote into the caller's ticket (no new fence).
    Claimed,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AcquireOutcome {
    Granted {
        how: How,
        fence: Fence,
        acquired_at: Time,
        expires_at: Time,
    },
    /// Another owner's live lease, or its lock delay after expiry (`delayed_until`: the
    /// delay's end, when the lease has expired).
    Held { delayed_until: Option<Time> },
    /// Free of other owners' leases, but a live waiter is ahead. (Over HTTP: `acquired:
    /// false`, as [`AcquireOutcome::Held`].)
    Queued,
}

impl AcquireOutcome {
    pub fn is_granted(&self) -> bool {
        matches!(self, AcquireOutcome::Granted { .. })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RenewOutcome {
    Renewed {
        fence: Fence,
        acquired_at: Time,
        expires_at: Time,
    },
    NotFound,
    Expired,
    OwnerMismatch,
    StaleFence {
        current: Fence,
    },
}

/// A release's hand-over: the new lease of the first live waiter.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Handover<O> {
    pub ticket: Ticket,
    pub owner: O,
    pub fence: Fence,
    /// The lease's expiry once taken (see [`Grant::until`]).
    pub expires_at: Time,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReleaseOutcome<O> {
    Released {
        fence: Fence,
        handed_over: Option<Handover<O>>,
    },
    /// No live lease (none, or expired).
    NotFound,
    NotOwner,
    StaleFence {
        current: Fence,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LeaveOutcome {
    /// Out of the queue, with nothing.
    Left,
    /// A grant written into the ticket still stood: the waiter took it on the way out.
    Claimed {
        fence: Fence,
        acquired_at: Time,
        expires_at: Time,
    },
    /// No such ticket in the resource's queue.
    NotQueued,
}

/// What inspect shows.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Inspection<'a, O> {
    Live(&'a Lease<O>),
    /// Expired, inside its lock delay.
    Delayed {
        until: Time,
    },
    Absent,
}

impl<R: Ord + Clone, O: Clone + Eq> Store<R, O> {
    pub fn slot(&self, resource: &R) -> Option<&Slot<O>> {
        self.slots.get(resource)
    }

    fn slot_mut(&mut self, resource: &R) -> &mut Slot<O> {
        self.slots.entry(resource.clone()).or_default()
    }

    /// The fence a grant would take, if `number` is possible.
    fn next_fence(&self, number: Number) -> Result<Fence, StepError> {
        match number {
            Number::Next => Ok(self.last_fence + 1),
            Number::Given(given) if given > self.last_fence => Ok(given),
            Number::Given(given) => Err(StepError::FenceNotAbove {
                given,
                last: self.last_fence,
            }),
        }
    }

    pub fn inspect(&self, resource: &R, now: Time) -> Inspection<'_, O> {
        match self.slot(resource).and_then(|s| s.lease.as_ref()) {
            Some(lease) if lease.is_live(now) => Inspection::Live(lease),
            Some(lease) if now < lease.free_at() => Inspection::Delayed {
                until: lease.free_at(),
            },
            _ => Inspection::Absent,
        }
    }

    /// An acquisition (a waiter's attempt, with its ticket). `fence` is used only if the
    /// answer is a new lease.
    pub fn acquire(
        &mut self,
        rules: &Rules,
        resource: &R,
        req: &Acquire<O>,
        now: Time,
        fence: Number,
    ) -> Result<AcquireOutcome, StepError> {
        let next = self.next_fence(fence);
        let mut slot = self.take(resource);
        let outcome = acquire(rules, &mut slot, req, now, next);
        if let Ok(AcquireOutcome::Granted {
            how: How::Fresh | How::Reacquired | How::TakenOver,
            fence,
            ..
        }) = outcome
        {
            self.last_fence = fence;
        }
        self.put(resource, slot);
        outcome
    }

    /// Takes a resource's slot out of the map (an empty one if none), for [`Store::put`].
    fn take(&mut self, resource: &R) -> Slot<O> {
        self.slots.remove(resource).unwrap_or_default()
    }

    /// Puts a slot back, unless it is empty: a resource with no lease and no queue has no
    /// slot, so that equal stores are equal maps.
    fn put(&mut self, resource: &R, slot: Slot<O>) {
        if slot.lease.is_some() || !slot.queue.is_empty() {
            self.slots.insert(resource.clone(), slot);
        }
    }
    /// A ticket at the end of the resource's queue, for `req` (its `ticket` is ignored),
    /// waiting until `deadline`.
    pub fn enqueue(
        &mut self,
        resource: &R,
        req: &Acquire<O>,
        deadline: Time,
        ticket: Number,
    ) -> Result<Ticket, StepError> {
        let ticket = match ticket {
            Number::Next => self.last_ticket + 1,
            Number::Given(given) if given > self.last_ticket => given,
            Number::Given(given) => {
                return Err(StepError::TicketNotAbove {
                    given,
                    last: self.last_ticket,
                });
            }
        };
        self.last_ticket = ticket;
        self.slot_mut(resource).queue.push(Waiter {
            ticket,
            owner: req.owner.clone(),
            ttl: req.ttl,
            lock_delay: req.lock_delay,
            deadline,
            left: false,
            granted: None,
        });
        Ok(ticket)
    }

    /// A renewal: the checks of the contract's order (a lease, live, this owner, this
    /// fence), then a new expiry `ttl` from now; same fence, same start.
    pub fn renew(
        &mut self,
        rules: &Rules,
        resource: &R,
        owner: &O,
        fence: Option<Fence>,
        ttl: Time,
        now: Time,
    ) -> RenewOutcome {
        let Some(lease) = self.slots.get_mut(resource).and_then(|s| s.lease.as_mut()) else {
            return RenewOutcome::NotFound;
        };
        let revive = rules.is(Broken::RenewRevivesExpired) && lease.owner == *owner;
        if !lease.is_live(now) && !revive {
            return RenewOutcome::Expired;
        }
        if lease.owner != *owner {
            return RenewOutcome::OwnerMismatch;
        }
        if fence.is_some_and(|f| f != lease.fence) {
            return RenewOutcome::StaleFence {
                current: lease.fence,
            };
        }
        lease.expires_at = now.saturating_add(ttl);
        RenewOutcome::Renewed {
            fence: lease.fence,
            acquired_at: lease.acquired_at,
            expires_at: lease.expires_at,
        }
    }

    /// A release: the same checks as renew (an expired lease counts as none), then the lease
    /// ends, and with [`Rules::handover_on_release`] the first live waiter gets a new lease
    /// with fence `handover_fence`, written into its ticket.
    pub fn release(
        &mut self,
        rules: &Rules,
        resource: &R,
        owner: &O,
        fence: Option<Fence>,
        now: Time,
        handover_fence: Number,
    ) -> Result<ReleaseOutcome<O>, StepError> {
        let next = self.next_fence(handover_fence);
        let mut slot = self.take(resource);
        let outcome = release(rules, &mut slot, owner, fence, now, next);
        if let Ok(ReleaseOutcome::Released {
            handed_over: Some(handover),
            ..
        }) = &outcome
        {
            self.last_fence = handover.fence;
        }
        self.put(resource, slot);
        outcome
    }

    /// A waiter leaves the queue (its client went away, or its wait ended).
    pub fn leave(&mut self, resource: &R, ticket: Ticket, now: Time) -> LeaveOutcome {
        let Some(slot) = self.slots.get_mut(resource) else {
            return LeaveOutcome::NotQueued;
        };
        match claim(slot, ticket, now) {
            Some(AcquireOutcome::Granted {
                fence,
                acquired_at,
                expires_at,
                ..
            }) => LeaveOutcome::Claimed {
                fence,
                acquired_at,
                expires_at,
            },
            _ => match slot.waiter_mut(ticket) {
                Some(waiter) => {
                    waiter.left = true;
                    LeaveOutcome::Left
                }
                None => LeaveOutcome::NotQueued,
            },
        }
    }

    /// Ends an expired lease whose lock delay has passed; whether there was one.
    pub fn purge(&mut self, resource: &R, now: Time) -> bool {
        let mut slot = self.take(resource);
        let ended = slot
            .lease
            .as_ref()
            .is_some_and(|l| !l.is_live(now) && now >= l.free_at());
        if ended {
            slot.lease = None;
        }
        self.put(resource, slot);
        ended
    }
}

/// [`Store::acquire`] on the resource's slot, the fence it would issue given (`next`).
fn acquire<O: Clone + Eq>(
    rules: &Rules,
    slot: &mut Slot<O>,
    req: &Acquire<O>,
    now: Time,
    next: Result<Fence, StepError>,
) -> Result<AcquireOutcome, StepError> {
    // A grant a release wrote into the ticket: taken if the lease is still that one and
    // live; otherwise undone, and the waiter competes like anyone, at its place.
    if let Some(ticket) = req.ticket
        && let Some(claimed) = claim(slot, ticket, now)
    {
        return Ok(claimed);
    }
    let lease = slot.lease.as_ref();
    let own = lease.is_some_and(|l| l.owner == req.owner);
    if let Some(lease) = lease
        && !own
    {
        let free_at = if rules.is(Broken::LockDelayIgnored) {
            lease.expires_at
        } else {
            lease.free_at()
        };
        if now < free_at {
            let delayed_until = (!lease.is_live(now)).then_some(free_at);
            return Ok(AcquireOutcome::Held { delayed_until });
        }
    }
    // The queue comes first, unless the holder re-acquires a resource nobody else may take
    // yet: its lease live, or inside its lock delay (not a grant to anyone else).
    let reacquire = own && lease.is_some_and(|l| l.is_live(now));
    let ahead_of_queue = own && lease.is_some_and(|l| now < l.free_at());
    let skip_queue = rules.is(Broken::HandoverSkipsQueue) && req.ticket.is_some();
    if !ahead_of_queue && !skip_queue && slot.waiters_ahead(req.ticket, now) {
        return Ok(AcquireOutcome::Queued);
    }
    let fence = next?;
    let how = match (lease, reacquire) {
        (None, _) => How::Fresh,
        (Some(_), true) => How::Reacquired,
        (Some(_), false) => How::TakenOver,
    };
    let expires_at = now.saturating_add(req.ttl);
    slot.lease = Some(Lease {
        owner: req.owner.clone(),
        fence,
        acquired_at: now,
        expires_at,
        lock_delay: req.lock_delay,
    });
    if let Some(ticket) = req.ticket {
        slot.remove(ticket);
    }
    Ok(AcquireOutcome::Granted {
        how,
        fence,
        acquired_at: now,
        expires_at,
    })
}

/// [`Store::release`] on the resource's slot, the fence a hand-over would take given.
fn release<O: Clone + Eq>(
    rules: &Rules,
    slot: &mut Slot<O>,
    owner: &O,
    fence: Option<Fence>,
    now: Time,
    next: Result<Fence, StepError>,
) -> Result<ReleaseOutcome<O>, StepError> {
    let Some(lease) = slot.lease.as_ref().filter(|l| l.is_live(now)) else {
        return Ok(ReleaseOutcome::NotFound);
    };
    if lease.owner != *owner {
        return Ok(ReleaseOutcome::NotOwner);
    }
    if fence.is_some_and(|f| f != lease.fence) {
        return Ok(ReleaseOutcome::StaleFence {
            current: lease.fence,
        });
    }
    let released = lease.fence;
    let head = if rules.handover_on_release {
        handover_head(rules, slot, now)
    } else {
        None
    };
    let Some(index) = head else {
        slot.lease = None;
        return Ok(ReleaseOutcome::Released {
            fence: released,
            handed_over: None,
        });
    };
    let fence = next?;
    let waiter = &mut slot.queue[index];
    let until = now.saturating_add(waiter.ttl);
    let (held_until, held_delay) = match rules.provisional_hold {
        Some(hold) => (now.saturating_add(hold.min(waiter.ttl)), 0),
        None => (until, waiter.lock_delay),
    };
    waiter.granted = Some(Grant {
        fence,
        until,
        lock_delay: waiter.lock_delay,
    });
    let handover = Handover {
        ticket: waiter.ticket,
        owner: waiter.owner.clone(),
        fence,
        expires_at: until,
    };
    slot.lease = Some(Lease {
        owner: waiter.owner.clone(),
        fence,
        acquired_at: now,
        expires_at: held_until,
        lock_delay: held_delay,
    });
    Ok(ReleaseOutcome::Released {
        fence: released,
        handed_over: Some(handover),
    })
}

/// Takes the grant written into `ticket`, if it still stands (the lease is that grant's, and
/// live): the lease runs to the grant's expiry with its lock delay, and the ticket leaves the
/// queue. A grant that no longer stands is undone (the ticket is back in the queue at its
/// place). `None` when there is nothing to take.
fn claim<O>(slot: &mut Slot<O>, ticket: Ticket, now: Time) -> Option<AcquireOutcome> {
    let grant = slot.waiter(ticket)?.granted?;
    match slot.lease.as_mut() {
        Some(lease) if lease.fence == grant.fence && lease.is_live(now) => {
            lease.expires_at = grant.until;
            lease.lock_delay = grant.lock_delay;
            let claimed = AcquireOutcome::Granted {
                how: How::Claimed,
                fence: lease.fence,
                acquired_at: lease.acquired_at,
                expires_at: lease.expires_at,
            };
            slot.remove(ticket);
            Some(claimed)
        }
        _ => {
            if let Some(waiter) = slot.waiter_mut(ticket) {
                waiter.granted = None;
            }
            None
        }
    }
}

/// The index of the waiter a release hands the lease to: the first live one (broken: the
/// last live one, or the first not yet granted, gone or not).
fn handover_head<O>(rules: &Rules, slot: &Slot<O>, now: Time) -> Option<usize> {
    let mut queue = slot.queue.iter().enumerate();
    match rules.broken {
        Some(Broken::HandoverSkipsQueue) => queue.filter(|(_, w)| w.is_live(now)).last(),
        Some(Broken::HandoverToDeparted) => queue.find(|(_, w)| w.granted.is_none()),
        _ => queue.find(|(_, w)| w.is_live(now)),
    }
    .map(|(index, _)| index)
}

#[cfg(test)]
mod tests {
    use super::*;

    type S = Store<&'static str, &'static str>;

    const PG: Rules = Rules::POSTGRES;
    const LITE: Rules = Rules::SQLITE;

    fn req(owner: &'static str, ttl: Time) -> Acquire<&'static str> {
        Acquire {
            owner,
            ttl,
            lock_delay: 0,
            ticket: None,
        }
    }

    fn with_ticket(owner: &'static str, ttl: Time, ticket: Ticket) -> Acquire<&'static str> {
        Acquire {
            ticket: Some(ticket),
            ..req(owner, ttl)
        }
    }

    fn with_delay(owner: &'static str, ttl: Time, lock_delay: Time) -> Acquire<&'static str> {
        Acquire {
            lock_delay,
            ..req(owner, ttl)
        }
    }

    /// Whether `request` for "r" at `now` is granted.
    fn grants(s: &mut S, rules: &Rules, request: &Acquire<&'static str>, now: Time) -> bool {
        s.acquire(rules, &"r", request, now, Number::Next)
            .unwrap()
            .is_granted()
    }

    fn granted(fence: Fence, how: How, at: Time, until: Time) -> AcquireOutcome {
        AcquireOutcome::Granted {
            how,
            fence,
            acquired_at: at,
            expires_at: until,
        }
    }

    /// `a` holds "r" with fence 1, live [0, 10).
    fn held_by_a() -> S {
        let mut s = S::default();
        let out = s.acquire(&PG, &"r", &req("a", 10), 0, Number::Next);
        assert_eq!(out, Ok(granted(1, How::Fresh, 0, 10)));
        s
    }

    #[test]
    fn acquire_grants_a_free_resource_and_refuses_another_owner_until_expiry() {
        let mut s = held_by_a();
        let b = req("b", 10);
        assert_eq!(
            s.acquire(&PG, &"r", &b, 9, Number::Next),
            Ok(AcquireOutcome::Held {
                delayed_until: None
            })
        );
        assert_eq!(
            s.acquire(&PG, &"r", &b, 10, Number::Next),
            Ok(granted(2, How::TakenOver, 10, 20))
        );
        // Another resource: its own lease, the store-wide counter.
        assert_eq!(
            s.acquire(&PG, &"q", &b, 10, Number::Next),
            Ok(granted(3, How::Fresh, 10, 20))
        );
    }

    #[test]
    fn the_owner_reacquires_with_a_new_fence_while_live_and_after_expiry() {
        let mut s = held_by_a();
        assert_eq!(
            s.acquire(&PG, &"r", &req("a", 10), 5, Number::Next),
            Ok(granted(2, How::Reacquired, 5, 15))
        );
        assert_eq!(
            s.acquire(&PG, &"r", &req("a", 10), 15, Number::Next),
            Ok(granted(3, How::TakenOver, 15, 25))
        );
    }

    #[test]
    fn a_given_fence_must_be_above_the_last_and_may_leave_a_gap() {
        let mut s = held_by_a();
        let before = s.clone();
        assert_eq!(
            s.acquire(&PG, &"q", &req("b", 10), 0, Number::Given(1)),
            Err(StepError::FenceNotAbove { given: 1, last: 1 })
        );
        assert_eq!(s, before, "an impossible step changes nothing");
        // A refusal issues no fence, so any number is fine there.
        assert!(
            s.acquire(&PG, &"r", &req("b", 10), 0, Number::Given(1))
                .is_ok()
        );
        assert_eq!(
            s.acquire(&PG, &"q", &req("b", 10), 0, Number::Given(7)),
            Ok(granted(7, How::Fresh, 0, 10))
        );
        assert_eq!(s.last_fence, 7);
    }

    #[test]
    fn renew_checks_expiry_owner_and_fence_in_that_order() {
        let mut s = held_by_a();
        assert_eq!(s.renew(&PG, &"q", &"a", None, 5, 1), RenewOutcome::NotFound);
        assert_eq!(
            s.renew(&PG, &"r", &"b", Some(9), 5, 1),
            RenewOutcome::OwnerMismatch
        );
        assert_eq!(
            s.renew(&PG, &"r", &"a", Some(9), 5, 1),
            RenewOutcome::StaleFence { current: 1 }
        );
        assert_eq!(
            s.renew(&PG, &"r", &"a", Some(1), 5, 8),
            RenewOutcome::Renewed {
                fence: 1,
                acquired_at: 0,
                expires_at: 13
            }
        );
        assert_eq!(
            s.renew(&PG, &"r", &"b", None, 5, 13),
            RenewOutcome::Expired,
            "expiry is checked before the owner"
        );
        assert_eq!(s.renew(&PG, &"r", &"a", None, 5, 13), RenewOutcome::Expired);
    }

    #[test]
    fn a_broken_renew_revives_an_expired_lease() {
        let mut s = held_by_a();
        let broken = PG.with_broken(Broken::RenewRevivesExpired);
        assert_eq!(
            s.renew(&broken, &"r", &"a", None, 5, 12),
            RenewOutcome::Renewed {
                fence: 1,
                acquired_at: 0,
                expires_at: 17
            }
        );
    }

    #[test]
    fn release_checks_like_renew_and_an_expired_lease_counts_as_none() {
        let mut s = held_by_a();
        let rel = |s: &mut S, owner, fence, now| {
            s.release(&PG, &"r", &owner, fence, now, Number::Next)
                .unwrap()
        };
        assert_eq!(rel(&mut s, "b", None, 1), ReleaseOutcome::NotOwner);
        assert_eq!(
            rel(&mut s, "a", Some(2), 1),
            ReleaseOutcome::StaleFence { current: 1 }
        );
        assert_eq!(rel(&mut s, "a", Some(1), 10), ReleaseOutcome::NotFound);
        assert_eq!(
            rel(&mut s, "a", Some(1), 9),
            ReleaseOutcome::Released {
                fence: 1,
                handed_over: None
            }
        );
        assert_eq!(rel(&mut s, "a", None, 9), ReleaseOutcome::NotFound);
        assert_eq!(s.inspect(&"r", 9), Inspection::Absent);
    }

    #[test]
    fn tickets_increase_and_a_given_one_must_be_above_the_last() {
        let mut s = S::default();
        assert_eq!(s.enqueue(&"r", &req("b", 5), 10, Number::Next), Ok(1));
        assert_eq!(s.enqueue(&"q", &req("c", 5), 10, Number::Given(4)), Ok(4));
        assert_eq!(
            s.enqueue(&"r", &req("d", 5), 10, Number::Given(4)),
            Err(StepError::TicketNotAbove { given: 4, last: 4 })
        );
    }

    /// `a` holds "r" [0, 10); `b` (ticket 1) then `c` (ticket 2) wait until 20, each for a
    /// lease of 5.
    fn two_waiters() -> S {
        let mut s = held_by_a();
        s.enqueue(&"r", &req("b", 5), 20, Number::Next).unwrap();
        s.enqueue(&"r", &req("c", 5), 20, Number::Next).unwrap();
        s
    }

    #[test]
    fn a_release_hands_over_to_the_first_waiter_who_takes_it_with_its_ticket() {
        let mut s = two_waiters();
        let out = s.release(&PG, &"r", &"a", Some(1), 3, Number::Next);
        assert_eq!(
            out,
            Ok(ReleaseOutcome::Released {
                fence: 1,
                handed_over: Some(Handover {
                    ticket: 1,
                    owner: "b",
                    fence: 2,
                    expires_at: 8
                })
            })
        );
        // Nobody else gets it, not even the next waiter.
        assert_eq!(
            s.acquire(&PG, &"r", &with_ticket("c", 5, 2), 4, Number::Next),
            Ok(AcquireOutcome::Held {
                delayed_until: None
            })
        );
        assert_eq!(
            s.acquire(&PG, &"r", &with_ticket("b", 5, 1), 4, Number::Next),
            Ok(granted(2, How::Claimed, 3, 8))
        );
        assert!(s.slot(&"r").unwrap().waiter(1).is_none());
    }

    #[test]
    fn a_provisional_hand_over_runs_out_unless_taken() {
        let mut s = two_waiters();
        let rules = Rules {
            provisional_hold: Some(2),
            ..PG
        };
        s.release(&rules, &"r", &"a", None, 3, Number::Next)
            .unwrap();
        assert_eq!(
            s.inspect(&"r", 4),
            Inspection::Live(&Lease {
                owner: "b",
                fence: 2,
                acquired_at: 3,
                expires_at: 5,
                lock_delay: 0
            })
        );
        // Not taken in time: `b` had its turn, so `c` is next; `b`'s grant is undone when it
        // comes back, and it finds the lease `c`'s.
        assert_eq!(
            s.acquire(&rules, &"r", &with_ticket("c", 5, 2), 5, Number::Next),
            Ok(granted(3, How::TakenOver, 5, 10))
        );
        assert_eq!(
            s.acquire(&rules, &"r", &with_ticket("b", 5, 1), 6, Number::Next),
            Ok(AcquireOutcome::Held {
                delayed_until: None
            })
        );
        assert_eq!(s.slot(&"r").unwrap().waiter(1).unwrap().granted, None);
    }

    #[test]
    fn a_hand_over_skips_waiters_that_left_or_whose_deadline_passed() {
        let mut s = held_by_a();
        for (owner, deadline) in [("b", 20), ("c", 5), ("d", 30)] {
            s.enqueue(&"r", &req(owner, 5), deadline, Number::Next)
                .unwrap();
        }
        assert_eq!(s.leave(&"r", 1, 2), LeaveOutcome::Left);
        assert_eq!(s.leave(&"r", 9, 2), LeaveOutcome::NotQueued);
        let out = s.release(&PG, &"r", &"a", None, 6, Number::Next).unwrap();
        let ReleaseOutcome::Released {
            handed_over: Some(handover),
            ..
        } = out
        else {
            panic!("{out:?}");
        };
        assert_eq!((handover.ticket, handover.owner), (3, "d"));
    }

    #[test]
    fn broken_hand_overs_skip_the_queue_or_reach_the_departed() {
        let mut s = two_waiters();
        let skips = PG.with_broken(Broken::HandoverSkipsQueue);
        let out = s.release(&skips, &"r", &"a", None, 3, Number::Next);
        assert!(
            matches!(out, Ok(ReleaseOutcome::Released { handed_over: Some(h), .. }) if h.owner == "c")
        );
        let mut s = two_waiters();
        s.leave(&"r", 1, 2);
        let departed = PG.with_broken(Broken::HandoverToDeparted);
        let out = s.release(&departed, &"r", &"a", None, 3, Number::Next);
        assert!(
            matches!(out, Ok(ReleaseOutcome::Released { handed_over: Some(h), .. }) if h.owner == "b")
        );
    }

    #[test]
    fn without_hand_over_the_first_waiter_takes_the_freed_resource_and_no_one_else() {
        let mut s = two_waiters();
        assert_eq!(
            s.release(&LITE, &"r", &"a", None, 3, Number::Next),
            Ok(ReleaseOutcome::Released {
                fence: 1,
                handed_over: None
            })
        );
        for late in [req("x", 5), with_ticket("c", 5, 2)] {
            assert_eq!(
                s.acquire(&LITE, &"r", &late, 4, Number::Next),
                Ok(AcquireOutcome::Queued)
            );
        }
        assert_eq!(
            s.acquire(&LITE, &"r", &with_ticket("b", 5, 1), 4, Number::Next),
            Ok(granted(2, How::Fresh, 4, 9))
        );
        // The same on expiry: `c` is next once `b`'s lease has run out.
        assert_eq!(
            s.acquire(&LITE, &"r", &req("x", 5), 9, Number::Next),
            Ok(AcquireOutcome::Queued)
        );
        assert_eq!(
            s.acquire(&LITE, &"r", &with_ticket("c", 5, 2), 9, Number::Next),
            Ok(granted(3, How::TakenOver, 9, 14))
        );
        // Queue empty: anyone.
        assert!(grants(&mut s, &LITE, &req("x", 5), 14));
    }

    #[test]
    fn the_live_holder_reacquires_past_the_queue_but_not_after_expiry() {
        let mut s = two_waiters();
        assert!(grants(&mut s, &PG, &req("a", 10), 5));
        assert_eq!(
            s.acquire(&PG, &"r", &req("a", 10), 15, Number::Next),
            Ok(AcquireOutcome::Queued)
        );
    }

    #[test]
    fn a_waiter_past_its_deadline_is_not_ahead_of_anyone() {
        let mut s = held_by_a();
        s.enqueue(&"r", &req("b", 5), 12, Number::Next).unwrap();
        assert_eq!(
            s.acquire(&PG, &"r", &req("x", 5), 11, Number::Next),
            Ok(AcquireOutcome::Queued)
        );
        assert!(grants(&mut s, &PG, &req("x", 5), 12));
    }

    #[test]
    fn a_broken_waiter_attempt_takes_the_resource_past_live_waiters_ahead() {
        let mut s = two_waiters();
        let skips = LITE.with_broken(Broken::HandoverSkipsQueue);
        assert!(grants(&mut s, &skips, &with_ticket("c", 5, 2), 10));
    }

    #[test]
    fn a_lock_delay_keeps_other_owners_out_after_expiry_but_not_its_owner() {
        let mut s = S::default();
        let a = with_delay("a", 10, 4);
        s.acquire(&PG, &"r", &a, 0, Number::Next).unwrap();
        assert_eq!(s.inspect(&"r", 12), Inspection::Delayed { until: 14 });
        assert_eq!(
            s.acquire(&PG, &"r", &req("b", 5), 12, Number::Next),
            Ok(AcquireOutcome::Held {
                delayed_until: Some(14)
            })
        );
        assert!(!s.purge(&"r", 13), "a lease inside its delay is kept");
        let ignored = PG.with_broken(Broken::LockDelayIgnored);
        assert!(grants(&mut s.clone(), &ignored, &req("b", 5), 12));
        assert!(grants(&mut s.clone(), &PG, &req("a", 5), 12));
        assert!(grants(&mut s, &PG, &req("b", 5), 14));
    }

    #[test]
    fn a_release_starts_no_lock_delay_and_a_hand_over_carries_the_waiters() {
        let mut s = S::default();
        let a = with_delay("a", 10, 4);
        s.acquire(&PG, &"r", &a, 0, Number::Next).unwrap();
        let b = with_delay("b", 5, 3);
        s.enqueue(&"r", &b, 50, Number::Next).unwrap();
        s.release(&PG, &"r", &"a", None, 2, Number::Next).unwrap();
        s.acquire(&PG, &"r", &with_ticket("b", 5, 1), 2, Number::Next)
            .unwrap();
        assert_eq!(s.inspect(&"r", 8), Inspection::Delayed { until: 10 });
    }

    #[test]
    fn leaving_with_a_grant_that_stands_takes_it() {
        let mut s = two_waiters();
        s.release(&PG, &"r", &"a", None, 3, Number::Next).unwrap();
        assert_eq!(
            s.leave(&"r", 1, 4),
            LeaveOutcome::Claimed {
                fence: 2,
                acquired_at: 3,
                expires_at: 8
            }
        );
    }

    #[test]
    fn purge_ends_an_expired_lease_and_renew_then_finds_none() {
        let mut s = held_by_a();
        assert!(!s.purge(&"r", 9));
        assert!(s.purge(&"r", 10));
        assert_eq!(
            s.renew(&PG, &"r", &"a", None, 5, 11),
            RenewOutcome::NotFound
        );
    }

    #[test]
    fn every_broken_rule_has_a_name() {
        for broken in Broken::ALL {
            assert_eq!(Broken::from_name(broken.name()), Some(broken));
        }
    }
}
