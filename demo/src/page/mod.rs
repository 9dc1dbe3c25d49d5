//! The paused-worker story as a page: `GET /` and its assets, the page's state as JSON, and
//! the buttons' endpoint that plays a story.
//!
//! - `GET /`, `GET /page.css`, `GET /page.js`, `GET /page.svg`: the page, shipped inside the
//!   binary, each with `Content-Security-Policy: default-src 'self'` (no inline script or
//!   style, nothing from elsewhere). They are not in the OpenAPI document, which describes
//!   the JSON API.
//! - `GET /page/state`: the newest runs, each with its events, the write log of its key
//!   (every attempt named by worker), the document, and for the newest run the lease as the
//!   lease server sees it. The page polls it.
//! - `POST /page/runs` `{"story": "guard-on" | "guard-off" | "gap" | "gap-checked"}`: plays
//!   the story on a fresh key; `202` with the run. At most [`stage::MAX_PLAYING`] play at once
//!   (`429 quota-exceeded` beyond).

pub mod stage;

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::SecondsFormat;
use fencelock::http::body::{JsonObject, string};
use fencelock::http::query::{self, Params};
use fencelock::http::{self, ApiError, FieldError};
use serde::Serialize;
use serde_json::Value;

use crate::docs::{MAX_PAGE_LIMIT, Page};
use crate::wire;
use stage::{Event, Phase, Run, Verdict};
pub use stage::{PageOptions, Stage, Story};

/// What the page may load: its own files and its own endpoints, nothing else.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'";

const INDEX_HTML: &str = include_str!("assets/index.html");
const PAGE_CSS: &str = include_str!("assets/page.css");
const PAGE_JS: &str = include_str!("assets/page.js");
const PAGE_SVG: &str = include_str!("assets/page.svg");

/// The page's routes, for the demo store's app.
pub(crate) fn routes(config: &mut web::ServiceConfig) {
    config
        .service(http::resource("/", "GET").route(web::get().to(index)))
        .service(http::resource("/page.css", "GET").route(web::get().to(css)))
        .service(http::resource("/page.js", "GET").route(web::get().to(js)))
        .service(http::resource("/page.svg", "GET").route(web::get().to(svg)))
        .service(http::resource("/page/state", "GET").route(web::get().to(state)))
        .service(http::resource("/page/runs", "POST").route(web::post().to(play)));
}

fn asset(content_type: &'static str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(body)
}

async fn index() -> HttpResponse {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn css() -> HttpResponse {
    asset("text/css; charset=utf-8", PAGE_CSS)
}

async fn js() -> HttpResponse {
    asset("text/javascript; charset=utf-8", PAGE_JS)
}

async fn svg() -> HttpResponse {
    asset("image/svg+xml", PAGE_SVG)
}

/// The page's view of everything it shows.
#[derive(Serialize, utoipa::ToSchema)]
pub struct PageState {
    /// Whether this store checks fences (`--no-guard` switches it off).
    guard: GuardState,
    /// The lease server the stories use; `null` until the first story needs it (the
    /// `store` command starts its in-process one then).
    #[schema(required = true)]
    lease_server: Option<String>,
    /// The stories' lease TTL.
    ttl_seconds: u64,
    /// The pause after each step of a story.
    beat_ms: u64,
    /// The newest runs, newest first.
    runs: Vec<RunState>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
enum GuardState {
    On,
    Off,
}

/// One play of a story.
#[derive(Serialize, utoipa::ToSchema)]
pub struct RunState {
    id: u64,
    story: Story,
    /// The document key and lock resource of this run: fresh for every run.
    key: String,
    /// Whether the store this run writes to checks fences: this store's guard for every
    /// story but `guard-off`, which writes to an unguarded copy.
    guarded: bool,
    /// RFC 3339 UTC, millisecond precision.
    #[schema(format = DateTime)]
    started_at: String,
    phase: Phase,
    /// How the run ended; `null` while it plays, or when it failed.
    #[schema(required = true)]
    verdict: Option<Verdict>,
    /// Why the run failed; `null` unless it did.
    #[schema(required = true)]
    error: Option<String>,
    /// What happened, oldest first.
    events: Vec<Event>,
    /// The store's write log of the key, oldest first: every attempt, applied or rejected.
    writes: Vec<Mark>,
    /// The document as the store holds it; `null` before the first applied write.
    #[schema(required = true)]
    document: Option<DocumentState>,
    /// The live lease on the key as the lease server sees it, for the newest run only;
    /// `null` when there is none (or for older runs).
    #[schema(required = true)]
    lease: Option<LeaseState>,
    /// Why `lease` is unknown: the lease server did not answer. `null` otherwise.
    #[schema(required = true)]
    lease_error: Option<String>,
}

/// One write attempt on a run's key.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Mark {
    #[serde(flatten)]
    write: wire::WriteRecord,
    /// The worker the story granted this fence to; `null` for a fence it did not grant.
    #[schema(required = true)]
    worker: Option<&'static str>,
    /// Made after a greater fence had been granted: the writer had lost its lease.
    late: bool,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct DocumentState {
    value: Value,
    #[schema(minimum = 1)]
    fence: i64,
    /// The worker whose fence wrote it, as in [`Mark::worker`].
    #[schema(required = true)]
    worker: Option<&'static str>,
    /// RFC 3339 UTC, millisecond precision.
    #[schema(format = DateTime)]
    updated_at: String,
}

/// A live lease as the lease server shows it (never its owner), with the worker the story
/// granted its fence to.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LeaseState {
    #[schema(minimum = 1)]
    fence: i64,
    #[schema(required = true)]
    holder: Option<&'static str>,
    /// Time left by the lease server's clock when it answered.
    expires_in_ms: i64,
}

#[utoipa::path(
    get, path = "/page/state", tag = "page",
    summary = "What the page shows: the newest story runs, their write logs, documents and lease",
    responses(
        (status = 200, body = PageState, description = "The page's state"),
        wire::StateProblems,
    ),
)]
pub(crate) async fn state(
    req: HttpRequest,
    stage: web::Data<Stage>,
) -> Result<HttpResponse, ApiError> {
    let Params { errors, .. } = query::params(
        req.query_string(),
        [],
        "unknown parameter; this endpoint takes none",
        "given more than once",
    )
    .map_err(|e| ApiError::Validation(vec![e]))?;
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    let options = stage.options();
    let backstage = stage.started_backstage();
    let mut runs = Vec::new();
    for (i, run) in stage.runs().iter().enumerate() {
        runs.push(run_state(&stage, run, i == 0).await?);
    }
    let body = PageState {
        guard: match options.guarding {
            crate::docs::Guarding::On => GuardState::On,
            crate::docs::Guarding::Off => GuardState::Off,
        },
        lease_server: backstage.map(|b| b.lease_url.clone()),
        ttl_seconds: options.ttl.as_secs(),
        beat_ms: u64::try_from(options.beat.as_millis()).unwrap_or(u64::MAX),
        runs,
    };
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(body))
}

