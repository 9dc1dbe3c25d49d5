//! The demo store's HTTP API, built on the write guard:
//!
//! - `PUT /docs/{key}` with `Fencing-Token` and any JSON body: `200 {"key", "value", "fence"}`
//!   when applied, `409 stale-fence` with `current_fence` when a greater fence wrote first.
//! - `GET /docs/{key}`: `200 {"key", "value", "fence", "updated_at"}` or `404`.
//! - `GET /docs/{key}/writes`: `200 {"writes": [{"fence", "outcome", "at"}, ...]}`, oldest first.
//!
//! Every store call is bounded by the store timeout: past it, or when the database cannot be
//! reached, the answer is `503 store-unavailable` with `Retry-After`, as from the lease
//! server; a bug is a `500`.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use actix_web::dev::{Server, ServerHandle};
use actix_web::middleware::from_fn;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use anyhow::Context as _;
use chrono::SecondsFormat;
use fencelock::domain::ResourceName;
use fencelock::guard::{self, FencingToken};
use fencelock::input::read_json;
use fencelock::problem::ApiError;
use fencelock::routes;
use fencelock::store::StoreError;
use serde_json::json;

use crate::docs::{Put, SharedDocs};

/// A bound demo store that has not started serving yet.
pub struct DemoServer {
    port: u16,
    server: Server,
}

/// What every handler shares.
struct Docs {
    store: SharedDocs,
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
    /// Binds `bind` and builds the app; `store_timeout` bounds every store call of every
    /// request (see [`crate::docs::StoreSettings`]).
    pub fn build(
        bind: SocketAddr,
        docs: SharedDocs,
        store_timeout: Duration,
    ) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(bind).with_context(|| format!("binding {bind}"))?;
        let port = listener.local_addr()?.port();
        let docs = web::Data::new(Docs {
            store: docs,
            timeout: store_timeout,
        });
        let server = HttpServer::new(move || {
            App::new()
                .app_data(docs.clone())
                .service(
                    web::resource("/docs/{key}")
                        .route(web::put().to(put_doc))
                        .route(web::get().to(get_doc))
                        .default_service(web::to(routes::not_allowed("GET, PUT"))),
                )
                .service(
                    web::resource("/docs/{key}/writes")
                        .route(web::get().to(list_writes))
                        .default_service(web::to(routes::not_allowed("GET"))),
                )
                .default_service(web::to(routes::not_found))
                .wrap(from_fn(routes::observe))
        })
        .disable_signals()
        .listen(listener)?
        .run();
        Ok(Self { port, server })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        self.server.await.context("serving HTTP")
    }
}

fn key(raw: &str) -> Result<ResourceName, ApiError> {
    ResourceName::parse(raw).map_err(|e| ApiError::validation("key", e))
}

async fn put_doc(
    req: HttpRequest,
    path: web::Path<String>,
    FencingToken(fence): FencingToken,
    payload: web::Payload,
    docs: web::Data<Docs>,
) -> Result<HttpResponse, ApiError> {
    let key = key(&path)?;
    let value = read_json(&req, payload).await?;
    match docs.ask(docs.store.put(&key, &value, fence)).await? {
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
            Err(guard::stale_write(key.as_str(), current))
        }
    }
}

async fn get_doc(path: web::Path<String>, docs: web::Data<Docs>) -> Result<HttpResponse, ApiError> {
    let key = key(&path)?;
    let doc = docs.ask(docs.store.get(&key)).await?;
    let doc = doc.ok_or_else(|| ApiError::NotFound(format!("no document {key}")))?;
    Ok(HttpResponse::Ok().json(json!({
        "key": doc.key,
        "value": doc.value,
        "fence": doc.fence,
        "updated_at": doc.updated_at.to_rfc3339_opts(SecondsFormat::Millis, true),
    })))
}

async fn list_writes(
    path: web::Path<String>,
    docs: web::Data<Docs>,
) -> Result<HttpResponse, ApiError> {
    let key = key(&path)?;
    let writes = docs.ask(docs.store.writes(&key)).await?;
    let writes: Vec<_> = writes
        .iter()
        .map(|w| {
            json!({
                "fence": w.fence,
                "outcome": w.outcome,
                "at": w.at.to_rfc3339_opts(SecondsFormat::Millis, true),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "writes": writes })))
}
