//! What must hold, and the history (leases granted and ended) some of it is judged on.

use stateright::actor::{ActorModelState, Envelope};

use crate::actors::{Fence, Msg, Node, Owner, SERVER, State, StoreState, worker_of};
use crate::config::{Config, Time};
use crate::{Model, STORE};

/// (a) In apply order, the fences of the applied writes never go down.
pub const FENCE_ORDER: &str = "(a) applied writes carry non-decreasing fences";
/// (a') In apply order, no write of an earlier lease follows a write of a later one. This is
/// what (a) means for the holders: it follows from (a) and (c), and fails when fences repeat.
pub const LEASE_ORDER: &str = "(a') writes are applied in lease order";
/// (b) No two owners hold a live lease on the resource at the same store time.
pub const ONE_HOLDER: &str = "(b) at most one live lease per resource";
/// (c) Every grant carries a fence never issued before, also across a crash and restart.
pub const UNIQUE_FENCES: &str = "(c) no fence is issued twice";
/// (d) Liveness sanity: on some path, every worker has a write applied.
pub const EVERY_WORKER_WRITES: &str = "(d) every worker gets a write applied";

/// Sanity: on some path the guard refuses a stale write, so the checked paths include the
/// one the guard exists for.
pub const STALE_WRITE_REFUSED: &str = "the guard refuses a stale write";

/// Every lease the server granted, in grant order, with when it ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct History {
    pub leases: Vec<LeaseRecord>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseRecord {
    pub owner: Owner,
    pub fence: Fence,
    pub acquired_at: Time,
    pub expires_at: Time,
    /// Released, or replaced by a re-acquisition of the same owner.
    pub ended_at: Option<Time>,
}

impl LeaseRecord {
    /// The end of the store-time interval `[acquired_at, live_until)` in which it was live.
    pub fn live_until(&self) -> Time {
        self.ended_at
            .map_or(self.expires_at, |ended| ended.min(self.expires_at))
    }
}

/// Records what the server's answers say: a grant starts a lease (and ends the same owner's
/// previous one), a release answer ends one.
pub fn record(_: &Config, history: &History, env: Envelope<&Msg>) -> Option<History> {
    if usize::from(env.src) != SERVER {
        return None;
    }
    let worker = worker_of(env.dst)?;
    let mut history = history.clone();
    match *env.msg {
        Msg::Granted {
            attempt,
            fence,
            acquired_at,
            expires_at,
            ..
        } => {
            let owner = Owner { worker, attempt };
            for lease in &mut history.leases {
                if lease.owner == owner && lease.ended_at.is_none() {
                    lease.ended_at = Some(acquired_at);
                }
            }
            history.leases.push(LeaseRecord {
                owner,
                fence,
                acquired_at,
                expires_at,
                ended_at: None,
            });
        }
        Msg::Released { attempt, fence, at } => {
            let owner = Owner { worker, attempt };
            let lease = history
                .leases
                .iter_mut()
                .find(|l| l.owner == owner && l.fence == fence && l.ended_at.is_none())?;
            lease.ended_at = Some(at);
        }
        _ => return None,
    }
    Some(history)
}

pub fn store(state: &ActorModelState<Node, History>) -> &StoreState {
    match &*state.actor_states[STORE] {
        State::Store(store) => store,
        _ => unreachable!("actor {STORE} is the store"),
    }
}

pub fn fence_order(_: &Model, state: &ActorModelState<Node, History>) -> bool {
    store(state)
        .applied
        .windows(2)
        .all(|pair| pair[0].fence <= pair[1].fence)
}

pub fn lease_order(_: &Model, state: &ActorModelState<Node, History>) -> bool {
    store(state)
        .applied
        .windows(2)
        .all(|pair| pair[0].grant <= pair[1].grant)
}

pub fn one_holder(_: &Model, state: &ActorModelState<Node, History>) -> bool {
    let leases = &state.history.leases;
    leases.iter().enumerate().all(|(i, a)| {
        leases[i + 1..].iter().all(|b| {
            a.owner == b.owner || a.live_until() <= b.acquired_at || b.live_until() <= a.acquired_at
        })
    })
}

pub fn unique_fences(_: &Model, state: &ActorModelState<Node, History>) -> bool {
    let leases = &state.history.leases;
    leases
        .iter()
        .enumerate()
        .all(|(i, a)| leases[i + 1..].iter().all(|b| a.fence != b.fence))
}

pub fn every_worker_writes(model: &Model, state: &ActorModelState<Node, History>) -> bool {
    let applied = &store(state).applied;
    (1..=model.cfg.workers).all(|worker| applied.iter().any(|a| a.worker == worker))
}

pub fn stale_write_refused(_: &Model, state: &ActorModelState<Node, History>) -> bool {
    store(state).rejected
}
