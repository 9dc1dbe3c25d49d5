//! The worker client (see issue 4): acquire, renew, release, inspect, retry, `Lease`.
