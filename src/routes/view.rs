//! The lease views the handlers share: the lock object (a lease as clients see it, with the
//! times every lock object shows alike) and the timestamp format of every answer. Below the
//! handlers, as [`super::wire`] is.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use utoipa::openapi::RefOr;

use fencelock::domain::{Fence, FenceKey, Lease, time_left_ms};

/// Declares a lock object: its own fields, then the lease's times, which every lock object
/// shows alike (the same names, descriptions and formats, from the store's clock).
macro_rules! lock_object {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident<'a> { $($(#[$field_meta:meta])* $field:ident: $ty:ty,)* }
    ) => {
        $(#[$meta])*
        $vis struct $name<'a> {
            $($(#[$field_meta])* $field: $ty,)*
            /// RFC 3339 UTC, millisecond precision.
            #[schema(format = DateTime)]
            acquired_at: String,
            /// RFC 3339 UTC, millisecond precision; the lease is expired when now >= `expires_at`.
            #[schema(format = DateTime)]
            expires_at: String,
            /// Time left, measured by the store's clock when the answer was made.
            #[schema(minimum = 0)]
            expires_in_ms: i64,
        }
    };
}
pub(super) use lock_object;

lock_object! {
    /// A lease as clients see it. `owner` is shown only to the request that presented it. The
    /// `fence_token`, like the fence it signs, is part of every lock object (API.md, *Signed
    /// fences*): it proves which fence the lease server issued for which resource.
    #[derive(Serialize, utoipa::ToSchema)]
    #[serde(deny_unknown_fields)]
    #[schema(as = Lock)]
    pub(super) struct LockView<'a> {
        /// The locked resource.
        resource: &'a str,
        /// The holder's owner token, shown only to the request that presented it.
        #[serde(skip_serializing_if = "Option::is_none")]
        #[schema(value_type = String, required = true)]
        owner: Option<&'a str>,
        /// The lease's fencing token: greater than every fence issued before it.
        #[schema(value_type = i64, minimum = 1, maximum = 9_007_199_254_740_991_i64)]
        fence: Fence,
        /// Only when the server has a fence key: `<fence>.<signature>`, the fence signed for
        /// this resource. Send it as `Fencing-Token` to guards that hold the same key; they
        /// refuse bare fences.
        #[serde(skip_serializing_if = "Option::is_none")]
        #[schema(value_type = String, required = false, pattern = r"^[1-9][0-9]*\.[A-Za-z0-9_-]{43}$")]
        fence_token: Option<String>,
    }
}

impl<'a> LockView<'a> {
    /// The holder's view: with its owner, and its `fence_token` when `key` signs fences.
    pub(super) fn with_owner(lease: &'a Lease, key: Option<&FenceKey>) -> Self {
        Self {
            owner: Some(lease.owner.as_str()),
            ..Self::without_owner(lease, key)
        }
    }

    /// Anyone's view: no owner.
    pub(super) fn without_owner(lease: &'a Lease, key: Option<&FenceKey>) -> Self {
        Self {
            resource: lease.resource.as_str(),
            owner: None,
            fence: lease.fence,
            fence_token: key.map(|key| key.sign(lease.resource.as_str(), lease.fence)),
            acquired_at: rfc3339_millis(lease.acquired_at),
            expires_at: rfc3339_millis(lease.expires_at),
            expires_in_ms: time_left_ms(lease.expires_at, lease.observed_at),
        }
    }
}

pub(super) fn rfc3339_millis(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The live lease as inspect shows it: a lock without its `owner`, which only the holder
/// sees.
pub(super) struct LiveLease;

impl utoipa::PartialSchema for LiveLease {
    fn schema() -> RefOr<utoipa::openapi::schema::Schema> {
        let mut schema = <LockView<'_> as utoipa::PartialSchema>::schema();
        if let RefOr::T(utoipa::openapi::schema::Schema::Object(object)) = &mut schema {
            object.properties.remove("owner");
            object.required.retain(|field| field != "owner");
        }
        schema
    }
}

impl utoipa::ToSchema for LiveLease {}
