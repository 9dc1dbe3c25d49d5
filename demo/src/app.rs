//! The demo store's HTTP API, built on the write guard:
//!
//! - `PUT /docs/{key}` with `Fencing-Token` and any JSON body: `200 {"key", "value", "fence"}`
//!   when applied, `409 stale-fence` with `current_fence` when a greater fence wrote first.
//!   A store started with fence keys takes only a `fence_token` the lease server signed for
//!   `key` with one of them: a forged token, another resource's or a bare fence is `403
//!   invalid-fence-token`, what is no token at all `400 malformed-request` (as without
//!   keys), and nothing is written or logged.
//! - `GET /docs/{key}`: `200 {"key", "value", "fence", "updated_at"}` or `404`.
//! - `GET /metrics`: the Prometheus text format, with the guard's
//!   `fencelock_guard_writes_total{outcome="admitted"|"stale"|"invalid_token"}` and the HTTP
//!   families.
//! - `GET /docs/{key}/writes?limit=N&after=ID`: one page of the key's write log, oldest
//!   first: `200 {"writes": [{"id", "fence", "outcome", "at"}, ...], "next": ID | null}`.
//!   Every attempt is there, `outcome` `"applied"` or `"rejected"`. `limit` is 1-1000
//!   (default 100); `after` is the `next` of the previous page (absent or `0`: from the
//!   start); `next` is `null` on the last page. A bad `limit` or `after`, or any other
//!   parameter, is `422 validation-failed` naming it.
//!
//! - `GET /openapi.json`: this API's OpenAPI document ([`document`]), the page's endpoints
//!   included; its shapes and problem answers are in [`crate::wire`].
//! - `GET /`: the paused-worker story as a page, and its JSON endpoints ([`crate::page`]).
//!
//! Every store call is bounded by the store timeout: past it, or when the database cannot be
//! reached, the answer is `503 store-unavailable` with `Retry-After`, as from the lease
//! server; a bug is a `500`.

use std::future::{Ready, ready};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Payload;
use actix_web::dev::{Server, ServerHandle};
use actix_web::middleware::from_fn;
use actix_web::{App, FromRequest, HttpRequest, HttpResponse, HttpServer, web};
use anyhow::Context as _;
use chrono::SecondsFormat;
use fencelock::domain::{FenceKeys, ResourceName};
use fencelock::guard::{self, FencingToken, Guard, GuardMetrics};
use fencelock::http::body::read_json;
use fencelock::http::metrics::HttpMetrics;
use fencelock::http::openapi::finish;
use fencelock::http::query::{self, Params, decimal};
use fencelock::http::{self, ApiError, FieldError};
use fencelock::metrics::Registry;
use fencelock_server::{StoreError, StoreOptions};
use serde_json::{Value, json};
use utoipa::OpenApi;

use crate::docs::{self, MAX_PAGE_LIMIT, Outcome, Page, Put, SharedDocs, Write};
use crate::page::{self, PageOptions, Stage, stage};
use crate::wire;

/// A bound demo store that has not started serving yet.
pub struct DemoServer {
    port: u16,
    server: Server,
    stage: Arc<Stage>,
}

/// What every handler shares.
pub(crate) struct Docs {
    store: SharedDocs,
    /// Checks every write's `Fencing-Token` against the key written, before the store.
    guard: Guard,
    /// Longest a request waits on the store; past it the answer is `503`, never a hang.
    timeout: Duration,
}

