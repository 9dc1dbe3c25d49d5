//! The in-process wake registry: which resources someone in this process waits on (a waiting
//! acquisition, a watch), and a way for the store to say "this resource may have changed".
//!
//! The store feeds it: in-process after each commit that changes a lease or a queue, and from
//! outside the process (the PostgreSQL store's LISTEN connection, the SQLite store's poll of
//! the file). A wake-up only says "look again": a subscriber re-reads the store, so a spurious
//! wake-up costs one read and a missed one is covered by the subscriber's own timer (the
//! lease's expiry, its wait deadline). When the announcements may have been missed (a
//! reconnect), everyone is woken.
//!
//! Here: the registry ([`Changes`], and a subscriber's [`Subscription`]), and what a store's
//! watch hands back ([`Watching`], [`Registration`]). Beside it: [`lines`], the waiters of
//! this process in ticket order, and [`seen`], how far a look at the store accounts for
//! (made by a subscription, passed on along a line). It knows no store: the stores, the
//! waiting loop and the watch route stand on it.

mod by_resource;
mod lines;
mod looks;
mod seen;

use std::sync::Arc;

use futures_util::FutureExt as _;
use tokio::sync::watch;

use by_resource::ByResource;
use fencelock::domain::ResourceName;
pub(crate) use lines::{Handoff, Lines};
pub(crate) use looks::{Answer, Look, Need};
pub(crate) use seen::Seen;

/// Who waits on which resource in this process.
#[derive(Default)]
pub struct Changes {
    /// One channel per resource someone subscribes to, with the count of its subscribers;
    /// removed with the last one, so the map holds only what is waited on now. A std mutex:
    /// held for a map lookup only, never across an `.await`.
    resources: ByResource<Entry>,
    /// The waiters of this process in ticket order, so that only the first of a resource
    /// listens here (see [`Lines`]). Kept with the store's wake registry because tickets
    /// are the store's: two stores in one process have lines of their own.
    lines: Arc<Lines>,
}

struct Entry {
    /// How many changes were announced since the entry was made.
    wake: watch::Sender<u64>,
    subscribers: usize,
    /// The newest look at the resource a subscriber made to share ([`Changes::look`]).
    latest: Option<looks::Latest>,
}

impl Changes {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Starts listening for changes of `resource`. Call [`Subscription::mark_seen`] before
    /// each look at the store: a change announced after it ends the next
    /// [`Subscription::changed`], so none falls between the look and the wait.
    pub fn subscribe(self: &Arc<Self>, resource: &ResourceName) -> Subscription {
        let mut resources = self.resources.lock();
        let entry = resources
            .entry(resource.as_str().to_owned())
            .or_insert_with(|| Entry {
                wake: watch::Sender::new(0),
                subscribers: 0,
                latest: None,
            });
        entry.subscribers += 1;
        let wake = entry.wake.subscribe();
        let seen = *wake.borrow();
        Subscription {
            changes: self.clone(),
            resource: resource.as_str().to_owned(),
            wake,
            seen,
        }
    }

    /// `resource` may have changed: its subscribers look again.
    pub fn changed(&self, resource: &str) {
        if let Some(entry) = self.resources.lock().get(resource) {
            entry.wake.send_modify(|count| *count += 1);
        }
    }

    /// A look at `resource` that accounts for `need`: the newest one made here if it does,
    /// else the one `start` makes, which later subscribers may share in turn. Unshared
    /// when nobody subscribes to the resource.
    pub(crate) fn look(
        &self,
        resource: &str,
        need: Need,
        start: impl FnOnce() -> futures_util::future::BoxFuture<'static, Answer>,
    ) -> Look {
        let mut resources = self.resources.lock();
        let Some(entry) = resources.get_mut(resource) else {
            return start().shared();
        };
        if let Some(look) = entry.latest.as_ref().and_then(|l| l.serving(need)) {
            return look;
        }
        let started = std::time::Instant::now();
        let look = start().shared();
        entry.latest = Some(looks::Latest::new(need, started, look.clone()));
        look
    }

    /// Anything may have changed (announcements may have been lost): everyone looks again.
    pub fn all_changed(&self) {
        for entry in self.resources.lock().values() {
            entry.wake.send_modify(|count| *count += 1);
        }
    }

