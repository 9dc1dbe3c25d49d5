use async_trait::async_trait;
use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use fencelock::domain::ResourceName;
use fencelock::guard::{self, Admission, GuardError, GuardMetrics};
use fencelock_server::postgres::{PgConfig, classify, classify_pool};
use fencelock_server::{StoreError, StoreOptions};
use tokio::sync::OnceCell;

use super::{Doc, DocStore, Guarding, Outcome, Page, Put, Write, WriteRecord, WritesPage, corrupt};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS docs (
    key        text        PRIMARY KEY,
    value      text        NOT NULL,
    fence      bigint      NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS doc_writes (
    id      bigserial   PRIMARY KEY,
    key     text        NOT NULL,
    fence   bigint      NOT NULL,
    outcome text        NOT NULL CHECK (outcome IN ('applied', 'rejected')),
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS doc_writes_key_id_idx ON doc_writes (key, id);";

/// The documents on PostgreSQL, through the lease server's pool: no request waits longer
/// than the pool's timeouts for a connection, and no statement runs longer than the store
/// timeout, so an outage is answered with `503` rather than a hang.
pub struct PgDocs {
    pool: Pool,
    guarding: Guarding,
    guard: GuardMetrics,
    /// Set once the tables exist; until then every operation tries to create them first, so
    /// a store started before its database comes up heals by itself.
    schema: OnceCell<()>,
}

impl PgDocs {
    /// Builds the pool and tries once to create the tables; an unreachable database is logged
    /// and left for the first request to retry.
    pub async fn open(
        config: &PgConfig,
        guarding: Guarding,
        settings: StoreOptions,
        guard: GuardMetrics,
    ) -> anyhow::Result<Self> {
        let pool = fencelock_server::postgres::pool(config, settings.pool_size, settings.timeout)?;
        let docs = Self {
            pool,
            guarding,
            guard,
            schema: OnceCell::new(),
        };
        let first_contact = tokio::time::timeout(settings.timeout, docs.ensure_schema()).await;
        match first_contact {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(
                error = %e,
                database = %config.redacted_url,
                "PostgreSQL is not available yet; serving 503 until it is"
            ),
            Err(_) => tracing::warn!(
                database = %config.redacted_url,
                "PostgreSQL did not answer within the store timeout; serving 503 until it does"
            ),
        }
        Ok(docs)
    }

    async fn ensure_schema(&self) -> Result<(), StoreError> {
        self.schema
            .get_or_try_init(|| async {
                let client = self.pool.get().await.map_err(classify_pool)?;
                client
                    .batch_execute(guard::postgres::SCHEMA)
                    .await
                    .map_err(classify)?;
                client.batch_execute(SCHEMA).await.map_err(classify)
            })
            .await
            .map(|_| ())
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.ensure_schema().await?;
        self.pool.get().await.map_err(classify_pool)
    }
}

/// The guard in the database checks the token again, by the keys installed in it: the store
/// installs none, so it refuses nothing the service's guard admitted, unless someone
/// installed other keys into the store's database.
fn unexpected_refusal(e: GuardError) -> StoreError {
    match e {
        GuardError::Store(e) => e,
        refusal => StoreError::Internal(anyhow::anyhow!(
            "fencelock_guard.admit refused a token the store's guard admitted (keys installed in its database?): {refusal}"
        )),
    }
}

#[async_trait]
impl DocStore for PgDocs {
    async fn put(&self, write: &Write) -> Result<Put, StoreError> {
        let Write { key, value, fence } = write;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(classify)?;
        let admission = match self.guarding {
            Guarding::On => guard::postgres::admit(&tx, fence, &self.guard)
                .await
                .map_err(unexpected_refusal)?,
            Guarding::Off => Admission::Admitted,
        };
        let put = match admission {
            Admission::Admitted => {
                let updated_at: DateTime<Utc> = tx
                    .query_one(
                        "INSERT INTO docs (key, value, fence, updated_at) VALUES ($1, $2, $3, now())
                         ON CONFLICT (key) DO UPDATE SET
                             value = EXCLUDED.value, fence = EXCLUDED.fence, updated_at = EXCLUDED.updated_at
                         RETURNING updated_at",
                        &[&key.as_str(), &value.to_string(), &fence.fence().get()],
                    )
                    .await
                    .map_err(classify)?
                    .get(0);
                write.applied(updated_at)
            }
            Admission::Stale { current } => Put::Stale { current },
        };
        tx.execute(
            "INSERT INTO doc_writes (key, fence, outcome) VALUES ($1, $2, $3)",
            &[&key.as_str(), &fence.fence().get(), &put.outcome().as_str()],
        )
        .await
        .map_err(classify)?;
        tx.commit().await.map_err(classify)?;
        Ok(put)
    }

    async fn get(&self, key: &ResourceName) -> Result<Option<Doc>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT value, fence, updated_at FROM docs WHERE key = $1",
                &[&key.as_str()],
            )
            .await
            .map_err(classify)?;
        row.map(|row| {
            Ok(Doc {
                key: key.to_string(),
                value: serde_json::from_str(row.get(0)).map_err(|e| corrupt("value", e))?,
                fence: row.get(1),
                updated_at: row.get(2),
            })
        })
        .transpose()
    }

    async fn writes(&self, key: &ResourceName, page: Page) -> Result<WritesPage, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id, fence, outcome, at FROM doc_writes
                 WHERE key = $1 AND id > $2 ORDER BY id LIMIT $3",
                &[&key.as_str(), &page.after, &WritesPage::rows_to_read(page)],
            )
            .await
            .map_err(classify)?;
        let writes = rows
            .iter()
            .map(|row| {
                Ok(WriteRecord {
                    id: row.get(0),
                    fence: row.get(1),
                    outcome: Outcome::parse(row.get(2))?,
                    at: row.get(3),
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(WritesPage::from_rows(writes, page))
    }
}
