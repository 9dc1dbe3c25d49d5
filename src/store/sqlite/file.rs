//! Opening the file: the connection's settings, the migration, the check of an existing
//! file's schema (`fencelock check`), and the read-only cases (a file SQLite may not write,
//! a read-only file system).

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use rusqlite::Connection;

mod embedded {
    refinery::embed_migrations!("migrations/sqlite");
}

/// How long a transaction waits for another process's write lock before answering `503`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens the file, without creating it, and verifies without changing anything that it can
/// serve leases: it can be written, and its schema is exactly this build's. Returns what was
/// found, or the cause of the first problem in one line.
pub(crate) fn check(path: &Path) -> anyhow::Result<String> {
    let flags =
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = Connection::open_with_flags(path, flags)
        .with_context(|| format!("opening SQLite database {} (it must exist)", path.display()))?;
    if is_read_only(&conn) {
        anyhow::bail!("the SQLite file {} is read-only", path.display());
    }
    let version = schema_version(&mut conn, path)?;
    for probe in SCHEMA_PROBES {
        conn.execute_batch(probe)
            .with_context(|| format!("the schema is not fencelock's ({probe})"))?;
    }
    super::counter::check(&conn).with_context(|| path.display().to_string())?;
    Ok(format!(
        "SQLite file {} has schema version {version}",
        path.display()
    ))
}

/// The schema version of the file, if it is exactly this build's; otherwise why not.
fn schema_version(conn: &mut Connection, path: &Path) -> anyhow::Result<i32> {
    let runner = embedded::migrations::runner();
    // Without the history table refinery's own read fails with "no such table": a file never
    // migrated is said to be one.
    let history: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'refinery_schema_history')",
            [],
            |row| row.get(0),
        )
        .with_context(|| format!("reading the SQLite file {}", path.display()))?;
    let applied = if history {
        runner
            .get_applied_migrations(conn)
            .map_err(|e| anyhow::anyhow!("reading the applied migrations: {e}"))?
    } else {
        Vec::new()
    };
    crate::store::schema::schema_version(runner.get_migrations(), &applied)
}

/// What `check` reads to make sure the tables the statements use are there, with the columns
/// they use. Reads only.
const SCHEMA_PROBES: [&str; 5] = [
    "SELECT resource, owner, fence, acquired_at, expires_at, token, lock_delay_ms FROM leases LIMIT 0",
    "SELECT fence, resource, acquired_at, expires_at, ended_at, end_kind, renewals FROM lease_history LIMIT 0",
    "SELECT ticket, resource, expires_at FROM lease_waiters LIMIT 0",
    "SELECT last_fence FROM fence_counter WHERE id = 1",
    "SELECT writes FROM store_probe WHERE id = 1",
];

/// Opens the file for the store: WAL, durable commits, a bounded wait for other processes.
///
/// Services beside the lease store (the demo's document store) open their SQLite files with
/// it too, so their writes get the same durability settings; it fails if WAL mode does not
/// take.
pub fn connect(path: &Path) -> anyhow::Result<Connection> {
    let conn = Connection::open(path)
        .with_context(|| format!("opening SQLite database {}", path.display()))?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // WAL lets readers of other processes go on while we write. synchronous=FULL makes
    // every commit durable before it returns, also on power loss: with NORMAL, WAL mode
    // may lose the last commits, and a lost fence-counter update would let the next
    // acquisition re-issue a fence a client already holds.
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        anyhow::bail!("{}: could not switch to WAL journal mode", path.display());
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    // The upper levels of the lease table and its indexes stay in memory however large the
    // table grows, and the WAL is copied back into the file in fewer, larger checkpoints (a
    // page written by many commits in between is copied once). Durability is unchanged:
    // every commit is still synced to the WAL before it returns.
    conn.pragma_update(None, "cache_size", CACHE_KIB)?;
    conn.pragma_update(None, "wal_autocheckpoint", CHECKPOINT_PAGES)?;
    prepare_once(&conn)?;
    Ok(conn)
}