impl Docs {
    /// Awaits a store operation within the store timeout.
    async fn ask<T>(
        &self,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, ApiError> {
        match tokio::time::timeout(self.timeout, operation).await {
            Ok(result) => result.map_err(ApiError::from),
            Err(_) => Err(ApiError::StoreUnavailable(anyhow::anyhow!(
                "the store did not answer within {:?}",
                self.timeout
            ))),
        }
    }
}

impl DemoServer {
    /// Opens the documents at `url` (see [`docs::open`]; `None`: the SQLite file
    /// `fencelock-demo.db`), guarded as `page.guarding` says by a guard that holds `keys`
    /// (none: bare fences), and builds the store on `bind` with a metrics registry of its own
    /// (see [`DemoServer::build`]).
    pub async fn open(
        bind: SocketAddr,
        url: Option<&str>,
        keys: FenceKeys,
        settings: StoreOptions,
        page: PageOptions,
    ) -> anyhow::Result<Self> {
        let registry = Registry::new();
        let guard = Guard::new(keys, GuardMetrics::register(&registry));
        let docs = docs::open(url, page.guarding, settings, &guard).await?;
        Self::build(bind, docs, guard, settings.timeout, registry, page)
    }

    /// Binds `bind` and builds the app; `store_timeout` bounds every store call of every
    /// request (see [`crate::docs::StoreOptions`]). `guard` checks each write's token (with
    /// its keys, if any) and counts in `registry`, which `GET /metrics` serves; `docs` must
    /// have been opened with the same guard (see [`crate::docs::open`]). `page` says how the
    /// page at `/` plays its stories.
    pub fn build(
        bind: SocketAddr,
        docs: SharedDocs,
        guard: Guard,
        store_timeout: Duration,
        registry: Registry,
        page: PageOptions,
    ) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(bind).with_context(|| format!("binding {bind}"))?;
        let bound = listener.local_addr()?;
        let port = bound.port();
        let stage = Arc::new(Stage::new(
            page,
            bound,
            docs.clone(),
            guard.clone(),
            store_timeout,
        ));
        let stage_data = web::Data::from(stage.clone());
        let docs = web::Data::new(Docs {
            store: docs,
            guard,
            timeout: store_timeout,
        });
        let http_metrics = web::Data::new(HttpMetrics::register(&registry));
        let registry = web::Data::new(registry);
        fencelock_server::install_refusal_renderer();
        // The answers the HTTP parser gives by itself are counted in the connection's metrics.
        let refusals = http_metrics.get_ref().clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(docs.clone())
                .app_data(registry.clone())
                .app_data(http_metrics.clone())
                .app_data(stage_data.clone())
                .configure(page::routes)
                .service(
                    http::resource("/docs/{key}", "GET, PUT")
                        .route(web::put().to(put_doc))
                        .route(web::get().to(get_doc)),
                )
                .service(
                    http::resource("/docs/{key}/writes", "GET").route(web::get().to(list_writes)),
                )
                .service(
                    http::resource("/metrics", "GET").route(web::get().to(http::metrics::expose)),
                )
                .service(http::resource("/openapi.json", "GET").route(web::get().to(openapi)))
                .default_service(web::to(http::not_found))
                .wrap(from_fn(http::observe))
                .wrap(from_fn(http::metrics::count))
        })
        .disable_signals()
        .on_connect(move |_, extensions| {
            fencelock_server::count_refusals(extensions, &refusals);
        })
        .listen(listener)?
        .run();
        Ok(Self {
            port,
            server,
            stage,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts what the page's stories need beyond this store now rather than at the first
    /// story (the in-process lease server, the unguarded copy), and answers the lease
    /// server's URL.
    pub async fn prepare_page(&self) -> anyhow::Result<String> {
        Ok(self.stage.backstage().await?.lease_url.clone())
    }

    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        self.server.await.context("serving HTTP")
    }
}

