//! A document store whose writes the fencelock guard protects: `PUT /docs/{key}` writes only
//! when the writer's `Fencing-Token` is not older than the last one accepted for the key, in
//! the write's own PostgreSQL transaction.
//!
//! Around the guarded write of the library's README (`docs.rs`): the tables (the guard's
//! [`SCHEMA`](fencelock::guard::postgres::SCHEMA) and the documents), a pool that answers
//! `503` rather than hang when PostgreSQL is away, the [`Guard`] (with fence keys: signed
//! tokens only), and the app: problem documents with their `instance` and `request_id`
//! ([`http::observe`]), request metrics and the guard's own on `GET /metrics`.

// Not reformatted: `put_doc` stays as the README lays it out, line for line.
#[rustfmt::skip]
mod docs;

use std::time::Duration;

use actix_web::middleware::from_fn;
use actix_web::web;
use deadpool_postgres::Pool;
use fencelock::domain::FenceKeys;
use fencelock::guard::{self, Guard, GuardMetrics};
use fencelock::http::{self, metrics::HttpMetrics};
use fencelock::metrics::Registry;

/// The documents. The guard's schema (`fencelock_guard`) stands beside them.
pub const DOCS_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS docs (
    key  text PRIMARY KEY,
    body text NOT NULL
)";

/// Connections per process.
pub const POOL_SIZE: usize = 8;

/// The longest a statement may run before the write answers `503`.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// A pool of connections to the database `config` names, with the guard's timeouts. No
/// connection is made here.
pub fn pool(config: tokio_postgres::Config) -> anyhow::Result<Pool> {
    guard::postgres::pool(config, tokio_postgres::NoTls, POOL_SIZE, STATEMENT_TIMEOUT)
}

/// Creates the guard's table and the documents' (idempotent): run at start-up.
pub async fn migrate(pool: &Pool) -> anyhow::Result<()> {
    let client = pool.get().await?;
    client.batch_execute(guard::postgres::SCHEMA).await?;
    client.batch_execute(DOCS_SCHEMA).await?;
    Ok(())
}

/// What every worker of the app shares: the pool, the guard, and the metrics registry.
#[derive(Clone)]
pub struct Service {
    pool: web::Data<Pool>,
    guard: web::Data<Guard>,
    registry: web::Data<Registry>,
    http_metrics: web::Data<HttpMetrics>,
}

impl Service {
    /// The service on `pool`, accepting tokens signed with `keys` (none: bare fences).
    pub fn new(pool: Pool, keys: FenceKeys) -> Self {
        let registry = Registry::new();
        let guard = Guard::new(keys, GuardMetrics::register(&registry));
        Self {
            pool: web::Data::new(pool),
            guard: web::Data::new(guard),
            http_metrics: web::Data::new(HttpMetrics::register(&registry)),
            registry: web::Data::new(registry),
        }
    }

    /// The app's data and routes: `App::new().configure(|cfg| service.configure(cfg))`.
    pub fn configure(&self, cfg: &mut web::ServiceConfig) {
        cfg.app_data(self.pool.clone())
            .app_data(self.guard.clone())
            .app_data(self.registry.clone())
            .app_data(self.http_metrics.clone())
            .service(
                web::scope("")
                    .configure(docs::routes)
                    .service(
                        http::resource("/metrics", "GET")
                            .route(web::get().to(http::metrics::expose)),
                    )
                    .default_service(web::to(http::not_found))
                    .wrap(from_fn(http::observe))
                    .wrap(from_fn(http::metrics::count)),
            );
    }
}
