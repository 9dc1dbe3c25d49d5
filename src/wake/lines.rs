//! The line of this process's waiters of one resource, in ticket order.
//!
//! Only the store's head of the queue can be granted a resource, and the head among this
//! process's waiters (the one with the smallest ticket) is the only one here that can be it.
//! So only that one listens for changes and makes attempts; the others sleep on a wake-up of
//! their own until they come first. Without this, every change of a resource woke every one of
//! its waiters into a store transaction of which all but one were bound to lose (a thundering
//! herd that made waiting slower than polling).
//!
//! One exception: a waiter whose owner holds the lease re-acquires it wherever it stands in the
//! queue (waiting applies only while another owner holds it). So a waiter that leaves with the
//! lease wakes the waiters of its owner behind it, first or not, to attempt at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::by_resource::ByResource;
use super::seen::Seen;
use fencelock::domain::{Lease, Owner, ResourceName, Ticket, time_left_ms};

/// This process's waiters, per resource, by ticket. A std mutex: held for a map operation
/// only, never across an `.await`.
#[derive(Default)]
pub struct Lines {
    resources: ByResource<Line>,
}

#[derive(Default)]
struct Line {
    waiters: BTreeMap<Ticket, Waiter>,
    /// Left by a first waiter that leaves with the lease, for the one after it.
    handoff: Option<Handoff>,
}

struct Waiter {
    owner: Owner,
    /// Woken when the waiter may attempt: it came first, or its owner got the lease.
    turn: Arc<Notify>,
    /// A waiter of the same owner left with the lease since the waiter last looked: it can
    /// re-acquire the lease at once, wherever it stands in line.
    owner_holds: bool,
}

/// What a waiter that was granted the resource passes on to the next in line: the lease is
/// its own until `held_until` (by this process's clock), as of a look at the store that
/// accounted for every change announced up to `seen`. The next waiter need not look again
/// before a later change or that time: it would find the lease held (unless it waits for the
/// same owner: it is woken to re-acquire instead, see [`Place::take_owner_holds`]).
#[derive(Clone, Copy, Debug)]
pub struct Handoff {
    pub seen: Seen,
    pub held_until: Instant,
}

impl Handoff {
    /// From a waiter that won `lease` in a look made after `seen`.
    pub fn holding(seen: Seen, lease: &Lease) -> Self {
        let left = time_left_ms(lease.expires_at, lease.observed_at);
        Self {
            seen,
            held_until: Instant::now()
                + Duration::from_millis(u64::try_from(left).unwrap_or_default()),
        }
    }
}

impl Lines {
    /// The tickets of every waiter of this process now, of every resource: the waiters that
    /// are alive, whose tickets the store's heartbeat keeps (see [`crate::store::LeaseStore::beat`]).
    /// A waiter is in its line from its ticket's issue until it has left the store's queue
    /// or given up leaving it, so a ticket it could not delete stops being kept.
    pub fn tickets(&self) -> Vec<Ticket> {
        self.resources
            .lock()
            .values()
            .flat_map(|line| line.waiters.keys().copied())
            .collect()
    }

    /// Takes the place of `ticket` (issued by the store for a request of `owner`) in the line
    /// of `resource`. Dropping the place leaves the line and wakes whoever comes first then.
    pub fn join(self: &Arc<Self>, resource: &ResourceName, ticket: Ticket, owner: &Owner) -> Place {
        let turn = Arc::new(Notify::new());
        let waiter = Waiter {
            owner: owner.clone(),
            turn: turn.clone(),
            owner_holds: false,
        };
        self.resources
            .lock()
            .entry(resource.as_str().to_owned())
            .or_default()
            .waiters
            .insert(ticket, waiter);
        Place {
            lines: self.clone(),
            resource: resource.as_str().to_owned(),
            ticket,
            turn,
            granted: false,
            handoff: None,
        }
    }
}

/// One waiter's place in its resource's line. A guard: however the waiter ends (a grant, a
/// timeout, a gone client, a cancelled or panicking task), its drop hands the turn on, so the
/// line is never stranded behind a waiter that is no more.
pub struct Place {
    lines: Arc<Lines>,
    resource: String,
    ticket: Ticket,
    turn: Arc<Notify>,
    /// Whether the waiter leaves with the lease: its owner's other waiters are woken.
    granted: bool,
    /// Passed on to the next waiter when this one leaves.
    handoff: Option<Handoff>,
}

impl Place {
    /// Whether this waiter has the smallest ticket of its resource in this process.
    pub fn is_first(&self) -> bool {
        self.lines
            .resources
            .lock()
            .get(&self.resource)
            .and_then(|line| line.waiters.keys().next())
            == Some(&self.ticket)
    }

    /// Leaves the line with the lease: the waiters of the same owner are woken to re-acquire
    /// it ([`Place::take_owner_holds`]), and the next waiter learns what [`Handoff`] says
    /// (without one, it looks at once).
    pub fn leave_granted(mut self, handoff: Option<Handoff>) {
        self.granted = true;
        self.handoff = handoff;
    }

    /// Whether a waiter of the same owner left with the lease since the last call: this one
    /// can re-acquire it now, first in line or not. Once per such departure.
    pub fn take_owner_holds(&self) -> bool {
        let mut resources = self.lines.resources.lock();
        resources
            .get_mut(&self.resource)
            .and_then(|line| line.waiters.get_mut(&self.ticket))
            .is_some_and(|waiter| std::mem::take(&mut waiter.owner_holds))
    }

