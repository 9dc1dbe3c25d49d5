//! Deleting the registrations of ended watches, together and in the background.

use std::sync::Arc;
use std::time::Duration;

use super::{Db, UNWATCH, classify};

/// The registrations of ended watches, deleted in the background: a watch's answer does not
/// wait for it, and a registration left behind costs only announcements until the purge
/// takes it. Deleted together, one statement at a time, starting [`UNWATCH_LINGER`] after
/// the first ended watch: a release ends every watch of its resource at once, and
/// statements run while the answers go out would take the database's share of the cores
/// from them (and a statement per watch would queue thousands of them).
#[derive(Default)]
pub(super) struct Unwatches(std::sync::Mutex<PendingUnwatches>);

/// How long the ended watches' registrations wait to be deleted together: longer than a
/// release's fan-out to its watches takes (API.md, *Watch*: within 100 ms), short enough that
/// few announcements go to registrations that are no longer needed.
const UNWATCH_LINGER: Duration = Duration::from_millis(200);

#[derive(Default)]
struct PendingUnwatches {
    ids: Vec<i64>,
    /// A deletion is under way: it takes the ids added meanwhile when its statement ends.
    deleting: bool,
}

impl Unwatches {
    fn pending(&self) -> std::sync::MutexGuard<'_, PendingUnwatches> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn end(self: &Arc<Self>, db: &Arc<Db>, id: i64) {
        let mut pending = self.pending();
        pending.ids.push(id);
        if pending.deleting {
            return;
        }
        // Outside a runtime (a shutdown) the id waits for the next deletion, or the purge.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        pending.deleting = true;
        let (unwatches, db) = (self.clone(), db.clone());
        runtime.spawn(async move { unwatches.delete(&db).await });
    }

    async fn delete(&self, db: &Db) {
        tokio::time::sleep(UNWATCH_LINGER).await;
        loop {
            let ids = {
                let mut pending = self.pending();
                if pending.ids.is_empty() {
                    pending.deleting = false;
                    return;
                }
                std::mem::take(&mut pending.ids)
            };
            let deleted = async {
                let client = db.client().await?;
                db.statements
                    .execute(&client, &UNWATCH, &[&ids])
                    .await
                    .map_err(classify)
            };
            if let Err(e) = deleted.await {
                tracing::debug!(error = %e, watches = ids.len(), "ended watches' registrations are left to the purge");
            }
        }
    }
}
