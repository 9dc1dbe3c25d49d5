//! Listing — `GET /locks?prefix=P&limit=N&after=R` (API.md, *Listing*): live leases only, in
//! byte order of their names, without owners, a page at a time; with bearer tokens, only the
//! names inside the token's prefixes (API.md, *Authentication and scopes*).

use std::collections::BTreeMap;
use std::sync::Arc;

use fencelock::client::Client;
use reqwest::Response;
use serde_json::{Value, json};

use crate::helpers::{
    StoreKind, TTL, TestApp, TestDb, admin, assert_invalid, assert_problem, assert_public_lock,
    fence, first_column, pg_connect, sorted_keys, token_entry,
};

/// `GET /locks` with `params` (form-encoded as any client would: `+` as `%2B`), with a
/// bearer token or none.
async fn list_as(app: &TestApp, token: Option<&str>, params: &[(&str, &str)]) -> Response {
    let mut request = app.client.get(app.url("/locks")).query(params);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.expect("request reaches the server")
}

/// A `200` page: its resources in order, its `next`, and the whole body.
async fn page_of(response: Response) -> (Vec<String>, Option<String>, Value) {
    let status = response.status();
    let text = response.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    let names = body["locks"]
        .as_array()
        .unwrap_or_else(|| panic!("no locks list in {body}"))
        .iter()
        .map(|lock| lock["resource"].as_str().unwrap().to_owned())
        .collect();
    let next = match &body["next"] {
        Value::Null => None,
        Value::String(next) => Some(next.clone()),
        other => panic!("next is {other}"),
    };
    (names, next, body)
}

async fn page(app: &TestApp, params: &[(&str, &str)]) -> (Vec<String>, Option<String>) {
    let (names, next, _) = page_of(list_as(app, None, params).await).await;
    (names, next)
}

/// Every page of a list, following `next` to the end; each page is checked to be full
/// except the last, and the last to have `next: null`.
async fn all_pages(
    app: &TestApp,
    token: Option<&str>,
    prefix: &str,
    limit: usize,
) -> Vec<Vec<String>> {
    let limit_text = limit.to_string();
    let mut pages = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut params = vec![("prefix", prefix), ("limit", limit_text.as_str())];
        if let Some(after) = &after {
            params.push(("after", after.as_str()));
        }
        let (names, next, _) = page_of(list_as(app, token, &params).await).await;
        assert!(names.len() <= limit, "{names:?}");
        match next {
            Some(next) => {
                assert_eq!(names.len(), limit, "a page before the last is full");
                assert_eq!(names.last(), Some(&next), "next is the page's last name");
                after = Some(next);
                pages.push(names);
            }
            None => {
                pages.push(names);
                return pages;
            }
        }
        assert!(pages.len() <= 10_000, "paging does not end");
    }
}

fn byte_order(names: &[&str]) -> Vec<String> {
    let mut sorted: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    sorted.sort_unstable();
    sorted
}

/// Names whose byte order differs from the order of most locales: upper case before lower,
/// digits and punctuation apart from letters.
const MIXED: [&str; 16] = [
    "job:2", "Job:1", "job:10", "job-1", "job_1", "job~", "job.1", "job@1", "job=1", "job+1", "0",
    "a", "B", "_", "~", ":",
];

/// Names that start with one another, or almost: a prefix must list exactly the ones that
/// start with it, whatever characters end the prefix.
const NEIGHBOURS: [&str; 15] = [
    "job",
    "job:1",
    "job:2",
    "jobs",
    "jo",
    "job~",
    "job~~",
    "jop",
    "billing:1",
    "a~",
    "a~~",
    "a~b",
    "b",
    ".x",
    "...",
];

