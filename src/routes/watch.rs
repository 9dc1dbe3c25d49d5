//! `GET /locks/{resource}/watch?fence=F&timeout_ms=T`: wait until the lease with fence `F`
//! ends (release, expiry, takeover, re-acquisition), or answer at once when it is not the
//! live lease.
//!
//! Woken by the same announcements as waiting acquisitions (the store's
//! [`crate::wake::Changes`]); an expiry is announced by nobody, so the watch arms a timer on
//! the lease's `expires_at` by the store's clock. While nothing changes it costs no store
//! read beyond one at the expiry, and the watches of a resource woken together share one
//! read ([`crate::wake::Changes::look`]).

use std::time::{Duration, Instant};

use actix_web::{HttpResponse, web};
use futures_util::FutureExt as _;
use serde::Serialize;

use super::AppState;
use super::locks::LockRead;
use super::parse::WatchRequest;
use super::view::{self, LockView};
use super::wire;
use crate::wake::{Need, Registration, Watching};
use fencelock::domain::{Lease, ResourceName, time_left_ms};
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
    let began = Instant::now();
    let until = began + query.timeout.duration();
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
    // A look's answer, when it came (the lease's time left counts from then), and the moment
    // a later look must not precede. For the first look that is when it began, not when this
    // task got its answer: under load the task may resume after a release its look came
    // before, and it must still share the look that the release's announcement starts. A
    // shared look's moment is its answer's, stamped as the read ended.
    let mut first = Some((watching.lease, Instant::now(), began));
    // What the next look must account for beyond the announcements seen: the moment the
    // watch was woken for (a lease's expiry), or nothing later than the last look.
    let mut after = began;
    loop {
        let (lease, looked_at, not_before) = match first.take() {
            Some(first) => first,
            None => {
                let seen = changes.mark_seen();
                let (lease, at) = look(&state, &resource, Need { seen, after }).await?;
                (lease, at, at)
            }
        };
        let watched = query
            .fence
            .filter(|fence| lease.as_ref().is_some_and(|l| l.fence == *fence));
        let done = match (query.fence, watched) {
            (None, _) => Some(false),
            (Some(_), None) => Some(true),
            (Some(_), Some(_)) if Instant::now() >= until => Some(false),
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
        let wake_at = (looked_at + expiry).min(until);
        after = tokio::select! {
            () = changes.changed() => not_before,
            () = tokio::time::sleep_until(wake_at.into()) => wake_at,
        };
    }
}

/// The live lease and when it was read, by a look the resource's other watches share (a
/// release wakes them all at once): one read of the store for all of them. A look that
/// failed is made again here, so that its error is this watch's answer.
async fn look(
    state: &web::Data<AppState>,
    resource: &ResourceName,
    need: Need,
) -> Result<(Option<Lease>, Instant), ApiError> {
    let shared = state.store.changes().look(resource.as_str(), need, || {
        let (state, resource) = (state.clone(), resource.clone());
        async move {
            let inspection = state.ask(state.store.inspect(&resource)).await;
            inspection.ok().map(|i| (i.live(), Instant::now()))
        }
        .boxed()
    });
    match shared.await {
        Some(answer) => Ok(answer),
        None => Ok((
            state.ask(state.store.inspect(resource)).await?.live(),
            Instant::now(),
        )),
    }
}
