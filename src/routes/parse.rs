//! One parser per request type: the path and the body's fields into a domain request, or the
//! full list of what is wrong with them (`422`, one entry per bad field, unknown fields
//! included). Nothing here touches the store: the input rules come first.

use serde_json::value::RawValue;

use fencelock::domain::{
    AcquireRequest, Fence, HistoryLimit, HistoryRequest, LockDelay, Owner, PageLimit,
    ReleaseRequest, RenewRequest, ResourceName, ResourcePrefix, Ttl, WaitFor, WatchTimeout,
};
use fencelock::http::body::{self, Object};
use fencelock::http::problem::{ApiError, FieldError};
use fencelock::http::query::{self, Params, decimal};

/// The server's bounds on what a request may ask for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub max_ttl: Ttl,
    /// `--max-wait-ms`: the largest `wait_ms`.
    pub max_wait_ms: u32,
}

/// `POST /locks/{resource}` `{"owner", "ttl_seconds", "lock_delay_ms"?, "wait_ms"?}`
pub(super) fn acquire(
    resource: &str,
    body: Object,
    limits: Limits,
) -> Result<AcquireRequest, ApiError> {
    let mut fields = Fields::new(body);
    let resource = fields.resource(resource);
    let owner = fields.required("owner", owner);
    let ttl = fields.required("ttl_seconds", |raw| ttl(raw, limits.max_ttl));
    let lock_delay = fields.optional("lock_delay_ms", lock_delay);
    let wait = fields.optional("wait_ms", |raw| wait(raw, limits.max_wait_ms));
    fields.finish()?;
    Ok(AcquireRequest {
        resource: present(resource)?,
        owner: present(owner)?,
        ttl: present(ttl)?,
        lock_delay: lock_delay.unwrap_or_default(),
        token: None,
        wait: wait.unwrap_or_default(),
        ticket: None,
    })
}

fn wait(raw: &RawValue, max_ms: u32) -> Result<WaitFor, String> {
    WaitFor::new(body::integer(raw)?, max_ms)
}

/// `POST /locks/{resource}/renew` `{"owner", "ttl_seconds", "fence"?}`
pub(super) fn renew(resource: &str, body: Object, max_ttl: Ttl) -> Result<RenewRequest, ApiError> {
    let mut fields = Fields::new(body);
    let resource = fields.resource(resource);
    let owner = fields.required("owner", owner);
    let ttl = fields.required("ttl_seconds", |raw| ttl(raw, max_ttl));
    let fence = fields.optional("fence", fence);
    fields.finish()?;
    Ok(RenewRequest {
        resource: present(resource)?,
        owner: present(owner)?,
        ttl: present(ttl)?,
        fence,
    })
}

/// `DELETE /locks/{resource}` or `POST /locks/{resource}/release`, `{"owner", "fence"?}`
pub(super) fn release(resource: &str, body: Object) -> Result<ReleaseRequest, ApiError> {
    let mut fields = Fields::new(body);
    let resource = fields.resource(resource);
    let owner = fields.required("owner", owner);
    let fence = fields.optional("fence", fence);
    fields.finish()?;
    Ok(ReleaseRequest {
        resource: present(resource)?,
        owner: present(owner)?,
        fence,
    })
}

/// A `{resource}` path segment alone, for requests without a body.
pub(super) fn resource(raw: &str) -> Result<ResourceName, ApiError> {
    ResourceName::parse(raw).map_err(|e| ApiError::validation("resource", e))
}

fn owner(raw: &RawValue) -> Result<Owner, String> {
    Owner::parse(&body::string(raw)?).map_err(|e| e.to_string())
}

fn ttl(raw: &RawValue, max: Ttl) -> Result<Ttl, String> {
    Ttl::new(body::integer(raw)?, max).map_err(|e| e.to_string())
}

fn lock_delay(raw: &RawValue) -> Result<LockDelay, String> {
    LockDelay::new(body::integer(raw)?).map_err(|e| e.to_string())
}

