//! The fence counter, checked before the store serves (docs/design/0006).
//!
//! Every fence is the counter row plus one, and "a new fence is greater than every fence
//! issued before" holds only while the counter is at or above every fence in the file. A
//! file put back from a copy of another moment, or edited by hand, can break that; the store
//! checks it when it opens the file, and `fencelock check` does too.

use anyhow::Context as _;
use rusqlite::Connection;

/// The counter and the highest fence in the file: the history's through its primary key,
/// the live leases' through a scan of their table (one row per resource held).
const COUNTER_AND_HIGHEST: &str = "
SELECT (SELECT last_fence FROM fence_counter WHERE id = 1),
       max(coalesce((SELECT max(fence) FROM lease_history), 0),
           coalesce((SELECT max(fence) FROM leases), 0))";

/// Fails, in one line naming the fix, when a fence in the file is above the counter.
pub(super) fn check(conn: &Connection) -> anyhow::Result<()> {
    let (counter, highest): (i64, i64) = conn
        .query_row(COUNTER_AND_HIGHEST, [], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .context("reading the fence counter")?;
    if highest > counter {
        anyhow::bail!(
            "the fence counter is behind the leases: it is at {counter}, but fence {highest} was issued already (a file put back from an older copy?); raise it with `UPDATE fence_counter SET last_fence = {highest} WHERE id = 1` while no server runs on the file, or further after a restore (docs/operations.md, Backups and restores)"
        );
    }
    Ok(())
}