    /// What the waiter before this one left, if it left with the lease; once, and only for
    /// the first waiter.
    pub fn take_handoff(&self) -> Option<Handoff> {
        let mut resources = self.lines.resources.lock();
        let line = resources.get_mut(&self.resource)?;
        if line.waiters.keys().next() != Some(&self.ticket) {
            return None;
        }
        line.handoff.take()
    }

    /// Returns once the waiter before this one has left the line, or one of its owner left
    /// with the lease (at once if that happened since the last call: the wake-up is kept until
    /// it is awaited, so none is lost between a look at [`Place::is_first`] and this wait). It
    /// may return spuriously: check again.
    pub async fn turn(&self) {
        self.turn.notified().await;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut resources = self.lines.resources.lock();
        let Some(line) = resources.get_mut(&self.resource) else {
            return;
        };
        let was_first = line.waiters.keys().next() == Some(&self.ticket);
        let Some(left) = line.waiters.remove(&self.ticket) else {
            return;
        };
        if was_first {
            // A first waiter leaving without the lease makes an earlier handoff stale.
            line.handoff = self.handoff.take();
        }
        if self.granted {
            // Its owner holds the lease now: the owner's other waiters re-acquire it.
            for waiter in line.waiters.values_mut() {
                if waiter.owner == left.owner {
                    waiter.owner_holds = true;
                    waiter.turn.notify_one();
                }
            }
        }
        match line.waiters.values().next() {
            None => {
                resources.remove(&self.resource);
            }
            Some(next) if was_first => next.turn.notify_one(),
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::wake::tests::name;

    #[tokio::test]
    async fn the_smallest_ticket_is_first_and_hands_on_when_it_leaves() {
        let lines = Arc::new(Lines::default());
        let late = lines.join(&name("a"), Ticket::new(7), &owner("w"));
        let early = lines.join(&name("a"), Ticket::new(3), &owner("w"));
        let other = lines.join(&name("b"), Ticket::new(9), &owner("w"));
        assert!(early.is_first() && !late.is_first() && other.is_first());
        drop(early);
        assert!(late.is_first());
        // The wake-up was kept although nobody awaited it yet.
        tokio::time::timeout(Duration::from_secs(1), late.turn())
            .await
            .expect("woken when the one before left");
        assert_eq!(lines.tickets().len(), 2, "the waiters still in line");
        drop(late);
        drop(other);
        assert!(lines.tickets().is_empty());
        assert!(
            lines.resources.lock().is_empty(),
            "the registry holds only waiters"
        );
    }

    fn owner(text: &str) -> Owner {
        Owner::parse(text).unwrap()
    }

    /// Three waiters of `a`, of three owners, joined in ticket order.
    fn three_waiters(lines: &Arc<Lines>) -> [Place; 3] {
        [(1, "u"), (2, "v"), (3, "w")]
            .map(|(ticket, who)| lines.join(&name("a"), Ticket::new(ticket), &owner(who)))
    }

    fn handoff() -> Handoff {
        let changes = crate::wake::Changes::new();
        Handoff {
            seen: changes.subscribe(&name("a")).mark_seen(),
            held_until: std::time::Instant::now(),
        }
    }

    #[test]
    fn a_handoff_goes_to_the_next_first_waiter_once() {
        let lines = Arc::new(Lines::default());
        let [first, second, third] = three_waiters(&lines);
        first.leave_granted(Some(handoff()));
        assert!(third.take_handoff().is_none(), "not first");
        assert!(second.take_handoff().is_some());
        assert!(second.take_handoff().is_none(), "taken once");
    }

    #[test]
    fn a_first_waiter_leaving_without_the_lease_drops_the_handoff() {
        let lines = Arc::new(Lines::default());
        let [first, second, third] = three_waiters(&lines);
        first.leave_granted(Some(handoff()));
        drop(second);
        assert!(third.take_handoff().is_none(), "stale");
    }

    #[tokio::test]
    async fn leaving_from_behind_wakes_nobody() {
        let lines = Arc::new(Lines::default());
        let [first, second, third] = three_waiters(&lines);
        drop(second);
        assert!(first.is_first() && !third.is_first());
        assert!(
            tokio::time::timeout(Duration::from_millis(20), third.turn())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_waiter_leaving_with_the_lease_wakes_the_waiters_of_its_owner() {
        let lines = Arc::new(Lines::default());
        let [granted, other, same] = [(1, "w"), (2, "x"), (3, "w")]
            .map(|(ticket, who)| lines.join(&name("a"), Ticket::new(ticket), &owner(who)));
        granted.leave_granted(Some(handoff()));
        assert!(other.is_first() && !same.is_first());
        tokio::time::timeout(Duration::from_secs(1), same.turn())
            .await
            .expect("the owner's waiter is woken, first or not");
        assert!(same.take_owner_holds(), "told its owner holds the lease");
        assert!(!same.take_owner_holds(), "once");
        assert!(!other.take_owner_holds(), "another owner's waiter waits");
        assert!(
            other.take_handoff().is_some(),
            "and learns the lease is held"
        );
        drop(other);
        drop(same);
        assert!(lines.resources.lock().is_empty());
    }

    #[test]
    fn leaving_without_the_lease_tells_nobody_that_its_owner_holds_it() {
        let lines = Arc::new(Lines::default());
        let [first, second] =
            [1, 2].map(|ticket| lines.join(&name("a"), Ticket::new(ticket), &owner("w")));
        drop(first);
        assert!(second.is_first() && !second.take_owner_holds());
    }
}
