//! One look at the store, shared by the subscribers of a resource that need the same one.
//!
//! A release wakes every watch of its resource at once, and each would read the same row: a
//! thousand watches, a thousand reads queued behind one another before the last one answers.
//! A look accounts for the announcements its maker had seen and for the moment it started, so
//! a subscriber that needs no more than that takes its answer instead of reading again.

use std::time::Instant;

use futures_util::future::{BoxFuture, Shared};

use super::Seen;
use fencelock::domain::Lease;

/// A look's answer: the live lease, if any, and when the answer came (so that every watch
/// sharing it arms the same timer on the lease's expiry, and shares the look at it too);
/// `None` when the look failed (its error is its maker's to report: a subscriber that shared
/// it looks on its own).
pub(crate) type Answer = Option<(Option<Lease>, Instant)>;

/// A look under way or done, awaited by everyone it serves.
pub(crate) type Look = Shared<BoxFuture<'static, Answer>>;

/// What a look must account for to serve a subscriber: every announcement the subscriber has
/// seen, and a moment it must have started after (the lease's expiry, for a subscriber woken
/// by its timer rather than by an announcement).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Need {
    pub(crate) seen: Seen,
    pub(crate) after: Instant,
}

/// The newest look at a resource, kept with its registry entry.
pub(super) struct Latest {
    /// What its maker had seen; the look began after that.
    seen: u64,
    /// Taken before the look was made: it began no earlier.
    started: Instant,
    look: Look,
}

impl Latest {
    pub(super) fn new(need: Need, started: Instant, look: Look) -> Self {
        Self {
            seen: need.seen.0,
            started,
            look,
        }
    }

    /// The look, if it accounts for `need`.
    pub(super) fn serving(&self, need: Need) -> Option<Look> {
        (self.seen >= need.seen.0 && self.started >= need.after).then(|| self.look.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use futures_util::FutureExt as _;

    use super::super::Changes;
    use super::super::tests::name;
    use super::*;

    fn counting(reads: &Arc<AtomicUsize>) -> impl FnOnce() -> BoxFuture<'static, Answer> {
        let reads = reads.clone();
        move || {
            async move {
                reads.fetch_add(1, Ordering::SeqCst);
                Some((None, Instant::now()))
            }
            .boxed()
        }
    }

    #[tokio::test]
    async fn subscribers_woken_by_one_announcement_share_one_look() {
        let changes = Changes::new();
        let mut subs: Vec<_> = (0..100).map(|_| changes.subscribe(&name("a"))).collect();
        changes.changed("a");
        let reads = Arc::new(AtomicUsize::new(0));
        let after = Instant::now() - Duration::from_secs(1);
        for sub in &mut subs {
            let need = Need {
                seen: sub.mark_seen(),
                after,
            };
            changes.look("a", need, counting(&reads)).await;
        }
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_later_announcement_or_moment_needs_a_new_look() {
        let changes = Changes::new();
        let mut sub = changes.subscribe(&name("a"));
        let reads = Arc::new(AtomicUsize::new(0));
        let first = Need {
            seen: sub.mark_seen(),
            after: Instant::now(),
        };
        changes.look("a", first, counting(&reads)).await;
        changes.changed("a");
        let announced = Need {
            seen: sub.mark_seen(),
            after: first.after,
        };
        changes.look("a", announced, counting(&reads)).await;
        assert_eq!(reads.load(Ordering::SeqCst), 2, "an announcement since");
        let later = Need {
            seen: announced.seen,
            after: Instant::now() + Duration::from_millis(1),
        };
        tokio::time::sleep(Duration::from_millis(2)).await;
        changes.look("a", later, counting(&reads)).await;
        assert_eq!(
            reads.load(Ordering::SeqCst),
            3,
            "a moment after the last look"
        );
        changes.look("a", later, counting(&reads)).await;
        assert_eq!(reads.load(Ordering::SeqCst), 3, "the same need again");
    }
}
