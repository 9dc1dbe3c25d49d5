//! The second model: clients that acquire (waiting or not), renew, release and leave, on two
//! resources of one store, every step one of [`crate::rules`]' atomic steps, in every order
//! and at every tick of the store's clock within the bounds.
//!
//! The actor model (`actors.rs`) checks what sits around one resource's lease: a network that
//! delays, reorders, duplicates and loses, a server that crashes, the guard. This one checks
//! what sits inside the store: the queue, hand-over, renewal and lock delay, as the store's
//! steps interleave. A client's request reaches the store at any later moment (the clock
//! ticks between any two steps), so a renewal or a release may come after its lease expired,
//! and a waiter's attempt after the lease it waited for was handed on.
//!
//! # Properties
//! Each step is judged on the state before it and the answer it gave, by the contract's
//! words, and a broken promise is remembered in the state (`violated`), so a counterexample
//! ends at the step that broke it:
//! - (b) no grant while another owner's lease is live;
//! - (c) every new lease's fence is above every fence issued before (store-wide);
//! - (e) grants among waiters follow their arrival (no grant past a waiter still waiting ahead,
//!   and none to a request that does not wait while anyone waits), except the live holder's
//!   re-acquisition;
//! - (f) no grant to a waiter that left or whose deadline passed;
//! - (g) no renewal of an expired lease;
//! - (h) after a lease ends by expiry, no other owner gets the resource before its lock delay
//!   has passed.

use std::fmt::Write as _;

use stateright::{Model, Property};

use crate::rules::{
    Acquire, AcquireOutcome, Broken, Fence, How, LeaveOutcome, Number, ReleaseOutcome,
    RenewOutcome, Rules, Slot, Store, Ticket, Time,
};

/// The bounds of one check of the queue model, and the rules it runs.
#[derive(Clone, Debug)]
pub struct QueueConfig {
    /// Clients (owners), 1-3: three let two wait behind a holder.
    pub clients: u8,
    /// Resources, 1-2.
    pub resources: u8,
    /// Every lease's TTL, in ticks.
    pub ttl: Time,
    /// How long a waiting acquisition waits, in ticks.
    pub wait: Time,
    /// The lock delay client 1 asks for with every acquisition (the others ask none).
    pub lock_delay: Time,
    /// The store's clock runs from 0 to this many ticks.
    pub max_time: Time,
    pub rules: Rules,
    /// Explore one state of each class that differs only by the names of the resources, or of
    /// the clients that ask for no lock delay (they act alike): the same verdicts in fewer
    /// states, but a counterexample may then rename them between its steps.
    pub symmetry: bool,
}

impl QueueConfig {
    /// The bounds `cargo test` checks, on PostgreSQL's rules (hand-over on release).
    pub fn fencelock() -> Self {
        QueueConfig {
            clients: 3,
            resources: 2,
            ttl: 2,
            wait: 3,
            lock_delay: 1,
            max_time: 4,
            rules: Rules::POSTGRES,
            symmetry: true,
        }
    }

    /// This configuration with one rule broken, without symmetry (so that its counterexample
    /// names the clients and resources as they acted).
    pub fn broken(mut self, broken: Broken) -> Self {
        self.rules = self.rules.with_broken(broken);
        self.symmetry = false;
        self
    }
}

/// What a client is doing, as it knows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Client {
    Idle,
    /// Refused by a waiting acquisition's first attempt; its ticket comes next.
    Refused {
        resource: u8,
    },
    Waiting {
        resource: u8,
        ticket: Ticket,
        deadline: Time,
    },
    /// Granted this fence; the client does not know whether the lease is still live.
    Holding {
        resource: u8,
        fence: Fence,
    },
}

