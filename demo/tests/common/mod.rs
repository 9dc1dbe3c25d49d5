//! What the demo's test binaries share.

use fencelock::domain::FenceKeys;
use fencelock::guard::{Guard, GuardMetrics};
use fencelock::metrics::Registry;
use fencelock_demo::app::DemoServer;
use fencelock_demo::docs::{self, Guarding};
use fencelock_demo::page::PageOptions;
use fencelock_server::StoreOptions;

/// A demo store on `url`, bound to a free local port, with its own metrics registry and a
/// guard holding `keys` (none: bare fences are accepted).
pub async fn demo_server(
    url: &str,
    guarding: Guarding,
    settings: StoreOptions,
    keys: FenceKeys,
) -> DemoServer {
    let registry = Registry::new();
    let guard = Guard::new(keys, GuardMetrics::register(&registry));
    let docs = docs::open(Some(url), guarding, settings, &guard)
        .await
        .expect("store opens");
    DemoServer::build(
        "127.0.0.1:0".parse().unwrap(),
        docs,
        guard,
        settings.timeout,
        registry,
        PageOptions {
            guarding,
            ..PageOptions::default()
        },
    )
    .unwrap()
}
