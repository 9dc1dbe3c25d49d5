//! `GET /locks/{resource}/watch?fence=F&timeout_ms=T`: wait until the lease with fence `F`
//! ends (release, expiry, takeover, re-acquisition), or answer at once when it is not the
//! live lease.
//!
//! Woken by the same announcements as waiting acquisitions (the store's
//! [`crate::wake::Changes`]); an expiry is announced by nobody, so the watch arms a timer on
//! the lease's `expires_at` by the store's clock. While nothing changes it costs no store
//! read beyond one at the expiry.

use std::time::{Duration, Instant};

use actix_web::HttpResponse;
use serde::Serialize;

use super::locks::LockRead;
use super::parse::WatchRequest;
use super::view::{self, LockView};
use super::wire;
use crate::wake::{Registration, Watching};
use fencelock::domain::time_left_ms;
use fencelock::http::ApiError;

/// Added to the lease's time left before looking again: the store's clock reading and ours
/// are a round trip apart, and a look that comes a moment early costs a second look.
const EXPIRY_SLACK: Duration = Duration::from_millis(1);

/// The answer of a watch.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct WatchResponse<'a> {
    /// Whether the lease with the given `fence` is not the live lease (any more): `true` when
    /// it ended before the timeout, or was not live when the watch began; `false` on a
    /// timeout, and always without `fence`.
    changed: bool,
    /// The live lease as inspect shows it (no owner), `null` when there is none.
    #[schema(value_type = Option<view::LiveLease>, required = true)]
    lock: Option<LockView<'a>>,
}

/// `GET /locks/{resource}/watch?fence=F&timeout_ms=T`
#[utoipa::path(
    get, path = "/locks/{resource}/watch", tag = "locks",
    params(wire::ResourcePath, wire::WatchParams),
    summary = "Wait until the lease with a given fence ends, or answer at once when it is not the live lease",
    responses(
        (status = 200, body = WatchResponse<'_>, description = "The lease changed (or the watch timed out), with the live lease"),
        wire::WatchProblems,
    ),
)]
pub(super) async fn watch(
    LockRead(WatchRequest { resource, query }, state): LockRead<WatchRequest>,
) -> Result<HttpResponse, ApiError> {
    let until = Instant::now() + query.timeout.duration();
    let mut changes = state.store.changes().subscribe(&resource);
    changes.mark_seen();
    // The first look registers the watch with the store (kept until the answer), so that
    // every change from then on is announced; later looks only read. Without a fence the
    // answer comes at once, and there is nothing to register.
    let watching = match query.fence {
        Some(_) => {
            state
                .ask(state.store.watch(&resource, query.timeout.duration()))
                .await?
        }
        None => Watching {
            lease: state.ask(state.store.inspect(&resource)).await?.live(),
            registration: Registration::none(),
        },
    };
    let _registration = watching.registration;
    let mut first = Some(watching.lease);
    loop {
        let lease = match first.take() {
            Some(lease) => lease,
            None => {
                changes.mark_seen();
                state.ask(state.store.inspect(&resource)).await?.live()
            }
        };
        let watched = query
            .fence
            .filter(|fence| lease.as_ref().is_some_and(|l| l.fence == *fence));
        let now = Instant::now();
        let done = match (query.fence, watched) {
            (None, _) => Some(false),
            (Some(_), None) => Some(true),
            (Some(_), Some(_)) if now >= until => Some(false),
            (Some(_), Some(_)) => None,
        };
        if let Some(changed) = done {
            let lock = lease
                .as_ref()
                .map(|lease| LockView::without_owner(lease, state.fence_key.as_ref()));
            return Ok(HttpResponse::Ok().json(WatchResponse { changed, lock }));
        }
        let left = lease
            .as_ref()
            .map_or(0, |l| time_left_ms(l.expires_at, l.observed_at));
        let expiry = Duration::from_millis(u64::try_from(left).unwrap_or(0)) + EXPIRY_SLACK;
        tokio::select! {
            () = changes.changed() => {}
            () = tokio::time::sleep(expiry.min(until - now)) => {}
        }
    }
}
