//! The server's answers turned into results: the one place where HTTP statuses and problem
//! types become [`Error`] variants. Pure functions of (status, body), so they are unit-tested
//! without a server.

use std::time::Duration;

use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::Value;

use super::error::{Error, LossReason};
use super::{LockInfo, LockPage, LockView};

/// Longest slice of a non-JSON body kept in an error, so that an HTML error page from a
/// proxy does not flood the logs.
const MAX_RAW_BODY: usize = 512;

/// The success body of acquire: `{"acquired": true, "lock": {...}}` or
/// `{"acquired": false, "resource": "..."}`.
#[derive(Deserialize)]
struct AcquireBody {
    acquired: bool,
    lock: Option<LockInfo>,
    /// How long a waited acquire waited (API.md, *Waiting*); read beside `acquired` or, if
    /// not there, in the lock object.
    waited_ms: Option<i64>,
}

/// A successful acquire: the lock, and how long the server waited before granting it.
#[derive(Debug)]
pub(super) struct Granted {
    pub(super) lock: LockInfo,
    /// Zero unless the server says it waited.
    pub(super) waited: Duration,
}

/// Just the `waited_ms` a lock object may carry.
#[derive(Deserialize)]
struct WaitedIn {
    waited_ms: Option<i64>,
}

/// The success body of renew: `{"lock": {...}}`.
#[derive(Deserialize)]
struct RenewBody {
    lock: LockInfo,
}

/// Acquire: `200` with `acquired: true` is the lease, `acquired: false` is contention.
pub(super) fn acquire(status: StatusCode, body: &[u8], resource: &str) -> Result<Granted, Error> {
    if status != StatusCode::OK {
        return Err(failure(status, body));
    }
    match parse::<AcquireBody>(body)? {
        AcquireBody {
            acquired: true,
            lock: Some(lock),
            waited_ms,
        } => {
            let waited_ms = waited_ms.or_else(|| {
                let full: Value = serde_json::from_slice(body).ok()?;
                WaitedIn::deserialize(&full["lock"]).ok()?.waited_ms
            });
            let waited =
                Duration::from_millis(waited_ms.and_then(|ms| u64::try_from(ms).ok()).unwrap_or(0));
            Ok(Granted { lock, waited })
        }
        AcquireBody {
            acquired: false, ..
        } => Err(Error::Held {
            resource: resource.to_owned(),
        }),
        AcquireBody { lock: None, .. } => Err(Error::Protocol(
            "acquire answered `acquired: true` without a lock".to_owned(),
        )),
    }
}

/// Renew: `200` is the extended lease; `404` and every `409` mean the lease is lost. When a
/// fence was sent, an answer with another fence breaks the contract.
pub(super) fn renew(
    status: StatusCode,
    body: &[u8],
    fence: Option<i64>,
) -> Result<LockInfo, Error> {
    if status != StatusCode::OK {
        return Err(loss(status, body).unwrap_or_else(|| failure(status, body)));
    }
    let lock = parse::<RenewBody>(body)?.lock;
    match fence {
        Some(sent) if sent != lock.fence => Err(Error::Protocol(format!(
            "renew of fence {sent} answered with fence {}",
            lock.fence
        ))),
        _ => Ok(lock),
    }
}

/// Release: `204` is done; `404`, `403 forbidden` and `409` mean the caller did not hold the
/// lease (`403 forbidden-scope` is the bearer token's scope: [`Error::Rejected`]).
pub(super) fn release(status: StatusCode, body: &[u8]) -> Result<(), Error> {
    match status {
        StatusCode::NO_CONTENT => Ok(()),
        StatusCode::FORBIDDEN if problem(body)["type"] != "forbidden-scope" => {
            Err(lost(LossReason::OwnerMismatch))
        }
        _ => Err(loss(status, body).unwrap_or_else(|| failure(status, body))),
    }
}

/// Inspect: `200` is the live lease, `404` is none.
pub(super) fn inspect(status: StatusCode, body: &[u8]) -> Result<Option<LockView>, Error> {
    match status {
        StatusCode::OK => parse(body).map(Some),
        StatusCode::NOT_FOUND => Ok(None),
        _ => Err(failure(status, body)),
    }
}

/// List: `200` is the page.
pub(super) fn list(status: StatusCode, body: &[u8]) -> Result<LockPage, Error> {
    match status {
        StatusCode::OK => parse(body),
        _ => Err(failure(status, body)),
    }
}

