//! The databases the benchmark works on: PostgreSQL databases it creates and always drops
//! (when it ends, fails, panics or is interrupted), and SQLite files in its temporary
//! directory; and what it does to a store's database behind the server's back (clearing the
//! workload's rows between runs, loading a million live leases).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context as _;

use crate::plan::Block;

/// The PostgreSQL databases this run created, dropped by [`Databases::drop_all`] at the end
/// and, should that never be reached (a panic unwinding through `main`), by `Drop`.
pub struct Databases {
    admin_url: String,
    names: Mutex<Vec<String>>,
}

impl Databases {
    /// `admin_url` names an existing database on the server (e.g. `postgres`) to connect to
    /// for `CREATE DATABASE` and `DROP DATABASE`.
    pub fn new(admin_url: &str) -> Self {
        Self {
            admin_url: admin_url.to_owned(),
            names: Mutex::new(Vec::new()),
        }
    }

    /// The list, also after a panic elsewhere poisoned its lock: the databases must still
    /// be dropped.
    fn names(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn admin_url(&self) -> &str {
        &self.admin_url
    }

    /// Creates the empty database `name` (dropping a leftover of that name first) and
    /// returns its URL. The name is registered before it is created, so that it is dropped
    /// whatever happens next.
    pub async fn create(&self, name: &str) -> anyhow::Result<String> {
        self.names().push(name.to_owned());
        let admin = connect(&self.admin_url).await?;
        // One statement per call: neither may run in the implicit transaction of a
        // multi-statement string.
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await
            .with_context(|| format!("dropping a leftover database {name}"))?;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .with_context(|| format!("creating database {name}"))?;
        Ok(url_for(&self.admin_url, name))
    }

    /// Drops every database created so far; says so on stderr if one cannot be dropped.
    pub async fn drop_all(&self) {
        let names = std::mem::take(&mut *self.names());
        if names.is_empty() {
            return;
        }
        match connect(&self.admin_url).await {
            Ok(admin) => {
                for name in names {
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    if let Err(e) = admin.batch_execute(&sql).await {
                        eprintln!("could not drop database {name}: {e}");
                    }
                }
            }
            Err(e) => eprintln!("could not drop databases {names:?}: {e:#}"),
        }
    }
}

impl Drop for Databases {
    fn drop(&mut self) {
        if self.names().is_empty() {
            return;
        }
        // Reached while unwinding, when no runtime may be entered on this thread: use a
        // thread with a runtime of its own.
        let this = Databases {
            admin_url: self.admin_url.clone(),
            names: Mutex::new(std::mem::take(&mut *self.names())),
        };
        let _ = std::thread::spawn(move || {
            if let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                runtime.block_on(this.drop_all());
            }
        })
        .join();
    }
}

/// A session on the PostgreSQL database at `url`.
pub async fn connect(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| {
            format!(
                "connecting to PostgreSQL at {} (set --database-url)",
                redact(url)
            )
        })?;
    tokio::spawn(connection);
    Ok(client)
}

/// `url` without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// The URL of database `name` on the server of `admin_url`: its path replaced, its query
/// kept.
pub fn url_for(admin_url: &str, name: &str) -> String {
    let (base, query) = match admin_url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (admin_url, String::new()),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let server = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    format!("{server}/{name}{query}")
}

/// The stores a workload of its own (`--waiting`, `--crowds`) runs on, by name, and the
/// temporary directory for its files: a database named after `workload`, and a SQLite file
/// in the directory; `only` leaves one of them out.
pub async fn stores_for(
    workload: &str,
    databases: &Databases,
    only: Option<Block>,
) -> anyhow::Result<(tempfile::TempDir, Vec<(&'static str, Store)>)> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("fencelock-bench-{workload}-"))
        .tempdir()?;
    let uses = |block| only.is_none_or(|b| b == block);
    let mut stores = Vec::new();
    if uses(Block::Postgres) {
        let name = format!("fencelock_bench_{}_{workload}", std::process::id());
        let url = databases.create(&name).await?;
        stores.push(("PostgreSQL", Store::Postgres { url }));
    }
    if uses(Block::Sqlite) {
        stores.push(("SQLite", Store::sqlite(&dir.path().join("sqlite"))?));
    }
    Ok((dir, stores))
}

/// One lease store the server is run on.
pub enum Store {
    Postgres { url: String },
    Sqlite { path: PathBuf },
}

/// Resource names of the loaded leases; the workload's are `res:<n>`.
const LOADED_PREFIX: &str = "loaded:";
/// The loaded leases outlive any run: one day.
const LOADED_TTL_MS: i64 = 86_400_000;

impl Store {
    /// A SQLite file `fencelock.db` in a new directory `dir`.
    pub fn sqlite(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self::Sqlite {
            path: dir.join("fencelock.db"),
        })
    }

    /// The server's `DATABASE_URL`.
    pub fn database_url(&self) -> String {
        match self {
            Self::Postgres { url } => url.clone(),
            Self::Sqlite { path } => format!("sqlite://{}", path.display()),
        }
    }

    /// Between runs, with no server running: removes the workload's leases (a run stopped
    /// while some were held), so that every run starts from the same table. On PostgreSQL
    /// also vacuums, so that no run inherits another's dead rows.
    pub async fn reset(&self) -> anyhow::Result<()> {
        match self {
            Self::Postgres { url } => {
                let session = connect(url).await?;
                session
                    .batch_execute("DELETE FROM leases WHERE resource LIKE 'res:%'")
                    .await
                    .context("clearing the workload's leases")?;
                // VACUUM cannot share a multi-statement string (an implicit transaction).
                session.batch_execute("VACUUM (ANALYZE) leases").await?;
            }
            Self::Sqlite { path } => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                    let conn = rusqlite::Connection::open(&path)?;
                    conn.execute("DELETE FROM leases WHERE resource LIKE 'res:%'", [])?;
                    Ok(())
                })
                .await??;
            }
        }
        Ok(())
    }

    /// Inserts `count` live leases (one day left), with fences drawn from the store's own
    /// fence counter, so that every fence the server issues afterwards is still greater.
    /// The schema is the one the server's migrations made.
    pub async fn load_live_leases(&self, count: u64) -> anyhow::Result<()> {
        let count = i64::try_from(count)?;
        match self {
            Self::Postgres { url } => {
                let session = connect(url).await?;
                session
                    .execute(
                        &format!(
                            "INSERT INTO leases (resource, owner, fence, acquired_at, expires_at)
                             SELECT '{LOADED_PREFIX}' || g, 'loaded-owner-' || g, nextval('lease_fence'),
                                    date_trunc('milliseconds', now()),
                                    date_trunc('milliseconds', now()) + $2::bigint * interval '1 millisecond'
                             FROM generate_series(1, $1::bigint) AS g"
                        ),
                        &[&count, &LOADED_TTL_MS],
                    )
                    .await
                    .context("loading live leases")?;
                // What autovacuum would do soon after such a load; done now so that every
                // run sees the same table statistics.
                session.batch_execute("VACUUM (ANALYZE) leases").await?;
            }
            Self::Sqlite { path } => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || load_sqlite(&path, count)).await??;
            }
        }
        Ok(())
    }
}

