//! A path through the model as numbered steps: what happened, then the state it left.

use std::fmt::Write as _;

use stateright::actor::{ActorModelAction, Id};

use crate::actors::{Phase, SERVER, STORE, State, Timer, worker_of};
use crate::properties::store;

use crate::config::Fences;
use crate::{Model, SystemState};

/// The steps of an actor model path, one action and the state after it per step.
pub fn render(model: &Model, steps: &[(SystemState, Option<crate::Action>)]) -> String {
    numbered(steps, describe, |state| summary(model, state))
}

/// A path as numbered steps, for either model: each action as `describe` tells it, then the
/// state it left as `summary` does.
pub fn numbered<S, A>(
    steps: &[(S, Option<A>)],
    describe: impl Fn(&A) -> String,
    summary: impl Fn(&S) -> String,
) -> String {
    let mut out = String::new();
    if let Some((first, _)) = steps.first() {
        let _ = writeln!(out, "   0. start\n        {}", summary(first));
    }
    for (number, pair) in steps.windows(2).enumerate() {
        let (Some(action), next) = (&pair[0].1, &pair[1].0) else {
            continue;
        };
        let _ = writeln!(
            out,
            "{:>4}. {}\n        {}",
            number + 1,
            describe(action),
            summary(next)
        );
    }
    out
}

fn name(id: Id) -> String {
    match usize::from(id) {
        SERVER => "server".to_owned(),
        STORE => "store".to_owned(),
        _ => worker_of(id).map_or_else(|| format!("{id:?}"), |w| format!("w{w}")),
    }
}

fn describe(action: &crate::Action) -> String {
    match action {
        ActorModelAction::Deliver { src, dst, msg } => {
            format!("{} receives from {}: {msg}", name(*dst), name(*src))
        }
        ActorModelAction::Drop(env) => format!(
            "the network loses {} -> {}: {}",
            name(env.src),
            name(env.dst),
            env.msg
        ),
        ActorModelAction::Timeout(_, Timer::Tick) => "the store's clock ticks".to_owned(),
        ActorModelAction::Timeout(_, Timer::Apply { worker, fence, .. }) => {
            format!(
                "store applies w{worker}'s write with fence {fence}, checked in an earlier step"
            )
        }
        ActorModelAction::Crash(id) => format!("{} crashes", name(*id)),
        ActorModelAction::Recover(id) => {
            format!("{} restarts from what it had committed", name(*id))
        }
        ActorModelAction::SelectRandom { actor, .. } => format!("{} chooses", name(*actor)),
    }
}

/// The state that matters: the clock, the lease row and the counter, the grants so far, the
/// guard's highest fence and the applied writes, each worker's phase.
fn summary(model: &Model, state: &SystemState) -> String {
    let mut out = String::new();
    match &*state.actor_states[SERVER] {
        State::Server(server) => {
            let _ = write!(out, "t={}", server.clock);
            if state.crashed[SERVER] {
                out.push_str(" | server down");
            } else {
                let lease = server
                    .lease
                    .map_or_else(|| "no lease".to_owned(), |l| format!("lease {l}"));
                let _ = write!(out, " | server: {lease}");
                if model.cfg.fences != Fences::PerRowResetOnRelease {
                    let _ = write!(out, ", counter {}", server.counter);
                }
            }
        }
        _ => out.push('?'),
    }
    let grants: Vec<String> = state
        .history
        .leases
        .iter()
        .map(|l| format!("{}:{}", l.owner, l.fence))
        .collect();
    let _ = write!(out, " | granted [{}]", grants.join(" "));
    let store = store(state);
    let applied: Vec<String> = store
        .applied
        .iter()
        .map(|a| format!("w{}:{}", a.worker, a.fence))
        .collect();
    let _ = write!(
        out,
        " | store: highest {}, applied [{}]",
        store.highest,
        applied.join(" ")
    );
    let checked: Vec<String> = state.timers_set[STORE]
        .iter()
        .filter_map(|timer| match timer {
            Timer::Apply { worker, fence, .. } => Some(format!("w{worker}:{fence}")),
            Timer::Tick => None,
        })
        .collect();
    if !checked.is_empty() {
        let _ = write!(out, ", checked but not applied [{}]", checked.join(" "));
    }
    let workers: Vec<String> = (1..=model.cfg.workers)
        .map(|w| {
            let index = usize::from(crate::actors::worker_id(w));
            match &*state.actor_states[index] {
                State::Worker(worker) => {
                    let phase = match worker.phase {
                        Phase::Acquiring => format!("acquiring #{}", worker.attempt),
                        Phase::Holding(fence) => format!("holds fence {fence}"),
                        Phase::GaveUp => "gave up".to_owned(),
                    };
                    format!("w{w} {phase}")
                }
                _ => format!("w{w} ?"),
            }
        })
        .collect();
    let _ = write!(out, " | {}", workers.join(", "));
    out
}
