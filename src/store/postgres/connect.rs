//! Connecting: the database URL's settings (`PgConfig`), the pool every request and
//! committer draws from, and the runtime every connection lives on.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, Pool};
use fencelock::guard::postgres as guard_pg;
use guard_pg::POOL_TIMEOUT;

use super::conninfo;
use super::statements::{self, Pooling};
use super::tls::{self, PgTls};

/// Connection settings plus the same URL with the password masked, for logs.
#[derive(Clone)]
pub struct PgConfig {
    /// As the URL gives them; the settings every session needs are added where connections
    /// are made, as [`PgConfig::pooling`] allows (see [`statements`]).
    pub config: tokio_postgres::Config,
    pub redacted_url: String,
    /// `sslmode` and `sslrootcert` (see [`tls`]); `config`'s own SSL mode follows it.
    pub tls: PgTls,
    /// What stands between this server and PostgreSQL (`--pg-pooling`).
    pub pooling: Pooling,
    /// Where the LISTEN session connects (`--listen-database-url`), if not where `config`
    /// does: around a pooler in transaction pooling, which cannot keep a LISTEN.
    pub listen: Option<Box<PgConfig>>,
}

impl PgConfig {
    pub fn parse(url: &str) -> anyhow::Result<Self> {
        let (driver_url, tls) = tls::take_tls_parameters(url)?;
        let mut config = tokio_postgres::Config::from_str(&driver_url)
            .map_err(|e| anyhow::anyhow!("invalid PostgreSQL URL: {e}"))?;
        config.ssl_mode(tls.driver_mode());
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(POOL_TIMEOUT);
        }
        config.application_name("fencelock");
        Ok(Self {
            redacted_url: redact_password(url),
            config,
            tls,
            pooling: Pooling::Direct,
            listen: None,
        })
    }

    /// The settings of a session of its own (the migration, `check`, the LISTEN session):
    /// a fence must never be returned before its commit is durable (after a crash a lost
    /// commit would let the sequence hand the same fence out again), so whatever the database
    /// default, this server's sessions commit synchronously. Through a pooler, which refuses
    /// startup options, the migration sets it in its transaction instead.
    pub fn session_config(&self) -> tokio_postgres::Config {
        let mut config = self.config.clone();
        if self.pooling == Pooling::Direct {
            with_options(&mut config, &[("synchronous_commit", "on".to_owned())]);
        }
        config
    }

    /// The LISTEN session's settings: [`PgConfig::listen`]'s, or these.
    pub(super) fn listen_config(&self) -> &PgConfig {
        self.listen.as_deref().unwrap_or(self)
    }
}

/// Adds `-c name=value` for each setting to the startup `options` `config` already carries.
fn with_options(config: &mut tokio_postgres::Config, settings: &[(&str, String)]) {
    let mut options = config.get_options().unwrap_or_default().to_owned();
    for (name, value) in settings {
        options.push_str(&format!(" -c {name}={value}"));
    }
    config.options(options.trim_start());
}

/// A connection pool with the lease server's timeouts, for any service that talks to
/// PostgreSQL on the request path (the lease store, the demo store): no request ever waits
/// longer than [`POOL_TIMEOUT`] for a connection, and no statement runs longer than
/// `statement_timeout`, so an outage is answered with `503` rather than a hang.
///
/// Connections are made on first use, not here.
///
/// Sessions also plan without sequential scans. Every statement on the request path finds its
/// rows through an index, but a plan is cached (a prepared statement's generic plan, or one
/// inside a PL/pgSQL function) and costed on the table as it was then: planned while the
/// table was a few pages, a primary-key lookup becomes a sequential scan, and stays one while
/// the table grows to thousands of pages of live and dead rows. A new deployment would get
/// slower as it filled up, until autovacuum's next `ANALYZE`. Statements with no usable index
/// still scan, as the setting only makes sequential scans the last resort.
pub fn pool(pg: &PgConfig, pool_size: usize, statement_timeout: Duration) -> anyhow::Result<Pool> {
    let mut config = pg.config.clone();
    let settings = statements::settings(statement_timeout);
    // Through a pooler in session pooling the settings are set once per connection; in
    // transaction pooling, per transaction (see `statements`).
    let mut on_connect = None;
    match pg.pooling {
        Pooling::Direct => with_options(&mut config, &settings),
        Pooling::Session => {
            on_connect = Some(
                settings
                    .iter()
                    .map(|(name, value)| format!("SET {name} = {value}"))
                    .collect::<Vec<_>>()
                    .join("; "),
            );
        }
        Pooling::Transaction => {}
    }
    let manager = Manager::from_connect(
        config,
        OnDriverRuntime {
            tls: pg.tls.connector.clone(),
            on_connect,
        },
        guard_pg::manager_config(),
    );
    guard_pg::pool_of(manager, pool_size)
}

