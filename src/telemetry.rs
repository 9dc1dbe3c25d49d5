//! Logging, set up once at start. `RUST_LOG` filters (default `info`); `--log-format json`
//! writes one JSON object per line for log pipelines. Logs go to stderr.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber, logging at `info` unless `RUST_LOG` says otherwise. A
/// second call (tests) leaves the first in place.
pub fn init(format: LogFormat) {
    init_with_default(format, "info");
}

/// Like [`init`], with another default filter (e.g. `warn` for a command whose own output
/// must not drown in logs).
pub fn init_with_default(format: LogFormat, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        // A log line that cannot be written (the collector behind stderr went away) is lost;
        // reporting that with `eprintln!` would panic on the same closed stderr and take the
        // lease server down with it.
        .log_internal_errors(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