/// Every live lease, in byte order of its name, with exactly its resource, fence and times.
async fn live_leases_are_listed_in_name_order_without_owners(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let mut locks = BTreeMap::new();
    for (i, name) in MIXED.iter().enumerate() {
        let lock = app
            .acquire_ok(name, &format!("secret-owner-{i}"), TTL)
            .await;
        locks.insert((*name).to_owned(), lock);
    }

    let response = list_as(&app, None, &[]).await;
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let (names, next, body) = page_of(response).await;
    assert!(
        !body.to_string().contains("secret-owner"),
        "owner leaked: {body}"
    );
    assert_eq!(names, byte_order(&MIXED));
    assert_eq!(next, None);
    assert_eq!(sorted_keys(&body), ["locks", "next"]);
    for listed in body["locks"].as_array().unwrap() {
        assert_public_lock(listed, &locks[listed["resource"].as_str().unwrap()]);
    }
}

/// `next` leads from page to page; the last page, also when it is full, says `null`.
async fn pages_follow_next_to_the_last_page(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let items: Vec<String> = (1..=9).map(|i| format!("item:{i}")).collect();
    for name in items
        .iter()
        .map(String::as_str)
        .chain(["item", "items", "other:1"])
    {
        app.acquire_ok(name, "a", TTL).await;
    }

    let three = all_pages(&app, None, "item:", 3).await;
    assert_eq!(three, [&items[0..3], &items[3..6], &items[6..9]]);
    let four = all_pages(&app, None, "item:", 4).await;
    assert_eq!(four, [&items[0..4], &items[4..8], &items[8..9]]);
    let nine = all_pages(&app, None, "item:", 9).await;
    assert_eq!(nine, [&items[..]]);

    // `after` need not be a listed name: the page starts at the next name after it.
    assert_eq!(
        page(
            &app,
            &[("prefix", "item:"), ("after", "item:35"), ("limit", "2")]
        )
        .await,
        (
            vec!["item:4".to_owned(), "item:5".to_owned()],
            Some("item:5".to_owned())
        )
    );
    assert_eq!(
        page(&app, &[("prefix", "item:"), ("after", "item:9")]).await,
        (vec![], None)
    );
    // A lease released between pages is simply not on the next one.
    let (first, next) = page(&app, &[("prefix", "item:"), ("limit", "3")]).await;
    assert_eq!(first, &items[0..3]);
    assert_eq!(
        app.release("item:4", json!({ "owner": "a" }))
            .await
            .status(),
        204
    );
    let next = next.unwrap();
    let (second, _) = page(
        &app,
        &[("prefix", "item:"), ("limit", "3"), ("after", &next)],
    )
    .await;
    assert_eq!(second, &items[4..7]);
}

/// A prefix lists exactly the names that start with it, whatever characters end it.
async fn a_prefix_lists_the_names_that_start_with_it(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let names = NEIGHBOURS;
    for name in names {
        app.acquire_ok(name, "a", TTL).await;
    }
    for prefix in [
        "", "job", "job:", "job~", "jo", "j", "a~", "a~~", "b", ".", "..", "zzz", "job:1", "~",
    ] {
        let expected: Vec<&str> = names
            .into_iter()
            .filter(|n| n.starts_with(prefix))
            .collect();
        let (listed, next) = page(&app, &[("prefix", prefix)]).await;
        assert_eq!(listed, byte_order(&expected), "prefix {prefix:?}");
        assert_eq!(next, None, "prefix {prefix:?}");
    }
    // An empty prefix is every name, as no prefix is.
    assert_eq!(page(&app, &[]).await.0, byte_order(&names));
}