/// `GET /openapi.json`
async fn openapi() -> HttpResponse {
    http::openapi::serve(&document())
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "fencelock demo store",
        description = "A small protected store whose writes pass the fencelock write guard: \
            each write carries the fence of its lease in `Fencing-Token`, and a write with a \
            fence below the highest accepted for its key is refused (`409 stale-fence`).",
        license(name = "MIT OR Apache-2.0", identifier = "MIT OR Apache-2.0"),
    ),
    paths(put_doc, get_doc, list_writes, page::state, page::play),
    components(schemas(
        wire::Applied, wire::Document, wire::WritesPage, wire::WriteRecord, Outcome,
        page::PageState, page::RunState, page::Mark, page::DocumentState, page::LeaseState,
        page::Started, page::PlayBody, page::Story, stage::Verdict, stage::VerdictKind,
        stage::Event, stage::Phase,
    )),
    tags(
        (name = "docs", description = "Documents and their write log"),
        (name = "page", description = "The paused-worker page's state, and its buttons"),
    ),
)]
struct DemoStoreApi;

/// The demo store's OpenAPI 3.1 document, generated from the code (its handlers' paths,
/// [`crate::wire`], the page's types): what `GET /openapi.json` serves.
pub fn document() -> Value {
    finish(DemoStoreApi::openapi())
}

fn key(raw: &str) -> Result<ResourceName, ApiError> {
    ResourceName::parse(raw).map_err(|e| ApiError::validation("key", e))
}

/// A document's `{key}`, parsed: a [`ResourceName`] (the lease server's resource rules), or
/// `422` naming `key`.
pub(crate) struct Key(ResourceName);

impl FromRequest for Key {
    type Error = actix_web::Error;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let parsed = web::Path::<String>::from_request(req, payload)
            .into_inner()
            .and_then(|raw| Ok(Self(key(&raw)?)));
        ready(parsed)
    }
}

#[utoipa::path(
    put, path = "/docs/{key}", tag = "docs", params(wire::KeyPath, wire::FencingTokenHeader),
    summary = "Write a document, if the writer's fence is not stale",
    request_body(content = serde_json::Value, content_type = "application/json",
        description = "Any JSON value"),
    responses(
        (status = 200, body = wire::Applied, description = "Applied"),
        wire::PutProblems,
    ),
)]
pub(crate) async fn put_doc(
    req: HttpRequest,
    // Extracted in this order: a missing or malformed token is refused before a bad key.
    token: FencingToken,
    Key(key): Key,
    payload: web::Payload,
    docs: web::Data<Docs>,
) -> Result<HttpResponse, ApiError> {
    // The token is checked for this key before the body is read: a refused one writes
    // nothing, not even the write log.
    let checked = docs.guard.check(key.as_str(), &token)?;
    let fence = checked.fence();
    let write = Write {
        key,
        value: read_json(&req, payload).await?,
        fence: checked,
    };
    let key = &write.key;
    match docs.ask(docs.store.put(&write)).await? {
        Put::Applied(doc) => {
            tracing::info!(doc.key = %key, write.fence = fence.get(), "write applied");
            Ok(HttpResponse::Ok().json(json!({
                "key": doc.key,
                "value": doc.value,
                "fence": doc.fence,
            })))
        }
        Put::Stale { current } => {
            tracing::info!(
                doc.key = %key,
                write.fence = fence.get(),
                current_fence = current.get(),
                "write rejected: stale fence"
            );
            Err(guard::stale_write(key.as_str(), current).into())
        }
    }
}

#[utoipa::path(
    get, path = "/docs/{key}", tag = "docs", params(wire::KeyPath),
    summary = "A document",
    responses((status = 200, body = wire::Document, description = "The document"), wire::GetProblems),
)]
pub(crate) async fn get_doc(
    Key(key): Key,
    docs: web::Data<Docs>,
) -> Result<HttpResponse, ApiError> {
    let doc = docs.ask(docs.store.get(&key)).await?;
    let doc = doc.ok_or_else(|| ApiError::NotFound(format!("no document {key}")))?;
    Ok(HttpResponse::Ok().json(json!({
        "key": doc.key,
        "value": doc.value,
        "fence": doc.fence,
        "updated_at": doc.updated_at.to_rfc3339_opts(SecondsFormat::Millis, true),
    })))
}

