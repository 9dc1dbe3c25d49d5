//! `GET /locks/{resource}/history?limit=N`: the resource's most recent leases, newest first.

use actix_web::HttpResponse;
use serde::Serialize;

use super::locks::LockRead;
use super::view::rfc3339_millis;
use super::wire;
use fencelock::domain::{Fence, HistoryRequest, LeaseEnd, LeaseHistory, PastLease};
use fencelock::http::ApiError;

/// How a lease in a history stands or ended.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
enum End {
    /// The lease is the resource's live lease.
    Live,
    /// Its holder released it, or acquired the resource again while it was live.
    Released,
    /// It expired, and no other owner has taken the resource since.
    Expired,
    /// It expired, then another owner acquired the resource.
    TakenOver,
}

impl From<LeaseEnd> for End {
    fn from(end: LeaseEnd) -> Self {
        match end {
            LeaseEnd::Live => Self::Live,
            LeaseEnd::Released => Self::Released,
            LeaseEnd::Expired => Self::Expired,
            LeaseEnd::TakenOver => Self::TakenOver,
        }
    }
}

/// One lease of the resource: neither its owner (the holder's secret) nor a `fence_token`
/// (a right to write through a guard).
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PastLease)]
struct PastLeaseView {
    /// The lease's fencing token.
    #[schema(value_type = i64, minimum = 1, maximum = 9_007_199_254_740_991_i64)]
    fence: Fence,
    /// RFC 3339 UTC, millisecond precision.
    #[schema(format = DateTime)]
    acquired_at: String,
    /// When it ended: the release time, or its `expires_at` (expired, taken over). `null`
    /// while live.
    #[schema(format = DateTime, required = true)]
    ended_at: Option<String>,
    end: End,
    /// How often it was renewed.
    #[schema(minimum = 0)]
    renewals: u32,
}

impl PastLeaseView {
    fn new(lease: &PastLease, history: &LeaseHistory) -> Self {
        let (end, ended_at) = lease.end(history.observed_at);
        Self {
            fence: lease.fence,
            acquired_at: rfc3339_millis(lease.acquired_at),
            ended_at: ended_at.map(rfc3339_millis),
            end: end.into(),
            renewals: lease.renewals,
        }
    }
}

/// The resource's most recent leases, newest (greatest fence) first.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = LeaseHistory)]
struct HistoryView<'a> {
    /// The resource.
    resource: &'a str,
    leases: Vec<PastLeaseView>,
}

/// `GET /locks/{resource}/history?limit=N`
#[utoipa::path(
    get, path = "/locks/{resource}/history", tag = "locks",
    params(wire::ResourcePath, wire::HistoryParams),
    summary = "The resource's most recent leases, newest first, without owners",
    responses(
        (status = 200, body = HistoryView<'_>, description = "The leases; an empty list when there are none"),
        wire::HistoryProblems,
    ),
)]
pub(super) async fn history(
    LockRead(request, state): LockRead<HistoryRequest>,
) -> Result<HttpResponse, ApiError> {
    let history = state.ask(state.store.history(&request)).await?;
    Ok(HttpResponse::Ok().json(HistoryView {
        resource: request.resource.as_str(),
        leases: history
            .leases
            .iter()
            .map(|lease| PastLeaseView::new(lease, &history))
            .collect(),
    }))
}
