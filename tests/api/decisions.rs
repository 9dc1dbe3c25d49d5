//! One table of lease decisions, run against the pure rules (`fencelock::domain::decide`) and
//! against each store. SQLite decides with those rules; PostgreSQL decides in SQL, inside its
//! statements. This table is what keeps the two spellings of the rules the same.

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use fencelock::domain::decide::{self, AcquireVerdict, Current};
use fencelock::domain::{
    AcquireOutcome, AcquireRequest, Acquisition, Fence, LockDelay, Owner, ReleaseOutcome,
    ReleaseRequest, RenewOutcome, RenewRequest, ResourceName, Ttl,
};
use fencelock_server::{Deadline, SharedStore};

use futures_util::future::join_all;

use crate::helpers::{StoreKind, TTL, TestApp, TestDb};

/// How the resource stands before the request.
#[derive(Debug, Clone, Copy)]
enum State {
    /// No row: never taken (or released, or purged).
    Absent,
    /// A live lease of `a`.
    LiveA,
    /// A lease of `a` that expired a second ago.
    ExpiredA,
    /// A lease of `a` with a lock delay of a minute, that expired a second ago.
    DelayedA,
}

/// The fence a request names.
#[derive(Debug, Clone, Copy)]
enum Given {
    None,
    /// The fence of `a`'s lease.
    Same,
    /// Some other fence.
    Other,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Acquire,
    Renew(Given),
    Release(Given),
}

/// What happened, in the words of the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Granted(Acquisition),
    Held,
    Renewed,
    Released,
    NotFound,
    Expired,
    OwnerMismatch,
    NotOwner,
    StaleFence,
}

use Given as G;
use Op::{Acquire, Release, Renew};
use State::{Absent, DelayedA, ExpiredA, LiveA};
use Verdict as V;

/// (state, op, requesting owner, expected)
const CASES: &[(State, Op, &str, Verdict)] = &[
    (Absent, Acquire, "a", V::Granted(Acquisition::Fresh)),
    (LiveA, Acquire, "a", V::Granted(Acquisition::Reacquired)),
    (LiveA, Acquire, "b", V::Held),
    (ExpiredA, Acquire, "a", V::Granted(Acquisition::TakenOver)),
    (ExpiredA, Acquire, "b", V::Granted(Acquisition::TakenOver)),
    (Absent, Renew(G::None), "a", V::NotFound),
    (Absent, Renew(G::Other), "a", V::NotFound),
    (LiveA, Renew(G::None), "a", V::Renewed),
    (LiveA, Renew(G::Same), "a", V::Renewed),
    (LiveA, Renew(G::Other), "a", V::StaleFence),
    (LiveA, Renew(G::None), "b", V::OwnerMismatch),
    (LiveA, Renew(G::Other), "b", V::OwnerMismatch),
    (ExpiredA, Renew(G::Same), "a", V::Expired),
    (ExpiredA, Renew(G::None), "b", V::Expired),
    (ExpiredA, Renew(G::Other), "a", V::Expired),
    (Absent, Release(G::None), "a", V::NotFound),
    (LiveA, Release(G::None), "a", V::Released),
    (LiveA, Release(G::Same), "a", V::Released),
    (LiveA, Release(G::Other), "a", V::StaleFence),
    (LiveA, Release(G::None), "b", V::NotOwner),
    (LiveA, Release(G::Same), "b", V::NotOwner),
    (ExpiredA, Release(G::Same), "a", V::NotFound),
    (ExpiredA, Release(G::None), "b", V::NotFound),
    (DelayedA, Acquire, "a", V::Granted(Acquisition::TakenOver)),
    (DelayedA, Acquire, "b", V::Held),
    (DelayedA, Renew(G::Same), "a", V::Expired),
    (DelayedA, Release(G::Same), "a", V::NotFound),
];

/// The lock delay of `a`'s lease in `state`.
fn lock_delay(state: State) -> LockDelay {
    match state {
        DelayedA => LockDelay::new(60_000).unwrap(),
        _ => LockDelay::NONE,
    }
}

fn owner(name: &str) -> Owner {
    Owner::parse(name).unwrap()
}

fn ttl() -> Ttl {
    Ttl::new(TTL, Ttl::max(86_400).unwrap()).unwrap()
}

fn given(g: Given, fence_of_a: Fence) -> Option<Fence> {
    match g {
        Given::None => None,
        Given::Same => Some(fence_of_a),
        Given::Other => Some(Fence::new(fence_of_a.get() + 1_000).unwrap()),
    }
}

/// The rules' own answer, with `a`'s lease (if any) holding fence 7.
fn by_the_rules(state: State, op: Op, who: &str) -> Verdict {
    let now = Utc::now();
    let fence_of_a = Fence::new(7).unwrap();
    let expires_at = match state {
        ExpiredA | DelayedA => now - TimeDelta::seconds(1),
        _ => now + TimeDelta::seconds(TTL),
    };
    let row = Current {
        owner: "a",
        fence: fence_of_a,
        expires_at,
        lock_delay: lock_delay(state),
    };
    let current = (!matches!(state, Absent)).then_some(&row);
    let who = owner(who);
    match op {
        Acquire => match decide::acquire(current, &who, now) {
            AcquireVerdict::Grant(how) => V::Granted(how),
            AcquireVerdict::Held => V::Held,
        },
        Renew(g) => match decide::renew(current, &who, given(g, fence_of_a), now) {
            Ok(()) => V::Renewed,
            Err(refusal) => renewed(refusal),
        },
        Release(g) => match decide::release(current, &who, given(g, fence_of_a), now) {
            Ok(()) => V::Released,
            Err(refusal) => released(refusal),
        },
    }
}

