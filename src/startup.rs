//! Building the application: the one path used by `main` and by the tests.

use std::net::TcpListener;
use std::num::NonZeroUsize;
use std::sync::Arc;

use actix_web::dev::{Extensions, ServerHandle};
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
    let exposed = settings.auth.is_none() && !is_loopback(settings.bind.ip());
    if exposed && !settings.allow_unauthenticated {
        anyhow::bail!(
            "refusing to serve without --auth-file on {}, which is not a loopback address: give --auth-file, or --allow-unauthenticated if anyone who can reach it may take and release leases",
            settings.bind
        );
    }
    Ok(exposed)
}

/// Whether only this machine can reach `ip`: an IPv4-mapped IPv6 address
/// (`::ffff:127.0.0.1`) is the IPv4 address it maps, which `Ipv6Addr::is_loopback` does not
/// see.
fn is_loopback(ip: std::net::IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// See `client_disconnect_timeout` in [`Application::serve`].
const DISCONNECT_LINGER: std::time::Duration = std::time::Duration::from_millis(250);

/// The per-peer cap when `--max-connections-per-peer` is not given: a quarter of the total
/// cap, so that at least four clients are needed to take every connection, but never fewer
/// than this (or the total, if it is smaller): a small total cap is a small deployment or a
/// test, where a quarter of it would refuse a single client's ordinary pool.
const MIN_DEFAULT_PER_PEER: u64 = 64;

/// The per-peer cap in force for a total cap of `total`; `None`: none.
pub(crate) fn per_peer_cap(requested: Option<u64>, total: u64) -> Option<u64> {
    match requested {
        Some(0) => None,
        Some(cap) => Some(cap),
        None => Some((total / 4).max(MIN_DEFAULT_PER_PEER.min(total))),
    }
}

/// The connections of each client address (`--max-connections-per-peer`), counted across
/// all workers.
///
/// The total cap (actix's `max_connections`) stops accepting while it is reached: one client
/// that opens thousands of slow connections would keep every other client in the listen
/// backlog until it lets go. So each connection is counted under its peer's IP address as it
/// starts (before its first byte is read), and one over its peer's cap is closed at once: it
/// cannot be kept waiting like the total cap's, which would hold a slot of that cap. Every
/// address is a peer, loopback included; behind a proxy every client is the proxy's address.
pub(crate) struct PeerCap {
    cap: usize,
    open: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
    /// Connections closed over the cap since the last WARN line.
    refused: std::sync::atomic::AtomicU64,
    last_report: std::sync::Mutex<Option<std::time::Instant>>,
}

/// A connection counted under its peer; dropped (with the connection) it is not any more.
struct PeerSlot {
    cap: Arc<PeerCap>,
    peer: std::net::IpAddr,
}

/// Refused connections are logged at most this often (a flood would otherwise be a line per
/// connection).
const PEER_REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl PeerCap {
    fn new(cap: u64) -> Arc<Self> {
        Arc::new(Self {
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
            open: std::sync::Mutex::default(),
            refused: std::sync::atomic::AtomicU64::new(0),
            last_report: std::sync::Mutex::new(None),
        })
    }

    /// Counts a connection of `peer`, or `None` if `peer` has its cap of them open already.
    fn admit(self: &Arc<Self>, peer: std::net::IpAddr) -> Option<PeerSlot> {
        let peer = peer.to_canonical();
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = open.entry(peer).or_default();
        if *count >= self.cap {
            drop(open);
            self.report_refused(peer);
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            cap: self.clone(),
            peer,
        })
    }

    fn report_refused(&self, peer: std::net::IpAddr) {
        use std::sync::atomic::Ordering::Relaxed;
        let refused = self.refused.fetch_add(1, Relaxed) + 1;
        let mut last = self
            .last_report
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.is_none_or(|at| at.elapsed() >= PEER_REPORT_EVERY) {
            *last = Some(std::time::Instant::now());
            self.refused.store(0, Relaxed);
            tracing::warn!(
                peer = %peer,
                max_connections_per_peer = self.cap,
                refused,
                "connections closed at once: their client address has --max-connections-per-peer open already"
            );
        }
    }

    /// The `on_connect` hook: counts the connection in its `Extensions` (which live as long
    /// as the connection), or shuts the socket down at once.
    fn on_connect(self: &Arc<Self>, io: &dyn std::any::Any, extensions: &mut Extensions) {
        use actix_web::rt::net::TcpStream;
        type Tls = actix_tls::accept::rustls_0_23::TlsStream<TcpStream>;
        let stream = match io.downcast_ref::<TcpStream>() {
            Some(stream) => stream,
            None => match io.downcast_ref::<Tls>() {
                Some(tls) => tls.get_ref().0,
                None => return,
            },
        };
        let Ok(peer) = stream.peer_addr() else {
            // Gone already.
            return;
        };
        match self.admit(peer.ip()) {
            Some(slot) => {
                extensions.insert(slot);
            }
            None => {
                // The dispatcher then reads the end of the stream and drops the connection
                // without a word: nothing of the request has been read to answer.
                let _ = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self
            .cap
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

/// A bound, configured server that has not started serving yet.
pub struct Application {
    port: u16,
    /// The HTTP server, running since it was bound; ends when stopped through its handle.
    serving: actix_web::rt::task::JoinHandle<std::io::Result<()>>,
    handle: ServerHandle,
    store: SharedStore,
    purge: Chore,
    live: Chore,
    /// Keeps this process's waiters' tickets alive in the store.
    heartbeat: Chore,
    auth: Option<Arc<Auth>>,
}

/// The HTTP server, serving on a store that may not be ready yet (see
/// [`Application::build`]).
struct Serving {
    port: u16,
    serving: actix_web::rt::task::JoinHandle<std::io::Result<()>>,
    handle: ServerHandle,
    store: SharedStore,
    address: std::net::SocketAddr,
    max_connections: usize,
    max_connections_per_peer: Option<u64>,
    live_leases: prometheus::IntGauge,
    /// Serving without tokens on an address other than loopback, as asked for.
    exposed: bool,
}

impl Application {
    /// Opens the store named by the settings, binds the listener and serves, then applies
    /// the store's migrations; returns once they are applied, or given up on for now.
    /// Port 0 picks a free port; [`Application::port`] tells which.
    ///
    /// The listener serves from the start: while PostgreSQL's migrations wait for the
    /// database or for another session's migration lock, `/healthz` answers `200`, `/readyz`
    /// and the lock routes `503` (the wait is logged, and bounded by the migration lock
    /// timeout, past which start-up fails).
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        // A cap the open-file limit cannot carry, or a server open to anyone without being
        // told so, stops start-up before anything is opened.
        check_exposure(&settings)?;
        connection_cap(settings.max_connections, settings.pool_size)?;
        let opened = store::open(&settings.store, settings.store_options()).await?;
        let serving = Self::serve(&settings, opened.store.clone())?;
        if let Err(e) = opened.prepare().await {
            serving.handle.stop(false).await;
            let _ = serving.serving.await;
            return Err(e);
        }
        Ok(Self::ready(settings, serving))
    }

    /// Like [`Application::build`], with a store opened (and migrated) by the caller.
    ///
    /// The app's metrics live in a registry of its own (see [`fencelock::metrics`]).
    pub fn with_store(settings: Settings, store: SharedStore) -> anyhow::Result<Self> {
        let serving = Self::serve(&settings, store)?;
        Ok(Self::ready(settings, serving))
    }

    /// Binds the listener and starts serving on `store`.
    fn serve(settings: &Settings, store: SharedStore) -> anyhow::Result<Serving> {
        let exposed = check_exposure(settings)?;
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
        let refusals = http_metrics.get_ref().clone();
        let gate = web::Data::new(Gate::new(settings.auth.clone(), &registry));
        let registry = web::Data::new(registry);

        let cap = connection_cap(settings.max_connections, settings.pool_size)?;
        let (workers, per_worker) = split_connections(cap);
        let max_connections = workers * per_worker;
        let max_connections_per_peer =
            per_peer_cap(settings.max_connections_per_peer, max_connections as u64);
        let listener = TcpListener::bind(settings.bind)
            .with_context(|| format!("binding {}", settings.bind))?;
        let address = listener.local_addr()?;
        tracing::info!(address = %address, "fencelock listening");

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
        // Must come before the listener is given to the server (actix captures it then).
        let peers = max_connections_per_peer.map(PeerCap::new);
        let server = server.on_connect(move |io, extensions| {
            if let Some(peers) = &peers {
                peers.on_connect(io, extensions);
            }
            crate::refusal::count_refusals(extensions, &refusals);
        });
        // Over TLS the same limits apply; the handshake has actix's own bound (3 s), after
        // which the head timer above starts.
        let server = match &settings.tls {
            Some(tls) => server.listen_rustls_0_23(listener, ServerConfig::clone(tls))?,
            None => server.listen(listener)?,
        }
        .run();
        let handle = server.handle();
        // actix's server starts accepting only once polled: from now on, not when the caller
        // gets to `run_until_stopped`.
        let serving = actix_web::rt::spawn(server);
        Ok(Serving {
            port: address.port(),
            serving,
            handle,
            store,
            address,
            max_connections,
            max_connections_per_peer,
            live_leases,
            exposed,
        })
    }

    /// The store is ready (or given up on for now, serving `503`): says so, and starts the
    /// chores.
    fn ready(settings: Settings, serving: Serving) -> Self {
        let store = serving.store;
        tracing::info!(
            store = %store.describe(),
            address = %serving.address,
            tls = settings.tls.is_some(),
            max_connections = serving.max_connections,
            max_connections_per_peer = serving.max_connections_per_peer.unwrap_or(0),
            "fencelock serving"
        );
        if serving.exposed {
            tracing::warn!(
                address = %settings.bind,
                "serving without authentication on an address other than loopback (--allow-unauthenticated): anyone who can reach it may take and release any lease"
            );
        }
        if let Some(auth) = &settings.auth {
            let tokens = auth.tokens().len();
            if tokens == 0 {
                crate::auth::warn_no_tokens(auth.path());
            } else {
                tracing::info!(
                    tokens,
                    path = %auth.path().display(),
                    "bearer tokens required on the lock routes"
                );
            }
        }
        let keep = Keep {
            grace: settings.purge_grace,
            history: settings.history_retention,
        };
        let purge = Purge::start(store.clone(), keep, settings.purge_interval);
        let live = LiveLeases::start(
            store.clone(),
            serving.live_leases,
            settings.live_leases_interval,
        );
        let heartbeat = Heartbeat::start(store.clone());
        Self {
            port: serving.port,
            serving: serving.serving,
            handle: serving.handle,
            store,
            purge,
            live,
            heartbeat,
            auth: settings.auth,
        }
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
        self.handle.clone()
    }

    pub fn store(&self) -> SharedStore {
        self.store.clone()
    }

    /// Serves until the server is stopped through its handle, then stops the purge and the
    /// live-lease count.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let served = self.serving.await;
        self.purge.stop().await;
        self.live.stop().await;
        self.heartbeat.stop().await;
        tracing::info!("fencelock stopped");
        served
            .context("the HTTP server's task")?
            .context("serving HTTP")
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
    fn the_per_peer_cap_is_a_quarter_of_the_total_but_not_tiny() {
        assert_eq!(per_peer_cap(None, 10_000), Some(2_500));
        assert_eq!(per_peer_cap(None, 100), Some(64));
        assert_eq!(per_peer_cap(None, 2), Some(2));
        assert_eq!(per_peer_cap(Some(0), 10_000), None);
        assert_eq!(per_peer_cap(Some(7), 10_000), Some(7));
    }

    #[test]
    fn a_mapped_loopback_address_is_loopback() {
        for loopback in ["127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1"] {
            assert!(is_loopback(loopback.parse().unwrap()), "{loopback}");
        }
        for exposed in [
            "0.0.0.0",
            "::",
            "10.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:0.0.0.0",
        ] {
            assert!(!is_loopback(exposed.parse().unwrap()), "{exposed}");
        }
    }

    #[test]
    fn the_cap_is_divided_among_workers() {
        let (workers, per_worker) = split_connections(1000);
        assert!(workers >= 1 && workers * per_worker <= 1000);
        assert_eq!(split_connections(1), (1, 1));
    }
}
