//! Query plans on PostgreSQL: lookups stay index scans whatever size the table had when their
//! plan was cached.

use std::time::Duration;

use fencelock_server::postgres::{PgConfig, pool};

use crate::helpers::{StoreKind, TestApp};

/// A session set up as the server's are (`store::postgres::pool`).
async fn session(app: &TestApp) -> deadpool_postgres::Object {
    pool(
        &PgConfig::parse(&app.db.url()).unwrap(),
        1,
        Duration::from_secs(10),
    )
    .unwrap()
    .get()
    .await
    .unwrap()
}

/// The plan of `sql` as the session would run it, one line per node.
async fn explain(
    session: &tokio_postgres::Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> String {
    let plan: Vec<String> = session
        .query(&format!("EXPLAIN {sql}"), params)
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    plan.join("\n")
}

/// A prepared statement's generic plan is costed on the table as it is when the plan is made.
/// Made on an empty, freshly analysed table (a new deployment, or the first minutes after a
/// quiet spell), a primary-key lookup would be a sequential scan, kept while the table grows.
/// The server's sessions must plan it as an index scan all the same.
#[tokio::test]
async fn a_lookup_planned_on_an_empty_table_uses_the_primary_key() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    let session = session(&app).await;
    // VACUUM cannot share a multi-statement string (an implicit transaction).
    session
        .batch_execute("VACUUM (ANALYZE) leases")
        .await
        .unwrap();
    session
        .batch_execute(
            "INSERT INTO leases (resource, owner, fence, acquired_at, expires_at)
             SELECT 'plan:' || g, 'owner', nextval('lease_fence'), now(), now() + interval '1 minute'
             FROM generate_series(1, 16) AS g;
             SET plan_cache_mode = force_generic_plan",
        )
        .await
        .unwrap();
    let plan = explain(
        &session,
        "SELECT owner, fence FROM leases WHERE resource = $1 FOR UPDATE",
        &[&"plan:1"],
    )
    .await;
    assert!(
        plan.contains("Index Scan using leases_pkey"),
        "the lookup is not an index scan:\n{plan}"
    );
}

/// A lease's history row is written again when the lease is renewed or ends (its
/// `expires_at`, `renewals`, `ended_at` and `end_kind`). No index may cover those columns,
/// so that those updates stay heap-only (HOT) and touch no index; the retention purge finds
/// old rows by `acquired_at`, which is written once.
#[tokio::test]
async fn history_updates_touch_no_index() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    let session = session(&app).await;
    let indexed: Vec<String> = session
        .query(
            "SELECT DISTINCT a.attname::text
             FROM pg_index i
             JOIN pg_attribute a ON a.attrelid = i.indrelid
             WHERE i.indrelid = 'lease_history'::regclass
               AND (a.attnum = ANY (i.indkey)
                    OR pg_get_expr(i.indexprs, i.indrelid) ~ ('\\m' || a.attname || '\\M'))
             ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(indexed, ["acquired_at", "fence", "resource"]);

    session
        .batch_execute("SET plan_cache_mode = force_generic_plan")
        .await
        .unwrap();
    let plan = explain(
        &session,
        "SELECT fence FROM lease_history
             WHERE acquired_at < now() - $1::bigint * interval '1 millisecond'
               AND coalesce(ended_at, expires_at) < now() - $1::bigint * interval '1 millisecond'
             LIMIT 100",
        &[&3_600_000_i64],
    )
    .await;
    assert!(
        plan.contains("lease_history_acquired_idx"),
        "the purge does not use the acquired_at index:\n{plan}"
    );
}
