//! fencelock's protocol as two models, checked exhaustively with
//! [stateright](https://docs.rs/stateright) within bounds against fencelock's safety
//! properties.
//!
//! The actor model: every interleaving of a lease server, a guarded store and 2-3 workers.
//! Abstract on purpose: one resource (and the one store key it protects), a store clock that
//! moves in ticks, workers that write once per lease. What it keeps is what the safety
//! argument rests on: who decides expiry (the store's clock), where fences come from (one
//! durable store-wide counter), and how the guard compares (check and apply in one step),
//! under a network that delays, reorders, duplicates and loses every message and a lease
//! server that crashes and restarts.
//!
//! The queue model: up to three clients on two resources of one store, acquiring (waiting or
//! not), renewing, releasing and leaving the queue at any moment of the store's clock, every
//! step one of the store's atomic steps (`rules.rs`): FIFO hand-over, departed waiters,
//! renewal after expiry and the lock delay, which the actor model leaves out.
//!
//! # Layout
//! - `config.rs`: the actor model's clock tick (`Time`), bounds, and the switches for the
//!   broken variants the checker must catch (no guard, per-row fences, a guard that checks
//!   and applies in two steps, ...).
//! - `actors.rs`: the lease server, the store and the workers.
//! - `properties.rs`: the actor model's properties (a)-(d), and the lease history they are
//!   judged on.
//! - `rules.rs`: the store's atomic steps over many resources (acquire, wait in a queue, renew,
//!   release with hand-over, leave, lock delay), pure and generic, with switchable broken
//!   rules: shared with the replay of real histories.
//! - `queue.rs`: the queue model, its bounds, and its properties (b), (c), (e)-(h), judged on
//!   every step.
//! - `trace.rs`: an actor model counterexample as readable steps (`queue.rs` renders its own).

pub mod actors;
pub mod config;
pub mod properties;
pub mod queue;
pub mod rules;
pub mod trace;

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hash;
use std::time::{Duration, Instant};

use stateright::actor::{ActorModel, ActorModelAction, ActorModelState, LossyNetwork, Network};
use stateright::{Checker, Expectation, HasDiscoveries, Path};

pub use actors::{FIRST_WORKER, SERVER, STORE};
use actors::{Msg, Node, Timer};
pub use config::{Config, Fences, Guard};
use properties::History;
pub use queue::{QueueAction, QueueConfig, QueueModel, QueueState};

/// The model type: the actors, the configuration, the lease history.
pub type Model = ActorModel<Node, Config, History>;
pub type SystemState = ActorModelState<Node, History>;
pub type Action = ActorModelAction<Msg, Timer, ()>;

/// The actor model of one configuration.
pub fn model(cfg: Config) -> Model {
    let server = Node::Server {
        ttl: cfg.ttl,
        max_time: cfg.max_time,
        fences: cfg.fences,
        clock_ahead: cfg.clock_ahead,
    };
    let store = Node::Store { guard: cfg.guard };
    let attempts = cfg.attempts;
    let workers = (0..cfg.workers).map(move |_| Node::Worker { attempts });
    let lossy = if cfg.lossy {
        LossyNetwork::Yes
    } else {
        LossyNetwork::No
    };
    let crashes = usize::from(cfg.server_crashes);
    ActorModel::new(cfg, History::default())
        .actor(server)
        .actor(store)
        .actors(workers)
        // Unordered and duplicating: any message may be delivered at any later step, in any
        // order, any number of times; with `lossy`, also never.
        .init_network(Network::new_unordered_duplicating([]))
        .lossy_network(lossy)
        .max_crashes(crashes)
        .record_msg_out(properties::record)
        // Only the lease server crashes: a worker that crashes is a worker paused forever,
        // and the store's guard state is committed with each write.
        .within_boundary(|_, state| {
            state
                .crashed
                .iter()
                .enumerate()
                .all(|(index, crashed)| !crashed || index == SERVER)
        })
        .property(
            Expectation::Always,
            properties::FENCE_ORDER,
            properties::fence_order,
        )
        .property(
            Expectation::Always,
            properties::LEASE_ORDER,
            properties::lease_order,
        )
        .property(
            Expectation::Always,
            properties::ONE_HOLDER,
            properties::one_holder,
        )
        .property(
            Expectation::Always,
            properties::UNIQUE_FENCES,
            properties::unique_fences,
        )
        .property(
            Expectation::Sometimes,
            properties::EVERY_WORKER_WRITES,
            properties::every_worker_writes,
        )
        .property(
            Expectation::Sometimes,
            properties::STALE_WRITE_REFUSED,
            properties::stale_write_refused,
        )
}

/// A model whose paths can be told as readable steps.
pub trait Explain: stateright::Model {
    /// The steps of a path, one action and the state after it per step.
    fn render(&self, steps: &[(Self::State, Option<Self::Action>)]) -> String;
}

impl Explain for Model {
    fn render(&self, steps: &[(SystemState, Option<Action>)]) -> String {
        trace::render(self, steps)
    }
}

