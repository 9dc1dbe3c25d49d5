//! Changes made by other processes sharing the file. SQLite has no notifications across
//! processes, so a thread looks every [`POLL_EVERY`], and only while someone in this process
//! waits or watches: `PRAGMA data_version` (no I/O beyond the file's change counter) tells
//! whether any other connection committed since the last look; only then are the watched
//! resources read (one indexed lookup each, on a connection of the thread's own, which in WAL
//! mode never waits for a writer) and those whose lease (its fence or its expiry: a renewal
//! may bring the expiry closer) or queue head changed are woken.
//! This process's own changes are announced right after their commit (see the store); the
//! poll sees them too, which costs only a spurious look.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::Context as _;
use rusqlite::{Connection, OpenFlags};

use crate::wake::Changes;

/// Between two looks at the file: the delay a change by another process may take to wake a
/// waiter here (well inside the 100 ms the contract gives a hand-over).
const POLL_EVERY: Duration = Duration::from_millis(20);

/// What a watched resource looked like at the last look: the fence and expiry of its lease
/// row (live or not) and the ticket at the head of its queue.
type Seen = (Option<i64>, Option<i64>, Option<i64>);

/// Starts the polling thread; it ends when the store's registry is gone.
pub(super) fn start(path: &Path, changes: &Arc<Changes>) -> anyhow::Result<()> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("opening {} to watch it for changes", path.display()))?;
    conn.busy_timeout(Duration::from_secs(1))?;
    let changes = Arc::downgrade(changes);
    std::thread::Builder::new()
        .name("fencelock-sqlite-poll".to_owned())
        .spawn(move || run(&conn, &changes))
        .context("starting the SQLite poll thread")?;
    Ok(())
}

fn run(conn: &Connection, changes: &Weak<Changes>) {
    let mut version: Option<i64> = None;
    let mut seen: HashMap<String, Seen> = HashMap::new();
    loop {
        std::thread::sleep(POLL_EVERY);
        let Some(changes) = changes.upgrade() else {
            return;
        };
        let watched = changes.watched();
        if watched.is_empty() {
            seen.clear();
            continue;
        }
        let now = conn
            .query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0))
            .ok();
        let committed = now.is_none() || now != version;
        version = now;
        seen.retain(|resource, _| watched.contains(resource));
        for resource in watched {
            // A resource seen for the first time is woken once: what its subscriber read
            // before the poll first looked is unknown here.
            if !committed && seen.contains_key(&resource) {
                continue;
            }
            let Ok(state) = look(conn, &resource) else {
                // The file is busy or gone for a moment: wake, the subscriber reads and
                // sees for itself.
                changes.changed(&resource);
                continue;
            };
            if seen.insert(resource.clone(), state) != Some(state) {
                changes.changed(&resource);
            }
        }
    }
}

fn look(conn: &Connection, resource: &str) -> rusqlite::Result<Seen> {
    conn.prepare_cached(
        "SELECT l.fence, l.expires_at,
                (SELECT min(ticket) FROM lease_waiters WHERE resource = ?1)
         FROM (SELECT 1) LEFT JOIN leases l ON l.resource = ?1",
    )?
    .query_row([resource], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
}
