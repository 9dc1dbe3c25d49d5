//! The actors: the lease server, the guarded store and the workers, as one stateright actor
//! type (an actor model holds actors of one type).

use std::borrow::Cow;
use std::fmt;

use stateright::actor::{Actor, Id, Out};

use crate::config::{Fences, Guard, Time};

/// A fence, as the lease server issues it. The model never issues more than a few.
pub type Fence = u32;

/// Actor ids: the server and the store first, then the workers.
pub const SERVER: usize = 0;
pub const STORE: usize = 1;
pub const FIRST_WORKER: usize = 2;

/// The worker number (1-based, as traces show it) behind an actor id, if it is a worker.
pub fn worker_of(id: Id) -> Option<u8> {
    let index = usize::from(id);
    let number = index.checked_sub(FIRST_WORKER)? + 1;
    u8::try_from(number).ok()
}

pub fn worker_id(worker: u8) -> Id {
    Id::from(FIRST_WORKER + usize::from(worker) - 1)
}

/// The owner of an acquisition attempt. A worker makes a new owner for every attempt, as a
/// real client generates a new owner token per attempt; an old attempt's request that arrives
/// late (or twice) acts for the old owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    pub worker: u8,
    pub attempt: u8,
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "w{}#{}", self.worker, self.attempt)
    }
}

/// The lease row of the one modelled resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    pub owner: Owner,
    pub fence: Fence,
    pub acquired_at: Time,
    pub expires_at: Time,
}

impl fmt::Display for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} fence {} [{},{})",
            self.owner, self.fence, self.acquired_at, self.expires_at
        )
    }
}

/// Messages. `grant` is model bookkeeping, not part of the protocol: the number of the grant
/// (0, 1, ...) in the order the server made them, carried along so that the store's log can
/// say which lease a write came from. No actor decides anything on it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    /// worker → server: `POST /locks/{resource}`.
    Acquire { attempt: u8 },
    /// server → worker: `acquired: true`.
    Granted {
        attempt: u8,
        fence: Fence,
        acquired_at: Time,
        expires_at: Time,
        grant: u8,
    },
    /// server → worker: `acquired: false`, another owner's lease is live.
    Held { attempt: u8 },
    /// worker → server: release with the owner and the fence.
    Release { attempt: u8, fence: Fence },
    /// server → worker: `204`, the lease is gone (the worker has nothing left to do with it;
    /// the model records when the lease ended).
    Released { attempt: u8, fence: Fence, at: Time },
    /// worker → store: a write carrying `Fencing-Token: fence`.
    Write { fence: Fence, grant: u8 },
}

impl fmt::Display for Msg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Msg::Acquire { attempt } => write!(f, "acquire (attempt {attempt})"),
            Msg::Granted {
                attempt,
                fence,
                acquired_at,
                expires_at,
                ..
            } => write!(
                f,
                "granted to attempt {attempt}: fence {fence}, live [{acquired_at},{expires_at})"
            ),
            Msg::Held { attempt } => write!(f, "held by another owner (attempt {attempt})"),
            Msg::Release { attempt, fence } => {
                write!(f, "release (attempt {attempt}, fence {fence})")
            }
            Msg::Released { attempt, fence, at } => {
                write!(f, "released (attempt {attempt}, fence {fence}) at {at}")
            }
            Msg::Write { fence, .. } => write!(f, "write with fence {fence}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Timer {
    /// The store's clock advances one tick.
    Tick,
    /// The second half of a guard that checks and applies in two steps
    /// ([`Guard::CheckThenApply`]): the write was checked, now it is applied.
    Apply { worker: u8, fence: Fence, grant: u8 },
}

/// What survives a crash of the lease server: what its store has committed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Durable {
    /// The store's clock keeps running while the server is down.
    pub clock: Time,
    pub counter: Fence,
    pub lease: Option<Lease>,
    pub grants: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServerState {
    pub clock: Time,
    /// The store-wide fence counter: the last fence issued.
    pub counter: Fence,
    pub lease: Option<Lease>,
    /// Bookkeeping: how many grants were made (see [`Msg`]).
    pub grants: u8,
}

impl ServerState {
    fn durable(&self) -> Durable {
        Durable {
            clock: self.clock,
            counter: self.counter,
            lease: self.lease,
            grants: self.grants,
        }
    }
}