impl Explain for QueueModel {
    fn render(&self, steps: &[(QueueState, Option<QueueAction>)]) -> String {
        queue::render(steps)
    }
}

/// What one check found.
pub struct Outcome<M: stateright::Model = Model> {
    pub model: M,
    /// States generated, repeats included.
    pub states: usize,
    pub unique_states: usize,
    /// Every state reachable in this many steps was checked (the depth asked for, or less
    /// when fewer steps already reach every state).
    pub depth: usize,
    pub elapsed: Duration,
    /// Whether the check stopped at a counterexample before exploring everything.
    pub stopped_early: bool,
    /// Counterexamples of `always` properties, by property name.
    pub violated: BTreeMap<&'static str, Path<M::State, M::Action>>,
    /// Examples of `sometimes` properties, by property name.
    pub reached: BTreeMap<&'static str, Path<M::State, M::Action>>,
}

impl<M: Explain> Outcome<M>
where
    M::State: Clone,
    M::Action: Clone,
{
    /// The `sometimes` properties without an example.
    pub fn unreached(&self) -> Vec<&'static str> {
        self.model
            .properties()
            .iter()
            .filter(|p| p.expectation == Expectation::Sometimes)
            .map(|p| p.name)
            .filter(|name| !self.reached.contains_key(name))
            .collect()
    }

    /// States, unique states, depth and time on one line.
    pub fn figures(&self) -> String {
        let scope = if self.stopped_early {
            format!(
                "stopped at a counterexample, paths of up to {} steps",
                self.depth
            )
        } else {
            format!("every path of up to {} steps", self.depth)
        };
        format!(
            "{} states ({} unique), {scope}, {:.1} s",
            self.states,
            self.unique_states,
            self.elapsed.as_secs_f64()
        )
    }

    /// Every counterexample, as readable steps up to the first state where its property
    /// fails (the checker may have recorded a longer path that goes on after it).
    pub fn counterexamples(&self) -> String {
        let mut out = String::new();
        for (name, path) in &self.violated {
            let mut steps = path.clone().into_vec();
            if let Some(property) = self
                .model
                .properties()
                .into_iter()
                .find(|p| p.name == *name)
                && let Some(first) = steps
                    .iter()
                    .position(|(state, _)| !(property.condition)(&self.model, state))
            {
                steps.truncate(first + 1);
            }
            out.push_str(&format!("counterexample to \"{name}\":\n"));
            out.push_str(&self.model.render(&steps));
            out.push('\n');
        }
        out
    }
}

/// When a check stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// When every state within the depth has been explored.
    Exhausted,
    /// At the first counterexample to any property.
    FirstCounterexample,
    /// At the first counterexample to the named property.
    CounterexampleTo(&'static str),
}

/// Explores every state of the actor model reachable within `depth` steps, breadth first.
pub fn check(cfg: Config, depth: usize, threads: usize, finish: Finish) -> Outcome {
    explore(model(cfg), depth, threads, finish)
}

/// Explores every state of the queue model reachable within `depth` steps, breadth first.
pub fn check_queue(
    cfg: QueueConfig,
    depth: usize,
    threads: usize,
    finish: Finish,
) -> Outcome<QueueModel> {
    explore(QueueModel { cfg }, depth, threads, finish)
}

/// Explores every state of `model` reachable within `depth` steps, breadth first.
pub fn explore<M>(model: M, depth: usize, threads: usize, finish: Finish) -> Outcome<M>
where
    M: Explain + Clone + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Clone + PartialEq,
{
    let started = Instant::now();
    // stateright counts the initial state as depth 1 and does not check the states at its
    // target depth: checking every path of `depth` steps takes a target of `depth + 2`.
    let target = depth + 2;
    let builder = model.checker().threads(threads).target_max_depth(target);
    let builder = match finish {
        Finish::Exhausted => builder,
        Finish::FirstCounterexample => builder.finish_when(HasDiscoveries::AnyFailures),
        Finish::CounterexampleTo(name) => {
            builder.finish_when(HasDiscoveries::AnyOf(BTreeSet::from([name])))
        }
    };
    let checker = builder.spawn_bfs().join();
    let elapsed = started.elapsed();
    let model = checker.model().clone();
    let properties = model.properties();
    let mut violated = BTreeMap::new();
    let mut reached = BTreeMap::new();
    for (name, path) in checker.discoveries() {
        let property = properties
            .iter()
            .find(|p| p.name == name)
            .expect("a discovery names a property");
        match property.expectation {
            Expectation::Sometimes => reached.insert(name, path),
            Expectation::Always | Expectation::Eventually => violated.insert(name, path),
        };
    }
    Outcome {
        stopped_early: finish != Finish::Exhausted && !violated.is_empty(),
        states: checker.state_count(),
        unique_states: checker.unique_state_count(),
        depth: if checker.max_depth() >= target {
            depth
        } else {
            checker.max_depth().saturating_sub(1)
        },
        elapsed,
        violated,
        reached,
        model,
    }
}