fn renewed(outcome: RenewOutcome) -> Verdict {
    match outcome {
        RenewOutcome::Renewed(_) => V::Renewed,
        RenewOutcome::NotFound => V::NotFound,
        RenewOutcome::Expired => V::Expired,
        RenewOutcome::OwnerMismatch => V::OwnerMismatch,
        RenewOutcome::StaleFence { .. } => V::StaleFence,
    }
}

fn released(outcome: ReleaseOutcome) -> Verdict {
    match outcome {
        ReleaseOutcome::Released { .. } => V::Released,
        ReleaseOutcome::NotFound => V::NotFound,
        ReleaseOutcome::NotOwner => V::NotOwner,
        ReleaseOutcome::StaleFence { .. } => V::StaleFence,
    }
}

fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(10))
}

fn acquisition(resource: &ResourceName, name: &str) -> AcquireRequest {
    AcquireRequest {
        resource: resource.clone(),
        owner: owner(name),
        ttl: ttl(),
        lock_delay: LockDelay::NONE,
        token: None,
        wait: Default::default(),
        ticket: None,
    }
}

/// Puts `resource` into `state`; returns the fence of `a`'s lease (1 when there is none).
async fn set_up(app: &TestApp, resource: &ResourceName, state: State) -> Fence {
    let store: &SharedStore = &app.store;
    let mut fence_of_a = Fence::new(1).unwrap();
    if !matches!(state, Absent) {
        let first = AcquireRequest {
            lock_delay: lock_delay(state),
            ..acquisition(resource, "a")
        };
        match store.acquire(&first, deadline()).await.unwrap() {
            AcquireOutcome::Acquired { lease, .. } => fence_of_a = lease.fence,
            other => panic!("setting up {resource}: {other:?}"),
        }
    }
    if matches!(state, ExpiredA | DelayedA) {
        app.db.age(resource.as_str(), 1_000).await;
    }
    fence_of_a
}

/// The store's answer to `op` by `who` on `resource`, set up with `fence_of_a`.
async fn by_the_store(
    store: &SharedStore,
    resource: &ResourceName,
    fence_of_a: Fence,
    op: Op,
    who: &str,
) -> Verdict {
    match op {
        Acquire => match store
            .acquire(&acquisition(resource, who), deadline())
            .await
            .unwrap()
        {
            AcquireOutcome::Acquired { how, .. } => V::Granted(how),
            AcquireOutcome::Held { .. } => V::Held,
            other => panic!("no quota was asked for: {other:?}"),
        },
        Renew(g) => {
            let request = RenewRequest {
                resource: resource.clone(),
                owner: owner(who),
                ttl: ttl(),
                fence: given(g, fence_of_a),
            };
            renewed(store.renew(&request, deadline()).await.unwrap())
        }
        Release(g) => {
            let request = ReleaseRequest {
                resource: resource.clone(),
                owner: owner(who),
                fence: given(g, fence_of_a),
            };
            released(store.release(&request, deadline()).await.unwrap())
        }
    }
}

/// Every case of the table, decided by the rules and by the store, gives the expected verdict:
/// each request decided alone (PostgreSQL: `--pg-batch-max 1`, every request a statement of its
/// own), then the whole table at once (PostgreSQL: decided together in full batches; SQLite: in
/// its batch transactions).
async fn the_store_decides_as_the_rules_do(kind: StoreKind) {
    let alone = TestApp::spawn_on(TestDb::new(kind).await, |s| s.pg_batch_max = 1).await;
    for (i, &(state, op, who, expected)) in CASES.iter().enumerate() {
        let case = format!("{state:?} {op:?} by {who}");
        assert_eq!(by_the_rules(state, op, who), expected, "rules: {case}");
        let resource = ResourceName::parse(&format!("case-{i}")).unwrap();
        let fence_of_a = set_up(&alone, &resource, state).await;
        assert_eq!(
            by_the_store(&alone.store, &resource, fence_of_a, op, who).await,
            expected,
            "store, alone: {case}"
        );
    }

    let together = TestApp::spawn(kind).await;
    let mut set = Vec::new();
    for (i, &(state, ..)) in CASES.iter().enumerate() {
        let resource = ResourceName::parse(&format!("case-{i}")).unwrap();
        let fence_of_a = set_up(&together, &resource, state).await;
        set.push((resource, fence_of_a));
    }
    let before = if kind == StoreKind::Postgres {
        batches(&together).await
    } else {
        (0.0, 0.0)
    };
    let store = &together.store;
    let verdicts = join_all(
        CASES
            .iter()
            .zip(&set)
            .map(|(&(_, op, who, _), (resource, fence))| {
                by_the_store(store, resource, *fence, op, who)
            }),
    )
    .await;
    for (&(state, op, who, expected), verdict) in CASES.iter().zip(verdicts) {
        assert_eq!(
            verdict, expected,
            "store, together: {state:?} {op:?} by {who}"
        );
    }
    if kind == StoreKind::Postgres {
        let after = batches(&together).await;
        let (requests, batches) = (after.0 - before.0, after.1 - before.1);
        assert_eq!(
            requests,
            CASES.len() as f64,
            "every request went through a batch"
        );
        assert!(
            batches * 4.0 <= requests,
            "{requests} requests in {batches} batches: not decided together"
        );
    }
}

/// The requests and the batches PostgreSQL's group commit has decided so far.
async fn batches(app: &TestApp) -> (f64, f64) {
    let metrics = app.metrics().await;
    (
        metrics.value("fencelock_store_batch_size_sum", &[]),
        metrics.value("fencelock_store_batch_size_count", &[]),
    )
}

contract!(the_store_decides_as_the_rules_do);
