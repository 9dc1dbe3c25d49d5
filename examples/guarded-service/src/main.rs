//! `guarded-service`: serves the document store.
//!
//! - `DATABASE_URL` (required): the PostgreSQL database of the documents and the guard.
//! - `BIND` (default `127.0.0.1:8081`): the address to listen on.
//! - `FENCE_KEY_FILE` (optional): the lease server's `--fence-key` file; with it, only tokens
//!   signed with it are accepted, never a bare fence.

use std::path::Path;

use actix_web::{App, HttpServer};
use anyhow::Context as _;
use fencelock::domain::{FenceKey, FenceKeys};
use guarded_service::Service;

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let database_url = std::env::var("DATABASE_URL").context("set DATABASE_URL")?;
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:8081".to_owned());
    let keys = match std::env::var_os("FENCE_KEY_FILE") {
        Some(path) => FenceKeys::new(vec![FenceKey::read(Path::new(&path))?]),
        None => FenceKeys::default(),
    };
    let config = database_url.parse().context("DATABASE_URL")?;
    let pool = guarded_service::pool(config)?;
    guarded_service::migrate(&pool)
        .await
        .context("creating the tables")?;
    let service = Service::new(pool, keys);
    let server = HttpServer::new(move || App::new().configure(|cfg| service.configure(cfg)))
        .bind(&bind)
        .with_context(|| format!("binding {bind}"))?;
    println!("guarded-service: listening on {bind}");
    server.run().await?;
    Ok(())
}
