//! The bounded check: fencelock's protocol keeps every property within the depth, and each
//! broken variant is caught with a counterexample, printed (`--nocapture` shows it).

use fencelock_model::properties::{
    EVERY_WORKER_WRITES, FENCE_ORDER, LEASE_ORDER, ONE_HOLDER, STALE_WRITE_REFUSED, UNIQUE_FENCES,
};
use fencelock_model::{Config, Explain, Finish, Outcome, check};
use stateright::Model as _;
use stateright::actor::ActorModelAction;

/// Steps on a path: enough for every counterexample below (the longest, the guard that checks
/// and applies in two steps, takes 9) and for an applied write by each worker, and `cargo
/// test` explores it in seconds. `fencelock-model --depth N` goes further.
const DEPTH: usize = 10;

#[test]
fn fencelock_keeps_every_property_within_the_bounds() {
    let outcome = check(Config::fencelock(), DEPTH, 1, Finish::Exhausted);
    assert_no_counterexample("fencelock", &outcome);
    assert!(
        outcome.reached.contains_key(EVERY_WORKER_WRITES),
        "no path within depth {DEPTH} lets every worker write"
    );
    assert!(
        outcome.reached.contains_key(STALE_WRITE_REFUSED),
        "no path within depth {DEPTH} has a stale write for the guard to refuse"
    );
    assert_eq!(outcome.depth, DEPTH, "the check stopped short of its depth");
}

#[test]
fn fencelock_keeps_every_property_with_three_workers_and_a_lossy_network() {
    // Loss adds nothing a safety property could see (a lost message is one never delivered),
    // but it is cheap to check at a smaller depth; so are three workers.
    for (workers, lossy, depth) in [(2, true, 7), (3, false, 7)] {
        let cfg = Config {
            workers,
            lossy,
            ..Config::fencelock()
        };
        let outcome = check(cfg, depth, 1, Finish::Exhausted);
        assert_no_counterexample(&format!("{workers} workers, lossy {lossy}"), &outcome);
    }
}

fn counterexample(variant: &str, property: &'static str) -> Outcome {
    let cfg = Config::fencelock()
        .variant(variant)
        .expect("a known variant");
    let outcome = check(cfg, DEPTH, 1, Finish::CounterexampleTo(property));
    assert_counterexample(variant, &outcome, property, DEPTH);
    outcome
}

/// Prints `outcome`'s figures, and asserts that it has no counterexample.
fn assert_no_counterexample<M: Explain>(name: &str, outcome: &Outcome<M>)
where
    M::State: Clone,
    M::Action: Clone,
{
    println!("{name}: {}", outcome.figures());
    assert!(outcome.violated.is_empty(), "{}", outcome.counterexamples());
}

/// Prints `outcome`'s figures and counterexamples, and asserts that one is to `property`.
fn assert_counterexample<M: Explain>(name: &str, outcome: &Outcome<M>, property: &str, depth: usize)
where
    M::State: Clone,
    M::Action: Clone,
{
    println!(
        "{name}: {}\n{}",
        outcome.figures(),
        outcome.counterexamples()
    );
    assert!(
        outcome.violated.contains_key(property),
        "{name}: no counterexample to \"{property}\" within depth {depth}"
    );
}

#[test]
fn a_store_without_the_guard_applies_a_stale_write() {
    counterexample("unguarded", FENCE_ORDER);
}

#[test]
fn fences_counted_per_row_and_reset_on_release_are_issued_twice() {
    counterexample("per-row-fences", UNIQUE_FENCES);
}

#[test]
fn reissued_fences_let_an_earlier_lease_write_after_a_later_one() {
    // The guard still sees non-decreasing fences, but two leases share one.
    counterexample("per-row-fences", LEASE_ORDER);
}

#[test]
fn a_guard_that_checks_and_applies_in_two_steps_applies_a_stale_write() {
    counterexample("check-then-apply", FENCE_ORDER);
}

#[test]
fn a_counter_kept_in_memory_reissues_fences_after_a_restart() {
    let outcome = counterexample("in-memory-counter", UNIQUE_FENCES);
    let path = outcome.violated[UNIQUE_FENCES].clone();
    assert!(
        path.into_actions()
            .iter()
            .any(|a| matches!(a, ActorModelAction::Crash(_))),
        "the counterexample should need a crash"
    );
    // And without crashes the same variant is safe: the restart is what the check caught.
    let mut cfg = Config::fencelock().variant("in-memory-counter").unwrap();
    cfg.server_crashes = false;
    let outcome = check(cfg, DEPTH - 2, 1, Finish::Exhausted);
    assert!(outcome.violated.is_empty(), "{}", outcome.counterexamples());
}

#[test]
fn expiry_judged_ahead_of_the_store_clock_makes_two_holders_but_the_guard_keeps_order() {
    let cfg = Config::fencelock().variant("clock-ahead").unwrap();
    let outcome = check(cfg, DEPTH - 2, 1, Finish::Exhausted);
    println!(
        "clock-ahead: {}\n{}",
        outcome.figures(),
        outcome.counterexamples()
    );
    assert!(outcome.violated.contains_key(ONE_HOLDER));
    // Fencing is what still protects the data when leases overlap.
    assert!(!outcome.violated.contains_key(FENCE_ORDER));
    assert!(!outcome.violated.contains_key(LEASE_ORDER));
    assert!(!outcome.violated.contains_key(UNIQUE_FENCES));
}