fn load_sqlite(path: &Path, count: i64) -> anyhow::Result<()> {
    let mut conn = rusqlite::Connection::open(path)?;
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let last: i64 = tx.query_row(
        "SELECT last_fence FROM fence_counter WHERE id = 1",
        [],
        |r| r.get(0),
    )?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    tx.execute(
        &format!(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?1)
             INSERT INTO leases (resource, owner, fence, acquired_at, expires_at)
             SELECT '{LOADED_PREFIX}' || n, 'loaded-owner-' || n, ?2 + n, ?3, ?3 + ?4 FROM g"
        ),
        rusqlite::params![count, last, now_ms, LOADED_TTL_MS],
    )
    .context("loading live leases")?;
    tx.execute(
        "UPDATE fence_counter SET last_fence = ?1 WHERE id = 1",
        [last + count],
    )?;
    tx.commit()?;
    // Leave the file as a server would find it after a quiet spell: WAL folded in.
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_for_replaces_the_database_only() {
        assert_eq!(
            url_for("postgres://postgres@127.0.0.1:5432/postgres", "b_1"),
            "postgres://postgres@127.0.0.1:5432/b_1"
        );
        assert_eq!(
            url_for("postgres://u:p@db:5433/admin?sslmode=disable", "b_2"),
            "postgres://u:p@db:5433/b_2?sslmode=disable"
        );
        assert_eq!(
            url_for("postgres://localhost", "b_3"),
            "postgres://localhost/b_3"
        );
    }

    #[test]
    fn redact_hides_the_password_only() {
        assert_eq!(redact("postgres://u:secret@db/x"), "postgres://u:***@db/x");
        assert_eq!(redact("postgres://u@db/x"), "postgres://u@db/x");
    }

    /// As in `main`: the databases are declared before the runtime, so a panic drops the
    /// runtime first and then the databases.
    #[test]
    fn a_panic_still_drops_the_databases() {
        let url = std::env::var("FENCELOCK_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
        let name = format!("fencelock_bench_test_{}", fastrand::u64(..));
        let panicked = std::panic::catch_unwind(|| {
            let databases = Databases::new(&url);
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(async {
                databases.create(&name).await.unwrap();
                panic!("a run fails");
            });
        });
        assert!(panicked.is_err());
        let left: i64 = tokio::runtime::Runtime::new().unwrap().block_on(async {
            connect(&url)
                .await
                .unwrap()
                .query_one(
                    "SELECT count(*) FROM pg_database WHERE datname = $1",
                    &[&name],
                )
                .await
                .unwrap()
                .get(0)
        });
        assert_eq!(left, 0, "database {name} outlived the panic");
    }

    #[test]
    fn sqlite_load_keeps_fences_increasing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE leases (resource TEXT PRIMARY KEY, owner TEXT NOT NULL,
                 fence INTEGER NOT NULL, acquired_at INTEGER NOT NULL,
                 expires_at INTEGER NOT NULL, token TEXT);
             CREATE TABLE fence_counter (id INTEGER PRIMARY KEY, last_fence INTEGER NOT NULL);
             INSERT INTO fence_counter VALUES (1, 41);",
        )
        .unwrap();
        load_sqlite(&path, 1000).unwrap();
        let (rows, min, max): (i64, i64, i64) = conn
            .query_row(
                "SELECT count(*), min(fence), max(fence) FROM leases",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        let last: i64 = conn
            .query_row("SELECT last_fence FROM fence_counter", [], |r| r.get(0))
            .unwrap();
        assert_eq!((rows, min, max, last), (1000, 42, 1041, 1041));
    }
}