/// The runtime every pooled connection lives on.
///
/// A connection's socket and its driver task belong to the runtime that opened them. actix
/// runs one runtime per worker thread and stops an idle worker's runtime first on a graceful
/// shutdown, which would cut the connections it opened while another worker is still
/// finishing a request on one of them. Connections therefore live on a runtime of their own
/// that lasts as long as the process; requests on any worker talk to them through the
/// client's channel, as they always do.
pub(super) static DRIVERS: std::sync::LazyLock<tokio::runtime::Runtime> =
    std::sync::LazyLock::new(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fencelock-pg")
            .enable_all()
            .build()
            .expect("starting the PostgreSQL connection runtime")
    });

/// Opens pool connections on [`DRIVERS`], with TLS as `sslmode` asks, and runs
/// `on_connect` on each before it is used.
struct OnDriverRuntime {
    tls: tls::MakeRustlsConnect,
    on_connect: Option<String>,
}

impl deadpool_postgres::Connect for OnDriverRuntime {
    fn connect(
        &self,
        config: &tokio_postgres::Config,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
    > {
        let config = config.clone();
        let tls = self.tls.clone();
        let on_connect = self.on_connect.clone();
        Box::pin(async move {
            let opened = DRIVERS.spawn(async move {
                let (client, connection) = config.connect(tls).await?;
                let driver = tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!(error = %e, "PostgreSQL connection ended");
                    }
                });
                if let Some(sql) = on_connect
                    && let Err(e) = client.batch_execute(&sql).await
                {
                    driver.abort();
                    return Err(e);
                }
                Ok((client, driver))
            });
            match opened.await {
                Ok(result) => result,
                // The runtime lives as long as the process, so this is a panic in the connect
                // code itself: pass it on.
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        })
    }
}

/// `url` for logs: the password masked, in the URL's user info, in a `password` query
/// parameter, or in a key-value connection string.
fn redact_password(url: &str) -> String {
    if conninfo::is_key_value(url) {
        return conninfo::parse(url).map_or_else(
            |_| "(a key-value connection string that does not parse)".to_owned(),
            |pairs| conninfo::redacted(&pairs),
        );
    }
    // postgres://user:password@host/db → postgres://user:***@host/db
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{user}:***@{host}")
        }
        _ => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some(("password", _)) => "password=***".to_owned(),
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_is_masked_in_logs() {
        assert_eq!(
            redact_password("postgres://app:s3cret@db:5432/locks"),
            "postgres://app:***@db:5432/locks"
        );
        assert_eq!(
            redact_password("postgres://app@db/locks"),
            "postgres://app@db/locks"
        );
        assert_eq!(
            redact_password(
                "postgres://app:s3cret@a:5432,b:5433/locks?target_session_attrs=read-write"
            ),
            "postgres://app:***@a:5432,b:5433/locks?target_session_attrs=read-write"
        );
        assert_eq!(
            redact_password("postgres://db/locks?user=app&password=s3cret&sslmode=disable"),
            "postgres://db/locks?user=app&password=***&sslmode=disable"
        );
        assert_eq!(
            redact_password("host=a,b port=5432,5433 user=app password='s3 cret' dbname=locks"),
            "host=a,b port=5432,5433 user=app password=*** dbname=locks"
        );
    }

    #[test]
    fn the_key_value_form_is_accepted_with_several_hosts() {
        let pg = PgConfig::parse(
            "host=a,b port=5432,5433 user=postgres password=s3cret dbname=x \
             target_session_attrs=read-write sslmode=disable",
        )
        .unwrap();
        assert_eq!(pg.config.get_hosts().len(), 2);
        assert_eq!(pg.config.get_ports(), [5432, 5433]);
        assert_eq!(pg.config.get_dbname(), Some("x"));
        assert_eq!(
            pg.config.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
        assert!(
            pg.session_config()
                .get_options()
                .unwrap()
                .contains("synchronous_commit=on")
        );
        assert!(!pg.redacted_url.contains("s3cret"), "{}", pg.redacted_url);
        // The server's own TLS parameters are taken out before the driver reads the rest.
        assert!(PgConfig::parse("host=a sslmode=verify-full sslrootcert=/nonexistent").is_err());
        assert!(PgConfig::parse("host=a sslmode=bogus").is_err());
        assert!(PgConfig::parse("host=a bogus_key=1").is_err());
    }

    #[test]
    fn sessions_commit_synchronously() {
        let mut pg =
            PgConfig::parse("postgres://u@localhost/db?options=-c%20work_mem%3D8MB").unwrap();
        assert_eq!(
            pg.session_config().get_options(),
            Some("-c work_mem=8MB -c synchronous_commit=on")
        );
        // A pooler refuses startup options, or drops them: none are added (the migration
        // and every pooled transaction set what they need themselves).
        for pooling in [Pooling::Session, Pooling::Transaction] {
            pg.pooling = pooling;
            assert_eq!(pg.session_config().get_options(), Some("-c work_mem=8MB"));
        }
        let mut pg = PgConfig::parse("postgres://u@localhost/db").unwrap();
        pg.pooling = Pooling::Transaction;
        assert_eq!(pg.session_config().get_options(), None);
    }
}