/// Expired leases (kept until purged) and released ones are never listed, and do not make
/// pages short or add a page.
async fn expired_and_released_leases_are_not_listed(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    for name in ["e:1", "e:2", "e:3", "e:4", "e:5"] {
        app.acquire_ok(name, "a", TTL).await;
    }
    app.db.age("e:2", 1).await;
    app.db.age("e:4", 60_000).await;
    assert_eq!(
        app.release("e:3", json!({ "owner": "a" })).await.status(),
        204
    );
    assert_eq!(
        app.db.rows("e:2").await,
        1,
        "the expired row is still there"
    );

    assert_eq!(
        page(&app, &[("prefix", "e:")]).await,
        (vec!["e:1".into(), "e:5".into()], None)
    );
    let pages = all_pages(&app, None, "e:", 1).await;
    assert_eq!(pages, [vec!["e:1".to_owned()], vec!["e:5".to_owned()]]);
    let (names, next) = page(&app, &[("prefix", "e:"), ("limit", "2")]).await;
    assert_eq!((names.len(), next), (2, None));
    // Taken over after expiry, it is listed again with its new fence.
    let lock = app.acquire_ok("e:2", "b", TTL).await;
    let (_, _, body) = page_of(list_as(&app, None, &[("prefix", "e:2")]).await).await;
    assert_eq!(fence(&body["locks"][0]), fence(&lock));
}

/// Every bad parameter is a `422` naming it, all of them at once; so is any other parameter.
async fn bad_parameters_are_named_in_a_422(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let long = "a".repeat(256);
    let bad_values: [(&str, &[&str]); 3] = [
        (
            "limit",
            &[
                "0",
                "1001",
                "-1",
                "abc",
                "1.5",
                "1e2",
                "",
                "99999999999999999999999",
            ],
        ),
        ("after", &["", "..", "a%2Fb", "a+b", &long]),
        ("prefix", &["a%20b", "a%2Fb", "%C3%A9", &long]),
    ];
    let mut cases: Vec<(String, Vec<&str>)> = bad_values
        .into_iter()
        .flat_map(|(field, values)| {
            values
                .iter()
                .map(move |v| (format!("{field}={v}"), vec![field]))
        })
        .collect();
    cases.extend([
        // Given twice, or not a parameter of the list.
        ("limit=5&limit=5".into(), vec!["limit"]),
        ("prefix=a&prefix=b".into(), vec!["prefix"]),
        ("limt=5".into(), vec!["limt"]),
        ("owner=x".into(), vec!["owner"]),
        (
            "prefix=%20&limit=0&after=.&fence=1".into(),
            vec!["prefix", "limit", "after", "fence"],
        ),
    ]);
    for (query, fields) in cases {
        assert_invalid(app.get(&format!("/locks?{query}")).await, &fields, &query).await;
    }
    // The limits themselves are fine.
    for limit in ["1", "1000", "0100"] {
        assert_eq!(
            page(&app, &[("limit", limit)]).await,
            (vec![], None),
            "{limit}"
        );
    }
}

/// `GET /locks` is counted under its own route, and its store read under `op="list"`.
async fn listing_is_counted_in_metrics(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.acquire_ok("job:1", "a", TTL).await;
    assert_eq!(page(&app, &[]).await.0, ["job:1"]);
    assert_eq!(app.get("/locks?limit=0").await.status(), 422);
    let route = app
        .url("/locks")
        .strip_prefix(&app.address)
        .unwrap()
        .to_owned();
    let metrics = app.metrics().await;
    let answered = |status: &str| {
        metrics.value(
            "fencelock_http_requests_total",
            &[("route", &route), ("method", "GET"), ("status", status)],
        )
    };
    assert_eq!((answered("200"), answered("422")), (1.0, 1.0), "{route}");
    // The 422 never reached the store.
    assert_eq!(
        metrics.value("fencelock_store_seconds_count", &[("op", "list")]),
        1.0
    );
}

