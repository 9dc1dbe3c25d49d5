//! Validated domain types. Raw input becomes one of these exactly once, at the HTTP edge;
//! everything behind the edge (routes, stores) only ever sees values that keep the rules of
//! the contract.

pub mod decide;
mod fence;
#[cfg(feature = "fence-token")]
pub mod fence_token;
mod history;
mod lease;
mod listing;
mod lock_delay;
mod owner;
mod resource_name;
pub mod ttl;
pub mod wait;

pub use fence::{Fence, FenceError, MAX_FENCE};
#[cfg(feature = "fence-token")]
pub use fence_token::{FenceKey, FenceKeyError, FenceKeys};
pub use history::{HistoryLimit, HistoryRequest, LeaseEnd, LeaseHistory, PastLease, RecordedEnd};
pub use lease::{
    AcquireOutcome, AcquireRequest, Acquisition, Inspection, Lease, ReleaseOutcome, ReleaseRequest,
    RenewOutcome, RenewRequest, TokenQuota, time_left_ms,
};
pub use listing::{
    LeasePage, Limit, ListRequest, ListScope, ListedLease, NameRange, PageLimit, ResourcePrefix,
};
pub use lock_delay::{LockDelay, LockDelayError};
pub use owner::{Owner, OwnerError};
pub use resource_name::{ResourceName, ResourceNameError};
pub use ttl::{Ttl, TtlError};
pub use wait::{Ticket, WaitFor, WatchTimeout};
