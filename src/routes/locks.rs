//! `/locks/{resource}`: acquire, inspect, renew, release.

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest, HttpResponse, web};
use futures_util::future::LocalBoxFuture;
use serde::Serialize;

use super::auth::Caller;
use super::metrics::Counted;
use super::parse::{Limits, WatchRequest};
use super::view::{self, LockView};
use super::{AppState, parse, wire};
use crate::auth::Permission;
use crate::store::{Deadline, StoreError};
use fencelock::domain::{
    AcquireOutcome, AcquireRequest, Acquisition, Fence, HistoryRequest, Inspection, Lease,
    ReleaseOutcome, ReleaseRequest, RenewOutcome, RenewRequest, ResourceName, Ttl,
};
use fencelock::http::ApiError;
use fencelock::http::body::{JsonObject, Object};

#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct RenewResponse<'a> {
    lock: LockView<'a>,
}

/// `acquired: true` with the lock, or `acquired: false` while another owner holds it (or,
/// while others wait for it, for anyone but the head of the queue).
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged, deny_unknown_fields)]
enum AcquireResponse<'a> {
    Acquired {
        acquired: bool,
        lock: LockView<'a>,
        /// Only when the request carried a `wait_ms` above 0: how long it waited, in
        /// milliseconds, from its arrival to the grant.
        #[serde(skip_serializing_if = "Option::is_none")]
        #[schema(minimum = 0)]
        waited_ms: Option<u64>,
    },
    Held {
        acquired: bool,
        resource: &'a str,
        /// Only when the refusal is a lock delay (another owner's lease expired less than
        /// its `lock_delay_ms` ago): when the delay ends, and no sooner may another owner
        /// acquire the resource.
        #[serde(skip_serializing_if = "Option::is_none")]
        #[schema(format = DateTime)]
        delayed_until: Option<String>,
    },
}

/// `POST /locks/{resource}` `{"owner", "ttl_seconds", "wait_ms"?}`
#[utoipa::path(
    post, path = "/locks/{resource}", tag = "locks", params(wire::ResourcePath),
    summary = "Acquire a lease, or re-acquire it by the same owner (a new, greater fence)",
    request_body(content = wire::AcquireBody, content_type = "application/json"),
    responses(
        (status = 200, body = AcquireResponse<'_>, description = "Acquired, or held by another owner"),
        wire::AcquireProblems,
    ),
)]
pub(super) async fn acquire(
    LockWrite(mut request, caller, state): LockWrite<AcquireRequest>,
) -> Result<HttpResponse, ApiError> {
    request.token = caller.quota();
    let (outcome, waited) = if request.wait.is_zero() {
        let outcome = write(&state, |deadline| state.store.acquire(&request, deadline)).await?;
        (outcome, None)
    } else {
        let waited = waiting(&state, request.clone()).await?;
        (waited.outcome, Some(waited.waited))
    };
    let body = match &outcome {
        AcquireOutcome::Acquired { lease, how } => {
            let event = match how {
                Acquisition::Fresh => "acquired",
                Acquisition::Reacquired => "reacquired",
                Acquisition::TakenOver => "taken over after expiry",
            };
            log_lease(event, lease, request.ttl, &caller);
            AcquireResponse::Acquired {
                acquired: true,
                lock: LockView::with_owner(lease, state.fence_key.as_ref()),
                waited_ms: waited.map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX)),
            }
        }
        AcquireOutcome::QuotaExceeded { max_leases } => {
            log_refusal(&request.resource, &caller, "the token is at its quota");
            return Err(caller.quota_exceeded(*max_leases));
        }
        AcquireOutcome::Held { delayed_until, .. } => {
            let why = match delayed_until {
                Some(_) => "inside the lock delay of another owner's expired lease",
                None => "held by another owner",
            };
            log_refusal(&request.resource, &caller, why);
            AcquireResponse::Held {
                acquired: false,
                resource: request.resource.as_str(),
                delayed_until: delayed_until.map(view::rfc3339_millis),
            }
        }
    };
    Ok(HttpResponse::Ok().json(body))
}

/// `GET /locks/{resource}`: the live lease, without its owner.
#[utoipa::path(
    get, path = "/locks/{resource}", tag = "locks", params(wire::ResourcePath),
    summary = "The live lease, without its owner",
    responses(
        (status = 200, body = view::LiveLease, description = "The live lease"),
        wire::InspectProblems,
    ),
)]
pub(super) async fn inspect(
    LockRead(resource, state): LockRead<ResourceName>,
) -> Result<HttpResponse, ApiError> {
    match state.ask(state.store.inspect(&resource)).await? {
        Inspection::Live(lease) => {
            Ok(HttpResponse::Ok().json(LockView::without_owner(&lease, state.fence_key.as_ref())))
        }
        Inspection::Delayed { until } => Err(ApiError::Delayed {
            detail: format!(
                "there is no live lease on {resource}; the last one expired, and its lock delay keeps other owners out until delayed_until"
            ),
            until,
        }),
        Inspection::Absent => Err(no_live_lease(&resource)),
    }
}