/// With `--fence-key`, a listed lease has no `fence_token`: that is a right to write,
/// which only its holder gets (and inspect, one resource at a time).
async fn a_list_shows_no_fence_token(kind: StoreKind) {
    let key = fencelock::domain::FenceKey::from_bytes(vec![7; 32]).unwrap();
    let app = TestApp::spawn_on(TestDb::new(kind).await, move |settings| {
        settings.fence_key = Some(key);
    })
    .await;
    let lock = app.acquire_ok("job:1", "a", TTL).await;
    assert!(lock["fence_token"].is_string(), "{lock}");
    let (_, _, body) = page_of(list_as(&app, None, &[]).await).await;
    assert_eq!(fence(&body["locks"][0]), fence(&lock));
    assert!(body["locks"][0].get("fence_token").is_none(), "{body}");
    let text = body.to_string();
    assert!(
        !text.contains(lock["fence_token"].as_str().unwrap()),
        "{text}"
    );
}

/// Issue 12's acceptance: a list with a prefix pages correctly over 2,500 leases, among
/// neighbours outside the prefix and expired leases inside it.
async fn a_prefix_pages_over_2500_leases(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let sql = match kind {
        StoreKind::Postgres => {
            "INSERT INTO leases (resource, owner, fence, acquired_at, expires_at)
             SELECT name, 'o', row_number() OVER (), now(),
                    now() + CASE WHEN name LIKE '%x' THEN interval '-1 minute' ELSE interval '1 hour' END
             FROM (SELECT 'bulk:' || lpad(g::text, 4, '0') FROM generate_series(1, 2500) g
                   UNION ALL SELECT 'bulk:' || lpad(g::text, 4, '0') || 'x' FROM generate_series(1, 2500, 10) g
                   UNION ALL SELECT p || g FROM generate_series(1, 50) g, unnest(ARRAY['bulj:', 'bulk', 'bulk.', 'bulk@', 'bull:']) p
                  ) AS names(name)"
        }
        StoreKind::Sqlite => {
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 2500),
                  clock(ms) AS (SELECT CAST(strftime('%s', 'now') AS INTEGER) * 1000),
                  names(name) AS (
                      SELECT 'bulk:' || printf('%04d', n) FROM g
                      UNION ALL SELECT 'bulk:' || printf('%04d', n) || 'x' FROM g WHERE n % 10 = 1
                      UNION ALL SELECT p || n FROM g, (SELECT 'bulj:' AS p UNION ALL SELECT 'bulk'
                          UNION ALL SELECT 'bulk.' UNION ALL SELECT 'bulk@' UNION ALL SELECT 'bull:')
                      WHERE n <= 50)
             INSERT INTO leases (resource, owner, fence, acquired_at, expires_at)
             SELECT name, 'o', row_number() OVER (), ms,
                    ms + CASE WHEN name LIKE '%x' THEN -60000 ELSE 3600000 END
             FROM names, clock"
        }
    };
    app.db.execute(sql).await;
    let expected: Vec<String> = (1..=2500).map(|n| format!("bulk:{n:04}")).collect();

    let pages = all_pages(&app, None, "bulk:", 1000).await;
    assert_eq!(
        pages.iter().map(Vec::len).collect::<Vec<_>>(),
        [1000, 1000, 500]
    );
    assert_eq!(pages.concat(), expected);
    let pages = all_pages(&app, None, "bulk:", 100).await;
    assert_eq!(pages.len(), 25);
    assert_eq!(pages.concat(), expected);
    // Without a limit, a page is 100 leases.
    let (first, next) = page(&app, &[("prefix", "bulk:")]).await;
    assert_eq!((first.len(), next.as_deref()), (100, Some("bulk:0100")));
}

const WRITER: &str = "writer-secret-0123456789";
const BILLING: &str = "billing-secret-0123456789";
const READER: &str = "reader-secret-0123456789";
const SPLIT: &str = "split-secret-0123456789";

/// A `lock`-only token for everything, the acceptance scenario's billing token (lock and read
/// on `billing:`) and read-only token, and a read token on two separate prefixes.
fn auth_file() -> String {
    [
        token_entry("writer", WRITER, &[""], &["lock"]),
        token_entry("billing-workers", BILLING, &["billing:"], &["lock", "read"]),
        token_entry("dashboards", READER, &[""], &["read"]),
        token_entry("split", SPLIT, &["c:", "a:"], &["read"]),
    ]
    .concat()
}

