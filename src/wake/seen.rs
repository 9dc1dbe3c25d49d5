//! How far a look at the store accounts for a resource's announcements: a leaf of
//! [`crate::wake`], made by the registry and passed on along the waiting lines.

/// How far a look at the store accounts for a resource's announcements: a look made after
/// [`super::Subscription::mark_seen`] returned it reflects every change announced up to
/// there. Valid for the subscriptions of the resource that are alive at the same time.
#[derive(Clone, Copy, Debug)]
pub struct Seen(pub(super) u64);
