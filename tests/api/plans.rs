//! Query plans on PostgreSQL: lookups stay index scans whatever size the table had when their
//! plan was cached.

use std::time::Duration;

use fencelock_server::postgres::{PgConfig, pool};

use crate::helpers::{StoreKind, TestApp};

/// A server on PostgreSQL, and a session set up as the server's are
/// (`store::postgres::pool`) that plans every prepared statement generically, as a plan the
/// server has cached is.
async fn generic_planning() -> (TestApp, deadpool_postgres::Object) {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    let session = pool(
        &PgConfig::parse(&app.db.url()).unwrap(),
        1,
        Duration::from_secs(10),
    )
    .unwrap()
    .get()
    .await
    .unwrap();
    session
        .batch_execute("SET plan_cache_mode = force_generic_plan")
        .await
        .unwrap();
    (app, session)
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
/// quiet spell), a lookup of a resource's current lease would be a sequential scan, kept while
/// the table grows. The server's sessions must plan it as an index scan all the same.
#[tokio::test]
async fn a_lookup_planned_on_an_empty_table_uses_an_index() {
    let (_app, session) = generic_planning().await;
    // VACUUM cannot share a multi-statement string (an implicit transaction).
    session
        .batch_execute("VACUUM (ANALYZE) leases")
        .await
        .unwrap();
    session
        .batch_execute(
            "INSERT INTO leases (resource, owner, fence, acquired_at, expires_at)
             SELECT 'plan:' || g, 'owner', nextval('lease_fence'), now(), now() + interval '1 minute'
             FROM generate_series(1, 16) AS g",
        )
        .await
        .unwrap();
    let plan = explain(
        &session,
        "SELECT owner, fence FROM leases WHERE resource = $1 AND ended_at IS NULL",
        &[&"plan:1"],
    )
    .await;
    assert!(
        plan.contains("Index Scan using leases_current_idx"),
        "the lookup is not an index scan:\n{plan}"
    );
}

/// The lease table is its own history, and rows are appended in acquisition order: the
/// retention purge finds the old rows by the block range index on `acquired_at`, not by a scan
/// of the whole table, and a resource's history is a range of the primary key.
#[tokio::test]
async fn history_reads_and_the_purge_use_their_indexes() {
    let (_app, session) = generic_planning().await;
    let statements: [(
        &str,
        &[&(dyn tokio_postgres::types::ToSql + Sync)],
        &str,
        &str,
    ); 2] = [
        (
            "SELECT resource, fence FROM leases
             WHERE acquired_at < now() - $1::bigint * interval '1 millisecond'
               AND ended_at < now() - $1::bigint * interval '1 millisecond'
             LIMIT 100",
            &[&3_600_000_i64],
            "leases_acquired_brin",
            "the purge does not use the acquired_at index",
        ),
        (
            r#"SELECT fence FROM leases WHERE resource = $1 COLLATE "C" ORDER BY fence DESC LIMIT $2"#,
            &[&"r", &50_i64],
            "leases_pkey",
            "the history is not a range of the primary key",
        ),
    ];
    for (sql, params, node, otherwise) in statements {
        let plan = explain(&session, sql, params).await;
        assert!(plan.contains(node), "{otherwise}:\n{plan}");
    }
}
