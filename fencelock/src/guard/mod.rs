//! The write guard, for services that must not accept a write from a holder whose lease has
//! passed, nor from anyone who was never given the lease.
//!
//! A protected service keeps, per protected key, the highest fence it has accepted, and
//! checks it in the same transaction as the write:
//!
//! 1. [`FencingToken`] extracts the writer's `Fencing-Token` header as it is (missing:
//!    `428 fencing-token-required`). It is not a fence yet: what it may write to depends on
//!    the key of the write.
//! 2. [`Guard::check`] turns the token into a [`CheckedFence`] for the key the write is for.
//!    A guard with [`FenceKeys`] accepts only a token signed by one of them for that key
//!    (`<fence>.<signature>`, see [`crate::domain::fence_token`]): a forged token, a token of
//!    another key, or a bare fence is `403 invalid-fence-token`; what is no token at all
//!    (neither a fence nor a well-formed `<fence>.<signature>`) is `400`, as without keys. A
//!    guard without keys takes a bare fence (or the fence part of a signed token) as before
//!    (not a positive integer: `400`).
//! 3. In the transaction that writes, [`postgres::admit`] or [`sqlite::admit`] compares the
//!    checked fence with the highest accepted for its key and records it: `fence >= highest`
//!    is admitted, a lower fence is [`Admission::Stale`] and the caller writes nothing. On
//!    PostgreSQL this is the guard's SQL function, `fencelock_guard.admit` ([`sql`]), which
//!    services in any language call, and which checks the token again by the keys installed
//!    in the database.
//!
//! `admit` takes only a [`CheckedFence`], which only [`Guard::check`] makes, so a service
//! cannot reach the fence comparison without the signature check, nor check a token against
//! one key and write to another.
//!
//! Because the check holds the key's guard row locked until the transaction ends, no write
//! with a lower fence can slip in between the check and the commit.
//!
//! Every refusal is a [`GuardError`], the guard's own error type: an actix-web
//! `ResponseError` that answers with its RFC 9457 problem document (`428`, `400`, `403`,
//! `409` with `current_fence`, `503`, `500`), whether or not the service also wraps its
//! routes in [`crate::http::observe`] (which then adds the `instance` and `request_id`).
//!
//! The guard counts each decision in its [`GuardMetrics`]
//! (`fencelock_guard_writes_total{outcome="admitted"|"stale"|"invalid_token"}`), so every
//! service that uses the guard exposes how many late or unsigned writes it refused; serve
//! them with [`crate::http::metrics::expose`]. A header that is no token at all (`400`) is a
//! malformed request, not a decision, and is not counted.

#[cfg(feature = "guard-postgres")]
pub mod postgres;
pub mod sql;
#[cfg(feature = "guard-sqlite")]
pub mod sqlite;

mod error;

use std::future::{Ready, ready};

use actix_web::dev::Payload;
use actix_web::http::header::HeaderMap;
use actix_web::{FromRequest, HttpRequest};

use crate::domain::Fence;
use crate::domain::fence_token::{self, FenceKeys, TokenError};
use crate::metrics::label::Outcome;
use crate::metrics::{self, Registry};
pub use error::GuardError;

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
        for outcome in [Outcome::Admitted, Outcome::Stale, Outcome::InvalidToken] {
            writes.with_label_values(&[outcome.as_str()]);
        }
        Self { writes }
    }

    /// Counts one decision of `admit`.
    fn decided(&self, admission: Admission) -> Admission {
        let outcome = match admission {
            Admission::Admitted => Outcome::Admitted,
            Admission::Stale { .. } => Outcome::Stale,
        };
        self.writes.with_label_values(&[outcome.as_str()]).inc();
        admission
    }

    /// Counts one token refused by [`Guard::check`] (or the database's keys) as invalid: the
    /// `403`s, not the `400`s of what is no token at all.
    fn refused(&self) {
        self.writes
            .with_label_values(&[Outcome::InvalidToken.as_str()])
            .inc();
    }
}

