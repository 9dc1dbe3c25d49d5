//! The demo store's HTTP API, built on the write guard:
//!
//! - `PUT /docs/{key}` with `Fencing-Token` and any JSON body: `200 {"key", "value", "fence"}`
//!   when applied, `409 stale-fence` with `current_fence` when a greater fence wrote first.
//! - `GET /docs/{key}`: `200 {"key", "value", "fence", "updated_at"}` or `404`.
//! - `GET /docs/{key}/writes`: `200 {"writes": [{"fence", "outcome", "at"}, ...]}`, oldest first.

use std::net::{SocketAddr, TcpListener};

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
use serde_json::json;

use crate::docs::{Put, SharedDocs};

/// A bound demo store that has not started serving yet.
pub struct DemoServer {
    port: u16,
    server: Server,
}

impl DemoServer {
    pub fn build(bind: SocketAddr, docs: SharedDocs) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(bind).with_context(|| format!("binding {bind}"))?;
        let port = listener.local_addr()?.port();
        let docs = web::Data::new(docs);
        routes::install_refusal_renderer();
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

fn unavailable(e: anyhow::Error) -> ApiError {
    ApiError::StoreUnavailable(e)
}

async fn put_doc(
    req: HttpRequest,
    path: web::Path<String>,
    FencingToken(fence): FencingToken,
    payload: web::Payload,
    docs: web::Data<SharedDocs>,
) -> Result<HttpResponse, ApiError> {
    let key = key(&path)?;
    let value = read_json(&req, payload).await?;
    match docs.put(&key, &value, fence).await.map_err(unavailable)? {
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

async fn get_doc(
    path: web::Path<String>,
    docs: web::Data<SharedDocs>,
) -> Result<HttpResponse, ApiError> {
    let key = key(&path)?;
    let doc = docs.get(&key).await.map_err(unavailable)?;
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
    docs: web::Data<SharedDocs>,
) -> Result<HttpResponse, ApiError> {
    let key = key(&path)?;
    let writes = docs.writes(&key).await.map_err(unavailable)?;
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