/// `POST /locks/{resource}/renew` `{"owner", "ttl_seconds", "fence"?}`
#[utoipa::path(
    post, path = "/locks/{resource}/renew", tag = "locks", params(wire::ResourcePath),
    summary = "Extend the live lease: same fence, expires_at = now + ttl_seconds",
    request_body(content = wire::RenewBody, content_type = "application/json"),
    responses(
        (status = 200, body = RenewResponse<'_>, description = "Renewed"),
        wire::RenewProblems,
    ),
)]
pub(super) async fn renew(
    LockWrite(request, caller, state): LockWrite<RenewRequest>,
) -> Result<HttpResponse, ApiError> {
    match write(&state, |deadline| state.store.renew(&request, deadline)).await? {
        RenewOutcome::Renewed(lease) => {
            log_lease("renewed", &lease, request.ttl, &caller);
            Ok(HttpResponse::Ok().json(RenewResponse {
                lock: LockView::with_owner(&lease, state.fence_key.as_ref()),
            }))
        }
        RenewOutcome::NotFound => Err(ApiError::NotFound(format!(
            "there is no lease on {} to renew; acquire it",
            request.resource
        ))),
        RenewOutcome::Expired => Err(ApiError::LeaseExpired(format!(
            "the lease on {} has expired and cannot be renewed; acquire it again for a new fence",
            request.resource
        ))),
        RenewOutcome::OwnerMismatch => Err(ApiError::OwnerMismatch(format!(
            "the lease on {} is held by another owner; this owner has lost it",
            request.resource
        ))),
        RenewOutcome::StaleFence { current } => {
            Err(stale_fence(&request.resource, request.fence, current))
        }
    }
}

/// `DELETE /locks/{resource}` or `POST /locks/{resource}/release`, `{"owner", "fence"?}`
#[utoipa::path(
    delete, path = "/locks/{resource}", tag = "locks", params(wire::ResourcePath),
    summary = "Release a lease",
    request_body(content = wire::ReleaseBody, content_type = "application/json"),
    responses(
        (status = 204, description = "Released"),
        wire::ReleaseProblems,
    ),
)]
pub(super) async fn release(
    LockWrite(request, caller, state): LockWrite<ReleaseRequest>,
) -> Result<HttpResponse, ApiError> {
    match write(&state, |deadline| state.store.release(&request, deadline)).await? {
        ReleaseOutcome::Released { fence, .. } => {
            tracing::info!(
                lease.resource = %request.resource,
                lease.fence = fence.get(),
                token = caller.name(),
                "lease released"
            );
            Ok(HttpResponse::NoContent().finish())
        }
        ReleaseOutcome::NotFound => Err(no_live_lease(&request.resource)),
        ReleaseOutcome::NotOwner => Err(ApiError::Forbidden(format!(
            "the lease on {} is held by another owner",
            request.resource
        ))),
        ReleaseOutcome::StaleFence { current } => {
            Err(stale_fence(&request.resource, request.fence, current))
        }
    }
}

/// The prologue of every lock write, as an extractor: the request parsed from its path and
/// JSON body (every bad field in one `422`, with every query parameter: these routes take
/// none), then allowed for the caller (`403` forbidden-scope); with the caller and the app
/// state. Its parts are extracted in the order of a handler's arguments: the caller, the
/// path, the body.
pub(super) struct LockWrite<R>(R, Caller, web::Data<AppState>);

/// A lock write's request: how [`LockWrite`] parses it, and what resource it locks.
pub(super) trait LockRequest: Sized + 'static {
    fn parse(resource: &str, body: Object, limits: Limits) -> Result<Self, ApiError>;
    fn resource(&self) -> &ResourceName;
}

/// Implements [`LockRequest`] for each `Request => parser;`.
macro_rules! lock_requests {
    ($($request:ty => $parse:expr;)*) => {$(
        impl LockRequest for $request {
            fn parse(resource: &str, body: Object, limits: Limits) -> Result<Self, ApiError> {
                $parse(resource, body, limits)
            }

            fn resource(&self) -> &ResourceName {
                &self.resource
            }
        }
    )*};
}

lock_requests! {
    AcquireRequest => parse::acquire;
    RenewRequest => |resource, body, limits: Limits| parse::renew(resource, body, limits.max_ttl);
    ReleaseRequest => |resource, body, _| parse::release(resource, body);
}

