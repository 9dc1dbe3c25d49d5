//! `GET /locks?prefix=P&limit=N&after=R`: the live leases, a page at a time, in name order.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;

use super::auth::Caller;
use super::view::{lock_object, rfc3339_millis};
use super::{AppState, parse, wire};
use fencelock::domain::{Fence, LeasePage, ListRequest, ListedLease, time_left_ms};
use fencelock::http::ApiError;

lock_object! {
    /// A live lease in a list: its resource, fence and times, and nothing of its holder.
    ///
    /// Neither the owner (the holder's secret) nor a `fence_token`: with `--fence-key`, a signed
    /// token is a right to write through the guard, and one list request would hand out that
    /// right for every lease under a prefix at once. Holders get theirs from acquire and renew.
    #[derive(Serialize, utoipa::ToSchema)]
    #[serde(deny_unknown_fields)]
    pub(super) struct ListedLock<'a> {
        /// The locked resource.
        resource: &'a str,
        /// The lease's fencing token.
        #[schema(value_type = i64, minimum = 1, maximum = 9_007_199_254_740_991_i64)]
        fence: Fence,
    }
}

impl<'a> From<&'a ListedLease> for ListedLock<'a> {
    fn from(lease: &'a ListedLease) -> Self {
        Self {
            resource: lease.resource.as_str(),
            fence: lease.fence,
            acquired_at: rfc3339_millis(lease.acquired_at),
            expires_at: rfc3339_millis(lease.expires_at),
            expires_in_ms: time_left_ms(lease.expires_at, lease.observed_at),
        }
    }
}

/// One page of live leases, in byte order of their names.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = LockList)]
pub(super) struct LockListView<'a> {
    locks: Vec<ListedLock<'a>>,
    /// The `after` of the next page: the last resource of this one. `null` on the last page
    /// (never a link to an empty page).
    #[schema(
        required = true,
        min_length = 1,
        max_length = 255,
        pattern = r"^(?!\.\.?$)[A-Za-z0-9._:@+=~-]{1,255}$"
    )]
    next: Option<&'a str>,
}

impl<'a> From<&'a LeasePage> for LockListView<'a> {
    fn from(page: &'a LeasePage) -> Self {
        Self {
            locks: page.leases.iter().map(ListedLock::from).collect(),
            next: page.next.as_ref().map(|next| next.as_str()),
        }
    }
}

/// `GET /locks?prefix=P&limit=N&after=R`
#[utoipa::path(
    get, path = "/locks", tag = "locks", params(wire::ListParams),
    summary = "The live leases whose names start with a prefix, a page at a time, in name order, without owners",
    responses(
        (status = 200, body = LockListView<'_>, description = "One page of live leases"),
        wire::ListProblems,
    ),
)]
pub(super) async fn list(
    caller: Caller,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let query = parse::list(req.query_string())?;
    let request = ListRequest {
        scope: caller.list_scope(query.prefix)?,
        after: query.after,
        limit: query.limit,
    };

    let page = state.ask(state.store.list(&request)).await?;
    Ok(HttpResponse::Ok().json(LockListView::from(&page)))
}