/// A list shows only names inside the token's prefixes, with full pages and a right `next`;
/// a prefix outside all of them, or a token without `read`, is `403 forbidden-scope`; no
/// token is `401` before anything else.
async fn a_token_lists_only_inside_its_prefixes(kind: StoreKind) {
    let (app, _dir) = TestApp::spawn_with_auth(kind, &auth_file()).await;
    let names = [
        "a:1",
        "a:2",
        "b:1",
        "b:2",
        "billing:1",
        "billing:2",
        "c:1",
        "c:2",
        "report:1",
        "report:2",
    ];
    for name in names {
        let response = app.acquire_as(Some(WRITER), name, "w", TTL).await;
        assert_eq!(response.status(), 200, "{name}");
    }

    // 401 first, even for a bad query; then the input rules; then the scope.
    for params in [&[][..], &[("limit", "0")][..]] {
        let response = list_as(&app, None, params).await;
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        assert_problem(response, 401, "unauthorized").await;
    }
    assert_invalid(
        list_as(&app, Some(WRITER), &[("limit", "0")]).await,
        &["limit"],
        "writer",
    )
    .await;
    assert_problem(
        list_as(&app, Some(WRITER), &[]).await,
        403,
        "forbidden-scope",
    )
    .await;

    // The read-only token lists everything, but may not acquire.
    let everything = all_pages(&app, Some(READER), "", 3).await.concat();
    assert_eq!(everything, byte_order(&names));
    assert_problem(
        app.acquire_as(Some(READER), "x:1", "r", TTL).await,
        403,
        "forbidden-scope",
    )
    .await;

    // The billing token never sees report:*, whatever it asks for.
    for (prefix, expected) in [
        ("", &["billing:1", "billing:2"][..]),
        ("b", &["billing:1", "billing:2"]),
        ("bill", &["billing:1", "billing:2"]),
        ("billing:2", &["billing:2"]),
    ] {
        for limit in [1, 100] {
            let listed = all_pages(&app, Some(BILLING), prefix, limit).await.concat();
            assert_eq!(listed, expected, "prefix {prefix:?}, limit {limit}");
        }
    }
    for prefix in ["report:", "r", "a:", "billing.", "billing:2x"] {
        let response = list_as(&app, Some(BILLING), &[("prefix", prefix)]).await;
        if prefix == "billing:2x" {
            // Inside the token's prefix: allowed, and simply empty.
            assert_eq!(page_of(response).await.0, Vec::<String>::new());
        } else {
            assert_problem(response, 403, "forbidden-scope").await;
        }
    }

    // Two prefixes with other names between them: pages are filled across both.
    let split = all_pages(&app, Some(SPLIT), "", 3).await;
    assert_eq!(split, [vec!["a:1", "a:2", "c:1"], vec!["c:2"]]);
    let split = all_pages(&app, Some(SPLIT), "", 2).await;
    assert_eq!(split, [vec!["a:1", "a:2"], vec!["c:1", "c:2"]]);
    assert_eq!(
        all_pages(&app, Some(SPLIT), "c", 10).await.concat(),
        ["c:1", "c:2"]
    );
    assert_problem(
        list_as(&app, Some(SPLIT), &[("prefix", "b")]).await,
        403,
        "forbidden-scope",
    )
    .await;
    let metrics = app.metrics().await;
    assert!(metrics.value("fencelock_auth_failures_total", &[("reason", "scope")]) >= 5.0);
}

