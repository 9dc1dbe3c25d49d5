//! How the store's statements reach PostgreSQL, by what stands between (`--pg-pooling`):
//!
//! - [`Pooling::Direct`] (the default): PostgreSQL itself. Each pooled connection carries its
//!   settings in the startup `options`, and statements are prepared once per connection and
//!   cached: every request is one round trip, with no parse or plan.
//! - [`Pooling::Session`]: a pooler in session pooling (PgBouncer `pool_mode = session`),
//!   which gives each client connection one server session for as long as it lasts, but
//!   refuses the startup `options` (or drops them, with `ignore_startup_parameters`). The
//!   settings are sent with `SET` once a connection is made; the rest is as direct.
//! - [`Pooling::Transaction`]: a pooler in transaction pooling (PgBouncer
//!   `pool_mode = transaction`), which may hand each transaction to another server session.
//!   Nothing may outlive a transaction there: no session setting, no named prepared
//!   statement. Each statement is sent unnamed with its parameters' types (no prepare round
//!   trip) inside a transaction of its own that first sets its settings with `SET LOCAL`:
//!   `BEGIN; SET LOCAL ...`, the statement, `COMMIT`, pipelined as one round trip. PostgreSQL
//!   parses and plans each such statement anew: a little more work for the database, the
//!   price of the pooler.

use deadpool_postgres::ClientWrapper;
use futures_util::{TryStreamExt as _, pin_mut};
use std::time::Duration;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Error, Row};

/// What stands between the lease server and PostgreSQL.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Pooling {
    /// PostgreSQL itself (or a proxy that passes sessions through unchanged).
    #[default]
    Direct,
    /// A pooler in session pooling mode.
    Session,
    /// A pooler in transaction pooling mode.
    Transaction,
}

impl Pooling {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Session => "session",
            Self::Transaction => "transaction",
        }
    }
}

/// A statement's text and the types of its parameters, as PostgreSQL is to take them (so
/// that an unnamed statement needs no prepare round trip to learn them).
pub(crate) struct Sql {
    pub text: &'static str,
    pub types: &'static [Type],
}