/// The lease-lost answers shared by renew and release: `404`, and `409` of any type.
fn loss(status: StatusCode, body: &[u8]) -> Option<Error> {
    let reason = match status {
        StatusCode::NOT_FOUND => LossReason::NotFound,
        StatusCode::CONFLICT => conflict(&problem(body)),
        _ => return None,
    };
    Some(lost(reason))
}

fn conflict(problem: &Value) -> LossReason {
    match problem["type"].as_str().unwrap_or_default() {
        "lease-expired" => LossReason::Expired,
        "owner-mismatch" => LossReason::OwnerMismatch,
        "stale-fence" => LossReason::StaleFence {
            current_fence: problem["current_fence"].as_i64(),
        },
        other => LossReason::Conflict {
            problem_type: other.to_owned(),
        },
    }
}

fn lost(reason: LossReason) -> Error {
    Error::LeaseLost { reason }
}

/// Every answer an operation has no specific meaning for: outages are
/// [`Error::Unavailable`], other client errors [`Error::Rejected`], anything else (`1xx`,
/// `3xx`, an unexpected `2xx`) [`Error::Protocol`]. A `429 quota-exceeded` is the bearer
/// token's quota, which waiting does not lift (a lease must be released): `Rejected`.
fn failure(status: StatusCode, body: &[u8]) -> Error {
    let problem = problem(body);
    if status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || (status == StatusCode::TOO_MANY_REQUESTS && problem["type"] != "quota-exceeded")
    {
        Error::Unavailable(format!("{status}: {}", summary(&problem)))
    } else if status.is_client_error() {
        Error::Rejected {
            status: status.as_u16(),
            problem,
        }
    } else {
        Error::Protocol(format!("unexpected {status}: {}", summary(&problem)))
    }
}

/// The body as JSON, or the (truncated) raw text as a JSON string when it is not JSON.
fn problem(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|_| {
        let text = String::from_utf8_lossy(body);
        Value::String(text.chars().take(MAX_RAW_BODY).collect())
    })
}

/// A one-line description of a problem document: `type: detail`, or the raw body.
fn summary(problem: &Value) -> String {
    match (problem["type"].as_str(), problem["detail"].as_str()) {
        (Some(kind), Some(detail)) => format!("{kind}: {detail}"),
        (Some(kind), None) => kind.to_owned(),
        _ => problem.to_string(),
    }
}

fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, Error> {
    serde_json::from_slice(body)
        .map_err(|e| Error::Protocol(format!("unexpected success body ({e}): {}", problem(body))))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const LOCK: &str = r#"{"resource":"job:1","owner":"a","fence":7,
        "acquired_at":"2026-11-30T01:02:03.456Z","expires_at":"2026-11-30T01:03:03.456Z",
        "expires_in_ms":60000}"#;

    fn problem_body(kind: &str, status: u16) -> Vec<u8> {
        json!({"type": kind, "title": "t", "status": status, "detail": "d", "instance": "/x"})
            .to_string()
            .into_bytes()
    }

    fn reason(result: Result<impl std::fmt::Debug, Error>) -> LossReason {
        match result {
            Err(Error::LeaseLost { reason }) => reason,
            other => panic!("expected LeaseLost, got {other:?}"),
        }
    }

    #[test]
    fn acquire_tells_the_lease_from_contention() {
        let granted = format!(r#"{{"acquired":true,"lock":{LOCK}}}"#);
        let granted = acquire(StatusCode::OK, granted.as_bytes(), "job:1").unwrap();
        assert_eq!(granted.lock.fence, 7);
        assert_eq!(granted.lock.expires_in_ms, 60000);
        assert_eq!(granted.waited, Duration::ZERO);
        let held = br#"{"acquired":false,"resource":"job:1"}"#;
        assert!(matches!(
            acquire(StatusCode::OK, held, "job:1"),
            Err(Error::Held { resource }) if resource == "job:1"
        ));
    }

    #[test]
    fn a_waited_acquire_says_how_long_it_waited() {
        let beside = format!(r#"{{"acquired":true,"lock":{LOCK},"waited_ms":1200}}"#);
        let granted = acquire(StatusCode::OK, beside.as_bytes(), "job:1").unwrap();
        assert_eq!(granted.waited, Duration::from_millis(1200));
        let inside = LOCK.replacen('{', r#"{"waited_ms":300,"#, 1);
        let inside = format!(r#"{{"acquired":true,"lock":{inside}}}"#);
        let granted = acquire(StatusCode::OK, inside.as_bytes(), "job:1").unwrap();
        assert_eq!(granted.waited, Duration::from_millis(300));
    }

    #[test]
    fn outages_are_unavailable_and_caller_bugs_rejected() {
        let unavailable = problem_body("store-unavailable", 503);
        for status in [500, 502, 503, 504, 408, 429] {
            let status = StatusCode::from_u16(status).unwrap();
            let error = acquire(status, &unavailable, "r").unwrap_err();
            assert!(
                matches!(error, Error::Unavailable(_)),
                "{status}: {error:?}"
            );
            assert!(error.is_retryable());
        }
        let invalid = problem_body("validation-failed", 422);
        let error = acquire(StatusCode::UNPROCESSABLE_ENTITY, &invalid, "r").unwrap_err();
        assert!(
            matches!(&error, Error::Rejected { status: 422, problem } if problem["type"] == "validation-failed")
        );
        assert!(!error.is_retryable());
    }

    #[test]
    fn answers_outside_the_contract_are_protocol_errors() {
        for (status, body) in [
            (StatusCode::OK, &b"<html>proxy</html>"[..]),
            (StatusCode::OK, br#"{"acquired":true}"#),
            (StatusCode::FOUND, b""),
        ] {
            let error = acquire(status, body, "r").unwrap_err();
            assert!(matches!(error, Error::Protocol(_)), "{status}: {error:?}");
        }
    }

    #[test]
    fn renew_refusals_are_lease_lost() {
        let cases = [
            (404, "not-found", LossReason::NotFound),
            (409, "lease-expired", LossReason::Expired),
            (409, "owner-mismatch", LossReason::OwnerMismatch),
            (
                409,
                "something-new",
                LossReason::Conflict {
                    problem_type: "something-new".to_owned(),
                },
            ),
        ];
        for (status, kind, expected) in cases {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(
                reason(renew(status, &problem_body(kind, 409), None)),
                expected
            );
        }
        let stale = json!({"type": "stale-fence", "current_fence": 9}).to_string();
        assert_eq!(
            reason(renew(StatusCode::CONFLICT, stale.as_bytes(), Some(7))),
            LossReason::StaleFence {
                current_fence: Some(9)
            }
        );
    }

    #[test]
    fn renew_answer_with_another_fence_breaks_the_contract() {
        let body = format!(r#"{{"lock":{LOCK}}}"#);
        assert!(renew(StatusCode::OK, body.as_bytes(), Some(7)).is_ok());
        assert!(matches!(
            renew(StatusCode::OK, body.as_bytes(), Some(8)),
            Err(Error::Protocol(_))
        ));
    }

    #[test]
    fn release_refusals_are_lease_lost() {
        assert!(release(StatusCode::NO_CONTENT, b"").is_ok());
        assert_eq!(
            reason(release(
                StatusCode::FORBIDDEN,
                &problem_body("forbidden", 403)
            )),
            LossReason::OwnerMismatch
        );
        assert_eq!(
            reason(release(
                StatusCode::NOT_FOUND,
                &problem_body("not-found", 404)
            )),
            LossReason::NotFound
        );
    }

    #[test]
    fn inspect_of_no_lease_is_none() {
        assert!(matches!(inspect(StatusCode::NOT_FOUND, b"{}"), Ok(None)));
        let view = inspect(StatusCode::OK, LOCK.as_bytes()).unwrap().unwrap();
        assert_eq!(view.fence, 7);
    }

    #[test]
    fn a_list_page_is_read_with_its_next() {
        let body = format!(r#"{{"locks":[{LOCK}],"next":"job:1"}}"#);
        let page = list(StatusCode::OK, body.as_bytes()).unwrap();
        assert_eq!(page.locks.len(), 1);
        assert_eq!(page.next.as_deref(), Some("job:1"));
        let last = list(StatusCode::OK, br#"{"locks":[],"next":null}"#).unwrap();
        assert_eq!((last.locks.len(), last.next), (0, None));
        let scope = problem_body("forbidden-scope", 403);
        assert!(matches!(
            list(StatusCode::FORBIDDEN, &scope),
            Err(Error::Rejected { status: 403, .. })
        ));
    }
}