fn fence(raw: &RawValue) -> Result<Fence, String> {
    Fence::new(body::integer(raw)?).map_err(|e| e.to_string())
}

/// After [`Fields::finish`] succeeded, every required field is there.
fn present<T>(field: Option<T>) -> Result<T, ApiError> {
    field.ok_or_else(|| ApiError::Internal(anyhow::anyhow!("a checked field went missing")))
}

/// The fields of one request, taken one by one; every problem is collected so that a `422`
/// lists them all, and fields nobody took are reported as unknown.
struct Fields {
    map: Object,
    errors: Vec<FieldError>,
}

impl Fields {
    fn new(map: Object) -> Self {
        Self {
            map,
            errors: Vec::new(),
        }
    }

    fn resource(&mut self, raw: &str) -> Option<ResourceName> {
        ResourceName::parse(raw)
            .map_err(|e| self.reject("resource", e))
            .ok()
    }

    /// A field that must be given (`null` counts as missing).
    fn required<T>(
        &mut self,
        name: &str,
        parse: impl FnOnce(&RawValue) -> Result<T, String>,
    ) -> Option<T> {
        let Some(raw) = self.take(name) else {
            self.reject(name, "is required");
            return None;
        };
        parse(&raw).map_err(|m| self.reject(name, m)).ok()
    }

    /// A field that may be left out or `null`; `None` then, and also when it is invalid (the
    /// problem is collected, so [`Fields::finish`] fails).
    fn optional<T>(
        &mut self,
        name: &str,
        parse: impl FnOnce(&RawValue) -> Result<T, String>,
    ) -> Option<T> {
        let raw = self.take(name)?;
        parse(&raw).map_err(|m| self.reject(name, m)).ok()
    }

    /// Every problem collected, unknown fields included, as one `422`.
    fn finish(mut self) -> Result<(), ApiError> {
        let unknown: Vec<String> = self.map.keys().cloned().collect();
        for field in unknown {
            self.reject(field, "is not a known field");
        }
        match self.errors.is_empty() {
            true => Ok(()),
            false => Err(ApiError::Validation(self.errors)),
        }
    }

    /// The field's raw text; absent and `null` are both `None`.
    fn take(&mut self, field: &str) -> Option<Box<RawValue>> {
        self.map.remove(field).filter(|raw| raw.get() != "null")
    }

    fn reject(&mut self, field: impl Into<String>, message: impl ToString) {
        self.errors.push(FieldError::new(field, message));
    }
}

/// The query of a route that takes none: `Ok` when it is empty, otherwise every parameter
/// given, named as an unknown body field is, since a lock request's options sent in the query
/// (`?wait_ms=5000`) would otherwise pass as not asked for.
pub(super) fn no_query(query: &str) -> Result<(), ApiError> {
    const NOT_HERE: &str = "is not a known parameter; this route takes none (a lock request's fields go in its JSON body)";
    if query.is_empty() {
        return Ok(());
    }
    let stray = match query::params(query, [], NOT_HERE, NOT_HERE) {
        Ok(params) => params.errors,
        Err(undecodable) => vec![undecodable],
    };
    if stray.is_empty() {
        Ok(())
    } else {
        Err(ApiError::Validation(stray))
    }
}