async fn run_state(stage: &Stage, run: &Run, newest: bool) -> Result<RunState, ApiError> {
    let view = run.view();
    let holder = |fence: i64| view.holders.get(&fence).copied();
    let time = |at: chrono::DateTime<chrono::Utc>| at.to_rfc3339_opts(SecondsFormat::Millis, true);
    let (mut writes, mut document) = (Vec::new(), None);
    if let Some(docs) = stage.docs_of(run) {
        let page = Page {
            after: 0,
            limit: MAX_PAGE_LIMIT,
        };
        let timeout = stage.store_timeout();
        let log = ask(timeout, docs.writes(&run.key, page)).await?;
        writes = log
            .writes
            .iter()
            .map(|w| Mark {
                write: w.into(),
                worker: holder(w.fence),
                late: view
                    .grants
                    .iter()
                    .any(|(fence, granted)| *fence > w.fence && *granted <= w.at),
            })
            .collect();
        document = ask(timeout, docs.get(&run.key))
            .await?
            .map(|doc| DocumentState {
                worker: holder(doc.fence),
                fence: doc.fence,
                updated_at: time(doc.updated_at),
                value: doc.value,
            });
    }
    let (mut lease, mut lease_error) = (None, None);
    if let (true, Some(backstage)) = (newest, stage.started_backstage()) {
        match backstage.locks.inspect(run.key.as_str()).await {
            Ok(live) => {
                lease = live.map(|l| LeaseState {
                    holder: holder(l.fence),
                    fence: l.fence,
                    expires_in_ms: l.expires_in_ms,
                });
            }
            Err(e) => lease_error = Some(e.to_string()),
        }
    }
    Ok(RunState {
        id: run.id,
        story: run.story,
        key: run.key.to_string(),
        guarded: stage.guarded(run),
        started_at: time(run.started_at),
        phase: view.phase,
        verdict: view.verdict,
        error: view.error,
        events: view.events,
        writes,
        document,
        lease,
        lease_error,
    })
}

/// A store call within the store timeout: past it, `503`, as every demo store request.
async fn ask<T>(
    timeout: std::time::Duration,
    operation: impl Future<Output = Result<T, fencelock_server::StoreError>>,
) -> Result<T, ApiError> {
    match tokio::time::timeout(timeout, operation).await {
        Ok(result) => result.map_err(ApiError::from),
        Err(_) => Err(ApiError::StoreUnavailable(anyhow::anyhow!(
            "the store did not answer within {timeout:?}"
        ))),
    }
}

/// A run just started.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Started {
    id: u64,
    story: Story,
    key: String,
}

/// The body of `POST /page/runs` (read field by field by `play`, for its `422`s).
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PlayBody {
    story: Story,
}

#[utoipa::path(
    post, path = "/page/runs", tag = "page",
    summary = "Play a story on a fresh key, against the lease server and this store",
    request_body(content = PlayBody, content_type = "application/json"),
    responses(
        (status = 202, body = Started, description = "The story has started; \
            `GET /page/state` shows it as it plays"),
        wire::PlayProblems,
    ),
)]
pub(crate) async fn play(
    JsonObject(body): JsonObject,
    stage: web::Data<Stage>,
) -> Result<HttpResponse, ApiError> {
    let mut errors = Vec::new();
    let mut story = None;
    for (field, raw) in &body {
        if field != "story" {
            errors.push(FieldError::new(
                field.clone(),
                "unknown field; the field is story",
            ));
            continue;
        }
        let names = Story::ALL.map(Story::as_str).join(", ");
        match string(raw).map(|text| Story::parse(&text)) {
            Ok(Some(found)) => story = Some(found),
            Ok(None) => errors.push(FieldError::new("story", format!("must be one of {names}"))),
            Err(message) => errors.push(FieldError::new("story", message)),
        }
    }
    if story.is_none() && errors.is_empty() {
        errors.push(FieldError::new("story", "is required"));
    }
    let Some(story) = story.filter(|_| errors.is_empty()) else {
        return Err(ApiError::Validation(errors));
    };
    let run = stage.into_inner().play(story).await?;
    Ok(HttpResponse::Accepted().json(Started {
        id: run.id,
        story: run.story,
        key: run.key.to_string(),
    }))
}
