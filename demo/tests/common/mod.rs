//! What the demo's test binaries share.

use fencelock::metrics::Registry;
use fencelock::store::StoreOptions;
use fencelock_demo::app::DemoServer;
use fencelock_demo::docs::{self, Guarding};

/// A demo store on `url`, bound to a free local port, with its own metrics registry.
pub async fn demo_server(url: &str, guarding: Guarding, settings: StoreOptions) -> DemoServer {
    let registry = Registry::new();
    let docs = docs::open(Some(url), guarding, settings, &registry)
        .await
        .expect("store opens");
    DemoServer::build(
        "127.0.0.1:0".parse().unwrap(),
        docs,
        settings.timeout,
        registry,
    )
    .unwrap()
}
