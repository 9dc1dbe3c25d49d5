//! Fresh storage per test: a PostgreSQL database created beside the admin database and
//! dropped with its [`TestDb`], or a SQLite file in a temporary directory; and the tools a
//! test uses on it behind the store's back (ageing a lease, counting rows, locking a row).

use std::net::{SocketAddr, ToSocketAddrs as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fencelock_server::StoreConfig;
use fencelock_server::postgres::{PgConfig, Pooling};

use crate::pgbouncer::PgBouncer;

/// The two stores every contract rule runs against (see [`contract!`](crate::contract)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    Postgres,
    Sqlite,
}

/// Where tests find PostgreSQL; a database is created beside it for every test. An
/// unreachable server fails the test, never skips it.
pub fn admin_url() -> String {
    std::env::var("FENCELOCK_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A session on the PostgreSQL database at `url`. An unreachable server fails the test with
/// a message that says where PostgreSQL was looked for and how to point the tests elsewhere.
pub async fn pg_connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!("PostgreSQL for tests is not reachable at {url} ({e}); start it or set FENCELOCK_TEST_DATABASE_URL")
        });
    tokio::spawn(connection);
    client
}

/// The first column of every row `sql` returns on `session`, in order.
pub async fn first_column<T>(
    session: &tokio_postgres::Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Vec<T>
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    session
        .query(sql, params)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// A session on the admin database, as an operator would open one.
pub async fn admin() -> tokio_postgres::Client {
    pg_connect(&admin_url()).await
}

/// The address of the test PostgreSQL server, for a [`Proxy`](crate::Proxy) in front of it.
pub fn postgres_addr() -> SocketAddr {
    let config: tokio_postgres::Config = admin_url().parse().expect("admin URL parses");
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        #[cfg(unix)]
        tokio_postgres::config::Host::Unix(path) => {
            panic!("a proxy needs PostgreSQL over TCP, not {}", path.display())
        }
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    (host.as_str(), port)
        .to_socket_addrs()
        .expect("resolving the PostgreSQL host")
        .next()
        .expect("an address for the PostgreSQL host")
}

/// `url` with its host and port replaced by `addr`; user, database and options stay.
fn url_via(url: &str, addr: SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").expect("URL with a scheme");
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let userinfo = authority
        .rsplit_once('@')
        .map(|(userinfo, _)| format!("{userinfo}@"))
        .unwrap_or_default();
    format!("{scheme}://{userinfo}{addr}{tail}")
}

/// A URL for database `name` on the admin server.
fn url_for(name: &str) -> String {
    let admin = admin_url();
    let (base, query) = match admin.split_once('?') {
        Some((b, q)) => (b.to_owned(), format!("?{q}")),
        None => (admin.clone(), String::new()),
    };
    let (server, _) = base.rsplit_once('/').expect("admin URL has a path");
    format!("{server}/{name}{query}")
}

/// One store's storage, shared by every server instance of a test. Dropping it drops the
/// PostgreSQL database (even when the test panicked) or deletes the SQLite file's directory.
pub enum TestDb {
    Postgres {
        name: String,
        /// The PgBouncer the lease store reaches the database through, under
        /// [`through_pgbouncer`](crate::through_pgbouncer); the test's own sessions go direct.
        bouncer: Option<PgBouncer>,
    },
    Sqlite {
        _dir: tempfile::TempDir,
        path: PathBuf,
    },
}

impl TestDb {
    /// Fresh, empty storage of `kind`: a new PostgreSQL database, or a new SQLite file.
    pub async fn new(kind: StoreKind) -> Arc<Self> {
        match kind {
            StoreKind::Postgres => {
                let name = format!("fencelock_test_{:016x}", fastrand::u64(..));
                admin()
                    .await
                    .batch_execute(&format!("CREATE DATABASE {name}"))
                    .await
                    .expect("creating the test database");
                let bouncer = crate::pgbouncer::requested()
                    .map(|pooling| PgBouncer::start(&admin_url(), pooling));
                Arc::new(Self::Postgres { name, bouncer })
            }
            StoreKind::Sqlite => Self::sqlite(),
        }
    }

    /// A SQLite file in a new temporary directory, for code with no runtime to await
    /// [`TestDb::new`] in.
    pub fn sqlite() -> Arc<Self> {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("fencelock.db");
        Arc::new(Self::Sqlite { _dir: dir, path })
    }

    /// The `DATABASE_URL` that names this storage.
    pub fn url(&self) -> String {
        match self {
            Self::Postgres { name, .. } => url_for(name),
            Self::Sqlite { path, .. } => format!("sqlite://{}", path.display()),
        }
    }

    /// The URL of this PostgreSQL database reached through `addr`, a
    /// [`Proxy`](crate::Proxy) in front of [`postgres_addr`].
    pub fn url_via(&self, addr: SocketAddr) -> String {
        assert!(
            matches!(self, Self::Postgres { .. }),
            "a proxy stands in front of PostgreSQL only"
        );
        url_via(&self.url(), addr)
    }

    /// The lease store's configuration for this storage.
    pub fn store_config(&self) -> StoreConfig {
        match self {
            Self::Postgres {
                name,
                bouncer: Some(bouncer),
            } => {
                let direct = url_for(name);
                let mut pg =
                    PgConfig::parse(&url_via(&direct, bouncer.address())).expect("URL parses");
                pg.pooling = bouncer.pooling();
                // LISTEN cannot work through transaction pooling: it goes around the pooler.
                if bouncer.pooling() == Pooling::Transaction {
                    pg.listen = Some(Box::new(PgConfig::parse(&direct).expect("URL parses")));
                }
                StoreConfig::Postgres(Box::new(pg))
            }
            Self::Postgres {
                name,
                bouncer: None,
            } => {
                let mut pg = PgConfig::parse(&admin_url()).expect("admin URL parses");
                pg.config.dbname(name);
                StoreConfig::Postgres(Box::new(pg))
            }
            Self::Sqlite { path, .. } => StoreConfig::Sqlite(path.clone()),
        }
    }

    /// Makes the lease on `resource` expire `ago_ms` milliseconds ago by the store's own
    /// clock, the way time passing would, without waiting for it. The lease's history row
    /// follows, as it does when time passes (on PostgreSQL the lease row is its history).
    pub async fn age(&self, resource: &str, ago_ms: i64) {
        let updated: i64 = match self {
            Self::Postgres { .. } => pg_connect(&self.url())
                .await
                .execute(
                    "UPDATE leases SET expires_at = now() - $2::bigint * interval '1 millisecond'
                     WHERE resource = $1 AND ended_at IS NULL",
                    &[&resource, &ago_ms],
                )
                .await
                .map(|n| n as i64)
                .expect("ageing a lease"),
            Self::Sqlite { path, .. } => {
                let conn = sqlite(path);
                let expired = chrono::Utc::now().timestamp_millis() - ago_ms;
                conn.execute(
                    "UPDATE lease_history SET expires_at = ?2
                     WHERE fence = (SELECT fence FROM leases WHERE resource = ?1)",
                    rusqlite::params![resource, expired],
                )
                .expect("ageing a lease's history");
                conn.execute(
                    "UPDATE leases SET expires_at = ?2 WHERE resource = ?1",
                    rusqlite::params![resource, expired],
                )
                .expect("ageing a lease") as i64
            }
        };
        assert_eq!(updated, 1, "no lease row for {resource} to age");
    }

    /// Moves every time in `resource`'s lease history `ago_ms` milliseconds back, as if all of
    /// it had happened that much earlier. For resources without a live lease: the lease table
    /// is not touched.
    pub async fn age_history(&self, resource: &str, ago_ms: i64) {
        self.change(
            "ageing a history",
            (
                "UPDATE leases SET
                     acquired_at = acquired_at - $2::bigint * interval '1 millisecond',
                     expires_at = expires_at - $2::bigint * interval '1 millisecond',
                     ended_at = ended_at - $2::bigint * interval '1 millisecond'
                 WHERE resource = $1",
                &[&resource, &ago_ms],
            ),
            (
                "UPDATE lease_history SET acquired_at = acquired_at - ?2,
                     expires_at = expires_at - ?2, ended_at = ended_at - ?2
                 WHERE resource = ?1",
                rusqlite::params![resource, ago_ms],
            ),
        )
        .await;
    }

    /// Rows in the lease history for `resource`.
    pub async fn history_rows(&self, resource: &str) -> i64 {
        self.count(Rows::History, Some(resource)).await
    }

    /// Runs SQL (the same text on both stores) on the store's database, as an operator would.
    pub async fn execute(&self, sql: &str) {
        match self {
            Self::Postgres { .. } => pg_connect(&self.url())
                .await
                .batch_execute(sql)
                .await
                .expect("running SQL on the test database"),
            Self::Sqlite { path, .. } => sqlite(path)
                .execute_batch(sql)
                .expect("running SQL on the test database"),
        }
    }

    /// Sets the fence counter so that the next fence issued is `last + 1`.
    pub async fn set_last_fence(&self, last: i64) {
        match self {
            Self::Postgres { .. } => {
                pg_connect(&self.url())
                    .await
                    .batch_execute(&format!(
                        "ALTER SEQUENCE lease_fence RESTART WITH {}",
                        last + 1
                    ))
                    .await
                    .expect("setting the fence sequence");
            }
            Self::Sqlite { path, .. } => {
                sqlite(path)
                    .execute(
                        "UPDATE fence_counter SET last_fence = ?1 WHERE id = 1",
                        [last],
                    )
                    .expect("setting the fence counter");
            }
        }
    }

    /// Tickets queued for `resource` (waiting acquisitions), live or expired.
    pub async fn waiters(&self, resource: &str) -> i64 {
        self.count(Rows::Waiters, Some(resource)).await
    }

    /// Queues a ticket for `resource` that lives `live_for_ms` by the store's clock, as a
    /// waiter of an instance that then died would leave it.
    pub async fn queue_ticket(&self, resource: &str, live_for_ms: i64) {
        let until = chrono::Utc::now().timestamp_millis() + live_for_ms;
        self.change(
            "queueing a ticket",
            (
                "INSERT INTO lease_waiters (resource, expires_at) VALUES ($1, now() + $2::bigint * interval '1 millisecond')",
                &[&resource, &live_for_ms],
            ),
            (
                "INSERT INTO lease_waiters (resource, expires_at) VALUES (?1, ?2)",
                rusqlite::params![resource, until],
            ),
        )
        .await;
    }

    /// Leases of `resource` that are its current one, live or expired: 1, or 0 once it was
    /// released or purged.
    pub async fn rows(&self, resource: &str) -> i64 {
        self.count(Rows::Current, Some(resource)).await
    }

    /// Adds `count` leases on one-off resources that expired `ago_ms` milliseconds ago.
    pub async fn insert_expired(&self, count: i64, ago_ms: i64) {
        let expired = chrono::Utc::now().timestamp_millis() - ago_ms;
        self.change(
            "inserting expired leases",
            (
                "INSERT INTO leases (resource, owner, fence, acquired_at, expires_at)
                 SELECT 'bulk-' || g, 'o', g,
                        now() - $2::bigint * interval '1 millisecond' - interval '1 minute',
                        now() - $2::bigint * interval '1 millisecond'
                 FROM generate_series(1, $1::bigint) AS g",
                &[&count, &ago_ms],
            ),
            (
                "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?1)
                 INSERT INTO leases (resource, owner, fence, acquired_at, expires_at)
                 SELECT 'bulk-' || n, 'o', n, ?2 - 60000, ?2 FROM g",
                rusqlite::params![count, expired],
            ),
        )
        .await;
    }

    /// Every resource's current lease, live or expired.
    pub async fn total_rows(&self) -> i64 {
        self.count(Rows::Current, None).await
    }

    /// Runs one statement that changes the tables, in the store's own dialect: `on_postgres`
    /// or `on_sqlite`, each an SQL text and its parameters; `what` names it if it fails.
    async fn change(
        &self,
        what: &str,
        on_postgres: (&str, &[&(dyn tokio_postgres::types::ToSql + Sync)]),
        on_sqlite: (&str, impl rusqlite::Params),
    ) {
        match self {
            Self::Postgres { .. } => {
                let (sql, params) = on_postgres;
                pg_connect(&self.url())
                    .await
                    .execute(sql, params)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            Self::Sqlite { path, .. } => {
                let (sql, params) = on_sqlite;
                sqlite(path)
                    .execute(sql, params)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            }
        }
    }

    /// `rows` of `resource`, or of all resources.
    async fn count(&self, rows: Rows, resource: Option<&str>) -> i64 {
        // PostgreSQL keeps a resource's history in its lease table, its current lease being
        // the row not yet ended; SQLite keeps the current lease and the history apart.
        let (table, condition) = match (self, rows) {
            (_, Rows::Waiters) => ("lease_waiters", None),
            (Self::Postgres { .. }, Rows::Current) => ("leases", Some("ended_at IS NULL")),
            (Self::Postgres { .. }, Rows::History) => ("leases", None),
            (Self::Sqlite { .. }, Rows::Current) => ("leases", None),
            (Self::Sqlite { .. }, Rows::History) => ("lease_history", None),
        };
        // `$1` is a numbered parameter on both stores.
        let filters: Vec<&str> = resource
            .map(|_| "resource = $1")
            .into_iter()
            .chain(condition)
            .collect();
        let filter = if filters.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", filters.join(" AND "))
        };
        let sql = format!("SELECT count(*) FROM {table}{filter}");
        let counted = match self {
            Self::Postgres { .. } => {
                let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                    resource.iter().map(|r| r as _).collect();
                pg_connect(&self.url())
                    .await
                    .query_one(&sql, &params)
                    .await
                    .map(|row| row.get(0))
                    .map_err(|e| e.to_string())
            }
            Self::Sqlite { path, .. } => sqlite(path)
                .query_row(&sql, rusqlite::params_from_iter(resource), |r| r.get(0))
                .map_err(|e| e.to_string()),
        };
        counted.unwrap_or_else(|e| panic!("{sql}: {e}"))
    }
}

/// Sessions of `session`'s database waiting for a lock right now, as PostgreSQL reports them.
///
/// A session inside a transaction keeps the activity it read first for as long as it lasts:
/// the snapshot is dropped before each reading.
pub async fn lock_waiters(session: &tokio_postgres::Client) -> i64 {
    session
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .expect("dropping the activity snapshot");
    session
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .expect("reading pg_stat_activity")
        .get(0)
}

/// A row lock on a lease, held by another session until released: requests that need the row
/// wait inside PostgreSQL, as they would behind a slow transaction.
pub struct RowLock {
    session: tokio_postgres::Client,
}

impl RowLock {
    /// Locks the lease row of `resource` in the test's PostgreSQL database.
    pub async fn take(db: &TestDb, resource: &str) -> Self {
        assert!(
            matches!(db, TestDb::Postgres { .. }),
            "row locks are a PostgreSQL test tool"
        );
        let session = pg_connect(&db.url()).await;
        session.batch_execute("BEGIN").await.expect("BEGIN");
        let locked = session
            .execute(
                "SELECT 1 FROM leases WHERE resource = $1 AND ended_at IS NULL FOR UPDATE",
                &[&resource],
            )
            .await
            .expect("locking the row");
        assert_eq!(locked, 1, "no lease row for {resource} to lock");
        Self { session }
    }

    /// Sessions of this database waiting for a lock right now ([`lock_waiters`], read from
    /// inside this session's open transaction).
    pub async fn waiters(&self) -> i64 {
        lock_waiters(&self.session).await
    }

    /// Ends the other session's transaction, letting the waiting requests through.
    pub async fn release(self) {
        self.session
            .batch_execute("ROLLBACK")
            .await
            .expect("ROLLBACK");
    }
}

/// What [`TestDb::count`] counts.
#[derive(Clone, Copy)]
enum Rows {
    /// Each resource's current lease.
    Current,
    /// Every lease the history keeps, the current one included.
    History,
    /// Tickets in the waiting queues.
    Waiters,
}

fn sqlite(path: &std::path::Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("opening the test SQLite file");
    conn.busy_timeout(Duration::from_secs(10))
        .expect("busy timeout");
    conn
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Self::Postgres { name, .. } = self {
            let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            // Drop runs inside the test's runtime, which cannot be blocked on: use a thread
            // with a runtime of its own.
            let dropped = std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime")
                    .block_on(async move { admin().await.batch_execute(&sql).await })
            })
            .join();
            if let Ok(Err(e)) = dropped {
                eprintln!("could not drop test database {name}: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_via_replaces_only_host_and_port() {
        let addr: SocketAddr = "127.0.0.1:6000".parse().unwrap();
        assert_eq!(
            url_via(
                "postgres://postgres@db.example:5432/fl_1?sslmode=disable",
                addr
            ),
            "postgres://postgres@127.0.0.1:6000/fl_1?sslmode=disable"
        );
        assert_eq!(
            url_via("postgres://u:p@w@localhost/fl_2", addr),
            "postgres://u:p@w@127.0.0.1:6000/fl_2"
        );
        assert_eq!(
            url_via("postgres://localhost", addr),
            "postgres://127.0.0.1:6000"
        );
    }
}
