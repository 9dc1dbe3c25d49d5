//! Building the application: the one path used by `main` and by the tests.

use std::net::TcpListener;
use std::num::NonZeroUsize;
use std::sync::Arc;

use actix_web::dev::{Server, ServerHandle};
use actix_web::middleware::from_fn;
use actix_web::{App, HttpServer, web};
use anyhow::Context as _;
use rustls::ServerConfig;

use crate::auth::Auth;
use crate::config::Settings;
use crate::routes::auth::Gate;
use crate::routes::metrics::LeaseMetrics;
use crate::routes::{self, AppState};
use crate::store::chore::Chore;
use crate::store::heartbeat::Heartbeat;
use crate::store::live::LiveLeases;
use crate::store::metered::{Metered, StoreMetrics};
use crate::store::purge::{Keep, Purge};
use crate::store::{self, SharedStore, StoreConfig};
use fencelock::http::metrics::HttpMetrics;
use fencelock::http::{self, body::RequestTimeout};
use fencelock::metrics::{self, Registry, label};

/// How long in-flight requests may take to finish after a stop was asked for.
const SHUTDOWN_TIMEOUT_SECONDS: u64 = 10;

/// Open files kept beside client connections (listener, SQLite file and its journal, logs,
/// the runtime's own handles, slack for a burst of accepts); the store's connection pool
/// comes on top.
const RESERVED_FILES: u64 = 64;

/// Raises the soft limit on open files to the hard limit, so that the connection cap can be
/// as high as the system allows; returns the soft limit now in force.
pub fn raise_open_file_limit() -> std::io::Result<u64> {
    rlimit::increase_nofile_limit(u64::MAX)
}

/// The most client connections this process can hold without running out of file handles:
/// the open-file limit less the reserve and the store's pool. A requested cap above it is
/// refused, since it would fail later as refused accepts or a store that cannot connect.
pub(crate) fn connection_cap(requested: Option<u64>, pool_size: usize) -> anyhow::Result<u64> {
    let (soft, _) = rlimit::Resource::NOFILE
        .get()
        .context("reading the open-file limit")?;
    let reserve = RESERVED_FILES + pool_size as u64;
    let room = soft.saturating_sub(reserve);
    match requested {
        _ if room == 0 => anyhow::bail!(
            "the open-file limit ({soft}) leaves no room for connections beside the {reserve} files the server keeps open; raise it (ulimit -n)"
        ),
        Some(cap) if cap > room => anyhow::bail!(
            "--max-connections {cap} is above the open-file limit ({soft}) less {reserve} files the server keeps open; use at most {room} or raise the limit (ulimit -n)"
        ),
        Some(cap) => Ok(cap),
        None => Ok(room),
    }
}

/// Workers and connections per worker for a total cap: actix counts connections per worker,
/// so the cap is divided, and there are never more workers than connections.
fn split_connections(cap: u64) -> (usize, usize) {
    let cap = usize::try_from(cap).unwrap_or(usize::MAX);
    let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    let workers = cores.min(cap).max(1);
    (workers, (cap / workers).max(1))
}

/// Refuses to serve without tokens on an address other than loopback, unless that is asked
/// for; returns whether the server is exposed without tokens (to be warned about).
pub(crate) fn check_exposure(settings: &Settings) -> anyhow::Result<bool> {
    let exposed = settings.auth.is_none() && !settings.bind.ip().is_loopback();
    if exposed && !settings.allow_unauthenticated {
        anyhow::bail!(
            "refusing to serve without --auth-file on {}, which is not a loopback address: give --auth-file, or --allow-unauthenticated if anyone who can reach it may take and release leases",
            settings.bind
        );
    }
    Ok(exposed)
}

/// See `client_disconnect_timeout` in [`Application::with_store`].
const DISCONNECT_LINGER: std::time::Duration = std::time::Duration::from_millis(250);

/// A bound, configured server that has not started serving yet.
pub struct Application {
    port: u16,
    server: Server,
    store: SharedStore,
    purge: Chore,
    live: Chore,
    /// Keeps this process's waiters' tickets alive in the store.
    heartbeat: Chore,
    auth: Option<Arc<Auth>>,
}