/// Every session setting the store's statements rely on: a fence is returned only once its
/// commit is durable (a lost commit would let the sequence hand the same fence out again); no
/// statement runs longer than the store timeout; sequential scans are the last resort (see
/// `postgres::pool`).
pub(crate) fn settings(statement_timeout: Duration) -> [(&'static str, String); 3] {
    [
        ("synchronous_commit", "on".to_owned()),
        (
            "statement_timeout",
            statement_timeout.as_millis().to_string(),
        ),
        ("enable_seqscan", "off".to_owned()),
    ]
}

/// Sends the store's statements as [`Pooling`] requires.
pub(crate) struct Statements {
    pooling: Pooling,
    /// Under transaction pooling: `BEGIN` and the settings, as `SET LOCAL`.
    begin: String,
}

impl Statements {
    pub(crate) fn new(pooling: Pooling, statement_timeout: Duration) -> Self {
        let mut begin = "BEGIN".to_owned();
        for (name, value) in settings(statement_timeout) {
            begin.push_str(&format!("; SET LOCAL {name} = {value}"));
        }
        Self { pooling, begin }
    }

    /// The rows of `sql` with `params`.
    pub(crate) async fn query(
        &self,
        client: &ClientWrapper,
        sql: &Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        if self.pooling != Pooling::Transaction {
            let statement = client.prepare_typed_cached(sql.text, sql.types).await?;
            return client.query(&statement, params).await;
        }
        let typed = typed(sql, params);
        self.in_transaction(client, client.query_typed(sql.text, &typed))
            .await
    }

    /// The one row of `sql` with `params`, if it answers one.
    pub(crate) async fn query_opt(
        &self,
        client: &ClientWrapper,
        sql: &Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error> {
        Ok(self.query(client, sql, params).await?.into_iter().next())
    }

    /// How many rows `sql` with `params` changed.
    pub(crate) async fn execute(
        &self,
        client: &ClientWrapper,
        sql: &Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error> {
        if self.pooling != Pooling::Transaction {
            let statement = client.prepare_typed_cached(sql.text, sql.types).await?;
            return client.execute(&statement, params).await;
        }
        let typed = typed(sql, params);
        let counted = async {
            let rows = client.query_typed_raw(sql.text, typed).await?;
            pin_mut!(rows);
            while rows.try_next().await?.is_some() {}
            Ok(rows.rows_affected().unwrap_or(0))
        };
        self.in_transaction(client, counted).await
    }

    /// `sql`, a statement without parameters, in the simple query protocol.
    pub(crate) async fn simple(&self, client: &ClientWrapper, sql: &str) -> Result<(), Error> {
        if self.pooling != Pooling::Transaction {
            return client.batch_execute(sql).await;
        }
        client
            .batch_execute(&format!("{}; {sql}; COMMIT", self.begin))
            .await
    }

    /// `work` in a transaction of its own with the settings in force. The three parts are
    /// sent together, in order (each future sends its messages when first polled), so this
    /// is one round trip. A failed `work` turns the `COMMIT` into a rollback, which is not
    /// an error: `work`'s own error is the answer.
    async fn in_transaction<T>(
        &self,
        client: &ClientWrapper,
        work: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let (begun, done, committed) = tokio::join!(
            client.batch_execute(&self.begin),
            work,
            client.batch_execute("COMMIT"),
        );
        begun?;
        let done = done?;
        committed?;
        Ok(done)
    }
}

/// What a session reports of itself, to tell what stands between (see [`pooling_mismatch`]).
pub(crate) const SESSION: Sql = Sql {
    text: "SELECT current_setting('enable_seqscan'), pg_backend_pid()",
    types: &[],
};

/// The database URL leads somewhere other than `--pg-pooling` says: fatal at start, since
/// every request would lose settings or prepared statements on the way.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct PoolingMismatch(String);

impl PoolingMismatch {
    /// A request found its session shared with another client (`error`: a prepared statement
    /// missing or already there).
    pub(crate) fn shared(error: tokio_postgres::Error) -> Self {
        Self(format!(
            "the PostgreSQL session of a connection is shared with other clients ({error}), as behind a pooler in transaction pooling: start with --pg-pooling transaction and --listen-database-url"
        ))
    }
}

/// Why sessions that answered `SESSION` with `first` and, if a second connection was open at
/// the same time, `second`, cannot be what `pooling` says: a setting sent at connection was
/// lost (a pooler that drops startup options), or two connections open at once shared one
/// PostgreSQL session (transaction pooling). `None`: nothing seen against it. A pooler in
/// transaction pooling may also give two connections two sessions, so this finds a mismatch
/// often, not always.
pub(crate) fn pooling_mismatch(
    pooling: Pooling,
    first: (&str, i32),
    second: Option<(&str, i32)>,
) -> Option<PoolingMismatch> {
    if pooling == Pooling::Transaction {
        return None;
    }
    let flag = pooling.as_str();
    if first.0 != "off" || second.is_some_and(|s| s.0 != "off") {
        return Some(PoolingMismatch(format!(
            "the sessions at the database URL lost the settings sent when they were opened (statement_timeout, synchronous_commit), as PgBouncer does with ignore_startup_parameters = options: start with --pg-pooling session or --pg-pooling transaction, as PgBouncer's pool_mode (this start said {flag})"
        )));
    }
    if second.is_some_and(|s| s.1 == first.1) {
        return Some(PoolingMismatch(format!(
            "two connections open at once share one PostgreSQL session (backend {}): the database URL leads to a pooler in transaction pooling; start with --pg-pooling transaction and --listen-database-url (this start said {flag})",
            first.1
        )));
    }
    None
}

fn typed<'a>(sql: &Sql, params: &[&'a (dyn ToSql + Sync)]) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    debug_assert_eq!(params.len(), sql.types.len(), "{}", sql.text);
    params
        .iter()
        .copied()
        .zip(sql.types.iter().cloned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_settings_and_shared_sessions_are_mismatches() {
        use Pooling::*;
        assert!(pooling_mismatch(Direct, ("off", 1), Some(("off", 2))).is_none());
        assert!(pooling_mismatch(Session, ("off", 1), None).is_none());
        let lost = pooling_mismatch(Direct, ("on", 1), Some(("on", 2))).unwrap();
        assert!(
            lost.to_string()
                .contains("--pg-pooling session or --pg-pooling transaction")
        );
        let shared = pooling_mismatch(Session, ("off", 7), Some(("off", 7))).unwrap();
        assert!(
            shared.to_string().contains("--pg-pooling transaction"),
            "{shared}"
        );
        assert!(pooling_mismatch(Transaction, ("on", 7), Some(("on", 7))).is_none());
    }

    #[test]
    fn a_pooled_transaction_sets_everything_locally() {
        let statements = Statements::new(Pooling::Transaction, Duration::from_millis(5000));
        assert_eq!(
            statements.begin,
            "BEGIN; SET LOCAL synchronous_commit = on; SET LOCAL statement_timeout = 5000; SET LOCAL enable_seqscan = off"
        );
    }
}