impl Client {
    /// The resource and ticket of a waiting client.
    fn waiting(&self) -> Option<(u8, Ticket)> {
        match *self {
            Client::Waiting {
                resource, ticket, ..
            } => Some((resource, ticket)),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueState {
    pub now: Time,
    pub store: Store<u8, u8>,
    pub clients: Vec<Client>,
    /// The highest fence any answer carried: the properties' own count, not the store's.
    pub issued: Fence,
    /// The properties broken so far, one bit each ([`ALWAYS`]).
    pub violated: u8,
    /// The sanity examples reached so far, one bit each ([`SOMETIMES`]).
    pub seen: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum QueueAction {
    Tick,
    /// An acquisition by an idle client; with `wait`, refused, it queues next.
    Acquire {
        client: u8,
        resource: u8,
        wait: bool,
    },
    /// A refused waiting acquisition takes its ticket.
    Enqueue {
        client: u8,
    },
    /// A waiter tries again with its ticket (before its deadline).
    Attempt {
        client: u8,
    },
    /// A waiter leaves: its client went away, or its wait ended.
    Leave {
        client: u8,
    },
    Renew {
        client: u8,
    },
    Release {
        client: u8,
    },
    /// The holder acquires its resource again.
    Reacquire {
        client: u8,
    },
}

/// Declares each `NAME = "property";` as a `pub const`, and `$list`, every one of them in
/// the order of their bits in [`QueueState`] (so that a property cannot be left out of it).
macro_rules! property_names {
    ($(#[$doc:meta])* $list:ident: $($name:ident = $text:literal;)*) => {
        $(pub const $name: &str = $text;)*
        $(#[$doc])*
        pub const $list: &[&str] = &[$($name),*];
        const _: () = assert!($list.len() <= 8, "one bit each in a u8");
    };
}

property_names! {
    /// The `always` properties, in bit order.
    ALWAYS:
    ONE_HOLDER = "(b) no grant while another owner's lease is live";
    FENCES_INCREASE = "(c) every new lease's fence is above every fence before";
    FIFO = "(e) waiters are granted in arrival order";
    NOT_DEPARTED = "(f) no grant to a waiter that left or whose deadline passed";
    NO_REVIVAL = "(g) an expired lease is never renewed";
    LOCK_DELAY = "(h) no other owner before an expired lease's lock delay ends";
}

property_names! {
    /// The `sometimes` properties (sanity: the checked paths include what the rules are for),
    /// in bit order.
    SOMETIMES:
    HANDED_OVER = "a release hands the lease to a waiter";
    WAITER_AFTER_EXPIRY = "a waiter takes an expired lease with its attempt";
    DELAY_REFUSED = "a lock delay refuses another owner";
    RENEWED = "a lease is renewed";
}

fn bit(names: &[&str], name: &str) -> u8 {
    let index = names.iter().position(|n| *n == name).expect("a known name");
    1 << index
}

/// The model of one configuration.
#[derive(Clone, Debug)]
pub struct QueueModel {
    pub cfg: QueueConfig,
}

impl QueueModel {
    fn lock_delay(&self, client: u8) -> Time {
        if client == 0 { self.cfg.lock_delay } else { 0 }
    }

    fn request(&self, client: u8, ticket: Option<Ticket>) -> Acquire<u8> {
        Acquire {
            owner: client,
            ttl: self.cfg.ttl,
            lock_delay: self.lock_delay(client),
            ticket,
        }
    }
}

/// The judge of every step: the contract's promises, stated on the state before the step
/// (`before`, the resource's slot) and the answer it gave. Independent of [`crate::rules`]'
/// code, so that a broken rule is caught by what it answers.
mod judge {
    use super::*;

    /// A waiter still waiting at `now`: not gone, before its deadline, not yet granted.
    fn waiting(w: &crate::rules::Waiter<u8>, now: Time) -> bool {
        !w.left && now < w.deadline && w.granted.is_none()
    }

    /// A new lease of `owner` at `now` with `fence`, by a request carrying `ticket`;
    /// `released`: a release ended `before`'s lease in the same step (a hand-over).
    pub(super) fn grant(
        state: &mut QueueState,
        before: Option<&Slot<u8>>,
        released: bool,
        owner: u8,
        ticket: Option<Ticket>,
        fence: Fence,
    ) {
        let now = state.now;
        let mut broken = Vec::new();
        if fence <= state.issued {
            broken.push(FENCES_INCREASE);
        }
        state.issued = state.issued.max(fence);
        let lease = before.and_then(|s| s.lease.as_ref()).filter(|_| !released);
        // Nobody else may take the resource while its lease is live or inside its lock delay:
        // its owner re-acquiring it then passes no one in the queue.
        let own_unfree = lease.is_some_and(|l| l.owner == owner && now < l.free_at());
        if let Some(lease) = lease.filter(|l| l.owner != owner) {
            if now < lease.expires_at {
                broken.push(ONE_HOLDER);
            } else if now < lease.expires_at + lease.lock_delay {
                broken.push(LOCK_DELAY);
            }
        }
        let queue = before.map_or(&[][..], |s| &s.queue[..]);
        if !own_unfree
            && queue
                .iter()
                .any(|w| waiting(w, now) && ticket.is_none_or(|t| w.ticket < t))
        {
            broken.push(FIFO);
        }
        if let Some(ticket) = ticket
            && queue
                .iter()
                .any(|w| w.ticket == ticket && (w.left || now >= w.deadline))
        {
            broken.push(NOT_DEPARTED);
        }
        for name in broken {
            state.violated |= bit(ALWAYS, name);
        }
    }

    /// A renewal answered `renewed` for the lease in `before`.
    pub(super) fn renewed(state: &mut QueueState, before: Option<&Slot<u8>>) {
        if before
            .and_then(|s| s.lease.as_ref())
            .is_none_or(|l| state.now >= l.expires_at)
        {
            state.violated |= bit(ALWAYS, NO_REVIVAL);
        }
    }
}

impl Model for QueueModel {
    type State = QueueState;
    type Action = QueueAction;

    fn init_states(&self) -> Vec<QueueState> {
        vec![QueueState {
            now: 0,
            store: Store::default(),
            clients: vec![Client::Idle; usize::from(self.cfg.clients)],
            issued: 0,
            violated: 0,
            seen: 0,
        }]
    }

    fn actions(&self, state: &QueueState, actions: &mut Vec<QueueAction>) {
        if state.now < self.cfg.max_time {
            actions.push(QueueAction::Tick);
        }
        for (index, client) in state.clients.iter().enumerate() {
            let client_id = u8::try_from(index).expect("at most 3 clients");
            match client {
                Client::Idle => {
                    for resource in 0..self.cfg.resources {
                        for wait in [false, true] {
                            actions.push(QueueAction::Acquire {
                                client: client_id,
                                resource,
                                wait,
                            });
                        }
                    }
                }
                Client::Refused { .. } => actions.push(QueueAction::Enqueue { client: client_id }),
                Client::Waiting { deadline, .. } => {
                    if state.now < *deadline {
                        actions.push(QueueAction::Attempt { client: client_id });
                    }
                    actions.push(QueueAction::Leave { client: client_id });
                }
                Client::Holding { .. } => {
                    actions.push(QueueAction::Renew { client: client_id });
                    actions.push(QueueAction::Release { client: client_id });
                    actions.push(QueueAction::Reacquire { client: client_id });
                }
            }
        }
    }

    fn next_state(&self, last: &QueueState, action: QueueAction) -> Option<QueueState> {
        let mut state = last.clone();
        let rules = self.cfg.rules;
        let now = state.now;
        let client_of = |c: u8| usize::from(c);
        match action {
            QueueAction::Tick => state.now += 1,
            QueueAction::Acquire {
                client,
                resource,
                wait,
            } => {
                let outcome = self.acquire(&mut state, client, resource, None);
                state.clients[client_of(client)] = match outcome {
                    Some(fence) => Client::Holding { resource, fence },
                    None if wait => Client::Refused { resource },
                    None => Client::Idle,
                };
            }
            QueueAction::Enqueue { client } => {
                let Client::Refused { resource } = state.clients[client_of(client)] else {
                    return None;
                };
                let deadline = now + self.cfg.wait;
                let ticket = state
                    .store
                    .enqueue(
                        &resource,
                        &self.request(client, None),
                        deadline,
                        Number::Next,
                    )
                    .ok()?;
                state.clients[client_of(client)] = Client::Waiting {
                    resource,
                    ticket,
                    deadline,
                };
            }
            QueueAction::Attempt { client } => {
                let (resource, ticket) = state.clients[client_of(client)].waiting()?;
                if let Some(fence) = self.acquire(&mut state, client, resource, Some(ticket)) {
                    state.clients[client_of(client)] = Client::Holding { resource, fence };
                }
            }
            QueueAction::Leave { client } => {
                let (resource, ticket) = state.clients[client_of(client)].waiting()?;
                state.clients[client_of(client)] = match state.store.leave(&resource, ticket, now) {
                    LeaveOutcome::Claimed { fence, .. } => Client::Holding { resource, fence },
                    LeaveOutcome::Left | LeaveOutcome::NotQueued => Client::Idle,
                };
            }
            QueueAction::Renew { client } => {
                let Client::Holding { resource, fence } = state.clients[client_of(client)] else {
                    return None;
                };
                let before = state.store.slot(&resource).cloned();
                let outcome =
                    state
                        .store
                        .renew(&rules, &resource, &client, Some(fence), self.cfg.ttl, now);
                if let RenewOutcome::Renewed { .. } = outcome {
                    judge::renewed(&mut state, before.as_ref());
                    state.seen |= bit(SOMETIMES, RENEWED);
                } else {
                    state.clients[client_of(client)] = Client::Idle;
                }
            }
            QueueAction::Release { client } => {
                let Client::Holding { resource, fence } = state.clients[client_of(client)] else {
                    return None;
                };
                let before = state.store.slot(&resource).cloned();
                let outcome = state
                    .store
                    .release(&rules, &resource, &client, Some(fence), now, Number::Next)
                    .ok()?;
                if let ReleaseOutcome::Released {
                    handed_over: Some(handover),
                    ..
                } = outcome
                {
                    judge::grant(
                        &mut state,
                        before.as_ref(),
                        true,
                        handover.owner,
                        Some(handover.ticket),
                        handover.fence,
                    );
                    state.seen |= bit(SOMETIMES, HANDED_OVER);
                }
                state.clients[client_of(client)] = Client::Idle;
            }
            QueueAction::Reacquire { client } => {
                let Client::Holding { resource, .. } = state.clients[client_of(client)] else {
                    return None;
                };
                state.clients[client_of(client)] =
                    match self.acquire(&mut state, client, resource, None) {
                        Some(fence) => Client::Holding { resource, fence },
                        None => Client::Idle,
                    };
            }
        }
        Some(if self.cfg.symmetry {
            state.representative(self.cfg.resources)
        } else {
            state
        })
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ONE_HOLDER, |_, s: &QueueState| s.kept(ONE_HOLDER)),
            Property::always(FENCES_INCREASE, |_, s: &QueueState| s.kept(FENCES_INCREASE)),
            Property::always(FIFO, |_, s: &QueueState| s.kept(FIFO)),
            Property::always(NOT_DEPARTED, |_, s: &QueueState| s.kept(NOT_DEPARTED)),
            Property::always(NO_REVIVAL, |_, s: &QueueState| s.kept(NO_REVIVAL)),
            Property::always(LOCK_DELAY, |_, s: &QueueState| s.kept(LOCK_DELAY)),
            Property::sometimes(HANDED_OVER, |_, s: &QueueState| s.has_seen(HANDED_OVER)),
            Property::sometimes(WAITER_AFTER_EXPIRY, |_, s: &QueueState| {
                s.has_seen(WAITER_AFTER_EXPIRY)
            }),
            Property::sometimes(DELAY_REFUSED, |_, s: &QueueState| s.has_seen(DELAY_REFUSED)),
            Property::sometimes(RENEWED, |_, s: &QueueState| s.has_seen(RENEWED)),
        ]
    }
}

impl QueueState {
    /// The least of this state's renamings: resources swapped or not, clients 2 and 3
    /// swapped or not (client 1 alone asks for a lock delay). Tickets and fences keep their
    /// numbers; owners, resources and the clients' places are renamed.
    fn representative(self, resources: u8) -> QueueState {
        let clients = self.clients.len();
        let mut best: Option<QueueState> = None;
        for swap_resources in [false, resources == 2] {
            for swap_clients in [false, clients == 3] {
                let client = |c: u8| match c {
                    1 if swap_clients => 2,
                    2 if swap_clients => 1,
                    c => c,
                };
                let resource = |r: u8| if swap_resources { 1 - r } else { r };
                let renamed = self.renamed(client, resource);
                if best.as_ref().is_none_or(|b| renamed < *b) {
                    best = Some(renamed);
                }
            }
        }
        best.unwrap_or(self)
    }

    fn renamed(&self, client: impl Fn(u8) -> u8, resource: impl Fn(u8) -> u8) -> QueueState {
        let mut renamed = self.clone();
        renamed.store.slots = self
            .store
            .slots
            .iter()
            .map(|(r, slot)| {
                let mut slot = slot.clone();
                if let Some(lease) = &mut slot.lease {
                    lease.owner = client(lease.owner);
                }
                for waiter in &mut slot.queue {
                    waiter.owner = client(waiter.owner);
                }
                (resource(*r), slot)
            })
            .collect();
        for (index, state) in self.clients.iter().enumerate() {
            let index = u8::try_from(index).expect("at most 3 clients");
            renamed.clients[usize::from(client(index))] = match state.clone() {
                Client::Idle => Client::Idle,
                Client::Refused { resource: r } => Client::Refused {
                    resource: resource(r),
                },
                Client::Waiting {
                    resource: r,
                    ticket,
                    deadline,
                } => Client::Waiting {
                    resource: resource(r),
                    ticket,
                    deadline,
                },
                Client::Holding { resource: r, fence } => Client::Holding {
                    resource: resource(r),
                    fence,
                },
            };
        }
        renamed
    }

    /// Whether the `always` property `name` has held on the path so far.
    pub fn kept(&self, name: &str) -> bool {
        self.violated & bit(ALWAYS, name) == 0
    }

    /// Whether the `sometimes` property `name` was reached on the path so far.
    pub fn has_seen(&self, name: &str) -> bool {
        self.seen & bit(SOMETIMES, name) != 0
    }
}

impl QueueModel {
    /// An acquisition by `client` (with its ticket, for a waiter's attempt), judged; the fence
    /// when granted.
    fn acquire(
        &self,
        state: &mut QueueState,
        client: u8,
        resource: u8,
        ticket: Option<Ticket>,
    ) -> Option<Fence> {
        let before = state.store.slot(&resource).cloned();
        let req = self.request(client, ticket);
        let outcome = state
            .store
            .acquire(&self.cfg.rules, &resource, &req, state.now, Number::Next)
            .ok()?;
        match outcome {
            AcquireOutcome::Granted { how, fence, .. } => {
                if how != How::Claimed {
                    judge::grant(state, before.as_ref(), false, client, ticket, fence);
                }
                if ticket.is_some()
                    && how == How::TakenOver
                    && before
                        .and_then(|s| s.lease)
                        .is_some_and(|l| l.owner != client)
                {
                    state.seen |= bit(SOMETIMES, WAITER_AFTER_EXPIRY);
                }
                Some(fence)
            }
            AcquireOutcome::Held {
                delayed_until: Some(_),
            } => {
                state.seen |= bit(SOMETIMES, DELAY_REFUSED);
                None
            }
            AcquireOutcome::Held { .. } | AcquireOutcome::Queued => None,
        }
    }
}

/// A path's steps, one action and the state after it per step.
pub fn render(steps: &[(QueueState, Option<QueueAction>)]) -> String {
    crate::trace::numbered(steps, describe, summary)
}

fn describe(action: &QueueAction) -> String {
    let c = |client: &u8| format!("c{}", client + 1);
    match action {
        QueueAction::Tick => "the store's clock ticks".to_owned(),
        QueueAction::Acquire {
            client,
            resource,
            wait,
        } => format!(
            "{} acquires r{}{}",
            c(client),
            resource + 1,
            if *wait { ", willing to wait" } else { "" }
        ),
        QueueAction::Enqueue { client } => format!("{} takes a ticket", c(client)),
        QueueAction::Attempt { client } => format!("{} tries again with its ticket", c(client)),
        QueueAction::Leave { client } => format!("{} leaves the queue", c(client)),
        QueueAction::Renew { client } => format!("{} renews", c(client)),
        QueueAction::Release { client } => format!("{} releases", c(client)),
        QueueAction::Reacquire { client } => format!("{} acquires its resource again", c(client)),
    }
}

fn summary(state: &QueueState) -> String {
    let mut out = format!("t={}", state.now);
    for (resource, slot) in &state.store.slots {
        let _ = write!(out, " | r{}:", resource + 1);
        if let Some(l) = &slot.lease {
            let _ = write!(
                out,
                " lease c{} fence {} [{},{})",
                l.owner + 1,
                l.fence,
                l.acquired_at,
                l.expires_at
            );
            if l.lock_delay > 0 {
                let _ = write!(out, " delay {}", l.lock_delay);
            }
        }
        for w in &slot.queue {
            let _ = write!(out, " #{}:c{} until {}", w.ticket, w.owner + 1, w.deadline);
            if w.left {
                out.push_str(" (left)");
            }
            if let Some(g) = w.granted {
                let _ = write!(out, " (granted fence {})", g.fence);
            }
        }
    }
    let clients: Vec<String> = state
        .clients
        .iter()
        .enumerate()
        .map(|(i, client)| {
            let what = match client {
                Client::Idle => "idle".to_owned(),
                Client::Refused { resource } => format!("refused on r{}", resource + 1),
                Client::Waiting {
                    resource, ticket, ..
                } => format!("waits on r{} #{ticket}", resource + 1),
                Client::Holding { resource, fence } => {
                    format!("holds r{} fence {fence}", resource + 1)
                }
            };
            format!("c{} {what}", i + 1)
        })
        .collect();
    let _ = write!(out, " | {}", clients.join(", "));
    out
}