/// One applied write, in the store's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Applied {
    pub worker: u8,
    pub fence: Fence,
    pub grant: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StoreState {
    /// The highest fence the guard has accepted for the key (0: none yet).
    pub highest: Fence,
    /// Every applied write, in apply order. The same write applied again right after itself
    /// (a duplicated message) changes nothing and is logged once.
    pub applied: Vec<Applied>,
    /// Whether the guard has refused a write (a stale one) yet.
    pub rejected: bool,
}

impl StoreState {
    fn apply(&mut self, write: Applied) {
        self.highest = write.fence;
        if self.applied.last() != Some(&write) {
            self.applied.push(write);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// An acquire request of the current attempt is out.
    Acquiring,
    /// Granted: the write and the release have been sent, and travel as the network lets them.
    Holding(Fence),
    /// Every attempt was answered `held`.
    GaveUp,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkerState {
    pub attempt: u8,
    pub phase: Phase,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum State {
    Server(ServerState),
    Store(StoreState),
    Worker(WorkerState),
}

#[derive(Clone, Debug)]
pub enum Node {
    Server {
        ttl: Time,
        max_time: Time,
        fences: Fences,
        /// How far ahead of the store's clock the clock that judges expiry runs (0: the
        /// store's own clock, as fencelock does).
        clock_ahead: Time,
    },
    Store {
        guard: Guard,
    },
    Worker {
        attempts: u8,
    },
}

impl Actor for Node {
    type Msg = Msg;
    type Timer = Timer;
    type State = State;
    type Storage = Durable;
    type Random = ();

    fn on_start(&self, _id: Id, storage: &Option<Durable>, o: &mut Out<Self>) -> State {
        match self {
            Node::Server {
                max_time, fences, ..
            } => {
                let durable = storage.clone().unwrap_or(Durable {
                    clock: 0,
                    counter: 0,
                    lease: None,
                    grants: 0,
                });
                if durable.clock < *max_time {
                    o.set_timer(Timer::Tick, stateright::actor::model_timeout());
                }
                State::Server(ServerState {
                    clock: durable.clock,
                    counter: if *fences == Fences::InMemory {
                        0
                    } else {
                        durable.counter
                    },
                    lease: durable.lease,
                    grants: durable.grants,
                })
            }
            Node::Store { .. } => State::Store(StoreState {
                highest: 0,
                applied: Vec::new(),
                rejected: false,
            }),
            Node::Worker { .. } => {
                o.send(Id::from(SERVER), Msg::Acquire { attempt: 0 });
                State::Worker(WorkerState {
                    attempt: 0,
                    phase: Phase::Acquiring,
                })
            }
        }
    }

    fn on_msg(&self, _id: Id, state: &mut Cow<'_, State>, src: Id, msg: Msg, o: &mut Out<Self>) {
        match self {
            Node::Server { .. } => self.server_msg(state, src, msg, o),
            Node::Store { guard } => store_msg(*guard, state, src, msg, o),
            Node::Worker { attempts } => worker_msg(*attempts, state, msg, o),
        }
    }

    fn on_timeout(&self, _id: Id, state: &mut Cow<'_, State>, timer: &Timer, o: &mut Out<Self>) {
        match (timer, state.to_mut()) {
            (Timer::Tick, State::Server(server)) => {
                server.clock += 1;
                if let Node::Server { max_time, .. } = self
                    && server.clock < *max_time
                {
                    o.set_timer(Timer::Tick, stateright::actor::model_timeout());
                }
                o.save(server.durable());
            }
            (
                Timer::Apply {
                    worker,
                    fence,
                    grant,
                },
                State::Store(store),
            ) => store.apply(Applied {
                worker: *worker,
                fence: *fence,
                grant: *grant,
            }),
            _ => {}
        }
    }
}

impl Node {
    fn server_msg(&self, state: &mut Cow<'_, State>, src: Id, msg: Msg, o: &mut Out<Self>) {
        let Node::Server {
            ttl,
            fences,
            clock_ahead,
            ..
        } = self
        else {
            return;
        };
        let State::Server(server) = &**state else {
            return;
        };
        let Some(worker) = worker_of(src) else {
            return;
        };
        let now = server.clock;
        match msg {
            Msg::Acquire { attempt } => {
                let owner = Owner { worker, attempt };
                // The check and the write are one atomic step (one statement in the store).
                if let Some(lease) = &server.lease
                    && lease.owner != owner
                    && now.saturating_add(*clock_ahead) < lease.expires_at
                {
                    o.send(src, Msg::Held { attempt });
                    return;
                }
                let fence = match fences {
                    Fences::StoreWide | Fences::InMemory => server.counter + 1,
                    Fences::PerRowResetOnRelease => server.lease.map_or(0, |l| l.fence) + 1,
                };
                let grant = server.grants;
                let lease = Lease {
                    owner,
                    fence,
                    acquired_at: now,
                    expires_at: now.saturating_add(*ttl),
                };
                let State::Server(server) = state.to_mut() else {
                    return;
                };
                if *fences != Fences::PerRowResetOnRelease {
                    server.counter = fence;
                }
                server.lease = Some(lease);
                server.grants += 1;
                o.save(server.durable());
                o.send(
                    src,
                    Msg::Granted {
                        attempt,
                        fence,
                        acquired_at: lease.acquired_at,
                        expires_at: lease.expires_at,
                        grant,
                    },
                );
            }
            Msg::Release { attempt, fence } => {
                let owner = Owner { worker, attempt };
                // Only the live lease of this owner with this fence: a late release of an
                // older lease must not free a newer one.
                let Some(lease) = server.lease else {
                    return;
                };
                if lease.owner != owner || lease.fence != fence || now >= lease.expires_at {
                    return;
                }
                if let State::Server(server) = state.to_mut() {
                    server.lease = None;
                    o.save(server.durable());
                }
                o.send(
                    src,
                    Msg::Released {
                        attempt,
                        fence,
                        at: now,
                    },
                );
            }
            _ => {}
        }
    }
}

fn store_msg(guard: Guard, state: &mut Cow<'_, State>, src: Id, msg: Msg, o: &mut Out<Node>) {
    let (Msg::Write { fence, grant }, Some(worker)) = (msg, worker_of(src)) else {
        return;
    };
    let State::Store(store) = &**state else {
        return;
    };
    let write = Applied {
        worker,
        fence,
        grant,
    };
    match guard {
        Guard::Atomic => {
            if fence >= store.highest {
                if let State::Store(store) = state.to_mut() {
                    store.apply(write);
                }
            } else if !store.rejected
                && let State::Store(store) = state.to_mut()
            {
                store.rejected = true;
            }
        }
        Guard::None => {
            if let State::Store(store) = state.to_mut() {
                store.apply(write);
            }
        }
        Guard::CheckThenApply => {
            if fence >= store.highest {
                o.set_timer(
                    Timer::Apply {
                        worker,
                        fence,
                        grant,
                    },
                    stateright::actor::model_timeout(),
                );
            }
        }
    }
}

fn worker_msg(attempts: u8, state: &mut Cow<'_, State>, msg: Msg, o: &mut Out<Node>) {
    let State::Worker(worker) = &**state else {
        return;
    };
    if worker.phase != Phase::Acquiring {
        return;
    }
    let current = worker.attempt;
    match msg {
        Msg::Granted {
            attempt,
            fence,
            grant,
            ..
        } if attempt == current => {
            if let State::Worker(worker) = state.to_mut() {
                worker.phase = Phase::Holding(fence);
            }
            // The worker writes and releases without looking at any clock: a worker that
            // paused after its last check is indistinguishable. The network delays each
            // message for as long as it likes, so the write may arrive any number of ticks
            // after the lease expired, or after the release.
            o.send(Id::from(STORE), Msg::Write { fence, grant });
            o.send(Id::from(SERVER), Msg::Release { attempt, fence });
        }
        Msg::Held { attempt } if attempt == current => {
            if let State::Worker(worker) = state.to_mut() {
                if attempt + 1 < attempts {
                    worker.attempt += 1;
                    o.send(
                        Id::from(SERVER),
                        Msg::Acquire {
                            attempt: worker.attempt,
                        },
                    );
                } else {
                    worker.phase = Phase::GaveUp;
                }
            }
        }
        _ => {}
    }
}