/// Two parts of one request, each checked on its own: both, or the problems of both in one
/// `422` (the first's first); any other error as it is.
pub(super) fn together<A, B>(
    a: Result<A, ApiError>,
    b: Result<B, ApiError>,
) -> Result<(A, B), ApiError> {
    match (a, b) {
        (Ok(a), Ok(b)) => Ok((a, b)),
        (Err(ApiError::Validation(mut a)), Err(ApiError::Validation(b))) => {
            a.extend(b);
            Err(ApiError::Validation(a))
        }
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// A query's known parameters (see [`query::params`]), each at most once; a query that cannot
/// be decoded at all is a `422` of its own.
fn known_params<const N: usize>(
    query: &str,
    names: [&str; N],
    unknown: &str,
) -> Result<Params<N>, ApiError> {
    query::params(query, names, unknown, "is given more than once")
        .map_err(|e| ApiError::Validation(vec![e]))
}

/// The query of `GET /locks`, checked; the token's scope is applied after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ListQuery {
    pub prefix: ResourcePrefix,
    pub after: Option<ResourceName>,
    pub limit: PageLimit,
}

/// `GET /locks?prefix=P&limit=N&after=R`, every parameter optional. As with unknown body
/// fields, a parameter that is not one of these, or one given twice, is a `422` naming it:
/// a typo such as `limt=5` must not pass as the default. Values are form-encoded: `+` stands
/// for a space (refused), so a name holding `+` is sent with `%2B`.
pub(super) fn list(query: &str) -> Result<ListQuery, ApiError> {
    let Params {
        values: [prefix, limit, after],
        mut errors,
    } = known_params(
        query,
        ["prefix", "limit", "after"],
        "is not a known parameter; the parameters are prefix, limit and after",
    )?;
    let mut checked = ListQuery {
        prefix: ResourcePrefix::everything(),
        after: None,
        limit: PageLimit::default(),
    };
    if let Some(text) = prefix {
        match ResourcePrefix::parse(&text) {
            Ok(parsed) => checked.prefix = parsed,
            Err(e) => errors.push(FieldError::new("prefix", e)),
        }
    }
    if let Some(text) = limit {
        match decimal(&text).and_then(PageLimit::new) {
            Some(parsed) => checked.limit = parsed,
            None => errors.push(FieldError::new(
                "limit",
                format!("must be an integer from 1 to {}", PageLimit::MAX),
            )),
        }
    }
    if let Some(text) = after {
        match ResourceName::parse(&text) {
            Ok(parsed) => checked.after = Some(parsed),
            Err(e) => errors.push(FieldError::new(
                "after",
                format!("must be the \"next\" of the previous page, a resource name: {e}"),
            )),
        }
    }
    match errors.is_empty() {
        true => Ok(checked),
        false => Err(ApiError::Validation(errors)),
    }
}

/// `GET /locks/{resource}/history?limit=N`: the resource and the query's problems in one
/// `422`.
pub(super) fn history(resource: &str, query: &str) -> Result<HistoryRequest, ApiError> {
    together(self::resource(resource), history_limit(query))
        .map(|(resource, limit)| HistoryRequest { resource, limit })
}

/// The query of `GET /locks/{resource}/history`. As with the list, a parameter other than
/// `limit`, or one given twice, is named.
fn history_limit(query: &str) -> Result<HistoryLimit, ApiError> {
    let Params {
        values: [limit],
        mut errors,
    } = known_params(
        query,
        ["limit"],
        "is not a known parameter; the only parameter is limit",
    )?;
    let mut checked = HistoryLimit::default();
    if let Some(text) = limit {
        match decimal(&text).and_then(HistoryLimit::new) {
            Some(parsed) => checked = parsed,
            None => errors.push(FieldError::new(
                "limit",
                format!("must be an integer from 1 to {}", HistoryLimit::MAX),
            )),
        }
    }
    match errors.is_empty() {
        true => Ok(checked),
        false => Err(ApiError::Validation(errors)),
    }
}

/// The query of `GET /locks/{resource}/watch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct WatchQuery {
    /// The fence of the lease the caller waits to see end; `None`: answer at once.
    pub fence: Option<Fence>,
    pub timeout: WatchTimeout,
}

/// A watch: the resource and its query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct WatchRequest {
    pub resource: ResourceName,
    pub query: WatchQuery,
}