    /// This process's waiting acquisitions, per resource in ticket order.
    pub fn lines(&self) -> &Arc<Lines> {
        &self.lines
    }

    /// The resources someone waits on now.
    pub fn watched(&self) -> Vec<String> {
        self.resources.lock().keys().cloned().collect()
    }
}

/// One subscriber's interest in one resource; dropping it ends the interest.
pub struct Subscription {
    changes: Arc<Changes>,
    resource: String,
    wake: watch::Receiver<u64>,
    /// The announcements accounted for.
    seen: u64,
}

impl Subscription {
    /// Everything announced so far has been seen: the caller is about to look at the store.
    pub fn mark_seen(&mut self) -> Seen {
        self.seen = *self.wake.borrow_and_update();
        Seen(self.seen)
    }

    /// What another subscriber's look accounted for counts as seen here too: a waiter
    /// takes over what the one before it in line learned (see [`crate::waiting`]).
    pub fn mark_seen_through(&mut self, seen: Seen) {
        self.seen = self.seen.max(seen.0);
    }

    /// Returns once a change is announced after what was marked seen.
    pub async fn changed(&mut self) {
        let seen = self.seen;
        if self.wake.wait_for(|count| *count > seen).await.is_err() {
            // The sender lives as long as a subscriber does; this is unreachable, but never
            // spin on it.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut resources = self.changes.resources.lock();
        if let Some(entry) = resources.get_mut(&self.resource) {
            entry.subscribers -= 1;
            if entry.subscribers == 0 {
                resources.remove(&self.resource);
            }
        }
    }
}

/// A watch started with [`crate::store::LeaseStore::watch`]: the lease as it was then, and
/// the registration that keeps its changes announced.
pub struct Watching {
    pub lease: Option<fencelock::domain::Lease>,
    /// Ends the registration when dropped; keep it for as long as the watch runs.
    pub registration: Registration,
}

/// A store's registration of interest in a resource, ended when dropped.
#[must_use = "the registration ends when dropped"]
pub struct Registration(Option<Box<dyn FnOnce() + Send + Sync>>);

impl Registration {
    /// Calls `end` when dropped.
    pub fn new(end: impl FnOnce() + Send + Sync + 'static) -> Self {
        Self(Some(Box::new(end)))
    }

    /// Nothing to end: the store announces every change anyway.
    pub fn none() -> Self {
        Self(None)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(end) = self.0.take() {
            end();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A resource name for the wake tests, here and in the submodules.
    pub(super) fn name(text: &str) -> ResourceName {
        ResourceName::parse(text).unwrap()
    }

    #[tokio::test]
    async fn what_another_subscriber_saw_counts_as_seen() {
        let changes = Changes::new();
        let mut before = changes.subscribe(&name("a"));
        let mut next = changes.subscribe(&name("a"));
        changes.changed("a");
        let seen = before.mark_seen();
        next.mark_seen_through(seen);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), next.changed())
                .await
                .is_err(),
            "woken by a change the other had seen"
        );
        changes.changed("a");
        tokio::time::timeout(Duration::from_secs(1), next.changed())
            .await
            .expect("a later change wakes");
    }

    #[tokio::test]
    async fn a_change_after_mark_seen_is_never_lost() {
        let changes = Changes::new();
        let mut sub = changes.subscribe(&name("a"));
        sub.mark_seen();
        changes.changed("b");
        changes.changed("a");
        tokio::time::timeout(Duration::from_secs(1), sub.changed())
            .await
            .expect("woken");
        sub.mark_seen();
        assert!(
            tokio::time::timeout(Duration::from_millis(20), sub.changed())
                .await
                .is_err()
        );
        changes.all_changed();
        tokio::time::timeout(Duration::from_secs(1), sub.changed())
            .await
            .expect("woken by all");
    }

    #[test]
    fn the_registry_holds_only_what_is_waited_on() {
        let changes = Changes::new();
        let one = changes.subscribe(&name("a"));
        let two = changes.subscribe(&name("a"));
        assert_eq!(changes.watched(), ["a"]);
        drop(one);
        assert_eq!(changes.watched(), ["a"]);
        drop(two);
        assert!(changes.watched().is_empty());
    }
}
