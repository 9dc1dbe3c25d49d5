//! The guard on PostgreSQL.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS fence_guard (
//!     key        text        PRIMARY KEY,
//!     fence      bigint      NOT NULL CHECK (fence > 0),
//!     updated_at timestamptz NOT NULL DEFAULT now()
//! );
//! ```
//!
//! ```no_run
//! # use fencelock::guard::{self, Admission, CheckedFence};
//! async fn write(
//!     client: &mut tokio_postgres::Client,
//!     guard: &guard::Guard,
//!     // From `guard.check(key, &token)?`, where `token` is the request's `FencingToken`
//!     // and `key` the one this write is for: the token must be signed for that key.
//!     fence: &CheckedFence,
//!     body: &str,
//! ) -> Result<Admission, tokio_postgres::Error> {
//!     let tx = client.transaction().await?;
//!     let admission = guard::postgres::admit(&tx, fence, guard.metrics()).await?;
//!     if let Admission::Stale { .. } = admission {
//!         return Ok(admission); // dropping tx rolls back: nothing was written
//!     }
//!     tx.execute("UPDATE documents SET body = $2 WHERE key = $1", &[&fence.key(), &body])
//!         .await?;
//!     tx.commit().await?;
//!     Ok(admission)
//! }
//! ```

use tokio_postgres::Transaction;

use super::{Admission, CheckedFence, GuardMetrics};
use crate::domain::Fence;

/// The guard's table; idempotent, for a service's own migrations or start-up.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fence_guard (
    key        text        PRIMARY KEY,
    fence      bigint      NOT NULL CHECK (fence > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
)";

/// Raises the key's highest fence to `fence` if it is not lower. On a conflict the row is
/// locked even when the condition fails, so the follow-up read sees the value that beat us
/// and nobody can change it before our transaction ends.
const ADMIT: &str = "
INSERT INTO fence_guard AS g (key, fence) VALUES ($1, $2)
ON CONFLICT (key) DO UPDATE SET fence = EXCLUDED.fence, updated_at = now()
    WHERE g.fence <= EXCLUDED.fence
RETURNING g.fence";

const CURRENT: &str = "SELECT fence FROM fence_guard WHERE key = $1";

/// Admits a write with `checked`'s fence to its key, or reports the greater fence already
/// accepted. [`super::Guard::check`] made `checked` from the writer's token, for this key.
///
/// It takes the transaction that performs the write: call it before the write, and write
/// only when admitted. The key's guard row stays locked until that transaction ends. The
/// decision is counted in `metrics`.
pub async fn admit(
    tx: &Transaction<'_>,
    checked: &CheckedFence,
    metrics: &GuardMetrics,
) -> Result<Admission, tokio_postgres::Error> {
    let (key, fence) = (checked.key(), checked.fence());
    if tx.query_opt(ADMIT, &[&key, &fence.get()]).await?.is_some() {
        return Ok(metrics.decided(Admission::Admitted));
    }
    let current: i64 = tx.query_one(CURRENT, &[&key]).await?.get(0);
    Ok(metrics.decided(Admission::Stale {
        // The stored fence was admitted once, so it is a valid fence.
        current: Fence::new(current).unwrap_or(fence),
    }))
}