/// `GET /locks/{resource}/watch?fence=F&timeout_ms=T`: the resource's and the query's
/// problems in one `422`.
pub(super) fn watch_request(resource: &str, query: &str) -> Result<WatchRequest, ApiError> {
    together(self::resource(resource), watch(query))
        .map(|(resource, query)| WatchRequest { resource, query })
}

/// `GET /locks/{resource}/watch?fence=F&timeout_ms=T`, both optional; unknown or repeated
/// parameters are a `422` as for the list.
pub(super) fn watch(query: &str) -> Result<WatchQuery, ApiError> {
    let Params {
        values: [fence, timeout],
        mut errors,
    } = known_params(
        query,
        ["fence", "timeout_ms"],
        "is not a known parameter; the parameters are fence and timeout_ms",
    )?;
    let mut checked = WatchQuery {
        fence: None,
        timeout: WatchTimeout::default(),
    };
    if let Some(text) = fence {
        match decimal(&text)
            .and_then(|n| i64::try_from(n).ok())
            .map(Fence::new)
        {
            Some(Ok(parsed)) => checked.fence = Some(parsed),
            _ => errors.push(FieldError::new(
                "fence",
                "must be a fence: an integer from 1 to 2^53 - 1",
            )),
        }
    }
    if let Some(text) = timeout {
        match decimal(&text).and_then(WatchTimeout::new) {
            Some(parsed) => checked.timeout = parsed,
            None => errors.push(FieldError::new(
                "timeout_ms",
                format!(
                    "must be an integer from 1 to {} (milliseconds)",
                    fencelock::domain::wait::WATCH_TIMEOUT_MAX_MS
                ),
            )),
        }
    }
    match errors.is_empty() {
        true => Ok(checked),
        false => Err(ApiError::Validation(errors)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn object(text: &str) -> Object {
        serde_json::from_str(text).expect("tests pass objects")
    }

    fn day() -> Ttl {
        Ttl::max(86_400).unwrap()
    }

    /// The fields a `422` names, in order.
    fn invalid(result: Result<impl std::fmt::Debug, ApiError>) -> Vec<String> {
        match result {
            Err(ApiError::Validation(errors)) => errors.into_iter().map(|e| e.field).collect(),
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    fn limits() -> Limits {
        Limits {
            max_ttl: day(),
            max_wait_ms: 60_000,
        }
    }

    fn acquire_with(ttl: &Value) -> Result<AcquireRequest, ApiError> {
        let body = format!(r#"{{"owner": "a", "ttl_seconds": {ttl}}}"#);
        acquire("job:1", object(&body), limits())
    }

    #[test]
    fn wait_ms_is_an_integer_up_to_the_maximum() {
        let with = |wait: &str| {
            let body = format!(r#"{{"owner": "a", "ttl_seconds": 5{wait}}}"#);
            acquire("job:1", object(&body), limits())
        };
        assert!(with("").unwrap().wait.is_zero());
        assert!(with(r#", "wait_ms": null"#).unwrap().wait.is_zero());
        assert!(with(r#", "wait_ms": 0"#).unwrap().wait.is_zero());
        assert_eq!(
            with(r#", "wait_ms": 60000"#)
                .unwrap()
                .wait
                .duration()
                .as_millis(),
            60_000
        );
        for bad in ["-1", "60001", "\"5\"", "5.0", "1e3", "true", "1e400"] {
            assert_eq!(
                invalid(with(&format!(r#", "wait_ms": {bad}"#))),
                ["wait_ms"],
                "{bad}"
            );
        }
    }

    #[test]
    fn watch_parameters_have_defaults_and_bounds() {
        let all = watch("").unwrap();
        assert_eq!(all.fence, None);
        assert_eq!(all.timeout, WatchTimeout::default());
        let some = watch("fence=7&timeout_ms=300000").unwrap();
        assert_eq!(some.fence, Some(Fence::new(7).unwrap()));
        assert_eq!(some.timeout, WatchTimeout::new(300_000).unwrap());
        for bad in [
            "fence=0",
            "fence=-1",
            "fence=x",
            "fence=9007199254740992",
            "fence=",
        ] {
            assert_eq!(invalid(watch(bad)), ["fence"], "{bad}");
        }
        for bad in [
            "timeout_ms=0",
            "timeout_ms=300001",
            "timeout_ms=1.5",
            "timeout_ms=99999999999999999999",
        ] {
            assert_eq!(invalid(watch(bad)), ["timeout_ms"], "{bad}");
        }
        assert_eq!(invalid(watch("fence=1&fence=1")), ["fence"]);
        assert_eq!(invalid(watch("timeout=5")), ["timeout"]);
    }

    #[test]
    fn ttl_must_be_a_strict_integer_in_range() {
        for bad in [
            json!(0),
            json!(-1),
            json!("60"),
            json!(60.0),
            json!(true),
            json!(1e300),
            json!(i64::MAX),
            json!(u64::MAX),
            json!(86_401),
        ] {
            assert_eq!(invalid(acquire_with(&bad)), ["ttl_seconds"], "{bad}");
        }
        assert_eq!(acquire_with(&json!(30)).unwrap().ttl.seconds(), 30);
    }

    #[test]
    fn numbers_beyond_float_range_are_field_errors() {
        let huge = "9".repeat(400);
        for bad in ["1e400", "-1e400", huge.as_str(), "1e2", "0.5e-400"] {
            let body = format!(r#"{{"owner": "a", "ttl_seconds": {bad}, "fence": {bad}}}"#);
            let result = renew("job:1", object(&body), day());
            assert_eq!(invalid(result), ["ttl_seconds", "fence"], "{bad}");
        }
        let unknown = acquire(
            "job:1",
            object(r#"{"owner": "a", "ttl_seconds": 5, "ttl": 1e400}"#),
            limits(),
        );
        let Err(ApiError::Validation(errors)) = unknown else {
            panic!("expected a validation error");
        };
        assert_eq!(errors, [FieldError::new("ttl", "is not a known field")]);
    }

    #[test]
    fn all_problems_are_listed_together() {
        let result = acquire(
            "",
            object(r#"{"owner": " ", "ttl": 5, "extra": 1}"#),
            limits(),
        );
        assert_eq!(
            invalid(result),
            ["resource", "owner", "ttl_seconds", "extra", "ttl"]
        );
    }

    #[test]
    fn fence_is_optional_but_positive() {
        let with = |fence: &str| {
            let body = format!(r#"{{"owner": "a"{fence}}}"#);
            release("job:1", object(&body))
        };
        assert_eq!(with("").unwrap().fence, None);
        assert_eq!(with(r#", "fence": null"#).unwrap().fence, None);
        assert_eq!(
            with(r#", "fence": 7"#).unwrap().fence,
            Some(Fence::new(7).unwrap())
        );
        for bad in ["0", "-3", "\"7\"", "7.5"] {
            assert_eq!(
                invalid(with(&format!(r#", "fence": {bad}"#))),
                ["fence"],
                "{bad}"
            );
        }
    }

    #[test]
    fn lock_delay_is_optional_and_a_strict_integer_in_range() {
        let with = |delay: &str| {
            let body = format!(r#"{{"owner": "a", "ttl_seconds": 5{delay}}}"#);
            acquire("job:1", object(&body), limits())
        };
        assert_eq!(with("").unwrap().lock_delay, LockDelay::NONE);
        assert_eq!(
            with(r#", "lock_delay_ms": null"#).unwrap().lock_delay,
            LockDelay::NONE
        );
        let most = with(r#", "lock_delay_ms": 60000"#).unwrap();
        assert_eq!(most.lock_delay.millis(), 60_000);
        let huge = "9".repeat(400);
        for bad in [
            "-1", "60001", "\"5\"", "5.0", "true", "1e400", "1e2", &huge, "[]",
        ] {
            let field = format!(r#", "lock_delay_ms": {bad}"#);
            assert_eq!(invalid(with(&field)), ["lock_delay_ms"], "{bad}");
        }
    }

    #[test]
    fn a_route_without_a_query_names_every_parameter_given() {
        assert_eq!(together(Ok(1), no_query("")).ok(), Some((1, ())));
        assert_eq!(
            invalid(together(Ok(1), no_query("wait_ms=5&x"))),
            ["wait_ms", "x"]
        );
        let body_problems = Err::<(), _>(ApiError::Validation(vec![FieldError::new(
            "owner", "blank",
        )]));
        assert_eq!(
            invalid(together(body_problems, no_query("a=1"))),
            ["owner", "a"]
        );
    }

    #[test]
    fn history_takes_a_limit_alone() {
        assert_eq!(history("job:1", "").unwrap().limit, HistoryLimit::default());
        assert_eq!(history("job:1", "limit=1000").unwrap().limit.get(), 1000);
        for bad in ["0", "1001", "x", "-1", "1.5", "99999999999999999999999", ""] {
            let query = format!("limit={bad}");
            assert_eq!(invalid(history("job:1", &query)), ["limit"], "{query}");
        }
        assert_eq!(invalid(history("job:1", "limt=5")), ["limt"]);
        assert_eq!(invalid(history("job:1", "limit=5&limit=5")), ["limit"]);
        assert_eq!(invalid(history("..", "limit=0")), ["resource", "limit"]);
        assert_eq!(invalid(history("..", "limit=%FF")), ["resource", "limit"]);
    }

    fn list_fields(query: &str) -> Vec<String> {
        invalid(list(query))
    }

    #[test]
    fn list_parameters_have_defaults() {
        let all = list("").unwrap();
        assert_eq!(all.prefix.as_str(), "");
        assert_eq!(all.after, None);
        assert_eq!(all.limit, PageLimit::default());
        let page = list("prefix=job%3A&limit=1000&after=job:7").unwrap();
        assert_eq!(page.prefix.as_str(), "job:");
        assert_eq!(page.after.unwrap().as_str(), "job:7");
        assert_eq!(page.limit.get(), 1000);
        assert_eq!(list("prefix=").unwrap().prefix.as_str(), "");
        assert_eq!(list("limit=1&prefix=.").unwrap().prefix.as_str(), ".");
        assert_eq!(list("after=a%2Bb").unwrap().after.unwrap().as_str(), "a+b");
    }

    #[test]
    fn bad_list_parameters_are_named() {
        // Out of range, or not a plain decimal (whose every form `http::query` tests).
        for bad in ["0", "1001", "-1", "abc", "%205", "99999999999999999999999"] {
            assert_eq!(
                list_fields(&format!("limit={bad}")),
                ["limit"],
                "limit={bad:?}"
            );
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a%2Fb",
            "a+b",
            "%C3%A9",
            &"a".repeat(256),
        ] {
            assert_eq!(
                list_fields(&format!("after={bad}")),
                ["after"],
                "after={bad:?}"
            );
        }
        for bad in ["a/b", "a b", "a+b", "%25", &"a".repeat(256)] {
            assert_eq!(
                list_fields(&format!("prefix={bad}")),
                ["prefix"],
                "prefix={bad:?}"
            );
        }
        assert_eq!(list_fields("limit"), ["limit"]);
        assert_eq!(list_fields("limit=5&limit=6"), ["limit"]);
        assert_eq!(list_fields("prefix=a&prefix=a"), ["prefix"]);
        assert_eq!(list_fields("limt=5"), ["limt"]);
        assert_eq!(
            list_fields("owner=x&limit=0&after="),
            ["owner", "limit", "after"]
        );
        // Bytes that are not UTF-8 decode to U+FFFD, which no name holds.
        assert_eq!(list_fields("prefix=%FF&after=%FF"), ["prefix", "after"]);
    }
}