/// The guard of one service: the keys whose tokens it accepts (none: bare fences), and
/// where it counts its decisions.
#[derive(Clone)]
pub struct Guard {
    keys: FenceKeys,
    metrics: GuardMetrics,
}

impl Guard {
    /// A guard that accepts tokens signed by `keys` (current first, then earlier ones kept
    /// for rotation); with no keys, bare fences.
    pub fn new(keys: FenceKeys, metrics: GuardMetrics) -> Self {
        Self { keys, metrics }
    }

    /// Where `admit` counts its decisions.
    pub fn metrics(&self) -> &GuardMetrics {
        &self.metrics
    }

    /// The fence `token` may write to `key` with, or why it may not: with keys, `403
    /// invalid-fence-token` (counted) for a bare fence or a token none of them signed for
    /// `key`; with or without keys, `400` (not counted) for what is no token at all. The SQL
    /// guard answers the same, by SQLSTATE ([`sql`]).
    pub fn check(&self, key: &str, token: &FencingToken) -> Result<CheckedFence, GuardError> {
        let fence = if self.keys.is_empty() {
            fence_token::unverified_fence(&token.0).ok_or_else(|| {
                invalid(&format!(
                    "{FENCING_TOKEN} must be a positive integer below 2^53 in plain decimal (no sign, no leading zero), got {:?}",
                    token.0
                ))
            })?
        } else {
            self.keys.verify(key, &token.0).map_err(|e| match e {
                TokenError::Malformed => invalid(&format!(
                    "{FENCING_TOKEN} must be the lease's fence_token, <fence>.<signature> (the fence a positive integer below 2^53 in plain decimal, the signature 43 characters of unpadded base64url), got {:?}",
                    token.0
                )),
                TokenError::BareFence | TokenError::Forged { .. } => {
                    self.metrics.refused();
                    GuardError::InvalidToken(format!(
                        "{FENCING_TOKEN} is refused for {key}: {e}"
                    ))
                }
            })?
        };
        Ok(CheckedFence {
            key: key.to_owned(),
            fence,
            token: token.0.clone(),
        })
    }
}

/// A fence the guard has accepted for a write to one key; only [`Guard::check`] makes one,
/// and `admit` takes nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedFence {
    key: String,
    fence: Fence,
    /// The token as sent, which the guard in the database checks again by its own keys.
    token: String,
}

impl CheckedFence {
    /// The key the write is for.
    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// The token the fence was read from, as the writer sent it.
    pub fn token(&self) -> &str {
        &self.token
    }
}

/// The `409 stale-fence` refusal of a write to `key`, which [`Admission::Stale`] reported.
pub fn stale_write(key: &str, current: Fence) -> GuardError {
    GuardError::Stale {
        key: key.to_owned(),
        current,
    }
}

/// The `Fencing-Token` header of a write, as sent: a bare fence or a signed token. Only
/// [`Guard::check`], told the key of the write, can turn it into a fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencingToken(String);

impl FencingToken {
    /// A token as a writer would send it (for services that read it from elsewhere, and
    /// tests).
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into().trim().to_owned())
    }

    /// The token as sent.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Reads the header: exactly one non-empty value of visible ASCII.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, GuardError> {
        let mut values = headers.get_all(FENCING_TOKEN);
        let Some(value) = values.next() else {
            return Err(GuardError::TokenRequired(format!(
                "send the fence_token (or, to a guard without keys, the fence) of your lease in the {FENCING_TOKEN} header"
            )));
        };
        if values.next().is_some() {
            return Err(invalid(&format!("{FENCING_TOKEN} is given more than once")));
        }
        let text = value.to_str().map(str::trim).unwrap_or_default();
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(&format!(
                "{FENCING_TOKEN} must be a fence or a fence token, got {:?}",
                String::from_utf8_lossy(value.as_bytes())
            )));
        }
        Ok(Self(text.to_owned()))
    }
}

