//! A lease server in this process, for the paused-worker story and the page when they are
//! given no running one: the real server (`fencelock-server`), on a SQLite file.

use std::path::Path;

use actix_web::dev::ServerHandle;
use fencelock::domain::FenceKey;
use fencelock_server::{Application, Settings, StoreConfig};

/// Starts a lease server on the SQLite file `leases.db` in `dir`, bound to a free loopback
/// port, that signs fences with `fence_key` (none: bare fences). Answers its URL, and the
/// handle that stops it; it serves until then, or until the process ends.
pub async fn start(
    dir: &Path,
    fence_key: Option<FenceKey>,
) -> anyhow::Result<(String, ServerHandle)> {
    let mut settings = Settings::for_store(StoreConfig::Sqlite(dir.join("leases.db")));
    settings.bind = "127.0.0.1:0".parse()?;
    settings.fence_key = fence_key;
    let app = Application::build(settings).await?;
    let url = format!("http://127.0.0.1:{}", app.port());
    let handle = app.handle();
    actix_web::rt::spawn(app.run_until_stopped());
    Ok((url, handle))
}
