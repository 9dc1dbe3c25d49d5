use anyhow::Context as _;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use fencelock::domain::{Fence, ResourceName};
use fencelock::guard::{self, Admission};
use fencelock::store::postgres::PgConfig;
use serde_json::Value;
use tokio_postgres::NoTls;

use super::{Doc, DocStore, Guarding, Outcome, Put, WriteRecord};

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

pub struct PgDocs {
    pool: Pool,
    guarding: Guarding,
}

impl PgDocs {
    pub async fn open(config: PgConfig, guarding: Guarding) -> anyhow::Result<Self> {
        let manager = Manager::from_config(
            config.config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(16)
            .runtime(Runtime::Tokio1)
            .build()?;
        let client = pool.get().await.context("connecting to PostgreSQL")?;
        client.batch_execute(guard::postgres::SCHEMA).await?;
        client.batch_execute(SCHEMA).await?;
        Ok(Self { pool, guarding })
    }
}

#[async_trait]
impl DocStore for PgDocs {
    async fn put(&self, key: &ResourceName, value: &Value, fence: Fence) -> anyhow::Result<Put> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let admission = match self.guarding {
            Guarding::On => guard::postgres::admit(&tx, key.as_str(), fence).await?,
            Guarding::Off => Admission::Admitted,
        };
        let (outcome, put) = match admission {
            Admission::Admitted => {
                let updated_at: DateTime<Utc> = tx
                    .query_one(
                        "INSERT INTO docs (key, value, fence, updated_at) VALUES ($1, $2, $3, now())
                         ON CONFLICT (key) DO UPDATE SET
                             value = EXCLUDED.value, fence = EXCLUDED.fence, updated_at = EXCLUDED.updated_at
                         RETURNING updated_at",
                        &[&key.as_str(), &value.to_string(), &fence.get()],
                    )
                    .await?
                    .get(0);
                let doc = Doc {
                    key: key.to_string(),
                    value: value.clone(),
                    fence: fence.get(),
                    updated_at,
                };
                (Outcome::Applied, Put::Applied(doc))
            }
            Admission::Stale { current } => (Outcome::Rejected, Put::Stale { current }),
        };
        tx.execute(
            "INSERT INTO doc_writes (key, fence, outcome) VALUES ($1, $2, $3)",
            &[&key.as_str(), &fence.get(), &outcome.as_str()],
        )
        .await?;
        tx.commit().await?;
        Ok(put)
    }

    async fn get(&self, key: &ResourceName) -> anyhow::Result<Option<Doc>> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT value, fence, updated_at FROM docs WHERE key = $1",
                &[&key.as_str()],
            )
            .await?;
        row.map(|row| {
            Ok(Doc {
                key: key.to_string(),
                value: serde_json::from_str(row.get(0))?,
                fence: row.get(1),
                updated_at: row.get(2),
            })
        })
        .transpose()
    }

    async fn writes(&self, key: &ResourceName) -> anyhow::Result<Vec<WriteRecord>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT fence, outcome, at FROM doc_writes WHERE key = $1 ORDER BY id",
                &[&key.as_str()],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(WriteRecord {
                    fence: row.get(0),
                    outcome: Outcome::parse(row.get(1))?,
                    at: row.get(2),
                })
            })
            .collect()
    }
}