impl Application {
    /// Opens the store named by the settings (applying migrations) and binds the listener.
    /// Port 0 picks a free port; [`Application::port`] tells which.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        // A cap the open-file limit cannot carry, or a server open to anyone without being
        // told so, stops start-up before anything is opened.
        check_exposure(&settings)?;
        connection_cap(settings.max_connections, settings.pool_size)?;
        let store = store::open(&settings.store, settings.store_options()).await?;
        Self::with_store(settings, store)
    }

    /// Like [`Application::build`], with a store opened by the caller.
    ///
    /// The app's metrics live in a registry of its own (see [`fencelock::metrics`]).
    pub fn with_store(settings: Settings, store: SharedStore) -> anyhow::Result<Self> {
        let registry = Registry::new();
        let store_kind = match settings.store {
            StoreConfig::Postgres(_) => label::store::POSTGRES,
            StoreConfig::Sqlite(_) => label::store::SQLITE,
        };
        metrics::info(
            &registry,
            &metrics::BUILD_INFO,
            &[env!("CARGO_PKG_VERSION"), store_kind],
        );
        let store_metrics = StoreMetrics::register(&registry);
        store.register_metrics(&registry);
        let store = Metered::wrap(store, store_metrics.clone());
        let live_leases = metrics::gauge(&registry, &metrics::LIVE_LEASES);
        let lease_metrics = LeaseMetrics::register(&registry, store_metrics);
        let http_metrics = web::Data::new(HttpMetrics::register(&registry));
        let gate = web::Data::new(Gate::new(settings.auth.clone(), &registry));
        let registry = web::Data::new(registry);

        let cap = connection_cap(settings.max_connections, settings.pool_size)?;
        let (workers, per_worker) = split_connections(cap);
        let listener = TcpListener::bind(settings.bind)
            .with_context(|| format!("binding {}", settings.bind))?;
        let port = listener.local_addr()?.port();
        tracing::info!(
            store = %store.describe(),
            address = %listener.local_addr()?,
            tls = settings.tls.is_some(),
            max_connections = workers * per_worker,
            "fencelock serving"
        );
        if check_exposure(&settings)? {
            tracing::warn!(
                address = %settings.bind,
                "serving without authentication on an address other than loopback (--allow-unauthenticated): anyone who can reach it may take and release any lease"
            );
        }
        if let Some(auth) = &settings.auth {
            tracing::info!(
                tokens = auth.tokens().len(),
                path = %auth.path().display(),
                "bearer tokens required on the lock routes"
            );
        }

        let state = web::Data::new(AppState {
            store: store.clone(),
            max_ttl: settings.max_ttl,
            max_wait_ms: settings.max_wait_ms,
            store_timeout: settings.store_timeout,
            metrics: lease_metrics,
            fence_key: settings.fence_key.clone(),
        });
        let request_timeout = settings.request_timeout;
        crate::refusal::install_refusal_renderer();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .app_data(RequestTimeout(request_timeout))
                .app_data(registry.clone())
                .app_data(http_metrics.clone())
                .app_data(gate.clone())
                .configure(routes::configure)
                .default_service(web::to(http::not_found))
                .wrap(from_fn(http::observe))
                .wrap(from_fn(http::metrics::count))
        })
        // main owns the signals (see `shutdown`), so tests can stop a server through its handle
        // without signalling the whole process.
        .disable_signals()
        .shutdown_timeout(SHUTDOWN_TIMEOUT_SECONDS)
        // A slow or idle client holds a connection no longer than the request timeout: the
        // head must arrive within it (else `408`), an idle keep-alive connection is closed
        // after it, and `input` bounds the body by it.
        .client_request_timeout(request_timeout)
        .keep_alive(request_timeout)
        // After a final answer (a `408`, or any answer to a request whose body was never
        // read), wait this long for the client to close before closing ourselves, instead
        // of actix's default second: a slow client is cut off close to the request timeout.
        .client_disconnect_timeout(DISCONNECT_LINGER)
        // A client that closes its connection while its request is in progress is gone:
        // the request's future is dropped at once (actix otherwise lets it run to its end,
        // taking a half-closed connection for one that still reads). A waiting acquisition
        // then leaves its queue at once (see `waiting`).
        .h1_allow_half_closed(false)
        .workers(workers)
        .max_connections(per_worker);
        // Over TLS the same limits apply; the handshake has actix's own bound (3 s), after
        // which the head timer above starts.
        let server = match &settings.tls {
            Some(tls) => server.listen_rustls_0_23(listener, ServerConfig::clone(tls))?,
            None => server.listen(listener)?,
        }
        .run();

        let keep = Keep {
            grace: settings.purge_grace,
            history: settings.history_retention,
        };
        let purge = Purge::start(store.clone(), keep, settings.purge_interval);
        let live = LiveLeases::start(store.clone(), live_leases, settings.live_leases_interval);
        let heartbeat = Heartbeat::start(store.clone());
        Ok(Self {
            port,
            server,
            store,
            purge,
            live,
            heartbeat,
            auth: settings.auth,
        })
    }

    /// The bearer tokens in force, when `--auth-file` is given; `main` reloads them on
    /// `SIGHUP`.
    pub fn auth(&self) -> Option<Arc<Auth>> {
        self.auth.clone()
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

    /// Serves until the server is stopped through its handle, then stops the purge and the
    /// live-lease count.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let served = self.server.await;
        self.purge.stop().await;
        self.live.stop().await;
        self.heartbeat.stop().await;
        tracing::info!("fencelock stopped");
        served.context("serving HTTP")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_cap_stays_below_the_open_file_limit() {
        let (soft, _) = rlimit::Resource::NOFILE.get().unwrap();
        let room = soft - RESERVED_FILES - 16;
        assert_eq!(connection_cap(None, 16).unwrap(), room);
        assert_eq!(connection_cap(Some(room), 16).unwrap(), room);
        assert_eq!(connection_cap(Some(10), 16).unwrap(), 10);
        let refused = connection_cap(Some(room + 1), 16).unwrap_err().to_string();
        assert!(refused.contains("--max-connections"), "{refused}");
        assert!(!refused.contains('\n'), "{refused}");
    }

    #[test]
    fn the_cap_is_divided_among_workers() {
        let (workers, per_worker) = split_connections(1000);
        assert!(workers >= 1 && workers * per_worker <= 1000);
        assert_eq!(split_connections(1), (1, 1));
    }
}