fn invalid(detail: &str) -> GuardError {
    GuardError::NotAToken(detail.to_owned())
}

impl FromRequest for FencingToken {
    type Error = GuardError;
    type Future = Ready<Result<Self, GuardError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(Self::from_headers(req.headers()))
    }
}

#[cfg(test)]
mod tests {
    use actix_web::http::header::{HeaderName, HeaderValue};

    use super::*;
    use crate::domain::FenceKey;

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

    fn guard(keys: Vec<FenceKey>) -> Guard {
        Guard::new(
            FenceKeys::new(keys),
            GuardMetrics::register(&Registry::new()),
        )
    }

    fn token(value: &str) -> FencingToken {
        FencingToken::from_headers(&headers(&[value])).unwrap()
    }

    #[test]
    fn missing_header_is_428() {
        let err = FencingToken::from_headers(&headers(&[])).unwrap_err();
        assert_eq!(err.status().as_u16(), 428);
    }

    #[test]
    fn without_keys_only_positive_integers_below_2_pow_53_pass() {
        let guard = guard(vec![]);
        let fence = |text| guard.check("k", &token(text)).map(|c| c.fence().get());
        assert_eq!(fence("42").unwrap(), 42);
        assert_eq!(fence(" 7 ").unwrap(), 7);
        for bad in [
            "0",
            "-1",
            "+1",
            "1.5",
            "1e3",
            "abc",
            "9007199254740992",
            "99999999999999999999",
        ] {
            let err = fence(bad).unwrap_err();
            assert_eq!(err.status().as_u16(), 400, "{bad:?}");
        }
        let empty = FencingToken::from_headers(&headers(&[""])).unwrap_err();
        assert_eq!(empty.status().as_u16(), 400);
        let twice = FencingToken::from_headers(&headers(&["1", "2"])).unwrap_err();
        assert_eq!(twice.status().as_u16(), 400);
    }

    #[test]
    fn with_keys_only_a_token_signed_for_the_key_passes() {
        let key = FenceKey::from_bytes(vec![3; 32]).unwrap();
        let guard = guard(vec![key.clone()]);
        let fence = Fence::new(9).unwrap();
        let checked = guard.check("k", &token(&key.sign("k", fence))).unwrap();
        assert_eq!((checked.key(), checked.fence()), ("k", fence));
        let signed = key.sign("k", fence);
        let signature = signed.split_once('.').unwrap().1;
        for refused in [
            key.sign("other", fence),
            "9".to_owned(),
            "9007199254740991".to_owned(),
            FenceKey::from_bytes(vec![4; 32]).unwrap().sign("k", fence),
            format!("10.{signature}"),
        ] {
            let err = guard.check("k", &token(&refused)).unwrap_err();
            assert_eq!(
                (err.status(), err.kind()),
                (
                    actix_web::http::StatusCode::FORBIDDEN,
                    "invalid-fence-token"
                ),
                "{refused:?}"
            );
        }
        let refusals = || {
            guard
                .metrics()
                .writes
                .with_label_values(&[Outcome::InvalidToken.as_str()])
                .get()
        };
        assert_eq!(refusals(), 5);

        // What is no token at all is a malformed request, as without keys, and not counted.
        for malformed in [
            "garbage".to_owned(),
            "0".to_owned(),
            "09".to_owned(),
            "9007199254740992".to_owned(),
            "9.".to_owned(),
            "9.AAAA".to_owned(),
            format!("0{signed}"),
            format!("+{signed}"),
            format!("{signed}A"),
            format!("{signed}.{signature}"),
        ] {
            let err = guard.check("k", &token(&malformed)).unwrap_err();
            assert!(matches!(err, GuardError::NotAToken(_)), "{malformed:?}");
            assert_eq!(
                (err.status().as_u16(), err.kind()),
                (400, "malformed-request"),
                "{malformed:?}"
            );
        }
        assert_eq!(refusals(), 5);
    }
}