// The queue model: waiting, hand-over, renewal and lock delay on two resources, as the
// store's atomic steps (`rules.rs`).

use fencelock_model::queue::{
    ALWAYS, FIFO, LOCK_DELAY, NO_REVIVAL, NOT_DEPARTED, SOMETIMES, WAITER_AFTER_EXPIRY,
};
use fencelock_model::rules::{Broken, Rules};
use fencelock_model::{QueueConfig, QueueModel, check_queue};

/// Steps on a path of the queue model in `cargo test`: every counterexample below takes at
/// most 7, and three clients on two resources at this depth are explored in a few seconds
/// (`fencelock-model --model queue --depth 10` takes about three times as long).
const QUEUE_DEPTH: usize = 9;

#[test]
fn the_queue_model_keeps_every_property_on_postgresql_rules() {
    let outcome = check_queue(QueueConfig::fencelock(), QUEUE_DEPTH, 1, Finish::Exhausted);
    assert_no_counterexample("queue, PostgreSQL", &outcome);
    assert_eq!(outcome.unreached(), Vec::<&str>::new());
    assert_eq!(
        outcome.depth, QUEUE_DEPTH,
        "the check stopped short of its depth"
    );
    assert_eq!(
        outcome.model.properties().len(),
        ALWAYS.len() + SOMETIMES.len()
    );
}

#[test]
fn the_queue_model_keeps_every_property_on_sqlite_rules() {
    let cfg = QueueConfig {
        rules: Rules::SQLITE,
        ..QueueConfig::fencelock()
    };
    let outcome = check_queue(cfg, QUEUE_DEPTH - 1, 1, Finish::Exhausted);
    assert_no_counterexample("queue, SQLite", &outcome);
    // SQLite hands nothing over on release: its first waiter takes the lease itself.
    assert!(outcome.reached.contains_key(WAITER_AFTER_EXPIRY));
}

fn queue_counterexample(cfg: QueueConfig, property: &'static str) -> Outcome<QueueModel> {
    let name = cfg.rules.broken.map_or("fencelock", Broken::name);
    let outcome = check_queue(cfg, QUEUE_DEPTH, 1, Finish::CounterexampleTo(property));
    assert_counterexample(name, &outcome, property, QUEUE_DEPTH);
    outcome
}

#[test]
fn a_hand_over_that_skips_the_queue_order_is_caught() {
    queue_counterexample(
        QueueConfig::fencelock().broken(Broken::HandoverSkipsQueue),
        FIFO,
    );
}

#[test]
fn a_waiter_that_takes_the_resource_past_those_ahead_is_caught_on_sqlite_rules() {
    let cfg = QueueConfig {
        rules: Rules::SQLITE,
        ..QueueConfig::fencelock()
    };
    queue_counterexample(cfg.broken(Broken::HandoverSkipsQueue), FIFO);
}

#[test]
fn a_hand_over_to_a_waiter_that_left_is_caught() {
    queue_counterexample(
        QueueConfig::fencelock().broken(Broken::HandoverToDeparted),
        NOT_DEPARTED,
    );
}

#[test]
fn a_renewal_that_revives_an_expired_lease_is_caught() {
    queue_counterexample(
        QueueConfig::fencelock().broken(Broken::RenewRevivesExpired),
        NO_REVIVAL,
    );
}

#[test]
fn a_grant_inside_another_owners_lock_delay_is_caught() {
    queue_counterexample(
        QueueConfig::fencelock().broken(Broken::LockDelayIgnored),
        LOCK_DELAY,
    );
}

#[test]
fn every_broken_rule_is_caught_with_symmetry_on_too() {
    // The symmetry reduction the correct model's check uses does not hide a broken rule.
    for broken in Broken::ALL {
        let cfg = QueueConfig {
            symmetry: true,
            ..QueueConfig::fencelock().broken(broken)
        };
        let outcome = check_queue(cfg, QUEUE_DEPTH, 1, Finish::FirstCounterexample);
        assert!(
            !outcome.violated.is_empty(),
            "{}: not caught",
            broken.name()
        );
    }
}

#[test]
fn the_queue_model_keeps_every_property_with_postgresqls_provisional_hand_over() {
    // PostgreSQL holds a handed-over lease for a short while, without its lock delay, until
    // the waiter takes it (a waiter that is gone frees it soon): here one tick of a TTL of 2.
    let cfg = QueueConfig {
        rules: Rules {
            provisional_hold: Some(1),
            ..Rules::POSTGRES
        },
        ..QueueConfig::fencelock()
    };
    let outcome = check_queue(cfg, QUEUE_DEPTH - 1, 1, Finish::Exhausted);
    println!(
        "queue, PostgreSQL, provisional hand-over: {}",
        outcome.figures()
    );
    assert!(outcome.violated.is_empty(), "{}", outcome.counterexamples());
    assert_eq!(outcome.unreached(), Vec::<&str>::new());
}
