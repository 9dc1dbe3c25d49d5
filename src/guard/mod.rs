//! The write guard, for services that must not accept a write from a holder whose lease has
//! passed.
//!
//! A protected service keeps, per protected key, the highest fence it has accepted, and
//! checks it in the same transaction as the write:
//!
//! 1. [`FencingToken`] extracts the writer's fence from the `Fencing-Token` header
//!    (missing: `428 fencing-token-required`; not a positive integer: `400`).
//! 2. In the transaction that writes, [`postgres::admit`] or [`sqlite::admit`] compares the
//!    fence with the highest accepted for the key and records it: `fence >= highest` is
//!    admitted, a lower fence is [`Admission::Stale`] and the caller writes nothing.
//!
//! Because the check holds the key's guard row locked until the transaction ends, no write
//! with a lower fence can slip in between the check and the commit.
//!
//! `admit` counts each decision in the [`GuardMetrics`] it is given
//! (`fencelock_guard_writes_total{outcome="admitted"|"stale"}`), so every service that uses
//! the guard exposes how many late writes it refused; serve them with
//! [`crate::http::metrics::expose`].

#[cfg(feature = "guard-postgres")]
pub mod postgres;
#[cfg(feature = "guard-sqlite")]
pub mod sqlite;

use std::future::{Ready, ready};

use actix_web::dev::Payload;
use actix_web::http::header::HeaderMap;
use actix_web::{FromRequest, HttpRequest};

use crate::domain::Fence;
use crate::http::ApiError;
use crate::metrics::{self, Registry, label};

/// The header a writer sends its fence in.
pub const FENCING_TOKEN: &str = "Fencing-Token";

/// The answer of the guard for one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The fence is at least the highest accepted so far, and is now the highest: write.
    Admitted,
    /// A greater fence has written already: the writer's lease has passed. Write nothing.
    Stale { current: Fence },
}

/// What the guard counts, in the registry of the service that uses it.
#[derive(Clone)]
pub struct GuardMetrics {
    writes: prometheus::IntCounterVec,
}

impl GuardMetrics {
    pub fn register(registry: &Registry) -> Self {
        let writes = metrics::counter(registry, &metrics::GUARD_WRITES);
        for outcome in [label::outcome::ADMITTED, label::outcome::STALE] {
            writes.with_label_values(&[outcome]);
        }
        Self { writes }
    }

    /// Counts one decision of `admit`.
    fn decided(&self, admission: Admission) -> Admission {
        let outcome = match admission {
            Admission::Admitted => label::outcome::ADMITTED,
            Admission::Stale { .. } => label::outcome::STALE,
        };
        self.writes.with_label_values(&[outcome]).inc();
        admission
    }
}

/// The `409 stale-fence` problem for a write to `key` refused by the guard.
pub fn stale_write(key: &str, current: Fence) -> ApiError {
    ApiError::StaleFence {
        detail: format!(
            "a write with fence {current} has been accepted for {key}; this writer's lease has passed"
        ),
        current_fence: Some(current),
    }
}

/// The fence of a write, from its `Fencing-Token` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencingToken(pub Fence);

impl FencingToken {
    /// Reads the header: exactly one value of ASCII digits, a fence in `1..2^53`.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, ApiError> {
        let mut values = headers.get_all(FENCING_TOKEN);
        let Some(value) = values.next() else {
            return Err(ApiError::FencingTokenRequired(format!(
                "send the fence of your lease in the {FENCING_TOKEN} header"
            )));
        };
        if values.next().is_some() {
            return Err(invalid(&format!("{FENCING_TOKEN} is given more than once")));
        }
        let text = value.to_str().map(str::trim).unwrap_or_default();
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid(&format!(
                "{FENCING_TOKEN} must be a positive integer, got {text:?}"
            )));
        }
        text.parse::<i64>()
            .ok()
            .and_then(|n| Fence::new(n).ok())
            .map(Self)
            .ok_or_else(|| {
                invalid(&format!(
                    "{FENCING_TOKEN} must be a positive integer below 2^53, got {text}"
                ))
            })
    }
}

fn invalid(detail: &str) -> ApiError {
    ApiError::Malformed(detail.to_owned())
}

impl FromRequest for FencingToken {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(Self::from_headers(req.headers()))
    }
}

#[cfg(test)]
mod tests {
    use actix_web::http::header::{HeaderName, HeaderValue};

    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(
                HeaderName::from_static("fencing-token"),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    #[test]
    fn missing_header_is_428() {
        let err = FencingToken::from_headers(&headers(&[])).unwrap_err();
        assert_eq!(err.status_and_type().0.as_u16(), 428);
    }

    #[test]
    fn only_positive_integers_below_2_pow_53_pass() {
        assert_eq!(
            FencingToken::from_headers(&headers(&["42"]))
                .unwrap()
                .0
                .get(),
            42
        );
        assert_eq!(
            FencingToken::from_headers(&headers(&[" 7 "]))
                .unwrap()
                .0
                .get(),
            7
        );
        for bad in [
            "",
            "0",
            "-1",
            "+1",
            "1.5",
            "1e3",
            "abc",
            "9007199254740992",
            "99999999999999999999",
        ] {
            let err = FencingToken::from_headers(&headers(&[bad])).unwrap_err();
            assert_eq!(err.status_and_type().0.as_u16(), 400, "{bad:?}");
        }
        let twice = FencingToken::from_headers(&headers(&["1", "2"])).unwrap_err();
        assert_eq!(twice.status_and_type().0.as_u16(), 400);
    }
}
