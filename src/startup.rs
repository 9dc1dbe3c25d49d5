//! Building the application: the one path used by `main` and by the tests.

use std::net::TcpListener;

use actix_web::dev::{Server, ServerHandle};
use actix_web::middleware::from_fn;
use actix_web::{App, HttpServer, web};
use anyhow::Context as _;

use crate::config::Settings;
use crate::routes::{self, AppState};
use crate::store::purge::Purge;
use crate::store::{self, SharedStore};

/// How long in-flight requests may take to finish after a stop was asked for.
const SHUTDOWN_TIMEOUT_SECONDS: u64 = 10;

/// A bound, configured server that has not started serving yet.
pub struct Application {
    port: u16,
    server: Server,
    store: SharedStore,
    purge: Purge,
}

impl Application {
    /// Opens the store named by the settings (applying migrations) and binds the listener.
    /// Port 0 picks a free port; [`Application::port`] tells which.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let store = store::open(&settings.store, settings.store_options()).await?;
        Self::with_store(settings, store)
    }

    /// Like [`Application::build`], with a store opened by the caller.
    pub fn with_store(settings: Settings, store: SharedStore) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(settings.bind)
            .with_context(|| format!("binding {}", settings.bind))?;
        let port = listener.local_addr()?.port();
        tracing::info!(store = %store.describe(), address = %listener.local_addr()?, "fencelock serving");

        let state = web::Data::new(AppState {
            store: store.clone(),
            max_ttl: settings.max_ttl,
            store_timeout: settings.store_timeout,
        });
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .configure(routes::configure)
                .default_service(web::to(routes::not_found))
                .wrap(from_fn(routes::observe))
        })
        // main owns the signals (see `shutdown`), so tests can stop a server through its handle
        // without signalling the whole process.
        .disable_signals()
        .shutdown_timeout(SHUTDOWN_TIMEOUT_SECONDS)
        .listen(listener)?
        .run();

        let purge = Purge::start(store.clone(), settings.purge_grace, settings.purge_interval);
        Ok(Self {
            port,
            server,
            store,
            purge,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server; `stop(true)` lets in-flight requests finish.
    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    pub fn store(&self) -> SharedStore {
        self.store.clone()
    }

    /// Serves until the server is stopped through its handle, then stops the purge task.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let served = self.server.await;
        self.purge.stop().await;
        tracing::info!("fencelock stopped");
        served.context("serving HTTP")
    }
}