/// Makes every cached statement stay prepared: each is parsed and planned once, not on each
/// use.
///
/// SQLite plans some statements for the values bound to them, and prepares such a statement
/// again whenever a new value is bound, as if the schema had changed: a `min()` over a
/// resource's queue is one (`WAITERS_AHEAD`), prepared anew on every acquisition, a fifth of
/// the store thread's time under load. The store's statements are all searches of a key or
/// an index, whatever the values, so plans that ignore them (SQLite's query planner
/// stability guarantee) lose nothing. And rusqlite keeps 16 statements by default, fewer
/// than the store has: one pushed out of the cache is prepared again on its next use.
fn prepare_once(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(())
}

/// The page cache of the store's connection, in KiB (negative: SQLite's unit for "KiB, not
/// pages"); SQLite's default is 2 MiB.
const CACHE_KIB: i64 = -16 * 1024;
/// WAL pages after which a commit copies the WAL back into the file; SQLite's default is 1000.
const CHECKPOINT_PAGES: i64 = 4000;
/// Prepared statements kept per connection: the store has about two dozen.
const STATEMENT_CACHE: usize = 64;

/// Whether `path` is an existing file on a file system mounted read-only.
pub(super) fn on_read_only_file_system(path: &Path) -> bool {
    path.is_file()
        && matches!(
            std::fs::OpenOptions::new().append(true).open(path),
            Err(e) if e.kind() == std::io::ErrorKind::ReadOnlyFilesystem
        )
}

/// Opens a file on a read-only file system for reading, once its schema is found current.
///
/// After a clean shutdown there is no WAL beside the file, and none can be created: the file
/// is opened `immutable` (nothing can change it while the file system stays read-only, so
/// SQLite needs no locks and no WAL index). A WAL left by a crash holds commits the file does
/// not: then the file is opened read-only as usual, which reads the WAL, or fails with a
/// clear cause, never serving the file without its last commits.
pub(super) fn open_frozen(path: &Path) -> anyhow::Result<Connection> {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let wal_has_commits = std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0);
    let flags =
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = if wal_has_commits {
        Connection::open_with_flags(path, flags)?
    } else {
        let uri = format!("file:{}?immutable=1", uri_path(path));
        Connection::open_with_flags(uri, flags | rusqlite::OpenFlags::SQLITE_OPEN_URI)?
    };
    schema_version(&mut conn, path)?;
    prepare_once(&conn)?;
    Ok(conn)
}

/// `path` as the path of a `file:` URI: the characters a URI gives a meaning to escaped.
fn uri_path(path: &Path) -> String {
    let mut out = String::new();
    for byte in path.as_os_str().as_encoded_bytes() {
        match byte {
            b'%' | b'?' | b'#' => out.push_str(&format!("%{byte:02X}")),
            b if b.is_ascii() => out.push(char::from(*b)),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// SQLite opens a file it may not write read-only, without an error; writes then fail.
pub(super) fn is_read_only(conn: &Connection) -> bool {
    conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false)
}

/// How often a connection that was opened read-only tries to reopen the file for writing.
pub(super) const REOPEN_EVERY: Duration = Duration::from_secs(1);

/// Concurrent starts on one new file race to migrate; the loser's attempt fails on the
/// winner's tables, and a second look finds everything applied.
pub(super) fn migrate(conn: &mut Connection) -> anyhow::Result<()> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        match embedded::migrations::runner().run(conn) {
            Ok(report) => {
                for migration in report.applied_migrations() {
                    tracing::info!(migration = %migration, "applied SQLite migration");
                }
                return Ok(());
            }
            Err(e) if attempts < 3 => {
                tracing::debug!(error = %e, "migration attempt failed; trying again");
            }
            Err(e) => return Err(anyhow::anyhow!("{e}")),
        }
    }
}

/// A database in memory with this build's schema, prepared as [`connect`] prepares a file.
#[cfg(test)]
pub(super) fn in_memory() -> Connection {
    let mut conn = Connection::open_in_memory().expect("an in-memory database");
    embedded::migrations::runner()
        .run(&mut conn)
        .expect("the schema applies");
    prepare_once(&conn).expect("the statements prepare");
    conn
}
