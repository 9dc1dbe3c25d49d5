//! The process's signals: SIGTERM (service managers) and SIGINT (Ctrl-C) both stop the
//! server gracefully, letting in-flight requests finish; SIGHUP asks for the auth file to be
//! read again ([`hangups`]).

/// Stops the server behind `handle` gracefully (in-flight requests finish) at the first stop
/// signal, logging which one arrived; from a task of its own, spawned here.
pub fn stop_on_signal(handle: actix_web::dev::ServerHandle) {
    actix_web::rt::spawn(async move {
        let signal = signal().await;
        tracing::info!(signal, "shutting down: finishing in-flight requests");
        handle.stop(true).await;
    });
}

/// Completes when the first stop signal arrives and names it.
async fn signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = tokio::signal::ctrl_c() => "SIGINT",
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                "SIGINT"
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}

/// Calls `on_hangup` for every SIGHUP until the process ends (on Unix; elsewhere never).
pub(crate) async fn hangups(on_hangup: impl Fn()) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(mut hangup) => {
                while hangup.recv().await.is_some() {
                    on_hangup();
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP; the auth file will not be reloaded")
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = on_hangup;
        std::future::pending::<()>().await;
    }
}