/// The worker client pages through a list with `next`. One store is enough: the client sees
/// only HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_lists_page_by_page() {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    for name in ["c+1", "c+2", "c+3", "d"] {
        app.acquire_ok(name, "a", TTL).await;
    }
    let client = Client::builder(&app.address)
        .no_proxy()
        .build()
        .expect("client builds");
    let first = client.list("c+", None, Some(2)).await.unwrap();
    let names: Vec<&str> = first.locks.iter().map(|l| l.resource.as_str()).collect();
    assert_eq!(names, ["c+1", "c+2"]);
    assert_eq!(first.next.as_deref(), Some("c+2"));
    let second = client
        .list("c+", first.next.as_deref(), Some(2))
        .await
        .unwrap();
    assert_eq!(second.locks.len(), 1);
    assert_eq!(second.locks[0].resource, "c+3");
    assert_eq!(second.next, None);
    assert_eq!(client.list("", None, None).await.unwrap().locks.len(), 4);
    let refused = client.list("", None, Some(0)).await.unwrap_err();
    assert!(matches!(
        refused,
        fencelock::client::Error::Rejected { status: 422, .. }
    ));
}

contract!(
    live_leases_are_listed_in_name_order_without_owners,
    pages_follow_next_to_the_last_page,
    a_prefix_lists_the_names_that_start_with_it,
    expired_and_released_leases_are_not_listed,
    bad_parameters_are_named_in_a_422,
    listing_is_counted_in_metrics,
    a_list_shows_no_fence_token,
    a_prefix_pages_over_2500_leases,
    a_token_lists_only_inside_its_prefixes,
);

/// On a database whose default collation is not byte order (ICU `en-US`: `a` before `B`,
/// punctuation apart from letters), names are still listed in byte order, as on SQLite, and
/// the primary key, in byte order itself, serves the range and the order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lists_in_byte_order_under_any_database_collation() {
    let name = format!(
        "fencelock_test_icu_{}",
        chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default()
    );
    admin()
        .await
        .batch_execute(&format!(
            "CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
        ))
        .await
        .expect("creating a database with the ICU en-US collation");
    let db = Arc::new(TestDb::Postgres {
        name,
        bouncer: None,
    });
    let app = TestApp::spawn_on(db.clone(), |_| {}).await;
    for name in MIXED {
        app.acquire_ok(name, "a", TTL).await;
    }

    let session = pg_connect(&db.url()).await;
    let locale_order: Vec<String> = first_column(
        &session,
        "SELECT r FROM unnest(ARRAY['a', 'B', '_', '0']) AS r ORDER BY r",
        &[],
    )
    .await;
    assert_eq!(
        locale_order,
        ["_", "0", "a", "B"],
        "the database does not sort bytes"
    );

    assert_eq!(page(&app, &[]).await.0, byte_order(&MIXED));
    let jobs: Vec<&str> = MIXED.into_iter().filter(|n| n.starts_with("job")).collect();
    assert_eq!(page(&app, &[("prefix", "job")]).await.0, byte_order(&jobs));
    let pages = all_pages(&app, None, "", 5).await;
    assert_eq!(pages.concat(), byte_order(&MIXED));

    let collation: Option<String> = session
        .query_one(
            "SELECT collation_name FROM information_schema.columns
             WHERE table_name = 'leases' AND column_name = 'resource'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(collation.as_deref(), Some("C"));
    // Whatever the table's size, a plan that reads the range and its order from the primary
    // key is possible only if the key is in byte order; otherwise a scan and a sort remain.
    session
        .batch_execute(
            "SET enable_seqscan = off; SET enable_bitmapscan = off; SET enable_sort = off",
        )
        .await
        .unwrap();
    let plan: Vec<String> = first_column(
        &session,
        r#"EXPLAIN SELECT resource FROM leases
           WHERE resource >= 'job' COLLATE "C" AND resource < ('job' || chr(127)) COLLATE "C"
           ORDER BY resource COLLATE "C" LIMIT 10"#,
        &[],
    )
    .await;
    let plan = plan.join("\n");
    assert!(
        plan.contains("Index Cond") && plan.contains("leases_pkey") && !plan.contains("Sort"),
        "{plan}"
    );
}