impl<R: LockRequest> FromRequest for LockWrite<R> {
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let parts = <(Caller, web::Path<String>, JsonObject, web::Data<AppState>)>::from_request(
            req, payload,
        );
        let no_query = parse::no_query(req.query_string());
        Box::pin(async move {
            let (caller, path, JsonObject(body), state) = parts.await?;
            let (request, ()) = parse::together(R::parse(&path, body, state.limits()), no_query)?;
            caller.allow(request.resource(), Permission::Lock)?;
            Ok(Self(request, caller, state))
        })
    }
}

/// The prologue of every lock read, as an extractor: the request parsed from its path and
/// query (every bad part in one `422`), then allowed for the caller to read (`403`
/// forbidden-scope); with the app state. Its parts are extracted in the order of a
/// handler's arguments: the caller, the path.
pub(super) struct LockRead<R>(pub(super) R, pub(super) web::Data<AppState>);

/// A lock read's request: how [`LockRead`] parses it, and what resource it reads.
pub(super) trait ReadRequest: Sized + 'static {
    fn parse(resource: &str, query: &str) -> Result<Self, ApiError>;
    fn resource(&self) -> &ResourceName;
}

/// Inspect: the resource alone, and no query.
impl ReadRequest for ResourceName {
    fn parse(resource: &str, query: &str) -> Result<Self, ApiError> {
        parse::together(parse::resource(resource), parse::no_query(query)).map(|(r, ())| r)
    }

    fn resource(&self) -> &ResourceName {
        self
    }
}

impl ReadRequest for HistoryRequest {
    fn parse(resource: &str, query: &str) -> Result<Self, ApiError> {
        parse::history(resource, query)
    }

    fn resource(&self) -> &ResourceName {
        &self.resource
    }
}

impl ReadRequest for WatchRequest {
    fn parse(resource: &str, query: &str) -> Result<Self, ApiError> {
        parse::watch_request(resource, query)
    }

    fn resource(&self) -> &ResourceName {
        &self.resource
    }
}

impl<R: ReadRequest> FromRequest for LockRead<R> {
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let parts = <(Caller, web::Path<String>, web::Data<AppState>)>::from_request(req, payload);
        let query = req.query_string().to_owned();
        Box::pin(async move {
            let (caller, path, state) = parts.await?;
            let request = R::parse(&path, &query)?;
            caller.allow(request.resource(), Permission::Read)?;
            Ok(Self(request, state))
        })
    }
}

/// Runs a lock write within its deadline (see [`AppState::write`]) and counts its answer.
async fn write<T: Counted, F>(
    state: &AppState,
    operation: impl FnOnce(Deadline) -> F,
) -> Result<T, ApiError>
where
    F: Future<Output = Result<T, StoreError>>,
{
    let answer = state.write(operation).await;
    T::count(&state.metrics, answer.as_ref());
    answer
}

/// A waiting acquisition (see [`crate::waiting`]), counted like any acquisition. It is
/// bounded by its own wait and by each attempt's store deadline, not by one store timeout.
async fn waiting(
    state: &AppState,
    request: AcquireRequest,
) -> Result<crate::waiting::Waited, ApiError> {
    let answer = super::store_answer(
        crate::waiting::acquire(state.store.clone(), request, state.store_timeout).await,
    );
    AcquireOutcome::count(&state.metrics, answer.as_ref().map(|w| &w.outcome));
    answer
}

/// The log line of a lease granted or extended: `lease {event}`.
fn log_lease(event: &str, lease: &Lease, ttl: Ttl, caller: &Caller) {
    tracing::info!(
        lease.resource = %lease.resource,
        lease.fence = lease.fence.get(),
        lease.ttl_s = ttl.seconds(),
        token = caller.name(),
        "lease {event}"
    );
}

/// The log line of an acquisition the store refused: `lease refused: {why}`.
fn log_refusal(resource: &ResourceName, caller: &Caller, why: &str) {
    tracing::info!(
        lease.resource = %resource,
        token = caller.name(),
        "lease refused: {why}"
    );
}

fn no_live_lease(resource: &ResourceName) -> ApiError {
    ApiError::NotFound(format!("there is no live lease on {resource}"))
}

/// The owner's lease is live, but the fence it gave is not that lease's: a lower one belongs
/// to an earlier lease of the same owner (superseded by a re-acquisition), a higher one was
/// never issued for this lease at all.
fn stale_fence(resource: &ResourceName, given: Option<Fence>, current: Fence) -> ApiError {
    let why = match given {
        Some(given) if given < current => {
            format!("fence {given} belongs to an older lease on {resource}")
        }
        Some(given) => format!("fence {given} was not issued for the live lease on {resource}"),
        None => format!("the fence given is not that of the live lease on {resource}"),
    };
    ApiError::StaleFence {
        detail: format!("{why}; the live lease has fence {current}"),
        current_fence: Some(current),
    }
}