#[utoipa::path(
    get, path = "/docs/{key}/writes", tag = "docs", params(wire::KeyPath, wire::PageQuery),
    summary = "One page of the key's write log, oldest first; rejected writes stay visible",
    responses(
        (status = 200, body = wire::WritesPage, description = "A page of the write log"),
        wire::WritesProblems,
    ),
)]
pub(crate) async fn list_writes(
    req: HttpRequest,
    path: web::Path<String>,
    docs: web::Data<Docs>,
) -> Result<HttpResponse, ApiError> {
    // Every input error is reported at once, before the store is asked.
    let (key, page) = match (key(&path), page(req.query_string())) {
        (Ok(key), Ok(page)) => (key, page),
        (key, page) => {
            let mut errors = Vec::new();
            if let Err(ApiError::Validation(key_errors)) = key {
                errors.extend(key_errors);
            }
            if let Err(page_errors) = page {
                errors.extend(page_errors);
            }
            return Err(ApiError::Validation(errors));
        }
    };
    let page = docs.ask(docs.store.writes(&key, page)).await?;
    let writes: Vec<_> = page.writes.iter().map(wire::WriteRecord::from).collect();
    Ok(HttpResponse::Ok().json(json!({ "writes": writes, "next": page.next })))
}

/// Reads `limit` and `after` from a query string. Anything else, a parameter given twice,
/// or a value that is not a plain decimal integer in range is an error naming the parameter.
fn page(query: &str) -> Result<Page, Vec<FieldError>> {
    let Params {
        values: [limit, after],
        mut errors,
    } = query::params(
        query,
        ["limit", "after"],
        "unknown parameter; the parameters are limit and after",
        "given more than once",
    )
    .map_err(|e| vec![e])?;
    let mut page = Page::default();
    if let Some(text) = limit {
        match decimal(&text).and_then(|n| u32::try_from(n).ok()) {
            Some(n @ 1..=MAX_PAGE_LIMIT) => page.limit = n,
            _ => errors.push(FieldError::new(
                "limit",
                format!("must be an integer from 1 to {MAX_PAGE_LIMIT}"),
            )),
        }
    }
    if let Some(text) = after {
        match decimal(&text).and_then(|n| i64::try_from(n).ok()) {
            Some(n) => page.after = n,
            None => errors.push(FieldError::new(
                "after",
                "must be the \"next\" value of the previous page: an integer from 0",
            )),
        }
    }
    if errors.is_empty() {
        Ok(page)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(query: &str) -> Vec<String> {
        page(query)
            .unwrap_err()
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    #[test]
    fn page_parameters_have_defaults_and_bounds() {
        assert_eq!(page(""), Ok(Page::default()));
        assert_eq!(
            page("limit=1000&after=42"),
            Ok(Page {
                after: 42,
                limit: 1000
            })
        );
        assert_eq!(page("limit=1").map(|p| p.limit), Ok(1));
        assert_eq!(page("after=0").map(|p| p.after), Ok(0));
        assert_eq!(
            page("after=9223372036854775807").map(|p| p.after),
            Ok(i64::MAX)
        );
    }

    #[test]
    fn bad_page_parameters_are_named() {
        // Out of range, or not a plain decimal (whose every form `http::query` tests).
        for bad in ["0", "1001", "+5", "1e2", "", " 5"] {
            assert_eq!(fields(&format!("limit={bad}")), ["limit"], "limit={bad:?}");
        }
        for bad in ["-1", "+1", "1.5", "", "x", "9223372036854775808"] {
            assert_eq!(fields(&format!("after={bad}")), ["after"], "after={bad:?}");
        }
        assert_eq!(fields("limit"), ["limit"]);
        assert_eq!(fields("limit=5&limit=6"), ["limit"]);
        assert_eq!(fields("limt=5"), ["limt"]);
        assert_eq!(fields("limit=0&after=x"), ["limit", "after"]);
    }
}
