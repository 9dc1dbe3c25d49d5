//! Logging, set up once at start. `RUST_LOG` filters (default `info`); a filter that does not
//! parse stops start-up, since a typo would otherwise silence or flood the log unnoticed.
//! Logs go to stderr through a writer thread (see [`LogGuard`]): a request never waits for a
//! write to stderr, and nothing is dropped.
//!
//! Every request's access line has the target `fencelock::access`, so
//! `RUST_LOG=info,fencelock::access=off` switches the access log off and keeps every lease
//! event, warning and error.
//!
//! `--log-format json` writes one flat JSON object per line for log pipelines: the event's
//! fields and the fields of the spans it happened in (so every line written while serving a
//! request carries its `request_id`) side by side at the top level. Lines from libraries that
//! log through the `log` crate keep their message, level and target, but not the `log.file`
//! and `log.line` of the machine that built them.

use std::io::IsTerminal as _;

use tracing::field::{Field, Visit};
use tracing_appender::non_blocking::{NonBlocking, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::prelude::*;

use crate::config::LogFormat;

/// Lines waiting for the writer thread before a request has to wait for it: a burst is
/// absorbed, and a stderr that blocks for good slows the server down rather than losing lines.
const BUFFERED_LINES: usize = 128 * 1024;

/// Keeps the log writer thread running; dropping it writes out every buffered line. Hold it
/// until the process is about to exit (and drop it before writing a last line of one's own to
/// stderr, so that line comes after the logs).
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard(#[allow(dead_code, reason = "held for its Drop")] Option<WorkerGuard>);

/// Installs the global subscriber, logging at `info` unless `RUST_LOG` says otherwise. A
/// second call (tests) leaves the first in place.
pub fn init(format: LogFormat) -> anyhow::Result<LogGuard> {
    init_with_default(format, "info")
}

/// Like [`init`], with another default filter (e.g. `warn` for a command whose own output
/// must not drown in logs).
pub fn init_with_default(format: LogFormat, default_filter: &str) -> anyhow::Result<LogGuard> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.trim().is_empty() => EnvFilter::try_new(&directives)
            .map_err(|e| anyhow::anyhow!("RUST_LOG={directives:?} is not a valid filter: {e}"))?,
        _ => EnvFilter::new(default_filter),
    };
    // Never lossy: a lease event must not vanish from the log because the log was busy.
    let (writer, guard) = NonBlockingBuilder::default()
        .buffered_lines_limit(BUFFERED_LINES)
        .lossy(false)
        .thread_name("fencelock-log")
        // Buffered: the writer thread writes out everything queued with one system call.
        .finish(std::io::BufWriter::new(std::io::stderr()));
    let installed = match format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(writer)
            .with_ansi(std::io::stderr().is_terminal())
            .with_target(false)
            // A log line that cannot be written (the collector behind stderr went away) is
            // lost; reporting that with `eprintln!` would panic on the same closed stderr and
            // take the lease server down with it.
            .log_internal_errors(false)
            .finish()
            .try_init(),
        LogFormat::Json => tracing_subscriber::registry()
            .with(filter)
            .with(json_layer(writer))
            .try_init(),
    };
    Ok(LogGuard(installed.is_ok().then_some(guard)))
}

fn json_layer<S>(writer: NonBlocking) -> json_subscriber::JsonLayer<S, NonBlocking>
where
    S: tracing::Subscriber + for<'lookup> tracing_subscriber::registry::LookupSpan<'lookup>,
{
    let mut layer = json_subscriber::JsonLayer::new(writer);
    layer.log_internal_errors(false);
    layer.with_timer("timestamp", tracing_subscriber::fmt::time::SystemTime);
    layer.with_level("level");
    layer.with_top_level_flattened_span_list();
    layer.add_multiple_dynamic_fields(|event, _, writer| {
        event.record(&mut TopLevel(writer));
    });
    layer
}

/// Writes an event's fields at the top level of its JSON line, leaving out the `log.*`
/// metadata a `log` record carries (among it the source path on the building machine).
struct TopLevel<'a, 'b>(&'a mut json_subscriber::FieldWriter<'b>);

impl TopLevel<'_, '_> {
    fn write(&mut self, field: &Field, value: impl serde::Serialize) {
        if !field.name().starts_with("log.") {
            let _ = self.0.write_field(field.name(), value);
        }
    }
}

impl Visit for TopLevel<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.write(field, value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.write(field, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.write(field, value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.write(field, value);
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.write(field, value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.write(field, format!("{value:?}"));
    }
}
