//! Query plans on PostgreSQL: lookups stay index scans whatever size the table had when their
//! plan was cached.

use std::time::Duration;

use fencelock::store::postgres::{PgConfig, pool};

use crate::helpers::{StoreKind, TestApp};

/// A prepared statement's generic plan is costed on the table as it is when the plan is made.
/// Made on an empty, freshly analysed table (a new deployment, or the first minutes after a
/// quiet spell), a primary-key lookup would be a sequential scan, kept while the table grows.
/// The server's sessions must plan it as an index scan all the same.
#[tokio::test]
async fn a_lookup_planned_on_an_empty_table_uses_the_primary_key() {
    let app = TestApp::spawn(StoreKind::Postgres).await;
    let sessions = pool(
        &PgConfig::parse(&app.db.url()).unwrap(),
        1,
        Duration::from_secs(10),
    )
    .unwrap();
    let session = sessions.get().await.unwrap();
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
    let plan: Vec<String> = session
        .query(
            "EXPLAIN SELECT owner, fence FROM leases WHERE resource = $1 FOR UPDATE",
            &[&"plan:1"],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let plan = plan.join("\n");
    assert!(
        plan.contains("Index Scan using leases_pkey"),
        "the lookup is not an index scan:\n{plan}"
    );
}
